"""The shapes bench/peers.py runs: a resolved prefill shape (one request, or a ragged batch of
them over contiguous K/V) and a resolved paged shape (a batch over a paged KV cache with its page
table; the cache holds `dtype`, or the fp8 format its `kv_dtype` names; with `append`, the shape is
the append of each request's qo_lens new tokens' K/V into that cache), read from the JSON list
`attnforge bench [--suite paged] --print-shapes` writes (fields: docs/benchmarking.md, "The data
contract"), with the tiny shape of the same FlashInfer configuration that triggers its JIT build.
"""

import json
import math

from peers_check import TOLERANCE, check_page_table, gather_pages
from peers_fp8 import fp8_format

SUITE_PREFILL = "prefill"
SUITE_PAGED = "paged"
JIT_PROBE_LENS = {"single": [128], "batch": [64, 96]}
JIT_PROBE_PAGED = {"qo_lens": [5, 3], "kv_pages": [3, 1]}  # decode probes use qo_lens 1
REQUIRED_FIELDS = ["name", "qo_lens", "kv_lens", "num_qo_heads", "num_kv_heads", "causal",
                   "dtype", "qk_accum", "flops", "bytes"]
PAGED_FIELDS = ["page_size", "num_pages", "kv_page_indptr", "kv_page_indices",
                "kv_last_page_len"]
DTYPE_BYTES = {"f16": 2, "bf16": 2}


PAGED_DECODE, PAGED_PREFILL, PAGED_APPEND = "decode", "prefill", "append"


def paged_kind(obj):
    """What a paged shape (a dict or a Shape) measures: "append" when it is an append, else
    "decode" when every qo_len is 1 and it is not causal, else "prefill" (paged prefill).
    bench/report.py groups by this."""
    get = obj.get if isinstance(obj, dict) else (lambda field, default=None:
                                                 getattr(obj, field, default))
    if get("append", False):
        return PAGED_APPEND
    decode = all(int(n) == 1 for n in get("qo_lens")) and not get("causal")
    return PAGED_DECODE if decode else PAGED_PREFILL


def is_decode(obj):
    """Whether a paged shape (a dict or a Shape) is a batch decode shape (paged_kind)."""
    return paged_kind(obj) == PAGED_DECODE


def prefix_sums(lens):
    acc = [0]
    for n in lens:
        acc.append(acc[-1] + n)
    return acc


