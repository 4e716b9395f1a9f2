"""Type hints of attnforge.flashinfer. ``Array`` is a numpy array or a torch tensor; results
come back in the caller's library. The wrappers' base classes are the runtime's (``_Wrapper``,
``_PagedWrapper``, from ``attnforge._wrapper``); each public function and method keeps its whole
parameter list, FlashInfer's, which is what type checkers read."""

from typing import Any, List, Literal, Optional, Sequence, SupportsIndex, Tuple, Union, overload

Array = Any
DTypeLike = Union[str, Any]
PagedKVCache = Union[Array, Tuple[Array, Array]]
# A scale of an fp8 KV cache: a number (FlashInfer's type), or an array of one entry or of one
# entry per KV head (attnforge's extension; read on the host).
Scale = Union[float, Array]
# What run() returns: o, or (o, lse) when return_lse.
Output = Union[Array, Tuple[Array, Array]]

@overload
def single_prefill_with_kv_cache(
    q: Array,
    k: Array,
    v: Array,
    scale_q: Optional[Array] = None,
    scale_k: Optional[Array] = None,
    scale_v: Optional[Array] = None,
    o_dtype: Optional[DTypeLike] = None,
    custom_mask: Optional[Array] = None,
    packed_custom_mask: Optional[Array] = None,
    causal: bool = False,
    kv_layout: str = "NHD",
    pos_encoding_mode: str = "NONE",
    use_fp16_qk_reduction: bool = False,
    sm_scale: Optional[float] = None,
    window_left: int = -1,
    logits_soft_cap: Optional[float] = None,
    rope_scale: Optional[float] = None,
    rope_theta: Optional[float] = None,
    backend: str = "auto",
    return_lse: Literal[False] = False,
) -> Array: ...
@overload
def single_prefill_with_kv_cache(
    q: Array,
    k: Array,
    v: Array,
    scale_q: Optional[Array] = None,
    scale_k: Optional[Array] = None,
    scale_v: Optional[Array] = None,
    o_dtype: Optional[DTypeLike] = None,
    custom_mask: Optional[Array] = None,
    packed_custom_mask: Optional[Array] = None,
    causal: bool = False,
    kv_layout: str = "NHD",
    pos_encoding_mode: str = "NONE",
    use_fp16_qk_reduction: bool = False,
    sm_scale: Optional[float] = None,
    window_left: int = -1,
    logits_soft_cap: Optional[float] = None,
    rope_scale: Optional[float] = None,
    rope_theta: Optional[float] = None,
    backend: str = "auto",
    return_lse: Literal[True] = True,
) -> Tuple[Array, Array]: ...
def single_prefill_with_kv_cache_return_lse(
    q: Array, k: Array, v: Array, **kwargs: Any
) -> Tuple[Array, Array]: ...
@overload
def single_decode_with_kv_cache(
    q: Array,
    k: Array,
    v: Array,
    kv_layout: str = "NHD",
    pos_encoding_mode: str = "NONE",
    use_tensor_cores: bool = False,
    q_scale: Optional[float] = None,
    k_scale: Optional[Scale] = None,
    v_scale: Optional[Scale] = None,
    window_left: int = -1,
    logits_soft_cap: Optional[float] = None,
    sm_scale: Optional[float] = None,
    rope_scale: Optional[float] = None,
    rope_theta: Optional[float] = None,
    return_lse: Literal[False] = False,
) -> Array: ...
@overload
def single_decode_with_kv_cache(
    q: Array,
    k: Array,
    v: Array,
    kv_layout: str = "NHD",
    pos_encoding_mode: str = "NONE",
    use_tensor_cores: bool = False,
    q_scale: Optional[float] = None,
    k_scale: Optional[Scale] = None,
    v_scale: Optional[Scale] = None,
    window_left: int = -1,
    logits_soft_cap: Optional[float] = None,
    sm_scale: Optional[float] = None,
    rope_scale: Optional[float] = None,
    rope_theta: Optional[float] = None,
    return_lse: Literal[True] = True,
) -> Tuple[Array, Array]: ...

class _Wrapper:
    def __init__(
        self,
        float_workspace_buffer: Array,
        kv_layout: str,
        backend: str,
        jit_args: Optional[Any],
        graph: Optional[Any] = None,
        jit_kwargs: Optional[Any] = None,
    ) -> None: ...
    @property
    def is_cuda_graph_enabled(self) -> bool: ...
    def reset_workspace_buffer(
        self, float_workspace_buffer: Array, int_workspace_buffer: Optional[Array] = None
    ) -> None: ...

