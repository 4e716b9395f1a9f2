//! The fast CPU backend as a [`Backend`](crate::verify::Backend) of the CLI and the verify suite.

use super::{attention_with_isa, Isa, BACKEND};
use crate::dtype::DType;
use crate::merge::{merge_many, MergeShape};
use crate::paged::{PagedAttention, PagedCache};
use crate::problem::AttentionProblem;
use crate::tensor::HostTensor;
use crate::testing::{BackendCaps, PagedRun, TileRequest};
use crate::verify::Backend;
use crate::{AttentionOutput, Error};

/// The CPU backend with the kernels of one instruction set.
#[derive(Clone, Copy, Debug)]
pub struct CpuBackend {
    isa: Isa,
}

impl CpuBackend {
    /// The best kernels this machine runs.
    pub fn detect() -> CpuBackend {
        CpuBackend { isa: Isa::detect() }
    }
}

impl Backend for CpuBackend {
    fn name(&self) -> &'static str {
        BACKEND
    }

    fn describe(&self) -> String {
        format!(
            "cpu ({} kernels, {} threads)",
            self.isa.name(),
            rayon::current_num_threads()
        )
    }

    fn caps(&self) -> BackendCaps {
        BackendCaps::cpu()
    }

    fn run(
        &self,
        p: &AttentionProblem,
        q: &HostTensor,
        k: &HostTensor,
        v: &HostTensor,
        _tile: TileRequest,
    ) -> Result<AttentionOutput, Error> {
        attention_with_isa(p, q, k, v, self.isa)
    }

    fn run_paged(
        &self,
        p: &PagedAttention,
        q: &HostTensor,
        cache: PagedCache<'_>,
        _tokens: (&HostTensor, &HostTensor),
        run: PagedRun,
        _tile: TileRequest,
    ) -> Result<AttentionOutput, Error> {
        if run != PagedRun::Direct {
            return Err(Error::Unsupported {
                backend: BACKEND,
                what: format!("the paged run {run:?}"),
                supported: "direct runs".into(),
            });
        }
        super::paged::paged_attention_with(p, q, cache, |problem, q, k, v| {
            attention_with_isa(problem, q, k, v, self.isa)
        })
    }

    fn merge_states(
        &self,
        shape: MergeShape,
        states: &[(HostTensor, Vec<f32>)],
    ) -> Result<(HostTensor, Vec<f32>), Error> {
        let dtype = states.first().map_or(DType::F32, |(o, _)| o.dtype());
        let wide: Vec<Vec<f32>> = states.iter().map(|(o, _)| o.to_f32_vec()).collect();
        let views: Vec<(&[f32], &[f32])> = wide
            .iter()
            .zip(states)
            .map(|(o, (_, lse))| (&o[..], &lse[..]))
            .collect();
        let (o, lse) = merge_many(shape, &views)?;
        Ok((HostTensor::from_f32(dtype, &o), lse))
    }
}
