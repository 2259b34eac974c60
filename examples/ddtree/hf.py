"""DDTree on Hugging Face transformers models through kdtree (kdtree.integrations.transformers): small
DeepSeek-V3-architecture (MLA) and Qwen3-architecture (GQA) models built from configs with random init,
trained briefly on the example's corpus (data.py, nothing downloaded), and the example's block drafter
trained on the target's own outputs (train.py's drafter loop, unchanged); plus the checks: greedy DDTree
against the model's own generate(do_sample=False) under the near-tie rule, and the sampling TV test.
"""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict

import torch
import torch.nn as nn

from . import checks, data, train
from .model import Config, Drafter

# name -> (architecture, config kwargs, drafter depth, drafter layers, training settings)
_CPU_TRAIN = train.TrainSettings(target_steps=60, drafter_steps=40, batch=8, seq=48, lr=1e-2, drafter_lr=5e-3,
                                 corpus_bytes=1 << 20, time_cap_s=20.0)
_GPU_TRAIN = train.TrainSettings(target_steps=400, drafter_steps=300, batch=32, seq=256, lr=2e-3, drafter_lr=2e-3,
                                 corpus_bytes=8 << 20, time_cap_s=60.0)
_COMMON = dict(vocab_size=256, bos_token_id=0, pad_token_id=0, eos_token_id=None, tie_word_embeddings=False,
               max_position_embeddings=1024)
PRESETS = {
    # CPU tests (torch backend takes any row width)
    "deepseek-tiny": ("deepseek_v3", dict(hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                                          num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                                          q_lora_rank=None, kv_lora_rank=32, qk_rope_head_dim=16, qk_nope_head_dim=16,
                                          v_head_dim=16, first_k_dense_replace=2, n_routed_experts=4,
                                          num_experts_per_tok=2, n_group=1, topk_group=1), 6, 1, _CPU_TRAIN),
    "qwen3-tiny": ("qwen3", dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                                 num_key_value_heads=1, head_dim=64, use_sliding_window=False), 6, 1, _CPU_TRAIN),
    # the H200: kdtree's kernels (MLA 512 + 64 latent row; GQA head dim 128)
    "deepseek-small": ("deepseek_v3", dict(hidden_size=256, intermediate_size=768, moe_intermediate_size=128,
                                           num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=8,
                                           q_lora_rank=128, kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=64,
                                           v_head_dim=64, first_k_dense_replace=4, n_routed_experts=4,
                                           num_experts_per_tok=2, n_group=1, topk_group=1), 16, 2, _GPU_TRAIN),
    "qwen3-small": ("qwen3", dict(hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=4,
                                 num_key_value_heads=2, head_dim=128, use_sliding_window=False), 16, 2, _GPU_TRAIN),
}


def make_config(preset):
    from transformers import AutoConfig
    arch, kw, _, _, _ = PRESETS[preset]
    return AutoConfig.for_model(arch, **_COMMON, **kw)


class HFTarget(nn.Module):
    """A transformers causal LM seen as train.py's target: tokens [B, T] -> (logits, final hidden, None)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, tokens):
        base = getattr(self.model, self.model.base_model_prefix)
        h = base(input_ids=tokens, use_cache=False).last_hidden_state
        return self.model.get_output_embeddings()(h), h, None


def _train_target(model, st, train_bytes, device, log):
    return train.fit_target(HFTarget(model).train(), model.parameters(), st, train_bytes, device, log, log_every=4)


def get_models(preset, device="cpu", log=print, use_cache=True):
    """(model, drafter module, drafter Config, info): the transformers model (float32, eval) and the example's
    block drafter, trained now (fixed seeds) or loaded from train.cache_dir()."""
    from transformers import AutoModelForCausalLM
    device = torch.device(device)
    arch, kw, depth, dlayers, st = PRESETS[preset]
    hcfg = make_config(preset)
    dcfg = Config(vocab=256, d_model=hcfg.hidden_size, draft_depth=depth, draft_layers=dlayers)
    train_bytes, _ = data.load_corpus(st.corpus_bytes)
    import transformers
    key = json.dumps([arch, kw, asdict(dcfg), asdict(st), data.fingerprint(train_bytes), transformers.__version__,
                      1], sort_keys=True)
    path = train.cache_dir() / f"hf-{preset}-{hashlib.sha256(key.encode()).hexdigest()[:16]}.pt"
    torch.manual_seed(st.seed)
    model = AutoModelForCausalLM.from_config(hcfg, attn_implementation="sdpa").float()
    drafter = Drafter(dcfg)
    if use_cache and path.exists():
        blob = torch.load(path, map_location="cpu", weights_only=True)
        model.load_state_dict(blob["target"])
        drafter.load_state_dict(blob["drafter"])
        log(f"models loaded from {path}")
        return model.to(device).eval(), drafter.to(device).eval(), dcfg, dict(blob["info"], loaded_from=str(path))
    t0 = time.time()
    log(f"training {preset} ({type(model).__name__}, {hcfg.num_hidden_layers} layers, hidden {hcfg.hidden_size}) "
        f"on {device}")
    model.to(device)
    t_steps = _train_target(model, st, train_bytes, device, log)
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    drafter, d_steps = train.train_drafter(dcfg, st, HFTarget(model), train_bytes, device, log)
    for p in drafter.parameters():
        p.requires_grad_(False)
    info = {"train_seconds": round(time.time() - t0, 1), "target_steps": t_steps, "drafter_steps": d_steps}
    log(f"trained in {info['train_seconds']} s")
    if use_cache:
        train.save_weights(path, model, drafter, info, log)
    return model, drafter, dcfg, info


# Families the GPU/CPU tests run with random weights (untrained): model type -> what its config adds to the
# small dense layout (the MoE layers' experts; DeepSeek's MLA dims, whose latent row the torch backend takes at any
# width; Gemma's head dim, 256 by default; Mistral's and Phi-3's windows off, as in Mistral 7B v0.2 on and Phi-4-mini).
_MLA_TINY = dict(q_lora_rank=None, kv_lora_rank=32, qk_rope_head_dim=16, qk_nope_head_dim=16, v_head_dim=16,
                 num_key_value_heads=4, first_k_dense_replace=1, n_routed_experts=4, num_experts_per_tok=2,
                 n_shared_experts=1, moe_intermediate_size=64)
UNTRAINED = {
    "deepseek_v2": _MLA_TINY,
    "deepseek_v3": dict(_MLA_TINY, n_group=1, topk_group=1),
    "gemma": dict(head_dim=16, pad_token_id=None),
    "llama": {},
    "mistral": dict(sliding_window=None),
    "mixtral": dict(sliding_window=None, num_local_experts=4, num_experts_per_tok=2),
    "phi3": dict(sliding_window=None, pad_token_id=None),
    "qwen2": {},
    "qwen2_moe": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64,
                      shared_expert_intermediate_size=64, decoder_sparse_step=1),
    "qwen3_moe": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64, decoder_sparse_step=1),
}


def untrained(model_type, device="cpu", draft_depth=4, **config):
    """(model, drafter module, drafter Config): a transformers causal LM of `model_type` (UNTRAINED's keys; float32,
    eval) and the example's block drafter, both with random weights (seeds 0 and 1); `config` overrides the
    model's config (a small dense layout: 2 layers, 4 query and 2 KV heads of 16 dims)."""
    from transformers import AutoConfig, AutoModelForCausalLM
    cfg = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=1024, eos_token_id=None, tie_word_embeddings=False)
    cfg.update(UNTRAINED[model_type])
    cfg.update(config)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **cfg)).to(device).eval()
    torch.manual_seed(1)
    dcfg = Config(vocab=cfg["vocab_size"], d_model=cfg["hidden_size"], draft_depth=draft_depth, draft_layers=1)
    return model, Drafter(dcfg).to(device).eval(), dcfg


