//! Graph-stable plans: a [`KernelPlan`] that a CUDA graph captured once keeps serving after
//! every later [`KernelPlan::replan`].
//!
//! A captured launch holds its parameter block by value: the grid, the addresses of the work
//! list, index pointers and workspace, the KV split's chunk size and slot count. A graph-stable
//! plan fixes all of them at construction from a [`GraphCapacity`]: its device arrays (work list,
//! index pointers) are sized for the capacity and never move, the grid is the largest work list
//! the capacity allows (the items past a plan's own are empty: no query row, no key, so their
//! CTAs write nothing), and a KV split, when there is one, keeps its chunk size and slot count.
//! Re-planning rewrites the arrays in place on the caller's stream; what the kernels read by
//! value does not change, so a replay reads the new batch.
//!
//! What would change a by-value parameter is refused: another kernel (mask kind, variant, dtypes,
//! head dims), other scales, window or views, a custom mask (its arrays are sized by the mask),
//! and, with a KV split, another batch size or query count (the merge's grid and bounds). The
//! warp-specialised tile (persistent CTAs, whose grid follows the plan) and tensor-map loads (the
//! maps hold the key count) are not used.

use super::{KernelPlan, PlanOptions};
use crate::codegen::param_values;
use crate::cuda::schedule::{choose_kv_split, prefill_work, KvSplit, SplitChoice, WorkItem};
use crate::problem::{AttentionProblem, InvalidProblem, Mask, RaggedBatch};
use crate::Error;
use cudarc::driver::CudaStream;
use std::sync::Arc;

/// The largest batch a graph-stable plan is re-planned for. Every later plan must fit in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GraphCapacity {
    /// Requests per plan.
    pub max_batch: usize,
    /// Query tokens per plan, all requests together.
    pub max_qo_tokens: usize,
    /// Query tokens of one request (1 for decode).
    pub max_qo_len: usize,
    /// Keys per plan, all requests together (a paged cache: the page ids the caller's table holds
    /// times the page size).
    pub max_kv_tokens: usize,
}

impl GraphCapacity {
    /// The capacity of a decode batch of `batch` requests over at most `max_kv_tokens` keys.
    pub fn decode(batch: usize, max_kv_tokens: usize) -> GraphCapacity {
        GraphCapacity {
            max_batch: batch,
            max_qo_tokens: batch,
            max_qo_len: 1,
            max_kv_tokens,
        }
    }

    /// An error naming the first bound `problem`'s batch exceeds.
    pub fn check(&self, batch: &RaggedBatch) -> Result<(), Error> {
        let lens = batch.lens();
        let longest_qo = lens.iter().map(|l| l.0).max().unwrap_or(0);
        for (field, what, have, max) in [
            ("batch", "requests", batch.len(), self.max_batch),
            (
                "qo_indptr",
                "query tokens",
                batch.total_qo(),
                self.max_qo_tokens,
            ),
            (
                "qo_indptr",
                "query tokens in one request",
                longest_qo,
                self.max_qo_len,
            ),
            ("kv_indptr", "keys", batch.total_kv(), self.max_kv_tokens),
        ] {
            if have > max {
                return Err(InvalidProblem::new(
                    field,
                    format!("has {have} {what}; the graph-stable plan was built for at most {max}"),
                )
                .into());
            }
        }
        Ok(())
    }
}

/// What a graph-stable plan fixed at construction.
#[derive(Clone, Debug)]
pub(crate) struct GraphState {
    pub capacity: GraphCapacity,
    /// Work items per launch (the grid), whatever the plan's own count.
    pub items: usize,
    /// With a KV split: the batch size and query tokens every plan keeps.
    pub split_batch: Option<(usize, usize)>,
}

/// A work item that does nothing: no query row and no key, so its CTA loads nothing and writes
/// nothing (the kernels skip rows past the query length and keys past the key length).
pub(crate) const EMPTY_ITEM: WorkItem = [0; 8];

/// Refuses what a graph-stable plan cannot keep fixed in `problem` or `options`.
pub(crate) fn check_graph_problem(
    problem: &AttentionProblem,
    options: &PlanOptions,
) -> Result<(), Error> {
    if matches!(problem.mask, Mask::Custom(_)) {
        return Err(unsupported(
            "a custom mask",
            "the causal, sliding-window or no mask",
        ));
    }
    if options.tile.is_some_and(|t| t.warp_specialized) {
        return Err(unsupported(
            "the warp-specialised tile (its persistent grid follows the plan)",
            "the other tiles",
        ));
    }
    Ok(())
}

