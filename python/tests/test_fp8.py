"""The fp8 KV cache on the CPU backend: ``kv_data_type`` in the paged wrappers' ``plan``,
``k_scale`` / ``v_scale`` in ``run`` (numbers, and arrays per KV head), ``append_paged_kv_cache``
into an fp8 cache, and the refusals. numpy caches hold the codes as ``uint8``; the reference is
float64 attention over the dequantised cache (``code * scale``), with fresh random codes each
run."""

import functools

import attnforge.flashinfer as fi
import numpy as np
import pytest

from pages import check_appended, shuffled_cache
from reference import attention, fp8_decode, gather_pages
from test_arrays import TorchLike

rng = np.random.default_rng()
TORCH_NAMES = {"e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2"}


def codes_like(fmt, shape, limit=6.0):
    """Random codes of ``fmt`` whose values are finite and at most ``limit`` in magnitude."""
    all_codes = np.arange(256, dtype=np.uint8)
    values = fp8_decode(all_codes, fmt)
    usable = all_codes[np.isfinite(values) & (np.abs(values) <= limit)]
    return rng.choice(usable, size=shape).astype(np.uint8)


def fp8_cache(kv_lens, page_size, hkv, d, layout, combined, fmt):
    """A cache of random codes in shuffled pages, its K/V views, and its page table."""
    codes = functools.partial(codes_like, fmt)
    return shuffled_cache(kv_lens, page_size, hkv, d, layout, combined, codes)


def dequantized(ck, cv, indptr, ids, last, r, layout, fmt, k_scale, v_scale):
    """Request ``r``'s keys and values, dequantised in float64 (``[kv_len, Hkv, D]``)."""
    k, v = gather_pages(ck, cv, indptr, ids, last, r, layout)
    ks = np.broadcast_to(np.asarray(k_scale, np.float64).reshape(-1), (k.shape[1],))
    vs = np.broadcast_to(np.asarray(v_scale, np.float64).reshape(-1), (v.shape[1],))
    return fp8_decode(k, fmt) * ks[None, :, None], fp8_decode(v, fmt) * vs[None, :, None]


def check_rows(o, lse, want_o, want_lse, rows):
    np.testing.assert_allclose(o[rows].astype(np.float64), want_o, atol=2e-2, rtol=2e-2)
    if lse is not None:
        np.testing.assert_allclose(lse[rows], want_lse, atol=2e-3, rtol=1e-3)


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("page_size", [16, 5])
@pytest.mark.parametrize("scales", ["number", "per_head", "none"])
def test_fp8_decode(fmt, layout, page_size, scales):
    hq, hkv, d = 8, 2, 64
    kv_lens = [int(n) for n in rng.integers(1, 60, 5)]
    cache, (ck, cv), ids, indptr, last = fp8_cache(kv_lens, page_size, hkv, d, layout, True, fmt)
    q = rng.standard_normal((len(kv_lens), hq, d)).astype(np.float16)
    # Scales keep the largest e5m2 code (57344) finite in f16: at most 65504 / 57344.
    if scales == "number":
        k_scale, v_scale = 0.37, 1.1
    elif scales == "per_head":
        k_scale = rng.uniform(0.1, 0.6, hkv).astype(np.float32)
        v_scale = rng.uniform(0.5, 1.1, hkv).astype(np.float32)
    else:
        k_scale = v_scale = None
    w = fi.BatchDecodeWithPagedKVCacheWrapper(np.empty(1, np.uint8), layout)
    w.plan(indptr, ids, last, hq, hkv, d, page_size, kv_data_type=TORCH_NAMES[fmt])
    o, lse = w.run(q, cache, k_scale=k_scale, v_scale=v_scale, return_lse=True)
    ks = 1.0 if k_scale is None else k_scale
    vs = 1.0 if v_scale is None else v_scale
    for r in range(len(kv_lens)):
        k, v = dequantized(ck, cv, indptr, ids, last, r, layout, fmt, ks, vs)
        want_o, want_lse = attention(q[r : r + 1], k, v)
        check_rows(o, lse, want_o, want_lse, slice(r, r + 1))


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("combined", [False, True])
@pytest.mark.parametrize("page_size", [8, 12])
def test_fp8_paged_prefill(fmt, combined, page_size):
    hq, hkv, d = 4, 4, 128
    kv_lens = [int(n) for n in rng.integers(10, 80, 3)]
    qo_lens = [int(rng.integers(1, n + 1)) for n in kv_lens]
    cache, (ck, cv), ids, indptr, last = fp8_cache(
        kv_lens, page_size, hkv, d, "NHD", combined, fmt
    )
    qo_indptr = np.cumsum([0] + qo_lens).astype(np.int32)
    q = rng.standard_normal((qo_indptr[-1], hq, d)).astype(np.float16)
    w = fi.BatchPrefillWithPagedKVCacheWrapper(np.empty(1, np.uint8))
    name = TORCH_NAMES[fmt]
    w.plan(qo_indptr, indptr, ids, last, hq, hkv, d, page_size, causal=True, kv_data_type=name)
    o, lse = w.run(q, cache, k_scale=0.25, v_scale=0.8, return_lse=True)
    for r in range(len(kv_lens)):
        k, v = dequantized(ck, cv, indptr, ids, last, r, "NHD", fmt, 0.25, 0.8)
        qs = slice(qo_indptr[r], qo_indptr[r + 1])
        want_o, want_lse = attention(q[qs], k, v, causal=True)
        check_rows(o, lse, want_o, want_lse, qs)


