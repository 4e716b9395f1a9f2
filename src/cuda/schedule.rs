//! The prefill work list: which CTA computes which (request, query tile, KV head).
//!
//! Pure host logic (no GPU): one work item per query tile of `CTA_Q` packed rows (query tokens x
//! the query heads of one KV head) per KV head per request, and per KV chunk when the KV range is
//! split (short queries over long KV: chunked prefill, append, decode-like batches), so that the
//! grid fills every SM. Items are ordered by their estimated cost, longest first, so that a
//! skewed batch (or the long last tiles of a causal mask) starts early and the short ones fill
//! the gaps at the end; items of equal cost go head by head, and where the K/V that several
//! query tiles read exceeds L2, the (request, KV head) pairs go in sections of about L2's size,
//! longest first within each, so that the CTAs resident at one time read K/V that stays in L2.

use crate::codegen::{KvCache, TileConfig};
use crate::jit::Arch;
use crate::problem::{AttentionProblem, Mask};

/// One CTA's work: request, query tile, KV head, KV chunk (0 when the KV range is not split),
/// then the request's span: first query token, query length, first key row, key length (what
/// `qo_indptr` and `kv_indptr` hold for it). The kernel reads the two halves as two `int4`s,
/// side by side, so its first loads do not wait for the request index (they read the indptrs
/// after the item before).
pub(crate) type WorkItem = [i32; 8];

/// Keys per chunk below which splitting does not pay (each chunk costs a workspace row and a
/// share of the merge).
const MIN_CHUNK_KEYS: usize = 256;

/// How the KV range of every request is cut: chunks of `chunk` keys, at most `max_chunks` per
/// request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvSplit {
    /// Keys per chunk, a multiple of the KV tile.
    pub chunk: usize,
    /// The largest number of chunks of one request (workspace slots per row).
    pub max_chunks: usize,
}

impl KvSplit {
    /// Chunks of a request with `kv_len` keys (one, possibly empty, when it has none); the merge
    /// kernel counts the same way.
    pub fn chunks(&self, kv_len: usize) -> usize {
        kv_len.div_ceil(self.chunk).max(1)
    }
}

/// How a plan cuts the KV range: as the planner decides, not at all, or in chunks of a given
/// number of keys. The last two are for checking that split and unsplit plans agree, and for
/// tuning; a server leaves it at [`SplitChoice::Planned`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SplitChoice {
    /// The planner's choice (no split when the grid already fills the GPU).
    #[default]
    Planned,
    /// Never split: one CTA covers each work item's whole KV range.
    Unsplit,
    /// Chunks of this many keys, a positive multiple of the kernel's KV tile.
    ChunkKeys(usize),
}

impl SplitChoice {
    /// The split of a problem whose longest request has `max_kv` keys under this choice, given
    /// the planner's own choice `planned` and the kernel's KV tile; an error names a chunk that
    /// is not a positive multiple of the tile.
    pub(crate) fn resolve(
        self,
        planned: Option<KvSplit>,
        max_kv: usize,
        kv_tile: usize,
    ) -> Result<Option<KvSplit>, crate::problem::InvalidProblem> {
        match self {
            SplitChoice::Planned => Ok(planned),
            SplitChoice::Unsplit => Ok(None),
            SplitChoice::ChunkKeys(chunk) => {
                if chunk == 0 || chunk % kv_tile != 0 {
                    return Err(crate::problem::InvalidProblem::new(
                        "split",
                        format!(
                            "chunks of {chunk} keys: must be a positive multiple of the kernel's KV tile ({kv_tile} keys)"
                        ),
                    ));
                }
                Ok(Some(KvSplit {
                    chunk,
                    max_chunks: max_kv.div_ceil(chunk).max(1),
                }))
            }
        }
    }
}

/// Key range `[lo, hi)` the tokens `[tok_lo, tok_hi]` of a request can see under the mask.
fn visible_range(
    mask: &Mask,
    qo_len: usize,
    kv_len: usize,
    tok_lo: usize,
    tok_hi: usize,
) -> (usize, usize) {
    let d = kv_len as i64 - qo_len as i64;
    let clamp = |x: i64| x.clamp(0, kv_len as i64) as usize;
    match mask {
        Mask::None | Mask::Custom(_) => (0, kv_len),
        Mask::Causal => (0, clamp(tok_hi as i64 + d + 1)),
        Mask::SlidingWindow { window_left } => {
            let hi = clamp(tok_hi as i64 + d + 1);
            (clamp(tok_lo as i64 + d - window_left).min(hi), hi)
        }
    }
}

/// Query tiles of each request: `(request, tile, tok_lo, tok_hi)`.
fn query_tiles(problem: &AttentionProblem, cta_q: usize) -> Vec<(usize, usize, usize, usize)> {
    let group = problem.group_size();
    let mut tiles = Vec::new();
    for r in 0..problem.batch.len() {
        let packed = problem.batch.request(r).1 * group;
        for tile in 0..packed.div_ceil(cta_q) {
            let tok_lo = tile * cta_q / group;
            let tok_hi = ((tile + 1) * cta_q).min(packed).saturating_sub(1) / group;
            tiles.push((r, tile, tok_lo, tok_hi));
        }
    }
    tiles
}

