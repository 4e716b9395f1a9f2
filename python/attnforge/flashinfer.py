"""FlashInfer's attention API on attnforge.

The same names, argument names, defaults, layouts and return conventions as FlashInfer 0.5:
``single_prefill_with_kv_cache``, the ``BatchPrefillWithRaggedKVCacheWrapper``,
``BatchPrefillWithPagedKVCacheWrapper`` and ``BatchDecodeWithPagedKVCacheWrapper`` wrappers
(``plan`` then ``run``), ``merge_state``, ``merge_state_in_place``, ``merge_states`` and
``append_paged_kv_cache``. Arrays are numpy arrays or torch tensors; results come back in the
caller's library, on the caller's device. LSEs are base 2, as FlashInfer's.

Host arrays run on attnforge's CPU backend; CUDA tensors on its CUDA backend, launched on torch's
current stream, reading the inputs where they are (no copy). An argument attnforge does not
implement raises ``NotImplementedError`` naming it; bad input raises ``ValueError`` or
``TypeError`` with the Rust error's message before anything runs.
"""

import functools

from . import _arrays as A
from . import _fp8
from . import _native
from ._graph import PagedGraph, RaggedGraph
from ._common import _finish, _LseShift, _outputs, _slopes
from ._merge import merge_state, merge_state_in_place, merge_states
from ._options import check_common, check_run, dtype_code, refuse, refuse_set, spec
from ._page import (
    _check_kv_layout,
    _kv_indptr,
    append_paged_kv_cache,
    get_batch_indices_positions,
    get_seq_lens,
)
from ._single import (
    _SINGLE_PLANS,
    _SINGLE_PLANS_MAX,
    single_decode_with_kv_cache,
    single_prefill_with_kv_cache,
    single_prefill_with_kv_cache_return_lse,
)

__all__ = [
    "single_prefill_with_kv_cache",
    "single_prefill_with_kv_cache_return_lse",
    "single_decode_with_kv_cache",
    "BatchPrefillWithRaggedKVCacheWrapper",
    "BatchPrefillWithPagedKVCacheWrapper",
    "BatchDecodeWithPagedKVCacheWrapper",
    "CUDAGraphBatchDecodeWithPagedKVCacheWrapper",
    "fast_decode_plan",
    "merge_state",
    "merge_state_in_place",
    "merge_states",
    "append_paged_kv_cache",
    "get_batch_indices_positions",
    "get_seq_lens",
]


def _refuse_in_graphs(pos_encoding_mode, masks):
    """What ``use_cuda_graph=True`` refuses at ``plan``: ALiBi and custom masks (``masks``: the
    custom mask arguments given, by name)."""
    if pos_encoding_mode == "ALIBI":
        refuse(
            "pos_encoding_mode",
            pos_encoding_mode,
            "ALiBi's LSE shift is computed per plan, which a captured graph does not follow",
        )
    for name, value in masks.items():
        if value is not None:
            refuse(name, "<mask>", "custom masks are not supported with use_cuda_graph=True")


# Plans with attention sinks kept per wrapper (one per distinct sink values, most recent last).
_SINK_PLANS_MAX = 4


