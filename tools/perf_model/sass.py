"""SASS of a cubin: disassembly (nvdisasm from the nvidia-cuda-nvdisasm wheel),
instructions with their scheduling control bits, and the steady-state path of one
iteration of the KV-tile loop of kdtree_verify_attention.

The control bits (the top 23 bits of each 128-bit sm_80+ instruction) are what
ptxas decided about latency: the stall count (cycles before the warp's next
instruction may issue: how fixed-latency results such as HMMA accumulators are
waited for), the yield hint, the scoreboard a variable-latency instruction sets
on write (LDSM, LDS, LDG, MUFU, SHFL, ...) or on operand read (stores), and the
scoreboards an instruction waits for. The model replays them, so the latencies
of sm_120 come from the sm_120 compiler, not from a guess.
"""
from __future__ import annotations

import dataclasses
import glob
import os
import re
import shutil
import subprocess
import sysconfig

KERNEL = "kdtree_verify_attention"


def find_tool(name: str) -> str:
    """nvdisasm / cuobjdump: $PATH, else the PyPI wheel's bin directory."""
    found = shutil.which(name)
    if found:
        return found
    for base in {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}:
        for path in sorted(glob.glob(os.path.join(base, "nvidia", "*", "bin", name))):
            if os.access(path, os.X_OK):
                return path
    raise SystemExit(f"perf_model: {name} not found: pip install nvidia-cuda-nvdisasm nvidia-cuda-cuobjdump")


@dataclasses.dataclass
class Instr:
    addr: int
    pred: str           # "@P0", "@!PT", "" ...
    op: str             # full opcode with modifiers, e.g. "LDSM.16.M88.4"
    operands: str
    stall: int          # cycles before the warp's next instruction may issue
    yield_: bool
    wr_sb: int          # scoreboard set at write-back (7 = none)
    rd_sb: int          # scoreboard set until operands are read (7 = none)
    wait: int           # mask of scoreboards waited for before issue
    target: str = ""    # branch target label

    @property
    def base(self) -> str:
        return self.op.split(".")[0]

    @property
    def conditional(self) -> bool:
        """A predicated instruction, or a BRA.U on a uniform predicate operand (UP0, !UP1)."""
        return self.pred not in ("", "@PT") or re.match(r"\s*!?UP[0-6]\s*,", self.operands) is not None


_LINE = re.compile(r"^\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;?\s*/\* 0x([0-9a-f]{16}) \*/\s*$")
_HI = re.compile(r"^\s+/\* 0x([0-9a-f]{16}) \*/\s*$")
_LABEL = re.compile(r"^(\.L_x_\d+):")
_TARGET = re.compile(r"`\((\.L_x_\d+)\)")


def disassemble(cubin_path: str) -> str:
    out = subprocess.run([find_tool("nvdisasm"), "-hex", "-c", cubin_path], check=True, capture_output=True, text=True)
    return out.stdout


def parse_function(text: str, name: str = KERNEL) -> tuple[list[Instr], dict[str, int]]:
    """Instructions of one function and its labels (label -> instruction index)."""
    lines = text.split("\n")
    start = None
    for i, line in enumerate(lines):
        if line.startswith(f".text.{name}:"):
            start = i
            break
    if start is None:
        raise ValueError(f"function {name} not found in the disassembly")
    instrs: list[Instr] = []
    labels: dict[str, int] = {}
    i = start + 1
    while i < len(lines):
        line = lines[i]
        if line.startswith(".text.") or line.startswith("\t.section"):
            break
        m = _LABEL.match(line)
        if m:
            labels[m.group(1)] = len(instrs)
        m = _LINE.match(line)
        if m and i + 1 < len(lines) and _HI.match(lines[i + 1]):
            ctrl = int(_HI.match(lines[i + 1]).group(1), 16) >> 41
            body = m.group(2)
            pred = ""
            if body.startswith("@"):
                pred, body = body.split(None, 1)
            parts = body.split(None, 1)
            op, operands = parts[0], parts[1] if len(parts) > 1 else ""
            t = _TARGET.search(operands)
            instrs.append(Instr(int(m.group(1), 16), pred, op, operands, ctrl & 15, bool((ctrl >> 4) & 1),
                                (ctrl >> 5) & 7, (ctrl >> 8) & 7, (ctrl >> 11) & 63, t.group(1) if t else ""))
            i += 2
            continue
        i += 1
    return instrs, labels


