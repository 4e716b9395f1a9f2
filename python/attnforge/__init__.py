"""attnforge: attention kernels for LLM serving.

``attnforge.flashinfer`` offers FlashInfer's attention API (same names, arguments, defaults,
layouts and return conventions) on numpy arrays and torch tensors: host arrays run on
attnforge's CPU backend, CUDA tensors on its CUDA backend, on torch's current stream.
See ``docs/python.md`` in the repository for the API and the compatibility table.
"""

from . import _nvrtc

_nvrtc.point_at_wheel()

from . import flashinfer  # noqa: E402
from ._native import __version__, cuda_available  # noqa: E402

__all__ = ["flashinfer", "cuda_available", "__version__"]
