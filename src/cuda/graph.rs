//! Capturing launches into a CUDA graph: what [`Engine::paged_host`](super::Engine::paged_host)
//! replays to prove a replay reads new contents, and what `attnforge bench` replays to time
//! kernels without the host's launch overhead.

use super::error::{CudaError, DriverContext};
use crate::Error;
use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaGraph, CudaStream};
use std::sync::Arc;

/// Captures what `launches` enqueues on `stream` (launches that neither allocate nor
/// synchronise, such as the plans' `run_on`) into an instantiated graph, replayed with
/// [`CudaGraph::launch`] on the same stream. The capture is ended whatever `launches` returns;
/// its error, if any, comes first.
pub fn capture_graph(
    stream: &Arc<CudaStream>,
    launches: impl FnOnce() -> Result<(), Error>,
) -> Result<CudaGraph, Error> {
    stream
        .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .during("beginning a graph capture")?;
    let launched = launches();
    let graph = stream
        .end_capture(CUgraphInstantiate_flags(0))
        .during("ending a graph capture");
    launched?;
    graph?.ok_or_else(|| {
        Error::from(CudaError::Buffer {
            name: "graph",
            reason: "the capture recorded no work".into(),
        })
    })
}
