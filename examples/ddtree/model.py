"""A small DeepSeek-style target model with MLA attention, and the DDTree drafter.

MLA (multi-head latent attention): every token caches one row [c_kv (kv_lora_rank) | k_rope
(rope_dim)] shared by all query heads. Head h's key is [W_uk[h] c_kv | k_rope] and its value
W_uv[h] c_kv. Training and prefill use that unabsorbed form; decoding uses the absorbed form, where
the query of head h becomes [W_uk[h]^T q_nope | q_rope] (576 = 512 + 64 dims) against the cached row
and the attention output (512 latent dims) goes through W_uv[h] afterwards. That is exactly
kdtree's mla576/512 verify kernel; sm_scale stays 1/sqrt(nope_dim + rope_dim) of the unabsorbed head.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass(frozen=True)
class Config:
    vocab: int = 256           # bytes
    d_model: int = 512
    n_layers: int = 4
    n_heads: int = 16
    kv_lora_rank: int = 512    # latent width of the KV cache row (V = these dims)
    rope_dim: int = 64         # decoupled RoPE key, shared by all heads
    nope_dim: int = 128        # per-head query/key dims without RoPE
    v_dim: int = 128           # per-head value dims (W_uv maps the latent to these)
    mlp_mult: int = 3
    rope_theta: float = 10000.0
    draft_depth: int = 16      # D: positions the drafter predicts
    draft_layers: int = 2      # the drafter's bidirectional block layers

    @property
    def row_dim(self):  # one cached token row
        return self.kv_lora_rank + self.rope_dim

    @property
    def sm_scale(self):
        return 1.0 / math.sqrt(self.nope_dim + self.rope_dim)

    def to_dict(self):
        return asdict(self)


def rms_norm(x, weight, eps=1e-6):
    return F.rms_norm(x, (x.shape[-1],), weight, eps)  # one fused kernel on CUDA


_INV_FREQ = {}


def rope_angles(positions, dim, theta):
    """(cos, sin) [N, dim/2] float32 of rotate-half RoPE at integer positions [N]."""
    key = (dim, theta, positions.device)
    if key not in _INV_FREQ:  # made once (before any CUDA-graph capture: the first call is eager)
        _INV_FREQ[key] = 1.0 / (theta ** (torch.arange(0, dim, 2, device=positions.device, dtype=torch.float32) / dim))
    ang = positions.float()[:, None] * _INV_FREQ[key][None, :]
    return ang.cos(), ang.sin()


def rope(x, cs, heads=False):
    """Rotate-half RoPE: x [..., N, dim] (or [..., N, H, dim] with heads), cs = rope_angles(...)."""
    cos, sin = cs
    if heads:
        cos, sin = cos[:, None, :], sin[:, None, :]
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).to(x.dtype)


class MLA(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.c = c
        self.wq = nn.Linear(c.d_model, c.n_heads * (c.nope_dim + c.rope_dim), bias=False)
        self.wdkv = nn.Linear(c.d_model, c.kv_lora_rank + c.rope_dim, bias=False)
        self.kv_norm = nn.Parameter(torch.ones(c.kv_lora_rank))
        self.w_uk = nn.Parameter(torch.randn(c.n_heads, c.nope_dim, c.kv_lora_rank) / math.sqrt(c.kv_lora_rank))
        self.w_uv = nn.Parameter(torch.randn(c.n_heads, c.v_dim, c.kv_lora_rank) / math.sqrt(c.kv_lora_rank))
        self.wo = nn.Linear(c.n_heads * c.v_dim, c.d_model, bias=False)

    def kv_row(self, x, cs):
        """The cached row [c_kv | rope(k_rope)] of each token: x [..., N, d] -> [..., N, 576]."""
        c = self.c
        ckv, kr = self.wdkv(x).split([c.kv_lora_rank, c.rope_dim], dim=-1)
        return torch.cat([rms_norm(ckv, self.kv_norm), rope(kr, cs)], dim=-1)

    def queries(self, x, cs):
        c = self.c
        q = self.wq(x).unflatten(-1, (c.n_heads, c.nope_dim + c.rope_dim))
        q_nope, q_rope = q.split([c.nope_dim, c.rope_dim], dim=-1)
        return q_nope, rope(q_rope, cs, heads=True)

    def forward_full(self, x, cs):
        """Causal attention over a whole sequence (training, prefill): x [B, T, d] at positions
        0..T-1 (cs = their rope_angles). Returns the output and the cached rows [B, T, 576]."""
        c = self.c
        row = self.kv_row(x, cs)
        ckv, kr = row.split([c.kv_lora_rank, c.rope_dim], dim=-1)
        q_nope, q_rope = self.queries(x, cs)  # [B, T, H, *]
        k_nope = torch.einsum("btl,hcl->bhtc", ckv, self.w_uk)
        v = torch.einsum("btl,hvl->bhtv", ckv, self.w_uv)
        q = torch.cat([q_nope, q_rope], dim=-1).transpose(1, 2)  # [B, H, T, 192]
        k = torch.cat([k_nope, kr[:, None].expand(-1, c.n_heads, -1, -1)], dim=-1)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=c.sm_scale)
        return self.wo(o.transpose(1, 2).flatten(2)), row

    def absorbed_query(self, x, cs):
        """x [N, d] -> the 576-dim absorbed query per head, [N, H, 576]."""
        q_nope, q_rope = self.queries(x, cs)
        q_lat = torch.einsum("nhc,hcl->nhl", q_nope, self.w_uk)
        return torch.cat([q_lat, q_rope], dim=-1)

    def absorbed_output(self, latent):
        """latent [N, H, 512] (attention over c_kv) -> [N, d]."""
        return self.wo(torch.einsum("nhl,hvl->nhv", latent, self.w_uv).flatten(1))


class Block(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.attn = MLA(c)
        self.n1 = nn.Parameter(torch.ones(c.d_model))
        self.n2 = nn.Parameter(torch.ones(c.d_model))
        h = c.mlp_mult * c.d_model
        self.w_gate_up = nn.Linear(c.d_model, 2 * h, bias=False)
        self.w_down = nn.Linear(h, c.d_model, bias=False)

    def mlp(self, x):
        g, u = self.w_gate_up(rms_norm(x, self.n2)).chunk(2, dim=-1)
        return self.w_down(F.silu(g) * u)


class Target(nn.Module):
    """The target model. `hidden` below means the final-normed state that feeds the LM head."""

    def __init__(self, c: Config):
        super().__init__()
        self.c = c
        self.emb = nn.Embedding(c.vocab, c.d_model)
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.n_layers))
        self.norm = nn.Parameter(torch.ones(c.d_model))
        self.head = nn.Linear(c.d_model, c.vocab, bias=False)
        nn.init.normal_(self.emb.weight, std=0.02)

    def forward(self, tokens):
        """Training/prefill: tokens [B, T] at positions 0..T-1 -> (logits, hidden, rows per layer)."""
        pos = torch.arange(tokens.shape[1], device=tokens.device)
        cs = rope_angles(pos, self.c.rope_dim, self.c.rope_theta)
        x = self.emb(tokens)
        rows = []
        for blk in self.blocks:
            a, row = blk.attn.forward_full(rms_norm(x, blk.n1), cs)
            rows.append(row)
            x = x + a
            x = x + blk.mlp(x)
        h = rms_norm(x, self.norm)
        return self.head(h), h, rows

    def forward_nodes(self, tokens, positions, attend):
        """Decode/verify: tokens [N] at RoPE positions [N]; attend(layer, q [N, H, 576], rows [N, 576])
        writes the rows into the cache and returns the latent attention output [N, H, 512]."""
        cs = rope_angles(positions, self.c.rope_dim, self.c.rope_theta)  # shared by every layer
        x = self.emb(tokens)
        for i, blk in enumerate(self.blocks):
            xn = rms_norm(x, blk.n1)
            row = blk.attn.kv_row(xn, cs)
            q = blk.attn.absorbed_query(xn, cs)
            x = x + blk.attn.absorbed_output(attend(i, q, row))
            x = x + blk.mlp(x)
        h = rms_norm(x, self.norm)
        # float32 logits: bf16 would round top-2 margins to ~0.1 and make exact ties common,
        # which the greedy-equality check would then have to excuse
        return F.linear(h.float(), self.head.weight.float()), h


class Drafter(nn.Module):
    """Per-depth distributions of the next D tokens in one pass (what DDTree's tree build consumes).

    Input: the target's hidden state at the position before the root (the one that predicted the
    root token) and the root token. A sequence of D + 1 slots, [root] + D query slots, each slot
    = proj(hidden) + (root embedding | depth embedding), goes through a small bidirectional
    transformer block; slot d's output gives the distribution of the token d positions after the
    root. Nothing is cached, so the drafter adds no KV state to the serving loop.
    """

    def __init__(self, c: Config):
        super().__init__()
        self.c = c
        d = c.d_model
        self.proj = nn.Linear(d, d, bias=False)
        self.emb = nn.Embedding(c.vocab, d)
        self.depth_emb = nn.Parameter(torch.randn(c.draft_depth + 1, d) * 0.02)
        self.n_heads = 8
        self.layers = nn.ModuleList()
        for _ in range(c.draft_layers):
            self.layers.append(nn.ModuleDict(dict(
                qkv=nn.Linear(d, 3 * d, bias=False), o=nn.Linear(d, d, bias=False),
                up=nn.Linear(d, 4 * d, bias=False), down=nn.Linear(4 * d, d, bias=False))))
            self.register_parameter(f"n1_{len(self.layers) - 1}", nn.Parameter(torch.ones(d)))
            self.register_parameter(f"n2_{len(self.layers) - 1}", nn.Parameter(torch.ones(d)))
        self.norm = nn.Parameter(torch.ones(d))
        self.head = nn.Linear(d, c.vocab, bias=False)
        nn.init.normal_(self.emb.weight, std=0.02)

    def forward(self, hidden, root):
        """hidden [N, d], root [N] -> logits [N, D, vocab] for the tokens 1..D after the root."""
        D = self.c.draft_depth
        x = self.proj(hidden)[:, None, :] + self.depth_emb[None]  # [N, D+1, d]
        x = torch.cat([x[:, :1] + self.emb(root)[:, None], x[:, 1:]], dim=1)
        for i, L in enumerate(self.layers):
            xn = rms_norm(x, getattr(self, f"n1_{i}"))
            q, k, v = L["qkv"](xn).unflatten(-1, (3, self.n_heads, -1)).permute(2, 0, 3, 1, 4)
            a = F.scaled_dot_product_attention(q, k, v)
            x = x + L["o"](a.transpose(1, 2).flatten(2))
            x = x + L["down"](F.gelu(L["up"](rms_norm(x, getattr(self, f"n2_{i}")))))
        return self.head(rms_norm(x[:, 1:], self.norm))

    def topk(self, hidden, root, k):
        """Top-k tokens [N, D, k] int32 and their log-probs [N, D, k] float32, descending."""
        lp = torch.log_softmax(self(hidden, root).float(), dim=-1)
        vals, idx = lp.topk(k, dim=-1)
        return idx.to(torch.int32), vals.contiguous()
