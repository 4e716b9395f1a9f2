//! The kernel generator: rendered sources of the built-in variants, uniqueness of kernel names
//! and sources across the compile matrix, sensitivity of the source (hence of the cache key) to
//! every field of a spec, parameter layouts, and user snippet errors in the user's line numbers.

mod jit_support;

use attnforge::codegen::{
    compile_matrix, render, sample_custom_variant_source, KernelSpec, KvCache, PrefillPolicy,
    TileConfig, VariantLayout, VariantSpec,
};
use attnforge::dtype::fp8::Fp8Format;
use attnforge::jit::compile::compile;
use attnforge::jit::{Arch, CompileOptions, JitError, KernelSource};
use attnforge::problem::{CudaVariantSource, MaskKind, ParamType, ParamValue};
use attnforge::{AttentionProblem, DType, Error, HeadDims, QkAccum, RaggedBatch, Variant};
use jit_support::nvrtc;
use std::collections::HashSet;

fn base() -> KernelSpec {
    KernelSpec {
        input_dtype: DType::F16,
        output_dtype: DType::F16,
        qk_accum: QkAccum::F32,
        head_dims: HeadDims::equal(128).unwrap(),
        mask: MaskKind::Causal,
        variant: VariantSpec::None,
        kv: KvCache::Ragged,
        kv_fp8: None,
        tile: TileConfig::candidates(HeadDims::equal(128).unwrap(), QkAccum::F32, KvCache::Ragged)
            [0],
    }
}

fn with_variant(variant: VariantSpec) -> String {
    render(&KernelSpec { variant, ..base() }).source
}

#[test]
fn built_in_variants_render_their_hooks() {
    let none = with_variant(VariantSpec::None);
    assert!(none.contains("constexpr bool VARIANT_HAS_TRANSFORM = false;"));
    assert!(none.contains("constexpr bool VARIANT_HAS_SINK = false;"));

    let softcap = with_variant(VariantSpec::SoftCap);
    assert!(softcap.contains("constexpr bool VARIANT_HAS_TRANSFORM = true;"));
    assert!(softcap.contains("softcap_tanh(s, params.soft_cap, params.softcap_exp2_scale)"));
    assert!(softcap.contains("float soft_cap;") && softcap.contains("float softcap_exp2_scale;"));
    // The fast kernels take the soft-cap from the accumulator, post_scale folded in.
    assert!(softcap.contains("constexpr bool VARIANT_TRANSFORM_FROM_ACC = true;"));
    assert!(softcap.contains("softcap_tanh(acc, params.soft_cap, params.softcap_acc_exp2_scale)"));
    assert!(none.contains("constexpr bool VARIANT_TRANSFORM_FROM_ACC = false;"));
    // Its small form (|s| <= cap / 2): a polynomial from the logit and from the accumulator, and
    // the accumulator limit; no other variant has one.
    assert!(softcap.contains("constexpr bool VARIANT_HAS_SMALL_FORM = true;"));
    assert!(softcap.contains("return odd_poly7(s, 1.0f, params.softcap_small_c1,"));
    assert!(softcap.contains("return odd_poly7(acc, params.softcap_small_acc_c0,"));
    assert!(softcap.contains("return params.softcap_small_acc_limit;"));
    assert!(none.contains("constexpr bool VARIANT_HAS_SMALL_FORM = false;"));

    let alibi = with_variant(VariantSpec::Alibi);
    assert!(alibi.contains("const float* alibi_slopes;"));
    assert!(alibi.contains("kv_idx - (qo_idx + kv_len - qo_len)"));

    let sinks = with_variant(VariantSpec::Sinks);
    assert!(sinks.contains("constexpr bool VARIANT_HAS_SINK = true;"));
    assert!(sinks.contains("return params.sinks[qo_head];"));
    assert!(sinks.contains("constexpr bool VARIANT_HAS_TRANSFORM = false;"));

    // The transform always takes and returns float: the rule that makes an f16 accumulator
    // reaching a variant impossible.
    for src in [&none, &softcap, &alibi, &sinks] {
        assert!(src.contains("float logits_transform(const VariantParams& params, float s,"));
        assert!(src.contains("float logits_transform_small(const VariantParams& params, float s,"));
        assert!(
            !src.contains("#include"),
            "generated kernels include no toolkit header"
        );
    }
}

