//! The append shapes of the paged suite (`append: true`): each request's `qo_lens` new tokens'
//! K and V rows (random normal, of the shape's dtype) written into their pages by
//! [`Engine::plan_append`]'s plan, into a cache of the dtype (a copy) or, with `kv_dtype`, of fp8
//! codes (quantising, one scale per tensor: `max |x| / largest finite` over every input copy's
//! rows).
//!
//! Checked first: the whole cache after one device append, from a cache of NaN, must equal bit
//! for bit the host's `append_paged_kv` (`append_paged_kv_fp8`) of the same rows into the same
//! cache (so a missed, misplaced or stray write, or a code rounded otherwise, is `wrong`). Then
//! timed as the attention shapes are, the launches rotating among copies of the new rows (the
//! cache is one buffer, rewritten by every launch); TB/s from the shape's `bytes`.

use super::{copies_for, time_runs, BenchArgs, ResultLine};
use attnforge::cuda::{
    AppendPlan, DeviceFp8Tensor, DeviceKvScales, DevicePagedKvMut, DeviceTensor, Engine,
};
use attnforge::dtype::fp8::{Fp8Format, Fp8Tensor};
use attnforge::paged::{
    append_paged_kv, append_paged_kv_fp8, KvScales, PagedAttention, PagedKvLayout, PagedKvMut,
};
use attnforge::shapes::ResolvedShape;
use attnforge::tensor::HostTensor;
use attnforge::testing::rng::SplitMix64;
use attnforge::Error;

/// The new K and V rows of one input copy, on the host and on the device.
struct Rows {
    k: HostTensor,
    v: HostTensor,
    k_dev: DeviceTensor,
    v_dev: DeviceTensor,
}

/// Checks, then times an append shape; returns the status (`ok` or `wrong: ...`).
pub(super) fn measure_append(
    engine: &Engine,
    shape: &ResolvedShape,
    args: &BenchArgs,
    line: &mut ResultLine,
) -> Result<String, Error> {
    let paged = shape.shape.paged_problem()?;
    let layout = *paged.layout();
    let stream = engine.stream();
    let plan = engine.plan_append(stream, &layout, paged.table(), plan_indptr(&paged))?;
    let copies = copies_for(shape);
    let mut rows = Vec::with_capacity(copies);
    for c in 0..copies {
        let seed = args.seed.wrapping_add(c as u64);
        let (k, v) = (
            random_rows(&layout, plan.total_new(), layout.head_dims.qk(), seed, 0),
            random_rows(&layout, plan.total_new(), layout.head_dims.vo(), seed, 1),
        );
        rows.push(Rows {
            k_dev: engine.upload(&k)?,
            v_dev: engine.upload(&v)?,
            k,
            v,
        });
    }
    let cache = match shape.shape.kv_fp8()? {
        None => "cache of the rows' dtype (a copy)".to_string(),
        Some(format) => format!("{format} cache, per-tensor scales (quantising)"),
    };
    line.kernel = Some(format!(
        "attnforge_append_paged_kv ({} tokens into a {cache})",
        plan.total_new()
    ));
    match shape.shape.kv_fp8()? {
        None => append_copy(engine, shape, args, line, (&paged, &plan), &rows),
        Some(format) => append_fp8(engine, shape, args, line, (&paged, &plan), &rows, format),
    }
}

/// `tokens` rows of `num_kv_heads x dim` random normal values of the layout's dtype, from
/// `seed` and `salt` (K: 0, V: 1).
fn random_rows(
    layout: &PagedKvLayout,
    tokens: usize,
    dim: usize,
    seed: u64,
    salt: u64,
) -> HostTensor {
    let mut rng = SplitMix64::with_salt(seed, salt);
    let values: Vec<f32> = (0..tokens * layout.num_kv_heads * dim)
        .map(|_| rng.normal() as f32)
        .collect();
    HostTensor::from_f32(layout.dtype, &values)
}

/// The append into a cache of the rows' dtype: checked against the host's `append_paged_kv`,
/// then timed.
fn append_copy(
    engine: &Engine,
    shape: &ResolvedShape,
    args: &BenchArgs,
    line: &mut ResultLine,
    (paged, plan): (&PagedAttention, &AppendPlan),
    rows: &[Rows],
) -> Result<String, Error> {
    let layout = paged.layout();
    let stream = engine.stream();
    let mut k_host = HostTensor::nan(layout.dtype, layout.k_buffer_len());
    let mut v_host = HostTensor::nan(layout.dtype, layout.v_buffer_len());
    // The device starts from the host's NaN, bit for bit.
    let mut k_cache = engine.upload(&k_host)?;
    let mut v_cache = engine.upload(&v_host)?;
    let first = &rows[0];
    append_paged_kv(
        layout,
        paged.table(),
        plan_indptr(paged),
        &first.k,
        &first.v,
        PagedKvMut::Separate {
            k: &mut k_host,
            v: &mut v_host,
        },
    )?;
    let cache = DevicePagedKvMut::Separate {
        k: &mut k_cache,
        v: &mut v_cache,
    };
    plan.run(stream, &first.k_dev, &first.v_dev, cache)?;
    engine.synchronize()?;
    let checks = [
        ("k_cache", k_cache.download(stream)?, &k_host),
        ("v_cache", v_cache.download(stream)?, &v_host),
    ];
    for (name, device, host) in &checks {
        if let Some(wrong) = first_difference(name, device.as_bytes(), host.as_bytes(), 2) {
            return Ok(wrong);
        }
    }
    drop(checks);
    let copies = rows.len();
    time_runs(engine, shape, args, line, |i| {
        let r = &rows[i % copies];
        let cache = DevicePagedKvMut::Separate {
            k: &mut k_cache,
            v: &mut v_cache,
        };
        plan.run(stream, &r.k_dev, &r.v_dev, cache)
    })
}

