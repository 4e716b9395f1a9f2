//! `KernelSpec`: everything that changes the generated code of one kernel, and nothing else.
//!
//! A spec is derived from an [`AttentionProblem`] by [`KernelSpec::for_problem`] (plus the tile
//! the planner picks) and rendered to source by [`super::render`]. The cache key is a hash of the
//! rendered source, so any field that changes the code changes the key by construction.

use super::policy::PrefillPolicy;
use super::tile::TileConfig;
use crate::dtype::fp8::Fp8Format;
use crate::dtype::DType;
use crate::problem::{
    AttentionProblem, CudaVariantSource, HeadDims, MaskKind, QkAccum, Variant, VariantKind,
};
use crate::Error;
use std::fmt;

/// The variant as far as code generation is concerned: built-ins by kind, custom ones with their
/// CUDA source (which is part of the code).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum VariantSpec {
    /// No transform.
    None,
    /// Soft-capping.
    SoftCap,
    /// ALiBi.
    Alibi,
    /// Attention sinks.
    Sinks,
    /// A user's CUDA snippet.
    Custom {
        /// Identifier used in the kernel name.
        name: String,
        /// The snippet and its parameter declarations.
        source: CudaVariantSource,
    },
}

impl VariantSpec {
    /// The data-free kind.
    pub fn kind(&self) -> VariantKind {
        match self {
            VariantSpec::None => VariantKind::None,
            VariantSpec::SoftCap => VariantKind::SoftCap,
            VariantSpec::Alibi => VariantKind::Alibi,
            VariantSpec::Sinks => VariantKind::Sinks,
            VariantSpec::Custom { .. } => VariantKind::Custom,
        }
    }

    /// Name fragment for kernel names.
    pub fn label(&self) -> String {
        match self {
            VariantSpec::Custom { name, .. } => format!("custom_{name}"),
            other => other.kind().name().to_string(),
        }
    }

    /// The spec of a problem's variant; an error for a custom variant without CUDA source.
    pub fn for_variant(variant: &Variant) -> Result<VariantSpec, Error> {
        Ok(match variant {
            Variant::None => VariantSpec::None,
            Variant::SoftCap { .. } => VariantSpec::SoftCap,
            Variant::Alibi { .. } => VariantSpec::Alibi,
            Variant::Sinks { .. } => VariantSpec::Sinks,
            Variant::Custom(c) => match &c.cuda {
                Some(source) => VariantSpec::Custom {
                    name: c.name.clone(),
                    source: source.clone(),
                },
                None => {
                    return Err(Error::Unsupported {
                        backend: "cuda",
                        what: format!("custom variant {:?} without a CUDA snippet", c.name),
                        supported: "custom variants that carry a CudaVariantSource".into(),
                    })
                }
            },
        })
    }
}

/// Where a kernel reads keys and values from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum KvCache {
    /// Ragged tensors: request `r`'s keys are rows `kv_indptr[r]..kv_indptr[r+1]`.
    Ragged,
    /// A paged cache: rows found through the page table (any page size, NHD or HND, separate
    /// or combined K/V: those are strides, not code).
    Paged,
}

impl KvCache {
    /// Both, in compile-matrix order.
    pub const ALL: [KvCache; 2] = [KvCache::Ragged, KvCache::Paged];

    /// Name fragment for kernel names.
    pub fn name(self) -> &'static str {
        match self {
            KvCache::Ragged => "ragged",
            KvCache::Paged => "paged",
        }
    }
}

/// What one generated prefill kernel computes and how it is tiled.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct KernelSpec {
    /// Element type of Q, K, V.
    pub input_dtype: DType,
    /// Element type of O.
    pub output_dtype: DType,
    /// QK accumulation type.
    pub qk_accum: QkAccum,
    /// Head dims.
    pub head_dims: HeadDims,
    /// Mask kind.
    pub mask: MaskKind,
    /// Variant.
    pub variant: VariantSpec,
    /// Where K and V come from.
    pub kv: KvCache,
    /// The paged cache's fp8 format (`None`: K and V are `input_dtype`). The kernel dequantises
    /// the codes into its f16/bf16 tiles (`kernels/fp8.cuh`); whether the scales are one per
    /// tensor or one per KV head is a launch parameter (a stride of 0 or 1), not code.
    pub kv_fp8: Option<Fp8Format>,
    /// CTA tiling.
    pub tile: TileConfig,
}