fn unsupported(what: &str, supported: &str) -> Error {
    Error::Unsupported {
        backend: "cuda",
        what: format!("{what} in a graph-stable plan"),
        supported: supported.into(),
    }
}

/// The most bytes the planner's split of a graph-stable plan gives its workspace: it holds a
/// slot per (query row, head, chunk) for a request holding every key of the capacity, and a
/// chunk is made longer (a power-of-two multiple of the planned one) until they fit. The size of
/// FlashInfer's usual float workspace, doubled.
const GRAPH_WORKSPACE_BYTES: usize = 256 << 20;

/// The KV split of a graph-stable plan, fixed for every later plan: `options.split`'s chunk, or
/// with [`SplitChoice::Planned`] the planner's choice for the decode batch the capacity
/// describes (every request at an equal share of the keys; none when the capacity's requests
/// have more than one query token, whose query count changes between plans), lengthened until
/// its workspace fits [`GRAPH_WORKSPACE_BYTES`], with room for a request holding every key.
pub(crate) fn graph_split(
    problem: &AttentionProblem,
    capacity: &GraphCapacity,
    (cta_q, kv_tile, slots): (usize, usize, usize),
    choice: SplitChoice,
) -> Result<Option<KvSplit>, Error> {
    let chunk = match choice {
        SplitChoice::Unsplit => return Ok(None),
        SplitChoice::ChunkKeys(c) => choice.resolve(None, c, kv_tile)?.map(|s| s.chunk),
        SplitChoice::Planned if capacity.max_qo_len > 1 || capacity.max_batch == 0 => None,
        SplitChoice::Planned => {
            let share = capacity.max_kv_tokens.div_ceil(capacity.max_batch);
            let mut shape = problem.clone();
            shape.batch = RaggedBatch::from_lens(&vec![(1, share); capacity.max_batch])?;
            shape.mask = Mask::None;
            let slot_bytes = capacity.max_qo_tokens
                * problem.num_qo_heads
                * (problem.head_dims.vo() + 1)
                * std::mem::size_of::<f32>();
            choose_kv_split(&shape, cta_q, kv_tile, slots).map(|s| {
                let mut chunk = s.chunk;
                while capacity.max_kv_tokens.div_ceil(chunk) * slot_bytes > GRAPH_WORKSPACE_BYTES
                    && chunk < capacity.max_kv_tokens
                {
                    chunk *= 2;
                }
                chunk
            })
        }
    };
    Ok(chunk.map(|chunk| KvSplit {
        chunk,
        max_chunks: capacity.max_kv_tokens.div_ceil(chunk).max(1),
    }))
}

/// The most work items a plan within `capacity` has, for query tiles of `cta_q` packed rows
/// (`group` query heads per KV head) and `split`: per KV head, every request's query tiles, times
/// its chunks when split. A request of `t` tiles and `k` keys has `t * (k / chunk + 1)` items at
/// most, so the keys add at most `t_max * (max_kv / chunk)` to the tiles' count.
pub(crate) fn work_capacity(
    capacity: &GraphCapacity,
    num_kv_heads: usize,
    group: usize,
    cta_q: usize,
    split: Option<&KvSplit>,
) -> usize {
    let tiles_of = |qo: usize| (qo * group).div_ceil(cta_q.max(1));
    let longest = tiles_of(capacity.max_qo_len);
    let tiles =
        (capacity.max_batch * longest).min(tiles_of(capacity.max_qo_tokens) + capacity.max_batch);
    let chunked = split.map_or(0, |s| longest * (capacity.max_kv_tokens / s.chunk));
    num_kv_heads * (tiles + chunked)
}

/// The work list of `problem` padded with [`EMPTY_ITEM`] to `items` entries, flattened as the
/// kernels read it.
pub(crate) fn padded_work(
    problem: &AttentionProblem,
    (cta_q, slots): (usize, usize),
    split: Option<&KvSplit>,
    items: usize,
) -> Result<Vec<i32>, Error> {
    let mut work = prefill_work(problem, cta_q, split, slots);
    if work.len() > items {
        // `work_capacity` bounds every problem `GraphCapacity::check` admits.
        return Err(InvalidProblem::new(
            "batch",
            format!(
                "needs {} work items; the graph-stable plan launches {items}",
                work.len()
            ),
        )
        .into());
    }
    work.resize(items, EMPTY_ITEM);
    Ok(work.into_iter().flatten().collect())
}

