"""CPU tests of kdtree.integrations.transformers (torch backend, tiny DeepSeek-V3 and Qwen3 configs trained for
a few seconds as in the DDTree example): greedy DDTree equals the model's own generate(do_sample=False) under the
near-tie rule (float32 model, float32 and bf16 cache), the SDPA dense-mask verification gives the same tokens,
the sampling TV test, the cost-chosen budget, and the errors a user can hit. Skipped without transformers."""
import os
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers", reason="transformers is not installed (pip install 'transformers>=5.17,<6')")

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from examples.ddtree import hf  # noqa: E402
from kdtree.integrations import transformers as kt  # noqa: E402

ARCHS = ["deepseek-tiny", "qwen3-tiny"]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


_models = {}


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("hf-cache"))


def models(preset, cache_dir):
    if preset not in _models:
        old = os.environ.get("KDTREE_DDTREE_CACHE")
        os.environ["KDTREE_DDTREE_CACHE"] = cache_dir
        try:
            _models[preset] = hf.get_models(preset, "cpu", log=lambda *a: None)
        finally:
            if old is None:
                del os.environ["KDTREE_DDTREE_CACHE"]
            else:
                os.environ["KDTREE_DDTREE_CACHE"] = old
    return _models[preset]


def prompts(preset):
    return hf.prompts(preset, [20, 33, 9, 41], seed=3)


@pytest.mark.parametrize("preset", ARCHS)
@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16])
def test_greedy_equals_generate(preset, cache_dtype, cache_dir):
    """greedy DDTree[budget 15, top-4, page 16] == model.generate(do_sample=False), 4 prompts x 32 tokens,
    every divergence at a near-tie (the float32 model; the cache and attention in float32 or bf16)."""
    model, drafter, dcfg, _ = models(preset, cache_dir)
    dec = hf.decoder(model, drafter, dcfg, backend="torch", budget=15, top_k=4, page_size=16, cache_dtype=cache_dtype)
    g = hf.greedy_vs_generate(model, dec, prompts(preset), max_new=32)
    assert g["other_divergences"] == 0, (g["numeric_margin_noise"], g["requests"])
    assert g["near_tie_divergences"] <= 1, g["requests"]
    assert g["mean_tokens_per_step"] > 1.2  # the drafter is predictive
    if cache_dtype == torch.float32:
        assert g["equal"] == len(g["requests"])


@pytest.mark.parametrize("preset", ARCHS)
def test_greedy_all_bf16_and_sdpa_reference(preset, cache_dir):
    """A bf16 model with a bf16 cache, verified by kdtree's path and by SDPA over a dense ancestor mask: both
    agree with generate() under the near-tie rule; auto budget too."""
    model, drafter, dcfg, _ = models(preset, cache_dir)
    import copy
    m16 = copy.deepcopy(model).to(torch.bfloat16)
    d16 = copy.deepcopy(drafter).to(torch.bfloat16)
    ps = prompts(preset)[:2]
    for kw in (dict(attention="verify"), dict(attention="sdpa"), dict(budget="auto")):
        dec = hf.decoder(m16, d16, dcfg, backend="torch", top_k=4, page_size=16, **{"budget": 15, **kw})
        g = hf.greedy_vs_generate(m16, dec, ps, max_new=24)
        assert g["other_divergences"] == 0, (kw, g["numeric_margin_noise"], g["requests"])


def test_sampling_matches_one_token_rounds(cache_dir):
    model, drafter, dcfg, _ = models("qwen3-tiny", cache_dir)
    dec = hf.decoder(model, drafter, dcfg, backend="torch", budget=15, top_k=4, page_size=16, temperature=1.0,
                     seed=11)
    r = hf.sampling_tv(dec, prompts("qwen3-tiny")[1], n_samples=300, chunk=300, rounds=300)
    for name, st in r["stats"].items():
        assert st["tv"] <= st["threshold"], (name, st)
    assert r["coupled_identical_fraction"] == 1.0


def test_mla_absorbed_path_equals_model_logits(cache_dir):
    """The absorbed MLA forward over the paged latent cache reproduces the model's own logits (float32)."""
    model, drafter, dcfg, _ = models("deepseek-tiny", cache_dir)
    assert_absorbed_logits_equal_the_models(model, drafter, dcfg, prompts("deepseek-tiny")[1])


