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


def check_common(pos_encoding_mode="NONE", rope_scale=None, rope_theta=None, backend="auto"):
    """The arguments shared by every entry point."""
    if pos_encoding_mode != "NONE":
        refuse(
            "pos_encoding_mode",
            pos_encoding_mode,
            "apply RoPE to q and k before the call; ALiBi is in attnforge's native API only",
        )
    refuse_set(
        rope_scale=(rope_scale, "attnforge applies no positional encoding"),
        rope_theta=(rope_theta, "attnforge applies no positional encoding"),
    )
    if backend not in _BACKENDS:
        refuse("backend", backend, f"attnforge runs its own kernels; accepted: {_BACKENDS}")


def check_run(args, q_scale=None, k_scale=None, v_scale=None, enable_pdl=None, sinks=None):
    """The arguments of ``run`` that attnforge does not take."""
    if args:
        refuse("*args", args, "extra positional arguments feed FlashInfer's JIT variants")
    refuse_set(
        q_scale=(q_scale, "fp8 inputs are not supported yet"),
        k_scale=(k_scale, "fp8 inputs are not supported yet"),
        v_scale=(v_scale, "fp8 inputs are not supported yet"),
        sinks=(sinks, "attention sinks are in attnforge's native API only"),
    )
    if enable_pdl:
        refuse("enable_pdl", enable_pdl, "programmatic dependent launch is not used")


def dtype_code(value, name):
    """attnforge's dtype name for a FlashInfer ``*_data_type`` (a string or a torch dtype)."""
    if value is None:
        return None
    text = str(value).replace("torch.", "")
    code = _DTYPE_NAMES.get(text)
    if code is None:
        refuse(name, value, "attnforge takes float16, bfloat16 and float32")
    return code


def spec(
    num_qo_heads,
    num_kv_heads,
    head_dim_qk,
    head_dim_vo,
    dtype,
    causal=False,
    window_left=-1,
    logits_soft_cap=None,
    sm_scale=None,
    use_fp16_qk_reduction=False,
    packed_mask=None,
):
    """The native problem options."""
    window_left = int(window_left)
    if window_left >= 0 and not causal:
        refuse(
            "window_left",
            window_left,
            "attnforge's sliding window is causal: pass causal=True with it",
        )
    if sm_scale is None:
        sm_scale = 1.0 / math.sqrt(head_dim_qk)
    cap = None if logits_soft_cap is None or logits_soft_cap <= 0 else float(logits_soft_cap)
    return {
        "num_qo_heads": int(num_qo_heads),
        "num_kv_heads": int(num_kv_heads),
        "head_dim_qk": int(head_dim_qk),
        "head_dim_vo": int(head_dim_vo),
        "dtype": dtype,
        "causal": bool(causal),
        "window_left": window_left,
        "soft_cap": cap,
        "sm_scale": float(sm_scale),
        "f16_qk": bool(use_fp16_qk_reduction),
        "packed_mask": packed_mask,
    }


def packed_mask(custom_mask, packed_custom_mask, qo_indptr, kv_indptr):
    """``(packed bytes, byte offsets per request)`` from FlashInfer's custom mask arguments
    (``packed_custom_mask`` wins when both are given, as in FlashInfer), or ``None``."""
    if custom_mask is None and packed_custom_mask is None:
        return None
    lens = [
        (qo_indptr[r + 1] - qo_indptr[r]) * (kv_indptr[r + 1] - kv_indptr[r])
        for r in range(len(qo_indptr) - 1)
    ]
    offsets = [0]
    for n in lens:
        offsets.append(offsets[-1] + (n + 7) // 8)
    if packed_custom_mask is not None:
        return (_arrays.uint8_bytes(packed_custom_mask), offsets)
    bits = _arrays.bool_numpy(custom_mask).reshape(-1)
    if bits.size != sum(lens):
        raise ValueError(
            f"invalid custom_mask: has {bits.size} elements; the requests need {sum(lens)}"
            " (the sum of qo_len * kv_len)"
        )
    segments = []
    start = 0
    for n in lens:
        segments.append(np.packbits(bits[start : start + n], bitorder="little").tobytes())
        start += n
    return (b"".join(segments), offsets)
