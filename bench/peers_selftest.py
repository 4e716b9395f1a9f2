"""The self-test of how bench/peers.py calls FlashInfer's paged wrappers and its paged append
(part of `python3 bench/peers.py --self-test`), on any machine, no GPU, torch or FlashInfer
needed: a stand-in of the flashinfer module records every plan(), run() and
append_paged_kv_cache() call, and for each paged impl, over an f16 cache and over an e4m3 cache,
the calls must carry the right data types, input copy and scales; the append must get the new
rows of the copy asked for, the new tokens' batch indices and positions, the cache pair and the
page table in FlashInfer's order, and refuse an fp8 cache as missing.
"""

from peers import (IMPL_FI_APPEND, IMPL_FI_DECODE, IMPL_FI_DECODE_TC, IMPL_FI_PAGED_PREFILL,
                   SUITE_IMPLS, FlashInferPaged)
from peers_append import FP8_MISSING, FlashInferAppend
from peers_check import SELF_TEST_KV_LENS, SELF_TEST_TABLE
from peers_shapes import SUITE_PAGED, PagedShape

Q_DTYPE, FP8_DTYPE = "torch.float16 stand-in", "torch.float8_e4m3fn stand-in"
K_SCALES, V_SCALES = [0.5, 0.25], [2.0, 4.0]


class _Recorder:
    """A stand-in of a FlashInfer wrapper class: each instance records its construction and its
    plan() and run() calls in the shared list."""

    def __init__(self, calls, kind):
        self.calls, self.kind = calls, kind

    def __call__(self, *args, **kwargs):
        self.calls.append((self.kind, "init", args, kwargs))
        return self

    def plan(self, *args, **kwargs):
        self.calls.append((self.kind, "plan", args, kwargs))

    def run(self, *args, **kwargs):
        self.calls.append((self.kind, "run", args, kwargs))
        return "out"


class _FakeLib:
    def __init__(self, calls):
        module = type("flashinfer", (), {})()
        module.BatchDecodeWithPagedKVCacheWrapper = _Recorder(calls, "decode")
        module.BatchPrefillWithPagedKVCacheWrapper = _Recorder(calls, "prefill")
        module.append_paged_kv_cache = \
            lambda *args, **kwargs: calls.append(("page", "append", args, kwargs))
        self.module = module

    def missing(self):
        return None

    def workspace(self):
        return "workspace"


def _shape(qo_lens, causal, kv_dtype, append=False):
    return PagedShape({"name": "wiring", "qo_lens": qo_lens, "kv_lens": SELF_TEST_KV_LENS,
                       "num_qo_heads": 2 if append else 8, "num_kv_heads": 2, "head_dim": 64,
                       "causal": causal, "dtype": "f16", "soft_cap": None, "qk_accum": "f32",
                       "flops": 1, "bytes": 1, "kv_dtype": kv_dtype, "append": append,
                       **SELF_TEST_TABLE})


def _inputs(kv_dtype):
    inputs = {"dtype": Q_DTYPE, "kv_dtype": FP8_DTYPE if kv_dtype else Q_DTYPE,
              "q": ["q0", "q1"], "k": ["k0", "k1"], "v": ["v0", "v1"], "qo_indptr": "qo_indptr",
              "kv_page_indptr": "indptr", "kv_page_indices": "indices",
              "kv_last_page_len": "last"}
    if kv_dtype:
        inputs.update(k_scale=K_SCALES, v_scale=V_SCALES)
    return inputs


