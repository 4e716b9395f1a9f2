//! The paged KV cache (host side): paged attention equals ragged attention on the gathered K/V and
//! the reference on independently built contiguous tensors, for shuffled page tables, page sizes
//! 1, 16, 64, random powers of two and other sizes (5, 12, any up to the maximum), NHD and HND,
//! separate and combined K/V; append then gather equals the old tokens followed by the new ones;
//! every validation path names its field; random garbage tables are errors, never panics.

use attnforge::cpu;
use attnforge::dtype::DType;
use attnforge::paged::{
    append_paged_kv, gather, KvOrder, KvStorage, PageTable, PagedAttention, PagedKv, PagedKvLayout,
    MAX_PAGE_SIZE,
};
use attnforge::problem::{AttentionProblem, HeadDims, InvalidProblem, Variant};
use attnforge::reference;
use attnforge::tensor::HostTensor;
use attnforge::testing::grid::VariantSpec;
use attnforge::testing::rng::SplitMix64;
use proptest::prelude::*;
use support::paged::{
    cache_mut, cache_ref, check_cache, gather_cache, page_spec, paged_setup, storage_buffers,
    PageSpec,
};
use support::Axes;

mod support;

/// Proptest cases per property (each runs the f64 reference on a small batch).
const PROPTEST_CASES: u32 = 128;

/// The address of (page, slot, head, e) written out from `docs/semantics.md`, independently of
/// `PagedKvLayout::k_index` / `v_index`.
fn doc_index(l: &PagedKvLayout, is_k: bool, page: usize, slot: usize, h: usize, e: usize) -> usize {
    let (ps, hk) = (l.page_size, l.num_kv_heads);
    let d = if is_k {
        l.head_dims.qk()
    } else {
        l.head_dims.vo()
    };
    match (l.storage, l.order) {
        (KvStorage::Separate, KvOrder::Nhd) => ((page * ps + slot) * hk + h) * d + e,
        (KvStorage::Separate, KvOrder::Hnd) => ((page * hk + h) * ps + slot) * d + e,
        (KvStorage::Combined, KvOrder::Nhd) => {
            (((page * 2 + usize::from(!is_k)) * ps + slot) * hk + h) * d + e
        }
        (KvStorage::Combined, KvOrder::Hnd) => {
            (((page * 2 + usize::from(!is_k)) * hk + h) * ps + slot) * d + e
        }
    }
}

/// Cache buffers (as f32 values, NaN everywhere no token lives) holding the contiguous `k`, `v`
/// of `kv_lens` tokens per request at the places `table` gives, scattered with [`doc_index`].
/// Returns one buffer per storage half (one for combined storage).
fn scatter(l: &PagedKvLayout, table: &PageTable, k: &[f32], v: &[f32]) -> Vec<Vec<f32>> {
    let (hk, dqk, dvo) = (l.num_kv_heads, l.head_dims.qk(), l.head_dims.vo());
    let mut bufs = storage_buffers(l, |n| vec![f32::NAN; n]);
    let v_buf = bufs.len() - 1;
    let mut token = 0;
    for r in 0..table.batch_size() {
        for j in 0..table.kv_len(r, l.page_size) {
            let page = table.kv_page_indices[table.kv_page_indptr[r] as usize + j / l.page_size];
            let slot = j % l.page_size;
            for h in 0..hk {
                for e in 0..dqk {
                    bufs[0][doc_index(l, true, page as usize, slot, h, e)] =
                        k[(token * hk + h) * dqk + e];
                }
                for e in 0..dvo {
                    bufs[v_buf][doc_index(l, false, page as usize, slot, h, e)] =
                        v[(token * hk + h) * dvo + e];
                }
            }
            token += 1;
        }
    }
    bufs
}

fn tensors(dtype: DType, bufs: &[Vec<f32>]) -> Vec<HostTensor> {
    bufs.iter()
        .map(|b| HostTensor::from_f32(dtype, b))
        .collect()
}

