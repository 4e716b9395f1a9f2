"""The peer of the paged suite's append shapes (`append: true`) for bench/peers.py: FlashInfer's
`flashinfer.page.append_paged_kv_cache`, writing each request's new K/V rows (f16, copies of
[total_new, num_kv_heads, head_dim]) into an NHD cache of separate K and V pages, as
`attnforge bench` times its own append (cli/src/bench/append.rs): the new rows rotate among
copies, the cache is one pair of buffers rewritten by every call.

FlashInfer takes the new tokens in COO form (batch_indices, positions: PagedShape's
append_positions), computed once outside the timed call like a wrapper's plan(), and the page
table of the cache after the append.

An fp8 cache (kv_dtype) is "missing": in FlashInfer 0.5.3 append_paged_kv_cache has no scale
argument, and its CUDA side (csrc/page.cu) dispatches one element type for the new rows and the
cache, so it copies rows already of the cache's dtype and cannot quantise f16 rows.

The check: after one call, every new token's K and V, gathered from the pages through the page
table, must equal the new rows exactly.

torch is passed in, never imported here.
"""

from peers_check import gather_pages

IMPL_FI_APPEND = "flashinfer-append"
FP8_MISSING = ("missing: flashinfer.page.append_paged_kv_cache (0.5.3) takes no scale and writes "
               "rows of the cache's own dtype: it has no quantising append from f16 rows")


def make_append_inputs(torch, shape, copy_count, randn, device="cuda"):
    """copy_count random-normal copies of the new K and V rows, one cache pair (NaN, so a token
    the append misses shows), and the shape's index arrays as int32 tensors; randn(*size) draws
    values of the shape's dtype."""
    k_size, v_size = shape.kv_sizes()
    total_new = sum(shape.qo_lens)
    dtype = {"f16": torch.float16, "bf16": torch.bfloat16}[shape.dtype]
    inputs = {"dtype": dtype, "kv_dtype": dtype,
              "k_new": [randn(total_new, shape.hkv, shape.d_qk) for _ in range(copy_count)],
              "v_new": [randn(total_new, shape.hkv, shape.d_vo) for _ in range(copy_count)],
              "k_cache": torch.full(k_size, float("nan"), dtype=dtype, device=device),
              "v_cache": torch.full(v_size, float("nan"), dtype=dtype, device=device)}
    for name, values in shape.index_arrays().items():
        inputs[name] = torch.tensor(values, dtype=torch.int32, device=device)
    return inputs


def check_append(torch, shape, inputs):
    """(None, problem or None): whether the cache holds copy 0's new rows at every new token's
    page slot, exactly (there is no error to report: rel_err None)."""
    k_new, v_new = inputs["k_new"][0], inputs["v_new"][0]
    start = 0
    for r, (n, kl) in enumerate(zip(shape.qo_lens, shape.kv_lens)):
        ids = shape.kv_page_indices[shape.kv_page_indptr[r]:shape.kv_page_indptr[r + 1]]
        for name, cache, new in (("k", inputs["k_cache"], k_new), ("v", inputs["v_cache"], v_new)):
            got = gather_pages(torch, cache, ids, kl)[kl - n:kl]
            if not torch.equal(got, new[start:start + n]):
                return None, f"request {r}: its new {name} rows are not in its pages"
        start += n
    return None, None


class FlashInferAppend:
    """flashinfer.page.append_paged_kv_cache on the append shapes (NHD, separate K and V)."""

    def __init__(self, lib, name=IMPL_FI_APPEND):
        self.lib = lib
        self.name = name

    def applies(self, shape):
        return getattr(shape, "append", False)

    def unsupported(self, shape):
        missing = self.lib.missing() if self.lib else None
        if missing:
            return missing
        return FP8_MISSING if shape.kv_dtype else None

    def config_key(self, shape):
        return ("page", "append", shape.dtype)  # FlashInfer's page module, built on first use

    def setup(self, shape, inputs, copy_count):
        fi = self.lib.module
        ks, vs = inputs["k_new"], inputs["v_new"]
        cache = (inputs["k_cache"], inputs["v_cache"])
        coo = (inputs["batch_indices"], inputs["positions"])
        table = (inputs["kv_page_indices"], inputs["kv_page_indptr"], inputs["kv_last_page_len"])

        def run(i):
            fi.append_paged_kv_cache(ks[i], vs[i], *coo, cache, *table, kv_layout="NHD")
            return cache
        return run, (lambda o: o), \
            f"append_paged_kv_cache, NHD pages of {shape.page_size} (batch_indices and " \
            "positions computed untimed)"

    def check(self, torch, shape, inputs, out):
        """peers.py's check of one call's output (here the cache it wrote)."""
        return check_append(torch, shape, inputs)
