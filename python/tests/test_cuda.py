"""The CUDA backend through attnforge.flashinfer on torch CUDA tensors, against float64 math on
the GPU (torch's scaled_dot_product_attention where it applies). Launches go to torch's current
stream; plan-then-run is checked inside CUDA-graph capture. Skipped without a CUDA device."""

import math

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("torch.cuda is not available: no GPU here", allow_module_level=True)

import attnforge.flashinfer as fi  # noqa: E402
import torch.nn.functional as F  # noqa: E402

DEV = "cuda"
TOL = {torch.float16: 1e-2, torch.bfloat16: 2e-2}


def visible(qo, kv, causal, window_left):
    i = torch.arange(qo, device=DEV)[:, None] + (kv - qo)
    j = torch.arange(kv, device=DEV)[None, :]
    m = torch.ones(qo, kv, dtype=torch.bool, device=DEV)
    if causal:
        m &= j <= i
    if window_left >= 0:
        m &= j >= i - window_left
    return m


def reference(
    q, k, v, causal=False, window_left=-1, soft_cap=None, sm_scale=None, mask=None, alibi=None
):
    """float64 ``(o, lse base 2)`` of one request, NHD; SDPA when there is no soft cap."""
    qo, hq, d = q.shape
    kv, hkv, _ = k.shape
    scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(d)
    m = mask if mask is not None else visible(qo, kv, causal, window_left)
    q64, k64, v64 = (x.double().transpose(0, 1) for x in (q, k, v))
    k64 = k64.repeat_interleave(hq // hkv, dim=0)
    v64 = v64.repeat_interleave(hq // hkv, dim=0)
    s = q64 @ k64.transpose(1, 2) * scale
    if soft_cap:
        s = soft_cap * torch.tanh(s / soft_cap)
    if alibi is not None:
        j_minus_i = torch.arange(kv, device=DEV)[None, :] - torch.arange(qo, device=DEV)[:, None]
        s = s + torch.tensor(alibi, dtype=torch.float64, device=DEV)[:, None, None] * j_minus_i
    s = s.masked_fill(~m, float("-inf"))
    lse = torch.logsumexp(s, dim=-1).transpose(0, 1) / math.log(2.0)
    if soft_cap is None and alibi is None:
        o = F.scaled_dot_product_attention(q64, k64, v64, attn_mask=m, scale=scale)
    else:
        o = torch.softmax(s, dim=-1) @ v64
    return o.transpose(0, 1), lse


def check(o, want, dtype):
    torch.testing.assert_close(o.double(), want, atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kv_layout", ["NHD", "HND"])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_single_prefill(dtype, causal, kv_layout, head_dim):
    qo, kv, hq, hkv = 127, 301, 8, 2
    q = torch.randn(qo, hq, head_dim, dtype=dtype, device=DEV)
    k = torch.randn(kv, hkv, head_dim, dtype=dtype, device=DEV)
    v = torch.randn(kv, hkv, head_dim, dtype=dtype, device=DEV)
    kk, vv = (x.transpose(0, 1).contiguous() for x in (k, v)) if kv_layout == "HND" else (k, v)
    o, lse = fi.single_prefill_with_kv_cache(
        q, kk, vv, causal=causal, kv_layout=kv_layout, return_lse=True
    )
    assert o.device.type == "cuda" and o.dtype == dtype
    want_o, want_lse = reference(q, k, v, causal=causal)
    check(o, want_o, dtype)
    torch.testing.assert_close(lse.double(), want_lse, atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize(
    "cap,window,f16_qk", [(30.0, -1, False), (None, 64, False), (None, -1, True)]
)
def test_single_prefill_variants(cap, window, f16_qk):
    q = torch.randn(200, 4, 128, dtype=torch.float16, device=DEV)
    k = torch.randn(260, 4, 128, dtype=torch.float16, device=DEV)
    v = torch.randn(260, 4, 128, dtype=torch.float16, device=DEV)
    o = fi.single_prefill_with_kv_cache(
        q, k, v, causal=True, window_left=window, logits_soft_cap=cap, use_fp16_qk_reduction=f16_qk
    )
    want, _ = reference(q, k, v, causal=True, window_left=window, soft_cap=cap)
    check(o, want, torch.float16)


@pytest.mark.parametrize("causal", [False, True])
def test_alibi_and_non_causal_window(causal):
    q = torch.randn(90, 8, 128, dtype=torch.float16, device=DEV)
    k = torch.randn(150, 8, 128, dtype=torch.float16, device=DEV)
    v = torch.randn(150, 8, 128, dtype=torch.float16, device=DEV)
    slopes = [2.0 ** (-i) for i in range(1, 9)]
    o, lse = fi.single_prefill_with_kv_cache(
        q, k, v, causal=causal, pos_encoding_mode="ALIBI", return_lse=True
    )
    want_o, want_lse = reference(q, k, v, causal=causal, alibi=slopes)
    check(o, want_o, torch.float16)
    torch.testing.assert_close(lse.double(), want_lse, atol=1e-3, rtol=1e-3)
    o = fi.single_prefill_with_kv_cache(q, k, v, causal=causal, window_left=40)
    want, _ = reference(q, k, v, causal=causal, window_left=40)
    check(o, want, torch.float16)


def test_custom_mask_and_strided_inputs():
    qo, kv, d = 64, 96, 128
    # q and k are views into fused buffers (strided tokens): read in place.
    qkv = torch.randn(kv, 3, 4, d, dtype=torch.float16, device=DEV)
    q, k, v = qkv[-qo:, 0], qkv[:, 1], qkv[:, 2]
    mask = torch.rand(qo, kv, device=DEV) < 0.7
    o = fi.single_prefill_with_kv_cache(q, k, v, custom_mask=mask)
    want, _ = reference(q, k, v, mask=mask)
    check(o, want, torch.float16)


@pytest.mark.parametrize("causal", [False, True])
def test_ragged_batch_on_a_side_stream_with_out(causal):
    qo_lens, kv_lens = [17, 1, 130, 64], [17, 300, 200, 64]
    hq, hkv, d = 16, 4, 128
    qo_indptr = torch.tensor([0] + qo_lens, dtype=torch.int32).cumsum(0).int()
    kv_indptr = torch.tensor([0] + kv_lens, dtype=torch.int32).cumsum(0).int()
    q = torch.randn(int(qo_indptr[-1]), hq, d, dtype=torch.bfloat16, device=DEV)
    k = torch.randn(int(kv_indptr[-1]), hkv, d, dtype=torch.bfloat16, device=DEV)
    v = torch.randn(int(kv_indptr[-1]), hkv, d, dtype=torch.bfloat16, device=DEV)
    ws = torch.empty(128 << 20, dtype=torch.uint8, device=DEV)
    w = fi.BatchPrefillWithRaggedKVCacheWrapper(ws, "NHD")
    w.plan(qo_indptr, kv_indptr, hq, hkv, d, causal=causal, q_data_type=torch.bfloat16)
    out = torch.empty_like(q)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        o, lse = w.run(q, k, v, out=out, return_lse=True)
    side.synchronize()
    assert o is out
    for r in range(len(qo_lens)):
        qs = slice(int(qo_indptr[r]), int(qo_indptr[r + 1]))
        ks = slice(int(kv_indptr[r]), int(kv_indptr[r + 1]))
        want_o, want_lse = reference(q[qs], k[ks], v[ks], causal=causal)
        check(o[qs], want_o, torch.bfloat16)
        torch.testing.assert_close(lse[qs].double(), want_lse, atol=1e-3, rtol=1e-3)


def paged_cache(kv_lens, page_size, hkv, d, layout, dtype=torch.float16):
    pages_per = [-(-n // page_size) for n in kv_lens]
    num_pages = sum(pages_per) + 5
    ids = torch.randperm(num_pages)[: sum(pages_per)].int()
    indptr = torch.tensor([0] + pages_per).cumsum(0).int()
    last = torch.tensor([n - (p - 1) * page_size for n, p in zip(kv_lens, pages_per)]).int()
    page = (page_size, hkv, d) if layout == "NHD" else (hkv, page_size, d)
    kv = torch.randn((num_pages, 2) + page, dtype=dtype, device=DEV)
    return kv, ids, indptr, last


def gather(kv, ids, indptr, last, r, layout, page_size):
    pages = ids[int(indptr[r]) : int(indptr[r + 1])].tolist()
    n = (len(pages) - 1) * page_size + int(last[r])
    halves = []
    for half in (0, 1):
        t = kv[pages, half]
        if layout == "HND":
            t = t.transpose(1, 2)
        halves.append(t.reshape(-1, *t.shape[2:])[:n])
    return halves


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("form", ["combined", "halves", "tuple"])
@pytest.mark.parametrize("page_size", [16, 5])
def test_paged_prefill(layout, form, page_size):
    hq, hkv, d = 8, 2, 128
    kv_lens, qo_lens = [33, 200, 16, 97], [33, 7, 1, 50]
    kv, ids, indptr, last = paged_cache(kv_lens, page_size, hkv, d, layout)
    cache = {
        "combined": kv,
        "halves": (kv[:, 0], kv[:, 1]),
        "tuple": (kv[:, 0].contiguous(), kv[:, 1].contiguous()),
    }[form]
    qo_indptr = torch.tensor([0] + qo_lens).cumsum(0).int()
    q = torch.randn(int(qo_indptr[-1]), hq, d, dtype=torch.float16, device=DEV)
    ws = torch.empty(128 << 20, dtype=torch.uint8, device=DEV)
    w = fi.BatchPrefillWithPagedKVCacheWrapper(ws, layout)
    w.plan(qo_indptr, indptr, ids, last, hq, hkv, d, page_size, causal=True)
    o = w.run(q, cache)
    for r in range(len(kv_lens)):
        k, v = gather(kv, ids, indptr, last, r, layout, page_size)
        qs = slice(int(qo_indptr[r]), int(qo_indptr[r + 1]))
        want, _ = reference(q[qs], k, v, causal=True)
        check(o[qs], want, torch.float16)


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize(
    "window_left,cap,page_size", [(-1, None, 16), (100, None, 12), (-1, 50.0, 5)]
)
def test_decode_and_cuda_graph(layout, window_left, cap, page_size):
    hq, hkv, d = 32, 8, 128
    kv_lens = [1, 15, 16, 17, 500, 1000, 3, 64]
    kv, ids, indptr, last = paged_cache(kv_lens, page_size, hkv, d, layout, torch.bfloat16)
    batch = len(kv_lens)
    ws = torch.empty(128 << 20, dtype=torch.uint8, device=DEV)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(ws, layout)
    w.plan(
        indptr,
        ids,
        last,
        hq,
        hkv,
        d,
        page_size,
        window_left=window_left,
        logits_soft_cap=cap,
        q_data_type=torch.bfloat16,
    )
    q = torch.randn(batch, hq, d, dtype=torch.bfloat16, device=DEV)
    out = torch.empty_like(q)
    w.run(q, kv, out=out)  # warm-up outside the graph
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        w.run(q, kv, out=out)
    q.copy_(torch.randn_like(q))
    out.zero_()
    graph.replay()
    torch.cuda.synchronize()
    for r in range(batch):
        k, v = gather(kv, ids, indptr, last, r, layout, page_size)
        want, _ = reference(q[r : r + 1], k, v, causal=True, window_left=window_left, soft_cap=cap)
        check(out[r : r + 1], want, torch.bfloat16)


@pytest.mark.parametrize(
    "split", [{}, {"disable_split_kv": True}, {"fixed_split_size": 3}, {"fixed_split_size": 64}]
)
def test_decode_split_choices(split):
    """FlashInfer's KV-split arguments: unsplit, and chunks of 3 pages (rounded up to 64 keys)
    or 64 pages, over requests long enough for the planner to split."""
    hq, hkv, d, page_size = 32, 8, 128, 16
    kv_lens = [4000, 1, 700, 2048]
    kv, ids, indptr, last = paged_cache(kv_lens, page_size, hkv, d, "NHD")
    ws = torch.empty(128 << 20, dtype=torch.uint8, device=DEV)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD")
    w.plan(indptr, ids, last, hq, hkv, d, page_size, **split)
    q = torch.randn(len(kv_lens), hq, d, dtype=torch.float16, device=DEV)
    o = w.run(q, kv)
    for r in range(len(kv_lens)):
        k, v = gather(kv, ids, indptr, last, r, "NHD", page_size)
        want, _ = reference(q[r : r + 1], k, v)
        check(o[r : r + 1], want, torch.float16)


def test_merges_on_the_gpu():
    seq, h, d = 77, 8, 128
    v = torch.randn(seq, 3, h, d, dtype=torch.float16, device=DEV)
    s = torch.randn(seq, 3, h, dtype=torch.float32, device=DEV) * 5
    s[3, 1, 2] = float("-inf")
    w = torch.exp2(s.double() - s.double().amax(1, keepdim=True))
    want_v = (w[..., None] * v.double()).sum(1) / w.sum(1)[..., None]
    want_s = torch.logsumexp(s.double() * math.log(2.0), dim=1) / math.log(2.0)
    got_v, got_s = fi.merge_states(v, s)
    torch.testing.assert_close(got_v.double(), want_v, atol=2e-3, rtol=2e-3)
    torch.testing.assert_close(got_s.double(), want_s, atol=1e-4, rtol=1e-4)
    a_v, a_s = fi.merge_state(
        v[:, 0].contiguous(), s[:, 0].contiguous(), v[:, 1].contiguous(), s[:, 1].contiguous()
    )
    b_v, b_s = fi.merge_state(a_v, a_s, v[:, 2].contiguous(), s[:, 2].contiguous())
    torch.testing.assert_close(b_v.double(), want_v, atol=2e-3, rtol=2e-3)
    torch.testing.assert_close(b_s.double(), want_s, atol=1e-4, rtol=1e-4)


def test_merge_state_in_place_with_mask():
    seq, h, d = 40, 4, 64
    v, v_other = (torch.randn(seq, h, d, dtype=torch.bfloat16, device=DEV) for _ in range(2))
    s, s_other = (torch.randn(seq, h, dtype=torch.float32, device=DEV) for _ in range(2))
    mask = torch.rand(seq, device=DEV) < 0.5
    want_v, want_s = fi.merge_state(v, s, v_other, s_other)
    v0, s0 = v.clone(), s.clone()
    fi.merge_state_in_place(v, s, v_other, s_other, mask=mask)
    torch.testing.assert_close(v[mask], want_v[mask], atol=0, rtol=0)
    torch.testing.assert_close(s[mask], want_s[mask], atol=0, rtol=0)
    torch.testing.assert_close(v[~mask], v0[~mask], atol=0, rtol=0)
    torch.testing.assert_close(s[~mask], s0[~mask], atol=0, rtol=0)


@pytest.mark.parametrize("page_size", [16, 5])
def test_append_on_the_gpu(page_size):
    hkv, d = 4, 128
    old, new = [10, 0, 31], [7, 20, 1]
    total = [a + b for a, b in zip(old, new)]
    kv, ids, indptr, last = paged_cache(total, page_size, hkv, d, "NHD")
    k_new = torch.randn(sum(new), hkv, d, dtype=torch.float16, device=DEV)
    v_new = torch.randn(sum(new), hkv, d, dtype=torch.float16, device=DEV)
    indptr_d, last_d = indptr.to(DEV), last.to(DEV)
    seq_lens = fi.get_seq_lens(indptr_d, last_d, page_size)
    append_indptr = torch.tensor([0, *new], device=DEV).cumsum(0).int()
    batch, pos = fi.get_batch_indices_positions(append_indptr, seq_lens, sum(new))
    assert batch.device.type == "cuda" and batch.dtype == torch.int32
    before = kv.clone()
    fi.append_paged_kv_cache(
        k_new, v_new, batch, pos, kv, ids.to(DEV), indptr.to(DEV), last.to(DEV)
    )
    torch.cuda.synchronize()
    start = 0
    for r in range(3):
        k, v = gather(kv, ids, indptr, last, r, "NHD", page_size)
        k0, _ = gather(before, ids, indptr, last, r, "NHD", page_size)
        torch.testing.assert_close(k[: old[r]], k0[: old[r]], atol=0, rtol=0)
        torch.testing.assert_close(k[old[r] :], k_new[start : start + new[r]], atol=0, rtol=0)
        torch.testing.assert_close(v[old[r] :], v_new[start : start + new[r]], atol=0, rtol=0)
        start += new[r]


@pytest.mark.parametrize("decode", [False, True])
def test_paged_alibi_and_sinks_match_the_cpu_backend(decode):
    """ALiBi (with its LSE convention) and run(sinks=) on the GPU, pages of 5 tokens, against
    the same calls on the CPU backend (itself checked against the float64 reference)."""
    page_size, hq, hkv, d = 5, 8, 2, 128
    kv_lens = [1, 37, 200, 64]
    qo_lens = [1] * 4 if decode else [1, 20, 3, 64]
    kv, ids, indptr, last = paged_cache(kv_lens, page_size, hkv, d, "NHD")
    qo_indptr = torch.tensor([0] + qo_lens).cumsum(0).int()
    q = torch.randn(int(qo_indptr[-1]), hq, d, dtype=torch.float16, device=DEV)
    sinks = torch.rand(hq, device=DEV) * 4
    results = []
    for dev in (DEV, "cpu"):
        ws = torch.empty(1 << 20, dtype=torch.uint8, device=dev)
        table = (indptr, ids, last, hq, hkv, d, page_size)
        if decode:
            alibi = fi.BatchDecodeWithPagedKVCacheWrapper(ws)
            alibi.plan(*table, pos_encoding_mode="ALIBI")
            plain = fi.BatchDecodeWithPagedKVCacheWrapper(ws)
            plain.plan(*table)
        else:
            alibi = fi.BatchPrefillWithPagedKVCacheWrapper(ws)
            alibi.plan(qo_indptr, *table, causal=True, pos_encoding_mode="ALIBI")
            plain = fi.BatchPrefillWithPagedKVCacheWrapper(ws)
            plain.plan(qo_indptr, *table, causal=True)
        qd, kvd = q.to(dev), kv.to(dev)
        o_a, lse_a = alibi.run(qd, kvd, return_lse=True)
        o_s, lse_s = plain.run(qd, kvd, sinks=sinks.to(dev), return_lse=True)
        results.append([x.cpu().double() for x in (o_a, lse_a, o_s, lse_s)])
    for got, want in zip(*results):
        torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)
