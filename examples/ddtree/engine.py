"""The serving loop: a static batch of requests over a paged MLA cache, decoded either
speculatively with DDTree or autoregressively (the baseline), one step at a time.

DDTree step (all on the device, no host synchronisation, so it can be one CUDA graph):
  drafter (per-depth top-K) -> tree_build -> the target over the tree nodes (each layer writes the
  nodes' KV rows at positions prefix + i and runs verify_attention with RoPE positions prefix +
  depth) -> sample_tokens (a target token at every node) -> tree_accept -> kv_compact -> the
  request state (committed length, root token, generated tokens) advances.
Autoregressive step: the target over one node per request (the same verify_attention kernel with
a one-node tree), sample_tokens, append.

Request state between steps: `kv_lens[b]` tokens are in the cache (the prompt without its last
token, then the generated tokens except the newest); `root[b]` is the newest token, not yet in the
cache, at position kv_lens[b]; `h_last[b]` is the target's hidden state at position kv_lens[b] - 1
(the one that predicted root), which the drafter reads.

Sampling: the target token at a node at depth d predicts position prefix + d + 1, and is drawn with
sample_tokens' counter-based RNG at row offset (stream_id << 32) + that position. Each position's
noise is therefore used for exactly one emitted token, independent of the noise that chose the
path to it, which makes tree acceptance lossless; and autoregressive decoding with the same
stream id draws the same tokens (up to numerics), which the tests use.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from kdtree.integrations import load_ops, rounds
from kdtree.integrations.budget import RoundLog

from .paged_cache import PagedKVCache


def tree_width(budget: int) -> int:
    """The smallest kdtree tree width W that holds the root and `budget` draft nodes (the widths are
    libkdtree's own table, kdtree.supported_shapes())."""
    import kdtree
    widths = kdtree.supported_shapes().widths
    for w in widths:
        if budget + 1 <= w:
            return w
    raise ValueError(f"budget {budget} does not fit the largest tree width {widths[-1]} (budget <= {widths[-1] - 1})")


load_backend = load_ops  # the example's name for it


@dataclass
class Result:
    tokens: list          # per request, exactly max_new generated tokens
    steps: int            # decoding steps run
    accept_lens: list     # per step, per request accepted draft tokens (-1 = request already done)
    margins: list | None  # per request, the target's top-2 logit margin at each generated token
    seconds: float
    budgets: list | None = None  # budget "auto": the budget of each step


class Engine:
    """mode 'spec' (DDTree) or 'ar'. Greedy for temperature <= 0.

    dtype is that of the KV cache, the attention queries and outputs (what kdtree's kernels take);
    the model computes in its own parameters' dtype (bf16 normally; float32 for the tight greedy
    check, where only the cache rows and attention outputs are bf16)."""

    def __init__(self, target, drafter, cfg, ops, *, mode="spec", batch_size, max_prompt, max_new,
                 budget=63, top_k=8, temperature=0.0, seed=0, page_size=64, num_pages=None,
                 record_margins=False, device="cuda", dtype=torch.bfloat16, kv_dtype=None, kv_scale=1.0,
                 auto_budgets=None, alloc="request"):
        if mode not in ("spec", "ar"):
            raise ValueError(f"mode must be 'spec' or 'ar', got {mode!r}")
        if alloc not in ("request", "batch"):
            raise ValueError(f"alloc must be 'request' (budget draft nodes per request) or 'batch' (budget x batch "
                             f"draft nodes shared by the batch), got {alloc!r}")
        if batch_size < 1 or max_new < 1 or max_prompt < 2:
            raise ValueError("batch_size and max_new must be >= 1 and max_prompt >= 2")
        self.cfg, self.ops, self.mode = cfg, ops, mode
        self.target, self.drafter = target, drafter
        self.device, self.dtype = torch.device(device), dtype
        self.model_dtype = next(target.parameters()).dtype
        self.B, self.max_new, self.temperature, self.seed = batch_size, max_new, float(temperature), int(seed)
        D = cfg.draft_depth
        # budget "auto": each round's budget is chosen from the measured step cost at this batch and the
        # accepted counts every budget would have given in the rounds so far (kdtree.integrations.budget.
        # AutoBudget) among auto_budgets (default DEFAULT_BUDGETS); the cache is sized for the largest candidate.
        self.auto = mode == "spec" and budget == "auto"
        self.autob, self.costs = None, None
        if self.auto:
            from kdtree.integrations.budget import DEFAULT_BUDGETS
            most = min(sum(top_k ** d for d in range(1, D + 1)), 127)
            self.budgets = tuple(sorted(b for b in (auto_budgets or DEFAULT_BUDGETS) if 1 <= b <= most))
            if not self.budgets:
                raise ValueError(f"auto_budgets {auto_budgets}: no budget in 1..{most} (the {D}-deep, {top_k}-wide "
                                 f"tree's node count, at most 127)")
            budget = self.budgets[-1]
        if mode == "spec":
            if not 1 <= top_k <= min(64, cfg.vocab):
                raise ValueError(f"top_k must be 1..64, got {top_k}")
            if budget > sum(top_k ** d for d in range(1, D + 1)):
                raise ValueError(f"budget {budget} exceeds the {D}-deep, {top_k}-wide tree's node count")
            self.W = tree_width(budget)
            self.N = budget + 1          # nodes per request: root + budget (tree_build always fills it)
        else:
            self.W, self.N = 16, 1       # a one-node tree per request
        # alloc "batch" (kdtree.integrations.allocate): a round's B x budget draft nodes go to the batch's most
        # valuable (probability x how far behind the request is, allocate.behind), each request's tree built at
        # `cap` (its width's largest), so a request holds up to cap + 1.
        # A batch of one takes the whole allocation, its budget: the uniform round's nodes, without the ranking.
        self.alloc = alloc if mode == "spec" and batch_size > 1 else "request"
        self._tree_nodes = sum(top_k ** d for d in range(1, D + 1))
        self.cap = self.cap_of(budget) if self.alloc == "batch" else None
        self.room = self.N if self.cap is None else self.cap + 1  # the most nodes a request's tree holds
        self.budget, self.K = budget, top_k
        self.MW = (self.W + 63) // 64
        self.page_size = page_size
        # Longest KV a request reaches: a finished request keeps running (static batch) with its
        # length frozen at prompt - 1 + (< max_new + D + 1) generated, plus one tree.
        self.max_kv = max_prompt + max_new + D + 1 + self.room
        self.M = math.ceil(self.max_kv / page_size)
        if num_pages is None:
            num_pages = self.M * batch_size
        # kv_dtype torch.float8_e4m3fn: an e4m3 cache with one scale (paged_cache.py)
        self.cache = PagedKVCache(cfg.n_layers, num_pages, page_size, cfg.row_dim, dtype, self.device,
                                  kv_dtype=kv_dtype, kv_scale=kv_scale)
        self.max_prompt = max_prompt
        self.record_margins = record_margins
        self.out_cols = max_new + D + 2  # the last column takes the writes of finished requests
        dev = self.device
        z = lambda *s, dt=torch.int32: torch.zeros(*s, dtype=dt, device=dev)
        self.page_table = torch.full((batch_size, self.M), -1, dtype=torch.int32, device=dev)
        self.kv_lens, self.root, self.gen = z(batch_size), z(batch_size), z(batch_size)
        self.stream = z(batch_size, dt=torch.int64)
        self.h_last = torch.zeros(batch_size, cfg.d_model, dtype=self.model_dtype, device=dev)
        self.out = z(batch_size, self.out_cols)
        self.out_margin = torch.zeros(batch_size, self.out_cols, dtype=torch.float32, device=dev)
        self.max_steps = max_new + 1
        self.acc_log = z(self.max_steps + 1, batch_size)   # last row: steps past max_steps
        self.step_no = z(1)
        self._minus1 = torch.full((), -1, dtype=torch.int32, device=dev)  # where(out=) takes no Python scalar
        self.indptr = torch.arange(batch_size + 1, dtype=torch.int32, device=dev) * self.N
        self.node = torch.arange(self.N, dtype=torch.int32, device=dev)
        self.req = torch.arange(batch_size, device=dev)
        self.row_split = None
        if cfg.row_dim != 576:  # the torch backend's small test models: V = the latent part
            self.row_split = cfg.kv_lora_rank
        self.pages_of = [[] for _ in range(batch_size)]
        self.graph = None
        self.graphs = None  # auto: {budget: graph}
        if self.auto:
            from kdtree.integrations.budget import AutoBudget, CostTable
            self.costs = CostTable()
            self.autob = AutoBudget(self.budgets, self.costs, dev, depth=D,
                                    alloc_cap=self.cap_of if self.alloc == "batch" else None)
        self._geo = {}
        self.budget_log = []  # auto: the budget of each step
        self.s = {}

    # ------------------------------------------------------------------ admission and prefill

    def admit(self, prompts, stream_ids=None):
        """Resets every request slot to a new prompt (token id lists) and prefills their caches."""
        B, ps = self.B, self.page_size
        if len(prompts) != B:
            raise ValueError(f"the engine was built for a batch of {B}, got {len(prompts)} prompts")
        for i, p in enumerate(prompts):
            if len(p) < 2:
                raise ValueError(f"prompt {i} has {len(p)} tokens; at least 2 are needed")
            if len(p) > self.max_prompt:
                raise ValueError(f"prompt {i} has {len(p)} tokens; this engine's cache takes prompts of at most "
                                 f"{self.max_prompt} tokens (max_prompt: {self.M} pages of {ps} tokens per request "
                                 f"hold the prompt, {self.max_new} new tokens, the drafter's lookahead and one tree)")
            if any(not 0 <= t < self.cfg.vocab for t in p):
                raise ValueError(f"prompt {i} has a token outside 0..{self.cfg.vocab - 1}")
        for pages in self.pages_of:
            if pages:
                self.cache.allocator.free(pages)
        self.pages_of = [[] for _ in range(B)]
        need = [math.ceil((len(p) + self.max_new + self.cfg.draft_depth + 1 + self.room) / ps) for p in prompts]
        if sum(need) > self.cache.allocator.free_pages:
            raise ValueError(f"a batch of {B} requests needs {sum(need)} pages of {ps} tokens but the cache has "
                             f"{self.cache.allocator.free_pages} free of {self.cache.num_pages}")
        table = torch.full((B, self.M), -1, dtype=torch.int32)
        for b, n in enumerate(need):
            self.pages_of[b] = self.cache.allocator.alloc(n, f"request {b}")
            table[b, :n] = torch.tensor(self.pages_of[b], dtype=torch.int32)
        self.page_table.copy_(table)
        self.stream.copy_(torch.as_tensor(stream_ids if stream_ids is not None else range(B), dtype=torch.int64))
        self.gen.zero_()
        self.out.zero_()
        self.out_margin.zero_()
        self.acc_log.fill_(-1)
        self.step_no.zero_()
        self.budget_log = []
        if self.auto:
            self.autob.reset(B, self.max_new)
        # Prefill requests of equal length together: the prompt but its last token (the first root).
        by_len = {}
        for b, p in enumerate(prompts):
            by_len.setdefault(len(p), []).append(b)
        with torch.no_grad():
            for n, reqs in by_len.items():
                toks = torch.tensor([prompts[b][:-1] for b in reqs], device=self.device)
                _, h, rows = self.target(toks)
                req = torch.tensor(reqs, device=self.device)
                pos = torch.arange(n - 1, device=self.device)
                slots = self.cache.slots(self.page_table, req[:, None], pos[None, :]).flatten()
                for layer, r in enumerate(rows):
                    self.cache.write(layer, slots, r.flatten(0, 1))
                self.h_last[req] = h[:, -1]
                self.kv_lens[req] = n - 1
                self.root[req] = torch.tensor([prompts[b][-1] for b in reqs], dtype=torch.int32, device=self.device)

    # ------------------------------------------------------------------ the step, in stages

    def _attend(self, kv_total, mask, W=None, indptr=None, max_kv_len=None):
        ops, cache = self.ops, self.cache
        W = self.W if W is None else W
        indptr = self.indptr if indptr is None else indptr
        max_kv_len = self.M * self.page_size if max_kv_len is None else max_kv_len

        def attend(layer, q, row):
            cache.write(layer, self.s["slots"], row)
            k = cache.layer(layer)
            v = None if self.row_split is None else k[..., : self.row_split]
            out = ops.verify_attention(q.to(self.dtype).contiguous(), k, self.page_table, kv_total, indptr,
                                       mask, max_tree_nodes=W, v_cache=v, sm_scale=self.cfg.sm_scale,
                                       max_kv_len=max_kv_len, **cache.attention_scales())
            return out.to(self.model_dtype)
        return attend

    def cap_of(self, budget):
        """alloc "batch": the draft nodes a request may take in a round at `budget` (its width's largest, within
        the drafter's tree)."""
        return min(tree_width(budget) - 1, self._tree_nodes)

    def _row_offsets(self, positions):
        return rounds.row_offsets(self.stream, positions, self.B)

    def stages(self, budget=None):
        return self._spec_stages(budget) if self.mode == "spec" else self._ar_stages()

    def _geometry(self, budget):
        """(N, W, MW, indptr, node, max_kv_len) of a tree of `budget` draft nodes (made once, before any capture).
        max_kv_len is the bound a fixed-budget engine at `budget` passes (its longest KV in pages), not the
        auto engine's cache bound (sized for the largest budget): verify_attention plans its KV split and
        stream-K work from it, so a larger bound made auto's small-budget rounds dearer than the same round
        of a fixed budget."""
        if budget not in self._geo:
            N, W = budget + 1, tree_width(budget)
            held = N if self.cap is None else self.cap_of(budget) + 1  # the most nodes a request holds in the round
            pages = math.ceil((self.max_kv - self.room + held) / self.page_size)
            self._geo[budget] = (N, W, (W + 63) // 64,
                                 torch.arange(self.B + 1, dtype=torch.int32, device=self.device) * N,
                                 torch.arange(N, dtype=torch.int32, device=self.device),
                                 min(pages, self.M) * self.page_size)
        return self._geo[budget]

    def _draft(self):
        """The round's first stage: which requests decode, and the drafter's per-depth top-K."""
        s = self.s
        s["active"] = self.gen < self.max_new
        s["dt"], s["dlp"] = self.drafter.topk(self.h_last, self.root, self.K)

    def _log_round(self, act, acc):
        """The round's accepted counts into acc_log; auto: they go straight into the policy's record (one kernel
        fewer per round) with the accepted paths (and, alloc "batch", the tree's scores, which the host ranks),
        read by the host lag steps later."""
        row = self.step_no.clamp(max=self.max_steps).long()
        logged = (torch.where(act, acc, self._minus1, out=self.autob.accepted) if self.auto
                  else torch.where(act, acc, -1))
        self.acc_log.index_copy_(0, row, logged[None])
        self.step_no.add_(1)
        if self.auto:
            self.autob.record(logged, self.s["path"], self.s["tree"].scores if self.autob.alloc_caps else None)

    def _spec_stages(self, budget=None):
        """The DDTree round at `budget`."""
        budget = self.budget if budget is None else budget
        if self.alloc == "batch" and self.cap_of(budget) != budget:
            return self._batch_stages(budget)  # (a budget that fills its width gives every request its cap)
        s, ops, B = self.s, self.ops, self.B
        N, W, MW, indptr, node, max_kv_len = self._geometry(budget)

        drafter = self._draft

        def tree_build():
            s["tree"] = ops.tree_build(s["dt"], s["dlp"], self.root, self.kv_lens, budget=budget,
                                       max_tree_nodes=W)

        def target():
            t = s["tree"]
            s["pos"] = t.positions[:, :N].contiguous()
            s["kv_total"] = self.kv_lens + N
            s["slots"] = self.cache.slots(self.page_table, self.req[:, None],
                                          (self.kv_lens[:, None] + node[None, :]).long()).flatten()
            mask = t.tree_mask[:, :N].reshape(B * N, MW)
            s["logits"], s["h"] = self.target.forward_nodes(t.tokens[:, :N].flatten(), s["pos"].flatten(),
                                                            self._attend(s["kv_total"], mask, W, indptr, max_kv_len))

        def sample_tokens():
            s["ttok"] = ops.sample_tokens(s["logits"], temperature=self.temperature, seed=self.seed,
                                          row_offsets=self._row_offsets(s["pos"]).flatten())

        def tree_accept():
            t = s["tree"]
            s["path"], s["acc"], s["bonus"] = ops.tree_accept(t.tokens, t.parents, t.node_counts, s["ttok"],
                                                              node_indptr=indptr)

        def kv_compact():
            ops.kv_compact(self.cache.k, self.page_table, s["kv_total"], s["tree"].node_counts, s["path"], s["acc"])

        def update():
            act, acc = s["active"], s["acc"]
            rounds.commit_tree(self, s["tree"].tokens, s["path"], acc, s["bonus"], act, s["h"], s["logits"],
                               self.cfg.draft_depth)
            self._log_round(act, acc)

        return [("drafter", drafter), ("tree_build", tree_build), ("target", target), ("sample_tokens", sample_tokens),
                ("tree_accept", tree_accept), ("kv_compact", kv_compact), ("update", update)]

    def _batch_stages(self, budget):
        """The DDTree round at `budget` with alloc "batch": each request's tree built at cap_of(budget), then the
        batch's B x budget most valuable draft nodes kept (kdtree.integrations.allocate) and packed request after
        request, B x (budget + 1) rows as a uniform round has; the ops take the per-request counts and
        node_indptr."""
        from kdtree.integrations.allocate import allocate_round
        s, ops, B = self.s, self.ops, self.B
        cap, total = self.cap_of(budget), B * budget
        _, W, _, _, _, max_kv_len = self._geometry(budget)

        drafter = self._draft

        def tree_build():
            s["tree"] = ops.tree_build(s["dt"], s["dlp"], self.root, self.kv_lens, budget=cap, max_tree_nodes=W)

        def allocate_nodes():
            s["alloc"] = allocate_round(ops, s["tree"].scores, s["active"], total, cap, self.max_new - self.gen)

        def target():
            n = rounds.packed_nodes(s["tree"], s["alloc"], self.kv_lens)
            s["pos"], s["kv_total"] = n.positions, n.kv_total
            s["slots"] = self.cache.slots(self.page_table, n.req, n.cache_pos)
            attend = self._attend(n.kv_total, n.mask, W, s["alloc"].indptr, max_kv_len)
            s["logits"], s["h"] = self.target.forward_nodes(n.tokens, n.positions, attend)

        def sample_tokens():
            s["ttok"] = ops.sample_tokens(s["logits"], temperature=self.temperature, seed=self.seed,
                                          row_offsets=rounds.packed_row_offsets(self.stream, s["alloc"], s["pos"]))

        def tree_accept():
            s["path"], s["acc"], s["bonus"] = rounds.accept_allocated(ops, s["tree"], s["alloc"], s["ttok"])

        def kv_compact():
            ops.kv_compact(self.cache.k, self.page_table, s["kv_total"], s["alloc"].counts, s["path"], s["acc"])

        def update():
            act, acc = s["active"], s["acc"]
            rounds.commit_tree(self, s["tree"].tokens, s["path"], acc, s["bonus"], act, s["h"], s["logits"],
                               self.cfg.draft_depth, indptr=s["alloc"].indptr)
            self._log_round(act, acc)

        return [("drafter", drafter), ("tree_build", tree_build), ("allocate", allocate_nodes), ("target", target),
                ("sample_tokens", sample_tokens), ("tree_accept", tree_accept), ("kv_compact", kv_compact),
                ("update", update)]

    def _ar_stages(self):
        s, ops, B = self.s, self.ops, self.B
        if "mask" not in s:
            s["mask"] = torch.ones(B, self.MW, dtype=torch.int64, device=self.device)  # bit 0: the node itself

        def target():
            s["active"] = self.gen < self.max_new
            s["pos"] = self.kv_lens.clone()
            s["kv_total"] = self.kv_lens + 1
            s["slots"] = self.cache.slots(self.page_table, self.req, self.kv_lens.long())
            s["logits"], _ = self.target.forward_nodes(self.root, s["pos"], self._attend(s["kv_total"], s["mask"]))

        def sample_tokens():
            s["ttok"] = ops.sample_tokens(s["logits"], temperature=self.temperature, seed=self.seed,
                                          row_offsets=self._row_offsets(s["pos"]).flatten())

        def update():
            rounds.commit_token(self, s["ttok"], s["active"], s["logits"])
            self.step_no.add_(1)

        return [("target", target), ("sample_tokens", sample_tokens), ("update", update)]

    @torch.no_grad()
    def step(self):
        if self.auto:
            self._auto_step()
            return
        if self.graph is not None:
            self.graph.replay()
            return
        for _, f in self.stages():
            f()

    def _run_round(self, budget):
        if self.graphs is not None:
            self.graphs[budget].replay()
        else:
            for _, f in self._spec_stages(budget):
                f()

    def _auto_step(self):
        """The budget the rounds read so far choose (no host read here: generate() hands each step's numbers
        to the policy lag steps later)."""
        b = self.autob.plan()
        self.budget_log.append(b)
        self._run_round(b)

    @torch.no_grad()
    def calibrate(self, rounds=6, lag=2):
        """auto: measures every candidate budget's round at this batch (AutoBudget.calibrate: a burst of rounds
        back to back per budget, as generate() runs them, timed by events between them; state restored after
        each); the largest budget's rounds give every budget's first counts. generate() calls it once per batch
        size, before its timer starts; the table then follows the rounds generate() runs."""
        snap = self._snapshot()
        self.autob.calibrate(self._run_round, lambda: self._restore(snap), rounds=rounds,
                             lag=lag if self.device.type == "cuda" else 0)

    # ------------------------------------------------------------------ CUDA graphs

    def _snapshot(self):
        return [t.clone() for t in (self.kv_lens, self.root, self.gen, self.h_last, self.out, self.out_margin,
                                    self.acc_log, self.step_no)]

    def _restore(self, snap):
        for t, v in zip((self.kv_lens, self.root, self.gen, self.h_last, self.out, self.out_margin,
                         self.acc_log, self.step_no), snap):
            t.copy_(v)

    def _rounds(self):
        """Every round a step can run, as (key, stages): one for a fixed budget; auto: one per budget."""
        if not self.auto:
            return [(None, self.stages())]
        return [(b, self._spec_stages(b)) for b in self.budgets]

    def _warm_rounds(self, passes=2):
        """Runs every round eagerly (compiles kdtree's kernels, sets cuBLAS up), each from the admitted state:
        rounds run back to back from one `active` would move requests past max_new, the output columns and
        the pages they have (at batch 64 with budget auto that was a device-side assert)."""
        snap = self._snapshot()
        for _ in range(passes):
            for _, stages in self._rounds():
                for _, f in stages:
                    f()
                self._restore(snap)

    def _warm(self):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self._warm_rounds()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()

    @torch.no_grad()
    def capture(self):
        """Captures one step as a CUDA graph (auto: one per budget), after eager warm-up steps
        (which compile kdtree's kernels). The request state is restored afterwards: positions past kv_lens
        are rewritten by the next tree before they are read, so the cache needs no restoring."""
        if self.device.type != "cuda":
            raise RuntimeError("CUDA graphs need a CUDA device")
        snap = self._snapshot()
        self._warm()
        graphs = {}
        for key, stages in self._rounds():
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                for _, f in stages:
                    f()
            graphs[key] = g
        torch.cuda.synchronize()
        self._restore(snap)
        if self.auto:
            self.graphs = graphs
        else:
            self.graph = graphs[None]

    @torch.no_grad()
    def stage_graphs(self):
        """One CUDA graph per stage (for the per-op breakdown), captured like `capture`."""
        if self.auto:
            raise ValueError("the per-op breakdown takes a fixed budget, not 'auto'")
        snap = self._snapshot()
        self._warm()
        graphs = []
        for name, f in self.stages():
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                f()
            graphs.append((name, g))
        torch.cuda.synchronize()
        self._restore(snap)
        return graphs

    # ------------------------------------------------------------------ running

    @torch.no_grad()
    def generate(self, prompts, stream_ids=None, lag=2):
        """Decodes every request to max_new tokens. The host never reads inside a step: after each
        step a one-byte "all done" flag (auto: the step's numbers for the budget policy) is copied
        to pinned memory with an event (budget.RoundLog), and the host waits for the copy of the step
        `lag` steps back, so the device always has the next steps queued and at most `lag` steps run past
        the end. (A CPU run checks after every step.) auto: the first call at a batch size measures the
        step costs first, untimed; each step's time, read with its numbers, then joins the cost table."""
        self.admit(prompts, stream_ids)
        if self.auto and not self.costs.has(self.B, self.budgets):
            self.calibrate()
        sync = self.device.type == "cuda"
        if sync:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        steps = 0
        if self.mode == "ar":  # exactly max_new steps, no checks needed
            for _ in range(self.max_new):
                self.step()
            steps = self.max_new
        else:
            # auto: the step's numbers (and its time, which the cost table follows); else the "all done" flag
            like = self.autob.stats if self.auto else torch.zeros(1, dtype=torch.bool, device=self.device)
            log = RoundLog(like, lag if sync else 0)
            while steps < self.max_steps:
                self.step()
                steps += 1
                if self.auto:
                    log.push(self.autob.stats, self.budget_log[-1])
                else:
                    log.push((self.gen >= self.max_new).all().view(1))
                if log.ready():
                    row, used, secs = log.pop()
                    if self.autob.observe(row, used, seconds=secs) if self.auto else bool(row[0]):
                        break
        if sync:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        if int(self.gen.min()) < self.max_new:
            raise RuntimeError(f"decoding stopped after {steps} steps with requests unfinished: {self.gen.tolist()}")
        out = self.out[:, : self.max_new].tolist()
        acc = self.acc_log[: min(steps, self.max_steps)].tolist() if self.mode == "spec" else []
        margins = self.out_margin[:, : self.max_new].tolist() if self.record_margins else None
        return Result(out, steps, acc, margins, seconds, list(self.budget_log) if self.auto else None)