/// Random paged problems (decode-like and small prefill batches) over every page geometry.
fn spec() -> impl Strategy<Value = PageSpec> {
    let page_sizes = prop_oneof![
        Just(1usize),
        Just(16),
        Just(64),
        (0u32..=8).prop_map(|k| 1usize << k),
        Just(5),
        Just(12),
        1usize..=MAX_PAGE_SIZE,
    ];
    let variants = prop_oneof![
        Just(VariantSpec::None),
        Just(VariantSpec::SoftCap(2.0)),
        Just(VariantSpec::Alibi),
        Just(VariantSpec::Sinks),
        Just(VariantSpec::CustomCpuOnly),
    ];
    // Decode-like (one query) and small prefill requests; zero-key requests included.
    let lens = prop::collection::vec((prop_oneof![Just(1usize), 0usize..6], 0usize..150), 1..5);
    let axes = Axes {
        max_window: 20,
        variants: variants.boxed(),
        groups: vec![1, 4, 8],
        lens: lens.boxed(),
    };
    page_spec(axes, page_sizes)
}

/// Builds the case, scatters its K/V into the pages and checks them; `Err` describes a failure.
fn check(s: &PageSpec) -> Result<(), String> {
    let case = s.case();
    let bufs = tensors(
        s.point.config.dtype,
        &scatter(
            &case.layout,
            &case.table,
            &case.k.to_f32_vec(),
            &case.v.to_f32_vec(),
        ),
    );
    check_cache(&case, cache_ref(&bufs), (&case.k, &case.v))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: PROPTEST_CASES, ..ProptestConfig::default() })]

    #[test]
    fn paged_equals_ragged_and_reference(s in spec()) {
        if let Err(e) = check(&s) {
            prop_assert!(false, "{e}\n{s:?}");
        }
    }

    #[test]
    fn append_then_gather_is_old_then_new(
        lens in prop::collection::vec((0usize..40, 0usize..20), 1..5),
        page_size in prop_oneof![(0u32..=6).prop_map(|k| 1usize << k), Just(5), 1usize..=40],
        hnd in any::<bool>(),
        combined in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let dims = HeadDims::equal(64).unwrap();
        let (hk, d) = (2, 64);
        let order = if hnd { KvOrder::Hnd } else { KvOrder::Nhd };
        let storage = if combined { KvStorage::Combined } else { KvStorage::Separate };
        let totals: Vec<usize> = lens.iter().map(|&(old, new)| old + new).collect();
        let shape = PagedKvLayout {
            num_pages: 0,
            page_size,
            num_kv_heads: hk,
            head_dims: dims,
            order,
            storage,
            dtype: DType::F16,
        };
        let (layout, table) = paged_setup(&totals, shape, seed);
        let mut rng = SplitMix64::with_salt(seed, 0xa99e);
        let mut draw = |n: usize| -> Vec<f32> { (0..n).map(|_| rng.normal() as f32).collect() };
        let row = hk * d;
        let (mut old_k, mut old_v, mut new_k, mut new_v) = (vec![], vec![], vec![], vec![]);
        let (mut want_k, mut want_v) = (vec![], vec![]);
        let mut append_indptr = vec![0i32];
        for &(old, new) in &lens {
            let (ok, ov, nk, nv) = (draw(old * row), draw(old * row), draw(new * row), draw(new * row));
            want_k.extend_from_slice(&ok);
            want_k.extend_from_slice(&nk);
            want_v.extend_from_slice(&ov);
            want_v.extend_from_slice(&nv);
            // The old tokens sit where the table puts them; the new ones' slots stay NaN for now.
            old_k.extend_from_slice(&ok);
            old_k.extend(std::iter::repeat_n(f32::NAN, new * row));
            old_v.extend_from_slice(&ov);
            old_v.extend(std::iter::repeat_n(f32::NAN, new * row));
            new_k.extend(nk);
            new_v.extend(nv);
            append_indptr.push(append_indptr.last().unwrap() + new as i32);
        }
        let mut bufs = tensors(DType::F16, &scatter(&layout, &table, &old_k, &old_v));
        let (new_k, new_v) = (HostTensor::from_f32(DType::F16, &new_k), HostTensor::from_f32(DType::F16, &new_v));
        append_paged_kv(&layout, &table, &append_indptr, &new_k, &new_v, cache_mut(&mut bufs)).unwrap();
        let (gk, gv) = gather(&layout, &table, cache_ref(&bufs)).unwrap();
        prop_assert_eq!(gk, HostTensor::from_f32(DType::F16, &want_k));
        prop_assert_eq!(gv, HostTensor::from_f32(DType::F16, &want_v));
    }

    /// Arbitrary tables: gather and append either succeed or return an error; never a panic.
    #[test]
    fn garbage_tables_are_errors_not_panics(
        indptr in prop::collection::vec(-3i32..12, 0..6),
        indices in prop::collection::vec(-3i32..8, 0..12),
        last in prop::collection::vec(-2i32..6, 0..6),
        append in prop::collection::vec(-2i32..12, 0..6),
        page_size in prop_oneof![Just(0usize), Just(3), (0u32..=3).prop_map(|k| 1usize << k)],
        num_pages in 0usize..6,
    ) {
        let layout = PagedKvLayout {
            num_pages,
            page_size,
            num_kv_heads: 1,
            head_dims: HeadDims::equal(64).unwrap(),
            order: KvOrder::Nhd,
            storage: KvStorage::Combined,
            dtype: DType::F32,
        };
        let table = PageTable { kv_page_indptr: indptr, kv_page_indices: indices, kv_last_page_len: last };
        let len = num_pages * 2 * page_size * 64;
        let mut buf = vec![HostTensor::F32(vec![1.0; len])];
        let ok = gather(&layout, &table, cache_ref(&buf)).is_ok();
        let new = HostTensor::F32(vec![1.0; 12 * 64]);
        let appended = append_paged_kv(&layout, &table, &append, &new, &new, cache_mut(&mut buf));
        if appended.is_ok() {
            prop_assert!(ok, "append accepted a table that gather rejected");
        }
    }
}

