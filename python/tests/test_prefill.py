"""single_prefill_with_kv_cache and BatchPrefillWithRaggedKVCacheWrapper on the CPU backend,
against the float64 reference, with fresh random inputs each run."""

import attnforge.flashinfer as fi
import numpy as np
import pytest

from reference import attention

rng = np.random.default_rng()
TOL = {np.float16: 2e-2, np.float32: 1e-4}


def rand(shape, dtype):
    return rng.standard_normal(shape).astype(dtype)


def close(got, want, dtype):
    np.testing.assert_allclose(
        np.asarray(got, dtype=np.float64), want, atol=TOL[dtype], rtol=TOL[dtype]
    )


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kv_layout", ["NHD", "HND"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_single_prefill(dtype, causal, kv_layout, head_dim):
    qo, kv, hq, hkv = 37, 53, 8, 2
    q = rand((qo, hq, head_dim), dtype)
    k = rand((kv, hkv, head_dim), dtype)
    v = rand((kv, hkv, head_dim), dtype)
    kk, vv = (
        (np.ascontiguousarray(np.swapaxes(x, 0, 1)) for x in (k, v))
        if kv_layout == "HND"
        else (k, v)
    )
    o, lse = fi.single_prefill_with_kv_cache(
        q, kk, vv, causal=causal, kv_layout=kv_layout, return_lse=True
    )
    assert isinstance(o, np.ndarray) and o.dtype == dtype and o.shape == (qo, hq, head_dim)
    want_o, want_lse = attention(q, k, v, causal=causal)
    close(o, want_o, dtype)
    np.testing.assert_allclose(lse, want_lse, atol=1e-3, rtol=1e-3)
    # return_lse=False returns the output alone.
    o2 = fi.single_prefill_with_kv_cache(q, kk, vv, causal=causal, kv_layout=kv_layout)
    assert isinstance(o2, np.ndarray)
    close(o2, want_o, dtype)


@pytest.mark.parametrize("cap,window,scale", [(30.0, -1, None), (None, 16, None), (5.0, 7, 0.05)])
def test_single_prefill_variants(cap, window, scale):
    q, k, v = (
        rand((40, 4, 64), np.float32),
        rand((64, 4, 64), np.float32),
        rand((64, 4, 64), np.float32),
    )
    o = fi.single_prefill_with_kv_cache(
        q, k, v, causal=True, window_left=window, logits_soft_cap=cap, sm_scale=scale
    )
    want, _ = attention(q, k, v, causal=True, window_left=window, soft_cap=cap, sm_scale=scale)
    close(o, want, np.float32)


def test_single_prefill_custom_mask_and_noncontiguous():
    qo, kv = 19, 33
    q = rand((qo, 4, 128), np.float16)
    # A non-contiguous k: every other token of a larger array.
    k = rand((2 * kv, 2, 128), np.float16)[::2]
    v = rand((kv, 2, 128), np.float16)
    mask = rng.random((qo, kv)) < 0.6
    o = fi.single_prefill_with_kv_cache(q, k, v, custom_mask=mask)
    want, _ = attention(q, k, v, mask=mask)
    close(o, want, np.float16)
    packed = np.packbits(mask.reshape(-1), bitorder="little")
    o2 = fi.single_prefill_with_kv_cache(q, k, v, packed_custom_mask=packed, causal=True)
    close(o2, want, np.float16)


def test_fp16_qk_reduction():
    q, k, v = (
        rand((16, 4, 64), np.float16),
        rand((24, 4, 64), np.float16),
        rand((24, 4, 64), np.float16),
    )
    o = fi.single_prefill_with_kv_cache(q, k, v, causal=True, use_fp16_qk_reduction=True)
    want, _ = attention(q, k, v, causal=True)
    close(o, want, np.float16)


