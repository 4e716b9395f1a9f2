//! The fast CPU backend against the exact reference: property tests over random problems (every
//! mask, variant, dtype configuration, head-dim pair, GQA group, ragged batches, strided and fused
//! views, every instruction set this machine runs), the quick suite of `attnforge::testing`, and
//! the edge cases the semantics pin down exactly (empty rows, sinks, errors).

use attnforge::compare::{compare, Tolerance};
use attnforge::cpu::{self, Isa};
use attnforge::problem::TensorView;
use attnforge::reference;
use attnforge::testing::grid::{MaskSpec, VariantSpec};
use attnforge::testing::rng::SplitMix64;
use attnforge::testing::{cases, random_inputs, sample_custom_variant, BackendCaps, Suite};
use attnforge::{AttentionProblem, DType, Error, HeadDims, HostTensor, Mask, RaggedBatch, Variant};
use proptest::prelude::*;
use support::{point_spec, Axes, PointSpec};

mod support;

/// Proptest cases per property: enough to meet every axis value several times, small enough for
/// a test run of well under a minute on two cores.
const PROPTEST_CASES: u32 = 128;
/// Padding (elements) of the padded views.
const PAD: usize = 3;

/// How Q, K and V sit in their buffers.
#[derive(Clone, Copy, Debug)]
enum Layout {
    Contiguous,
    /// Q, K and V as slices of one token row `[q heads | k heads | v heads]` (same buffer
    /// content drawn three times: each tensor gets its own buffer of the fused shape).
    Fused,
    /// Padded head and token strides and an offset, different per tensor.
    Padded,
}

fn apply_layout(p: &mut AttentionProblem, layout: Layout) {
    let (hq, hkv) = (p.num_qo_heads, p.num_kv_heads);
    let (dqk, dvo) = (p.head_dims.qk(), p.head_dims.vo());
    match layout {
        Layout::Contiguous => {}
        Layout::Fused => {
            let row = hq * dqk + hkv * dqk + hkv * dvo;
            p.q_view = TensorView {
                offset: 0,
                token_stride: row,
                head_stride: dqk,
            };
            p.k_view = TensorView {
                offset: hq * dqk,
                token_stride: row,
                head_stride: dqk,
            };
            p.v_view = TensorView {
                offset: hq * dqk + hkv * dqk,
                token_stride: row,
                head_stride: dvo,
            };
        }
        Layout::Padded => {
            let padded = |heads: usize, dim: usize, offset: usize| TensorView {
                offset,
                token_stride: heads * (dim + PAD) + 2 * PAD,
                head_stride: dim + PAD,
            };
            p.q_view = padded(hq, dqk, 1);
            p.k_view = padded(hkv, dqk, 2);
            p.v_view = padded(hkv, dvo, 5);
        }
    }
}

/// A random problem description (kept as plain data so proptest can shrink and print it).
#[derive(Clone, Debug)]
struct Spec {
    point: PointSpec,
    layout: Layout,
    narrow_output: bool,
    isa: Isa,
}

impl Spec {
    fn problem(&self) -> AttentionProblem {
        let mut p = self.point.point().problem(self.point.seed);
        apply_layout(&mut p, self.layout);
        // f16 -> bf16 and bf16 -> f16 outputs exercise the output conversion.
        if self.narrow_output {
            p.output_dtype = match p.input_dtype {
                DType::F16 => DType::Bf16,
                DType::Bf16 => DType::F16,
                DType::F32 => DType::F32,
            };
        }
        p.return_lse = self.point.seed % 5 != 0;
        p
    }
}

fn spec() -> impl Strategy<Value = Spec> {
    let variants = prop_oneof![
        Just(VariantSpec::None),
        prop_oneof![Just(50.0f32), Just(2.0), Just(0.05)].prop_map(VariantSpec::SoftCap),
        Just(VariantSpec::Alibi),
        Just(VariantSpec::Sinks),
        Just(VariantSpec::Custom),
        Just(VariantSpec::CustomCpuOnly),
    ];
    let axes = Axes {
        max_window: 40,
        variants: variants.boxed(),
        groups: vec![1, 2, 3, 4, 8],
        lens: prop::collection::vec((0usize..70, 0usize..140), 1..4).boxed(),
    };
    let isas: Vec<Isa> = Isa::ALL.into_iter().filter(|i| i.is_available()).collect();
    (
        point_spec(axes),
        prop_oneof![
            Just(Layout::Contiguous),
            Just(Layout::Fused),
            Just(Layout::Padded)
        ],
        any::<bool>(),
        prop::sample::select(isas),
    )
        .prop_map(|(point, layout, narrow_output, isa)| Spec {
            point,
            layout,
            narrow_output,
            isa,
        })
}

