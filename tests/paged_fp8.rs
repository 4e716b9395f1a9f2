//! The fp8 paged KV cache (host side): a cache filled by the quantising append and read by the
//! reference and the CPU backend equals attention over the K/V computed element by element from
//! `docs/semantics.md` (exact `decode(code) * scale` with f32 QK accumulation, those values
//! rounded to the problem's dtype with f16 QK), for both formats, per-tensor and per-head scales,
//! every page geometry; scales and non-finite inputs are checked with errors naming their field, and
//! a failed append leaves the cache unchanged.

use attnforge::compare::{compare, Tolerance};
use attnforge::dtype::fp8::{Fp8Format, Fp8Tensor};
use attnforge::dtype::DType;
use attnforge::paged::{
    append_paged_kv_fp8, dequantize, gather_dequantized, gather_exact, Fp8Kv, KvOrder, KvScales,
    KvStorage, PageTable, PagedAttention, PagedKv, PagedKvLayout,
};
use attnforge::problem::{HeadDims, QkAccum};
use attnforge::tensor::HostTensor;
use attnforge::testing::grid::VariantSpec;
use attnforge::testing::rng::SplitMix64;
use attnforge::{cpu, reference};
use proptest::prelude::*;
use support::paged::{cache_mut, cache_ref, check_cache, page_spec, storage_buffers, PageSpec};
use support::Axes;

mod support;

/// Proptest cases per property (each runs the f64 reference on a small batch).
const PROPTEST_CASES: u32 = 96;

/// A random fp8 paged problem (plain data so proptest can shrink and print it).
#[derive(Clone, Debug)]
struct Spec {
    page: PageSpec,
    format: Fp8Format,
    per_head: bool,
    /// log2 of the base scale, as a fraction of the format's range.
    scale_exp: i32,
}

fn spec() -> impl Strategy<Value = Spec> {
    let variants = prop_oneof![
        Just(VariantSpec::None),
        Just(VariantSpec::SoftCap(2.0)),
        Just(VariantSpec::Alibi),
        Just(VariantSpec::Sinks),
    ];
    let lens = prop::collection::vec((prop_oneof![Just(1usize), 0usize..6], 0usize..120), 1..4);
    let axes = Axes {
        max_window: 20,
        variants: variants.boxed(),
        groups: vec![1, 4, 8],
        lens: lens.boxed(),
    };
    (
        page_spec(axes, (0u32..=7).prop_map(|k| 1usize << k)),
        prop_oneof![Just(Fp8Format::E4m3), Just(Fp8Format::E5m2)],
        any::<bool>(),
        -12i32..=2,
    )
        .prop_map(|(page, format, per_head, scale_exp)| Spec {
            page,
            format,
            per_head,
            scale_exp,
        })
}

/// Scales for `heads` KV heads: around `2^exp` (clamped so the format's largest value stays
/// finite in f16), varying per head when `per_head`.
fn scales(s: &Spec, heads: usize, rng: &mut SplitMix64) -> KvScales {
    let top = 60000.0 / s.format.max_finite();
    let mut draw = || (2f32.powi(s.scale_exp) * (0.5 + rng.uniform() as f32)).min(top);
    if s.per_head {
        let k = (0..heads).map(|_| draw()).collect();
        let v = (0..heads).map(|_| draw()).collect();
        KvScales::per_head(k, v)
    } else {
        KvScales::per_tensor(draw(), draw())
    }
}

/// The exact values of the contiguous tensor `[tokens, heads, dim]` once quantised, element by
/// element: `decode(encode(x / s)) * s` in f64.
fn exact_values(
    t: &HostTensor,
    heads: usize,
    dim: usize,
    format: Fp8Format,
    scale: impl Fn(usize) -> f32,
) -> Vec<f64> {
    t.to_f32_vec()
        .iter()
        .enumerate()
        .map(|(i, &x)| {
            let s = scale(i / dim % heads);
            f64::from(format.decode(format.encode(x / s))) * f64::from(s)
        })
        .collect()
}

