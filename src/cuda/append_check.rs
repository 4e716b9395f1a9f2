//! The CUDA backend's self-check of the quantising append: every f16 and bf16 bit pattern (NaNs,
//! infinities, zeros and subnormals included) appended into e4m3 and e5m2 caches under per-head
//! scales across the range the host admits, through both of the kernel's launches (a batch below
//! the wide launch's threshold and one above it), each code compared bit for bit with the host's
//! quantiser ([`quantize_value`]: `encode(x / scale)`, docs/semantics.md). The attention cases
//! judge the appended caches only through their outputs, where a code one step off hides within
//! the tolerance; this check does not.

use super::append::DevicePagedKvMut;
use super::buffers::DeviceTensor;
use super::engine::Engine;
use super::fp8::{DeviceFp8Tensor, DeviceKvScales};
use super::paged::first_of;
use crate::dtype::fp8::{Fp8Format, Fp8Tensor};
use crate::dtype::DType;
use crate::paged::{quantize_value, KvOrder, KvScales, KvStorage, PageTable, PagedKvLayout};
use crate::problem::HeadDims;
use crate::tensor::HostTensor;
use half::{bf16, f16};

/// KV heads of the check's cache (one scale each).
const HEADS: usize = 8;
/// Head dim of the check's cache.
const HEAD_DIM: usize = 128;
/// Page size of the check's cache.
const PAGE_SIZE: usize = 16;
/// New tokens of the two appends: 512 (every 16-bit pattern once per head, below the wide
/// launch's threshold) and 4096 (every pattern eight times per head, the wide launch).
const TOKENS: [usize; 2] = [512, 4096];

/// The check over both row dtypes, both formats and both launches: the number of codes compared,
/// or what differed.
pub(crate) fn fp8_append_codes(engine: &Engine) -> Result<usize, String> {
    let mut compared = 0;
    for dtype in [DType::F16, DType::Bf16] {
        for format in Fp8Format::ALL {
            for tokens in TOKENS {
                compared += append_and_compare(engine, dtype, format, tokens)?;
            }
        }
    }
    Ok(compared)
}

/// Per-head scales: the usual kinds (1, 1/3, 0.1, a max-abs scale), a subnormal and a tiny one
/// (the kernel scales those by 2^64 first), and the largest the host admits for `dtype` and
/// `format`; V's are K's rotated by three heads.
fn scales(dtype: DType, format: Fp8Format) -> KvScales {
    let dtype_max = match dtype {
        DType::Bf16 => bf16::MAX.to_f32(),
        _ => f16::MAX.to_f32(),
    };
    let largest = dtype_max / format.max_finite() * 0.999;
    let k = vec![
        1.0,
        1.0 / 3.0,
        0.1,
        448.0 / 65504.0,
        f32::from_bits(0x0012_3456),
        f32::MIN_POSITIVE * 0.75,
        0.012_345_679,
        largest,
    ];
    let mut v = k.clone();
    v.rotate_left(3);
    KvScales { k, v }
}

/// The 16-bit pattern of element `d` of head `h` of new token `t`: K runs through all 65536
/// patterns per head every 512 tokens, V through an odd multiple of the same index.
fn pattern(is_k: bool, t: usize, h: usize, d: usize) -> u16 {
    let i = t * HEAD_DIM + d;
    if is_k {
        (i + 7919 * h) as u16
    } else {
        (i.wrapping_mul(40503) + h) as u16
    }
}

/// The new rows of `tokens` tokens, `[tokens, HEADS, HEAD_DIM]`, as `dtype` values.
fn rows(dtype: DType, tokens: usize, is_k: bool) -> HostTensor {
    let bits = (0..tokens).flat_map(|t| {
        (0..HEADS).flat_map(move |h| (0..HEAD_DIM).map(move |d| pattern(is_k, t, h, d)))
    });
    match dtype {
        DType::Bf16 => HostTensor::Bf16(bits.map(bf16::from_bits).collect()),
        _ => HostTensor::F16(bits.map(f16::from_bits).collect()),
    }
}

/// One request of `tokens` new tokens in pages 0, 1, ... (so the cache holds token t's rows at
/// the rows' own flat offsets), appended on the device and compared with the host's codes.
fn append_and_compare(
    engine: &Engine,
    dtype: DType,
    format: Fp8Format,
    tokens: usize,
) -> Result<usize, String> {
    let what = format!(
        "{dtype} rows into an {} cache, {tokens} tokens",
        format.name()
    );
    let fail = |e: &dyn std::fmt::Display| format!("{what}: {e}");
    let head_dims = HeadDims::equal(HEAD_DIM).map_err(|e| fail(&e))?;
    let layout = PagedKvLayout {
        num_pages: tokens / PAGE_SIZE,
        page_size: PAGE_SIZE,
        num_kv_heads: HEADS,
        head_dims,
        order: KvOrder::Nhd,
        storage: KvStorage::Separate,
        dtype,
    };
    let pages: Vec<i32> = (0..layout.num_pages as i32).collect();
    let table = PageTable::from_kv_lens(&[tokens], PAGE_SIZE, &pages).map_err(|e| fail(&e))?;
    let scales = scales(dtype, format);
    let stream = engine.stream();
    let (k, v) = (rows(dtype, tokens, true), rows(dtype, tokens, false));
    let device_scales =
        DeviceKvScales::upload(stream, &scales, &layout, format).map_err(|e| fail(&e))?;
    let upload = |h: &HostTensor| DeviceTensor::upload(stream, h).map_err(|e| fail(&e));
    let (kd, vd) = (upload(&k)?, upload(&v)?);
    let nan = Fp8Tensor::nan(format, k.len());
    let new_cache = || DeviceFp8Tensor::upload(stream, &nan).map_err(|e| fail(&e));
    let (mut k_cache, mut v_cache) = (new_cache()?, new_cache()?);
    engine
        .append_paged_kv_fp8(
            stream,
            &layout,
            &table,
            &[0, tokens as i32],
            (&kd, &vd),
            DevicePagedKvMut::Separate {
                k: &mut k_cache,
                v: &mut v_cache,
            },
            &device_scales,
        )
        .map_err(|e| fail(&e))?;
    let mut compared = 0;
    for (name, new, cache, scale) in [
        ("K", &k, &k_cache, &scales.k),
        ("V", &v, &v_cache, &scales.v),
    ] {
        let codes = cache.download(stream).map_err(|e| fail(&e))?.codes;
        let values = new.to_f32_vec();
        let differ = first_of(
            codes
                .iter()
                .zip(&values)
                .enumerate()
                .map(|(i, (&got, &x))| {
                    let want = quantize_value(format, x, scale[i / HEAD_DIM % HEADS]);
                    (got == want, got, want)
                }),
            |c| format!("{c:#04x}"),
        );
        if let Some((i, got, want, n)) = differ {
            let (t, h, d) = (i / (HEADS * HEAD_DIM), i / HEAD_DIM % HEADS, i % HEAD_DIM);
            return Err(format!(
                "{what}: {n} of {} {name} codes differ from the host's; the first, token {t} head {h} element {d}: {:e} (bits {:#06x}) / {:e} gave {got}, the host {want}",
                codes.len(),
                values[i],
                pattern(name == "K", t, h, d),
                scale[h],
            ));
        }
        compared += codes.len();
    }
    Ok(compared)
}
