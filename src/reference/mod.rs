//! The exact reference: `docs/semantics.md` as executable f64 code, the oracle of every test.
//!
//! Each output row (query token, query head) is computed on its own, straight from the
//! definitions: the visible keys (the [`Mask`](crate::problem::Mask) and a custom variant's mask),
//! the scaled logit `s` ([`logits::scaled_logit`], exact for f32 accumulation and a bit-exact
//! emulation for f16 accumulation), the transform `t` ([`logits::transform`]), then a two-pass
//! softmax in f64 with the sink in the denominator. Rows run in parallel with rayon; nothing is
//! tiled or fused, so the code reads like the formulas.
//!
//! Use [`attention`] for whole problems and [`attention_rows`] to check a sample of rows of a
//! problem too big to compute whole. The test harness (feature `harness`) compares backends with it in `compare`.

pub mod logits;
mod paged;

pub use paged::paged_attention;

use crate::problem::{AttentionProblem, InvalidProblem, LogitSite, TensorView, Validation};
use crate::tensor::HostTensor;
use rayon::prelude::*;

/// The reference result of a whole problem.
#[derive(Clone, Debug, PartialEq)]
pub struct ReferenceOutput {
    /// `o`, contiguous `[total_qo, num_qo_heads, head_dim_vo]`.
    pub o: Vec<f64>,
    /// Natural-log LSE, `[total_qo, num_qo_heads]`; `-inf` for a row that sees no key (without
    /// sinks).
    pub lse: Vec<f64>,
}

/// The reference result of one row (query token, query head).
#[derive(Clone, Debug, PartialEq)]
pub struct RowOutput {
    /// The output row, `head_dim_vo` values.
    pub o: Vec<f64>,
    /// Its natural-log LSE.
    pub lse: f64,
}

/// The whole problem in f64. Validates the problem and buffers first (and rejects non-finite
/// input values and custom transforms that return NaN or +inf).
pub fn attention(
    p: &AttentionProblem,
    q: &HostTensor,
    k: &HostTensor,
    v: &HostTensor,
) -> Result<ReferenceOutput, InvalidProblem> {
    attention_in(Context::new(p, q, k, v)?)
}

/// [`attention`] over K and V given as exact values (in `p`'s K/V views), not as tensors of the
/// problem's dtype: the fp8 cache's `decode(code) * scale` (`paged::gather_exact`). Checks them as
/// [`attention`] checks its inputs.
pub fn attention_exact_kv(
    p: &AttentionProblem,
    q: &HostTensor,
    k: Vec<f64>,
    v: Vec<f64>,
) -> Result<ReferenceOutput, InvalidProblem> {
    attention_in(Context::with_exact_kv(p, q, k, v)?)
}

/// [`attention_rows`] over K and V given as exact values (see [`attention_exact_kv`]).
pub fn attention_rows_exact_kv(
    p: &AttentionProblem,
    q: &HostTensor,
    (k, v): (Vec<f64>, Vec<f64>),
    rows: &[(usize, usize)],
) -> Result<Vec<RowOutput>, InvalidProblem> {
    rows_in(Context::with_exact_kv(p, q, k, v)?, rows)
}

fn attention_in(ctx: Context<'_>) -> Result<ReferenceOutput, InvalidProblem> {
    let p = ctx.p;
    let hq = p.num_qo_heads;
    let rows: Vec<RowOutput> = (0..p.batch.total_qo() * hq)
        .into_par_iter()
        .map(|row| ctx.row(row / hq, row % hq))
        .collect::<Result<_, _>>()?;
    let mut out = ReferenceOutput {
        o: Vec::with_capacity(p.output_len()),
        lse: Vec::with_capacity(rows.len()),
    };
    for row in rows {
        out.o.extend_from_slice(&row.o);
        out.lse.push(row.lse);
    }
    Ok(out)
}

/// Only the listed rows `(query token, query head)`, in the order given; for sampled checks of
/// big problems.
pub fn attention_rows(
    p: &AttentionProblem,
    q: &HostTensor,
    k: &HostTensor,
    v: &HostTensor,
    rows: &[(usize, usize)],
) -> Result<Vec<RowOutput>, InvalidProblem> {
    rows_in(Context::new(p, q, k, v)?, rows)
}

fn rows_in(ctx: Context<'_>, rows: &[(usize, usize)]) -> Result<Vec<RowOutput>, InvalidProblem> {
    let p = ctx.p;
    for (n, &(token, head)) in rows.iter().enumerate() {
        if token >= p.batch.total_qo() || head >= p.num_qo_heads {
            return Err(InvalidProblem::new(
                format!("rows[{n}]"),
                format!(
                    "({token}, {head}) is out of range: {} query tokens, {} query heads",
                    p.batch.total_qo(),
                    p.num_qo_heads
                ),
            ));
        }
    }
    rows.par_iter()
        .map(|&(token, head)| ctx.row(token, head))
        .collect()
}

/// A validated problem with its inputs widened to f64 (in their original layout).
struct Context<'a> {
    p: &'a AttentionProblem,
    q: Vec<f64>,
    k: Vec<f64>,
    v: Vec<f64>,
}