/// With f32 QK: the exact values gathered from the cache equal the element-wise ones, the paged
/// reference equals the reference over them, and the CPU backend is within the tolerance.
fn check_exact(
    case: &support::paged::PagedCase,
    cache: Fp8Kv<'_>,
    (k, v): (Vec<f64>, Vec<f64>),
) -> Result<(), String> {
    let gathered =
        gather_exact(&case.layout, &case.table, cache).map_err(|e| format!("gather: {e}"))?;
    if gathered != (k.clone(), v.clone()) {
        return Err("gathered exact K/V differ from the element-wise ones".into());
    }
    let contiguous = &case.contiguous;
    let paged = PagedAttention::new(contiguous.clone(), case.layout, case.table.clone())
        .map_err(|e| format!("PagedAttention::new: {e}"))?;
    let want = reference::attention_exact_kv(contiguous, &case.q, k, v)
        .map_err(|e| format!("ref: {e}"))?;
    let got_ref = reference::paged_attention(&paged, &case.q, cache)
        .map_err(|e| format!("paged ref: {e}"))?;
    if got_ref != want {
        return Err(
            "paged reference differs from the contiguous reference on the same values".into(),
        );
    }
    let got_cpu =
        cpu::paged_attention(&paged, &case.q, cache).map_err(|e| format!("paged cpu: {e}"))?;
    let cmp = compare(&got_cpu, &want);
    let tol = Tolerance::for_problem(contiguous);
    if !cmp.passes(&tol) {
        return Err(format!("paged CPU vs reference: {cmp} (tolerance {tol:?})"));
    }
    Ok(())
}

/// The dequantised contiguous tensor `[tokens, heads, dim]` from the semantics, element by
/// element: `T(decode(encode(x / s)) * s)`.
fn dequantised(
    t: &HostTensor,
    heads: usize,
    dim: usize,
    format: Fp8Format,
    scale: impl Fn(usize) -> f32,
) -> HostTensor {
    let vals: Vec<f32> = t
        .to_f32_vec()
        .iter()
        .enumerate()
        .map(|(i, &x)| {
            let s = scale(i / dim % heads);
            format.decode(format.encode(x / s)) * s
        })
        .collect();
    HostTensor::from_f32(t.dtype(), &vals)
}

fn nan_buffers(layout: &PagedKvLayout, format: Fp8Format) -> Vec<Fp8Tensor> {
    storage_buffers(layout, |n| Fp8Tensor::nan(format, n))
}

/// Builds the case, fills the pages with the quantising append and checks them against the
/// element-wise dequantisation; `Err` describes a failure.
fn check(s: &Spec) -> Result<(), String> {
    let pt = &s.page.point;
    let case = s.page.case();
    let (layout, table) = (&case.layout, &case.table);
    let scales = scales(s, pt.kv_heads, &mut SplitMix64::with_salt(pt.seed, 0x5ca1));
    let mut bufs = nan_buffers(layout, s.format);
    let all_new = table.kv_indptr(layout.page_size);
    append_paged_kv_fp8(
        layout,
        table,
        &all_new,
        (&case.k, &case.v),
        cache_mut(&mut bufs),
        &scales,
    )
    .map_err(|e| format!("append: {e}"))?;
    let (h, dqk, dvo) = (pt.kv_heads, pt.head_dims.qk(), pt.head_dims.vo());
    if case.contiguous.qk_accum == QkAccum::F32 {
        let ke = exact_values(&case.k, h, dqk, s.format, |h| scales.scale(true, h));
        let ve = exact_values(&case.v, h, dvo, s.format, |h| scales.scale(false, h));
        let cache = Fp8Kv {
            pages: cache_ref(&bufs),
            scales: &scales,
        };
        return check_exact(&case, cache, (ke, ve));
    }
    let kd = dequantised(&case.k, h, dqk, s.format, |h| scales.scale(true, h));
    let vd = dequantised(&case.v, h, dvo, s.format, |h| scales.scale(false, h));
    let cache = Fp8Kv {
        pages: cache_ref(&bufs),
        scales: &scales,
    };
    check_cache(&case, cache, (&kd, &vd))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: PROPTEST_CASES, ..ProptestConfig::default() })]

    #[test]
    fn fp8_paged_equals_reference_on_dequantised_kv(s in spec()) {
        if let Err(e) = check(&s) {
            prop_assert!(false, "{e}\n{s:?}");
        }
    }
}

