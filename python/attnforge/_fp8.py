"""The fp8 KV cache in FlashInfer's arguments: ``kv_data_type`` (``torch.float8_e4m3fn``,
``torch.float8_e5m2``) in the paged wrappers' ``plan``, ``k_scale`` / ``v_scale`` in their
``run``, and the caches ``append_paged_kv_cache`` writes into.

A cache of fp8 codes is dequantised as ``code * k_scale`` (keys) and ``code * v_scale``
(values), which is what FlashInfer's folding of ``k_scale`` into the softmax scale and of
``v_scale`` into the output computes. numpy has no fp8 type: a numpy cache of fp8 codes is a
``uint8`` array, read as codes only where the call names the format (``kv_data_type``).
"""

from . import _arrays as A
from ._options import refuse

# FlashInfer's (torch's) names of the fp8 formats, and attnforge's.
_FORMATS = {"float8_e4m3fn": "e4m3", "float8_e5m2": "e5m2"}
# torch's fp8 types attnforge does not read.
_OTHER_FP8 = ("float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu")


def format_of(data_type):
    """attnforge's fp8 format (``"e4m3"``, ``"e5m2"``) of a FlashInfer ``*_data_type`` (a
    string or a torch dtype), or ``None`` for any other type."""
    if data_type is None:
        return None
    text = str(data_type).replace("torch.", "")
    if text in _OTHER_FP8:
        refuse("kv_data_type", data_type, "attnforge reads float8_e4m3fn and float8_e5m2 caches")
    return _FORMATS.get(text)


def array_format(x):
    """The fp8 format of a torch tensor's dtype (or of an object reporting one), else ``None``."""
    return _FORMATS.get(str(getattr(x, "dtype", "")).replace("torch.", ""))


def scale_list(value, name):
    """A run's ``k_scale`` / ``v_scale`` as a list of floats: ``None`` stays ``None`` (1.0); a
    number is one scale for the tensor; an array (numpy, or torch on any device: read on the
    host) holds one entry, or one per KV head (an attnforge extension: FlashInfer takes a
    number)."""
    if value is None:
        return None
    if isinstance(value, (int, float)):
        return [float(value)]
    values = A.float_list(value, name)
    if not values:
        raise ValueError(f"invalid {name}: is empty; expected a number or one scale per KV head")
    return values


def refuse_plain_scales(k_scale, v_scale):
    """``k_scale`` / ``v_scale`` on a plan for a cache of the query's dtype."""
    for name, value in (("k_scale", k_scale), ("v_scale", v_scale)):
        if value is not None:
            refuse(
                name,
                value,
                "attnforge takes scales for fp8 caches only (plan with kv_data_type="
                "torch.float8_e4m3fn or torch.float8_e5m2); FlashInfer would fold k_scale into"
                " sm_scale and multiply the output by v_scale",
            )


def cache_format(cache, kv_data_type):
    """The fp8 format of the cache ``append_paged_kv_cache`` writes into, or ``None`` for a cache
    of floats: a torch fp8 tensor names its own (it must agree with ``kv_data_type`` when that
    is given); a numpy ``uint8`` cache needs ``kv_data_type``."""
    first = cache[0] if isinstance(cache, (tuple, list)) else cache
    named = format_of(kv_data_type)
    if kv_data_type is not None and named is None:
        refuse("kv_data_type", kv_data_type, "append_paged_kv_cache takes it for fp8 caches")
    own = array_format(first)
    if own is not None:
        if named is not None and named != own:
            raise ValueError(
                f"invalid paged_kv_cache: holds {first.dtype} but kv_data_type is {kv_data_type}"
            )
        return own
    if str(getattr(first, "dtype", "")) == "uint8" and not A.is_torch(first):
        if named is None:
            raise ValueError(
                "invalid paged_kv_cache: a uint8 numpy cache holds fp8 codes only with"
                " kv_data_type=torch.float8_e4m3fn or torch.float8_e5m2 (or their names)"
            )
        return named
    if named is not None:
        raise ValueError(
            f"invalid paged_kv_cache: has dtype {getattr(first, 'dtype', None)} but kv_data_type"
            f" is {kv_data_type}; an fp8 cache holds fp8 codes (numpy: uint8)"
        )
    return None


def append_rows(x, name, fmt):
    """The new rows of an fp8 cache as the native append takes them: fp8 codes of the cache's
    format (torch), widened exactly to float16 on a GPU; numpy ``uint8`` codes as they are.
    FlashInfer's append copies elements of the cache's type, so rows of another type (float16,
    bfloat16...), which it would read as fp8 codes, are refused."""
    if A.is_torch(x):
        if array_format(x) != fmt:
            _refuse_rows(x, name, fmt)
        if x.is_cuda:
            import torch

            return x.to(torch.float16).contiguous()
        return x
    if str(getattr(x, "dtype", "")) == "uint8":
        return x
    if array_format(x) == fmt:
        return x
    _refuse_rows(x, name, fmt)


def _refuse_rows(x, name, fmt):
    torch_name = {"e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2"}[fmt]
    refuse(
        name,
        f"an array of dtype {getattr(x, 'dtype', None)}",
        f"the cache holds {torch_name} codes and FlashInfer's append copies elements of the"
        f" cache's type (it does not quantise): pass {torch_name} rows, e.g."
        f" (k / k_scale).to(torch.{torch_name})",
    )
