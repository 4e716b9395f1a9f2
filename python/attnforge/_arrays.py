"""Arrays in and out of the native module: descriptors, allocation, streams.

The native module takes every array as ``(address, shape, strides, dtype, device)``, strides in
elements and device -1 for host memory. This module builds those descriptors from numpy arrays
and torch tensors (read through their public Python attributes only: no dependency on torch's
C++ ABI), allocates outputs with the caller's library on the caller's device, and finds the
CUDA stream to launch on (torch's current stream).
"""

import math

import numpy as np

LOG2E = 1.0 / math.log(2.0)
LN2 = math.log(2.0)

_NUMPY_DTYPES = {"float16": "f16", "float32": "f32"}
_TORCH_DTYPES = {"float16": "f16", "bfloat16": "bf16", "float32": "f32"}


def is_torch(x):
    """Whether ``x`` is a torch tensor (without importing torch)."""
    return type(x).__module__.split(".")[0] == "torch" and hasattr(x, "data_ptr")


def _torch_dtype_name(x):
    return str(x.dtype).replace("torch.", "")


def dtype_name(x):
    """attnforge's name of the element type of ``x`` (``f16``, ``bf16``, ``f32``) or ``None``."""
    if is_torch(x):
        return _TORCH_DTYPES.get(_torch_dtype_name(x))
    if isinstance(x, np.ndarray):
        return _NUMPY_DTYPES.get(x.dtype.name)
    return None


def describe(x, name):
    """The native descriptor of ``x``; ``TypeError`` for anything but a numpy array or a torch
    tensor, ``ValueError`` for an element type attnforge does not take."""
    dtype = dtype_name(x)
    if is_torch(x):
        if dtype is None:
            raise ValueError(
                f"invalid {name}: has dtype {x.dtype}; expected float16, bfloat16 or float32"
            )
        device = -1 if x.device.type == "cpu" else (x.device.index or 0)
        if x.device.type not in ("cpu", "cuda"):
            raise ValueError(f"invalid {name}: is on {x.device}; expected cpu or cuda")
        return (x.data_ptr(), tuple(x.shape), tuple(x.stride()), dtype, device)
    if isinstance(x, np.ndarray):
        if dtype is None:
            raise ValueError(f"invalid {name}: has dtype {x.dtype}; expected float16 or float32")
        size = x.dtype.itemsize
        if any(s % size for s in x.strides):
            raise ValueError(f"invalid {name}: strides {x.strides} are not whole elements")
        strides = tuple(s // size for s in x.strides)
        return (x.__array_interface__["data"][0], x.shape, strides, dtype, -1)
    raise TypeError(f"{name} must be a numpy array or a torch tensor, not {type(x).__name__}")


def describe_out(x, name):
    """``describe`` for an array the native module writes."""
    if isinstance(x, np.ndarray) and not x.flags.writeable:
        raise ValueError(f"invalid {name}: the array is read-only")
    return describe(x, name)


def device_of(x):
    """The CUDA ordinal of ``x``, or -1 for host memory."""
    if is_torch(x) and x.device.type == "cuda":
        return x.device.index or 0
    return -1


def stream_of(x):
    """The handle of torch's current CUDA stream on ``x``'s device; 0 for host arrays."""
    if device_of(x) < 0:
        return 0
    import torch

    return torch.cuda.current_stream(x.device).cuda_stream


def empty(like, shape, float32=False):
    """An uninitialised array of ``shape`` with the library, device and dtype of ``like``
    (float32 when asked)."""
    if is_torch(like):
        import torch

        dtype = torch.float32 if float32 else like.dtype
        return torch.empty(tuple(shape), dtype=dtype, device=like.device)
    return np.empty(tuple(shape), dtype=np.float32 if float32 else like.dtype)


def from_list(like, values):
    """A float32 1-d array of ``values`` in the library and on the device of ``like``."""
    if is_torch(like):
        import torch

        return torch.tensor(values, dtype=torch.float32, device=like.device)
    return np.asarray(values, dtype=np.float32)


def int32_array(like, values):
    """An int32 1-d array of ``values`` in the library and on the device of ``like``."""
    if is_torch(like):
        import torch

        return torch.tensor(values, dtype=torch.int32, device=like.device)
    return np.asarray(values, dtype=np.int32)


def swap01(x):
    """``x`` with its first two axes swapped (a view)."""
    if is_torch(x):
        return x.transpose(0, 1)
    return np.swapaxes(x, 0, 1)


def int_list(x, name):
    """The integers of a 1-d index array (numpy, torch on any device, or a sequence)."""
    if x is None:
        raise ValueError(f"invalid {name}: is None")
    if is_torch(x):
        return [int(i) for i in x.detach().cpu().reshape(-1).tolist()]
    arr = np.asarray(x)
    if arr.dtype.kind not in "iu":
        raise ValueError(f"invalid {name}: has dtype {arr.dtype}; expected integers")
    return [int(i) for i in arr.reshape(-1).tolist()]


def bool_numpy(x):
    """A host numpy bool copy of a mask array."""
    if is_torch(x):
        return x.detach().cpu().numpy().astype(bool)
    return np.asarray(x).astype(bool)


def uint8_bytes(x):
    """The bytes of a packed uint8 mask array."""
    if is_torch(x):
        x = x.detach().cpu().numpy()
    arr = np.asarray(x)
    if arr.dtype != np.uint8:
        raise ValueError(f"invalid packed_custom_mask: has dtype {arr.dtype}; expected uint8")
    return arr.reshape(-1).tobytes()


def same_library(a, b):
    """Whether ``a`` and ``b`` are both torch tensors or both numpy arrays."""
    return is_torch(a) == is_torch(b)


def copy_into(dst, src, mask=None):
    """``dst[...] = src`` (only the rows where ``mask`` is true, when given)."""
    if mask is None:
        dst[...] = src
    else:
        dst[mask] = src[mask]
