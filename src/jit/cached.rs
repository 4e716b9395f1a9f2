//! [`Jit`]: NVRTC with the disk cache in front — the entry point the rest of attnforge uses.
//!
//! Lifecycle of one request (FlashInfer's contract, made race-free by the atomic writes):
//! 1. compute the key and try to load the entry; a valid entry is returned at once;
//! 2. otherwise take the key's build lock (other processes building the same kernel wait here);
//! 3. load again — whoever held the lock may have built it meanwhile;
//! 4. compile, store atomically, release the lock.
//!
//! A corrupt entry is logged at debug level (`log` crate), reported in [`CacheStatus::Rebuilt`]
//! and replaced.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::cache::{CacheEntry, CacheKey, DiskCache, Lookup};
use super::compile::{self, CompileOptions, CompiledKernel, KernelSource};
use super::error::JitError;
use super::locate::{self, NvrtcLocation};
use super::nvrtc::Nvrtc;

/// How a request was served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CacheStatus {
    /// Loaded from the disk cache.
    Hit,
    /// Compiled and stored (no entry existed).
    Compiled,
    /// The entry was corrupt; compiled and replaced.
    Rebuilt {
        /// What was wrong with the old entry.
        reason: String,
    },
    /// Compiled; the cache is off for this `Jit`.
    Disabled,
    /// Compiled; this request cannot be cached (the reason says why).
    Bypassed {
        /// Why.
        reason: String,
    },
}

impl CacheStatus {
    /// Whether the kernel came from the cache.
    pub fn is_hit(&self) -> bool {
        matches!(self, CacheStatus::Hit)
    }
}

/// The result of [`Jit::compile`].
#[derive(Debug, Clone)]
pub struct JitOutput {
    /// The kernel.
    pub kernel: CompiledKernel,
    /// How it was served.
    pub cache: CacheStatus,
    /// The cache file, when the cache was used.
    pub path: Option<PathBuf>,
    /// Wall time of this request (load or compile, plus cache I/O).
    pub elapsed: Duration,
}

/// NVRTC plus an optional disk cache. Cheap to clone; shareable across threads.
#[derive(Debug, Clone)]
pub struct Jit {
    nvrtc: Arc<Nvrtc>,
    location: Option<NvrtcLocation>,
    cache: Option<DiskCache>,
}

impl Jit {
    /// Wraps a loaded NVRTC and a cache (`None`: compile every time).
    pub fn new(nvrtc: Arc<Nvrtc>, cache: Option<DiskCache>) -> Self {
        Jit {
            nvrtc,
            location: None,
            cache,
        }
    }

    /// Finds and loads NVRTC ([`locate::locate`]) and opens the default cache
    /// ([`DiskCache::open_default`]) unless `use_cache` is false.
    pub fn from_env(use_cache: bool) -> Result<Self, JitError> {
        let location = locate::locate()?;
        let nvrtc = Nvrtc::load(&location.lib, location.builtins.as_deref())?;
        let cache = if use_cache {
            Some(DiskCache::open_default()?)
        } else {
            None
        };
        Ok(Jit {
            nvrtc: Arc::new(nvrtc),
            location: Some(location),
            cache,
        })
    }

    /// The loaded NVRTC.
    pub fn nvrtc(&self) -> &Nvrtc {
        &self.nvrtc
    }

    /// Where NVRTC was found, when [`Jit::from_env`] found it.
    pub fn location(&self) -> Option<&NvrtcLocation> {
        self.location.as_ref()
    }

    /// The disk cache, if enabled.
    pub fn cache(&self) -> Option<&DiskCache> {
        self.cache.as_ref()
    }

    /// The cache key of a request (what a cache file is named after).
    pub fn key(&self, src: &KernelSource<'_>, opts: &CompileOptions) -> CacheKey {
        CacheKey::new(
            src.source,
            self.nvrtc.version(),
            &opts.to_args(),
            &opts.headers,
        )
    }

    /// Compiles `src`, or loads it from the cache.
    pub fn compile(
        &self,
        src: &KernelSource<'_>,
        opts: &CompileOptions,
    ) -> Result<JitOutput, JitError> {
        let start = Instant::now();
        let Some(cache) = &self.cache else {
            return self.fresh(src, opts, CacheStatus::Disabled, None, start);
        };
        if !opts.include_dirs.is_empty() {
            let reason =
                "headers read from include directories are not part of the key".to_string();
            return self.fresh(src, opts, CacheStatus::Bypassed { reason }, None, start);
        }
        let key = self.key(src, opts);
        if let Lookup::Hit(entry) = cache.load(src.name, &key) {
            return self.hit(entry, src, opts, start);
        }
        let _lock = cache.lock(src.name, &key)?;
        let status = match cache.load(src.name, &key) {
            Lookup::Hit(entry) => return self.hit(entry, src, opts, start),
            Lookup::Miss => CacheStatus::Compiled,
            Lookup::Corrupt { path, reason } => {
                log::debug!(
                    "attnforge cache: {} is corrupt ({reason}); rebuilding",
                    path.display()
                );
                CacheStatus::Rebuilt { reason }
            }
        };
        let kernel = compile::compile(&self.nvrtc, src, opts)?;
        let path = cache.store(
            src.name,
            &key,
            &kernel.log,
            &kernel.cubin,
            kernel.compile_time,
        )?;
        Ok(JitOutput {
            kernel,
            cache: status,
            path: Some(path),
            elapsed: start.elapsed(),
        })
    }

    /// A valid cache entry turned into an output.
    fn hit(
        &self,
        entry: CacheEntry,
        src: &KernelSource<'_>,
        opts: &CompileOptions,
        start: Instant,
    ) -> Result<JitOutput, JitError> {
        let report = compile::report_for(src.name, src.entry, &entry.log)?;
        Ok(JitOutput {
            kernel: CompiledKernel {
                name: src.name.to_string(),
                entry: src.entry.to_string(),
                arch: opts.arch,
                cubin: entry.cubin,
                log: entry.log,
                report,
                compile_time: entry.compile_time,
            },
            cache: CacheStatus::Hit,
            path: Some(entry.path),
            elapsed: start.elapsed(),
        })
    }

    fn fresh(
        &self,
        src: &KernelSource<'_>,
        opts: &CompileOptions,
        cache: CacheStatus,
        path: Option<PathBuf>,
        start: Instant,
    ) -> Result<JitOutput, JitError> {
        let kernel = compile::compile(&self.nvrtc, src, opts)?;
        Ok(JitOutput {
            kernel,
            cache,
            path,
            elapsed: start.elapsed(),
        })
    }
}
