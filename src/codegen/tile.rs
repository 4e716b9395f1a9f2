//! CTA tile configurations and the rule that picks one per problem.
//!
//! Tile choices are made here, once, in Rust; the CUDA templates only receive the numbers. Each
//! configuration is checked by `attnforge compile` (registers, no spills) for every kernel.

use super::spec::KvCache;
use crate::jit::Arch;
use crate::problem::{HeadDims, MaskKind, QkAccum, VariantKind};

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
    /// Warp layout: `false` gives each warp its own `mma_q * 16` query rows and every key
    /// (prefill); `true` gives every warp the same rows and a share of each KV tile's
    /// sub-tiles, merged at the end (decode and other short query tiles).
    pub split_keys: bool,
    /// K/V buffers in shared memory: 2 (tile t + 1 loads while tile t computes) or 1 (tile
    /// t + 1's K loads during tile t's P V and its V after it; the rows layout over ragged K/V,
    /// with one sub-tile per tile).
    pub kv_stages: u32,
    /// Whether S = Q K^T and O += P V run as Hopper warpgroup MMAs (`wgmma`, sm_90a only) rather
    /// than `mma.sync`: one or two warpgroups of row warps over 64-key sub-tiles, for the kernels
    /// [`supports_wgmma`](Self::supports_wgmma) allows.
    pub wgmma: bool,
    /// The warp-specialised kernel (`kernels/prefill_ws.cuh`, sm_90a): a producer warpgroup
    /// fills a ring of `kv_stages` K/V stages by TMA while two consumer warpgroups of 64 rows
    /// each (`num_warps` 12 in all, `mma_q` 1, `wgmma`), or three at head dim 64 (`num_warps`
    /// 16), take turns at the tensor cores, over K/V tiles of 64 or 128 keys. Label
    /// `ws{kv_stages}q1kv{kv_tile}`, with `c3` after it for three consumers; see
    /// [`WARP_SPECIALIZED`](Self::WARP_SPECIALIZED).
    pub warp_specialized: bool,
}

/// Bytes of one 16-byte shared-memory chunk (8 elements of 16 bits).
const CHUNK_BYTES: u32 = 16;
/// Elements per chunk.
const CHUNK_ELEMS: u32 = 8;
/// Shared memory a wgmma tile adds so that the kernel can align its tiles to 1024 bytes (the
/// period of wgmma's swizzle): `SMEM_ALIGN_SLACK` in kernels/prefill.cuh.
const WGMMA_ALIGN_SLACK: u32 = 1024;
/// Bytes of one mbarrier.
const MBARRIER_BYTES: u32 = 8;
/// The producer warpgroup of a warp-specialised tile.
const WS_PRODUCER_WARPS: u32 = 4;
/// Dynamic shared memory one CTA may have on sm_90a (227 KB).
const MAX_SHARED_MEMORY_PER_CTA_SM90: u32 = 227 * 1024;

impl TileConfig {
    /// Packed query rows per CTA.
    pub fn cta_q(self) -> u32 {
        let row_warps = if self.split_keys {
            1
        } else {
            self.compute_warps()
        };
        row_warps * self.mma_q * 16
    }

    /// Threads per CTA.
    pub fn threads(self) -> u32 {
        self.num_warps * 32
    }

    /// Warps that compute (own query rows or keys): all of them, but the producer warpgroup of a
    /// warp-specialised tile.
    pub fn compute_warps(self) -> u32 {
        if self.warp_specialized {
            self.num_warps - WS_PRODUCER_WARPS
        } else {
            self.num_warps
        }
    }

    /// Dynamic shared memory: the Q tile and `kv_stages` K and V tiles each.
    pub fn smem_bytes(self, dims: HeadDims) -> u32 {
        self.smem_bytes_staging(dims, self.ws_output_in_q_tile(dims))
    }