# Tensor-core MMA opcodes of mma.sync (ptxas's spellings, checked with nvdisasm on small kernels):
#   HMMA.16816.F32.BF16 / HMMA.16816.F32       bf16 / f16 m16n8k16 (sm_80+); sm_90 also runs e4m3 mma.sync
#                                              as F2FP.F16.E4M3.UNPACK_B conversions + two HMMA.16816.F32
#   QMMA.16832.F32.E4M3.E4M3                   e4m3 m16n8k32 (sm_89, plain sm_120: the bf16 rate per FLOP)
#   QMMA.SF.16832.F32.E4M3.E4M3.E8             block-scaled kind::mxf8f6f4 m16n8k32, ue8m0 scales (sm_120a:
#                                              twice the bf16 rate per FLOP)
MMA_OPS = ("HMMA", "QMMA")
_MMA_SHAPE = re.compile(r"\.16(8)(\d+)(?:\.|$)")


def is_mma(ins: Instr) -> bool:
    return ins.base in MMA_OPS


def mma_flop(ins: Instr) -> int:
    """FLOP of one warp-wide MMA: 2 * M * N * K from the shape in the opcode
    (16816: m16n8k16, 4096; 16832: m16n8k32, 8192; 1688: m16n8k8, 2048)."""
    m = _MMA_SHAPE.search(ins.op[len(ins.base):])
    return 2 * 16 * 8 * int(m.group(2)) if m else 4096


def mma_rate(ins: Instr) -> str:
    """Which tensor rate an MMA runs at: "mxf8" (block-scaled fp8, QMMA.SF), "e4m3"
    (plain fp8 QMMA) or "bf16" (HMMA: bf16 and f16)."""
    if ins.base == "QMMA":
        return "mxf8" if ins.op.startswith("QMMA.SF") else "e4m3"
    return "bf16"


def spills(instrs: list[Instr]) -> int:
    """Local-memory accesses (register spills: LDL/STL) anywhere in the function."""
    return sum(1 for ins in instrs if ins.base in ("LDL", "STL"))


def _mma_loops(instrs: list[Instr], labels: dict[str, int]) -> list[tuple[int, int]]:
    """(head, back-edge) of every loop whose body holds an MMA (HMMA, QMMA). A backward branch whose
    span holds an EXIT is not a loop: it is the jump back from a block placed after
    the function's end (e.g. a divergent vote's slow path)."""
    found = []
    for i, ins in enumerate(instrs):
        if ins.base == "BRA" and ins.target in labels and labels[ins.target] <= i:
            head = labels[ins.target]
            body = instrs[head:i]
            if any(is_mma(x) for x in body) and not any(x.base == "EXIT" for x in body):
                found.append((head, i))
    return found


def main_loops(instrs: list[Instr], labels: dict[str, int]) -> list[tuple[int, int]]:
    """The tile loops of a kernel that instantiates one per warp row (the qsplit
    kernel's tile_loop<ROLE>, inside its loop over stream-K segments): the
    innermost loops with MMAs, in program order."""
    found = _mma_loops(instrs, labels)
    return sorted(lp for lp in found if not any(o != lp and lp[0] <= o[0] and o[1] <= lp[1] for o in found))


def main_loop(instrs: list[Instr], labels: dict[str, int]) -> tuple[int, int]:
    """(head, back-edge) of the KV-tile loop of a kernel with one: the outermost
    loop whose body holds MMA instructions."""
    found = _mma_loops(instrs, labels)
    if not found:
        raise ValueError("no loop with HMMA/QMMA instructions (is this kdtree_verify_attention?)")
    return max(found, key=lambda lp: lp[1] - lp[0])


_MEMORY = ("LDS", "STS", "LDSM", "SHFL", "LDG", "STG", "LDGSTS", "BAR", "ATOMS", "ATOMG", "RED")


