//! The GPU reference kernel's generator: names and sources across its matrix, the shared variant
//! and mask code it renders, refusals, and (with NVRTC) a sample of the matrix compiled within its
//! spill budget for sm_90a and sm_80. Running it needs a GPU: `attnforge verify --backend cuda` checks
//! it against the f64 reference on every case.

mod jit_support;

use attnforge::codegen::{
    reference_matrix, render_reference, sample_custom_variant_source, ReferenceSpec, VariantSpec,
};
use attnforge::jit::compile::compile;
use attnforge::jit::{Arch, CompileOptions, KernelSource};
use attnforge::problem::MaskKind;
use attnforge::{AttentionProblem, DType, Error, HeadDims, Mask, QkAccum, RaggedBatch};
use jit_support::nvrtc;
use std::collections::HashSet;

#[test]
fn every_reference_kernel_has_its_own_name_and_source() {
    let matrix = reference_matrix();
    // (f16 x 2 accumulations + bf16) x 4 head dims x 4 masks x 5 variants.
    assert_eq!(matrix.len(), 3 * 4 * 4 * 5);
    let (mut names, mut sources) = (HashSet::new(), HashSet::new());
    for spec in &matrix {
        let r = render_reference(spec);
        assert_eq!(r.entry, spec.name());
        assert!(r.source.contains(&format!(
            "{}(const __grid_constant__ PrefillParams params)",
            r.entry
        )));
        assert!(!r.source.contains("#include"), "no toolkit header");
        assert!(names.insert(r.entry.clone()), "duplicate name {}", r.entry);
        assert!(sources.insert(r.source), "duplicate source {}", r.entry);
    }
}

#[test]
fn the_reference_renders_the_fast_kernels_mask_and_variant_code() {
    let spec = ReferenceSpec {
        input_dtype: DType::F16,
        qk_accum: QkAccum::F16,
        head_dims: HeadDims::new(192, 128).unwrap(),
        mask: MaskKind::Custom,
        variant: VariantSpec::Custom {
            name: "sample".into(),
            source: sample_custom_variant_source(),
        },
    };
    let r = render_reference(&spec);
    for needle in [
        "constexpr bool QK_F16_ACCUM = true;",
        "constexpr int MASK_KIND = MASK_CUSTOM;",
        "constexpr int HEAD_DIM_QK = 192;",
        "__device__ __forceinline__ bool mask_visible(",
        "variant_transform(",
        "return s * params.temperature + params.head_bias[qo_head];",
        "return ((qo_idx + 2 * kv_idx) % 7) != 3;",
    ] {
        assert!(r.source.contains(needle), "missing {needle}");
    }
    assert_eq!(
        r.snippets.len(),
        10,
        "transform, transform from the accumulator, the small form's four hooks, the short form's \
         two, mask and sink"
    );
}

#[test]
fn problems_the_cuda_kernels_do_not_take_are_refused() {
    let dims = HeadDims::equal(64).unwrap();
    let f32_problem =
        AttentionProblem::new(RaggedBatch::single(4, 4).unwrap(), 2, 1, dims, DType::F32);
    assert!(matches!(
        ReferenceSpec::for_problem(&f32_problem),
        Err(Error::Unsupported { .. })
    ));
    let p = AttentionProblem::new(RaggedBatch::single(4, 4).unwrap(), 2, 1, dims, DType::Bf16)
        .with_mask(Mask::SlidingWindow { window_left: 3 });
    let spec = ReferenceSpec::for_problem(&p).unwrap();
    assert_eq!(
        spec.name(),
        "attnforge_reference_bf16_qkf32_d64x64_window_none"
    );
}

#[test]
fn a_sample_of_the_reference_matrix_compiles_within_its_spill_budget() {
    let Some(nvrtc) = nvrtc() else { return };
    let matrix = reference_matrix();
    // Every 7th kernel (7 is prime to the 5 variants and the 4 masks, so each meets each) plus
    // the heaviest: f16 accumulation, d256, custom mask and variant.
    let heaviest = matrix
        .iter()
        .position(|s| {
            s.qk_accum == QkAccum::F16
                && s.head_dims.qk() == 256
                && s.mask == MaskKind::Custom
                && matches!(s.variant, VariantSpec::Custom { .. })
        })
        .expect("in the matrix");
    let picks: Vec<&ReferenceSpec> = matrix
        .iter()
        .enumerate()
        .filter(|(i, _)| i % 7 == 0 || *i == heaviest)
        .map(|(_, s)| s)
        .collect();
    for (n, spec) in picks.iter().enumerate() {
        let r = render_reference(spec);
        let src = KernelSource {
            name: &r.entry,
            entry: &r.entry,
            source: &r.source,
            snippets: &r.snippets,
        };
        let arch = if n % 2 == 0 { Arch::Sm90a } else { Arch::Sm80 };
        let k = compile(&nvrtc, &src, &CompileOptions::new(arch))
            .unwrap_or_else(|e| panic!("{}: {e}", r.entry));
        let spill = k.report.spill_store_bytes.max(k.report.spill_load_bytes);
        assert!(
            spill <= u64::from(r.spill_budget_bytes),
            "{} spills beyond its budget: {}",
            r.entry,
            k.log
        );
    }
}
