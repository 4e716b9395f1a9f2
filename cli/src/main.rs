//! The `attnforge` command line: `demo`, `verify`, `compile`, `bench`, `info`.
//!
//! Each subcommand lives in its own module; this file only parses arguments and dispatches.

mod backend;
mod bench;
mod compile;
mod demo;
mod explain;
mod info;
mod verify;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "attnforge",
    version,
    about = "Attention kernels for LLM serving"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the version, the backends found, NVRTC and the kernel cache.
    Info,
    /// Run a Llama-3-8B-shaped and a Gemma-2-shaped prefill, timed and checked.
    Demo(demo::DemoArgs),
    /// Run the randomized correctness suite against the exact reference.
    Verify(verify::VerifyArgs),
    /// Time the GPU prefill kernel on the shared shape list (after checking it).
    Bench(bench::BenchArgs),
    /// Compile every kernel the engine can emit, for each target architecture.
    Compile(compile::Args),
}

fn main() -> ExitCode {
    restore_default_sigpipe();
    let cli = Cli::parse();
    match cli.command {
        Command::Info => info::run(),
        Command::Bench(args) => bench::run(args),
        Command::Demo(args) => demo::run(args),
        Command::Verify(args) => verify::run(args),
        Command::Compile(args) => compile::run(args),
    }
}

/// Printing into a closed pipe (`attnforge bench --print-shapes | head`) ends the process quietly,
/// as command-line tools do, instead of panicking in `println!` (Rust ignores SIGPIPE by default).
fn restore_default_sigpipe() {
    #[cfg(unix)]
    // SAFETY: called first thing in main, before any other thread exists; SIG_DFL is a valid
    // disposition for SIGPIPE.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}
