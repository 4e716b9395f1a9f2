//! The exact reference against an independent brute force, hand-computed cases, invariants and
//! the f16-accumulation emulation.

use attnforge::dtype::DType;
use attnforge::problem::{
    AttentionProblem, CustomMask, HeadDims, LogitSite, Mask, QkAccum, RaggedBatch, Variant,
};
use attnforge::reference::{self, logits};
use attnforge::tensor::HostTensor;
use attnforge::testing::{random_inputs, sample_custom_variant};
use half::f16;

/// The most naive implementation of docs/semantics.md: loops, the formulas, nothing shared with
/// the reference except the custom closures. Returns (o, lse) per (token, head).
fn brute_force(
    p: &AttentionProblem,
    q: &HostTensor,
    k: &HostTensor,
    v: &HostTensor,
) -> (Vec<f64>, Vec<f64>) {
    let (dqk, dvo) = (p.head_dims.qk(), p.head_dims.vo());
    let mut o_all = vec![0.0; p.batch.total_qo() * p.num_qo_heads * dvo];
    let mut lse_all = vec![0.0; p.batch.total_qo() * p.num_qo_heads];
    let g = p.num_qo_heads / p.num_kv_heads;
    for r in 0..p.batch.qo_indptr.len() - 1 {
        let qs = p.batch.qo_indptr[r] as usize;
        let qo_len = p.batch.qo_indptr[r + 1] as usize - qs;
        let ks = p.batch.kv_indptr[r] as usize;
        let kv_len = p.batch.kv_indptr[r + 1] as usize - ks;
        for i in 0..qo_len {
            for h in 0..p.num_qo_heads {
                let hk = h / g;
                let pos = i as i64 + kv_len as i64 - qo_len as i64;
                let mut ts = Vec::new();
                for j in 0..kv_len {
                    let jj = j as i64;
                    let visible = match &p.mask {
                        Mask::None => true,
                        Mask::Causal => jj <= pos,
                        Mask::SlidingWindow { window_left } => jj <= pos && jj >= pos - window_left,
                        Mask::Custom(m) => {
                            let bit = i * kv_len + j;
                            (m.packed[m.mask_indptr[r] + bit / 8] >> (bit % 8)) & 1 == 1
                        }
                    };
                    let site = LogitSite {
                        request: r,
                        qo_idx: i,
                        kv_idx: j,
                        qo_head: h,
                        kv_head: hk,
                        qo_len,
                        kv_len,
                    };
                    let variant_visible = match &p.variant {
                        Variant::Custom(c) => c.cpu_mask.as_ref().is_none_or(|m| m(&site)),
                        _ => true,
                    };
                    if !visible || !variant_visible {
                        continue;
                    }
                    let mut dot = 0.0f64;
                    for e in 0..dqk {
                        dot += q.get_f32(p.q_view.index(qs + i, h, e)) as f64
                            * k.get_f32(p.k_view.index(ks + j, hk, e)) as f64;
                    }
                    let s = p.sm_scale as f64 * dot;
                    let t = match &p.variant {
                        Variant::None | Variant::Sinks { .. } => s,
                        Variant::SoftCap { cap } => *cap as f64 * (s / *cap as f64).tanh(),
                        Variant::Alibi { slopes } => s + slopes[h] as f64 * (j as f64 - pos as f64),
                        Variant::Custom(c) => (c.cpu_transform)(s as f32, &site) as f64,
                    };
                    ts.push((j, t));
                }
                let sink = match &p.variant {
                    Variant::Sinks { sinks } => Some(sinks[h] as f64),
                    _ => None,
                };
                let row = (qs + i) * p.num_qo_heads + h;
                if ts.is_empty() {
                    lse_all[row] = sink.unwrap_or(f64::NEG_INFINITY);
                    continue;
                }
                // Logits are O(1) in these tests: no max subtraction needed.
                let denom: f64 =
                    ts.iter().map(|(_, t)| t.exp()).sum::<f64>() + sink.map_or(0.0, f64::exp);
                lse_all[row] = denom.ln();
                for &(j, t) in &ts {
                    for e in 0..dvo {
                        o_all[row * dvo + e] +=
                            t.exp() / denom * v.get_f32(p.v_view.index(ks + j, hk, e)) as f64;
                    }
                }
            }
        }
    }
    (o_all, lse_all)
}

