//! Attention states and the paged cache: `merge_state`, `merge_states` and the append of new
//! tokens' K and V into their pages. LSEs are natural logs here; the Python layer converts
//! FlashInfer's base-2 LSEs on the way in and out.

use crate::array::{ArrayArg, Elem};
use crate::cache;
use crate::errors::{invalid, IntoPy};
use crate::gpu;
use crate::plans::expect_shape;
use attnforge::cuda::{DevicePagedKvMut, Engine};
use attnforge::dtype::fp8::Fp8Format;
use attnforge::merge::{merge_many, merge_states as merge_rows, MergeShape};
use attnforge::paged::{KvScales, PageTable, PagedKvLayout};
use attnforge::{DType, HostTensor};
use pyo3::prelude::*;

fn read_f32(a: &ArrayArg, name: &str) -> PyResult<Vec<f32>> {
    Ok(a.read_host(name)?.to_f32_vec())
}

fn check_lse_dtype(arrays: &[(&str, &ArrayArg)]) -> PyResult<()> {
    for (name, a) in arrays {
        if a.elem() != Elem::Float(DType::F32) {
            return Err(invalid(name, "must be float32"));
        }
    }
    Ok(())
}

fn check_contiguous(arrays: &[(&str, &ArrayArg)]) -> PyResult<()> {
    for (name, a) in arrays {
        if !a.is_contiguous() {
            return Err(invalid(name, "must be contiguous on a CUDA device"));
        }
    }
    Ok(())
}

/// Merges `(v_a, s_a)` and `(v_b, s_b)` (`v [seq, heads, dim]`, `s [seq, heads]` f32) into
/// `(v_out, s_out)`.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
pub fn merge_state(
    v_a: &Bound<'_, PyAny>,
    s_a: &Bound<'_, PyAny>,
    v_b: &Bound<'_, PyAny>,
    s_b: &Bound<'_, PyAny>,
    v_out: &Bound<'_, PyAny>,
    s_out: &Bound<'_, PyAny>,
    stream: u64,
) -> PyResult<()> {
    let (v_a, s_a) = (ArrayArg::read(v_a, "v_a")?, ArrayArg::read(s_a, "s_a")?);
    let (v_b, s_b) = (ArrayArg::read(v_b, "v_b")?, ArrayArg::read(s_b, "s_b")?);
    let v_out = ArrayArg::read_out(v_out, "v_out")?;
    let s_out = ArrayArg::read_out(s_out, "s_out")?;
    v_a.check("v_a", 3)?;
    let [rows, heads, head_dim] = [v_a.shape()[0], v_a.shape()[1], v_a.shape()[2]];
    let dtype = v_a.dtype("v_a")?;
    for (name, a) in [("v_b", &v_b), ("v_out", &v_out)] {
        expect_shape(a, name, &[rows, heads, head_dim])?;
        if a.elem() != Elem::Float(dtype) {
            return Err(invalid(
                name,
                format!("has another dtype than v_a ({dtype})"),
            ));
        }
    }
    for (name, a) in [("s_a", &s_a), ("s_b", &s_b), ("s_out", &s_out)] {
        expect_shape(a, name, &[rows, heads])?;
    }
    check_lse_dtype(&[("s_a", &s_a), ("s_b", &s_b), ("s_out", &s_out)])?;
    let all = [
        ("v_a", &v_a),
        ("s_a", &s_a),
        ("v_b", &v_b),
        ("s_b", &s_b),
        ("v_out", &v_out),
        ("s_out", &s_out),
    ];
    match gpu::common_device(&all)? {
        None => {
            let (o, lse) = merge_rows(
                &read_f32(&v_a, "v_a")?,
                &read_f32(&s_a, "s_a")?,
                &read_f32(&v_b, "v_b")?,
                &read_f32(&s_b, "s_b")?,
                head_dim,
            )
            .py()?;
            v_out.write_host("v_out", &HostTensor::from_f32(dtype, &o))?;
            s_out.write_host_f32("s_out", &lse)
        }
        Some(ordinal) => {
            check_contiguous(&all)?;
            let engine = gpu::engine(ordinal)?;
            let stream = gpu::stream(&engine, stream);
            let b = |a: &ArrayArg, name: &str, dt| gpu::borrow(&stream, a, name, dt);
            let shape = MergeShape {
                rows,
                heads,
                head_dim,
            };
            let (va, sa) = (b(&v_a, "v_a", dtype)?, b(&s_a, "s_a", DType::F32)?);
            let (vb, sb) = (b(&v_b, "v_b", dtype)?, b(&s_b, "s_b", DType::F32)?);
            let (mut vo, mut so) = (b(&v_out, "v_out", dtype)?, b(&s_out, "s_out", DType::F32)?);
            engine
                .merge_state(&stream, shape, (&va, &sa), (&vb, &sb), (&mut vo, &mut so))
                .py()
        }
    }
}

