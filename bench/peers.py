#!/usr/bin/env python3
"""The peers' side of attnforge's GPU benchmarks, timed on the very shapes that `attnforge bench`
times, the same way. Two suites:

  prefill  FlashInfer 0.5.3 FA2 (single prefill, ragged batch prefill), FlashInfer 0.5.3's FA3
           backend (f16 shapes), FlashAttention-3 from the `fa3-fwd` wheel (`flash_attn_func`,
           `flash_attn_varlen_func` for ragged batches; built without fp16, so bf16 shapes), and
           torch SDPA (flash and cuDNN backends), on contiguous K/V.
  paged    FlashInfer 0.5.3 over a paged KV cache (NHD, separate K and V pages): batch decode with
           BatchDecodeWithPagedKVCacheWrapper (CUDA cores, and tensor cores), batch paged prefill
           with BatchPrefillWithPagedKVCacheWrapper (FA2). A shape with a `kv_dtype` has an fp8
           cache (bench/peers_fp8.py: per-tensor scales, f16 queries), given to FlashInfer as
           kv_data_type and k_scale/v_scale. An `append` shape (new tokens' K/V written into
           the cache) has flashinfer.page.append_paged_kv_cache (bench/peers_append.py; f16
           caches only: it has no quantising append). torch SDPA has no paged KV cache and is
           left out of this suite.

Input: the RESOLVED shape list printed by `attnforge bench [--suite paged] --print-shapes` (a JSON
list of shape objects with `flops` and `bytes` added; paged shapes also carry the page table).
FLOP and byte counts are taken from that file, never recomputed here, so both sides share one
formula. Output: one JSON line per (shape, impl that applies to it) in the benchmark data contract
(docs/benchmarking.md), plus a short table on stdout.

Method, per (shape, impl):
  1. A peer that cannot run the shape is reported, never skipped: "missing: why" when the feature
     does not exist there (torch has no soft-cap and no f16 QK accumulation, fa3-fwd is built
     without fp16, FlashInfer's decode wrapper has no f16 QK accumulation), "error: why" when it
     fails (FlashInfer 0.5.3's f16-QK kernels stop at a static assertion unless FlashInfer is
     rebuilt with -DFP16_QK_REDUCTION_SUPPORTED and Boost.Math: that is expected). In the paged
     suite the decode wrappers apply to decode shapes (every qo_len 1, not causal) and the paged
     prefill wrapper to the others; FlashInfer's FA3 backend applies to f16 shapes (bf16 shapes
     have FA3 itself).
  2. FlashInfer JIT-compiles one module per configuration (backend, dtype, head dims, soft-cap
     on/off, f16 QK, and which kernel family) on its first call. Every configuration is compiled
     on a tiny problem before any timing, JIT_WORKERS at a time (--jit-workers), in one shared
     JIT folder; a configuration that fails to compile is not retried for its other shapes.
  3. The output of one call is checked against a float64 reference on a few rows of a few
     requests (all heads); relative L2 error above TOLERANCE gives "wrong: ..." and no time. For
     paged shapes the reference reads K/V gathered from the pages through the page table, over
     an fp8 cache the dequantised K/V (codes * scale); an append must have written every new
     token's rows exactly where the page table puts them.
  4. Timing (bench/peers_timing.py): replays of a CUDA graph of N calls, N so that a replay
     lasts a few milliseconds, the median replay over N; back to back where a call cannot be
     captured (the line's `method` says which); and the host time of one call in its own field.
     Inputs rotate among several random-normal copies when the working set is under 2x L2
     (paged: whole copies of q, k_cache and v_cache, one page table).

Usage:
  python3 bench/peers.py shapes-prefill.json --out peers-prefill.jsonl
  python3 bench/peers.py shapes-paged.json --suite paged --out peers-paged.jsonl
Also: --dry-run (print the plan, no GPU, no torch), --self-test (the timing rules and the timer
on a stand-in of torch.cuda, the fp8 quantisation on a stand-in tensor and the paged wrappers'
arguments on a stand-in of FlashInfer, on any machine; with torch, also the reference and the
page gather of the paged suite, fp8 included, on the CPU), --impls and --filter (narrow a run),
--method back-to-back.

The shapes are read by bench/peers_shapes.py; the page table check, the float64 reference, the
page gather, the output check (with TOLERANCE) and their self-test are in bench/peers_check.py;
the fp8 cache in bench/peers_fp8.py; the append peer in bench/peers_append.py; the timing in bench/peers_timing.py; the stand-in test of
the paged wrappers' calls in bench/peers_selftest.py.
"""

import argparse
import importlib
import json
import math
import os
import sys
import time
import warnings
from concurrent.futures import ThreadPoolExecutor

import peers_append
import peers_fp8
import peers_timing
from peers_check import check_output
from peers_shapes import (SUITE_PAGED, SUITE_PREFILL, PagedShape, Shape, load_shapes,
                          paged_kind)