fn assert_close(a: &[f64], b: &[f64], tol: f64, what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        let ok = (x == y) || (x - y).abs() <= tol * (1.0 + y.abs());
        assert!(ok, "{what}[{i}]: {x} vs {y}");
    }
}

fn small_problems() -> Vec<AttentionProblem> {
    let lens = [(3usize, 5usize), (1, 1), (4, 2), (2, 9)];
    let batch = RaggedBatch::from_lens(&lens).unwrap();
    let masks: Vec<Vec<bool>> = lens
        .iter()
        .enumerate()
        .map(|(r, &(q, k))| (0..q * k).map(|b| (b * 7 + r) % 3 != 0).collect())
        .collect();
    let all_masks = [
        Mask::None,
        Mask::Causal,
        Mask::SlidingWindow { window_left: 0 },
        Mask::SlidingWindow { window_left: 2 },
        Mask::Custom(CustomMask::pack(&masks)),
    ];
    let hq = 4;
    let variants = [
        Variant::None,
        Variant::SoftCap { cap: 0.7 },
        Variant::Alibi {
            slopes: vec![0.5, 0.25, 0.125, 0.0625],
        },
        Variant::Sinks {
            sinks: vec![0.3, -1.0, 2.0, 0.0],
        },
        Variant::Custom(sample_custom_variant(hq, 9)),
    ];
    let mut out = Vec::new();
    for (mi, mask) in all_masks.iter().enumerate() {
        for (vi, variant) in variants.iter().enumerate() {
            let dims = HeadDims::all().nth((mi + vi) % 4).unwrap();
            let dtype = [DType::F32, DType::F16, DType::Bf16][(mi + vi) % 3];
            let kv_heads = [1, 2, 4][(mi * 5 + vi) % 3];
            out.push(
                AttentionProblem::new(batch.clone(), hq, kv_heads, dims, dtype)
                    .with_mask(mask.clone())
                    .with_variant(variant.clone()),
            );
        }
    }
    out
}

#[test]
fn matches_brute_force_on_every_mask_and_variant() {
    for (n, p) in small_problems().iter().enumerate() {
        let (q, k, v) = random_inputs(p, n as u64);
        let got = reference::attention(p, &q, &k, &v).unwrap();
        let (o, lse) = brute_force(p, &q, &k, &v);
        let what = format!("problem {n} ({:?}, {:?})", p.mask.kind(), p.variant.kind());
        assert_close(&got.o, &o, 1e-12, &format!("{what} o"));
        assert_close(&got.lse, &lse, 1e-12, &format!("{what} lse"));
    }
}

#[test]
fn attention_rows_equal_the_whole_result() {
    let p = &small_problems()[7];
    let (q, k, v) = random_inputs(p, 1);
    let whole = reference::attention(p, &q, &k, &v).unwrap();
    let rows = [(0, 0), (9, 3), (4, 1), (0, 0)];
    let got = reference::attention_rows(p, &q, &k, &v, &rows).unwrap();
    let dvo = p.head_dims.vo();
    for (&(t, h), row) in rows.iter().zip(&got) {
        let at = t * p.num_qo_heads + h;
        assert_eq!(row.o, whole.o[at * dvo..(at + 1) * dvo].to_vec());
        assert_eq!(row.lse.to_bits(), whole.lse[at].to_bits());
    }
    let err = reference::attention_rows(p, &q, &k, &v, &[(0, 0), (10, 0)]).unwrap_err();
    assert_eq!(err.field, "rows[1]");
    let err = reference::attention_rows(p, &q, &k, &v, &[(0, 4)]).unwrap_err();
    assert_eq!(err.field, "rows[0]");
}

/// One query over two keys, d = 64: q = e0, k0 = 2 e0, k1 = e1, v0 = e0, v1 = e1, scale 1/2, so
/// the raw logits are s0 = 1, s1 = 0.
fn two_keys(variant: Variant, mask: Mask) -> (f64, f64, f64) {
    let d = 64;
    let p = AttentionProblem::new(
        RaggedBatch::single(1, 2).unwrap(),
        1,
        1,
        HeadDims::equal(d).unwrap(),
        DType::F32,
    )
    .with_sm_scale(0.5)
    .with_variant(variant)
    .with_mask(mask);
    let unit = |i: usize, x: f32| {
        let mut v = vec![0.0f32; d];
        v[i] = x;
        v
    };
    let q = HostTensor::F32(unit(0, 1.0));
    let k = HostTensor::F32([unit(0, 2.0), unit(1, 1.0)].concat());
    let v = HostTensor::F32([unit(0, 1.0), unit(1, 1.0)].concat());
    let out = reference::attention(&p, &q, &k, &v).unwrap();
    (out.o[0], out.o[1], out.lse[0])
}