def self_test():
    """True when every paged impl plans with the cache's data type and runs copy i with copy i's
    scales (and no scales over an f16 cache)."""
    failures = []

    def check(cond, what):
        print(f"  {'ok  ' if cond else 'FAIL'} {what}")
        if not cond:
            failures.append(what)

    print("FlashInfer paged calls (stand-in):")
    check(SUITE_IMPLS[SUITE_PAGED] == [IMPL_FI_DECODE, IMPL_FI_DECODE_TC, IMPL_FI_PAGED_PREFILL,
                                       IMPL_FI_APPEND],
          "the paged suite's impls are FlashInfer's paged wrappers and append (no torch SDPA)")
    for name in (IMPL_FI_DECODE, IMPL_FI_DECODE_TC, IMPL_FI_PAGED_PREFILL):
        for kv_dtype in (None, "e4m3"):
            calls = []
            impl = FlashInferPaged(_FakeLib(calls), name)
            decode = name != IMPL_FI_PAGED_PREFILL
            shape = _shape([1, 1, 1], False, kv_dtype) if decode else \
                _shape([3, 1, 6], True, kv_dtype)
            run, to_nhd, note = impl.setup(shape, _inputs(kv_dtype), 2)
            out = to_nhd(run(1))
            kind = "decode" if decode else "prefill"
            plans = [c for c in calls if c[1] == "plan"]
            runs = [c for c in calls if c[1] == "run"]
            label = f"{name} over {kv_dtype or 'f16'}"
            check(impl.applies(shape) and impl.unsupported(shape) is None, f"{label}: applies")
            check(len(plans) == 1 and plans[0][0] == kind
                  and plans[0][3].get("q_data_type") == Q_DTYPE
                  and plans[0][3].get("kv_data_type") == (FP8_DTYPE if kv_dtype else Q_DTYPE),
                  f"{label}: plan(q_data_type=f16, kv_data_type="
                  f"{'float8_e4m3fn' if kv_dtype else 'f16'})")
            want = {"k_scale": K_SCALES[1], "v_scale": V_SCALES[1]} if kv_dtype else {}
            check(out == "out" and len(runs) == 1 and runs[0][2] == ("q1", ("k1", "v1"))
                  and runs[0][3] == want,
                  f"{label}: run(q, (k_cache, v_cache){', k_scale, v_scale' if kv_dtype else ''})"
                  f" of the copy asked for")
            check((kv_dtype is not None) == ("k_scale" in note), f"{label}: the note says so")
    _append_self_test(check)
    verdict = "PASS" if not failures else f"FAIL ({len(failures)})"
    print(f"FlashInfer paged calls self-test: {verdict}")
    return not failures


def _append_self_test(check):
    """The append peer: which shapes it and the wrappers take, its call's arguments, its refusal
    of an fp8 cache, and the new tokens' positions."""
    # Requests of 9, 4 and 6 tokens append 2, 1 and 3 of them.
    news = [2, 1, 3]
    shape = _shape(news, False, None, append=True)
    check(shape.append_positions() == ([0, 0, 1, 2, 2, 2], [7, 8, 3, 3, 4, 5]),
          "append: batch_indices and positions of the new tokens (the last of each request)")
    check(all(not FlashInferPaged(_FakeLib([]), name).applies(shape)
              for name in (IMPL_FI_DECODE, IMPL_FI_DECODE_TC, IMPL_FI_PAGED_PREFILL)),
          "append: no attention wrapper runs an append shape")
    calls = []
    impl = FlashInferAppend(_FakeLib(calls))
    check(impl.applies(shape) and not impl.applies(_shape([1, 1, 1], False, None))
          and impl.unsupported(shape) is None, "append: applies to append shapes only")
    check(impl.unsupported(_shape(news, False, "e4m3", append=True)) == FP8_MISSING,
          "append: an e4m3 cache is missing (no quantising append in FlashInfer)")
    inputs = {"k_new": ["kn0", "kn1"], "v_new": ["vn0", "vn1"], "k_cache": "kc", "v_cache": "vc",
              "batch_indices": "batch", "positions": "pos", "kv_page_indices": "indices",
              "kv_page_indptr": "indptr", "kv_last_page_len": "last"}
    run, to_nhd, _ = impl.setup(shape, inputs, 2)
    out = to_nhd(run(1))
    want = ("kn1", "vn1", "batch", "pos", ("kc", "vc"), "indices", "indptr", "last")
    check(out == ("kc", "vc") and calls == [("page", "append", want, {"kv_layout": "NHD"})],
          "append: append_paged_kv_cache(k, v of the copy asked for, batch_indices, positions, "
          "(k_cache, v_cache), kv_indices, kv_indptr, kv_last_page_len, kv_layout=NHD)")