from peers_timing import METHOD_BACK_TO_BACK, METHOD_GRAPH, Timer, first_output

IMPL_FLASHINFER = "flashinfer-fa2"
IMPL_FI_FA3 = "flashinfer-fa3"
IMPL_FA3 = "fa3"
IMPL_TORCH_FLASH = "torch-flash"
IMPL_TORCH_CUDNN = "torch-cudnn"
IMPL_FI_DECODE = "flashinfer-decode"
IMPL_FI_DECODE_TC = "flashinfer-decode-tc"
IMPL_FI_PAGED_PREFILL = "flashinfer-paged-prefill"
IMPL_FI_APPEND = peers_append.IMPL_FI_APPEND
# The peers of each suite, in the order of the report's columns (bench/report.py reads this).
SUITE_IMPLS = {
    SUITE_PREFILL: [IMPL_FLASHINFER, IMPL_FI_FA3, IMPL_FA3, IMPL_TORCH_FLASH, IMPL_TORCH_CUDNN],
    SUITE_PAGED: [IMPL_FI_DECODE, IMPL_FI_DECODE_TC, IMPL_FI_PAGED_PREFILL, IMPL_FI_APPEND],
}
# The peers that run only some shapes of their suite (no line for the others), and which:
# bench/report.py shows this for the shapes they leave out.
IMPL_SCOPE = {IMPL_FI_FA3: "runs the f16 shapes only (on bf16 shapes FA3 is the fa3 column)"}

L2_BYTES_FALLBACK = 60 * 1000 * 1000  # H200; the device's own figure is used when torch gives it
ROTATE_BELOW_L2_MULTIPLE = 2  # rotate inputs when one copy's working set is under 2x L2
ROTATE_TARGET_L2_MULTIPLE = 4  # ... among enough copies to span 4x L2
MAX_COPIES = 32
JIT_WORKERS = 4  # FlashInfer configurations compiled at once (each nvcc run takes one core)
INPUT_MEMORY_BUDGET = 16 * 1000 ** 3  # all rotated copies of a shape's inputs together
FLASHINFER_WORKSPACE_BYTES = 128 * 1024 * 1024
DEFAULT_JIT_DIR = "/tmp/attnforge-flashinfer-jit"
SEED = 20261130
ERROR_TEXT_LIMIT = 300
FA3_MODULE = "fa3_fwd_interface"
FA3_DIST = "fa3-fwd"

def short_error(exc):
    """First line of an exception's message; for a failed build, also the first compiler error."""
    text = str(exc).strip() or type(exc).__name__
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    msg = f"{type(exc).__name__}: {lines[0]}"
    compiler = next((ln for ln in lines[1:] if "error:" in ln), None)
    if compiler:
        msg += f" | {compiler}"
    return msg[:ERROR_TEXT_LIMIT]


def copies_for(shape, l2_bytes):
    """How many copies of the inputs the timed runs rotate among (shape.bytes is what one run
    touches; a paged cache may hold more, so the memory of all copies is capped too)."""
    if shape.bytes >= ROTATE_BELOW_L2_MULTIPLE * l2_bytes:
        return 1
    want = math.ceil(ROTATE_TARGET_L2_MULTIPLE * l2_bytes / max(shape.bytes, 1.0))
    fit = INPUT_MEMORY_BUDGET // max(shape.input_bytes(), 1)
    return max(1, min(MAX_COPIES, want, fit))


def result_line(shape, impl, status, timing=None, note=None, rel_err=None):
    """A result line; `timing` is Timer.time_runs's dict when the impl was timed."""
    line = {"suite": shape.suite, "shape": shape.name, "impl": impl, "status": status,
            "median_ms": None, "tflops": None, "tbps": None, "runs": 0}
    if timing is not None and timing["median_ms"] > 0:
        seconds = timing["median_ms"] * 1e-3
        line["median_ms"] = timing["median_ms"]
        line["tflops"] = shape.flops / seconds / 1e12 if shape.flops else None  # append: none
        line["tbps"] = shape.bytes / seconds / 1e12
        for field in ("runs", "method", "launches", "host_us", "host_calls"):
            line[field] = timing[field]
        if timing.get("note"):
            note = f"{note}; {timing['note']}" if note else timing["note"]
    if note:
        line["note"] = note
    if rel_err is not None:
        line["rel_err"] = rel_err
    return line


# ----------------------------------------------------------------------------------------------
# Implementations: each has applies(shape) -> bool (False: no line for this shape at all),
# unsupported(shape) -> str|None, config_key(shape) -> hashable|None, and
# setup(shape, inputs, copy_count) -> (run(copy_index), to_nhd(result), note).


