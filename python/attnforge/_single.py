"""FlashInfer's single-request functions: ``single_prefill_with_kv_cache`` (with its plans kept
by shape), ``single_prefill_with_kv_cache_return_lse`` and ``single_decode_with_kv_cache``,
re-exported by ``attnforge.flashinfer``."""

import collections
import functools

from . import _arrays as A
from . import _fp8
from . import _native
from ._common import _LseShift, _check_o_dtype, _finish, _outputs, _prefill_spec
from ._options import check_common, refuse, refuse_set
from ._page import _check_kv_layout


class _SinglePlan:
    """A plan of ``single_prefill_with_kv_cache`` with what its calls need beside it."""

    __slots__ = ("plan", "device", "qo_len", "num_qo_heads", "head_dim_vo", "shift")

    def __init__(self, plan, device, qo_len, num_qo_heads, head_dim_vo, shift):
        self.plan, self.device = plan, device
        self.qo_len, self.num_qo_heads, self.head_dim_vo = qo_len, num_qo_heads, head_dim_vo
        self.shift = shift  # an _LseShift with ALiBi, else None


# The plans of single_prefill_with_kv_cache, by the call's arguments, most recently used last:
# repeated calls of one shape neither plan again nor wait for the device (replacing a plan waits
# for the device to be idle, since a launch may still read its arrays), and skip re-deriving the
# options. A call with a custom mask, which the plan uploads, plans each time.
_SINGLE_PLANS = collections.OrderedDict()
# Plans kept: a few shapes of a model's layers and batch sizes, each plan a few small arrays.
_SINGLE_PLANS_MAX = 32


def _single_key(q, k, v, options):
    """The plan cache key of a call: the arrays' shapes, q's dtype and device, and the other
    arguments (``options``); ``None`` when they do not make a key (not arrays, or unhashable)."""
    try:
        key = (q.shape, k.shape, v.shape, q.dtype, A.device_of(q)) + options
        hash(key)
    except (AttributeError, TypeError):
        return None
    return key


def single_prefill_with_kv_cache(
    q,
    k,
    v,
    scale_q=None,
    scale_k=None,
    scale_v=None,
    o_dtype=None,
    custom_mask=None,
    packed_custom_mask=None,
    causal=False,
    kv_layout="NHD",
    pos_encoding_mode="NONE",
    use_fp16_qk_reduction=False,
    sm_scale=None,
    window_left=-1,
    logits_soft_cap=None,
    rope_scale=None,
    rope_theta=None,
    backend="auto",
    return_lse=False,
):
    """Attention of one request: ``q [qo_len, Hq, Dqk]`` over ``k``, ``v`` (``[kv_len, Hkv, D]``
    for NHD, ``[Hkv, kv_len, D]`` for HND). Returns ``o [qo_len, Hq, Dvo]``, or ``(o, lse)``
    with the base-2 LSE ``[qo_len, Hq]`` when ``return_lse``."""
    key = entry = None
    if custom_mask is None and packed_custom_mask is None:
        options = (kv_layout, causal, pos_encoding_mode, use_fp16_qk_reduction, sm_scale)
        options += (window_left, logits_soft_cap, backend, o_dtype, scale_q, scale_k, scale_v)
        key = _single_key(q, k, v, options + (rope_scale, rope_theta))
        entry = None if key is None else _SINGLE_PLANS.get(key)
    if entry is None:
        # On a miss only: the plan reads the call's arguments by name.
        entry = _single_plan(locals())
        if key is not None:
            _SINGLE_PLANS[key] = entry
            if len(_SINGLE_PLANS) > _SINGLE_PLANS_MAX:
                _SINGLE_PLANS.popitem(last=False)
    else:
        _SINGLE_PLANS.move_to_end(key)
    if kv_layout == "HND":
        k, v = A.swap01(k), A.swap01(v)
    shape = (entry.qo_len, entry.num_qo_heads, entry.head_dim_vo)
    out, lse = _outputs(q, *shape, None, None, return_lse)
    entry.plan.run(q, k, v, out, lse, A.current_stream(entry.device))
    return _finish(out, lse, return_lse, entry.shift)


def _single_plan(call):
    """Checks a call of ``single_prefill_with_kv_cache`` (``call``: its arguments by name, its
    ``locals()``) and plans it."""
    q, k, v, kv_layout = call["q"], call["k"], call["v"], call["kv_layout"]
    mode, backend = call["pos_encoding_mode"], call["backend"]
    check_common(mode, call["rope_scale"], call["rope_theta"], backend, alibi=True)
    reason = "the scales of fp8 prefill inputs; attnforge's fp8 K/V are paged"
    refuse_set(
        scale_q=(call["scale_q"], "fp8 queries are not supported"),
        scale_k=(call["scale_k"], reason),
        scale_v=(call["scale_v"], reason),
    )
    _check_o_dtype(call["o_dtype"], q)
    _check_kv_layout(kv_layout)
    for name, x in (("k", k), ("v", v)):
        if _fp8.array_format(x) is not None:
            refuse(
                name,
                f"a {x.dtype} tensor",
                "fp8 K/V are read by the paged wrappers (kv_data_type) and"
                " single_decode_with_kv_cache",
            )
    if kv_layout == "HND":
        k, v = A.swap01(k), A.swap01(v)
    for name, x in (("q", q), ("k", k), ("v", v)):
        A.checked_dtype(x, name)
        if len(x.shape) != 3:
            raise ValueError(f"invalid {name}: has shape {tuple(x.shape)}; expected 3 dimensions")
    qo_len, num_qo_heads, head_dim_qk = (int(n) for n in q.shape)
    kv_len, num_kv_heads, _ = (int(n) for n in k.shape)
    head_dim_vo = int(v.shape[2])
    qo_indptr, kv_indptr = [0, qo_len], [0, kv_len]
    heads = {"num_qo_heads": num_qo_heads, "num_kv_heads": num_kv_heads}
    dims = {"head_dim_qk": head_dim_qk, "head_dim_vo": head_dim_vo}
    dtype = A.checked_dtype(q, "q")
    options, slopes = _prefill_spec({**call, **heads, **dims}, dtype, qo_indptr, kv_indptr)
    device = A.device_of(q)
    plan = _native.RaggedPlan(qo_indptr, kv_indptr, options, device, lazy=True)
    shift = _LseShift.of_batch(slopes, qo_indptr, kv_indptr)
    return _SinglePlan(plan, device, qo_len, num_qo_heads, head_dim_vo, shift)


