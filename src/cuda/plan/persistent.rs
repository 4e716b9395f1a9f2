//! The persistent launch of the warp-specialised tile: whether a plan may take it
//! ([`persistent_plannable`]), the K/V views its tensor maps read ([`kv_view`]), and how its work
//! items are dealt to the CTAs ([`persistent_work`]).

use crate::codegen::KvCache;
use crate::cuda::schedule::{SplitChoice, WorkItem, CTA_OVERHEAD_KEYS};
use crate::cuda::tma::{check_addressable, KvView};
use crate::problem::AttentionProblem;

/// Whether the planner may take the warp-specialised tile for `problem` over K/V from `kv` with
/// `split` (`choose_tile_on`): not with a split asked for (the planner keeps the split it has
/// measured, that of the other tiles; `--tile` still runs the warp-specialised one split), a
/// graph-stable plan gives its kernel no tensor maps (the maps hold the batch's key count), and
/// every K/V tile arrives by TMA, so an unsplit plan that is not `graph_stable`, over ragged K/V
/// whose views the accelerator can address. A view's address is known to be aligned at plan
/// time: a buffer's base is 16-byte aligned (`DeviceTensor::from_raw` refuses others) and the
/// view's offset is a multiple of 16 bytes (`check_view_alignment`).
pub(crate) fn persistent_plannable(
    problem: &AttentionProblem,
    kv: KvCache,
    split: SplitChoice,
    graph_stable: bool,
) -> bool {
    if graph_stable || kv != KvCache::Ragged || matches!(split, SplitChoice::ChunkKeys(_)) {
        return false;
    }
    let elem = problem.input_dtype.size_bytes() as u64;
    let view = |v: &crate::problem::TensorView, dim| {
        let address = v.offset as u64 * elem;
        kv_view(
            problem,
            address,
            dim,
            v.token_stride as i64,
            v.head_stride as i64,
        )
    };
    let dims = problem.head_dims;
    [
        view(&problem.k_view, dims.qk()),
        view(&problem.v_view, dims.vo()),
    ]
    .iter()
    .all(|v| check_addressable(v).is_ok())
}

/// The K or V view (`address` in bytes, head dim `dim`, strides in elements) of `problem`'s
/// ragged K/V as the tensor memory accelerator reads it: every token and KV head.
pub(super) fn kv_view(
    problem: &AttentionProblem,
    address: u64,
    dim: usize,
    token_stride: i64,
    head_stride: i64,
) -> KvView {
    KvView {
        address,
        dtype: problem.input_dtype,
        tokens: problem.batch.total_kv(),
        heads: problem.num_kv_heads,
        dim,
        token_stride,
        head_stride,
    }
}