def assert_absorbed_logits_equal_the_models(model, drafter, dcfg, p):
    """The logits of p's last token through the decoder (float32; p[:-1] prefilled through the same path) equal
    the model's own forward over p."""
    dec = hf.decoder(model, drafter, dcfg, backend="torch", budget=4, top_k=4, page_size=16,
                     cache_dtype=torch.float32)
    dec.generate([p[:2]], 1, mode="ar")  # allocates and prefills
    full = model(torch.tensor([p])).logits[0]
    dec._admit([p], 1, None, None)  # prefill p[:-1] through the kdtree path
    dec.mode, dec.record_margins = "ar", False
    stages = dict(dec._stages())
    stages["target"]()
    assert torch.allclose(dec.s["logits"][0], full[len(p) - 1], atol=1e-4, rtol=1e-4)


YARN = dict(rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=256, beta_fast=32.0,
            beta_slow=1.0, mscale=0.707, mscale_all_dim=0.707)


@pytest.mark.parametrize("model_type,rope", [("deepseek_v2", {}), ("deepseek_v2", dict(rope_parameters=YARN)),
                                             ("deepseek_v3", {}), ("deepseek_v3", dict(rope_parameters=YARN)),
                                             ("deepseek_v3", dict(rope_parameters=YARN, rope_interleave=False))],
                         ids=["v2", "v2-yarn", "v3", "v3-yarn", "v3-yarn-rotate-half"])
def test_mla_absorbed_path_equals_model_logits_for_each_rope(model_type, rope):
    """The absorbed forward takes the module's own RoPE (V2's complex frequencies, V3's interleaved or rotate-half
    tables) and its own softmax scale (YaRN's mscale folded in, 0.2131 here against 0.1768 without): the logits at
    the last token of a 60-token prompt, which attend over the 59 rows its prefill wrote through the same path,
    equal the model's own (float32)."""
    m, drafter, dcfg = hf.untrained(model_type, **rope)
    assert_absorbed_logits_equal_the_models(m, drafter, dcfg, [(7 * i + 3) % 256 for i in range(60)])


def test_auto_budget_reports_its_choices(cache_dir):
    model, drafter, dcfg, _ = models("qwen3-tiny", cache_dir)
    dec = hf.decoder(model, drafter, dcfg, backend="torch", budget="auto", top_k=4, page_size=16,
                     auto_budgets=(4, 8, 16))
    out = dec.generate(prompts("qwen3-tiny")[:3], 16)
    assert dec.costs.has(3, (4, 8, 16))
    assert set(out.budgets) <= {4, 8, 16} and len(out.budgets) == out.steps


@pytest.mark.parametrize("preset", ARCHS)
@pytest.mark.parametrize("budget", [3, "auto"])
def test_greedy_with_batch_allocation_equals_generate(preset, budget, cache_dir):
    """alloc "batch" (a round's B x budget draft nodes to the batch's most likely, packed through node_indptr):
    greedy DDTree still equals generate() under the near-tie rule, fixed and auto budgets, MLA and GQA; its
    rounds give requests different node counts, each a prefix of the request's tree at the width's cap."""
    model, drafter, dcfg, _ = models(preset, cache_dir)
    dec = hf.decoder(model, drafter, dcfg, backend="torch", budget=budget, top_k=4, page_size=16, alloc="batch",
                     auto_budgets=(2, 4, 8))
    g = hf.greedy_vs_generate(model, dec, prompts(preset), max_new=32)
    assert g["other_divergences"] == 0, (g["numeric_margin_noise"], g["requests"])
    assert g["near_tie_divergences"] <= 1, g["requests"]
    assert g["mean_tokens_per_step"] > 1.2
    a, n = dec.s["alloc"], dec.s["budget"]
    B = len(prompts(preset))
    assert int(a.counts.sum()) == B * (n + 1) and a.indptr.tolist()[-1] == B * (n + 1)
    assert int(a.counts.max()) <= dec.cap_of(n) + 1


def test_batch_allocation_moves_nodes_between_requests(cache_dir):
    """Over a batch whose drafter confidence differs, some batch-allocated round gives requests different node
    counts (else the allocation would be the uniform one)."""
    model, drafter, dcfg, _ = models("qwen3-tiny", cache_dir)
    dec = hf.decoder(model, drafter, dcfg, backend="torch", budget=4, top_k=4, page_size=16, alloc="batch")
    uneven = []
    stages = dec._stages

    def spy(budget=None):
        out = stages(budget)
        names = [n for n, _ in out]
        i = names.index("allocate")
        f = out[i][1]

        def alloc():
            f()
            c = dec.s["alloc"].counts
            uneven.append(int(c.max()) != int(c.min()))
        out[i] = ("allocate", alloc)
        return out

    dec._stages = spy
    dec.generate(prompts("qwen3-tiny"), 16)
    assert any(uneven)