class _Wrapper:
    """What the three wrappers share: the workspace's device, the layout, the CUDA-graph mode
    (``_graph``: the caller's buffers and the graph-stable plan over them, see ``_graph``)."""

    def __init__(self, float_workspace_buffer, kv_layout, backend, jit_args, graph=None):
        _check_kv_layout(kv_layout)
        check_common(backend=backend)
        self._lse_shift = None
        refuse_set(jit_args=(jit_args, "attnforge has no FlashInfer JIT variants"))
        self._kv_fp8 = None
        self._kv_layout = kv_layout
        self._device = A.device_of(float_workspace_buffer)
        self._plan = None
        self._graph = graph

    @property
    def is_cuda_graph_enabled(self):
        return self._graph is not None

    def _graph_plan(self, args, rows_per_request, pos_encoding_mode, custom=None):
        """``use_cuda_graph``: the plan of ``args`` (``_native.PagedPlan``'s first seven) over
        the caller's buffers, after FlashInfer's checks and the refusals of what a captured
        launch cannot follow (``custom``: the custom mask arguments given)."""
        _refuse_in_graphs(pos_encoding_mode, custom or {})
        qo, indptr, indices, last = args[:4]
        g = self._graph
        g.check(len(last), len(indices), qo[-1])
        try:
            native = g.plan(args, self._device, self._kv_fp8, rows_per_request)
        except Exception:
            # The wrapper keeps the plan it had, and the dtypes that plan was made for.
            if self._plan is not None:
                self._dtype, self._kv_fp8 = self._graph_dtypes
            raise
        self._graph_dtypes = (self._dtype, self._kv_fp8)
        if not getattr(self, "_fast_plan", False):
            g.write(qo, indptr, indices, last)
        return native

    def reset_workspace_buffer(self, float_workspace_buffer, int_workspace_buffer=None):
        """Accepted for compatibility: attnforge's plans own their buffers."""
        self._device = A.device_of(float_workspace_buffer)

    def _planned(self):
        if self._plan is None:
            raise RuntimeError("run() before plan(): call plan() first")
        return self._plan

    def _keep_paged(self, native, qo, indptr, indices, last, page_size, options):
        """Keeps what a plan with sinks (``run(sinks=)``) is made from."""
        self._paged_args = (qo, indptr, indices, last, page_size, options)
        self._sink_plans = {}
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
            qo, indptr, indices, last, page_size, options = self._paged_args
            options = dict(options, sinks=list(values))
            plan = _native.PagedPlan(
                qo,
                indptr,
                indices,
                last,
                page_size,
                self._kv_layout,
                options,
                self._device,
                self._kv_fp8,
            )
            if len(self._sink_plans) >= _SINK_PLANS_MAX:
                self._sink_plans.pop(next(iter(self._sink_plans)))
            self._sink_plans[values] = plan
        return plan

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


class BatchPrefillWithRaggedKVCacheWrapper(_Wrapper):
    """Batch prefill over ragged K/V (``k [kv_indptr[-1], Hkv, Dqk]`` for NHD)."""

    def __init__(
        self,
        float_workspace_buffer,
        kv_layout="NHD",
        use_cuda_graph=False,
        qo_indptr_buf=None,
        kv_indptr_buf=None,
        custom_mask_buf=None,
        mask_indptr_buf=None,
        backend="auto",
        jit_args=None,
        jit_kwargs=None,
    ):
        graph = RaggedGraph(qo_indptr_buf, kv_indptr_buf) if use_cuda_graph else None
        super().__init__(float_workspace_buffer, kv_layout, backend, jit_args, graph)
        refuse_set(jit_kwargs=(jit_kwargs, "attnforge has no FlashInfer JIT variants"))

    def plan(
        self,
        qo_indptr,
        kv_indptr,
        num_qo_heads,
        num_kv_heads,
        head_dim_qk,
        head_dim_vo=None,
        custom_mask=None,
        packed_custom_mask=None,
        causal=False,
        pos_encoding_mode="NONE",
        use_fp16_qk_reduction=False,
        window_left=-1,
        logits_soft_cap=None,
        sm_scale=None,
        rope_scale=None,
        rope_theta=None,
        q_data_type="float16",
        kv_data_type=None,
        non_blocking=True,
        prefix_len_ptr=None,
        token_pos_in_items_ptr=None,
        token_pos_in_items_len=0,
        max_item_len_ptr=None,
        fixed_split_size=None,
        disable_split_kv=False,
    ):
        """Plans the batch: validates it, and on a GPU compiles the kernel and uploads the
        index arrays, so that ``run`` only launches."""
        check_common(pos_encoding_mode, rope_scale, rope_theta, alibi=True)
        _refuse_plan_extras(
            prefix_len_ptr,
            token_pos_in_items_ptr,
            token_pos_in_items_len,
            max_item_len_ptr,
            fixed_split_size,
            disable_split_kv,
        )
        self._plan_dtype(q_data_type, kv_data_type)
        head_dim_vo = head_dim_qk if head_dim_vo is None else head_dim_vo
        qo = A.int_list(qo_indptr, "qo_indptr")
        kv = A.int_list(kv_indptr, "kv_indptr")
        slopes = _slopes(pos_encoding_mode, num_qo_heads)
        options = spec(
            num_qo_heads,
            num_kv_heads,
            head_dim_qk,
            head_dim_vo,
            self._dtype,
            qo,
            kv,
            causal,
            window_left,
            logits_soft_cap,
            sm_scale,
            use_fp16_qk_reduction,
            custom_mask,
            packed_custom_mask,
            slopes,
        )
        if self._graph is not None:
            masks = {"custom_mask": custom_mask, "packed_custom_mask": packed_custom_mask}
            _refuse_in_graphs(pos_encoding_mode, masks)
            native = self._graph.plan(qo, kv, options, self._device)
        else:
            native = _native.RaggedPlan(qo, kv, options, self._device)
        self._plan = (native, qo[-1], int(num_qo_heads), int(head_dim_vo), int(window_left))
        self._lse_shift = _LseShift.of_batch(slopes, qo, kv)

    def run(self, q, k, v, *args, out=None, lse=None, return_lse=False, enable_pdl=None):
        """``o [qo_indptr[-1], Hq, Dvo]``, or ``(o, lse)`` (base 2) when ``return_lse``."""
        if args or enable_pdl:
            check_run(args, enable_pdl=enable_pdl)
        native, total_qo, num_qo_heads, head_dim_vo, _ = self._planned()
        if self._kv_layout == "HND":
            k, v = A.swap01(k), A.swap01(v)
        out, lse = _outputs(q, total_qo, num_qo_heads, head_dim_vo, out, lse, return_lse)
        native.run(q, k, v, out, lse, A.current_stream(self._device))
        return _finish(out, lse, return_lse, self._lse_shift)

    run_return_lse = functools.partialmethod(run, return_lse=True)


