//! One NVRTC compilation: a complete CUDA source → CUBIN for one [`Arch`], with ptxas' resource
//! report, and compile errors mapped back to the user's snippets.
//!
//! This is the uncached step; [`super::cached::Jit`] puts the disk cache in front of it. The
//! options are plain data ([`CompileOptions`]) and [`CompileOptions::to_args`] is the single
//! place that turns them into NVRTC's command line, so the cache key (which hashes that command
//! line) cannot drift from what is compiled.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::arch::Arch;
use super::error::JitError;
use super::nvrtc::{CompileStatus, Nvrtc};
use super::report::{self, ResourceReport};

/// The C++ dialect kernels are compiled as.
pub const CXX_STANDARD: &str = "-std=c++17";
/// Asks ptxas for its per-function resource report (parsed by [`super::report`]).
pub const PTXAS_VERBOSE: &str = "--ptxas-options=-v";
/// Turns off NVRTC's own compile cache (CUDA 12.9 and newer, where a machine with a driver keeps
/// one): a result served from it comes with no ptxas report, so the kernel's resources would be
/// unknown and its entry reported missing. attnforge's disk cache keeps compiled kernels instead.
pub const NVRTC_NO_CACHE: &str = "--no-cache";

/// The NVRTC options for `opts` on this NVRTC: [`CompileOptions::to_args`], plus
/// [`NVRTC_NO_CACHE`] where NVRTC has a cache of its own (12.9 and newer).
pub fn nvrtc_args(nvrtc: &Nvrtc, opts: &CompileOptions) -> Vec<String> {
    let mut args = opts.to_args();
    let v = nvrtc.version();
    if (v.major, v.minor) >= (12, 9) {
        args.push(NVRTC_NO_CACHE.to_string());
    }
    args
}

/// A span of the generated source that came from a variant's snippet, so errors inside it can be
/// reported in the snippet's own line numbers (the generator fills these in).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SnippetSpan {
    /// What the snippet is, e.g. `custom logits_transform`.
    pub label: String,
    /// 1-based line in the generated source where the snippet starts.
    pub first_line: usize,
    /// How many lines it spans.
    pub line_count: usize,
}

/// What is compiled: a complete, self-contained CUDA source and its entry point.
#[derive(Debug, Clone, Copy)]
pub struct KernelSource<'a> {
    /// Readable name (used in messages, the program name and the cache file name).
    pub name: &'a str,
    /// The `extern "C"` entry function.
    pub entry: &'a str,
    /// The CUDA source.
    pub source: &'a str,
    /// Spans of user snippets inside `source`.
    pub snippets: &'a [SnippetSpan],
}

/// NVRTC options as plain data. Everything that changes the CUBIN is a field here or in
/// `extra`, and all of it reaches [`CompileOptions::to_args`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CompileOptions {
    /// Target architecture.
    pub arch: Arch,
    /// `--use_fast_math` (off by default: the kernel generator decides per kernel).
    pub fast_math: bool,
    /// `-lineinfo` (on by default: source lines in profilers, no effect on code).
    pub line_info: bool,
    /// `-I` directories. Headers read from here are not part of the cache key (NVRTC does not say
    /// which it read), so [`super::cached::Jit`] bypasses the disk cache when this is non-empty;
    /// prefer `headers`.
    pub include_dirs: Vec<PathBuf>,
    /// In-memory headers `(include name, contents)`; hashed into the cache key.
    pub headers: Vec<(String, String)>,
    /// Further NVRTC options, verbatim (e.g. `-DTILE=64`, `--maxrregcount=128`).
    pub extra: Vec<String>,
}

impl CompileOptions {
    /// The default options for `arch`: C++17, ptxas report, line info, no fast math.
    pub fn new(arch: Arch) -> Self {
        CompileOptions {
            arch,
            fast_math: false,
            line_info: true,
            include_dirs: Vec::new(),
            headers: Vec::new(),
            extra: Vec::new(),
        }
    }

    /// NVRTC's command line for these options.
    pub fn to_args(&self) -> Vec<String> {
        let mut args = vec![
            format!("--gpu-architecture={}", self.arch.name()),
            CXX_STANDARD.to_string(),
            PTXAS_VERBOSE.to_string(),
        ];
        if self.line_info {
            args.push("-lineinfo".into());
        }
        if self.fast_math {
            args.push("--use_fast_math".into());
        }
        args.extend(
            self.include_dirs
                .iter()
                .map(|d| format!("-I{}", d.display())),
        );
        args.extend(self.extra.iter().cloned());
        args
    }
}

/// A compiled kernel.
#[derive(Debug, Clone)]
pub struct CompiledKernel {
    /// Readable name.
    pub name: String,
    /// `extern "C"` entry function (present in the CUBIN: checked against ptxas' report).
    pub entry: String,
    /// The architecture it was compiled for.
    pub arch: Arch,
    /// The CUBIN image.
    pub cubin: Vec<u8>,
    /// NVRTC's full log (warnings and ptxas' report).
    pub log: String,
    /// ptxas' resource figures.
    pub report: ResourceReport,
    /// How long NVRTC took (for a cache hit: how long the original compile took).
    pub compile_time: Duration,
}

/// The NVRTC program name of a kernel: its readable name made file-name safe, plus `.cu`.
pub fn program_name(kernel_name: &str) -> String {
    format!("{}.cu", sanitize(kernel_name))
}

/// Keeps `[A-Za-z0-9._-]`, replaces everything else with `_`.
pub fn sanitize(name: &str) -> String {
    let s: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    if s.is_empty() {
        "kernel".into()
    } else {
        s
    }
}