/// Fixed cost of one CTA in units of keys streamed: launch, the Q load, the first K/V load's
/// latency and the epilogue (a few microseconds against about 50 ns per key of one KV head at
/// full bandwidth).
pub(crate) const CTA_OVERHEAD_KEYS: usize = 64;
/// Cost of a split in units of keys streamed by one CTA slot: the merge kernel's launch.
const MERGE_OVERHEAD_KEYS: usize = 128;
/// Cost of one chunk's partial result per packed query row of its tile, in keys: the f32 row
/// stored to the workspace and read back by the merge (for a 128-row tile, 64 KB each way:
/// about as long as a slot's share of the bandwidth takes for 128 keys of work).
const PARTIAL_KEYS_PER_ROW: usize = 1;

/// Whether and how to split the KV range for a kernel of `cta_q` packed rows per CTA that fills
/// `slots` CTA slots at once (SMs x resident CTAs per SM), by simulating the block scheduler:
/// items are dealt longest first to the slot that frees first (the work list's order), each
/// costing its visible keys plus a fixed CTA overhead (plus its partial result's round trip when
/// split), and the split with the shortest estimated finish (plus the merge's launch) wins. A
/// single long request splits, many short ones do not, a batch that fills 1.3 waves splits so
/// that the last wave is not mostly idle, and a prefill whose tiles nearly fill one wave is left
/// whole (its partial results would cost more than the idle slots).
pub(crate) fn choose_kv_split(
    problem: &AttentionProblem,
    cta_q: usize,
    kv_tile: usize,
    slots: usize,
) -> Option<KvSplit> {
    best_split(problem, cta_q, kv_tile, slots, WIDEST_KEY_COST).1
}

/// The tile for `problem` over K/V from `kv` on a GPU with `sm_count` SMs of architecture `arch`:
/// the key-split tile when the longest request's packed query rows fit in its rows (decode), else
/// the row tile of [`TileConfig::row_tiles_on`] whose simulated finish (with its best KV split, as
/// [`choose_kv_split`] finds it) is the earliest; a tie keeps the wider tile.
///
/// The narrower row tile computes fewer rows per key at a lower rate per row
/// (0.85 of the wider tile's, measured), so it wins only where the wider tile leaves slots idle or
/// one long tile ends the launch late: short causal prefills (seq 512 and 1024, where the last
/// query tile sees every key) and prefills of fewer rows than the wider tile holds. A wgmma tile
/// with one resident CTA per SM ([`TileConfig::resident_ctas`]: head dim 256's two warpgroups)
/// has half the slots and the SM to itself: its cost per key is halved and divided by
/// [`ONE_CTA_WIDE_TILE_RATE`].
///
/// When `persistent` allows it (an unsplit plan that is not graph-stable, over K/V views the
/// tensor memory accelerator can address: `plan::persistent_plannable`), the warp-specialised
/// tile competes too, without a custom mask (whose kernels of that tile spill, and which no
/// benchmark has timed): at head dim 128 [`TileConfig::PLANNED_WARP_SPECIALIZED`], one CTA of 128
/// rows per SM, unsplit, each key costing half a widest-tile slot's divided by
/// [`WARP_SPECIALIZED_RATE`], and each causal tile paying for the keys of its last 128-key tile
/// that the mask hides; at head dim 256 [`TileConfig::WARP_SPECIALIZED_D256`], also one CTA of
/// 128 rows per SM, at [`WARP_SPECIALIZED_D256_GAIN`] times the one-CTA wide tile's rate; at
/// head dim 64 [`TileConfig::WARP_SPECIALIZED_THREE_CONSUMERS`], one CTA of 192 rows per SM at
/// [`WARP_SPECIALIZED_THREE_CONSUMERS_RATE`], where it computes the kernel
/// ([`TileConfig::computes`]: no logits transform).
pub(crate) fn choose_tile_on(
    problem: &AttentionProblem,
    kv: KvCache,
    sm_count: usize,
    arch: Arch,
    persistent: bool,
) -> TileConfig {
    let dims = problem.head_dims;
    let max_packed_rows =
        problem.batch.lens().iter().map(|l| l.0).max().unwrap_or(0) * problem.group_size();
    let key_split = TileConfig::key_split(dims).for_arch(arch, dims);
    if max_packed_rows <= key_split.cta_q() as usize {
        return key_split;
    }
    let rows = TileConfig::row_tiles_on(dims, problem.qk_accum, kv, arch);
    let widest = rows.iter().map(|t| t.cta_q()).max().unwrap_or(1) as f64;
    let mut best: Option<(u64, TileConfig)> = None;
    for tile in rows {
        // Two CTAs per SM for the mma.sync tiles, as measured (on an H200); a wgmma tile as
        // shared memory allows.
        let resident = if tile.wgmma {
            tile.resident_ctas(dims, arch)
        } else {
            TileConfig::ROW_TILE_CTAS_PER_SM
        };
        let share = tile.cta_q() as f64 / widest;
        let efficiency = if share < 1.0 {
            NARROW_TILE_ROW_EFFICIENCY
        } else if resident < TileConfig::ROW_TILE_CTAS_PER_SM {
            ONE_CTA_WIDE_TILE_RATE
        } else {
            1.0
        };
        let key_cost = key_cost(share, resident, efficiency);
        let (finish, _) = best_split(
            problem,
            tile.cta_q() as usize,
            tile.kv_tile as usize,
            sm_count * resident as usize,
            key_cost,
        );
        if best.is_none_or(|(f, _)| finish < f) {
            best = Some((finish, tile));
        }
    }
    let planned_ws = match (dims.qk(), dims.vo()) {
        (64, 64) => Some((
            TileConfig::WARP_SPECIALIZED_THREE_CONSUMERS,
            WARP_SPECIALIZED_THREE_CONSUMERS_RATE,
        )),
        (128, 128) => Some((TileConfig::PLANNED_WARP_SPECIALIZED, WARP_SPECIALIZED_RATE)),
        (256, 256) => Some((
            TileConfig::WARP_SPECIALIZED_D256,
            ONE_CTA_WIDE_TILE_RATE * WARP_SPECIALIZED_D256_GAIN,
        )),
        _ => None,
    };
    if let Some((ws, rate)) = planned_ws {
        let eligible = persistent
            && !matches!(problem.mask, Mask::Custom(_))
            && ws.computes(problem.mask.kind(), problem.variant.kind())
            && ws.runs_on(arch, dims)
            && ws.supports(kv);
        if eligible {
            let resident = ws.resident_ctas(dims, arch);
            let share = ws.cta_q() as f64 / widest;
            let finish = makespan(
                problem,
                ws.cta_q() as usize,
                ws.kv_tile as usize,
                None,
                sm_count * resident as usize,
                key_cost(share, resident, rate),
            );
            if best.is_none_or(|(f, _)| finish < f) {
                best = Some((finish, ws));
            }
        }
    }
    best.map_or(key_split, |(_, t)| t)
}

