//! Batch decode over a paged KV cache on the GPU: the cache is allocated on the device, the
//! tokens are written into their pages by the GPU append kernel, and one query per request
//! attends to its pages. Checked against the exact CPU reference on the same tokens, contiguous.
//!
//! `cargo run --release --example 03_paged_decode` (exits with status 1 and `no CUDA device`
//! where there is no GPU).

mod common;

use attnforge::cuda::{DevicePagedKv, DevicePagedKvMut, DeviceTensor, Engine, PagedPlan};
use attnforge::paged::{KvOrder, KvStorage, PageTable, PagedAttention, PagedKvLayout};
use attnforge::reference::{self, ReferenceOutput};
use attnforge::{AttentionOutput, DType, HeadDims, HostTensor};
use common::Outcome;
use std::process::ExitCode;

/// The paged problem, its inputs (Q and the new tokens' K/V, contiguous) and its exact result.
struct Decode {
    paged: PagedAttention,
    inputs: (HostTensor, HostTensor, HostTensor),
    want: ReferenceOutput,
}

fn main() -> ExitCode {
    match decode() {
        Ok(d) => common::with_gpu(|engine| run(engine, &d)),
        Err(e) => common::report(Err(e)),
    }
}

/// The host side: the cache's layout and page table, the problem, the inputs, the reference.
fn decode() -> Result<Decode, Box<dyn std::error::Error>> {
    // 8 requests, each decoding one token over its cached tokens; pages of 16 tokens, 32/8 heads.
    let kv_lens = [1000, 17, 512, 1, 300, 64, 999, 250];
    let layout = PagedKvLayout {
        num_pages: 256,
        page_size: 16,
        num_kv_heads: 8,
        head_dims: HeadDims::new(128, 128)?,
        order: KvOrder::Nhd,
        storage: KvStorage::Separate,
        dtype: DType::F16,
    };
    // The pages of the requests, in a scattered order (a cache's pages are never contiguous).
    let pages: Vec<i32> = (0..layout.num_pages as i32)
        .map(|i| (i * 37) % 256)
        .collect();
    let table = PageTable::from_kv_lens(&kv_lens, layout.page_size, &pages)?;
    let qo_indptr: Vec<i32> = (0..=kv_lens.len() as i32).collect();
    let problem = PagedAttention::problem_for(qo_indptr, 32, &layout, &table)?;
    let (q, k, v) = common::inputs(&problem, 3);
    // The paged problem is the ragged problem over the same tokens.
    let want = reference::attention(&problem, &q, &k, &v)?;
    Ok(Decode {
        paged: PagedAttention::new(problem, layout, table)?,
        inputs: (q, k, v),
        want,
    })
}

fn run(engine: &Engine, d: &Decode) -> Outcome {
    let stream = engine.stream().clone();
    let (paged, (q, k, v)) = (&d.paged, &d.inputs);
    let (p, layout, table) = (paged.problem(), paged.layout(), paged.table());
    let plan = PagedPlan::new(engine, paged)?;
    println!(
        "plan: kernel {}, {} CTAs, KV split {:?}",
        plan.spec().name(),
        plan.num_ctas(),
        plan.kv_split()
    );

    // The cache, allocated and poisoned on the device; every request's tokens are new here, so
    // the append writes all of them into their pages.
    let mut k_cache = DeviceTensor::nan(&stream, DType::F16, layout.k_buffer_len())?;
    let mut v_cache = DeviceTensor::nan(&stream, DType::F16, layout.v_buffer_len())?;
    let (k_new, v_new) = (engine.upload(k)?, engine.upload(v)?);
    let cache = DevicePagedKvMut::Separate {
        k: &mut k_cache,
        v: &mut v_cache,
    };
    let all_tokens = &p.batch.kv_indptr;
    engine.append_paged_kv(&stream, layout, table, all_tokens, &k_new, &v_new, cache)?;

    let qd = engine.upload(q)?;
    let rows = p.batch.total_qo() * p.num_qo_heads;
    let mut o = DeviceTensor::nan(&stream, p.output_dtype, p.output_len())?;
    let mut lse = DeviceTensor::nan(&stream, DType::F32, rows)?;
    let cache = DevicePagedKv::Separate {
        k: &k_cache,
        v: &v_cache,
    };
    // No allocation, no synchronisation: a serving loop may capture this in a CUDA graph.
    plan.run_on(&stream, &qd, cache, &mut o, Some(&mut lse))?;
    engine.synchronize()?;

    let out = AttentionOutput {
        o: o.download(&stream)?,
        lse: Some(lse.download(&stream)?.to_f32_vec()),
    };
    common::check("paged decode vs reference", &out, &d.want, 2e-3, 1e-3)
}