#[test]
fn every_kernel_of_the_matrix_has_its_own_name_and_source() {
    let matrix = compile_matrix();
    assert!(matrix.len() > 100);
    let mut names = HashSet::new();
    let mut sources = HashSet::new();
    for spec in &matrix {
        let r = render(spec);
        assert_eq!(r.entry, spec.name());
        assert!(r.source.contains(&format!(
            "{}(const __grid_constant__ PrefillParams params)",
            r.entry
        )));
        assert!(
            names.insert(r.name.clone()),
            "two kernels share the name {}",
            r.name
        );
        assert!(
            sources.insert(r.source),
            "two kernels share a source: {}",
            r.name
        );
    }
}

/// The kernels whose KV loop reads the request's bounds from shared memory (`prefill.cuh`
/// `BOUNDS_IN_SHARED`) are the ten that ptxas spilled without it on sm_80 (NVRTC 13), and their
/// shared memory counts each warp's slot: 8 bytes unmasked, 16 with a mask.
#[test]
fn loop_bounds_in_shared_memory_for_the_ten_sm80_kernels_that_spilled() {
    // (Their fp8 twins share their policy: see fp8_kernels_are_the_paged_kernels_per_format.)
    let mut names: Vec<String> = compile_matrix()
        .iter()
        .filter(|s| s.kv_fp8.is_none() && s.keeps_loop_bounds_in_shared())
        .map(|s| s.name())
        .collect();
    names.sort();
    let mut expected: Vec<String> = [
        "f16_of16_qkf32_d128x128_none_none_paged",
        "f16_of16_qkf32_d128x128_none_sinks_paged",
        "f16_of16_qkf32_d128x128_causal_none_paged",
        "f16_of16_qkf32_d128x128_causal_sinks_paged",
        "f16_of16_qkf16_d128x128_window_none_ragged",
        "f16_of16_qkf16_d128x128_window_none_paged",
        "f16_of16_qkf16_d128x128_window_sinks_ragged",
        "f16_of16_qkf16_d128x128_window_sinks_paged",
        "bf16_obf16_qkf32_d128x128_causal_none_ragged",
        "bf16_obf16_qkf32_d128x128_causal_sinks_ragged",
    ]
    .iter()
    .map(|n| format!("attnforge_prefill_{n}_w4q2kv64"))
    .collect();
    expected.sort();
    assert_eq!(names, expected);

    let paged = KernelSpec {
        kv: KvCache::Paged,
        ..base()
    };
    assert_eq!(paged.tile.label(), "w4q2kv64");
    let bf16 = KernelSpec {
        input_dtype: DType::Bf16,
        output_dtype: DType::Bf16,
        ..paged.clone()
    };
    let unmasked = KernelSpec {
        mask: MaskKind::None,
        ..paged.clone()
    };
    let unmasked_bf16 = KernelSpec {
        mask: MaskKind::None,
        ..bf16.clone()
    };
    assert!(paged.keeps_loop_bounds_in_shared() && unmasked.keeps_loop_bounds_in_shared());
    assert!(!bf16.keeps_loop_bounds_in_shared() && !unmasked_bf16.keeps_loop_bounds_in_shared());
    assert_eq!(paged.smem_bytes(), bf16.smem_bytes() + 4 * 16);
    assert_eq!(unmasked.smem_bytes(), unmasked_bf16.smem_bytes() + 4 * 8);
}

