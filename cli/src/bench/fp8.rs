//! The paged shapes over an fp8 cache (`kv_dtype` in the shape): the cache quantised on the host
//! with one scale per tensor (`max |x| / largest finite` of the first input set's K and V), the
//! fp8 plan checked against the exact reference on the dequantised K/V, then timed as the plain
//! paged shapes are.

use super::{check_sampled, copies_for, poisoned_outputs, time_runs, BenchArgs, ResultLine};
use attnforge::cuda::{
    DeviceFp8Kv, DeviceFp8Tensor, DeviceKvScales, DevicePagedKv, DeviceTensor, Engine, PagedPlan,
};
use attnforge::dtype::fp8::{Fp8Format, Fp8Tensor};
use attnforge::paged::{
    append_paged_kv_fp8, gather_dequantized, Fp8Kv, KvScales, PagedAttention, PagedKv, PagedKvMut,
};
use attnforge::shapes::ResolvedShape;
use attnforge::tensor::HostTensor;
use attnforge::testing::random_inputs;
use attnforge::Error;
use rayon::prelude::*;

/// One input set: the queries and the fp8 cache on the device.
struct Fp8Set {
    q: DeviceTensor,
    k_cache: DeviceFp8Tensor,
    v_cache: DeviceFp8Tensor,
}

/// The largest magnitude of `t` over the largest finite value of `format` (at least a tiny
/// positive scale); in parallel (a benchmark's K or V is hundreds of megabytes).
fn scale_for(t: &HostTensor, format: Fp8Format) -> f32 {
    let max = t
        .to_f32_vec()
        .par_iter()
        .map(|x| x.abs())
        .reduce(|| 0f32, f32::max);
    (max / format.max_finite()).max(f32::MIN_POSITIVE)
}

/// Checks, then times a paged shape over an fp8 cache of `format`; returns the status.
pub(super) fn measure_paged_fp8(
    engine: &Engine,
    shape: &ResolvedShape,
    args: &BenchArgs,
    line: &mut ResultLine,
    paged: PagedAttention,
    format: Fp8Format,
) -> Result<String, Error> {
    let problem = paged.problem().clone();
    let layout = *paged.layout();
    let plan = PagedPlan::with_kv_fp8(engine, &paged, Some(format), args.plan_options())?;
    line.kernel = Some(format!(
        "{} ({} CTAs{})",
        plan.spec().name(),
        plan.num_ctas(),
        plan.kv_split()
            .map_or(String::new(), |s| format!(", KV chunks of {}", s.chunk))
    ));
    let copies = copies_for(shape);
    let mut sets = Vec::new();
    let mut scales = None;
    let mut first = None;
    for c in 0..copies {
        let (q, k, v) = random_inputs(&problem, args.seed.wrapping_add(c as u64));
        let s = scales
            .get_or_insert_with(|| {
                KvScales::per_tensor(scale_for(&k, format), scale_for(&v, format))
            })
            .clone();
        let mut k_cache = Fp8Tensor::nan(format, layout.k_buffer_len());
        let mut v_cache = Fp8Tensor::nan(format, layout.v_buffer_len());
        append_paged_kv_fp8(
            &layout,
            paged.table(),
            &problem.batch.kv_indptr,
            (&k, &v),
            PagedKvMut::Separate {
                k: &mut k_cache,
                v: &mut v_cache,
            },
            &s,
        )?;
        if c == 0 {
            let cache = Fp8Kv {
                pages: PagedKv::Separate {
                    k: &k_cache,
                    v: &v_cache,
                },
                scales: &s,
            };
            let (kd, vd) = gather_dequantized(&layout, paged.table(), cache)?;
            first = Some((q.clone(), kd, vd));
        }
        let stream = engine.stream();
        sets.push(Fp8Set {
            q: engine.upload(&q)?,
            k_cache: DeviceFp8Tensor::upload(stream, &k_cache)?,
            v_cache: DeviceFp8Tensor::upload(stream, &v_cache)?,
        });
    }
    let scales = scales.expect("at least one input copy");
    let device_scales = DeviceKvScales::upload(engine.stream(), &scales, &layout, format)?;
    let (mut o, mut lse) = poisoned_outputs(engine, &problem)?;
    let run = |set: &Fp8Set, o: &mut DeviceTensor, lse: &mut DeviceTensor| {
        let cache = DeviceFp8Kv {
            pages: DevicePagedKv::Separate {
                k: &set.k_cache,
                v: &set.v_cache,
            },
            scales: &device_scales,
        };
        plan.run_fp8_on(engine.stream(), &set.q, cache, o, Some(lse))
    };

    // Correctness first, on the first input set, against the reference on the dequantised K/V.
    run(&sets[0], &mut o, &mut lse)?;
    let (qh, kh, vh) = first.as_ref().expect("at least one input copy");
    if let Some(wrong) = check_sampled(engine, &problem, &o, &lse, (qh, kh, vh))? {
        return Ok(wrong);
    }
    time_runs(engine, shape, args, line, |i| {
        run(&sets[i % copies], &mut o, &mut lse)
    })
}
