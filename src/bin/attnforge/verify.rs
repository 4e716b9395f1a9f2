//! `attnforge verify`: the randomized correctness suite of `attnforge::testing` run through one
//! backend and judged against the exact reference.
//!
//! Prints one line per failing case (and per case with `-v`) and ends with the line
//! `N passed, M failed`; the exit status is non-zero when M > 0.

use crate::backend::BackendKind;
use attnforge::compare::compare;
use attnforge::reference;
use attnforge::testing::{cases, Case, Suite};
use std::process::ExitCode;
use std::time::Instant;

/// The case list, as named on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum SuiteArg {
    /// Every mask × variant pair once; a few seconds.
    Quick,
    /// Every mask × variant × dtype configuration × head dims; minutes.
    Full,
}

/// Arguments of `attnforge verify`.
#[derive(clap::Args, Debug)]
pub struct VerifyArgs {
    /// The backend to verify.
    #[arg(long, value_enum, default_value = "cpu")]
    backend: BackendKind,
    /// Which case list.
    #[arg(long, value_enum, default_value = "quick")]
    suite: SuiteArg,
    /// Base seed of the case list and inputs.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Only cases whose name contains this.
    #[arg(long)]
    filter: Option<String>,
    /// Print a line for every case, not only failures.
    #[arg(short, long)]
    verbose: bool,
}

/// Runs the suite; see the module doc.
pub fn run(args: VerifyArgs) -> ExitCode {
    let backend = match args.backend.open() {
        Ok(b) => b,
        Err(why) => {
            eprintln!("error: {why}");
            return ExitCode::FAILURE;
        }
    };
    let suite = match args.suite {
        SuiteArg::Quick => Suite::Quick,
        SuiteArg::Full => Suite::Full,
    };
    let selected: Vec<Case> = cases(suite, args.seed, &backend.caps())
        .into_iter()
        .filter(|c| args.filter.as_deref().is_none_or(|f| c.name.contains(f)))
        .collect();
    println!(
        "verify: {} cases of the {:?} suite (seed {}) on {}",
        selected.len(),
        args.suite,
        args.seed,
        backend.describe()
    );
    let (mut passed, mut failed) = (0usize, 0usize);
    for case in &selected {
        let start = Instant::now();
        let verdict = judge(case, backend.as_ref());
        let ms = start.elapsed().as_secs_f64() * 1e3;
        match verdict {
            Ok(summary) => {
                passed += 1;
                if args.verbose {
                    println!("ok   {} ({ms:.0} ms): {summary}", case.name);
                }
            }
            Err(why) => {
                failed += 1;
                println!("FAIL {} (seed {}): {why}", case.name, case.seed);
            }
        }
    }
    println!("{passed} passed, {failed} failed");
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// One case: `Ok` with the error figures, or `Err` saying what went wrong.
fn judge(case: &Case, backend: &dyn crate::backend::Backend) -> Result<String, String> {
    let (q, k, v) = case.inputs();
    let want = reference::attention(&case.problem, &q, &k, &v)
        .map_err(|e| format!("reference rejected the case: {e}"))?;
    let got = backend
        .run(&case.problem, &q, &k, &v)
        .map_err(|e| format!("{} backend: {e}", backend.name()))?;
    let cmp = compare(&got, &want);
    let tol = case.tolerance();
    if cmp.passes(&tol) {
        Ok(cmp.to_string())
    } else {
        Err(format!(
            "{cmp}; tolerance rel_l2 {:.0e}, lse {:.0e}",
            tol.rel_l2, tol.lse_abs
        ))
    }
}