/// The dtypes the CUDA kernels take.
pub const CUDA_DTYPES: [DType; 2] = [DType::F16, DType::Bf16];

/// Fails unless the problem's input and output dtypes are among [`CUDA_DTYPES`], saying so.
pub(crate) fn check_cuda_dtypes(problem: &AttentionProblem) -> Result<(), Error> {
    for (what, dtype) in [
        ("input", problem.input_dtype),
        ("output", problem.output_dtype),
    ] {
        if !CUDA_DTYPES.contains(&dtype) {
            return Err(Error::Unsupported {
                backend: "cuda",
                what: format!("{what} dtype {dtype}"),
                supported: "f16, bf16".into(),
            });
        }
    }
    Ok(())
}

/// Refuses a problem the warp-specialised tile cannot compute, saying what it can: head dims 64,
/// 128, 256 and (192, 128) (the ring in one CTA's shared memory); with three consumer warpgroups
/// head dim 64 without a logits transform or a custom mask ([`TileConfig::computes`]).
fn check_warp_specialized(
    problem: &AttentionProblem,
    kv: KvCache,
    tile: TileConfig,
) -> Result<(), Error> {
    let what = if !tile.supports(kv) {
        Some(format!("{} K/V", kv.name()))
    } else if !tile.supports_wgmma(problem.head_dims) {
        Some(format!("head dims {}", problem.head_dims))
    } else if !tile.computes(problem.mask.kind(), problem.variant.kind()) {
        Some(format!(
            "the {} mask and the {} variant",
            problem.mask.kind().name(),
            problem.variant.kind().name()
        ))
    } else {
        None
    };
    match what {
        None => Ok(()),
        Some(what) => Err(Error::Unsupported {
            backend: "cuda",
            what: format!("the warp-specialised tile {} with {what}", tile.label()),
            supported:
                "ragged or paged K/V, head dims 64, 128, 256 and (192, 128) (a ring of at most 227 KB: at 256 64-key tiles in two stages); \
                 three consumer warpgroups (`c3`) at head dim 64 only, without soft-cap, ALiBi, a custom variant or a custom mask"
                    .into(),
        }),
    }
}

impl KernelSpec {
    /// The spec that runs `problem` with K/V from `kv` and CTA tiling `tile` (the planner picks
    /// it: `cuda::choose_tile_on`). Fails when the problem needs something the generator cannot emit (f32
    /// inputs, a custom variant without CUDA source, a one-buffer tile over a paged cache),
    /// saying what is supported.
    pub fn for_problem(
        problem: &AttentionProblem,
        kv: KvCache,
        tile: TileConfig,
    ) -> Result<KernelSpec, Error> {
        check_cuda_dtypes(problem)?;
        if tile.warp_specialized {
            check_warp_specialized(problem, kv, tile)?;
        }
        if !tile.supports(kv) {
            return Err(Error::Unsupported {
                backend: "cuda",
                what: format!("tile {} over {} K/V", tile.label(), kv.name()),
                supported: "one K/V buffer (a `b1` tile) over ragged K/V only".into(),
            });
        }
        if !tile.supports_wgmma(problem.head_dims) {
            return Err(Error::Unsupported {
                backend: "cuda",
                what: format!("tile {} for head dims {}", tile.label(), problem.head_dims),
                supported: "wgmma (`g`) tiles: head dims 64, 128 and 256".into(),
            });
        }
        let variant = VariantSpec::for_variant(&problem.variant)?;
        Ok(KernelSpec {
            input_dtype: problem.input_dtype,
            output_dtype: problem.output_dtype,
            qk_accum: problem.qk_accum,
            head_dims: problem.head_dims,
            mask: problem.mask.kind(),
            variant,
            kv,
            kv_fp8: None,
            tile,
        })
    }