    /// [`smem_bytes`](Self::smem_bytes) with the warp-specialised output staged in the Q tile
    /// or not.
    fn smem_bytes_staging(self, dims: HeadDims, output_in_q_tile: bool) -> u32 {
        let qk_row = dims.qk() as u32 / CHUNK_ELEMS * CHUNK_BYTES;
        let vo_row = dims.vo() as u32 / CHUNK_ELEMS * CHUNK_BYTES;
        let align_slack = if self.wgmma { WGMMA_ALIGN_SLACK } else { 0 };
        // The warp-specialised tile adds its ring's barriers (full and empty, of K and of V, per
        // stage) and, unless the output is staged in the Q tile, an output stage of its own (its
        // Q tile takes the next work item's rows while the output is stored) and, where the
        // products read Q from shared memory, a second Q tile for the next item.
        let ws_extra = if self.warp_specialized {
            let own_stage = if output_in_q_tile {
                0
            } else {
                let next_q = if self.ws_q_in_registers(dims) {
                    0
                } else {
                    self.cta_q() * qk_row
                };
                self.cta_q() * vo_row + next_q
            };
            4 * self.kv_stages * MBARRIER_BYTES + own_stage
        } else {
            0
        };
        self.cta_q() * qk_row + self.kv_bytes(dims) + align_slack + ws_extra
    }

    /// The K and V buffers' bytes: `kv_stages` K and V tiles of f16/bf16 rows.
    pub fn kv_bytes(self, dims: HeadDims) -> u32 {
        let qk_row = dims.qk() as u32 / CHUNK_ELEMS * CHUNK_BYTES;
        let vo_row = dims.vo() as u32 / CHUNK_ELEMS * CHUNK_BYTES;
        self.kv_stages * self.kv_tile * (qk_row + vo_row)
    }

    /// Whether the warp-specialised consumers hold Q in registers, as the A fragments of
    /// S = Q K^T (`WS_Q_IN_REGISTERS` in kernels/prefill_ws.cuh): with 64-key tiles at head dims
    /// up to 128; otherwise the logits of a 128-key tile, or head dim 256's output, take those
    /// registers and the products read Q from shared memory.
    fn ws_q_in_registers(self, dims: HeadDims) -> bool {
        self.kv_tile == 64 && dims.qk() <= 128
    }

    /// Whether a warp-specialised tile stages its output in the Q tile rather than in a region
    /// of its own (`WS_OUTPUT_IN_Q_TILE` in kernels/prefill_ws.cuh): where the products read Q
    /// from shared memory and that region, with a second Q tile for the next work item, would
    /// not fit one CTA's shared memory (head dim 256). The next item's Q rows then follow the
    /// output's stores instead of arriving during the item.
    pub fn ws_output_in_q_tile(self, dims: HeadDims) -> bool {
        self.warp_specialized
            && !self.ws_q_in_registers(dims)
            && self.smem_bytes_staging(dims, false) > MAX_SHARED_MEMORY_PER_CTA_SM90
    }

    /// Whether this tile can compute a kernel with these head dims: always without wgmma; with
    /// it, head dims 64, 128 and 256 (either QK accumulation).
    pub fn supports_wgmma(self, dims: HeadDims) -> bool {
        if self.warp_specialized {
            return self.supports_warp_specialized(dims);
        }
        !self.wgmma || matches!((dims.qk(), dims.vo()), (64, 64) | (128, 128) | (256, 256))
    }

    /// Whether this warp-specialised tile can compute a kernel with these head dims: 64, 128,
    /// 256 and (192, 128), with the ring in one CTA's shared memory on sm_90a (at 256 only
    /// 64-key tiles in two stages fit, at (192, 128) 128-key tiles in two stages or 64-key
    /// tiles in up to three, each with the output staged in the Q tile).
    fn supports_warp_specialized(self, dims: HeadDims) -> bool {
        if self.ws_consumers() == 3 && (dims.qk(), dims.vo()) != (64, 64) {
            return false;
        }
        matches!(
            (dims.qk(), dims.vo()),
            (64, 64) | (128, 128) | (256, 256) | (192, 128)
        ) && self.smem_bytes(dims) <= MAX_SHARED_MEMORY_PER_CTA_SM90
    }

