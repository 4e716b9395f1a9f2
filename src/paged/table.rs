//! The page table of a batch: which pages hold each request's keys and values, and how full the
//! last one is.
//!
//! Request `r` owns pages `kv_page_indices[kv_page_indptr[r] .. kv_page_indptr[r+1]]`, in token
//! order: its token `j` sits in page `kv_page_indices[kv_page_indptr[r] + j / page_size]`, slot
//! `j % page_size`. All its pages are full except the last, which holds `kv_last_page_len[r]`
//! tokens (`1..=page_size`), so `kv_len = (pages - 1) * page_size + kv_last_page_len`. A request
//! with zero pages has zero keys, and its `kv_last_page_len` must be 0. The same page may appear in
//! several requests (a shared prefix); [`PageTable::validate`] makes sure no entry can index
//! outside the cache.

use crate::problem::{InvalidProblem, Validation};

/// The page table of a batch (FlashInfer's `paged_kv_indptr`, `paged_kv_indices`,
/// `paged_kv_last_page_len`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PageTable {
    /// Prefix sums of the number of pages per request: `batch + 1` entries, from 0, never
    /// decreasing.
    pub kv_page_indptr: Vec<i32>,
    /// Page ids, `kv_page_indptr[batch]` of them, each in `0..num_pages`.
    pub kv_page_indices: Vec<i32>,
    /// Tokens in each request's last page: `1..=page_size`, or 0 for a request with no page.
    pub kv_last_page_len: Vec<i32>,
}

impl PageTable {
    /// The table of requests holding `kv_lens[r]` tokens each in the given pages, in order:
    /// request `r` takes the next `ceil(kv_lens[r] / page_size)` ids of `pages`. An error if
    /// `pages` runs out or the page size is 0.
    pub fn from_kv_lens(kv_lens: &[usize], page_size: usize, pages: &[i32]) -> Validation<Self> {
        if page_size == 0 {
            return Err(InvalidProblem::new("page_size", "is 0"));
        }
        let mut table = PageTable {
            kv_page_indptr: vec![0],
            kv_page_indices: Vec::new(),
            kv_last_page_len: Vec::new(),
        };
        for (r, &kv_len) in kv_lens.iter().enumerate() {
            let n = kv_len.div_ceil(page_size);
            let start = table.kv_page_indices.len();
            let Some(ids) = pages.get(start..start + n) else {
                return Err(InvalidProblem::new(
                    "pages",
                    format!(
                        "has {} ids; request {r} needs pages up to {}",
                        pages.len(),
                        start + n
                    ),
                ));
            };
            table.kv_page_indices.extend_from_slice(ids);
            table
                .kv_page_indptr
                .push(to_i32("kv_page_indptr", start + n)?);
            let last = if kv_len == 0 {
                0
            } else {
                kv_len - (n - 1) * page_size
            };
            table.kv_last_page_len.push(last as i32);
        }
        Ok(table)
    }

    /// Number of requests.
    pub fn batch_size(&self) -> usize {
        self.kv_page_indptr.len().saturating_sub(1)
    }

