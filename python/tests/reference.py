"""A float64 numpy reference of FlashInfer's attention semantics, written for the tests:
bottom-right-aligned causal mask, causal sliding window, logit soft cap, custom boolean mask,
GQA, ALiBi, attention sinks, and the base-2 LSE."""

import numpy as np


def attention(
    q,
    k,
    v,
    causal=False,
    window_left=-1,
    soft_cap=None,
    sm_scale=None,
    mask=None,
    alibi=None,
    sinks=None,
):
    """``q [qo, Hq, D]``, ``k``/``v [kv, Hkv, D]`` (NHD), any float dtype. Returns ``(o, lse)``
    in float64, ``lse`` base 2; a row that sees no key has ``o = 0`` and ``lse = -inf``.
    ``mask`` (bool ``[qo, kv]``) combines with ``window_left`` but replaces ``causal``;
    ``alibi`` (slopes per query head) adds ``slope * (j - i)``, ``i`` the query's index;
    ``sinks`` (one logit per query head) joins each row's softmax denominator (and its LSE) as
    ``exp(sink)``; a row that sees no key then has ``lse = sink`` (base 2)."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    qo, hq, d = q.shape
    kv, hkv, _ = k.shape
    group = hq // hkv
    scale = 1.0 / np.sqrt(d) if sm_scale is None else sm_scale
    o = np.zeros((qo, hq, v.shape[2]))
    lse = np.full((qo, hq), -np.inf)
    i = np.arange(qo)[:, None] + (kv - qo)
    j = np.arange(kv)[None, :]
    visible = np.ones((qo, kv), dtype=bool)
    if mask is not None:
        visible = np.asarray(mask, dtype=bool).reshape(qo, kv)
    elif causal:
        visible &= j <= i
    if window_left >= 0:
        visible &= j >= i - window_left
    for h in range(hq):
        s = q[:, h, :] @ k[:, h // group, :].T * scale
        if soft_cap:
            s = soft_cap * np.tanh(s / soft_cap)
        if alibi is not None:
            s = s + alibi[h] * (j - np.arange(qo)[:, None])
        s = np.where(visible, s, -np.inf)
        m = s.max(axis=1, keepdims=True)
        if sinks is not None:
            m = np.maximum(m, sinks[h])
        m = np.where(np.isfinite(m), m, 0.0)
        p = np.exp(s - m)
        total = p.sum(axis=1, keepdims=True)
        if sinks is not None:
            total = total + np.exp(sinks[h] - m)
        seen = total[:, 0] > 0
        o[seen, h, :] = (p[seen] / total[seen]) @ v[:, h // group, :]
        lse[seen, h] = (m[seen, 0] + np.log(total[seen, 0])) / np.log(2.0)
    return o, lse


def gather_pages(cache_k, cache_v, page_indptr, page_indices, last_page_len, r, layout):
    """Request ``r``'s keys and values from a paged cache, NHD ``[kv_len, H, D]``."""
    pages = page_indices[page_indptr[r] : page_indptr[r + 1]]
    ks, vs = [], []
    for n, page in enumerate(pages):
        k, v = cache_k[page], cache_v[page]
        if layout == "HND":
            k, v = np.swapaxes(k, 0, 1), np.swapaxes(v, 0, 1)
        used = last_page_len[r] if n == len(pages) - 1 else k.shape[0]
        ks.append(k[:used])
        vs.append(v[:used])
    return np.concatenate(ks), np.concatenate(vs)


# (exponent bits, mantissa bits, bias) of the fp8 formats.
FP8_FORMATS = {"e4m3": (4, 3, 7), "e5m2": (5, 2, 15)}


def fp8_decode(codes, fmt):
    """The exact values of fp8 codes (``uint8``) as float64: e4m3 (``float8_e4m3fn``: NaN only
    at ``S.1111.111``, no infinity) or e5m2 (IEEE-like: exponent 31 is infinity or NaN)."""
    e_bits, m_bits, bias = FP8_FORMATS[fmt]
    c = np.asarray(codes, dtype=np.uint8).astype(np.int64)
    sign = np.where(c & 0x80, -1.0, 1.0)
    e = (c >> m_bits) & ((1 << e_bits) - 1)
    m = c & ((1 << m_bits) - 1)
    top = (1 << e_bits) - 1
    normal = (1.0 + m / 2.0**m_bits) * np.exp2(e.astype(np.float64) - bias)
    value = np.where(e == 0, m / 2.0**m_bits * 2.0 ** (1 - bias), normal)
    if fmt == "e4m3":
        value = np.where((e == top) & (m == (1 << m_bits) - 1), np.nan, value)
    else:
        value = np.where(e == top, np.where(m == 0, np.inf, np.nan), value)
    return sign * value
