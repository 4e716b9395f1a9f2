//! What the paged cache's properties share (plain pages and fp8 codes): the page geometry drawn
//! beside a grid point, the layout and shuffled page table (with spare pages) holding a batch's
//! K/V, views of one or two buffers as a cache, and the check that the reference and the CPU
//! backend over a cache equal them over the contiguous K/V the cache holds.
#![allow(dead_code)] // `tests/cpu_backend.rs` shares `support` and uses none of this.

use super::{point_spec, Axes, PointSpec};
use attnforge::compare::{compare, Tolerance};
use attnforge::cpu;
use attnforge::paged::{
    gather, gather_dequantized, KvOrder, KvStorage, PageTable, PagedAttention, PagedCache, PagedKv,
    PagedKvLayout, PagedKvMut,
};
use attnforge::problem::AttentionProblem;
use attnforge::reference;
use attnforge::tensor::HostTensor;
use attnforge::testing::random_inputs;
use attnforge::testing::rng::SplitMix64;
use proptest::prelude::*;

/// Pages in the cache beyond those the table uses (never referenced; NaN).
pub const SPARE_PAGES: usize = 3;

/// A random grid point and the page geometry of its cache (plain data so proptest can shrink
/// and print it).
#[derive(Clone, Debug)]
pub struct PageSpec {
    pub point: PointSpec,
    pub page_size: usize,
    pub order: KvOrder,
    pub storage: KvStorage,
}

/// Random points over `axes` in pages of `page_sizes`, either order, either storage (combined
/// only where the head dims are equal: it needs them so).
pub fn page_spec(
    axes: Axes,
    page_sizes: impl Strategy<Value = usize>,
) -> impl Strategy<Value = PageSpec> {
    (
        point_spec(axes),
        page_sizes,
        prop_oneof![Just(KvOrder::Nhd), Just(KvOrder::Hnd)],
        prop_oneof![Just(KvStorage::Separate), Just(KvStorage::Combined)],
    )
        .prop_map(|(point, page_size, order, storage)| PageSpec {
            storage: if point.head_dims.qk() == point.head_dims.vo() {
                storage
            } else {
                KvStorage::Separate
            },
            point,
            page_size,
            order,
        })
}

/// A case built from a [`PageSpec`]: the contiguous problem and its inputs, and the layout and
/// table of a cache holding its K/V.
pub struct PagedCase {
    pub contiguous: AttentionProblem,
    pub q: HostTensor,
    pub k: HostTensor,
    pub v: HostTensor,
    pub layout: PagedKvLayout,
    pub table: PageTable,
}

impl PageSpec {
    /// The case (the cache buffers are the property's to fill).
    pub fn case(&self) -> PagedCase {
        let pt = &self.point;
        let contiguous = pt.point().problem(pt.seed);
        let (q, k, v) = random_inputs(&contiguous, pt.seed);
        let kv_lens: Vec<usize> = pt.lens.iter().map(|&(_, kv)| kv).collect();
        let shape = PagedKvLayout {
            num_pages: 0,
            page_size: self.page_size,
            num_kv_heads: pt.kv_heads,
            head_dims: pt.head_dims,
            order: self.order,
            storage: self.storage,
            dtype: pt.config.dtype,
        };
        let (layout, table) = paged_setup(&kv_lens, shape, pt.seed);
        PagedCase {
            contiguous,
            q,
            k,
            v,
            layout,
            table,
        }
    }
}

/// Page ids `0..n` in a random order.
fn shuffled_pages(n: usize, rng: &mut SplitMix64) -> Vec<i32> {
    let mut ids: Vec<i32> = (0..n as i32).collect();
    for i in (1..n).rev() {
        ids.swap(i, rng.range_usize(0, i));
    }
    ids
}

