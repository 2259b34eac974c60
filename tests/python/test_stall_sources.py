"""tools/stall_sources.py (the per-instruction stall summary of an Nsight Compute source page) on a small
page written here in ncu's CSV layout: shares by reason, the top instructions, the windows between markers."""
import gzip
import importlib.util
import pathlib

import pytest

_spec = importlib.util.spec_from_file_location(
    "stall_sources", pathlib.Path(__file__).resolve().parents[2] / "tools" / "stall_sources.py")
ss = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ss)

HEADER = ["Address", "Source", ss.SAMPLES, "Warp Stall Sampling (Not-issued Samples)", "stall_barrier",
          "stall_wait", "stall_mio", "stall_barrier (Not Issued)"]
# (instruction, samples, barrier, wait, mio)
LINES = [("LDC R1, c[0x0][0x28]", 2, 0, 2, 0),
         ("HGMMA.64x64x16.F32.BF16 R152, gdesc[UR20], R152", 10, 0, 4, 6),
         ("WARPGROUP.DEPBAR.LE gsb0, 0x0", 40, 40, 0, 0),
         ("MUFU.EX2 R2, R2", 8, 0, 8, 0),
         ("FMUL R3, R2, R2", 0, 0, 0, 0),
         ("BAR.SYNC.DEFER_BLOCKING 0x0", 30, 30, 0, 0),
         ("STS [R4], R3", 10, 0, 0, 10)]


def page(lines=LINES):
    out = ['"Kernel Name","kdtree_verify_attention",', ",".join(f'"{h}"' for h in HEADER)]
    for i, (text, n, bar, wait, mio) in enumerate(lines):
        out.append(",".join(f'"{v}"' for v in (hex(0x1000 + 16 * i), "      " + text, n, n, bar, wait, mio, bar)))
    return "\n".join(out) + "\n"


def test_shares_top_and_windows(tmp_path):
    path = tmp_path / "src.csv.gz"
    with gzip.open(path, "wt") as f:
        f.write(page())
    s = ss.Sources(*ss.load(str(path)))
    assert s.total == 100 and len(s.rows) == len(LINES)
    assert s.by_reason() == pytest.approx({"barrier": 0.70, "mio": 0.16, "wait": 0.14})
    assert list(s.by_reason())[0] == "barrier"  # largest first
    top = s.top(2)
    assert [(i, share, why) for i, share, _, why in top] == [(2, 0.40, ["barrier"]), (5, 0.30, ["barrier"])]
    assert s.dominant(1) == ["mio", "wait"]  # 6 of 10 is not yet 80%
    # runs end at the MMA, the warpgroup wait and the barrier; the last run ends the function
    assert [(a, b) for a, b, _, _ in s.windows()] == [(0, 1), (2, 2), (3, 5), (6, 6)]
    assert [round(w, 2) for _, _, w, _ in s.windows()] == [0.12, 0.40, 0.38, 0.10]
    assert [(a, b) for a, b, _, _ in s.windows(0.2)] == [(2, 2), (3, 5)]


def test_main_prints_and_bad_input_is_named(tmp_path, capsys):
    path = tmp_path / "src.csv"
    path.write_text(page())
    assert ss.main([str(path), "--top", "3", "--windows", "--min-share", "1"]) == 0
    out = capsys.readouterr().out
    assert "100 samples over 7 instructions" in out and "barrier 70.0%" in out and "ending BAR.SYNC" in out
    bad = tmp_path / "bad.csv"
    bad.write_text('"Kernel Name","k",\n"Address","Source"\n"0x0","NOP"\n')
    assert ss.main([str(bad)]) == 2
    assert "SourceCounters" in capsys.readouterr().err
    (tmp_path / "none.csv").write_text("a,b\n")
    assert ss.main([str(tmp_path / "none.csv")]) == 2
    assert "no 'Address' header" in capsys.readouterr().err