#[test]
fn every_code_changing_field_changes_the_source() {
    let b = base();
    let reference = render(&b).source;
    let mut custom_edit = sample_custom_variant_source();
    custom_edit.transform_body = "return s * params.temperature;".into();
    let variants = [
        KernelSpec {
            input_dtype: DType::Bf16,
            output_dtype: DType::Bf16,
            ..b.clone()
        },
        KernelSpec {
            output_dtype: DType::Bf16,
            ..b.clone()
        },
        KernelSpec {
            qk_accum: QkAccum::F16,
            ..b.clone()
        },
        KernelSpec {
            head_dims: HeadDims::equal(64).unwrap(),
            ..b.clone()
        },
        KernelSpec {
            head_dims: HeadDims::new(192, 128).unwrap(),
            ..b.clone()
        },
        KernelSpec {
            mask: MaskKind::SlidingWindow,
            ..b.clone()
        },
        KernelSpec {
            variant: VariantSpec::SoftCap,
            ..b.clone()
        },
        KernelSpec {
            tile: TileConfig::parse("w4q1kv64").unwrap(),
            ..b.clone()
        },
        KernelSpec {
            tile: TileConfig::parse("w4q2kv64s32").unwrap(),
            ..b.clone()
        },
        KernelSpec {
            variant: VariantSpec::Custom {
                name: "x".into(),
                source: sample_custom_variant_source(),
            },
            ..b.clone()
        },
    ];
    let mut seen = HashSet::from([reference]);
    for v in &variants {
        assert!(
            seen.insert(render(v).source),
            "{} renders like another spec",
            v.name()
        );
    }
    // Two custom snippets with the same name are different kernels (the name is only a label).
    let a = KernelSpec {
        variant: VariantSpec::Custom {
            name: "x".into(),
            source: sample_custom_variant_source(),
        },
        ..b.clone()
    };
    let c = KernelSpec {
        variant: VariantSpec::Custom {
            name: "x".into(),
            source: custom_edit,
        },
        ..b
    };
    assert_eq!(a.name(), c.name());
    assert_ne!(render(&a).source, render(&c).source);
}

#[test]
fn tiles_round_trip_through_their_labels() {
    for label in [
        "w4q2kv64",
        "w4q2kv64s32",
        "w4q1kv32",
        "w4q1kv64s16k",
        "w4q1kv64b1",
        "w4q2kv64g",
        "w8q1kv64g",
        "w4q1kv64b1g",
    ] {
        assert_eq!(TileConfig::parse(label).unwrap().label(), label);
    }
    // One K/V buffer needs one sub-tile per tile and the rows layout.
    for bad in [
        "",
        "w4",
        "w4q2kv60",
        "w4q2kv64s48",
        "w9q1kv64",
        "x4q1kv64",
        "w4q1kv64s32b1",
        "w4q1kv64s16kb1",
        // wgmma: one or two warpgroups of row warps over whole 64-key tiles.
        "w2q1kv64g",
        "w6q1kv64g",
        "w4q2kv64s32g",
        "w4q1kv32g",
        "w4q1kv64s16kg",
    ] {
        assert!(TileConfig::parse(bad).is_none(), "{bad:?} parsed");
    }
}

#[test]
fn head_dim_128_computes_whole_64_key_tiles_with_either_qk_accumulation() {
    // The 64-key tile measured faster than 32-key sub-tiles with f32 accumulators too (`attnforge
    // bench --filter d128` with `--tile` of each); no head dim depends on the accumulation today.
    let labels = |dims: HeadDims, accum| -> Vec<String> {
        TileConfig::candidates(dims, accum, KvCache::Ragged)
            .iter()
            .map(|t| t.label())
            .collect()
    };
    let d128 = HeadDims::equal(128).unwrap();
    for accum in [QkAccum::F16, QkAccum::F32] {
        assert_eq!(
            labels(d128, accum),
            ["w4q2kv64", "w4q1kv64", "w4q1kv64s16k"]
        );
    }
    for dims in [64, 256].map(|d| HeadDims::equal(d).unwrap()) {
        assert_eq!(labels(dims, QkAccum::F16), labels(dims, QkAccum::F32));
    }
}

