"""DDTree speculative decoding of Hugging Face transformers causal LMs through kdtree.

Supported: transformers 5.x (tested with 5.17 and 5.24; `pip install 'transformers>=5.17,<6'`), models
DeepseekV2ForCausalLM and DeepseekV3ForCausalLM (MLA, absorbed form over a 576-wide latent cache row) and, GQA
with head dim 64/128/256: GemmaForCausalLM, LlamaForCausalLM, MistralForCausalLM, MixtralForCausalLM,
Phi3ForCausalLM, Qwen2ForCausalLM, Qwen2MoeForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM (one attention
module each; the MoE MLPs are the model's own; each family's logits are its lm_head's alone). transformers is
imported only when a DDTreeDecoder is made.

One DDTree round, all on the device: drafter top-K -> tree_build -> ONE target forward over the tree nodes
(verify_attention in every layer, RoPE at prefix_len + depth) -> sample_tokens -> tree_accept -> kv_compact.
The prompt is prefilled into the same paged cache through the same path (chunks of up to W tokens as
chain trees).

How the model is driven, and why:
- The forward is the model's own (`model.model(input_ids, position_ids)`: embeddings, RoPE tables, norms,
  MLPs/MoE, the decoder layers), over the packed nodes of every request as one sequence [1, B*N].
- GQA: the attention goes through transformers' attention-function registry (AttentionInterface,
  registered as "kdtree_ddtree" and selected only while the decoder runs a forward). The registered
  function receives the nodes' post-norm, post-RoPE K and V: it writes them into the paged cache and runs
  verify_attention over the cache. No transformers Cache object is used: the registry already hands over
  exactly the rows to cache, and the Cache.update signature and the forward's cache argument changed within
  5.x (past_key_values -> cache), which the registry did not. The mask registry has no entry for the name,
  so transformers builds no dense mask.
- MLA: DeepseekV3Attention (and V2's) expands the latent into per-head K/V (kv_b_proj) before it calls the
  attention function, so the registry never sees the latent row the absorbed form attends over. Its forward is
  therefore replaced, on each attention module and only while the decoder runs a forward, by one that uses
  the module's own weights: cache row [kv_a_layernorm(c_kv) | RoPE(k_pe)], query
  [q_nope @ W_UK per head | RoPE(q_pe)], verify_attention over the latent cache (V = the first
  kv_lora_rank dims), then W_UV and o_proj. The softmax scale is the module's own `scaling`
  (qk_head_dim**-0.5 with the YaRN mscale when configured).
"""
from __future__ import annotations

import contextlib
import contextvars
import math
import sys
import time
from dataclasses import dataclass, field
from typing import Protocol

import torch
import torch.nn.functional as F

from . import load_ops, rounds  # load_ops: the backend switch (kdtree or torch), also importable from here
from .budget import DEFAULT_BUDGETS, AutoBudget, CostTable, RoundLog

SUPPORTED_VERSIONS = ">=5.17,<6"
SUPPORTED_MODELS = {"DeepseekV2ForCausalLM": "mla", "DeepseekV3ForCausalLM": "mla", "GemmaForCausalLM": "gqa",
                    "LlamaForCausalLM": "gqa", "MistralForCausalLM": "gqa", "MixtralForCausalLM": "gqa",
                    "Phi3ForCausalLM": "gqa", "Qwen2ForCausalLM": "gqa", "Qwen2MoeForCausalLM": "gqa",
                    "Qwen3ForCausalLM": "gqa", "Qwen3MoeForCausalLM": "gqa"}
# Families whose config.sliding_window, when set, windows every layer's attention (no use_sliding_window flag,
# no layer_types): exact through kdtree only while no position reaches the window (DDTreeDecoder checks it).
WINDOW_EVERY_LAYER = ("MistralForCausalLM", "MixtralForCausalLM", "Phi3ForCausalLM")
ATTN_NAME = "kdtree_ddtree"

_active = contextvars.ContextVar("kdtree_ddtree_step", default=None)


def require_transformers():
    """The transformers module, or an ImportError that says how to install a supported version."""
    try:
        import transformers
    except ImportError as e:
        raise ImportError("kdtree.integrations.transformers needs Hugging Face transformers: pip install "
                          f"'kdtree[transformers]' (or 'transformers{SUPPORTED_VERSIONS}')") from e
    major, minor = (int("".join(ch for ch in x if ch.isdigit()) or 0) for x in transformers.__version__.split(".")[:2])
    if major != 5 or minor < 17:
        raise ImportError(f"kdtree.integrations.transformers supports transformers{SUPPORTED_VERSIONS}, found "
                          f"{transformers.__version__}: pip install 'transformers{SUPPORTED_VERSIONS}'")
    return transformers


# ----------------------------------------------------------------------------- drafters

