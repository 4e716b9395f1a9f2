//! Graph-stable paged plans: [`PagedPlan::graph_stable`] sizes the page table on the device for a
//! [`PagedGraphCapacity`] and [`PagedPlan::replan`] writes each new batch's table, index pointers
//! and work list into the same buffers, so that a CUDA graph captured once around
//! [`PagedPlan::run_on`] replays every later plan (the kernel side: `cuda::plan`'s graph
//! module).

use super::{KernelPages, KernelPlan, PagedPlan};
use crate::codegen::KvCache;
use crate::cuda::engine::Engine;
use crate::cuda::plan::{memory_write, upload, GraphCapacity, PlanOptions};
use crate::cuda::prefill::check_view_alignment;
use crate::dtype::fp8::Fp8Format;
use crate::paged::{PagedAttention, PagedKvLayout};
use crate::problem::InvalidProblem;
use crate::Error;
use cudarc::driver::CudaStream;
use std::sync::Arc;

/// The largest batch a graph-stable paged plan is re-planned for, in the caller's terms: requests,
/// query tokens (all together and per request) and page ids in the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PagedGraphCapacity {
    /// Requests per plan.
    pub max_batch: usize,
    /// Query tokens per plan, all requests together.
    pub max_qo_tokens: usize,
    /// Query tokens of one request (1 for decode).
    pub max_qo_len: usize,
    /// Page ids in the table, all requests together.
    pub max_pages: usize,
}

impl PagedGraphCapacity {
    /// A decode batch of `batch` requests (one query each) over a table of at most `max_pages`
    /// page ids.
    pub fn decode(batch: usize, max_pages: usize) -> PagedGraphCapacity {
        PagedGraphCapacity {
            max_batch: batch,
            max_qo_tokens: batch,
            max_qo_len: 1,
            max_pages,
        }
    }

    /// The kernel plan's capacity over pages of `page_size` tokens.
    fn keys(&self, page_size: usize) -> GraphCapacity {
        GraphCapacity {
            max_batch: self.max_batch,
            max_qo_tokens: self.max_qo_tokens,
            max_qo_len: self.max_qo_len,
            max_kv_tokens: self.max_pages * page_size,
        }
    }
}

/// The kernels' page ids per caller page id: 1, or a page's tokens when the kernels address
/// pages of one token (`KernelPages`).
fn ids_per_page(layout: &PagedKvLayout, kernel_page_size: usize) -> usize {
    layout.page_size / kernel_page_size.max(1)
}

impl PagedPlan {
    /// [`with_kv_fp8`](Self::with_kv_fp8), graph-stable: the page table, index pointers and work
    /// list live in buffers sized for `capacity`, and [`replan`](Self::replan) writes every later
    /// batch within it there, so that a graph captured once around [`run_on`](Self::run_on) (or
    /// `run_fp8_on`) replays the newest plan. Refused: custom masks and the warp-specialised
    /// tile; a KV split (the planner's, for a decode capacity) keeps its chunk size and needs
    /// every plan to keep the batch size.
    pub fn graph_stable(
        engine: &Engine,
        paged: &PagedAttention,
        kv_fp8: Option<Fp8Format>,
        options: PlanOptions,
        capacity: PagedGraphCapacity,
    ) -> Result<PagedPlan, Error> {
        let problem = paged.problem();
        check_view_alignment("q", &problem.q_view)?;
        let table = paged.table().clone();
        check_pages(&capacity, table.kv_page_indices.len())?;
        let layout = *paged.layout();
        let kp = KernelPages::new(&layout, &table)?;
        let plan = KernelPlan::graph_stable(
            engine,
            problem,
            KvCache::Paged,
            kv_fp8,
            options,
            capacity.keys(layout.page_size),
        )?;
        let room = |v: &[i32], n: usize| {
            let mut v = v.to_vec();
            v.resize(n.max(v.len()), 0);
            v
        };
        let ids = capacity.max_pages * ids_per_page(&layout, kp.page_size);
        Ok(PagedPlan {
            plan,
            kv_fp8,
            layout,
            kernel_pages: (kp.page_size, kp.k_page_stride, kp.v_page_stride),
            page_indptr: upload(
                engine,
                &room(&kp.table.kv_page_indptr, capacity.max_batch + 1),
                "kv_page_indptr",
            )?,
            page_indices: upload(
                engine,
                &room(&kp.table.kv_page_indices, ids),
                "kv_page_indices",
            )?,
            table,
            graph: Some(capacity),
        })
    }

    /// The capacity of a graph-stable plan; `None` for the others.
    pub fn graph_capacity(&self) -> Option<PagedGraphCapacity> {
        self.graph
    }

    /// Re-plans a graph-stable plan for `paged`: the same cache layout (its page count may
    /// differ: it bounds the page ids), heads, head dims, dtypes, mask, scale and variant, any
    /// batch within the capacity. Writes the new page table, index pointers and work list into
    /// the plan's buffers on `stream` (no allocation), so that a graph captured around an
    /// earlier run replays this plan once the copies are done (they are ordered on `stream`).
    pub fn replan(
        &mut self,
        stream: &Arc<CudaStream>,
        paged: &PagedAttention,
    ) -> Result<(), Error> {
        let Some(capacity) = self.graph else {
            return Err(Error::Unsupported {
                backend: "cuda",
                what: "re-planning a paged plan built without a graph capacity".into(),
                supported: "plans built by PagedPlan::graph_stable".into(),
            });
        };
        let layout = *paged.layout();
        if (PagedKvLayout {
            num_pages: self.layout.num_pages,
            ..layout
        }) != self.layout
        {
            return Err(InvalidProblem::new(
                "layout",
                "differs from the graph-stable plan's in more than its page count",
            )
            .into());
        }
        let table = paged.table();
        check_pages(&capacity, table.kv_page_indices.len())?;
        let kp = KernelPages::new(&layout, table)?;
        self.plan.replan(stream, paged.problem())?;
        memory_write(
            stream,
            &kp.table.kv_page_indptr,
            &mut self.page_indptr,
            "kv_page_indptr",
        )?;
        memory_write(
            stream,
            &kp.table.kv_page_indices,
            &mut self.page_indices,
            "kv_page_indices",
        )?;
        self.layout = layout;
        self.table = table.clone();
        Ok(())
    }
}

fn check_pages(capacity: &PagedGraphCapacity, pages: usize) -> Result<(), Error> {
    if pages > capacity.max_pages {
        return Err(InvalidProblem::new(
            "kv_page_indices",
            format!(
                "has {pages} page ids; the graph-stable plan was built for at most {}",
                capacity.max_pages
            ),
        )
        .into());
    }
    Ok(())
}
