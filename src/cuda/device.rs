//! Finding the GPU: is a driver there, which device, what it can do.
//!
//! cudarc's driver loader panics when `libcuda` is missing, so presence is checked first with a
//! plain `dlopen`: on a machine without a GPU, attnforge reports "no driver" as an error and the
//! CPU backend carries on.

use super::error::{CudaError, DriverContext};
use crate::jit::Arch;
use cudarc::driver::sys::CUdevice_attribute;
use cudarc::driver::CudaContext;
use std::sync::Arc;

/// Names the driver library goes by on Linux.
const DRIVER_LIBRARIES: [&str; 2] = ["libcuda.so.1", "libcuda.so"];

/// Checks that the CUDA driver library loads, without touching cudarc's loader.
pub fn driver_present() -> Result<(), CudaError> {
    let mut last = String::new();
    for name in DRIVER_LIBRARIES {
        // SAFETY: loading the NVIDIA driver library runs its initialisers, which have no
        // preconditions; the handle is dropped (the library stays loaded for cudarc).
        match unsafe { libloading::Library::new(name) } {
            Ok(_) => return Ok(()),
            Err(e) => last = e.to_string(),
        }
    }
    Err(CudaError::NoDriver {
        tried: DRIVER_LIBRARIES.join(", "),
        reason: last,
    })
}

/// An opened GPU and its properties.
#[derive(Debug, Clone)]
pub struct DeviceInfo {
    /// Ordinal.
    pub ordinal: usize,
    /// Marketing name.
    pub name: String,
    /// Compute capability.
    pub compute_capability: (u32, u32),
    /// The architecture kernels are compiled for.
    pub arch: Arch,
    /// Multiprocessors.
    pub sm_count: u32,
    /// Largest dynamic shared memory a block may opt into.
    pub max_smem_per_block: u32,
}

/// Opens device `ordinal`: checks the driver, creates (retains) its primary context.
pub fn open(ordinal: usize) -> Result<(Arc<CudaContext>, DeviceInfo), CudaError> {
    driver_present()?;
    let ctx = CudaContext::new(ordinal).during(format!("context creation on device {ordinal}"))?;
    let name = ctx.name().during("device name")?;
    let (major, minor) = ctx.compute_capability().during("compute capability")?;
    let (major, minor) = (major as u32, minor as u32);
    let arch =
        Arch::from_compute_capability(major, minor).map_err(|e| CudaError::UnsupportedDevice {
            name: name.clone(),
            major,
            minor,
            reason: e.to_string(),
        })?;
    let sm_count = ctx
        .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        .during("SM count")?;
    let max_smem = ctx
        .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
        .during("shared memory limit")?;
    let info = DeviceInfo {
        ordinal,
        name,
        compute_capability: (major, minor),
        arch,
        sm_count: sm_count as u32,
        max_smem_per_block: max_smem as u32,
    };
    Ok((ctx, info))
}
