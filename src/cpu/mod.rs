//! The fast CPU backend: tiled online-softmax attention in f32, parallel with rayon.
//!
//! [`attention`] takes the same [`AttentionProblem`] and host buffers as the exact reference
//! (`crate::reference`) and follows the same semantics (`docs/semantics.md`), but computes in f32
//! the way a GPU kernel does: FlashAttention's online softmax over key tiles, so memory stays
//! `O(block)` whatever the sequence length. It shares no code with the reference, which stays an
//! independent oracle; the test suite compares the two.
//!
//! Work is split into blocks (`block.rs`): a few query tokens of one request times the query heads
//! of one KV head, so that the heads of a GQA group share each K/V tile load. Blocks run in
//! parallel on rayon's pool; key tiles that the causal or sliding-window mask hides entirely are
//! never visited. The inner kernels (`tile.rs`) are compiled per instruction set (`isa.rs`).
//!
//! | module | job |
//! |---|---|
//! | `tile` | packing into panels, the register-blocked micro-kernel |
//! | `softmax` | `exp2`, row reductions, running max/sum |
//! | `logits` | scale, mask, transform of one row of a tile |
//! | `f16_accum` | emulation of f16 QK accumulation |
//! | `block` | one block from start to finish |
//! | `isa` | per-instruction-set instantiations and the runtime choice |

#[cfg(feature = "harness")]
mod backend;
mod block;
mod f16_accum;
mod isa;
mod logits;
mod paged;
mod softmax;
mod tile;

#[cfg(feature = "harness")]
pub use backend::CpuBackend;
pub use isa::Isa;
pub use paged::paged_attention;

use crate::dtype::DType;
use crate::error::Error;
use crate::output::AttentionOutput;
use crate::problem::{AttentionProblem, InvalidProblem, QkAccum};
use crate::tensor::HostTensor;
use block::{Block, BlockOut, Ctx, Scratch};
use logits::LogitRules;
use rayon::prelude::*;
use tile::Widen;

/// The backend's name in errors and reports.
pub const BACKEND: &str = "cpu";

/// Query rows (tokens × heads of a group) a block aims for: enough to amortise each K/V tile
/// load, small enough that a block's buffers stay in the L2 cache.
const BLOCK_ROWS: usize = 64;

/// Runs `p` on `q`, `k`, `v` with the best kernels this machine has ([`Isa::detect`]).
///
/// Validates first ([`AttentionProblem::validate_inputs`]). The output is contiguous
/// `[total_qo, num_qo_heads, head_dim_vo]` in `p.output_dtype`; the LSE (natural log) is returned
/// when `p.return_lse`.
pub fn attention(
    p: &AttentionProblem,
    q: &HostTensor,
    k: &HostTensor,
    v: &HostTensor,
) -> Result<AttentionOutput, Error> {
    attention_with_isa(p, q, k, v, Isa::detect())
}

/// [`attention`] with the kernels of `isa`; an [`Error::Unsupported`] if this machine lacks it.
pub fn attention_with_isa(
    p: &AttentionProblem,
    q: &HostTensor,
    k: &HostTensor,
    v: &HostTensor,
    isa: Isa,
) -> Result<AttentionOutput, Error> {
    p.validate_inputs(q, k, v)?;
    if !isa.is_available() {
        let available: Vec<&str> = Isa::ALL
            .iter()
            .filter(|i| i.is_available())
            .map(|i| i.name())
            .collect();
        return Err(Error::Unsupported {
            backend: BACKEND,
            what: format!("instruction set {} on this machine", isa.name()),
            supported: available.join(", "),
        });
    }
    match (q, k, v) {
        (HostTensor::F32(q), HostTensor::F32(k), HostTensor::F32(v)) => run(p, q, k, v, isa),
        (HostTensor::F16(q), HostTensor::F16(k), HostTensor::F16(v)) => run(p, q, k, v, isa),
        (HostTensor::Bf16(q), HostTensor::Bf16(k), HostTensor::Bf16(v)) => run(p, q, k, v, isa),
        // validate_inputs has checked each dtype against the problem's; kept as an error, not a
        // panic, in case that check ever changes.
        _ => Err(InvalidProblem::new(
            "k, v",
            format!(
                "dtypes {} and {} differ from q's {}",
                k.dtype(),
                v.dtype(),
                q.dtype()
            ),
        )
        .into()),
    }
}