/// Merges the states stored together in `v [seq, num_states, heads, dim]`,
/// `s [seq, num_states, heads]` into `(v_out [seq, heads, dim], s_out [seq, heads])`.
#[pyfunction]
pub fn merge_states(
    v: &Bound<'_, PyAny>,
    s: &Bound<'_, PyAny>,
    v_out: &Bound<'_, PyAny>,
    s_out: &Bound<'_, PyAny>,
    stream: u64,
) -> PyResult<()> {
    let (v, s) = (ArrayArg::read(v, "v")?, ArrayArg::read(s, "s")?);
    let v_out = ArrayArg::read_out(v_out, "v_out")?;
    let s_out = ArrayArg::read_out(s_out, "s_out")?;
    v.check("v", 4)?;
    let [rows, n, heads, head_dim] = [v.shape()[0], v.shape()[1], v.shape()[2], v.shape()[3]];
    let dtype = v.dtype("v")?;
    expect_shape(&s, "s", &[rows, n, heads])?;
    expect_shape(&v_out, "v_out", &[rows, heads, head_dim])?;
    expect_shape(&s_out, "s_out", &[rows, heads])?;
    if v_out.elem() != Elem::Float(dtype) {
        return Err(invalid(
            "v_out",
            format!("has another dtype than v ({dtype})"),
        ));
    }
    check_lse_dtype(&[("s", &s), ("s_out", &s_out)])?;
    let shape = MergeShape {
        rows,
        heads,
        head_dim,
    };
    let all = [("v", &v), ("s", &s), ("v_out", &v_out), ("s_out", &s_out)];
    match gpu::common_device(&all)? {
        None => {
            if n == 0 {
                return Err(invalid("v", "holds no state; a merge needs at least one"));
            }
            let (vs, ss) = (read_f32(&v, "v")?, read_f32(&s, "s")?);
            let row_o = heads * head_dim;
            // State c of row r: o at (r * n + c) * row_o, lse at (r * n + c) * heads.
            let states: Vec<(Vec<f32>, Vec<f32>)> = (0..n)
                .map(|c| {
                    let o = (0..rows)
                        .flat_map(|r| &vs[(r * n + c) * row_o..(r * n + c + 1) * row_o])
                        .copied()
                        .collect();
                    let l = (0..rows)
                        .flat_map(|r| &ss[(r * n + c) * heads..(r * n + c + 1) * heads])
                        .copied()
                        .collect();
                    (o, l)
                })
                .collect();
            let refs: Vec<(&[f32], &[f32])> = states
                .iter()
                .map(|(o, l)| (o.as_slice(), l.as_slice()))
                .collect();
            let (o, lse) = merge_many(shape, &refs).py()?;
            v_out.write_host("v_out", &HostTensor::from_f32(dtype, &o))?;
            s_out.write_host_f32("s_out", &lse)
        }
        Some(ordinal) => {
            check_contiguous(&all)?;
            let engine = gpu::engine(ordinal)?;
            let stream = gpu::stream(&engine, stream);
            let b = |a: &ArrayArg, name: &str, dt| gpu::borrow(&stream, a, name, dt);
            let (vd, sd) = (b(&v, "v", dtype)?, b(&s, "s", DType::F32)?);
            let (mut vo, mut so) = (b(&v_out, "v_out", dtype)?, b(&s_out, "s_out", DType::F32)?);
            engine
                .merge_states(&stream, shape, n, (&vd, &sd), (&mut vo, &mut so))
                .py()
        }
    }
}

