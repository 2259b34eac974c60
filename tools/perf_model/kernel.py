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
    steps: list                 # sim.Step per instruction of the steady path (of warp role 0)
    outside_stall_cycles: int   # sum of stall counts outside the loop (prologue + epilogue, one pass)
    port_bytes_per_warp: int    # shared-memory port bytes per warp and tile
    role_steps: list = dataclasses.field(default_factory=list)  # steps per warp role (warp rows in turn)


def resource_usage(cubin: str) -> int:
    out = subprocess.run([sass.find_tool("cuobjdump"), "-res-usage", cubin], check=True, capture_output=True, text=True).stdout
    m = re.search(r"Function " + sass.KERNEL + r":\s*\n\s*REG:(\d+)", out)
    if not m:
        raise ValueError(f"{cubin}: no resource usage for {sass.KERNEL}")
    return int(m.group(1))


def ptxas_spills(log_text: str) -> int:
    """Spill bytes (stores + loads) of kdtree_verify_attention in a ptxas -v log."""
    section = log_text.split(f"Function properties for {sass.KERNEL}")
    if len(section) < 2:
        return -1
    m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", section[1])
    return int(m.group(1)) + int(m.group(2)) if m else -1


def analyse(cubin: str, copies_per_thread: int, log_text: str | None = None, roles: int = 1) -> Kernel:
    """roles > 1: warp row r runs the loop's role regions (sass.hmma_regions) in
    reverse order of rows, i.e. the last row the first region (the qsplit kernel:
    row 1 runs the PV at the top of the loop, row 0 the one at the bottom)."""
    instrs, labels = sass.parse_function(sass.disassemble(cubin))
    head, back = sass.main_loop(instrs, labels)
    if roles > 1:
        n = len(sass.hmma_regions(instrs, labels, head, back))
        if n != roles:
            raise ValueError(f"{cubin}: {n} warp-role HMMA regions in the loop, expected {roles}")
        paths = [sass.steady_path(instrs, labels, head, back, copies_per_thread, {roles - 1 - r}) for r in range(roles)]
        hmma = {sum(1 for i in p if i.base == "HMMA") for p in paths}
        if len(hmma) != 1:
            raise ValueError(f"{cubin}: the warp roles' paths issue different HMMA counts {sorted(hmma)}")
    else:
        paths = [sass.steady_path(instrs, labels, head, back, copies_per_thread)]
    path = paths[0]
    outside = sum(max(1, i.stall) for i in instrs[:head] + instrs[back + 1:])
    return Kernel(
        name=cubin.rsplit("/", 1)[-1].removesuffix(".cubin"),
        registers=resource_usage(cubin),
        spill_instrs=sass.spills(instrs),
        spill_bytes=ptxas_spills(log_text) if log_text is not None else -1,
        counts=sass.count(path),
        steps=sim.compile_path(path),
        outside_stall_cycles=outside,
        port_bytes_per_warp=sum(sass.access_bytes(i) for i in path if i.pred != "@!PT"),
        role_steps=[sim.compile_path(p) for p in paths],
    )
