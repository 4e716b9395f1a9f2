//! `attnforge info`: version, backends (CPU always; CUDA when the driver loads), NVRTC's location
//! and version, and the kernel cache.
//!
//! Nothing here fails the command: each line says what was found or why not. The CUDA driver is
//! probed with a plain `dlopen` first ([`attnforge::cuda::driver_present`]), because cudarc's own
//! loader panics when the library is missing; only after that succeeds is a cudarc context
//! created (and a panic of cudarc's lazily-resolved symbols is still caught and reported).

use std::process::ExitCode;

use attnforge::jit::locate::locate;
use attnforge::jit::nvrtc::Nvrtc;
use attnforge::jit::{Arch, DiskCache};

/// Runs the subcommand.
pub fn run() -> ExitCode {
    println!("attnforge {}", env!("CARGO_PKG_VERSION"));
    println!("backends:");
    println!(
        "  cpu:  available ({} threads)",
        rayon::current_num_threads()
    );
    println!("  cuda: {}", cuda_line());
    println!("nvrtc:  {}", nvrtc_line().replace('\n', "\n        "));
    println!("cache:  {}", cache_line());
    ExitCode::SUCCESS
}

fn cuda_line() -> String {
    if let Err(e) = attnforge::cuda::driver_present() {
        return format!("unavailable ({e})");
    }
    match std::panic::catch_unwind(device_description) {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => format!("driver loads, but no usable device: {e}"),
        Err(_) => {
            "driver loads, but cudarc panicked while querying it (driver older than CUDA 13?)"
                .into()
        }
    }
}

/// Device 0's name, compute capability and compile target.
fn device_description() -> Result<String, String> {
    let count = cudarc::driver::CudaContext::device_count().map_err(|e| e.to_string())?;
    let ctx = cudarc::driver::CudaContext::new(0).map_err(|e| e.to_string())?;
    let name = ctx.name().map_err(|e| e.to_string())?;
    let (major, minor) = ctx.compute_capability().map_err(|e| e.to_string())?;
    let target = u32::try_from(major)
        .ok()
        .zip(u32::try_from(minor).ok())
        .map(|(a, b)| match Arch::from_compute_capability(a, b) {
            Ok(arch) => format!("kernels target {arch}"),
            Err(e) => e.to_string(),
        })
        .unwrap_or_else(|| "invalid compute capability".into());
    Ok(format!(
        "{count} device(s); device 0: {name}, compute capability {major}.{minor}, {target}"
    ))
}

fn nvrtc_line() -> String {
    let loc = match locate() {
        Ok(loc) => loc,
        Err(e) => return format!("not found\n{e}"),
    };
    match Nvrtc::load(&loc.lib, loc.builtins.as_deref()) {
        Ok(n) => format!(
            "{} (version {}, found via {})",
            loc.lib.display(),
            n.version(),
            loc.origin
        ),
        Err(e) => format!("found but unusable: {e}"),
    }
}

fn cache_line() -> String {
    let dir = match DiskCache::default_dir() {
        Ok(d) => d,
        Err(e) => return e.to_string(),
    };
    if !dir.exists() {
        return format!("{} (not created yet; 0 entries)", dir.display());
    }
    match DiskCache::open(&dir).and_then(|c| c.entry_count()) {
        Ok(n) => format!("{} ({n} entries)", dir.display()),
        Err(e) => format!("{} ({e})", dir.display()),
    }
}