// ---- Validation: every error path names its field. ----

fn small() -> (PagedKvLayout, PageTable) {
    // Request 0: 20 keys in pages [3, 0]; request 1: none; request 2: 5 keys in page [2].
    let layout = PagedKvLayout {
        num_pages: 4,
        page_size: 16,
        num_kv_heads: 2,
        head_dims: HeadDims::equal(64).unwrap(),
        order: KvOrder::Nhd,
        storage: KvStorage::Separate,
        dtype: DType::F16,
    };
    let table = PageTable::from_kv_lens(&[20, 0, 5], 16, &[3, 0, 2]).unwrap();
    (layout, table)
}

fn small_bufs(l: &PagedKvLayout) -> Vec<HostTensor> {
    vec![
        HostTensor::from_f32(l.dtype, &vec![0.5; l.k_buffer_len()]),
        HostTensor::from_f32(l.dtype, &vec![0.25; l.v_buffer_len()]),
    ]
}

fn expect_gather(l: &PagedKvLayout, t: &PageTable, field: &str) -> InvalidProblem {
    let bufs = small_bufs(&small().0);
    let err = gather(l, t, cache_ref(&bufs)).unwrap_err();
    assert_eq!(err.field, field, "{err}");
    err
}

#[test]
fn layout_errors() {
    let (l, t) = small();
    for bad in [0, MAX_PAGE_SIZE + 1, 512] {
        expect_gather(
            &PagedKvLayout {
                page_size: bad,
                ..l
            },
            &t,
            "page_size",
        );
    }
    expect_gather(
        &PagedKvLayout {
            num_kv_heads: 0,
            ..l
        },
        &t,
        "num_kv_heads",
    );
    let uneven = PagedKvLayout {
        head_dims: HeadDims::new(192, 128).unwrap(),
        storage: KvStorage::Combined,
        ..l
    };
    expect_gather(&uneven, &t, "kv_storage");
    let huge = PagedKvLayout {
        num_kv_heads: usize::MAX / 2,
        ..l
    };
    expect_gather(&huge, &t, "num_pages");
    expect_gather(&PagedKvLayout { num_pages: 5, ..l }, &t, "k_cache");
    expect_gather(
        &PagedKvLayout {
            dtype: DType::Bf16,
            ..l
        },
        &t,
        "k_cache",
    );
    let combined = PagedKvLayout {
        storage: KvStorage::Combined,
        ..l
    };
    let err = expect_gather(&combined, &t, "kv_cache");
    assert!(err.reason.contains("combined"), "{err}");
    // V too small: separate buffers of the wrong sizes.
    let bufs = small_bufs(&l);
    let short_v = HostTensor::from_f32(DType::F16, &[0.0; 8]);
    let err = gather(
        &l,
        &t,
        PagedKv::Separate {
            k: &bufs[0],
            v: &short_v,
        },
    )
    .unwrap_err();
    assert_eq!(err.field, "v_cache", "{err}");
}

