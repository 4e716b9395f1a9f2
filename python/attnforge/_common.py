"""What the single-request functions and the wrappers share: their outputs (allocated like q,
or the caller's), the LSE's conversion to FlashInfer's base 2 and ALiBi convention,
FlashInfer's ALiBi slopes, and the native options of a prefill call."""

import operator

import numpy as np

from . import _arrays as A
from ._options import alibi_slopes, refuse, spec


def _outputs(q, total_qo, num_qo_heads, head_dim_vo, out, lse, return_lse):
    """The output arrays: the caller's ``out`` / ``lse`` when given, else new ones like ``q``."""
    if out is None:
        out = A.empty(q, (total_qo, num_qo_heads, head_dim_vo))
    elif not A.same_library(out, q):
        raise TypeError("out must be of the same array library as q")
    if lse is None and return_lse:
        lse = A.empty(q, (total_qo, num_qo_heads), float32=True)
    return out, lse


def _finish(out, lse, return_lse, shift=None):
    """Shifts the LSE to FlashInfer's ALiBi convention (``shift``, an ``_LseShift``, when
    given), converts it from natural log to FlashInfer's base 2, in place, and returns."""
    if lse is not None:
        if shift is not None:
            lse += shift.like(lse)
        lse *= A.LOG2E
    return (out, lse) if return_lse else out


def _check_o_dtype(o_dtype, q):
    if o_dtype is not None and str(o_dtype) != str(q.dtype):
        refuse("o_dtype", o_dtype, "the output has the dtype of q")


class _LseShift:
    """What turns attnforge's ALiBi LSEs into FlashInfer's. attnforge's bias is
    ``slope * (j - (i + kv_len - qo_len))`` (query ``i`` at its position among the keys),
    FlashInfer's ``slope * (j - i)`` (``i`` the query's index in its request; 0 in decode): the
    same softmax, and LSEs apart by ``slope * (kv_len - qo_len)`` per request and head. Holds
    those shifts (a float32 numpy array, ``[heads]`` or ``[rows, heads]``) and their copy in
    each library and device they are added on."""

    def __init__(self, values):
        self.values, self._arrays = values, {}

    @staticmethod
    def of_batch(slopes, qo_indptr, kv_indptr):
        """The shifts of every query row of a batch; ``None`` without ALiBi."""
        if slopes is None:
            return None
        rows = np.zeros((qo_indptr[-1], len(slopes)), np.float32)
        slopes = np.asarray(slopes, np.float32)
        for r in range(len(qo_indptr) - 1):
            qo, kv = qo_indptr[r + 1] - qo_indptr[r], kv_indptr[r + 1] - kv_indptr[r]
            rows[qo_indptr[r] : qo_indptr[r + 1]] = slopes * (kv - qo)
        return _LseShift(rows)

    def like(self, lse):
        key = (type(lse), A.device_of(lse))
        array = self._arrays.get(key)
        if array is None:
            array = self._arrays[key] = A.float32_array(lse, self.values)
        return array


def _slopes(pos_encoding_mode, num_qo_heads):
    """FlashInfer's ALiBi slopes with ``pos_encoding_mode="ALIBI"``, else ``None``."""
    return alibi_slopes(int(num_qo_heads)) if pos_encoding_mode == "ALIBI" else None


# The arguments of a FlashInfer prefill call that ``spec`` takes, in its order: those before the
# dtype and the indptr lists, and those after.
_SPEC_SHAPE = operator.itemgetter("num_qo_heads", "num_kv_heads", "head_dim_qk", "head_dim_vo")
_SPEC_MASKING = operator.itemgetter(
    "causal",
    "window_left",
    "logits_soft_cap",
    "sm_scale",
    "use_fp16_qk_reduction",
    "custom_mask",
    "packed_custom_mask",
)


def _prefill_spec(call, dtype, qo_indptr, kv_indptr):
    """The native options of a prefill call over ``qo_indptr``, ``kv_indptr`` (lists), and its
    ALiBi slopes (``None`` without ALiBi). ``call`` maps the call's argument names to their
    values (the caller's ``locals()``); ``head_dim_vo=None`` is ``head_dim_qk``, as in
    FlashInfer."""
    num_qo_heads, num_kv_heads, head_dim_qk, head_dim_vo = _SPEC_SHAPE(call)
    if head_dim_vo is None:
        head_dim_vo = head_dim_qk
    slopes = _slopes(call["pos_encoding_mode"], num_qo_heads)
    shape = (num_qo_heads, num_kv_heads, head_dim_qk, head_dim_vo)
    options = spec(*shape, dtype, qo_indptr, kv_indptr, *_SPEC_MASKING(call), slopes)
    return options, slopes