#[test]
fn hand_computed_two_key_cases() {
    let e = 1f64.exp();
    let close = |a: f64, b: f64| assert!((a - b).abs() < 1e-15, "{a} vs {b}");

    let (o0, o1, lse) = two_keys(Variant::None, Mask::None);
    close(lse, (e + 1.0).ln());
    close(o0, e / (e + 1.0));
    close(o1, 1.0 / (e + 1.0));

    // Causal with qo_len 1, kv_len 2: the query sits at position 1 and sees both keys.
    let (o0, _, lse) = two_keys(Variant::None, Mask::Causal);
    close(lse, (e + 1.0).ln());
    close(o0, e / (e + 1.0));

    // Window 0: only the diagonal key 1 (s = 0).
    let (o0, o1, lse) = two_keys(Variant::None, Mask::SlidingWindow { window_left: 0 });
    close(lse, 0.0);
    close(o0, 0.0);
    close(o1, 1.0);

    // Soft-cap 0.5: t0 = 0.5 tanh(2), t1 = 0.
    let t0 = 0.5 * 2f64.tanh();
    let (o0, _, lse) = two_keys(Variant::SoftCap { cap: 0.5 }, Mask::None);
    close(lse, (t0.exp() + 1.0).ln());
    close(o0, t0.exp() / (t0.exp() + 1.0));

    // ALiBi slope 0.5: t_j = s_j + 0.5 (j - 1): t0 = 0.5, t1 = 0.
    let (o0, _, lse) = two_keys(Variant::Alibi { slopes: vec![0.5] }, Mask::None);
    close(lse, (0.5f64.exp() + 1.0).ln());
    close(o0, 0.5f64.exp() / (0.5f64.exp() + 1.0));

    // Sink ln 2: the denominator gains 2, the values do not.
    let sink = 2f64.ln() as f32;
    let (o0, o1, lse) = two_keys(Variant::Sinks { sinks: vec![sink] }, Mask::None);
    let denom = e + 1.0 + (sink as f64).exp();
    close(lse, denom.ln());
    close(o0, e / denom);
    close(o1, 1.0 / denom);
}

#[test]
fn rows_without_keys_give_zero_and_minus_infinity_or_the_sink() {
    // Causal with qo_len 3 > kv_len 1: d = -2, so rows 0 and 1 see nothing; request 2 has no key.
    let lens = [(3, 1), (2, 0)];
    for sinks in [None, Some(vec![0.75f32, -0.5])] {
        let mut p = AttentionProblem::new(
            RaggedBatch::from_lens(&lens).unwrap(),
            2,
            1,
            HeadDims::equal(64).unwrap(),
            DType::F16,
        )
        .with_mask(Mask::Causal);
        if let Some(s) = &sinks {
            p = p.with_variant(Variant::Sinks { sinks: s.clone() });
        }
        let (q, k, v) = random_inputs(&p, 3);
        let out = reference::attention(&p, &q, &k, &v).unwrap();
        for token in 0..5 {
            for h in 0..2 {
                let row = token * 2 + h;
                let o = &out.o[row * 64..(row + 1) * 64];
                if token == 2 {
                    assert!(out.lse[row].is_finite() && o.iter().all(|x| *x != 0.0));
                    continue;
                }
                assert!(o.iter().all(|&x| x == 0.0), "token {token} head {h}");
                let expected = sinks.as_ref().map_or(f64::NEG_INFINITY, |s| s[h] as f64);
                assert_eq!(out.lse[row], expected, "token {token} head {h}");
            }
        }
    }
}

