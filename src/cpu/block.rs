//! One unit of work of the CPU backend: a block of query rows (a few tokens of one request × the
//! query heads of one KV head) attending to that request's keys, tile by tile.
//!
//! The skeleton is FlashAttention's: load the query block once; for each key tile that the mask
//! does not hide entirely, load K and V (widened to f32 once per tile and shared by every query
//! head of the group), compute `S = Q·Kᵀ`, turn each row into base-2 logits (`logits.rs`), fold
//! them into the running softmax (`softmax.rs`), rescale the output rows whose max grew and
//! accumulate `O += P·V`; finally divide by the denominator (with the sink, if any). Everything
//! here is `#[inline(always)]` and generic over the register width, so that `isa.rs` can compile
//! it once per instruction set.

use super::f16_accum;
use super::logits::{visible_range, LogitRules};
use super::softmax::RowState;
use super::tile::{
    gemm_accumulate, gemm_store, pack_a_panel, pack_a_row, pack_b_row, pack_bt_panel, Widen, MR,
};
use crate::problem::{AttentionProblem, LogitSite, QkScaling};

/// Keys per tile. A multiple of every register width `NR` used (8, 16, 32).
pub(super) const KEY_TILE: usize = 64;

/// The inputs shared by every block of one run.
pub(super) struct Ctx<'a, T> {
    /// Query elements.
    pub q: &'a [T],
    /// Key elements.
    pub k: &'a [T],
    /// Value elements.
    pub v: &'a [T],
    /// The validated problem.
    pub problem: &'a AttentionProblem,
    /// How raw tile values become logits.
    pub rules: LogitRules<'a>,
    /// The scale split, when QK accumulates in f16.
    pub f16_accum: Option<QkScaling>,
}

/// A block: tokens `tok_start..tok_start + tok_len` of request `request`, with every query head
/// served by `kv_head`. Row `m` of the block is token `m / group`, head `m % group` of the group.
#[derive(Clone, Copy, Debug)]
pub(super) struct Block {
    /// Request index.
    pub request: usize,
    /// KV head.
    pub kv_head: usize,
    /// First token, request-local.
    pub tok_start: usize,
    /// Number of tokens.
    pub tok_len: usize,
}

/// What a block produces: `o` normalised, `[tok_len * group][head_dim_vo]` (row `m` as in
/// [`Block`]), and the natural-log LSE per row.
pub(super) struct BlockOut {
    /// Output rows.
    pub o: Vec<f32>,
    /// LSE per row.
    pub lse: Vec<f32>,
    /// The first site where a custom transform returned NaN or +inf, if any.
    pub bad_transform: Option<LogitSite>,
}

/// The keys and values of one (request, KV head), widened to f32 and laid out for the
/// micro-kernel once, then shared by every query block of that pair. Key tiles start at multiples
/// of [`KEY_TILE`]; the last one is padded with zero keys.
pub(super) struct KvPanels {
    /// f32 accumulation: Kᵀ as B panels `[keys / nr][head_dim_qk][nr]`; f16 accumulation: K rows
    /// `[keys][head_dim_qk]`.
    k: Vec<f32>,
    /// V as B panels, tile by tile: `[tiles][head_dim_vo / nr][KEY_TILE][nr]`.
    v: Vec<f32>,
}