#[test]
fn head_dim_256_single_buffers_whole_64_key_tiles_over_ragged_rows_only() {
    let d256 = HeadDims::equal(256).unwrap();
    for accum in [QkAccum::F16, QkAccum::F32] {
        let ragged = TileConfig::row_tiles_on(d256, accum, KvCache::Ragged, Arch::Sm80);
        let paged = TileConfig::row_tiles(d256, accum, KvCache::Paged);
        assert_eq!(
            ragged.iter().map(|t| t.label()).collect::<Vec<_>>(),
            ["w4q1kv64b1"]
        );
        assert_eq!(
            paged.iter().map(|t| t.label()).collect::<Vec<_>>(),
            ["w4q1kv32"]
        );
        // Both fit two CTAs per SM (at most 113 KB each on sm_90 and sm_80).
        assert_eq!(ragged[0].smem_bytes(d256), 96 * 1024);
        assert_eq!(paged[0].smem_bytes(d256), 96 * 1024);
        // On sm_90a, two warpgroups of 64 rows with two buffers come first: one CTA per SM.
        let hopper = TileConfig::row_tiles_on(d256, accum, KvCache::Ragged, Arch::Sm90a);
        assert_eq!(
            hopper.iter().map(|t| t.label()).collect::<Vec<_>>(),
            ["w8q1kv64g", "w4q1kv64b1g"]
        );
        assert_eq!(hopper[0].resident_ctas(d256, Arch::Sm90a), 1);
        assert_eq!(hopper[1].resident_ctas(d256, Arch::Sm90a), 2);
    }
    // Every other head dim keeps two buffers everywhere.
    for dims in HeadDims::all().filter(|d| d.qk() != 256) {
        for kv in KvCache::ALL {
            assert!(TileConfig::candidates(dims, QkAccum::F32, kv)
                .iter()
                .all(|t| t.kv_stages == 2));
        }
    }
    // A one-buffer tile over a paged cache is refused, saying what is supported.
    let p = AttentionProblem::new(RaggedBatch::single(64, 64).unwrap(), 4, 4, d256, DType::F16);
    let b1 = TileConfig::parse("w4q1kv64b1").unwrap();
    match KernelSpec::for_problem(&p, KvCache::Paged, b1) {
        Err(Error::Unsupported { supported, .. }) => assert!(supported.contains("ragged")),
        other => panic!("expected Unsupported, got {other:?}"),
    }
    let spec = KernelSpec::for_problem(&p, KvCache::Ragged, b1).unwrap();
    let source = render(&spec).source;
    assert!(source.contains("constexpr int KV_STAGES = 1;"));
}