/// `shape` with `num_pages` set to what `kv_lens` need plus spare pages, and a shuffled table.
pub fn paged_setup(
    kv_lens: &[usize],
    shape: PagedKvLayout,
    seed: u64,
) -> (PagedKvLayout, PageTable) {
    let used: usize = kv_lens.iter().map(|n| n.div_ceil(shape.page_size)).sum();
    let num_pages = used + SPARE_PAGES;
    let ids = shuffled_pages(num_pages, &mut SplitMix64::with_salt(seed, 0x9a6e));
    let table = PageTable::from_kv_lens(kv_lens, shape.page_size, &ids).unwrap();
    (PagedKvLayout { num_pages, ..shape }, table)
}

/// One buffer per storage half of `layout` (one for combined storage, else K then V), made by
/// `make(elements)`.
pub fn storage_buffers<T>(layout: &PagedKvLayout, make: impl Fn(usize) -> T) -> Vec<T> {
    match layout.storage {
        KvStorage::Separate => vec![make(layout.k_buffer_len()), make(layout.v_buffer_len())],
        KvStorage::Combined => vec![make(layout.k_buffer_len())],
    }
}

/// The cache over one (combined) or two (separate) buffers.
pub fn cache_ref<T>(bufs: &[T]) -> PagedKv<'_, T> {
    match bufs {
        [kv] => PagedKv::Combined(kv),
        [k, v] => PagedKv::Separate { k, v },
        _ => panic!("one or two buffers"),
    }
}

/// [`cache_ref`], writable.
pub fn cache_mut<T>(bufs: &mut [T]) -> PagedKvMut<'_, T> {
    match bufs {
        [kv] => PagedKvMut::Combined(kv),
        [k, v] => PagedKvMut::Separate { k, v },
        _ => panic!("one or two buffers"),
    }
}

/// The K and V a cache of either kind holds, contiguous (dequantised for fp8 codes).
pub fn gather_cache(
    layout: &PagedKvLayout,
    table: &PageTable,
    cache: PagedCache<'_>,
) -> Result<(HostTensor, HostTensor), String> {
    match cache {
        PagedCache::Plain(pages) => gather(layout, table, pages),
        PagedCache::Fp8(fp8) => gather_dequantized(layout, table, fp8),
    }
    .map_err(|e| format!("gather: {e}"))
}

/// Checks `cache`, holding the contiguous `k`, `v` of `case` (for fp8 codes, their dequantised
/// values): gathering gives them back, the paged reference equals the reference on them exactly,
/// the paged CPU backend equals the ragged CPU backend on them exactly and the reference within
/// the problem's tolerance. `Err` describes a failure.
pub fn check_cache<'a>(
    case: &PagedCase,
    cache: impl Into<PagedCache<'a>>,
    (k, v): (&HostTensor, &HostTensor),
) -> Result<(), String> {
    let cache = cache.into();
    let (gk, gv) = gather_cache(&case.layout, &case.table, cache)?;
    if (&gk, &gv) != (k, v) {
        return Err("gathered K/V differ from the K/V the cache holds".into());
    }
    let contiguous = &case.contiguous;
    let q = &case.q;
    let paged = PagedAttention::new(contiguous.clone(), case.layout, case.table.clone())
        .map_err(|e| format!("PagedAttention::new: {e}"))?;
    let want = reference::attention(contiguous, q, k, v).map_err(|e| format!("ref: {e}"))?;
    let got_ref =
        reference::paged_attention(&paged, q, cache).map_err(|e| format!("paged ref: {e}"))?;
    if got_ref != want {
        return Err("paged reference differs from the contiguous reference on the same K/V".into());
    }
    let got_cpu = cpu::paged_attention(&paged, q, cache).map_err(|e| format!("paged cpu: {e}"))?;
    let ragged_cpu = cpu::attention(paged.problem(), q, k, v).map_err(|e| format!("{e}"))?;
    if got_cpu != ragged_cpu {
        return Err("paged CPU differs from ragged CPU on the same K/V".into());
    }
    let cmp = compare(&got_cpu, &want);
    let tol = Tolerance::for_problem(contiguous);
    if !cmp.passes(&tol) {
        return Err(format!("paged CPU vs reference: {cmp} (tolerance {tol:?})"));
    }
    Ok(())
}
