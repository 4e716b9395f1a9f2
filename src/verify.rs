//! Running the shared case list through a backend and judging it against the exact reference.
//!
//! `attnforge verify` for every backend goes through [`run_cases`]: for each
//! [`Case`], the backend computes the output (the GPU backend poisons its
//! output buffers with NaN first), the reference computes the exact rows (all rows of small
//! problems, a spread sample of large ones), and [`crate::compare`] decides with the case's
//! tolerance. Nothing is skipped silently: a backend error is a failed case with its message.
//!
//! A backend may bring a full reference of its own ([`Backend::full_reference`]; the CUDA
//! backend: the GPU reference kernel). Then a large case is judged on every row against it (the
//! case's tolerance), and its sampled rows still against the exact reference, both the output's
//! (the case's tolerance) and the full reference's ([`Tolerance::gpu_reference`]); every other
//! case checks the full reference against the exact one on all rows, so a wrong full reference
//! fails the suite. The judgements besides the main one are in [`CaseResult::also`].

use crate::compare::{compare, compare_rows, Comparison, Tolerance};
use crate::merge::MergeShape;
use crate::paged::{PagedAttention, PagedCache};
use crate::problem::AttentionProblem;
use crate::reference::{self, ReferenceOutput, RowOutput};
use crate::tensor::HostTensor;
use crate::testing::{
    merge_expected, BackendCaps, Case, MergeCase, PagedInputs, PagedRun, TileRequest,
};
use crate::{AttentionOutput, Error};
use std::time::{Duration, Instant};

/// Reference multiply-adds above which only sampled rows are checked (the f64 reference of a
/// larger case would take longer than the whole suite should).
const FULL_REFERENCE_LIMIT: usize = 1 << 30;
/// Rows checked in a sampled comparison.
const SAMPLED_ROWS: usize = 256;

/// Something that computes attention on host tensors.
pub trait Backend {
    /// Short name, as on the command line (`cpu`, `cuda`).
    fn name(&self) -> &'static str;
    /// One line on what runs (instruction set and threads, or the device).
    fn describe(&self) -> String;
    /// What it runs; the suite lists only cases inside it.
    fn caps(&self) -> BackendCaps;
    /// Computes `problem` on the host tensors, with the tile `tile` asks for (a backend with one
    /// tiling runs every problem with it).
    fn run(
        &self,
        problem: &AttentionProblem,
        q: &HostTensor,
        k: &HostTensor,
        v: &HostTensor,
        tile: TileRequest,
    ) -> Result<AttentionOutput, Error>;
    /// Gets ready to run `cases`, without waiting for what it starts: the GPU backend starts
    /// compiling their kernels into the disk cache on background threads, and each case's run
    /// waits only for its own kernels. Nothing by default.
    fn prepare(&self, cases: &[Case]) -> Result<(), Error> {
        let _ = cases;
        Ok(())
    }
    /// Computes a paged problem on the host cache, which holds the ragged `k`, `v` (an fp8 cache
    /// holds them quantised); `run` says how (the GPU-only ways are asked only of backends whose caps say `device_runs`), `tile`
    /// with which tile (as for [`run`](Self::run)).
    fn run_paged(
        &self,
        problem: &PagedAttention,
        q: &HostTensor,
        cache: PagedCache<'_>,
        tokens: (&HostTensor, &HostTensor),
        run: PagedRun,
        tile: TileRequest,
    ) -> Result<AttentionOutput, Error>;
    /// The whole problem computed by an independent reference of the backend's own, for the
    /// cases too large for the f64 reference (see the module doc); `None` (the default) when the
    /// backend has none. The CUDA backend runs the GPU reference kernel.
    fn full_reference(
        &self,
        problem: &AttentionProblem,
        q: &HostTensor,
        k: &HostTensor,
        v: &HostTensor,
    ) -> Option<Result<AttentionOutput, Error>> {
        let _ = (problem, q, k, v);
        None
    }
    /// Why the backend can run nothing more, or `None` (the default) while it can: the CUDA
    /// backend after an error that poisons its context (an illegal address in a kernel), which
    /// every later call would repeat. Asked after a failed case.
    fn lost(&self) -> Option<String> {
        None
    }
    /// Merges partial states of one `shape` (each `o [rows, heads, head_dim]` in one dtype with
    /// its f32 `lse [rows, heads]`) into one; returns the merged `(o, lse)`.
    fn merge_states(
        &self,
        shape: MergeShape,
        states: &[(HostTensor, Vec<f32>)],
    ) -> Result<(HostTensor, Vec<f32>), Error>;
    /// Checks of the backend itself beside the case list, each judged like a case and named
    /// under [`SELF_CHECK`]; none by default. `small` is a small case a check may run (the CUDA
    /// backend: a buffer beyond the GPU's memory is refused with an error naming its size, then
    /// `small` runs and passes).
    fn self_checks(&self, small: &Case) -> Vec<CaseResult> {
        let _ = small;
        Vec::new()
    }
}

