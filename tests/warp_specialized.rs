//! The warp-specialised tiles (`ws{stages}q1kv{keys}`, kernels/prefill_ws.cuh): their labels, what they
//! refuse (with an error naming what they support), their place in the compile matrix (sm_90a
//! only), their rendered source and shared memory, and the head-dim-256 kernels' spills.

mod jit_support;

use attnforge::codegen::{
    compile_matrix, render, KernelSpec, KvCache, RenderedKernel, TileConfig, VariantSpec,
};
use attnforge::dtype::fp8::Fp8Format;
use attnforge::jit::compile::compile;
use attnforge::jit::nvrtc::Nvrtc;
use attnforge::jit::{Arch, CompileOptions, KernelSource};
use attnforge::problem::MaskKind;
use attnforge::{AttentionProblem, DType, Error, HeadDims, QkAccum, RaggedBatch, Variant};
use jit_support::nvrtc;

fn ws() -> TileConfig {
    TileConfig::warp_specialized(TileConfig::WARP_SPECIALIZED_STAGES, 64)
}

fn ws128() -> TileConfig {
    TileConfig::warp_specialized(2, 128)
}

#[test]
fn labels_round_trip_and_bad_ones_are_refused() {
    for label in [
        "ws2q1kv64",
        "ws3q1kv64",
        "ws4q1kv64",
        "ws8q1kv64",
        "ws2q1kv128",
        "ws3q1kv128",
    ] {
        let t = TileConfig::parse(label).unwrap();
        assert_eq!(t.label(), label);
        assert!(t.warp_specialized && t.wgmma);
        assert_eq!((t.threads(), t.cta_q(), t.compute_warps()), (384, 128, 8));
    }
    // Three consumer warpgroups: 512 threads, 192 rows.
    for label in ["ws2q1kv128c3", "ws4q1kv64c3"] {
        let t = TileConfig::parse(label).unwrap();
        assert_eq!(t.label(), label);
        assert_eq!((t.threads(), t.cta_q(), t.ws_consumers()), (512, 192, 3));
    }
    for bad in [
        "ws2q1kv128c2",
        "ws2q1kv128c4",
        "ws2q1kv128c",
        "ws1q1kv64",
        "ws9q1kv64",
        "ws4q2kv64",
        "ws4q1kv32",
        "ws2q1kv96",
        "ws2q1kv256",
        "ws4q1kv64g",
        "wsq1kv64",
        "ws4",
    ] {
        assert!(TileConfig::parse(bad).is_none(), "{bad:?} parsed");
    }
}