def flashinfer_config(shape, backend="fa2"):
    """What selects one FlashInfer JIT module: sequence lengths, head counts and the mask do not.
    "batch" with fa2 is get_batch_prefill_module("fa2", ...): the ragged and the paged prefill
    wrappers and the tensor-core decode wrapper all load that one module (flashinfer/prefill.py,
    decode.py); the K/V dtype (an fp8 cache's) is part of it."""
    return (backend, "single" if shape.single else "batch", shape.dtype,
            shape.kv_dtype or shape.dtype, shape.d_qk, shape.d_vo, shape.soft_cap is not None,
            shape.qk_accum)


class FlashInferLib:
    """The flashinfer module (or why it cannot be imported) and the workspace its wrappers share;
    one per run, so every FlashInfer impl reports the same import failure."""

    def __init__(self, torch):
        self.torch = torch
        self.module = None
        self.import_error = None
        self.version = "-"
        try:
            import flashinfer  # noqa: PLC0415 (optional peer, imported only when asked for)
            self.module = flashinfer
            self.version = getattr(flashinfer, "__version__", "?")
        except Exception as exc:  # ImportError, or a failure inside its import
            self.import_error = short_error(exc)
        self._workspace = None

    def missing(self):
        return f"missing: flashinfer not importable: {self.import_error}" \
            if self.import_error else None

    def workspace(self):
        """The float workspace of the batch wrappers: zeroed before its first use, as the
        wrappers' docs ask; runs are sequential on one stream, so the wrappers share it."""
        if self._workspace is None:
            self._workspace = self.torch.zeros(FLASHINFER_WORKSPACE_BYTES,
                                               dtype=self.torch.uint8, device="cuda")
        return self._workspace


class FlashInferPrefill:
    """FlashInfer's prefill on contiguous K/V with one backend: single_prefill_with_kv_cache for
    one request, BatchPrefillWithRaggedKVCacheWrapper (plan untimed) for a ragged batch. The fa3
    backend runs the f16 shapes only: on bf16 shapes FA3 itself (fa3-fwd) is the peer."""

    def __init__(self, lib, name, backend):
        self.lib = lib
        self.name = name
        self.backend = backend

    def applies(self, shape):
        return self.backend == "fa2" or shape.dtype == "f16"

    def unsupported(self, shape):
        return self.lib.missing() if self.lib else None

    def config_key(self, shape):
        return flashinfer_config(shape, self.backend)

    def setup(self, shape, inputs, copy_count):
        fi, backend = self.lib.module, self.backend
        qs, ks, vs = inputs["q"], inputs["k"], inputs["v"]
        f16qk = shape.qk_accum == "f16"
        if shape.single:
            def run(i):
                return fi.single_prefill_with_kv_cache(
                    qs[i], ks[i], vs[i], causal=shape.causal, sm_scale=shape.sm_scale,
                    logits_soft_cap=shape.soft_cap, use_fp16_qk_reduction=f16qk, backend=backend)
            return run, (lambda o: o), f"single_prefill_with_kv_cache(backend={backend}), NHD"
        wrapper = fi.BatchPrefillWithRaggedKVCacheWrapper(self.lib.workspace(), "NHD",
                                                          backend=backend)
        wrapper.plan(inputs["qo_indptr"], inputs["kv_indptr"], shape.hq, shape.hkv, shape.d_qk,
                     shape.d_vo, causal=shape.causal, use_fp16_qk_reduction=f16qk,
                     logits_soft_cap=shape.soft_cap, sm_scale=shape.sm_scale,
                     q_data_type=inputs["dtype"], kv_data_type=inputs["dtype"])

        def run_batch(i):
            return wrapper.run(qs[i], ks[i], vs[i])
        return run_batch, (lambda o: o), \
            f"BatchPrefillWithRaggedKVCacheWrapper(backend={backend}) (plan untimed)"