class Shape:
    """One resolved prefill shape (single request when it has one length, else a ragged batch)."""

    suite = SUITE_PREFILL

    def __init__(self, obj):
        for field in REQUIRED_FIELDS:
            if field not in obj:
                raise ValueError(f"shape {obj.get('name', '?')!r}: missing field {field!r}")
        self.name = obj["name"]
        self.qo_lens = [int(x) for x in obj["qo_lens"]]
        self.kv_lens = [int(x) for x in obj["kv_lens"]]
        if not self.qo_lens or len(self.qo_lens) != len(self.kv_lens):
            raise ValueError(f"shape {self.name!r}: qo_lens and kv_lens must be non-empty and "
                             f"of one length, got {self.qo_lens} and {self.kv_lens}")
        self.hq = int(obj["num_qo_heads"])
        self.hkv = int(obj["num_kv_heads"])
        if self.hkv <= 0 or self.hq % self.hkv != 0:
            raise ValueError(f"shape {self.name!r}: num_qo_heads {self.hq} is not a multiple of "
                             f"num_kv_heads {self.hkv}")
        if "head_dim" in obj:
            self.d_qk = self.d_vo = int(obj["head_dim"])
        elif "head_dim_qk" in obj and "head_dim_vo" in obj:
            self.d_qk, self.d_vo = int(obj["head_dim_qk"]), int(obj["head_dim_vo"])
        else:
            raise ValueError(f"shape {self.name!r}: needs head_dim or head_dim_qk/head_dim_vo")
        self.causal = bool(obj["causal"])
        self.dtype = obj["dtype"]
        if self.dtype not in TOLERANCE:
            raise ValueError(f"shape {self.name!r}: dtype {self.dtype!r} is not f16 or bf16")
        cap = obj.get("soft_cap")
        self.soft_cap = float(cap) if cap else None
        self.qk_accum = obj["qk_accum"]
        if self.qk_accum not in ("f32", "f16"):
            raise ValueError(f"shape {self.name!r}: qk_accum {self.qk_accum!r} is not f32 or f16")
        self.kv_dtype = obj.get("kv_dtype")
        if self.kv_dtype is not None:
            if obj.get("page_size") is None:
                raise ValueError(f"shape {self.name!r}: kv_dtype is for paged shapes only")
            try:
                fp8_format(self.kv_dtype)
            except ValueError as exc:
                raise ValueError(f"shape {self.name!r}: {exc}") from None
        self.append = bool(obj.get("append", False))
        if self.append and (obj.get("page_size") is None or self.hq != self.hkv):
            raise ValueError(f"shape {self.name!r}: an append is a paged shape with "
                             "num_qo_heads == num_kv_heads")
        if self.append and any(n > k for n, k in zip(self.qo_lens, self.kv_lens)):
            raise ValueError(f"shape {self.name!r}: an append's qo_lens (new tokens) must not "
                             "exceed its kv_lens")
        self.flops = float(obj["flops"])
        self.bytes = float(obj["bytes"])
        self.sm_scale = 1.0 / math.sqrt(self.d_qk)

    @property
    def single(self):
        return len(self.qo_lens) == 1

    def requests(self):
        """(qo_start, qo_len, kv_start, kv_len) per request."""
        out, qs, ks = [], 0, 0
        for ql, kl in zip(self.qo_lens, self.kv_lens):
            out.append((qs, ql, ks, kl))
            qs, ks = qs + ql, ks + kl
        return out

    def kv_sizes(self):
        """Sizes of the K and V tensors that hold the keys and values of the whole batch."""
        tk = sum(self.kv_lens)
        return (tk, self.hkv, self.d_qk), (tk, self.hkv, self.d_vo)

    def index_arrays(self):
        """The int32 index arrays the peers are given, by name."""
        return {"qo_indptr": prefix_sums(self.qo_lens), "kv_indptr": prefix_sums(self.kv_lens)}

    def request_kv(self, k, v, r):
        """Request r's keys and values, [kv_len, hkv, d] each, from the batch's K and V."""
        _, _, ks, kl = self.requests()[r]
        return k[ks:ks + kl], v[ks:ks + kl]

    def input_bytes(self):
        """Bytes of one copy of the inputs (q, K, V or the K/V caches) as allocated; an fp8
        cache has one byte an element."""
        q_bytes = DTYPE_BYTES[self.dtype] * sum(self.qo_lens) * self.hq * self.d_qk
        kv_element = 1 if self.kv_dtype else DTYPE_BYTES[self.dtype]
        return q_bytes + kv_element * sum(math.prod(size) for size in self.kv_sizes())

    def probe(self):
        """A tiny shape of the same FlashInfer configuration, used to trigger its JIT build."""
        lens = JIT_PROBE_LENS["single" if self.single else "batch"]
        obj = {"name": self.name + "#jit-probe", "qo_lens": lens, "kv_lens": lens,
               "num_qo_heads": self.hq, "num_kv_heads": self.hkv,
               "head_dim_qk": self.d_qk, "head_dim_vo": self.d_vo, "causal": self.causal,
               "dtype": self.dtype, "soft_cap": self.soft_cap, "qk_accum": self.qk_accum,
               "flops": 0, "bytes": 0}
        return Shape(obj)


