//! [`gather`]: the paged K and V of a batch copied into contiguous ragged tensors.
//!
//! This is the obviously-right bridge from the paged cache to everything that takes ragged K/V:
//! the exact reference and the CPU backend run a paged problem as the ragged problem over the
//! gathered tensors, and the GPU suite uses it to build its oracle.

use super::layout::{PagedKv, PagedKvLayout};
use super::table::PageTable;
use crate::problem::{InvalidProblem, Validation};
use crate::tensor::HostTensor;

/// The keys and values of every request of `table`, in request order, as contiguous
/// `[total_kv, num_kv_heads, head_dim_qk]` (K) and `[total_kv, num_kv_heads, head_dim_vo]` (V)
/// tensors of the cache's dtype. Validates the layout, the buffers and the table first.
pub fn gather(
    layout: &PagedKvLayout,
    table: &PageTable,
    cache: PagedKv<'_>,
) -> Validation<(HostTensor, HostTensor)> {
    layout.validate_buffers(cache)?;
    table.validate(layout.page_size, layout.num_pages)?;
    let (k_src, v_src) = match cache {
        PagedKv::Separate { k, v } => (k, v),
        PagedKv::Combined(kv) => (kv, kv),
    };
    Ok(match (k_src, v_src) {
        (HostTensor::F16(k), HostTensor::F16(v)) => {
            let (k, v) = gather_typed(layout, table, k, v);
            (HostTensor::F16(k), HostTensor::F16(v))
        }
        (HostTensor::Bf16(k), HostTensor::Bf16(v)) => {
            let (k, v) = gather_typed(layout, table, k, v);
            (HostTensor::Bf16(k), HostTensor::Bf16(v))
        }
        (HostTensor::F32(k), HostTensor::F32(v)) => {
            let (k, v) = gather_typed(layout, table, k, v);
            (HostTensor::F32(k), HostTensor::F32(v))
        }
        // validate_buffers has checked both dtypes against the layout's; kept as an error, not
        // a panic, in case that check ever changes.
        (k, v) => {
            return Err(InvalidProblem::new(
                "kv_cache",
                format!("K has dtype {} but V has {}", k.dtype(), v.dtype()),
            ))
        }
    })
}

fn gather_typed<T: Copy>(
    layout: &PagedKvLayout,
    table: &PageTable,
    k_src: &[T],
    v_src: &[T],
) -> (Vec<T>, Vec<T>) {
    let ps = layout.page_size;
    let (dqk, dvo) = (layout.head_dims.qk(), layout.head_dims.vo());
    let total: usize = table.kv_lens(ps).iter().sum();
    let mut k = Vec::with_capacity(total * layout.num_kv_heads * dqk);
    let mut v = Vec::with_capacity(total * layout.num_kv_heads * dvo);
    for r in 0..table.batch_size() {
        for j in 0..table.kv_len(r, ps) {
            let (page, slot) = table.locate(r, j, ps);
            for h in 0..layout.num_kv_heads {
                let at = layout.k_index(page, slot, h, 0);
                k.extend_from_slice(&k_src[at..at + dqk]);
                let at = layout.v_index(page, slot, h, 0);
                v.extend_from_slice(&v_src[at..at + dvo]);
            }
        }
    }
    (k, v)
}