    /// The tile to run on `arch`: on sm_90a, this tile's wgmma twin where the kernel supports
    /// one; otherwise this tile. A twin has the same rows, keys and buffers, so the planner's
    /// simulation holds for both. It keeps the warps of this tile (one warpgroup), except the
    /// 128-row tile, which becomes two warpgroups of 64 rows (`w8q1kv64g`): at head dim 128 one
    /// warpgroup of 128 rows keeps 128 f32 output accumulators and 64 logits per thread and
    /// spilled past [`SPILL_BUDGET_BYTES`](Self::SPILL_BUDGET_BYTES) with a transforming variant
    /// (NVRTC 13, sm_90a: up to 216 bytes); two of 64 rows keep half as many, fit 128 registers
    /// with two CTAs per SM, and ran faster on the H200 (`attnforge bench --tile` against the one
    /// warpgroup: soft-cap +31%, causal s4096 +3%, bf16 GQA s8192 causal +8%, head dim 64 +1.4% to
    /// +5%).
    pub fn for_arch(self, arch: Arch, dims: HeadDims) -> TileConfig {
        let (num_warps, mma_q) = if self.mma_q == 2 {
            (8, 1)
        } else {
            (self.num_warps, self.mma_q)
        };
        let twin = TileConfig {
            num_warps,
            mma_q,
            wgmma: true,
            ..self
        };
        let eligible =
            arch == Arch::Sm90a && !self.wgmma && twin.wgmma_shape() && twin.supports_wgmma(dims);
        if eligible {
            twin
        } else {
            self
        }
    }

    /// Whether the tiling itself suits wgmma (always true without it): one or two warpgroups of
    /// row warps over whole 64-key tiles.
    fn wgmma_shape(self) -> bool {
        !self.wgmma
            || (matches!(self.num_warps, 4 | 8)
                && !self.split_keys
                && self.kv_tile == 64
                && self.kv_sub == 64)
    }

    /// Whether a kernel with this tile and these head dims runs on `arch` (and so compiles for
    /// it): a wgmma tile on sm_90a only; an `mma.sync` tile wherever no wgmma twin takes its place
    /// ([`for_arch`](Self::for_arch)), so on sm_90a only the tiles without one (the key-split
    /// tile, 32-key tiles, head dims (192, 128)). The engine plans a twinned `mma.sync` tile on
    /// sm_90a only when asked for another architecture's tiles (`PlanOptions::tiles_of`, used by
    /// `verify --tiles-of sm_80` to run sm_80's kernels on a Hopper GPU) and otherwise refuses one
    /// forced on it, so `attnforge compile` does not build those kernels for sm_90a.
    pub fn runs_on(self, arch: Arch, dims: HeadDims) -> bool {
        if self.warp_specialized {
            arch == Arch::Sm90a && self.supports_warp_specialized(dims)
        } else if self.wgmma {
            arch == Arch::Sm90a
        } else {
            self.for_arch(arch, dims) == self
        }
    }

    /// Whether a kernel over K/V from `kv` can use this tiling: a single K/V buffer only over
    /// ragged rows (the paged loads stage page ids one tile ahead in two buffers); the
    /// warp-specialised ring over either (ragged tiles arrive by TMA, paged ones by its
    /// producer's cp.async).
    pub fn supports(self, kv: KvCache) -> bool {
        self.warp_specialized || self.kv_stages == 2 || kv == KvCache::Ragged
    }

    /// Whether the planner splits the KV range over several CTAs with this tile on its own
    /// (`choose_kv_split`): not with the warp-specialised tile, whose split runs only when a plan
    /// asks for one (`SplitChoice::ChunkKeys`), since the split heuristic was measured with the
    /// other tiles. Every tile can write a split's partial results.
    pub fn plans_kv_split(self) -> bool {
        !self.warp_specialized
    }