#[test]
fn sm90a_takes_the_wgmma_twin_of_whole_64_key_row_tiles() {
    let twin = |dims: u32, label: &str, arch| {
        let dims = HeadDims::equal(dims as usize).unwrap();
        TileConfig::parse(label)
            .unwrap()
            .for_arch(arch, dims)
            .label()
    };
    for (dims, label, expected) in [
        // The 128-row tile: two warpgroups of 64 rows.
        (64, "w4q2kv64", "w8q1kv64g"),
        (64, "w4q1kv64", "w4q1kv64g"),
        (128, "w4q2kv64", "w8q1kv64g"),
        (128, "w4q1kv64", "w4q1kv64g"),
        (256, "w4q1kv64b1", "w4q1kv64b1g"),
        // Not whole 64-key tiles, or the key-split layout: mma.sync.
        (256, "w4q1kv32", "w4q1kv32"),
        (128, "w4q1kv64s16k", "w4q1kv64s16k"),
        (128, "w4q2kv64s32", "w4q2kv64s32"),
    ] {
        assert_eq!(twin(dims, label, Arch::Sm90a), expected);
        // Other targets keep mma.sync.
        assert_eq!(twin(dims, label, Arch::Sm80), label);
        assert_eq!(twin(dims, label, Arch::Sm89), label);
        // A twin is its own twin.
        assert_eq!(twin(dims, expected, Arch::Sm90a), expected);
    }
    // The twin keeps the rows, keys and buffers that the planner simulated.
    for dims in HeadDims::all() {
        for kv in KvCache::ALL {
            for tile in TileConfig::candidates(dims, QkAccum::F32, kv) {
                let t = tile.for_arch(Arch::Sm90a, dims);
                assert_eq!(
                    (t.cta_q(), t.kv_tile, t.kv_sub, t.kv_stages),
                    (tile.cta_q(), tile.kv_tile, tile.kv_sub, tile.kv_stages),
                    "{} -> {}",
                    tile.label(),
                    t.label()
                );
            }
        }
    }

    // A twin adds the slack that aligns its tiles to 1024 bytes, compiles for sm_90a only, and
    // the matrix holds one for every twin the planner can pick.
    let d128 = HeadDims::equal(128).unwrap();
    let g = TileConfig::parse("w4q2kv64g").unwrap();
    let plain = TileConfig::parse("w4q2kv64").unwrap();
    assert_eq!(g.smem_bytes(d128), plain.smem_bytes(d128) + 1024);
    let two_groups = TileConfig::parse("w8q1kv64g").unwrap();
    assert_eq!(two_groups.smem_bytes(d128), g.smem_bytes(d128));
    assert_eq!((two_groups.cta_q(), two_groups.threads()), (128, 256));
    assert!(
        g.runs_on(Arch::Sm90a, d128)
            && !g.runs_on(Arch::Sm80, d128)
            && !g.runs_on(Arch::Sm89, d128)
    );
    // The mma.sync tile with a twin runs everywhere but sm_90a, where the twin takes its place;
    // the key-split tile has none and runs everywhere.
    assert!(
        plain.runs_on(Arch::Sm80, d128)
            && plain.runs_on(Arch::Sm89, d128)
            && !plain.runs_on(Arch::Sm90a, d128)
    );
    let key_split = TileConfig::key_split(d128);
    assert!(key_split.runs_on(Arch::Sm90a, d128) && key_split.runs_on(Arch::Sm80, d128));
    let matrix = compile_matrix();
    for spec in matrix.iter().filter(|s| !s.tile.wgmma) {
        let t = spec.tile.for_arch(Arch::Sm90a, spec.head_dims);
        assert!(
            !t.wgmma
                || matrix.iter().any(|m| m.tile == t
                    && m.variant == spec.variant
                    && m.head_dims == spec.head_dims
                    && m.qk_accum == spec.qk_accum
                    && m.mask == spec.mask
                    && m.kv == spec.kv
                    && m.input_dtype == spec.input_dtype),
            "{} has no wgmma twin in the matrix",
            spec.name()
        );
    }
    let source = render(&KernelSpec { tile: g, ..base() }).source;
    assert!(source.contains("constexpr bool WGMMA = true;"));
    // A forced twin the kernel cannot compute is refused, saying what is supported; f16 QK
    // accumulation has twins too.
    let d192 = HeadDims::new(192, 128).unwrap();
    let p = AttentionProblem::new(RaggedBatch::single(64, 64).unwrap(), 4, 4, d192, DType::F16);
    let g1 = TileConfig::parse("w4q1kv64g").unwrap();
    match KernelSpec::for_problem(&p, KvCache::Ragged, g1) {
        Err(Error::Unsupported { supported, .. }) => {
            assert!(supported.contains("64, 128 and 256"))
        }
        other => panic!("expected Unsupported, got {other:?}"),
    }
    let f16qk = AttentionProblem::new(RaggedBatch::single(64, 64).unwrap(), 4, 4, d128, DType::F16)
        .with_qk_accum(QkAccum::F16);
    let spec = KernelSpec::for_problem(&f16qk, KvCache::Ragged, g).unwrap();
    assert!(render(&spec)
        .source
        .contains("constexpr bool QK_F16_ACCUM = true;"));
    assert!(matrix
        .iter()
        .any(|m| m.qk_accum == QkAccum::F16 && m.tile.label() == "w8q1kv64g"));
}

#[test]
fn variant_layouts_put_pointers_first_and_pack_in_declaration_order() {
    let decl = vec![
        ("a".to_string(), ParamType::F32),
        ("p".to_string(), ParamType::F32Ptr),
        ("b".to_string(), ParamType::I32),
        ("q".to_string(), ParamType::I32Ptr),
    ];
    let layout = VariantLayout::new(&decl);
    let offsets: Vec<usize> = layout.fields.iter().map(|f| f.2).collect();
    assert_eq!(offsets, vec![16, 0, 20, 8]);
    assert_eq!((layout.size, layout.align), (24, 8));
    let bytes = layout.pack(
        &[
            ParamValue::F32(1.5),
            ParamValue::F32Array(vec![]),
            ParamValue::I32(-3),
            ParamValue::I32Array(vec![]),
        ],
        &[0x1111, 0x2222],
    );
    assert_eq!(&bytes[0..8], &0x1111u64.to_le_bytes());
    assert_eq!(&bytes[8..16], &0x2222u64.to_le_bytes());
    assert_eq!(&bytes[16..20], &1.5f32.to_le_bytes());
    assert_eq!(&bytes[20..24], &(-3i32).to_le_bytes());
    // No parameters: one filler int (C++ structs are never empty).
    assert_eq!(VariantLayout::new(&[]).size, 4);
}

