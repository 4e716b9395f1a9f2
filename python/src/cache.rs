//! Paged KV cache descriptors into a [`PagedKvLayout`].
//!
//! A cache arrives as one array (K and V combined, `[pages, 2, page_size, heads, D]` for NHD,
//! `[pages, 2, heads, page_size, D]` for HND) or two (`[pages, page_size, heads, D]` each, NHD,
//! or `[pages, heads, page_size, D]`, HND), as FlashInfer takes them. The layout is read off the
//! shapes; the problem model validates it. A (K, V) pair that is the two halves of one combined
//! array (`kv[:, 0]`, `kv[:, 1]`) is read as that array, so the CUDA kernels read it in place.
//! An fp8 cache holds one-byte codes ([`Elem::Fp8`]); its layout's dtype is the one its values
//! are dequantised to.

use crate::array::{ArrayArg, Elem};
use crate::errors::{invalid, IntoPy};
use attnforge::dtype::fp8::{Fp8Format, Fp8Tensor};
use attnforge::paged::{KvOrder, KvStorage, PagedKv, PagedKvLayout, PagedKvMut};
use attnforge::{DType, HeadDims, HostTensor};
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};

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

/// The arrays of the cache object `cache`: one combined array, or a (K, V) tuple or list; a pair
/// that is the two halves of one combined array comes back as that array. `fp8` is the fp8
/// format the caller expects, if any: numpy `uint8` arrays are then read as its codes.
pub fn arrays(cache: &Bound<'_, PyAny>, fp8: Option<Fp8Format>) -> PyResult<Vec<ArrayArg>> {
    let pair = if let Ok(t) = cache.cast::<PyTuple>() {
        t.iter().collect::<Vec<_>>()
    } else if let Ok(l) = cache.cast::<PyList>() {
        l.iter().collect()
    } else {
        return Ok(vec![ArrayArg::read_cache(cache, "paged_kv_cache", fp8)?]);
    };
    let [k, v] = pair.as_slice() else {
        return Err(invalid(
            "paged_kv_cache",
            format!("a tuple of {} arrays; expected (k, v)", pair.len()),
        ));
    };
    let k = ArrayArg::read_cache(k, "paged_kv_cache[0]", fp8)?;
    let v = ArrayArg::read_cache(v, "paged_kv_cache[1]", fp8)?;
    Ok(match combined_halves(&k, &v) {
        Some(kv) => vec![kv],
        None => vec![k, v],
    })
}

/// The combined `[pages, 2, ...]` array whose halves `k` and `v` are (`kv[:, 0]`, `kv[:, 1]`,
/// each half contiguous within a page), if they are.
fn combined_halves(k: &ArrayArg, v: &ArrayArg) -> Option<ArrayArg> {
    let (shape, strides) = (k.shape(), k.strides());
    if shape.len() != 4
        || shape != v.shape()
        || strides != v.strides()
        || shape[0] <= 1
        || k.elem() != v.elem()
        || k.device() != v.device()
    {
        return None;
    }
    let half: usize = shape[1..].iter().product();
    let inner = [shape[2] * shape[3], shape[3], 1];
    let elem = k.elem().size_bytes() as u64;
    let halves_apart = v.address().checked_sub(k.address()) == Some(half as u64 * elem);
    let rows = strides[1..].iter().zip(inner).all(|(&s, i)| s == i as i64);
    if strides[0] != 2 * half as i64 || !rows || !halves_apart {
        return None;
    }
    let shape = vec![shape[0], 2, shape[1], shape[2], shape[3]];
    let strides = vec![strides[0], half as i64, strides[1], strides[2], strides[3]];
    Some(k.with_view(shape, strides))
}

/// `(pages, page_size, heads, dim)` of one half's shape `[pages, a, b, dim]`.
fn half_dims(order: KvOrder, pages: usize, a: usize, b: usize, dim: usize) -> [usize; 4] {
    match order {
        KvOrder::Nhd => [pages, a, b, dim],
        KvOrder::Hnd => [pages, b, a, dim],
    }
}

/// The fp8 format of the cache arrays, `None` when they hold floats.
pub fn fp8_format(cache: &[ArrayArg]) -> Option<Fp8Format> {
    match cache.first().map(ArrayArg::elem) {
        Some(Elem::Fp8(format)) => Some(format),
        _ => None,
    }
}

/// The layout of the cache arrays `cache` (one combined array, or K then V); the layout's dtype
/// is the arrays' float type, or `dequantized` for fp8 codes.
pub fn layout(cache: &[ArrayArg], kv_layout: &str, dequantized: DType) -> PyResult<PagedKvLayout> {
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
    let elem = cache[0].elem();
    if let Some(other) = cache.get(1) {
        if other.elem() != elem {
            return Err(invalid("paged_kv_cache[1]", "has another dtype than K"));
        }
    }
    let dtype = match elem {
        Elem::Float(d) => d,
        Elem::Fp8(_) => dequantized,
    };
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

/// The host fp8 cache buffers, read into contiguous code tensors (the layout's own order).
pub fn read_host_codes(cache: &[ArrayArg]) -> PyResult<Vec<Fp8Tensor>> {
    cache
        .iter()
        .enumerate()
        .map(|(i, a)| a.read_host_codes(&format!("paged_kv_cache[{i}]")))
        .collect()
}

/// The host buffers (floats or fp8 codes) as the layout's storage expects them.
pub fn host_view<B>(buffers: &[B]) -> PagedKv<'_, B> {
    match buffers {
        [kv] => PagedKv::Combined(kv),
        [k, v, ..] => PagedKv::Separate { k, v },
        [] => unreachable!("layout() accepts one or two arrays"),
    }
}

/// The host buffers, writable.
pub fn host_view_mut<B>(buffers: &mut [B]) -> PagedKvMut<'_, B> {
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

/// Writes host fp8 code buffers back into the caller's arrays.
pub fn write_host_codes(cache: &[ArrayArg], buffers: &[Fp8Tensor]) -> PyResult<()> {
    for (i, (a, t)) in cache.iter().zip(buffers).enumerate() {
        a.write_host_codes(&format!("paged_kv_cache[{i}]"), t)?;
    }
    Ok(())
}
