"""FlashInfer's attention API on attnforge.

The same names, argument names, defaults, layouts and return conventions as FlashInfer 0.5:
``single_prefill_with_kv_cache``, the ``BatchPrefillWithRaggedKVCacheWrapper``,
``BatchPrefillWithPagedKVCacheWrapper`` and ``BatchDecodeWithPagedKVCacheWrapper`` wrappers
(``plan`` then ``run``), ``merge_state``, ``merge_state_in_place``, ``merge_states``,
``append_paged_kv_cache``, and ``MultiLevelCascadeAttentionWrapper`` (cascade attention over a
page table in levels) with the two shared-prefix wrappers it replaced. Arrays are numpy arrays or torch tensors; results come back in the
caller's library, on the caller's device. LSEs are base 2, as FlashInfer's.

Host arrays run on attnforge's CPU backend; CUDA tensors on its CUDA backend, launched on torch's
current stream, reading the inputs where they are (no copy). An argument attnforge does not
implement raises ``NotImplementedError`` naming it; bad input raises ``ValueError`` or
``TypeError`` with the Rust error's message before anything runs.
"""

import functools

from . import _arrays as A
from . import _native
from ._graph import PagedGraph, RaggedGraph
from ._common import _finish, _outputs, _prefill_spec, _slopes
from ._cascade import (
    BatchDecodeWithSharedPrefixPagedKVCacheWrapper,
    BatchPrefillWithSharedPrefixPagedKVCacheWrapper,
    MultiLevelCascadeAttentionWrapper,
)
from ._merge import merge_state, merge_state_in_place, merge_states
from ._options import check_run, refuse, spec
from ._page import (
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
from ._wrapper import _PagedWrapper, _refuse_in_graphs, _Wrapper

# The arguments of the paged prefill's plan that feed FlashInfer's trtllm-gen and cuDNN backends.
_TRTLLM_CUDNN_PREFILL = (
    "seq_lens",
    "seq_lens_q",
    "block_tables",
    "max_token_per_sequence",
    "max_sequence_kv",
)

__all__ = [
    "single_prefill_with_kv_cache",
    "single_prefill_with_kv_cache_return_lse",
    "single_decode_with_kv_cache",
    "BatchPrefillWithRaggedKVCacheWrapper",
    "BatchPrefillWithPagedKVCacheWrapper",
    "BatchDecodeWithPagedKVCacheWrapper",
    "CUDAGraphBatchDecodeWithPagedKVCacheWrapper",
    "MultiLevelCascadeAttentionWrapper",
    "BatchDecodeWithSharedPrefixPagedKVCacheWrapper",
    "BatchPrefillWithSharedPrefixPagedKVCacheWrapper",
    "fast_decode_plan",
    "merge_state",
    "merge_state_in_place",
    "merge_states",
    "append_paged_kv_cache",
    "get_batch_indices_positions",
    "get_seq_lens",
]


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
        super().__init__(float_workspace_buffer, kv_layout, backend, jit_args, graph, jit_kwargs)

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
        call = locals()
        self._check_plan(call)
        qo = A.int_list(qo_indptr, "qo_indptr")
        kv = A.int_list(kv_indptr, "kv_indptr")
        options, slopes = _prefill_spec(call, self._dtype, qo, kv)
        if self._graph is not None:
            _refuse_in_graphs(pos_encoding_mode, (custom_mask, packed_custom_mask))
            native = self._graph.plan(qo, kv, options, self._device)
        else:
            native = _native.RaggedPlan(qo, kv, options, self._device)
        self._set_plan(native, qo, kv, slopes, num_qo_heads, options["head_dim_vo"], window_left)

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


class BatchPrefillWithPagedKVCacheWrapper(_PagedWrapper):
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
        buffers = (paged_kv_indptr_buf, paged_kv_indices_buf, paged_kv_last_page_len_buf)
        graph = PagedGraph(*buffers, qo_indptr_buf, mode="CUDA graph") if use_cuda_graph else None
        super().__init__(float_workspace_buffer, kv_layout, backend, jit_args, graph, jit_kwargs)

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
        call = locals()
        reason = "these arguments feed FlashInfer's trtllm-gen and cuDNN backends"
        self._check_plan(call, fp8_cache=True, others=_TRTLLM_CUDNN_PREFILL, reason=reason)
        qo = A.int_list(qo_indptr, "qo_indptr")
        indptr = A.int_list(paged_kv_indptr, "paged_kv_indptr")
        indices = A.int_list(paged_kv_indices, "paged_kv_indices")
        last = A.int_list(paged_kv_last_page_len, "paged_kv_last_page_len")
        kv = _kv_indptr(indptr, last, int(page_size))
        options, slopes = _prefill_spec(call, self._dtype, qo, kv)
        args = (qo, indptr, indices, last, int(page_size), self._kv_layout, options)
        masks = (custom_mask, packed_custom_mask)
        native = self._plan_paged(args, None, pos_encoding_mode, masks)
        self._set_plan(native, qo, kv, slopes, num_qo_heads, options["head_dim_vo"], window_left)

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


class BatchDecodeWithPagedKVCacheWrapper(_PagedWrapper):
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
        buffers = (paged_kv_indptr_buffer, paged_kv_indices_buffer, paged_kv_last_page_len_buffer)
        graph = PagedGraph(*buffers) if use_cuda_graph else None
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
        if data_type is not None:
            # FlashInfer's deprecated data_type fills in only the types not given.
            q_data_type = data_type if q_data_type is None else q_data_type
            kv_data_type = data_type if kv_data_type is None else kv_data_type
        reason = "these arguments feed FlashInfer's trtllm-gen backend"
        others = ("block_tables", "seq_lens")
        self._check_plan(locals(), fp8_cache=True, others=others, reason=reason)
        page_indptr = A.int_list(indptr, "indptr")
        qo = list(range(len(page_indptr)))
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
        native = self._plan_paged(args, 1, pos_encoding_mode)
        self._set_plan(native, qo, kv, slopes, num_qo_heads, head_dim, window_left)

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
        (float32 ``[Hq]``), ``k_scale`` and ``v_scale`` as in the paged prefill's ``run``: the
        sinks join each row's softmax denominator, read on the host (so not in a graph capture);
        the scales dequantise a cache planned with an fp8 ``kv_data_type``."""
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
    # The decode plan's arguments, by the same names.
    plan_args = dict(locals())
    del plan_args["self"], plan_args["global_override_indptr_cpu"]
    if not isinstance(self, BatchDecodeWithPagedKVCacheWrapper):
        name = type(self).__name__
        raise TypeError(f"fast_decode_plan plans a BatchDecodeWithPagedKVCacheWrapper, not {name}")
    if global_override_indptr_cpu is not None:
        plan_args["indptr"] = global_override_indptr_cpu
    if q_data_type is None and data_type is None:
        plan_args["q_data_type"] = "float16"
    self._fast_plan = True
    try:
        BatchDecodeWithPagedKVCacheWrapper.plan(self, **plan_args)
    finally:
        self._fast_plan = False
