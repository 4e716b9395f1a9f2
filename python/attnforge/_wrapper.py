"""What FlashInfer's batch wrappers share, as the base classes of ``attnforge.flashinfer``'s
wrappers: ``_Wrapper`` (the workspace's device, the layout, the CUDA-graph mode, the checks every
``plan`` makes first, the planned dtypes and the plan ``run`` reads) and ``_PagedWrapper`` (the
paged wrappers' plan over a page table, its variants with attention sinks, and ``run``)."""

import operator

from . import _arrays as A
from . import _fp8
from . import _native
from ._common import _finish, _LseShift, _outputs
from ._options import check_common, dtype_code, refuse, refuse_set
from ._page import _check_kv_layout

_NO_JIT = "attnforge has no FlashInfer JIT variants"

# Plans with attention sinks kept per wrapper (one per distinct sink values, most recent last).
_SINK_PLANS_MAX = 4


def _refuse_in_graphs(pos_encoding_mode, masks=(None, None)):
    """What ``use_cuda_graph=True`` refuses at ``plan``: ALiBi and custom masks (``masks``: the
    plan's ``custom_mask`` and ``packed_custom_mask``)."""
    if pos_encoding_mode == "ALIBI":
        refuse(
            "pos_encoding_mode",
            pos_encoding_mode,
            "ALiBi's LSE shift is computed per plan, which a captured graph does not follow",
        )
    for name, value in zip(("custom_mask", "packed_custom_mask"), masks):
        if value is not None:
            refuse(name, "<mask>", "custom masks are not supported with use_cuda_graph=True")


def _refuse_plan_extras(call):
    """Refuses multi-item scoring, and a chosen KV split where the plan has no pages (``call``:
    the plan's arguments by name; those a wrapper's plan does not take are FlashInfer's
    defaults)."""
    reason = "multi-item scoring is not supported"
    refuse_set(
        prefix_len_ptr=(call.get("prefix_len_ptr"), reason),
        token_pos_in_items_ptr=(call.get("token_pos_in_items_ptr"), reason),
        max_item_len_ptr=(call.get("max_item_len_ptr"), reason),
    )
    if call.get("token_pos_in_items_len"):
        refuse("token_pos_in_items_len", call["token_pos_in_items_len"], reason)
    if "page_size" not in call:
        split = "a chosen KV split is supported by the paged wrappers; here the planner chooses"
        refuse_set(fixed_split_size=(call["fixed_split_size"], split))
        if call["disable_split_kv"]:
            refuse("disable_split_kv", call["disable_split_kv"], split)


# Keys of attnforge's KV tiles, every kernel that splits a KV range: a chunk is a multiple of it.
_SPLIT_KEYS_MULTIPLE = 64