class PagedShape(Shape):
    """One resolved paged shape: a batch whose K and V live in pages of a cache (NHD, separate K
    and V caches of [num_pages, page_size, num_kv_heads, head_dim]), found through FlashInfer's
    page table (kv_page_indptr, kv_page_indices, kv_last_page_len), which peers_check's
    check_page_table validates. Always a batch."""

    suite = SUITE_PAGED

    def __init__(self, obj):
        super().__init__(obj)
        for field in PAGED_FIELDS:
            if field not in obj:
                raise ValueError(f"shape {self.name!r}: missing field {field!r}")
        self.page_size = int(obj["page_size"])
        self.num_pages = int(obj["num_pages"])
        self.kv_page_indptr = [int(x) for x in obj["kv_page_indptr"]]
        self.kv_page_indices = [int(x) for x in obj["kv_page_indices"]]
        self.kv_last_page_len = [int(x) for x in obj["kv_last_page_len"]]
        check_page_table(self)

    @property
    def single(self):
        return False

    @property
    def decode(self):
        return is_decode(self)

    def kv_sizes(self):
        cache = (self.num_pages, self.page_size, self.hkv)
        return cache + (self.d_qk,), cache + (self.d_vo,)

    def index_arrays(self):
        arrays = {"qo_indptr": prefix_sums(self.qo_lens), "kv_page_indptr": self.kv_page_indptr,
                  "kv_page_indices": self.kv_page_indices,
                  "kv_last_page_len": self.kv_last_page_len}
        if self.append:
            arrays.update(zip(("batch_indices", "positions"), self.append_positions()))
        return arrays

    def append_positions(self):
        """(batch_indices, positions) of an append's new tokens, FlashInfer's COO form of the
        ragged new rows: new token t of request r is its position kv_len - qo_len + t."""
        batch, positions = [], []
        for r, (n, kl) in enumerate(zip(self.qo_lens, self.kv_lens)):
            batch += [r] * n
            positions += range(kl - n, kl)
        return batch, positions

    def request_kv(self, k_cache, v_cache, r):
        """Request r's keys and values gathered from the caches: token j is at page
        kv_page_indices[kv_page_indptr[r] + j // page_size], slot j % page_size."""
        import torch  # noqa: PLC0415 (only the GPU run and the self-test come here)
        ids = self.kv_page_indices[self.kv_page_indptr[r]:self.kv_page_indptr[r + 1]]
        kl = self.kv_lens[r]
        return gather_pages(torch, k_cache, ids, kl), gather_pages(torch, v_cache, ids, kl)

    def probe(self):
        """A tiny paged shape of the same FlashInfer configuration and kind (decode or not)."""
        ps = self.page_size
        pages = JIT_PROBE_PAGED["kv_pages"]
        kv_lens = [(n - 1) * ps + 1 for n in pages]
        qo_lens = [1] * len(pages) if self.decode else \
            [min(q, k) for q, k in zip(JIT_PROBE_PAGED["qo_lens"], kv_lens)]
        obj = {"name": self.name + "#jit-probe", "qo_lens": qo_lens, "kv_lens": kv_lens,
               "num_qo_heads": self.hq, "num_kv_heads": self.hkv,
               "head_dim_qk": self.d_qk, "head_dim_vo": self.d_vo, "causal": self.causal,
               "dtype": self.dtype, "soft_cap": self.soft_cap, "qk_accum": self.qk_accum,
               "flops": 0, "bytes": 0, "page_size": ps, "kv_dtype": self.kv_dtype,
               "append": self.append,
               "num_pages": sum(pages),
               "kv_page_indptr": prefix_sums(pages),
               "kv_page_indices": list(reversed(range(sum(pages)))),
               "kv_last_page_len": [1] * len(pages)}
        return PagedShape(obj)


def load_shapes(path, suite, name_filter):
    with open(path) as f:
        raw = json.load(f)
    if isinstance(raw, dict):  # tolerate {"prefill": [...]} as well as a bare list
        raw = raw.get(suite, [])
    if not isinstance(raw, list):
        raise ValueError(f"{path}: expected a JSON list of resolved shapes")
    cls = PagedShape if suite == SUITE_PAGED else Shape
    shapes = [cls(obj) for obj in raw]
    if name_filter:
        shapes = [s for s in shapes if name_filter in s.name]
    return shapes