class _PagedWrapper(_Wrapper): ...

class BatchPrefillWithRaggedKVCacheWrapper(_Wrapper):
    def __init__(
        self,
        float_workspace_buffer: Array,
        kv_layout: str = "NHD",
        use_cuda_graph: bool = False,
        qo_indptr_buf: Optional[Array] = None,
        kv_indptr_buf: Optional[Array] = None,
        custom_mask_buf: Optional[Array] = None,
        mask_indptr_buf: Optional[Array] = None,
        backend: str = "auto",
        jit_args: Optional[Any] = None,
        jit_kwargs: Optional[Any] = None,
    ) -> None: ...
    def plan(
        self,
        qo_indptr: Array,
        kv_indptr: Array,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim_qk: int,
        head_dim_vo: Optional[int] = None,
        custom_mask: Optional[Array] = None,
        packed_custom_mask: Optional[Array] = None,
        causal: bool = False,
        pos_encoding_mode: str = "NONE",
        use_fp16_qk_reduction: bool = False,
        window_left: int = -1,
        logits_soft_cap: Optional[float] = None,
        sm_scale: Optional[float] = None,
        rope_scale: Optional[float] = None,
        rope_theta: Optional[float] = None,
        q_data_type: DTypeLike = "float16",
        kv_data_type: Optional[DTypeLike] = None,
        non_blocking: bool = True,
        prefix_len_ptr: Optional[Array] = None,
        token_pos_in_items_ptr: Optional[Array] = None,
        token_pos_in_items_len: int = 0,
        max_item_len_ptr: Optional[Array] = None,
        fixed_split_size: Optional[int] = None,
        disable_split_kv: bool = False,
    ) -> None: ...
    def run(
        self,
        q: Array,
        k: Array,
        v: Array,
        *args: Any,
        out: Optional[Array] = None,
        lse: Optional[Array] = None,
        return_lse: bool = False,
        enable_pdl: Optional[bool] = None,
    ) -> Output: ...
    def run_return_lse(
        self, q: Array, k: Array, v: Array, *args: Any, **kwargs: Any
    ) -> Tuple[Array, Array]: ...

class BatchPrefillWithPagedKVCacheWrapper(_PagedWrapper):
    def __init__(
        self,
        float_workspace_buffer: Array,
        kv_layout: str = "NHD",
        use_cuda_graph: bool = False,
        qo_indptr_buf: Optional[Array] = None,
        paged_kv_indptr_buf: Optional[Array] = None,
        paged_kv_indices_buf: Optional[Array] = None,
        paged_kv_last_page_len_buf: Optional[Array] = None,
        custom_mask_buf: Optional[Array] = None,
        mask_indptr_buf: Optional[Array] = None,
        backend: str = "auto",
        jit_args: Optional[Any] = None,
        jit_kwargs: Optional[Any] = None,
    ) -> None: ...
    def plan(
        self,
        qo_indptr: Array,
        paged_kv_indptr: Array,
        paged_kv_indices: Array,
        paged_kv_last_page_len: Array,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim_qk: int,
        page_size: int,
        head_dim_vo: Optional[int] = None,
        custom_mask: Optional[Array] = None,
        packed_custom_mask: Optional[Array] = None,
        causal: bool = False,
        pos_encoding_mode: str = "NONE",
        use_fp16_qk_reduction: bool = False,
        sm_scale: Optional[float] = None,
        window_left: int = -1,
        logits_soft_cap: Optional[float] = None,
        rope_scale: Optional[float] = None,
        rope_theta: Optional[float] = None,
        q_data_type: DTypeLike = "float16",
        kv_data_type: Optional[DTypeLike] = None,
        non_blocking: bool = True,
        prefix_len_ptr: Optional[Array] = None,
        token_pos_in_items_ptr: Optional[Array] = None,
        token_pos_in_items_len: int = 0,
        max_item_len_ptr: Optional[Array] = None,
        seq_lens: Optional[Array] = None,
        seq_lens_q: Optional[Array] = None,
        block_tables: Optional[Array] = None,
        max_token_per_sequence: Optional[int] = None,
        max_sequence_kv: Optional[int] = None,
        fixed_split_size: Optional[int] = None,
        disable_split_kv: bool = False,
    ) -> None: ...
    def run(
        self,
        q: Array,
        paged_kv_cache: PagedKVCache,
        *args: Any,
        q_scale: Optional[float] = None,
        k_scale: Optional[Scale] = None,
        v_scale: Optional[Scale] = None,
        out: Optional[Array] = None,
        lse: Optional[Array] = None,
        return_lse: bool = False,
        enable_pdl: Optional[bool] = None,
        window_left: Optional[int] = None,
        sinks: Optional[Array] = None,
    ) -> Output: ...
    def run_return_lse(
        self, q: Array, paged_kv_cache: PagedKVCache, *args: Any, **kwargs: Any
    ) -> Tuple[Array, Array]: ...

