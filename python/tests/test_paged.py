"""The paged wrappers (prefill and decode), append_paged_kv_cache and the merges on the CPU
backend, against the float64 reference, with fresh random inputs each run."""

import attnforge.flashinfer as fi
import numpy as np
import pytest

from pages import check_appended, shuffled_cache
from reference import attention, gather_pages

rng = np.random.default_rng()
LN2 = np.log(2.0)


def rand(shape, dtype=np.float16):
    return rng.standard_normal(shape).astype(dtype)


def make_cache(kv_lens, page_size, hkv, d, layout, combined):
    """A cache holding random pages in a shuffled order, and its page table."""
    return shuffled_cache(kv_lens, page_size, hkv, d, layout, combined, rand)


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("combined", [False, True])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("page_size", [16, 5])
def test_paged_prefill(layout, combined, causal, page_size):
    hq, hkv, d = 8, 2, 128
    kv_lens = [int(n) for n in rng.integers(20, 100, 4)]
    qo_lens = [int(rng.integers(1, n + 1)) for n in kv_lens]
    cache, (ck, cv), ids, indptr, last = make_cache(kv_lens, page_size, hkv, d, layout, combined)
    qo_indptr = np.cumsum([0] + qo_lens).astype(np.int32)
    q = rand((qo_indptr[-1], hq, d))
    w = fi.BatchPrefillWithPagedKVCacheWrapper(np.empty(1, np.uint8), layout)
    w.plan(qo_indptr, indptr, ids, last, hq, hkv, d, page_size, causal=causal)
    o, lse = w.run(q, cache, return_lse=True)
    for r in range(len(kv_lens)):
        k, v = gather_pages(ck, cv, indptr, ids, last, r, layout)
        qs = slice(qo_indptr[r], qo_indptr[r + 1])
        want_o, want_lse = attention(q[qs], k, v, causal=causal)
        np.testing.assert_allclose(o[qs].astype(np.float64), want_o, atol=2e-2, rtol=2e-2)
        np.testing.assert_allclose(lse[qs], want_lse, atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("window_left,cap", [(-1, None), (20, None), (-1, 10.0)])
@pytest.mark.parametrize("page_size", [8, 12])
def test_decode(layout, window_left, cap, page_size):
    hq, hkv, d = 8, 8, 64
    kv_lens = [int(n) for n in rng.integers(1, 70, 6)]
    cache, (ck, cv), ids, indptr, last = make_cache(kv_lens, page_size, hkv, d, layout, True)
    q = rand((len(kv_lens), hq, d))
    w = fi.BatchDecodeWithPagedKVCacheWrapper(np.empty(1, np.uint8), layout)
    w.plan(indptr, ids, last, hq, hkv, d, page_size, window_left=window_left, logits_soft_cap=cap)
    o = w.run(q, cache)
    for r in range(len(kv_lens)):
        k, v = gather_pages(ck, cv, indptr, ids, last, r, layout)
        want, _ = attention(q[r : r + 1], k, v, causal=True, window_left=window_left, soft_cap=cap)
        np.testing.assert_allclose(o[r : r + 1].astype(np.float64), want, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("decode", [False, True])
def test_page_ids_past_the_indptr_are_not_read(decode):
    """As FlashInfer, a page-id array longer than ``indptr[-1]`` (a buffer, or the ids of a
    larger batch replanned for its first requests) is read only up to ``indptr[-1]``; the rest,
    here out of range, is ignored."""
    hq, hkv, d, page_size = 4, 2, 64, 8
    kv_lens = [30, 9, 17]
    cache, (ck, cv), ids, indptr, last = make_cache(kv_lens, page_size, hkv, d, "NHD", True)
    longer = np.concatenate([ids, np.array([-7, 10**6], np.int32)])
    q = rand((len(kv_lens), hq, d))
    qo_indptr = np.arange(len(kv_lens) + 1, dtype=np.int32)
    if decode:
        w = fi.BatchDecodeWithPagedKVCacheWrapper(np.empty(1, np.uint8))
        w.plan(indptr[:3], longer, last[:2], hq, hkv, d, page_size)
    else:
        w = fi.BatchPrefillWithPagedKVCacheWrapper(np.empty(1, np.uint8))
        w.plan(qo_indptr[:3], indptr[:3], longer, last[:2], hq, hkv, d, page_size, causal=True)
    o = w.run(q[:2], cache)
    for r in range(2):
        k, v = gather_pages(ck, cv, indptr, ids, last, r, "NHD")
        want, _ = attention(q[r : r + 1], k, v, causal=True)
        np.testing.assert_allclose(o[r : r + 1].astype(np.float64), want, atol=2e-2, rtol=2e-2)
    # Fewer ids than indptr[-1] is still an error.
    with pytest.raises(ValueError, match="kv_page_indices"):
        w.plan(*((qo_indptr,) if not decode else ()), indptr, ids[:-1], last, hq, hkv, d, page_size)


@pytest.mark.parametrize("page_size", [4, 5])
def test_append_then_decode(page_size):
    hkv, d = 2, 64
    old = [5, 0, 9]
    new = [3, 2, 1]
    total = [a + b for a, b in zip(old, new)]
    cache, (ck, cv), ids, indptr, last = make_cache(total, page_size, hkv, d, "NHD", False)
    before = (ck.copy(), cv.copy())
    k_new, v_new = rand((sum(new), hkv, d)), rand((sum(new), hkv, d))
    seq_lens = fi.get_seq_lens(indptr, last, page_size)
    np.testing.assert_array_equal(seq_lens, total)
    append_indptr = np.cumsum([0, *new]).astype(np.int32)
    batch, pos = fi.get_batch_indices_positions(append_indptr, seq_lens, sum(new))
    np.testing.assert_array_equal(batch, np.repeat(np.arange(3), new))
    np.testing.assert_array_equal(
        pos, np.concatenate([np.arange(o, o + n) for o, n in zip(old, new)])
    )
    fi.append_paged_kv_cache(k_new, v_new, batch, pos, cache, ids, indptr, last, "NHD")
    check_appended((ck, cv), before, (ids, indptr, last), old, new, (k_new, v_new))
    with pytest.raises(NotImplementedError, match="positions"):
        fi.append_paged_kv_cache(k_new, v_new, batch, pos[::-1].copy(), cache, ids, indptr, last)


def merged_reference(vs, ss):
    """float64 merge of states (base-2 LSEs)."""
    s = np.stack([x.astype(np.float64) for x in ss])
    m = s.max(axis=0)
    w = np.exp2(s - m)
    total = w.sum(axis=0)
    v = sum(w[i][..., None] * vs[i].astype(np.float64) for i in range(len(vs))) / total[..., None]
    return v, m + np.log2(total)


def test_merge_state():
    seq, h, d = 11, 4, 64
    v_a, v_b = rand((seq, h, d)), rand((seq, h, d))
    s_a, s_b = rand((seq, h), np.float32) * 4, rand((seq, h), np.float32) * 4
    v, s = fi.merge_state(v_a, s_a, v_b, s_b)
    want_v, want_s = merged_reference([v_a, v_b], [s_a, s_b])
    np.testing.assert_allclose(v.astype(np.float64), want_v, atol=2e-3, rtol=2e-3)
    np.testing.assert_allclose(s, want_s, atol=1e-5, rtol=1e-5)
    mask = rng.random(seq) < 0.5
    v_in, s_in = v_a.copy(), s_a.copy()
    fi.merge_state_in_place(v_in, s_in, v_b, s_b, mask=mask)
    np.testing.assert_array_equal(v_in[mask], v[mask])
    np.testing.assert_array_equal(v_in[~mask], v_a[~mask])
    np.testing.assert_array_equal(s_in[~mask], s_a[~mask])


def test_merge_states_matches_split_attention():
    """Attention over two halves of the keys, merged, equals attention over all of them."""
    q, k, v = rand((9, 4, 64)), rand((50, 4, 64)), rand((50, 4, 64))
    o1, l1 = fi.single_prefill_with_kv_cache(q, k[:20], v[:20], return_lse=True)
    o2, l2 = fi.single_prefill_with_kv_cache(q, k[20:], v[20:], return_lse=True)
    o, lse = fi.merge_states(np.stack([o1, o2], axis=1), np.stack([l1, l2], axis=1))
    want_o, want_lse = attention(q, k, v)
    np.testing.assert_allclose(o.astype(np.float64), want_o, atol=2e-2, rtol=2e-2)
    np.testing.assert_allclose(lse, want_lse, atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("decode", [False, True])
def test_paged_wrappers_alibi(decode):
    page_size, h, d = 5, 4, 64
    kv_lens = [7, 1, 23]
    qo_lens = [1, 1, 1] if decode else [3, 1, 23]
    cache, (ck, cv), ids, indptr, last = make_cache(kv_lens, page_size, h, d, "NHD", True)
    qo_indptr = np.cumsum([0, *qo_lens])
    q = rand((qo_indptr[-1], h, d))
    ws = np.empty(1, np.uint8)
    if decode:
        w = fi.BatchDecodeWithPagedKVCacheWrapper(ws)
        w.plan(indptr, ids, last, h, h, d, page_size, pos_encoding_mode="ALIBI")
    else:
        w = fi.BatchPrefillWithPagedKVCacheWrapper(ws)
        w.plan(
            qo_indptr, indptr, ids, last, h, h, d, page_size, causal=True, pos_encoding_mode="ALIBI"
        )
    o, lse = w.run(q, cache, return_lse=True)
    n = 2 ** int(np.floor(np.log2(h)))
    slopes = [2.0 ** (-8.0 * i / n) for i in range(1, n + 1)]
    for r in range(len(kv_lens)):
        k, v = gather_pages(ck, cv, indptr, ids, last, r, "NHD")
        qs = slice(qo_indptr[r], qo_indptr[r + 1])
        want_o, want_lse = attention(q[qs], k, v, causal=not decode, alibi=slopes)
        np.testing.assert_allclose(o[qs].astype(np.float64), want_o, atol=2e-2, rtol=2e-2)
        np.testing.assert_allclose(lse[qs], want_lse, atol=2e-3, rtol=1e-3)


@pytest.mark.parametrize("decode", [False, True])
def test_paged_wrappers_sinks(decode):
    page_size, hq, hkv, d = 12, 8, 2, 64
    kv_lens = [30, 1, 5, 13]
    qo_lens = [1, 1, 1, 1] if decode else [4, 1, 2, 13]
    cache, (ck, cv), ids, indptr, last = make_cache(kv_lens, page_size, hkv, d, "HND", False)
    qo_indptr = np.cumsum([0, *qo_lens])
    q = rand((qo_indptr[-1], hq, d))
    ws = np.empty(1, np.uint8)
    if decode:
        w = fi.BatchDecodeWithPagedKVCacheWrapper(ws, "HND")
        w.plan(indptr, ids, last, hq, hkv, d, page_size)
    else:
        w = fi.BatchPrefillWithPagedKVCacheWrapper(ws, "HND")
        w.plan(qo_indptr, indptr, ids, last, hq, hkv, d, page_size, causal=True)
    for _ in range(2):  # new sink values each time: a plan for each
        sinks = rng.random(hq).astype(np.float32) * 4
        o, lse = w.run(q, cache, sinks=sinks, return_lse=True)
        for r in range(len(kv_lens)):
            qs = slice(qo_indptr[r], qo_indptr[r + 1])
            k, v = gather_pages(ck, cv, indptr, ids, last, r, "HND")
            want_o, want_lse = attention(q[qs], k, v, causal=not decode, sinks=sinks)
            np.testing.assert_allclose(o[qs].astype(np.float64), want_o, atol=2e-2, rtol=2e-2)
            np.testing.assert_allclose(lse[qs], want_lse, atol=2e-3, rtol=1e-3)
    # Without sinks the plan's own batch runs as before.
    o = w.run(q, cache)
    k, v = gather_pages(ck, cv, indptr, ids, last, 0, "HND")
    want_o, _ = attention(q[: qo_lens[0]], k, v, causal=not decode)
    np.testing.assert_allclose(o[: qo_lens[0]].astype(np.float64), want_o, atol=2e-2, rtol=2e-2)