/// Whether `a` and `b` launch with the same parameters but for their batches: everything the
/// kernel reads by value or is compiled for, the variant's parameter values included.
fn same_launch(a: &AttentionProblem, b: &AttentionProblem) -> bool {
    let params = |p: &AttentionProblem| param_values(&p.variant, p.qk_scaling().post_scale);
    a.num_qo_heads == b.num_qo_heads
        && a.num_kv_heads == b.num_kv_heads
        && a.head_dims == b.head_dims
        && a.input_dtype == b.input_dtype
        && a.output_dtype == b.output_dtype
        && a.qk_accum == b.qk_accum
        && a.sm_scale.to_bits() == b.sm_scale.to_bits()
        && a.mask == b.mask
        && a.q_view == b.q_view
        && a.k_view == b.k_view
        && a.v_view == b.v_view
        && a.variant.kind() == b.variant.kind()
        && params(a) == params(b)
}

/// An error unless `next` may re-plan a graph-stable plan of `first`: the same launch but for
/// the batch (heads, head dims, dtypes, mask and window, scale, variant and its parameters,
/// views); only the batch may change.
pub fn check_replan(first: &AttentionProblem, next: &AttentionProblem) -> Result<(), Error> {
    if same_launch(first, next) {
        return Ok(());
    }
    Err(InvalidProblem::new(
        "problem",
        "differs from the graph-stable plan's in more than its batch (heads, head dims, dtypes, \
         mask and window, sm_scale, variant and its parameters, views are fixed at construction)",
    )
    .into())
}

