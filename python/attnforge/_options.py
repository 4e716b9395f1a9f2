"""FlashInfer's arguments mapped onto attnforge's problem options, and the refusals.

Every argument attnforge does not implement raises ``NotImplementedError`` naming it; nothing
is silently ignored. The arguments that only choose how FlashInfer computes (its workspace
buffer, ``backend`` among its own FlashAttention implementations, ``use_tensor_cores``,
``non_blocking``) are accepted: attnforge computes the same result with its own kernels.
"""

import math

import numpy as np

from . import _arrays

_BACKENDS = ("auto", "fa2", "fa3")
_DTYPE_NAMES = {
    "float16": "f16",
    "half": "f16",
    "bfloat16": "bf16",
    "float32": "f32",
    "float": "f32",
}


def refuse(name, value, reason):
    """Raises ``NotImplementedError`` for argument ``name``."""
    raise NotImplementedError(f"attnforge.flashinfer: {name}={value!r} is not supported: {reason}")


def refuse_set(**kwargs):
    """Refuses every argument given a value other than None; the reasons follow ``|``."""
    for key, (value, reason) in kwargs.items():
        if value is not None:
            refuse(key, value, reason)


def check_common(
    pos_encoding_mode="NONE", rope_scale=None, rope_theta=None, backend="auto", alibi=False
):
    """The arguments shared by every entry point (``alibi``: whether it takes ALiBi)."""
    allowed = ("NONE", "ALIBI") if alibi else ("NONE",)
    if pos_encoding_mode not in allowed:
        refuse(
            "pos_encoding_mode",
            pos_encoding_mode,
            f"accepted here: {allowed}; RoPE is applied by the caller before the call",
        )
    refuse_set(
        rope_scale=(rope_scale, "attnforge applies no positional encoding"),
        rope_theta=(rope_theta, "attnforge applies no positional encoding"),
    )
    if backend not in _BACKENDS:
        refuse("backend", backend, f"attnforge runs its own kernels; accepted: {_BACKENDS}")


def check_run(args, q_scale=None, enable_pdl=None):
    """The arguments of ``run`` that attnforge does not take (``k_scale`` and ``v_scale`` are
    the paged wrappers' own: they dequantise an fp8 cache)."""
    if args:
        refuse("*args", args, "extra positional arguments feed FlashInfer's JIT variants")
    refuse_set(q_scale=(q_scale, "fp8 queries are not supported (fp8 KV caches are)"))
    if enable_pdl:
        refuse("enable_pdl", enable_pdl, "programmatic dependent launch is not used")


def dtype_code(value, name):
    """attnforge's dtype name for a FlashInfer ``*_data_type`` (a string, a torch dtype, or a
    numpy dtype or scalar type such as ``np.float16``)."""
    if value is None:
        return None
    if isinstance(value, type) and issubclass(value, np.generic):
        value = np.dtype(value)
    text = str(value).replace("torch.", "")
    code = _DTYPE_NAMES.get(text)
    if code is None:
        also = " (and float8_e4m3fn, float8_e5m2 for kv_data_type)" if name == "kv_data_type" else ""
        refuse(name, value, f"attnforge takes float16, bfloat16 and float32{also}")
    return code


def spec(
    num_qo_heads,
    num_kv_heads,
    head_dim_qk,
    head_dim_vo,
    dtype,
    qo_indptr,
    kv_indptr,
    causal=False,
    window_left=-1,
    logits_soft_cap=None,
    sm_scale=None,
    use_fp16_qk_reduction=False,
    custom_mask=None,
    packed_custom_mask=None,
    alibi_slopes=None,
):
    """The native problem options of a batch (``qo_indptr``, ``kv_indptr`` as lists)."""
    window_left = int(window_left)
    if window_left < -1:
        raise ValueError(f"invalid window_left: is {window_left}; expected -1 or >= 0")
    packed = None
    masks = _custom_masks(custom_mask, packed_custom_mask, qo_indptr, kv_indptr)
    if masks is not None or (window_left >= 0 and not causal):
        # attnforge's sliding window is causal: a window over a custom mask or without
        # causal=True becomes part of a custom mask (FlashInfer ignores causal with a custom mask).
        if masks is None:
            masks = [np.ones((q, k), dtype=bool) for q, k in _lens(qo_indptr, kv_indptr)]
        if window_left >= 0:
            masks = [m & _window(m.shape, window_left) for m in masks]
        packed = _pack(masks)
        causal, window_left = False, -1
    if sm_scale is None:
        if head_dim_qk <= 0:
            raise ValueError(f"invalid head_dim: is {head_dim_qk}; expected a positive head dimension")
        sm_scale = 1.0 / math.sqrt(head_dim_qk)
    cap = None if logits_soft_cap is None or logits_soft_cap <= 0 else float(logits_soft_cap)
    if cap is not None and alibi_slopes is not None:
        refuse("logits_soft_cap", logits_soft_cap, "attnforge does not combine it with ALiBi")
    return {
        "num_qo_heads": int(num_qo_heads),
        "num_kv_heads": int(num_kv_heads),
        "head_dim_qk": int(head_dim_qk),
        "head_dim_vo": int(head_dim_vo),
        "dtype": dtype,
        "causal": bool(causal),
        "window_left": window_left,
        "soft_cap": cap,
        "alibi_slopes": alibi_slopes,
        "sm_scale": float(sm_scale),
        "f16_qk": bool(use_fp16_qk_reduction),
        "packed_mask": packed,
    }


