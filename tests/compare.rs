//! compare / Tolerance: exact agreement passes, each hard failure fails.

use attnforge::compare::{compare, compare_rows, Tolerance};
use attnforge::dtype::DType;
use attnforge::problem::{AttentionProblem, HeadDims, Mask, QkAccum, RaggedBatch};
use attnforge::reference::{self, ReferenceOutput};
use attnforge::testing::random_inputs;
use attnforge::{AttentionOutput, HostTensor};

/// A causal problem with qo_len > kv_len, so rows 0 and 1 see no key.
fn setup(dtype: DType) -> (AttentionProblem, ReferenceOutput, AttentionOutput) {
    let p = AttentionProblem::new(
        RaggedBatch::from_lens(&[(4, 2), (3, 9)]).unwrap(),
        2,
        1,
        HeadDims::equal(64).unwrap(),
        dtype,
    )
    .with_mask(Mask::Causal);
    let (q, k, v) = random_inputs(&p, 4);
    let r = reference::attention(&p, &q, &k, &v).unwrap();
    let o: Vec<f32> = r.o.iter().map(|&x| x as f32).collect();
    let out = AttentionOutput {
        o: HostTensor::from_f32(dtype, &o),
        lse: Some(r.lse.iter().map(|&x| x as f32).collect()),
    };
    (p, r, out)
}

#[test]
fn rounded_reference_passes() {
    for dtype in [DType::F16, DType::Bf16, DType::F32] {
        let (p, r, out) = setup(dtype);
        let c = compare(&out, &r);
        assert!(c.passes(&Tolerance::for_problem(&p)), "{dtype}: {c}");
        assert_eq!(c.rows, 14);
        assert!(c.lse_compared && c.rel_l2_o > 0.0 || dtype == DType::F32);
    }
}

#[test]
fn nan_fails() {
    let (p, r, mut out) = setup(DType::F32);
    if let HostTensor::F32(o) = &mut out.o {
        o[5 * 64 + 3] = f32::NAN;
    }
    let c = compare(&out, &r);
    assert_eq!(c.nan_count, 1);
    assert!(!c.passes(&Tolerance::for_problem(&p)));
    let (p, r, mut out) = setup(DType::F32);
    out.lse.as_mut().unwrap()[6] = f32::NAN;
    assert!(!compare(&out, &r).passes(&Tolerance::for_problem(&p)));
}

#[test]
fn empty_rows_must_be_exactly_zero_and_minus_infinity() {
    let (p, r, mut out) = setup(DType::F32);
    assert_eq!(r.lse[0], f64::NEG_INFINITY);
    if let HostTensor::F32(o) = &mut out.o {
        o[1] = 1e-30;
    }
    let c = compare(&out, &r);
    assert_eq!(c.empty_row_violations, 1);
    assert!(!c.passes(&Tolerance::for_problem(&p)));

    let (p, r, mut out) = setup(DType::F32);
    out.lse.as_mut().unwrap()[0] = -80.0;
    let c = compare(&out, &r);
    assert_eq!(c.lse_mismatch, 1);
    assert!(!c.passes(&Tolerance::for_problem(&p)));
}

#[test]
fn errors_beyond_tolerance_fail() {
    let (p, r, mut out) = setup(DType::F32);
    if let HostTensor::F32(o) = &mut out.o {
        for x in o.iter_mut() {
            *x *= 1.0 + 1e-4;
        }
    }
    let c = compare(&out, &r);
    assert!((c.rel_l2_o - 1e-4).abs() < 1e-6, "{c}");
    assert!(!c.passes(&Tolerance::for_problem(&p)));
    assert!(c.passes(&Tolerance::for_dtype(DType::F16)));

    let (p, r, mut out) = setup(DType::F32);
    out.lse.as_mut().unwrap()[10] += 0.01;
    let c = compare(&out, &r);
    assert!(c.max_abs_lse >= 0.0099, "{c}");
    assert!(!c.passes(&Tolerance::for_problem(&p)));
}

#[test]
fn shape_mismatch_fails() {
    let (p, r, mut out) = setup(DType::F32);
    out.lse.as_mut().unwrap().pop();
    let c = compare(&out, &r);
    assert!(c.shape_error.is_some());
    assert!(!c.passes(&Tolerance::for_problem(&p)));
}

#[test]
fn sampled_rows() {
    let (p, _, out) = setup(DType::F16);
    let (q, k, v) = random_inputs(&p, 4);
    let rows = [(0, 0), (3, 1), (6, 0)];
    let sample = reference::attention_rows(&p, &q, &k, &v, &rows).unwrap();
    let c = compare_rows(&out, 2, &rows, &sample);
    assert_eq!(c.rows, 3);
    assert!(c.passes(&Tolerance::for_problem(&p)), "{c}");
    let c = compare_rows(&out, 2, &[(0, 0), (9, 0), (6, 0)], &sample);
    assert!(c.shape_error.is_some(), "{c}");
    // Rows compared against the wrong reference rows fail.
    let c = compare_rows(&out, 2, &[(4, 0), (3, 1), (6, 0)], &sample);
    assert!(!c.passes(&Tolerance::for_problem(&p)), "{c}");
}

/// f16 QK accumulation widens the LSE bound by 2^-9 (two f16 ulps of a logit, the hardware's
/// rare departures from the reference's rounding), and nothing else; f32 accumulation keeps it.
#[test]
fn f16_accumulation_widens_only_the_lse_bound() {
    let (p, r, mut out) = setup(DType::F16);
    let f32_tol = Tolerance::for_problem(&p);
    let f16_tol = Tolerance::for_problem(&p.clone().with_qk_accum(QkAccum::F16));
    assert_eq!(f16_tol.rel_l2, f32_tol.rel_l2);
    assert!((f16_tol.lse_abs - f32_tol.lse_abs - 1.0 / 512.0).abs() < 1e-12);
    // A one-key row's LSE off by 1.4e-3 (measured on an H200 with f16 accumulation, head dim
    // 256, seed 212): beyond f32 accumulation's bound,
    // within f16's; 3.5e-3 is beyond both.
    let row = r
        .lse
        .iter()
        .position(|l| l.is_finite() && l.abs() < 1.0)
        .unwrap();
    out.lse.as_mut().unwrap()[row] += 1.4e-3;
    let c = compare(&out, &r);
    assert!(!c.passes(&f32_tol), "{c}");
    assert!(c.passes(&f16_tol), "{c}");
    out.lse.as_mut().unwrap()[row] += 2.1e-3;
    assert!(!compare(&out, &r).passes(&f16_tol));
}
