"""The checks of bench/peers.py: the page table of a paged shape, the float64 reference, the
page gather, the check of a peer's output against the reference (over an fp8 cache: against the
reference on the dequantised cache), and the CPU self-test of them all (`python3 bench/peers.py
--self-test`). peers.py imports this module; this module imports neither peers.py nor torch
(torch is passed in, and so are the shape classes the self-test builds), so `peers.py --dry-run`
still runs without torch.
"""

import math

from peers_fp8 import dequantise, quantise

CHECK_REQUESTS = 3  # first, middle and last request of a batch
TOLERANCE = {"f16": 1e-2, "bf16": 3e-2}  # relative L2 error of o on the checked rows


# ----------------------------------------------------------------------------------------------
# Page table, reference, page gather and check (torch, float64)


def check_page_table(shape):
    """Raises ValueError unless a paged shape's page table (peers_shapes.PagedShape's fields)
    describes exactly its kv_lens, with every page id inside the cache."""
    name, ps, batch = shape.name, shape.page_size, len(shape.kv_lens)
    if ps < 1 or ps & (ps - 1):
        raise ValueError(f"shape {name!r}: page_size {ps} is not a power of two")
    indptr, indices, last = shape.kv_page_indptr, shape.kv_page_indices, shape.kv_last_page_len
    if len(indptr) != batch + 1 or indptr[0] != 0:
        raise ValueError(f"shape {name!r}: kv_page_indptr needs {batch + 1} entries from 0")
    if len(last) != batch:
        raise ValueError(f"shape {name!r}: kv_last_page_len needs {batch} entries")
    if len(indices) != indptr[-1]:
        raise ValueError(f"shape {name!r}: kv_page_indices has {len(indices)} ids, "
                         f"kv_page_indptr ends at {indptr[-1]}")
    bad = [p for p in indices if not 0 <= p < shape.num_pages]
    if bad:
        raise ValueError(f"shape {name!r}: page id {bad[0]} outside 0..{shape.num_pages}")
    for r in range(batch):
        pages = indptr[r + 1] - indptr[r]
        if pages < 0:
            raise ValueError(f"shape {name!r}: kv_page_indptr decreases at request {r}")
        lo = 1 if pages else 0
        if not lo <= last[r] <= (ps if pages else 0):
            raise ValueError(f"shape {name!r}: kv_last_page_len[{r}] = {last[r]} with "
                             f"{pages} pages of {ps}")
        kv_len = (pages - 1) * ps + last[r] if pages else 0
        if kv_len != shape.kv_lens[r]:
            raise ValueError(f"shape {name!r}: request {r} has {kv_len} keys in its pages "
                             f"but kv_lens[{r}] = {shape.kv_lens[r]}")


def reference_rows(torch, q, k, v, rows, shape):
    """Exact attention for the given query rows of one request: [len(rows), hq, d_vo] float64.

    q: [qo_len, hq, d_qk], k: [kv_len, hkv, d_qk], v: [kv_len, hkv, d_vo]. Query head h reads KV
    head h // group. Causal is bottom-right aligned: key j is visible to row i iff
    j <= i + (kv_len - qo_len). A row with no visible key gives o = 0."""
    group = shape.hq // shape.hkv
    qo_len, kv_len = q.shape[0], k.shape[0]
    row_idx = torch.tensor(rows, device=q.device, dtype=torch.long)
    qr = q.index_select(0, row_idx).double()
    kf = k.double().repeat_interleave(group, dim=1)
    vf = v.double().repeat_interleave(group, dim=1)
    s = torch.einsum("rhd,khd->hrk", qr, kf) * shape.sm_scale
    if shape.soft_cap:
        s = shape.soft_cap * torch.tanh(s / shape.soft_cap)
    if shape.causal:
        j = torch.arange(kv_len, device=q.device)
        visible = j[None, :] <= (row_idx + (kv_len - qo_len))[:, None]
        s = s.masked_fill(~visible[None, :, :], float("-inf"))
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)
    return torch.einsum("hrk,khd->rhd", p, vf)



