"""fp8 KV caches on the CUDA backend through attnforge.flashinfer: torch ``float8_e4m3fn`` /
``float8_e5m2`` pages planned with ``kv_data_type``, dequantised with ``k_scale`` / ``v_scale``
(numbers, and tensors per KV head), against float64 attention over the dequantised cache; a
decode captured in a CUDA graph and replayed; the append of fp8 rows; the same calls on the CPU
backend. Skipped without a CUDA device."""

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("torch.cuda is not available: no GPU here", allow_module_level=True)

import attnforge.flashinfer as fi  # noqa: E402
from test_cuda import DEV, check, gather, paged_cache, reference  # noqa: E402

FORMATS = [torch.float8_e4m3fn, torch.float8_e5m2]


def fp8_cache(kv_lens, page_size, hkv, d, layout, fp8):
    """A combined cache of random fp8 codes (values within a few units) in shuffled pages."""
    kv, ids, indptr, last = paged_cache(kv_lens, page_size, hkv, d, layout, torch.float32)
    return (kv * 2).to(fp8), ids, indptr, last


def dequantized(kv, ids, indptr, last, r, layout, page_size, k_scale, v_scale, dtype):
    """Request ``r``'s K and V dequantised as docs/semantics.md defines it, ``dtype(code *
    scale)`` (an f32 product rounded to the queries' dtype), NHD, float64 (the codes decoded to
    f32 before they are gathered)."""
    k, v = gather(kv.float(), ids, indptr, last, r, layout, page_size)
    hkv = k.shape[1]

    def scaled(x, s):
        s = torch.as_tensor(s, dtype=torch.float32, device=DEV).reshape(-1).expand(hkv)
        return (x * s[None, :, None]).to(dtype).double()

    return scaled(k, k_scale), scaled(v, v_scale)


@pytest.mark.parametrize("fp8", FORMATS)
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("page_size", [16, 5])
def test_fp8_decode_and_cuda_graph(fp8, layout, page_size):
    hq, hkv, d = 32, 8, 128
    kv_lens = [1, 15, 16, 17, 500, 1000, 3, 64]
    kv, ids, indptr, last = fp8_cache(kv_lens, page_size, hkv, d, layout, fp8)
    batch = len(kv_lens)
    k_scale, v_scale = 0.3, 1.7
    ws = torch.empty(128 << 20, dtype=torch.uint8, device=DEV)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(ws, layout)
    w.plan(
        indptr, ids, last, hq, hkv, d, page_size, q_data_type=torch.bfloat16, kv_data_type=fp8
    )
    q = torch.randn(batch, hq, d, dtype=torch.bfloat16, device=DEV)
    out = torch.empty_like(q)
    # Warm-up outside the graph: the scales are uploaded on first use.
    w.run(q, kv, k_scale=k_scale, v_scale=v_scale, out=out)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        w.run(q, kv, k_scale=k_scale, v_scale=v_scale, out=out)
    q.copy_(torch.randn_like(q))
    out.zero_()
    graph.replay()
    torch.cuda.synchronize()
    for r in range(batch):
        k, v = dequantized(kv, ids, indptr, last, r, layout, page_size, k_scale, v_scale, q.dtype)
        want, _ = reference(q[r : r + 1], k, v, causal=True)
        check(out[r : r + 1], want, torch.bfloat16)