/// The simulated cost of one key of a work item on one CTA slot of a tile: the widest tile's
/// ([`WIDEST_KEY_COST`]) scaled by the tile's share of the widest tile's rows and by its resident
/// CTAs per SM against [`TileConfig::ROW_TILE_CTAS_PER_SM`] (a slot of a tile with fewer CTAs per SM
/// has more of the SM), divided by the tile's rate against that model (1 where it holds).
fn key_cost(share: f64, resident: u32, rate: f64) -> u64 {
    let occupancy = resident as f64 / TileConfig::ROW_TILE_CTAS_PER_SM as f64;
    (WIDEST_KEY_COST as f64 * share * occupancy / rate).round() as u64
}

/// The CTA slots among which [`choose_kv_split`] deals the work of a kernel with tile `tile`,
/// `ctas_per_sm` of whose CTAs fit on each of `sm_count` SMs: every resident CTA for the
/// key-split tile (decode: memory-bound, each CTA adds loads in flight), at most
/// [`TileConfig::ROW_TILE_CTAS_PER_SM`] per SM for a row tile. The simulation takes each slot for a
/// processor of its own at a fixed cost per key, which holds for two row-tile CTAs per SM (the
/// measurements behind the costs); past that, co-resident CTAs share the SM's tensor cores, and a
/// split that fills the extra slots adds partial results and a merge for no gain: measured on an
/// H200, the D=64 64-row tile (4 to 5 CTAs per SM) split in two ran seq 512 and 1024 causal at 47
/// and 99 TFLOP/s against 70 and 146 for the 128-row tile unsplit (`attnforge bench --all
/// --filter f16-d64-h32/32-s512-causal --tile w4q1kv64 --split 256` against the default plan).
pub(crate) fn split_slots(tile: TileConfig, sm_count: usize, ctas_per_sm: u32) -> usize {
    let per_sm = if tile.split_keys {
        ctas_per_sm
    } else {
        ctas_per_sm.min(TileConfig::ROW_TILE_CTAS_PER_SM)
    };
    sm_count * per_sm.max(1) as usize
}

/// Rows per second of the narrower row tile (64 rows, `w4q1kv64`) against the wider one (128
/// rows, `w4q2kv64s32`) on long prefills, where neither leaves slots idle. Measured on an H200,
/// f16, D=128, seq 4096: causal 271 vs 322 TFLOP/s (0.84), non-causal 309 vs 343 (0.90); soft-cap
/// and f16 QK 0.94, paged prefill 0.78 (`attnforge bench --filter d128 --tile w4q1kv64` against
/// `--tile w4q2kv64s32`).
const NARROW_TILE_ROW_EFFICIENCY: f64 = 0.85;

/// Rows per second per SM of a widest row tile with one resident CTA per SM against a widest tile
/// of two (the unit of [`WIDEST_KEY_COST`]): head dim 256's two warpgroups on sm_90a (128 rows,
/// one CTA) ran 1.26x to 1.29x the 64-row one-buffer tile (two CTAs) per SM on an H200 (seq 4096
/// causal and non-causal, f16 and bf16), which the simulation rates at
/// [`NARROW_TILE_ROW_EFFICIENCY`] of a two-CTA widest tile: 1.26 x 0.85. With it the planner takes
/// that tile for every shape of the prefill list, seq 512 and up, and it was faster on each of
/// the 27 f16 D=256 shapes against `--tile w4q1kv64b1g` on an H200: +8.8% to +16% at seq 512,
/// +15% to +22% at seq 1024, +21% to +40% from seq 2048 on (`attnforge bench --all --filter
/// f16-d256`, with and without `--tile w4q1kv64b1g`).
const ONE_CTA_WIDE_TILE_RATE: f64 = 1.07;

/// Rows per second per SM of the warp-specialised 128-key tile (`ws2q1kv128`, one CTA of 128
/// rows per SM) against two CTAs of the widest row tile (`w8q1kv64g`) where both fill the GPU:
/// 1.026 to 1.05 non-causal and 1.014 to 1.02 causal at seq 4096 to 32768 on an H200 (bf16,
/// head dim 128, 32 heads), the causal shapes' lower figure being the masked keys of their last
/// 128-key tiles, which the simulation counts apart (`attnforge bench --filter d128 --tile
/// ws2q1kv128` against the same command without `--tile`).
const WARP_SPECIALIZED_RATE: f64 = 1.035;

