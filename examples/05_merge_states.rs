//! Merging partial attention states: attention over a request's keys computed in two parts
//! (as split-KV and shared-prefix attention do), each part's `(o, lse)` merged into the result
//! over all keys. On the host with `attnforge::merge`, then on the GPU with
//! `Engine::merge_state`; both are checked against the exact reference over all keys.
//!
//! `cargo run --release --example 05_merge_states` (after the host part, exits with status 1 and
//! `no CUDA device` where there is no GPU).

mod common;

use attnforge::cuda::DeviceTensor;
use attnforge::merge::{merge_many, MergeShape};
use attnforge::reference::{self, ReferenceOutput};
use attnforge::Result as AttnResult;
use attnforge::{AttentionOutput, AttentionProblem, DType, HeadDims, HostTensor, RaggedBatch};
use std::process::ExitCode;

/// Queries, keys of the first part, keys of the second part.
const QUERIES: usize = 8;
const KEYS_A: usize = 700;
const KEYS_B: usize = 300;
/// Heads (no GQA here) and head dim.
const HEADS: usize = 8;
const DIM: usize = 64;

/// The problem of `QUERIES` queries over `keys` keys, in f32 (the CPU backend's partial states
/// then carry no rounding to f16; the merge takes f16 and bf16 states as well).
fn problem(keys: usize) -> AttnResult<AttentionProblem> {
    let batch = RaggedBatch::from_lens(&[(QUERIES, keys)])?;
    Ok(AttentionProblem::new(
        batch,
        HEADS,
        HEADS,
        HeadDims::new(DIM, DIM)?,
        DType::F32,
    ))
}

/// The keys (or values) of both parts, one after the other.
fn concat(a: &HostTensor, b: &HostTensor) -> HostTensor {
    let mut all = a.to_f32_vec();
    all.extend(b.to_f32_vec());
    HostTensor::from_f32(a.dtype(), &all)
}

/// Two partial states and the exact result over all keys.
struct Parts {
    a: (HostTensor, Vec<f32>),
    b: (HostTensor, Vec<f32>),
    want: ReferenceOutput,
}

const SHAPE: MergeShape = MergeShape {
    rows: QUERIES,
    heads: HEADS,
    head_dim: DIM,
};

fn main() -> ExitCode {
    let parts = match on_host() {
        Ok(parts) => parts,
        Err(e) => return common::report(Err(e)),
    };
    common::with_gpu(|engine| {
        let stream = engine.stream();
        let upload = |(o, lse): &(HostTensor, Vec<f32>)| -> AttnResult<_> {
            Ok((
                engine.upload(o)?,
                engine.upload(&HostTensor::F32(lse.clone()))?,
            ))
        };
        let (a, b) = (upload(&parts.a)?, upload(&parts.b)?);
        let mut o = DeviceTensor::nan(stream, DType::F32, SHAPE.o_len())?;
        let mut lse = DeviceTensor::nan(stream, DType::F32, SHAPE.lse_len())?;
        // On `stream`, nothing allocated: the merge can follow the attention kernels in a graph.
        engine.merge_state(
            stream,
            SHAPE,
            (&a.0, &a.1),
            (&b.0, &b.1),
            (&mut o, &mut lse),
        )?;
        engine.synchronize()?;
        let merged = AttentionOutput {
            o: o.download(stream)?,
            lse: Some(lse.download(stream)?.to_f32_vec()),
        };
        common::check("gpu merge vs reference", &merged, &parts.want, 1e-5, 1e-5)
    })
}

/// Computes both parts on the CPU and merges them on the host; checks the merge.
fn on_host() -> Result<Parts, Box<dyn std::error::Error>> {
    let (pa, pb, all) = (
        problem(KEYS_A)?,
        problem(KEYS_B)?,
        problem(KEYS_A + KEYS_B)?,
    );
    let (q, k_a, v_a) = common::inputs(&pa, 5);
    let (_, k_b, v_b) = common::inputs(&pb, 6);
    let state = |p: &AttentionProblem, k: &HostTensor, v: &HostTensor| -> AttnResult<_> {
        let out = attnforge::cpu::attention(p, &q, k, v)?;
        // The problems ask for the LSE, so it is there.
        Ok((out.o, out.lse.unwrap_or_default()))
    };
    let (a, b) = (state(&pa, &k_a, &v_a)?, state(&pb, &k_b, &v_b)?);

    let (o_a, o_b) = (a.0.to_f32_vec(), b.0.to_f32_vec());
    let (o, lse) = merge_many(SHAPE, &[(&o_a, &a.1), (&o_b, &b.1)])?;
    let merged = AttentionOutput {
        o: HostTensor::F32(o),
        lse: Some(lse),
    };
    let want = reference::attention(&all, &q, &concat(&k_a, &k_b), &concat(&v_a, &v_b))?;
    println!(
        "two partial states of {QUERIES} queries x {HEADS} heads over {KEYS_A} and {KEYS_B} keys"
    );
    common::check("host merge vs reference", &merged, &want, 1e-5, 1e-5)?;
    Ok(Parts { a, b, want })
}