@pytest.mark.parametrize("fp8", FORMATS)
@pytest.mark.parametrize("form", ["combined", "halves", "tuple"])
@pytest.mark.parametrize("page_size", [16, 12])
def test_fp8_paged_prefill_per_head_scales(fp8, form, page_size):
    hq, hkv, d = 8, 2, 128
    kv_lens, qo_lens = [33, 200, 16, 97], [33, 7, 1, 50]
    kv, ids, indptr, last = fp8_cache(kv_lens, page_size, hkv, d, "NHD", fp8)
    cache = {
        "combined": kv,
        "halves": (kv[:, 0], kv[:, 1]),
        "tuple": (kv[:, 0].contiguous(), kv[:, 1].contiguous()),
    }[form]
    k_scale = torch.rand(hkv, device=DEV) * 0.5 + 0.1
    # At most 65504 / 57344, so that the largest e5m2 code stays finite in f16.
    v_scale = torch.rand(hkv, device=DEV) * 0.6 + 0.5
    qo_indptr = torch.tensor([0] + qo_lens).cumsum(0).int()
    q = torch.randn(int(qo_indptr[-1]), hq, d, dtype=torch.float16, device=DEV)
    ws = torch.empty(128 << 20, dtype=torch.uint8, device=DEV)
    w = fi.BatchPrefillWithPagedKVCacheWrapper(ws)
    w.plan(qo_indptr, indptr, ids, last, hq, hkv, d, page_size, causal=True, kv_data_type=fp8)
    o, lse = w.run(q, cache, k_scale=k_scale, v_scale=v_scale, return_lse=True)
    for r in range(len(kv_lens)):
        k, v = dequantized(kv, ids, indptr, last, r, "NHD", page_size, k_scale, v_scale, q.dtype)
        qs = slice(int(qo_indptr[r]), int(qo_indptr[r + 1]))
        want_o, want_lse = reference(q[qs], k, v, causal=True)
        check(o[qs], want_o, torch.float16)
        torch.testing.assert_close(lse[qs].double(), want_lse, atol=2e-3, rtol=1e-3)


@pytest.mark.parametrize("fp8", FORMATS)
@pytest.mark.parametrize("page_size", [16, 5])
def test_fp8_append_copies_codes_on_the_gpu(fp8, page_size):
    hkv, d, hq = 4, 128, 8
    old, new = [10, 0, 31], [7, 20, 1]
    total = [a + b for a, b in zip(old, new)]
    kv, ids, indptr, last = fp8_cache(total, page_size, hkv, d, "NHD", fp8)
    k_new = (torch.randn(sum(new), hkv, d, device=DEV) * 3).to(fp8)
    v_new = (torch.randn(sum(new), hkv, d, device=DEV) * 3).to(fp8)
    indptr_d, last_d = indptr.to(DEV), last.to(DEV)
    seq_lens = fi.get_seq_lens(indptr_d, last_d, page_size)
    append_indptr = torch.tensor([0, *new], device=DEV).cumsum(0).int()
    batch, pos = fi.get_batch_indices_positions(append_indptr, seq_lens, sum(new))
    before = kv.clone()
    fi.append_paged_kv_cache(k_new, v_new, batch, pos, kv, ids.to(DEV), indptr_d, last_d)
    torch.cuda.synchronize()
    codes = kv.view(torch.uint8)
    start = 0
    for r in range(3):
        k, v = gather(codes, ids, indptr, last, r, "NHD", page_size)
        k0, _ = gather(before.view(torch.uint8), ids, indptr, last, r, "NHD", page_size)
        torch.testing.assert_close(k[: old[r]], k0[: old[r]], atol=0, rtol=0)
        new_k = k_new[start : start + new[r]].view(torch.uint8)
        new_v = v_new[start : start + new[r]].view(torch.uint8)
        torch.testing.assert_close(k[old[r] :], new_k, atol=0, rtol=0)
        torch.testing.assert_close(v[old[r] :], new_v, atol=0, rtol=0)
        start += new[r]
    # Rows of another type than the cache's are refused (FlashInfer's append copies elements).
    with pytest.raises(NotImplementedError, match="append_key"):
        fi.append_paged_kv_cache(
            k_new.half(), v_new.half(), batch, pos, kv, ids.to(DEV), indptr_d, last_d
        )
    q = torch.randn(3, hq, d, dtype=torch.float16, device=DEV)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(torch.empty(1 << 20, dtype=torch.uint8, device=DEV))
    w.plan(indptr, ids, last, hq, hkv, d, page_size, kv_data_type=fp8)
    o = w.run(q, kv, k_scale=0.5, v_scale=0.8)
    for r in range(3):
        k, v = dequantized(kv, ids, indptr, last, r, "NHD", page_size, 0.5, 0.8, q.dtype)
        want, _ = reference(q[r : r + 1], k, v, causal=True)
        check(o[r : r + 1], want, torch.float16)