/// Rows per second per SM of the warp-specialised head-dim-64 tile of three consumer warpgroups
/// (`ws2q1kv128c3`, one CTA of 192 rows per SM) against two CTAs of the widest row tile
/// (`w8q1kv64g`): 1.14 causal at seq 16384 and 1.15 to 1.19 non-causal at 8192 on an H100 (bf16,
/// 32 heads; `attnforge bench --all --filter bf16-d64 --tile ws2q1kv128c3` against the same
/// command without `--tile`).
const WARP_SPECIALIZED_THREE_CONSUMERS_RATE: f64 = 1.14;

/// Rows per second per SM of the warp-specialised head-dim-256 tile (`ws2q1kv64`) against the
/// one-CTA wide tile (`w8q1kv64g`): the lowest of 1.06 to 1.13 measured at bf16, 32 heads, causal
/// seq 4096 and 16384 and non-causal 8192 on an H100 (`attnforge bench --all --filter
/// bf16-d256 --tile ws2q1kv64` against the same command without `--tile`). With it the planner
/// takes that tile on every bf16 head-dim-256 shape of the grid, and each was faster for it, A B
/// B A on an H100 (`python3 bench/ab.py` against the planner before): +2.2% to +4.6% at seq 512,
/// +3.4% to +6.8% at 1024, +4.2% to +13.4% from 2048 on (18 shapes, 32/32 and 32/8 heads).
const WARP_SPECIALIZED_D256_GAIN: f64 = 1.06;

/// The cost of one key for a CTA of the widest row tile, in the simulation's units
/// (thousandths of a key).
const WIDEST_KEY_COST: u64 = 1000;

/// The split with the earliest simulated finish for a tile of `cta_q` rows and `kv_tile` keys
/// whose CTAs cost `key_cost` per key (the widest tile: [`WIDEST_KEY_COST`]), with that finish
/// (including the merge's launch when split).
fn best_split(
    problem: &AttentionProblem,
    cta_q: usize,
    kv_tile: usize,
    slots: usize,
    key_cost: u64,
) -> (u64, Option<KvSplit>) {
    let max_kv = problem.batch.lens().iter().map(|l| l.1).max().unwrap_or(0);
    let min_chunk = MIN_CHUNK_KEYS.next_multiple_of(kv_tile);
    let items = query_tiles(problem, cta_q).len() * problem.num_kv_heads;
    let unsplit = makespan(problem, cta_q, kv_tile, None, slots, key_cost);
    if items == 0 {
        return (unsplit, None);
    }
    let mut best: (u64, Option<KvSplit>) = (unsplit, None);
    // Candidate cuts of the longest request: 2..8 pieces, then a geometric series, plus the
    // cuts that make the longest requests' chunks fill 1..8 whole waves of slots.
    let mut candidates: Vec<usize> = (2..=8).collect();
    let mut pieces = 12;
    while max_kv.div_ceil(pieces) >= min_chunk {
        candidates.push(pieces);
        pieces = pieces * 3 / 2;
    }
    candidates.extend(
        (1..=8)
            .map(|waves| waves * slots / items)
            .filter(|&p| p >= 2),
    );
    candidates.sort_unstable();
    candidates.dedup();
    for pieces in candidates {
        if max_kv.div_ceil(pieces) < min_chunk {
            break;
        }
        let chunk = max_kv.div_ceil(pieces).next_multiple_of(kv_tile);
        let split = KvSplit {
            chunk,
            max_chunks: max_kv.div_ceil(chunk),
        };
        let cost = makespan(problem, cta_q, kv_tile, Some(&split), slots, key_cost)
            + MERGE_OVERHEAD_KEYS as u64 * WIDEST_KEY_COST;
        if cost < best.0 {
            best = (cost, Some(split));
        }
    }
    best
}

/// Estimated finish, in thousandths of a key of the widest tile, of the work list dealt longest
/// first to `slots` slots, each key of an item costing `key_cost`, and an item's keys counted in
/// whole tiles of `kv_tile` (the keys of its last tile that the mask or the request's end hides
/// are computed all the same).
fn makespan(
    problem: &AttentionProblem,
    cta_q: usize,
    kv_tile: usize,
    split: Option<&KvSplit>,
    slots: usize,
    key_cost: u64,
) -> u64 {
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;
    let costs = item_costs(problem, cta_q, split, slots);
    let per_item = (CTA_OVERHEAD_KEYS + split.map_or(0, |_| cta_q * PARTIAL_KEYS_PER_ROW)) as u64
        * WIDEST_KEY_COST;
    let mut free: BinaryHeap<Reverse<u64>> = (0..slots.max(1)).map(|_| Reverse(0)).collect();
    let mut end = 0;
    for (cost, _) in costs {
        let Reverse(t) = free.pop().unwrap_or(Reverse(0));
        let done = t + cost.next_multiple_of(kv_tile.max(1)) as u64 * key_cost + per_item;
        end = end.max(done);
        free.push(Reverse(done));
    }
    end
}

/// K/V bytes that the CTAs resident at one time may read between them and still find in L2
/// (an H200 has 50 MB; the rest holds the Q and O streams).
const L2_SHARE_BYTES: usize = 32 << 20;