def prompts(preset, lengths, seed=5):
    _, held = data.load_corpus(PRESETS[preset][4].corpus_bytes)
    return data.prompts(held, lengths, seed)


def decoder(model, drafter, dcfg, **kw):
    from kdtree.integrations.transformers import DDTreeDecoder, LogitsDrafter
    return DDTreeDecoder(model, LogitsDrafter(drafter, dcfg.draft_depth), **kw)


@torch.no_grad()
def hf_generate(model, prompt, max_new):
    """The model's own greedy generate(): tokens and the top-2 logit margin at each."""
    dev = model.get_output_embeddings().weight.device
    out = model.generate(input_ids=torch.tensor([prompt], device=dev), max_new_tokens=max_new, min_new_tokens=max_new,
                         do_sample=False, output_logits=True, return_dict_in_generate=True, pad_token_id=0)
    toks = out.sequences[0, len(prompt):].tolist()
    top2 = torch.stack(out.logits)[:, 0].float().topk(2, -1).values
    return toks, (top2[:, 0] - top2[:, 1]).tolist()


def greedy_vs_generate(model, dec, prompt_list, *, max_new, noise=None):
    """checks.greedy_equality's rule with the model's own generate() as the reference: every divergence must
    sit where generate's top-2 margin is within the numeric noise (the largest |margin difference| over the
    positions where both agree; `noise`: a given one, checks.near_tie_report)."""
    ref = [hf_generate(model, p, max_new) for p in prompt_list]
    sp = dec.generate(prompt_list, max_new, record_margins=True)
    report = checks.near_tie_report([t for t, _ in ref], [m for _, m in ref], sp, max_new, "ref_margin",
                                    noise=noise)
    report["spec_tokens"] = sp.tokens
    return report


def sampling_tv(dec, prompt, *, n_samples, n_tokens=3, chunk=1024, alpha=1e-3, rounds=2000):
    """The example's TV test (checks.permutation_thresholds) on the decoder: DDTree vs one-token rounds at
    temperature 1 from disjoint RNG streams, and the same streams drawn both ways (coupled draws)."""
    def draw(mode, streams):
        out = []
        for i in range(0, len(streams), chunk):
            ids = streams[i:i + chunk]
            out += dec.generate([prompt] * len(ids), n_tokens, mode=mode, stream_ids=ids).tokens
        return torch.tensor(out, dtype=torch.int64)

    spec = draw("spec", list(range(n_samples)))
    ar = draw("ar", list(range(n_samples, 2 * n_samples)))
    ar_same = draw("ar", list(range(n_samples)))
    V = dec.spec.vocab_size
    pairs = [(spec[:, i], ar[:, i]) for i in range(n_tokens)]
    pairs.append((spec[:, 0] * V + spec[:, 1], ar[:, 0] * V + ar[:, 1]))
    names = [f"token{i + 1}" for i in range(n_tokens)] + ["tokens1-2 joint"]
    stats = dict(zip(names, checks.permutation_thresholds(pairs, alpha=alpha, rounds=rounds)))
    return {"stats": stats, "coupled_identical_fraction": (spec == ar_same).all(1).float().mean().item(),
            "independent_identical_fraction": (spec == ar).all(1).float().mean().item()}