def test_batch_allocation_of_one_request_runs_the_uniform_round(cache_dir):
    """A batch of one takes the whole allocation (its budget): the decoder runs the uniform round and auto's
    record has no allocation columns; a larger batch after it allocates again."""
    model, drafter, dcfg, _ = models("qwen3-tiny", cache_dir)
    dec = hf.decoder(model, drafter, dcfg, backend="torch", budget="auto", top_k=4, page_size=16, alloc="batch",
                     auto_budgets=(2, 4))
    ps = prompts("qwen3-tiny")
    one = dec.generate(ps[:1], 12)
    assert "allocate" not in dict(dec._stages(4)) and dec.autob.alloc_caps is None
    ref = hf.decoder(model, drafter, dcfg, backend="torch", budget=4, top_k=4, page_size=16)
    assert one.tokens == ref.generate(ps[:1], 12).tokens  # greedy, float32: the text of any budget
    dec.generate(ps[:3], 12)
    assert "allocate" in dict(dec._stages(4)) and dec.autob.alloc_caps is not None


def test_batch_allocation_at_a_width_filling_budget_runs_the_uniform_round(cache_dir):
    """Budget 15 over trees of width 16 gives every request its cap: the uniform round (no 'allocate' stage); auto
    over 4 and 15 records both kinds of round and still equals generate()."""
    model, drafter, dcfg, _ = models("qwen3-tiny", cache_dir)
    dec = hf.decoder(model, drafter, dcfg, backend="torch", budget="auto", top_k=4, page_size=16, alloc="batch",
                     auto_budgets=(4, 15))
    g = hf.greedy_vs_generate(model, dec, prompts("qwen3-tiny"), max_new=24)
    assert g["other_divergences"] == 0, g["requests"]
    assert "allocate" not in dict(dec._stages(15)) and "allocate" in dict(dec._stages(4))


# ----------------------------------------------------------------------------- errors


def test_alloc_is_checked(cache_dir):
    model, drafter, dcfg, _ = models("qwen3-tiny", cache_dir)
    with pytest.raises(ValueError, match="alloc must be 'request' or 'batch'"):
        hf.decoder(model, drafter, dcfg, backend="torch", alloc="tree")
    with pytest.raises(ValueError, match="attention='sdpa'"):
        hf.decoder(model, drafter, dcfg, backend="torch", alloc="batch", attention="sdpa")


def test_unsupported_model_family():
    from transformers import GPT2Config, GPT2LMHeadModel
    m = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64))
    with pytest.raises(ValueError, match="GPT2LMHeadModel is not supported; supported models: "
                                         "DeepseekV2ForCausalLM, DeepseekV3ForCausalLM, GemmaForCausalLM"):
        kt.DDTreeDecoder(m, backend="torch")


def test_unsupported_head_layout_names_the_head_dim():
    from transformers import Qwen3Config, Qwen3ForCausalLM
    m = Qwen3ForCausalLM(Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                     num_attention_heads=2, num_key_value_heads=1, head_dim=16))
    with pytest.raises(ValueError, match="head_dim 16 has no kdtree GQA kernel; supported head dims: 64, 128, 256"):
        kt.DDTreeDecoder(m, backend="kdtree")
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM
    d = DeepseekV3ForCausalLM(DeepseekV3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                               num_attention_heads=2, kv_lora_rank=32, qk_rope_head_dim=16,
                                               qk_nope_head_dim=16, v_head_dim=16, q_lora_rank=None,
                                               first_k_dense_replace=1))
    with pytest.raises(ValueError, match=r"kv_lora_rank \+ qk_rope_head_dim = 512 \+ 64; this model has 32 \+ 16"):
        kt.DDTreeDecoder(d, backend="kdtree")


def test_cache_too_small_names_the_sizes(cache_dir):
    model, drafter, dcfg, _ = models("qwen3-tiny", cache_dir)
    dec = hf.decoder(model, drafter, dcfg, backend="torch", budget=15, top_k=4, page_size=16)
    with pytest.raises(ValueError, match=r"KV cache is too small: a batch of 2 requests needs \d+ pages of 16 tokens"):
        dec.generate(prompts("qwen3-tiny")[:2], 16, num_pages=3)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        dec.generate([[1] * 1000], 100)