@pytest.mark.parametrize("causal", [False, True])
def test_batch_ragged(causal):
    lens = [(int(a), int(b)) for a, b in zip(rng.integers(1, 40, 5), rng.integers(40, 90, 5))]
    qo_indptr = np.cumsum([0] + [a for a, _ in lens]).astype(np.int32)
    kv_indptr = np.cumsum([0] + [b for _, b in lens]).astype(np.int32)
    hq, hkv, d = 8, 4, 64
    q = rand((qo_indptr[-1], hq, d), np.float16)
    k = rand((kv_indptr[-1], hkv, d), np.float16)
    v = rand((kv_indptr[-1], hkv, d), np.float16)
    w = fi.BatchPrefillWithRaggedKVCacheWrapper(np.empty(1, np.uint8), "NHD")
    w.plan(qo_indptr, kv_indptr, hq, hkv, d, causal=causal, q_data_type="float16")
    out = np.empty((qo_indptr[-1], hq, d), np.float16)
    o, lse = w.run(q, k, v, out=out, return_lse=True)
    assert o is out
    for r in range(len(lens)):
        qs, ks = slice(qo_indptr[r], qo_indptr[r + 1]), slice(kv_indptr[r], kv_indptr[r + 1])
        want_o, want_lse = attention(q[qs], k[ks], v[ks], causal=causal)
        close(o[qs], want_o, np.float16)
        np.testing.assert_allclose(lse[qs], want_lse, atol=1e-3, rtol=1e-3)
    # run_return_lse is run(return_lse=True).
    o2, _ = w.run_return_lse(q, k, v)
    np.testing.assert_array_equal(o2, o)


def test_non_causal_window_and_window_over_a_custom_mask():
    q, k, v = (
        rand((30, 4, 64), np.float16),
        rand((50, 2, 64), np.float16),
        rand((50, 2, 64), np.float16),
    )
    o = fi.single_prefill_with_kv_cache(q, k, v, window_left=9)
    want, _ = attention(q, k, v, window_left=9)
    close(o, want, np.float16)
    mask = rng.random((30, 50)) < 0.8
    packed = np.packbits(mask.reshape(-1), bitorder="little")
    o2 = fi.single_prefill_with_kv_cache(q, k, v, packed_custom_mask=packed, window_left=12)
    want2, _ = attention(q, k, v, mask=mask, window_left=12)
    close(o2, want2, np.float16)


def flashinfer_slopes(num_heads):
    """FlashInfer's ALiBi slopes (its tests' reference)."""
    n = 2 ** int(np.floor(np.log2(num_heads)))
    slopes = [2.0 ** (-8.0 * i / n) for i in range(1, n + 1)]
    return slopes + [2.0 ** (-4.0 * i / n) for i in range(1, 2 * (num_heads - n), 2)]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("num_heads", [8, 12])
def test_alibi(causal, num_heads):
    q = rand((33, num_heads, 128), np.float32)
    k, v = rand((70, num_heads, 128), np.float32), rand((70, num_heads, 128), np.float32)
    o, lse = fi.single_prefill_with_kv_cache(
        q, k, v, causal=causal, pos_encoding_mode="ALIBI", return_lse=True
    )
    slopes = flashinfer_slopes(num_heads)
    want_o, want_lse = attention(q, k, v, causal=causal, alibi=slopes)
    close(o, want_o, np.float32)
    np.testing.assert_allclose(lse, want_lse, atol=1e-3, rtol=1e-4)


@pytest.mark.parametrize("kv_layout", ["NHD", "HND"])
@pytest.mark.parametrize("window,cap", [(-1, None), (20, None), (-1, 30.0)])
def test_single_decode(kv_layout, window, cap):
    kv, hq, hkv, d = 77, 8, 2, 64
    q = rand((hq, d), np.float32)
    k = rand((kv, hkv, d), np.float32)
    v = rand((kv, hkv, d), np.float32)
    kk, vv = (
        (np.ascontiguousarray(np.swapaxes(x, 0, 1)) for x in (k, v))
        if kv_layout == "HND"
        else (k, v)
    )
    o, lse = fi.single_decode_with_kv_cache(
        q, kk, vv, kv_layout=kv_layout, window_left=window, logits_soft_cap=cap, return_lse=True
    )
    assert o.shape == (hq, d) and lse.shape == (hq,)
    # The decode query is the newest token: position kv_len - 1 of a causal prefill.
    want_o, want_lse = attention(q[None], k, v, causal=True, window_left=window, soft_cap=cap)
    close(o, want_o[0], np.float32)
    np.testing.assert_allclose(lse, want_lse[0], atol=1e-3, rtol=1e-3)
    with pytest.raises(ValueError):
        fi.single_decode_with_kv_cache(q[None], kk, vv, kv_layout=kv_layout)