/// The name prefix of the backends' self-checks ([`Backend::self_checks`]).
pub const SELF_CHECK: &str = "self-check/";

/// The case of least reference work among `cases` that reads a ragged K/V (the one a
/// self-check runs).
pub fn smallest_case(cases: &[Case]) -> Option<&Case> {
    cases
        .iter()
        .filter(|c| c.paged.is_none())
        .min_by_key(|c| reference_work(&c.problem))
}

/// The verdict on one case.
#[derive(Debug)]
pub struct CaseResult {
    /// The case's name.
    pub name: String,
    /// The comparison, or the error the backend or reference returned.
    pub outcome: Result<Comparison, String>,
    /// Whether it passed.
    pub passed: bool,
    /// What `outcome` compared the output with.
    pub oracle: Oracle,
    /// Further judgements of the same case, each with its label and verdict: a split-pair case
    /// ([`PagedRun::OppositeSplit`]) judges its planned run against the reference and the two
    /// runs against each other; with a backend's full reference, the full reference against the
    /// exact one and (large cases) the output's sampled rows against the exact reference.
    pub also: Vec<(String, Result<Comparison, String>, bool)>,
    /// Time of the backend's run.
    pub backend_time: Duration,
}

/// What a case's main judgement compared the output with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Oracle {
    /// The exact (f64) reference, every row.
    Exact,
    /// The exact reference on a spread sample of rows (a large case, no full reference).
    ExactSampled,
    /// The backend's full reference ([`Backend::full_reference`]), every row (a large case).
    FullReference,
}

impl Oracle {
    /// A few words for reports (empty for the exact reference on every row).
    pub fn describe(self) -> &'static str {
        match self {
            Oracle::Exact => "",
            Oracle::ExactSampled => "sampled rows",
            Oracle::FullReference => "all rows vs the GPU reference",
        }
    }
}

/// Totals of a run.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Summary {
    /// Cases that passed.
    pub passed: usize,
    /// Cases that failed.
    pub failed: usize,
    /// Cases not run because the backend was lost ([`Backend::lost`]) before them.
    pub not_run: usize,
    /// Why the run stopped early: the failed case after which the backend was lost, and why.
    pub stopped: Option<String>,
}

/// `n` rows `(query token, query head)` of `p` spread over its tokens, the first and the last
/// included, heads varied: the rows a sampled comparison checks (verify, bench, demo).
pub fn sample_rows(p: &AttentionProblem, n: usize) -> Vec<(usize, usize)> {
    let total = p.batch.total_qo();
    let n = n.min(total * p.num_qo_heads);
    (0..n)
        .map(|i| {
            let token = if n > 1 { i * (total - 1) / (n - 1) } else { 0 };
            (token, (i * 7 + i / 3) % p.num_qo_heads)
        })
        .collect()
}

fn reference_work(p: &AttentionProblem) -> usize {
    p.batch.lens().iter().map(|&(q, k)| q * k).sum::<usize>()
        * p.num_qo_heads
        * (p.head_dims.qk() + p.head_dims.vo())
}