#[test]
fn softmax_weights_sum_to_one_and_match_the_lse() {
    // v_j = e_j (one-hot): o is the row of softmax weights P; V of ones would give 1 exactly.
    let kv_len = 60;
    let d = 64;
    for (n, variant) in [
        Variant::None,
        Variant::SoftCap { cap: 1.5 },
        Variant::Alibi {
            slopes: vec![0.3, 0.01],
        },
    ]
    .into_iter()
    .enumerate()
    {
        let p = AttentionProblem::new(
            RaggedBatch::single(7, kv_len).unwrap(),
            2,
            1,
            HeadDims::equal(d).unwrap(),
            DType::F32,
        )
        .with_mask(Mask::SlidingWindow { window_left: 40 })
        .with_variant(variant);
        let (q, k, _) = random_inputs(&p, 10 + n as u64);
        let mut one_hot = vec![0.0f32; kv_len * d];
        for j in 0..kv_len {
            one_hot[j * d + j] = 1.0;
        }
        let v = HostTensor::F32(one_hot);
        let out = reference::attention(&p, &q, &k, &v).unwrap();
        for row in 0..7 * 2 {
            let (i, h) = (row / 2, row % 2);
            let weights = &out.o[row * d..row * d + kv_len];
            let total: f64 = weights.iter().sum();
            assert!((total - 1.0).abs() < 1e-13, "row {row}: sum {total}");
            // Each visible weight is exp(t_j - lse), t_j recomputed independently.
            let qv: Vec<f64> = (0..d)
                .map(|e| q.get_f32(i * 2 * d + h * d + e) as f64)
                .collect();
            for (j, &w) in weights.iter().enumerate() {
                let pos = i as i64 + (kv_len - 7) as i64;
                let visible = (j as i64) <= pos && (j as i64) >= pos - 40;
                if !visible {
                    assert_eq!(w, 0.0);
                    continue;
                }
                let kv: Vec<f64> = (0..d).map(|e| k.get_f32(j * d + e) as f64).collect();
                let s = logits::scaled_logit(QkAccum::F32, p.sm_scale, &qv, &kv);
                let site = LogitSite {
                    request: 0,
                    qo_idx: i,
                    kv_idx: j,
                    qo_head: h,
                    kv_head: 0,
                    qo_len: 7,
                    kv_len,
                };
                let t = logits::transform(&p.variant, s, &site);
                assert!(
                    (w - (t - out.lse[row]).exp()).abs() < 1e-14,
                    "row {row} key {j}"
                );
            }
        }
    }
}

/// f16 values for a d = 64 row made of four 16-wide chunks.
fn chunks(c: [[f32; 2]; 4]) -> Vec<f64> {
    c.iter()
        .flat_map(|&[first, rest]| std::iter::once(first).chain(std::iter::repeat_n(rest, 15)))
        .map(|x| f16::from_f32(x).to_f64())
        .collect()
}

#[test]
fn f16_accumulation_rounds_after_every_chunk() {
    // sm_scale 1/8 = 2^-3: prescale 2^-3, post-scale 1. q = 8 everywhere, so q' = 1.
    let sm_scale = 0.125f32;
    let q = vec![8.0; 64];
    // Chunk sums (of q' k): 2048, 1, 1, 0. Exactly: 2050. In f16: 2048 + 1 = 2049 is a tie that
    // rounds to even (2048), twice.
    let k_tie = chunks([[128.0, 128.0], [1.0, 0.0], [1.0, 0.0], [0.0, 0.0]]);
    assert_eq!(
        logits::f16_accumulated_logit(sm_scale, &q, &k_tie),
        Some(2048.0)
    );
    assert_eq!(
        logits::scaled_logit(QkAccum::F32, sm_scale, &q, &k_tie),
        2050.0
    );
    // Chunk sums 2048, 2, 0, 0: 2050 is an f16 value, nothing is lost.
    let k_exact = chunks([[128.0, 128.0], [2.0, 0.0], [0.0, 0.0], [0.0, 0.0]]);
    assert_eq!(
        logits::f16_accumulated_logit(sm_scale, &q, &k_exact),
        Some(2050.0)
    );

    // The same keys in a problem: f16 accumulation sees logits 2048 and 2050, f32 sees 2050 twice.
    let p = AttentionProblem::new(
        RaggedBatch::single(1, 2).unwrap(),
        1,
        1,
        HeadDims::equal(64).unwrap(),
        DType::F16,
    )
    .with_sm_scale(sm_scale);
    let to_f16 = |x: &[f64]| HostTensor::F16(x.iter().map(|&v| f16::from_f64(v)).collect());
    let qt = to_f16(&q);
    let kt = to_f16(&[k_tie.clone(), k_exact.clone()].concat());
    let vt = to_f16(&[vec![1.0; 64], vec![-1.0; 64]].concat());
    let f32_out = reference::attention(&p, &qt, &kt, &vt).unwrap();
    let f16_out =
        reference::attention(&p.clone().with_qk_accum(QkAccum::F16), &qt, &kt, &vt).unwrap();
    assert!((f32_out.lse[0] - (2050.0 + 2f64.ln())).abs() < 1e-12);
    assert!(f32_out.o[0].abs() < 1e-15);
    let expected_lse = 2050.0 + (1.0 + (-2f64).exp()).ln();
    assert!((f16_out.lse[0] - expected_lse).abs() < 1e-12);
    let w0 = (2048.0 - expected_lse).exp();
    assert!((f16_out.o[0] - (w0 - (1.0 - w0))).abs() < 1e-12);
}