def alibi_slopes(num_heads):
    """FlashInfer's ALiBi slopes: a geometric series from ``2^(-8/n)`` over the largest power of
    two ``n <= num_heads``, then the odd powers of ``2^(-4/n)`` for the remaining heads."""
    if num_heads <= 0:
        raise ValueError(f"invalid num_qo_heads: is {num_heads}; expected at least one head")
    n = 2 ** int(math.floor(math.log2(num_heads)))
    slopes = [2.0 ** (-8.0 / n * i) for i in range(1, n + 1)]
    slopes += [2.0 ** (-4.0 / n * i) for i in range(1, 2 * (num_heads - n), 2)]
    return slopes


def _lens(qo_indptr, kv_indptr):
    """Each request's ``(qo_len, kv_len)``; a ValueError, worded as the native plan's, for
    indptr lists of different lengths or that decrease (the masks are built before that plan
    checks them)."""
    if len(kv_indptr) != len(qo_indptr):
        raise ValueError(
            f"invalid kv_indptr: has {len(kv_indptr)} entries but qo_indptr has "
            f"{len(qo_indptr)}; both need batch + 1"
        )
    for name, indptr in (("qo_indptr", qo_indptr), ("kv_indptr", kv_indptr)):
        for r in range(len(indptr) - 1):
            if indptr[r + 1] < indptr[r]:
                raise ValueError(
                    f"invalid {name}[{r + 1}]: {indptr[r + 1]} is less than {name}[{r}] = "
                    f"{indptr[r]}; indptr must not decrease"
                )
    return [
        (qo_indptr[r + 1] - qo_indptr[r], kv_indptr[r + 1] - kv_indptr[r])
        for r in range(len(qo_indptr) - 1)
    ]


def _window(shape, window_left):
    """Keys a query sees under a left window (bottom-right aligned, as the causal mask)."""
    qo, kv = shape
    i = np.arange(qo)[:, None] + (kv - qo)
    j = np.arange(kv)[None, :]
    return j >= i - window_left


def _pack(masks):
    """Packs boolean matrices, one per request, each padded to whole bytes (little bit order)."""
    segments = [np.packbits(m.reshape(-1), bitorder="little").tobytes() for m in masks]
    offsets = [0]
    for seg in segments:
        offsets.append(offsets[-1] + len(seg))
    return (b"".join(segments), offsets)


def _custom_masks(custom_mask, packed_custom_mask, qo_indptr, kv_indptr):
    """One boolean ``[qo_len, kv_len]`` matrix per request from FlashInfer's custom mask
    arguments (``packed_custom_mask`` wins when both are given, as in FlashInfer), or ``None``."""
    if custom_mask is None and packed_custom_mask is None:
        return None
    lens = _lens(qo_indptr, kv_indptr)
    total = sum(q * k for q, k in lens)
    if packed_custom_mask is not None:
        packed = np.frombuffer(_arrays.uint8_bytes(packed_custom_mask), dtype=np.uint8)
        need = sum((q * k + 7) // 8 for q, k in lens)
        if packed.size < need:
            raise ValueError(
                f"invalid packed_custom_mask: has {packed.size} bytes; the requests need {need}"
            )
        masks, start = [], 0
        for q, k in lens:
            nbytes = (q * k + 7) // 8
            bits = np.unpackbits(packed[start : start + nbytes], bitorder="little")
            masks.append(bits[: q * k].astype(bool).reshape(q, k))
            start += nbytes
        return masks
    bits = _arrays.bool_numpy(custom_mask).reshape(-1)
    if bits.size != total:
        raise ValueError(
            f"invalid custom_mask: has {bits.size} elements; the requests need {total}"
            " (the sum of qo_len * kv_len)"
        )
    masks, start = [], 0
    for q, k in lens:
        masks.append(bits[start : start + q * k].reshape(q, k))
        start += q * k
    return masks