def test_without_transformers_is_a_clear_import_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(ImportError, match=r"pip install .kdtree\[transformers\]."):
        kt.DDTreeDecoder(object())


def test_greedy_check_fails_without_kv_compact(cache_dir):
    """Negative control: skipping kv_compact keeps rejected nodes' KV rows and the output diverges. The
    drafter's first two guesses are swapped so that accepted paths leave the tree's first branch (a path of
    nodes 0, 1, 2, ... needs no move, and a well-trained drafter's often is one)."""
    moves = []

    class NoCompact:
        def __getattr__(self, name):
            return getattr(kt.load_ops("torch"), name)

        @staticmethod
        def kv_compact(k_cache, page_table, kv_total, node_counts, path, accepted, **k):
            steps = torch.arange(path.shape[1], device=path.device)
            moved = (path != steps) & (steps < accepted[:, None].long())
            moves.append(int(moved.sum()))

    class SwappedDrafter:
        def __init__(self, inner):
            self.inner, self.depth = inner, inner.depth

        def topk(self, hidden, root, k):
            tokens, logprobs = self.inner.topk(hidden, root, k)
            return tokens[..., [1, 0] + list(range(2, k))].contiguous(), logprobs

    model, drafter, dcfg, _ = models("qwen3-tiny", cache_dir)
    dec = hf.decoder(model, drafter, dcfg, backend="torch", budget=15, top_k=4, page_size=16)
    dec.drafter = SwappedDrafter(dec.drafter)
    right = hf.greedy_vs_generate(model, dec, prompts("qwen3-tiny"), max_new=32)
    assert right["other_divergences"] == 0
    dec.ops = NoCompact()
    # Judged by the right run's noise: the stale rows move the margins where the tokens still agree too.
    g = hf.greedy_vs_generate(model, dec, prompts("qwen3-tiny"), max_new=32, noise=right["numeric_margin_noise"])
    assert sum(moves) > 0, "no accepted path needed a KV move: the control cannot see kv_compact"
    # The broken run must fail the check: a divergence the right run's noise does not excuse or, since a tiny
    # model need not flip a token in 32, top-2 margins moved far past that noise where the tokens agree.
    noise, broken = right["numeric_margin_noise"], g["measured_margin_noise"]
    assert g["other_divergences"] > 0 or broken > 10 * noise, (noise, broken, g["requests"])


def test_end_of_sequence_ends_a_request_as_generate_does(cache_dir):
    """tokens end at the first end-of-sequence id (given, or the model's generation_config's by default)."""
    model, drafter, dcfg, _ = models("qwen3-tiny", cache_dir)
    dec = hf.decoder(model, drafter, dcfg, backend="torch", budget=15, top_k=4, page_size=16,
                     cache_dtype=torch.float32)
    ps = prompts("qwen3-tiny")[:2]
    full = dec.generate(ps, 16, eos_token_id=None).tokens
    eos = full[0][3]
    cut = [row[:row.index(eos) + 1] if eos in row else row for row in full]
    assert dec.generate(ps, 16, eos_token_id=eos).tokens == cut
    assert dec.generate(ps, 16, eos_token_id=[12345, eos]).tokens == cut
    old = model.generation_config.eos_token_id
    model.generation_config.eos_token_id = eos
    try:
        assert dec.generate(ps, 16).tokens == cut
    finally:
        model.generation_config.eos_token_id = old
    with pytest.raises(TypeError, match=r"^eos_token_id: expected an int"):
        dec.generate(ps, 4, eos_token_id="</s>")


def test_positions_are_checked_against_the_positions_a_decode_reaches(cache_dir):
    """The last round's tree reaches prompt + max_new + depth - 1; the cache holds a tree more, which is no
    position (a prompt that ends there used to be refused)."""
    model, drafter, dcfg, _ = models("qwen3-tiny", cache_dir)
    dec = hf.decoder(model, drafter, dcfg, backend="torch", budget=15, top_k=4, page_size=16,
                     cache_dtype=torch.float32)
    top, new, D = model.config.max_position_embeddings, 4, dcfg.draft_depth
    p = (prompts("qwen3-tiny")[3] * 64)[: top - new - D]
    assert len(dec.generate([p], new).tokens[0]) == new
    with pytest.raises(ValueError, match=rf"reach position {top}, beyond the model's max_position_embeddings {top}"):
        dec.generate([p + [1]], new)