def test_fp8_torch_like_tensors_read_as_their_format():
    """A tensor reporting torch.float8_e5m2 is read as e5m2 codes, as numpy uint8 codes are with
    kv_data_type; a tensor of the other format is refused."""
    hq, hkv, d, page_size = 4, 2, 64, 4
    kv_lens = [9, 3]
    cache, _, ids, indptr, last = fp8_cache(kv_lens, page_size, hkv, d, "HND", True, "e5m2")
    q = rng.standard_normal((2, hq, d)).astype(np.float16)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(np.empty(1, np.uint8), "HND")
    w.plan(indptr, ids, last, hq, hkv, d, page_size, kv_data_type="float8_e5m2")
    want = w.run(q, cache, k_scale=0.5)
    got = w.run(q, TorchLike(cache, dtype="torch.float8_e5m2"), k_scale=0.5)
    np.testing.assert_array_equal(got, want)
    with pytest.raises(ValueError, match="e4m3"):
        w.run(q, TorchLike(cache, dtype="torch.float8_e4m3fn"), k_scale=0.5)


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("page_size", [4, 5])
def test_fp8_append_copies_codes(fmt, page_size):
    """Appending fp8 rows writes their codes unchanged (FlashInfer's copy), then a decode over
    the cache reads them."""
    hkv, d, hq = 2, 64, 4
    old, new = [6, 0, 3], [2, 3, 1]
    total = [a + b for a, b in zip(old, new)]
    cache, (ck, cv), ids, indptr, last = fp8_cache(total, page_size, hkv, d, "NHD", False, fmt)
    before = (ck.copy(), cv.copy())
    k_new, v_new = codes_like(fmt, (sum(new), hkv, d)), codes_like(fmt, (sum(new), hkv, d))
    seq_lens = fi.get_seq_lens(indptr, last, page_size)
    append_indptr = np.cumsum([0, *new]).astype(np.int32)
    batch, pos = fi.get_batch_indices_positions(append_indptr, seq_lens, sum(new))
    name = TORCH_NAMES[fmt]
    fi.append_paged_kv_cache(
        k_new, v_new, batch, pos, cache, ids, indptr, last, kv_data_type=name
    )
    check_appended((ck, cv), before, (ids, indptr, last), old, new, (k_new, v_new))
    q = rng.standard_normal((3, hq, d)).astype(np.float16)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(np.empty(1, np.uint8))
    w.plan(indptr, ids, last, hq, hkv, d, page_size, kv_data_type=name)
    o = w.run(q, cache, k_scale=0.5, v_scale=0.5)
    for r in range(3):
        k, v = dequantized(ck, cv, indptr, ids, last, r, "NHD", fmt, 0.5, 0.5)
        want_o, _ = attention(q[r : r + 1], k, v)
        check_rows(o, None, want_o, None, slice(r, r + 1))


def small_decode(fmt="e4m3", page_size=4):
    hq, hkv, d = 4, 2, 64
    cache, _, ids, indptr, last = fp8_cache([5, 2], page_size, hkv, d, "NHD", True, fmt)
    q = rng.standard_normal((2, hq, d)).astype(np.float16)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(np.empty(1, np.uint8))
    return w, (indptr, ids, last, hq, hkv, d, page_size), q, cache


