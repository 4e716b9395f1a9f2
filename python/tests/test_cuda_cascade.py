"""MultiLevelCascadeAttentionWrapper on torch CUDA tensors: a prefix shared by every request
(level 0) and each request's own pages (level 1) against the float64 reference over each
request's prefix and own pages, directly and replayed from a CUDA graph over the caller's
buffers. Skipped without a CUDA device."""

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("torch.cuda is not available: no GPU here", allow_module_level=True)

import attnforge.flashinfer as fi  # noqa: E402
from test_cuda import DEV, check, gather, reference  # noqa: E402


def levels(page_size, prefix_pages, own_lens, qo_lens, num_pages):
    """Level tables (int32, on the GPU) over shuffled page ids: the shared prefix, each
    request's own pages; and each request's flat table (prefix pages, then its own)."""
    own_pages = [-(-n // page_size) for n in own_lens]
    order = torch.randperm(num_pages).int()
    prefix, own = order[:prefix_pages], order[prefix_pages : prefix_pages + sum(own_pages)]
    qo = torch.tensor([0] + qo_lens).cumsum(0).int()
    shared = (
        torch.tensor([0, int(qo[-1])]).int(),
        torch.tensor([0, prefix_pages]).int(),
        prefix,
        torch.tensor([page_size]).int(),
    )
    per_request = (
        qo,
        torch.tensor([0] + own_pages).cumsum(0).int(),
        own,
        torch.tensor([n - (p - 1) * page_size for n, p in zip(own_lens, own_pages)]).int(),
    )
    flat_ids, start = [], 0
    for n in own_pages:
        flat_ids.append(torch.cat([prefix, own[start : start + n]]))
        start += n
    flat = (
        torch.cat(flat_ids),
        torch.tensor([0] + [prefix_pages + n for n in own_pages]).cumsum(0).int(),
        per_request[3],
    )
    to = lambda t: tuple(x.to(DEV) for x in t)  # noqa: E731
    return to(shared), to(per_request), flat


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("graph", [False, True])
def test_two_levels(layout, graph):
    page_size, hq, hkv, d = 16, 8, 2, 128
    own_lens, qo_lens = [40, 3, 130], [40, 1, 17]
    prefix_pages, num_pages = 8, 40
    shared, own, (flat_ids, flat_indptr, flat_last) = levels(
        page_size, prefix_pages, own_lens, qo_lens, num_pages
    )
    page = (page_size, hkv, d) if layout == "NHD" else (hkv, page_size, d)
    kv = torch.randn((num_pages, 2) + page, dtype=torch.float16, device=DEV)
    q = torch.randn(sum(qo_lens), hq, d, dtype=torch.float16, device=DEV)
    ws = torch.empty(128 << 20, dtype=torch.uint8, device=DEV)
    tables = [list(t) for t in zip(shared, own)]
    if graph:
        bufs = [[torch.empty_like(x) for x in level] for level in (shared, own)]
        w = fi.MultiLevelCascadeAttentionWrapper(
            2, ws, layout, True, *[[b[i] for b in bufs] for i in range(4)]
        )
    else:
        w = fi.MultiLevelCascadeAttentionWrapper(2, ws, layout)
    w.plan(*tables, hq, hkv, d, page_size, causal=True)
    if graph:
        w.run(q, kv)  # warm-up: kernels compiled before the capture
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            o = w.run(q, kv)
        g.replay()
    else:
        o = w.run(q, kv)
    torch.cuda.synchronize()
    for r in range(len(own_lens)):
        k, v = gather(kv, flat_ids, flat_indptr, flat_last, r, layout, page_size)
        rows = slice(sum(qo_lens[:r]), sum(qo_lens[: r + 1]))
        want, _ = reference(q[rows], k, v, causal=True)
        check(o[rows], want, torch.float16)
