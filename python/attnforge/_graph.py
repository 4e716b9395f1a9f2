"""``use_cuda_graph=True``: the wrappers over the caller's fixed-capacity index buffers.

A paged wrapper is built over the caller's buffers (``paged_kv_indptr_buffer``,
``..._indices_...``, ``..._last_page_len_...``, and for prefill ``qo_indptr_buf``), the ragged
one over ``qo_indptr_buf`` and ``kv_indptr_buf``: their lengths fix the batch size and the most
page ids a plan may hold. The first ``plan`` makes a graph-stable native plan for
that capacity (its own device arrays, a launch grid for the largest batch it allows); every later
``plan`` checks the new batch against the capacity as FlashInfer does, writes it into the
caller's buffers and re-plans the native plan in place on the current stream, so that a CUDA
graph captured once around ``run`` replays the newest plan. What a captured launch holds by value
(heads, head dims, dtypes, page size, layout, mask, scale, soft cap) stays that of the first plan:
a plan that changes it raises ``ValueError``.
"""

from . import _arrays as A
from . import _native


def _length(buf, name, mode):
    if buf is None or not hasattr(buf, "shape") or len(buf.shape) != 1:
        raise ValueError(f"use_cuda_graph=True ({mode}) needs {name} as a one-dimensional tensor")
    return int(buf.shape[0])


def _write(buf, values):
    """``buf[:len(values)] = values`` in the buffer's library (a host-to-device copy on torch's
    current stream for a CUDA tensor)."""
    if not values:
        return
    n = len(values)
    if A.is_torch(buf):
        import torch

        src = torch.tensor(values, dtype=buf.dtype)
        buf[:n].copy_(src, non_blocking=False)
    else:
        buf[:n] = values


def _check_batch(batch, fixed):
    if batch != fixed:
        raise ValueError(
            f"use_cuda_graph=True: the buffers fix the batch at {fixed} requests; this plan has "
            f"{batch}"
        )


def _check_rows(rows, max_rows):
    if rows is not None and max_rows is not None and rows > max_rows:
        raise ValueError(
            f"use_cuda_graph=True: this plan has {rows} query rows in qo_indptr; the first plan's "
            f"{max_rows} sized the launch, and a later plan may not exceed them"
        )


class RaggedGraph:
    """The caller's buffers of the ragged wrapper and the graph-stable plan made over them: a
    batch of the buffers' size, at most the first plan's query rows (keys unbounded: the caller
    passes K and V)."""

    def __init__(self, qo_indptr, kv_indptr):
        self.batch = _length(qo_indptr, "qo_indptr_buf", "cuda graph") - 1
        kv = _length(kv_indptr, "kv_indptr_buf", "cuda graph")
        if kv != self.batch + 1:
            raise ValueError(
                f"kv_indptr_buf has {kv} entries; qo_indptr_buf's {self.batch + 1} need as many"
            )
        self.buffers = (qo_indptr, kv_indptr)
        self.max_rows = None
        self.native = None

    def plan(self, qo, kv, options, device):
        """FlashInfer's checks, then the graph-stable native plan: made on the first call,
        re-planned in place after; the index arrays copied into the caller's buffers."""
        _check_rows(qo[-1], self.max_rows)
        _check_batch(len(qo) - 1, self.batch)
        if self.native is None:
            graph = (self.batch, qo[-1])
            self.native = _native.RaggedPlan(qo, kv, options, device, graph=graph)
            self.max_rows = qo[-1]
        else:
            self.native.replan(qo, kv, options, A.current_stream(device))
        for buf, values in zip(self.buffers, (qo, kv)):
            _write(buf, values)
        return self.native


class PagedGraph:
    """The caller's buffers of one paged wrapper and the graph-stable plan made over them."""

    def __init__(self, indptr, indices, last_page_len, qo_indptr=None, mode="cudagraph"):
        names = {
            "cudagraph": (
                "paged_kv_indptr_buffer",
                "paged_kv_indices_buffer",
                "paged_kv_last_page_len_buffer",
            ),
            "CUDA graph": (
                "paged_kv_indptr_buf",
                "paged_kv_indices_buf",
                "paged_kv_last_page_len_buf",
            ),
        }[mode]
        if qo_indptr is not None or mode == "CUDA graph":
            self.batch = _length(qo_indptr, "qo_indptr_buf", mode) - 1
            if _length(indptr, names[0], mode) != self.batch + 1:
                raise ValueError(f"{names[0]} needs batch size + 1 = {self.batch + 1} entries")
            if _length(last_page_len, names[2], mode) != self.batch:
                raise ValueError(f"{names[2]} needs batch size = {self.batch} entries")
        else:
            self.batch = _length(last_page_len, names[2], mode)
            if _length(indptr, names[0], mode) != self.batch + 1:
                raise ValueError(f"{names[0]} needs batch size + 1 = {self.batch + 1} entries")
        self.max_pages = _length(indices, names[1], mode)
        self.buffers = (qo_indptr, indptr, indices, last_page_len)
        self.max_rows = None
        self.native = None
        self.split = None  # the KV split of the first plan (PagedPlan's keyword arguments)

    def check(self, batch, num_pages, rows=None):
        """FlashInfer's checks of a plan in CUDA-graph mode: the batch size of the buffers, the
        page ids within the indices buffer, (prefill) the query rows within the first plan's."""
        _check_batch(batch, self.batch)
        if num_pages > self.max_pages:
            raise ValueError(
                f"use_cuda_graph=True: this plan holds {num_pages} page ids; the indices buffer "
                f"holds at most {self.max_pages}"
            )
        _check_rows(rows, self.max_rows)

    def write(self, qo, indptr, indices, last):
        """Copies the plan's index arrays into the caller's buffers."""
        for buf, values in zip(self.buffers, (qo, indptr, indices, last)):
            if buf is not None:
                _write(buf, values)

    def plan(self, args, device, kv_fp8, rows_per_request, split):
        """The graph-stable native plan of ``args`` (``_native.PagedPlan``'s first seven
        arguments): made on the first call for the capacity (queries per request at most
        ``rows_per_request``; None: as many as the first plan's rows) and the KV split
        ``split`` (``PagedPlan``'s keyword arguments), re-planned in place after (the split
        must stay the one the graph was planned with)."""
        qo = args[0]
        if self.native is None:
            rows = qo[-1]
            per_request = rows if rows_per_request is None else rows_per_request
            capacity = (self.batch, rows, per_request, self.max_pages)
            self.native = _native.PagedPlan(*args, device, kv_fp8, capacity, **split)
            self.max_rows = rows
            self.split = split
        else:
            if split != self.split:
                raise ValueError(
                    "fixed_split_size and disable_split_kv: with use_cuda_graph=True they stay "
                    f"as the first plan set them ({_split_text(self.split)}); "
                    f"this plan asks for {_split_text(split)}"
                )
            self.native.replan(*args, A.current_stream(device), kv_fp8)
        return self.native


def _split_text(split):
    """A plan's KV split (``PagedPlan``'s keyword arguments) in the caller's terms."""
    if split.get("unsplit"):
        return "disable_split_kv=True"
    if "chunk_keys" in split:
        return f"fixed_split_size: chunks of {split['chunk_keys']} keys"
    return "the planner's choice"