def _split_choice(call):
    """The KV split a paged plan asks for, as ``_native.PagedPlan``'s keyword arguments:
    ``disable_split_kv=True`` never splits; ``fixed_split_size`` (FlashInfer's unit: pages)
    cuts each request's keys into chunks of that many pages, rounded up to a multiple of
    attnforge's 64-key tile; neither leaves the choice to the planner."""
    pages, disable = call["fixed_split_size"], call["disable_split_kv"]
    if pages is None:
        return {"unsplit": True} if disable else {}
    if disable:
        raise ValueError("fixed_split_size and disable_split_kv=True: give one or neither")
    try:
        count = None if isinstance(pages, bool) else operator.index(pages)
    except TypeError:
        count = None
    if count is None or count <= 0:
        raise ValueError(f"invalid fixed_split_size: is {pages!r}; expected a positive int (pages)")
    keys = count * int(call["page_size"])
    return {"chunk_keys": -(-keys // _SPLIT_KEYS_MULTIPLE) * _SPLIT_KEYS_MULTIPLE}


class _Wrapper:
    """What the three wrappers share: the workspace's device, the layout, the CUDA-graph mode
    (``_graph``: the caller's buffers and the graph-stable plan over them, see ``_graph``), and
    the plan: ``(native plan, rows, num_qo_heads, head_dim_vo, window_left)``."""

    def __init__(
        self, float_workspace_buffer, kv_layout, backend, jit_args, graph=None, jit_kwargs=None
    ):
        _check_kv_layout(kv_layout)
        check_common(backend=backend)
        self._lse_shift = None
        refuse_set(jit_args=(jit_args, _NO_JIT))
        self._kv_fp8 = None
        self._kv_layout = kv_layout
        self._device = A.device_of(float_workspace_buffer)
        self._plan = None
        self._graph = graph
        refuse_set(jit_kwargs=(jit_kwargs, _NO_JIT))

    @property
    def is_cuda_graph_enabled(self):
        return self._graph is not None

    def reset_workspace_buffer(self, float_workspace_buffer, int_workspace_buffer=None):
        """Accepted for compatibility: attnforge's plans own their buffers."""
        self._device = A.device_of(float_workspace_buffer)

    def _planned(self):
        if self._plan is None:
            raise RuntimeError("run() before plan(): call plan() first")
        return self._plan

    def _check_plan(self, call, fp8_cache=False, others=(), reason=None):
        """What every ``plan`` checks first, in this order: the arguments every entry point
        takes, those of multi-item scoring and the KV split, those feeding FlashInfer's other
        backends (``others``: their names, refused for ``reason``), then the dtypes (see
        ``_plan_dtype``). ``call`` maps the plan's argument names to their values (its
        ``locals()``)."""
        check_common(call["pos_encoding_mode"], call["rope_scale"], call["rope_theta"], alibi=True)
        _refuse_plan_extras(call)
        refuse_set(**{name: (call[name], reason) for name in others})
        self._plan_dtype(call["q_data_type"], call["kv_data_type"], fp8_cache)
        self._split = _split_choice(call) if "page_size" in call else {}

    def _plan_dtype(self, q_data_type, kv_data_type, fp8_cache=False):
        """The planned dtypes: q's, and the cache's fp8 format (``fp8_cache``: whether this
        wrapper takes one) or none."""
        if _fp8.format_of(q_data_type) is not None:
            refuse("q_data_type", q_data_type, "fp8 queries are not supported (fp8 KV caches are)")
        q = dtype_code(q_data_type, "q_data_type")
        if q is None:
            raise ValueError("invalid q_data_type: is None; expected float16 or bfloat16")
        self._kv_fp8 = _fp8.format_of(kv_data_type)
        if self._kv_fp8 is not None:
            if not fp8_cache:
                refuse("kv_data_type", kv_data_type, "fp8 K/V are read from paged caches only")
            if q == "f32":
                refuse("kv_data_type", kv_data_type, "an fp8 cache goes with f16 or bf16 queries")
        else:
            kv = dtype_code(kv_data_type, "kv_data_type")
            if kv is not None and kv != q:
                refuse("kv_data_type", kv_data_type, "q and a float KV cache share one dtype")
        self._dtype = q

    def _set_plan(self, native, qo, kv, slopes, num_qo_heads, head_dim_vo, window_left):
        """Keeps the plan ``native`` of a batch (``qo``, ``kv``: its indptr lists; ``slopes``:
        its ALiBi slopes or ``None``) for ``run``."""
        self._plan = (native, qo[-1], int(num_qo_heads), int(head_dim_vo), int(window_left))
        self._lse_shift = _LseShift.of_batch(slopes, qo, kv)


class _PagedWrapper(_Wrapper):
    """What the paged wrappers share: the plan over a page table (``_paged_args``: what it is
    made from), the plans of that batch with attention sinks, and ``run``."""

    def _plan_paged(self, args, rows_per_request, pos_encoding_mode, masks=(None, None)):
        """The plan of ``args`` (``_native.PagedPlan``'s first seven), over the caller's buffers
        with ``use_cuda_graph`` (see ``_graph_plan``), kept with what its plans with sinks are
        made from. Page ids past ``indptr[-1]`` are not read (FlashInfer's kernels read only the
        entries the indptr points to, so callers may pass a longer buffer)."""
        qo, indptr, indices = args[:3]
        if indptr and len(indices) > indptr[-1] >= 0:
            args = (qo, indptr, indices[: indptr[-1]]) + tuple(args[3:])
        if self._graph is not None:
            native = self._graph_plan(args, rows_per_request, pos_encoding_mode, masks)
        else:
            native = _native.PagedPlan(*args, self._device, self._kv_fp8, **self._split)
        self._paged_args = args
        self._sink_plans = {}
        return native

    def _graph_plan(self, args, rows_per_request, pos_encoding_mode, masks):
        """``use_cuda_graph``: the plan of ``args`` (``_native.PagedPlan``'s first seven) over
        the caller's buffers, after FlashInfer's checks and the refusals of what a captured
        launch cannot follow (``masks``: as in ``_refuse_in_graphs``)."""
        _refuse_in_graphs(pos_encoding_mode, masks)
        qo, indptr, indices, last = args[:4]
        g = self._graph
        g.check(len(last), len(indices), qo[-1])
        try:
            native = g.plan(args, self._device, self._kv_fp8, rows_per_request, self._split)
        except Exception:
            # The wrapper keeps the plan it had, and the dtypes that plan was made for.
            if self._plan is not None:
                self._dtype, self._kv_fp8 = self._graph_dtypes
            raise
        self._graph_dtypes = (self._dtype, self._kv_fp8)
        if not getattr(self, "_fast_plan", False):
            g.write(qo, indptr, indices, last)
        return native

    def _sink_plan(self, sinks):
        """The plan of the planned batch with attention sinks ``sinks`` (one logit per query
        head): read on the host (a device-to-host copy on a GPU), planned on first use of those
        values, the last few kept."""
        if self._graph is not None:
            reason = "sinks are read on the host, which use_cuda_graph=True rules out"
            refuse("sinks", "<array>", reason)
        values = tuple(A.float_list(sinks, "sinks"))
        plan = self._sink_plans.get(values)
        if plan is None:
            *table, options = self._paged_args
            options = dict(options, sinks=list(values))
            plan = _native.PagedPlan(*table, options, self._device, self._kv_fp8, **self._split)
            if len(self._sink_plans) >= _SINK_PLANS_MAX:
                self._sink_plans.pop(next(iter(self._sink_plans)))
            self._sink_plans[values] = plan
        return plan

    def _run_paged(
        self, q, paged_kv_cache, out, lse, return_lse, window_left, sinks, k_scale, v_scale
    ):
        plan, total_qo, num_qo_heads, head_dim_vo, planned_window = self._planned()
        if window_left is not None and window_left != planned_window:
            refuse("window_left", window_left, "the window is fixed by plan()")
        if self._kv_fp8 is None:
            _fp8.refuse_plain_scales(k_scale, v_scale)
        scales = (_fp8.scale_list(k_scale, "k_scale"), _fp8.scale_list(v_scale, "v_scale"))
        if sinks is not None:
            plan = self._sink_plan(sinks)
        out, lse = _outputs(q, total_qo, num_qo_heads, head_dim_vo, out, lse, return_lse)
        plan.run(q, paged_kv_cache, out, lse, A.current_stream(self._device), *scales)
        return _finish(out, lse, return_lse, self._lse_shift)