/// Every work item with its cost (visible keys), in launch order: longest first within each
/// L2 section ([`l2_sections`]), and equal costs head by head (request, KV head, query tile,
/// chunk), so that the CTAs resident at one time share few heads' K/V.
pub(crate) fn item_costs(
    problem: &AttentionProblem,
    cta_q: usize,
    split: Option<&KvSplit>,
    slots: usize,
) -> Vec<(usize, WorkItem)> {
    let mut items: Vec<(usize, WorkItem)> = Vec::new();
    for (r, tile, tok_lo, tok_hi) in query_tiles(problem, cta_q) {
        let (qo_start, qo_len, kv_start, kv_len) = problem.batch.request(r);
        let span = [qo_start, qo_len, kv_start, kv_len].map(|x| x as i32);
        let (lo, hi) = visible_range(&problem.mask, qo_len, kv_len, tok_lo, tok_hi);
        let chunks = split.map_or(1, |s| s.chunks(kv_len));
        for chunk in 0..chunks {
            let (c_lo, c_hi) = match split {
                Some(s) => (chunk * s.chunk, (chunk + 1) * s.chunk),
                None => (0, kv_len),
            };
            let cost = hi.min(c_hi).saturating_sub(lo.max(c_lo));
            for kv_head in 0..problem.num_kv_heads {
                let [q0, ql, k0, kl] = span;
                let item = [
                    r as i32,
                    tile as i32,
                    kv_head as i32,
                    chunk as i32,
                    q0,
                    ql,
                    k0,
                    kl,
                ];
                items.push((cost, item));
            }
        }
    }
    let section = l2_sections(problem, cta_q, items.len(), slots);
    let heads = problem.num_kv_heads;
    items.sort_by_key(|&(cost, [r, tile, kv_head, chunk, ..])| {
        let pair = r as usize * heads + kv_head as usize;
        (
            section[pair],
            std::cmp::Reverse(cost),
            r,
            kv_head,
            tile,
            chunk,
        )
    });
    items
}

/// The L2 section of every (request, KV head) pair, indexed `request * num_kv_heads + head`.
///
/// Every query tile of a pair reads the pair's K/V. Ordered longest first across the whole
/// batch, the resident CTAs of a causal prefill span every pair (the same tile index of each),
/// and when the K/V read by more than one tile exceeds [`L2_SHARE_BYTES`] each CTA fetches its
/// K/V from DRAM (measured on an H200: a paged prefill of 16 requests read 9.7 GB for 0.6 GB of
/// data; `attnforge bench --suite paged` shows the effect).
/// Consecutive pairs are then cut into sections of about that many bytes, each ordered longest
/// first on its own; at least a wave of CTAs (`slots`) per section, so that each section's long
/// tiles still start early. All zeros (one section) when the reused K/V fits, as in decode,
/// whose pairs have one tile each.
fn l2_sections(problem: &AttentionProblem, cta_q: usize, items: usize, slots: usize) -> Vec<u32> {
    let heads = problem.num_kv_heads;
    let row_bytes =
        (problem.head_dims.qk() + problem.head_dims.vo()) * problem.input_dtype.size_bytes();
    let group = problem.group_size();
    let pair_bytes: Vec<usize> = (0..problem.batch.len())
        .map(|r| problem.batch.request(r).3 * row_bytes)
        .collect();
    let reused: usize = (0..problem.batch.len())
        .filter(|&r| (problem.batch.request(r).1 * group).div_ceil(cta_q.max(1)) > 1)
        .map(|r| pair_bytes[r] * heads)
        .sum();
    let total: usize = pair_bytes.iter().sum::<usize>() * heads;
    let sections = reused.div_ceil(L2_SHARE_BYTES).min(items / slots.max(1));
    let mut out = vec![0u32; problem.batch.len() * heads];
    if sections <= 1 || total == 0 {
        return out;
    }
    let mut before = 0usize;
    for (r, &bytes) in pair_bytes.iter().enumerate() {
        for h in 0..heads {
            out[r * heads + h] = (before as u128 * sections as u128 / total as u128) as u32;
            before += bytes;
        }
    }
    out
}