class Fa3:
    """FlashAttention-3's forward from the fa3-fwd wheel: flash_attn_func on [1, seq, heads, dim]
    views for one request, flash_attn_varlen_func with cumulative lengths for a ragged batch.
    Its build has fp16 disabled: f16 shapes are missing. A call returns the output alone or
    first in a tuple, as builds differ (first_output)."""

    name = IMPL_FA3

    def __init__(self, import_module):
        """import_module: None in a dry run (nothing is imported)."""
        self.module, self.import_error, self.version = None, None, "-"
        if import_module is None:
            return
        try:
            self.module = import_module(FA3_MODULE)
            from importlib.metadata import version  # noqa: PLC0415
            self.version = version(FA3_DIST)
        except Exception as exc:  # ImportError, or a failure inside its import
            if self.module is None:
                self.import_error = short_error(exc)
            else:
                self.version = "?"

    def applies(self, shape):
        return True

    def unsupported(self, shape):
        if shape.dtype == "f16":
            return "missing: fa3-fwd is built without fp16"
        if self.import_error:
            return f"missing: {FA3_MODULE} not importable: {self.import_error}"
        if shape.qk_accum == "f16":
            return "missing: FA3 has no f16 QK accumulation"
        return None

    def config_key(self, shape):
        return None

    def setup(self, shape, inputs, copy_count):
        fa = self.module
        cap = shape.soft_cap or 0.0
        if shape.single:
            qs, ks, vs = ([x.unsqueeze(0) for x in inputs[n]] for n in ("q", "k", "v"))

            def run(i):
                return first_output(fa.flash_attn_func(qs[i], ks[i], vs[i],
                                                       softmax_scale=shape.sm_scale,
                                                       causal=shape.causal, softcap=cap))
            return run, (lambda o: o[0]), f"{FA3_DIST} {self.version} flash_attn_func, " \
                "[1, S, H, D]"
        qs, ks, vs = inputs["q"], inputs["k"], inputs["v"]
        cu_q, cu_k = inputs["qo_indptr"], inputs["kv_indptr"]
        max_q, max_k = max(shape.qo_lens), max(shape.kv_lens)

        def run_varlen(i):
            return first_output(fa.flash_attn_varlen_func(qs[i], ks[i], vs[i], cu_q, cu_k,
                                                          max_q, max_k,
                                                          softmax_scale=shape.sm_scale,
                                                          causal=shape.causal, softcap=cap))
        return run_varlen, (lambda o: o), f"{FA3_DIST} {self.version} flash_attn_varlen_func, " \
            "[total, H, D]"


class FlashInferPaged:
    """FlashInfer over the paged cache: the decode wrapper without or with tensor cores (decode
    shapes), or the FA2 paged prefill wrapper (the other paged shapes). plan() is untimed. Over
    an fp8 cache, plan() gets kv_data_type and run() the per-tensor k_scale and v_scale: in
    FlashInfer 0.5.3 k_scale is folded into sm_scale and the output multiplied by v_scale in a
    second kernel after the attention kernel (decode.py, prefill.py), timed with it."""

    def __init__(self, lib, name):
        self.lib = lib
        self.name = name
        self.decode = name in (IMPL_FI_DECODE, IMPL_FI_DECODE_TC)
        self.tensor_cores = name == IMPL_FI_DECODE_TC

    def applies(self, shape):
        return isinstance(shape, PagedShape) and not shape.append and shape.decode == self.decode

    def unsupported(self, shape):
        missing = self.lib.missing() if self.lib else None
        if missing:
            return missing
        if self.decode and shape.qk_accum == "f16":
            return "missing: BatchDecodeWithPagedKVCacheWrapper has no f16 QK accumulation"
        if self.decode and shape.d_qk != shape.d_vo:
            return "missing: BatchDecodeWithPagedKVCacheWrapper needs head_dim_qk == head_dim_vo"
        return None

    def config_key(self, shape):
        if self.decode and not self.tensor_cores:
            return ("fa2", "decode", shape.dtype, shape.kv_dtype or shape.dtype, shape.d_qk,
                    shape.soft_cap is not None)
        return flashinfer_config(shape)  # the fa2 batch prefill module (tensor-core decode too)

    def setup(self, shape, inputs, copy_count):
        fi, dtype, kv_dtype = self.lib.module, inputs["dtype"], inputs["kv_dtype"]
        qs, ks, vs = inputs["q"], inputs["k"], inputs["v"]
        table = (inputs["kv_page_indptr"], inputs["kv_page_indices"], inputs["kv_last_page_len"])
        if self.decode:
            wrapper = fi.BatchDecodeWithPagedKVCacheWrapper(
                self.lib.workspace(), "NHD", use_tensor_cores=self.tensor_cores)
            wrapper.plan(*table, shape.hq, shape.hkv, shape.d_qk, shape.page_size,
                         pos_encoding_mode="NONE", logits_soft_cap=shape.soft_cap,
                         q_data_type=dtype, kv_data_type=kv_dtype, sm_scale=shape.sm_scale)
            note = f"BatchDecodeWithPagedKVCacheWrapper(use_tensor_cores={self.tensor_cores})"
        else:
            wrapper = fi.BatchPrefillWithPagedKVCacheWrapper(self.lib.workspace(), "NHD",
                                                             backend="fa2")
            wrapper.plan(inputs["qo_indptr"], *table, shape.hq, shape.hkv, shape.d_qk,
                         shape.page_size, head_dim_vo=shape.d_vo, causal=shape.causal,
                         use_fp16_qk_reduction=shape.qk_accum == "f16",
                         logits_soft_cap=shape.soft_cap, sm_scale=shape.sm_scale,
                         q_data_type=dtype, kv_data_type=kv_dtype)
            note = "BatchPrefillWithPagedKVCacheWrapper(backend=fa2)"
        note += f", NHD pages of {shape.page_size} (plan untimed)"
        if shape.kv_dtype is None:
            def run(i):
                return wrapper.run(qs[i], (ks[i], vs[i]))
            return run, (lambda o: o), note
        k_scales, v_scales = inputs["k_scale"], inputs["v_scale"]

        def run_fp8(i):
            return wrapper.run(qs[i], (ks[i], vs[i]), k_scale=k_scales[i], v_scale=v_scales[i])
        return run_fp8, (lambda o: o), \
            f"{note}; {kv_dtype} cache, per-tensor k_scale and v_scale (the output's v_scale " \
            "multiply is a second kernel, timed)"