def test_single_prefill_plans_are_kept_by_shape_and_options():
    fi._SINGLE_PLANS.clear()
    q = rand((9, 4, 64), np.float32)
    k, v = rand((21, 2, 64), np.float32), rand((21, 2, 64), np.float32)
    first = fi.single_prefill_with_kv_cache(q, k, v, causal=True)
    again = fi.single_prefill_with_kv_cache(q, k, v, causal=True)
    assert len(fi._SINGLE_PLANS) == 1
    np.testing.assert_array_equal(first, again)
    close(again, attention(q, k, v, causal=True)[0], np.float32)
    # Other options are another plan; a custom mask is planned per call and not kept.
    fi.single_prefill_with_kv_cache(q, k, v, causal=False)
    mask = rng.random((9, 21)) < 0.5
    mask[:, 0] = True
    got = fi.single_prefill_with_kv_cache(q, k, v, custom_mask=mask.reshape(-1))
    assert len(fi._SINGLE_PLANS) == 2
    close(got, attention(q, k, v, mask=mask)[0], np.float32)
    for n in range(fi._SINGLE_PLANS_MAX + 3):
        fi.single_prefill_with_kv_cache(q[: 1 + n % 9], k, v, sm_scale=0.01 * (n + 1))
    assert len(fi._SINGLE_PLANS) == fi._SINGLE_PLANS_MAX


def test_single_decode_alibi_lse():
    # FlashInfer's decode bias is slope * j (the query's index 0): the reference with one query.
    q = rand((8, 64), np.float32)
    k, v = rand((41, 8, 64), np.float32), rand((41, 8, 64), np.float32)
    o, lse = fi.single_decode_with_kv_cache(q, k, v, pos_encoding_mode="ALIBI", return_lse=True)
    want_o, want_lse = attention(q[None], k, v, alibi=flashinfer_slopes(8))
    close(o, want_o[0], np.float32)
    np.testing.assert_allclose(lse, want_lse[0], atol=1e-3, rtol=1e-4)


@pytest.mark.parametrize("causal", [False, True])
def test_ragged_wrapper_alibi(causal):
    qo_lens, kv_lens, h = [5, 1, 17], [9, 30, 17], 6
    qo_indptr, kv_indptr = np.cumsum([0, *qo_lens]), np.cumsum([0, *kv_lens])
    q = rand((qo_indptr[-1], h, 64), np.float32)
    k, v = rand((kv_indptr[-1], h, 64), np.float32), rand((kv_indptr[-1], h, 64), np.float32)
    w = fi.BatchPrefillWithRaggedKVCacheWrapper(np.empty(1, np.uint8))
    w.plan(
        qo_indptr,
        kv_indptr,
        h,
        h,
        64,
        causal=causal,
        pos_encoding_mode="ALIBI",
        q_data_type="float32",
    )
    o, lse = w.run(q, k, v, return_lse=True)
    for r in range(3):
        qs, ks = slice(qo_indptr[r], qo_indptr[r + 1]), slice(kv_indptr[r], kv_indptr[r + 1])
        want_o, want_lse = attention(q[qs], k[ks], v[ks], causal=causal, alibi=flashinfer_slopes(h))
        close(o[qs], want_o, np.float32)
        np.testing.assert_allclose(lse[qs], want_lse, atol=1e-3, rtol=1e-4)
