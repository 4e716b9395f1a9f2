"""MultiLevelCascadeAttentionWrapper on the CPU backend: a prefix shared by every request (level
0) and each request's own pages (level 1) give the same attention as one paged prefill over
each request's prefix and own pages, and as the float64 reference; fresh random inputs each
run."""

import attnforge.flashinfer as fi
import numpy as np
import pytest

from reference import attention, gather_pages

rng = np.random.default_rng()


def rand(shape):
    return rng.standard_normal(shape).astype(np.float16)


def table(pages_per, lens, page_size, ids):
    """A page table (int32) over ``ids``: ``pages_per[r]`` pages for request r, ``lens[r]`` keys."""
    indptr = np.cumsum([0] + pages_per).astype(np.int32)
    last = np.array([n - (p - 1) * page_size for n, p in zip(lens, pages_per)], np.int32)
    return indptr, np.asarray(ids, np.int32), last


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("causal", [False, True])
def test_two_levels_equal_one_flat_prefill(layout, causal):
    hq, hkv, d, page = 8, 2, 64, 4
    prefix_pages = 3  # the shared prefix: 12 keys, whole pages
    own_lens = [int(n) for n in rng.integers(1, 14, 3)]
    qo_lens = [int(rng.integers(1, n + 1)) for n in own_lens]
    own_pages = [-(-n // page) for n in own_lens]
    num_pages = prefix_pages + sum(own_pages) + 2
    shape = (num_pages, 2, page, hkv, d) if layout == "NHD" else (num_pages, 2, hkv, page, d)
    cache = rand(shape)
    order = rng.permutation(num_pages).astype(np.int32)
    prefix_ids, own_ids = order[:prefix_pages], order[prefix_pages : prefix_pages + sum(own_pages)]
    qo_indptr = np.cumsum([0] + qo_lens).astype(np.int32)
    total_q = int(qo_indptr[-1])

    # Level 0: every query against the prefix, as one request; level 1: each request's own pages.
    shared = table([prefix_pages], [prefix_pages * page], page, prefix_ids)
    own = table(own_pages, own_lens, page, own_ids)
    w = fi.MultiLevelCascadeAttentionWrapper(2, np.empty(1, np.uint8), layout)
    w.plan(
        [np.array([0, total_q], np.int32), qo_indptr],
        [shared[0], own[0]],
        [shared[1], own[1]],
        [shared[2], own[2]],
        hq,
        hkv,
        d,
        page,
        causal=causal,
    )
    q = rand((total_q, hq, d))
    o = w.run(q, cache)

    # The same attention as one paged prefill over each request's prefix pages, then its own.
    flat_ids, start = [], 0
    for n in own_pages:
        flat_ids += list(prefix_ids) + list(own_ids[start : start + n])
        start += n
    flat_pages = [prefix_pages + n for n in own_pages]
    flat = table(flat_pages, [prefix_pages * page + n for n in own_lens], page, flat_ids)
    p = fi.BatchPrefillWithPagedKVCacheWrapper(np.empty(1, np.uint8), layout)
    p.plan(qo_indptr, flat[0], flat[1], flat[2], hq, hkv, d, page, causal=causal)
    want = p.run(q, cache)
    np.testing.assert_allclose(o.astype(np.float32), want.astype(np.float32), atol=2e-3, rtol=2e-3)

    k_all, v_all = cache[:, 0], cache[:, 1]
    for r in range(len(own_lens)):
        k, v = gather_pages(k_all, v_all, flat[0], flat[1], flat[2], r, layout)
        rows = slice(qo_indptr[r], qo_indptr[r + 1])
        ref, _ = attention(q[rows], k, v, causal=causal)
        np.testing.assert_allclose(o[rows].astype(np.float64), ref, atol=2e-2, rtol=2e-2)


def test_one_level_is_the_paged_prefill():
    hq, hkv, d, page = 4, 2, 64, 16
    cache = rand((3, 2, page, hkv, d))
    indptr, ids = np.array([0, 2], np.int32), np.array([2, 0], np.int32)
    last = np.array([5], np.int32)
    q = rand((7, hq, d))
    w = fi.MultiLevelCascadeAttentionWrapper(1, np.empty(1, np.uint8))
    w.begin_forward([[0, 7]], [indptr], [ids], [last], hq, hkv, d, page, causal=True)
    p = fi.BatchPrefillWithPagedKVCacheWrapper(np.empty(1, np.uint8))
    p.plan([0, 7], indptr, ids, last, hq, hkv, d, page, causal=True)
    np.testing.assert_array_equal(w.forward(q, cache), p.run(q, cache))


def test_bad_levels():
    ws = np.empty(1, np.uint8)
    for bad in (0, -1, 1.5, True, "2", np.float64(2.0), np.int64(0)):
        with pytest.raises(ValueError, match="num_levels"):
            fi.MultiLevelCascadeAttentionWrapper(bad, ws)
    with pytest.raises(ValueError, match="qo_indptr_buf_arr"):
        fi.MultiLevelCascadeAttentionWrapper(2, ws, use_cuda_graph=True)
    one = [np.array([0, 1], np.int32)]
    # A numpy integer counts levels as a Python int does: two levels expected of the plan.
    for levels in (2, np.int64(2)):
        w = fi.MultiLevelCascadeAttentionWrapper(levels, ws)
        with pytest.raises(ValueError, match="qo_indptr_arr: has 1 entries; the wrapper has 2 levels"):
            w.plan(one, one * 2, one * 2, one * 2, 4, 2, 64, 16)
    with pytest.raises(NotImplementedError, match="pos_encoding_mode"):
        w.plan(one * 2, one * 2, one * 2, one * 2, 4, 2, 64, 16, pos_encoding_mode="ROPE_LLAMA")


@pytest.mark.parametrize("stage,causal", [("decode", False), ("append", False), ("append", True)])
def test_shared_prefix_wrappers_equal_the_cascade(stage, causal):
    """FlashInfer's deprecated shared-prefix wrappers (the prefix as contiguous K/V) against the
    two-level cascade over the same keys in pages, as FlashInfer's own test compares them."""
    hq, hkv, d, page, batch, unique = 4, 2, 64, 4, 3, 7
    shared_len = 12
    k_shared, v_shared = rand((shared_len, hkv, d)), rand((shared_len, hkv, d))
    unique_pages = -(-unique // page)
    num_pages = shared_len // page + batch * unique_pages
    cache = np.zeros((num_pages, 2, page, hkv, d), np.float16)
    cache[: shared_len // page, 0] = k_shared.reshape(-1, page, hkv, d)
    cache[: shared_len // page, 1] = v_shared.reshape(-1, page, hkv, d)
    own = rand((batch * unique_pages * page, 2, hkv, d))
    cache[shared_len // page :] = own.reshape(-1, page, 2, hkv, d).transpose(0, 2, 1, 3, 4)
    shared = table([shared_len // page], [shared_len], page, np.arange(shared_len // page))
    own_ids = np.arange(shared_len // page, num_pages)
    unique_table = table([unique_pages] * batch, [unique] * batch, page, own_ids)
    rows = batch if stage == "decode" else batch * unique
    q = rand((rows, hq, d))
    qo_indptr = np.arange(batch + 1, dtype=np.int32) * (rows // batch)
    ws = np.empty(1, np.uint8)

    cascade = fi.MultiLevelCascadeAttentionWrapper(2, ws)
    cascade.plan(
        [np.array([0, rows], np.int32), qo_indptr],
        [shared[0], unique_table[0]],
        [shared[1], unique_table[1]],
        [shared[2], unique_table[2]],
        hq,
        hkv,
        d,
        page,
        causal=causal,
    )
    want = cascade.run(q, cache)
    if stage == "decode":
        w = fi.BatchDecodeWithSharedPrefixPagedKVCacheWrapper(ws)
        w.begin_forward(*unique_table, hq, hkv, d, page)
        got = w.forward(q, k_shared, v_shared, cache)
    else:
        w = fi.BatchPrefillWithSharedPrefixPagedKVCacheWrapper(ws)
        w.begin_forward(qo_indptr, *unique_table, hq, hkv, d, page)
        got = w.forward(q, k_shared, v_shared, cache, causal=causal)
    w.end_forward()
    got, want = got.astype(np.float32), want.astype(np.float32)
    np.testing.assert_allclose(got, want, atol=1e-3, rtol=1e-3)