class TorchSdpa:
    def __init__(self, torch, name, backend_name):
        self.torch = torch
        self.name = name
        from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: PLC0415
        self.backend = getattr(SDPBackend, backend_name)
        self.sdpa_kernel = sdpa_kernel
        self.sdpa = torch.nn.functional.scaled_dot_product_attention

    def applies(self, shape):
        return True

    def unsupported(self, shape):
        if shape.soft_cap:
            return "missing: not supported by torch SDPA (soft-cap)"
        if shape.qk_accum == "f16":
            return "missing: not supported by torch SDPA (f16 QK accumulation)"
        if shape.causal and shape.qo_lens != shape.kv_lens:
            return "missing: torch SDPA's is_causal is top-left aligned and qo_len != kv_len"
        return None

    def config_key(self, shape):
        return None

    def _call(self, qb, kb, vb, causal, scale, gqa):
        with self.sdpa_kernel(self.backend):
            return self.sdpa(qb, kb, vb, is_causal=causal, scale=scale, enable_gqa=gqa)

    def setup(self, shape, inputs, copy_count):
        group = shape.hq // shape.hkv

        def to_bhsd(x, repeat):
            y = x.transpose(0, 1).unsqueeze(0)
            if repeat > 1:
                y = y.repeat_interleave(repeat, dim=1)
            return y.contiguous()

        def build(repeat):
            per_copy = []
            for c in range(copy_count):
                reqs = []
                for qs, ql, ks, kl in shape.requests():
                    reqs.append((to_bhsd(inputs["q"][c][qs:qs + ql], 1),
                                 to_bhsd(inputs["k"][c][ks:ks + kl], repeat),
                                 to_bhsd(inputs["v"][c][ks:ks + kl], repeat)))
                per_copy.append(reqs)
            return per_copy

        note = "layout [1, H, S, D] contiguous"
        gqa = group > 1
        data = build(1)
        if gqa:
            # Prefer the native GQA path; fall back to repeating K/V heads (outside the timed
            # region) only if this backend refuses enable_gqa, and say so in the note.
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    qb, kb, vb = data[0][0]
                    self._call(qb, kb, vb, shape.causal, shape.sm_scale, True)
                    note += "; GQA via enable_gqa=True"
                except Exception as exc:
                    why = str(caught[0].message).splitlines()[0] if caught else short_error(exc)
                    gqa = False
                    del data
                    data = build(group)
                    note += f"; GQA by repeating K/V heads before timing (enable_gqa refused: " \
                            f"{why[:120]})"
        if not shape.single:
            note += f"; ragged batch as a loop of {len(shape.qo_lens)} SDPA calls"
        causal, scale = shape.causal, shape.sm_scale

        def run(i):
            return [self._call(qb, kb, vb, causal, scale, gqa) for qb, kb, vb in data[i]]

        def to_nhd(outs):
            return self.torch.cat([o[0].transpose(0, 1) for o in outs], dim=0)

        return run, to_nhd, note


# ----------------------------------------------------------------------------------------------
# Driver


def make_inputs(torch, shape, copy_count, device="cuda"):
    """copy_count random-normal copies of q, K and V (paged shapes: of q, k_cache and v_cache,
    every page filled, used or not), and the shape's index arrays as int32 tensors. An fp8 cache
    (kv_dtype) is quantised from random-normal values of dtype, one scale per tensor and copy
    (k_scale and v_scale: lists of floats, one per copy). An append shape has its own inputs
    (peers_append.make_append_inputs)."""
    dtype = {"f16": torch.float16, "bf16": torch.bfloat16}[shape.dtype]
    gen = torch.Generator(device=device)
    gen.manual_seed(SEED)
    k_size, v_size = shape.kv_sizes()

    def randn(*size):
        return torch.randn(*size, dtype=dtype, device=device, generator=gen)

    if getattr(shape, "append", False):
        return peers_append.make_append_inputs(torch, shape, copy_count, randn, device)
    inputs = {"dtype": dtype, "kv_dtype": dtype, "q": [], "k": [], "v": []}
    if shape.kv_dtype is not None:
        inputs.update(kv_dtype=getattr(torch, peers_fp8.fp8_format(shape.kv_dtype).torch_name),
                      k_scale=[], v_scale=[])
    for _ in range(copy_count):
        inputs["q"].append(randn(sum(shape.qo_lens), shape.hq, shape.d_qk))
        for name, size in (("k", k_size), ("v", v_size)):
            values = randn(*size)
            if shape.kv_dtype is not None:
                values, scale = peers_fp8.quantise(torch, values, shape.kv_dtype)
                inputs[f"{name}_scale"].append(scale)
            inputs[name].append(values)
    for name, values in shape.index_arrays().items():
        inputs[name] = torch.tensor(values, dtype=torch.int32, device=device)
    return inputs


