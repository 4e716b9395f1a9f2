//! The paged KV cache: what an inference server keeps its keys and values in.
//!
//! A cache is a pool of fixed-size pages ([`PagedKvLayout`]: page size, NHD or HND order, separate
//! or combined K/V buffers); each request of a batch owns a list of pages ([`PageTable`]). This
//! module is the host side of paged attention, with no GPU in it:
//!
//! | module | job |
//! |---|---|
//! | `layout` | the cache geometry and THE address of (page, slot, head, e) for K and for V |
//! | `table` | the page table of a batch, its validation, and kv_len per request |
//! | `problem` | [`PagedAttention`]: an [`AttentionProblem`](crate::AttentionProblem) over a cache |
//! | `gather` | [`gather`]: the paged K/V copied to contiguous ragged tensors |
//! | `append` | [`append_paged_kv`]: the new tokens' K/V written into their pages (quantised for an fp8 cache: [`append_paged_kv_fp8`]) |
//! | `fp8` | the fp8 cache: [`KvScales`], [`Fp8Kv`], [`PagedCache`] and the exact dequantisation |
//!
//! Every entry point validates first and returns an
//! [`InvalidProblem`](crate::problem::InvalidProblem) naming the field, the request and the
//! value: a bad page table never becomes an out-of-bounds index. The exact reference and the CPU
//! backend run paged problems through [`gather`] (`reference::paged_attention`,
//! `cpu::paged_attention`); `docs/semantics.md` ("Paged KV cache") has the definitions.

mod append;
mod fp8;
mod gather;
mod layout;
mod problem;
mod table;

pub use append::{append_paged_kv, append_paged_kv_fp8, validate_append};
pub use fp8::{
    dequantize, dequantize_code, gather_dequantized, gather_exact, quantize_value, Fp8Kv, KvScales,
    PagedCache,
};
pub use gather::gather;
pub use layout::{KvBuffer, KvOrder, KvStorage, PagedKv, PagedKvLayout, PagedKvMut, MAX_PAGE_SIZE};
pub use problem::PagedAttention;
pub use table::PageTable;