#[test]
fn f16_accumulation_post_scale_is_an_f32_multiply() {
    // sm_scale 0.3: prescale 2^-2, post-scale 1.2 (as f32). q = 4, k = 1: q' = 1, acc = 64.
    let sm_scale = 0.3f32;
    let q = vec![4.0; 64];
    let k = vec![1.0; 64];
    let post = sm_scale / 0.25;
    assert_eq!(
        logits::f16_accumulated_logit(sm_scale, &q, &k),
        Some((64.0f32 * post) as f64)
    );
}

#[test]
fn f16_overflow_falls_back_to_f32_accumulation() {
    let sm_scale = 0.125f32;
    let q = vec![8.0; 64];
    // Chunk sums 70016 (past the f16 maximum 65504), -70016, 1, 1: the exact dot is 16 (x 8).
    let k = chunks([[4376.0, 4376.0], [-4376.0, -4376.0], [1.0, 0.0], [1.0, 0.0]]);
    assert_eq!(logits::f16_accumulated_logit(sm_scale, &q, &k), None);
    assert_eq!(logits::scaled_logit(QkAccum::F16, sm_scale, &q, &k), 2.0);
    // Just inside the range: 65504 stays finite.
    let k_max = chunks([[4094.0, 4094.0], [0.0, 0.0], [0.0, 0.0], [0.0, 0.0]]);
    assert_eq!(
        logits::f16_accumulated_logit(sm_scale, &q, &k_max),
        Some(65504.0)
    );

    // In a whole problem the overflowing logit is finite and the output has no NaN.
    let p = AttentionProblem::new(
        RaggedBatch::single(1, 2).unwrap(),
        1,
        1,
        HeadDims::equal(64).unwrap(),
        DType::F16,
    )
    .with_sm_scale(sm_scale)
    .with_qk_accum(QkAccum::F16);
    let to_f16 = |x: &[f64]| HostTensor::F16(x.iter().map(|&v| f16::from_f64(v)).collect());
    let out = reference::attention(
        &p,
        &to_f16(&q),
        &to_f16(&[k.clone(), k].concat()),
        &to_f16(&[vec![1.0; 64], vec![3.0; 64]].concat()),
    )
    .unwrap();
    assert!((out.lse[0] - (2.0 + 2f64.ln())).abs() < 1e-12);
    assert!((out.o[0] - 2.0).abs() < 1e-12);
}

#[test]
fn rejects_non_finite_inputs_and_custom_transforms_returning_nan() {
    let p = &small_problems()[0];
    let (mut q, k, v) = random_inputs(p, 0);
    if let HostTensor::F32(x) = &mut q {
        x[70] = f32::NAN;
    } else {
        panic!("problem 0 is f32");
    }
    let err = reference::attention(p, &q, &k, &v).unwrap_err();
    assert!(err.field.starts_with("q[token 0, head 1"), "{err}");

    // The sample custom variant made for 2 heads, used with 4: heads 2 and 3 return NaN.
    let p = small_problems()[4]
        .clone()
        .with_variant(Variant::Custom(sample_custom_variant(2, 0)));
    let (q, k, v) = random_inputs(&p, 0);
    let err = reference::attention(&p, &q, &k, &v).unwrap_err();
    assert_eq!(err.field, "custom variant transform");
}

#[test]
fn invalid_problems_are_rejected_before_work() {
    let p = small_problems()[0].clone().with_sm_scale(f32::NAN);
    let (q, k, v) = random_inputs(&small_problems()[0], 0);
    assert_eq!(
        reference::attention(&p, &q, &k, &v).unwrap_err().field,
        "sm_scale"
    );
    let short = HostTensor::F32(vec![1.0; 3]);
    assert_eq!(
        reference::attention(&small_problems()[0], &short, &k, &v)
            .unwrap_err()
            .field,
        "q"
    );
}
