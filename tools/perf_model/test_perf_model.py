#!/usr/bin/env python3
"""Unit tests of the performance model's parts on hand-written SASS (no GPU, no
disassembler): control-bit decoding, the steady-state path of the KV-tile loop,
the simulator's limits and the measured-file reader."""
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import sass  # noqa: E402
import sim  # noqa: E402
from model import Model, occupancy  # noqa: E402
from perf_model import copies_per_thread, read_measured  # noqa: E402
from rates import rates_for  # noqa: E402


def ctrl(stall=1, yield_=0, wr=7, rd=7, wait=0):
    """The high 64-bit word of an instruction with these control bits."""
    c = stall | (yield_ << 4) | (wr << 5) | (rd << 8) | (wait << 11)
    return f"0x{c << 41:016x}"


def listing(lines):
    """nvdisasm -hex style text of kdtree_verify_attention from (label or (text, ctrl))."""
    out = [".text.kdtree_verify_attention:"]
    addr = 0
    for item in lines:
        if isinstance(item, str):
            out.append(f"{item}:")
            continue
        text, c = item
        out.append(f"        /*{addr:04x}*/                   {text} ;   /* 0x0000000000000000 */")
        out.append(f"                                                   /* {c} */")
        addr += 16
    return "\n".join(out) + "\n"


# A loop with a KV copy in one or two row passes (only two passes give the
# thread's 2 copies), an edge-only arithmetic block, a lane-predicated store and
# a dependent HMMA pair.
LOOP = [
    ("MOV R1, R2", ctrl()),
    ".L_x_1",
    ("DEPBAR.LE SB0, 0x1", ctrl()),
    ("BAR.SYNC.DEFER_BLOCKING 0x0", ctrl()),
    ("@P1 BRA `(.L_x_2)", ctrl()),
    ("LDGSTS.E.BYPASS.128 [R3], desc[UR6][R4.64], P0", ctrl()),
    ("BRA `(.L_x_3)", ctrl()),
    ".L_x_2",
    ("LDGSTS.E.BYPASS.128 [R3], desc[UR6][R4.64], P0", ctrl()),
    ("LDGSTS.E.BYPASS.128 [R3+0x80], desc[UR6][R4.64+0x80], P0", ctrl()),
    ".L_x_3",
    ("LDGDEPBAR", ctrl()),
    ("LDSM.16.M88.4 R8, [R5]", ctrl(wr=0)),
    ("HMMA.16816.F32.BF16 R12, R8, R10, R12", ctrl(stall=2, wait=1)),
    ("NOP", ctrl(stall=15)),
    ("HMMA.16816.F32.BF16 R12, R8, R10, R12", ctrl(stall=1)),
    ("@!P2 BRA `(.L_x_4)", ctrl()),
    ("FMUL R12, R12, R20", ctrl()),
    ("FMUL R13, R13, R20", ctrl()),
    ".L_x_4",
    ("@P3 BRA `(.L_x_5)", ctrl()),
    ("STS [R6], R12", ctrl()),
    ".L_x_5",
    ("@P0 BRA `(.L_x_1)", ctrl()),
    ("EXIT", ctrl()),
]