class BatchDecodeWithPagedKVCacheWrapper(_PagedWrapper):
    def __init__(
        self,
        float_workspace_buffer: Array,
        kv_layout: str = "NHD",
        use_cuda_graph: bool = False,
        use_tensor_cores: bool = False,
        paged_kv_indptr_buffer: Optional[Array] = None,
        paged_kv_indices_buffer: Optional[Array] = None,
        paged_kv_last_page_len_buffer: Optional[Array] = None,
        backend: str = "auto",
        jit_args: Optional[Any] = None,
    ) -> None: ...
    @property
    def use_tensor_cores(self) -> bool: ...
    def plan(
        self,
        indptr: Array,
        indices: Array,
        last_page_len: Array,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim: int,
        page_size: int,
        pos_encoding_mode: str = "NONE",
        window_left: int = -1,
        logits_soft_cap: Optional[float] = None,
        q_data_type: Optional[DTypeLike] = "float16",
        kv_data_type: Optional[DTypeLike] = None,
        data_type: Optional[DTypeLike] = None,
        sm_scale: Optional[float] = None,
        rope_scale: Optional[float] = None,
        rope_theta: Optional[float] = None,
        non_blocking: bool = True,
        block_tables: Optional[Array] = None,
        seq_lens: Optional[Array] = None,
        fixed_split_size: Optional[int] = None,
        disable_split_kv: bool = False,
    ) -> None: ...
    def run(
        self,
        q: Array,
        paged_kv_cache: PagedKVCache,
        *args: Any,
        q_scale: Optional[float] = None,
        k_scale: Optional[Scale] = None,
        v_scale: Optional[Scale] = None,
        out: Optional[Array] = None,
        lse: Optional[Array] = None,
        return_lse: bool = False,
        enable_pdl: Optional[bool] = None,
        window_left: Optional[int] = None,
        sinks: Optional[Array] = None,
        q_len_per_req: Optional[int] = 1,
    ) -> Output: ...
    def run_return_lse(
        self, q: Array, paged_kv_cache: PagedKVCache, *args: Any, **kwargs: Any
    ) -> Tuple[Array, Array]: ...

class MultiLevelCascadeAttentionWrapper:
    def __init__(
        self,
        num_levels: SupportsIndex,
        float_workspace_buffer: Array,
        kv_layout: str = "NHD",
        use_cuda_graph: bool = False,
        qo_indptr_buf_arr: Optional[Sequence[Array]] = None,
        paged_kv_indptr_buf_arr: Optional[Sequence[Array]] = None,
        paged_kv_indices_buf_arr: Optional[Sequence[Array]] = None,
        paged_kv_last_page_len_buf_arr: Optional[Sequence[Array]] = None,
    ) -> None: ...
    @property
    def is_cuda_graph_enabled(self) -> bool: ...
    def reset_workspace_buffer(
        self, float_workspace_buffer: Array, int_workspace_buffers: List[Array]
    ) -> None: ...
    def plan(
        self,
        qo_indptr_arr: Sequence[Array],
        paged_kv_indptr_arr: Sequence[Array],
        paged_kv_indices_arr: Sequence[Array],
        paged_kv_last_page_len: Sequence[Array],
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim: int,
        page_size: int,
        causal: bool = False,
        pos_encoding_mode: str = "NONE",
        use_fp16_qk_reduction: bool = False,
        sm_scale: Optional[float] = None,
        window_left: int = -1,
        logits_soft_cap: Optional[float] = None,
        rope_scale: Optional[float] = None,
        rope_theta: Optional[float] = None,
        q_data_type: DTypeLike = "float16",
        kv_data_type: Optional[DTypeLike] = None,
    ) -> None: ...
    begin_forward = plan
    def run(self, q: Array, paged_kv_cache: PagedKVCache) -> Array: ...
    forward = run