/// The launch of a persistent kernel (the warp-specialised tile) over work items with their
/// costs in keys, in the planner's launch order: at most one CTA per slot; each item, in that
/// order, goes to the CTA whose items so far cost least (each item also costing
/// `CTA_OVERHEAD_KEYS`), as the block scheduler deals items to the CTA that frees first. CTA `b`
/// reads positions `b, b + grid, ..` of the list: its k-th item at `k * grid + b`, then an end
/// marker (request -1), which also fills every position no CTA has an item for.
pub(super) fn persistent_work(slots: usize, items: Vec<(usize, WorkItem)>) -> (u32, Vec<i32>) {
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;
    let grid = items.len().min(slots.max(1));
    let mut queues: Vec<Vec<WorkItem>> = vec![Vec::new(); grid];
    let mut load: BinaryHeap<Reverse<(usize, usize)>> =
        (0..grid).map(|b| Reverse((0, b))).collect();
    for (cost, item) in items {
        if let Some(Reverse((done, b))) = load.pop() {
            queues[b].push(item);
            load.push(Reverse((done + cost + CTA_OVERHEAD_KEYS, b)));
        }
    }
    let rounds = queues.iter().map(Vec::len).max().unwrap_or(0) + 1;
    let end = [-1, 0, 0, 0, 0, 0, 0, 0];
    let work = (0..rounds)
        .flat_map(|k| queues.iter().map(move |q| q.get(k).copied().unwrap_or(end)))
        .flatten()
        .collect();
    (grid as u32, work)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::problem::HeadDims;

    fn d128() -> HeadDims {
        HeadDims::new(128, 128).expect("head dims")
    }

    // The warp-specialised tile is offered to the planner only for an unsplit, not graph-stable
    // plan over ragged K/V that the accelerator can address.
    #[test]
    fn persistent_launches_are_planned_only_where_they_can_run() {
        use crate::problem::{RaggedBatch, TensorView};
        let p = AttentionProblem::new(
            RaggedBatch::from_lens(&[(4096, 4096)]).unwrap(),
            32,
            8,
            d128(),
            crate::DType::Bf16,
        );
        let planned = SplitChoice::Planned;
        assert!(persistent_plannable(&p, KvCache::Ragged, planned, false));
        assert!(persistent_plannable(
            &p,
            KvCache::Ragged,
            SplitChoice::Unsplit,
            false
        ));
        assert!(!persistent_plannable(&p, KvCache::Ragged, planned, true));
        assert!(!persistent_plannable(&p, KvCache::Paged, planned, false));
        assert!(!persistent_plannable(
            &p,
            KvCache::Ragged,
            SplitChoice::ChunkKeys(1024),
            false
        ));
        // K and V of one fused `[tokens, 2, heads, dim]` buffer: addressable.
        let fused = |offset| TensorView {
            offset,
            token_stride: 2 * 8 * 128,
            head_stride: 128,
        };
        let mut kv_fused = p.clone();
        kv_fused.k_view = fused(0);
        kv_fused.v_view = fused(8 * 128);
        assert!(persistent_plannable(
            &kv_fused,
            KvCache::Ragged,
            planned,
            false
        ));
        // Every head on one vector (a zero head stride): no tensor map describes it.
        let mut broadcast = p.clone();
        broadcast.v_view.head_stride = 0;
        assert!(!persistent_plannable(
            &broadcast,
            KvCache::Ragged,
            planned,
            false
        ));
        // No keys at all: nothing to address.
        let empty = AttentionProblem::new(
            RaggedBatch::from_lens(&[(4, 0)]).unwrap(),
            32,
            8,
            d128(),
            crate::DType::Bf16,
        );
        assert!(!persistent_plannable(
            &empty,
            KvCache::Ragged,
            planned,
            false
        ));
    }

    // The persistent launch: at most one CTA per slot; every item once, each CTA's walk over
    // the list (b, b + grid, ..) meets its items and then an end marker, and the costs are
    // balanced as the block scheduler would (no CTA's load exceeds another's by more than the
    // largest item).
    #[test]
    fn persistent_work_deals_every_item_once_and_balances_the_ctas() {
        for (items, slots) in [(1usize, 132usize), (5, 3), (132, 132), (1000, 132), (7, 7)] {
            // Costs like a causal prefill's: longest first, from `items` keys down to 1.
            let list: Vec<(usize, WorkItem)> = (0..items)
                .map(|i| (items - i, [i as i32, 0, 0, 0, 0, 0, 0, 0]))
                .collect();
            let (grid, work) = persistent_work(slots, list);
            let grid = grid as usize;
            assert_eq!(grid, items.min(slots));
            assert_eq!(work.len() % (8 * grid), 0);
            let mut seen = vec![0; items];
            let mut loads = Vec::new();
            for b in 0..grid {
                let (mut i, mut load) = (b, 0);
                while work[8 * i] >= 0 {
                    let item = work[8 * i] as usize;
                    seen[item] += 1;
                    load += items - item + CTA_OVERHEAD_KEYS;
                    i += grid;
                }
                assert!(
                    i < work.len() / 8,
                    "CTA {b}'s walk ends on a marker inside the list"
                );
                loads.push(load);
            }
            assert!(
                seen.iter().all(|&n| n == 1),
                "{items} items over {slots} slots"
            );
            let (min, max) = (loads.iter().min().unwrap(), loads.iter().max().unwrap());
            assert!(max - min <= items + CTA_OVERHEAD_KEYS, "{loads:?}");
        }
        assert_eq!(persistent_work(132, Vec::new()), (0, Vec::new()));
    }
}