#[test]
fn table_errors() {
    let (l, t) = small();
    gather(&l, &t, cache_ref(&small_bufs(&l))).unwrap();

    let mut bad = t.clone();
    bad.kv_page_indptr = vec![0];
    expect_gather(&l, &bad, "kv_page_indptr");
    let mut bad = t.clone();
    bad.kv_page_indptr[0] = 1;
    expect_gather(&l, &bad, "kv_page_indptr[0]");
    let mut bad = t.clone();
    bad.kv_page_indptr = vec![0, 2, 1, 3];
    let err = expect_gather(&l, &bad, "kv_page_indptr[2]");
    assert!(err.reason.contains("request 1"), "{err}");
    let mut bad = t.clone();
    bad.kv_page_indices.push(1);
    expect_gather(&l, &bad, "kv_page_indices");
    let mut bad = t.clone();
    bad.kv_page_indices[2] = 4;
    let err = expect_gather(&l, &bad, "kv_page_indices[2]");
    assert!(
        err.reason.contains("request 2") && err.reason.contains('4'),
        "{err}"
    );
    let mut bad = t.clone();
    bad.kv_page_indices[1] = -1;
    let err = expect_gather(&l, &bad, "kv_page_indices[1]");
    assert!(err.reason.contains("request 0"), "{err}");
    let mut bad = t.clone();
    bad.kv_last_page_len.pop();
    expect_gather(&l, &bad, "kv_last_page_len");
    for (r, value) in [(0, 0), (0, 17), (2, -1), (1, 1)] {
        let mut bad = t.clone();
        bad.kv_last_page_len[r] = value;
        let err = expect_gather(&l, &bad, &format!("kv_last_page_len[{r}]"));
        assert!(err.reason.contains(&format!("request {r}")), "{err}");
    }
    assert_eq!(
        PageTable::from_kv_lens(&[40], 16, &[0, 1])
            .unwrap_err()
            .field,
        "pages"
    );
}

fn small_problem() -> (PagedAttention, AttentionProblem) {
    let (l, t) = small();
    let qo = vec![0, 1, 2, 3];
    let p = PagedAttention::problem_for(qo, 4, &l, &t).unwrap();
    (PagedAttention::new(p.clone(), l, t).unwrap(), p)
}

#[test]
fn problem_errors() {
    let (paged, p) = small_problem();
    let (l, t) = (*paged.layout(), paged.table().clone());
    let expect = |p: AttentionProblem, field: &str| {
        let err = PagedAttention::new(p, l, t.clone()).unwrap_err();
        assert_eq!(err.field, field, "{err}");
    };
    let mut bad = p.clone();
    bad.batch.qo_indptr = vec![0, 1, 2];
    bad.batch.kv_indptr = vec![0, 20, 20];
    expect(bad, "kv_page_indptr");
    let mut bad = p.clone();
    bad.batch.kv_indptr = vec![0, 20, 21, 26];
    expect(bad, "kv_indptr[2]");
    let mut bad = p.clone();
    bad.batch.kv_indptr.pop();
    expect(bad, "kv_indptr");
    let mut bad = p.clone();
    bad.num_kv_heads = 1;
    expect(bad, "num_kv_heads");
    let mut bad = p.clone();
    bad.head_dims = HeadDims::equal(128).unwrap();
    expect(bad, "head_dims");
    let mut bad = p.clone();
    bad.input_dtype = DType::Bf16;
    bad.output_dtype = DType::Bf16;
    expect(bad, "input_dtype");
    let mut bad = p.clone();
    bad.k_view.offset = 1;
    expect(bad, "k_view");
    let mut bad = p.clone();
    bad.num_qo_heads = 3;
    expect(bad, "num_kv_heads");

    // q is checked before any work, by both entry points.
    let bufs = small_bufs(&l);
    let q = HostTensor::from_f32(DType::Bf16, &vec![0.5; 3 * 4 * 64]);
    assert_eq!(
        reference::paged_attention(&paged, &q, cache_ref(&bufs))
            .unwrap_err()
            .field,
        "q"
    );
    let q = HostTensor::from_f32(DType::F16, &vec![0.5; 3 * 4 * 64 - 1]);
    assert_eq!(
        reference::paged_attention(&paged, &q, cache_ref(&bufs))
            .unwrap_err()
            .field,
        "q"
    );
    match cpu::paged_attention(&paged, &q, cache_ref(&bufs)) {
        Err(attnforge::Error::InvalidProblem(e)) => assert_eq!(e.field, "q"),
        other => panic!("expected an invalid q, got {other:?}"),
    }
    // The cache buffers too.
    let q = HostTensor::from_f32(DType::F16, &vec![0.5; 3 * 4 * 64]);
    let short = HostTensor::from_f32(DType::F16, &[0.0; 4]);
    let err = reference::paged_attention(
        &paged,
        &q,
        PagedKv::Separate {
            k: &short,
            v: &bufs[1],
        },
    );
    assert_eq!(err.unwrap_err().field, "k_cache");
}