/// What an output is compared with: a whole output, or sampled rows `(token, head)` of it.
enum Expected {
    All(ReferenceOutput),
    Rows(Vec<(usize, usize)>, Vec<RowOutput>),
}

/// The exact reference of `case`: every row, or a spread sample of a large problem (`sampled`).
fn exact_reference(
    case: &Case,
    (q, k, v): (&HostTensor, &HostTensor, &HostTensor),
    exact_kv: Option<&(Vec<f64>, Vec<f64>)>,
    sampled: bool,
) -> Result<Expected, String> {
    if let Some((ke, ve)) = exact_kv {
        let kv = (ke.clone(), ve.clone());
        return if sampled {
            let rows = sample_rows(&case.problem, SAMPLED_ROWS);
            let expected = reference::attention_rows_exact_kv(&case.problem, q, kv, &rows)
                .map_err(|e| e.to_string())?;
            Ok(Expected::Rows(rows, expected))
        } else {
            reference::attention_exact_kv(&case.problem, q, kv.0, kv.1)
                .map(Expected::All)
                .map_err(|e| e.to_string())
        };
    }
    if sampled {
        let rows = sample_rows(&case.problem, SAMPLED_ROWS);
        let expected =
            reference::attention_rows(&case.problem, q, k, v, &rows).map_err(|e| e.to_string())?;
        Ok(Expected::Rows(rows, expected))
    } else {
        let expected = reference::attention(&case.problem, q, k, v).map_err(|e| e.to_string())?;
        Ok(Expected::All(expected))
    }
}

/// The comparison of `out` with `expected` (either side may have failed to exist).
fn judge(
    case: &Case,
    out: Result<&AttentionOutput, &str>,
    expected: Result<&Expected, &str>,
) -> Result<Comparison, String> {
    let out = out.map_err(str::to_string)?;
    Ok(match expected.map_err(str::to_string)? {
        Expected::All(all) => compare(out, all),
        Expected::Rows(rows, expected) => {
            compare_rows(out, case.problem.num_qo_heads, rows, expected)
        }
    })
}

/// A judgement with its verdict under `tolerance`.
fn verdict(
    label: &str,
    comparison: Result<Comparison, String>,
    tolerance: &Tolerance,
) -> (String, Result<Comparison, String>, bool) {
    let passed = comparison.as_ref().is_ok_and(|c| c.passes(tolerance));
    (label.to_string(), comparison, passed)
}

/// Output `b` as the expected side of a comparison with output `a`.
fn as_expected(b: &AttentionOutput) -> ReferenceOutput {
    let rows = b.lse.as_ref().map_or(0, Vec::len);
    ReferenceOutput {
        o: (0..b.o.len()).map(|i| f64::from(b.o.get_f32(i))).collect(),
        lse: b.lse.as_ref().map_or_else(
            || vec![0.0; rows],
            |l| l.iter().map(|&x| f64::from(x)).collect(),
        ),
    }
}

/// How close split and unsplit runs of one plan must be: half the reference tolerance of the
/// dtype (they differ only in where partial sums are rounded).
fn split_pair_tolerance(case: &Case) -> Tolerance {
    let t = case.tolerance();
    Tolerance {
        rel_l2: t.rel_l2 / 2.0,
        lse_abs: t.lse_abs / 2.0,
    }
}

/// Runs one case.
pub fn run_case(backend: &dyn Backend, case: &Case) -> CaseResult {
    run_case_with_limit(backend, case, FULL_REFERENCE_LIMIT)
}

