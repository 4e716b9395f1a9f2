"""FlashInfer's cascade wrappers, re-exported by ``attnforge.flashinfer``:
``MultiLevelCascadeAttentionWrapper`` and the two deprecated shared-prefix wrappers it replaced,
``BatchDecodeWithSharedPrefixPagedKVCacheWrapper`` and
``BatchPrefillWithSharedPrefixPagedKVCacheWrapper``.

Cascade attention reads a KV cache stored in levels of one page table: level 0 typically a prefix
that many requests share (one entry of the level's ``qo_indptr`` spans all their queries), the
last level each request's own pages. Each level is a ``BatchPrefillWithPagedKVCacheWrapper``
plan (causal only at the last level, as in FlashInfer); ``run`` computes every level with its LSE
and merges the states into the last level's output (``merge_state_in_place``), which equals one
attention over each request's keys of all levels.
"""

import operator

from ._merge import merge_state_in_place


def _per_level(name, values, num_levels):
    """``values`` as a list of one entry per level; a ValueError naming ``name`` otherwise."""
    if values is None or isinstance(values, (str, bytes)):
        raise ValueError(f"invalid {name}: is {values!r}; expected a list of {num_levels} arrays")
    values = list(values)
    if len(values) != num_levels:
        raise ValueError(
            f"invalid {name}: has {len(values)} entries; the wrapper has {num_levels} levels"
        )
    return values


class MultiLevelCascadeAttentionWrapper:
    """Attention over a paged KV cache in ``num_levels`` levels (see the module docs)."""

    def __init__(
        self,
        num_levels,
        float_workspace_buffer,
        kv_layout="NHD",
        use_cuda_graph=False,
        qo_indptr_buf_arr=None,
        paged_kv_indptr_buf_arr=None,
        paged_kv_indices_buf_arr=None,
        paged_kv_last_page_len_buf_arr=None,
    ):
        from .flashinfer import BatchPrefillWithPagedKVCacheWrapper

        self._num_levels = _level_count(num_levels)
        self._kv_layout = kv_layout
        self._use_cuda_graph = bool(use_cuda_graph)
        if self._use_cuda_graph:
            buffers = zip(
                _per_level("qo_indptr_buf_arr", qo_indptr_buf_arr, num_levels),
                _per_level("paged_kv_indptr_buf_arr", paged_kv_indptr_buf_arr, num_levels),
                _per_level("paged_kv_indices_buf_arr", paged_kv_indices_buf_arr, num_levels),
                _per_level(
                    "paged_kv_last_page_len_buf_arr", paged_kv_last_page_len_buf_arr, num_levels
                ),
            )
            self._levels = [
                BatchPrefillWithPagedKVCacheWrapper(
                    float_workspace_buffer,
                    kv_layout,
                    use_cuda_graph=True,
                    qo_indptr_buf=qo,
                    paged_kv_indptr_buf=indptr,
                    paged_kv_indices_buf=indices,
                    paged_kv_last_page_len_buf=last,
                )
                for qo, indptr, indices, last in buffers
            ]
        else:
            self._levels = [
                BatchPrefillWithPagedKVCacheWrapper(float_workspace_buffer, kv_layout)
                for _ in range(num_levels)
            ]

    @property
    def is_cuda_graph_enabled(self):
        return self._use_cuda_graph

    def reset_workspace_buffer(self, float_workspace_buffer, int_workspace_buffers):
        """Accepted for compatibility: attnforge's plans own their buffers."""
        int_buffers = _per_level("int_workspace_buffers", int_workspace_buffers, self._num_levels)
        for level, int_buffer in zip(self._levels, int_buffers):
            level.reset_workspace_buffer(float_workspace_buffer, int_buffer)

    def plan(
        self,
        qo_indptr_arr,
        paged_kv_indptr_arr,
        paged_kv_indices_arr,
        paged_kv_last_page_len,
        num_qo_heads,
        num_kv_heads,
        head_dim,
        page_size,
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
    ):
        """Plans every level: the i-th entry of each list is level i's table (its ``qo_indptr``
        over the same queries as the other levels'). ``causal`` applies to the last level."""
        n = self._num_levels
        tables = zip(
            _per_level("qo_indptr_arr", qo_indptr_arr, n),
            _per_level("paged_kv_indptr_arr", paged_kv_indptr_arr, n),
            _per_level("paged_kv_indices_arr", paged_kv_indices_arr, n),
            _per_level("paged_kv_last_page_len", paged_kv_last_page_len, n),
        )
        for i, (level, (qo, indptr, indices, last)) in enumerate(zip(self._levels, tables)):
            level.plan(
                qo,
                indptr,
                indices,
                last,
                num_qo_heads,
                num_kv_heads,
                head_dim,
                page_size,
                causal=causal if i == n - 1 else False,
                pos_encoding_mode=pos_encoding_mode,
                use_fp16_qk_reduction=use_fp16_qk_reduction,
                sm_scale=sm_scale,
                window_left=window_left,
                logits_soft_cap=logits_soft_cap,
                rope_scale=rope_scale,
                rope_theta=rope_theta,
                q_data_type=q_data_type,
                kv_data_type=kv_data_type,
            )

    begin_forward = plan

    def run(self, q, paged_kv_cache):
        """``o [rows, Hq, D]``: every level's attention over its pages, merged."""
        out, lse = self._levels[-1].run(q, paged_kv_cache, return_lse=True)
        for level in self._levels[:-1]:
            out_i, lse_i = level.run(q, paged_kv_cache, return_lse=True)
            merge_state_in_place(out, lse, out_i, lse_i)
        return out

    forward = run


