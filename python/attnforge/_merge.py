"""FlashInfer's ``merge_state``, ``merge_state_in_place`` and ``merge_states`` (attention states
over disjoint key sets merged into one), re-exported by ``attnforge.flashinfer``. LSEs are base
2 here, as FlashInfer's; the native module takes natural logs."""

from . import _arrays as A
from . import _native


def _lse_to_natural(s):
    return s * A.LN2


def _check_f32_lse(name, s):
    if str(getattr(s, "dtype", "")).replace("torch.", "") != "float32":
        raise ValueError(f"invalid {name}: has dtype {getattr(s, 'dtype', None)}; expected float32")


def merge_state(v_a, s_a, v_b, s_b):
    """Merges two attention states over disjoint key sets: ``v [seq, heads, dim]``,
    ``s [seq, heads]`` (float32, base-2 LSE). Returns ``(v, s)``."""
    for name, s in (("s_a", s_a), ("s_b", s_b)):
        _check_f32_lse(name, s)
    v_out = A.empty(v_a, v_a.shape)
    s_out = A.empty(v_a, s_a.shape, float32=True)
    # The natural-log copies stay referenced until the call returns.
    ln_a, ln_b = _lse_to_natural(s_a), _lse_to_natural(s_b)
    _native.merge_state(
        v_a, ln_a, v_b, ln_b, v_out, s_out, A.current_stream(A.device_of(v_a))
    )
    s_out *= A.LOG2E
    return v_out, s_out


def merge_state_in_place(v, s, v_other, s_other, mask=None):
    """Merges ``(v_other, s_other)`` into ``(v, s)`` in place; with ``mask`` (bool
    ``[seq]``), only the rows where it is true."""
    v_new, s_new = merge_state(v, s, v_other, s_other)
    A.copy_into(v, v_new, mask)
    A.copy_into(s, s_new, mask)


def merge_states(v, s):
    """Merges the states stored together in ``v [seq, num_states, heads, dim]``,
    ``s [seq, num_states, heads]`` (float32, base 2). Returns ``(v, s)``."""
    _check_f32_lse("s", s)
    if len(v.shape) != 4:
        raise ValueError(f"invalid v: has shape {tuple(v.shape)}; expected 4 dimensions")
    seq, _, heads, dim = v.shape
    v_out = A.empty(v, (seq, heads, dim))
    s_out = A.empty(v, (seq, heads), float32=True)
    ln_s = _lse_to_natural(s)  # referenced until the call returns
    _native.merge_states(v, ln_s, v_out, s_out, A.current_stream(A.device_of(v)))
    s_out *= A.LOG2E
    return v_out, s_out
