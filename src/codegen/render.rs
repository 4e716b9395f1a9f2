//! Rendering a [`KernelSpec`] into one self-contained CUDA source.
//!
//! The source is the embedded templates (`kernels/*.cuh`, in dependency order) with three
//! generated pieces: the spec constants, the variant block and the parameter struct, then the
//! `extern "C"` entry point. Rendering is pure: no GPU, no toolkit, no file system.

use super::params::{ParamBlockLayout, VariantLayout};
use super::spec::{KernelSpec, KvCache};
use super::tile::TileConfig;
use super::variant::{self, VariantCode};
use crate::dtype::fp8::Fp8Format;
use crate::dtype::DType;
use crate::jit::{Arch, SnippetSpan};
use crate::problem::{MaskKind, QkAccum};
use std::fmt::Write;

/// The templates, in the order they are concatenated, with their file names.
pub(super) const COMMON: (&str, &str) = ("common.cuh", include_str!("../../kernels/common.cuh"));
const MMA: (&str, &str) = ("mma.cuh", include_str!("../../kernels/mma.cuh"));
const SMEM_TILE: (&str, &str) = ("smem_tile.cuh", include_str!("../../kernels/smem_tile.cuh"));
const TMA: (&str, &str) = ("tma.cuh", include_str!("../../kernels/tma.cuh"));
const FP8: (&str, &str) = ("fp8.cuh", include_str!("../../kernels/fp8.cuh"));
const KV_ROWS: (&str, &str) = ("kv_rows.cuh", include_str!("../../kernels/kv_rows.cuh"));
pub(super) const MASK: (&str, &str) = ("mask.cuh", include_str!("../../kernels/mask.cuh"));
const ONLINE_SOFTMAX: (&str, &str) = (
    "online_softmax.cuh",
    include_str!("../../kernels/online_softmax.cuh"),
);
pub(super) const VARIANT: (&str, &str) = ("variant.cuh", include_str!("../../kernels/variant.cuh"));
/// The prefill kernel by role, in dependency order, its skeleton last.
const PREFILL: [(&str, &str); 7] = [
    (
        "prefill_tile.cuh",
        include_str!("../../kernels/prefill_tile.cuh"),
    ),
    (
        "prefill_products.cuh",
        include_str!("../../kernels/prefill_products.cuh"),
    ),
    (
        "prefill_fp8_fragments.cuh",
        include_str!("../../kernels/prefill_fp8_fragments.cuh"),
    ),
    (
        "prefill_kv_pipeline.cuh",
        include_str!("../../kernels/prefill_kv_pipeline.cuh"),
    ),
    (
        "prefill_step.cuh",
        include_str!("../../kernels/prefill_step.cuh"),
    ),
    (
        "prefill_epilogue.cuh",
        include_str!("../../kernels/prefill_epilogue.cuh"),
    ),
    ("prefill.cuh", include_str!("../../kernels/prefill.cuh")),
];
/// The warp-specialised prefill kernel (sm_90a), after the prefill templates it builds on.
const PREFILL_WS: [(&str, &str); 2] = [
    (
        "ws_pipeline.cuh",
        include_str!("../../kernels/ws_pipeline.cuh"),
    ),
    (
        "prefill_ws.cuh",
        include_str!("../../kernels/prefill_ws.cuh"),
    ),
];
const MERGE_MATH: (&str, &str) = (
    "merge_math.cuh",
    include_str!("../../kernels/merge_math.cuh"),
);
const MERGE_STATE: (&str, &str) = (
    "merge_state.cuh",
    include_str!("../../kernels/merge_state.cuh"),
);

/// Threads per CTA of the merge kernel.
pub const MERGE_THREADS: u32 = 128;
/// (token, query head) rows merged per CTA: one per warp.
pub const MERGE_ROWS_PER_CTA: u32 = MERGE_THREADS / 32;
/// Bytes the host uploads after a packed custom mask (zeros): the prefill kernels read each row's
/// bits for a sub-tile as aligned 32-bit words, which reach up to this far past a segment's last
/// byte (five words for a 128-key sub-tile, from up to 3 bytes before its first;
/// `CUSTOM_MASK_PAD_BYTES` in kernels/mask.cuh, checked when a kernel compiles).
pub const CUSTOM_MASK_PAD_BYTES: usize = 20;

/// A rendered kernel: what the JIT compiles and what the launcher needs to run it.
#[derive(Clone, Debug)]
pub struct RenderedKernel {
    /// Complete CUDA source; includes no toolkit header.
    pub source: String,
    /// The `extern "C"` entry point of the prefill kernel.
    pub entry: String,
    /// The entry point of the split-KV merge kernel (same module, same parameter block; one
    /// warp per (token, query head), [`MERGE_ROWS_PER_CTA`] per CTA of [`MERGE_THREADS`]).
    pub merge_entry: String,
    /// Readable name (equal to the entry name).
    pub name: String,
    /// File name the generated source's `#line` directives use.
    pub file_name: String,
    /// Register spill bytes this kernel is declared to allow ([`TileConfig::spill_budget_bytes`]).
    pub spill_budget_bytes: u32,
    /// Where the variant's snippets sit in `source`.
    pub snippets: Vec<SnippetSpan>,
    /// Threads per CTA.
    pub threads: u32,
    /// Dynamic shared memory per CTA.
    pub smem_bytes: u32,
    /// Layout of the kernel's single parameter.
    pub params: ParamBlockLayout,
}

