//! CTA tile configurations and the rule that picks one per problem.
//!
//! Tile choices are made here, once, in Rust; the CUDA templates only receive the numbers. Each
//! configuration is checked by `attnforge compile` (registers, no spills) for every kernel.

use crate::problem::HeadDims;

/// How one CTA of the prefill kernel is tiled.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub struct TileConfig {
    /// Warps per CTA.
    pub num_warps: u32,
    /// m16 query tiles per warp.
    pub mma_q: u32,
    /// Keys per KV tile: loaded together, one barrier per tile.
    pub kv_tile: u32,
    /// Keys computed at a time within a tile (sets the S registers); divides `kv_tile`.
    pub kv_sub: u32,
}

/// Bytes of one 16-byte shared-memory chunk (8 elements of 16 bits).
const CHUNK_BYTES: u32 = 16;
/// Elements per chunk.
const CHUNK_ELEMS: u32 = 8;

impl TileConfig {
    /// Packed query rows per CTA.
    pub fn cta_q(self) -> u32 {
        self.num_warps * self.mma_q * 16
    }

    /// Threads per CTA.
    pub fn threads(self) -> u32 {
        self.num_warps * 32
    }

    /// Dynamic shared memory: the Q tile and two K and V tiles each.
    pub fn smem_bytes(self, dims: HeadDims) -> u32 {
        let qk_row = dims.qk() as u32 / CHUNK_ELEMS * CHUNK_BYTES;
        let vo_row = dims.vo() as u32 / CHUNK_ELEMS * CHUNK_BYTES;
        self.cta_q() * qk_row + 2 * self.kv_tile * (qk_row + vo_row)
    }

    /// Name fragment, e.g. `w4q2kv64` or, when computed in sub-tiles, `w4q2kv64s32`.
    pub fn label(self) -> String {
        let sub = if self.kv_sub == self.kv_tile {
            String::new()
        } else {
            format!("s{}", self.kv_sub)
        };
        format!("w{}q{}kv{}{sub}", self.num_warps, self.mma_q, self.kv_tile)
    }

    /// Parses a label as [`label`](Self::label) writes it (`w4q2kv64`, `w4q2kv64s32`).
    pub fn parse(s: &str) -> Option<TileConfig> {
        let rest = s.strip_prefix('w')?;
        let (w, rest) = rest.split_once('q')?;
        let (q, rest) = rest.split_once("kv")?;
        let (kv, sub) = rest.split_once('s').unwrap_or((rest, rest));
        let t = TileConfig {
            num_warps: w.parse().ok()?,
            mma_q: q.parse().ok()?,
            kv_tile: kv.parse().ok()?,
            kv_sub: sub.parse().ok()?,
        };
        let valid = (1..=8).contains(&t.num_warps)
            && (1..=4).contains(&t.mma_q)
            && t.kv_sub % 16 == 0
            && t.kv_sub > 0
            && t.kv_tile % t.kv_sub == 0;
        valid.then_some(t)
    }

    /// Every configuration the planner can pick for a kernel with these head dims (the compile
    /// matrix covers them all), widest first; chosen by the tile sweeps on the H200 recorded in
    /// `docs/perf-notes.md`.
    pub fn candidates(dims: HeadDims) -> Vec<TileConfig> {
        let tile = |mma_q, kv_tile, kv_sub| TileConfig {
            num_warps: 4,
            mma_q,
            kv_tile,
            kv_sub,
        };
        match dims.qk() {
            64 => vec![tile(2, 64, 64), tile(1, 64, 64)],
            128 => vec![tile(2, 64, 32), tile(1, 64, 64)],
            192 => vec![tile(1, 64, 32)],
            _ => vec![tile(1, 32, 32)],
        }
    }

    /// Bytes of register spills (stores or loads, as ptxas reports them) a prefill kernel is
    /// declared to allow; `attnforge compile` fails any kernel above it.
    ///
    /// Why not zero: ptxas leaves 60 of the 720 kernels of the matrix a few registers short
    /// (8 to 128 bytes: mostly 255-register kernels with the split-KV store path, and a few it
    /// caps at 128 or 168 registers by its own occupancy heuristic). In the benchmarked kernel
    /// (`f16 d128 w4q2kv64s32`) the 8 spilled bytes are two values stored before the main loop
    /// and reloaded in the epilogue (read off its SASS), so the loop itself is spill-free. The
    /// budget keeps that visible and bounded; removing the spills is tracked in
    /// `docs/perf-notes.md`.
    pub const SPILL_BUDGET_BYTES: u32 = 128;

    /// The configuration for `dims` when the longest request has `max_packed_rows` packed query
    /// rows (qo_len x group size): the narrow tile when one wide tile would be mostly empty.
    pub fn choose(dims: HeadDims, max_packed_rows: usize) -> TileConfig {
        let candidates = Self::candidates(dims);
        candidates
            .iter()
            .copied()
            .find(|t| max_packed_rows as u32 > t.cta_q() / 2)
            .unwrap_or(*candidates.last().expect("every head dim has a tile"))
    }
}
