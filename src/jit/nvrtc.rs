//! A thin, checked FFI over libnvrtc, loaded by absolute path.
//!
//! Why not `cudarc::nvrtc`: cudarc 0.19's loader searches only the dynamic-linker path and panics
//! when it finds nothing, and its safe layer returns PTX only. attnforge needs CUBIN (a toolkit
//! newer than the driver cannot load its own PTX) and a library found where [`super::locate`]
//! found it (a pip wheel, say), with an error instead of a panic when it is absent. So this module
//! resolves the handful of entry points it needs from a [`libloading::Library`] opened at an
//! absolute path, checks every call's `nvrtcResult`, and wraps the program handle in an RAII
//! type. Nothing here knows about kernels, caches or architectures: [`super::compile`] builds on
//! it.

use std::ffi::{c_char, c_int, CStr, CString};
use std::path::{Path, PathBuf};
use std::ptr;

use super::error::JitError;

/// `nvrtcResult` as the C API returns it (an `enum` of C `int` size).
type NvrtcResult = c_int;
/// `NVRTC_SUCCESS`.
const NVRTC_SUCCESS: NvrtcResult = 0;
/// `NVRTC_ERROR_COMPILATION`: the source did not compile; the program log says why.
pub(crate) const NVRTC_ERROR_COMPILATION: NvrtcResult = 6;

/// Opaque `nvrtcProgram` handle.
type RawProgram = *mut std::ffi::c_void;

type FnVersion = unsafe extern "C" fn(*mut c_int, *mut c_int) -> NvrtcResult;
type FnGetErrorString = unsafe extern "C" fn(NvrtcResult) -> *const c_char;
type FnCreateProgram = unsafe extern "C" fn(
    *mut RawProgram,
    *const c_char,
    *const c_char,
    c_int,
    *const *const c_char,
    *const *const c_char,
) -> NvrtcResult;
type FnCompileProgram =
    unsafe extern "C" fn(RawProgram, c_int, *const *const c_char) -> NvrtcResult;
type FnGetSize = unsafe extern "C" fn(RawProgram, *mut usize) -> NvrtcResult;
type FnGetBytes = unsafe extern "C" fn(RawProgram, *mut c_char) -> NvrtcResult;
type FnDestroyProgram = unsafe extern "C" fn(*mut RawProgram) -> NvrtcResult;

/// The NVRTC version as `(major, minor)`, e.g. `(13, 0)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NvrtcVersion {
    /// Major version (the CUDA major release).
    pub major: i32,
    /// Minor version.
    pub minor: i32,
}

impl std::fmt::Display for NvrtcVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// A loaded libnvrtc: the library handle and the entry points attnforge uses.
///
/// The function pointers stay valid as long as `_lib` is alive, which is as long as `self`.
/// NVRTC is thread-safe for calls on distinct programs, so `Nvrtc` is `Send + Sync` and one
/// instance serves every compile thread.
pub struct Nvrtc {
    path: PathBuf,
    version: NvrtcVersion,
    get_error_string: FnGetErrorString,
    create_program: FnCreateProgram,
    compile_program: FnCompileProgram,
    get_program_log_size: FnGetSize,
    get_program_log: FnGetBytes,
    get_cubin_size: FnGetSize,
    get_cubin: FnGetBytes,
    destroy_program: FnDestroyProgram,
    // Last, so they are dropped after nothing can call through the pointers above.
    _lib: libloading::Library,
    _builtins: Option<libloading::Library>,
}

impl std::fmt::Debug for Nvrtc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nvrtc")
            .field("path", &self.path)
            .field("version", &self.version)
            .finish_non_exhaustive()
    }
}

/// Resolves one symbol as a function pointer of type `T`.
///
/// # Safety
/// `T` must be the exact C signature of the symbol `name` in `lib`.
unsafe fn symbol<T: Copy>(
    lib: &libloading::Library,
    path: &Path,
    name: &str,
) -> Result<T, JitError> {
    // SAFETY: the caller guarantees the signature; the pointer is copied out and used only while
    // `lib` is alive (both live in the same `Nvrtc`).
    unsafe { lib.get::<T>(name.as_bytes()) }
        .map(|s| *s)
        .map_err(|e| JitError::NvrtcLoad {
            path: path.to_path_buf(),
            reason: format!("symbol {name} missing: {e}"),
        })
}