def run_one(torch, timer, impl, shape, inputs, copy_count, jit_failures, jit_notes):
    """One result line for (shape, impl): missing, error, wrong, or ok with its time."""
    missing = impl.unsupported(shape)
    if missing:
        return result_line(shape, impl.name, missing)
    key = impl.config_key(shape)
    if key is not None and key in jit_failures:
        return result_line(shape, impl.name, f"error: {jit_failures[key]}")
    # torch explains why a backend refuses a shape in warnings, not in the exception: keep them.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            return measure(torch, timer, impl, shape, inputs, copy_count, jit_notes.get(key))
        except Exception as exc:
            status = f"error: {short_error(exc)}"
            if caught:
                status += f" | warning: {str(caught[0].message).splitlines()[0]}"
            return result_line(shape, impl.name, status[:ERROR_TEXT_LIMIT])


def measure(torch, timer, impl, shape, inputs, copy_count, jit_note):
    """Set up, check the output of copy 0 against the reference, then time; raises on failure."""
    run, to_nhd, note = impl.setup(shape, inputs, copy_count)
    if jit_note:
        note += f"; {jit_note}"
    out = to_nhd(run(0))
    torch.cuda.synchronize()
    if hasattr(impl, "check"):  # an impl whose output is not attention (the append)
        rel, problem = impl.check(torch, shape, inputs, out)
    else:
        scales = (inputs["k_scale"][0], inputs["v_scale"][0]) if shape.kv_dtype else None
        rel, problem = check_output(torch, shape, inputs["q"][0], inputs["k"][0],
                                    inputs["v"][0], out, scales)
    del out
    if problem:
        return result_line(shape, impl.name, f"wrong: {problem}", note=note, rel_err=rel)
    timing = timer.time_runs(run, copy_count)
    return result_line(shape, impl.name, "ok", timing=timing, note=note, rel_err=rel)


def jit_probe(torch, impl, shape):
    """Runs one call of impl on a tiny shape of shape's configuration (its JIT build, nvcc
    running outside the GIL); returns (seconds, error text or None). The output is not used."""
    probe = shape.probe()
    t0 = time.perf_counter()
    try:
        inputs = make_inputs(torch, probe, 1)
        run, _, _ = impl.setup(probe, inputs, 1)
        run(0)
        torch.cuda.synchronize()
        return time.perf_counter() - t0, None
    except Exception as exc:
        return time.perf_counter() - t0, short_error(exc)


def compile_configs(torch, impls, shapes, jit_failures, jit_notes, workers):
    """Builds each FlashInfer configuration once on a tiny problem before timing, `workers` at a
    time (each build is FlashInfer's own ninja run under its own per-module lock). A
    configuration shared by several impls (the fa2 batch module) is built once."""
    jobs = {}
    for impl in impls:
        for shape in shapes:
            if not impl.applies(shape) or impl.unsupported(shape):
                continue
            key = impl.config_key(shape)
            if key is not None and key not in jobs:
                jobs[key] = (impl, shape)
    if not jobs:
        return
    # FA3 modules take about three times as long as FA2 ones: they start first.
    jobs = dict(sorted(jobs.items(), key=lambda item: item[0][0] != "fa3"))
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        futures = {key: pool.submit(jit_probe, torch, impl, shape)
                   for key, (impl, shape) in jobs.items()}
        for key, future in futures.items():
            secs, error = future.result()
            name = jobs[key][0].name
            if error:
                jit_failures[key] = error
                print(f"[jit] {name} {key}: FAILED after {secs:.1f} s: {error}", flush=True)
            else:
                jit_notes[key] = f"first call (JIT) {secs:.1f} s, untimed"
                print(f"[jit] {name} {key}: ready in {secs:.1f} s", flush=True)


def print_table(lines):
    print("\n| shape | impl | status | median ms | TFLOP/s | TB/s | host us | method |")
    print("|---|---|---|---:|---:|---:|---:|---|")
    for ln in lines:
        status = ln["status"] if ln["status"] == "ok" else ln["status"][:70]
        ms = f"{ln['median_ms']:.4f}" if ln["median_ms"] else "-"
        tf = f"{ln['tflops']:.1f}" if ln["tflops"] else "-"
        tb = f"{ln['tbps']:.2f}" if ln["tbps"] else "-"
        host = f"{ln['host_us']:.1f}" if ln.get("host_us") else "-"
        print(f"| {ln['shape']} | {ln['impl']} | {status} | {ms} | {tf} | {tb} | {host} | "
              f"{ln.get('method', '-')} |")
    sys.stdout.flush()


