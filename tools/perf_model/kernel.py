"""What the model needs from one compiled verify_attention kernel: the steady-state
path of its KV-tile loop, per-warp instruction counts, registers, spills and the
fixed per-CTA work outside the loop."""
from __future__ import annotations

import dataclasses
import re
import subprocess

import sass
import sim


@dataclasses.dataclass
class Kernel:
    name: str
    registers: int
    spill_instrs: int           # LDL/STL in the SASS
    spill_bytes: int            # ptxas: spill stores + loads (bytes), -1 when no log
    counts: dict                # per warp and KV tile, by class
    role_steps: list            # sim.Step per instruction of the steady path, per warp role (warp rows in turn)
    outside_stall_cycles: int   # sum of stall counts outside the loop (prologue + epilogue, one pass)
    port_bytes_per_warp: int    # shared-memory port bytes per warp and tile
    local_per_tile: int = 0     # LDL/STL per warp and tile (a stack frame or spills in the tile loop: not modelled)


def resource_usage(cubin: str, function: str = sass.KERNEL) -> int:
    out = subprocess.run([sass.find_tool("cuobjdump"), "-res-usage", cubin], check=True, capture_output=True, text=True).stdout
    m = re.search(r"Function " + function + r":\s*\n\s*REG:(\d+)", out)
    if not m:
        raise ValueError(f"{cubin}: no resource usage for {function}")
    return int(m.group(1))


def ptxas_spills(log_text: str, function: str = sass.KERNEL) -> int:
    """Spill bytes (stores + loads) of one entry (kdtree_verify_attention) in a ptxas -v log."""
    section = log_text.split(f"Function properties for {function}\n")
    if len(section) < 2:
        return -1
    m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", section[1])
    return int(m.group(1)) + int(m.group(2)) if m else -1


def analyse(cubin: str, copies_per_thread: int, log_text: str | None = None, roles: int = 1,
            function: str = sass.KERNEL) -> Kernel:
    """function: the entry (kdtree_verify_attention, or its _cluster twin). roles > 1: the kernel has one tile loop per warp row (the qsplit kernel's
    tile_loop<ROLE>); role 0's is the one where row 0 arrives on the barrier that
    row 1 waits on (BAR.ARV 0x4: BAR_TO_LATE in templates/verify_attention_qsplit.cu)."""
    instrs, labels = sass.parse_function(sass.disassemble(cubin), function)
    if roles > 1:
        loops = sass.main_loops(instrs, labels)
        if len(loops) != roles:
            raise ValueError(f"{cubin}: {len(loops)} tile loops, expected one per warp role ({roles})")
        first = [lp for lp in loops if any(i.base == "BAR" and i.op.startswith("BAR.ARV") and
                                          i.operands.replace(" ", "").startswith("0x4,") for i in instrs[lp[0]:lp[1]])]
        if len(first) != 1:
            raise ValueError(f"{cubin}: cannot tell warp row 0's tile loop (BAR.ARV 0x4)")
        loops = first + [lp for lp in loops if lp != first[0]]
    else:
        loops = [sass.main_loop(instrs, labels)]
    paths = [sass.steady_path(instrs, labels, head, back, copies_per_thread) for head, back in loops]
    if len({sum(sass.mma_flop(i) for i in p if sass.is_mma(i)) for p in paths}) != 1:
        raise ValueError(f"{cubin}: the warp roles' tile loops issue different MMA work")
    inside = set()
    for head, back in loops:
        inside.update(range(head, back + 1))
    path = paths[0]
    outside = sum(max(1, ins.stall) for k, ins in enumerate(instrs) if k not in inside)
    return Kernel(
        name=cubin.rsplit("/", 1)[-1].removesuffix(".cubin") + ("" if function == sass.KERNEL else " " + function),
        registers=resource_usage(cubin, function),
        spill_instrs=sass.spills(instrs),
        spill_bytes=ptxas_spills(log_text, function) if log_text is not None else -1,
        counts=sass.count(path),
        outside_stall_cycles=outside,
        port_bytes_per_warp=sum(sass.access_bytes(i) for i in path if i.pred != "@!PT"),
        local_per_tile=sum(1 for i in path if i.base in ("LDL", "STL")),
        role_steps=[sim.compile_path(p) for p in paths],
    )
