//! Code generation: [`KernelSpec`] in, CUDA source out. Pure: no GPU, no toolkit.
//!
//! The CUDA templates live in `kernels/*.cuh` as real files, embedded with `include_str!`; Rust
//! renders the small specialisation for one spec (constants, the variant block, the parameter
//! struct, the entry point). [`compile_matrix`] lists every kernel the engine can emit, which
//! `attnforge compile` and CI compile for each target architecture; [`reference_matrix`] lists the
//! GPU reference kernels (`kernels/reference.cuh`), which they compile too.

mod fast_divisor;
mod fixed;
mod params;
mod policy;
mod reference;
mod render;
mod spec;
mod tile;
mod variant;

pub use fast_divisor::FastDivisor;
pub use fixed::{
    render_append, render_merge_states, RenderedFixed, APPEND_THREADS, APPEND_WIDE_TOKEN_THREADS,
    MERGE_STATES_ITEMS_PER_CTA, MERGE_STATES_THREADS,
};
pub use params::{
    AppendParams, MergeParams, ParamBlockLayout, PrefillParams, TmaMap, VariantLayout,
};
pub use policy::PrefillPolicy;
pub use reference::{
    reference_matrix, render_reference, ReferenceSpec, RenderedReference, REFERENCE_ROWS_PER_CTA,
    REFERENCE_SPILL_BUDGET_BYTES, REFERENCE_THREADS,
};
pub use render::{
    render, RenderedKernel, CUSTOM_MASK_PAD_BYTES, MERGE_ROWS_PER_CTA, MERGE_THREADS,
};
pub use spec::{KernelSpec, KvCache, VariantSpec, CUDA_DTYPES};
pub use tile::TileConfig;
pub use variant::{param_values, VariantCode};

use crate::dtype::fp8::Fp8Format;
use crate::dtype::DType;
use crate::jit::Arch;
use crate::problem::{CudaVariantSource, HeadDims, MaskKind, ParamType, QkAccum};

/// The sample custom variant the compile matrix includes: a temperature and a per-head bias,
/// plus a mask, so that every part of the custom path (scalar and pointer parameters, a mask
/// hook) is compiled in CI.
pub fn sample_custom_variant_source() -> CudaVariantSource {
    CudaVariantSource {
        transform_body: "return s * params.temperature + params.head_bias[qo_head];".into(),
        mask_body: Some("return ((qo_idx + 2 * kv_idx) % 7) != 3;".into()),
        params: vec![
            ("temperature".into(), ParamType::F32),
            ("head_bias".into(), ParamType::F32Ptr),
        ],
    }
}

/// Whether the compile matrix holds the fp8 `format` kernels of `variant`: e4m3 (the format
/// servers use) with every built-in variant, e5m2 with none (the formats differ only in the
/// decoding of `fp8.cuh`, which the variants do not touch). Other fp8 kernels compile on first use.
fn fp8_in_matrix(format: Fp8Format, variant: &VariantSpec) -> bool {
    match format {
        Fp8Format::E4m3 => !matches!(variant, VariantSpec::Custom { .. }),
        Fp8Format::E5m2 => *variant == VariantSpec::None,
    }
}

/// Every kernel the engine can emit today: dtypes x QK accumulation (f16 only with f16 inputs)
/// x head dims x masks x variants (built-ins and the sample custom one) x ragged or paged K/V x
/// each tile the planner can pick for the head dims and QK accumulation (the key-split decode
/// tile included), each tile's wgmma twin where it has one, and the warp-specialised tile
/// (sm_90a) where it can compute the kernel. [`TileConfig::runs_on`] says
/// which targets each compiles for: a twin for sm_90a only, and the tile it replaces for the
/// others. Then the fp8 caches: the paged kernels with f32 QK accumulation once more per fp8
/// format, those of every built-in variant for e4m3 and of no variant for e5m2 (the others read
/// fp8 caches too, compiled on first use).
pub fn compile_matrix() -> Vec<KernelSpec> {
    let variants = [
        VariantSpec::None,
        VariantSpec::SoftCap,
        VariantSpec::Alibi,
        VariantSpec::Sinks,
        VariantSpec::Custom {
            name: "sample".into(),
            source: sample_custom_variant_source(),
        },
    ];
    let mut specs = Vec::new();
    for dtype in CUDA_DTYPES {
        let accums: &[QkAccum] = if dtype == DType::F16 {
            &[QkAccum::F32, QkAccum::F16]
        } else {
            &[QkAccum::F32]
        };
        for &qk_accum in accums {
            for head_dims in HeadDims::all() {
                for mask in MaskKind::ALL {
                    for variant in &variants {
                        for kv in KvCache::ALL {
                            let ws = TileConfig::warp_specialized_tiles_for(head_dims)
                                .into_iter()
                                .filter(|ws| ws.supports(kv) && ws.computes(mask, variant.kind()));
                            for tile in TileConfig::candidates(head_dims, qk_accum, kv)
                                .into_iter()
                                .chain(ws)
                            {
                                let wgmma = tile.for_arch(Arch::Sm90a, head_dims);
                                let twin = (wgmma != tile).then_some(wgmma);
                                for tile in std::iter::once(tile).chain(twin) {
                                    specs.push(KernelSpec {
                                        input_dtype: dtype,
                                        output_dtype: dtype,
                                        qk_accum,
                                        head_dims,
                                        mask,
                                        variant: variant.clone(),
                                        kv,
                                        kv_fp8: None,
                                        tile,
                                    });
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    let fp8: Vec<KernelSpec> = specs
        .iter()
        .filter(|s| {
            s.kv == KvCache::Paged && s.qk_accum == QkAccum::F32 && !s.tile.warp_specialized
        })
        .flat_map(|s| {
            Fp8Format::ALL
                .into_iter()
                .filter(|&f| fp8_in_matrix(f, &s.variant))
                .map(|f| KernelSpec {
                    kv_fp8: Some(f),
                    ..s.clone()
                })
        })
        .collect();
    specs.extend(fp8);
    specs
}
