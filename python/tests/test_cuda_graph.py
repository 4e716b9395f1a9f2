"""``use_cuda_graph=True`` on the CUDA backend: a graph captured once around ``run`` replays every
later ``plan`` (other lengths, other pages, a request holding every page of the buffer, empty
requests), checked against float64 attention after each replay; decode (unsplit, and a long
single request the planner splits, whose merge is in the graph), the CUDAGraph wrapper with
``fast_decode_plan`` over buffers the caller writes on the device, an fp8 cache, paged and ragged
prefill.
Skipped without a CUDA device."""

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("torch.cuda is not available: no GPU here", allow_module_level=True)

import attnforge.flashinfer as fi  # noqa: E402
from test_cuda import DEV, check, gather, reference  # noqa: E402

HQ, HKV, D = 32, 8, 128


def cache(num_pages, page_size, layout, dtype=torch.float16):
    page = (page_size, HKV, D) if layout == "NHD" else (HKV, page_size, D)
    return torch.randn((num_pages, 2) + page, device=DEV).to(dtype)


def table(kv_lens, page_size, num_pages):
    """Device page-table tensors of requests with ``kv_lens`` keys on shuffled pages."""
    pages_per = [-(-n // page_size) for n in kv_lens]
    ids = torch.randperm(num_pages)[: sum(pages_per)].int()
    indptr = torch.tensor([0] + pages_per).cumsum(0).int()
    last = torch.tensor(
        [0 if p == 0 else n - (p - 1) * page_size for n, p in zip(kv_lens, pages_per)]
    ).int()
    return indptr.to(DEV), ids.to(DEV), last.to(DEV)


def check_decode(o, lse, q, kv, indptr, ids, last, layout, page_size, dtype, scale=1.0):
    for r in range(len(last)):
        if int(indptr[r + 1]) == int(indptr[r]):
            assert (o[r] == 0).all(), f"request {r} has no key"
            continue
        k, v = gather(kv.float() * scale, ids, indptr, last, r, layout, page_size)
        want, want_lse = reference(q[r : r + 1], k, v)
        check(o[r : r + 1], want, dtype)
        if lse is not None:
            torch.testing.assert_close(lse[r : r + 1].double(), want_lse, atol=1e-3, rtol=1e-3)


def capture(run):
    """Warms ``run`` up on a side stream (as FlashInfer's tests do), then captures it."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        run()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = run()
    return g, out


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("page_size", [1, 16, 5])
@pytest.mark.parametrize(
    "batch,max_pages,lens",
    [
        # Many requests: the capacity's decode is not split.
        (12, 600, [[54] * 12, [1] * 12, [500, 0, 3, 17, 64, 1000, 2, 2, 2, 2, 2, 2]]),
        # One long request: the planner splits its keys; the merge is captured too.
        (1, 512, [[3000], [1], [16], [6000]]),
    ],
)
def test_decode_graph_replays_every_plan(layout, page_size, batch, max_pages, lens):
    num_pages = max_pages * 16 // page_size if page_size < 16 else max_pages + 5
    kv = cache(num_pages, page_size, layout)
    max_ids = min(max_pages * 16 // page_size, num_pages)
    bufs = (
        torch.empty(batch + 1, dtype=torch.int32, device=DEV),
        torch.empty(max_ids, dtype=torch.int32, device=DEV),
        torch.empty(batch, dtype=torch.int32, device=DEV),
    )
    ws = torch.empty(128 << 20, dtype=torch.uint8, device=DEV)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(
        ws,
        layout,
        use_cuda_graph=True,
        paged_kv_indptr_buffer=bufs[0],
        paged_kv_indices_buffer=bufs[1],
        paged_kv_last_page_len_buffer=bufs[2],
    )
    q = torch.randn(batch, HQ, D, dtype=torch.float16, device=DEV)
    plans = [table(kv_lens, page_size, num_pages) for kv_lens in lens]
    w.plan(*plans[0], HQ, HKV, D, page_size, q_data_type=torch.float16)
    g, (o, lse) = capture(lambda: w.run(q, kv, return_lse=True))
    for indptr, ids, last in plans:
        w.plan(indptr, ids, last, HQ, HKV, D, page_size, q_data_type=torch.float16)
        assert torch.equal(bufs[1][: len(ids)], ids) and torch.equal(bufs[0], indptr)
        o.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        check_decode(o, lse, q, kv, indptr, ids, last, layout, page_size, torch.float16)


def test_the_cuda_graph_wrapper_with_fast_decode_plan():
    """As serving engines drive it: the caller writes the buffers on the device, then plans
    with fast_decode_plan over them and a host copy of indptr, then replays."""
    batch, page_size, num_pages = 4, 16, 200
    kv = cache(num_pages, page_size, "NHD", torch.bfloat16)
    indptr_buf = torch.zeros(batch + 1, dtype=torch.int32, device=DEV)
    ids_buf = torch.zeros(num_pages, dtype=torch.int32, device=DEV)
    last_buf = torch.zeros(batch, dtype=torch.int32, device=DEV)
    ws = torch.empty(128 << 20, dtype=torch.uint8, device=DEV)
    w = fi.CUDAGraphBatchDecodeWithPagedKVCacheWrapper(ws, indptr_buf, ids_buf, last_buf, "NHD")
    q = torch.randn(batch, HQ, D, dtype=torch.bfloat16, device=DEV)
    first = table([100, 1, 40, 7], page_size, num_pages)
    w.plan(*first, HQ, HKV, D, page_size, q_data_type=torch.bfloat16)
    w.plan = lambda *a, **k: fi.fast_decode_plan(w, *a, **k)
    g, o = capture(lambda: w.run(q, kv))
    for kv_lens in ([16, 16, 16, 16], [3000, 1, 0, 5], [1, 2, 3, 4]):
        indptr, ids, last = table(kv_lens, page_size, num_pages)
        indptr_buf.copy_(indptr)
        ids_buf[: len(ids)].copy_(ids)
        last_buf.copy_(last)
        w.plan(
            indptr_buf,
            ids_buf[: len(ids)],
            last_buf,
            HQ,
            HKV,
            D,
            page_size,
            q_data_type=torch.bfloat16,
            global_override_indptr_cpu=indptr.cpu(),
        )
        o.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        check_decode(o, None, q, kv, indptr, ids, last, "NHD", page_size, torch.bfloat16)


def test_fp8_decode_graph_replays_every_plan():
    batch, page_size, num_pages = 5, 16, 120
    kv = (torch.randn((num_pages, 2, page_size, HKV, D), device=DEV) * 2).to(torch.float8_e4m3fn)
    bufs = [torch.empty(n, dtype=torch.int32, device=DEV) for n in (batch + 1, num_pages, batch)]
    ws = torch.empty(128 << 20, dtype=torch.uint8, device=DEV)
    w = fi.CUDAGraphBatchDecodeWithPagedKVCacheWrapper(ws, *bufs)
    q = torch.randn(batch, HQ, D, dtype=torch.float16, device=DEV)
    options = dict(data_type=torch.float8_e4m3fn, q_data_type=torch.float16)
    w.plan(*table([16] * batch, page_size, num_pages), HQ, HKV, D, page_size, **options)
    g, o = capture(lambda: w.run(q, kv, k_scale=0.5, v_scale=0.5))
    for kv_lens in ([1, 2, 3, 4, 5], [700, 300, 1, 0, 800]):
        indptr, ids, last = table(kv_lens, page_size, num_pages)
        w.plan(indptr, ids, last, HQ, HKV, D, page_size, **options)
        g.replay()
        torch.cuda.synchronize()
        check_decode(o, None, q, kv, indptr, ids, last, "NHD", page_size, torch.float16, 0.5)


def test_paged_prefill_graph_replays_every_plan():
    batch, page_size, num_pages = 3, 16, 100
    kv = cache(num_pages, page_size, "NHD")
    qo_buf = torch.empty(batch + 1, dtype=torch.int32, device=DEV)
    bufs = [torch.empty(n, dtype=torch.int32, device=DEV) for n in (batch + 1, num_pages, batch)]
    ws = torch.empty(128 << 20, dtype=torch.uint8, device=DEV)
    w = fi.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD", True, qo_buf, *bufs)
    rows = 200
    q = torch.randn(rows, HQ, D, dtype=torch.float16, device=DEV)
    runs = [([100, 50, 50], [100, 300, 60]), ([1, 1, 198], [1, 16, 1000]), ([7, 0, 3], [7, 9, 3])]
    first = table(runs[0][1], page_size, num_pages)
    qo_first = torch.tensor([0, 100, 150, 200], dtype=torch.int32)
    w.plan(qo_first, *first, HQ, HKV, D, page_size, causal=True)
    g, o = capture(lambda: w.run(q, kv))
    for qo_lens, kv_lens in runs:
        indptr, ids, last = table(kv_lens, page_size, num_pages)
        qo = torch.tensor([0] + qo_lens).cumsum(0).int()
        w.plan(qo, indptr, ids, last, HQ, HKV, D, page_size, causal=True)
        o.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        for r in range(batch):
            qs = slice(int(qo[r]), int(qo[r + 1]))
            if qs.start == qs.stop:
                continue
            k, v = gather(kv, ids, indptr, last, r, "NHD", page_size)
            want, _ = reference(q[qs], k, v, causal=True)
            check(o[qs], want, torch.float16)


def test_a_replan_beyond_the_captured_cache_is_refused():
    batch, page_size = 2, 16
    kv = cache(10, page_size, "NHD")
    bufs = [torch.empty(n, dtype=torch.int32, device=DEV) for n in (batch + 1, 40, batch)]
    w = fi.CUDAGraphBatchDecodeWithPagedKVCacheWrapper(torch.empty(1, device=DEV), *bufs)
    q = torch.randn(batch, HQ, D, dtype=torch.float16, device=DEV)
    w.plan(*table([16, 16], page_size, 10), HQ, HKV, D, page_size)
    w.run(q, kv)
    ids = torch.tensor([3, 25], dtype=torch.int32, device=DEV)
    indptr = torch.tensor([0, 1, 2], dtype=torch.int32, device=DEV)
    last = torch.tensor([16, 16], dtype=torch.int32, device=DEV)
    with pytest.raises(ValueError, match="page id 25"):
        w.plan(indptr, ids, last, HQ, HKV, D, page_size)


def test_ragged_prefill_graph_replays_every_plan():
    batch, rows, keys = 3, 200, 900
    qo_buf = torch.empty(batch + 1, dtype=torch.int32, device=DEV)
    kv_buf = torch.empty(batch + 1, dtype=torch.int32, device=DEV)
    ws = torch.empty(128 << 20, dtype=torch.uint8, device=DEV)
    w = fi.BatchPrefillWithRaggedKVCacheWrapper(ws, "NHD", True, qo_buf, kv_buf)
    q = torch.randn(rows, HQ, D, dtype=torch.bfloat16, device=DEV)
    k = torch.randn(keys, HKV, D, dtype=torch.bfloat16, device=DEV)
    v = torch.randn(keys, HKV, D, dtype=torch.bfloat16, device=DEV)
    runs = [([100, 50, 50], [300, 300, 300]), ([1, 198, 1], [1, 800, 99]), ([3, 0, 7], [3, 5, 7])]
    options = dict(causal=True, q_data_type=torch.bfloat16)
    first = (torch.tensor([0, 100, 150, 200]), torch.tensor([0, 300, 600, 900]))
    w.plan(*first, HQ, HKV, D, **options)
    g, o = capture(lambda: w.run(q, k, v))
    for qo_lens, kv_lens in runs:
        qo = torch.tensor([0] + qo_lens).cumsum(0).int()
        kv = torch.tensor([0] + kv_lens).cumsum(0).int()
        w.plan(qo, kv, HQ, HKV, D, **options)
        o.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        for r in range(batch):
            qs, ks = slice(int(qo[r]), int(qo[r + 1])), slice(int(kv[r]), int(kv[r + 1]))
            if qs.start == qs.stop:
                continue
            want, _ = reference(q[qs], k[ks], v[ks], causal=True)
            check(o[qs], want, torch.bfloat16)
