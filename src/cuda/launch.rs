//! The launch of a kernel without specialisation (`codegen`'s fixed kernels: the paged-KV
//! append, the public merge): one parameter struct, a one-dimensional grid, no dynamic shared
//! memory. The callers check the buffers and build the parameter block; this is where it is
//! handed to the driver, with a failed launch named after the kernel.

use super::error::CudaError;
use cudarc::driver::{CudaFunction, CudaStream};
use std::ffi::c_void;

/// Launches `function` on `stream` with `blocks` blocks of `threads` threads, no dynamic shared
/// memory and `params` as its one argument; a failed launch is a [`CudaError::Launch`] naming
/// `kernel`. Nothing waits: the kernel runs in `stream`'s order.
///
/// # Safety
/// `function` must take exactly one parameter laid out as `P` (a `repr(C)` struct without
/// padding whose CUDA twin asserts the same field sizes), and every address in `params` must
/// refer to memory that stays valid, and is large enough, for all the kernel reads and writes
/// until it has run on `stream`.
pub(crate) unsafe fn launch_fixed<P>(
    stream: &CudaStream,
    function: &CudaFunction,
    kernel: &str,
    blocks: u32,
    threads: u32,
    params: &P,
) -> Result<(), CudaError> {
    // The driver only reads the argument (it copies the parameter bytes at launch).
    let mut args = [std::ptr::from_ref(params).cast_mut().cast::<c_void>()];
    // SAFETY: the caller vouches for the kernel's signature and for every address in `params`;
    // `args` points to `params`, which outlives this call.
    unsafe {
        cudarc::driver::result::launch_kernel(
            function.cu_function(),
            (blocks, 1, 1),
            (threads, 1, 1),
            0,
            stream.cu_stream(),
            &mut args,
        )
    }
    .map_err(|source| CudaError::Launch {
        kernel: kernel.into(),
        source,
    })
}