/// [`run_case`] with the reference work above which a case counts as large.
fn run_case_with_limit(backend: &dyn Backend, case: &Case, limit: usize) -> CaseResult {
    let (q, k, v) = case.inputs();
    let paged = case.paged_inputs(&k, &v).transpose();
    let run = case.paged.map_or(PagedRun::Direct, |p| p.run);
    let run_as = |run: PagedRun| match &paged {
        Ok(None) => backend.run(&case.problem, &q, &k, &v, case.tile),
        Ok(Some(inputs)) => {
            backend.run_paged(&inputs.paged, &q, inputs.cache(), (&k, &v), run, case.tile)
        }
        Err(e) => Err(Error::InvalidProblem(e.clone())),
    };
    let start = Instant::now();
    let out = run_as(run).map_err(|e| e.to_string());
    let backend_time = start.elapsed();
    // An fp8 cache is judged against the reference on its dequantised K/V.
    let (k_ref, v_ref) = match &paged {
        Ok(Some(PagedInputs {
            dequantized: Some((k, v)),
            ..
        })) => (k, v),
        _ => (&k, &v),
    };
    // With f32 QK accumulation it is judged against its exact values (docs/semantics.md), which
    // the GPU reference kernel (f16/bf16 inputs) cannot take: such a case has no full reference,
    // and a large one is judged on sampled rows.
    let exact_kv = match &paged {
        Ok(Some(PagedInputs {
            exact: Some(kv), ..
        })) => Some(kv),
        _ => None,
    };
    let sampled = reference_work(&case.problem) > limit;
    let tolerance = case.tolerance();
    let exact = exact_reference(case, (&q, k_ref, v_ref), exact_kv, sampled);
    let full = match exact_kv {
        Some(_) => None,
        None => backend.full_reference(&case.problem, &q, k_ref, v_ref),
    }
    .map(|r| r.map_err(|e| format!("gpu reference: {e}")));
    let mut also = Vec::new();
    // The main oracle: the full reference on every row of a large case, else the exact one.
    let full_expected = match (&full, sampled) {
        (Some(f), true) => Some(
            f.as_ref()
                .map(|o| Expected::All(as_expected(o)))
                .map_err(String::clone),
        ),
        _ => None,
    };
    let (oracle, expected) = match &full_expected {
        Some(f) => (Oracle::FullReference, f.as_ref().map_err(String::as_str)),
        None if sampled => (Oracle::ExactSampled, exact.as_ref().map_err(String::as_str)),
        None => (Oracle::Exact, exact.as_ref().map_err(String::as_str)),
    };
    if let Some(f) = &full {
        let f = f.as_ref().map_err(String::as_str);
        let exact = exact.as_ref().map_err(String::as_str);
        let gpu_tolerance = Tolerance::gpu_reference();
        if sampled {
            also.push(verdict(
                "sampled rows vs f64 reference",
                judge(case, out.as_ref().map_err(String::as_str), exact),
                &tolerance,
            ));
            also.push(verdict(
                "gpu reference, sampled rows vs f64 reference",
                judge(case, f, exact),
                &gpu_tolerance,
            ));
        } else {
            also.push(verdict(
                "gpu reference vs f64 reference",
                judge(case, f, exact),
                &gpu_tolerance,
            ));
        }
    }
    if run == PagedRun::OppositeSplit {
        let planned = run_as(PagedRun::Direct).map_err(|e| e.to_string());
        let pair = match (&out, &planned) {
            (Ok(a), Ok(b)) => Ok(compare(a, &as_expected(b))),
            (Err(e), _) | (_, Err(e)) => Err(e.clone()),
        };
        also.push(verdict(
            "planned split vs reference",
            judge(case, planned.as_ref().map_err(String::as_str), expected),
            &tolerance,
        ));
        also.push(verdict(
            "opposite split vs planned",
            pair,
            &split_pair_tolerance(case),
        ));
    }
    let outcome = judge(case, out.as_ref().map_err(String::as_str), expected);
    let passed =
        outcome.as_ref().is_ok_and(|c| c.passes(&tolerance)) && also.iter().all(|(_, _, ok)| *ok);
    CaseResult {
        name: case.name.clone(),
        outcome,
        passed,
        oracle,
        backend_time,
        also,
    }
}

