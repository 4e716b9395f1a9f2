//! Handing a kernel launch to the driver: every attnforge kernel takes one parameter (a struct,
//! or the bytes of a generated parameter block) on a one-dimensional grid. The callers check the
//! buffers and build the parameter; this is where it is launched, with a failed launch named
//! after the kernel.

use super::error::CudaError;
use cudarc::driver::{CudaFunction, CudaStream};
use std::ffi::c_void;

/// The shape of a one-dimensional launch.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Launch1d {
    /// CTAs in the grid.
    pub blocks: u32,
    /// Threads per CTA.
    pub threads: u32,
    /// Dynamic shared memory per CTA, in bytes.
    pub smem_bytes: u32,
}

/// Launches `function` on `stream` with the shape `launch` and the bytes at `param` as its one
/// argument (the driver copies them at launch); a failed launch is a [`CudaError::Launch`] named
/// `kernel()`, which is called only then. Nothing waits: the kernel runs in `stream`'s order.
///
/// # Safety
/// `function` must take exactly one parameter whose bytes `param` holds (a `repr(C)` struct
/// without padding whose CUDA twin asserts the same field sizes, or a generated parameter block
/// packed to the kernel's layout), and every address in it must refer to memory that stays
/// valid, and is large enough, for all the kernel reads and writes until it has run on `stream`.
pub(crate) unsafe fn launch_1d<P: ?Sized>(
    stream: &CudaStream,
    function: &CudaFunction,
    launch: Launch1d,
    param: &P,
    kernel: impl FnOnce() -> String,
) -> Result<(), CudaError> {
    // The driver only reads the argument.
    let mut args = [std::ptr::from_ref(param).cast_mut().cast::<c_void>()];
    // SAFETY: the caller vouches for the kernel's signature and for every address in `param`;
    // `args` points to `param`, which outlives this call.
    unsafe {
        cudarc::driver::result::launch_kernel(
            function.cu_function(),
            (launch.blocks, 1, 1),
            (launch.threads, 1, 1),
            launch.smem_bytes,
            stream.cu_stream(),
            &mut args,
        )
    }
    .map_err(|source| CudaError::Launch {
        kernel: kernel(),
        source,
    })
}