/// The query blocks of one (request, KV head): they share one packing of its keys and values.
struct Unit {
    request: usize,
    kv_head: usize,
    blocks: Vec<Block>,
}

/// The units of a problem: per request and KV head, the query tokens in runs of
/// `ceil(BLOCK_ROWS / group)`. Requests without queries have no unit (their keys are never read).
fn plan(p: &AttentionProblem) -> Vec<Unit> {
    let tokens_per_block = BLOCK_ROWS.div_ceil(p.group_size()).max(1);
    let mut units = Vec::new();
    for request in 0..p.batch.len() {
        let (_, qo_len, _, _) = p.batch.request(request);
        if qo_len == 0 {
            continue;
        }
        for kv_head in 0..p.num_kv_heads {
            let blocks = (0..qo_len)
                .step_by(tokens_per_block)
                .map(|tok_start| Block {
                    request,
                    kv_head,
                    tok_start,
                    tok_len: tokens_per_block.min(qo_len - tok_start),
                })
                .collect();
            units.push(Unit {
                request,
                kv_head,
                blocks,
            });
        }
    }
    units
}

fn run<T: Widen>(
    p: &AttentionProblem,
    q: &[T],
    k: &[T],
    v: &[T],
    isa: Isa,
) -> Result<AttentionOutput, Error> {
    let f16_accum = (p.qk_accum == QkAccum::F16).then(|| p.qk_scaling());
    let s_mul = if f16_accum.is_some() { 1.0 } else { p.sm_scale };
    let ctx = Ctx {
        q,
        k,
        v,
        problem: p,
        rules: LogitRules::new(&p.mask, &p.variant, s_mul),
        f16_accum,
    };
    let units = plan(p);
    let group = p.group_size();
    let max_rows = units
        .iter()
        .flat_map(|u| &u.blocks)
        .map(|b| b.tok_len * group)
        .max()
        .unwrap_or(0);
    let (dqk, dvo) = (p.head_dims.qk(), p.head_dims.vo());
    let results: Vec<Vec<BlockOut>> = units
        .par_iter()
        .map(|unit| {
            let kv = block::pack_kv(&ctx, unit.request, unit.kv_head, isa.lanes());
            unit.blocks
                .par_iter()
                .map_init(
                    || Scratch::new(max_rows, dqk, dvo, f16_accum.is_some()),
                    |scratch, &b| isa::attend(isa, &ctx, &kv, b, scratch),
                )
                .collect()
        })
        .collect();

    // A custom transform that returned NaN or +inf makes the result meaningless: an error, like
    // the reference's, rather than an output.
    if let Some(site) = results.iter().flatten().find_map(|b| b.bad_transform) {
        return Err(InvalidProblem::new(
            "custom variant transform",
            format!(
                "returned NaN or +inf at request {}, query {}, key {}, query head {}",
                site.request, site.qo_idx, site.kv_idx, site.qo_head
            ),
        )
        .into());
    }

    // Scatter: row m of a block is token tok_start + m / group, head kv_head * group + m % group,
    // so one token's rows are `group` consecutive heads, contiguous in the output too.
    let hq = p.num_qo_heads;
    let mut o = vec![0.0f32; p.output_len()];
    let mut lse = vec![0.0f32; p.batch.total_qo() * hq];
    for (b, out) in units
        .iter()
        .flat_map(|u| &u.blocks)
        .zip(results.iter().flatten())
    {
        let (qo_start, ..) = p.batch.request(b.request);
        for t in 0..b.tok_len {
            let token = qo_start + b.tok_start + t;
            let head = b.kv_head * group;
            let dst = (token * hq + head) * dvo;
            o[dst..dst + group * dvo]
                .copy_from_slice(&out.o[t * group * dvo..(t + 1) * group * dvo]);
            lse[token * hq + head..token * hq + head + group]
                .copy_from_slice(&out.lse[t * group..(t + 1) * group]);
        }
    }
    let o = match p.output_dtype {
        DType::F32 => HostTensor::F32(o),
        dtype => HostTensor::from_f32(dtype, &o),
    };
    Ok(AttentionOutput {
        o,
        lse: p.return_lse.then_some(lse),
    })
}
