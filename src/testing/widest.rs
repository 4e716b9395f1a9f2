//! Targeted cases for the widest row tile: the kernels of long prefills, run on small problems.
//!
//! The planner takes the 128-row tile (`w4q2kv64`; on sm_90a its wgmma twin `w8q1kv64g`) only
//! when a problem has enough query rows to fill the GPU with it, so the grid's small cases run
//! other tiles, and most of the widest tile's kernels (one per mask, variant, accumulation and
//! K/V layout) would be executed only by benchmarks. These cases ask the GPU backend to compute
//! them with that tile ([`TileRequest::WidestRows`]) whatever the planner would choose; a CPU
//! backend has one tiling and runs them as ordinary cases.
//!
//! The list: every mask × variant pair; in the full suite × every dtype configuration a GPU
//! runs at head dim 128 (f16 with f32 and with f16 QK accumulation, bf16) × ragged and paged K/V,
//! plus head dims 64 and 256 in rotation; in the quick suite one configuration and head dim per
//! pair, rotating. Where not both, ragged and paged K/V alternate. The batch has several query tiles per KV head, a partial last query
//! and KV tile, and a request with fewer keys than queries' causal reach.

use super::grid::{mask_variant_pairs, DtypeConfig, Point, GROUPS};
use super::paged::{layout_at, PagedRun};
use super::{BackendCaps, PagedCase, Suite};
use crate::dtype::DType;
use crate::problem::{HeadDims, QkAccum};

/// Which tile a GPU backend computes a case with. The CPU backends have one tiling and run every
/// case with it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TileRequest {
    /// The planner's choice for the problem.
    #[default]
    Planned,
    /// The widest row tile of the problem's kernel (the one long prefills get), whatever the
    /// planner would choose (see the module doc).
    WidestRows,
}

/// Requests of the widest-tile cases: 130 queries over 200 keys (two full query tiles of 64
/// rows and a partial one per KV head at group 1; more with GQA; four KV tiles, the last partial)
/// and 70 over 70.
const LENS: [(usize, usize); 2] = [(130, 200), (70, 70)];

/// The widest-tile points of `suite` for a backend with `caps`, each with its paged layout
/// (`None`: ragged K/V).
pub(super) fn widest_tile_points(
    suite: Suite,
    caps: &BackendCaps,
) -> Vec<(Point, Option<PagedCase>)> {
    let cfg = |dtype, accum| DtypeConfig { dtype, accum };
    let configs: Vec<DtypeConfig> = [
        cfg(DType::F16, QkAccum::F32),
        cfg(DType::F16, QkAccum::F16),
        cfg(DType::Bf16, QkAccum::F32),
    ]
    .into_iter()
    .filter(|&c| caps.supports(c))
    .collect();
    let dims: Vec<HeadDims> = [128, 64, 256]
        .into_iter()
        .filter_map(|d| HeadDims::new(d, d).ok())
        .collect();
    let mut out = Vec::new();
    if configs.is_empty() || dims.is_empty() {
        return out;
    }
    let mut i = 0usize;
    for (pair, mask, variant) in mask_variant_pairs() {
        let combos: Vec<(DtypeConfig, HeadDims)> = match suite {
            Suite::Quick => vec![(configs[pair % configs.len()], dims[pair % dims.len()])],
            Suite::Full => {
                let mut c: Vec<_> = configs.iter().map(|&c| (c, dims[0])).collect();
                if dims.len() > 1 {
                    let other = dims[1 + pair % (dims.len() - 1)];
                    c.push((configs[pair % configs.len()], other));
                }
                c
            }
        };
        for (config, head_dims) in combos {
            // Head dim 128 in the full suite over both K/V layouts (its widest tile's kernels
            // are the long prefills'), the others alternating.
            let both = suite == Suite::Full && head_dims == dims[0];
            let layouts: Vec<bool> = if both {
                vec![false, true]
            } else {
                vec![i % 2 == 1]
            };
            for paged in layouts {
                let group = GROUPS[i % GROUPS.len()];
                let kv_heads = 1 + i % 2;
                let point = Point {
                    config,
                    head_dims,
                    mask,
                    variant,
                    heads: (group * kv_heads, kv_heads),
                    lens: LENS.to_vec(),
                };
                out.push((point, paged.then(|| layout_at(i / 2, PagedRun::Direct))));
                i += 1;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::grid::MASKS;
    use super::*;

    // Every mask x variant pair meets every GPU dtype configuration at head dim 128 over each
    // K/V layout in the full suite.
    #[test]
    fn the_full_list_covers_every_pair_and_configuration_at_head_dim_128() {
        let points = widest_tile_points(Suite::Full, &BackendCaps::cuda());
        let d128 = HeadDims::new(128, 128).expect("head dims");
        for mask in MASKS {
            for config in [
                (DType::F16, QkAccum::F32),
                (DType::F16, QkAccum::F16),
                (DType::Bf16, QkAccum::F32),
            ] {
                let found: Vec<_> = points
                    .iter()
                    .filter(|(p, _)| {
                        p.mask == mask
                            && p.head_dims == d128
                            && (p.config.dtype, p.config.accum) == config
                    })
                    .collect();
                assert_eq!(
                    found.len(),
                    10,
                    "{mask:?} {config:?}: per variant and layout"
                );
                let paged = found.iter().filter(|(_, paged)| paged.is_some()).count();
                assert_eq!(paged, 5, "{mask:?} {config:?}: half of them paged");
            }
        }
        assert!(points.iter().any(|(_, paged)| paged.is_some()));
        assert!(points.iter().any(|(_, paged)| paged.is_none()));
        let quick = widest_tile_points(Suite::Quick, &BackendCaps::cuda());
        assert_eq!(quick.len(), MASKS.len() * 5);
    }
}