impl Nvrtc {
    /// Opens libnvrtc at `path` (an absolute path to `libnvrtc.so*`) and checks that it answers
    /// `nvrtcVersion`.
    ///
    /// `builtins` is `libnvrtc-builtins.so*`. NVRTC opens it by its bare soname at compile time,
    /// which finds it only on the dynamic-linker path; loading it here first by absolute path
    /// makes that lookup resolve to the already-loaded copy (glibc matches loaded sonames), so a
    /// wheel folder needs no `LD_LIBRARY_PATH`.
    ///
    /// Loading runs the library's initialisers; that is the only unsafety and it is inherent to
    /// using NVRTC at all, so this function is safe to call with any path: a wrong file yields
    /// [`JitError::NvrtcLoad`].
    pub fn load(path: &Path, builtins: Option<&Path>) -> Result<Self, JitError> {
        if !path.is_absolute() {
            return Err(JitError::NvrtcLoad {
                path: path.to_path_buf(),
                reason: "the path must be absolute (attnforge never searches the linker path)"
                    .into(),
            });
        }
        let builtins = builtins
            .map(|b| {
                // SAFETY: as for libnvrtc below.
                unsafe { libloading::Library::new(b) }.map_err(|e| JitError::NvrtcLoad {
                    path: b.to_path_buf(),
                    reason: e.to_string(),
                })
            })
            .transpose()?;
        // SAFETY: loading a shared library runs its constructors; libnvrtc's are benign.
        let lib = unsafe { libloading::Library::new(path) }.map_err(|e| JitError::NvrtcLoad {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        // SAFETY (all `symbol` calls): each type alias above mirrors the C declaration in
        // nvrtc.h of CUDA 11 through 13 (these signatures have not changed).
        let version_fn: FnVersion = unsafe { symbol(&lib, path, "nvrtcVersion") }?;
        let get_error_string: FnGetErrorString =
            unsafe { symbol(&lib, path, "nvrtcGetErrorString") }?;
        let mut nvrtc = Nvrtc {
            path: path.to_path_buf(),
            version: NvrtcVersion { major: 0, minor: 0 },
            get_error_string,
            create_program: unsafe { symbol(&lib, path, "nvrtcCreateProgram") }?,
            compile_program: unsafe { symbol(&lib, path, "nvrtcCompileProgram") }?,
            get_program_log_size: unsafe { symbol(&lib, path, "nvrtcGetProgramLogSize") }?,
            get_program_log: unsafe { symbol(&lib, path, "nvrtcGetProgramLog") }?,
            get_cubin_size: unsafe { symbol(&lib, path, "nvrtcGetCUBINSize") }?,
            get_cubin: unsafe { symbol(&lib, path, "nvrtcGetCUBIN") }?,
            destroy_program: unsafe { symbol(&lib, path, "nvrtcDestroyProgram") }?,
            _lib: lib,
            _builtins: builtins,
        };
        let (mut major, mut minor) = (0, 0);
        // SAFETY: two valid out-pointers to c_int.
        let rc = unsafe { version_fn(&mut major, &mut minor) };
        nvrtc.check(rc, "nvrtcVersion")?;
        nvrtc.version = NvrtcVersion { major, minor };
        Ok(nvrtc)
    }

    /// The absolute path the library was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The library's version.
    pub fn version(&self) -> NvrtcVersion {
        self.version
    }

    /// NVRTC's own description of a result code.
    pub fn error_string(&self, code: c_int) -> String {
        // SAFETY: nvrtcGetErrorString accepts any value and returns a static C string (or null
        // in some versions for unknown codes, handled below).
        let p = unsafe { (self.get_error_string)(code) };
        if p.is_null() {
            return format!("unknown nvrtcResult {code}");
        }
        // SAFETY: non-null, NUL-terminated, static storage.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }

    /// Turns a result code into `Ok` or a [`JitError::Nvrtc`] naming the call.
    fn check(&self, code: NvrtcResult, call: &'static str) -> Result<(), JitError> {
        if code == NVRTC_SUCCESS {
            Ok(())
        } else {
            Err(JitError::Nvrtc {
                call,
                code,
                message: self.error_string(code),
            })
        }
    }

    /// Creates a program from `source`, named `name` (the name NVRTC uses in its diagnostics),
    /// with in-memory headers `(include name, contents)` that `#include "name"` resolves to.
    pub fn create_program(
        &self,
        source: &str,
        name: &str,
        headers: &[(String, String)],
    ) -> Result<Program<'_>, JitError> {
        let c_source = c_string("source", source)?;
        let c_name = c_string("program name", name)?;
        let header_contents = headers
            .iter()
            .map(|(n, c)| c_string(&format!("header {n}"), c))
            .collect::<Result<Vec<_>, _>>()?;
        let header_names = headers
            .iter()
            .map(|(n, _)| c_string("header name", n))
            .collect::<Result<Vec<_>, _>>()?;
        let contents_ptrs: Vec<*const c_char> =
            header_contents.iter().map(|c| c.as_ptr()).collect();
        let names_ptrs: Vec<*const c_char> = header_names.iter().map(|c| c.as_ptr()).collect();
        let num_headers = c_int::try_from(headers.len()).map_err(|_| JitError::InvalidInput {
            what: "headers",
            reason: format!("{} headers exceed the C int range", headers.len()),
        })?;
        let mut raw: RawProgram = ptr::null_mut();
        // SAFETY: every pointer is valid for the duration of the call (NVRTC copies the strings);
        // with zero headers the arrays may be dangling-but-unused, so pass null then.
        let rc = unsafe {
            (self.create_program)(
                &mut raw,
                c_source.as_ptr(),
                c_name.as_ptr(),
                num_headers,
                if headers.is_empty() {
                    ptr::null()
                } else {
                    contents_ptrs.as_ptr()
                },
                if headers.is_empty() {
                    ptr::null()
                } else {
                    names_ptrs.as_ptr()
                },
            )
        };
        self.check(rc, "nvrtcCreateProgram")?;
        Ok(Program { nvrtc: self, raw })
    }
}

/// A C string from Rust text, rejecting interior NUL bytes with a typed error.
fn c_string(what: &str, s: &str) -> Result<CString, JitError> {
    CString::new(s).map_err(|e| JitError::InvalidInput {
        what: "text passed to NVRTC",
        reason: format!("{what} contains a NUL byte at offset {}", e.nul_position()),
    })
}

/// An NVRTC program; destroyed when dropped.
pub struct Program<'a> {
    nvrtc: &'a Nvrtc,
    raw: RawProgram,
}

/// What `nvrtcCompileProgram` said: success, or a compilation error whose reason is in the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompileStatus {
    /// The program compiled.
    Success,
    /// `NVRTC_ERROR_COMPILATION`: see [`Program::log`].
    Failed,
}

