#!/usr/bin/env python3
"""Where a kernel's warps stall, instruction by instruction: a summary of Nsight Compute's source page.

    tools/stall_sources.py SOURCE.csv[.gz] [--top N] [--windows] [--min-share PCT]

SOURCE.csv is `ncu -i REPORT --page source --csv --print-source sass` of a report taken with the
SourceCounters section (`scripts/device_stalls.sh SHAPE KV_DTYPE SOURCE.csv.gz` takes and exports one).
It prints the warp-stall samples' share by reason, the N instructions with the most samples (index in the
function, share, instruction, the reasons that make up most of its samples) and, with --windows, the samples
of each run of instructions between two synchronisation or MMA instructions (MMA batches, warpgroup MMA
waits, CTA and named barriers, mbarrier waits, exit): in a warp-specialised kernel those runs are its
phases, and the instruction a run ends with names it.
"""
from __future__ import annotations

import argparse
import collections
import csv
import gzip
import io
import sys

SAMPLES = "Warp Stall Sampling (All Samples)"
# Instructions that end a window: where a phase of an MMA kernel waits or hands its work to the tensor pipe.
MARKERS = ("HGMMA", "HMMA", "QMMA", "WARPGROUP.DEPBAR", "BAR.SYNC", "BAR.ARV", "BAR.RED", "SYNCS.PHASECHK", "EXIT")


def load(path: str):
    """(header, rows) of the source page: the rows after the line that starts with "Address"."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", newline="") as f:
        return parse(f.read())


def parse(text: str):
    rows = list(csv.reader(io.StringIO(text)))
    for i, row in enumerate(rows):
        if row and row[0] == "Address":
            header = row
            body = [r for r in rows[i + 1:] if len(r) >= len(header) - 1 and r[0] != "Address"]
            if SAMPLES not in header:
                raise ValueError(f"no '{SAMPLES}' column: take the report with --section SourceCounters")
            return header, body
    raise ValueError("no 'Address' header line: is this `ncu --page source --csv --print-source sass` output?")


def _int(text: str) -> int:
    text = text.replace(",", "").strip()
    return int(float(text)) if text and text != "-" else 0


class Sources:
    def __init__(self, header, rows):
        self.header = header
        self.col = {h: i for i, h in enumerate(header)}
        self.reasons = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
        self.rows = rows
        self.samples = [_int(r[self.col[SAMPLES]]) for r in rows]
        self.total = sum(self.samples)

    def text(self, i: int) -> str:
        return self.rows[i][self.col["Source"]].strip()

    def reason_counts(self, i: int):
        return {h[len("stall_"):]: _int(self.rows[i][self.col[h]]) for h in self.reasons}

    def by_reason(self):
        """{reason: share of all samples}, largest first."""
        agg = collections.Counter()
        for i in range(len(self.rows)):
            agg.update(self.reason_counts(i))
        return {k: v / self.total for k, v in agg.most_common() if v} if self.total else {}

    def dominant(self, i: int, cover: float = 0.8):
        """The reasons that together make up `cover` of instruction i's samples, largest first."""
        counts = sorted(((v, k) for k, v in self.reason_counts(i).items() if v), reverse=True)
        out, got = [], 0
        for v, k in counts:
            if got >= cover * self.samples[i]:
                break
            out.append(k)
            got += v
        return out

    def top(self, n: int):
        """[(index, share, instruction, dominant reasons)] of the n instructions with the most samples."""
        order = sorted(range(len(self.rows)), key=lambda i: -self.samples[i])[:n]
        return [(i, self.samples[i] / max(self.total, 1), self.text(i), self.dominant(i)) for i in sorted(order)]

    def windows(self, min_share: float = 0.0):
        """[(first index, last index, share, the last instruction)] of the runs ending in a marker
        instruction (the last run may end without one), those with at least min_share of the samples."""
        out, start, acc = [], 0, 0
        for i in range(len(self.rows)):
            acc += self.samples[i]
            if any(m in self.text(i) for m in MARKERS) or i == len(self.rows) - 1:
                share = acc / max(self.total, 1)
                if share >= min_share:
                    out.append((start, i, share, self.text(i)))
                start, acc = i + 1, 0
        return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("source", help="ncu --page source --csv --print-source sass output (.csv or .csv.gz)")
    ap.add_argument("--top", type=int, default=30, help="instructions with the most samples to list (30)")
    ap.add_argument("--windows", action="store_true", help="also list the samples between markers")
    ap.add_argument("--min-share", type=float, default=0.4, help="windows below this %% of samples are left out")
    args = ap.parse_args(argv)
    try:
        s = Sources(*load(args.source))
    except (OSError, ValueError) as e:
        print(f"stall_sources: {args.source}: {e}", file=sys.stderr)
        return 2
    print(f"{s.total} samples over {len(s.rows)} instructions")
    print("by reason: " + ", ".join(f"{k} {v:.1%}" for k, v in s.by_reason().items() if v >= 0.005))
    print(f"\n{args.top} instructions with the most samples (index, share, instruction, main reasons):")
    for i, share, text, why in s.top(args.top):
        print(f"{i:6d} {share:6.1%}  {text[:72]:72s} {' '.join(why)}")
    if args.windows:
        print(f"\nsamples between markers (>= {args.min_share}%):")
        for a, b, share, text in s.windows(args.min_share / 100):
            print(f"{a:6d}-{b:<6d} {share:6.1%}  ending {text[:72]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
