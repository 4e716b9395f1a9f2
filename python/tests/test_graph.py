"""``use_cuda_graph=True`` on the CPU backend (numpy buffers): the paged wrappers over the
caller's fixed-capacity index buffers re-plan in place for each new batch (other lengths, other
pages), write the batch into the buffers and run it correctly; FlashInfer's capacity checks and
what the mode refuses. The graph capture itself is checked on a GPU by test_cuda_graph.py."""

import attnforge.flashinfer as fi
import numpy as np
import pytest

from reference import attention, gather_pages

rng = np.random.default_rng()
HQ, HKV, D = 8, 2, 64
NUM_PAGES = 40


def rand(shape):
    return rng.standard_normal(shape).astype(np.float16)


def cache(page_size, layout="NHD"):
    page = (page_size, HKV, D) if layout == "NHD" else (HKV, page_size, D)
    return rand((NUM_PAGES, 2) + page)


def table(kv_lens, page_size):
    """A page table of requests with ``kv_lens`` keys over shuffled pages of the cache."""
    pages_per = [-(-n // page_size) for n in kv_lens]
    ids = rng.permutation(NUM_PAGES)[: sum(pages_per)].astype(np.int32)
    indptr = np.cumsum([0] + pages_per).astype(np.int32)
    last = np.array(
        [0 if p == 0 else n - (p - 1) * page_size for n, p in zip(kv_lens, pages_per)], np.int32
    )
    return indptr, ids, last


def buffers(batch, max_pages):
    return (
        np.zeros(batch + 1, np.int32),
        np.zeros(max_pages, np.int32),
        np.zeros(batch, np.int32),
    )


def check_decode(w, kv, q, indptr, ids, last, layout="NHD", **options):
    o = w.run(q, kv)
    for r in range(len(last)):
        if indptr[r + 1] == indptr[r]:
            assert (o[r] == 0).all(), "a request without keys gets zeros"
            continue
        k, v = gather_pages(kv[:, 0], kv[:, 1], indptr, ids, last, r, layout)
        want, _ = attention(q[r : r + 1], k, v, causal=True, **options)
        np.testing.assert_allclose(o[r : r + 1].astype(np.float64), want, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("page_size", [16, 5])
def test_decode_replans_within_the_buffers(layout, page_size):
    kv = cache(page_size, layout)
    bufs = buffers(3, 30)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(
        np.empty(1, np.uint8),
        layout,
        use_cuda_graph=True,
        paged_kv_indptr_buffer=bufs[0],
        paged_kv_indices_buffer=bufs[1],
        paged_kv_last_page_len_buffer=bufs[2],
    )
    assert w.is_cuda_graph_enabled
    q = rand((3, HQ, D))
    for kv_lens in ([7, 40, 1], [1, 2, 3], [29 * page_size - 2, 0, 1], [50, 17, 64]):
        indptr, ids, last = table(kv_lens, page_size)
        w.plan(indptr, ids, last, HQ, HKV, D, page_size, logits_soft_cap=20.0)
        # The plan is in the caller's buffers, as FlashInfer writes it.
        np.testing.assert_array_equal(bufs[0], indptr)
        np.testing.assert_array_equal(bufs[1][: len(ids)], ids)
        np.testing.assert_array_equal(bufs[2], last)
        check_decode(w, kv, q, indptr, ids, last, layout, soft_cap=20.0)


def test_the_cuda_graph_wrapper_and_fast_decode_plan():
    page_size = 8
    kv = cache(page_size)
    bufs = buffers(2, 20)
    w = fi.CUDAGraphBatchDecodeWithPagedKVCacheWrapper(np.empty(1, np.uint8), *bufs)
    assert w.is_cuda_graph_enabled
    q = rand((2, HQ, D))
    indptr, ids, last = table([30, 9], page_size)
    w.plan(indptr, ids, last, HQ, HKV, D, page_size)
    check_decode(w, kv, q, indptr, ids, last)
    # fast_decode_plan: the caller writes the buffers; the plan reads the arrays it is given.
    indptr, ids, last = table([100, 3], page_size)
    bufs[1][:] = -7
    fi.fast_decode_plan(w, indptr, ids, last, HQ, HKV, D, page_size, q_data_type="float16")
    assert (bufs[1] == -7).all(), "fast_decode_plan leaves the buffers to the caller"
    check_decode(w, kv, q, indptr, ids, last)
    # As FlashInfer's tests use it: bound as the wrapper's plan, with a host copy of indptr.
    w.plan = lambda *a, **k: fi.fast_decode_plan(w, *a, **k)
    indptr, ids, last = table([1, 150], page_size)
    w.plan(indptr + 0, ids, last, HQ, HKV, D, page_size, global_override_indptr_cpu=indptr)
    check_decode(w, kv, q, indptr, ids, last)


def test_capacity_and_fixed_parameters_are_checked():
    page_size = 4
    bufs = buffers(2, 6)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(
        np.empty(1, np.uint8), "NHD", True, False, *bufs
    )
    indptr, ids, last = table([5, 9], page_size)
    w.plan(indptr, ids, last, HQ, HKV, D, page_size)
    with pytest.raises(ValueError, match="fix the batch at"):
        three = table([1, 1, 1], page_size)
        w.plan(*three, HQ, HKV, D, page_size)
    with pytest.raises(ValueError, match="the indices buffer holds at most"):
        w.plan(*table([16, 12], page_size), HQ, HKV, D, page_size)
    # What a captured launch holds by value stays the first plan's.
    with pytest.raises(ValueError, match="sm_scale"):
        w.plan(indptr, ids, last, HQ, HKV, D, page_size, sm_scale=0.5)
    with pytest.raises(ValueError, match="page_size"):
        w.plan(*table([3, 5], 2), HQ, HKV, D, 2)
    with pytest.raises(NotImplementedError, match="pos_encoding_mode"):
        w.plan(indptr, ids, last, HQ, HKV, D, page_size, pos_encoding_mode="ALIBI")
    with pytest.raises(ValueError, match="kv_data_type"):
        w.plan(indptr, ids, last, HQ, HKV, D, page_size, kv_data_type="float8_e4m3fn")
    with pytest.raises(ValueError, match=r"\(the planner's choice\); this plan asks for "
                       r"fixed_split_size: chunks of 64 keys"):
        w.plan(indptr, ids, last, HQ, HKV, D, page_size, fixed_split_size=2)
    # The failed plans left the last good one in place.
    kv = cache(page_size)
    check_decode(w, kv, rand((2, HQ, D)), indptr, ids, last)
    with pytest.raises(NotImplementedError, match="sinks"):
        w.run(rand((2, HQ, D)), kv, sinks=np.zeros(HQ, np.float32))


def test_buffers_are_required_and_the_ragged_wrapper_refuses():
    ws = np.empty(1, np.uint8)
    with pytest.raises(ValueError, match="needs paged_kv_indptr_buffer as a one-dimensional"):
        fi.BatchDecodeWithPagedKVCacheWrapper(
            ws, "NHD", use_cuda_graph=True, paged_kv_last_page_len_buffer=np.zeros(2, np.int32)
        )
    with pytest.raises(ValueError, match="batch size \\+ 1 = 3 entries"):
        fi.CUDAGraphBatchDecodeWithPagedKVCacheWrapper(
            ws, np.zeros(2, np.int32), np.zeros(4, np.int32), np.zeros(2, np.int32)
        )
    with pytest.raises(ValueError, match="needs qo_indptr_buf as a one-dimensional tensor"):
        fi.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD", use_cuda_graph=True)
    with pytest.raises(ValueError, match="kv_indptr_buf"):
        fi.BatchPrefillWithRaggedKVCacheWrapper(
            ws, "NHD", True, np.zeros(3, np.int32), np.zeros(4, np.int32)
        )
    with pytest.raises(TypeError, match="fast_decode_plan"):
        prefill = fi.BatchPrefillWithPagedKVCacheWrapper(ws)
        fi.fast_decode_plan(prefill, None, None, None, 1, 1, 64, 1)


def test_paged_prefill_replans_within_the_first_plans_rows():
    page_size = 16
    kv = cache(page_size)
    qo_buf = np.zeros(3, np.int32)
    indptr_buf, ids_buf, last_buf = buffers(2, 30)
    w = fi.BatchPrefillWithPagedKVCacheWrapper(
        np.empty(1, np.uint8), "NHD", True, qo_buf, indptr_buf, ids_buf, last_buf
    )
    assert w.is_cuda_graph_enabled
    for qo_lens, kv_lens in (([20, 12], [40, 100]), ([31, 1], [31, 300]), ([1, 1], [1, 16])):
        indptr, ids, last = table(kv_lens, page_size)
        qo = np.cumsum([0] + qo_lens).astype(np.int32)
        w.plan(qo, indptr, ids, last, HQ, HKV, D, page_size, causal=True)
        np.testing.assert_array_equal(qo_buf, qo)
        q = rand((qo[-1], HQ, D))
        o = w.run(q, kv)
        for r in range(2):
            k, v = gather_pages(kv[:, 0], kv[:, 1], indptr, ids, last, r, "NHD")
            qs = slice(qo[r], qo[r + 1])
            want, _ = attention(q[qs], k, v, causal=True)
            np.testing.assert_allclose(o[qs].astype(np.float64), want, atol=2e-2, rtol=2e-2)
    with pytest.raises(ValueError, match="may not exceed them"):
        w.plan(np.array([0, 20, 33], np.int32), indptr, ids, last, HQ, HKV, D, page_size)
    with pytest.raises(NotImplementedError, match="custom_mask"):
        mask = np.ones(1 + 16, bool)
        w.plan(np.array([0, 1, 2], np.int32), indptr, ids, last, HQ, HKV, D, page_size,
               custom_mask=mask)


def test_ragged_prefill_replans_within_the_first_plans_rows():
    qo_buf, kv_buf = np.zeros(3, np.int32), np.zeros(3, np.int32)
    w = fi.BatchPrefillWithRaggedKVCacheWrapper(np.empty(1, np.uint8), "NHD", True, qo_buf, kv_buf)
    assert w.is_cuda_graph_enabled
    for qo_lens, kv_lens in (([20, 12], [40, 100]), ([31, 1], [31, 300]), ([0, 2], [5, 2])):
        qo = np.cumsum([0] + qo_lens).astype(np.int32)
        kv = np.cumsum([0] + kv_lens).astype(np.int32)
        w.plan(qo, kv, HQ, HKV, D, causal=True, logits_soft_cap=5.0)
        np.testing.assert_array_equal(qo_buf, qo)
        np.testing.assert_array_equal(kv_buf, kv)
        q, k, v = rand((qo[-1], HQ, D)), rand((kv[-1], HKV, D)), rand((kv[-1], HKV, D))
        o = w.run(q, k, v)
        for r in range(2):
            if qo[r] == qo[r + 1]:
                continue
            qs, ks = slice(qo[r], qo[r + 1]), slice(kv[r], kv[r + 1])
            want, _ = attention(q[qs], k[ks], v[ks], causal=True, soft_cap=5.0)
            np.testing.assert_allclose(o[qs].astype(np.float64), want, atol=2e-2, rtol=2e-2)
    with pytest.raises(ValueError, match="may not exceed them"):
        w.plan(np.array([0, 20, 33], np.int32), kv, HQ, HKV, D, causal=True, logits_soft_cap=5.0)
    with pytest.raises(ValueError, match="fix the batch at"):
        w.plan(np.array([0, 1], np.int32), np.array([0, 1], np.int32), HQ, HKV, D)
    with pytest.raises(ValueError, match="logits_soft_cap|problem"):
        w.plan(qo, kv, HQ, HKV, D, causal=True, logits_soft_cap=6.0)