    /// Checks every entry against the page size and the number of pages; after this, every
    /// other method is in bounds and every (page, slot) it yields is inside the cache.
    pub fn validate(&self, page_size: usize, num_pages: usize) -> Validation {
        let indptr = &self.kv_page_indptr;
        if indptr.len() < 2 {
            return Err(InvalidProblem::new(
                "kv_page_indptr",
                format!(
                    "has {} entries; it needs batch + 1 >= 2",
                    self.kv_page_indptr.len()
                ),
            ));
        }
        if indptr[0] != 0 {
            return Err(InvalidProblem::new(
                "kv_page_indptr[0]",
                format!("is {}; it must be 0", indptr[0]),
            ));
        }
        for (r, w) in indptr.windows(2).enumerate() {
            if w[1] < w[0] {
                return Err(InvalidProblem::new(
                    format!("kv_page_indptr[{}]", r + 1),
                    format!(
                        "{} is less than kv_page_indptr[{r}] = {} (request {r}); indptr must not decrease",
                        w[1], w[0]
                    ),
                ));
            }
        }
        let batch = self.batch_size();
        let total_pages = indptr[batch] as usize;
        if self.kv_page_indices.len() != total_pages {
            return Err(InvalidProblem::new(
                "kv_page_indices",
                format!(
                    "has {} entries but kv_page_indptr[{batch}] = {total_pages}",
                    self.kv_page_indices.len()
                ),
            ));
        }
        if self.kv_last_page_len.len() != batch {
            return Err(InvalidProblem::new(
                "kv_last_page_len",
                format!(
                    "has {} entries; the page table has {batch} requests",
                    self.kv_last_page_len.len()
                ),
            ));
        }
        for (i, &page) in self.kv_page_indices.iter().enumerate() {
            if page < 0 || page as usize >= num_pages {
                let r = indptr.partition_point(|&x| x as usize <= i) - 1;
                return Err(InvalidProblem::new(
                    format!("kv_page_indices[{i}]"),
                    format!("page id {page} of request {r} is outside 0..{num_pages}"),
                ));
            }
        }
        let mut total_kv: usize = 0;
        for r in 0..batch {
            let pages = self.num_pages(r);
            let last = self.kv_last_page_len[r];
            let ok = if pages == 0 {
                last == 0
            } else {
                last >= 1 && last as usize <= page_size
            };
            if !ok {
                let want = if pages == 0 {
                    "0 (the request has no page)".to_string()
                } else {
                    format!("in 1..={page_size}")
                };
                return Err(InvalidProblem::new(
                    format!("kv_last_page_len[{r}]"),
                    format!("is {last} for request {r} with {pages} pages; it must be {want}"),
                ));
            }
            total_kv += self.kv_len(r, page_size);
        }
        to_i32("kv_last_page_len", total_kv).map_err(|_| {
            InvalidProblem::new(
                "kv_page_indptr",
                format!("the batch holds {total_kv} tokens; token offsets must fit in i32"),
            )
        })?;
        Ok(())
    }

    /// Pages of request `r`.
    pub fn num_pages(&self, r: usize) -> usize {
        (self.kv_page_indptr[r + 1] - self.kv_page_indptr[r]) as usize
    }

    /// The page ids of request `r`, in token order.
    pub fn pages(&self, r: usize) -> &[i32] {
        &self.kv_page_indices[self.kv_page_indptr[r] as usize..self.kv_page_indptr[r + 1] as usize]
    }

    /// Keys of request `r`: `(pages - 1) * page_size + kv_last_page_len`, or 0 with no page.
    pub fn kv_len(&self, r: usize, page_size: usize) -> usize {
        match self.num_pages(r) {
            0 => 0,
            n => (n - 1) * page_size + self.kv_last_page_len[r] as usize,
        }
    }

    /// The key count of every request.
    pub fn kv_lens(&self, page_size: usize) -> Vec<usize> {
        (0..self.batch_size())
            .map(|r| self.kv_len(r, page_size))
            .collect()
    }

    /// Token prefix sums (`batch + 1` entries): the `kv_indptr` of the ragged batch that
    /// [`gather`](super::gather) produces. Call after [`validate`](Self::validate), which checks
    /// that the total fits in i32.
    pub fn kv_indptr(&self, page_size: usize) -> Vec<i32> {
        let mut indptr = Vec::with_capacity(self.batch_size() + 1);
        let mut total = 0usize;
        indptr.push(0);
        for r in 0..self.batch_size() {
            total += self.kv_len(r, page_size);
            indptr.push(total as i32);
        }
        indptr
    }

    /// `(page, slot)` of token `j` of request `r` (`j < kv_len(r)`).
    pub fn locate(&self, r: usize, j: usize, page_size: usize) -> (usize, usize) {
        let page = self.kv_page_indices[self.kv_page_indptr[r] as usize + j / page_size];
        (page as usize, j % page_size)
    }
}

/// `n` as an i32, or an error naming `field`.
fn to_i32(field: &str, n: usize) -> Validation<i32> {
    i32::try_from(n).map_err(|_| InvalidProblem::new(field, format!("{n} does not fit in i32")))
}