class SassTest(unittest.TestCase):
    def setUp(self):
        self.instrs, self.labels = sass.parse_function(listing(LOOP))

    def test_control_bits(self):
        ldsm = self.instrs[9]
        self.assertEqual(ldsm.op, "LDSM.16.M88.4")
        self.assertEqual(ldsm.wr_sb, 0)
        hmma = self.instrs[10]
        self.assertEqual((hmma.stall, hmma.wait, hmma.wr_sb), (2, 1, 7))
        self.assertEqual(self.instrs[11].stall, 15)

    def test_loop_and_steady_path(self):
        head, back = sass.main_loop(self.instrs, self.labels)
        self.assertEqual((head, back), (1, len(self.instrs) - 2))
        path = sass.steady_path(self.instrs, self.labels, head, back, copies_per_thread=2)
        counts = sass.count(path)
        # two row passes, the FMULs of the edge/rescale block skipped, the lane store run
        self.assertEqual(counts["LDGSTS"], 2)
        self.assertEqual(counts["HMMA"], 2)
        self.assertEqual(counts["STS"], 1)
        self.assertNotIn("FMUL", [i.base for i in path])
        one = sass.count(sass.steady_path(self.instrs, self.labels, head, back, copies_per_thread=1))
        self.assertEqual(one["LDGSTS"], 1)

    def test_many_copy_regions_take_the_path_with_the_threads_copies(self):
        # 14 optional copies, each behind its own branch: 16,384 ways through the tile, which
        # walks that reach a branch with the same copies share (a kernel's tile had 12 such regions).
        lines = [("MOV R1, R2", ctrl()), ".L_x_1"]
        for n in range(14):
            lines += [(f"@P1 BRA `(.L_x_{10 + n})", ctrl()),
                      ("LDGSTS.E.BYPASS.128 [R3], desc[UR6][R4.64], P0", ctrl()), f".L_x_{10 + n}"]
        lines += [("HMMA.16816.F32.BF16 R12, R8, R10, R12", ctrl()), ("@P0 BRA `(.L_x_1)", ctrl()), ("EXIT", ctrl())]
        instrs, labels = sass.parse_function(listing(lines))
        head, back = sass.main_loop(instrs, labels)
        for copies in (0, 5, 14):
            path = sass.steady_path(instrs, labels, head, back, copies_per_thread=copies)
            self.assertEqual(sass.count(path).get("LDGSTS", 0), copies)

    def test_spills_and_bytes(self):
        self.assertEqual(sass.spills(self.instrs), 0)
        spill = sass.parse_function(listing([("STL [R1], R2", ctrl()), ("LDL R2, [R1]", ctrl())]))[0]
        self.assertEqual(sass.spills(spill), 2)
        self.assertEqual(sass.access_bytes(self.instrs[9]), 512)  # ldmatrix.x4: four 8x8 bf16 matrices
        self.assertEqual(sass.access_bytes(self.instrs[4]), 512)  # cp.async: 32 lanes x 16 bytes


class SimTest(unittest.TestCase):
    def test_tensor_bound_loop_runs_at_the_tensor_rate(self):
        # Independent HMMAs only: one scheduler's pipe takes one per 4096 / (rate / 4) cycles.
        r = rates_for("sm_120")
        steps = [sim.Step(sim.HMMA, 1, 7, 7, 0) for _ in range(64)]
        res = sim.simulate(steps, warps_per_cta=4, ctas=1, rates=r)
        per_hmma = 4096 / (r["tensor_flop_per_clk_sm"] / 4)
        self.assertAlmostEqual(res.cycles_per_tile, 64 * per_hmma, delta=per_hmma * 2)
        self.assertGreater(res.tensor_busy, 0.95)

    def test_port_bound_loop_runs_at_128_bytes_per_clock(self):
        r = rates_for("sm_90")
        steps = [sim.Step(sim.MIO, 1, 7, 7, 0, port_bytes=512) for _ in range(32)]
        res = sim.simulate(steps, warps_per_cta=8, ctas=1, rates=r)
        self.assertAlmostEqual(res.cycles_per_tile, 8 * 32 * 4, delta=16)
        self.assertGreater(res.port_busy, 0.95)

    def test_stall_counts_bound_a_lone_warp(self):
        r = rates_for("sm_90")
        steps = [sim.Step(sim.ALU, 10, 7, 7, 0) for _ in range(10)]
        res = sim.simulate(steps, warps_per_cta=1, ctas=1, rates=r)
        self.assertAlmostEqual(res.cycles_per_tile, 100, delta=1)