@pytest.mark.parametrize("decode", [False, True])
def test_fp8_matches_the_cpu_backend(decode):
    """The same fp8 calls on torch CPU tensors (the CPU backend, itself checked against the
    float64 reference in test_fp8.py) and on the GPU, pages of 5 tokens, HND."""
    page_size, hq, hkv, d = 5, 8, 2, 64
    kv_lens = [1, 37, 200, 64]
    qo_lens = [1] * 4 if decode else [1, 20, 3, 64]
    kv, ids, indptr, last = fp8_cache(kv_lens, page_size, hkv, d, "HND", torch.float8_e4m3fn)
    qo_indptr = torch.tensor([0] + qo_lens).cumsum(0).int()
    q = torch.randn(int(qo_indptr[-1]), hq, d, dtype=torch.float16, device=DEV)
    results = []
    for dev in (DEV, "cpu"):
        ws = torch.empty(1 << 20, dtype=torch.uint8, device=dev)
        table = (indptr, ids, last, hq, hkv, d, page_size)
        if decode:
            w = fi.BatchDecodeWithPagedKVCacheWrapper(ws, "HND")
            w.plan(*table, kv_data_type=torch.float8_e4m3fn)
        else:
            w = fi.BatchPrefillWithPagedKVCacheWrapper(ws, "HND")
            w.plan(qo_indptr, *table, causal=True, kv_data_type=torch.float8_e4m3fn)
        o, lse = w.run(q.to(dev), kv.to(dev), k_scale=0.2, v_scale=1.5, return_lse=True)
        results.append([x.cpu().double() for x in (o, lse)])
    for got, want in zip(*results):
        torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)


def test_fp8_errors_on_the_gpu():
    hq, hkv, d, page_size = 8, 2, 128, 16
    kv, ids, indptr, last = fp8_cache([20, 3], page_size, hkv, d, "NHD", torch.float8_e5m2)
    q = torch.randn(2, hq, d, dtype=torch.float16, device=DEV)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(torch.empty(1 << 20, dtype=torch.uint8, device=DEV))
    w.plan(indptr, ids, last, hq, hkv, d, page_size, kv_data_type=torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="e5m2"):
        w.run(q, kv)
    with pytest.raises(ValueError, match="paged_kv_cache"):
        w.run(q, kv.half())
    w.plan(indptr, ids, last, hq, hkv, d, page_size)
    with pytest.raises(ValueError, match="paged_kv_cache"):
        w.run(q, kv)
    with pytest.raises(NotImplementedError, match="k_scale"):
        w.run(q, kv.half(), k_scale=0.5)


@pytest.mark.parametrize("fp8", FORMATS)
@pytest.mark.parametrize("kv_layout", ["NHD", "HND"])
def test_fp8_single_decode(fp8, kv_layout):
    hq, hkv, d, kv_len = 32, 8, 128, 333
    k = (torch.randn(kv_len, hkv, d, device=DEV) * 2).to(fp8)
    v = (torch.randn(kv_len, hkv, d, device=DEV) * 2).to(fp8)
    q = torch.randn(hq, d, dtype=torch.bfloat16, device=DEV)
    kk, vv = (x.transpose(0, 1).contiguous() for x in (k, v)) if kv_layout == "HND" else (k, v)
    o, lse = fi.single_decode_with_kv_cache(
        q, kk, vv, kv_layout=kv_layout, k_scale=0.3, v_scale=1.5, return_lse=True
    )
    kd, vd = ((x.float() * s).to(q.dtype) for x, s in ((k, 0.3), (v, 1.5)))
    want_o, want_lse = reference(q[None], kd, vd)
    check(o[None], want_o, torch.bfloat16)
    torch.testing.assert_close(lse[None].double(), want_lse, atol=2e-3, rtol=1e-3)