single_prefill_with_kv_cache_return_lse = functools.partial(
    single_prefill_with_kv_cache, return_lse=True
)


def single_decode_with_kv_cache(
    q,
    k,
    v,
    kv_layout="NHD",
    pos_encoding_mode="NONE",
    use_tensor_cores=False,
    q_scale=None,
    k_scale=None,
    v_scale=None,
    window_left=-1,
    logits_soft_cap=None,
    sm_scale=None,
    rope_scale=None,
    rope_theta=None,
    return_lse=False,
):
    """Decode attention of one request: ``q [Hq, D]`` (the request's newest token) over ``k``,
    ``v`` as in ``single_prefill_with_kv_cache``. Returns ``o [Hq, Dvo]``, or ``(o, lse)`` with
    the base-2 LSE ``[Hq]``. It is the one-query prefill (the query sits at position
    ``kv_len - 1``; ``use_tensor_cores`` chooses nothing: attnforge's planner picks the kernel);
    with ALiBi the LSE follows FlashInfer's decode bias ``slope * j``, as the prefill's
    ``slope * (j - i)`` with ``i = 0``. fp8 ``k`` and ``v`` (torch ``float8_e4m3fn`` /
    ``float8_e5m2``, dequantised with ``k_scale`` / ``v_scale``) run as a batch decode of one
    request over pages of one token (``_single_decode_fp8``)."""
    refuse_set(q_scale=(q_scale, "fp8 queries are not supported (fp8 K/V are)"))
    A.checked_dtype(q, "q")
    if len(q.shape) != 2:
        raise ValueError(f"invalid q: has shape {tuple(q.shape)}; expected [num_qo_heads, head_dim]")
    # The arguments its prefill (or, over fp8, the decode wrapper's plan) takes by the same names.
    passed = dict(
        pos_encoding_mode=pos_encoding_mode,
        window_left=window_left,
        logits_soft_cap=logits_soft_cap,
        sm_scale=sm_scale,
        rope_scale=rope_scale,
        rope_theta=rope_theta,
    )
    if _fp8.array_format(k) is not None:
        o = _single_decode_fp8(q, k, v, kv_layout, passed, (k_scale, v_scale), return_lse)
        return _first_row(o, return_lse)
    _fp8.refuse_plain_scales(k_scale, v_scale)
    o = single_prefill_with_kv_cache(
        q[None], k, v, causal=True, kv_layout=kv_layout, return_lse=return_lse, **passed
    )
    return _first_row(o, return_lse)


def _first_row(o, return_lse):
    """The one query row of a result: ``o[0]``, or ``(o[0], lse[0])`` when ``return_lse``."""
    if return_lse:
        o, lse = o
        return o[0], lse[0]
    return o[0]


def _single_decode_fp8(q, k, v, kv_layout, passed, scales, return_lse):
    """``single_decode_with_kv_cache`` over fp8 ``k``, ``v`` (``passed``: its arguments the
    decode wrapper's plan takes, by name): the wrapper over a cache of one-token pages
    (``[kv_len, 1, Hkv, D]`` views of NHD ``k``, ``v``; HND ones are copied into NHD first),
    planned and run once; returns the batch of one's result."""
    _check_kv_layout(kv_layout)
    if kv_layout == "HND":
        k, v = A.swap01(k), A.swap01(v)
    if len(k.shape) != 3 or len(v.shape) != 3:
        raise ValueError(f"invalid k: has shape {tuple(k.shape)}; expected 3 dimensions")
    kv_len, num_kv_heads, head_dim = (int(n) for n in k.shape)
    pages = tuple(x.contiguous()[:, None] for x in (k, v))
    from .flashinfer import BatchDecodeWithPagedKVCacheWrapper

    w = BatchDecodeWithPagedKVCacheWrapper(q, "NHD")
    w.plan(
        [0, kv_len],
        list(range(kv_len)),
        [1],
        int(q.shape[0]),
        num_kv_heads,
        head_dim,
        1,
        q_data_type=q.dtype,
        kv_data_type=k.dtype,
        **passed,
    )
    k_scale, v_scale = scales
    return w.run(q[None], pages, k_scale=k_scale, v_scale=v_scale, return_lse=return_lse)