/// Compiles `src` with `opts` (no cache).
pub fn compile(
    nvrtc: &Nvrtc,
    src: &KernelSource<'_>,
    opts: &CompileOptions,
) -> Result<CompiledKernel, JitError> {
    if src.entry.is_empty() {
        return Err(JitError::InvalidInput {
            what: "entry",
            reason: format!("kernel {} has an empty entry name", src.name),
        });
    }
    let prog_name = program_name(src.name);
    let start = Instant::now();
    let mut program = nvrtc.create_program(src.source, &prog_name, &opts.headers)?;
    let status = program.compile(&nvrtc_args(nvrtc, opts))?;
    let log = program.log()?;
    if status == CompileStatus::Failed {
        return Err(JitError::Compile {
            kernel: src.name.to_string(),
            log: map_snippet_lines(&log, &prog_name, src.snippets),
        });
    }
    let cubin = program.cubin()?;
    let compile_time = start.elapsed();
    let report = report_for(src.name, src.entry, &log)?;
    Ok(CompiledKernel {
        name: src.name.to_string(),
        entry: src.entry.to_string(),
        arch: opts.arch,
        cubin,
        log,
        report,
        compile_time,
    })
}

/// The entry's resource report from a log, or [`JitError::MissingEntry`].
pub(crate) fn report_for(kernel: &str, entry: &str, log: &str) -> Result<ResourceReport, JitError> {
    let functions = report::parse(log);
    let found: Vec<String> = functions
        .iter()
        .filter(|f| f.is_entry)
        .map(|f| f.name.clone())
        .collect();
    ResourceReport::for_entry(entry, functions).ok_or_else(|| JitError::MissingEntry {
        kernel: kernel.to_string(),
        entry: entry.to_string(),
        found,
    })
}

/// Rewrites diagnostics that point into a user snippet to `LABEL, line N: rest`, N counted from
/// the snippet's first line. Two shapes are recognised:
/// - `LABEL(N): rest`, where the generator put `#line 1 "LABEL"` before the snippet (NVRTC then
///   already counts from the snippet's start);
/// - `PROG(LINE): rest` with LINE inside a span of the generated file (no `#line` directive).
///
/// Every other line is kept as it is.
pub fn map_snippet_lines(log: &str, prog_name: &str, snippets: &[SnippetSpan]) -> String {
    let mapped: Vec<String> = log
        .lines()
        .map(|line| map_line(line, prog_name, snippets).unwrap_or_else(|| line.to_string()))
        .collect();
    let mut out = mapped.join("\n");
    if log.ends_with('\n') {
        out.push('\n');
    }
    out
}

/// `FILE(N): rest` split into `(FILE, N, rest)`.
fn diagnostic_location(line: &str) -> Option<(&str, usize, &str)> {
    let (head, tail) = line.split_once("): ")?;
    let (file, num) = head.rsplit_once('(')?;
    Some((file, num.parse().ok()?, tail))
}

fn map_line(line: &str, prog_name: &str, snippets: &[SnippetSpan]) -> Option<String> {
    let (file, n, tail) = diagnostic_location(line)?;
    if let Some(s) = snippets.iter().find(|s| s.label == file) {
        return Some(format!("{}, line {n}: {tail}", s.label));
    }
    if file != prog_name {
        return None;
    }
    let s = snippets
        .iter()
        .find(|s| n >= s.first_line && n < s.first_line + s.line_count)?;
    Some(format!(
        "{}, line {}: {tail}",
        s.label,
        n - s.first_line + 1
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_render_every_field() {
        let mut o = CompileOptions::new(Arch::Sm90a);
        assert_eq!(
            o.to_args(),
            [
                "--gpu-architecture=sm_90a",
                "-std=c++17",
                "--ptxas-options=-v",
                "-lineinfo"
            ]
        );
        o.fast_math = true;
        o.line_info = false;
        o.include_dirs.push("/x/include".into());
        o.extra.push("-DTILE=64".into());
        assert_eq!(
            o.to_args(),
            [
                "--gpu-architecture=sm_90a",
                "-std=c++17",
                "--ptxas-options=-v",
                "--use_fast_math",
                "-I/x/include",
                "-DTILE=64"
            ]
        );
    }

    #[test]
    fn snippet_lines_are_renamed_and_others_kept() {
        // Real NVRTC 13.0 log shape.
        let log = "k.cu(12): error: identifier \"undefined_thing\" is undefined\n    \
                   float y = undefined_thing;\n              ^\n\nk.cu(4): error: expected a \";\"\n\n\
                   2 errors detected in the compilation of \"k.cu\".\n";
        let spans = [SnippetSpan {
            label: "custom logits_transform".into(),
            first_line: 10,
            line_count: 3,
        }];
        let out = map_snippet_lines(log, "k.cu", &spans);
        assert!(
            out.starts_with(
                "custom logits_transform, line 3: error: identifier \"undefined_thing\""
            ),
            "{out}"
        );
        let via_line_directive = "custom logits_transform(2): error: expected a \";\"\n";
        assert_eq!(
            map_snippet_lines(via_line_directive, "k.cu", &spans),
            "custom logits_transform, line 2: error: expected a \";\"\n"
        );
        assert!(out.contains("\nk.cu(4): error: expected"), "{out}");
        assert!(out.ends_with("compilation of \"k.cu\".\n"), "{out}");
    }

    #[test]
    fn sanitize_names() {
        assert_eq!(
            sanitize("prefill f16/causal d=128"),
            "prefill_f16_causal_d_128"
        );
        assert_eq!(sanitize(""), "kernel");
    }
}