#[test]
fn it_runs_on_sm90a_only_at_head_dims_64_128_256_and_192_128() {
    let t = ws();
    for d in [64, 128] {
        let dims = HeadDims::equal(d).unwrap();
        assert!(t.runs_on(Arch::Sm90a, dims));
        assert!(!t.runs_on(Arch::Sm80, dims) && !t.runs_on(Arch::Sm89, dims));
        assert_eq!(t.for_arch(Arch::Sm90a, dims), t);
    }
    // Four 64-key stages fit head dims (192, 128) only with the output staged in the Q tile,
    // and head dim 256 not at all.
    let d192 = HeadDims::new(192, 128).unwrap();
    assert!(t.runs_on(Arch::Sm90a, d192) && t.ws_output_in_q_tile(d192));
    let d256 = HeadDims::equal(256).unwrap();
    assert!(!t.runs_on(Arch::Sm90a, d256) && !t.supports_wgmma(d256));
    assert!(t.supports(KvCache::Ragged) && t.supports(KvCache::Paged));
    assert!(!t.plans_kv_split());
    // Eight stages of head dim 128 do not fit one CTA's shared memory.
    let eight = TileConfig::parse("ws8q1kv64").unwrap();
    assert!(!eight.runs_on(Arch::Sm90a, HeadDims::equal(128).unwrap()));
    assert!(eight.runs_on(Arch::Sm90a, HeadDims::equal(64).unwrap()));
    // 128-key tiles at head dim 128: two stages fit beside an output stage and a second Q tile
    // (225 KB); three only with the output staged in the Q tile (225 KB); four not at all.
    let d128 = HeadDims::equal(128).unwrap();
    let three = TileConfig::parse("ws3q1kv128").unwrap();
    assert!(ws128().runs_on(Arch::Sm90a, d128) && !ws128().ws_output_in_q_tile(d128));
    assert!(three.runs_on(Arch::Sm90a, d128) && three.ws_output_in_q_tile(d128));
    assert!(!TileConfig::parse("ws4q1kv128")
        .unwrap()
        .runs_on(Arch::Sm90a, d128));
    assert!(three.runs_on(Arch::Sm90a, HeadDims::equal(64).unwrap()));
    assert!(!three.ws_output_in_q_tile(HeadDims::equal(64).unwrap()));
    // Head dim 256: 64-key tiles in two stages only, with the output staged in the Q tile.
    let two = TileConfig::WARP_SPECIALIZED_D256;
    assert_eq!(two.label(), "ws2q1kv64");
    assert!(two.runs_on(Arch::Sm90a, d256) && !two.runs_on(Arch::Sm80, d256));
    assert!(two.ws_output_in_q_tile(d256));
    for other in ["ws3q1kv64", "ws4q1kv64", "ws2q1kv128"] {
        assert!(
            !TileConfig::parse(other).unwrap().runs_on(Arch::Sm90a, d256),
            "{other}"
        );
    }
    assert!(ws128().runs_on(Arch::Sm90a, d192) && ws128().ws_output_in_q_tile(d192));
    // At head dims 64 and 128 each tile keeps an output stage of its own.
    for d in [64, 128] {
        let dims = HeadDims::equal(d).unwrap();
        for t in [two, ws(), ws128()] {
            assert!(!t.ws_output_in_q_tile(dims), "{} at {d}", t.label());
        }
    }
    assert_eq!(
        TileConfig::warp_specialized_tiles_for(d256),
        vec![TileConfig::WARP_SPECIALIZED_D256]
    );
    assert_eq!(
        TileConfig::warp_specialized_tiles_for(HeadDims::equal(128).unwrap()),
        vec![ws(), ws128()]
    );
    assert_eq!(TileConfig::warp_specialized_tiles_for(d192), vec![ws128()]);
}

#[test]
fn what_it_cannot_compute_is_refused_naming_what_it_can() {
    let problem = |d: usize, dtype| {
        AttentionProblem::new(
            RaggedBatch::single(64, 64).unwrap(),
            4,
            4,
            HeadDims::equal(d).unwrap(),
            dtype,
        )
    };
    // The refusal names the tile and what the warp-specialised tiles compute.
    let refused = |p: &AttentionProblem, tile: TileConfig| match KernelSpec::for_problem(
        p,
        KvCache::Ragged,
        tile,
    ) {
        Err(Error::Unsupported {
            what, supported, ..
        }) => {
            assert!(what.contains(&tile.label()), "{what}");
            assert!(supported.contains("head dims 64, 128, 256"), "{supported}");
            assert!(supported.contains("head dim 64 only"), "{supported}");
            what
        }
        other => panic!("expected Unsupported, got {other:?}"),
    };
    assert!(refused(&problem(256, DType::Bf16), ws()).contains("head dims"));
    // f16 QK accumulation over either K/V.
    let mut qk16 = problem(128, DType::F16);
    qk16.qk_accum = QkAccum::F16;
    for kv in KvCache::ALL {
        assert!(KernelSpec::for_problem(&qk16, kv, ws()).is_ok());
    }
    assert!(KernelSpec::for_problem(&problem(64, DType::Bf16), KvCache::Ragged, ws()).is_ok());
    // A paged cache of f16/bf16 pages, but not of fp8 codes.
    let paged = KernelSpec::for_problem(&problem(128, DType::F16), KvCache::Paged, ws()).unwrap();
    assert!(!paged.copies_kv_by_tma());
    match paged.with_kv_fp8(Some(Fp8Format::E4m3)) {
        Err(Error::Unsupported { what, .. }) => {
            assert!(what.contains("fp8") && what.contains("ws4q1kv64"), "{what}")
        }
        other => panic!("expected Unsupported, got {other:?}"),
    }
    let d256 = TileConfig::WARP_SPECIALIZED_D256;
    assert!(KernelSpec::for_problem(&problem(256, DType::Bf16), KvCache::Ragged, d256).is_ok());
    // Three consumers: head dim 64, without a logits transform or a custom mask.
    let c3 = TileConfig::WARP_SPECIALIZED_THREE_CONSUMERS;
    assert!(KernelSpec::for_problem(&problem(64, DType::Bf16), KvCache::Paged, c3).is_ok());
    assert!(refused(&problem(128, DType::Bf16), c3).contains("head dims"));
    let softcap = problem(64, DType::Bf16).with_variant(Variant::SoftCap { cap: 30.0 });
    assert!(refused(&softcap, c3).contains("soft"));
}