// ---- Validation ----

fn small(format: Fp8Format) -> (PagedKvLayout, PageTable, Vec<Fp8Tensor>) {
    let layout = PagedKvLayout {
        num_pages: 2,
        page_size: 4,
        num_kv_heads: 2,
        head_dims: HeadDims::equal(64).unwrap(),
        order: KvOrder::Nhd,
        storage: KvStorage::Separate,
        dtype: DType::F16,
    };
    let table = PageTable::from_kv_lens(&[5], 4, &[1, 0]).unwrap();
    let bufs = nan_buffers(&layout, format);
    (layout, table, bufs)
}

fn new_tokens(n: usize, value: f32) -> HostTensor {
    HostTensor::from_f32(DType::F16, &vec![value; n * 2 * 64])
}

#[test]
fn bad_scales_are_errors_naming_the_field() {
    let cases: [(KvScales, Fp8Format, &str); 7] = [
        (
            KvScales::per_tensor(0.0, 1.0),
            Fp8Format::E4m3,
            "k_scale[0]",
        ),
        (
            KvScales::per_tensor(1.0, -2.0),
            Fp8Format::E4m3,
            "v_scale[0]",
        ),
        (
            KvScales::per_tensor(f32::NAN, 1.0),
            Fp8Format::E4m3,
            "k_scale[0]",
        ),
        (
            KvScales::per_tensor(1.0, f32::INFINITY),
            Fp8Format::E5m2,
            "v_scale[0]",
        ),
        (
            KvScales::per_head(vec![1.0; 3], vec![1.0; 3]),
            Fp8Format::E4m3,
            "k_scale",
        ),
        (
            KvScales::per_head(vec![1.0; 2], vec![1.0]),
            Fp8Format::E4m3,
            "v_scale",
        ),
        // 57344 * 2 overflows f16.
        (
            KvScales::per_head(vec![1.0, 2.0], vec![1.0; 2]),
            Fp8Format::E5m2,
            "k_scale[1]",
        ),
    ];
    for (scales, format, field) in cases {
        let (layout, table, mut bufs) = small(format);
        let before = bufs.clone();
        let new = new_tokens(5, 1.0);
        let err = append_paged_kv_fp8(
            &layout,
            &table,
            &[0, 5],
            (&new, &new),
            cache_mut(&mut bufs),
            &scales,
        )
        .unwrap_err();
        assert_eq!(err.field, field, "{scales:?}: {err}");
        assert_eq!(bufs, before, "a failed append leaves the cache unchanged");
        let cache = Fp8Kv {
            pages: cache_ref(&bufs),
            scales: &scales,
        };
        let err = gather_dequantized(&layout, &table, cache).unwrap_err();
        assert_eq!(err.field, field);
        assert_eq!(dequantize(&layout, cache).unwrap_err().field, field);
    }
    // 448 * 100 is finite in f16 and 57344 * 1.0 too: accepted.
    let ok = KvScales::per_tensor(100.0, 1.0);
    ok.validate(2, Fp8Format::E4m3, DType::F16).unwrap();
    KvScales::per_tensor(1.0, 1.0)
        .validate(2, Fp8Format::E5m2, DType::F16)
        .unwrap();
    KvScales::per_tensor(1e30, 1.0)
        .validate(2, Fp8Format::E4m3, DType::Bf16)
        .unwrap();
}