class RolesAndBarriersTest(unittest.TestCase):
    """The qsplit kernel's structure: a tile loop per warp row inside a segment
    loop, id barriers handing tiles between the rows, named row barriers."""

    def test_tile_loops_are_the_innermost_hmma_loops_and_skip_out_of_line_jumps(self):
        text = listing([
            ".L_x_0",                                           # segment loop
            ("MOV R1, R2", ctrl()),
            ".L_x_1",
            ("HMMA.16816.F32.BF16 R12, R8, R10, R12", ctrl()),
            ("@P0 BRA `(.L_x_1)", ctrl()),                      # row 0's tile loop
            ".L_x_2",
            ("HMMA.16816.F32.BF16 R12, R8, R10, R12", ctrl()),
            ("BRA.U UP0, `(.L_x_2)", ctrl()),                   # row 1's: a uniform predicate
            ("@P1 BRA `(.L_x_0)", ctrl()),
            ("EXIT", ctrl()),
            ".L_x_9",
            ("BRA `(.L_x_2)", ctrl()),                          # back from a block after EXIT
        ])
        instrs, labels = sass.parse_function(text)
        self.assertEqual(sass.main_loops(instrs, labels), [(1, 2), (3, 4)])
        self.assertTrue(instrs[4].conditional)
        self.assertFalse(instrs[7].conditional)

    def test_loop_exit_branch_is_not_taken_in_a_steady_tile(self):
        text = listing([
            ".L_x_1",
            ("HMMA.16816.F32.BF16 R12, R8, R10, R12", ctrl()),
            ("@!P0 BRA `(.L_x_2)", ctrl()),
            ("BRA `(.L_x_1)", ctrl()),
            ".L_x_2",
            ("EXIT", ctrl()),
        ])
        instrs, labels = sass.parse_function(text)
        head, back = sass.main_loop(instrs, labels)
        self.assertEqual([i.base for i in sass.steady_path(instrs, labels, head, back, 0)], ["HMMA", "BRA", "BRA"])

    def test_hand_off_barriers_alternate_two_roles(self):
        # Row 0 waits on barrier 3 and arrives on 4 before its work; row 1 waits on 4,
        # works, then arrives on 3. The prologue's first arrival (row 1 on 3) starts
        # it; then the rows' work overlaps and a tile costs one row's work plus the
        # two hand-offs (barrier latency 20 each), not both rows' work.
        def bar(text):
            ins = sass.Instr(0, "", text.split()[0], text.split(None, 1)[1], 1, False, 7, 7, 0)
            return sim.compile_path([ins])[0]
        work = [sim.Step(sim.ALU, 10, 7, 7, 0) for _ in range(10)]
        row0 = [bar("BAR.SYNC.DEFER_BLOCKING 0x3, 0x100"), bar("BAR.ARV 0x4, 0x100")] + work
        row1 = [bar("BAR.SYNC.DEFER_BLOCKING 0x4, 0x100")] + work + [bar("BAR.ARV 0x3, 0x100")]
        self.assertEqual((row0[0].bar_id, row0[0].bar_warps, row0[0].bar_arrive), (3, 8, False))
        self.assertTrue(row0[1].bar_arrive)
        r = rates_for("sm_120")
        res = sim.simulate([row0, row1], warps_per_cta=8, ctas=1, rates=r)
        self.assertAlmostEqual(res.cycles_per_tile, 100 + 2 * r["barrier_latency"], delta=5)


