//! The paged KV cache's geometry: where element (page, slot, head, e) of K and of V lives.
//!
//! A cache is `num_pages` pages of `page_size` token slots each. Within a page the tokens are laid
//! out NHD (`[page_size, kv_heads, D]`) or HND (`[kv_heads, page_size, D]`); K and V live either in
//! two buffers (`[pages, page_size, kv_heads, D_qk]` and the same with `D_vo`, NHD shown) or in one
//! combined buffer `[pages, 2, ...]` whose index 0 along the second axis is K and 1 is V (both
//! halves the same shape, so combined storage needs `head_dim_qk == head_dim_vo`).
//! [`PagedKvLayout::k_index`] and [`PagedKvLayout::v_index`] are THE address definitions; the page
//! table ([`super::PageTable`]) says which pages and slots a request's tokens occupy.

use crate::dtype::fp8::Fp8Tensor;
use crate::dtype::DType;
use crate::problem::{HeadDims, InvalidProblem, Validation};
use crate::tensor::HostTensor;

/// The largest page size (tokens per page) the cache takes.
pub const MAX_PAGE_SIZE: usize = 256;

/// How the tokens and heads of one page are ordered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KvOrder {
    /// `[page_size, kv_heads, D]`: the heads of one token are adjacent.
    Nhd,
    /// `[kv_heads, page_size, D]`: the tokens of one head are adjacent.
    Hnd,
}

impl KvOrder {
    /// Short name (`"nhd"`, `"hnd"`).
    pub fn name(self) -> &'static str {
        match self {
            KvOrder::Nhd => "nhd",
            KvOrder::Hnd => "hnd",
        }
    }
}

/// Whether K and V have a buffer each or share one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KvStorage {
    /// K in one buffer `[pages, <page>]`, V in another.
    Separate,
    /// One buffer `[pages, 2, <page>]`: K at index 0, V at index 1 of the second axis.
    Combined,
}

impl KvStorage {
    /// Short name (`"separate"`, `"combined"`).
    pub fn name(self) -> &'static str {
        match self {
            KvStorage::Separate => "separate",
            KvStorage::Combined => "combined",
        }
    }
}

/// The cache buffers to read, as the layout's storage expects them: host tensors of the layout's
/// dtype, or fp8 codes (`PagedKv<'_, Fp8Tensor>`, read through [`super::Fp8Kv`]).
#[derive(Debug)]
pub enum PagedKv<'a, B = HostTensor> {
    /// K and V in their own buffers ([`KvStorage::Separate`]).
    Separate {
        /// The K pages.
        k: &'a B,
        /// The V pages.
        v: &'a B,
    },
    /// K and V in one buffer ([`KvStorage::Combined`]).
    Combined(&'a B),
}

impl<B> Clone for PagedKv<'_, B> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<B> Copy for PagedKv<'_, B> {}

impl<'a, B> PagedKv<'a, B> {
    /// The buffers holding K and V (the same buffer twice for combined storage).
    pub fn k_and_v(self) -> (&'a B, &'a B) {
        match self {
            PagedKv::Separate { k, v } => (k, v),
            PagedKv::Combined(kv) => (kv, kv),
        }
    }

    /// The buffers, one or two.
    fn buffers(self) -> Vec<(&'static str, &'a B, bool)> {
        match self {
            PagedKv::Separate { k, v } => vec![("k_cache", k, true), ("v_cache", v, false)],
            PagedKv::Combined(kv) => vec![("kv_cache", kv, true)],
        }
    }
}

/// The cache buffers to write (see [`PagedKv`]).
#[derive(Debug)]
pub enum PagedKvMut<'a, B = HostTensor> {
    /// K and V in their own buffers ([`KvStorage::Separate`]).
    Separate {
        /// The K pages.
        k: &'a mut B,
        /// The V pages.
        v: &'a mut B,
    },
    /// K and V in one buffer ([`KvStorage::Combined`]).
    Combined(&'a mut B),
}

