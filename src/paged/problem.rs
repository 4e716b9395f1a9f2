//! [`PagedAttention`]: an attention problem whose keys and values live in a paged cache.
//!
//! It bundles an [`AttentionProblem`] (queries, heads, mask, variant; its `batch.kv_indptr` is
//! the token prefix sums that the page table implies), the cache's [`PagedKvLayout`] and the
//! batch's [`PageTable`]. The constructor checks that the three agree, so every backend can rely on
//! them: a paged problem is exactly the ragged problem over the gathered K and V
//! ([`super::gather`]). Batch decode is the case of one query per request.

use super::layout::PagedKvLayout;
use super::table::PageTable;
use crate::problem::{AttentionProblem, InvalidProblem, RaggedBatch, TensorView, Validation};
use crate::tensor::HostTensor;

/// A validated paged attention problem.
#[derive(Clone, Debug)]
pub struct PagedAttention {
    problem: AttentionProblem,
    layout: PagedKvLayout,
    table: PageTable,
}

impl PagedAttention {
    /// The default [`AttentionProblem`] (see [`AttentionProblem::new`]) for queries
    /// `qo_indptr` over the cache: its `kv_indptr` comes from the table, its KV heads, head dims
    /// and dtype from the layout. Set the mask, variant and scale on it, then pass it to
    /// [`new`](Self::new).
    pub fn problem_for(
        qo_indptr: Vec<i32>,
        num_qo_heads: usize,
        layout: &PagedKvLayout,
        table: &PageTable,
    ) -> Validation<AttentionProblem> {
        layout.validate()?;
        table.validate(layout.page_size, layout.num_pages)?;
        let batch = RaggedBatch {
            qo_indptr,
            kv_indptr: table.kv_indptr(layout.page_size),
        };
        Ok(AttentionProblem::new(
            batch,
            num_qo_heads,
            layout.num_kv_heads,
            layout.head_dims,
            layout.dtype,
        ))
    }

    /// Checks the layout, the table (against the layout), the problem, and that they agree: the
    /// same number of requests, `problem.batch.kv_indptr` equal to the table's token prefix sums,
    /// the same KV heads, head dims and dtype, and contiguous K/V views (the views describe the
    /// gathered tensors, which are contiguous).
    pub fn new(
        problem: AttentionProblem,
        layout: PagedKvLayout,
        table: PageTable,
    ) -> Validation<PagedAttention> {
        layout.validate()?;
        table.validate(layout.page_size, layout.num_pages)?;
        let batch = problem.batch.len();
        if table.batch_size() != batch || problem.batch.qo_indptr.len() < 2 {
            return Err(InvalidProblem::new(
                "kv_page_indptr",
                format!(
                    "describes {} requests but qo_indptr has {} entries (batch + 1)",
                    table.batch_size(),
                    problem.batch.qo_indptr.len()
                ),
            ));
        }
        let kv_indptr = table.kv_indptr(layout.page_size);
        if problem.batch.kv_indptr.len() != kv_indptr.len() {
            return Err(InvalidProblem::new(
                "kv_indptr",
                format!(
                    "has {} entries; the page table has {batch} requests",
                    problem.batch.kv_indptr.len()
                ),
            ));
        }
        if let Some(i) = (0..=batch).find(|&i| problem.batch.kv_indptr[i] != kv_indptr[i]) {
            return Err(InvalidProblem::new(
                format!("kv_indptr[{i}]"),
                format!(
                    "is {} but the page table gives {} (request {})",
                    problem.batch.kv_indptr[i],
                    kv_indptr[i],
                    i.saturating_sub(1)
                ),
            ));
        }
        if problem.num_kv_heads != layout.num_kv_heads {
            return Err(InvalidProblem::new(
                "num_kv_heads",
                format!(
                    "is {} but the cache has {} KV heads",
                    problem.num_kv_heads, layout.num_kv_heads
                ),
            ));
        }
        if problem.head_dims != layout.head_dims {
            return Err(InvalidProblem::new(
                "head_dims",
                format!(
                    "are {:?} but the cache's are {:?}",
                    problem.head_dims, layout.head_dims
                ),
            ));
        }
        if problem.input_dtype != layout.dtype {
            return Err(InvalidProblem::new(
                "input_dtype",
                format!(
                    "is {} but the cache's dtype is {}",
                    problem.input_dtype, layout.dtype
                ),
            ));
        }
        let (h, dqk, dvo) = (
            layout.num_kv_heads,
            layout.head_dims.qk(),
            layout.head_dims.vo(),
        );
        for (name, view, want) in [
            ("k_view", problem.k_view, TensorView::contiguous(h, dqk)),
            ("v_view", problem.v_view, TensorView::contiguous(h, dvo)),
        ] {
            if view != want {
                return Err(InvalidProblem::new(
                    name,
                    format!("is {view:?}; a paged problem's K/V views must be contiguous ({want:?}): the cache layout says where K and V live"),
                ));
            }
        }
        problem.validate()?;
        Ok(PagedAttention {
            problem,
            layout,
            table,
        })
    }

    /// The ragged problem (over the gathered K and V).
    pub fn problem(&self) -> &AttentionProblem {
        &self.problem
    }

    /// The cache layout.
    pub fn layout(&self) -> &PagedKvLayout {
        &self.layout
    }

    /// The page table.
    pub fn table(&self) -> &PageTable {
        &self.table
    }

    /// Checks `q` against the problem's query view and dtype (the cache buffers are checked by
    /// [`PagedKvLayout::validate_buffers`]).
    pub fn validate_q(&self, q: &HostTensor) -> Validation {
        let p = &self.problem;
        p.check_input_dtype("q", q)?;
        p.q_view.validate(
            "q",
            p.batch.total_qo(),
            p.num_qo_heads,
            p.head_dims.qk(),
            q.len(),
        )
    }
}