    /// The warp-specialised tile with a ring of `stages` K/V stages of `kv_tile` keys (64 or
    /// 128: S = Q K^T of a stage is one `m64n{kv_tile}k16` product per k16 step) and two consumer
    /// warpgroups.
    pub const fn warp_specialized(stages: u32, kv_tile: u32) -> TileConfig {
        Self::warp_specialized_consumers(stages, kv_tile, 2)
    }

    /// [`warp_specialized`](Self::warp_specialized) with `consumers` consumer warpgroups of 64
    /// rows each: 2, or 3 at head dim 64 (their 160 registers a thread hold its 32 output
    /// accumulators beside a 128-key tile's logits).
    pub const fn warp_specialized_consumers(
        stages: u32,
        kv_tile: u32,
        consumers: u32,
    ) -> TileConfig {
        TileConfig {
            num_warps: WS_PRODUCER_WARPS + 4 * consumers,
            mma_q: 1,
            kv_tile,
            kv_sub: kv_tile,
            split_keys: false,
            kv_stages: stages,
            wgmma: true,
            warp_specialized: true,
        }
    }

    /// K/V stages of the warp-specialised tile in the compile matrix: a consumer releases tile
    /// j - 1's stage while it computes tile j, so two is the least, and each stage more lets the
    /// producer's copies run a tile further ahead (four: 160 KB at head dim 128, one CTA per SM
    /// either way). `attnforge bench --tile ws2q1kv64` (or `ws3q1kv64`) measures the others.
    pub const WARP_SPECIALIZED_STAGES: u32 = 4;

    /// Keys per K/V tile of the warp-specialised tiles in the compile matrix, with their stages
    /// (the most that fit 227 KB at head dim 128): 64-key tiles in four stages, and 128-key tiles
    /// (half the softmax bookkeeping and barriers per key, `m64n128k16` products) in two.
    pub const WARP_SPECIALIZED: [(u32, u32); 2] = [(Self::WARP_SPECIALIZED_STAGES, 64), (2, 128)];

    /// The warp-specialised tile the planner may take (`cuda::choose_tile_on`): 128-key tiles in
    /// two stages, the softmax's bookkeeping once per 128 keys; beside the planner's row tile on
    /// the H200 it measured ahead on more shapes than the 64-key tile (the two tables of
    /// `docs/kernel-design.md`, `attnforge bench --filter bf16-d128 --tile ws2q1kv128`).
    pub const PLANNED_WARP_SPECIALIZED: TileConfig = Self::warp_specialized(2, 128);

    /// The warp-specialised tile of head dim 256, where none of
    /// [`WARP_SPECIALIZED`](Self::WARP_SPECIALIZED) fits: 64-key tiles in two stages (64 KB of
    /// Q, 128 KB of ring; its output staged in the Q tile).
    pub const WARP_SPECIALIZED_D256: TileConfig = Self::warp_specialized(2, 64);

    /// The warp-specialised tile of three consumer warpgroups (192 rows) at head dim 64, where
    /// a tile's products take half as long as at 128: 128-key tiles in two stages.
    pub const WARP_SPECIALIZED_THREE_CONSUMERS: TileConfig =
        Self::warp_specialized_consumers(2, 128, 3);

    /// Whether this tile computes kernels of `mask` and `variant`: every tile but the
    /// three-consumer one, which leaves out the variants that transform the logits (soft-cap,
    /// ALiBi, custom ones) and custom masks: with them its 160 registers a consumer thread spill
    /// 92-416 bytes (`attnforge compile --arch sm_90a --filter ws2q1kv128c3` with those kernels
    /// in the matrix), against 8-72 without.
    pub fn computes(self, mask: MaskKind, variant: VariantKind) -> bool {
        self.ws_consumers() != 3
            || (mask != MaskKind::Custom
                && matches!(variant, VariantKind::None | VariantKind::Sinks))
    }