impl<B> PagedKvMut<'_, B> {
    /// A read view of the same buffers.
    pub fn as_ref(&self) -> PagedKv<'_, B> {
        match self {
            PagedKvMut::Separate { k, v } => PagedKv::Separate { k, v },
            PagedKvMut::Combined(kv) => PagedKv::Combined(kv),
        }
    }
}

/// A cache buffer as the layout checks it: its length and the name of its element type.
pub trait KvBuffer {
    /// Elements held.
    fn len(&self) -> usize;
    /// Whether it holds no element.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The element type's name (`f16`, `e4m3`, ...).
    fn element_name(&self) -> &'static str;
}

impl KvBuffer for HostTensor {
    fn len(&self) -> usize {
        HostTensor::len(self)
    }
    fn element_name(&self) -> &'static str {
        self.dtype().name()
    }
}

impl KvBuffer for Fp8Tensor {
    fn len(&self) -> usize {
        Fp8Tensor::len(self)
    }
    fn element_name(&self) -> &'static str {
        self.format.name()
    }
}

/// The geometry of a paged KV cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PagedKvLayout {
    /// Pages in the cache buffer(s); page ids run `0..num_pages`.
    pub num_pages: usize,
    /// Token slots per page, `1..=MAX_PAGE_SIZE`.
    pub page_size: usize,
    /// Key/value heads.
    pub num_kv_heads: usize,
    /// Head dims: K has `head_dims.qk()` elements per head, V `head_dims.vo()`.
    pub head_dims: HeadDims,
    /// NHD or HND within a page.
    pub order: KvOrder,
    /// Separate or combined K/V buffers.
    pub storage: KvStorage,
    /// Element type of the cache.
    pub dtype: DType,
}

impl PagedKvLayout {
    /// Checks the page size, heads and storage; buffers are checked by
    /// [`validate_buffers`](Self::validate_buffers).
    pub fn validate(&self) -> Validation {
        if !(1..=MAX_PAGE_SIZE).contains(&self.page_size) {
            return Err(InvalidProblem::new(
                "page_size",
                format!("{} is not in 1..={MAX_PAGE_SIZE}", self.page_size),
            ));
        }
        if self.num_kv_heads == 0 {
            return Err(InvalidProblem::new("num_kv_heads", "is 0"));
        }
        HeadDims::new(self.head_dims.qk(), self.head_dims.vo())?;
        if self.storage == KvStorage::Combined && self.head_dims.qk() != self.head_dims.vo() {
            return Err(InvalidProblem::new(
                "kv_storage",
                format!(
                    "combined K/V needs equal head dims; they are ({}, {})",
                    self.head_dims.qk(),
                    self.head_dims.vo()
                ),
            ));
        }
        if self.buffer_len(true).is_none() || self.buffer_len(false).is_none() {
            return Err(InvalidProblem::new(
                "num_pages",
                format!(
                    "{} pages of {} tokens x {} heads overflow the address space",
                    self.num_pages, self.page_size, self.num_kv_heads
                ),
            ));
        }
        Ok(())
    }

    /// Elements of one page of K (`true`) or V (`false`).
    fn half_page_len(&self, is_k: bool) -> usize {
        let dim = if is_k {
            self.head_dims.qk()
        } else {
            self.head_dims.vo()
        };
        self.page_size * self.num_kv_heads * dim
    }

    /// Elements between consecutive pages of the buffer that holds K (`true`) or V (`false`).
    fn page_stride(&self, is_k: bool) -> usize {
        match self.storage {
            KvStorage::Separate => self.half_page_len(is_k),
            KvStorage::Combined => 2 * self.half_page_len(true),
        }
    }

