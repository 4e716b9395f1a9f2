//! The fast CPU backend against the exact reference, on the shapes of `docs/benchmarks.md`.
//!
//! `cargo bench --bench cpu_backend` (divan). The headline shape is (1 request, 2048 tokens,
//! 32/8 heads, D=128, causal, f32), the one `bench/torch_cpu_sdpa.py` times PyTorch's CPU
//! `scaled_dot_product_attention` on. The reference is benchmarked on smaller shapes only: it
//! computes each row on its own in f64 and is meant to be right, not fast.

use attnforge::cpu::{self, Isa};
use attnforge::reference;
use attnforge::testing::random_inputs;
use attnforge::{AttentionProblem, DType, HeadDims, HostTensor, Mask, RaggedBatch};

/// `(name, tokens, query heads, kv heads, head dim, causal)`, all f32, one request.
const SHAPES: [(&str, usize, usize, usize, usize, bool); 4] = [
    ("llama_2048_causal", 2048, 32, 8, 128, true),
    ("llama_512_causal", 512, 32, 8, 128, true),
    ("mha_512_full_d64", 512, 8, 8, 64, false),
    ("gqa_256_causal_d256", 256, 16, 8, 256, true),
];

/// Shapes small enough to run the reference on.
const REFERENCE_SHAPES: [&str; 3] = [
    "llama_512_causal",
    "mha_512_full_d64",
    "gqa_256_causal_d256",
];

fn problem(name: &str) -> (AttentionProblem, (HostTensor, HostTensor, HostTensor)) {
    let (_, n, hq, hkv, d, causal) = SHAPES
        .into_iter()
        .find(|s| s.0 == name)
        .expect("the name comes from SHAPES");
    let dims = HeadDims::equal(d).expect("the shapes use supported head dims");
    let mask = if causal { Mask::Causal } else { Mask::None };
    let p = AttentionProblem::new(
        RaggedBatch::single(n, n).unwrap(),
        hq,
        hkv,
        dims,
        DType::F32,
    )
    .with_mask(mask);
    let inputs = random_inputs(&p, 1);
    (p, inputs)
}

fn main() {
    divan::main();
}

#[divan::bench(args = SHAPES.map(|s| s.0), sample_count = 5, sample_size = 1)]
fn cpu_backend(bencher: divan::Bencher, name: &str) {
    let (p, (q, k, v)) = problem(name);
    bencher.bench(|| cpu::attention(&p, &q, &k, &v).expect("valid problem"));
}

#[divan::bench(args = ["llama_512_causal"], sample_count = 5, sample_size = 1)]
fn cpu_backend_portable(bencher: divan::Bencher, name: &str) {
    let (p, (q, k, v)) = problem(name);
    bencher
        .bench(|| cpu::attention_with_isa(&p, &q, &k, &v, Isa::Portable).expect("valid problem"));
}

#[divan::bench(args = REFERENCE_SHAPES, sample_count = 3, sample_size = 1)]
fn reference_f64(bencher: divan::Bencher, name: &str) {
    let (p, (q, k, v)) = problem(name);
    bencher.bench(|| reference::attention(&p, &q, &k, &v).expect("valid problem"));
}