    /// Consumer warpgroups of a warp-specialised tile (0 for any other).
    pub fn ws_consumers(self) -> u32 {
        if self.warp_specialized {
            self.compute_warps() / 4
        } else {
            0
        }
    }

    /// The warp-specialised tiles of the compile matrix ([`WARP_SPECIALIZED`](Self::WARP_SPECIALIZED)).
    pub fn warp_specialized_tiles() -> impl Iterator<Item = TileConfig> {
        Self::WARP_SPECIALIZED
            .into_iter()
            .map(|(stages, keys)| Self::warp_specialized(stages, keys))
    }

    /// The warp-specialised tiles of the compile matrix that compute `dims`: at head dims 64
    /// and 128 those of [`WARP_SPECIALIZED`](Self::WARP_SPECIALIZED) (that fit), at 64 also
    /// [`WARP_SPECIALIZED_THREE_CONSUMERS`](Self::WARP_SPECIALIZED_THREE_CONSUMERS); at the others
    /// one tile, the planner's kind ([`PLANNED_WARP_SPECIALIZED`](Self::PLANNED_WARP_SPECIALIZED))
    /// where it fits ((192, 128), with the output staged in the Q tile), else
    /// [`WARP_SPECIALIZED_D256`](Self::WARP_SPECIALIZED_D256) where that fits (256).
    pub fn warp_specialized_tiles_for(dims: HeadDims) -> Vec<TileConfig> {
        if matches!((dims.qk(), dims.vo()), (64, 64) | (128, 128)) {
            return Self::warp_specialized_tiles()
                .chain([Self::WARP_SPECIALIZED_THREE_CONSUMERS])
                .filter(|t| t.supports_wgmma(dims))
                .collect();
        }
        [Self::PLANNED_WARP_SPECIALIZED, Self::WARP_SPECIALIZED_D256]
            .into_iter()
            .find(|t| t.supports_wgmma(dims))
            .into_iter()
            .collect()
    }

    /// Name fragment, e.g. `w4q2kv64`, `w4q2kv64s32` when computed in sub-tiles,
    /// `w4q1kv64s16k` when the warps split the keys and `w4q1kv64b1` with one K/V buffer.
    pub fn label(self) -> String {
        if self.warp_specialized {
            let consumers = if self.ws_consumers() == 2 {
                String::new()
            } else {
                format!("c{}", self.ws_consumers())
            };
            return format!(
                "ws{}q{}kv{}{consumers}",
                self.kv_stages, self.mma_q, self.kv_tile
            );
        }
        let sub = if self.kv_sub == self.kv_tile {
            String::new()
        } else {
            format!("s{}", self.kv_sub)
        };
        let keys = if self.split_keys { "k" } else { "" };
        let buffers = if self.kv_stages == 1 { "b1" } else { "" };
        let wgmma = if self.wgmma { "g" } else { "" };
        format!(
            "w{}q{}kv{}{sub}{keys}{buffers}{wgmma}",
            self.num_warps, self.mma_q, self.kv_tile
        )
    }