pub(super) fn cuda_dtype(d: DType) -> &'static str {
    match d {
        DType::F16 => "f16_t",
        DType::Bf16 => "bf16_t",
        // KernelSpec::for_problem rejects f32 before a spec exists; the matrix never has it.
        DType::F32 => "float",
    }
}

pub(super) fn mask_constant(m: MaskKind) -> &'static str {
    match m {
        MaskKind::None => "MASK_NONE",
        MaskKind::Causal => "MASK_CAUSAL",
        MaskKind::SlidingWindow => "MASK_SLIDING_WINDOW",
        MaskKind::Custom => "MASK_CUSTOM",
    }
}

/// Appends a template with a `#line` directive so compiler messages name the template file.
pub(super) fn template(out: &mut String, (name, text): (&str, &str)) {
    let _ = writeln!(out, "#line 1 \"{name}\"");
    out.push_str(text);
    if !text.ends_with('\n') {
        out.push('\n');
    }
}

/// The `KV_FP8` constant of `fp8.cuh` for a cache format.
pub(super) fn fp8_constant(format: Option<Fp8Format>) -> &'static str {
    match format {
        None => "KV_FP8_NONE",
        Some(Fp8Format::E4m3) => "KV_FP8_E4M3",
        Some(Fp8Format::E5m2) => "KV_FP8_E5M2",
    }
}

/// Renders `spec` into CUDA source.
pub fn render(spec: &KernelSpec) -> RenderedKernel {
    let name = spec.name();
    let file_name = format!("{name}.cu");
    let code = VariantCode::of(&spec.variant);
    let layout = ParamBlockLayout::new(VariantLayout::new(&code.params));
    let smem_bytes = spec.smem_bytes();
    let mut out = String::new();
    let mut snippets = Vec::new();
    let _ = writeln!(
        out,
        "// Generated by attnforge {} for {name}.",
        env!("CARGO_PKG_VERSION")
    );
    template(&mut out, COMMON);
    template(&mut out, MMA);
    template(&mut out, SMEM_TILE);
    template(&mut out, TMA);
    template(&mut out, FP8);
    template(&mut out, KV_ROWS);
    let generated_line = |out: &String| out.lines().count() + 2;
    // A warp-specialised tile's spec constants describe its two consumer warpgroups as the
    // two-warpgroup tile the prefill templates know (two K/V buffers); its ring has its own.
    let (kv_stages, ws_stages) = if spec.tile.warp_specialized {
        (
            2,
            format!(
                "constexpr int WS_KV_STAGES = {};\nconstexpr bool WS_OUTPUT_IN_Q_TILE = {};\n",
                spec.tile.kv_stages,
                spec.tile.ws_output_in_q_tile(spec.head_dims)
            ),
        )
    } else {
        (spec.tile.kv_stages, String::new())
    };
    let _ = writeln!(out, "#line {} \"{file_name}\"", generated_line(&out));
    let _ = writeln!(
        out,
        "namespace spec {{\nusing DTypeIn = {};\nusing DTypeOut = {};\nconstexpr int HEAD_DIM_QK = {};\n\
         constexpr int HEAD_DIM_VO = {};\nconstexpr bool QK_F16_ACCUM = {};\nconstexpr int MASK_KIND = {};\n\
         constexpr int NUM_WARPS = {};\nconstexpr int MMA_Q = {};\nconstexpr int KV_TILE = {};\n\
         constexpr int KV_SUB = {};\nconstexpr int KV_STAGES = {};\nconstexpr bool WARPS_SPLIT_KEYS = {};\nconstexpr bool WGMMA = {};\n\
         constexpr bool WARP_SPECIALIZED = {};\n\
         constexpr bool KV_PAGED = {};\nconstexpr int KV_FP8 = {};\n\
         constexpr int SMEM_BYTES = {smem_bytes};\n{ws_stages}}}  // namespace spec",
        cuda_dtype(spec.input_dtype),
        cuda_dtype(spec.output_dtype),
        spec.head_dims.qk(),
        spec.head_dims.vo(),
        spec.qk_accum == QkAccum::F16,
        mask_constant(spec.mask),
        spec.tile.compute_warps(),
        spec.tile.mma_q,
        spec.tile.kv_tile,
        spec.tile.kv_sub,
        kv_stages,
        spec.tile.split_keys,
        spec.tile.wgmma,
        spec.tile.warp_specialized,
        spec.kv == KvCache::Paged,
        fp8_constant(spec.kv_fp8),
    );
    out.push_str(&spec.policy().render());
    out.push_str(&layout.variant.cuda_struct());
    variant::render(&code, &mut out, &mut snippets, &file_name);
    out.push_str(&layout.cuda_struct());
    template(&mut out, MASK);
    template(&mut out, ONLINE_SOFTMAX);
    template(&mut out, VARIANT);
    for file in PREFILL {
        template(&mut out, file);
    }
    if spec.tile.warp_specialized {
        for file in PREFILL_WS {
            template(&mut out, file);
        }
    }
    template(&mut out, MERGE_MATH);
    template(&mut out, MERGE_STATE);
    let merge_entry = format!("{name}_merge");
    let (bounds, size_check, body) = if spec.tile.warp_specialized {
        (
            WS_LAUNCH_BOUNDS.to_string(),
            "prefill::WS_SMEM_BYTES",
            "prefill::run_ws_cta(params)",
        )
    } else {
        (
            prefill_launch_bounds(smem_bytes, spec.tile),
            "prefill::SMEM_BYTES",
            "prefill::run_cta(params)",
        )
    };
    let _ = writeln!(out, "#line {} \"{file_name}\"", generated_line(&out));
    let _ = writeln!(
        out,
        "static_assert({size_check} == spec::SMEM_BYTES, \"shared memory size agrees with the host\");\n\
         static_assert(merge::NUM_THREADS == {MERGE_THREADS} && merge::WARPS == {MERGE_ROWS_PER_CTA}, \"merge launch shape\");\n\
         static_assert(CUSTOM_MASK_PAD_BYTES == {CUSTOM_MASK_PAD_BYTES}, \"custom mask padding agrees with the host\");\n\
         {bounds}\
         extern \"C\" __global__ void ATTNFORGE_PREFILL_BOUNDS\n\
         {name}(const __grid_constant__ PrefillParams params) {{\n  {body};\n}}\n\
         extern \"C\" __global__ void __launch_bounds__(merge::NUM_THREADS)\n\
         {merge_entry}(const __grid_constant__ PrefillParams params) {{\n  merge::run(params);\n}}"
    );
    RenderedKernel {
        source: out,
        entry: name.clone(),
        merge_entry,
        name,
        file_name,
        spill_budget_bytes: spec.tile.spill_budget_bytes(spec.head_dims),
        snippets,
        threads: spec.tile.threads(),
        smem_bytes,
        params: layout,
    }
}