def make_impls(torch, suite, names, lib):
    """The impl objects for `names`. Without torch (a dry run), FlashInfer impls get lib None
    (enough for applies/config_key), FA3 imports nothing, and torch's are None (they apply to
    every prefill shape)."""
    objs = []
    for name in names:
        if name == IMPL_FLASHINFER:
            objs.append(FlashInferPrefill(lib, name, "fa2"))
        elif name == IMPL_FI_FA3:
            objs.append(FlashInferPrefill(lib, name, "fa3"))
        elif name == IMPL_FA3:
            objs.append(Fa3(None if torch is None else importlib.import_module))
        elif name == IMPL_FI_APPEND:
            objs.append(peers_append.FlashInferAppend(lib, name))
        elif suite == SUITE_PAGED:
            objs.append(FlashInferPaged(lib, name))
        elif torch is None:
            objs.append(None)
        else:
            backend = "FLASH_ATTENTION" if name == IMPL_TORCH_FLASH else "CUDNN_ATTENTION"
            objs.append(TorchSdpa(torch, name, backend))
    return objs


def dry_run(suite, shapes, impls):
    print(f"suite {suite}: {len(shapes)} shapes; impls: {', '.join(impls)}")
    objs = dict(zip(impls, make_impls(None, suite, impls, None)))
    configs = []
    for s in shapes:
        here = [n for n, o in objs.items() if o is None or o.applies(s)]
        for n in here:
            o = objs[n]
            key = o.config_key(s) if o is not None and not o.unsupported(s) else None
            if key is not None and key not in configs:
                configs.append(key)
        extra = ""
        if suite == SUITE_PAGED:
            extra = (f" {paged_kind(s)} page_size={s.page_size} "
                     f"pages={len(s.kv_page_indices)}/{s.num_pages} kv={s.kv_dtype or s.dtype}")
        print(f"  {s.name}: requests={len(s.qo_lens)}{extra} flops={s.flops:.3e} "
              f"bytes={s.bytes:.3e} copies={copies_for(s, L2_BYTES_FALLBACK)} "
              f"impls={','.join(here) or '-'}")
    print(f"FlashInfer configurations to compile ({JIT_WORKERS} at a time by default): "
          f"{len(configs)}")
    for key in configs:
        print(f"  {key}")
    t = peers_timing
    print(f"timing: CUDA graph of N calls (back to back where capture fails), N for a "
          f"{t.REPLAY_TARGET_MS:g} ms replay (at most {t.MAX_LAUNCHES}); {t.MIN_RUNS}-"
          f"{t.MAX_RUNS} replays filling {t.TARGET_TIMED_MS:g} ms; host time of "
          f"{t.MIN_HOST_CALLS}-{t.MAX_HOST_CALLS} calls in bursts of {t.HOST_BURST}")