#[test]
fn the_matrix_has_them_for_every_mask_variant_and_qk_accumulation_over_ragged_and_paged_kv() {
    let kernels: Vec<KernelSpec> = compile_matrix()
        .into_iter()
        .filter(|s| s.tile.warp_specialized)
        .collect();
    // (2 tiles x 2 head dims + 1 tile at each of 256 and (192, 128)) x 3 dtype and QK
    // accumulation pairs (f16 with f32 and with f16 QK, bf16) x 4 masks x 5 variants x (ragged,
    // paged), and the three-consumer tile at head dim 64 for 3 masks (not custom) x 2 variants
    // (none, sinks) x 3 pairs x 2; none over fp8 pages.
    assert_eq!(kernels.len(), 720 + 36);
    assert_eq!(
        kernels
            .iter()
            .filter(|s| s.qk_accum == QkAccum::F16)
            .count(),
        240 + 12
    );
    for s in &kernels {
        if s.head_dims.qk() == 256 {
            assert_eq!(s.tile, TileConfig::WARP_SPECIALIZED_D256);
        } else if s.head_dims.qk() == 192 {
            assert_eq!(s.tile, ws128());
        } else if s.tile == TileConfig::WARP_SPECIALIZED_THREE_CONSUMERS {
            assert_eq!(s.head_dims.qk(), 64);
            assert!(
                s.tile.computes(s.mask, s.variant.kind()),
                "{}",
                s.tile.label()
            );
            assert!(matches!(s.variant, VariantSpec::None | VariantSpec::Sinks));
            assert_ne!(s.mask, MaskKind::Custom);
        } else {
            assert!(s.tile == ws() || s.tile == ws128(), "{}", s.tile.label());
        }
        assert!(s.kv_fp8.is_none());
        assert!(s.qk_accum == QkAccum::F32 || s.input_dtype == DType::F16);
        assert!(s.tile.runs_on(Arch::Sm90a, s.head_dims));
        assert_eq!(s.copies_kv_by_tma(), s.kv == KvCache::Ragged);
    }
    for mask in MaskKind::ALL {
        for kv in KvCache::ALL {
            assert!(kernels.iter().any(|s| s.mask == mask && s.kv == kv));
        }
    }
}

#[test]
fn its_source_runs_the_warp_specialised_cta_with_the_ring_in_shared_memory() {
    let spec = compile_matrix()
        .into_iter()
        .find(|s| s.tile.warp_specialized && s.head_dims.qk() == 128)
        .unwrap();
    let r = render(&spec);
    assert!(r.source.contains("prefill::run_ws_cta(params)"));
    assert!(r.source.contains("constexpr int WS_KV_STAGES = 4;"));
    // The templates see the two consumer warpgroups as the two-warpgroup tile.
    assert!(r.source.contains("constexpr int NUM_WARPS = 8;"));
    assert!(r
        .source
        .contains("__launch_bounds__(prefill::WS_THREADS, 1)"));
    assert_eq!(r.threads, 384);
    // Q (128 rows), four stages of K and V (64 rows each), the output stage, sixteen mbarriers
    // (full and empty, of K and of V, per stage), the alignment slack.
    assert_eq!(
        r.smem_bytes,
        128 * 256 + 4 * 64 * 512 + 128 * 256 + 16 * 8 + 1024
    );
    // The planner's tiles render without it.
    let plain = render(&KernelSpec {
        tile: TileConfig::parse("w8q1kv64g").unwrap(),
        ..spec.clone()
    });
    assert!(!plain.source.contains("run_ws_cta") && !plain.source.contains("WS_KV_STAGES"));
    assert!(r.source.contains("constexpr bool WARP_SPECIALIZED = true;"));
    assert!(plain
        .source
        .contains("constexpr bool WARP_SPECIALIZED = false;"));
    // 128-key tiles in two stages: two Q tiles, two stages of K and V (128 rows each), the
    // output stage, eight mbarriers, the alignment slack.
    let wide = render(&KernelSpec {
        tile: ws128(),
        ..spec.clone()
    });
    assert!(wide.source.contains("constexpr int KV_TILE = 128;"));
    assert!(wide.source.contains("constexpr int WS_KV_STAGES = 2;"));
    assert_eq!(
        wide.smem_bytes,
        2 * 128 * 256 + 2 * 128 * 512 + 128 * 256 + 8 * 8 + 1024
    );
    assert!(wide
        .source
        .contains("constexpr bool WS_OUTPUT_IN_Q_TILE = false;"));
    // Head dim 256: one Q tile (128 rows of 512 bytes), which also stages the output, two
    // stages of K and V (64 rows each), eight mbarriers, the alignment slack.
    let d256 = render(&KernelSpec {
        tile: TileConfig::WARP_SPECIALIZED_D256,
        head_dims: HeadDims::equal(256).unwrap(),
        ..spec
    });
    assert!(d256
        .source
        .contains("constexpr bool WS_OUTPUT_IN_Q_TILE = true;"));
    assert_eq!(d256.smem_bytes, 128 * 512 + 2 * 64 * 1024 + 8 * 8 + 1024);
}

