//! Merge cases of the shared suite: random partial states for [`Backend::merge_states`]
//! (crate::verify::Backend), judged against [`merge_many`](crate::merge::merge_many) in f64.
//!
//! Each case has `num_states` states of one shape (`o [rows, heads, head_dim]` in the case's
//! dtype, values of magnitude 0.1..1 with random signs, never zero; `lse [rows, heads]` in
//! -20..20, so some states dominate by many orders of magnitude). About one LSE in six is
//! `-inf` (a state that saw no key: its `o` is filled with large values that must not leak),
//! and every seventh (row, head) has every state `-inf` (the merge must give `(0, -inf)`). The
//! list covers one, two (the pair form) and many states (more than a warp's 32), head dims that
//! are and are not multiples of 64, and the three dtypes of `o`.

use super::rng::SplitMix64;
use super::Suite;
use crate::dtype::DType;
use crate::merge::{merge_many, MergeShape};
use crate::problem::InvalidProblem;
use crate::reference::ReferenceOutput;
use crate::tensor::HostTensor;

/// One merge case.
#[derive(Clone, Debug)]
pub struct MergeCase {
    /// E.g. `merge/f16/s2/d128/r37h8`.
    pub name: String,
    /// Shape of each state.
    pub shape: MergeShape,
    /// States merged.
    pub num_states: usize,
    /// dtype of `o` (in and out).
    pub dtype: DType,
    /// Seed of the inputs.
    pub seed: u64,
}

/// Salt of the merge cases' seeds.
const SALT_MERGE: u64 = 0x3e79e;
/// What a state that saw no key holds in `o` (it must not reach the result).
const EMPTY_STATE_O: f32 = 1000.0;

/// The exact merge (f64, [`merge_many`]) of `states` as stored (each `o` widened from its
/// dtype): what a backend's merge is judged against.
pub fn merge_expected(
    shape: MergeShape,
    states: &[(HostTensor, Vec<f32>)],
) -> Result<ReferenceOutput, InvalidProblem> {
    let wide: Vec<(Vec<f64>, Vec<f64>)> = states
        .iter()
        .map(|(o, lse)| {
            (
                o.to_f32_vec().into_iter().map(f64::from).collect(),
                lse.iter().map(|&x| f64::from(x)).collect(),
            )
        })
        .collect();
    let views: Vec<(&[f64], &[f64])> = wide.iter().map(|(o, l)| (&o[..], &l[..])).collect();
    let (o, lse) = merge_many(shape, &views)?;
    Ok(ReferenceOutput { o, lse })
}

impl MergeCase {
    /// The states: `(o, lse)` per state.
    pub fn inputs(&self) -> Vec<(HostTensor, Vec<f32>)> {
        let mut rng = SplitMix64::new(self.seed);
        let (n_lse, dim) = (self.shape.lse_len(), self.shape.head_dim);
        let lses: Vec<Vec<f32>> = (0..self.num_states)
            .map(|_| {
                (0..n_lse)
                    .map(|item| {
                        if item % 7 == 3 || rng.bernoulli(1.0 / 6.0) {
                            f32::NEG_INFINITY
                        } else {
                            rng.range_f64(-20.0, 20.0) as f32
                        }
                    })
                    .collect()
            })
            .collect();
        lses.into_iter()
            .map(|lse| {
                let o: Vec<f32> = (0..n_lse * dim)
                    .map(|i| {
                        if lse[i / dim] == f32::NEG_INFINITY {
                            EMPTY_STATE_O
                        } else {
                            let m = rng.range_f64(0.1, 1.0) as f32;
                            if rng.bernoulli(0.5) {
                                -m
                            } else {
                                m
                            }
                        }
                    })
                    .collect();
                (HostTensor::from_f32(self.dtype, &o), lse)
            })
            .collect()
    }
}

/// The merge cases of `suite`.
pub fn merge_cases(suite: Suite, base_seed: u64) -> Vec<MergeCase> {
    // (states, head_dim, rows, heads)
    let mut forms = vec![(2, 128, 37, 8), (1, 64, 5, 4), (40, 96, 9, 3)];
    if suite == Suite::Full {
        forms.extend([
            (2, 256, 300, 32),
            (5, 64, 64, 2),
            (33, 512, 4, 1),
            (3, 2, 17, 5),
        ]);
    }
    let dtypes = [DType::F16, DType::Bf16, DType::F32];
    let mut rng = SplitMix64::with_salt(base_seed, SALT_MERGE);
    let mut out = Vec::new();
    for (i, &(num_states, head_dim, rows, heads)) in forms.iter().enumerate() {
        let per_form = if suite == Suite::Full { 3 } else { 2 };
        for j in 0..per_form {
            let dtype = dtypes[(i + j) % dtypes.len()];
            out.push(MergeCase {
                name: format!("merge/{dtype}/s{num_states}/d{head_dim}/r{rows}h{heads}"),
                shape: MergeShape {
                    rows,
                    heads,
                    head_dim,
                },
                num_states,
                dtype,
                seed: rng.next_u64(),
            });
        }
    }
    out
}