/// Runs one merge case: the backend's merge against [`merge_expected`] (f64, on the same stored
/// values), with the tolerance of the case's dtype.
pub fn run_merge_case(backend: &dyn Backend, case: &MergeCase) -> CaseResult {
    let states = case.inputs();
    let start = Instant::now();
    let out = backend.merge_states(case.shape, &states);
    let backend_time = start.elapsed();
    let outcome = out.map_err(|e| e.to_string()).and_then(|(o, lse)| {
        let expected = merge_expected(case.shape, &states).map_err(|e| e.to_string())?;
        Ok(compare(&AttentionOutput { o, lse: Some(lse) }, &expected))
    });
    let passed = outcome
        .as_ref()
        .is_ok_and(|c| c.passes(&Tolerance::for_dtype(case.dtype)));
    CaseResult {
        name: case.name.clone(),
        outcome,
        passed,
        oracle: Oracle::Exact,
        backend_time,
        also: Vec::new(),
    }
}

/// Runs every case, reporting each result to `report` as it comes; stops after a failed case
/// that leaves the backend lost ([`Backend::lost`]), counting the rest as not run.
pub fn run_cases(
    backend: &dyn Backend,
    cases: &[Case],
    mut report: impl FnMut(&CaseResult),
) -> Summary {
    let mut summary = Summary::default();
    for (i, case) in cases.iter().enumerate() {
        let result = run_case(backend, case);
        report(&result);
        if result.passed {
            summary.passed += 1;
            continue;
        }
        summary.failed += 1;
        if let Some(why) = backend.lost() {
            summary.not_run = cases.len() - i - 1;
            summary.stopped = Some(format!("after {}: {why}", case.name));
            break;
        }
    }
    summary
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::CpuBackend;
    use crate::dtype::DType;
    use crate::testing::{cases, BackendCaps, Suite};

    /// The CPU backend with a "full reference" that is the exact reference rounded to f32, its
    /// `o` scaled by `1 + error` (0: a correct full reference); `lost`: it says it is lost.
    struct WithFullReference {
        cpu: CpuBackend,
        error: f32,
        lost: bool,
    }

    impl Backend for WithFullReference {
        fn name(&self) -> &'static str {
            "cpu+full"
        }
        fn describe(&self) -> String {
            self.cpu.describe()
        }
        fn caps(&self) -> BackendCaps {
            self.cpu.caps()
        }
        fn run(
            &self,
            p: &AttentionProblem,
            q: &HostTensor,
            k: &HostTensor,
            v: &HostTensor,
            tile: TileRequest,
        ) -> Result<AttentionOutput, Error> {
            self.cpu.run(p, q, k, v, tile)
        }
        fn full_reference(
            &self,
            p: &AttentionProblem,
            q: &HostTensor,
            k: &HostTensor,
            v: &HostTensor,
        ) -> Option<Result<AttentionOutput, Error>> {
            Some(
                reference::attention(p, q, k, v)
                    .map(|r| {
                        let o: Vec<f32> =
                            r.o.iter().map(|&x| x as f32 * (1.0 + self.error)).collect();
                        AttentionOutput {
                            o: HostTensor::from_f32(DType::F32, &o),
                            lse: Some(r.lse.iter().map(|&x| x as f32).collect()),
                        }
                    })
                    .map_err(Error::from),
            )
        }
        fn run_paged(
            &self,
            p: &PagedAttention,
            q: &HostTensor,
            cache: PagedCache<'_>,
            tokens: (&HostTensor, &HostTensor),
            run: PagedRun,
            tile: TileRequest,
        ) -> Result<AttentionOutput, Error> {
            self.cpu.run_paged(p, q, cache, tokens, run, tile)
        }
        fn merge_states(
            &self,
            shape: MergeShape,
            states: &[(HostTensor, Vec<f32>)],
        ) -> Result<(HostTensor, Vec<f32>), Error> {
            self.cpu.merge_states(shape, states)
        }
        fn lost(&self) -> Option<String> {
            self.lost.then(|| "the test backend is lost".to_string())
        }
    }

    /// A small ragged f16 case of the quick suite.
    fn small_case() -> Case {
        cases(Suite::Quick, 1, &BackendCaps::cpu())
            .into_iter()
            .find(|c| c.paged.is_none() && c.problem.input_dtype == DType::F16)
            .expect("the quick suite has a ragged f16 case")
    }

    fn labels(r: &CaseResult) -> Vec<(&str, bool)> {
        r.also.iter().map(|(l, _, ok)| (l.as_str(), *ok)).collect()
    }

    #[test]
    fn a_large_case_is_judged_on_all_rows_by_the_full_reference_and_sampled_by_the_exact_one() {
        let backend = WithFullReference {
            cpu: CpuBackend::detect(),
            error: 0.0,
            lost: false,
        };
        let r = run_case_with_limit(&backend, &small_case(), 0);
        assert_eq!(r.oracle, Oracle::FullReference);
        assert!(r.passed, "{r:?}");
        let case = small_case();
        let all_rows = case.problem.batch.total_qo() * case.problem.num_qo_heads;
        assert_eq!(r.outcome.as_ref().unwrap().rows, all_rows);
        let sampled = r.also[0].1.as_ref().unwrap().rows;
        assert_eq!(sampled, SAMPLED_ROWS.min(all_rows));
        assert_eq!(
            labels(&r),
            [
                ("sampled rows vs f64 reference", true),
                ("gpu reference, sampled rows vs f64 reference", true)
            ]
        );
    }

    #[test]
    fn a_wrong_full_reference_fails_large_and_small_cases() {
        let backend = WithFullReference {
            cpu: CpuBackend::detect(),
            error: 1e-3,
            lost: false,
        };
        let case = small_case();
        let large = run_case_with_limit(&backend, &case, 0);
        assert!(!large.passed);
        assert!(!large.also[1].2, "{large:?}");
        let small = run_case_with_limit(&backend, &case, usize::MAX);
        assert_eq!(small.oracle, Oracle::Exact);
        assert!(small.outcome.as_ref().unwrap().passes(&case.tolerance()));
        assert_eq!(labels(&small), [("gpu reference vs f64 reference", false)]);
        assert!(!small.passed);
    }

    #[test]
    fn without_a_full_reference_large_cases_are_sampled() {
        let case = small_case();
        let r = run_case_with_limit(&CpuBackend::detect(), &case, 0);
        assert_eq!(r.oracle, Oracle::ExactSampled);
        assert!(r.passed && r.also.is_empty(), "{r:?}");
        let r = run_case_with_limit(&CpuBackend::detect(), &case, usize::MAX);
        assert_eq!(r.oracle, Oracle::Exact);
        assert!(r.passed && r.also.is_empty(), "{r:?}");
    }

    #[test]
    fn a_lost_backend_stops_the_run_after_the_failed_case() {
        let cases = vec![small_case(), small_case(), small_case()];
        let failing = |lost| WithFullReference {
            cpu: CpuBackend::detect(),
            error: 1e-3,
            lost,
        };
        let mut reported = 0;
        let summary = run_cases(&failing(true), &cases, |_| reported += 1);
        assert_eq!((summary.passed, summary.failed, summary.not_run), (0, 1, 2));
        assert_eq!(reported, 1);
        let why = summary.stopped.expect("stopped");
        assert!(
            why.contains(&cases[0].name) && why.contains("lost"),
            "{why}"
        );
        // A failure that leaves the backend usable runs on.
        let summary = run_cases(&failing(false), &cases, |_| {});
        assert_eq!((summary.failed, summary.not_run), (3, 0));
        assert!(summary.stopped.is_none());
        // Nor does a lost backend stop a run whose cases pass (it is asked after failures only).
        let passing = WithFullReference {
            cpu: CpuBackend::detect(),
            error: 0.0,
            lost: true,
        };
        let summary = run_cases(&passing, &cases, |_| {});
        assert_eq!((summary.passed, summary.not_run), (3, 0));
    }

    #[test]
    fn the_smallest_case_reads_ragged_kv_and_has_the_least_work() {
        let all = cases(Suite::Quick, 1, &CpuBackend::detect().caps());
        let small = smallest_case(&all).expect("a ragged case");
        assert!(small.paged.is_none());
        let least = all
            .iter()
            .filter(|c| c.paged.is_none())
            .map(|c| reference_work(&c.problem))
            .min();
        assert_eq!(Some(reference_work(&small.problem)), least);
        assert!(CpuBackend::detect().self_checks(small).is_empty());
    }
}
