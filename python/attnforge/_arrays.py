"""Arrays in and out of the native module: element types, allocation, streams.

The native module reads numpy arrays and torch tensors itself (a tensor through its public
Python attributes only: no dependency on torch's C++ ABI). This module checks arrays where the
Python layer needs their shapes first, allocates outputs with the caller's library on the
caller's device, and finds the CUDA stream to launch on (torch's current stream).
"""

import math

import numpy as np

from . import _native

LOG2E = 1.0 / math.log(2.0)
LN2 = math.log(2.0)



def is_torch(x):
    """Whether ``x`` is a torch tensor (without importing torch)."""
    return type(x).__module__.split(".")[0] == "torch" and hasattr(x, "data_ptr")


def checked_dtype(x, name):
    """attnforge's name of the element type of ``x`` (``f16``, ``bf16``, ``f32``), read as the
    native module reads every array: ``TypeError`` for anything but a numpy array or a torch
    tensor, ``ValueError`` for an element type or device attnforge does not take. For the
    Python layer, which reads shapes before the native call."""
    return _native.describe(x, name)[3]


def device_of(x):
    """The CUDA ordinal of ``x``, or -1 for host memory."""
    if is_torch(x) and x.is_cuda:
        return x.get_device()
    return -1


# torch's current raw stream of a device, as a function of the ordinal: the fast private
# ``torch._C._cuda_getCurrentRawStream`` where torch has it, else the public
# ``torch.cuda.current_stream(ordinal).cuda_stream``. Found on first use.
_raw_stream = None


def _find_raw_stream():
    import torch

    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return raw
    return lambda ordinal: torch.cuda.current_stream(ordinal).cuda_stream


def current_stream(ordinal):
    """The handle of torch's current CUDA stream on device ``ordinal``; 0 for host (-1)."""
    global _raw_stream
    if ordinal < 0:
        return 0
    if _raw_stream is None:
        _raw_stream = _find_raw_stream()
    return _raw_stream(ordinal)


def empty(like, shape, float32=False):
    """An uninitialised array of ``shape`` with the library, device and dtype of ``like``
    (float32 when asked)."""
    if isinstance(like, np.ndarray):
        return np.empty(shape, dtype=np.float32 if float32 else like.dtype)
    if float32:
        import torch

        return like.new_empty(shape, dtype=torch.float32)
    return like.new_empty(shape)


def float32_array(like, values):
    """A float32 array of ``values`` (a list or a numpy array) in the library and on the device
    of ``like``."""
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


def float_list(x, name):
    """The floats of a 1-d array (numpy, torch on any device, or a sequence)."""
    if is_torch(x):
        return [float(f) for f in x.detach().float().cpu().reshape(-1).tolist()]
    arr = np.asarray(x)
    if arr.dtype.kind not in "fiu":
        raise ValueError(f"invalid {name}: has dtype {arr.dtype}; expected numbers")
    return [float(f) for f in arr.reshape(-1).tolist()]


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
