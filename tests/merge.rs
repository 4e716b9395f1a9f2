//! merge_state: random splits of the key set merge back to the unsplit reference; edge cases.

use attnforge::dtype::DType;
use attnforge::merge::{apply_sink, merge_state, merge_states};
use attnforge::problem::{AttentionProblem, CustomMask, HeadDims, Mask, RaggedBatch, Variant};
use attnforge::reference;
use attnforge::testing::random_inputs;
use proptest::prelude::*;

/// The reference restricted to the keys where `keep(r, i, j)` holds, on top of `base`'s mask.
fn partial(
    base: &AttentionProblem,
    variant: Variant,
    keep: &dyn Fn(usize, usize, usize) -> bool,
    inputs: &(
        attnforge::HostTensor,
        attnforge::HostTensor,
        attnforge::HostTensor,
    ),
) -> reference::ReferenceOutput {
    let masks: Vec<Vec<bool>> = base
        .batch
        .lens()
        .iter()
        .enumerate()
        .map(|(r, &(qo, kv))| {
            (0..qo * kv)
                .map(|b| {
                    let (i, j) = (b / kv, b % kv);
                    base.mask.visible(r, qo, kv, i, j) && keep(r, i, j)
                })
                .collect()
        })
        .collect();
    let p = base
        .clone()
        .with_mask(Mask::Custom(CustomMask::pack(&masks)))
        .with_variant(variant);
    reference::attention(&p, &inputs.0, &inputs.1, &inputs.2).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn merging_a_random_split_gives_the_unsplit_result(
        lens in prop::collection::vec((1usize..6, 0usize..12), 1..4),
        causal in any::<bool>(),
        variant_pick in 0usize..4,
        split_seed in any::<u64>(),
        seed in any::<u64>(),
    ) {
        let hq = 2;
        let base = AttentionProblem::new(
            RaggedBatch::from_lens(&lens).unwrap(), hq, 1, HeadDims::equal(64).unwrap(), DType::F32,
        )
        .with_mask(if causal { Mask::Causal } else { Mask::None });
        let sinks = vec![0.5f32, -1.25];
        let (full_variant, partial_variant) = match variant_pick {
            0 => (Variant::None, Variant::None),
            1 => (Variant::SoftCap { cap: 1.0 }, Variant::SoftCap { cap: 1.0 }),
            2 => (Variant::Alibi { slopes: vec![0.5, 0.1] }, Variant::Alibi { slopes: vec![0.5, 0.1] }),
            // Partials never include the sink; it is applied once after merging.
            _ => (Variant::Sinks { sinks: sinks.clone() }, Variant::None),
        };
        let full_problem = base.clone().with_variant(full_variant);
        let inputs = random_inputs(&base, seed);
        let full = reference::attention(&full_problem, &inputs.0, &inputs.1, &inputs.2).unwrap();

        // Key j of request r goes to A or B by a hash of (seed, r, j): disjoint, covering.
        let in_a = move |r: usize, _i: usize, j: usize| {
            (split_seed ^ (r as u64 * 0x9e37_79b9) ^ (j as u64).wrapping_mul(0xbf58_476d_1ce4_e5b9))
                .count_ones() % 2 == 0
        };
        let a = partial(&base, partial_variant.clone(), &in_a, &inputs);
        let b = partial(&base, partial_variant, &|r, i, j| !in_a(r, i, j), &inputs);
        let d = 64;
        let (mut o, mut lse) = merge_states(&a.o, &a.lse, &b.o, &b.lse, d).unwrap();
        if variant_pick == 3 {
            for (row, lse_row) in lse.iter_mut().enumerate() {
                let sink = f64::from(sinks[row % hq]);
                *lse_row = apply_sink(&mut o[row * d..(row + 1) * d], *lse_row, sink).unwrap();
            }
        }
        for (row, (&x, &y)) in lse.iter().zip(&full.lse).enumerate() {
            prop_assert!(x == y || (x - y).abs() < 1e-12, "row {}: lse {} vs {}", row, x, y);
        }
        for (e, (&x, &y)) in o.iter().zip(&full.o).enumerate() {
            prop_assert!((x - y).abs() < 1e-12, "o[{}]: {} vs {}", e, x, y);
        }
    }

    #[test]
    fn f32_merge_matches_f64_merge(
        o_a in prop::collection::vec(-4.0f32..4.0, 8),
        o_b in prop::collection::vec(-4.0f32..4.0, 8),
        lse_a in -30.0f32..30.0,
        lse_b in -30.0f32..30.0,
    ) {
        let (o32, l32) = merge_state(&o_a, lse_a, &o_b, lse_b).unwrap();
        let wide = |v: &[f32]| v.iter().map(|&x| f64::from(x)).collect::<Vec<_>>();
        let (o64, l64) =
            merge_state(&wide(&o_a), f64::from(lse_a), &wide(&o_b), f64::from(lse_b)).unwrap();
        prop_assert!((f64::from(l32) - l64).abs() < 1e-5);
        for (x, y) in o32.iter().zip(&o64) {
            prop_assert!((f64::from(*x) - y).abs() < 1e-5);
        }
    }
}

