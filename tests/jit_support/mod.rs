//! Shared set-up of the JIT integration tests: find NVRTC once, or skip with the reason.
//!
//! Without NVRTC these tests print why they skip; `scripts/test` (and so CI) installs NVRTC and
//! sets `ATTNFORGE_REQUIRE_NVRTC=1`, which turns a missing NVRTC into a failure.

#![allow(dead_code)] // each test binary uses a different subset

use std::sync::{Arc, OnceLock};

use attnforge::jit::locate::locate;
use attnforge::jit::nvrtc::Nvrtc;
use attnforge::jit::{DiskCache, Jit};

/// Set to `1` to fail, not skip, when NVRTC is missing.
pub const REQUIRE_ENV: &str = "ATTNFORGE_REQUIRE_NVRTC";

/// The process-wide NVRTC, or `None` (after printing why) when it is absent and not required.
pub fn nvrtc() -> Option<Arc<Nvrtc>> {
    static NVRTC: OnceLock<Result<Arc<Nvrtc>, String>> = OnceLock::new();
    let loaded = NVRTC.get_or_init(|| {
        let loc = locate().map_err(|e| e.to_string())?;
        Nvrtc::load(&loc.lib, loc.builtins.as_deref())
            .map(Arc::new)
            .map_err(|e| e.to_string())
    });
    match loaded {
        Ok(n) => Some(n.clone()),
        Err(e) if std::env::var(REQUIRE_ENV).as_deref() == Ok("1") => {
            panic!("{REQUIRE_ENV}=1 but NVRTC is unavailable:\n{e}")
        }
        Err(e) => {
            eprintln!("SKIPPED: NVRTC unavailable (set {REQUIRE_ENV}=1 to fail instead):\n{e}");
            None
        }
    }
}

/// A `Jit` with a cache in `dir`, or without a cache.
pub fn jit(cache_dir: Option<&std::path::Path>) -> Option<Jit> {
    let cache = cache_dir.map(|d| DiskCache::open(d).expect("open cache"));
    nvrtc().map(|n| Jit::new(n, cache))
}

/// A small kernel with static shared memory: `x[i] += y[255 - tid]`.
pub const ADD_KERNEL: &str = r#"extern "C" __global__ void add(float* x, const float* y, int n) {
  __shared__ float tile[256];
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  tile[threadIdx.x] = i < n ? y[i] : 0.f;
  __syncthreads();
  if (i < n) x[i] += tile[255 - threadIdx.x];
}
"#;

/// A kernel that `__launch_bounds__` forces to spill (a few hundred ms to compile).
pub const SPILL_KERNEL: &str = r#"extern "C" __global__ void __launch_bounds__(1024, 2) heavy(float* a, const float* b) {
  float acc[96];
  #pragma unroll
  for (int j = 0; j < 96; j++) acc[j] = b[threadIdx.x * 96 + j];
  #pragma unroll
  for (int r = 0; r < 8; r++)
  #pragma unroll
  for (int j = 0; j < 96; j++) acc[j] = acc[j] * acc[(j + r + 1) % 96] + b[j + r];
  float s = 0;
  #pragma unroll
  for (int j = 0; j < 96; j++) s += acc[j];
  a[threadIdx.x] = s;
}
"#;