def test_prompts_stream_ids_and_page_size_are_checked(cache_dir):
    model, drafter, dcfg, _ = models("qwen3-tiny", cache_dir)
    dec = hf.decoder(model, drafter, dcfg, backend="torch", budget=15, top_k=4, page_size=16)
    ps = prompts("qwen3-tiny")[:2]
    with pytest.raises(TypeError, match=r"^prompts: expected a list of token-id lists, one per request and without "
                                        r"padding \(a \[B, T\] tensor"):
        dec.generate(torch.tensor([ps[0][:9], ps[1][:9]]), 4)
    with pytest.raises(TypeError, match=r"^prompts: expected a list of token-id lists, one per request \(a single"):
        dec.generate(ps[0], 4)
    with pytest.raises(ValueError, match=r"^stream_ids: expected one per request \(2\), got 1"):
        dec.generate(ps, 4, stream_ids=[0])
    for bad in (0, -16, 16.0):
        with pytest.raises(ValueError, match=r"^page_size must be a positive int"):
            hf.decoder(model, drafter, dcfg, backend="torch", budget=15, top_k=4, page_size=bad)
    with pytest.raises(ValueError, match=rf"^top_k must be 1\.\.{min(64, model.config.vocab_size)} "):
        hf.decoder(model, drafter, dcfg, backend="torch", budget=15, top_k=65, page_size=16)


def test_mla_keeps_a_forward_wrapper_on_its_attention_modules(cache_dir):
    """The absorbed MLA forward is put on each attention module for a decode, then the module's own (a wrapper
    someone installed on the instance) is put back, not deleted."""
    model, drafter, dcfg, _ = models("deepseek-tiny", cache_dir)
    calls = []
    attn = model.model.layers[0].self_attn
    inner = attn.forward

    def wrapped(*a, **k):
        calls.append(1)
        return inner(*a, **k)

    attn.forward = wrapped
    try:
        dec = hf.decoder(model, drafter, dcfg, backend="torch", budget=4, top_k=4, page_size=16)
        dec.generate([prompts("deepseek-tiny")[0]], 2)
        assert attn.forward is wrapped
        model(torch.tensor([[1, 2, 3]]))
        assert calls
    finally:
        del attn.forward


