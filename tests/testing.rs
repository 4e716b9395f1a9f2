//! Tests of the shared case list and input generator (`attnforge::testing`).

use attnforge::dtype::DType;
use attnforge::problem::{MaskKind, QkAccum, VariantKind};
use attnforge::reference;
use attnforge::testing::{cases, random_inputs, BackendCaps, Suite};
use std::collections::HashSet;

#[test]
fn quick_cases_are_valid_unique_and_nonzero() {
    let list = cases(Suite::Quick, 7, &BackendCaps::cpu());
    assert!(list.len() >= 30, "only {} cases", list.len());
    let mut names = HashSet::new();
    for case in &list {
        assert!(
            names.insert(case.name.clone()),
            "duplicate name {}",
            case.name
        );
        let (q, k, v) = case.inputs();
        case.problem
            .validate_inputs(&q, &k, &v)
            .unwrap_or_else(|e| panic!("{}: {e}", case.name));
        for t in [&q, &k, &v] {
            assert!(
                t.to_f32_vec().iter().all(|&x| x != 0.0 && x.is_finite()),
                "{}",
                case.name
            );
        }
    }
}

#[test]
fn quick_suite_covers_every_axis() {
    let list = cases(Suite::Quick, 1, &BackendCaps::cpu());
    let masks: HashSet<MaskKind> = list.iter().map(|c| c.problem.mask.kind()).collect();
    let variants: HashSet<VariantKind> = list.iter().map(|c| c.problem.variant.kind()).collect();
    let dtypes: HashSet<DType> = list.iter().map(|c| c.problem.input_dtype).collect();
    let groups: HashSet<usize> = list.iter().map(|c| c.problem.group_size()).collect();
    let dims: HashSet<_> = list.iter().map(|c| c.problem.head_dims).collect();
    assert_eq!(masks.len(), MaskKind::ALL.len());
    assert_eq!(variants.len(), 5);
    assert_eq!(dtypes.len(), 3);
    assert_eq!(groups, HashSet::from([1, 4, 7, 8]));
    assert_eq!(dims.len(), 4);
    assert!(list.iter().any(|c| c.problem.qk_accum == QkAccum::F16));
    let lens: HashSet<usize> = list
        .iter()
        .flat_map(|c| c.problem.batch.lens())
        .flat_map(|(q, k)| [q, k])
        .collect();
    for l in [1, 17, 127, 128, 129] {
        assert!(lens.contains(&l), "no request of length {l}");
    }
    assert!(list.iter().any(|c| c.problem.batch.len() == 64));
}

#[test]
fn cuda_caps_leave_out_f32_and_cpu_only_variants() {
    for case in cases(Suite::Full, 3, &BackendCaps::cuda()) {
        assert_ne!(case.problem.input_dtype, DType::F32, "{}", case.name);
        if let attnforge::Variant::Custom(c) = &case.problem.variant {
            assert!(c.cuda.is_some(), "{}", case.name);
        }
    }
}

#[test]
fn max_work_shrinks_or_drops_cases() {
    let mut caps = BackendCaps::cpu();
    caps.max_work = 200_000;
    let list = cases(Suite::Full, 3, &caps);
    assert!(!list.is_empty());
    for case in &list {
        let p = &case.problem;
        let w: usize = p
            .batch
            .lens()
            .iter()
            .map(|&(q, k)| q * k * p.num_qo_heads * (p.head_dims.qk() + p.head_dims.vo()))
            .sum();
        assert!(w <= caps.max_work, "{} has work {w}", case.name);
    }
}

#[test]
fn inputs_are_deterministic_in_the_seed() {
    let case = &cases(Suite::Quick, 11, &BackendCaps::cpu())[3];
    let a = random_inputs(&case.problem, 5);
    let b = random_inputs(&case.problem, 5);
    let c = random_inputs(&case.problem, 6);
    assert_eq!(a, b);
    assert_ne!(a, c);
}

#[test]
fn reference_runs_every_quick_case() {
    let start = std::time::Instant::now();
    for case in cases(Suite::Quick, 2, &BackendCaps::cpu()) {
        let (q, k, v) = case.inputs();
        let out = reference::attention(&case.problem, &q, &k, &v)
            .unwrap_or_else(|e| panic!("{}: {e}", case.name));
        assert!(out.o.iter().all(|x| x.is_finite()), "{}", case.name);
        assert!(out.lse.iter().all(|x| !x.is_nan()), "{}", case.name);
    }
    eprintln!("reference over the quick suite: {:?}", start.elapsed());
}

/// Raw scaled logits of the first request of a case (all query heads), under its accumulation.
fn raw_logits(case: &attnforge::testing::Case) -> Vec<(f64, Option<f64>)> {
    use attnforge::reference::logits;
    let p = &case.problem;
    let (q, k, _) = case.inputs();
    let (_, qo_len, _, kv_len) = p.batch.request(0);
    let d = p.head_dims.qk();
    let row = |t: &attnforge::HostTensor, view: &attnforge::problem::TensorView, tok, h| {
        (0..d)
            .map(|e| f64::from(t.get_f32(view.index(tok, h, e))))
            .collect::<Vec<_>>()
    };
    let mut out = Vec::new();
    for i in 0..qo_len {
        for h in 0..p.num_qo_heads {
            let qr = row(&q, &p.q_view, i, h);
            for j in 0..kv_len {
                let kr = row(&k, &p.k_view, j, p.kv_head_of(h));
                out.push((
                    logits::scaled_logit(QkAccum::F32, p.sm_scale, &qr, &kr),
                    logits::f16_accumulated_logit(p.sm_scale, &qr, &kr),
                ));
            }
        }
    }
    out
}

#[test]
fn targeted_cases_reach_their_regimes() {
    let list = cases(Suite::Quick, 5, &BackendCaps::cpu());
    let near_max: Vec<_> = list
        .iter()
        .filter(|c| c.name.ends_with("logits-near-f16-max"))
        .collect();
    assert_eq!(near_max.len(), 2);
    for case in near_max {
        let l = raw_logits(case);
        let overflowed = l.iter().filter(|(_, f16)| f16.is_none()).count();
        let big = l
            .iter()
            .filter(|(_, f16)| f16.is_some_and(|s| s.abs() > 20_000.0))
            .count();
        assert!(
            overflowed > 0 && big > 0,
            "{}: {overflowed} overflowed, {big} big",
            case.name
        );
        assert!(
            overflowed < l.len() / 2,
            "{}: {overflowed} of {}",
            case.name,
            l.len()
        );
    }
    let capped: Vec<_> = list
        .iter()
        .filter(|c| c.name.ends_with("logits-100x-cap"))
        .collect();
    assert_eq!(capped.len(), 2);
    for case in capped {
        let attnforge::Variant::SoftCap { cap } = case.problem.variant else {
            panic!("{} is not soft-capped", case.name);
        };
        let max = raw_logits(case)
            .iter()
            .map(|(s, _)| s.abs())
            .fold(0.0, f64::max);
        assert!(
            max >= 100.0 * f64::from(cap),
            "{}: max |s| {max}",
            case.name
        );
    }
}

#[test]
fn full_case_names_are_unique() {
    let list = cases(Suite::Full, 9, &BackendCaps::cpu());
    let names: HashSet<&str> = list.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names.len(), list.len());
}