def _refuse_plan_extras(
    prefix_len_ptr=None,
    token_pos_in_items_ptr=None,
    token_pos_in_items_len=0,
    max_item_len_ptr=None,
    fixed_split_size=None,
    disable_split_kv=False,
):
    reason = "multi-item scoring is not supported"
    refuse_set(
        prefix_len_ptr=(prefix_len_ptr, reason),
        token_pos_in_items_ptr=(token_pos_in_items_ptr, reason),
        max_item_len_ptr=(max_item_len_ptr, reason),
        fixed_split_size=(fixed_split_size, "attnforge's planner chooses the KV split"),
    )
    if token_pos_in_items_len:
        refuse("token_pos_in_items_len", token_pos_in_items_len, reason)
    if disable_split_kv:
        refuse("disable_split_kv", disable_split_kv, "attnforge's planner chooses the KV split")


class BatchPrefillWithPagedKVCacheWrapper(_Wrapper):
    """Batch prefill over a paged KV cache."""

    def __init__(
        self,
        float_workspace_buffer,
        kv_layout="NHD",
        use_cuda_graph=False,
        qo_indptr_buf=None,
        paged_kv_indptr_buf=None,
        paged_kv_indices_buf=None,
        paged_kv_last_page_len_buf=None,
        custom_mask_buf=None,
        mask_indptr_buf=None,
        backend="auto",
        jit_args=None,
        jit_kwargs=None,
    ):
        graph = None
        if use_cuda_graph:
            graph = PagedGraph(
                paged_kv_indptr_buf,
                paged_kv_indices_buf,
                paged_kv_last_page_len_buf,
                qo_indptr_buf,
                mode="CUDA graph",
            )
        super().__init__(float_workspace_buffer, kv_layout, backend, jit_args, graph)
        refuse_set(jit_kwargs=(jit_kwargs, "attnforge has no FlashInfer JIT variants"))

    def plan(
        self,
        qo_indptr,
        paged_kv_indptr,
        paged_kv_indices,
        paged_kv_last_page_len,
        num_qo_heads,
        num_kv_heads,
        head_dim_qk,
        page_size,
        head_dim_vo=None,
        custom_mask=None,
        packed_custom_mask=None,
        causal=False,
        pos_encoding_mode="NONE",
        use_fp16_qk_reduction=False,
        sm_scale=None,
        window_left=-1,
        logits_soft_cap=None,
        rope_scale=None,
        rope_theta=None,
        q_data_type="float16",
        kv_data_type=None,
        non_blocking=True,
        prefix_len_ptr=None,
        token_pos_in_items_ptr=None,
        token_pos_in_items_len=0,
        max_item_len_ptr=None,
        seq_lens=None,
        seq_lens_q=None,
        block_tables=None,
        max_token_per_sequence=None,
        max_sequence_kv=None,
        fixed_split_size=None,
        disable_split_kv=False,
    ):
        """Plans the batch over the page table."""
        check_common(pos_encoding_mode, rope_scale, rope_theta, alibi=True)
        _refuse_plan_extras(
            prefix_len_ptr,
            token_pos_in_items_ptr,
            token_pos_in_items_len,
            max_item_len_ptr,
            fixed_split_size,
            disable_split_kv,
        )
        reason = "these arguments feed FlashInfer's trtllm-gen and cuDNN backends"
        refuse_set(
            seq_lens=(seq_lens, reason),
            seq_lens_q=(seq_lens_q, reason),
            block_tables=(block_tables, reason),
            max_token_per_sequence=(max_token_per_sequence, reason),
            max_sequence_kv=(max_sequence_kv, reason),
        )
        self._plan_dtype(q_data_type, kv_data_type, fp8_cache=True)
        head_dim_vo = head_dim_qk if head_dim_vo is None else head_dim_vo
        qo = A.int_list(qo_indptr, "qo_indptr")
        indptr = A.int_list(paged_kv_indptr, "paged_kv_indptr")
        indices = A.int_list(paged_kv_indices, "paged_kv_indices")
        last = A.int_list(paged_kv_last_page_len, "paged_kv_last_page_len")
        kv = _kv_indptr(indptr, last, int(page_size))
        slopes = _slopes(pos_encoding_mode, num_qo_heads)
        options = spec(
            num_qo_heads,
            num_kv_heads,
            head_dim_qk,
            head_dim_vo,
            self._dtype,
            qo,
            kv,
            causal,
            window_left,
            logits_soft_cap,
            sm_scale,
            use_fp16_qk_reduction,
            custom_mask,
            packed_custom_mask,
            slopes,
        )
        args = (qo, indptr, indices, last, int(page_size), self._kv_layout, options)
        if self._graph is not None:
            masks = {"custom_mask": custom_mask, "packed_custom_mask": packed_custom_mask}
            made = self._graph_plan(args, None, pos_encoding_mode, masks)
        else:
            made = _native.PagedPlan(*args, self._device, self._kv_fp8)
        native = self._keep_paged(
            made,
            qo,
            indptr,
            indices,
            last,
            int(page_size),
            options,
        )
        self._plan = (native, qo[-1], int(num_qo_heads), int(head_dim_vo), int(window_left))
        self._lse_shift = _LseShift.of_batch(slopes, qo, kv)

    def run(
        self,
        q,
        paged_kv_cache,
        *args,
        q_scale=None,
        k_scale=None,
        v_scale=None,
        out=None,
        lse=None,
        return_lse=False,
        enable_pdl=None,
        window_left=None,
        sinks=None,
    ):
        """``o [qo_indptr[-1], Hq, Dvo]``, or ``(o, lse)`` (base 2) when ``return_lse``. ``sinks``
        (float32 ``[Hq]``, one logit per query head) join each row's softmax denominator;
        they are read on the host, so such a call does not belong in a graph capture.
        ``k_scale`` / ``v_scale`` dequantise a cache planned with an fp8 ``kv_data_type``
        (see ``_fp8``)."""
        if args or enable_pdl or q_scale is not None:
            check_run(args, q_scale, enable_pdl)
        return self._run_paged(
            q, paged_kv_cache, out, lse, return_lse, window_left, sinks, k_scale, v_scale
        )

    run_return_lse = functools.partialmethod(run, return_lse=True)