    /// The same kernel over a paged cache of `format` codes; an error for ragged K/V (fp8 K/V
    /// live in a paged cache only) and for the warp-specialised tile (its ring holds f16/bf16
    /// rows as they arrive; codes would need expanding between the copy and the products).
    pub fn with_kv_fp8(self, format: Option<Fp8Format>) -> Result<KernelSpec, Error> {
        if format.is_some() && self.kv != KvCache::Paged {
            return Err(Error::Unsupported {
                backend: "cuda",
                what: format!("fp8 K/V over {} K/V", self.kv.name()),
                supported: "fp8 K/V in a paged cache".into(),
            });
        }
        if format.is_some() && self.tile.warp_specialized {
            return Err(Error::Unsupported {
                backend: "cuda",
                what: format!(
                    "fp8 K/V with the warp-specialised tile {}",
                    self.tile.label()
                ),
                supported: "fp8 K/V with the other tiles (`w...` labels)".into(),
            });
        }
        Ok(KernelSpec {
            kv_fp8: format,
            ..self
        })
    }

    /// The kernel's tuning choices (rendered into its source; `attnforge compile --explain`).
    pub fn policy(&self) -> PrefillPolicy {
        PrefillPolicy::of(self)
    }

    /// Dynamic shared memory per CTA: the tile's buffers, each thread's K and V base pointers
    /// (16 bytes), paged, the page ids of two KV tiles, staged one tile ahead, and what the
    /// policy adds ([`PrefillPolicy::smem_bytes`]). With
    /// [`fp8_fragments`](PrefillPolicy::fp8_fragments) the K/V buffers hold one-byte codes, half
    /// the tile's f16 rows.
    pub fn smem_bytes(&self) -> u32 {
        if self.tile.warp_specialized {
            // The Q tile, the ring and its barriers: no thread pointers, no policy bytes.
            return self.tile.smem_bytes(self.head_dims);
        }
        let page_ids = match self.kv {
            KvCache::Ragged => 0,
            KvCache::Paged => 2 * self.tile.kv_tile * 4,
        };
        let policy = self.policy();
        let codes_only = if policy.fp8_fragments {
            self.tile.kv_bytes(self.head_dims) / 2
        } else {
            0
        };
        self.tile.smem_bytes(self.head_dims) - codes_only
            + self.tile.threads() * 16
            + page_ids
            + policy.smem_bytes(self.tile.num_warps)
    }

    /// Whether the kernel's KV loop reads the request's bounds from shared memory
    /// ([`PrefillPolicy::bounds_in_shared`]).
    pub fn keeps_loop_bounds_in_shared(&self) -> bool {
        self.policy().bounds_in_shared
    }

    /// Whether the kernel copies whole K/V tiles with the tensor memory accelerator when the
    /// launch passes tensor maps ([`PrefillPolicy::tma_kv`]).
    pub fn copies_kv_by_tma(&self) -> bool {
        self.policy().tma_kv
    }

    /// A readable identifier, also the kernel's entry name: it says what the kernel computes.
    pub fn name(&self) -> String {
        format!(
            "attnforge_prefill_{}_o{}_qk{}_d{}x{}_{}_{}_{}_{}",
            self.input_dtype,
            self.output_dtype,
            self.qk_accum.name(),
            self.head_dims.qk(),
            self.head_dims.vo(),
            self.mask.name(),
            self.variant.label(),
            self.kv_label(),
            self.tile.label(),
        )
    }

    /// The K/V part of the name: `ragged`, `paged`, or `paged_e4m3` / `paged_e5m2`.
    fn kv_label(&self) -> String {
        match self.kv_fp8 {
            None => self.kv.name().to_string(),
            Some(f) => format!("{}_{}", self.kv.name(), f.name()),
        }
    }
}

impl fmt::Display for KernelSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}
