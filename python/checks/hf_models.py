"""attnforge.flashinfer inside real model code: small random-initialised Llama and Gemma-2 models
of transformers 5.x, their attention registered through transformers' ``AttentionInterface`` as
``"attnforge"``, against the same models running transformers' own attention (``"sdpa"`` for
Llama; ``"eager"`` for Gemma-2, whose logit soft-cap SDPA does not have).

Models (one seed, random weights): 2 layers, hidden 256, 4 query heads over 2 KV heads, vocab
1000. Llama with head dim 64; Gemma-2 with head dim 128, a sliding window of 64 on its first
layer (a "sliding_attention" layer; the second is "full_attention"), an attention logit soft-cap
of 10 and Gemma-2's query scale (``query_pre_attn_scalar``). The default initialisation leaves
q·k so small that every softmax is nearly uniform and no soft-cap bends anything, so the q and k
projections are redrawn for attention scores of standard deviation about ``SCORE_STD``.

The "attnforge" attention function works on a step the driver sets before each forward:

- a ragged prefill: the prompts (37, 100 and 160 tokens; two exceed Gemma-2's window) packed into
  one sequence with positions restarting at each prompt, as FlashInfer takes them; every layer's
  attention is one ``BatchPrefillWithRaggedKVCacheWrapper`` run (causal, ``window_left =
  sliding_window - 1`` on sliding layers, ``logits_soft_cap`` and ``sm_scale`` from the layer),
  and its K/V are written into the layer's pages with ``append_paged_kv_cache``;
- a decode step: one new token per prompt; its K/V appended to the pages, then
  ``BatchDecodeWithPagedKVCacheWrapper`` over the pages (page size 16, NHD, K and V in one
  tensor, every request's pages scattered over the cache).

transformers gets no mask function for "attnforge", so it hands the function no mask (checked)
and keeps no KV cache (``use_cache=False``): this program's loop owns the paged cache.

Checks, per model (the table's rows):

- ``prefill logits``: the logits of the ragged prefill, every prompt position;
- ``decode logits``: the logits of the 63 decode steps of a greedy generation of 64 tokens of the
  three prompts as one batch, against transformers' logits of the same tokens (one forward of
  prompt + generated tokens, "teacher-forced");
- ``greedy tokens``: those 64 token ids against transformers' own greedy ``generate`` (its own
  KV cache), prompt by prompt;
- ``attention calls``: the function ran once per layer and forward, with the window and soft-cap
  each layer has, and never got a mask.

Metric and bound. Both sides run the model in bfloat16 (``--dtype float16`` for half), so they
differ by rounding whatever the attention does. The yardstick is a float32 copy of the very
same (already rounded) weights running transformers' attention: ``err = max |logits -
logits_fp32| / max |logits_fp32|`` over the positions and the vocabulary. attnforge passes when
its ``err`` is at most ``ERR_FACTOR`` times transformers' own low-precision ``err`` on the same
tokens plus one unit roundoff of the dtype (2^-8 for bfloat16).

Tokens. Random weights make near ties between the two best logits common, and rounding flips
them legitimately: after one flip two greedy generations go separate ways. The tokens of a
prompt pass when they are identical, or when at the first step where they differ the float32
model's logits of the two candidates are closer than the rounding both sides may make there: the
decode bound at that step (``ERR_FACTOR`` times transformers' largest logit error there, plus a
unit roundoff of the largest logit) plus transformers' own error. The steps after such a tie are
still checked by the decode row, which follows attnforge's own tokens.

Sensitivity, measured on attnforge's CPU backend: dropping Gemma-2's soft-cap gives errors of
0.3 and widening its window by 4 tokens errors of 0.6 to 0.7, against bounds near 0.06, and the
greedy-tokens row fails with either.

Runs on a CUDA GPU with torch, transformers 5.x and the attnforge wheel (``--device cpu``: the
same on attnforge's CPU backend, in under a minute); exits 0 when every row passes, 1 when one
fails, 2 when it cannot run (no torch, no GPU, no transformers 5.x, no attnforge).

    python3 python/checks/hf_models.py [--dtype bfloat16|float16] [--models llama,gemma2]
                                       [--device cuda|cpu]
"""

import argparse
import copy
import math
import sys

try:
    import torch
except ImportError:
    torch = None

PROMPT_LENS = (37, 100, 160)
NEW_TOKENS = 64
PAGE_SIZE = 16
VOCAB = 1000
SLIDING_WINDOW = 64
SOFT_CAP = 10.0
SCORE_STD = 2.5
ERR_FACTOR = 2.0
SEED = 0
WORKSPACE_BYTES = 16 << 20
DEVICE = "cuda"  # --device cpu runs the same on attnforge's CPU backend