    /// Parses a label as [`label`](Self::label) writes it (`w4q2kv64`, `w4q2kv64s32`,
    /// `w4q1kv64s16k`, `w4q1kv64b1`, `w8q1kv64g`, the warp-specialised `ws4q1kv64` and `ws2q1kv128`); `None`
    /// for anything else or a tiling the kernel cannot run.
    pub fn parse(s: &str) -> Option<TileConfig> {
        if let Some(rest) = s.strip_prefix("ws") {
            let (rest, consumers) = match rest.strip_suffix("c3") {
                Some(rest) => (rest, 3),
                None => (rest, 2),
            };
            let (stages, rest) = rest.split_once('q')?;
            let (q, kv) = rest.split_once("kv")?;
            let keys = kv.parse::<u32>().ok()?;
            let t = TileConfig::warp_specialized_consumers(stages.parse().ok()?, keys, consumers);
            let valid = (2..=8).contains(&t.kv_stages)
                && q.parse::<u32>().ok()? == t.mma_q
                && matches!(keys, 64 | 128);
            return valid.then_some(t);
        }
        let (s, wgmma) = match s.strip_suffix('g') {
            Some(rest) => (rest, true),
            None => (s, false),
        };
        let (s, kv_stages) = match s.strip_suffix("b1") {
            Some(rest) => (rest, 1),
            None => (s, 2),
        };
        let (s, split_keys) = match s.strip_suffix('k') {
            Some(rest) => (rest, true),
            None => (s, false),
        };
        let rest = s.strip_prefix('w')?;
        let (w, rest) = rest.split_once('q')?;
        let (q, rest) = rest.split_once("kv")?;
        let (kv, sub) = rest.split_once('s').unwrap_or((rest, rest));
        let t = TileConfig {
            num_warps: w.parse().ok()?,
            mma_q: q.parse().ok()?,
            kv_tile: kv.parse().ok()?,
            kv_sub: sub.parse().ok()?,
            split_keys,
            kv_stages,
            wgmma,
            warp_specialized: false,
        };
        let valid = (1..=8).contains(&t.num_warps)
            && (1..=4).contains(&t.mma_q)
            && t.kv_sub % 16 == 0
            && t.kv_sub > 0
            && t.kv_tile % t.kv_sub == 0
            && (!split_keys || (t.kv_tile / t.kv_sub) % t.num_warps == 0)
            && (kv_stages == 2 || (!split_keys && t.kv_sub == t.kv_tile))
            && t.wgmma_shape();
        valid.then_some(t)
    }

    /// Every configuration the planner can pick for a kernel with these head dims and QK
    /// accumulation over K/V from `kv` (the compile matrix covers them all), widest first, the
    /// key-split tile for short query tiles last; the row tiles were chosen by the tile sweeps
    /// on the H200 (`attnforge bench --tile`; docs/kernel-design.md). Head dim 128 computes whole 64-key tiles
    /// (`w4q2kv64`) with either accumulator. With f32 accumulators S takes 64 of the 255
    /// registers and ptxas spills a few values (the KV range bounds and the row sums, within the
    /// budget below): measured faster on the H200 than 32-key sub-tiles (`w4q2kv64s32`), which
    /// run the softmax bookkeeping twice per tile (`attnforge bench --tile w4q2kv64s32`).
    /// Head dim 256 over ragged rows computes 64-key tiles with one K/V buffer (`w4q1kv64b1`,
    /// 96 KB, two CTAs per SM; double-buffered, a 64-key tile needs 160 KB and one CTA per SM);
    /// over a paged cache it keeps double-buffered 32-key tiles (`w4q1kv32`). On sm_90a it also
    /// has [`D256_TWO_WARPGROUPS`](Self::D256_TWO_WARPGROUPS), listed first, a wgmma tile with no
    /// `mma.sync` original (which [`runs_on`](Self::runs_on) keeps to sm_90a).
    pub fn candidates(dims: HeadDims, qk_accum: QkAccum, kv: KvCache) -> Vec<TileConfig> {
        let tile = |mma_q, kv_tile, kv_sub, kv_stages| TileConfig {
            num_warps: 4,
            mma_q,
            kv_tile,
            kv_sub,
            split_keys: false,
            kv_stages,
            wgmma: false,
            warp_specialized: false,
        };
        let mut tiles = match (dims.qk(), qk_accum, kv) {
            (64, _, _) => vec![tile(2, 64, 64, 2), tile(1, 64, 64, 2)],
            (128, _, _) => vec![tile(2, 64, 64, 2), tile(1, 64, 64, 2)],
            (192, _, _) => vec![tile(1, 64, 32, 2)],
            (_, _, KvCache::Ragged) => vec![Self::D256_TWO_WARPGROUPS, tile(1, 64, 64, 1)],
            (_, _, KvCache::Paged) => vec![tile(1, 32, 32, 2)],
        };
        tiles.push(Self::key_split(dims));
        tiles
    }

