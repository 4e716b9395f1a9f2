"""CPU torch tensors through the same functions: results come back as torch tensors, bf16
included. Skipped where torch is not installed (the GPU machine has it)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import attnforge.flashinfer as fi  # noqa: E402

from reference import attention  # noqa: E402


def test_single_prefill_bf16_hnd():
    q = torch.randn(21, 8, 128, dtype=torch.bfloat16)
    k = torch.randn(2, 40, 128, dtype=torch.bfloat16)
    v = torch.randn(2, 40, 128, dtype=torch.bfloat16)
    o, lse = fi.single_prefill_with_kv_cache(q, k, v, causal=True, kv_layout="HND", return_lse=True)
    assert isinstance(o, torch.Tensor) and o.dtype == torch.bfloat16 and lse.dtype == torch.float32
    nhd = [x.transpose(0, 1).float().numpy() for x in (k, v)]
    want_o, want_lse = attention(q.float().numpy(), *nhd, causal=True)
    np.testing.assert_allclose(o.float().numpy(), want_o, atol=3e-2, rtol=3e-2)
    np.testing.assert_allclose(lse.numpy(), want_lse, atol=1e-3, rtol=1e-3)


def test_decode_tuple_cache():
    batch, page_size, h, d = 3, 16, 4, 64
    k_cache = torch.randn(6, page_size, h, d, dtype=torch.float16)
    v_cache = torch.randn(6, page_size, h, d, dtype=torch.float16)
    indptr = torch.tensor([0, 2, 3, 5], dtype=torch.int32)
    indices = torch.tensor([5, 0, 3, 1, 2], dtype=torch.int32)
    last = torch.tensor([7, 16, 1], dtype=torch.int32)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(torch.empty(1, dtype=torch.uint8))
    w.plan(indptr, indices, last, h, h, d, page_size, q_data_type=torch.float16)
    q = torch.randn(batch, h, d, dtype=torch.float16)
    out = torch.empty(batch, h, d, dtype=torch.float16)
    o = w.run(q, (k_cache, v_cache), out=out)
    assert o is out
    for r in range(batch):
        pages = indices[indptr[r] : indptr[r + 1]].tolist()
        n = (len(pages) - 1) * page_size + int(last[r])
        k = torch.cat([k_cache[p] for p in pages])[:n].float().numpy()
        v = torch.cat([v_cache[p] for p in pages])[:n].float().numpy()
        want, _ = attention(q[r : r + 1].float().numpy(), k, v)
        np.testing.assert_allclose(o[r : r + 1].float().numpy(), want, atol=2e-2, rtol=2e-2)