/// The work items of `problem` with `cta_q` packed rows per CTA (and KV chunks when `split`) in
/// launch order for `slots` resident CTAs: longest first within each L2 section of (request,
/// KV head) pairs, equal costs head by head.
pub(crate) fn prefill_work(
    problem: &AttentionProblem,
    cta_q: usize,
    split: Option<&KvSplit>,
    slots: usize,
) -> Vec<WorkItem> {
    item_costs(problem, cta_q, split, slots)
        .into_iter()
        .map(|(_, w)| w)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::problem::{HeadDims, RaggedBatch, Variant};
    use crate::DType;

    #[test]
    fn split_choice_overrides_the_planner_and_checks_the_chunk() {
        let planned = Some(KvSplit {
            chunk: 512,
            max_chunks: 8,
        });
        assert_eq!(SplitChoice::Planned.resolve(planned, 4096, 64), Ok(planned));
        assert_eq!(SplitChoice::Unsplit.resolve(planned, 4096, 64), Ok(None));
        assert_eq!(
            SplitChoice::ChunkKeys(192).resolve(None, 4096, 64),
            Ok(Some(KvSplit {
                chunk: 192,
                max_chunks: 22
            }))
        );
        for bad in [0, 100] {
            let err = SplitChoice::ChunkKeys(bad)
                .resolve(None, 4096, 64)
                .unwrap_err();
            assert!(err
                .to_string()
                .contains("multiple of the kernel's KV tile (64 keys)"));
        }
    }

    fn problem(lens: &[(usize, usize)], hq: usize, hkv: usize, mask: Mask) -> AttentionProblem {
        AttentionProblem::new(
            RaggedBatch::from_lens(lens).unwrap(),
            hq,
            hkv,
            HeadDims::equal(128).unwrap(),
            DType::F16,
        )
        .with_mask(mask)
    }

    #[test]
    fn equal_costs_go_head_by_head_and_longer_items_first() {
        // Non-causal: every item costs the same; one head's query tiles come before the next
        // head's (+5% at seq 8192 and 16384 against tile by tile on an H200, `attnforge bench
        // --all --filter noncausal`).
        let p = problem(&[(1024, 1024)], 4, 4, Mask::None);
        let work = prefill_work(&p, 128, None, 264);
        let order: Vec<(i32, i32)> = work.iter().map(|w| (w[2], w[1])).collect();
        let head_major: Vec<(i32, i32)> =
            (0..4).flat_map(|h| (0..8).map(move |t| (h, t))).collect();
        assert_eq!(order, head_major);
        // Causal: the last query tile sees the most keys, so each head's last tile leads.
        let p = problem(&[(1024, 1024)], 4, 4, Mask::Causal);
        let work = prefill_work(&p, 128, None, 264);
        let first: Vec<(i32, i32)> = work[..4].iter().map(|w| (w[2], w[1])).collect();
        assert_eq!(first, [(0, 7), (1, 7), (2, 7), (3, 7)]);
    }

    #[test]
    fn kv_reused_beyond_l2_is_ordered_in_sections_and_decode_is_not() {
        // 16 requests of 1024 new tokens over 5120 keys, 32/8 heads: 335 MB of K/V, each pair's
        // read by 32 query tiles. The launch order takes a few requests at a time, longest
        // first within them.
        let p = problem(&[(1024, 5120); 16], 32, 8, Mask::Causal);
        let section = l2_sections(&p, 128, 4096, 264);
        assert_eq!(*section.iter().max().unwrap(), 9);
        assert!(section.windows(2).all(|w| w[0] <= w[1]));
        let work = prefill_work(&p, 128, None, 264);
        let first_section: Vec<i32> = work[..256].iter().map(|w| w[0]).collect();
        assert!(first_section.iter().all(|&r| r <= 1), "{first_section:?}");
        assert_eq!(work[0][1], 31, "the longest tile of the section leads");
        // Decode: one tile per pair, nothing reused: one section, longest first over the batch.
        let mut lens = vec![(1, 512); 63];
        lens.push((1, 16384));
        let d = problem(&lens, 32, 8, Mask::None);
        assert!(l2_sections(&d, 16, 512, 264).iter().all(|&s| s == 0));
        // A prefill whose reused K/V fits in L2 keeps one section.
        let s2048 = problem(&[(2048, 2048)], 32, 32, Mask::Causal);
        assert!(l2_sections(&s2048, 128, 512, 264).iter().all(|&s| s == 0));
    }

    #[test]
    fn every_tile_and_head_appears_once() {
        let p = problem(&[(1, 5), (200, 300), (0, 7), (64, 64)], 8, 2, Mask::None);
        let work = prefill_work(&p, 128, None, 264);
        // Packed rows per request: 4, 800, 0, 256 -> tiles 1, 7, 0, 2; times 2 KV heads.
        assert_eq!(work.len(), (1 + 7 + 2) * 2);
        let mut seen = std::collections::HashSet::new();
        for w in &work {
            assert!(seen.insert(*w), "duplicate {w:?}");
            assert_eq!(w[3], 0);
            // The item carries its request's span, as the indptrs give it.
            let (q0, ql, k0, kl) = p.batch.request(w[0] as usize);
            assert_eq!(w[4..], [q0, ql, k0, kl].map(|x| x as i32), "{w:?}");
        }
        assert!(
            work.iter().all(|w| w[0] != 2),
            "an empty request gets no work"
        );
    }

    #[test]
    fn short_queries_over_long_keys_are_split_and_long_prefills_are_not() {
        let append = problem(&[(17, 4096)], 8, 2, Mask::Causal);
        let split = choose_kv_split(&append, 64, 64, 264).expect("2 CTAs cannot fill 132 SMs");
        assert_eq!(split.chunk % 64, 0);
        assert!(split.chunk >= 256 && split.max_chunks == 4096usize.div_ceil(split.chunk));
        let work = prefill_work(&append, 64, Some(&split), 264);
        // 17 tokens x group 4 = 68 packed rows: 2 query tiles, each over every chunk, 2 KV heads.
        assert_eq!(work.len(), 2 * split.max_chunks * 2);
        let long = problem(&[(4096, 4096)], 32, 8, Mask::Causal);
        assert_eq!(choose_kv_split(&long, 128, 64, 264), None);
        // 8 query tiles x 32 heads = 256 CTAs of 1024 keys in 264 slots: nearly one wave, and
        // splitting would add 2 x 64 KB of partial results per CTA.
        let one_wave = problem(&[(1024, 1024)], 32, 32, Mask::None);
        assert_eq!(choose_kv_split(&one_wave, 128, 64, 264), None);
        let short_kv = problem(&[(1, 200)], 8, 8, Mask::None);
        assert_eq!(
            choose_kv_split(&short_kv, 64, 64, 264),
            None,
            "nothing worth cutting"
        );
    }

    #[test]
    fn balanced_split_cuts_a_long_decode_and_leaves_many_short_ones_alone() {
        let slots = 132 * 3;
        let long = problem(&[(1, 65536)], 32, 8, Mask::None);
        let split = choose_kv_split(&long, 16, 64, slots).expect("8 CTAs for 396 slots");
        assert!(split.max_chunks >= 32, "{split:?}");
        assert!(
            8 * split.max_chunks <= slots,
            "one wave of long chunks: {split:?}"
        );
        assert_eq!(split.chunk % 64, 0);
        let short = problem(&[(1, 512); 256], 32, 8, Mask::None);
        assert_eq!(choose_kv_split(&short, 16, 64, slots), None);
        // 64 x 8 = 512 CTAs are 1.3 waves of 396: a split evens the waves out.
        let batch = problem(&[(1, 4096); 64], 32, 8, Mask::None);
        let split = choose_kv_split(&batch, 16, 64, slots).expect("1.3 waves split");
        let ctas = 64 * 8 * split.max_chunks;
        let waves = ctas as f64 / slots as f64;
        assert!(
            waves.ceil() - waves < 0.35 || waves > 8.0,
            "{split:?}: {waves} waves"
        );
    }

    #[test]
    fn row_tiles_split_for_two_ctas_per_sm_and_decode_for_all_it_holds() {
        let narrow = TileConfig::parse("w4q1kv64").expect("a row tile");
        let decode = TileConfig::key_split(HeadDims::new(64, 64).expect("valid dims"));
        assert_eq!(split_slots(narrow, 132, 5), 264);
        assert_eq!(split_slots(narrow, 132, 1), 132);
        assert_eq!(split_slots(decode, 132, 6), 792);
        // The D=64 64-row tile holds 5 CTAs per SM: counted as 660 slots, a causal seq-512
        // prefill's 256 CTAs looked worth splitting in two (measured 0.67x the 128-row tile).
        let short = problem(&[(512, 512)], 32, 32, Mask::Causal);
        assert!(choose_kv_split(&short, 64, 64, 132 * 5).is_some());
        assert_eq!(
            choose_kv_split(&short, 64, 64, split_slots(narrow, 132, 5)),
            None
        );
    }

    #[test]
    fn a_request_without_keys_keeps_one_chunk() {
        let s = KvSplit {
            chunk: 256,
            max_chunks: 4,
        };
        assert_eq!(
            (s.chunks(0), s.chunks(1), s.chunks(256), s.chunks(257)),
            (1, 1, 1, 2)
        );
    }

    #[test]
    fn causal_orders_longest_tiles_first() {
        let p = problem(&[(1024, 1024)], 4, 4, Mask::Causal);
        let work = prefill_work(&p, 128, None, 264);
        let tiles: Vec<i32> = work.iter().map(|w| w[1]).collect();
        assert_eq!(tiles.first(), Some(&7));
        assert_eq!(tiles.last(), Some(&0));
        assert!(tiles.windows(2).all(|w| w[0] >= w[1]));
    }

    // Head dim 256 over ragged K/V: sm_90a plans its two warpgroups of 64 rows (one CTA per SM)
    // from seq 512 on (measured faster on every f16 shape; see `ONE_CTA_WIDE_TILE_RATE`); sm_80
    // and sm_89 never plan a wgmma tile.
    #[test]
    fn head_dim_256_takes_two_warpgroups_on_sm90a_from_seq_512() {
        let tile = |lens: &[(usize, usize)], hq, hkv, mask, arch| {
            let p = AttentionProblem::new(
                RaggedBatch::from_lens(lens).unwrap(),
                hq,
                hkv,
                HeadDims::equal(256).unwrap(),
                DType::F16,
            )
            .with_mask(mask);
            choose_tile_on(&p, KvCache::Ragged, 132, arch, false).label()
        };
        let sm90 = Arch::Sm90a;
        assert_eq!(
            tile(&[(4096, 4096)], 32, 32, Mask::Causal, sm90),
            "w8q1kv64g"
        );
        assert_eq!(tile(&[(4096, 4096)], 32, 32, Mask::None, sm90), "w8q1kv64g");
        assert_eq!(
            tile(&[(8192, 8192)], 32, 8, Mask::Causal, sm90),
            "w8q1kv64g"
        );
        assert_eq!(tile(&[(2048, 2048)], 32, 32, Mask::None, sm90), "w8q1kv64g");
        assert_eq!(tile(&[(1024, 1024)], 32, 8, Mask::None, sm90), "w8q1kv64g");
        assert_eq!(tile(&[(512, 512)], 32, 32, Mask::Causal, sm90), "w8q1kv64g");
        assert_eq!(tile(&[(512, 512)], 32, 8, Mask::Causal, sm90), "w8q1kv64g");
        for arch in [Arch::Sm80, Arch::Sm89] {
            assert_eq!(
                tile(&[(4096, 4096)], 32, 32, Mask::Causal, arch),
                "w4q1kv64b1"
            );
        }
    }

    #[test]
    fn short_causal_prefills_take_the_narrow_tile_and_long_ones_the_wide() {
        let tile = |lens: &[(usize, usize)], hq, hkv, mask| {
            let t = choose_tile_on(
                &problem(lens, hq, hkv, mask),
                KvCache::Ragged,
                132,
                Arch::Sm80,
                false,
            );
            (t.cta_q(), t.split_keys)
        };
        // The last 128-row tile of a causal seq-512 prefill sees every key while the 128 CTAs
        // fill half the 264 slots: 64-row tiles finish first (H200: 102 vs 77 TFLOP/s).
        assert_eq!(tile(&[(512, 512)], 32, 32, Mask::Causal), (64, false));
        assert_eq!(tile(&[(1024, 1024)], 32, 32, Mask::Causal), (64, false));
        // Enough tiles to fill the slots evenly: the wider tile's higher rate wins.
        assert_eq!(tile(&[(1024, 1024)], 32, 32, Mask::None), (128, false));
        assert_eq!(tile(&[(2048, 2048)], 32, 32, Mask::Causal), (128, false));
        assert_eq!(tile(&[(4096, 4096)], 32, 32, Mask::Causal), (128, false));
        assert_eq!(tile(&[(4096, 4096)], 32, 8, Mask::None), (128, false));
        assert_eq!(tile(&[(1024, 5120); 16], 32, 8, Mask::Causal), (128, false));
        // Decode: the key-split tile.
        assert_eq!(tile(&[(1, 4096); 64], 32, 8, Mask::None), (16, true));
        // A prefill of fewer rows than the wide tile holds.
        assert_eq!(tile(&[(40, 40)], 8, 8, Mask::None), (64, false));
    }

    // The warp-specialised tiles where the planner may take them (an unsplit, not graph-stable
    // plan over addressable K/V). At head dim 128: the long prefills, which it ran 1.5% to 5% faster on the H200,
    // and the short ones whose 128-row tiles leave slots idle, where its persistent CTAs and
    // single wave measured +12% (non-causal s512) and +16% (causal s1024); not causal s2048 or
    // s4096 (-3% to +1.4%), where the masked half of each diagonal 128-key tile costs what the
    // tile gains.
    #[test]
    fn warp_specialized_tile_takes_long_prefills_where_persistent_launches_are_allowed() {
        let tile = |lens: &[(usize, usize)], hkv, mask, dim, arch, persistent| {
            let p = AttentionProblem::new(
                RaggedBatch::from_lens(lens).unwrap(),
                32,
                hkv,
                HeadDims::equal(dim).unwrap(),
                DType::Bf16,
            )
            .with_mask(mask);
            choose_tile_on(&p, KvCache::Ragged, 132, arch, persistent).label()
        };
        // The tile it plans is one the compile matrix builds.
        assert!(
            TileConfig::warp_specialized_tiles().any(|t| t == TileConfig::PLANNED_WARP_SPECIALIZED)
        );
        let sm90 = Arch::Sm90a;
        for (s, hkv, mask) in [
            (16384, 32, Mask::Causal),
            (8192, 8, Mask::Causal),
            (4096, 32, Mask::None),
            (1024, 32, Mask::Causal),
            (512, 32, Mask::None),
        ] {
            assert_eq!(
                tile(&[(s, s)], hkv, mask.clone(), 128, sm90, true),
                "ws2q1kv128"
            );
            assert_ne!(tile(&[(s, s)], hkv, mask, 128, sm90, false), "ws2q1kv128");
        }
        assert_eq!(
            tile(&[(2048, 2048)], 32, Mask::Causal, 128, sm90, true),
            "w8q1kv64g"
        );
        assert_eq!(
            tile(&[(4096, 4096)], 8, Mask::Causal, 128, sm90, true),
            "w8q1kv64g"
        );
        // At head dim 256 its own tile, on every shape of the grid, short ones too (measured
        // faster on each), only on sm_90a.
        for (s, hkv, mask) in [
            (512, 32, Mask::Causal),
            (512, 8, Mask::None),
            (4096, 8, Mask::Causal),
            (16384, 32, Mask::None),
        ] {
            assert_eq!(
                tile(&[(s, s)], hkv, mask.clone(), 256, sm90, true),
                "ws2q1kv64"
            );
            assert_ne!(tile(&[(s, s)], hkv, mask, 256, sm90, false), "ws2q1kv64");
        }
        // At head dim 64 the three-consumer tile from seq 4096 on (measured faster there), the
        // row tile at 2048 (measured slower); none with a logits transform.
        for (s, hkv, mask) in [
            (4096, 32, Mask::Causal),
            (16384, 8, Mask::Causal),
            (8192, 32, Mask::None),
        ] {
            assert_eq!(
                tile(&[(s, s)], hkv, mask.clone(), 64, sm90, true),
                "ws2q1kv128c3"
            );
            assert_ne!(tile(&[(s, s)], hkv, mask, 64, sm90, false), "ws2q1kv128c3");
        }
        assert_eq!(
            tile(&[(2048, 2048)], 32, Mask::Causal, 64, sm90, true),
            "w8q1kv64g"
        );
        let softcap = AttentionProblem::new(
            RaggedBatch::from_lens(&[(8192, 8192)]).unwrap(),
            32,
            32,
            HeadDims::equal(64).unwrap(),
            DType::Bf16,
        )
        .with_variant(Variant::SoftCap { cap: 30.0 });
        assert_ne!(
            choose_tile_on(&softcap, KvCache::Ragged, 132, sm90, true).label(),
            "ws2q1kv128c3"
        );
        assert_eq!(
            tile(&[(8192, 8192)], 32, Mask::None, 128, Arch::Sm80, true),
            "w4q2kv64"
        );
    }
}