impl Program<'_> {
    /// Compiles with the given command-line options. A compilation error is not an `Err` here:
    /// the caller reads the log either way. Other failures (invalid option, out of memory) are.
    pub fn compile(&mut self, options: &[String]) -> Result<CompileStatus, JitError> {
        let c_opts = options
            .iter()
            .map(|o| c_string("option", o))
            .collect::<Result<Vec<_>, _>>()?;
        let ptrs: Vec<*const c_char> = c_opts.iter().map(|c| c.as_ptr()).collect();
        let n = c_int::try_from(ptrs.len()).map_err(|_| JitError::InvalidInput {
            what: "options",
            reason: format!("{} options exceed the C int range", ptrs.len()),
        })?;
        // SAFETY: `self.raw` is a live program; `ptrs` holds `n` valid C strings.
        let rc = unsafe { (self.nvrtc.compile_program)(self.raw, n, ptrs.as_ptr()) };
        if rc == NVRTC_ERROR_COMPILATION {
            return Ok(CompileStatus::Failed);
        }
        if let Err(JitError::Nvrtc {
            call,
            code,
            message,
        }) = self.nvrtc.check(rc, "nvrtcCompileProgram")
        {
            // NVRTC explains a rejected option in the log; keep that explanation.
            let log = self.log().unwrap_or_default();
            let message = if log.trim().is_empty() {
                message
            } else {
                format!("{message}\n{}", log.trim_end())
            };
            return Err(JitError::Nvrtc {
                call,
                code,
                message,
            });
        }
        Ok(CompileStatus::Success)
    }

    /// The program log (diagnostics, and ptxas' `-v` report when asked for), as text.
    pub fn log(&self) -> Result<String, JitError> {
        let bytes = self.read_bytes(
            self.nvrtc.get_program_log_size,
            self.nvrtc.get_program_log,
            ("nvrtcGetProgramLogSize", "nvrtcGetProgramLog"),
        )?;
        // The size includes the terminating NUL.
        let text = bytes.split(|&b| b == 0).next().unwrap_or_default();
        Ok(String::from_utf8_lossy(text).into_owned())
    }

    /// The CUBIN of a successfully compiled program.
    pub fn cubin(&self) -> Result<Vec<u8>, JitError> {
        self.read_bytes(
            self.nvrtc.get_cubin_size,
            self.nvrtc.get_cubin,
            ("nvrtcGetCUBINSize", "nvrtcGetCUBIN"),
        )
    }

    /// The size-then-bytes protocol every NVRTC getter follows.
    fn read_bytes(
        &self,
        size_fn: FnGetSize,
        bytes_fn: FnGetBytes,
        names: (&'static str, &'static str),
    ) -> Result<Vec<u8>, JitError> {
        let mut size = 0usize;
        // SAFETY: live program, valid out-pointer.
        let rc = unsafe { size_fn(self.raw, &mut size) };
        self.nvrtc.check(rc, names.0)?;
        let mut buf = vec![0u8; size];
        if size > 0 {
            // SAFETY: `buf` has exactly the `size` bytes NVRTC asked for.
            let rc = unsafe { bytes_fn(self.raw, buf.as_mut_ptr().cast()) };
            self.nvrtc.check(rc, names.1)?;
        }
        Ok(buf)
    }
}

impl Drop for Program<'_> {
    fn drop(&mut self) {
        // SAFETY: `raw` came from nvrtcCreateProgram and is destroyed exactly once, here.
        // A failure to destroy cannot be reported from Drop; it would leak the program only.
        let _ = unsafe { (self.nvrtc.destroy_program)(&mut self.raw) };
    }
}