def test_mla_rows_of_another_width_on_the_torch_backend():
    """kv_lora_rank 512 with a rope head other than 64 (a 528-wide row): V is the latent part, not the row."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM
    torch.manual_seed(0)
    m = DeepseekV3ForCausalLM(DeepseekV3Config(vocab_size=64, hidden_size=64, intermediate_size=64,
                                               num_hidden_layers=1, num_attention_heads=2, kv_lora_rank=512,
                                               qk_rope_head_dim=16, qk_nope_head_dim=16, v_head_dim=16,
                                               q_lora_rank=None, first_k_dense_replace=1, eos_token_id=None,
                                               max_position_embeddings=256)).eval()
    p = [3, 9, 27, 17, 51, 25]
    ref = m.generate(torch.tensor([p]), max_new_tokens=4, do_sample=False, min_new_tokens=4)[0, len(p):].tolist()
    dec = kt.DDTreeDecoder(m, backend="torch", page_size=16, cache_dtype=torch.float32)
    assert dec.generate([p], 4, mode="ar").tokens[0] == ref


def test_a_cpu_model_on_the_kdtree_backend_says_to_move_it_or_use_torch(cache_dir):
    model, drafter, dcfg, _ = models("qwen3-tiny", cache_dir)
    try:
        dec = hf.decoder(model, drafter, dcfg, backend="kdtree", budget=15, top_k=4, page_size=16)
    except (ImportError, OSError, ValueError) as e:  # no kdtree library here, or a head kdtree has no kernel for
        pytest.skip(f"the kdtree backend does not load for this model here: {e}")
    with pytest.raises(ValueError, match=r"^the model is on cpu; backend='kdtree' runs kdtree's CUDA kernels"):
        dec.generate(prompts("qwen3-tiny")[:1], 4)


@pytest.mark.parametrize("model_type", sorted(hf.UNTRAINED))
def test_family_greedy_equals_generate(model_type):
    """Each family beyond the trained presets: the GQA ones through the attention registry (Qwen2's q/k/v biases,
    the MoE families' routed experts, Mistral's and Mixtral's own attention), DeepSeek-V2 through the absorbed MLA
    forward with its complex RoPE. Greedy DDTree with an untrained drafter (so most rounds reject the tree) equals
    generate() under the near-tie rule."""
    m, drafter, dcfg = hf.untrained(model_type)
    assert type(m).__name__ in kt.SUPPORTED_MODELS
    if model_type == "qwen2":
        assert m.model.layers[0].self_attn.q_proj.bias is not None  # the layout this family adds
    dec = hf.decoder(m, drafter, dcfg, backend="torch", budget=15, top_k=4, page_size=16, cache_dtype=torch.float32)
    g = hf.greedy_vs_generate(m, dec, [[5, 17, 200, 3, 9, 44, 61], [8, 1, 250, 77]], max_new=16)
    assert g["other_divergences"] == 0, (g["numeric_margin_noise"], g["requests"])
    assert g["near_tie_divergences"] <= 1, g["requests"]
    assert g["equal"] == 2  # float32 throughout: no near-tie here either


@pytest.mark.parametrize("model_type", ["mistral", "mixtral", "phi3"])
def test_every_layer_sliding_window_holds_while_no_position_reaches_it(model_type):
    """Mistral's, Mixtral's and Phi-3's config.sliding_window windows every layer: below it the window changes
    nothing and DDTree equals generate(); a decode whose positions would reach it is refused, naming the window."""
    m, drafter, dcfg = hf.untrained(model_type, sliding_window=32)
    dec = hf.decoder(m, drafter, dcfg, backend="torch", budget=15, top_k=4, page_size=16, cache_dtype=torch.float32)
    g = hf.greedy_vs_generate(m, dec, [[5, 17, 200, 3, 9, 44, 61]], max_new=16)  # positions up to 7 + 16 + 4 - 1
    assert g["equal"] == 1, g["requests"]
    with pytest.raises(ValueError, match=rf"{type(m).__name__}: config.sliding_window 32 limits .* reach position 50"):
        dec.generate([[5, 17, 200, 3, 9, 44, 61]], 40)


def test_longrope_holds_below_its_switch_and_is_refused_past_it():
    """Phi-3's longrope takes its long factors for a whole forward once a position reaches
    original_max_position_embeddings: below that DDTree equals generate(); a decode that would reach it (where the
    two would rotate some tokens differently) is refused, naming the limit."""
    rope = {"rope_type": "longrope", "short_factor": [1.0] * 8, "long_factor": [3.0] * 8,
            "original_max_position_embeddings": 32, "rope_theta": 10000.0}
    m, drafter, dcfg = hf.untrained("phi3", rope_parameters=rope, original_max_position_embeddings=32)
    dec = hf.decoder(m, drafter, dcfg, backend="torch", budget=15, top_k=4, page_size=16, cache_dtype=torch.float32)
    g = hf.greedy_vs_generate(m, dec, [[5, 17, 200, 3, 9, 44, 61], [8, 1, 250, 77]], max_new=16)
    assert g["equal"] == 2, g["requests"]
    with pytest.raises(ValueError, match=r"Phi3ForCausalLM: its longrope RoPE .*_embeddings 32.* reach position 50"):
        dec.generate([[5, 17, 200, 3, 9, 44, 61]], 40)


@pytest.mark.parametrize("ask", [dict(sliding_window=64), dict(softcap=30.0), dict(s_aux=torch.zeros(2))])
def test_attention_asked_for_more_than_verify_attention_does_stops(ask):
    """The registered attention function refuses a window, logit soft-capping or sinks it would not apply, naming
    what was asked, instead of attending over the whole prefix without them."""
    import types
    m, _, _ = hf.untrained("llama")
    dec = kt.DDTreeDecoder(m, backend="torch")
    token = kt._active.set(types.SimpleNamespace(dec=dec))
    try:
        q, k = torch.zeros(1, 4, 3, 16), torch.zeros(1, 2, 3, 16)
        with pytest.raises(RuntimeError, match=f"layer 0 asks for .*{next(iter(ask))}|layer 0 asks for a sliding"):
            kt._gqa_attention(m.model.layers[0].self_attn, q, k, k, None, scaling=0.25, **ask)
    finally:
        kt._active.reset(token)


def test_qwen2_sliding_window_layers_are_refused():
    for model_type in ("qwen2", "qwen2_moe"):
        m, _, _ = hf.untrained(model_type, use_sliding_window=True, sliding_window=64, max_window_layers=1)
        with pytest.raises(ValueError, match=f"{type(m).__name__}: sliding-window layers are not supported"):
            kt.DDTreeDecoder(m, backend="torch")