def test_fp8_refusals_and_errors():
    w, args, q, cache = small_decode()
    # A uint8 cache is codes only for an fp8 plan; an fp8 plan takes no float cache.
    w.plan(*args)
    with pytest.raises(ValueError, match="uint8"):
        w.run(q, cache)
    with pytest.raises(NotImplementedError, match="k_scale"):
        w.run(q, cache.astype(np.float16), k_scale=0.5)
    # FlashInfer's deprecated data_type names the cache's type when q_data_type is given.
    w.plan(*args, data_type="float8_e4m3fn", q_data_type="float16")
    w.run(q, cache)
    w.plan(*args, kv_data_type="float8_e4m3fn")
    with pytest.raises(ValueError, match="paged_kv_cache"):
        w.run(q, cache.astype(np.float16))
    # Scales: one entry or one per KV head, finite and positive, small enough for f16.
    with pytest.raises(ValueError, match="k_scale"):
        w.run(q, cache, k_scale=np.ones(3, np.float32))
    with pytest.raises(ValueError, match="v_scale"):
        w.run(q, cache, v_scale=-1.0)
    with pytest.raises(ValueError, match="k_scale"):
        w.run(q, cache, k_scale=1e6)
    # e5m2 reaches 57344: with f16 queries a scale above 65504 / 57344 would make it infinite.
    w5, args5, q5, cache5 = small_decode("e5m2")
    w5.plan(*args5, kv_data_type="float8_e5m2")
    w5.run(q5, cache5, v_scale=1.14)
    with pytest.raises(ValueError, match="v_scale"):
        w5.run(q5, cache5, v_scale=1.15)
    with pytest.raises(NotImplementedError, match="q_scale"):
        w.run(q, cache, q_scale=2.0)
    # fp8 queries, fp8 ragged K/V and formats attnforge does not read are refused by name.
    with pytest.raises(NotImplementedError, match="q_data_type"):
        w.plan(*args, q_data_type="float8_e4m3fn", kv_data_type="float8_e4m3fn")
    with pytest.raises(NotImplementedError, match="kv_data_type"):
        w.plan(*args, kv_data_type="float8_e4m3fnuz")
    ragged = fi.BatchPrefillWithRaggedKVCacheWrapper(np.empty(1, np.uint8))
    with pytest.raises(NotImplementedError, match="kv_data_type"):
        ragged.plan([0, 1], [0, 4], 4, 2, 64, kv_data_type="float8_e4m3fn")


def test_fp8_append_refusals():
    hkv, d, page_size = 2, 64, 4
    cache, _, ids, indptr, last = fp8_cache([3], page_size, hkv, d, "NHD", True, "e4m3")
    batch, pos = np.zeros(1, np.int32), np.array([2], np.int32)
    rows = codes_like("e4m3", (1, hkv, d))
    table = (ids, indptr, last)
    # The format of a uint8 cache must be named.
    with pytest.raises(ValueError, match="kv_data_type"):
        fi.append_paged_kv_cache(rows, rows, batch, pos, cache, *table)
    # FlashInfer's append copies elements of the cache's type: float rows are refused.
    f16 = rng.standard_normal((1, hkv, d)).astype(np.float16)
    with pytest.raises(NotImplementedError, match="append_key"):
        fi.append_paged_kv_cache(f16, f16, batch, pos, cache, *table, kv_data_type="float8_e4m3fn")
    # A NaN code is an error before anything is written.
    before = cache.copy()
    nan = rows.copy()
    nan[0, 1, 7] = 0x7F
    with pytest.raises(ValueError, match="NaN"):
        fi.append_paged_kv_cache(rows, nan, batch, pos, cache, *table, kv_data_type="float8_e4m3fn")
    np.testing.assert_array_equal(cache, before)


class Fp8Like(TorchLike):
    """A ``TorchLike`` of fp8 codes that also takes the views single decode makes."""

    def contiguous(self):
        return Fp8Like(np.ascontiguousarray(self.array), self.dtype)

    def __getitem__(self, index):
        return Fp8Like(self.array[index], self.dtype)


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_fp8_single_decode(fmt):
    """single_decode_with_kv_cache over fp8 k, v (a tensor reporting a torch fp8 dtype)."""
    hq, hkv, d, kv_len = 8, 2, 128, 77
    k, v = codes_like(fmt, (kv_len, hkv, d)), codes_like(fmt, (kv_len, hkv, d))
    q = rng.standard_normal((hq, d)).astype(np.float16)
    dtype = "torch." + TORCH_NAMES[fmt]
    o, lse = fi.single_decode_with_kv_cache(
        q, Fp8Like(k, dtype), Fp8Like(v, dtype), k_scale=0.4, v_scale=0.9, return_lse=True
    )
    want_o, want_lse = attention(q[None], fp8_decode(k, fmt) * 0.4, fp8_decode(v, fmt) * 0.9)
    check_rows(o[None], lse[None], want_o, want_lse, slice(0, 1))
    # fp8 K/V are not read by single prefill.
    with pytest.raises(NotImplementedError, match="k="):
        fi.single_prefill_with_kv_cache(q[None], Fp8Like(k, dtype), Fp8Like(v, dtype))
