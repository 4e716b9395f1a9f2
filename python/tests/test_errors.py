"""Unsupported arguments raise NotImplementedError naming them; bad input raises ValueError or
TypeError carrying the Rust error's message, before anything runs."""

import attnforge.flashinfer as fi
import numpy as np
import pytest

rng = np.random.default_rng()


def qkv(qo=8, kv=16, hq=4, hkv=2, d=64, dtype=np.float16):
    return (
        rng.standard_normal((qo, hq, d)).astype(dtype),
        rng.standard_normal((kv, hkv, d)).astype(dtype),
        rng.standard_normal((kv, hkv, d)).astype(dtype),
    )


@pytest.mark.parametrize(
    "kwargs,name",
    [
        ({"pos_encoding_mode": "ROPE_LLAMA"}, "pos_encoding_mode"),
        ({"rope_theta": 1e4}, "rope_theta"),
        ({"rope_scale": 1.0}, "rope_scale"),
        ({"scale_q": np.ones(4, np.float32)}, "scale_q"),
        ({"o_dtype": "float32"}, "o_dtype"),
        ({"backend": "trtllm-gen"}, "backend"),
        ({"pos_encoding_mode": "ALIBI", "logits_soft_cap": 30.0}, "logits_soft_cap"),
    ],
)
def test_single_prefill_refuses(kwargs, name):
    q, k, v = qkv()
    with pytest.raises(NotImplementedError, match=name):
        fi.single_prefill_with_kv_cache(q, k, v, **kwargs)


def test_wrappers_refuse():
    ws = np.empty(1, np.uint8)
    with pytest.raises(ValueError, match="qo_indptr_buf"):
        fi.BatchPrefillWithRaggedKVCacheWrapper(ws, "NHD", use_cuda_graph=True)
    w = fi.BatchPrefillWithRaggedKVCacheWrapper(ws)
    with pytest.raises(NotImplementedError, match="kv_data_type"):
        w.plan([0, 8], [0, 16], 4, 2, 64, q_data_type="float16", kv_data_type="bfloat16")
    # numpy's scalar types name dtypes as their dtypes and strings do.
    with pytest.raises(NotImplementedError, match="kv_data_type"):
        w.plan([0, 8], [0, 16], 4, 2, 64, q_data_type=np.float16, kv_data_type=np.float64)
    w.plan([0, 8], [0, 16], 4, 2, 64, q_data_type=np.float16, kv_data_type=np.dtype("float16"))
    with pytest.raises(NotImplementedError, match="pos_encoding_mode"):
        w.plan([0, 8], [0, 16], 4, 2, 64, pos_encoding_mode="ROPE_LLAMA")
    with pytest.raises(NotImplementedError, match="logits_soft_cap"):
        w.plan([0, 8], [0, 16], 4, 2, 64, pos_encoding_mode="ALIBI", logits_soft_cap=30.0)
    with pytest.raises(NotImplementedError, match="fixed_split_size"):
        w.plan([0, 8], [0, 16], 4, 2, 64, fixed_split_size=128)
    w.plan([0, 8], [0, 16], 4, 2, 64)
    q, k, v = qkv()
    with pytest.raises(NotImplementedError, match="enable_pdl"):
        w.run(q, k, v, enable_pdl=True)
    d = fi.BatchDecodeWithPagedKVCacheWrapper(ws)
    d.plan([0, 1], [0], [4], 4, 2, 64, 16)
    cache = rng.standard_normal((1, 2, 16, 2, 64)).astype(np.float16)
    with pytest.raises(ValueError, match="sinks"):
        d.run(q[:1], cache, sinks=np.zeros(3, np.float32))
    capped = fi.BatchDecodeWithPagedKVCacheWrapper(ws)
    capped.plan([0, 1], [0], [4], 4, 2, 64, 16, logits_soft_cap=30.0)
    with pytest.raises(NotImplementedError, match="sinks"):
        capped.run(q[:1], cache, sinks=np.zeros(4, np.float32))
    with pytest.raises(NotImplementedError, match="window_left"):
        d.run(q[:1], cache, window_left=3)


def test_bad_input_messages():
    q, k, v = qkv()
    # Head dim 48 is not among the kernels' head dims: the problem model's message comes through.
    with pytest.raises(ValueError, match="head_dim"):
        fi.single_prefill_with_kv_cache(q[..., :48], k[..., :48], v[..., :48])
    # GQA: 3 KV heads do not divide 4 query heads.
    k3 = rng.standard_normal((16, 3, 64)).astype(np.float16)
    with pytest.raises(ValueError, match="num_kv_heads"):
        fi.single_prefill_with_kv_cache(q, k3, k3)
    with pytest.raises(ValueError, match="dtype"):
        fi.single_prefill_with_kv_cache(q, k.astype(np.float32), v)
    with pytest.raises(ValueError, match="float64"):
        fi.single_prefill_with_kv_cache(q.astype(np.float64), k, v)
    with pytest.raises(TypeError, match="numpy array or a torch tensor"):
        fi.single_prefill_with_kv_cache(q.tolist(), k, v)
    with pytest.raises(ValueError, match="kv_layout"):
        fi.single_prefill_with_kv_cache(q, k, v, kv_layout="NDH")
    # Found by random bad input: a zero head dim without sm_scale (whose default divides by its
    # square root) and ALiBi over zero query heads raised ZeroDivisionError / a bare "math domain
    # error".
    with pytest.raises(ValueError, match="head_dim"):
        fi.single_prefill_with_kv_cache(q[..., :0], k[..., :0], v[..., :0])
    empty = np.zeros((8, 0, 64), np.float16)
    with pytest.raises(ValueError, match="num_qo_heads"):
        fi.single_prefill_with_kv_cache(empty, empty, empty, pos_encoding_mode="ALIBI")


