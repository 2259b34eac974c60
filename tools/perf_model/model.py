"""Predicted time of one bench_verify shape: the launch plan (from verify_plan, the
runtime's own planner), the SM simulation of the kernel's steady-state tile, the
waves of CTAs over the SMs, the fixed work of a CTA, the DRAM bytes, the split
combine and the launches."""
from __future__ import annotations

import dataclasses
import math

import sim
from kernel import Kernel


NOT_MODELLED = "NOT MODELLED"


@dataclasses.dataclass
class Prediction:
    shape: str
    arch: str
    us: float
    main_us: float
    combine_us: float
    binding: str
    ctas_per_sm: int
    waves: int
    tile_cycles: float       # one KV tile of all resident CTAs of an SM (full waves)
    tensor_busy: float
    port_busy: float
    issue_busy: float
    l2_busy: float
    tflops: float
    kv_gbps: float
    flops: float
    bytes: float

    @property
    def modelled(self) -> bool:
        return not self.binding.startswith(NOT_MODELLED)


def occupancy(k: Kernel, plan: dict, r: dict) -> int:
    """CTAs per SM the hardware can hold: registers (allocated per warp in units of
    256, 16K per scheduler), shared memory (plus the per-CTA reservation), warps."""
    warps = plan["warps"]
    regs_warp = math.ceil(k.registers * 32 / 256) * 256
    warps_per_sched = (r["regs_sm"] // 4) // regs_warp
    by_regs = (4 * warps_per_sched) // warps
    by_smem = plan["max_smem_per_sm"] // (plan["smem"] + r["smem_reserved_cta"])
    by_warps = r["max_warps_sm"] // warps
    return max(1, min(by_regs, by_smem, by_warps, r["max_ctas_sm"]))


def shape_flops_bytes(plan: dict) -> tuple[float, float]:
    """The roofline's FLOPs and bytes, as bench_verify computes them."""
    mla = plan["head_qk"] == 576
    nodes = plan["nodes"] * plan["batch"]
    flops = 2.0 * nodes * plan["q_heads"] * plan["kv_len"] * (plan["head_qk"] + plan["head_v"])
    kvb = 1 if plan.get("kv_dtype") == "e4m3" else 2  # bytes a cached element
    kv = plan["batch"] * plan["kv_len"] * plan["kv_heads"] * (plan["head_qk"] + (0 if mla else plan["head_v"])) * kvb
    qo = nodes * plan["q_heads"] * (plan["head_qk"] + plan["head_v"]) * 2
    return flops, float(kv + qo)


def stream_k(plan: dict) -> dict | None:
    """A stream-K plan's work per CTA (templates/verify_attention_common.cuh): the
    unit line of (request, KV head, row tile) items of kv tiles each, cut into
    stream_ctas ranges of chunk units. Returns the CTAs with work, chunk, the most
    segments a CTA runs, the partial pieces written, the most pieces of an item and
    the items cut; None for a uniform-split plan."""
    p_ctas = plan.get("stream_ctas", 0)
    if not p_ctas:
        return None
    tiles = math.ceil(plan["kv_len"] / plan["block_n"])
    items = plan["batch"] * plan["kv_heads"] * plan["active_x"]
    total = items * tiles
    chunk = math.ceil(total / p_ctas)
    ctas = math.ceil(total / chunk)
    segments = pieces = max_pieces = cut = 0
    for c in range(ctas):
        u0, u1 = c * chunk, min(total, (c + 1) * chunk)
        first, last = u0 // tiles, (u1 - 1) // tiles
        segments = max(segments, last - first + 1)
    for i in range(items):
        c0, c1 = (i * tiles) // chunk, ((i + 1) * tiles - 1) // chunk
        if c1 > c0:
            cut += 1
            pieces += c1 - c0 + 1
            max_pieces = max(max_pieces, c1 - c0 + 1)
    return {"ctas": ctas, "chunk": chunk, "segments": segments, "pieces": pieces, "max_pieces": max_pieces,
            "cut_items": cut}


class Model:
    def __init__(self, rates: dict):
        self.r = rates
        self._sim: dict = {}

    def tile(self, k: Kernel, warps: int, ctas: int, active_sms: int) -> sim.SmResult:
        key = (k.name, warps, ctas, active_sms)
        if key not in self._sim:
            r = dict(self.r)
            # The L2 bandwidth is shared by the SMs that are running.
            r["l2_bytes_per_s"] = self.r["l2_bytes_per_s"] * self.r["num_sms"] / max(1, active_sms)
            self._sim[key] = sim.simulate(k.role_steps, warps, ctas, r)
        return self._sim[key]

    def predict(self, plan: dict, k: Kernel) -> Prediction:
        r = self.r
        clk = r["clock_hz"]
        nsm = r["num_sms"]
        occ = occupancy(k, plan, r)
        ctas = plan["active_x"] * plan["grid"][1] * plan["splits"]
        tiles = math.ceil(plan["split_tokens"] / plan["block_n"])
        tiles = min(tiles, math.ceil(plan["kv_len"] / plan["block_n"]))
        segments = 1
        stream = stream_k(plan)
        if stream:
            ctas, tiles, segments = stream["ctas"], stream["chunk"], stream["segments"]
        slots = nsm * occ
        waves = math.ceil(ctas / slots)
        # Fixed work of a CTA: the instructions outside the loop, the pipeline fill
        # (Q and the first STAGES - 1 tiles) and the output or 16-bit partial stores.
        # The CTAs of the first wave start together, so their fill is one burst
        # through L2 (one memory latency at least), and those of the last wave end
        # together with one burst of stores; CTAs of other waves overlap theirs
        # with running CTAs.
        mla = plan["head_qk"] == 576
        row_bytes = (plan["head_qk"] + (0 if mla else plan["head_v"])) * (1 if plan.get("kv_dtype") == "e4m3" else 2)
        fill_bytes = plan["block_m"] * plan["head_qk"] * 2 + (plan["stages"] - 1) * plan["block_n"] * row_bytes
        store_bytes = plan["block_m"] * plan["head_v"] * (4 if plan["splits"] > 1 else 2)
        cluster = plan.get("cluster_splits", 0)
        merge = 0.0
        if cluster > 1:
            # Splits merged in a cluster: only rank 0 stores (the output rows), after it
            # has read the other ranks' 16-bit rows from their shared memory, a chain of
            # two remote loads per (row, split) and the bytes at the DSMEM rate, between
            # two cluster barriers.
            store_bytes = plan["block_m"] * plan["head_v"] * 2 / cluster
            peer_bytes = (cluster - 1) * plan["block_m"] * plan["head_v"] * 2
            chains = (cluster - 1) * 4 * 2 * r["dsmem_latency"]  # 4 rows a thread, stats then values
            merge = max(peer_bytes / r["dsmem_bytes_per_clk_sm"], chains) + 2 * r["cluster_barrier_cycles"]
        l2_bpc = r["l2_bytes_per_s"] / clk
        cycles = 0.0
        first = None
        remaining = ctas
        for wave in range(waves):
            in_wave = min(remaining, slots)
            remaining -= in_wave
            per_sm = math.ceil(in_wave / nsm)
            active = min(nsm, in_wave)
            t = self.tile(k, plan["warps"], per_sm, active)
            first = first or t
            fill = max(r["mem_latency"], in_wave * fill_bytes / l2_bpc) if wave == 0 else r["mem_latency"]
            drain = max(r["mem_latency"], in_wave * store_bytes / l2_bpc) if wave == waves - 1 else 0
            # A stream-K CTA runs its range as segments; each one after the first
            # loads its Q tile and fills the pipeline again, and stores its rows.
            refill = (segments - 1) * (k.outside_stall_cycles + 2 * r["mem_latency"])
            cycles += k.outside_stall_cycles + fill + tiles * t.cycles_per_tile + drain + refill + merge
        main_us = cycles / clk * 1e6
        flops, nbytes = shape_flops_bytes(plan)
        rows = plan["nodes"] * plan["batch"] * plan["q_heads"]
        partial_row_bytes = plan["head_v"] * 2 + 4  # 16-bit values and an fp32 LSE
        partial_bytes = plan["splits"] * rows * partial_row_bytes if plan["splits"] > 1 and cluster <= 1 else 0
        pieces = plan["splits"]  # partials merged per row, at most
        merged_rows = rows       # rows the combine writes: every row of uniform splits,
        if stream:               # a stream-K plan's cut items only (the main kernel writes whole items')
            partial_bytes = stream["pieces"] * plan["block_m"] * partial_row_bytes
            pieces = stream["max_pieces"]
            merged_rows = min(rows, stream["cut_items"] * plan["block_m"])
        dram_us = (nbytes + partial_bytes) / r["dram_bytes_per_s"] * 1e6 + 2 * r["mem_latency"] / clk * 1e6
        binding = self.binding(first)
        if dram_us > main_us:
            main_us, binding = dram_us, "DRAM"
        combine_us = 0.0
        if (plan["splits"] > 1 and cluster <= 1) or (stream and ctas > 1):
            # Each combine thread holds 8 splits' loads in flight per round trip;
            # the partials were just written and are read from L2.
            batches = math.ceil(max(1, pieces) / 8) * max(1, plan["head_v"] // 512)
            launch_us = r["launch_us"] - (r["pdl_combine_saving_us"] if r["programmatic_launch"] else 0.0)
            combine_us = (launch_us + batches * r["mem_latency"] / clk * 1e6 +
                          (partial_bytes + merged_rows * plan["head_v"] * 2) / r["l2_bytes_per_s"] * 1e6)
        total = r["launch_us"] + main_us + combine_us
        if waves * tiles * first.cycles_per_tile < 0.5 * cycles and binding != "DRAM":
            binding = "fill/drain (" + binding + ")"
        if k.local_per_tile:
            # Local memory shares L1 with the kernel's shared memory and misses to L2 in a
            # dependency chain the replay does not see: the H200 ran gqa256's e4m3 tiles 64,64,4,2,16,
            # with a 704-byte stack frame in its tile loop, 7x slower than this replay predicted.
            binding = f"{NOT_MODELLED}: {k.local_per_tile} local-memory accesses a warp and tile"
        return Prediction(plan["shape"], r["arch"], total, main_us, combine_us, binding, occ, waves,
                          first.cycles_per_tile, first.tensor_busy, first.port_busy, first.issue_busy, first.l2_busy,
                          flops / total / 1e6, nbytes / total / 1e3, flops, nbytes)

    @staticmethod
    def binding(t: sim.SmResult) -> str:
        use = {"tensor": t.tensor_busy, "smem port": t.port_busy, "issue": t.issue_busy, "L2": t.l2_busy}
        name, top = max(use.items(), key=lambda kv: kv[1])
        if top >= 0.85:
            return name
        return f"latency ({name} {top:.0%})"
