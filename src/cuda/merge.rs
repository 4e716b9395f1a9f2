//! `merge_state` on the GPU, public: partial attention states `(o, lse)` over disjoint key sets
//! merged into one, for shared-prefix (cascade) attention and for callers that split a KV range
//! themselves. The math is [`crate::merge`]'s (and the split-KV merge's: both kernels share
//! `kernels/merge_math.cuh`); one generated kernel (`kernels/merge_states.cuh`) serves both
//! forms:
//! - [`Engine::merge_state`]: two states in separate tensors;
//! - [`Engine::merge_states`]: `n` states stored together, `o [rows, n, heads, head_dim]`,
//!   `lse [rows, n, heads]`.
//!
//! `o` is f16, bf16 or f32 (in and out alike), LSEs are f32 natural logs. A state whose LSE is
//! `-inf` adds nothing whatever its `o` holds; a row where every state is `-inf` becomes
//! `(0, -inf)`. The sink of a sink variant is not applied here (see [`crate::merge::apply_sink`]).
//! Every shape, dtype and alignment is checked before the launch; nothing is allocated and
//! nothing waits, so the call may be captured in a CUDA graph.

use super::buffers::DeviceTensor;
use super::engine::Engine;
use super::error::CudaError;
use super::launch::{launch_1d, Launch1d};
use crate::codegen::{self, MergeParams, MERGE_STATES_ITEMS_PER_CTA, MERGE_STATES_THREADS};
use crate::dtype::DType;
use crate::merge::MergeShape;
use crate::Error;
use cudarc::driver::CudaStream;
use std::sync::Arc;

/// One state (or `n` stored together): `o`, then the LSEs.
pub type DeviceState<'a> = (&'a DeviceTensor, &'a DeviceTensor);

fn dtype_code(dtype: DType) -> i32 {
    match dtype {
        DType::F16 => 0,
        DType::Bf16 => 1,
        DType::F32 => 2,
    }
}

fn check(name: &'static str, t: &DeviceTensor, dtype: DType, len: usize) -> Result<(), Error> {
    if t.dtype() != dtype {
        return Err(CudaError::Buffer {
            name,
            reason: format!("is {}, expected {dtype}", t.dtype()),
        }
        .into());
    }
    if t.len() != len {
        return Err(CudaError::Buffer {
            name,
            reason: format!("has {} elements, expected {len}", t.len()),
        }
        .into());
    }
    Ok(())
}

/// The kernel reads and writes `o` two elements at a time.
fn check_pair_alignment(name: &'static str, address: u64, dtype: DType) -> Result<(), Error> {
    let align = 2 * dtype.size_bytes() as u64;
    if address % align != 0 {
        return Err(CudaError::Buffer {
            name,
            reason: format!(
                "starts at {address:#x}, not a multiple of {align} bytes (two elements)"
            ),
        }
        .into());
    }
    Ok(())
}

impl Engine {
    /// Merges state `a` (`o [rows, heads, head_dim]`, `lse [rows, heads]`, contiguous) and
    /// state `b` into `out` on `stream`.
    pub fn merge_state(
        &self,
        stream: &Arc<CudaStream>,
        shape: MergeShape,
        a: DeviceState<'_>,
        b: DeviceState<'_>,
        out: (&mut DeviceTensor, &mut DeviceTensor),
    ) -> Result<(), Error> {
        let dtype = a.0.dtype();
        check("o_b", b.0, dtype, shape.o_len())?;
        check("lse_b", b.1, DType::F32, shape.lse_len())?;
        let v1 = b.0.device_address(stream);
        let s1 = b.1.device_address(stream);
        check_pair_alignment("o_b", v1, dtype)?;
        self.launch_merge(stream, shape, 2, a, ("o_a", "lse_a"), (v1, s1), false, out)
    }

    /// Merges `num_states` states stored together (`o [rows, num_states, heads, head_dim]`,
    /// `lse [rows, num_states, heads]`, contiguous) into `out` on `stream`.
    pub fn merge_states(
        &self,
        stream: &Arc<CudaStream>,
        shape: MergeShape,
        num_states: usize,
        states: DeviceState<'_>,
        out: (&mut DeviceTensor, &mut DeviceTensor),
    ) -> Result<(), Error> {
        if num_states == 0 {
            return Err(CudaError::Buffer {
                name: "num_states",
                reason: "is 0; a merge needs at least one state".into(),
            }
            .into());
        }
        let dtype = states.0.dtype();
        let elem = dtype.size_bytes() as u64;
        // State c >= 1 is read at v1 + (c - 1) state strides: v1 is state 1's address. With one
        // state, v1 is never read.
        let v1 = states.0.device_address(stream) + (shape.heads * shape.head_dim) as u64 * elem;
        let s1 = states.1.device_address(stream) + shape.heads as u64 * 4;
        self.launch_merge(
            stream,
            shape,
            num_states,
            states,
            ("o", "lse"),
            (v1, s1),
            true,
            out,
        )
    }

