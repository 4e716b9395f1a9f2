"""How the native module reads arrays: numpy arrays through ``__array_interface__``, torch
tensors through their attributes. ``TorchLike`` carries those attributes over numpy memory, so
the torch path is checked here without torch (and end to end, on the CPU backend)."""

import attnforge.flashinfer as fi
import numpy as np
import pytest
from attnforge import _native

from reference import attention

rng = np.random.default_rng()


class TorchLike:
    """The attributes attnforge reads from a torch tensor, over a numpy array."""

    class Device:
        def __init__(self, kind):
            self.type = kind

        def __str__(self):
            return self.type

    def __init__(self, array, dtype=None, device="cpu"):
        self.array = array
        self.shape = array.shape
        self.dtype = dtype or "torch." + array.dtype.name
        self.is_cuda = device == "cuda"
        self.device = TorchLike.Device(device)

    def data_ptr(self):
        return self.array.__array_interface__["data"][0]

    def stride(self):
        return tuple(s // self.array.itemsize for s in self.array.strides)

    def get_device(self):
        return 0 if self.is_cuda else -1


def rand(shape, dtype=np.float16):
    return rng.standard_normal(shape).astype(dtype)


def test_numpy_and_torch_like_read_alike():
    base = rand((6, 4, 64))
    view = base[1::2, :, :32]  # strided rows, a cut head dim
    address = view.__array_interface__["data"][0]
    want = (address, [3, 4, 32], [512, 64, 1], "f16", -1)
    assert _native.describe(view, "x") == want
    assert _native.describe(TorchLike(view), "x") == want
    # Row-major arrays carry no strides in their interface: they are derived.
    f32 = rand((2, 3), np.float32)
    assert _native.describe(f32, "x")[2:] == ([3, 1], "f32", -1)
    bf16 = TorchLike(rand((2, 3)), dtype="torch.bfloat16")
    assert _native.describe(bf16, "x")[3] == "bf16"
    cuda = TorchLike(rand((2, 3)), device="cuda")
    assert _native.describe(cuda, "x")[4] == 0


def test_what_cannot_be_read_is_refused_by_name():
    with pytest.raises(ValueError, match="invalid q.*float64"):
        _native.describe(rand((2, 2), np.float64), "q")
    with pytest.raises(ValueError, match="invalid k.*torch.int64"):
        _native.describe(TorchLike(rand((2, 2)), dtype="torch.int64"), "k")
    with pytest.raises(ValueError, match="invalid v.*is on meta"):
        _native.describe(TorchLike(rand((2, 2)), device="meta"), "v")
    with pytest.raises(TypeError, match="q must be a numpy array or a torch tensor, not list"):
        _native.describe([1.0, 2.0], "q")
    # Byte strides that are not whole elements (a structured array's field).
    packed = np.zeros(4, dtype=[("a", np.uint8), ("b", np.float16)])["b"]
    with pytest.raises(ValueError, match="whole elements"):
        _native.describe(packed, "x")


def test_a_read_only_output_is_refused():
    q, k, v = rand((4, 2, 64)), rand((9, 2, 64)), rand((9, 2, 64))
    w = fi.BatchPrefillWithRaggedKVCacheWrapper(np.empty(1, np.uint8))
    w.plan([0, 4], [0, 9], 2, 2, 64)
    out = np.empty((4, 2, 64), np.float16)
    out.flags.writeable = False
    with pytest.raises(ValueError, match="invalid out.*read-only"):
        w.run(q, k, v, out=out)


def test_torch_like_arrays_run_end_to_end():
    # Strided q (a slice of a wider buffer) and K/V as torch-like objects, on the CPU backend.
    wide = rand((5, 3, 128))
    q, k, v = wide[:, :, :64], rand((11, 3, 64)), rand((11, 3, 64))
    w = fi.BatchPrefillWithRaggedKVCacheWrapper(np.empty(1, np.uint8))
    w.plan([0, 5], [0, 11], 3, 3, 64, causal=True)
    out = np.full((5, 3, 64), np.nan, np.float16)
    got = w.run(TorchLike(q), TorchLike(k), TorchLike(v), out=TorchLike(out))
    assert isinstance(got, TorchLike)
    want, _ = attention(q, k, v, causal=True)
    np.testing.assert_allclose(out.astype(np.float64), want, atol=2e-2, rtol=2e-2)