def cannot_run(why):
    print(f"hf_models: cannot run: {why}", file=sys.stderr)
    sys.exit(2)


def import_stack(device):
    """transformers and attnforge.flashinfer, or exit 2 saying what is missing."""
    if torch is None:
        cannot_run("torch is not installed (this check runs on a GPU machine with torch)")
    if device == "cuda" and not torch.cuda.is_available():
        cannot_run("torch.cuda is not available: this check needs a CUDA GPU")
    try:
        import transformers
    except ImportError as exc:
        cannot_run(f"transformers is not importable: {exc}")
    if int(transformers.__version__.split(".")[0]) < 5:
        cannot_run(f"transformers 5.x is needed, found {transformers.__version__}")
    try:
        import attnforge
        import attnforge.flashinfer as fi
    except ImportError as exc:
        cannot_run(f"attnforge is not importable (install its wheel): {exc}")
    return transformers, attnforge, fi


# ----------------------------------------------------------------------------------------------
# The paged KV cache and the attention steps


class PagedCache:
    """Every layer's K/V pages (``[pages, 2, PAGE_SIZE, Hkv, D]``, NHD, K and V in one tensor)
    and the page table the layers share. Each request owns the pages of its final length from
    the start, drawn in a shuffled order, so its pages are scattered over the cache."""

    def __init__(self, fi, num_layers, final_lens, num_kv_heads, head_dim, dtype, generator):
        self.fi = fi
        pages = [-(-n // PAGE_SIZE) for n in final_lens]
        order = torch.randperm(sum(pages), generator=generator).tolist()
        self.owned, start = [], 0
        for p in pages:
            self.owned.append(order[start : start + p])
            start += p
        shape = (sum(pages), 2, PAGE_SIZE, num_kv_heads, head_dim)
        self.kv = [torch.zeros(shape, dtype=dtype, device=DEVICE) for _ in range(num_layers)]
        self.lens = [0] * len(final_lens)

    def grow(self, new_tokens):
        """Makes room for ``new_tokens[r]`` more tokens of each request: the page table after
        the append, on the host (for ``plan``) and on the device (for the append)."""
        self.lens = [n + a for n, a in zip(self.lens, new_tokens)]
        indptr, indices, last = [0], [], []
        for r, n in enumerate(self.lens):
            p = -(-n // PAGE_SIZE)
            indptr.append(indptr[-1] + p)
            indices += self.owned[r][:p]
            last.append(n - (p - 1) * PAGE_SIZE)
        self.table = tuple(torch.tensor(x, dtype=torch.int32) for x in (indptr, indices, last))
        self.table_dev = tuple(t.to(DEVICE) for t in self.table)
        append_indptr = torch.tensor([0, *new_tokens], device=DEVICE).cumsum(0).int()
        seq_lens = self.fi.get_seq_lens(self.table_dev[0], self.table_dev[2], PAGE_SIZE)
        self.batch_indices, self.positions = self.fi.get_batch_indices_positions(
            append_indptr, seq_lens, sum(new_tokens)
        )

    def append(self, layer, k, v):
        """Writes the new tokens' ``k``, ``v`` (``[new, Hkv, D]``, grouped by request) into the
        layer's pages."""
        indptr, indices, last = self.table_dev
        self.fi.append_paged_kv_cache(
            k.contiguous(),
            v.contiguous(),
            self.batch_indices,
            self.positions,
            self.kv[layer],
            indices,
            indptr,
            last,
            kv_layout="NHD",
        )


class Step:
    """One forward's attention: wrappers planned on first use, one per kind of layer (window,
    soft-cap, scale and heads); a new step per forward, as the page table changes."""

    def __init__(self, fi, workspace, cache):
        self.fi = fi
        self.workspace = workspace
        self.cache = cache
        self.wrappers = {}

    def wrapper(self, key, make):
        if key not in self.wrappers:
            self.wrappers[key] = make()
        return self.wrappers[key]


class RaggedPrefill(Step):
    """The prompts packed into one sequence (batch 1), each attending causally to itself."""

    def __init__(self, fi, workspace, cache, lens):
        super().__init__(fi, workspace, cache)
        self.indptr = torch.tensor([0, *lens]).cumsum(0).int()

    def attend(self, layer, q, k, v, scaling, window_left, cap):
        q3, k3, v3 = (x[0].transpose(0, 1) for x in (q, k, v))  # [tokens, heads, dim] views

        def make():
            w = self.fi.BatchPrefillWithRaggedKVCacheWrapper(self.workspace, "NHD")
            w.plan(
                self.indptr,
                self.indptr,
                q3.shape[1],
                k3.shape[1],
                q3.shape[2],
                causal=True,
                window_left=window_left,
                logits_soft_cap=cap,
                sm_scale=scaling,
                q_data_type=q3.dtype,
            )
            return w

        o = self.wrapper((window_left, cap, scaling) + tuple(k3.shape[1:]), make).run(q3, k3, v3)
        if self.cache is not None:
            self.cache.append(layer, k3, v3)
        return o[None]  # [1, tokens, heads, dim], as transformers takes it back


class PagedDecode(Step):
    """One new token per request, over the paged cache (which already holds its room)."""

    def attend(self, layer, q, k, v, scaling, window_left, cap):
        q3, k3, v3 = (x[:, :, 0] for x in (q, k, v))  # [batch, heads, dim]
        self.cache.append(layer, k3, v3)

        def make():
            w = self.fi.BatchDecodeWithPagedKVCacheWrapper(self.workspace, "NHD")
            w.plan(
                *self.cache.table,
                q3.shape[1],
                k3.shape[1],
                q3.shape[2],
                PAGE_SIZE,
                window_left=window_left,
                logits_soft_cap=cap,
                sm_scale=scaling,
                q_data_type=q3.dtype,
            )
            return w

        w = self.wrapper((window_left, cap, scaling) + tuple(k3.shape[1:]), make)
        return w.run(q3, self.cache.kv[layer])[:, None]  # [batch, 1, heads, dim]


class AttnforgeAttention:
    """The attention function registered as "attnforge": transformers calls it with
    ``query [batch, Hq, seq, D]``, ``key``/``value [batch, Hkv, seq, D]`` (after RoPE, KV heads
    not repeated) and the layer's ``scaling``, ``sliding_window`` and ``softcap``; it returns
    ``(out [batch, seq, Hq, D], None)``. Other keyword arguments (positions and the like) are
    transformers' own and not needed here."""

    def __init__(self):
        self.step = None
        self.calls = []  # (layer, window_left, soft-cap, mask given)

    def __call__(
        self,
        module,
        query,
        key,
        value,
        attention_mask,
        scaling=None,
        dropout=0.0,
        sliding_window=None,
        softcap=None,
        **kwargs,
    ):
        if self.step is None:
            raise RuntimeError("attnforge attention called outside a step set by this program")
        if dropout:
            raise NotImplementedError(f"attnforge attention: dropout={dropout}")
        window_left = -1 if sliding_window is None else int(sliding_window) - 1
        self.calls.append((module.layer_idx, window_left, softcap, attention_mask is not None))
        out = self.step.attend(module.layer_idx, query, key, value, scaling, window_left, softcap)
        return out, None


# ----------------------------------------------------------------------------------------------
# Models


def model_configs(transformers):
    """name -> (config, transformers' attention to compare with)."""
    common = {
        "vocab_size": VOCAB,
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 512,
        "bos_token_id": None,
        "eos_token_id": None,  # greedy generation runs its 64 tokens, never stopping early
    }
    llama = transformers.LlamaConfig(head_dim=64, **common)
    gemma2 = transformers.Gemma2Config(
        head_dim=128,
        query_pre_attn_scalar=128,
        sliding_window=SLIDING_WINDOW,
        layer_types=["sliding_attention", "full_attention"],
        attn_logit_softcapping=SOFT_CAP,
        final_logit_softcapping=30.0,
        **common,
    )
    return {
        "llama": (transformers.LlamaForCausalLM, llama, "sdpa"),
        "gemma2": (transformers.Gemma2ForCausalLM, gemma2, "eager"),
    }


def build(model_class, config, dtype):
    """The model with random weights in ``dtype`` and a float32 copy of those same weights."""
    torch.manual_seed(SEED)
    model = model_class(config).eval()
    for layer in model.model.layers:
        attn = layer.self_attn
        # Normalised hidden states have unit RMS, so a score scaling·q·k has standard deviation
        # scaling·sqrt(D)·hidden·std² when q and k weights are N(0, std²).
        std = math.sqrt(SCORE_STD / (attn.scaling * math.sqrt(attn.head_dim) * config.hidden_size))
        for proj in (attn.q_proj, attn.k_proj):
            torch.nn.init.normal_(proj.weight, std=std)
    low = model.to(device=DEVICE, dtype=dtype)
    return low, copy.deepcopy(low).float()


def use_attention(model, name):
    """Switches the model's attention; transformers only warns when a model cannot switch."""
    model.set_attn_implementation(name)
    if model.config._attn_implementation != name:
        raise RuntimeError(
            f"{type(model).__name__} kept attention {model.config._attn_implementation!r}"
            f" when switched to {name!r}"
        )


def prompts_for(generator):
    return [torch.randint(0, VOCAB, (n,), generator=generator).to(DEVICE) for n in PROMPT_LENS]


def forward(model, ids, positions=None):
    """float32 logits ``[batch, seq, vocab]`` of one forward without transformers' cache."""
    out = model(input_ids=ids, position_ids=positions, use_cache=False)
    return out.logits.float()


def generate_attnforge(model, backend, fi, prompts):
    """Greedy generation of NEW_TOKENS tokens of all prompts as one batch over a paged cache.
    Returns (prefill logits [sum(lens), V], step logits [batch, NEW_TOKENS, V], tokens
    [batch, NEW_TOKENS])."""
    config = model.config
    lens = [len(p) for p in prompts]
    generator = torch.Generator().manual_seed(SEED + 1)
    cache = PagedCache(
        fi,
        config.num_hidden_layers,
        [n + NEW_TOKENS for n in lens],
        config.num_key_value_heads,
        model.model.layers[0].self_attn.head_dim,
        model.dtype,
        generator,
    )
    workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=DEVICE)
    cache.grow(lens)
    backend.step = RaggedPrefill(fi, workspace, cache, lens)
    ids = torch.cat(prompts)[None]
    positions = torch.cat([torch.arange(n, device=DEVICE) for n in lens])[None]
    prefill = forward(model, ids, positions)[0]
    ends = torch.tensor(lens, device=DEVICE).cumsum(0) - 1
    step_logits = [prefill[ends]]
    tokens = [step_logits[0].argmax(-1)]
    for _ in range(1, NEW_TOKENS):
        positions = torch.tensor(cache.lens, device=DEVICE)[:, None]
        cache.grow([1] * len(prompts))
        backend.step = PagedDecode(fi, workspace, cache)
        step_logits.append(forward(model, tokens[-1][:, None], positions)[:, 0])
        tokens.append(step_logits[-1].argmax(-1))
    backend.step = None
    return prefill, torch.stack(step_logits, 1), torch.stack(tokens, 1)


def generate_transformers(model, prompt):
    """transformers' greedy generate of NEW_TOKENS tokens (its own KV cache)."""
    out = model.generate(
        input_ids=prompt[None],
        attention_mask=torch.ones_like(prompt)[None],
        max_new_tokens=NEW_TOKENS,
        do_sample=False,
    )
    new = out[0, len(prompt) :]
    if len(new) != NEW_TOKENS:
        raise RuntimeError(f"generate returned {len(new)} new tokens, expected {NEW_TOKENS}")
    return new


# ----------------------------------------------------------------------------------------------
# Checks


def rel_err(got, want):
    return ((got - want).abs().max() / want.abs().max()).item()


def logits_row(check, got, low, ref, unit):
    """A table row: ``got`` (attnforge) and ``low`` (transformers in the same dtype) against
    ``ref`` (float32)."""
    e_af, e_tf = rel_err(got, ref), rel_err(low, ref)
    bound = ERR_FACTOR * e_tf + unit
    metric = f"max|d|/max|ref| {e_af:.2e} (transformers {e_tf:.2e})"
    return (check, metric, f"<= {bound:.2e}", e_af <= bound)


def tokens_row(ours, theirs, ref_steps, low_steps, unit):
    """Tokens of each prompt: identical, or first apart at a float32 near tie: the float32
    logits of the two candidates within the decode bound at that step (``ERR_FACTOR`` times
    transformers' error there plus a unit roundoff, for attnforge) plus transformers' error."""
    parts, ok = [], True
    for r in range(len(ours)):
        differ = (ours[r] != theirs[r]).nonzero()
        if len(differ) == 0:
            parts.append(f"{NEW_TOKENS}/{NEW_TOKENS}")
            continue
        s = int(differ[0])
        ref, low = ref_steps[r][s], low_steps[r][s]
        a, b = int(ours[r, s]), int(theirs[r, s])
        gap = (ref[a] - ref[b]).abs().item()
        e_tf = (low - ref).abs().max().item()
        tol = (ERR_FACTOR + 1) * e_tf + unit * ref.abs().max().item()
        ok &= gap <= tol
        parts.append(f"{s}/{NEW_TOKENS} (then a gap of {gap:.1e} <= {tol:.1e})")
    metric = "identical: " + ", ".join(parts)
    return ("greedy tokens", metric, "same, or first apart at a tie", ok)


def calls_row(calls, config, forwards):
    """The attention function ran once per layer and forward, with each layer's window and
    soft-cap, and without a mask."""
    layers = config.num_hidden_layers
    types = getattr(config, "layer_types", None) or ["full_attention"] * layers
    cap = getattr(config, "attn_logit_softcapping", None)
    want = {
        i: (config.sliding_window - 1 if t == "sliding_attention" else -1, cap)
        for i, t in enumerate(types)
    }
    seen = {(layer, w, c) for layer, w, c, _ in calls}
    masks = sum(m for *_, m in calls)
    ok = (
        len(calls) == layers * forwards
        and seen == {(i, w, c) for i, (w, c) in want.items()}
        and masks == 0
    )
    windows = sorted({(layer, w) for layer, w, _ in seen})
    metric = f"{len(calls)} calls, (layer, window_left) {windows}, soft-cap {cap}, {masks} masks"
    return ("attention calls", metric, f"{layers * forwards} calls, no mask", ok)


def check_model(name, model_class, config, ref_impl, fi, backend, dtype):
    low, fp32 = build(model_class, config, dtype)
    prompts = prompts_for(torch.Generator().manual_seed(SEED))
    unit = torch.finfo(dtype).eps / 2

    use_attention(low, "attnforge")
    backend.calls.clear()
    prefill, steps, tokens = generate_attnforge(low, backend, fi, prompts)
    calls = list(backend.calls)

    use_attention(low, ref_impl)
    use_attention(fp32, ref_impl)
    theirs = torch.stack([generate_transformers(low, p) for p in prompts])
    # Teacher-forced: each prompt and attnforge's tokens but the last, one forward each.
    ref_prompt, low_prompt, ref_steps, low_steps = [], [], [], []
    for r, p in enumerate(prompts):
        seq = torch.cat([p, tokens[r, :-1]])[None]
        ref, lo = forward(fp32, seq)[0], forward(low, seq)[0]
        n = len(p)
        ref_prompt.append(ref[:n])
        low_prompt.append(lo[:n])
        ref_steps.append(ref[n - 1 :])  # step s predicts token s from position n - 1 + s
        low_steps.append(lo[n - 1 :])

    rows = [
        logits_row("prefill logits", prefill, torch.cat(low_prompt), torch.cat(ref_prompt), unit)
    ]
    rows.append(
        logits_row(
            "decode logits",
            steps[:, 1:],
            torch.stack(low_steps)[:, 1:],
            torch.stack(ref_steps)[:, 1:],
            unit,
        )
    )
    rows.append(tokens_row(tokens, theirs, ref_steps, low_steps, unit))
    rows.append(calls_row(calls, config, NEW_TOKENS))
    return [(name,) + row for row in rows]


def device_name():
    return torch.cuda.get_device_name() if DEVICE == "cuda" else "CPU (attnforge's CPU backend)"


def print_table(rows):
    head = ("model", "check", "metric", "bound", "result")
    cells = [head] + [(m, c, metric, b, "PASS" if ok else "FAIL") for m, c, metric, b, ok in rows]
    widths = [max(len(str(r[i])) for r in cells) for i in range(len(head))]
    for r in cells:
        print("  ".join(str(x).ljust(w) for x, w in zip(r, widths)).rstrip())


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", choices=["bfloat16", "float16"], default="bfloat16")
    parser.add_argument("--models", default="llama,gemma2", help="comma-separated: llama,gemma2")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    args = parser.parse_args()
    global DEVICE
    DEVICE = args.device
    transformers, attnforge, fi = import_stack(DEVICE)
    transformers.logging.set_verbosity_error()
    torch.set_float32_matmul_precision("highest")  # the float32 yardstick without TF32
    dtype = getattr(torch, args.dtype)
    configs = model_configs(transformers)
    names = [n for n in args.models.split(",") if n]
    unknown = [n for n in names if n not in configs]
    if unknown or not names:
        parser.error(f"--models: unknown {unknown}; choose from {sorted(configs)}")
    backend = AttnforgeAttention()
    transformers.AttentionInterface.register("attnforge", backend)
    print(
        f"torch {torch.__version__}, transformers {transformers.__version__}, attnforge "
        f"{attnforge.__version__}, {device_name()}, {args.dtype}, prompts "
        f"{list(PROMPT_LENS)}, {NEW_TOKENS} new tokens, page size {PAGE_SIZE}"
    )
    rows = []
    with torch.inference_mode():
        for name in names:
            model_class, config, ref_impl = configs[name]
            rows += check_model(name, model_class, config, ref_impl, fi, backend, dtype)
    print_table(rows)
    failed = [r for r in rows if not r[-1]]
    print(f"{len(rows) - len(failed)}/{len(rows)} checks passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
