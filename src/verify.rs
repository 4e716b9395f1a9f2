//! Running the shared case list through a backend and judging it against the exact reference.
//!
//! `attnforge verify` for every backend goes through [`run_cases`]: for each
//! [`Case`], the backend computes the output (the GPU backend poisons its
//! output buffers with NaN first), the reference computes the exact rows (all rows of small
//! problems, a spread sample of large ones), and [`crate::compare`] decides with the case's
//! tolerance. Nothing is skipped silently: a backend error is a failed case with its message.

use crate::compare::{compare, compare_rows, Comparison, Tolerance};
use crate::merge::MergeShape;
use crate::paged::{PagedAttention, PagedKv};
use crate::problem::AttentionProblem;
use crate::reference::{self, ReferenceOutput};
use crate::tensor::HostTensor;
use crate::testing::{merge_expected, BackendCaps, Case, MergeCase, PagedRun};
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
    /// Computes `problem` on the host tensors.
    fn run(
        &self,
        problem: &AttentionProblem,
        q: &HostTensor,
        k: &HostTensor,
        v: &HostTensor,
    ) -> Result<AttentionOutput, Error>;
    /// Gets ready to run `cases` (the GPU backend compiles their kernels in parallel into the
    /// disk cache, with progress); nothing by default.
    fn prepare(&self, cases: &[Case]) -> Result<(), Error> {
        let _ = cases;
        Ok(())
    }
    /// Computes a paged problem on the host cache, which holds the ragged `k`, `v`; `run` says
    /// how (the GPU-only ways are asked only of backends whose caps say `device_runs`).
    fn run_paged(
        &self,
        problem: &PagedAttention,
        q: &HostTensor,
        cache: PagedKv<'_>,
        tokens: (&HostTensor, &HostTensor),
        run: PagedRun,
    ) -> Result<AttentionOutput, Error>;
    /// Merges partial states of one `shape` (each `o [rows, heads, head_dim]` in one dtype with
    /// its f32 `lse [rows, heads]`) into one; returns the merged `(o, lse)`.
    fn merge_states(
        &self,
        shape: MergeShape,
        states: &[(HostTensor, Vec<f32>)],
    ) -> Result<(HostTensor, Vec<f32>), Error>;
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
    /// Whether only sampled rows were compared.
    pub sampled: bool,
    /// Further judgements of the same case, each with its label and verdict: a split-pair case
    /// ([`PagedRun::OppositeSplit`]) judges its planned run against the reference and the two
    /// runs against each other.
    pub also: Vec<(String, Result<Comparison, String>, bool)>,
    /// Time of the backend's run.
    pub backend_time: Duration,
}

/// Totals of a run.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Summary {
    /// Cases that passed.
    pub passed: usize,
    /// Cases that failed.
    pub failed: usize,
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

/// The comparison of `out` with the reference of `case`: all rows, or a spread sample of a large
/// problem (`sampled`).
fn judge(
    case: &Case,
    (q, k, v): (&HostTensor, &HostTensor, &HostTensor),
    out: Result<AttentionOutput, Error>,
    sampled: bool,
) -> Result<Comparison, String> {
    let out = out.map_err(|e| e.to_string())?;
    if sampled {
        let rows = sample_rows(&case.problem, SAMPLED_ROWS);
        let expected =
            reference::attention_rows(&case.problem, q, k, v, &rows).map_err(|e| e.to_string())?;
        Ok(compare_rows(
            &out,
            case.problem.num_qo_heads,
            &rows,
            &expected,
        ))
    } else {
        let expected = reference::attention(&case.problem, q, k, v).map_err(|e| e.to_string())?;
        Ok(compare(&out, &expected))
    }
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
    let (q, k, v) = case.inputs();
    let paged = case.paged_inputs(&k, &v).transpose();
    let run = case.paged.map_or(PagedRun::Direct, |p| p.run);
    let run_as = |run: PagedRun| match &paged {
        Ok(None) => backend.run(&case.problem, &q, &k, &v),
        Ok(Some(inputs)) => backend.run_paged(&inputs.paged, &q, inputs.cache(), (&k, &v), run),
        Err(e) => Err(Error::InvalidProblem(e.clone())),
    };
    let start = Instant::now();
    let out = run_as(run);
    let backend_time = start.elapsed();
    let sampled = reference_work(&case.problem) > FULL_REFERENCE_LIMIT;
    let tolerance = case.tolerance();
    let mut also = Vec::new();
    if run == PagedRun::OppositeSplit {
        let planned = run_as(PagedRun::Direct);
        let pair = match (&out, &planned) {
            (Ok(a), Ok(b)) => Ok(compare(a, &as_expected(b))),
            (Err(e), _) | (_, Err(e)) => Err(e.to_string()),
        };
        let pair_passed = pair
            .as_ref()
            .is_ok_and(|c| c.passes(&split_pair_tolerance(case)));
        let planned = judge(case, (&q, &k, &v), planned, sampled);
        let planned_passed = planned.as_ref().is_ok_and(|c| c.passes(&tolerance));
        also.push(("planned split vs reference".into(), planned, planned_passed));
        also.push(("opposite split vs planned".into(), pair, pair_passed));
    }
    let outcome = judge(case, (&q, &k, &v), out, sampled);
    let passed =
        outcome.as_ref().is_ok_and(|c| c.passes(&tolerance)) && also.iter().all(|(_, _, ok)| *ok);
    CaseResult {
        name: case.name.clone(),
        outcome,
        passed,
        sampled,
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
        sampled: false,
        backend_time,
        also: Vec::new(),
    }
}

/// Runs every case, reporting each result to `report` as it comes.
pub fn run_cases(
    backend: &dyn Backend,
    cases: &[Case],
    mut report: impl FnMut(&CaseResult),
) -> Summary {
    let mut summary = Summary::default();
    for case in cases {
        let result = run_case(backend, case);
        if result.passed {
            summary.passed += 1;
        } else {
            summary.failed += 1;
        }
        report(&result);
    }
    summary
}
