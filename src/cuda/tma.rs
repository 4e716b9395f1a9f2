//! Tensor maps for the prefill kernels' K/V tile copies by the tensor memory accelerator
//! (`kernels/tma.cuh`): ragged K or V, a `[tokens, heads, dim]` view, as a 3-D tensor whose box
//! is 64 elements of one head's vector (128 bytes, the span of the 128-byte swizzle) by 64
//! tokens (a KV tile), swizzled as wgmma reads it. Encoded on the host at a launch (the driver
//! only fills 128 bytes; no device call); a plan keeps its last launch's pair for the next launch
//! over the same K/V addresses and strides.
//!
//! A view the accelerator cannot address (an unaligned base or stride, a dimension past its
//! limits) gets no map, and the kernel copies its tiles with `cp.async` instead: the same
//! values, by the threads' own copies.

use crate::codegen::TmaMap;
use crate::dtype::DType;
use cudarc::driver::sys;
use std::ffi::c_void;

/// Elements of a head's vector per box: 128 bytes of 16-bit elements.
const BOX_ELEMS: usize = 64;
/// Tokens per box: the KV tile of the kernels that take the maps.
const BOX_TOKENS: u32 = 64;
/// The accelerator's limits: 16-byte aligned addresses and strides, strides below 2^40 bytes,
/// dimensions of at most 2^32 elements.
const ALIGN_BYTES: u64 = 16;
const MAX_STRIDE_BYTES: u64 = 1 << 40;
const MAX_DIM: u64 = 1 << 32;
/// The kernels' box coordinates are `int`s: the token coordinate of a box must stay below 2^31.
const MAX_TOKENS: u64 = i32::MAX as u64;

/// The shape of a ragged K or V view, as the kernel reads it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct KvView {
    /// Device address of element 0 of head 0 of token 0.
    pub address: u64,
    pub dtype: DType,
    pub tokens: usize,
    pub heads: usize,
    pub dim: usize,
    /// Strides in elements.
    pub token_stride: i64,
    pub head_stride: i64,
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

/// Whether the accelerator can address `view` (else why not), decided on the host without the
/// driver: what a plan checks before it takes a kernel whose every K/V tile arrives by TMA.
pub(crate) fn check_addressable(view: &KvView) -> Result<(), String> {
    layout(view).map(|_| ())
}

/// What the driver is told of an addressable view: element type, dimensions and strides (in
/// bytes) of its outer dimensions, innermost first.
struct Layout {
    data_type: sys::CUtensorMapDataType,
    dims: [u64; 3],
    strides: [u64; 2],
}

fn layout(view: &KvView) -> Result<Layout, String> {
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
    // Innermost first: elements, heads, tokens.
    let dims = [view.dim as u64, view.heads as u64, view.tokens as u64];
    if dims.iter().any(|&d| d == 0 || d > MAX_DIM) || dims[2] > MAX_TOKENS {
        return Err(format!("dimensions {dims:?}"));
    }
    Ok(Layout {
        data_type,
        dims,
        strides: [head_stride, token_stride],
    })
}

fn encode(view: &KvView) -> Result<TmaMap, String> {
    let Layout {
        data_type,
        dims,
        strides,
    } = layout(view)?;
    let box_dims = [BOX_ELEMS as u32, 1, BOX_TOKENS];
    let element_strides = [1u32; 3];
    let mut map = sys::CUtensorMap { opaque: [0; 16] };
    // SAFETY: every pointer refers to a live local array of the rank (3) the call is given (2
    // for the strides of the outer dimensions), and `map` is written in place; the driver only
    // encodes the description (the address is not dereferenced here).
    let result = unsafe {
        sys::cuTensorMapEncodeTiled(
            &mut map,
            data_type,
            3,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn view() -> KvView {
        KvView {
            address: 0x1000,
            dtype: DType::F16,
            tokens: 4096,
            heads: 8,
            dim: 128,
            token_stride: 8 * 128,
            head_stride: 128,
        }
    }

    // The views the accelerator cannot address are turned away before the driver is asked, so
    // these run without one; each names what is wrong.
    #[test]
    fn views_the_accelerator_cannot_address_get_no_map() {
        let cases = [
            (
                KvView {
                    dtype: DType::F32,
                    ..view()
                },
                "f32 elements",
            ),
            (KvView { dim: 96, ..view() }, "96 elements"),
            (
                KvView {
                    token_stride: 8 * 128 + 4,
                    ..view()
                },
                "token stride",
            ),
            (
                KvView {
                    head_stride: 0,
                    ..view()
                },
                "head stride",
            ),
            (
                KvView {
                    token_stride: -1024,
                    ..view()
                },
                "token stride",
            ),
            (
                KvView {
                    address: 0x1008,
                    ..view()
                },
                "base address",
            ),
            (
                KvView {
                    tokens: 0,
                    ..view()
                },
                "dimensions",
            ),
            (
                KvView {
                    tokens: 1 << 31,
                    ..view()
                },
                "dimensions",
            ),
            (
                KvView {
                    heads: (1 << 32) + 1,
                    head_stride: 128,
                    ..view()
                },
                "dimensions",
            ),
        ];
        assert_eq!(check_addressable(&view()), Ok(()));
        for (v, why) in cases {
            assert!(check_addressable(&v).is_err(), "{why}");
            let err = encode(&v).expect_err(why);
            assert!(err.contains(why), "{err:?} should name {why:?}");
        }
    }
}