#[test]
fn problems_the_generator_cannot_emit_are_refused_with_the_supported_list() {
    let dims = HeadDims::equal(64).unwrap();
    let any_tile = TileConfig::row_tiles(dims, QkAccum::F32, KvCache::Ragged)[0];
    let f32_problem =
        AttentionProblem::new(RaggedBatch::single(4, 4).unwrap(), 2, 1, dims, DType::F32);
    match KernelSpec::for_problem(&f32_problem, KvCache::Ragged, any_tile) {
        Err(Error::Unsupported { supported, .. }) => assert!(supported.contains("bf16")),
        other => panic!("expected Unsupported, got {other:?}"),
    }
    let cpu_only = attnforge::problem::CustomVariant {
        name: "cpu_only".into(),
        cpu_transform: std::sync::Arc::new(|s, _| s),
        cpu_mask: None,
        cuda: None,
        param_values: vec![],
    };
    let p = AttentionProblem::new(RaggedBatch::single(4, 4).unwrap(), 2, 1, dims, DType::F16)
        .with_variant(Variant::Custom(cpu_only));
    assert!(matches!(
        KernelSpec::for_problem(&p, KvCache::Paged, any_tile),
        Err(Error::Unsupported { .. })
    ));
}

/// The fp8 kernels of the matrix are paged f32-accumulation kernels (e4m3 with every built-in
/// variant, e5m2 without a variant), named after the format, with the policy of their plain twin;
/// fp8 over ragged K/V is refused, and so is the warp-specialised tile (its paged kernels have no
/// fp8 twin).
#[test]
fn fp8_kernels_are_the_paged_kernels_per_format() {
    let matrix = compile_matrix();
    let plain: Vec<&KernelSpec> = matrix
        .iter()
        .filter(|s| {
            s.kv_fp8.is_none()
                && s.kv == KvCache::Paged
                && s.qk_accum == QkAccum::F32
                && !s.tile.warp_specialized
        })
        .collect();
    assert!(matrix
        .iter()
        .all(|s| s.kv_fp8.is_none() || !s.tile.warp_specialized));
    let fp8: Vec<&KernelSpec> = matrix.iter().filter(|s| s.kv_fp8.is_some()).collect();
    // e4m3 with the four built-in variants, e5m2 without a variant: of the five variants.
    assert_eq!(fp8.len() * 5, plain.len() * (4 + 1));
    for s in &plain {
        let e4m3 = fp8.iter().any(|f| {
            f.kv_fp8 == Some(Fp8Format::E4m3)
                && KernelSpec {
                    kv_fp8: None,
                    ..(*f).clone()
                } == **s
        });
        assert_eq!(
            e4m3,
            !matches!(s.variant, VariantSpec::Custom { .. }),
            "{}",
            s.name()
        );
    }
    for s in &fp8 {
        let twin = KernelSpec {
            kv_fp8: None,
            ..(*s).clone()
        };
        assert!(plain.contains(&&twin), "{} has no plain twin", s.name());
        let format = s.kv_fp8.unwrap();
        assert!(
            s.name().contains(&format!("_paged_{}_", format.name())),
            "{}",
            s.name()
        );
        // The same choices as the twin's, but the fp8 expansion's own and, on the key-split
        // tiles with f32 QK at head dim 128, the fragments read from the codes.
        let policy = s.policy();
        assert_eq!(
            policy.fp8_expand_unrolled,
            s.tile.split_keys,
            "{}",
            s.name()
        );
        assert_eq!(
            policy.fp8_fragments,
            s.tile.split_keys
                && !s.tile.wgmma
                && s.qk_accum == QkAccum::F32
                && s.head_dims.qk() == 128
                && s.head_dims.vo() == 128,
            "{}",
            s.name()
        );
        assert_eq!(
            PrefillPolicy {
                fp8_expand_unrolled: false,
                fp8_fragments: false,
                ..policy
            },
            twin.policy(),
            "{}",
            s.name()
        );
        let source = render(s).source;
        let constant = match format {
            Fp8Format::E4m3 => "constexpr int KV_FP8 = KV_FP8_E4M3;",
            Fp8Format::E5m2 => "constexpr int KV_FP8 = KV_FP8_E5M2;",
        };
        assert!(source.contains(constant), "{}", s.name());
    }
    assert!(matches!(
        base().with_kv_fp8(Some(Fp8Format::E4m3)),
        Err(Error::Unsupported { .. })
    ));
}

