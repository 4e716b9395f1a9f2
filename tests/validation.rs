//! Every validation error path of the problem model names the right field.

use attnforge::dtype::DType;
use attnforge::problem::{
    AttentionProblem, CudaVariantSource, CustomMask, CustomVariant, HeadDims, InvalidProblem,
    LogitSite, Mask, ParamType, ParamValue, QkAccum, RaggedBatch, TensorView, Variant,
};
use attnforge::reference;
use attnforge::tensor::HostTensor;
use attnforge::testing::random_inputs;
use std::sync::Arc;

fn base() -> AttentionProblem {
    AttentionProblem::new(
        RaggedBatch::from_lens(&[(2, 3), (1, 4)]).unwrap(),
        4,
        2,
        HeadDims::equal(64).unwrap(),
        DType::F16,
    )
}

/// Checks `validate()` fails on `field`, and that the reference (an entry point) returns the same.
fn expect(p: &AttentionProblem, field: &str) -> InvalidProblem {
    let err = p.validate().unwrap_err();
    assert_eq!(err.field, field, "{err}");
    let (q, k, v) = random_inputs(&base(), 0);
    let ref_err = reference::attention(p, &q, &k, &v).unwrap_err();
    assert_eq!(ref_err.field, field, "reference: {ref_err}");
    err
}

#[test]
fn the_base_problem_is_valid() {
    let p = base();
    let (q, k, v) = random_inputs(&p, 0);
    p.validate_inputs(&q, &k, &v).unwrap();
}

#[test]
fn batches_beyond_32_bit_token_indices_are_errors_naming_the_request() {
    let big = i32::MAX as usize;
    let err = RaggedBatch::from_lens(&[(1, 5), (big, 5)]).unwrap_err();
    assert_eq!(err.field, "qo_indptr");
    assert!(err.reason.contains("request 1"), "{err}");
    let err = RaggedBatch::from_lens(&[(1, big), (1, 1)]).unwrap_err();
    assert_eq!(err.field, "kv_indptr");
    assert!(err.reason.contains("request 1"), "{err}");
    assert!(RaggedBatch::single(usize::MAX, 1).is_err());
    let fits = RaggedBatch::from_lens(&[(big - 1, 1), (1, 1)]).unwrap();
    assert_eq!(fits.qo_indptr, vec![0, i32::MAX - 1, i32::MAX]);
}

#[test]
fn indptr_errors() {
    let mut p = base();
    p.batch.kv_indptr.push(9);
    expect(&p, "kv_indptr");

    let mut p = base();
    p.batch.qo_indptr = vec![0, 2, 1];
    let err = expect(&p, "qo_indptr[2]");
    assert!(err.reason.contains("must not decrease"), "{err}");

    let mut p = base();
    p.batch.kv_indptr = vec![1, 3, 7];
    expect(&p, "kv_indptr[0]");

    let mut p = base();
    p.batch.qo_indptr = vec![];
    expect(&p, "qo_indptr");
}

#[test]
fn head_errors() {
    let mut p = base();
    p.num_kv_heads = 3;
    let err = expect(&p, "num_kv_heads");
    assert!(
        err.reason.contains('3') && err.reason.contains('4'),
        "{err}"
    );
    let mut p = base();
    p.num_qo_heads = 0;
    expect(&p, "num_qo_heads");
    let mut p = base();
    p.num_kv_heads = 0;
    expect(&p, "num_kv_heads");
}

#[test]
fn unsupported_head_dim_lists_the_supported_ones() {
    for (qk, vo) in [(72, 72), (128, 64), (96, 96)] {
        let err = HeadDims::new(qk, vo).unwrap_err();
        assert_eq!(err.field, "head_dim");
        assert!(err.reason.contains(&qk.to_string()), "{err}");
        for supported in ["(64, 64)", "(128, 128)", "(256, 256)", "(192, 128)"] {
            assert!(err.reason.contains(supported), "{err}");
        }
    }
    assert_eq!(HeadDims::parse("72").unwrap_err().field, "head_dim");
}