    /// Elements the buffer holding K (`true`) or V (`false`) needs; `None` on overflow (checked
    /// factor by factor, so absurd head counts are an error too, never a wrapped size).
    fn buffer_len(&self, is_k: bool) -> Option<usize> {
        let dim = match (self.storage, is_k) {
            (KvStorage::Separate, false) => self.head_dims.vo(),
            _ => self.head_dims.qk(),
        };
        let halves = match self.storage {
            KvStorage::Separate => 1,
            KvStorage::Combined => 2,
        };
        [self.page_size, self.num_kv_heads, dim, halves]
            .into_iter()
            .try_fold(self.num_pages, usize::checked_mul)
    }

    /// Elements the K buffer needs (for combined storage: the combined buffer).
    pub fn k_buffer_len(&self) -> usize {
        self.buffer_len(true).unwrap_or(usize::MAX)
    }

    /// Elements the V buffer needs (for combined storage: the combined buffer).
    pub fn v_buffer_len(&self) -> usize {
        self.buffer_len(false).unwrap_or(usize::MAX)
    }

    /// Offset of (page, slot, head, e) in the buffer holding K (`true`) or V (`false`).
    fn index(&self, is_k: bool, page: usize, slot: usize, head: usize, e: usize) -> usize {
        let dim = if is_k {
            self.head_dims.qk()
        } else {
            self.head_dims.vo()
        };
        let half = match (self.storage, is_k) {
            (KvStorage::Combined, false) => self.half_page_len(true),
            _ => 0,
        };
        let in_page = match self.order {
            KvOrder::Nhd => (slot * self.num_kv_heads + head) * dim + e,
            KvOrder::Hnd => (head * self.page_size + slot) * dim + e,
        };
        page * self.page_stride(is_k) + half + in_page
    }

    /// Index of K element `e` of head `head` at token slot `slot` of page `page`, in the K buffer
    /// (or the combined buffer).
    pub fn k_index(&self, page: usize, slot: usize, head: usize, e: usize) -> usize {
        self.index(true, page, slot, head, e)
    }

    /// Index of V element `e` of head `head` at token slot `slot` of page `page`, in the V buffer
    /// (or the combined buffer).
    pub fn v_index(&self, page: usize, slot: usize, head: usize, e: usize) -> usize {
        self.index(false, page, slot, head, e)
    }

    /// [`validate`](Self::validate), then checks that the buffers match the storage, have the
    /// layout's dtype and hold `num_pages` pages.
    pub fn validate_buffers(&self, cache: PagedKv<'_>) -> Validation {
        self.validate_buffers_of(cache, self.dtype.name())
    }

    /// [`validate`](Self::validate), then checks that the buffers match the storage, hold
    /// elements named `element` (`f16`, `e4m3`, ...) and hold `num_pages` pages.
    pub fn validate_buffers_of<B: KvBuffer>(
        &self,
        cache: PagedKv<'_, B>,
        element: &str,
    ) -> Validation {
        self.validate()?;
        let given = match cache {
            PagedKv::Separate { .. } => KvStorage::Separate,
            PagedKv::Combined(_) => KvStorage::Combined,
        };
        if given != self.storage {
            let other = match self.storage {
                KvStorage::Separate => "one combined buffer",
                KvStorage::Combined => "separate K and V buffers",
            };
            return Err(InvalidProblem::new(
                "kv_cache",
                format!(
                    "the layout's storage is {} but {other} were given",
                    self.storage.name()
                ),
            ));
        }
        for (name, t, is_k) in cache.buffers() {
            let need = if is_k {
                self.k_buffer_len()
            } else {
                self.v_buffer_len()
            };
            if t.element_name() != element {
                return Err(InvalidProblem::new(
                    name,
                    format!(
                        "has elements of {} but the cache holds {element}",
                        t.element_name()
                    ),
                ));
            }
            if t.len() < need {
                return Err(InvalidProblem::new(
                    name,
                    format!(
                        "has {} elements; {} pages of {} tokens x {} heads ({}, {}) need {need}",
                        t.len(),
                        self.num_pages,
                        self.page_size,
                        self.num_kv_heads,
                        self.order.name(),
                        self.storage.name()
                    ),
                ));
            }
        }
        Ok(())
    }
}