#[test]
fn append_errors_leave_the_cache_unchanged() {
    let (l, t) = small();
    let row = l.num_kv_heads * 64;
    let new = |n: usize| HostTensor::from_f32(DType::F16, &vec![2.0; n * row]);
    let expect = |indptr: &[i32], k: &HostTensor, v: &HostTensor, t: &PageTable, field: &str| {
        let mut bufs = small_bufs(&l);
        let before = bufs.clone();
        let err = append_paged_kv(&l, t, indptr, k, v, cache_mut(&mut bufs)).unwrap_err();
        assert_eq!(err.field, field, "{err}");
        assert_eq!(bufs, before, "the cache changed on error");
        err
    };
    let (k3, v3) = (new(3), new(3));
    // A valid append for reference.
    let mut bufs = small_bufs(&l);
    append_paged_kv(&l, &t, &[0, 2, 2, 3], &k3, &v3, cache_mut(&mut bufs)).unwrap();

    expect(&[0, 2, 3], &k3, &v3, &t, "append_indptr");
    expect(&[1, 2, 2, 3], &k3, &v3, &t, "append_indptr[0]");
    expect(&[0, 2, 1, 3], &k3, &v3, &t, "append_indptr[2]");
    // Request 1 has no page, so it has no room for a new token.
    let err = expect(&[0, 1, 2, 3], &k3, &v3, &t, "append_indptr[2]");
    assert!(err.reason.contains("request 1"), "{err}");
    // Request 2 holds 5 tokens; 6 new ones do not fit.
    let (k8, v8) = (new(8), new(8));
    let err = expect(&[0, 2, 2, 8], &k8, &v8, &t, "append_indptr[3]");
    assert!(err.reason.contains("request 2"), "{err}");
    expect(&[0, 2, 2, 3], &new(2), &v3, &t, "k_new");
    expect(&[0, 2, 2, 3], &k3, &new(2), &t, "v_new");
    let k_bf16 = HostTensor::from_f32(DType::Bf16, &vec![2.0; 3 * row]);
    expect(&[0, 2, 2, 3], &k_bf16, &v3, &t, "k_new");
    // Request 2's page 2 also listed as request 0's second page (slots 0..4 hold request 0's
    // tokens 16..20): request 2's two new tokens go to slots 3 and 4, and slot 3 holds request
    // 0's token 19. One new token (slot 4 only) would be fine.
    let mut shared = t.clone();
    shared.kv_page_indices = vec![3, 2, 2];
    let err = expect(&[0, 0, 0, 2], &new(2), &new(2), &shared, "kv_page_indices");
    assert!(
        err.reason.contains("request 2") && err.reason.contains("token 19 of request 0"),
        "{err}"
    );
    let mut bufs = small_bufs(&l);
    append_paged_kv(
        &l,
        &shared,
        &[0, 0, 0, 1],
        &new(1),
        &new(1),
        cache_mut(&mut bufs),
    )
    .unwrap();
    // Both requests write into the same slot.
    let twin = PageTable::from_kv_lens(&[3, 3], 16, &[1, 1]).unwrap();
    let err = expect(&[0, 1, 2], &new(2), &new(2), &twin, "kv_page_indices");
    assert!(err.reason.contains("also receives"), "{err}");
    // A shared prefix page that nobody writes to is fine.
    let prefix = PageTable::from_kv_lens(&[20, 20], 16, &[0, 1, 0, 2]).unwrap();
    let mut bufs = small_bufs(&l);
    append_paged_kv(
        &l,
        &prefix,
        &[0, 2, 4],
        &new(4),
        &new(4),
        cache_mut(&mut bufs),
    )
    .unwrap();
}

