//! [`append_paged_kv`]: write the new tokens' K and V of a ragged batch into their pages, the step
//! every server runs before attention.
//!
//! The page table passed in describes the cache *after* the append (as FlashInfer's
//! `append_paged_kv_cache` takes it): the server first allocates pages and raises
//! `kv_last_page_len`, then appends, then runs attention with the same table. Request `r`'s
//! `n_r = append_indptr[r+1] - append_indptr[r]` new tokens are its last `n_r` positions,
//! `kv_len_r - n_r .. kv_len_r`; the tokens before them are left as they are. A request whose
//! pages cannot hold its new tokens (`n_r > kv_len_r`) is an error naming it, as is a write that
//! would land on a slot that another token of the batch (an existing token, or a new token of
//! another request, e.g. through a page listed twice) also occupies.

use super::fp8::{quantize_value, KvScales};
use super::layout::{PagedKv, PagedKvLayout, PagedKvMut};
use super::table::PageTable;
use crate::dtype::fp8::{Fp8Format, Fp8Tensor};
use crate::dtype::DType;
use crate::problem::{InvalidProblem, TensorView, Validation};
use crate::tensor::HostTensor;
use rayon::prelude::*;
use std::collections::{HashMap, HashSet};

/// Writes `k_new` (`[total_new, num_kv_heads, head_dim_qk]`, contiguous) and `v_new`
/// (`[total_new, num_kv_heads, head_dim_vo]`) into the cache: request `r`'s new tokens
/// `append_indptr[r] .. append_indptr[r+1]` go to its last positions (see the module docs).
/// Everything is validated before the first write; on error the cache is unchanged.
pub fn append_paged_kv(
    layout: &PagedKvLayout,
    table: &PageTable,
    append_indptr: &[i32],
    k_new: &HostTensor,
    v_new: &HostTensor,
    mut cache: PagedKvMut<'_>,
) -> Validation {
    layout.validate_buffers(cache.as_ref())?;
    validate_append(
        layout,
        table,
        append_indptr,
        (k_new.dtype(), k_new.len()),
        (v_new.dtype(), v_new.len()),
    )?;

    let writes = Writes {
        layout,
        table,
        append_indptr,
    };
    match &mut cache {
        PagedKvMut::Separate { k, v } => {
            writes.copy(k_new, k, true)?;
            writes.copy(v_new, v, false)
        }
        PagedKvMut::Combined(kv) => {
            writes.copy(k_new, kv, true)?;
            writes.copy(v_new, kv, false)
        }
    }
}

/// [`append_paged_kv`] into an fp8 cache: the new K and V (of the layout's dtype) are quantised
/// on the way in, element `x` of KV head `h` stored as `encode(x / scale[h])` (see
/// [`quantize_value`]). Validates everything [`append_paged_kv`] does, the scales, and that
/// every new value is finite (a non-finite value is an error naming its tensor, token, head and
/// element) before the first write; on error the cache is unchanged.
pub fn append_paged_kv_fp8(
    layout: &PagedKvLayout,
    table: &PageTable,
    append_indptr: &[i32],
    (k_new, v_new): (&HostTensor, &HostTensor),
    mut cache: PagedKvMut<'_, Fp8Tensor>,
    scales: &KvScales,
) -> Validation {
    let format = match cache.as_ref() {
        PagedKv::Separate { k, .. } | PagedKv::Combined(k) => k.format,
    };
    layout.validate_buffers_of(cache.as_ref(), format.name())?;
    scales.validate(layout.num_kv_heads, format, layout.dtype)?;
    validate_append(
        layout,
        table,
        append_indptr,
        (k_new.dtype(), k_new.len()),
        (v_new.dtype(), v_new.len()),
    )?;
    let (h, dqk, dvo) = (
        layout.num_kv_heads,
        layout.head_dims.qk(),
        layout.head_dims.vo(),
    );
    let total_new = *append_indptr.last().unwrap_or(&0) as usize;
    // The new rows quantised in their own order (K checked before V, nothing written before both
    // pass), then scattered into the pages.
    let rows = |name, values, dim, is_k| NewRows {
        name,
        values,
        tokens: total_new,
        heads: h,
        dim,
        is_k,
    };
    let k_codes = quantize_new_rows(rows("k_new", k_new, dqk, true), format, scales)?;
    let v_codes = quantize_new_rows(rows("v_new", v_new, dvo, false), format, scales)?;
    let writes = Writes {
        layout,
        table,
        append_indptr,
    };
    match &mut cache {
        PagedKvMut::Separate { k, v } => {
            writes.copy_with(&k_codes, &mut k.codes, true, |c, _| c);
            writes.copy_with(&v_codes, &mut v.codes, false, |c, _| c);
        }
        PagedKvMut::Combined(kv) => {
            writes.copy_with(&k_codes, &mut kv.codes, true, |c, _| c);
            writes.copy_with(&v_codes, &mut kv.codes, false, |c, _| c);
        }
    }
    Ok(())
}

