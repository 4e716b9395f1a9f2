//! Tensor maps for the prefill kernels' K/V tile copies by the tensor memory accelerator
//! (`kernels/tma.cuh`), swizzled as wgmma reads them (128-byte swizzle), each box 64 elements of
//! one head's vector (128 bytes, the swizzle's span) by:
//! - ragged K/V, a `[tokens, heads, dim]` view as a 3-D tensor: 64 tokens (a KV tile);
//! - a paged cache as a 4-D tensor `[pages, slots, heads, dim]` (NHD or HND: only the strides
//!   differ): `min(page size, 64)` slots of one page, so a tile takes one box per page (pages of
//!   at least 8 slots, whose boxes start 1024-byte aligned in the tile).
//!
//! Encoded on the host for each launch (the driver only fills 128 bytes; no device call). A view
//! the accelerator cannot address (an unaligned base or stride, a dimension past its limits,
//! pages of fewer than 8 slots) gets no map, and the kernel copies its tiles with `cp.async`
//! instead: the same values, by the threads' own copies.

use crate::codegen::TmaMap;
use crate::dtype::DType;
use cudarc::driver::sys;
use std::ffi::c_void;

/// Elements of a head's vector per box: 128 bytes of 16-bit elements.
const BOX_ELEMS: usize = 64;
/// Tokens per box: the KV tile of the kernels that take the maps (at most).
const BOX_TOKENS: usize = 64;
/// The fewest slots a page may have for its boxes: 8 rows of 128 bytes, one swizzle period.
const MIN_BOX_TOKENS: usize = 8;
/// The accelerator's limits: 16-byte aligned addresses and strides, strides below 2^40 bytes,
/// dimensions of at most 2^32 elements.
const ALIGN_BYTES: u64 = 16;
const MAX_STRIDE_BYTES: u64 = 1 << 40;
const MAX_DIM: u64 = 1 << 32;

/// The shape of a K or V view, as the kernel reads it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct KvView {
    /// Device address of element 0 of head 0 of token 0 (of page 0).
    pub address: u64,
    pub dtype: DType,
    pub heads: usize,
    pub dim: usize,
    /// Strides in elements (paged: the token stride within a page).
    pub token_stride: i64,
    pub head_stride: i64,
    pub rows: KvRowsView,
}

/// How the tokens of a [`KvView`] are laid out.
#[derive(Clone, Copy, Debug)]
pub(crate) enum KvRowsView {
    /// One run of `tokens` rows.
    Ragged { tokens: usize },
    /// `num_pages` pages of `page_size` slots, `page_stride` elements apart.
    Paged {
        num_pages: usize,
        page_size: usize,
        page_stride: i64,
    },
}

/// The tensor map of `view`, or `None` when the accelerator cannot address it (the reason is
/// logged at debug level).
pub(crate) fn kv_tensor_map(view: &KvView) -> Option<TmaMap> {
    match encode(view) {
        Ok(map) => Some(map),
        Err(why) => {
            log::debug!("K/V tiles copied with cp.async, not the tensor memory accelerator: {why}");
            None
        }
    }
}

fn encode(view: &KvView) -> Result<TmaMap, String> {
    let data_type = match view.dtype {
        DType::F16 => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
        DType::Bf16 => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
        other => return Err(format!("{other} elements")),
    };
    let elem = view.dtype.size_bytes() as u64;
    if view.dim % BOX_ELEMS != 0 || view.heads == 0 {
        return Err(format!("{} heads of {} elements", view.heads, view.dim));
    }
    let stride_bytes = |stride: i64, what: &str| -> Result<u64, String> {
        u64::try_from(stride)
            .ok()
            .map(|s| s * elem)
            .filter(|&b| b > 0 && b % ALIGN_BYTES == 0 && b < MAX_STRIDE_BYTES)
            .ok_or_else(|| format!("a {what} stride of {stride} elements"))
    };
    let token_stride = stride_bytes(view.token_stride, "token")?;
    // With one head the head coordinate is always 0: any valid stride describes the view.
    let head_stride = if view.heads == 1 {
        view.dim as u64 * elem
    } else {
        stride_bytes(view.head_stride, "head")?
    };
    if view.address % ALIGN_BYTES != 0 {
        return Err(format!("a base address {:#x}", view.address));
    }
    // Innermost first: elements, heads, tokens (ragged) or slots and pages (paged).
    let (dims, strides, box_dims, rank) = match view.rows {
        KvRowsView::Ragged { tokens } => (
            [view.dim as u64, view.heads as u64, tokens as u64, 1],
            [head_stride, token_stride, 0],
            [BOX_ELEMS as u32, 1, BOX_TOKENS as u32, 1],
            3,
        ),
        KvRowsView::Paged {
            num_pages,
            page_size,
            page_stride,
        } => {
            if page_size < MIN_BOX_TOKENS {
                return Err(format!("pages of {page_size} slots"));
            }
            (
                [
                    view.dim as u64,
                    view.heads as u64,
                    page_size as u64,
                    num_pages as u64,
                ],
                [
                    head_stride,
                    token_stride,
                    stride_bytes(page_stride, "page")?,
                ],
                [BOX_ELEMS as u32, 1, page_size.min(BOX_TOKENS) as u32, 1],
                4,
            )
        }
    };
    if dims.iter().any(|&d| d == 0 || d > MAX_DIM) {
        return Err(format!("dimensions {dims:?}"));
    }
    let element_strides = [1u32; 4];
    let mut map = sys::CUtensorMap { opaque: [0; 16] };
    // SAFETY: every pointer refers to a live local array at least as long as the rank the call
    // is given (rank - 1 for the strides of the outer dimensions), and `map` is written in place;
    // the driver only encodes the description (the address is not dereferenced here).
    let result = unsafe {
        sys::cuTensorMapEncodeTiled(
            &mut map,
            data_type,
            rank,
            view.address as *mut c_void,
            dims.as_ptr(),
            strides.as_ptr(),
            box_dims.as_ptr(),
            element_strides.as_ptr(),
            sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
            sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
    };
    if result != sys::CUresult::CUDA_SUCCESS {
        return Err(format!("cuTensorMapEncodeTiled returned {result:?}"));
    }
    Ok(TmaMap(map.opaque))
}
