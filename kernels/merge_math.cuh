// merge_math.cuh — the arithmetic of merging partial attention states, shared by the split-KV
// merge (merge_state.cuh) and the public merge kernel (merge_states.cuh).
//
// A partial state over a key set is (o_c, lse_c): the softmax-weighted mean of its values and
// the natural-log sum of exp(logit) over its keys. States over disjoint sets merge into
// lse = log(sum_c exp(lse_c)) and o = sum_c exp(lse_c - lse) o_c, computed against the largest
// LSE so that nothing overflows; when no state saw a key (every lse_c = -inf) the merge is o = 0,
// lse = -inf, never NaN.
// Requires: common.cuh.

namespace merge_math {

// The largest of `n` LSEs, lse_at(c) for c < n, read 32 at a time across the lanes so that the
// loads are in flight together; every lane gets the result.
template <class LseAt>
__device__ __forceinline__ float max_lse(int n, int lane, LseAt lse_at) {
  float mx = neg_inf();
  for (int c0 = 0; c0 < n; c0 += 32) {
    const float l = c0 + lane < n ? lse_at(c0 + lane) : neg_inf();
    mx = fmaxf(mx, warp_max(l));
  }
  return mx;
}

// exp(lse - mx): the state's weight relative to the largest; 0 for a state that saw no key.
// `mx` must be finite (callers test for the all-empty case first).
__device__ __forceinline__ float weight(float lse, float mx) { return exp2_approx((lse - mx) * LOG2E); }

// The merged natural-log LSE from the largest LSE and the sum of the weights.
__device__ __forceinline__ float merged_lse(float mx, float weight_sum) {
  return weight_sum > 0.0f ? mx + log2_approx(weight_sum) * LN2 : neg_inf();
}

}  // namespace merge_math