    /// Head dim 256 over ragged K/V on sm_90a: two warpgroups of 64 rows (`w8q1kv64g`, the head
    /// dim 128 tile's structure) with two K/V buffers filled by TMA, about 197 KB of shared
    /// memory, so one CTA per SM. Its `mma.sync` counterpart would be `w4q2kv64`, whose 32-row
    /// warps would hold 256 output floats a thread, so it has none. Measured on the H200 with
    /// `attnforge bench --tile` against `w4q1kv64b1g` (seq 4096, 32 heads): causal +26%,
    /// non-causal +27%, bf16 +27% / +29%, soft-cap 50 +19%, f16 QK +18% / +20%, and faster from seq
    /// 512 up; 203-255 registers, no spill, no serialized wgmma in any of its 60 kernels.
    pub const D256_TWO_WARPGROUPS: TileConfig = TileConfig {
        num_warps: 8,
        mma_q: 1,
        kv_tile: 64,
        kv_sub: 64,
        split_keys: false,
        kv_stages: 2,
        wgmma: true,
        warp_specialized: false,
    };

    /// The key-split tile for `dims`: 16 query rows shared by every warp, 16-key sub-tiles
    /// dealt round robin. Four warps over 64-key tiles, except for head dim 256, where two warps
    /// over 32-key tiles keep the double-buffered K/V (and so occupancy) at the size of the
    /// others.
    pub fn key_split(dims: HeadDims) -> TileConfig {
        let (num_warps, kv_tile) = if dims.qk() > 192 { (2, 32) } else { (4, 64) };
        TileConfig {
            num_warps,
            mma_q: 1,
            kv_tile,
            kv_sub: 16,
            split_keys: true,
            kv_stages: 2,
            wgmma: false,
            warp_specialized: false,
        }
    }

    /// Resident CTAs per SM that every row tile is built for (its `__launch_bounds__` minimum,
    /// where shared memory allows as many) and that the planner assumes (`cuda::choose_tile_on`,
    /// `cuda::split_slots`): past two, co-resident CTAs share the SM's tensor cores.
    pub const ROW_TILE_CTAS_PER_SM: u32 = 2;

    /// Bytes of register spills (stores or loads, as ptxas reports them) a prefill kernel is
    /// declared to allow; `attnforge compile` fails any kernel above it.
    ///
    /// Why not zero: ptxas leaves some 255-register kernels (and 128-register ones, at two CTAs
    /// per SM) a few registers short, and the fixes that remove those spills cost speed. The
    /// spilling kernels of the matrix are sm_80 `w4q2kv64` ones (the f16-QK window ones 24/32 B,
    /// f32-QK paged no-variant and sinks ones 4-16 B, bf16 causal ragged 4 B, fp8 12-48 B:
    /// f16 unmasked, bf16 unmasked and causal), the sm_90a fp8 head-dim-128 two-warpgroup
    /// soft-cap ones (4/8 B) and key-split custom-mask ALiBi one (8 B), and warp-specialised ones (at head dim 128 the custom mask's, up
    /// to 68 B with `ws2q1kv128`, soft-cap 12-20 B; over a paged cache every head-dim-64
    /// `ws2q1kv128` one, 40-56 B, and most (192, 128) ones, 8-60 B; the three-consumer
    /// `ws2q1kv128c3` ones 8-92 B, outside the main loop); no kernel serializes its
    /// wgmma. Code
    /// that removes 6 of them (f32 row sums over a paged cache, sums by MMA in the bf16 causal ragged
    /// kernels) cost 1.6-3.5% on the kernels it changes, timed on the H200 with `attnforge bench
    /// --tiles-of sm_80`. The budget keeps the rest visible and bounded: `attnforge compile
    /// --arch sm_90a,sm_80` lists every kernel's spills and fails one past the budget.
    pub const SPILL_BUDGET_BYTES: u32 = 128;

