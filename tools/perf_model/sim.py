"""One SM running the steady-state KV-tile loop: every resident warp replays its
SASS path with the compiler's control bits, against the SM's shared resources.

Per cycle, each of the 4 schedulers issues at most one instruction from one of
its warps (loose round robin). An instruction issues when the warp's stall
count since its last issue has elapsed, the scoreboards it waits for are clear,
and its pipe accepts it:
  - MMA (HMMA, QMMA, QMMA.SF): the scheduler's tensor pipe, busy FLOP / (tensor
    FLOP/clk/SM at the instruction's rate / 4) cycles (m16n8k16: 4096 FLOP, m16n8k32:
    8192; the result latency is in the compiler's stall counts);
  - shared-memory accesses (LDSM, LDS, STS, SHFL and the shared-memory write of
    cp.async): one port per SM, busy bytes / port_bytes_per_clk cycles each, the
    result after smem_latency more, plus smem_latency_per_inflight for each access
    of the same partition still in flight (latency under load; released through the
    instruction's scoreboard);
    while the port's backlog exceeds mio_queue_cycles, no more are accepted (the
    MIO queue is full: "MIO throttle");
  - cp.async (LDGSTS): also the SM's share of the L2 bandwidth; a commit group is
    complete mem_latency after its last byte, and DEPBAR waits for it;
  - other math: the scheduler's FMA, IMAD, ALU or XU (MUFU, conversions) pipe, busy
    32 / (its lanes per scheduler) cycles; LDG (page table, tree mask: L1-resident) l1_latency;
  - instruction fetch: a warp waits icache_miss_cycles for a 128-byte line of code
    that is not in its scheduler's L0 instruction cache (icache_l0_bytes, LRU);
  - BAR.SYNC: released barrier_latency after every warp of the CTA has arrived; a named barrier
    with a thread count when the count's warps have arrived on it: with an
    immediate id (BAR.SYNC 0x3, 0x100) any of the CTA's warps, with an id in a
    register (BAR.SYNC R2, 0x80) those of the arriving warp's group of
    consecutive warps (the kernels' warp rows). BAR.ARV arrives without waiting.
The time per tile is the steady-state period once every warp has run a few tiles.
"""
from __future__ import annotations

import dataclasses
import re

from sass import Instr, access_bytes, is_mma, mma_flop, mma_rate

# Instruction kinds of the replay.
ALU, HMMA, MIO, LDGSTS, LDG, MUFU, BAR, DEPBAR, COMMIT = range(9)
MMA = HMMA  # every tensor-core MMA (HMMA, QMMA) is this kind; Step.flop and Step.rate say how much and at which rate


@dataclasses.dataclass
class Step:
    kind: int
    stall: int
    wr_sb: int
    rd_sb: int
    wait: int
    port_bytes: int = 0
    global_bytes: int = 0
    depbar_n: int = 0
    live: bool = True  # False for @!PT instructions (issued, never executed)
    bar_warps: int = 0  # BAR: warps a named barrier waits for (0: the whole CTA)
    bar_id: int = -1    # BAR: an immediate barrier id (-1: in a register, or the CTA barrier)
    bar_arrive: bool = False  # BAR.ARV: arrive without waiting
    pipe: str = ""     # the scheduler's math pipe it occupies ("fma", "imad", "alu", "xu"), if any
    addr: int = -1     # byte address in the function (instruction fetch); -1: not modelled
    flop: int = 4096   # MMA: FLOP of the instruction (m16n8k16: 4096, m16n8k32: 8192)
    rate: str = "bf16"  # MMA: which tensor rate ("bf16", "e4m3": plain fp8 QMMA, "mxf8": block-scaled QMMA.SF)


# Math pipes by opcode (CUDA programming guide, arithmetic instruction throughput:
# FP32 add/mul/fma 128 lanes per SM on sm_86+ (64 on sm_80); integer add, logic,
# compare, min/max, shift and integer multiply-add 64; conversions and MUFU 16).
# F2FP (the packed conversions: F2FP.BF16.F32.PACK_AB, F2FP.SATFINITE.E4M3.F32.PACK_AB*,
# F2FP.F16.E4M3.UNPACK_B) is not an XU conversion: ptxas issues it with fixed latency (no
# scoreboard) and back-to-back F2FPs two cycles apart on sm_90 and sm_120, the 64-lane pipe.
_PIPES = {
    "fma": ("FFMA", "FADD", "FMUL", "HFMA2", "HADD2", "HMUL2"),
    "imad": ("IMAD", "IMUL"),
    "alu": ("IADD3", "IADD", "LOP3", "LOP", "ISETP", "FSETP", "FMNMX", "IMNMX", "SEL", "FSEL", "SHF", "PLOP3", "LEA",
            "PRMT", "IABS", "FCHK", "BMSK", "SGXT", "POPC", "FLO", "F2FP"),
    "xu": ("MUFU", "F2F", "I2F", "F2I", "FRND", "I2FP", "F2IP"),
}
_PIPE_OF = {op: pipe for pipe, ops in _PIPES.items() for op in ops}