/// The new rows of one tensor for [`quantize_new_rows`]: its first `tokens` tokens of `heads`
/// rows of `dim` elements, named `name` in errors, K's or V's (which scale applies).
struct NewRows<'a> {
    name: &'static str,
    values: &'a HostTensor,
    tokens: usize,
    heads: usize,
    dim: usize,
    is_k: bool,
}

/// The codes of `new`'s rows in `format`, each quantised with its KV head's scale; an error
/// naming the tensor, token, head and element of the first non-finite value. In parallel: a
/// benchmark's cache is gigabytes.
fn quantize_new_rows(
    new: NewRows<'_>,
    format: Fp8Format,
    scales: &KvScales,
) -> Result<Vec<u8>, InvalidProblem> {
    let (heads, dim) = (new.heads, new.dim);
    let values = new.values.to_f32_vec();
    let values = &values[..new.tokens * heads * dim];
    if let Some(i) = values.par_iter().position_first(|x| !x.is_finite()) {
        return Err(InvalidProblem::new(
            new.name,
            format!(
                "token {} head {} element {} is {}; an fp8 cache takes finite values only",
                i / (heads * dim),
                i / dim % heads,
                i % dim,
                values[i]
            ),
        ));
    }
    Ok(values
        .par_iter()
        .enumerate()
        .map(|(i, &x)| quantize_value(format, x, scales.scale(new.is_k, i / dim % heads)))
        .collect())
}

/// Everything [`append_paged_kv`] checks before its first write except the cache buffers, with
/// the new K and V rows given as (dtype, elements): the layout, the table against it,
/// `append_indptr` (and that each request's new tokens fit in its pages), the new rows' dtype and
/// size, and that no two tokens of the batch share a slot. The GPU's append runs the same checks.
pub fn validate_append(
    layout: &PagedKvLayout,
    table: &PageTable,
    append_indptr: &[i32],
    k_new: (DType, usize),
    v_new: (DType, usize),
) -> Validation {
    layout.validate()?;
    table.validate(layout.page_size, layout.num_pages)?;
    validate_append_indptr(table, append_indptr, layout.page_size)?;
    let total_new = *append_indptr.last().unwrap_or(&0) as usize;
    let (h, dqk, dvo) = (
        layout.num_kv_heads,
        layout.head_dims.qk(),
        layout.head_dims.vo(),
    );
    for (name, (dtype, len), dim) in [("k_new", k_new, dqk), ("v_new", v_new, dvo)] {
        if dtype != layout.dtype {
            return Err(InvalidProblem::new(
                name,
                format!(
                    "has dtype {dtype} but the cache's dtype is {}",
                    layout.dtype
                ),
            ));
        }
        TensorView::contiguous(h, dim).validate(name, total_new, h, dim, len)?;
    }
    check_no_overlap(layout, table, append_indptr)
}

/// Checks `append_indptr` (`batch + 1` entries from 0, never decreasing) and that each request's
/// new tokens fit in its pages.
fn validate_append_indptr(
    table: &PageTable,
    append_indptr: &[i32],
    page_size: usize,
) -> Validation {
    let batch = table.batch_size();
    if append_indptr.len() != batch + 1 {
        return Err(InvalidProblem::new(
            "append_indptr",
            format!(
                "has {} entries; the page table has {batch} requests (needs batch + 1)",
                append_indptr.len()
            ),
        ));
    }
    if append_indptr[0] != 0 {
        return Err(InvalidProblem::new(
            "append_indptr[0]",
            format!("is {}; it must be 0", append_indptr[0]),
        ));
    }
    for r in 0..batch {
        let (start, end) = (append_indptr[r], append_indptr[r + 1]);
        if end < start {
            return Err(InvalidProblem::new(
                format!("append_indptr[{}]", r + 1),
                format!("{end} is less than append_indptr[{r}] = {start} (request {r}); indptr must not decrease"),
            ));
        }
        let (n, kv_len) = ((end - start) as usize, table.kv_len(r, page_size));
        if n > kv_len {
            return Err(InvalidProblem::new(
                format!("append_indptr[{}]", r + 1),
                format!(
                    "request {r} appends {n} tokens but its {} pages hold {kv_len}; allocate its pages and set kv_last_page_len to cover the new tokens first",
                    table.num_pages(r)
                ),
            ));
        }
    }
    Ok(())
}

