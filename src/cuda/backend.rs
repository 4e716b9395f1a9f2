//! The GPU as a [`Backend`](crate::verify::Backend) of the verify suite.

use super::engine::Engine;
use super::paged::PagedRunMode;
use crate::paged::{PagedAttention, PagedKv};
use crate::problem::AttentionProblem;
use crate::tensor::HostTensor;
use crate::testing::BackendCaps;
use crate::verify::Backend;
use crate::{AttentionOutput, Error};

/// Runs each problem through [`Engine::prefill_host`] (outputs poisoned with NaN first).
pub struct CudaBackend {
    engine: Engine,
}

impl CudaBackend {
    /// Opens GPU `ordinal`.
    pub fn new(ordinal: usize) -> Result<CudaBackend, Error> {
        Ok(CudaBackend {
            engine: Engine::new(ordinal)?,
        })
    }

    /// The engine.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }
}

impl Backend for CudaBackend {
    fn name(&self) -> &'static str {
        "cuda"
    }

    fn describe(&self) -> String {
        let info = self.engine.info();
        format!(
            "cuda ({}, {}, {} SMs)",
            info.name,
            info.arch.name(),
            info.sm_count
        )
    }

    fn caps(&self) -> BackendCaps {
        BackendCaps::cuda()
    }

    fn run(
        &self,
        problem: &AttentionProblem,
        q: &HostTensor,
        k: &HostTensor,
        v: &HostTensor,
    ) -> Result<AttentionOutput, Error> {
        self.engine.prefill_host(problem, q, k, v)
    }

    fn run_paged(
        &self,
        p: &PagedAttention,
        q: &HostTensor,
        cache: PagedKv<'_>,
        graph: bool,
    ) -> Result<AttentionOutput, Error> {
        let mode = if graph {
            PagedRunMode::GraphReplay
        } else {
            PagedRunMode::Direct
        };
        self.engine.paged_host(p, q, cache, mode)
    }
}