/// Runs `p` on the CPU backend with `isa` and on the reference; `Err` describes a failure.
fn check(
    p: &AttentionProblem,
    inputs: &(HostTensor, HostTensor, HostTensor),
    isa: Isa,
) -> Result<(), String> {
    let (q, k, v) = inputs;
    let want = reference::attention(p, q, k, v).map_err(|e| format!("reference: {e}"))?;
    let got = cpu::attention_with_isa(p, q, k, v, isa).map_err(|e| format!("cpu: {e}"))?;
    let cmp = compare(&got, &want);
    let tol = Tolerance::for_problem(p);
    if cmp.passes(&tol) {
        Ok(())
    } else {
        Err(format!("{cmp} (tolerance {tol:?})"))
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: PROPTEST_CASES, ..ProptestConfig::default() })]

    #[test]
    fn cpu_backend_matches_reference(spec in spec()) {
        let p = spec.problem();
        let inputs = random_inputs(&p, spec.point.seed);
        if let Err(why) = check(&p, &inputs, spec.isa) {
            prop_assert!(false, "{spec:?}: {why}");
        }
    }
}

#[test]
fn quick_suite_passes() {
    let mut failures = Vec::new();
    let all = cases(Suite::Quick, 1, &BackendCaps::cpu());
    assert!(
        all.len() > 30,
        "the quick suite has only {} cases",
        all.len()
    );
    for case in &all {
        let inputs = case.inputs();
        if let Err(why) = check(&case.problem, &inputs, Isa::detect()) {
            failures.push(format!("{}: {why}", case.name));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} failed:\n{}",
        failures.len(),
        all.len(),
        failures.join("\n")
    );
}

#[test]
fn every_isa_agrees_on_a_quick_case_sample() {
    let all = cases(Suite::Quick, 7, &BackendCaps::cpu());
    for isa in Isa::ALL.into_iter().filter(|i| i.is_available()) {
        for case in all.iter().step_by(5) {
            let inputs = case.inputs();
            if let Err(why) = check(&case.problem, &inputs, isa) {
                panic!("{} with {isa:?}: {why}", case.name);
            }
        }
    }
}

fn single(qo: usize, kv: usize, mask: Mask, variant: Variant) -> AttentionProblem {
    AttentionProblem::new(
        RaggedBatch::from_lens(&[(qo, kv)]).unwrap(),
        4,
        2,
        HeadDims::equal(64).expect("64 is supported"),
        DType::F32,
    )
    .with_mask(mask)
    .with_variant(variant)
}

#[test]
fn empty_rows_give_zero_and_minus_infinity_or_the_sink() {
    // qo 5 > kv 3 under causal: the first two queries see no key.
    let sinks = vec![0.5f32, -1.0, 2.0, 0.0];
    for variant in [
        Variant::None,
        Variant::Sinks {
            sinks: sinks.clone(),
        },
    ] {
        let p = single(5, 3, Mask::Causal, variant.clone());
        let (q, k, v) = random_inputs(&p, 3);
        let out = cpu::attention(&p, &q, &k, &v).expect("valid problem");
        let lse = out.lse.expect("LSE requested");
        for token in 0..2 {
            for head in 0..4 {
                let row = token * 4 + head;
                let want = variant.sink(head).unwrap_or(f32::NEG_INFINITY);
                assert_eq!(lse[row], want, "lse of row {row}");
                for e in 0..64 {
                    assert_eq!(out.o.get_f32(row * 64 + e), 0.0, "o of row {row}");
                }
            }
        }
        for (row, l) in lse.iter().enumerate().skip(8) {
            assert!(l.is_finite(), "row {row} sees keys");
        }
    }
}

#[test]
fn large_logits_give_no_nan() {
    // Q and K of 1e18 overflow an f32 dot product; the output must stay finite.
    let p = single(9, 9, Mask::None, Variant::None);
    let (q, k, v) = random_inputs(&p, 5);
    let huge = |t: &HostTensor| HostTensor::F32(t.to_f32_vec().iter().map(|x| x * 1e18).collect());
    let out = cpu::attention(&p, &huge(&q), &huge(&k), &v).expect("valid problem");
    assert!(out.o.to_f32_vec().iter().all(|x| x.is_finite()));
    assert!(out.lse.expect("LSE").iter().all(|x| !x.is_nan()));
}

