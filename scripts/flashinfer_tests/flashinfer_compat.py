"""The few FlashInfer internals that FlashInfer's attention tests import outside their fixtures.

`scripts/flashinfer-tests` copies this module beside FlashInfer's test files and points those
imports here (FlashInfer itself is not installed where the tests run). Nothing here computes a
result a test checks:

- `is_sm90a_supported(device)`: whether the device is a Hopper GPU (compute capability 9.x); the
  attention-sink tests skip their `backend="fa3"` cases without one.
- `filename_safe_dtype_map`: a short name per dtype, which those tests put in the module name
  they pass as `jit_args`.
- `attention_sink_decl`: per backend, FlashInfer's CUDA source of its attention-sink variant,
  which those tests pass in `jit_args`. attnforge refuses `jit_args` (NotImplementedError) before
  reading it, so the source is not carried: each entry only names what it stands for.
"""

import torch


def is_sm90a_supported(device):
    major, _minor = torch.cuda.get_device_capability(device)
    return major == 9


filename_safe_dtype_map = {
    torch.float16: "f16",
    torch.bfloat16: "bf16",
    torch.float8_e4m3fn: "e4m3",
    torch.float8_e5m2: "e5m2",
    torch.int32: "i32",
    torch.int64: "i64",
}

attention_sink_decl = {
    backend: f"(FlashInfer's attention-sink variant for {backend}: not carried)"
    for backend in ("fa2", "fa3")
}
