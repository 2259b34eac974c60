"""Trains the target and then the drafter (target frozen) on the stdlib corpus, or loads them from
the weight cache of an earlier run with the same config, settings and corpus.

Cache dir: $KDTREE_DDTREE_CACHE, else $KDTREE_CACHE_DIR/ddtree, else ~/.cache/kdtree-ddtree.
Weights are never written into the repository.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from . import data
from .model import Config, Drafter, Target


@dataclass(frozen=True)
class TrainSettings:
    target_steps: int = 1000
    drafter_steps: int = 700
    batch: int = 48
    seq: int = 512              # >= the longest position decoded (prompt + new tokens + tree depth)
    lr: float = 2e-3
    drafter_lr: float = 2e-3
    seed: int = 1234
    corpus_bytes: int = 24 << 20
    time_cap_s: float = 150.0   # a guard: training stops here even if steps remain (reported)


# The H200 configuration (the shapes) and a tiny one for CPU tests.
PRESETS = {
    "h200": (Config(d_model=512, n_layers=6, n_heads=16), TrainSettings()),
    # CPU tests: the same code with a small latent (the torch backend takes any row width).
    "tiny": (Config(d_model=48, n_layers=2, n_heads=2, kv_lora_rank=32, rope_dim=16, nope_dim=16, v_dim=16,
                    mlp_mult=2, draft_depth=6, draft_layers=1),
             TrainSettings(target_steps=150, drafter_steps=60, batch=16, seq=48, lr=1e-2, drafter_lr=5e-3,
                           corpus_bytes=1 << 20, time_cap_s=40.0)),
}


def cache_dir() -> Path:
    if os.environ.get("KDTREE_DDTREE_CACHE"):
        return Path(os.environ["KDTREE_DDTREE_CACHE"])
    if os.environ.get("KDTREE_CACHE_DIR"):
        return Path(os.environ["KDTREE_CACHE_DIR"]) / "ddtree"
    return Path.home() / ".cache" / "kdtree-ddtree"


def _lr(step, total, peak):
    warm = max(1, total // 20)
    if step < warm:
        return peak * (step + 1) / warm
    return peak * 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, total - warm))) * 0.95 + peak * 0.05


def _autocast(device):
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return torch.autocast("cpu", enabled=False)


def train_target(cfg, st, train_bytes, device, log):
    torch.manual_seed(st.seed)
    model = Target(cfg).to(device)
    steps = fit_target(model, model.parameters(), st, train_bytes, device, log, fused=device.type == "cuda")
    return model.eval(), steps


def fit_target(model, params, st, train_bytes, device, log, fused=False, log_every=10):
    """Next-byte training of `model` (tokens [B, T] -> (logits, hidden, _)) on random windows of the corpus,
    cosine learning rate, under st's step count and time cap; logs log_every times. Returns the steps run."""
    opt = torch.optim.AdamW(params, lr=st.lr, betas=(0.9, 0.95), weight_decay=0.05, fused=fused)
    gen = torch.Generator().manual_seed(st.seed)
    t0 = time.time()
    steps = 0
    for step in range(st.target_steps):
        if time.time() - t0 > st.time_cap_s * 0.6:
            log(f"  target: time cap reached after {step} of {st.target_steps} steps")
            break
        for g in opt.param_groups:
            g["lr"] = _lr(step, st.target_steps, st.lr)
        x = data.random_windows(train_bytes, st.batch, st.seq + 1, gen).to(device, non_blocking=True)
        with _autocast(device):
            logits, _, _ = model(x[:, :-1])
        loss = F.cross_entropy(logits.float().flatten(0, 1), x[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        steps = step + 1
        if step % max(1, st.target_steps // log_every) == 0 or step == st.target_steps - 1:
            log(f"  target step {step:4d}  loss {loss.item() / math.log(2):.3f} bits/byte  {time.time() - t0:.0f}s")
    return steps


def drafter_batch(target, x, D, device):
    """Drafter inputs and labels from windows x [B, T]: the root at t+1, the target's hidden state
    at t; for depth d = 1..D the byte at t+1+d (hard label) and the target's own distribution of
    it given the true prefix (soft label, the target's logits at t+d). Training on the soft labels
    distils the target: what tree acceptance rewards is agreeing with the target, not the data."""
    with torch.no_grad(), _autocast(device):
        logits, h, _ = target(x)
    T = x.shape[1]
    n = T - D - 1
    hid = h[:, :n].float().flatten(0, 1)
    root = x[:, 1:n + 1].flatten()
    idx = torch.arange(n, device=x.device)[:, None] + 2 + torch.arange(D, device=x.device)[None, :]
    labels = x[:, idx].flatten(0, 1)  # [B*n, D]
    soft = torch.softmax(logits[:, idx - 1].float(), -1).flatten(0, 1)  # [B*n, D, V]
    return hid, root, labels, soft


def train_drafter(cfg, st, target, train_bytes, device, log):
    torch.manual_seed(st.seed + 1)
    dr = Drafter(cfg).to(device)
    opt = torch.optim.AdamW(dr.parameters(), lr=st.drafter_lr, betas=(0.9, 0.95), weight_decay=0.01, fused=device.type == "cuda")
    gen = torch.Generator().manual_seed(st.seed + 1)
    D = cfg.draft_depth
    t0 = time.time()
    steps = 0
    for step in range(st.drafter_steps):
        if time.time() - t0 > st.time_cap_s * 0.4:
            log(f"  drafter: time cap reached after {step} of {st.drafter_steps} steps")
            break
        for g in opt.param_groups:
            g["lr"] = _lr(step, st.drafter_steps, st.drafter_lr)
        x = data.random_windows(train_bytes, st.batch // 2, st.seq + D + 1, gen).to(device)
        hid, root, _, soft = drafter_batch(target, x, D, device)
        with _autocast(device):
            logits = dr(hid, root)
        loss = -(soft * torch.log_softmax(logits.float(), -1)).sum(-1).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(dr.parameters(), 1.0)
        opt.step()
        steps = step + 1
        if step % max(1, st.drafter_steps // 5) == 0 or step == st.drafter_steps - 1:
            log(f"  drafter step {step:4d}  loss {loss.item():.3f} nats/depth  {time.time() - t0:.0f}s")
    return dr.eval(), steps


@torch.no_grad()
def evaluate(cfg, target, drafter, held, device, windows=32, seq=256):
    """Held-out target bits/byte, mean top-1 probability, and the drafter's per-depth top-1 accuracy."""
    gen = torch.Generator().manual_seed(7)
    x = data.random_windows(held, windows, seq + cfg.draft_depth + 1, gen).to(device)
    with _autocast(device):
        logits, _, _ = target(x[:, :-1])
    lp = torch.log_softmax(logits.float(), -1)
    nll = -lp.gather(-1, x[:, 1:, None]).mean().item() / math.log(2)
    top1 = lp.exp().amax(-1).mean().item()
    hid, root, labels, soft = drafter_batch(target, x, cfg.draft_depth, device)
    with _autocast(device):
        dl = drafter(hid, root)
    acc = (dl.argmax(-1) == labels).float().mean(0).tolist()
    agree = (dl.argmax(-1) == soft.argmax(-1)).float().mean(0).tolist()
    return {"target_bits_per_byte": round(nll, 4), "target_mean_top1_prob": round(top1, 4),
            "drafter_top1_acc_by_depth": [round(a, 3) for a in acc],
            "drafter_top1_agrees_with_target_by_depth": [round(a, 3) for a in agree]}


def _weights_path(preset, cfg, st, train_bytes):
    key_src = json.dumps([cfg.to_dict(), asdict(st), data.fingerprint(train_bytes), 5], sort_keys=True)
    return cache_dir() / f"{preset}-{hashlib.sha256(key_src.encode()).hexdigest()[:16]}.pt"


def weights_cached(preset="h200") -> bool:
    """Whether get_models(preset) would load instead of train."""
    cfg, st = PRESETS[preset]
    return _weights_path(preset, cfg, st, data.load_corpus(st.corpus_bytes)[0]).exists()


def get_models(preset="h200", device="cuda", log=print, use_cache=True, cfg=None, settings=None):
    """(target, drafter, cfg, info): trained now or loaded from the cache. float32 weights."""
    device = torch.device(device)
    pcfg, pst = PRESETS[preset]
    cfg, st = cfg or pcfg, settings or pst
    t0 = time.time()
    train_bytes, held = data.load_corpus(st.corpus_bytes)
    path = _weights_path(preset, cfg, st, train_bytes)
    target, drafter = Target(cfg), Drafter(cfg)
    if use_cache and path.exists():
        blob = torch.load(path, map_location="cpu", weights_only=True)
        target.load_state_dict(blob["target"])
        drafter.load_state_dict(blob["drafter"])
        info = dict(blob["info"], loaded_from=str(path))
        log(f"models loaded from {path}")
        return target.to(device).eval(), drafter.to(device).eval(), cfg, info
    log(f"training ({preset}: {cfg.n_layers} layers, d_model {cfg.d_model}, {cfg.n_heads} heads, MLA "
        f"{cfg.kv_lora_rank}+{cfg.rope_dim}; corpus {train_bytes.numel() / 1e6:.1f} MB of stdlib source) on {device}")
    target, t_steps = train_target(cfg, st, train_bytes, device, log)
    for p in target.parameters():
        p.requires_grad_(False)
    drafter, d_steps = train_drafter(cfg, st, target, train_bytes, device, log)
    for p in drafter.parameters():
        p.requires_grad_(False)
    info = {"train_seconds": round(time.time() - t0, 1), "target_steps": t_steps, "drafter_steps": d_steps,
            "settings": asdict(st), "config": cfg.to_dict()}
    info.update(evaluate(cfg, target, drafter, held, device, seq=st.seq - cfg.draft_depth - 1))
    log(f"trained in {info['train_seconds']} s: {json.dumps({k: info[k] for k in ('target_bits_per_byte', 'target_mean_top1_prob', 'drafter_top1_acc_by_depth', 'drafter_top1_agrees_with_target_by_depth')})}")
    if use_cache:
        save_weights(path, target, drafter, info, log)
    return target, drafter, cfg, info


def save_weights(path, target, drafter, info, log):
    """Stores the trained weights atomically (a private temporary file, then a rename); a failure is a warning:
    the models are still returned, only not cached."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        torch.save({"target": target.state_dict(), "drafter": drafter.state_dict(), "info": info}, tmp)
        os.replace(tmp, path)
        log(f"weights cached at {path}")
    except OSError as e:
        log(f"warning: could not cache the weights ({e})")


def corpus_prompts(preset, lengths, seed=99, settings=None):
    _, st = PRESETS[preset]
    st = settings or st
    _, held = data.load_corpus(st.corpus_bytes)
    return data.prompts(held, lengths, seed)