class BatchDecodeWithPagedKVCacheWrapper(_Wrapper):
    """Batch decode (one query per request) over a paged KV cache."""

    def __init__(
        self,
        float_workspace_buffer,
        kv_layout="NHD",
        use_cuda_graph=False,
        use_tensor_cores=False,
        paged_kv_indptr_buffer=None,
        paged_kv_indices_buffer=None,
        paged_kv_last_page_len_buffer=None,
        backend="auto",
        jit_args=None,
    ):
        graph = None
        if use_cuda_graph:
            graph = PagedGraph(
                paged_kv_indptr_buffer, paged_kv_indices_buffer, paged_kv_last_page_len_buffer
            )
        super().__init__(float_workspace_buffer, kv_layout, backend, jit_args, graph)
        self._use_tensor_cores = use_tensor_cores

    @property
    def use_tensor_cores(self):
        return self._use_tensor_cores

    def plan(
        self,
        indptr,
        indices,
        last_page_len,
        num_qo_heads,
        num_kv_heads,
        head_dim,
        page_size,
        pos_encoding_mode="NONE",
        window_left=-1,
        logits_soft_cap=None,
        q_data_type="float16",
        kv_data_type=None,
        data_type=None,
        sm_scale=None,
        rope_scale=None,
        rope_theta=None,
        non_blocking=True,
        block_tables=None,
        seq_lens=None,
        fixed_split_size=None,
        disable_split_kv=False,
    ):
        """Plans one query per request over the page table."""
        check_common(pos_encoding_mode, rope_scale, rope_theta, alibi=True)
        _refuse_plan_extras(fixed_split_size=fixed_split_size, disable_split_kv=disable_split_kv)
        reason = "these arguments feed FlashInfer's trtllm-gen backend"
        refuse_set(block_tables=(block_tables, reason), seq_lens=(seq_lens, reason))
        if data_type is not None:
            # FlashInfer's deprecated data_type fills in only the types not given.
            q_data_type = data_type if q_data_type is None else q_data_type
            kv_data_type = data_type if kv_data_type is None else kv_data_type
        self._plan_dtype(q_data_type, kv_data_type, fp8_cache=True)
        page_indptr = A.int_list(indptr, "indptr")
        batch = len(page_indptr) - 1
        qo = list(range(batch + 1))
        kv = _kv_indptr(page_indptr, A.int_list(last_page_len, "last_page_len"), int(page_size))
        slopes = _slopes(pos_encoding_mode, num_qo_heads)
        # One query at the last position sees every key: causal only matters for the window.
        options = spec(
            num_qo_heads,
            num_kv_heads,
            head_dim,
            head_dim,
            self._dtype,
            qo,
            kv,
            causal=int(window_left) >= 0,
            window_left=window_left,
            logits_soft_cap=logits_soft_cap,
            sm_scale=sm_scale,
            alibi_slopes=slopes,
        )
        table = (A.int_list(indices, "indices"), A.int_list(last_page_len, "last_page_len"))
        args = (qo, page_indptr, *table, int(page_size), self._kv_layout, options)
        if self._graph is not None:
            made = self._graph_plan(args, 1, pos_encoding_mode)
        else:
            made = _native.PagedPlan(*args, self._device, self._kv_fp8)
        native = self._keep_paged(
            made,
            qo,
            page_indptr,
            *table,
            int(page_size),
            options,
        )
        self._plan = (native, batch, int(num_qo_heads), int(head_dim), int(window_left))
        self._lse_shift = _LseShift.of_batch(slopes, qo, kv)

    def run(
        self,
        q,
        paged_kv_cache,
        *args,
        q_scale=None,
        k_scale=None,
        v_scale=None,
        out=None,
        lse=None,
        return_lse=False,
        enable_pdl=None,
        window_left=None,
        sinks=None,
        q_len_per_req=1,
    ):
        """``o [batch, Hq, D]``, or ``(o, lse)`` (base 2) when ``return_lse``. ``sinks``
        (float32 ``[Hq]``, one logit per query head) join each row's softmax denominator;
        they are read on the host, so such a call does not belong in a graph capture.
        ``k_scale`` / ``v_scale`` dequantise a cache planned with an fp8 ``kv_data_type``
        (see ``_fp8``)."""
        if args or enable_pdl or q_scale is not None:
            check_run(args, q_scale, enable_pdl)
        if q_len_per_req not in (None, 1):
            refuse("q_len_per_req", q_len_per_req, "decode takes one query per request")
        return self._run_paged(
            q, paged_kv_cache, out, lse, return_lse, window_left, sinks, k_scale, v_scale
        )

    run_return_lse = functools.partialmethod(run, return_lse=True)