/// Rejects a batch in which a new token's slot is also occupied by any other token of the batch
/// (a new token of another request, or an existing token of any request): the write would
/// corrupt it, or two writes would race on a GPU.
fn check_no_overlap(
    layout: &PagedKvLayout,
    table: &PageTable,
    append_indptr: &[i32],
) -> Validation {
    let ps = layout.page_size;
    // Every slot that receives a new token, and who writes it.
    let mut writer: HashMap<(usize, usize), (usize, usize)> = HashMap::new();
    for r in 0..table.batch_size() {
        let kv_len = table.kv_len(r, ps);
        let n = (append_indptr[r + 1] - append_indptr[r]) as usize;
        for j in kv_len - n..kv_len {
            let at = table.locate(r, j, ps);
            if let Some((r2, j2)) = writer.insert(at, (r, j)) {
                return Err(overlap(at, (r, j), (r2, j2), "also receives new token"));
            }
        }
    }
    // Every token of every request that lives in a written page must be the writer itself.
    let written_pages: HashSet<usize> = writer.keys().map(|&(page, _)| page).collect();
    for r in 0..table.batch_size() {
        let kv_len = table.kv_len(r, ps);
        for (i, &page) in table.pages(r).iter().enumerate() {
            if !written_pages.contains(&(page as usize)) {
                continue;
            }
            for j in i * ps..((i + 1) * ps).min(kv_len) {
                let at = table.locate(r, j, ps);
                match writer.get(&at) {
                    Some(&w) if w != (r, j) => {
                        return Err(overlap(at, w, (r, j), "also holds token"));
                    }
                    _ => {}
                }
            }
        }
    }
    Ok(())
}

fn overlap(
    (page, slot): (usize, usize),
    (r, j): (usize, usize),
    (r2, j2): (usize, usize),
    what: &str,
) -> InvalidProblem {
    InvalidProblem::new(
        "kv_page_indices",
        format!("page {page} slot {slot} receives new token {j} of request {r} but {what} {j2} of request {r2}"),
    )
}

/// The validated destinations of one append.
struct Writes<'a> {
    layout: &'a PagedKvLayout,
    table: &'a PageTable,
    append_indptr: &'a [i32],
}

impl Writes<'_> {
    /// Copies the new K (`is_k`) or V rows from `src` into `dst`.
    fn copy(&self, src: &HostTensor, dst: &mut HostTensor, is_k: bool) -> Validation {
        match (src, dst) {
            (HostTensor::F16(s), HostTensor::F16(d)) => self.copy_typed(s, d, is_k),
            (HostTensor::Bf16(s), HostTensor::Bf16(d)) => self.copy_typed(s, d, is_k),
            (HostTensor::F32(s), HostTensor::F32(d)) => self.copy_typed(s, d, is_k),
            // The dtypes were checked against the layout's; kept as an error, not a panic, in
            // case those checks ever change.
            (s, d) => {
                return Err(InvalidProblem::new(
                    "kv_cache",
                    format!(
                        "has dtype {} but the new tokens are {}",
                        d.dtype(),
                        s.dtype()
                    ),
                ))
            }
        }
        Ok(())
    }

    fn copy_typed<T: Copy>(&self, src: &[T], dst: &mut [T], is_k: bool) {
        self.copy_with(src, dst, is_k, |x, _| x);
    }

    /// Writes `convert(x, kv_head)` of every new K (`is_k`) or V element `x` of `src` to its
    /// place in `dst`.
    fn copy_with<S: Copy, D>(
        &self,
        src: &[S],
        dst: &mut [D],
        is_k: bool,
        convert: impl Fn(S, usize) -> D,
    ) {
        let l = self.layout;
        let ps = l.page_size;
        let dim = if is_k {
            l.head_dims.qk()
        } else {
            l.head_dims.vo()
        };
        for r in 0..self.table.batch_size() {
            let kv_len = self.table.kv_len(r, ps);
            let (start, end) = (
                self.append_indptr[r] as usize,
                self.append_indptr[r + 1] as usize,
            );
            let first = kv_len - (end - start);
            for (t, token) in (start..end).enumerate() {
                let (page, slot) = self.table.locate(r, first + t, ps);
                for h in 0..l.num_kv_heads {
                    let to = if is_k {
                        l.k_index(page, slot, h, 0)
                    } else {
                        l.v_index(page, slot, h, 0)
                    };
                    let from = (token * l.num_kv_heads + h) * dim;
                    for (d, &x) in dst[to..to + dim].iter_mut().zip(&src[from..from + dim]) {
                        *d = convert(x, h);
                    }
                }
            }
        }
    }
}
