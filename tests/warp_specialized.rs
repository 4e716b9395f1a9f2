//! The warp-specialised tiles (`ws{stages}q1kv{keys}`, kernels/prefill_ws.cuh): their labels, what they
//! refuse (with an error naming what they support), their place in the compile matrix (sm_90a
//! only), and their rendered source and shared memory.

use attnforge::codegen::{compile_matrix, render, KernelSpec, KvCache, TileConfig};
use attnforge::jit::Arch;
use attnforge::problem::MaskKind;
use attnforge::{AttentionProblem, DType, Error, HeadDims, QkAccum, RaggedBatch};

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
    for bad in [
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
fn it_runs_on_sm90a_only_and_at_head_dims_64_and_128() {
    let t = ws();
    for d in [64, 128] {
        let dims = HeadDims::equal(d).unwrap();
        assert!(t.runs_on(Arch::Sm90a, dims));
        assert!(!t.runs_on(Arch::Sm80, dims) && !t.runs_on(Arch::Sm89, dims));
        assert_eq!(t.for_arch(Arch::Sm90a, dims), t);
    }
    for dims in [
        HeadDims::equal(256).unwrap(),
        HeadDims::new(192, 128).unwrap(),
    ] {
        assert!(!t.runs_on(Arch::Sm90a, dims) && !t.supports_wgmma(dims));
    }
    assert!(t.supports(KvCache::Ragged) && !t.supports(KvCache::Paged));
    assert!(t.supports_qk_accum(QkAccum::F32) && !t.supports_qk_accum(QkAccum::F16));
    assert!(!t.supports_kv_split());
    // Eight stages of head dim 128 do not fit one CTA's shared memory.
    let eight = TileConfig::parse("ws8q1kv64").unwrap();
    assert!(!eight.runs_on(Arch::Sm90a, HeadDims::equal(128).unwrap()));
    assert!(eight.runs_on(Arch::Sm90a, HeadDims::equal(64).unwrap()));
    // 128-key tiles: two stages fit at head dim 128 (225 KB), three only at head dim 64.
    let three = TileConfig::parse("ws3q1kv128").unwrap();
    assert!(ws128().runs_on(Arch::Sm90a, HeadDims::equal(128).unwrap()));
    assert!(!three.runs_on(Arch::Sm90a, HeadDims::equal(128).unwrap()));
    assert!(three.runs_on(Arch::Sm90a, HeadDims::equal(64).unwrap()));
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
    let refused = |p: &AttentionProblem, kv| match KernelSpec::for_problem(p, kv, ws()) {
        Err(Error::Unsupported {
            what, supported, ..
        }) => {
            assert!(what.contains("ws4q1kv64"), "{what}");
            assert!(supported.contains("ragged K/V, f32 QK"), "{supported}");
            what
        }
        other => panic!("expected Unsupported, got {other:?}"),
    };
    assert!(refused(&problem(128, DType::F16), KvCache::Paged).contains("paged"));
    assert!(refused(&problem(256, DType::Bf16), KvCache::Ragged).contains("head dims"));
    let mut qk16 = problem(128, DType::F16);
    qk16.qk_accum = QkAccum::F16;
    assert!(refused(&qk16, KvCache::Ragged).contains("QK"));
    assert!(KernelSpec::for_problem(&problem(64, DType::Bf16), KvCache::Ragged, ws()).is_ok());
}

#[test]
fn the_matrix_has_them_for_every_mask_and_variant_of_f32_qk_over_ragged_kv() {
    let kernels: Vec<KernelSpec> = compile_matrix()
        .into_iter()
        .filter(|s| s.tile.warp_specialized)
        .collect();
    // 2 tiles x 2 dtypes x 2 head dims x 4 masks x 5 variants.
    assert_eq!(kernels.len(), 160);
    for s in &kernels {
        assert!(s.tile == ws() || s.tile == ws128(), "{}", s.tile.label());
        assert!(s.kv == KvCache::Ragged && s.qk_accum == QkAccum::F32);
        assert!(s.tile.runs_on(Arch::Sm90a, s.head_dims));
        assert!(s.copies_kv_by_tma());
    }
    for mask in MaskKind::ALL {
        assert!(kernels.iter().any(|s| s.mask == mask));
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
        ..spec
    });
    assert!(wide.source.contains("constexpr int KV_TILE = 128;"));
    assert!(wide.source.contains("constexpr int WS_KV_STAGES = 2;"));
    assert_eq!(
        wide.smem_bytes,
        2 * 128 * 256 + 2 * 128 * 512 + 128 * 256 + 8 * 8 + 1024
    );
}