def compile_path(path: list[Instr]) -> list[Step]:
    steps = []
    for ins in path:
        b = ins.base
        live = ins.pred != "@!PT"
        if is_mma(ins):
            kind = HMMA
        elif b == "LDGSTS":
            kind = LDGSTS
        elif b in ("LDSM", "LDS", "STS", "SHFL"):
            kind = MIO
        elif b in ("LDG", "LDC", "ULDC"):
            kind = LDG if b == "LDG" else ALU
        elif b == "MUFU":
            kind = MUFU
        elif b == "BAR":
            kind = BAR
        elif b == "DEPBAR":
            kind = DEPBAR
        elif b == "LDGDEPBAR":
            kind = COMMIT
        else:
            kind = ALU
        s = Step(kind, max(1, ins.stall), ins.wr_sb, ins.rd_sb, ins.wait, live=live, pipe=_PIPE_OF.get(b, ""),
                 addr=ins.addr)
        if kind == HMMA:
            s.flop, s.rate = mma_flop(ins), mma_rate(ins)
        if kind in (MIO, LDGSTS) and live:
            s.port_bytes = access_bytes(ins)
        if kind == LDGSTS and live:
            s.global_bytes = access_bytes(ins)
        if kind == BAR:
            m = re.fullmatch(r"\s*(\w+)\s*,\s*0x([0-9a-f]+)\s*", ins.operands)
            s.bar_warps = int(m.group(2), 16) // 32 if m else 0
            if m and m.group(1).startswith("0x"):
                s.bar_id = int(m.group(1), 16)
            s.bar_arrive = ins.op.startswith("BAR.ARV")
        if kind == DEPBAR:
            m = re.search(r"0x([0-9a-f]+)", ins.operands)
            s.depbar_n = int(m.group(1), 16) if m else 0
        steps.append(s)
    return steps


@dataclasses.dataclass
class SmResult:
    cycles_per_tile: float   # all resident CTAs advance one tile
    tensor_busy: float       # fraction of cycles each scheduler's tensor pipe is busy (mean)
    port_busy: float         # fraction of cycles the shared-memory port is busy
    issue_busy: float        # fraction of scheduler issue slots used (mean)
    l2_busy: float           # fraction of the SM's L2 bandwidth share used
    stalls: dict             # warp-cycles not issued, by reason, per issued instruction