    /// The one launch of the merge kernel. State 0 is `first`; states 1.. start at
    /// `rest = (o, lse)` addresses, `num_states` states in all; `interleaved` is true when the
    /// states are stored together (a row holds all of them), false when state 0 and state 1 are
    /// separate tensors of one state each.
    #[allow(clippy::too_many_arguments)]
    fn launch_merge(
        &self,
        stream: &Arc<CudaStream>,
        shape: MergeShape,
        num_states: usize,
        first: DeviceState<'_>,
        names: (&'static str, &'static str),
        rest: (u64, u64),
        interleaved: bool,
        out: (&mut DeviceTensor, &mut DeviceTensor),
    ) -> Result<(), Error> {
        let dtype = first.0.dtype();
        if shape.head_dim == 0 || shape.head_dim % 2 != 0 {
            return Err(CudaError::Buffer {
                name: "head_dim",
                reason: format!(
                    "is {}; the merge needs a positive even head_dim",
                    shape.head_dim
                ),
            }
            .into());
        }
        // States in one row of `first`: its sizes here, its row strides in the parameter block.
        let per_row = if interleaved { num_states } else { 1 };
        check(names.0, first.0, dtype, shape.o_len() * per_row)?;
        check(names.1, first.1, DType::F32, shape.lse_len() * per_row)?;
        check("merged o", out.0, dtype, shape.o_len())?;
        check("merged lse", out.1, DType::F32, shape.lse_len())?;
        let items = shape.lse_len();
        if items == 0 {
            return Ok(());
        }
        let blocks = u32::try_from(items.div_ceil(MERGE_STATES_ITEMS_PER_CTA as usize))
            .ok()
            .filter(|&b| b < (1 << 31))
            .ok_or_else(|| CudaError::Buffer {
                name: "rows",
                reason: format!("{items} (row, head) items need more blocks than a grid holds"),
            })?;
        let to_i32 = |x: usize, name: &'static str| {
            i32::try_from(x).map_err(|_| CudaError::Buffer {
                name,
                reason: format!("{x} does not fit the kernel's 32-bit counts"),
            })
        };
        let v0 = first.0.device_address(stream);
        check_pair_alignment(names.0, v0, dtype)?;
        let v_out = out.0.device_address(stream);
        check_pair_alignment("merged o", v_out, dtype)?;
        let (h, d) = (shape.heads as i64, shape.head_dim as i64);
        let row_states = per_row as i64;
        let params = MergeParams {
            v0,
            v1: rest.0,
            s0: first.1.device_address(stream),
            s1: rest.1,
            v_out,
            s_out: out.1.device_address(stream),
            v_stride_row: row_states * h * d,
            v_stride_state: h * d,
            v_stride_head: d,
            s_stride_row: row_states * h,
            s_stride_state: h,
            s_stride_head: 1,
            out_stride_row: h * d,
            out_stride_head: d,
            s_out_stride_row: h,
            rows: to_i32(shape.rows, "rows")?,
            heads: to_i32(shape.heads, "heads")?,
            num_states: to_i32(num_states, "num_states")?,
            head_dim: to_i32(shape.head_dim, "head_dim")?,
            dtype: dtype_code(dtype),
            reserved: 0,
        };
        let kernel = self.fixed_kernel(codegen::render_merge_states)?;
        // SAFETY: the kernel takes one MergeParams, repr(C) without padding, whose CUDA twin
        // asserts the same field sizes; every buffer was checked to hold the elements the
        // strides reach (states, merged outputs) in the dtype the kernel is told, with the
        // two-element alignment its paired loads and stores need; the outputs are borrowed
        // mutably, so they alias no input.
        unsafe {
            launch_1d(
                stream,
                &kernel,
                Launch1d {
                    blocks,
                    threads: MERGE_STATES_THREADS,
                    smem_bytes: 0,
                },
                &params,
                || "attnforge_merge_states".into(),
            )
        }?;
        Ok(())
    }
}
