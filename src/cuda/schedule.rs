//! The prefill work list: which CTA computes which (request, query tile, KV head).
//!
//! Pure host logic (no GPU): one work item per query tile of `CTA_Q` packed rows (query tokens x
//! the query heads of one KV head) per KV head per request. Items are ordered by their estimated
//! cost, longest first, so that a skewed batch (or the long last tiles of a causal mask) starts
//! early and the short ones fill the gaps at the end.

use crate::problem::{AttentionProblem, Mask};

/// One CTA's work: request, query tile, KV head, and a fourth field kept 0 (the KV chunk of a
/// split, reserved).
pub type WorkItem = [i32; 4];

/// Keys a query tile must visit under the mask: the cost estimate used for ordering.
fn visible_keys(mask: &Mask, qo_len: usize, kv_len: usize, tok_lo: usize, tok_hi: usize) -> usize {
    let d = kv_len as i64 - qo_len as i64;
    let hi = |tok: usize| (tok as i64 + d + 1).clamp(0, kv_len as i64) as usize;
    match mask {
        Mask::None | Mask::Custom(_) => kv_len,
        Mask::Causal => hi(tok_hi),
        Mask::SlidingWindow { window_left } => {
            let lo = (tok_lo as i64 + d - window_left).clamp(0, kv_len as i64) as usize;
            hi(tok_hi).saturating_sub(lo)
        }
    }
}

/// The work items of `problem` with `cta_q` packed rows per CTA, longest first.
pub fn prefill_work(problem: &AttentionProblem, cta_q: usize) -> Vec<WorkItem> {
    let group = problem.group_size();
    let mut items: Vec<(usize, WorkItem)> = Vec::new();
    for r in 0..problem.batch.len() {
        let (_, qo_len, _, kv_len) = problem.batch.request(r);
        let packed = qo_len * group;
        for tile in 0..packed.div_ceil(cta_q) {
            let tok_lo = tile * cta_q / group;
            let tok_hi = ((tile + 1) * cta_q).min(packed).saturating_sub(1) / group;
            let cost = visible_keys(&problem.mask, qo_len, kv_len, tok_lo, tok_hi);
            for kv_head in 0..problem.num_kv_heads {
                items.push((cost, [r as i32, tile as i32, kv_head as i32, 0]));
            }
        }
    }
    // Stable: equal costs keep request/tile/head order, which keeps neighbouring CTAs on
    // neighbouring data.
    items.sort_by_key(|&(cost, _)| std::cmp::Reverse(cost));
    items.into_iter().map(|(_, w)| w).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::problem::{HeadDims, RaggedBatch};
    use crate::DType;

    fn problem(lens: &[(usize, usize)], hq: usize, hkv: usize, mask: Mask) -> AttentionProblem {
        AttentionProblem::new(
            RaggedBatch::from_lens(lens),
            hq,
            hkv,
            HeadDims::equal(128).unwrap(),
            DType::F16,
        )
        .with_mask(mask)
    }

    #[test]
    fn every_tile_and_head_appears_once() {
        let p = problem(&[(1, 5), (200, 300), (0, 7), (64, 64)], 8, 2, Mask::None);
        let work = prefill_work(&p, 128);
        // Packed rows per request: 4, 800, 0, 256 -> tiles 1, 7, 0, 2; times 2 KV heads.
        assert_eq!(work.len(), (1 + 7 + 2) * 2);
        let mut seen = std::collections::HashSet::new();
        for w in &work {
            assert!(seen.insert(*w), "duplicate {w:?}");
            assert_eq!(w[3], 0);
        }
        assert!(
            work.iter().all(|w| w[0] != 2),
            "an empty request gets no work"
        );
    }

    #[test]
    fn causal_orders_longest_tiles_first() {
        let p = problem(&[(1024, 1024)], 4, 4, Mask::Causal);
        let work = prefill_work(&p, 128);
        let tiles: Vec<i32> = work.iter().map(|w| w[1]).collect();
        assert_eq!(tiles.first(), Some(&7));
        assert_eq!(tiles.last(), Some(&0));
        assert!(tiles.windows(2).all(|w| w[0] >= w[1]));
    }
}
