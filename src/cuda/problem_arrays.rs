//! The device copies of a problem's own arrays, which every kernel launched for it reads: the
//! index pointers, the custom mask and the variant's parameter arrays. The prefill and paged
//! plans and the reference kernel upload them through [`ProblemArrays`] alike. A graph-stable
//! plan's index pointers are sized for its capacity and rewritten in place
//! ([`ProblemArrays::rewrite`]).

use super::engine::Engine;
use super::plan::{memory_write, upload};
use crate::codegen::{self, VariantLayout};
use crate::problem::{AttentionProblem, Mask, ParamValue};
use crate::Error;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use std::sync::Arc;

/// A problem's arrays on the device.
pub(crate) struct ProblemArrays {
    qo_indptr: CudaSlice<i32>,
    kv_indptr: CudaSlice<i32>,
    /// The packed mask (followed by [`codegen::CUSTOM_MASK_PAD_BYTES`] zero bytes) and each
    /// request's byte offset into it (as i64), for a custom mask.
    custom_mask: Option<(CudaSlice<u8>, CudaSlice<i64>)>,
    /// The variant's array parameters, as bytes, in declaration order.
    variant_arrays: Vec<CudaSlice<u8>>,
    /// The variant's parameter values (arrays still on the host).
    variant_values: Vec<ParamValue>,
}

impl ProblemArrays {
    /// Uploads the arrays of `problem` on the engine's stream.
    pub fn upload(engine: &Engine, problem: &AttentionProblem) -> Result<ProblemArrays, Error> {
        let custom_mask = match &problem.mask {
            Mask::Custom(m) => {
                let offsets: Vec<i64> = m.mask_indptr.iter().map(|&o| o as i64).collect();
                // The kernels read a row's bits as aligned words, which reach past the last
                // segment's end: padded (a device allocation is aligned far beyond 4 bytes).
                let mut packed = m.packed.clone();
                packed.resize(m.packed.len() + codegen::CUSTOM_MASK_PAD_BYTES, 0);
                Some((
                    upload(engine, &packed, "custom mask")?,
                    upload(engine, &offsets, "mask_indptr")?,
                ))
            }
            _ => None,
        };
        let variant_values =
            codegen::param_values(&problem.variant, problem.qk_scaling().post_scale);
        let mut variant_arrays = Vec::new();
        for value in &variant_values {
            let bytes: Option<Vec<u8>> = match value {
                ParamValue::F32Array(a) => Some(a.iter().flat_map(|x| x.to_le_bytes()).collect()),
                ParamValue::I32Array(a) => Some(a.iter().flat_map(|x| x.to_le_bytes()).collect()),
                ParamValue::F32(_) | ParamValue::I32(_) => None,
            };
            if let Some(bytes) = bytes {
                variant_arrays.push(upload(engine, &bytes, "variant parameter")?);
            }
        }
        Ok(ProblemArrays {
            qo_indptr: upload(engine, &problem.batch.qo_indptr, "qo_indptr")?,
            kv_indptr: upload(engine, &problem.batch.kv_indptr, "kv_indptr")?,
            custom_mask,
            variant_arrays,
            variant_values,
        })
    }

    /// [`upload`](Self::upload) with index pointers room for `max_batch` requests, so that
    /// [`rewrite`](Self::rewrite) can write any batch up to that size at the same addresses.
    pub fn upload_with_capacity(
        engine: &Engine,
        problem: &AttentionProblem,
        max_batch: usize,
    ) -> Result<ProblemArrays, Error> {
        let mut arrays = ProblemArrays::upload(engine, problem)?;
        let room = |indptr: &[i32]| {
            let mut v = indptr.to_vec();
            v.resize(
                (max_batch + 1).max(indptr.len()),
                *indptr.last().unwrap_or(&0),
            );
            v
        };
        arrays.qo_indptr = upload(engine, &room(&problem.batch.qo_indptr), "qo_indptr")?;
        arrays.kv_indptr = upload(engine, &room(&problem.batch.kv_indptr), "kv_indptr")?;
        Ok(arrays)
    }

    /// Writes the index pointers of `problem` over the uploaded ones on `stream`, in place. The
    /// other arrays stay: `problem` must have no custom mask and the same variant parameters
    /// (an error otherwise).
    pub fn rewrite(
        &mut self,
        stream: &Arc<CudaStream>,
        problem: &AttentionProblem,
    ) -> Result<(), Error> {
        let values = codegen::param_values(&problem.variant, problem.qk_scaling().post_scale);
        if values != self.variant_values || matches!(problem.mask, Mask::Custom(_)) {
            return Err(crate::problem::InvalidProblem::new(
                "variant",
                "a graph-stable plan keeps its variant's parameters and has no custom mask",
            )
            .into());
        }
        memory_write(
            stream,
            &problem.batch.qo_indptr,
            &mut self.qo_indptr,
            "qo_indptr",
        )?;
        memory_write(
            stream,
            &problem.batch.kv_indptr,
            &mut self.kv_indptr,
            "kv_indptr",
        )
    }

    /// Device addresses of `qo_indptr` and `kv_indptr`.
    pub fn indptrs(&self, stream: &Arc<CudaStream>) -> (u64, u64) {
        (
            self.qo_indptr.device_ptr(stream).0,
            self.kv_indptr.device_ptr(stream).0,
        )
    }

    /// Device addresses of the packed custom mask and of its per-request offsets (0, 0 without a
    /// custom mask).
    pub fn custom_mask(&self, stream: &Arc<CudaStream>) -> (u64, u64) {
        self.custom_mask.as_ref().map_or((0, 0), |(m, i)| {
            (m.device_ptr(stream).0, i.device_ptr(stream).0)
        })
    }

    /// The bytes of the variant's parameter struct laid out by `layout`, arrays as device
    /// addresses.
    pub fn variant_bytes(&self, stream: &Arc<CudaStream>, layout: &VariantLayout) -> Vec<u8> {
        let array_ptrs: Vec<u64> = self
            .variant_arrays
            .iter()
            .map(|a| a.device_ptr(stream).0)
            .collect();
        layout.pack(&self.variant_values, &array_ptrs)
    }
}
