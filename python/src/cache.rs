//! Paged KV cache descriptors into a [`PagedKvLayout`].
//!
//! A cache arrives as one array (K and V combined, `[pages, 2, page_size, heads, D]` for NHD,
//! `[pages, 2, heads, page_size, D]` for HND) or two (`[pages, page_size, heads, D]` each, NHD,
//! or `[pages, heads, page_size, D]`, HND), as FlashInfer takes them. The layout is read off the
//! shapes; the problem model validates it.

use crate::array::ArrayArg;
use crate::errors::{invalid, IntoPy};
use attnforge::paged::{KvOrder, KvStorage, PagedKv, PagedKvLayout, PagedKvMut};
use attnforge::{HeadDims, HostTensor};
use pyo3::prelude::*;

/// `NHD` or `HND`.
pub fn order(kv_layout: &str) -> PyResult<KvOrder> {
    match kv_layout {
        "NHD" => Ok(KvOrder::Nhd),
        "HND" => Ok(KvOrder::Hnd),
        other => Err(invalid(
            "kv_layout",
            format!("is {other:?}; expected \"NHD\" or \"HND\""),
        )),
    }
}

/// `(pages, page_size, heads, dim)` of one half's shape `[pages, a, b, dim]`.
fn half_dims(order: KvOrder, pages: usize, a: usize, b: usize, dim: usize) -> [usize; 4] {
    match order {
        KvOrder::Nhd => [pages, a, b, dim],
        KvOrder::Hnd => [pages, b, a, dim],
    }
}

/// The layout of the cache arrays `cache` (one combined array, or K then V).
pub fn layout(cache: &[ArrayArg], kv_layout: &str) -> PyResult<PagedKvLayout> {
    let order = order(kv_layout)?;
    let (storage, k, v) = match cache {
        [kv] => {
            kv.check("paged_kv_cache", 5)?;
            let s = kv.shape();
            if s[1] != 2 {
                return Err(invalid(
                    "paged_kv_cache",
                    format!("has shape {s:?}; a combined cache has 2 at dimension 1 (K, V)"),
                ));
            }
            let half = half_dims(order, s[0], s[2], s[3], s[4]);
            (KvStorage::Combined, half, half)
        }
        [k, v] => {
            k.check("paged_kv_cache[0]", 4)?;
            v.check("paged_kv_cache[1]", 4)?;
            let (ks, vs) = (k.shape(), v.shape());
            let kd = half_dims(order, ks[0], ks[1], ks[2], ks[3]);
            let vd = half_dims(order, vs[0], vs[1], vs[2], vs[3]);
            (KvStorage::Separate, kd, vd)
        }
        _ => {
            return Err(invalid(
                "paged_kv_cache",
                format!(
                    "has {} arrays; expected one combined array or a (k, v) pair",
                    cache.len()
                ),
            ))
        }
    };
    if k[..3] != v[..3] {
        return Err(invalid(
            "paged_kv_cache",
            format!(
                "K is (pages, page_size, heads) = {:?} but V is {:?}",
                &k[..3],
                &v[..3]
            ),
        ));
    }
    let dtype = cache[0].dtype("paged_kv_cache")?;
    if let Some(other) = cache.get(1) {
        if other.dtype("paged_kv_cache[1]")? != dtype {
            return Err(invalid("paged_kv_cache[1]", "has another dtype than K"));
        }
    }
    let layout = PagedKvLayout {
        num_pages: k[0],
        page_size: k[1],
        num_kv_heads: k[2],
        head_dims: HeadDims::new(k[3], v[3]).py()?,
        order,
        storage,
        dtype,
    };
    layout.validate().py()?;
    Ok(layout)
}

/// The host cache buffers, read into contiguous tensors (the layout's own order).
pub fn read_host(cache: &[ArrayArg]) -> PyResult<Vec<HostTensor>> {
    cache
        .iter()
        .enumerate()
        .map(|(i, a)| a.read_host(&format!("paged_kv_cache[{i}]")))
        .collect()
}

/// The host buffers as the layout's storage expects them.
pub fn host_view(buffers: &[HostTensor]) -> PagedKv<'_> {
    match buffers {
        [kv] => PagedKv::Combined(kv),
        [k, v, ..] => PagedKv::Separate { k, v },
        [] => unreachable!("layout() accepts one or two arrays"),
    }
}

/// The host buffers, writable.
pub fn host_view_mut(buffers: &mut [HostTensor]) -> PagedKvMut<'_> {
    match buffers {
        [kv] => PagedKvMut::Combined(kv),
        [k, v, ..] => PagedKvMut::Separate { k, v },
        [] => unreachable!("layout() accepts one or two arrays"),
    }
}

/// Writes the host buffers back into the caller's arrays.
pub fn write_host(cache: &[ArrayArg], buffers: &[HostTensor]) -> PyResult<()> {
    for (i, (a, t)) in cache.iter().zip(buffers).enumerate() {
        a.write_host(&format!("paged_kv_cache[{i}]"), t)?;
    }
    Ok(())
}