#[test]
fn empty_partials() {
    let ninf = f64::NEG_INFINITY;
    let (o, lse) = merge_state(&[0.0, 0.0], ninf, &[0.0, 0.0], ninf).unwrap();
    assert_eq!((o, lse), (vec![0.0, 0.0], ninf));
    let (o, lse) = merge_state(&[0.0, 0.0], ninf, &[1.5, -2.0], 0.25).unwrap();
    assert_eq!((o, lse), (vec![1.5, -2.0], 0.25));
    // Huge LSEs do not overflow.
    let (o, lse) = merge_state(&[1.0f32], 1e30, &[3.0], 1e30).unwrap();
    assert_eq!(o, vec![2.0]);
    assert_eq!(lse, 1e30);
    // A sink on an empty row: lse = sink, o stays 0.
    let mut o = vec![0.0f64; 3];
    assert_eq!(apply_sink(&mut o, ninf, 0.5).unwrap(), 0.5);
    assert_eq!(o, vec![0.0; 3]);
    // A sink of ln 3 on a row with lse 0 (sum 1): lse ln 4, o scaled by 1/4.
    let mut o = vec![2.0f64];
    let lse = apply_sink(&mut o, 0.0, 3f64.ln()).unwrap();
    assert!((lse - 4f64.ln()).abs() < 1e-15 && (o[0] - 0.5).abs() < 1e-15);
}

#[test]
fn bad_arguments_are_named() {
    let err = merge_state(&[1.0f64, 2.0], 0.0, &[1.0], 0.0).unwrap_err();
    assert_eq!(err.field, "o_b");
    let err = merge_state(&[1.0f64], f64::NAN, &[1.0], 0.0).unwrap_err();
    assert_eq!(err.field, "lse_a");
    let err = merge_state(&[1.0f32], 0.0, &[1.0], f32::INFINITY).unwrap_err();
    assert_eq!(err.field, "lse_b");
    let err = merge_states(&[1.0f64; 4], &[0.0; 2], &[1.0; 4], &[0.0; 3], 2).unwrap_err();
    assert_eq!(err.field, "lse_b");
    let err = merge_states(&[1.0f64; 5], &[0.0; 2], &[1.0; 4], &[0.0; 2], 2).unwrap_err();
    assert_eq!(err.field, "o_a");
    let err = merge_states(&[1.0f64; 4], &[0.0, f64::NAN], &[1.0; 4], &[0.0; 2], 2).unwrap_err();
    assert_eq!(err.field, "lse_a[1]");
    let err = apply_sink(&mut [1.0f64], 0.0, f64::NEG_INFINITY).unwrap_err();
    assert_eq!(err.field, "sink");
}

#[test]
fn merge_many_folds_any_number_of_states_and_empties_rows_that_saw_no_key() {
    use attnforge::merge::{merge_many, MergeShape};
    let shape = MergeShape {
        rows: 2,
        heads: 1,
        head_dim: 2,
    };
    let ninf = f64::NEG_INFINITY;
    // Row 0: three states with equal LSE average their o; row 1: every state empty.
    let s0 = (vec![1.0, 2.0, 9.0, 9.0], vec![0.5, ninf]);
    let s1 = (vec![3.0, 4.0, 9.0, 9.0], vec![0.5, ninf]);
    let s2 = (vec![5.0, 6.0, 9.0, 9.0], vec![0.5, ninf]);
    let states = [
        (&s0.0[..], &s0.1[..]),
        (&s1.0[..], &s1.1[..]),
        (&s2.0[..], &s2.1[..]),
    ];
    let (o, lse) = merge_many(shape, &states).unwrap();
    assert!((o[0] - 3.0).abs() < 1e-12 && (o[1] - 4.0).abs() < 1e-12);
    assert!((lse[0] - (0.5 + 3f64.ln())).abs() < 1e-12);
    assert_eq!((&o[2..], lse[1]), (&[0.0, 0.0][..], ninf));
    // One state is itself, but an empty row still becomes (0, -inf).
    let (o, lse) = merge_many(shape, &states[..1]).unwrap();
    assert_eq!((o, lse), (vec![1.0, 2.0, 0.0, 0.0], vec![0.5, ninf]));
    // No state, or a state of the wrong length, is an error naming it.
    assert!(merge_many::<f64>(shape, &[]).is_err());
    let short = [(&s0.0[..3], &s0.1[..])];
    let err = merge_many(shape, &short).unwrap_err().to_string();
    assert!(err.contains("o of state 0"), "{err}");
}
