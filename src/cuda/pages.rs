//! How the kernels address a paged cache's pages: the page table they read, the page size and
//! the page strides.
//!
//! The kernels (prefill, decode, append) find key `j`'s page and slot by shift and mask, so a
//! page size that is a power of two is used as it is. A cache with another page size (5, 12...)
//! is addressed as pages of one token: token `j` of page `p`, slot `s` is "page"
//! `p * ratio + s` of a page stride equal to the token stride (`ratio` = page stride / token
//! stride, the same for K and V in every layout a [`PagedKvLayout`] describes), so every key
//! lands on the same address. The table the kernels read then holds one id per token (4 bytes
//! per token instead of per page); the kernels and their code are the same.

use super::paged::cache_strides;
use crate::paged::{PageTable, PagedKvLayout};
use crate::Error;

/// The table, page size and page strides (elements) the kernels are given for a cache.
#[derive(Clone, Debug)]
pub(crate) struct KernelPages {
    /// The page table as the kernels read it.
    pub table: PageTable,
    /// A power of two.
    pub page_size: usize,
    /// Elements between the kernels' pages of K.
    pub k_page_stride: i64,
    /// Elements between the kernels' pages of V.
    pub v_page_stride: i64,
}

impl KernelPages {
    /// The kernels' view of `table` (validated against `layout`) over a cache laid out as
    /// `layout`.
    pub fn new(layout: &PagedKvLayout, table: &PageTable) -> Result<KernelPages, Error> {
        let (_, k_page, k_token, _) = cache_strides(layout, true);
        let (_, v_page, v_token, _) = cache_strides(layout, false);
        let ps = layout.page_size;
        if ps.is_power_of_two() {
            return Ok(KernelPages {
                table: table.clone(),
                page_size: ps,
                k_page_stride: k_page,
                v_page_stride: v_page,
            });
        }
        let ratio = k_page / k_token;
        let unsupported = |what: String| Error::Unsupported {
            backend: "cuda",
            what,
            supported: "page sizes that are powers of two, or caches of at most 2^31 token slots"
                .into(),
        };
        if ratio * k_token != k_page || ratio * v_token != v_page {
            return Err(unsupported(format!(
                "page size {ps} with page strides ({k_page}, {v_page}) that are not whole \
                 multiples of the token strides ({k_token}, {v_token})"
            )));
        }
        let slots = (layout.num_pages as u64) * ratio as u64;
        if slots > i32::MAX as u64 + 1 {
            return Err(unsupported(format!(
                "page size {ps} over {} pages ({slots} token slots)",
                layout.num_pages
            )));
        }
        let mut unit = PageTable {
            kv_page_indptr: Vec::with_capacity(table.kv_page_indptr.len()),
            kv_page_indices: Vec::new(),
            kv_last_page_len: Vec::with_capacity(table.batch_size()),
        };
        unit.kv_page_indptr.push(0);
        for r in 0..table.batch_size() {
            let first = table.kv_page_indptr[r] as usize;
            let kv_len = table.kv_len(r, ps);
            unit.kv_page_indices.extend((0..kv_len).map(|j| {
                let page = table.kv_page_indices[first + j / ps] as i64;
                (page * ratio + (j % ps) as i64) as i32
            }));
            unit.kv_page_indptr.push(unit.kv_page_indices.len() as i32);
            unit.kv_last_page_len.push(i32::from(kv_len > 0));
        }
        Ok(KernelPages {
            table: unit,
            page_size: 1,
            k_page_stride: k_token,
            v_page_stride: v_token,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::paged::{KvOrder, KvStorage};
    use crate::{DType, HeadDims};

    fn layout(page_size: usize, order: KvOrder, storage: KvStorage) -> PagedKvLayout {
        PagedKvLayout {
            num_pages: 7,
            page_size,
            num_kv_heads: 3,
            head_dims: HeadDims::equal(64).expect("head dim 64"),
            order,
            storage,
            dtype: DType::F16,
        }
    }

    // Every key of every request lands where the layout puts it, for page sizes that are not
    // powers of two, in every order and storage; powers of two keep their table.
    #[test]
    fn one_token_pages_address_every_key_where_the_layout_puts_it() {
        let lens = [0usize, 1, 5, 12, 23];
        for ps in [3usize, 5, 12, 16] {
            for order in [KvOrder::Nhd, KvOrder::Hnd] {
                for storage in [KvStorage::Separate, KvStorage::Combined] {
                    let l = layout(ps, order, storage);
                    let ids: Vec<i32> = (0..7).rev().collect();
                    let table = PageTable::from_kv_lens(&lens[..4], ps, &ids).expect("table");
                    table.validate(ps, l.num_pages).expect("valid");
                    let kp = KernelPages::new(&l, &table).expect("kernel pages");
                    assert!(kp.page_size.is_power_of_two());
                    kp.table
                        .validate(kp.page_size, usize::MAX)
                        .expect("a valid table");
                    if ps.is_power_of_two() {
                        assert_eq!(kp.table, table);
                        continue;
                    }
                    let (k0, _, k_tok, k_head) = cache_strides(&l, true);
                    let (v0, _, v_tok, _) = cache_strides(&l, false);
                    for r in 0..table.batch_size() {
                        assert_eq!(kp.table.kv_len(r, 1), table.kv_len(r, ps));
                        for j in 0..table.kv_len(r, ps) {
                            let page =
                                table.kv_page_indices[table.kv_page_indptr[r] as usize + j / ps];
                            let unit =
                                kp.table.kv_page_indices[kp.table.kv_page_indptr[r] as usize + j];
                            for head in 0..3 {
                                let want_k = l.k_index(page as usize, j % ps, head, 0);
                                let got_k = k0 as i64
                                    + unit as i64 * kp.k_page_stride
                                    + head as i64 * k_head;
                                assert_eq!(
                                    got_k, want_k as i64,
                                    "K ps {ps} {order:?} {storage:?} r {r} j {j}"
                                );
                                let want_v = l.v_index(page as usize, j % ps, head, 0);
                                let v_head = cache_strides(&l, false).3;
                                let got_v = v0 as i64
                                    + unit as i64 * kp.v_page_stride
                                    + head as i64 * v_head;
                                assert_eq!(got_v, want_v as i64, "V ps {ps} {order:?} {storage:?}");
                                assert_eq!(kp.k_page_stride, k_tok);
                                assert_eq!(kp.v_page_stride, v_tok);
                            }
                        }
                    }
                }
            }
        }
    }

    // A cache too large for one-token ids is refused by name, not wrapped.
    #[test]
    fn too_many_token_slots_is_unsupported() {
        let l = PagedKvLayout {
            num_pages: 1 << 28,
            ..layout(12, KvOrder::Nhd, KvStorage::Combined)
        };
        let table = PageTable::from_kv_lens(&[3], 12, &[0]).expect("table");
        let err = KernelPages::new(&l, &table).expect_err("2^31 slots");
        assert!(err.to_string().contains("page size 12"), "{err}");
    }
}