class BatchDecodeWithSharedPrefixPagedKVCacheWrapper:
    """FlashInfer's (deprecated) two-level decode: every query against the shared prefix
    ``k_shared``, ``v_shared`` (one non-causal single prefill), then each request's own pages
    (a batch decode), merged."""

    def __init__(self, float_workspace_buffer, kv_layout="NHD"):
        from .flashinfer import BatchDecodeWithPagedKVCacheWrapper

        self._kv_layout = kv_layout
        self._decode = BatchDecodeWithPagedKVCacheWrapper(float_workspace_buffer, kv_layout)

    def reset_workspace_buffer(self, float_workspace_buffer, int_workspace_buffer):
        """Accepted for compatibility: attnforge's plans own their buffers."""
        self._decode.reset_workspace_buffer(float_workspace_buffer, int_workspace_buffer)

    def begin_forward(
        self,
        unique_kv_indptr,
        unique_kv_indices,
        unique_kv_last_page_len,
        num_qo_heads,
        num_kv_heads,
        head_dim,
        page_size,
        data_type="float16",
    ):
        """Plans the decode over each request's own pages; ``data_type`` is the queries' and the
        cache's dtype."""
        self._decode.plan(
            unique_kv_indptr,
            unique_kv_indices,
            unique_kv_last_page_len,
            num_qo_heads,
            num_kv_heads,
            head_dim,
            page_size,
            q_data_type=data_type,
            kv_data_type=data_type,
        )

    def forward(self, q, k_shared, v_shared, unique_kv_cache):
        """``o [batch, Hq, D]``: attention over the shared prefix and the request's own pages."""
        from .flashinfer import single_prefill_with_kv_cache

        out, lse = single_prefill_with_kv_cache(
            q, k_shared, v_shared, kv_layout=self._kv_layout, return_lse=True
        )
        out_own, lse_own = self._decode.run(q, unique_kv_cache, return_lse=True)
        merge_state_in_place(out, lse, out_own, lse_own)
        return out

    def end_forward(self):
        """Accepted for compatibility: nothing to release."""


class BatchPrefillWithSharedPrefixPagedKVCacheWrapper:
    """FlashInfer's (deprecated) two-level prefill: every query against the shared prefix
    ``k_shared``, ``v_shared`` (one non-causal single prefill), then each request's own pages (a
    paged prefill, causal when ``forward`` asks), merged. ``forward`` takes the masking options,
    so the paged prefill is planned at the first ``forward`` with each set of them."""

    def __init__(self, float_workspace_buffer, kv_layout="NHD"):
        from .flashinfer import BatchPrefillWithPagedKVCacheWrapper

        self._kv_layout = kv_layout
        self._prefill = BatchPrefillWithPagedKVCacheWrapper(float_workspace_buffer, kv_layout)
        self._table = None
        self._planned = None

    def reset_workspace_buffer(self, float_workspace_buffer, int_workspace_buffer):
        """Accepted for compatibility: attnforge's plans own their buffers."""
        self._prefill.reset_workspace_buffer(float_workspace_buffer, int_workspace_buffer)

    def begin_forward(
        self,
        qo_indptr,
        paged_kv_indptr,
        paged_kv_indices,
        paged_kv_last_page_len,
        num_qo_heads,
        num_kv_heads,
        head_dim,
        page_size,
    ):
        """Keeps the table of each request's own pages; ``forward`` plans over it."""
        self._table = (
            qo_indptr,
            paged_kv_indptr,
            paged_kv_indices,
            paged_kv_last_page_len,
            num_qo_heads,
            num_kv_heads,
            head_dim,
            page_size,
        )
        self._planned = None

    def forward(
        self,
        q,
        k_shared,
        v_shared,
        unique_kv_cache,
        causal=False,
        use_fp16_qk_reduction=False,
        sm_scale=None,
        rope_scale=None,
        rope_theta=None,
    ):
        """``o [rows, Hq, D]``: attention over the shared prefix and the request's own pages."""
        from .flashinfer import single_prefill_with_kv_cache

        if self._table is None:
            raise RuntimeError("forward() before begin_forward(): call begin_forward() first")
        options = dict(
            causal=causal,
            use_fp16_qk_reduction=use_fp16_qk_reduction,
            sm_scale=sm_scale,
            rope_scale=rope_scale,
            rope_theta=rope_theta,
        )
        shared_options = dict(options, causal=False)
        out, lse = single_prefill_with_kv_cache(
            q, k_shared, v_shared, kv_layout=self._kv_layout, return_lse=True, **shared_options
        )
        if self._planned != options:
            self._prefill.plan(*self._table, q_data_type=q.dtype, **options)
            self._planned = options
        out_own, lse_own = self._prefill.run(q, unique_kv_cache, return_lse=True)
        merge_state_in_place(out, lse, out_own, lse_own)
        return out

    def end_forward(self):
        """Accepted for compatibility: nothing to release."""


def _level_count(num_levels):
    """``num_levels`` as an int: any integer (a Python int, a numpy or torch integer scalar) of at
    least 1; a ``ValueError`` for anything else (a bool, a float, a string)."""
    try:
        count = None if isinstance(num_levels, bool) else operator.index(num_levels)
    except TypeError:
        count = None
    if count is None or count < 1:
        raise ValueError(f"invalid num_levels: is {num_levels!r}; expected an int >= 1")
    return count