/// Packs the keys and values of `request`, `kv_head` for micro-kernels `nr` lanes wide.
pub(super) fn pack_kv<T: Widen>(
    ctx: &Ctx<'_, T>,
    request: usize,
    kv_head: usize,
    nr: usize,
) -> KvPanels {
    let p = ctx.problem;
    let (dqk, dvo) = (p.head_dims.qk(), p.head_dims.vo());
    let (_, _, kv_start, kv_len) = p.batch.request(request);
    let padded = kv_len.next_multiple_of(KEY_TILE);
    let mut k = vec![0.0f32; padded * dqk];
    let mut v = vec![0.0f32; padded * dvo];
    let mut rows = vec![0.0f32; nr * dqk];
    let mut row_v = vec![0.0f32; dvo];
    for (panel_index, panel) in k.chunks_exact_mut(nr * dqk).enumerate() {
        let first = panel_index * nr;
        let count = nr.min(kv_len.saturating_sub(first));
        for (c, row) in rows.chunks_exact_mut(dqk).take(count).enumerate() {
            let at = p.k_view.index(kv_start + first + c, kv_head, 0);
            T::widen(&ctx.k[at..at + dqk], row);
        }
        match ctx.f16_accum {
            Some(_) => panel[..count * dqk].copy_from_slice(&rows[..count * dqk]),
            None => pack_bt_panel(panel, nr, &rows[..count * dqk], dqk),
        }
    }
    for (tile_index, tile) in v.chunks_exact_mut(KEY_TILE * dvo).enumerate() {
        let first = tile_index * KEY_TILE;
        for jj in 0..KEY_TILE.min(kv_len - first) {
            let at = p.v_view.index(kv_start + first + jj, kv_head, 0);
            T::widen(&ctx.v[at..at + dvo], &mut row_v);
            pack_b_row(tile, nr, KEY_TILE * nr, jj, &row_v);
        }
    }
    KvPanels { k, v }
}

/// Per-thread buffers, sized for the largest block of a run.
pub(super) struct Scratch {
    q_panels: Vec<f32>,
    p_panels: Vec<f32>,
    s: Vec<f32>,
    o: Vec<f32>,
    row: Vec<f32>,
    states: Vec<RowState>,
    /// f16 accumulation only: q rows as given, and pre-scaled and rounded.
    q_rows: Vec<f32>,
    q_scaled: Vec<f32>,
}

impl Scratch {
    /// Buffers for blocks of at most `max_rows` rows.
    pub fn new(max_rows: usize, dqk: usize, dvo: usize, f16_accum: bool) -> Scratch {
        let rows = max_rows.next_multiple_of(MR);
        let f16_len = |n: usize| if f16_accum { n } else { 0 };
        Scratch {
            q_panels: vec![0.0; rows * dqk],
            p_panels: vec![0.0; rows * KEY_TILE],
            s: vec![0.0; rows * KEY_TILE],
            o: vec![0.0; rows * dvo],
            row: vec![0.0; dqk],
            states: vec![RowState::EMPTY; rows],
            q_rows: vec![0.0; f16_len(rows * dqk)],
            q_scaled: vec![0.0; f16_len(rows * dqk)],
        }
    }
}