class Fp8MmaTest(unittest.TestCase):
    """The fp8 opcodes as ptxas spells them (nvdisasm of small mma.sync kernels, CUDA 13):
    sm_120a block-scaled kind::mxf8f6f4, plain e4m3 on sm_120, the sm_90 emulation."""
    QMMA_SF = "QMMA.SF.16832.F32.E4M3.E4M3.E8 R4, R8, R2, R4, R13, R13, URZ"
    QMMA = "QMMA.16832.F32.E4M3.E4M3 R4, R8, R2, R4"

    def instrs(self, *texts):
        return sass.parse_function(listing([(t, ctrl()) for t in texts]))[0]

    def test_opcodes_flops_and_rates(self):
        sf, plain, bf16, f16, unpack, pack = self.instrs(
            self.QMMA_SF, self.QMMA, "HMMA.16816.F32.BF16 R12, R8, R10, R12", "HMMA.16816.F32 R12, R4, R2, RZ",
            "F2FP.F16.E4M3.UNPACK_B R2, R32.H1", "F2FP.SATFINITE.E4M3.F32.PACK_AB_MERGE_C R12, R12, R13, RZ")
        self.assertEqual([sass.mma_flop(i) for i in (sf, plain, bf16, f16)], [8192, 8192, 4096, 4096])
        self.assertEqual([sass.mma_rate(i) for i in (sf, plain, bf16, f16)], ["mxf8", "e4m3", "bf16", "bf16"])
        self.assertEqual([sass.classify(i) for i in (sf, plain, bf16, unpack, pack)],
                         ["QMMA.SF", "QMMA", "HMMA", "F2FP", "F2FP"])
        self.assertFalse(sass.is_mma(unpack))
        steps = sim.compile_path([sf, plain, unpack, pack])
        self.assertEqual([s.kind for s in steps[:2]], [sim.MMA, sim.MMA])
        self.assertEqual([s.pipe for s in steps[2:]], ["alu", "alu"])  # fixed latency, 2 cycles apart in the SASS

    def test_sm120_tensor_rates(self):
        # Independent MMAs of four warps, one per scheduler: the pipe takes one m16n8k32 per
        # 8192 / (rate / 4) cycles: block-scaled at twice the bf16 FLOP rate (16 cycles, as
        # one HMMA.16816), plain e4m3 at the bf16 FLOP rate (32 cycles).
        r = rates_for("sm_120")
        self.assertAlmostEqual(r["tensor_flop_per_clk_sm"], 1023, delta=1)
        self.assertAlmostEqual(r["tensor_flop_per_clk_sm_mxf8"], 2 * r["tensor_flop_per_clk_sm"])
        self.assertAlmostEqual(r["tensor_flop_per_clk_sm_e4m3"], r["tensor_flop_per_clk_sm"])
        for text, cycles in ((self.QMMA_SF, 16), (self.QMMA, 32), ("HMMA.16816.F32.BF16 R12, R8, R10, R12", 16)):
            steps = sim.compile_path(self.instrs(*[text] * 64))
            res = sim.simulate(steps, warps_per_cta=4, ctas=1, rates=r)
            self.assertAlmostEqual(res.cycles_per_tile, 64 * cycles, delta=cycles * 2, msg=text)
            self.assertGreater(res.tensor_busy, 0.95)

    def test_qmma_loop_is_the_main_loop(self):
        text = listing([
            ("MOV R1, R2", ctrl()),
            ".L_x_1",
            (self.QMMA_SF, ctrl()),
            ("@P0 BRA `(.L_x_1)", ctrl()),
            ("EXIT", ctrl()),
        ])
        instrs, labels = sass.parse_function(text)
        self.assertEqual(sass.main_loop(instrs, labels), (1, 2))