def simulate(steps: list, warps_per_cta: int, ctas: int, rates: dict, tiles: int = 6, warm: int = 2) -> SmResult:
    """steps: one warp's steady path (list of Step), or one path per warp role
    (list of lists): consecutive groups of warps_per_cta / roles warps of a CTA
    (its warp rows) take the roles in turn."""
    role_paths = steps if steps and isinstance(steps[0], list) else [steps]
    n_warps = warps_per_cta * ctas
    per_role = max(1, warps_per_cta // len(role_paths))
    path_of = [role_paths[min(len(role_paths) - 1, (w % warps_per_cta) // per_role)] for w in range(n_warps)]
    # Tensor pipe cycles per FLOP of one scheduler, by rate (rates.py: plain e4m3 and
    # block-scaled fp8 default to the bf16 rate where the arch has no rate of its own).
    per_flop = {kind: 4.0 / rates.get(f"tensor_flop_per_clk_sm_{kind}", rates["tensor_flop_per_clk_sm"])
                for kind in ("e4m3", "mxf8")}
    per_flop["bf16"] = 4.0 / rates["tensor_flop_per_clk_sm"]
    port_rate = rates["smem_bytes_per_clk_sm"]
    l2_rate = rates["l2_bytes_per_s"] / rates["num_sms"] / rates["clock_hz"]
    smem_lat, l1_lat = rates["smem_latency"], rates["l1_latency"]
    mem_lat, mufu_lat = rates["mem_latency"], rates["mufu_latency"]
    bar_lat = rates["barrier_latency"]
    # Shared-memory latency under load: each shared-memory access (LDSM, LDS, STS, SHFL)
    # of a partition still in flight (issued, result not yet back) adds
    # smem_latency_per_inflight cycles to the latency of the next one.
    load_lat = rates.get("smem_latency_per_inflight", 0.0)
    inflight: list[list[float]] = [[] for _ in range(4)]  # per partition: result times of accesses in flight
    mio_queue = rates["mio_queue_cycles"]

    pc = [0] * n_warps
    tile = [0] * n_warps
    ready = [0.0] * n_warps
    sb = [[0.0] * 6 for _ in range(n_warps)]
    groups: list[list[float]] = [[] for _ in range(n_warps)]
    open_group = [0.0] * n_warps
    at_bar = [False] * n_warps
    bar_arrived: dict[tuple, list[int]] = {}  # barrier -> warps arrived (waiting or not) in this generation
    tile_end: list[list[float]] = [[] for _ in range(n_warps)]
    sched_of = [w % 4 for w in range(n_warps)]
    cta_of = [w // warps_per_cta for w in range(n_warps)]
    tensor_free = [0.0] * 4
    pipe_cycles = rates["pipe_cycles"]
    pipe_free = [{p: 0.0 for p in pipe_cycles} for _ in range(4)]
    last_issued = [-1] * 4
    port_grant = [0.0] * 4
    port_free = 0.0
    l2_free = 0.0
    busy_tensor = busy_port = busy_l2 = 0.0
    issued = 0
    # A warp starts with its earlier tiles' copies complete (the pipeline prologue).
    warps_of = [[w for w in range(n_warps) if sched_of[w] == s] for s in range(4)]
    now = 0
    done = 0
    stalls: dict[str, int] = {}
    counting = False
    t_warm = t_end = None
    limit = 200000 * tiles
    seeded: set = set()
    # Instruction fetch: each scheduler's L0 instruction cache, LRU over 128-byte lines; a
    # line not resident is filled in icache_miss_cycles (the warp waits). A loop whose
    # executed lines fit stays resident; a larger one misses on every line, every pass.
    ic_lines = rates.get("icache_l0_bytes", 0) // 128
    ic_miss = rates.get("icache_miss_cycles", 0)
    l0: list[dict[int, float]] = [{} for _ in range(4)]  # line -> time its fill completes (insertion order = LRU)

    ifetch = [0.0] * n_warps

    def fetch(q: int, line: int, t: float) -> float:
        """When line is in scheduler q's L0 (starting a fill at t if absent); marks it most recent."""
        c = l0[q]
        at = c.pop(line, None)
        if at is None:
            at = t + ic_miss
            if len(c) >= ic_lines:
                del c[next(iter(c))]
        c[line] = at
        return at
    while done < n_warps:
        now += 1
        if now > limit:
            raise RuntimeError("simulation did not converge")
        # Every warp waits on a barrier: the kernel's prologue makes the first
        # arrival of a hand-off between warp rows (a barrier some path arrives on
        # with BAR.ARV), e.g. row 1's copies of tile 0; make it once per barrier.
        if all(at_bar[w] or tile[w] >= tiles for w in range(n_warps)):
            blocked = {key for key in bar_arrived if key[1] == "id" and any(at_bar[x] for x in bar_arrived[key])}
            blocked |= {(cta_of[w], "id", path_of[w][pc[w] - 1].bar_id) for w in range(n_warps)
                        if at_bar[w] and path_of[w][pc[w] - 1].bar_id >= 0}
            fresh = sorted(key for key in blocked if key not in seeded)[:1]  # one at a time: it may unblock the rest
            if not fresh:
                raise RuntimeError("simulation deadlocked on barriers")
            for key in fresh:
                seeded.add(key)
                arrivers = [w for w in range(n_warps) if cta_of[w] == key[0] and
                            any(st.bar_arrive and st.bar_id == key[2] for st in path_of[w])]
                if not arrivers:
                    raise RuntimeError(f"simulation deadlocked on barrier {key[2]}: nothing arrives on it")
                arrived = bar_arrived.setdefault(key, [])
                arrived.extend(arrivers)
                size = next(st.bar_warps for st in path_of[arrivers[0]] if st.bar_id == key[2]) or warps_per_cta
                if len(arrived) >= size:
                    for x in arrived:
                        if at_bar[x]:
                            at_bar[x] = False
                            ready[x] = max(ready[x], now + bar_lat)
                    del bar_arrived[key]
        # The scheduler that least recently got the shared-memory port goes first.
        for s in sorted(range(4), key=port_grant.__getitem__):
            cands = warps_of[s]
            order = cands
            if last_issued[s] in cands:  # loose round robin: start after the last warp issued
                i = cands.index(last_issued[s])
                order = cands[i + 1:] + cands[:i + 1]
            chosen = -1
            for w in order:
                if tile[w] >= tiles:
                    continue
                reason = ""
                st = path_of[w][pc[w]]
                if ic_lines and st.addr >= 0 and ready[w] <= now and not at_bar[w]:
                    ifetch[w] = fetch(s, st.addr // 128, now)
                if at_bar[w]:
                    reason = "barrier"
                elif ifetch[w] > now:
                    reason = "instruction fetch"
                elif ready[w] > now:
                    reason = "fixed latency (stall count)"
                elif st.wait and any((st.wait >> k) & 1 and sb[w][k] > now for k in range(6)):
                    reason = "scoreboard"
                elif st.kind == HMMA and tensor_free[s] - now >= 1:
                    reason = "tensor pipe"
                elif st.pipe and pipe_free[s][st.pipe] - now >= 1:
                    reason = "math pipe"
                elif st.kind in (MIO, LDGSTS) and port_free - now > mio_queue:
                    reason = "MIO throttle"
                elif st.kind == DEPBAR and len(groups[w]) > st.depbar_n and max(groups[w][:len(groups[w]) - st.depbar_n]) > now:
                    reason = "cp.async wait"
                elif chosen >= 0:
                    reason = "not selected"
                else:
                    chosen = w
                if reason and counting:
                    stalls[reason] = stalls.get(reason, 0) + 1
            if chosen >= 0:
                w = chosen
                st = path_of[w][pc[w]]
                kind = st.kind
                issued += 1
                last_issued[s] = w
                if st.pipe:
                    pipe_free[s][st.pipe] = max(pipe_free[s][st.pipe], now) + pipe_cycles[st.pipe]
                done_at = now
                if kind == HMMA:
                    occ = st.flop * per_flop[st.rate]
                    tensor_free[s] = max(tensor_free[s], now) + occ
                    busy_tensor += occ
                elif kind == MUFU:
                    done_at = now + mufu_lat
                elif kind in (MIO, LDGSTS) and st.live:
                    port_grant[s] = now
                    service = max(1.0, st.port_bytes / port_rate)
                    start = max(port_free, now)
                    port_free = start + service
                    busy_port += service
                    extra = 0.0
                    if load_lat and kind == MIO:
                        inflight[s] = [t for t in inflight[s] if t > now]
                        extra = load_lat * len(inflight[s])
                    done_at = port_free + smem_lat + extra
                    if load_lat and kind == MIO:
                        inflight[s].append(done_at)
                    if kind == LDGSTS:
                        l2s = st.global_bytes / l2_rate
                        l2_free = max(l2_free, now) + l2s
                        busy_l2 += l2s
                        open_group[w] = max(open_group[w], l2_free + mem_lat)
                        done_at = start + 2
                elif kind == LDG and st.live:
                    done_at = now + l1_lat
                elif kind == COMMIT:
                    groups[w].append(open_group[w])
                    open_group[w] = 0.0
                    if len(groups[w]) > 8:
                        groups[w] = groups[w][-8:]
                if st.wr_sb < 6:
                    sb[w][st.wr_sb] = max(sb[w][st.wr_sb], done_at)
                if st.rd_sb < 6:
                    sb[w][st.rd_sb] = max(sb[w][st.rd_sb], now + 2 if kind not in (MIO, LDGSTS) else done_at - smem_lat - extra)
                ready[w] = now + st.stall
                pc[w] += 1
                if kind == BAR:
                    size = st.bar_warps or warps_per_cta
                    if st.bar_id >= 0:
                        key = (cta_of[w], "id", st.bar_id)
                    else:
                        key = (cta_of[w], "group", (w % warps_per_cta) // size, size)
                    arrived = bar_arrived.setdefault(key, [])
                    arrived.append(w)
                    at_bar[w] = not st.bar_arrive
                    if len(arrived) == size:
                        for x in arrived:
                            if at_bar[x]:
                                at_bar[x] = False
                                ready[x] = max(ready[x], now + bar_lat)
                        del bar_arrived[key]
                if pc[w] == len(path_of[w]):
                    pc[w] = 0
                    tile[w] += 1
                    tile_end[w].append(now)
                    if tile[w] >= tiles:
                        done += 1
        if t_warm is None and all(len(e) >= warm for e in tile_end):
            t_warm = max(e[warm - 1] for e in tile_end)
            b0 = (busy_tensor, busy_port, busy_l2, issued, now)
            counting = True
    t_end = max(e[-1] for e in tile_end)
    span = t_end - t_warm
    per_tile = span / (tiles - warm)
    bt, bp, bl, bi, _ = b0
    n_issued = max(1, issued - bi)
    return SmResult(per_tile, (busy_tensor - bt) / (4 * span), (busy_port - bp) / span, (issued - bi) / (4 * span),
                    (busy_l2 - bl) / span, {k: v / n_issued for k, v in sorted(stalls.items())})