/// The head-dim-256 kernels compile for sm_90a within their spill budget and with their wgmma
/// products asynchronous: the plain causal one and the soft-cap one, whose transform adds the
/// most registers beside the 128 output accumulators (`attnforge compile --arch sm_90a --filter
/// ws2q1kv64` covers the rest).
#[test]
fn head_dim_256_kernels_compile_within_their_spill_budget() {
    let Some(nvrtc) = nvrtc() else { return };
    for variant in [VariantSpec::None, VariantSpec::SoftCap] {
        let spec = compile_matrix()
            .into_iter()
            .find(|s| {
                s.tile == TileConfig::WARP_SPECIALIZED_D256
                    && s.head_dims.qk() == 256
                    && s.input_dtype == DType::Bf16
                    && s.mask == MaskKind::Causal
                    && s.variant == variant
            })
            .unwrap();
        let r = render(&spec);
        compiles_within_budget(&nvrtc, &r);
        assert_eq!(
            r.spill_budget_bytes,
            TileConfig::WARP_SPECIALIZED_WIDE_HEAD_SPILL_BUDGET_BYTES
        );
    }
}

/// With f16 QK accumulation each tile's kernel compiles (its f16-accumulating wgmma, the
/// widening and the f32 fallback by `mma.sync`) within its spill budget and keeps its products
/// asynchronous: the plain causal f16 kernel of each warp-specialised tile the planner or
/// `--tile` can give head dims 128 and 256.
#[test]
fn f16_qk_kernels_compile_within_their_spill_budget() {
    let Some(nvrtc) = nvrtc() else { return };
    for (tile, d) in [
        (ws(), 128),
        (ws128(), 128),
        (TileConfig::WARP_SPECIALIZED_D256, 256),
    ] {
        let spec = compile_matrix()
            .into_iter()
            .find(|s| {
                s.tile == tile
                    && s.head_dims.qk() == d
                    && s.qk_accum == QkAccum::F16
                    && s.mask == MaskKind::Causal
                    && s.variant == VariantSpec::None
                    && s.kv == KvCache::Ragged
            })
            .unwrap();
        let r = render(&spec);
        assert!(r.source.contains("constexpr bool QK_F16_ACCUM = true;"));
        compiles_within_budget(&nvrtc, &r);
    }
}

/// Compiles `r` for sm_90a and checks that it spills no more than its budget and keeps its wgmma
/// products asynchronous.
fn compiles_within_budget(nvrtc: &Nvrtc, r: &RenderedKernel) {
    let src = KernelSource {
        name: &r.name,
        entry: &r.entry,
        source: &r.source,
        snippets: &r.snippets,
    };
    let compiled = compile(nvrtc, &src, &CompileOptions::new(Arch::Sm90a))
        .unwrap_or_else(|e| panic!("{}: {e}", r.name));
    let report = &compiled.report;
    let spills = report.spill_store_bytes.max(report.spill_load_bytes);
    assert!(
        spills <= u64::from(r.spill_budget_bytes),
        "{}: {spills} bytes spilled, budget {}",
        r.name,
        r.spill_budget_bytes
    );
    assert!(report.wgmma_serialized.is_none(), "{}", r.name);
}
