"""FlashInfer's ``MultiLevelCascadeAttentionWrapper``, re-exported by ``attnforge.flashinfer``.

Cascade attention reads a KV cache stored in levels of one page table: level 0 typically a prefix
that many requests share (one entry of the level's ``qo_indptr`` spans all their queries), the
last level each request's own pages. Each level is a ``BatchPrefillWithPagedKVCacheWrapper``
plan (causal only at the last level, as in FlashInfer); ``run`` computes every level with its LSE
and merges the states into the last level's output (``merge_state_in_place``), which equals one
attention over each request's keys of all levels.
"""

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

        if isinstance(num_levels, bool) or not isinstance(num_levels, int) or num_levels < 1:
            raise ValueError(f"invalid num_levels: is {num_levels!r}; expected an int >= 1")
        self._num_levels = num_levels
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
