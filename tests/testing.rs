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
