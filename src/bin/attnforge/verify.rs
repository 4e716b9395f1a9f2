//! `attnforge verify`: the randomized correctness suite against the exact reference.
//!
//! Prints a line per failed case (every case with `-v`) and ends with `N passed, M failed`; the
//! exit status is non-zero when any case failed.

use attnforge::testing::{cases, BackendCaps, Suite};
use attnforge::verify::{run_cases, Backend, CaseResult};
use std::process::ExitCode;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendChoice {
    /// The GPU (CUDA).
    Cuda,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum SuiteChoice {
    /// Every mask x variant pair once, small problems.
    Quick,
    /// The whole grid.
    Full,
}

#[derive(clap::Args)]
pub struct VerifyArgs {
    /// Which backend to check.
    #[arg(long, value_enum, default_value = "cuda")]
    backend: BackendChoice,
    /// Which case list.
    #[arg(long, value_enum, default_value = "quick")]
    suite: SuiteChoice,
    /// Seed of the case list and inputs.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Only cases whose name contains this.
    #[arg(long)]
    filter: Option<String>,
    /// Print every case, not only failures.
    #[arg(short, long)]
    verbose: bool,
}

fn report(result: &CaseResult, verbose: bool) {
    if result.passed && !verbose {
        return;
    }
    let verdict = if result.passed { "ok  " } else { "FAIL" };
    let detail = match &result.outcome {
        Ok(c) => c.to_string(),
        Err(e) => format!("error: {e}"),
    };
    let sampled = if result.sampled {
        " (sampled rows)"
    } else {
        ""
    };
    println!(
        "{verdict} {} [{:.1} ms]{sampled}: {detail}",
        result.name,
        result.backend_time.as_secs_f64() * 1e3
    );
}

pub fn run(args: VerifyArgs) -> ExitCode {
    let (backend, caps): (Box<dyn Backend>, BackendCaps) = match args.backend {
        BackendChoice::Cuda => match attnforge::cuda::CudaBackend::new(0) {
            Ok(b) => (Box::new(b), BackendCaps::cuda()),
            Err(e) => {
                eprintln!("error: the cuda backend is not available: {e}");
                return ExitCode::FAILURE;
            }
        },
    };
    let suite = match args.suite {
        SuiteChoice::Quick => Suite::Quick,
        SuiteChoice::Full => Suite::Full,
    };
    let mut list = cases(suite, args.seed, &caps);
    if let Some(f) = &args.filter {
        list.retain(|c| c.name.contains(f.as_str()));
    }
    println!(
        "verify: backend {}, {} cases, seed {}",
        backend.name(),
        list.len(),
        args.seed
    );
    let summary = run_cases(backend.as_ref(), &list, |r| report(r, args.verbose));
    println!("{} passed, {} failed", summary.passed, summary.failed);
    if summary.failed > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