class CUDAGraphBatchDecodeWithPagedKVCacheWrapper(BatchDecodeWithPagedKVCacheWrapper):
    """The decode wrapper with ``use_cuda_graph=True`` over the caller's ``indptr_buffer``
    (``[batch + 1]``), ``indices_buffer`` (the most page ids a plan may hold) and
    ``last_page_len_buffer`` (``[batch]``): every ``plan`` keeps that batch size, writes its
    table into those buffers and re-plans in place, so that a graph captured around ``run``
    replays the newest plan."""

    def __init__(
        self,
        workspace_buffer,
        indptr_buffer,
        indices_buffer,
        last_page_len_buffer,
        kv_layout="NHD",
        use_tensor_cores=False,
    ):
        super().__init__(
            workspace_buffer,
            kv_layout,
            use_cuda_graph=True,
            use_tensor_cores=use_tensor_cores,
            paged_kv_indptr_buffer=indptr_buffer,
            paged_kv_indices_buffer=indices_buffer,
            paged_kv_last_page_len_buffer=last_page_len_buffer,
        )


def fast_decode_plan(
    self,
    indptr,
    indices,
    last_page_len,
    num_qo_heads,
    num_kv_heads,
    head_dim,
    page_size,
    pos_encoding_mode="NONE",
    window_left=-1,
    logits_soft_cap=None,
    q_data_type=None,
    kv_data_type=None,
    data_type=None,
    sm_scale=None,
    rope_scale=None,
    rope_theta=None,
    non_blocking=True,
    fixed_split_size=None,
    disable_split_kv=False,
    global_override_indptr_cpu=None,
):
    """FlashInfer's ``plan`` of a decode wrapper for callers that write the index buffers
    themselves: the same plan (and the same checks in CUDA-graph mode), without copying the
    indices into the wrapper's buffers; ``global_override_indptr_cpu``, when given, is the host
    copy of ``indptr`` read instead of it."""
    if not isinstance(self, BatchDecodeWithPagedKVCacheWrapper):
        name = type(self).__name__
        raise TypeError(f"fast_decode_plan plans a BatchDecodeWithPagedKVCacheWrapper, not {name}")
    if global_override_indptr_cpu is not None:
        indptr = global_override_indptr_cpu
    if q_data_type is None and data_type is None:
        q_data_type = "float16"
    self._fast_plan = True
    try:
        BatchDecodeWithPagedKVCacheWrapper.plan(
            self,
            indptr,
            indices,
            last_page_len,
            num_qo_heads,
            num_kv_heads,
            head_dim,
            page_size,
            pos_encoding_mode=pos_encoding_mode,
            window_left=window_left,
            logits_soft_cap=logits_soft_cap,
            q_data_type=q_data_type,
            kv_data_type=kv_data_type,
            data_type=data_type,
            sm_scale=sm_scale,
            rope_scale=rope_scale,
            rope_theta=rope_theta,
            non_blocking=non_blocking,
            fixed_split_size=fixed_split_size,
            disable_split_kv=disable_split_kv,
        )
    finally:
        self._fast_plan = False