impl KernelPlan {
    /// Re-plans a graph-stable plan for `problem` (validated by the caller): checks that it fits
    /// the capacity and launches as the plan's kernel with the same by-value parameters, then
    /// writes its work list and index pointers into the plan's device arrays on `stream` (no
    /// allocation; ordered before later launches there, so a graph replayed on `stream` after
    /// this call reads them).
    pub fn replan(
        &mut self,
        stream: &Arc<CudaStream>,
        problem: &AttentionProblem,
    ) -> Result<(), Error> {
        let Some(graph) = &self.graph else {
            return Err(Error::Unsupported {
                backend: "cuda",
                what: "re-planning a plan built without a graph capacity".into(),
                supported: "graph-stable plans (built with a GraphCapacity)".into(),
            });
        };
        graph.capacity.check(&problem.batch)?;
        check_graph_problem(problem, &PlanOptions::default())?;
        let spec = crate::codegen::KernelSpec::for_problem(problem, self.spec.kv, self.spec.tile)?
            .with_kv_fp8(self.spec.kv_fp8)?;
        check_replan(&self.problem, problem)?;
        if spec != self.spec {
            return Err(InvalidProblem::new(
                "problem",
                format!(
                    "needs kernel {}; the graph-stable plan runs {}",
                    spec.name(),
                    self.spec.name()
                ),
            )
            .into());
        }
        if let Some((batch, qo)) = graph.split_batch {
            if (problem.batch.len(), problem.batch.total_qo()) != (batch, qo) {
                return Err(InvalidProblem::new(
                    "batch",
                    format!(
                        "has {} requests and {} query tokens; a graph-stable plan with a KV split \
                         keeps its {batch} requests and {qo} query tokens",
                        problem.batch.len(),
                        problem.batch.total_qo()
                    ),
                )
                .into());
            }
        }
        let cta_q = self.spec.tile.cta_q() as usize;
        let work = padded_work(
            problem,
            (cta_q, self.slots),
            self.split.as_ref(),
            graph.items,
        )?;
        self.arrays.rewrite(stream, problem)?;
        super::memory_write(stream, &work, &mut self.work, "the work list")?;
        self.problem = problem.clone();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::problem::HeadDims;
    use crate::DType;

    fn decode(lens: &[usize], hq: usize, hkv: usize) -> AttentionProblem {
        let lens: Vec<(usize, usize)> = lens.iter().map(|&k| (1, k)).collect();
        AttentionProblem::new(
            RaggedBatch::from_lens(&lens).unwrap(),
            hq,
            hkv,
            HeadDims::equal(128).unwrap(),
            DType::F16,
        )
    }

    // Every batch the capacity admits fits the padded work list, split or not, whatever the
    // split of its keys between the requests.
    #[test]
    fn the_work_capacity_bounds_every_batch_within_the_capacity() {
        let cap = GraphCapacity::decode(4, 4096);
        for split in [
            None,
            Some(KvSplit {
                chunk: 256,
                max_chunks: 16,
            }),
        ] {
            let items = work_capacity(&cap, 8, 4, 16, split.as_ref());
            for lens in [
                vec![4096, 0, 0, 0],
                vec![1024; 4],
                vec![1, 1, 1, 4093],
                vec![255, 257, 511, 513],
                vec![0, 0, 0, 0],
            ] {
                let p = decode(&lens, 32, 8);
                cap.check(&p.batch).unwrap();
                let work = padded_work(&p, (16, 264), split.as_ref(), items).unwrap();
                assert_eq!(work.len(), items * 8);
                let real = prefill_work(&p, 16, split.as_ref(), 264).len();
                // The padding is empty items only.
                assert!(work[real * 8..].iter().all(|&x| x == 0), "{lens:?}");
            }
        }
        // Prefill: many short requests or one long one.
        let cap = GraphCapacity {
            max_batch: 8,
            max_qo_tokens: 1000,
            max_qo_len: 1000,
            max_kv_tokens: 4000,
        };
        let items = work_capacity(&cap, 2, 4, 64, None);
        for lens in [vec![(1000, 4000)], vec![(125, 500); 8], vec![(1, 1); 8]] {
            let mut p = decode(&[1], 8, 2);
            p.batch = RaggedBatch::from_lens(&lens).unwrap();
            padded_work(&p, (64, 264), None, items).unwrap();
        }
    }

    #[test]
    fn a_batch_beyond_the_capacity_is_refused_naming_the_bound() {
        let cap = GraphCapacity::decode(4, 100);
        let text = |lens: &[usize]| {
            cap.check(&decode(lens, 8, 8).batch)
                .unwrap_err()
                .to_string()
        };
        assert!(text(&[1; 5]).contains("5 requests"), "{}", text(&[1; 5]));
        assert!(text(&[60, 41]).contains("101 keys"), "{}", text(&[60, 41]));
        let mut prefill = decode(&[10], 8, 8);
        prefill.batch = RaggedBatch::from_lens(&[(2, 10)]).unwrap();
        let err = cap.check(&prefill.batch).unwrap_err().to_string();
        assert!(err.contains("query tokens"), "{err}");
    }

    // The planned split of a decode capacity has room for one request holding every key; a
    // prefill capacity is not split unless asked, and a forced chunk must be a multiple of the
    // KV tile.
    #[test]
    fn the_graph_split_covers_a_request_with_every_key() {
        let p = decode(&[1], 32, 8);
        let cap = GraphCapacity::decode(1, 65536);
        let split = graph_split(&p, &cap, (16, 64, 792), SplitChoice::Planned)
            .unwrap()
            .expect("one long request splits");
        assert!(split.max_chunks * split.chunk >= 65536, "{split:?}");
        // A large capacity's workspace stays bounded.
        let wide = GraphCapacity::decode(128, 2 << 20);
        let p = decode(&[1; 128], 32, 8);
        let s = graph_split(&p, &wide, (16, 64, 792), SplitChoice::Planned)
            .unwrap()
            .expect("1.3 waves of 16384-key requests split");
        let bytes = 128 * 32 * 129 * 4 * s.max_chunks;
        assert!(bytes <= GRAPH_WORKSPACE_BYTES, "{s:?}: {bytes} bytes");
        let prefill = GraphCapacity {
            max_qo_len: 64,
            ..cap
        };
        assert_eq!(
            graph_split(&p, &prefill, (16, 64, 792), SplitChoice::Planned).unwrap(),
            None
        );
        let forced = graph_split(&p, &prefill, (16, 64, 792), SplitChoice::ChunkKeys(512))
            .unwrap()
            .unwrap();
        assert_eq!((forced.chunk, forced.max_chunks), (512, 128));
        assert!(graph_split(&p, &cap, (16, 64, 792), SplitChoice::ChunkKeys(100)).is_err());
        assert_eq!(
            graph_split(&p, &cap, (16, 64, 792), SplitChoice::Unsplit).unwrap(),
            None
        );
    }

    #[test]
    fn only_the_batch_may_change_between_plans() {
        let a = decode(&[10, 20], 8, 2);
        let mut b = decode(&[30, 1], 8, 2);
        assert!(same_launch(&a, &b));
        b.sm_scale *= 2.0;
        assert!(!same_launch(&a, &b));
        let c = a.clone().with_mask(Mask::SlidingWindow { window_left: 4 });
        assert!(!same_launch(&a, &c));
    }
}
