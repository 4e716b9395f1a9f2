//! What the property tests share: the random grid point (dtype configuration, head dims, mask,
//! variant, GQA shape, ragged lengths, seed) that the CPU backend's and the paged cache's
//! properties both draw, each adding its own axes (views, instruction set; page geometry).
//! [`paged`] holds what the paged cache's properties share beyond that.

use attnforge::testing::grid::{DtypeConfig, MaskSpec, Point, VariantSpec, DTYPE_CONFIGS};
use attnforge::HeadDims;
use proptest::prelude::*;

pub mod paged;

/// A random grid point (plain data so proptest can shrink and print it) and its seed.
#[derive(Clone, Debug)]
pub struct PointSpec {
    pub config: DtypeConfig,
    pub head_dims: HeadDims,
    pub mask: MaskSpec,
    pub variant: VariantSpec,
    /// Query heads per KV head.
    pub group: usize,
    pub kv_heads: usize,
    /// `(qo_len, kv_len)` per request.
    pub lens: Vec<(usize, usize)>,
    pub seed: u64,
}

impl PointSpec {
    /// The grid point (its problem is `point().problem(seed)`).
    pub fn point(&self) -> Point {
        Point {
            config: self.config,
            head_dims: self.head_dims,
            mask: self.mask,
            variant: self.variant,
            heads: (self.group * self.kv_heads, self.kv_heads),
            lens: self.lens.clone(),
        }
    }
}

/// The axes a property draws its point from; masks are always all four kinds.
pub struct Axes {
    /// Sliding windows are drawn from `0..max_window`.
    pub max_window: i64,
    /// The variants.
    pub variants: BoxedStrategy<VariantSpec>,
    /// GQA groups (KV heads are 1 or 2).
    pub groups: Vec<usize>,
    /// The ragged lengths.
    pub lens: BoxedStrategy<Vec<(usize, usize)>>,
}

/// Random points over `axes`, every dtype configuration and head-dim pair.
pub fn point_spec(axes: Axes) -> impl Strategy<Value = PointSpec> {
    let masks = prop_oneof![
        Just(MaskSpec::None),
        Just(MaskSpec::Causal),
        (0..axes.max_window).prop_map(MaskSpec::Window),
        Just(MaskSpec::Custom),
    ];
    (
        prop::sample::select(DTYPE_CONFIGS.to_vec()),
        prop::sample::select(HeadDims::all().collect::<Vec<_>>()),
        masks,
        axes.variants,
        prop::sample::select(axes.groups),
        1usize..=2,
        axes.lens,
        any::<u64>(),
    )
        .prop_map(
            |(config, head_dims, mask, variant, group, kv_heads, lens, seed)| PointSpec {
                config,
                head_dims,
                mask,
                variant,
                group,
                kv_heads,
                lens,
                seed,
            },
        )
}