#[test]
fn invalid_problems_are_errors_not_panics() {
    let p = single(4, 4, Mask::SlidingWindow { window_left: -1 }, Variant::None);
    let (q, k, v) = random_inputs(&single(4, 4, Mask::None, Variant::None), 1);
    match cpu::attention(&p, &q, &k, &v) {
        Err(Error::InvalidProblem(e)) => assert_eq!(e.field, "window_left"),
        other => panic!("expected an InvalidProblem error, got {other:?}"),
    }
    let good = single(4, 4, Mask::None, Variant::None);
    let short = HostTensor::F32(vec![1.0; 10]);
    match cpu::attention(&good, &q, &short, &v) {
        Err(Error::InvalidProblem(e)) => assert_eq!(e.field, "k"),
        other => panic!("expected an InvalidProblem error, got {other:?}"),
    }
    let wrong_dtype = HostTensor::from_f32(DType::F16, &q.to_f32_vec());
    assert!(matches!(
        cpu::attention(&good, &wrong_dtype, &k, &v),
        Err(Error::InvalidProblem(_))
    ));
}

#[test]
fn a_custom_transform_returning_nan_is_an_error() {
    // The sample variant made for 2 heads returns NaN for heads 2 and 3.
    let variant = Variant::Custom(sample_custom_variant(2, 5));
    let p = single(6, 6, Mask::None, variant);
    let (q, k, v) = random_inputs(&p, 2);
    match cpu::attention(&p, &q, &k, &v) {
        Err(Error::InvalidProblem(e)) => assert_eq!(e.field, "custom variant transform"),
        other => panic!("expected an InvalidProblem error, got {other:?}"),
    }
}

#[test]
fn portable_kernels_are_always_available() {
    assert!(Isa::Portable.is_available());
    assert!(Isa::detect().is_available());
    let p = single(3, 70, Mask::Causal, Variant::None);
    let inputs = random_inputs(&p, 11);
    check(&p, &inputs, Isa::Portable).expect("portable kernels match the reference");
}

#[test]
fn long_sequences_across_many_key_tiles() {
    // Several key tiles, a window that starts mid-tile, GQA 8.
    let mut rng = SplitMix64::new(99);
    for (mask, seed) in [
        (Mask::Causal, 1),
        (Mask::SlidingWindow { window_left: 100 }, 2),
        (MaskSpec::Custom.build(&[(150, 300)], &mut rng), 3),
    ] {
        let p = AttentionProblem::new(
            RaggedBatch::from_lens(&[(150, 300)]).unwrap(),
            8,
            1,
            HeadDims::equal(128).expect("128 is supported"),
            DType::Bf16,
        )
        .with_mask(mask);
        let inputs = random_inputs(&p, seed);
        check(&p, &inputs, Isa::detect()).unwrap_or_else(|why| panic!("{:?}: {why}", p.mask));
    }
}

#[test]
fn the_merge_cases_pass_on_the_cpu_and_a_leaking_empty_state_would_fail() {
    use attnforge::cpu::CpuBackend;
    use attnforge::testing::merge_cases;
    use attnforge::verify::run_merge_case;
    let backend = CpuBackend::detect();
    let all = merge_cases(Suite::Full, 5);
    assert!(all.len() >= 20, "only {} merge cases", all.len());
    for case in &all {
        let r = run_merge_case(&backend, case);
        assert!(r.passed, "{}: {:?}", r.name, r.outcome);
    }
    // The judge sees a merge that lets an empty state's o through.
    let case = &all[0];
    let states = case.inputs();
    let (mut o, lse) = attnforge::verify::Backend::merge_states(&backend, case.shape, &states)
        .expect("the cpu merges");
    let empty_item = 3; // every seventh item from 3 is empty in every state
    let leaked = o.get_f32(empty_item * case.shape.head_dim) + 1000.0;
    let mut values = o.to_f32_vec();
    values[empty_item * case.shape.head_dim] = leaked;
    o = attnforge::HostTensor::from_f32(o.dtype(), &values);
    let expected = attnforge::testing::merge_expected(case.shape, &states).unwrap();
    let c =
        attnforge::compare::compare(&attnforge::AttentionOutput { o, lse: Some(lse) }, &expected);
    assert_eq!(c.empty_row_violations, 1, "{c}");
}