#[test]
fn variant_errors() {
    for cap in [f32::NAN, 0.0, -1.0, f32::INFINITY] {
        expect(&base().with_variant(Variant::SoftCap { cap }), "soft_cap");
    }
    expect(
        &base().with_variant(Variant::Alibi {
            slopes: vec![0.5; 3],
        }),
        "alibi_slopes",
    );
    expect(
        &base().with_variant(Variant::Sinks {
            sinks: vec![0.0, f32::NAN, 0.0, 0.0],
        }),
        "sinks[1]",
    );
    let custom = |name: &str, params: Vec<(String, ParamType)>, values: Vec<ParamValue>| {
        Variant::Custom(CustomVariant {
            name: name.into(),
            cpu_transform: Arc::new(|s: f32, _: &LogitSite| s),
            cpu_mask: None,
            cuda: Some(CudaVariantSource {
                transform_body: "return s;".into(),
                mask_body: None,
                params,
            }),
            param_values: values,
        })
    };
    expect(
        &base().with_variant(custom("9bad", vec![], vec![])),
        "custom variant name",
    );
    expect(
        &base().with_variant(custom("ok", vec![("t".into(), ParamType::F32)], vec![])),
        "custom variant parameters",
    );
    expect(
        &base().with_variant(custom(
            "ok",
            vec![("t".into(), ParamType::F32)],
            vec![ParamValue::I32(1)],
        )),
        "custom variant parameter t",
    );
}

#[test]
fn mask_errors() {
    expect(
        &base().with_mask(Mask::SlidingWindow { window_left: -1 }),
        "window_left",
    );
    // Request 1 is 1 x 4 = 4 bits (1 byte); request 0 is 2 x 3 = 6 bits (1 byte).
    let short = CustomMask {
        packed: vec![0xff],
        mask_indptr: vec![0, 1, 1],
    };
    let err = expect(
        &base().with_mask(Mask::Custom(short)),
        "custom mask of request 1",
    );
    assert!(err.reason.contains("needs 1"), "{err}");
    let wrong_count = CustomMask {
        packed: vec![0xff; 2],
        mask_indptr: vec![0, 2],
    };
    expect(&base().with_mask(Mask::Custom(wrong_count)), "mask_indptr");
    let past_end = CustomMask {
        packed: vec![0xff],
        mask_indptr: vec![0, 1, 2],
    };
    expect(&base().with_mask(Mask::Custom(past_end)), "custom mask");
}

#[test]
fn dtype_and_scale_errors() {
    let mut p = base();
    p.input_dtype = DType::Bf16;
    p.output_dtype = DType::Bf16;
    p.qk_accum = QkAccum::F16;
    assert_eq!(p.validate().unwrap_err().field, "qk_accum");
    let mut p = base();
    p.output_dtype = DType::F32;
    expect(&p, "output_dtype");
    for scale in [0.0, -0.1, f32::NAN, f32::INFINITY] {
        expect(&base().with_sm_scale(scale), "sm_scale");
    }
}

#[test]
fn buffer_errors() {
    let p = base();
    let (q, k, v) = random_inputs(&p, 0);
    let f32_k = HostTensor::from_f32(DType::F32, &k.to_f32_vec());
    assert_eq!(p.validate_inputs(&q, &f32_k, &v).unwrap_err().field, "k");
    let short_v = HostTensor::from_f32(DType::F16, &v.to_f32_vec()[1..]);
    let err = p.validate_inputs(&q, &k, &short_v).unwrap_err();
    assert_eq!(err.field, "v");
    assert_eq!(
        reference::attention(&p, &q, &k, &short_v)
            .unwrap_err()
            .field,
        "v"
    );

    let mut p = base();
    p.k_view = TensorView {
        offset: 0,
        token_stride: 128,
        head_stride: 32,
    };
    assert_eq!(
        p.validate_inputs(&q, &k, &v).unwrap_err().field,
        "k head stride"
    );
    let mut p = base();
    p.q_view = TensorView {
        offset: 0,
        token_stride: 100,
        head_stride: 64,
    };
    assert_eq!(
        p.validate_inputs(&q, &k, &v).unwrap_err().field,
        "q token stride"
    );
    let mut p = base();
    p.q_view.offset = 1;
    assert_eq!(p.validate_inputs(&q, &k, &v).unwrap_err().field, "q");
}
