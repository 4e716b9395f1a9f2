"""Pointing attnforge's NVRTC search at this interpreter's ``nvidia-cuda-nvrtc`` wheel.

The Rust library looks for NVRTC in explicit settings, then a CUDA toolkit, then Python
site-packages, where it finds the directories of the ``python3`` on ``PATH``, which need not
be the interpreter running this package (a virtual environment used without activating it).
When no explicit setting or toolkit is there, this module names the NVRTC wheel of the running
interpreter through ``ATTNFORGE_CUDA_HOME``, before the first kernel is compiled.
"""

import contextlib
import glob
import os
import site
import sys

_SETTINGS = ("ATTNFORGE_NVRTC_LIB", "ATTNFORGE_CUDA_HOME", "CUDA_HOME", "CUDA_PATH")
_WHEEL_ROOTS = ("nvidia/cu13", "nvidia/cuda_nvrtc")


def _has_nvrtc(root):
    for lib in ("lib", "lib64"):
        d = os.path.join(root, lib)
        if glob.glob(os.path.join(d, "libnvrtc.so*")) and glob.glob(
            os.path.join(d, "libnvrtc-builtins.so*")
        ):
            return True
    return False


def _site_dirs():
    dirs = []
    # Some embedded interpreters lack getsitepackages.
    with contextlib.suppress(AttributeError):
        dirs += site.getsitepackages()
    dirs += [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))]
    return list(dict.fromkeys(dirs))


def point_at_wheel():
    """Sets ``ATTNFORGE_CUDA_HOME`` to this interpreter's NVRTC wheel when nothing else would
    be found first; returns the root it set, or ``None``."""
    if any(os.environ.get(k) for k in _SETTINGS) or _has_nvrtc("/usr/local/cuda"):
        return None
    for d in _site_dirs():
        for sub in _WHEEL_ROOTS:
            root = os.path.join(d, sub)
            if _has_nvrtc(root):
                os.environ["ATTNFORGE_CUDA_HOME"] = root
                return root
    return None