#[test]
fn non_finite_new_values_are_errors_and_leave_the_cache_unchanged() {
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let (layout, table, mut bufs) = small(Fp8Format::E4m3);
        let before = bufs.clone();
        let good = new_tokens(5, 0.5);
        let mut vals = good.to_f32_vec();
        vals[3 * 128 + 64 + 7] = bad;
        let poisoned = HostTensor::from_f32(DType::F16, &vals);
        let scales = KvScales::per_tensor(1.0, 1.0);
        let err = append_paged_kv_fp8(
            &layout,
            &table,
            &[0, 5],
            (&good, &poisoned),
            cache_mut(&mut bufs),
            &scales,
        )
        .unwrap_err();
        assert_eq!(err.field, "v_new");
        assert!(
            err.to_string().contains("token 3 head 1 element 7"),
            "{err}"
        );
        assert_eq!(bufs, before);
    }
}

#[test]
fn mixed_formats_and_wrong_storage_are_errors() {
    let (layout, table, mut bufs) = small(Fp8Format::E4m3);
    bufs[1] = Fp8Tensor::nan(Fp8Format::E5m2, layout.v_buffer_len());
    let scales = KvScales::per_tensor(1.0, 1.0);
    let cache = Fp8Kv {
        pages: cache_ref(&bufs),
        scales: &scales,
    };
    assert_eq!(
        gather_dequantized(&layout, &table, cache)
            .unwrap_err()
            .field,
        "v_cache"
    );
    let combined = Fp8Kv {
        pages: PagedKv::Combined(&bufs[0]),
        scales: &scales,
    };
    assert_eq!(
        gather_dequantized(&layout, &table, combined)
            .unwrap_err()
            .field,
        "kv_cache"
    );
}

/// Values at and beyond the saturation limit: `max * scale` stores the largest code, anything
/// larger saturates to it, and both dequantise to `max * scale`.
#[test]
fn values_beyond_the_range_saturate() {
    for format in Fp8Format::ALL {
        let scale = 0.125f32;
        let (layout, table, mut bufs) = small(format);
        let top = format.max_finite() * scale;
        let mut vals = vec![0.0f32; 5 * 2 * 64];
        for (i, x) in vals.iter_mut().enumerate() {
            *x = match i % 4 {
                0 => top,
                1 => -top,
                2 => (top * 4.0).min(60000.0),
                _ => -60000.0,
            };
        }
        let new = HostTensor::from_f32(DType::F16, &vals);
        let scales = KvScales::per_tensor(scale, scale);
        append_paged_kv_fp8(
            &layout,
            &table,
            &[0, 5],
            (&new, &new),
            cache_mut(&mut bufs),
            &scales,
        )
        .unwrap();
        let (k, _) = gather_dequantized(
            &layout,
            &table,
            Fp8Kv {
                pages: cache_ref(&bufs),
                scales: &scales,
            },
        )
        .unwrap();
        for (i, x) in k.to_f32_vec().into_iter().enumerate() {
            let want = if i % 4 == 0 || i % 4 == 2 { top } else { -top };
            assert_eq!(x, want, "{format} element {i}");
        }
        assert!(bufs[0]
            .codes
            .iter()
            .any(|&c| c == format.max_code() || c == 0x80 | format.max_code()));
    }
}

/// The dequantised value rounds once to the problem's dtype after the f32 product: a bf16
/// problem sees `bf16(code * scale)`, not the product in f32.
#[test]
fn dequantisation_rounds_to_the_problem_dtype() {
    let mut layout = small(Fp8Format::E4m3).0;
    layout.dtype = DType::Bf16;
    let table = PageTable::from_kv_lens(&[1], 4, &[0]).unwrap();
    let format = Fp8Format::E4m3;
    let mut bufs = nan_buffers(&layout, format);
    // Code 0x39 is 1.125; times 1.0078125 = 1.1337890625, which bf16 rounds to 1.1328125.
    for b in &mut bufs {
        b.codes.iter_mut().for_each(|c| *c = 0x39);
    }
    let scales = KvScales::per_tensor(1.0078125, 1.0);
    let (k, v) = gather_dequantized(
        &layout,
        &table,
        Fp8Kv {
            pages: cache_ref(&bufs),
            scales: &scales,
        },
    )
    .unwrap();
    assert_eq!(k.get_f32(0), 1.1328125);
    assert_eq!(v.get_f32(0), 1.125);
}