def self_test():
    """The timing's, the fp8 quantisation's and the FlashInfer paged calls' self-tests (no torch
    needed), then, where torch imports, the reference's and the page gather's (peers_check). True
    when everything that ran passed."""
    ok = peers_timing.self_test()
    ok = peers_fp8.self_test() and ok
    from peers_selftest import self_test as wiring_self_test  # noqa: PLC0415 (imports this)
    ok = wiring_self_test() and ok
    try:
        import torch  # noqa: PLC0415
    except ImportError:
        print("reference self-test: not run: torch is not importable here (it needs torch's "
              "CPU build)")
        return ok
    from peers_check import self_test as check_self_test  # noqa: PLC0415
    return check_self_test(torch, Shape, PagedShape) and ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("shapes", nargs="?", help="resolved shapes (attnforge bench --print-shapes)")
    ap.add_argument("--suite", choices=list(SUITE_IMPLS), default=SUITE_PREFILL,
                    help="which suite the shapes belong to (default prefill)")
    ap.add_argument("--out", help="JSON-lines output file")
    ap.add_argument("--impls", default="",
                    help="comma-separated subset of the suite's peers (default: all of them): "
                         + "; ".join(f"{k}: {','.join(v)}" for k, v in SUITE_IMPLS.items()))
    ap.add_argument("--filter", default="", help="only shapes whose name contains this text")
    ap.add_argument("--jit-dir", default=os.environ.get("FLASHINFER_WORKSPACE_BASE",
                                                         DEFAULT_JIT_DIR),
                    help="FlashInfer JIT workspace (sets FLASHINFER_WORKSPACE_BASE)")
    ap.add_argument("--method", choices=[METHOD_GRAPH, METHOD_BACK_TO_BACK],
                    default=METHOD_GRAPH, help="CUDA graph replays (back to back where a call "
                    "cannot be captured), or back to back for every peer (default graph)")
    ap.add_argument("--jit-workers", type=int, default=JIT_WORKERS,
                    help=f"FlashInfer configurations compiled at once (default {JIT_WORKERS})")
    ap.add_argument("--dry-run", action="store_true", help="print the plan; no GPU, no torch")
    ap.add_argument("--self-test", action="store_true",
                    help="check the timing on a stand-in of torch.cuda and the fp8 quantisation "
                         "on a stand-in tensor; with torch, also the reference and the page "
                         "gather on the CPU (both suites, fp8 caches included)")
    args = ap.parse_args()

    if args.self_test:
        return 0 if self_test() else 1
    if not args.shapes:
        ap.error("the resolved shapes file is required")
    known = SUITE_IMPLS[args.suite]
    impls = [x.strip() for x in args.impls.split(",") if x.strip()] or list(known)
    unknown = [x for x in impls if x not in known]
    if unknown:
        ap.error(f"--impls: unknown in suite {args.suite}: {unknown}; known: {known}")
    try:
        shapes = load_shapes(args.shapes, args.suite, args.filter)
    except (OSError, ValueError) as exc:
        print(f"peers.py: cannot read shapes: {exc}", file=sys.stderr)
        return 2
    if args.dry_run:
        dry_run(args.suite, shapes, impls)
        return 0
    if not args.out:
        ap.error("--out is required")

    # FlashInfer reads its cache location when it is imported: set it first, one folder for all.
    os.environ["FLASHINFER_WORKSPACE_BASE"] = args.jit_dir
    import torch  # noqa: PLC0415
    if not torch.cuda.is_available():
        print("peers.py: no CUDA device visible to torch", file=sys.stderr)
        return 2
    props = torch.cuda.get_device_properties(0)
    l2_bytes = getattr(props, "L2_cache_size", 0) or L2_BYTES_FALLBACK
    print(f"peers.py: suite {args.suite}, {props.name}, torch {torch.__version__}, CUDA "
          f"{torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}, L2 "
          f"{l2_bytes / 1e6:.0f} MB, {len(shapes)} shapes, JIT dir {args.jit_dir}", flush=True)

    lib = None
    if any(name.startswith("flashinfer") for name in impls):
        lib = FlashInferLib(torch)
        print(f"peers.py: flashinfer {lib.version}"
              f"{' (' + lib.import_error + ')' if lib.import_error else ''}", flush=True)
        if not lib.import_error:
            lib.workspace()  # allocated once, before the JIT threads share it
    impl_objs = make_impls(torch, args.suite, impls, lib)
    for impl in impl_objs:
        if isinstance(impl, Fa3):
            print(f"peers.py: {FA3_DIST} {impl.version}"
                  f"{' (' + impl.import_error + ')' if impl.import_error else ''}", flush=True)

    jit_failures, jit_notes = {}, {}
    t_jit = time.perf_counter()
    compile_configs(torch, impl_objs, shapes, jit_failures, jit_notes, args.jit_workers)
    print(f"[jit] all configurations in {time.perf_counter() - t_jit:.1f} s", flush=True)

    timer = Timer(torch, args.method)
    if not timer.can_sleep:
        print("peers.py: torch.cuda._sleep unavailable: back-to-back times of small shapes may "
              "include host overhead", flush=True)
    metric, unit = ("tbps", "TB/s") if args.suite == SUITE_PAGED else ("tflops", "TFLOP/s")
    results = []
    with open(args.out, "w") as out:
        for n, shape in enumerate(shapes, 1):
            t0 = time.perf_counter()
            here = [impl for impl in impl_objs if impl.applies(shape)]
            copy_count = copies_for(shape, l2_bytes)
            inputs, why = None, None
            if here:
                try:
                    inputs = make_inputs(torch, shape, copy_count)
                except Exception as exc:
                    why = f"error: inputs: {short_error(exc)}"
            lines = []
            for impl in here:
                if inputs is None:
                    line = result_line(shape, impl.name, why)
                else:
                    line = run_one(torch, timer, impl, shape, inputs, copy_count, jit_failures,
                                   jit_notes)
                lines.append(line)
                out.write(json.dumps(line) + "\n")
                out.flush()
            results += lines
            del inputs
            torch.cuda.empty_cache()
            summary = ", ".join(
                f"{ln['impl']} {ln[metric] or 0:.2f} {unit}" if ln["status"] == "ok"
                else f"{ln['impl']} {ln['status'].split(':')[0]}" for ln in lines) or "no impl"
            print(f"[{n}/{len(shapes)}] {shape.name} (x{copy_count} copies, "
                  f"{time.perf_counter() - t0:.1f} s): {summary}", flush=True)
    print_table(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