impl<'a> Context<'a> {
    fn new(
        p: &'a AttentionProblem,
        q: &HostTensor,
        k: &HostTensor,
        v: &HostTensor,
    ) -> Result<Context<'a>, InvalidProblem> {
        p.validate_inputs(q, k, v)?;
        let widen = |t: &HostTensor| t.to_f32_vec().into_iter().map(f64::from).collect();
        Self::checked(Context {
            p,
            q: widen(q),
            k: widen(k),
            v: widen(v),
        })
    }

    /// The context of `q` (a tensor of the problem's dtype) with K and V as exact values, each
    /// as long as a K or V tensor of the problem would be.
    fn with_exact_kv(
        p: &'a AttentionProblem,
        q: &HostTensor,
        k: Vec<f64>,
        v: Vec<f64>,
    ) -> Result<Context<'a>, InvalidProblem> {
        p.validate()?;
        p.check_input_dtype("q", q)?;
        let (qo, kv) = (p.batch.total_qo(), p.batch.total_kv());
        let (dqk, dvo) = (p.head_dims.qk(), p.head_dims.vo());
        p.q_view.validate("q", qo, p.num_qo_heads, dqk, q.len())?;
        p.k_view.validate("k", kv, p.num_kv_heads, dqk, k.len())?;
        p.v_view.validate("v", kv, p.num_kv_heads, dvo, v.len())?;
        let widen = |t: &HostTensor| t.to_f32_vec().into_iter().map(f64::from).collect();
        Self::checked(Context {
            p,
            q: widen(q),
            k,
            v,
        })
    }

    /// `ctx` once every value its views read is finite.
    fn checked(ctx: Context<'a>) -> Result<Context<'a>, InvalidProblem> {
        let p = ctx.p;
        let (qo, kv) = (p.batch.total_qo(), p.batch.total_kv());
        let (dqk, dvo) = (p.head_dims.qk(), p.head_dims.vo());
        check_finite("q", &ctx.q, &p.q_view, qo, p.num_qo_heads, dqk)?;
        check_finite("k", &ctx.k, &p.k_view, kv, p.num_kv_heads, dqk)?;
        check_finite("v", &ctx.v, &p.v_view, kv, p.num_kv_heads, dvo)?;
        Ok(ctx)
    }

    /// The request that owns query token `token` (empty requests own no token).
    fn request_of(&self, token: usize) -> usize {
        let indptr = &self.p.batch.qo_indptr;
        indptr.partition_point(|&x| x as usize <= token) - 1
    }

    fn row(&self, token: usize, qo_head: usize) -> Result<RowOutput, InvalidProblem> {
        let p = self.p;
        let (dqk, dvo) = (p.head_dims.qk(), p.head_dims.vo());
        let request = self.request_of(token);
        let (qo_start, qo_len, kv_start, kv_len) = p.batch.request(request);
        let qo_idx = token - qo_start;
        let kv_head = p.kv_head_of(qo_head);
        let q_at = p.q_view.index(token, qo_head, 0);
        let q_row = &self.q[q_at..q_at + dqk];

        // Pass 1: the transformed logit of every visible key.
        let mut logits: Vec<(usize, f64)> = Vec::with_capacity(kv_len);
        for kv_idx in 0..kv_len {
            let site = LogitSite {
                request,
                qo_idx,
                kv_idx,
                qo_head,
                kv_head,
                qo_len,
                kv_len,
            };
            if !p.mask.visible(request, qo_len, kv_len, qo_idx, kv_idx)
                || !logits::variant_visible(&p.variant, &site)
            {
                continue;
            }
            let k_at = p.k_view.index(kv_start + kv_idx, kv_head, 0);
            let s = logits::scaled_logit(p.qk_accum, p.sm_scale, q_row, &self.k[k_at..k_at + dqk]);
            let t = logits::transform(&p.variant, s, &site);
            if t.is_nan() || t == f64::INFINITY {
                return Err(InvalidProblem::new(
                    "custom variant transform",
                    format!("returned {t} for s = {s} at {site:?}; it must return a finite value or -inf"),
                ));
            }
            logits.push((kv_idx, t));
        }

        // Pass 2: the softmax, stabilised by the largest logit (the sink included).
        let sink = p.variant.sink(qo_head).map(f64::from);
        let max = logits
            .iter()
            .map(|&(_, t)| t)
            .chain(sink)
            .fold(f64::NEG_INFINITY, f64::max);
        let mut o = vec![0.0; dvo];
        if max == f64::NEG_INFINITY {
            // No visible key (and no sink): o = 0, lse = -inf.
            return Ok(RowOutput {
                o,
                lse: f64::NEG_INFINITY,
            });
        }
        // exp(t_j - max) for every key, then o = sum_j exp(t_j - max) v_j / denominator, which is
        // sum_j exp(t_j - lse) v_j with one exponential per key.
        let mut denominator = sink.map_or(0.0, |s| (s - max).exp());
        for (_, t) in logits.iter_mut() {
            *t = (*t - max).exp();
            denominator += *t;
        }
        for &(kv_idx, unnormalised) in &logits {
            let v_at = p.v_view.index(kv_start + kv_idx, kv_head, 0);
            for (oe, ve) in o.iter_mut().zip(&self.v[v_at..v_at + dvo]) {
                *oe += unnormalised * ve;
            }
        }
        o.iter_mut().for_each(|x| *x /= denominator);
        Ok(RowOutput {
            o,
            lse: max + denominator.ln(),
        })
    }
}

/// Rejects NaN and infinities among the elements a view covers (the gaps between heads or
/// tokens are not read and may hold anything).
fn check_finite(
    name: &str,
    data: &[f64],
    view: &TensorView,
    tokens: usize,
    heads: usize,
    dim: usize,
) -> Validation {
    for token in 0..tokens {
        for head in 0..heads {
            let at = view.index(token, head, 0);
            if let Some(e) = data[at..at + dim].iter().position(|x| !x.is_finite()) {
                return Err(InvalidProblem::new(
                    format!("{name}[token {token}, head {head}, element {e}]"),
                    format!(
                        "is {}; the reference takes finite inputs only",
                        data[at + e]
                    ),
                ));
            }
        }
    }
    Ok(())
}