class BatchDecodeWithSharedPrefixPagedKVCacheWrapper:
    def __init__(self, float_workspace_buffer: Array, kv_layout: str = "NHD") -> None: ...
    def reset_workspace_buffer(
        self, float_workspace_buffer: Array, int_workspace_buffer: Array
    ) -> None: ...
    def begin_forward(
        self,
        unique_kv_indptr: Array,
        unique_kv_indices: Array,
        unique_kv_last_page_len: Array,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim: int,
        page_size: int,
        data_type: DTypeLike = "float16",
    ) -> None: ...
    def forward(
        self, q: Array, k_shared: Array, v_shared: Array, unique_kv_cache: PagedKVCache
    ) -> Array: ...
    def end_forward(self) -> None: ...

class BatchPrefillWithSharedPrefixPagedKVCacheWrapper:
    def __init__(self, float_workspace_buffer: Array, kv_layout: str = "NHD") -> None: ...
    def reset_workspace_buffer(
        self, float_workspace_buffer: Array, int_workspace_buffer: Array
    ) -> None: ...
    def begin_forward(
        self,
        qo_indptr: Array,
        paged_kv_indptr: Array,
        paged_kv_indices: Array,
        paged_kv_last_page_len: Array,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim: int,
        page_size: int,
    ) -> None: ...
    def forward(
        self,
        q: Array,
        k_shared: Array,
        v_shared: Array,
        unique_kv_cache: PagedKVCache,
        causal: bool = False,
        use_fp16_qk_reduction: bool = False,
        sm_scale: Optional[float] = None,
        rope_scale: Optional[float] = None,
        rope_theta: Optional[float] = None,
    ) -> Array: ...
    def end_forward(self) -> None: ...

def merge_state(v_a: Array, s_a: Array, v_b: Array, s_b: Array) -> Tuple[Array, Array]: ...
def merge_state_in_place(
    v: Array, s: Array, v_other: Array, s_other: Array, mask: Optional[Array] = None
) -> None: ...
def merge_states(v: Array, s: Array) -> Tuple[Array, Array]: ...
def append_paged_kv_cache(
    append_key: Array,
    append_value: Array,
    batch_indices: Array,
    positions: Array,
    paged_kv_cache: PagedKVCache,
    kv_indices: Array,
    kv_indptr: Array,
    kv_last_page_len: Array,
    kv_layout: str = "NHD",
    *,
    kv_data_type: Optional[DTypeLike] = None,
) -> None: ...
def get_seq_lens(kv_indptr: Array, kv_last_page_len: Array, page_size: int) -> Array: ...
def get_batch_indices_positions(
    append_indptr: Array, seq_lens: Array, nnz: int
) -> Tuple[Array, Array]: ...

class CUDAGraphBatchDecodeWithPagedKVCacheWrapper(BatchDecodeWithPagedKVCacheWrapper):
    def __init__(
        self,
        workspace_buffer: Array,
        indptr_buffer: Array,
        indices_buffer: Array,
        last_page_len_buffer: Array,
        kv_layout: str = "NHD",
        use_tensor_cores: bool = False,
    ) -> None: ...

def fast_decode_plan(
    self: BatchDecodeWithPagedKVCacheWrapper,
    indptr: Array,
    indices: Array,
    last_page_len: Array,
    num_qo_heads: int,
    num_kv_heads: int,
    head_dim: int,
    page_size: int,
    pos_encoding_mode: str = "NONE",
    window_left: int = -1,
    logits_soft_cap: Optional[float] = None,
    q_data_type: Optional[Any] = None,
    kv_data_type: Optional[Any] = None,
    data_type: Optional[Any] = None,
    sm_scale: Optional[float] = None,
    rope_scale: Optional[float] = None,
    rope_theta: Optional[float] = None,
    non_blocking: bool = True,
    fixed_split_size: Optional[int] = None,
    disable_split_kv: bool = False,
    global_override_indptr_cpu: Optional[Array] = None,
) -> None: ...