/// fp8 kernels compile for sm_80 and sm_90a within the spill budget: the causal d128 paged
/// kernels of every tile, both formats and dtypes (`attnforge compile --filter paged_e` covers
/// the rest). The accumulator-bound ones (two warpgroups on sm_90a, `w4q2kv64` on sm_80) may
/// spill within `TileConfig::SPILL_BUDGET_BYTES` (their K/V code copies' addresses beside the
/// accumulators: 4-12 B at sm_90a); the others not at all.
#[test]
fn fp8_paged_kernels_compile_within_the_spill_budget() {
    let Some(nvrtc) = nvrtc() else { return };
    let matrix = compile_matrix();
    for spec in matrix.iter().filter(|s| {
        s.kv_fp8.is_some()
            && s.head_dims == HeadDims::equal(128).unwrap()
            && s.variant == VariantSpec::None
            && s.mask == MaskKind::Causal
    }) {
        for arch in [Arch::Sm80, Arch::Sm90a] {
            if !spec.tile.runs_on(arch, spec.head_dims) {
                continue;
            }
            let r = render(spec);
            let src = KernelSource {
                name: &r.name,
                entry: &r.entry,
                source: &r.source,
                snippets: &r.snippets,
            };
            let compiled = compile(&nvrtc, &src, &CompileOptions::new(arch))
                .unwrap_or_else(|e| panic!("{} {}: {e}", r.name, arch.name()));
            let report = &compiled.report;
            let spills = report.spill_store_bytes.max(report.spill_load_bytes);
            let budget = if spec.policy().accumulator_bound {
                u64::from(TileConfig::SPILL_BUDGET_BYTES)
            } else {
                0
            };
            assert!(
                spills <= budget,
                "{} {} spills {spills} B (allowed {budget})",
                r.name,
                arch.name()
            );
        }
    }
}

fn compile_spec(spec: &KernelSpec, arch: Arch) -> Option<Result<(), JitError>> {
    let nvrtc = nvrtc()?;
    let r = render(spec);
    let src = KernelSource {
        name: &r.name,
        entry: &r.entry,
        source: &r.source,
        snippets: &r.snippets,
    };
    Some(compile(&nvrtc, &src, &CompileOptions::new(arch)).map(|_| ()))
}

#[test]
fn a_custom_variant_with_every_parameter_type_compiles() {
    let source = CudaVariantSource {
        transform_body:
            "return s * params.a + params.p[qo_head] + float(params.b + params.q[kv_head]);".into(),
        mask_body: Some("return kv_idx != params.b;".into()),
        params: vec![
            ("a".into(), ParamType::F32),
            ("p".into(), ParamType::F32Ptr),
            ("b".into(), ParamType::I32),
            ("q".into(), ParamType::I32Ptr),
        ],
    };
    let spec = KernelSpec {
        variant: VariantSpec::Custom {
            name: "mixed".into(),
            source,
        },
        ..base()
    };
    if let Some(result) = compile_spec(&spec, Arch::Sm90a) {
        result.expect("the generated layout checks hold");
    }
}

#[test]
fn a_snippet_syntax_error_is_reported_in_the_snippets_own_lines() {
    let source = CudaVariantSource {
        transform_body: "float t = s * 2.0f;\nreturn t +;\n".into(),
        mask_body: None,
        params: vec![],
    };
    let spec = KernelSpec {
        variant: VariantSpec::Custom {
            name: "broken".into(),
            source,
        },
        ..base()
    };
    let Some(result) = compile_spec(&spec, Arch::Sm80) else {
        return;
    };
    let err = result.expect_err("the snippet does not compile");
    let text = err.to_string();
    assert!(
        text.contains("custom logits_transform") && text.contains("line 2"),
        "{text}"
    );
}