/// Runs one block. `NR` is the micro-kernel's register width in f32 lanes; `FMA` whether the
/// caller was compiled with fused multiply-add.
#[inline(always)]
pub(super) fn attend<T: Widen, const NR: usize, const FMA: bool>(
    ctx: &Ctx<'_, T>,
    kv: &KvPanels,
    block: Block,
    scratch: &mut Scratch,
) -> BlockOut {
    let p = ctx.problem;
    let (dqk, dvo) = (p.head_dims.qk(), p.head_dims.vo());
    let group = p.group_size();
    let (qo_start, qo_len, _, kv_len) = p.batch.request(block.request);
    let rows = block.tok_len * group;
    let padded = rows.next_multiple_of(MR);
    let head_of = |m: usize| block.kv_head * group + m % group;
    let Scratch {
        q_panels,
        p_panels,
        s,
        o,
        row,
        states,
        q_rows,
        q_scaled,
    } = scratch;
    let row_qk = &mut row[..dqk];

    // Load the query block once (padding rows stay zero).
    let q_panels = &mut q_panels[..padded * dqk];
    q_panels.fill(0.0);
    for m in 0..rows {
        let token = qo_start + block.tok_start + m / group;
        let at = p.q_view.index(token, head_of(m), 0);
        T::widen(&ctx.q[at..at + dqk], row_qk);
        match ctx.f16_accum {
            Some(scaling) => {
                q_rows[m * dqk..(m + 1) * dqk].copy_from_slice(row_qk);
                f16_accum::prescale_row(
                    row_qk,
                    scaling.prescale,
                    &mut q_scaled[m * dqk..(m + 1) * dqk],
                );
            }
            None => pack_a_row(q_panels, dqk, m, row_qk),
        }
    }
    let o = &mut o[..padded * dvo];
    o.fill(0.0);
    let states = &mut states[..padded];
    states.fill(RowState::EMPTY);

    // Keys any row of the block may see; rows are sorted, so the first row starts the range and
    // the last row ends it. Tiles are aligned to KEY_TILE, as in the packed K/V.
    let mut bad_transform = None;
    let first = block.tok_start;
    let last = block.tok_start + block.tok_len - 1;
    let keys = visible_range(&p.mask, qo_len, kv_len, first).start
        ..visible_range(&p.mask, qo_len, kv_len, last).end;
    let first_tile = keys.start / KEY_TILE * KEY_TILE;

    for j0 in (first_tile..keys.end).step_by(KEY_TILE) {
        let n = KEY_TILE.min(kv_len - j0);
        let k_tile = &kv.k[j0 * dqk..(j0 + KEY_TILE) * dqk];
        let v_tile = &kv.v[j0 * dvo..(j0 + KEY_TILE) * dvo];

        // S = Q·Kᵀ (raw dot products), or s itself under f16 accumulation.
        match ctx.f16_accum {
            Some(scaling) => {
                for m in 0..rows {
                    let qs = &q_scaled[m * dqk..(m + 1) * dqk];
                    let qr = &q_rows[m * dqk..(m + 1) * dqk];
                    for (jj, kr) in k_tile.chunks_exact(dqk).take(n).enumerate() {
                        s[m * KEY_TILE + jj] = f16_accum::logit(qs, qr, kr, scaling, p.sm_scale);
                    }
                }
            }
            None => gemm_store::<NR, FMA>(
                q_panels,
                k_tile,
                dqk,
                n.div_ceil(NR),
                &mut s[..padded * KEY_TILE],
                KEY_TILE,
            ),
        }

        // Softmax rows: logits, running max and sum, rescale of the output so far; then each
        // group of MR rows becomes one P panel.
        for (ip, s_rows) in s[..padded * KEY_TILE]
            .chunks_exact_mut(MR * KEY_TILE)
            .enumerate()
        {
            for (r, x) in s_rows.chunks_exact_mut(KEY_TILE).enumerate() {
                let m = ip * MR + r;
                let i = block.tok_start + m / group;
                let visible = if m < rows {
                    let range = visible_range(&p.mask, qo_len, kv_len, i);
                    range.start.clamp(j0, j0 + n) - j0..range.end.clamp(j0, j0 + n) - j0
                } else {
                    0..0
                };
                let site = LogitSite {
                    request: block.request,
                    qo_idx: i,
                    kv_idx: j0,
                    qo_head: head_of(m),
                    kv_head: block.kv_head,
                    qo_len,
                    kv_len,
                };
                if let Some(bad) = ctx.rules.apply(x, visible, j0, site) {
                    bad_transform = bad_transform.or(Some(bad));
                }
                let alpha = states[m].update(x);
                if alpha != 1.0 {
                    for e in &mut o[m * dvo..(m + 1) * dvo] {
                        *e *= alpha;
                    }
                }
            }
            let s_rows = &*s_rows;
            let rows_of_panel: [&[f32]; MR] =
                std::array::from_fn(|r| &s_rows[r * KEY_TILE..(r + 1) * KEY_TILE]);
            pack_a_panel(
                &mut p_panels[ip * KEY_TILE * MR..(ip + 1) * KEY_TILE * MR],
                rows_of_panel,
            );
        }

        // O += P·V over the tile's n keys.
        gemm_accumulate::<NR, FMA>(
            &p_panels[..padded * KEY_TILE],
            KEY_TILE * MR,
            v_tile,
            KEY_TILE * NR,
            n,
            o,
            dvo,
        );
    }

    let mut out = BlockOut {
        o: vec![0.0; rows * dvo],
        lse: vec![0.0; rows],
        bad_transform,
    };
    for m in 0..rows {
        let (inv, lse) = states[m].finish(p.variant.sink(head_of(m)));
        for (dst, &src) in out.o[m * dvo..(m + 1) * dvo]
            .iter_mut()
            .zip(&o[m * dvo..(m + 1) * dvo])
        {
            *dst = src * inv;
        }
        out.lse[m] = lse;
    }
    out
}