/// The quantising append into an fp8 cache of `format`: checked against the host's
/// `append_paged_kv_fp8` with the same scales, then timed.
fn append_fp8(
    engine: &Engine,
    shape: &ResolvedShape,
    args: &BenchArgs,
    line: &mut ResultLine,
    (paged, plan): (&PagedAttention, &AppendPlan),
    rows: &[Rows],
    format: Fp8Format,
) -> Result<String, Error> {
    let layout = paged.layout();
    let stream = engine.stream();
    let largest = |pick: fn(&Rows) -> &HostTensor| {
        rows.iter()
            .flat_map(|r| pick(r).to_f32_vec())
            .fold(0f32, |m, x| m.max(x.abs()))
    };
    let scale = |max: f32| (max / format.max_finite()).max(f32::MIN_POSITIVE);
    let scales = KvScales::per_tensor(scale(largest(|r| &r.k)), scale(largest(|r| &r.v)));
    let device_scales = DeviceKvScales::upload(stream, &scales, layout, format)?;
    let mut k_host = Fp8Tensor::nan(format, layout.k_buffer_len());
    let mut v_host = Fp8Tensor::nan(format, layout.v_buffer_len());
    let mut k_cache = DeviceFp8Tensor::upload(stream, &k_host)?;
    let mut v_cache = DeviceFp8Tensor::upload(stream, &v_host)?;
    let first = &rows[0];
    append_paged_kv_fp8(
        layout,
        paged.table(),
        plan_indptr(paged),
        (&first.k, &first.v),
        PagedKvMut::Separate {
            k: &mut k_host,
            v: &mut v_host,
        },
        &scales,
    )?;
    let cache = DevicePagedKvMut::Separate {
        k: &mut k_cache,
        v: &mut v_cache,
    };
    plan.run_fp8(stream, (&first.k_dev, &first.v_dev), cache, &device_scales)?;
    engine.synchronize()?;
    let checks = [
        ("k_cache", k_cache.download(stream)?, &k_host),
        ("v_cache", v_cache.download(stream)?, &v_host),
    ];
    for (name, device, host) in &checks {
        if let Some(wrong) = first_difference(name, &device.codes, &host.codes, 1) {
            return Ok(wrong);
        }
    }
    drop(checks);
    let copies = rows.len();
    time_runs(engine, shape, args, line, |i| {
        let r = &rows[i % copies];
        let cache = DevicePagedKvMut::Separate {
            k: &mut k_cache,
            v: &mut v_cache,
        };
        plan.run_fp8(stream, (&r.k_dev, &r.v_dev), cache, &device_scales)
    })
}

/// The new tokens' indptr of an append shape: its queries' (one query row per new token).
fn plan_indptr(paged: &PagedAttention) -> &[i32] {
    &paged.problem().batch.qo_indptr
}

/// `Some("wrong: ...")` naming the first element (of `elem` bytes) where the device's cache
/// differs from the host's, and how many differ.
fn first_difference(name: &str, device: &[u8], host: &[u8], elem: usize) -> Option<String> {
    if device.len() != host.len() {
        return Some(format!(
            "wrong: {name}: the device cache has {} bytes, the host's {}",
            device.len(),
            host.len()
        ));
    }
    let differs = |i: &usize| device[i * elem..(i + 1) * elem] != host[i * elem..(i + 1) * elem];
    let elements = host.len() / elem;
    let first = (0..elements).find(differs)?;
    let count = (first..elements).filter(differs).count();
    let hex = |b: &[u8]| {
        b.iter()
            .rev()
            .map(|x| format!("{x:02x}"))
            .collect::<String>()
    };
    let at = first * elem..(first + 1) * elem;
    Some(format!(
        "wrong: {name}: {count} of {elements} elements differ from the host append, first at \
         element {first} (device 0x{}, host 0x{})",
        hex(&device[at.clone()]),
        hex(&host[at])
    ))
}

#[cfg(test)]
mod tests {
    use super::first_difference;

    #[test]
    fn a_difference_is_named_with_its_element_and_count() {
        assert_eq!(first_difference("k", &[1, 2, 3, 4], &[1, 2, 3, 4], 2), None);
        let wrong = first_difference("k", &[1, 2, 3, 5, 0, 0], &[1, 2, 3, 4, 0, 1], 2)
            .expect("two elements differ");
        assert!(
            wrong.contains("2 of 3 elements") && wrong.contains("element 1"),
            "{wrong}"
        );
        assert!(wrong.contains("device 0x0503, host 0x0403"), "{wrong}");
        assert!(first_difference("v", &[1], &[1, 2], 1).is_some());
    }
}