def test_bad_tables():
    ws = np.empty(1, np.uint8)
    w = fi.BatchPrefillWithRaggedKVCacheWrapper(ws)
    with pytest.raises(ValueError, match="kv_indptr"):
        w.plan([0, 4, 8], [0, 10, 5], 4, 2, 64)
    # A window without causal=True becomes a custom mask, built before the native plan checks
    # the tables: indptr lists of different lengths or that decrease raised IndexError or numpy's
    # "negative dimensions" there.
    with pytest.raises(ValueError, match="kv_indptr"):
        w.plan([0, 4, 8], [0, 10], 4, 2, 64, window_left=2)
    with pytest.raises(ValueError, match=r"qo_indptr\[2\]"):
        w.plan([0, 4, 3], [0, 10, 16], 4, 2, 64, window_left=2)
    with pytest.raises(ValueError, match="custom_mask|kv_indptr"):
        w.plan([0, 4, 8], [0, 10], 4, 2, 64, custom_mask=np.ones(40, bool))
    w.plan([0, 4, 8], [0, 10, 16], 4, 2, 64)
    q, k, v = qkv()
    with pytest.raises(ValueError, match="k"):
        w.run(q, k[:15], v[:15])
    p = fi.BatchPrefillWithPagedKVCacheWrapper(ws)
    p.plan([0, 8], [0, 2], [0, 5], [16], 4, 2, 64, 16)
    cache = rng.standard_normal((3, 2, 16, 2, 64)).astype(np.float16)
    with pytest.raises(ValueError, match="kv_page_indices"):
        p.run(q, cache)
    with pytest.raises(ValueError, match="kv_last_page_len"):
        p.plan([0, 8], [0, 2], [0, 1], [17], 4, 2, 64, 16)
    with pytest.raises(RuntimeError, match="plan"):
        fi.BatchDecodeWithPagedKVCacheWrapper(ws).run(q[:1], cache)


def test_merge_rejects_nan_lse():
    v = rng.standard_normal((3, 2, 64)).astype(np.float16)
    s = np.zeros((3, 2), np.float32)
    bad = s.copy()
    bad[1, 1] = np.nan
    with pytest.raises(ValueError, match="lse"):
        fi.merge_state(v, s, v, bad)
    with pytest.raises(ValueError, match="float32"):
        fi.merge_state(v, s.astype(np.float16), v, s)


def test_cuda_graph_decode_wrapper_needs_consistent_buffers():
    ws = np.empty(1, np.uint8)
    idx = np.zeros(4, np.int32)
    with pytest.raises(ValueError, match="paged_kv_indptr_buffer"):
        fi.CUDAGraphBatchDecodeWithPagedKVCacheWrapper(ws, idx, idx, idx)
    with pytest.raises(TypeError, match="fast_decode_plan"):
        fi.fast_decode_plan(object(), idx, idx, idx, 1, 1, 64, 1)


def test_paged_split_choices():
    """The paged wrappers take FlashInfer's KV-split arguments (the ragged one refuses them,
    above); bad values are ValueErrors naming them, and the results do not depend on them."""
    from attnforge._wrapper import _split_choice

    call = {"page_size": 16, "fixed_split_size": None, "disable_split_kv": False}
    assert _split_choice(call) == {}
    assert _split_choice(dict(call, disable_split_kv=True)) == {"unsplit": True}
    # pages -> keys, rounded up to a multiple of the 64-key tile
    assert _split_choice(dict(call, fixed_split_size=4)) == {"chunk_keys": 64}
    assert _split_choice(dict(call, fixed_split_size=5)) == {"chunk_keys": 128}
    assert _split_choice(dict(call, fixed_split_size=np.int64(8))) == {"chunk_keys": 128}
    ws = np.empty(1, np.uint8)
    cache = rng.standard_normal((2, 2, 16, 2, 64)).astype(np.float16)
    q = rng.standard_normal((1, 4, 64)).astype(np.float16)
    outs = []
    for kwargs in ({}, {"disable_split_kv": True}, {"fixed_split_size": 1}):
        d = fi.BatchDecodeWithPagedKVCacheWrapper(ws)
        d.plan([0, 2], [0, 1], [4], 4, 2, 64, 16, **kwargs)
        outs.append(d.run(q, cache))
    for o in outs[1:]:
        np.testing.assert_array_equal(o, outs[0])
    d = fi.BatchDecodeWithPagedKVCacheWrapper(ws)
    for bad in (0, -2, 1.5, True, "4"):
        with pytest.raises(ValueError, match="fixed_split_size"):
            d.plan([0, 2], [0, 1], [4], 4, 2, 64, 16, fixed_split_size=bad)
    with pytest.raises(ValueError, match="disable_split_kv"):
        d.plan([0, 2], [0, 1], [4], 4, 2, 64, 16, fixed_split_size=2, disable_split_kv=True)
    p = fi.BatchPrefillWithPagedKVCacheWrapper(ws)
    p.plan([0, 1], [0, 2], [0, 1], [4], 4, 2, 64, 16, fixed_split_size=2)
