//! The JIT layer's error type: finding and loading NVRTC, compiling, and the disk cache.
//!
//! Every `Display` prints text meant for a person: a compile error prints NVRTC's log verbatim,
//! line by line (never `Debug`-escaped), and "NVRTC not found" lists every place searched and how
//! to install it.

use std::fmt;
use std::path::PathBuf;

/// The pinned NVRTC wheel that matches the `cuda-13000` driver bindings.
pub const NVRTC_PIP_INSTALL: &str = "python3 -m pip install nvidia-cuda-nvrtc==13.0.88";

/// One place [`super::locate`] looked for libnvrtc, and what it found there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SearchedPlace {
    /// Where the candidate came from, e.g. `ATTNFORGE_CUDA_HOME` or `python site-packages`.
    pub origin: String,
    /// The directory or file looked at (empty when a variable was unset).
    pub path: PathBuf,
    /// Why it did not qualify, e.g. `not set` or `no lib/libnvrtc.so*`.
    pub outcome: String,
}

/// Any failure of the JIT layer.
#[derive(Debug, thiserror::Error)]
pub enum JitError {
    /// No libnvrtc was found anywhere.
    #[error("{}", not_found_message(.searched))]
    NvrtcNotFound {
        /// Every place looked at, in search order.
        searched: Vec<SearchedPlace>,
    },
    /// A libnvrtc file was found but could not be loaded.
    #[error("cannot load NVRTC from {}: {reason}", .path.display())]
    NvrtcLoad {
        /// The file.
        path: PathBuf,
        /// The loader's message.
        reason: String,
    },
    /// An NVRTC call other than compilation itself failed.
    #[error("{call} failed with nvrtcResult {code}: {message}")]
    Nvrtc {
        /// The C function.
        call: &'static str,
        /// Its result code.
        code: i32,
        /// `nvrtcGetErrorString` of the code.
        message: String,
    },
    /// Text handed to the JIT cannot be passed to NVRTC (e.g. an interior NUL byte).
    #[error("invalid {what}: {reason}")]
    InvalidInput {
        /// Which argument.
        what: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The source did not compile. `log` is NVRTC's log, with lines inside user snippets
    /// renamed to the snippet and its own line numbers.
    #[error("kernel {kernel} failed to compile:\n{log}")]
    Compile {
        /// The kernel's readable name.
        kernel: String,
        /// The (mapped) compiler log, verbatim.
        log: String,
    },
    /// The source compiled, but ptxas reported no entry function of that name.
    #[error(
        "kernel {kernel}: entry function {entry:?} not in the CUBIN (ptxas compiled: {found:?})"
    )]
    MissingEntry {
        /// The kernel's readable name.
        kernel: String,
        /// The `extern "C"` name asked for.
        entry: String,
        /// The entry functions ptxas did report.
        found: Vec<String>,
    },
    /// An architecture string or compute capability attnforge does not target.
    #[error("unsupported architecture {value:?}; supported: {supported}")]
    UnsupportedArch {
        /// What was given.
        value: String,
        /// The supported list.
        supported: String,
    },
    /// Reading or writing the disk cache failed.
    #[error("cache: cannot {op} {}: {source}", .path.display())]
    Cache {
        /// What was attempted (`create`, `write`, `rename`, `read`, `lock`).
        op: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A compile worker thread panicked (a bug); the kernel it held has no result.
    #[error("the worker compiling {kernel} panicked")]
    WorkerPanicked {
        /// The kernel whose result is missing.
        kernel: String,
    },
    /// A compile worker thread could not be started.
    #[error("cannot start a compile worker thread: {source}")]
    WorkerSpawn {
        /// The operating system's error.
        source: std::io::Error,
    },
    /// No cache directory could be determined.
    #[error("no cache directory: set ATTNFORGE_CACHE_DIR (the platform has no cache directory)")]
    NoCacheDir,
}

fn not_found_message(searched: &[SearchedPlace]) -> String {
    let mut s = String::from("NVRTC (libnvrtc.so) not found. Looked in, in order:\n");
    for p in searched {
        let path = p.path.display().to_string();
        if path.is_empty() {
            s += &format!("  - {}: {}\n", p.origin, p.outcome);
        } else {
            s += &format!("  - {} ({path}): {}\n", p.origin, p.outcome);
        }
    }
    s += &format!(
        "Install it with `{NVRTC_PIP_INSTALL}` (or `--target .cache/cuda/site` for a project-local \
         copy, as scripts/test does), or point ATTNFORGE_CUDA_HOME at a CUDA toolkit, or \
         ATTNFORGE_NVRTC_LIB at libnvrtc.so itself."
    );
    s
}

impl fmt::Display for SearchedPlace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} ({}): {}",
            self.origin,
            self.path.display(),
            self.outcome
        )
    }
}
