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
    steps: list                 # sim.Step per instruction of the steady path
    outside_stall_cycles: int   # sum of stall counts outside the loop (prologue + epilogue, one pass)
    port_bytes_per_warp: int    # shared-memory port bytes per warp and tile


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


def analyse(cubin: str, copies_per_thread: int, log_text: str | None = None) -> Kernel:
    instrs, labels = sass.parse_function(sass.disassemble(cubin))
    head, back = sass.main_loop(instrs, labels)
    path = sass.steady_path(instrs, labels, head, back, copies_per_thread)
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
    )