def gather_pages(torch, cache, page_ids, kv_len):
    """The first kv_len tokens held by the pages page_ids of a paged cache ([num_pages,
    page_size, heads, d]), in order: [kv_len, heads, d]. Token j is at page page_ids[j //
    page_size], slot j % page_size. An fp8 cache is gathered as bytes (torch's index_select
    need not take fp8 dtypes) and given back in its dtype."""
    if cache.is_floating_point() and cache.element_size() == 1:
        return gather_pages(torch, cache.view(torch.uint8), page_ids, kv_len).view(cache.dtype)
    pages = torch.tensor(page_ids, dtype=torch.long, device=cache.device)
    return cache.index_select(0, pages).reshape(-1, *cache.shape[2:])[:kv_len]


def check_output(torch, shape, q, k, v, out, kv_scales=None):
    """(rel_err, None) when `out` ([total_qo, hq, d_vo]) matches the reference on the checked rows,
    (rel_err, reason) otherwise. k and v are the batch's K and V as the peer read them
    (contiguous, or the page caches of a paged shape: shape.request_kv finds each request's).
    kv_scales: (k_scale, v_scale) when k and v are fp8 codes; the reference then reads
    codes * scale."""
    reqs = shape.requests()
    picks = sorted({0, len(reqs) // 2, len(reqs) - 1})[:CHECK_REQUESTS]
    got_all, ref_all = [], []
    for r in picks:
        qs, ql, _, _ = reqs[r]
        rows = sorted({0, ql // 3, (2 * ql) // 3, ql - 1})
        kr, vr = shape.request_kv(k, v, r)
        if kv_scales is not None:
            kr, vr = dequantise(torch, kr, kv_scales[0]), dequantise(torch, vr, kv_scales[1])
        ref = reference_rows(torch, q[qs:qs + ql], kr, vr, rows, shape)
        idx = torch.tensor([qs + x for x in rows], device=out.device, dtype=torch.long)
        got_all.append(out.index_select(0, idx).double())
        ref_all.append(ref)
    got, ref = torch.cat(got_all), torch.cat(ref_all)
    if got.shape != ref.shape:
        return None, f"output shape {tuple(got.shape)} != reference {tuple(ref.shape)}"
    if not bool(torch.isfinite(got).all()):
        return None, "non-finite values in the output"
    rel = float(torch.linalg.vector_norm(got - ref) / torch.linalg.vector_norm(ref))
    if rel > TOLERANCE[shape.dtype]:
        return rel, f"relative L2 error {rel:.3e} > {TOLERANCE[shape.dtype]:.0e} on checked rows"
    return rel, None


# ----------------------------------------------------------------------------------------------
# Self-test (CPU)


def sdpa_f64(torch, q, k, v, causal, group):
    """torch's math SDPA in float64 on one request ([len, heads, d] in and out), causal mask
    bottom-right aligned; the self-test's independent route to the expected output."""
    qb = q.double().transpose(0, 1)
    kb = k.double().transpose(0, 1).repeat_interleave(group, 0)
    vb = v.double().transpose(0, 1).repeat_interleave(group, 0)
    mask = None
    if causal:
        ql, kl = q.shape[0], k.shape[0]
        mask = torch.arange(kl)[None, :] <= (torch.arange(ql) + (kl - ql))[:, None]
    o = torch.nn.functional.scaled_dot_product_attention(qb, kb, vb, attn_mask=mask)
    return o.transpose(0, 1)


def self_test_prefill(torch, shape_cls):
    """The reference against torch's math SDPA, and a soft-cap case by hand, on shapes of
    shape_cls (peers_shapes.Shape). Returns [ok...]."""
    results = []
    cases = [(32, 8, 64, True, [37], [37]), (4, 4, 64, False, [21], [21]),
             (8, 2, 128, True, [5, 40, 17], [5, 40, 17])]
    for hq, hkv, d, causal, qls, kls in cases:
        shape = shape_cls({"name": "t", "qo_lens": qls, "kv_lens": kls, "num_qo_heads": hq,
                       "num_kv_heads": hkv, "head_dim": d, "causal": causal, "dtype": "f16",
                       "soft_cap": None, "qk_accum": "f32", "flops": 1, "bytes": 1})
        q = torch.randn(sum(qls), hq, d, dtype=torch.float16)
        k = torch.randn(sum(kls), hkv, d, dtype=torch.float16)
        v = torch.randn(sum(kls), hkv, d, dtype=torch.float16)
        out = torch.cat([sdpa_f64(torch, q[qs:qs + ql], k[ks:ks + kl], v[ks:ks + kl], causal,
                                  hq // hkv)
                         for qs, ql, ks, kl in shape.requests()]).to(torch.float16)
        rel, problem = check_output(torch, shape, q, k, v, out)
        ok = problem is None and rel < 1e-3
        bad = out.clone()
        bad[:, 0, :] = bad[:, 0, :].flip(0)  # rows of head 0 permuted: must be caught
        _, caught = check_output(torch, shape, q, k, v, bad)
        ok = ok and caught is not None
        results.append(ok)
        print(f"self-test hq={hq} hkv={hkv} d={d} causal={causal} lens={qls}: rel={rel} "
              f"perturbed->{caught!r} {'PASS' if ok else 'FAIL'}")
    # Soft-cap: one query row, two keys, by hand.
    shape = shape_cls({"name": "cap", "qo_lens": [1], "kv_lens": [2], "num_qo_heads": 1,
                   "num_kv_heads": 1, "head_dim": 4, "causal": False, "dtype": "f16",
                   "soft_cap": 2.0, "qk_accum": "f32", "flops": 1, "bytes": 1})
    q = torch.tensor([[[4.0, 0.0, 0.0, 0.0]]])
    k = torch.tensor([[[3.0, 0.0, 0.0, 0.0]], [[0.0, 0.0, 0.0, 0.0]]])
    v = torch.tensor([[[1.0, 0.0, 0.0, 0.0]], [[0.0, 1.0, 0.0, 0.0]]])
    t0 = 2.0 * math.tanh(4.0 * 3.0 * 0.5 / 2.0)
    p0 = math.exp(t0) / (math.exp(t0) + 1.0)
    ref = reference_rows(torch, q, k, v, [0], shape)
    ok = abs(float(ref[0, 0, 0]) - p0) < 1e-12 and abs(float(ref[0, 0, 1]) - (1 - p0)) < 1e-12
    results.append(ok)
    print(f"self-test soft-cap by hand: {float(ref[0, 0, 0])} vs {p0} {'PASS' if ok else 'FAIL'}")
    return results


# A hand-written page table: 3 requests of 9, 4 and 6 keys in pages of 4 (ids shuffled, pages 1,
# 4, 6 and 8 unused), for the paged self-test.
SELF_TEST_TABLE = {"page_size": 4, "num_pages": 10, "kv_page_indptr": [0, 3, 4, 6],
                   "kv_page_indices": [7, 2, 9, 0, 5, 3], "kv_last_page_len": [1, 4, 2]}
SELF_TEST_KV_LENS = [9, 4, 6]


def self_test_paged_case(torch, paged_cls, label, qls, causal, hq, hkv, d):
    """One hand-written paged batch (SELF_TEST_TABLE): K/V scattered into the caches token by
    token by the contract's formula; the gather must give them back exactly; outputs computed on
    the contiguous K/V must pass the check, outputs computed from the pages in sorted order (a
    kernel that ignores the shuffle) must fail it."""
    table = SELF_TEST_TABLE
    shape = paged_cls({"name": label, "qo_lens": qls, "kv_lens": SELF_TEST_KV_LENS,
                        "num_qo_heads": hq, "num_kv_heads": hkv, "head_dim": d,
                        "causal": causal, "dtype": "f16", "soft_cap": None,
                        "qk_accum": "f32", "flops": 1, "bytes": 1, **table})
    ps, group = shape.page_size, hq // hkv
    k_cache = torch.randn(shape.num_pages, ps, hkv, d, dtype=torch.float16)
    v_cache = torch.randn(shape.num_pages, ps, hkv, d, dtype=torch.float16)
    q = torch.randn(sum(qls), hq, d, dtype=torch.float16)
    ks, vs = [], []
    for r, kl in enumerate(SELF_TEST_KV_LENS):
        ks.append(torch.randn(kl, hkv, d, dtype=torch.float16))
        vs.append(torch.randn(kl, hkv, d, dtype=torch.float16))
        for j in range(kl):
            page = table["kv_page_indices"][table["kv_page_indptr"][r] + j // ps]
            k_cache[page, j % ps] = ks[r][j]
            v_cache[page, j % ps] = vs[r][j]
    gather_ok = all(torch.equal(gk, ks[r]) and torch.equal(gv, vs[r]) for r, (gk, gv) in
                    enumerate(shape.request_kv(k_cache, v_cache, r) for r in range(len(qls))))

    def outputs(kv_of):
        return torch.cat([sdpa_f64(torch, q[qs:qs + ql], *kv_of(r), causal, group)
                          for r, (qs, ql, _, _) in enumerate(shape.requests())])

    def sorted_pages(r):
        ids = sorted(table["kv_page_indices"][table["kv_page_indptr"][r]:
                                              table["kv_page_indptr"][r + 1]])
        kl = SELF_TEST_KV_LENS[r]
        return k_cache[ids].reshape(-1, hkv, d)[:kl], v_cache[ids].reshape(-1, hkv, d)[:kl]

    out = outputs(lambda r: (ks[r], vs[r])).to(torch.float16)
    rel, problem = check_output(torch, shape, q, k_cache, v_cache, out)
    bad = outputs(sorted_pages).to(torch.float16)
    _, caught = check_output(torch, shape, q, k_cache, v_cache, bad)
    ok = gather_ok and problem is None and rel < 1e-3 and caught is not None \
        and shape.decode == (label == "decode")
    print(f"self-test paged {label} hq={hq} hkv={hkv} d={d} qo={qls}: gather "
          f"{'exact' if gather_ok else 'DIFFERS'}, rel={rel}, sorted pages->{caught!r} "
          f"{'PASS' if ok else 'FAIL'}")
    return ok


def self_test_paged_fp8(torch, paged_cls):
    """A decode batch over an e4m3 cache (SELF_TEST_TABLE), quantised by peers_fp8.quantise: the
    gather must give back the codes written at each token's page and slot; outputs computed on
    the dequantised K/V must pass the check; outputs computed on the K/V before quantisation
    (about 3% away), and the check of the right outputs without the scales, must fail."""
    table, hq, hkv, d = SELF_TEST_TABLE, 8, 2, 64
    shape = paged_cls({"name": "fp8", "qo_lens": [1, 1, 1], "kv_lens": SELF_TEST_KV_LENS,
                       "num_qo_heads": hq, "num_kv_heads": hkv, "head_dim": d,
                       "causal": False, "dtype": "f16", "soft_cap": None, "qk_accum": "f32",
                       "flops": 1, "bytes": 1, "kv_dtype": "e4m3", **table})
    ps, group = shape.page_size, hq // hkv
    size = (shape.num_pages, ps, hkv, d)
    k_f16, v_f16 = torch.randn(*size, dtype=torch.float16), torch.randn(*size, dtype=torch.float16)
    (k_codes, k_scale), (v_codes, v_scale) = quantise(torch, k_f16, "e4m3"), \
        quantise(torch, v_f16, "e4m3")
    k_deq, v_deq = dequantise(torch, k_codes, k_scale), dequantise(torch, v_codes, v_scale)
    q = torch.randn(len(SELF_TEST_KV_LENS), hq, d, dtype=torch.float16)

    def by_hand(cache, r):
        """Request r's tokens of a cache, token by token by the contract's formula."""
        ids = table["kv_page_indices"][table["kv_page_indptr"][r]:table["kv_page_indptr"][r + 1]]
        return torch.stack([cache[ids[j // ps], j % ps] for j in range(SELF_TEST_KV_LENS[r])])

    gather_ok = all(
        torch.equal(dequantise(torch, gk, k_scale), by_hand(k_deq, r))
        and torch.equal(dequantise(torch, gv, v_scale), by_hand(v_deq, r))
        and gk.dtype == k_codes.dtype
        for r, (gk, gv) in enumerate(shape.request_kv(k_codes, v_codes, r)
                                     for r in range(len(SELF_TEST_KV_LENS))))

    def outputs(k_cache, v_cache):
        return torch.cat([sdpa_f64(torch, q[r:r + 1], by_hand(k_cache, r), by_hand(v_cache, r),
                                   False, group) for r in range(len(SELF_TEST_KV_LENS))])

    scales = (k_scale, v_scale)
    out = outputs(k_deq, v_deq).to(torch.float16)
    rel, problem = check_output(torch, shape, q, k_codes, v_codes, out, scales)
    before = outputs(k_f16.double(), v_f16.double()).to(torch.float16)
    rel_before, caught_before = check_output(torch, shape, q, k_codes, v_codes, before, scales)
    _, caught_unscaled = check_output(torch, shape, q, k_codes, v_codes, out)
    ok = gather_ok and problem is None and rel < 1e-3 and caught_before is not None \
        and caught_unscaled is not None
    print(f"self-test paged fp8 e4m3 hq={hq} hkv={hkv} d={d}: gather "
          f"{'exact' if gather_ok else 'DIFFERS'}, rel={rel}, before quantisation->"
          f"{rel_before} {'caught' if caught_before else 'NOT CAUGHT'}, without scales->"
          f"{'caught' if caught_unscaled else 'NOT CAUGHT'} {'PASS' if ok else 'FAIL'}")
    return ok


def self_test_paged(torch, paged_cls):
    """Paged batches (self_test_paged_case), bad page tables refused, and JIT probes that are
    valid paged shapes of the same kind, on shapes of paged_cls (peers_shapes.PagedShape). Returns
    [ok...]."""
    results = [self_test_paged_case(torch, paged_cls, *case) for case in [
        ("prefill causal", [3, 1, 6], True, 4, 2, 16),
        ("prefill non-causal", [2, 4, 6], False, 4, 4, 32),
        ("decode", [1, 1, 1], False, 8, 2, 16)]]
    results.append(self_test_paged_fp8(torch, paged_cls))
    base = {"name": "bad", "qo_lens": [1, 1, 1], "kv_lens": SELF_TEST_KV_LENS,
            "num_qo_heads": 2, "num_kv_heads": 1, "head_dim": 16, "causal": False,
            "dtype": "bf16", "soft_cap": None, "qk_accum": "f32", "flops": 1, "bytes": 1,
            **SELF_TEST_TABLE}
    bad_tables = {"last page too short": {"kv_last_page_len": [2, 4, 2]},
                  "page id outside": {"kv_page_indices": [7, 2, 10, 0, 5, 3]},
                  "page_size not a power of two": {"page_size": 3},
                  "indptr too short": {"kv_page_indptr": [0, 3, 6]},
                  "kv_dtype not an fp8 format": {"kv_dtype": "e3m4"}}
    for label, change in bad_tables.items():
        try:
            paged_cls({**base, **change})
            why = None
        except ValueError as exc:
            why = str(exc)
        results.append(why is not None)
        print(f"self-test paged table refused ({label}): {why!r} "
              f"{'PASS' if why is not None else 'FAIL'}")
    probes_ok = True
    for ps, kv_dtype in ((1, None), (16, None), (16, "e4m3")):
        for qls, causal in (([1, 1, 1], False), ([3, 1, 6], True)):
            obj = {**base, "qo_lens": qls, "causal": causal, "page_size": ps,
                   "kv_lens": [(pages - 1) * ps + 1 for pages in (3, 1, 2)],
                   "kv_last_page_len": [1, 1, 1], "kv_dtype": kv_dtype}
            shape, probe = paged_cls(obj), paged_cls(obj).probe()
            probes_ok = probes_ok and probe.decode == shape.decode \
                and probe.kv_dtype == shape.kv_dtype
    results.append(probes_ok)
    print(f"self-test paged probes valid, of the same kind and cache dtype: "
          f"{'PASS' if probes_ok else 'FAIL'}")
    return results


def self_test(torch, shape_cls, paged_cls):
    """CPU checks (no GPU): the reference, the page gather and the paged shape checks, on shapes
    of peers.py's classes (shape_cls: Shape, paged_cls: PagedShape). True when all pass."""
    torch.manual_seed(0)
    results = self_test_prefill(torch, shape_cls) + self_test_paged(torch, paged_cls)
    failed = results.count(False)
    print(f"{len(results) - failed} passed, {failed} failed")
    return failed == 0