class Drafter(Protocol):
    """What the decoder needs from a drafter: `depth` (D) and per-depth top-K tokens and log-probs of the D
    tokens after the root, from the target's final hidden state at the position before the root."""
    depth: int

    def topk(self, hidden: torch.Tensor, root: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """hidden [B, d], root [B] int32 -> (tokens int32 [B, D, k], log-probs float32 [B, D, k]), descending."""


class LogitsDrafter:
    """Adapts a module mapping (hidden [B, d], root [B]) to per-depth logits [B, D, vocab] (the DDTree
    example's block drafter, examples/ddtree/model.py Drafter) to the Drafter interface."""

    def __init__(self, module, depth: int):
        self.module, self.depth = module, int(depth)

    def topk(self, hidden, root, k):
        dtype = next(self.module.parameters()).dtype
        logits = self.module(hidden.to(dtype), root.long())
        if logits.dim() != 3 or logits.shape[1] != self.depth:
            raise ValueError(f"drafter: expected logits [B, {self.depth}, vocab], got {tuple(logits.shape)}")
        lp = torch.log_softmax(logits.float(), dim=-1)
        vals, idx = lp.topk(k, dim=-1)
        return idx.to(torch.int32), vals.contiguous()


# ----------------------------------------------------------------------------- the model's layout

@dataclass(frozen=True)
class ModelSpec:
    family: str          # "mla" or "gqa"
    arch: str            # the model class name
    num_layers: int
    num_heads: int
    num_kv_heads: int    # 1 for MLA (one latent row per token)
    head_dim: int        # q/K width per head in the cache: 576-style latent + rope for MLA
    v_dim: int           # V width read from the cache (kv_lora_rank for MLA)
    hidden_size: int
    vocab_size: int
    max_positions: int
    window: int | None = None  # every layer's sliding window (WINDOW_EVERY_LAYER), None: none
    rope_switch: int | None = None  # longrope: the position count past which a forward's RoPE takes its long factors


def model_spec(model) -> ModelSpec:
    """The kdtree cache layout of a supported transformers model; ValueError naming the class otherwise."""
    arch = type(model).__name__
    family = SUPPORTED_MODELS.get(arch)
    if family is None:
        raise ValueError(f"kdtree.integrations.transformers: {arch} is not supported; supported models: "
                         f"{', '.join(SUPPORTED_MODELS)} (DeepSeek-V2/V3 MLA; Gemma, Llama, Mistral, Mixtral, "
                         f"Phi-3 and Qwen GQA)")
    c = model.config
    L, H = c.num_hidden_layers, c.num_attention_heads
    maxpos = getattr(c, "max_position_embeddings", 1 << 30) or (1 << 30)
    if family == "mla":
        return ModelSpec("mla", arch, L, H, 1, c.kv_lora_rank + c.qk_rope_head_dim, c.kv_lora_rank, c.hidden_size,
                         c.vocab_size, maxpos)
    hd = getattr(c, "head_dim", None) or c.hidden_size // H
    kvh = getattr(c, "num_key_value_heads", None) or H
    if H % kvh:
        raise ValueError(f"{arch}: num_attention_heads {H} is not a multiple of num_key_value_heads {kvh}")
    layer_types = getattr(c, "layer_types", None) or []
    if getattr(c, "use_sliding_window", False) or any(t != "full_attention" for t in layer_types):
        raise ValueError(f"{arch}: sliding-window layers are not supported (kdtree's verify_attention attends "
                         f"over the whole prefix); set use_sliding_window=False / layer_types to full_attention")
    window = getattr(c, "sliding_window", None) if arch in WINDOW_EVERY_LAYER else None
    return ModelSpec("gqa", arch, L, H, kvh, hd, hd, c.hidden_size, c.vocab_size, maxpos, window or None,
                     _rope_switch(c))


def _rope_switch(c):
    """longrope (Phi-3's long-context configs) rotates a whole forward with its long factors once any position in it
    reaches original_max_position_embeddings, and the rows cached before keep their rotation; DDTree's rounds reach a
    position earlier than generate()'s steps, so past that point the two rotate some tokens differently."""
    rp = getattr(c, "rope_parameters", None)
    if isinstance(rp, dict) and rp.get("rope_type") == "longrope":
        return rp.get("original_max_position_embeddings") or getattr(c, "original_max_position_embeddings", None)
    return None


def check_kdtree_shapes(spec: ModelSpec, page_size: int, cache_dtype: torch.dtype):
    """Raises ValueError naming what to change when libkdtree has no kernel for this layout."""
    import kdtree
    s = kdtree.supported_shapes()
    if spec.family == "mla":
        head = s.head(spec.head_dim, mla=True)
        if head is None or head.head_dim_v != spec.v_dim:
            mla = [f"{h.head_dim_v} + {h.head_dim_qk - h.head_dim_v}" for h in s.heads if h.mla]
            raise ValueError(f"{spec.arch}: kdtree's MLA kernels take a cache row of kv_lora_rank + "
                             f"qk_rope_head_dim = {' or '.join(mla)}; this model has "
                             f"{spec.v_dim} + {spec.head_dim - spec.v_dim}. Use a config with those dims, or "
                             f"backend='torch'")
    else:
        if s.head(spec.head_dim, mla=False) is None:
            dims = [str(h.head_dim_qk) for h in s.heads if not h.mla]
            raise ValueError(f"{spec.arch}: head_dim {spec.head_dim} has no kdtree GQA kernel; supported head dims: "
                             f"{', '.join(dims)} (set head_dim in the config, or use backend='torch')")
    if page_size not in s.page_sizes:
        raise ValueError(f"page_size must be one of {', '.join(map(str, s.page_sizes))}, got {page_size}")
    if cache_dtype not in s.torch_dtypes:
        raise ValueError(f"cache_dtype must be one of {', '.join(map(str, s.torch_dtypes))}, got {cache_dtype}")




# ----------------------------------------------------------------------------- one forward's attention state

@dataclass
class _Step:
    """What every layer's attention needs for one forward: where the nodes' rows go and what they see."""
    dec: "DDTreeDecoder"
    slots: torch.Tensor        # [T] flat cache row of each node
    page_table: torch.Tensor   # [B, M]
    kv_total: torch.Tensor     # [B] int32: prefix + nodes
    indptr: torch.Tensor       # [B + 1] int32
    mask: torch.Tensor         # [T, ceil(W/64)] int64 ancestor bits
    W: int
    dense: bool = False        # SDPA over a dense ancestor mask (the reference method) instead of verify_attention
    nodes: int = 0             # nodes per request (dense only: equal for every request)
    max_kv: int = 0            # verify_attention's max_kv_len; 0: the cache's (dec.max_kv)
    _dense_mask: torch.Tensor | None = field(default=None, repr=False)

    def write(self, layer, k_rows, v_rows=None):
        d = self.dec
        d.k_cache[layer].view(-1, *d.k_cache.shape[3:]).index_copy_(0, self.slots, k_rows.to(d.cache_dtype))
        if v_rows is not None:
            d.v_cache[layer].view(-1, *d.v_cache.shape[3:]).index_copy_(0, self.slots, v_rows.to(d.cache_dtype))

    def attend(self, layer, q, scale):
        """q [T, H, Dq] -> [T, H, Dv] in the cache dtype."""
        d = self.dec
        k = d.k_cache[layer]
        v = d.v_cache[layer] if d.v_cache is not None else None
        if self.dense:
            return self._attend_dense(q, k, v, scale)
        if v is None and (d.spec.v_dim, d.spec.head_dim) != (512, 576):
            v = k[..., : d.spec.v_dim]  # the torch backend's other MLA rows: V = the latent part
        return d.ops.verify_attention(q.to(d.cache_dtype).contiguous(), k, self.page_table, self.kv_total, self.indptr,
                                      self.mask, max_tree_nodes=self.W, v_cache=v, sm_scale=scale,
                                      max_kv_len=self.max_kv or d.max_kv)

    def _visible(self, L):
        """[B, 1, N, L] bool: a node sees the committed prefix and its ancestors (the tree's mask bits)."""
        if self._dense_mask is None:
            B, N = self.page_table.shape[0], self.nodes
            prefix = (self.kv_total - N).long()[:, None, None]  # [B, 1, 1]
            j = torch.arange(N, device=self.mask.device)
            bits = ((self.mask[:, j // 64] >> (j % 64)) & 1).bool().view(B, N, N)
            pos = torch.arange(L, device=self.mask.device)[None, None, :]
            col = (pos - prefix).clamp(0, N - 1).expand(B, N, L)
            tree = bits.gather(2, col) & (pos >= prefix) & (pos < prefix + N)
            self._dense_mask = ((pos < prefix) | tree)[:, None]
        return self._dense_mask

    def _attend_dense(self, q, k, v, scale):
        d = self.dec
        B, N = self.page_table.shape[0], self.nodes
        if k.dim() == 3:  # MLA: one latent row per token
            k = k.unsqueeze(2)
        # The cache gathered into a dense [B, Hkv, L, D] per layer, as a contiguous per-request cache holds it.
        kd = k[self.page_table.long()].flatten(1, 2).transpose(1, 2)
        L = kd.shape[2]
        vd = kd[..., : d.spec.v_dim] if v is None else v[self.page_table.long()].flatten(1, 2).transpose(1, 2)
        qd = q.to(d.cache_dtype).view(B, N, q.shape[1], q.shape[2]).transpose(1, 2)
        o = F.scaled_dot_product_attention(qd, kd, vd, attn_mask=self._visible(L), scale=scale,
                                           enable_gqa=kd.shape[1] != qd.shape[1])
        return o.transpose(1, 2).reshape(B * N, q.shape[1], -1)


def _gqa_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """The registered attention function: query [1, H, T, D], key/value [1, Hkv, T, D] of the packed nodes."""
    st = _active.get()
    if st is None:
        raise RuntimeError(f"attention implementation {ATTN_NAME!r} runs only inside a kdtree DDTreeDecoder forward; "
                           f"use another attn_implementation for the model's own forward")
    if query.shape[0] != 1:
        raise RuntimeError(f"{ATTN_NAME}: expected the packed batch [1, H, T, D], got {tuple(query.shape)}")
    # What the model asks of its attention beyond softmax(q k^T scale) v: verify_attention does none of it, so a
    # model that asks (a config changed after the decoder checked it, a family not in SUPPORTED_MODELS) stops here.
    window = kwargs.get("sliding_window")
    if window is not None and window != st.dec.spec.window:
        raise RuntimeError(f"{ATTN_NAME}: layer {module.layer_idx} asks for a sliding window of {window}, which "
                           f"kdtree's verify_attention does not apply (it attends over the whole prefix)")
    for name in ("softcap", "s_aux"):
        if kwargs.get(name) is not None:
            raise RuntimeError(f"{ATTN_NAME}: layer {module.layer_idx} asks for {name}={kwargs[name]!r} (logit "
                               f"soft-capping / attention sinks), which kdtree's verify_attention does not apply")
    st.write(module.layer_idx, key[0].transpose(0, 1), value[0].transpose(0, 1))
    out = st.attend(module.layer_idx, query[0].transpose(0, 1), scaling)
    return out.to(query.dtype)[None], None


def _apply_rope(attn, q_rot, k_rot, position_embeddings):
    """The model's own RoPE on q [1, H, T, rope] and k [1, 1, T, rope]: DeepSeek-V3's (cos, sin) tables, interleaved
    or rotate-half, or DeepSeek-V2's complex frequencies (its position embeddings are one complex tensor)."""
    mod = sys.modules[type(attn).__module__]
    if isinstance(position_embeddings, torch.Tensor):  # DeepseekV2: freqs_cis
        return mod.apply_rotary_emb(q_rot, k_rot, position_embeddings.to(q_rot.device))
    cos, sin = position_embeddings
    rope = mod.apply_rotary_pos_emb_interleave if attn.config.rope_interleave else mod.apply_rotary_pos_emb
    return rope(q_rot, k_rot, cos, sin)


def _mla_forward(attn, hidden_states, position_embeddings=None, attention_mask=None, *args, **kwargs):
    """DeepseekV3Attention (or V2's: the same weights, complex RoPE) in the absorbed form over the latent cache
    (see the module docstring for why the forward is replaced). hidden_states [1, T, d] packed nodes."""
    st = _active.get()
    if st is None:
        raise RuntimeError("the kdtree MLA forward runs only inside a DDTreeDecoder forward")
    x = hidden_states[0]
    T, H = x.shape[0], attn.num_heads
    nope, rope_d, lora, vd = attn.qk_nope_head_dim, attn.qk_rope_head_dim, attn.kv_lora_rank, attn.v_head_dim
    q = attn.q_proj(x) if attn.q_lora_rank is None else attn.q_b_proj(attn.q_a_layernorm(attn.q_a_proj(x)))
    q_nope, q_rot = q.view(T, H, nope + rope_d).split([nope, rope_d], dim=-1)
    kv_nope, k_rot = attn.kv_a_proj_with_mqa(x).split([lora, rope_d], dim=-1)
    kv_nope = attn.kv_a_layernorm(kv_nope)
    # The model's own RoPE function, on its [B, heads, T, dim] layout.
    q_rot, k_rot = _apply_rope(attn, q_rot.transpose(0, 1)[None], k_rot[None, None], position_embeddings)
    row = torch.cat([kv_nope, k_rot[0, 0]], dim=-1)  # [T, lora + rope]
    w = attn.kv_b_proj.weight.view(H, nope + vd, lora)
    q_lat = torch.einsum("thc,hcl->thl", q_nope, w[:, :nope])  # W_UK folded into the query
    qa = torch.cat([q_lat, q_rot[0].transpose(0, 1)], dim=-1)  # [T, H, lora + rope]
    st.write(attn.layer_idx, row)
    lat = st.attend(attn.layer_idx, qa, attn.scaling)  # [T, H, lora]
    o = torch.einsum("thl,hvl->thv", lat.to(x.dtype), w[:, nope:]).reshape(T, H * vd)  # W_UV
    return attn.o_proj(o)[None], None


_registered = False


def _register():
    global _registered
    if not _registered:
        from transformers import AttentionInterface
        AttentionInterface.register(ATTN_NAME, _gqa_attention)
        _registered = True


# ----------------------------------------------------------------------------- the decoder

_MODEL_EOS = object()  # generate()'s default: the model's generation_config.eos_token_id


def _eos_ids(eos_token_id):
    """The end-of-sequence ids as a set."""
    if eos_token_id is None:
        return frozenset()
    ids = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
    if any(isinstance(t, bool) or not isinstance(t, int) for t in ids):
        raise TypeError(f"eos_token_id: expected an int, a list of ints or None, got {eos_token_id!r}")
    return frozenset(ids)


def _eos_end(row, eos):
    """How many of a request's tokens generate() keeps: up to and with its first end-of-sequence token."""
    for i, t in enumerate(row):
        if t in eos:
            return i + 1
    return len(row)


@dataclass
class DDTreeOutput:
    tokens: list             # per request, max_new_tokens generated token ids, or fewer ending at the first
                             # end-of-sequence token (as generate() stops there)
    steps: int               # decoding rounds run
    accept_lens: list        # per round, per request accepted draft tokens (-1: request already done)
    budgets: list            # per round, the tree budget used
    margins: list | None     # per request, the target's top-2 logit margin at each generated token
    seconds: float           # prefill + decoding, wall time
    prefill_seconds: float
    stage_ms: dict | None    # profile=True: mean ms per round of each stage


class DDTreeDecoder:
    """DDTree decoding of a transformers causal LM over a kdtree paged KV cache.

    model      a causal LM of SUPPORTED_MODELS: DeepseekV2/V3ForCausalLM (MLA), or Gemma, Llama, Mistral, Mixtral,
               Phi-3, Qwen2, Qwen2-MoE, Qwen3 or Qwen3-MoE (GQA) (eval mode; float32 or bf16)
    drafter    a Drafter (per-depth top-K tokens and log-probs); None allows mode="ar" only
    backend    "kdtree" (CUDA) or "torch" (kdtree.integrations.torch_ops: any device, for CPU tests)
    budget     draft nodes per round (1..127), or "auto": chosen each round from the measured step cost at the
               batch size and the drafter's confidence (kdtree.integrations.budget)
    attention  "verify" (kdtree's verify_attention, or its torch twin) or "sdpa": torch SDPA over a dense
               ancestor mask, the DDTree reference implementation's verification (for comparisons)
    cache_dtype  the KV cache's and attention's dtype (bf16 or f16 for kdtree's kernels)
    alloc      "request" (budget draft nodes per request) or "batch": a round's B x budget draft nodes go to the
               batch's most valuable (probability x how far behind, kdtree.integrations.allocate), at most a tree
               width's worth per request; the round's rows and cost are a uniform round's (attention "verify" only)
    """

    def __init__(self, model, drafter=None, *, backend="kdtree", budget=63, top_k=8, page_size=64,
                 cache_dtype=torch.bfloat16, attention="verify", temperature=0.0, seed=0,
                 auto_budgets=DEFAULT_BUDGETS, costs: CostTable | None = None, alloc="request"):
        require_transformers()
        self.spec = model_spec(model)
        if attention not in ("verify", "sdpa"):
            raise ValueError(f"attention must be 'verify' or 'sdpa', got {attention!r}")
        if alloc not in ("request", "batch"):
            raise ValueError(f"alloc must be 'request' or 'batch', got {alloc!r}")
        if alloc == "batch" and attention == "sdpa":
            raise ValueError("alloc='batch' gives requests different node counts, which attention='sdpa' (a dense "
                             "mask over equal trees) does not take: use attention='verify'")
        self.alloc = alloc
        if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1:
            raise ValueError(f"page_size must be a positive int, got {page_size!r}")
        if backend == "kdtree":
            check_kdtree_shapes(self.spec, page_size, cache_dtype)
        self.ops = load_ops(backend)
        self.backend, self.attention = backend, attention
        self.model, self.drafter = model, drafter
        self.base = getattr(model, model.base_model_prefix)
        self.lm_head = model.get_output_embeddings()
        self.page_size, self.cache_dtype = page_size, cache_dtype
        self.temperature, self.seed = float(temperature), int(seed)
        import kdtree
        self.widths = kdtree.supported_shapes().widths
        self.top_k = int(top_k)
        self.auto = budget == "auto"
        if drafter is not None:
            D = int(drafter.depth)
            if not 1 <= self.top_k <= min(64, self.spec.vocab_size):
                raise ValueError(f"top_k must be 1..{min(64, self.spec.vocab_size)} (at most 64 and the vocabulary's "
                                 f"{self.spec.vocab_size} tokens), got {top_k}")
            self._tree_nodes = sum(self.top_k ** d for d in range(1, D + 1))
            most = min(self._tree_nodes, self.widths[-1] - 1)
            if self.auto:
                bad = [b for b in auto_budgets if isinstance(b, bool) or not isinstance(b, int) or b < 1]
                if bad or not auto_budgets:
                    raise ValueError(f"auto_budgets must be positive ints (budgets above {most} are left out: "
                                     f"this drafter's trees hold at most {most} nodes), got {list(auto_budgets)!r}")
            cands = [b for b in auto_budgets if b <= most] if self.auto else [int(budget)]
            if not cands or any(not 1 <= b <= most for b in cands):
                raise ValueError(f"budget must be 1..{most} (a {D}-deep, {self.top_k}-wide tree in a tree of at most "
                                 f"{self.widths[-1]} nodes) or 'auto', got {budget!r}")
            self.budgets = tuple(sorted(cands))
        else:
            self.budgets = (1,)
        self.costs = costs if costs is not None else CostTable()
        self.autob = None  # budget "auto": the policy and its device-side round numbers (AutoBudget)
        self.k_cache = self.v_cache = None

    # ------------------------------------------------------------------ forward through the model

    def _allocating(self) -> bool:
        """Whether this batch's rounds allocate their nodes over the batch: alloc "batch" and more than one
        request (one request takes the whole allocation, its budget: the uniform round, without the ranking)."""
        return self.alloc == "batch" and self.B > 1

    def cap_of(self, budget):
        """alloc "batch": the draft nodes a request may take in a round at `budget` (its width's largest, within
        the drafter's tree)."""
        return min(self.width(budget + 1) - 1, self._tree_nodes)

    def width(self, nodes):
        for w in self.widths:
            if nodes <= w:
                return w
        raise ValueError(f"{nodes} tree nodes do not fit the largest tree width {self.widths[-1]}")

    @contextlib.contextmanager
    def _driving(self, step):
        """Routes the model's attention to the paged cache for one forward, then restores the model."""
        _register()
        cfg = self.model.config
        old_impl = cfg._attn_implementation
        token = _active.set(step)
        swapped = []
        try:
            cfg._attn_implementation = ATTN_NAME  # GQA: the registry; both: transformers builds no mask
            if self.spec.family == "mla":
                for layer in self.base.layers:
                    attn = layer.self_attn
                    swapped.append((attn, attn.__dict__.get("forward")))  # a wrapper someone put on the instance
                    attn.forward = _mla_forward.__get__(attn)
            yield
        finally:
            for attn, own in swapped:
                if own is None:
                    del attn.forward  # back to the class's forward
                else:
                    attn.forward = own
            cfg._attn_implementation = old_impl
            _active.reset(token)

    def forward_nodes(self, tokens, positions, step):
        """tokens/positions [T] packed nodes -> (float32 logits [T, V], final hidden [T, d])."""
        with self._driving(step):
            h = self.base(input_ids=tokens.long()[None], position_ids=positions.long()[None],
                          use_cache=False).last_hidden_state[0]
        # float32 logits: bf16 would round top-2 margins and make exact ties common (as in the example)
        return F.linear(h.float(), self.lm_head.weight.float()), h

    # ------------------------------------------------------------------ cache and admission

    def _alloc(self, prompts, max_new, num_pages):
        spec, ps, dev = self.spec, self.page_size, self.device
        B = len(prompts)
        D = self.drafter.depth if self.drafter is not None else 0
        Wmax = max(self.width(b + 1) for b in self.budgets) if self.mode == "spec" else self.widths[0]
        longest = max(len(p) for p in prompts)
        need_len = longest + max_new + D + 1 + Wmax  # KV rows (a round's tree included)
        # Positions: the last round's tree reaches D past the last committed token (prompt + max_new, 0-based).
        top = longest + max_new + D - 1
        reach = f"prompts of up to {longest} tokens + max_new_tokens {max_new} + drafter depth {D} reach position {top}"
        for limit, message in (
                (spec.max_positions, f"{reach}, beyond the model's max_position_embeddings {spec.max_positions}: "
                                     f"lower max_new_tokens"),
                (spec.rope_switch, f"{spec.arch}: its longrope RoPE switches to the long factors for a whole forward "
                                   f"once a position reaches original_max_position_embeddings {spec.rope_switch}, "
                                   f"which DDTree's rounds reach earlier than generate(): {reach}; keep them below "
                                   f"{spec.rope_switch} (lower max_new_tokens)"),
                (spec.window, f"{spec.arch}: config.sliding_window {spec.window} limits each token's attention to the "
                              f"last {spec.window} positions, and kdtree attends over the whole prefix: {reach}; keep "
                              f"them below {spec.window} (lower max_new_tokens), or use a config without "
                              f"sliding_window")):
            if limit is not None and top >= limit:
                raise ValueError(message)
        self.M = math.ceil(need_len / ps)
        self.max_kv = self.M * ps
        self._kv_base = need_len - Wmax  # + a round's tree width: that round's bound on a request's KV
        need = B * self.M
        if num_pages is None:
            num_pages = need
        if num_pages < need:
            raise ValueError(f"the KV cache is too small: a batch of {B} requests needs {need} pages of {ps} tokens "
                             f"({self.M} per request: longest prompt {longest} + "
                             f"max_new_tokens {max_new} + drafter depth {D} + one tree of {Wmax} nodes), but "
                             f"num_pages is {num_pages}; raise num_pages or lower the batch or max_new_tokens")
        L, rows = spec.num_layers, (spec.num_kv_heads, spec.head_dim)
        shape = (L, num_pages, ps) + ((rows[1],) if spec.family == "mla" else rows)
        if self.k_cache is None or self.k_cache.shape != shape or self.k_cache.device != dev:
            self.k_cache = torch.zeros(shape, dtype=self.cache_dtype, device=dev)
            self.v_cache = torch.zeros(shape, dtype=self.cache_dtype, device=dev) if spec.family == "gqa" else None
        self.page_table = torch.arange(need, dtype=torch.int32, device=dev).view(B, self.M)

    def _prefill(self, prompts):
        """The prompts but their last tokens (the first roots), in chunks of up to W tokens per request, each
        chunk a chain tree through the same forward."""
        dev, B = self.device, len(prompts)
        C = self.widths[-1]
        MW = (C + 63) // 64
        # node i sees nodes 0..i: word w of row i holds bits j - 64w for 64w <= j <= i
        j = torch.arange(C)
        words = [torch.where((j[:, None] >= 64 * w + torch.arange(64)[None, :]),
                             torch.ones((), dtype=torch.int64) << torch.arange(64)[None, :], 0).sum(1)
                 for w in range(MW)]
        chain = torch.stack(words, 1).to(dev)  # int64 wraparound gives bit 63 its two's-complement value
        lens = [len(p) - 1 for p in prompts]
        for start in range(0, max(lens), C):
            reqs = [b for b in range(B) if lens[b] > start]
            n = [min(C, lens[b] - start) for b in reqs]
            toks = torch.tensor([t for b, k in zip(reqs, n) for t in prompts[b][start:start + k]], device=dev)
            pos = torch.cat([torch.arange(start, start + k) for k in n]).to(dev)
            idx = torch.tensor(reqs, device=dev)
            table = self.page_table.index_select(0, idx)
            rq = torch.cat([torch.full((k,), i) for i, k in enumerate(n)]).to(dev)
            slots = table[rq, pos // self.page_size].long() * self.page_size + pos % self.page_size
            mask = torch.cat([chain[:k] for k in n])
            indptr = torch.tensor([0] + n, dtype=torch.int32).cumsum(0).to(torch.int32).to(dev)
            kv = torch.tensor([start + k for k in n], dtype=torch.int32, device=dev)
            step = _Step(self, slots, table, kv, indptr, mask, C)
            _, h = self.forward_nodes(toks, pos, step)
            ends = indptr[1:].long() - 1
            for i, b in enumerate(reqs):
                if start + n[i] == lens[b]:
                    self.h_last[b] = h[ends[i]]
        self.kv_lens.copy_(torch.tensor(lens, dtype=torch.int32))
        self.root.copy_(torch.tensor([p[-1] for p in prompts], dtype=torch.int32))

    def _admit(self, prompts, max_new, stream_ids, num_pages):
        spec = self.spec
        if isinstance(prompts, torch.Tensor):
            raise TypeError("prompts: expected a list of token-id lists, one per request and without padding (a [B, T] "
                            "tensor's rows would take its padding for prompt tokens: pass [row[mask].tolist() ...])")
        if not isinstance(prompts, (list, tuple)) or any(isinstance(p, int) or not hasattr(p, "__len__") for p in prompts):
            raise TypeError("prompts: expected a list of token-id lists, one per request (a single prompt is "
                            "[[t0, t1, ...]])")
        if not prompts:
            raise ValueError("prompts: expected at least one prompt")
        for i, p in enumerate(prompts):
            if len(p) < 2:
                raise ValueError(f"prompts[{i}] has {len(p)} tokens; at least 2 are needed")
            if any(not 0 <= t < spec.vocab_size for t in p):
                raise ValueError(f"prompts[{i}] has a token outside 0..{spec.vocab_size - 1}")
        if max_new < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new}")
        if stream_ids is not None and len(stream_ids) != len(prompts):
            raise ValueError(f"stream_ids: expected one per request ({len(prompts)}), got {len(stream_ids)}")
        self.device = self.lm_head.weight.device
        if self.backend == "kdtree" and self.device.type != "cuda":
            raise ValueError(f"the model is on {self.device}; backend='kdtree' runs kdtree's CUDA kernels: move the "
                             f"model to a GPU, or use backend='torch'")
        self.model_dtype = self.lm_head.weight.dtype
        dev, B = self.device, len(prompts)
        self.B = B
        self._alloc(prompts, max_new, num_pages)
        z = lambda *s, dt=torch.int32: torch.zeros(*s, dtype=dt, device=dev)
        self.kv_lens, self.root, self.gen = z(B), z(B), z(B)
        self.stream = torch.as_tensor(list(stream_ids) if stream_ids is not None else range(B), dtype=torch.int64,
                                      device=dev)
        self.h_last = torch.zeros(B, spec.hidden_size, dtype=self.model_dtype, device=dev)
        D = self.drafter.depth if self.drafter is not None else 0
        self.max_new = max_new
        self.out_cols = max_new + D + 2  # the last column takes the writes of finished requests
        self.out = z(B, self.out_cols)
        self.out_margin = torch.zeros(B, self.out_cols, dtype=torch.float32, device=dev)
        self.req = torch.arange(B, device=dev)
        self.acc_log, self.budget_log = [], []
        self.s = {}
        self._prefill(prompts)

    # ------------------------------------------------------------------ one round, in stages

    def _row_offsets(self, positions):
        return rounds.row_offsets(self.stream, positions, self.B)

    def _stages(self, budget=None):
        """The round's stages as (name, fn) at tree budget `budget` (None: the decoder's first budget)."""
        s, ops, B = self.s, self.ops, self.B
        if self.mode == "ar":
            return self._ar_stages()
        n0 = budget if budget is not None else self.budgets[0]
        if self._allocating() and self.cap_of(n0) != n0:
            return self._batch_stages(n0)  # (a budget that fills its width gives every request its cap)

        drafter = self._draft

        def tree_build():
            n = budget if budget is not None else self.budgets[0]
            s["tree"] = ops.tree_build(s["dt"], s["dlp"], self.root, self.kv_lens, budget=n,
                                       max_tree_nodes=self.width(n + 1))
            s["budget"] = n

        def target():
            t, N = s["tree"], s["budget"] + 1
            W = self.width(N)
            s["N"] = N
            s["pos"] = t.positions[:, :N].contiguous()
            s["kv_total"] = self.kv_lens + N
            node = torch.arange(N, device=self.device)
            s["slots"] = self._slots(self.req[:, None], self.kv_lens[:, None].long() + node[None, :]).flatten()
            s["indptr"] = torch.arange(B + 1, dtype=torch.int32, device=self.device) * N
            mask = t.tree_mask[:, :N].reshape(B * N, -1)
            # a round's bound, as a decoder with this fixed budget has it (auto's cache bound is the largest
            # budget's; verify_attention plans its KV split from this)
            max_kv = min(self.max_kv, math.ceil((self._kv_base + W) / self.page_size) * self.page_size)
            step = _Step(self, s["slots"], self.page_table, s["kv_total"], s["indptr"], mask, W,
                         dense=self.attention == "sdpa", nodes=N, max_kv=max_kv)
            s["logits"], s["h"] = self.forward_nodes(t.tokens[:, :N].flatten(), s["pos"].flatten(), step)

        def sample():
            s["ttok"] = ops.sample_tokens(s["logits"], temperature=self.temperature, seed=self.seed,
                                          row_offsets=self._row_offsets(s["pos"]).flatten())

        def accept():
            t = s["tree"]
            s["path"], s["acc"], s["bonus"] = ops.tree_accept(t.tokens, t.parents, t.node_counts, s["ttok"],
                                                              node_indptr=s["indptr"])

        def compact():
            ops.kv_compact(self.k_cache, self.page_table, s["kv_total"], s["tree"].node_counts, s["path"], s["acc"],
                           v_caches=self.v_cache)

        def update():
            act, acc = s["active"], s["acc"]
            rounds.commit_tree(self, s["tree"].tokens, s["path"], acc, s["bonus"], act, s["h"], s["logits"],
                               self.drafter.depth)
            self._log_round(act, acc, s["budget"])

        return [("drafter", drafter), ("tree_build", tree_build), ("target", target), ("sample_tokens", sample),
                ("tree_accept", accept), ("kv_compact", compact), ("update", update)]

    def _draft(self):
        """The round's first stage: which requests decode, and the drafter's per-depth top-K."""
        s = self.s
        s["active"] = self.gen < self.max_new
        s["dt"], s["dlp"] = self.drafter.topk(self.h_last, self.root, self.top_k)

    def _log_round(self, act, acc, budget):
        """The round's accepted counts into acc_log; auto: with its accepted paths (and, alloc "batch", the tree's
        scores, which the host ranks) into the policy's record, read by the host lag rounds later."""
        logged = torch.where(act, acc, -1)
        self.acc_log.append(logged)
        self.budget_log.append(budget)
        if self.auto:
            self.autob.record(logged, self.s["path"], self.s["tree"].scores if self.autob.alloc_caps else None)

    def _batch_stages(self, budget):
        """The round at `budget` with alloc "batch": every request's tree built at cap_of(budget), the batch's
        B x budget most valuable draft nodes kept (kdtree.integrations.allocate) and packed request after request
        in B x (budget + 1) rows, as a uniform round has; the ops take the per-request counts and node_indptr."""
        from .allocate import allocate_round
        s, ops, B = self.s, self.ops, self.B
        cap, total, W = self.cap_of(budget), B * budget, self.width(budget + 1)

        def tree_build():
            s["tree"] = ops.tree_build(s["dt"], s["dlp"], self.root, self.kv_lens, budget=cap, max_tree_nodes=W)
            s["budget"] = budget

        def allocate_nodes():
            s["alloc"] = allocate_round(ops, s["tree"].scores, s["active"], total, cap, self.max_new - self.gen)

        def target():
            n = rounds.packed_nodes(s["tree"], s["alloc"], self.kv_lens)
            s["pos"], s["kv_total"] = n.positions, n.kv_total
            s["slots"] = self._slots(n.req, n.cache_pos)
            max_kv = min(self.max_kv, math.ceil((self._kv_base + W) / self.page_size) * self.page_size)
            step = _Step(self, s["slots"], self.page_table, n.kv_total, s["alloc"].indptr, n.mask, W, max_kv=max_kv)
            s["logits"], s["h"] = self.forward_nodes(n.tokens, n.positions, step)

        def sample():
            s["ttok"] = ops.sample_tokens(s["logits"], temperature=self.temperature, seed=self.seed,
                                          row_offsets=rounds.packed_row_offsets(self.stream, s["alloc"], s["pos"]))

        def accept():
            s["path"], s["acc"], s["bonus"] = rounds.accept_allocated(ops, s["tree"], s["alloc"], s["ttok"])

        def compact():
            ops.kv_compact(self.k_cache, self.page_table, s["kv_total"], s["alloc"].counts, s["path"], s["acc"],
                           v_caches=self.v_cache)

        def update():
            act, acc, a = s["active"], s["acc"], s["alloc"]
            rounds.commit_tree(self, s["tree"].tokens, s["path"], acc, s["bonus"], act, s["h"], s["logits"],
                               self.drafter.depth, indptr=a.indptr)
            self._log_round(act, acc, budget)

        return [("drafter", self._draft), ("tree_build", tree_build), ("allocate", allocate_nodes),
                ("target", target), ("sample_tokens", sample), ("tree_accept", accept), ("kv_compact", compact),
                ("update", update)]

    def _slots(self, req, positions):
        ps = self.page_size
        return self.page_table[req, positions // ps].long() * ps + (positions % ps).long()

    def _ar_stages(self):
        s, ops, B = self.s, self.ops, self.B
        W = self.widths[0]

        def target():
            s["active"] = self.gen < self.max_new
            s["pos"] = self.kv_lens.clone()
            kv = self.kv_lens + 1
            slots = self._slots(self.req, self.kv_lens.long())
            indptr = torch.arange(B + 1, dtype=torch.int32, device=self.device)
            mask = torch.ones(B, (W + 63) // 64, dtype=torch.int64, device=self.device)  # bit 0: the node itself
            step = _Step(self, slots, self.page_table, kv, indptr, mask, W, dense=self.attention == "sdpa", nodes=1)
            s["logits"], _ = self.forward_nodes(self.root, s["pos"], step)

        def sample():
            s["ttok"] = ops.sample_tokens(s["logits"], temperature=self.temperature, seed=self.seed,
                                          row_offsets=self._row_offsets(s["pos"]).flatten())

        def update():
            rounds.commit_token(self, s["ttok"], s["active"], s["logits"])

        return [("target", target), ("sample_tokens", sample), ("update", update)]

    # ------------------------------------------------------------------ running

    def _sync(self):
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()

    def _snapshot(self):
        return [t.clone() for t in (self.kv_lens, self.root, self.gen, self.h_last, self.out, self.out_margin)]

    def _restore(self, snap):
        for t, v in zip((self.kv_lens, self.root, self.gen, self.h_last, self.out, self.out_margin), snap):
            t.copy_(v)

    def calibrate(self, rounds=4, lag=2):
        """Measures every candidate budget's round at this batch into self.costs as generate() runs rounds
        (AutoBudget.calibrate: a burst of rounds back to back per budget, no synchronisation between them, timed
        by events between rounds; state restored after each burst). Eager rounds are the host's issue time
        where the host is the bottleneck and the device's where it is; a round synchronised on its own would
        cost both. The largest budget's rounds give every budget's first counts. Runs on the first auto round of
        a batch size the table lacks."""
        snap = self._snapshot()
        logs = (list(self.acc_log), list(self.budget_log))

        def run(b):
            for _, f in self._stages(budget=b):
                f()

        def restore():
            self._restore(snap)
            self.acc_log, self.budget_log = list(logs[0]), list(logs[1])

        self.autob.calibrate(run, restore, rounds=rounds, lag=lag if self.device.type == "cuda" else 0)

    @torch.no_grad()
    def generate(self, prompts, max_new_tokens, *, mode="spec", stream_ids=None, record_margins=False,
                 num_pages=None, profile=False, lag=2, eos_token_id=_MODEL_EOS) -> DDTreeOutput:
        """Decodes every prompt (a list of token id lists; the batch is their number) to max_new_tokens.
        mode "spec" (DDTree) or "ar" (one token per round through the same cache and attention). The host
        checks for the end `lag` rounds late without waiting on the device (auto budgets read one number
        per round). eos_token_id: an id or a list of ids, or None; by default the model's
        generation_config.eos_token_id, as generate() takes it. A request's tokens end at its first one (the
        rounds still decode every request to max_new_tokens)."""
        if mode not in ("spec", "ar"):
            raise ValueError(f"mode must be 'spec' or 'ar', got {mode!r}")
        if mode == "spec" and self.drafter is None:
            raise ValueError("mode 'spec' needs a drafter (DDTreeDecoder(model, drafter, ...))")
        self.mode, self.record_margins = mode, record_margins
        if eos_token_id is _MODEL_EOS:
            eos_token_id = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        eos = _eos_ids(eos_token_id)
        t0 = time.perf_counter()
        self._admit(prompts, max_new_tokens, stream_ids, num_pages)
        self._sync()
        t_prefill = time.perf_counter() - t0
        auto = mode == "spec" and self.auto
        if auto:
            if (self.autob is None or self.autob.device != self.device
                    or (self.autob.alloc_caps is not None) != self._allocating()):
                self.autob = AutoBudget(self.budgets, self.costs, self.device, depth=self.drafter.depth,
                                        alloc_cap=self.cap_of if self._allocating() else None)
            self.autob.reset(self.B, max_new_tokens)
            if not self.costs.has(self.B, self.budgets):
                self.calibrate()  # once per batch size; not counted in the decoding time
        t1 = time.perf_counter()
        stage_ms = {} if profile else None
        max_steps = max_new_tokens + 1
        steps = 0
        log = None
        if mode == "spec":
            # per round: the "all done" flag (auto: the round's accepted paths, AutoBudget.stats, and its time,
            # which the cost table follows), read lag rounds late (a CPU device: at once)
            like = self.autob.stats if auto else torch.zeros(1, dtype=torch.bool, device=self.device)
            log = RoundLog(like, lag if self.device.type == "cuda" else 0)
        while steps < max_steps:
            budget = self.autob.plan() if auto else None
            for name, f in self._stages(budget=budget):
                if profile:
                    self._sync()
                    t = time.perf_counter()
                    f()
                    self._sync()
                    stage_ms[name] = stage_ms.get(name, 0.0) + 1e3 * (time.perf_counter() - t)
                else:
                    f()
            steps += 1
            if mode == "ar":
                if steps == max_new_tokens:
                    break
                continue
            log.push(self.autob.stats if auto else (self.gen >= max_new_tokens).all().view(1), budget)
            if log.ready():
                row, used, secs = log.pop()
                secs = None if profile else secs  # a round synchronised per stage is not a steady round
                if self.autob.observe(row, used, seconds=secs) if auto else bool(row[0]):
                    break
        self._sync()
        t_end = time.perf_counter()
        if int(self.gen.min()) < max_new_tokens:
            raise RuntimeError(f"decoding stopped after {steps} rounds with requests unfinished: {self.gen.tolist()}")
        acc = torch.stack(self.acc_log).tolist() if self.acc_log else []
        tokens = self.out[:, :max_new_tokens].tolist()
        ends = [_eos_end(row, eos) for row in tokens]
        margins = self.out_margin[:, :max_new_tokens].tolist() if record_margins else None
        return DDTreeOutput(
            tokens=[row[:n] for row, n in zip(tokens, ends)], steps=steps, accept_lens=acc,
            budgets=list(self.budget_log), margins=[row[:n] for row, n in zip(margins, ends)] if margins else None,
            seconds=t_prefill + (t_end - t1), prefill_seconds=t_prefill,
            stage_ms={k: v / steps for k, v in stage_ms.items()} if profile else None)