#[test]
fn zero_page_requests_see_no_key() {
    let (paged, mut p) = small_problem();
    let (l, t) = (*paged.layout(), paged.table().clone());
    let bufs = small_bufs(&l);
    let q = HostTensor::from_f32(DType::F16, &vec![0.5; 3 * 4 * 64]);
    let row = 4 * 64;
    let sinks = vec![0.5f32, -1.0, 2.0, 0.0];
    for with_sinks in [false, true] {
        if with_sinks {
            p = p.with_variant(Variant::Sinks {
                sinks: sinks.clone(),
            });
        }
        let paged = PagedAttention::new(p.clone(), l, t.clone()).unwrap();
        let want = reference::paged_attention(&paged, &q, cache_ref(&bufs)).unwrap();
        let got = cpu::paged_attention(&paged, &q, cache_ref(&bufs)).unwrap();
        let lse = got.lse.as_ref().unwrap();
        // Request 1 (query token 1) has no page.
        for h in 0..4 {
            let expected = if with_sinks {
                f64::from(sinks[h])
            } else {
                f64::NEG_INFINITY
            };
            assert_eq!(want.lse[4 + h], expected);
            assert_eq!(f64::from(lse[4 + h]), expected);
        }
        assert!(want.o[row..2 * row].iter().all(|&x| x == 0.0));
        assert!(got.o.to_f32_vec()[row..2 * row].iter().all(|&x| x == 0.0));
        // The other requests see keys.
        assert!(want.lse[0].is_finite() && want.lse[8].is_finite());
    }
}

#[test]
fn layout_indices_match_the_documented_formulas() {
    let dims = HeadDims::equal(64).unwrap();
    for order in [KvOrder::Nhd, KvOrder::Hnd] {
        for storage in [KvStorage::Separate, KvStorage::Combined] {
            let l = PagedKvLayout {
                num_pages: 3,
                page_size: 4,
                num_kv_heads: 3,
                head_dims: dims,
                order,
                storage,
                dtype: DType::F16,
            };
            let mut seen = std::collections::HashSet::new();
            for page in 0..3 {
                for slot in 0..4 {
                    for h in 0..3 {
                        for e in [0, 63] {
                            let (ki, vi) =
                                (l.k_index(page, slot, h, e), l.v_index(page, slot, h, e));
                            assert_eq!(ki, doc_index(&l, true, page, slot, h, e));
                            assert_eq!(vi, doc_index(&l, false, page, slot, h, e));
                            assert!(ki < l.k_buffer_len() && vi < l.v_buffer_len());
                            if storage == KvStorage::Combined {
                                assert!(seen.insert(ki) && seen.insert(vi), "K and V overlap");
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Every paged case of the GPU's quick list (the device-only ones included) builds its cache: the
/// shuffled table, the NaN-filled pages and the append all validate, and gathering the cache
/// gives back exactly the case's ragged K and V. (The full list has the same kinds of cases,
/// larger; building them all takes over a minute on two cores.)
#[test]
fn every_gpu_paged_case_builds_its_cache() {
    use attnforge::testing::{cases, BackendCaps, PagedRun, Suite};
    let mut runs = std::collections::HashSet::new();
    let mut fp8_cases = 0;
    for case in cases(Suite::Quick, 7, &BackendCaps::cuda()) {
        let Some(layout) = case.paged else { continue };
        runs.insert(format!("{:?}", layout.run));
        let (_, k, v) = case.inputs();
        let inputs = case
            .paged_inputs(&k, &v)
            .expect("a paged case")
            .unwrap_or_else(|e| panic!("{}: {e}", case.name));
        let cache = inputs.cache();
        fp8_cases += usize::from(cache.fp8_format().is_some());
        let (gk, gv) = gather_cache(inputs.paged.layout(), inputs.paged.table(), cache)
            .unwrap_or_else(|e| panic!("{}: {e}", case.name));
        let (wk, wv) = inputs
            .dequantized
            .as_ref()
            .map_or((&k, &v), |(a, b)| (a, b));
        assert!(&gk == wk && &gv == wv, "{}: gather differs", case.name);
    }
    for run in [
        PagedRun::Direct,
        PagedRun::GraphReplay,
        PagedRun::DeviceAppend,
    ] {
        assert!(runs.contains(&format!("{run:?}")), "no {run:?} case");
    }
    assert!(fp8_cases > 0, "no fp8 case");
}