/// The warp-specialised kernel's `__launch_bounds__`: its 384 threads, one CTA per SM, so that
/// ptxas caps the launch at 168 registers a thread, which the roles then trade by `setmaxnreg`
/// (sm_90a only: the tile runs nowhere else).
const WS_LAUNCH_BOUNDS: &str = "#if __CUDA_ARCH__ >= 900\n\
     #define ATTNFORGE_PREFILL_BOUNDS __launch_bounds__(prefill::WS_THREADS, 1)\n\
     #else\n#error \"the warp-specialised prefill kernel needs sm_90a\"\n#endif\n";

/// The prefill kernel's `__launch_bounds__`, per target (a preprocessor choice on
/// `__CUDA_ARCH__`, since one source is compiled for every architecture): the minimum of resident
/// CTAs per SM it declares lets ptxas use every register those CTAs can have, and keeps its
/// register target from moving with unrelated code. A row tile declares
/// [`TileConfig::ROW_TILE_CTAS_PER_SM`] (what the planner assumes), or fewer where shared memory
/// allows fewer: left to its own guess, ptxas gave the D=64 128-row tile, whose 48 KB of shared
/// memory allow four CTAs per SM, 215 registers on main and 170 after an unrelated change of the
/// work items (-8% at D=64 on the H200), and capped the 64-row D=128 tile at 168 registers
/// with 8 bytes of spills (192 and none with the bound). The key-split tile (decode: bound by
/// memory, every resident CTA adds loads in flight) declares a minimum only where shared memory
/// allows at most two CTAs; otherwise ptxas's own choice stands.
fn prefill_launch_bounds(smem_bytes: u32, tile: TileConfig) -> String {
    let mut out = String::new();
    for (i, arch) in Arch::ALL.into_iter().rev().enumerate() {
        let by_smem = arch.ctas_per_sm_by_shared_memory(smem_bytes);
        let min_ctas = if tile.split_keys {
            (by_smem <= 2).then_some(by_smem)
        } else {
            Some(by_smem.min(TileConfig::ROW_TILE_CTAS_PER_SM))
        };
        let bounds = match min_ctas {
            Some(ctas) => format!("__launch_bounds__(prefill::NUM_THREADS, {ctas})"),
            None => "__launch_bounds__(prefill::NUM_THREADS)".to_string(),
        };
        let keyword = if i == 0 { "#if" } else { "#elif" };
        let _ = writeln!(
            out,
            "{keyword} __CUDA_ARCH__ >= {}\n#define ATTNFORGE_PREFILL_BOUNDS {bounds}",
            arch.cuda_arch_macro()
        );
    }
    out.push_str("#else\n#error \"attnforge prefill kernels need sm_80 or newer\"\n#endif\n");
    out
}