/// Writes `k_new [total_new, heads, Dqk]` and `v_new` into the cache: request `r`'s new tokens
/// `append_indptr[r] .. append_indptr[r+1]` become its last positions under the page table
/// (the table after the append). `kv_fp8` names the format of a numpy `uint8` cache's fp8 codes.
///
/// Into an fp8 cache the new rows are codes of its format (host arrays), or those codes widened
/// to float16 (CUDA tensors: the Python layer widens them, exactly), and are stored unchanged:
/// widened exactly and quantised again with unit scales, which gives back every finite code. A
/// non-finite code is an error on the host; on the GPU a NaN stays a NaN and an e5m2 infinity
/// saturates to the largest finite value.
#[pyfunction]
#[pyo3(signature = (
    k_new, v_new, append_indptr, cache, kv_layout, kv_page_indptr, kv_page_indices,
    kv_last_page_len, stream, kv_fp8 = None
))]
#[allow(clippy::too_many_arguments)]
pub fn append_paged_kv(
    k_new: &Bound<'_, PyAny>,
    v_new: &Bound<'_, PyAny>,
    append_indptr: Vec<i32>,
    cache: &Bound<'_, PyAny>,
    kv_layout: &str,
    kv_page_indptr: Vec<i32>,
    kv_page_indices: Vec<i32>,
    kv_last_page_len: Vec<i32>,
    stream: u64,
    kv_fp8: Option<&str>,
) -> PyResult<()> {
    let hint = kv_fp8
        .map(|name| {
            Fp8Format::parse(name).ok_or_else(|| {
                invalid(
                    "kv_data_type",
                    format!("{name:?} is not an fp8 format (e4m3, e5m2)"),
                )
            })
        })
        .transpose()?;
    let k_new = ArrayArg::read_cache(k_new, "append_key", hint)?;
    let v_new = ArrayArg::read_cache(v_new, "append_value", hint)?;
    let cache = cache::arrays(cache, hint)?;
    for (i, a) in cache.iter().enumerate() {
        if !a.writable() {
            return Err(invalid(
                &format!("paged_kv_cache[{i}]"),
                "the array is read-only",
            ));
        }
    }
    k_new.check("append_key", 3)?;
    v_new.check("append_value", 3)?;
    let fp8 = cache::fp8_format(&cache);
    // New rows of an fp8 cache are read as float16 (the codes widened exactly).
    let row_dtype = match (fp8, k_new.elem()) {
        (Some(_), _) => DType::F16,
        (None, Elem::Float(d)) => d,
        (None, Elem::Fp8(format)) => {
            return Err(invalid(
                "append_key",
                format!("holds {format} codes; the cache holds floats"),
            ))
        }
    };
    let layout = cache::layout(&cache, kv_layout, row_dtype)?;
    let table = PageTable {
        kv_page_indptr,
        kv_page_indices,
        kv_last_page_len,
    };
    let mut all = vec![("append_key", &k_new), ("append_value", &v_new)];
    all.extend(cache.iter().map(|a| ("paged_kv_cache", a)));
    let on = gpu::common_device(&all)?;
    let Some(format) = fp8 else {
        return append_plain(
            &layout,
            &table,
            &append_indptr,
            (&k_new, &v_new),
            &cache,
            on,
            stream,
        );
    };
    let unit = KvScales::per_tensor(1.0, 1.0);
    match on {
        None => {
            let rows = |a: &ArrayArg, name: &str| -> PyResult<HostTensor> {
                if a.elem() != Elem::Fp8(format) {
                    return Err(invalid(
                        name,
                        format!("has dtype {}; the cache holds {format} codes", a.elem()),
                    ));
                }
                let codes = a.read_host_codes(name)?;
                let values: Vec<f32> = codes.codes.iter().map(|&c| format.decode(c)).collect();
                Ok(HostTensor::from_f32(DType::F16, &values))
            };
            let (kh, vh) = (rows(&k_new, "append_key")?, rows(&v_new, "append_value")?);
            let mut codes = cache::read_host_codes(&cache)?;
            attnforge::paged::append_paged_kv_fp8(
                &layout,
                &table,
                &append_indptr,
                (&kh, &vh),
                cache::host_view_mut(&mut codes),
                &unit,
            )
            .py()?;
            cache::write_host_codes(&cache, &codes)
        }
        Some(ordinal) => {
            check_contiguous(&all)?;
            let engine = gpu::engine(ordinal)?;
            let stream = gpu::stream(&engine, stream);
            let scales = gpu::kv_scales(&engine, &layout, format, &unit)?;
            let kd = gpu::borrow(&stream, &k_new, "append_key", k_new.dtype("append_key")?)?;
            let vd = gpu::borrow(
                &stream,
                &v_new,
                "append_value",
                v_new.dtype("append_value")?,
            )?;
            let mut bufs = cache
                .iter()
                .map(|a| gpu::borrow_codes(&stream, a, "paged_kv_cache"))
                .collect::<PyResult<Vec<_>>>()?;
            let target = device_target(&mut bufs)?;
            engine
                .append_paged_kv_fp8(
                    &stream,
                    &layout,
                    &table,
                    &append_indptr,
                    (&kd, &vd),
                    target,
                    &scales,
                )
                .py()
        }
    }
}