def steady_path(instrs: list[Instr], labels: dict[str, int], head: int, back: int,
                copies_per_thread: int) -> list[Instr]:
    """The instructions one warp issues in a steady-state KV tile, in order.

    Forward branches whose regions hold the KV copy (LDGSTS) are followed both
    ways and the path with this thread's share of the tile's copies
    (copies_per_thread 16-byte cp.async) is kept: the next tile is loaded, in as
    many row passes as the tile needs. Of the other forward conditional branches,
    a region of arithmetic only is skipped (the tree-mask code of edge tiles and
    the O rescale, skipped once the lazy reference max settles) and a region with
    memory instructions is run (lane-predicated exchanges such as the row-max
    stores: some lane of every warp runs them). An inner loop (a backward branch
    inside the body) runs as often as the copies need.
    """
    inner: dict[int, int] = {}  # back-edge index -> iterations
    for i in range(head, back):
        ins = instrs[i]
        if ins.base == "BRA" and ins.target in labels and head < labels[ins.target] <= i:
            inner[i] = 0
    if inner:
        def copies(a: int, b: int) -> int:
            return sum(1 for x in instrs[a:b] if x.base == "LDGSTS")
        outside = copies(head, back) - sum(copies(labels[instrs[b].target], b + 1) for b in inner)
        for b in inner:
            body = copies(labels[instrs[b].target], b + 1)
            inner[b] = max(1, -(-(copies_per_thread - max(outside, 0)) // body)) if body else 1

    paths: list[list[Instr]] = []
    # Both ways of every copy region multiply the paths (a kernel with 12 such regions
    # in its tile has thousands), but two walks that reach the same branch with the same
    # copies and inner-loop counts go on alike: only the shorter one is followed.
    shortest: dict[tuple, int] = {}

    def walk(i: int, path: list[Instr], taken: dict[int, int]) -> None:
        while i <= back:
            if len(path) > 100000 or len(paths) > 4096:
                raise ValueError("steady path does not terminate")
            ins = instrs[i]
            path.append(ins)
            if i == back:
                paths.append(path)
                return
            if ins.op.startswith("BRA.DIV"):  # taken only by a diverged warp (a vote's slow path)
                i += 1
                continue
            if ins.base == "BRA" and ins.target in labels:
                dest = labels[ins.target]
                conditional = ins.conditional
                if conditional and dest > back:  # the loop's exit: not taken in a steady tile
                    i += 1
                    continue
                if dest <= i:  # inner loop back-edge
                    taken[i] = taken.get(i, 0) + 1
                    if taken[i] < inner.get(i, 1):
                        i = dest
                        continue
                    taken[i] = 0
                    i += 1
                    continue
                if not conditional:
                    i = dest
                    continue
                region = instrs[i + 1:dest]
                if any(x.base == "LDGSTS" for x in region):
                    state = (i, sum(1 for x in path if x.base == "LDGSTS"), tuple(sorted(taken.items())))
                    if shortest.get(state, len(path) + 1) <= len(path):
                        return
                    shortest[state] = len(path)
                    walk(dest, list(path), dict(taken))
                    i += 1
                elif any(x.base in _MEMORY for x in region):
                    i += 1
                else:
                    i = dest
                continue
            i += 1

    walk(head, [], {})
    if not paths:
        raise ValueError("no path through the loop body")
    return min(paths, key=lambda p: (abs(sum(1 for x in p if x.base == "LDGSTS") - copies_per_thread), len(p)))


def classify(ins: Instr) -> str:
    """The instruction class the report counts."""
    b = ins.base
    if b == "HMMA":
        return "HMMA"
    if b == "QMMA":
        return "QMMA.SF" if ins.op.startswith("QMMA.SF") else "QMMA"
    if b in ("F2FP", "PRMT"):
        return b  # fp8 kernels: packs / unpacks and byte permutes
    if b == "LDSM":
        width = ins.op.rsplit(".", 1)[-1]
        return f"LDSM.{'T.' if '.MT88' in ins.op else ''}{width}"
    if b == "LDGSTS":
        return "LDGSTS"
    if b in ("LDS", "STS"):
        return b
    if b == "SHFL":
        return "SHFL"
    if b in ("BAR", "DEPBAR", "LDGDEPBAR"):
        return b
    if b in ("LDG", "STG", "LDL", "STL"):
        return b
    if b == "MUFU":
        return "MUFU"
    return "other"


def count(path: list[Instr]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for ins in path:
        k = classify(ins)
        counts[k] = counts.get(k, 0) + 1
    counts["total"] = len(path)
    return counts


def access_bytes(ins: Instr) -> int:
    """Bytes a warp-wide shared-memory access moves through the port (all lanes)."""
    b = ins.base
    if b == "LDSM":
        n = {"1": 1, "2": 2, "4": 4}.get(ins.op.rsplit(".", 1)[-1], 4)
        return 128 * n  # n 8x8 matrices of 16-bit values
    if b == "LDGSTS":
        m = re.search(r"\.(32|64|128)\b", ins.op)
        return 32 * (int(m.group(1)) // 8 if m else 16)
    if b in ("LDS", "STS"):
        m = re.search(r"\.(U8|S8|U16|S16|32|64|128)\b", ins.op)
        width = {"U8": 1, "S8": 1, "U16": 2, "S16": 2, "32": 4, "64": 8, "128": 16}.get(m.group(1) if m else "32", 4)
        return 32 * width
    if b == "SHFL":
        return 128
    return 0