    /// The spill budget of the warp-specialised kernels whose products read Q from shared memory
    /// and which stage their output in the Q tile, head dims 256
    /// ([`WARP_SPECIALIZED_D256`](Self::WARP_SPECIALIZED_D256)) and (192, 128): at 256 each
    /// consumer thread holds 128 output accumulators, 32 logits and 16 registers of P in at most
    /// 240 registers, and ptxas spills 8-72 bytes, 92-140 with soft-cap or a window's ALiBi
    /// (local loads in the main loop, the rest in the per-item set-up and epilogue); with f16 QK
    /// accumulation, whose overflow fallback adds an `mma.sync` loop beside them, 16-160 at 256
    /// and 84-160 at (192, 128) (8-60 with f32 QK). NVRTC 13, `attnforge compile --arch sm_90a
    /// --filter ws2q1kv64` and `--filter d192x128_` with `ws2q1kv128` in the names.
    pub const WARP_SPECIALIZED_WIDE_HEAD_SPILL_BUDGET_BYTES: u32 = 192;

    /// The spill budget of a kernel of this tile at `dims`: [`SPILL_BUDGET_BYTES`](Self::SPILL_BUDGET_BYTES),
    /// or [`WARP_SPECIALIZED_WIDE_HEAD_SPILL_BUDGET_BYTES`](Self::WARP_SPECIALIZED_WIDE_HEAD_SPILL_BUDGET_BYTES)
    /// for the warp-specialised tile at head dims 256 and (192, 128).
    pub fn spill_budget_bytes(self, dims: HeadDims) -> u32 {
        if self.warp_specialized && dims.qk() >= 192 {
            Self::WARP_SPECIALIZED_WIDE_HEAD_SPILL_BUDGET_BYTES
        } else {
            Self::SPILL_BUDGET_BYTES
        }
    }

    /// The row tiles of [`candidates`](Self::candidates) (each warp its own query rows), widest
    /// first.
    pub fn row_tiles(dims: HeadDims, qk_accum: QkAccum, kv: KvCache) -> Vec<TileConfig> {
        Self::candidates(dims, qk_accum, kv)
            .into_iter()
            .filter(|t| !t.split_keys)
            .collect()
    }

    /// The row tiles a kernel runs on `arch`: each of [`row_tiles`](Self::row_tiles) as
    /// [`for_arch`](Self::for_arch) gives it, those that [`run on`](Self::runs_on) `arch`, widest
    /// first; `cuda::choose_tile_on` picks one of them by simulating the block scheduler.
    pub fn row_tiles_on(
        dims: HeadDims,
        qk_accum: QkAccum,
        kv: KvCache,
        arch: Arch,
    ) -> Vec<TileConfig> {
        let mut tiles: Vec<TileConfig> = Self::row_tiles(dims, qk_accum, kv)
            .into_iter()
            .map(|t| t.for_arch(arch, dims))
            .filter(|t| t.runs_on(arch, dims))
            .collect();
        tiles.dedup();
        tiles
    }

    /// CTAs of this row tile resident per SM on `arch` by shared memory (the tile's buffers, the
    /// K/V base pointers, the wgmma alignment), at most
    /// [`ROW_TILE_CTAS_PER_SM`](Self::ROW_TILE_CTAS_PER_SM). The planner counts it for wgmma
    /// tiles (head dim 256's two warpgroups: one).
    pub fn resident_ctas(self, dims: HeadDims, arch: Arch) -> u32 {
        let smem = self.smem_bytes(dims) + self.threads() * CHUNK_BYTES;
        arch.ctas_per_sm_by_shared_memory(smem)
            .min(Self::ROW_TILE_CTAS_PER_SM)
    }
}