/// The append into a cache of floats, on the host (`on` is `None`) or on device `on`.
fn append_plain(
    layout: &PagedKvLayout,
    table: &PageTable,
    append_indptr: &[i32],
    (k_new, v_new): (&ArrayArg, &ArrayArg),
    cache: &[ArrayArg],
    on: Option<usize>,
    stream: u64,
) -> PyResult<()> {
    match on {
        None => {
            let mut buffers = cache::read_host(cache)?;
            attnforge::paged::append_paged_kv(
                layout,
                table,
                append_indptr,
                &k_new.read_host("append_key")?,
                &v_new.read_host("append_value")?,
                cache::host_view_mut(&mut buffers),
            )
            .py()?;
            cache::write_host(cache, &buffers)
        }
        Some(ordinal) => {
            let mut all = vec![("append_key", k_new), ("append_value", v_new)];
            all.extend(cache.iter().map(|a| ("paged_kv_cache", a)));
            check_contiguous(&all)?;
            let engine: std::sync::Arc<Engine> = gpu::engine(ordinal)?;
            let stream = gpu::stream(&engine, stream);
            let dt = layout.dtype;
            let kd = gpu::borrow(&stream, k_new, "append_key", k_new.dtype("append_key")?)?;
            let vd = gpu::borrow(&stream, v_new, "append_value", v_new.dtype("append_value")?)?;
            let mut bufs = cache
                .iter()
                .map(|a| gpu::borrow(&stream, a, "paged_kv_cache", dt))
                .collect::<PyResult<Vec<_>>>()?;
            let target = device_target(&mut bufs)?;
            engine
                .append_paged_kv(&stream, layout, table, append_indptr, &kd, &vd, target)
                .py()
        }
    }
}

/// The writable device cache over one (combined) or two (separate) borrowed buffers.
fn device_target<B>(bufs: &mut [B]) -> PyResult<DevicePagedKvMut<'_, B>> {
    match bufs {
        [kv] => Ok(DevicePagedKvMut::Combined(kv)),
        [k, v] => Ok(DevicePagedKvMut::Separate { k, v }),
        _ => Err(invalid("paged_kv_cache", "expected one or two arrays")),
    }
}