class CalibrationTest(unittest.TestCase):
    """The mechanisms fitted on the H200 rows (rates.CALIBRATION)."""

    def test_shared_memory_latency_grows_with_accesses_in_flight(self):
        # One warp, 8 independent LDS then one instruction waiting on all: under load the
        # last result comes back later than port time + the unloaded latency.
        def run(per_inflight):
            r = dict(rates_for("sm_90"), smem_latency_per_inflight=per_inflight)
            steps = [sim.Step(sim.MIO, 1, k % 6, 7, 0, port_bytes=128) for k in range(8)]
            steps.append(sim.Step(sim.ALU, 1, 7, 7, 63))
            return sim.simulate(steps, warps_per_cta=1, ctas=1, rates=r).cycles_per_tile
        self.assertAlmostEqual(run(0), 8 + 30 + 1, delta=2)
        self.assertGreater(run(4), run(0) + 4 * 4)

    def test_a_loop_larger_than_the_l0_instruction_cache_misses_every_line(self):
        def run(n_instr):
            r = rates_for("sm_90")
            steps = [sim.Step(sim.ALU, 1, 7, 7, 0, addr=16 * k) for k in range(n_instr)]
            return sim.simulate(steps, warps_per_cta=1, ctas=1, rates=r).cycles_per_tile, r
        fits, r = run(r_lines := rates_for("sm_90")["icache_l0_bytes"] // 16)
        self.assertAlmostEqual(fits, r_lines, delta=2)            # resident after the first pass
        big, r = run(2 * r_lines)
        lines = 2 * r_lines // 8
        self.assertAlmostEqual(big, 2 * r_lines + lines * r["icache_miss_cycles"], delta=lines)


class PlanTest(unittest.TestCase):
    PLAN = {"warps": 4, "smem": 66048, "max_smem_per_sm": 102400, "block_n": 64, "head_qk": 64, "head_v": 64}

    def test_occupancy_by_shared_memory_and_registers(self):
        class K:
            registers = 220
        r = rates_for("sm_120")
        self.assertEqual(occupancy(K, self.PLAN, r), 1)
        self.assertEqual(occupancy(K, dict(self.PLAN, smem=49664), r), 2)
        K.registers = 255  # 256 x 32 per warp: two warps per scheduler, two 4-warp CTAs
        self.assertEqual(occupancy(K, dict(self.PLAN, smem=10000), r), 2)

    def test_copies_per_thread(self):
        # gqa64, 64 tokens, 128 threads: 16 rows per pass, 4 passes, K and V one chunk each
        self.assertEqual(copies_per_thread(self.PLAN), 8)
        mla = {"warps": 8, "block_n": 64, "head_qk": 576, "head_v": 512}
        self.assertEqual(copies_per_thread(mla), 18)  # 2 passes x 9 chunks (the ncu count of v8)
        qsplit = {"warps": 8, "block_n": 16, "head_qk": 576, "head_v": 512}
        self.assertEqual(copies_per_thread(qsplit), 5)  # 16 lanes per row: 72 chunks in 5 rounds

    def test_stream_k_work_per_cta(self):
        from model import stream_k
        # 8 requests x 2 row tiles of 10 KV tiles on 6 CTAs: 160 units, 27 per CTA.
        plan = {"stream_ctas": 6, "kv_len": 160, "block_n": 16, "batch": 8, "kv_heads": 1, "active_x": 2}
        s = stream_k(plan)
        self.assertEqual((s["ctas"], s["chunk"]), (6, 27))
        self.assertEqual(s["segments"], 4)      # 27 units over items of 10: up to 4 items touched
        self.assertEqual(s["max_pieces"], 2)
        self.assertEqual(s["pieces"], 2 * 5)    # boundaries 27, 54, 81, 108, 135 each cut an item in two
        self.assertEqual(s["cut_items"], 5)
        self.assertIsNone(stream_k(dict(plan, stream_ctas=0)))

    def test_measured_table_and_json(self):
        with tempfile.TemporaryDirectory() as d:
            table = os.path.join(d, "t.txt")
            with open(table, "w") as f:
                f.write("verify_attention on sm_90: floor = ...\n"
                        "shape                          us   b2b_us graph_us\n"
                        "mla_b1_h16_n16_p4k           32.6     28.6     29.1\n")
            self.assertEqual(read_measured(table, "graph_us"), {"mla_b1_h16_n16_p4k": 29.1})
            js = os.path.join(d, "t.json")
            with open(js, "w") as f:
                f.write('{"shape":"gqa64_b4_g8_n64_p8k","us":213.1,"b2b_us":210.0,"graph_us":209.6}\n')
            self.assertEqual(read_measured(js, "us"), {"gqa64_b4_g8_n64_p8k": 213.1})
            with self.assertRaises(SystemExit):
                read_measured(table, "b2b")


class ClusterPlanTest(unittest.TestCase):
    """Uniform splits merged in a thread-block cluster (KDTREE_VERIFY_SCHEDULE=cluster)
    against the same splits through partials and the combine kernel."""

    PLAN = {"shape": "mla_b64_h8_n8_p4k", "batch": 64, "q_heads": 8, "kv_heads": 1, "nodes": 8, "kv_len": 4104,
            "head_qk": 576, "head_v": 512, "block_m": 64, "block_n": 32, "warps": 8, "stages": 4, "smem": 101248,
            "max_smem_per_sm": 102400, "splits": 2, "stream_ctas": 0, "split_tokens": 2080, "grid": [1, 64, 2],
            "active_x": 1, "kv_dtype": "e4m3"}

    def predict(self, plan):
        class K:
            name = "k"
            registers = 248
            outside_stall_cycles = 2000
            local_per_tile = plan.get("local_per_tile", 0)
        model = Model(rates_for("sm_120"))
        model.tile = lambda k, warps, ctas, active: sim.SmResult(2500.0, 0.87, 0.5, 0.3, 0.5, {})
        return model.predict(plan, K)

    def test_no_partials_and_no_combine(self):
        split = self.predict(dict(self.PLAN, cluster_splits=0))
        cluster = self.predict(dict(self.PLAN, cluster_splits=2))
        self.assertGreater(split.combine_us, 0.0)
        self.assertEqual(cluster.combine_us, 0.0)
        # Both read the KV at the DRAM rate; the cluster writes no partials (64 x 64 rows of
        # 1028 bytes per split) and launches no combine.
        self.assertEqual((split.binding, cluster.binding), ("DRAM", "DRAM"))
        partials_us = 2 * 64 * 64 * 1028 / rates_for("sm_120")["dram_bytes_per_s"] * 1e6
        self.assertAlmostEqual(split.main_us - cluster.main_us, partials_us, delta=0.01)
        self.assertLess(cluster.us, split.us - partials_us)

    def test_local_memory_in_the_tile_loop_is_not_modelled(self):
        p = self.predict(dict(self.PLAN, local_per_tile=65))
        self.assertFalse(p.modelled)
        self.assertIn("65 local-memory accesses", p.binding)
        self.assertTrue(self.predict(self.PLAN).modelled)


class ValidateTest(unittest.TestCase):
    """cmd_validate over stand-in predictions (no plan tool): a file whose rows match none of the predicted
    shapes fails instead of reporting a worst error of 0%."""

    def run_validate(self, text, kv_dtype, modelled=(True,)):
        import argparse
        import contextlib
        import io
        import types

        import perf_model
        shapes = ["mla_b1_h16_n16_p4k", "mla_b64_h8_n8_p4k"][:len(modelled)]
        rows = [({"shape": shape, "tiles": "kernel=qsplit"}, None,
                 types.SimpleNamespace(us=30.0, binding="tensor" if m else "NOT MODELLED: local memory", modelled=m))
                for shape, m in zip(shapes, modelled)]
        saved = perf_model.predictions, perf_model.print_counts
        perf_model.predictions = lambda args, arch, tiles: rows
        perf_model.print_counts = lambda rows: None
        try:
            with tempfile.TemporaryDirectory() as d:
                path = os.path.join(d, "m.txt")
                with open(path, "w") as f:
                    f.write(text)
                args = argparse.Namespace(measured=path, column="graph_us", kv_dtype=kv_dtype, arch="sm_90",
                                          tiles=None, max_error=20.0)
                with contextlib.redirect_stdout(io.StringIO()):
                    return perf_model.cmd_validate(args)
        finally:
            perf_model.predictions, perf_model.print_counts = saved

    def test_rows_of_the_other_kv_dtype_validate_nothing_and_fail(self):
        e4m3_rows = "shape graph_us\nmla_b1_h16_n16_p4k,e4m3 31.0\n"
        self.assertEqual(self.run_validate(e4m3_rows, "e4m3"), 0)
        self.assertEqual(self.run_validate(e4m3_rows, None), 1)
        self.assertEqual(self.run_validate("shape graph_us\nmla_b1_h16_n16_p4k 31.0\n", "e4m3"), 1)

    def test_an_error_over_the_limit_fails(self):
        self.assertEqual(self.run_validate("shape graph_us\nmla_b1_h16_n16_p4k 20.0\n", None), 1)  # +50%
        self.assertEqual(self.run_validate("shape graph_us\nmla_b1_h16_n16_p4k 29.0\n", None), 0)

    def test_rows_not_modelled_are_shown_but_not_in_the_worst_error(self):
        both = "shape graph_us\nmla_b1_h16_n16_p4k 29.0\nmla_b64_h8_n8_p4k 210.0\n"  # the second 7x off
        self.assertEqual(self.run_validate(both, None, modelled=(True, False)), 0)
        self.assertEqual(self.run_validate(both, None, modelled=(True, True)), 1)
        self.assertEqual(self.run_validate(both, None, modelled=(False, False)), 1)  # nothing validated


if __name__ == "__main__":
    unittest.main(verbosity=1)
