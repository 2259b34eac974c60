"""Per-arch rates of the model, set once from first principles and public or
measured figures (sources beside each number), and four parameters fitted on the
H200 validation rows (CALIBRATION below, applied to every arch).

Latencies in cycles of the SM clock. Result latencies of fixed-latency
instructions (HMMA accumulators, ALU) are not here: they come from the
compiler's stall counts in the SASS.
"""

# Fitted once on the nineteen H200 rows of docs/PERFORMANCE.md ("H200 validation";
# the measurements are in tools/perf_model/measured/h200_*.txt), each a mechanism the
# model lacked, with one value for every kernel and shape; microarchitectural, so
# applied to sm_120 and sm_80 as well (not measured there).
CALIBRATION = {
    # Shared-memory latency under load: each access (LDSM, LDS, STS, SHFL) of the same
    # SM partition still in flight adds this to the next one's latency (queueing in the
    # partition's MIO path and result write-back beyond the port's 128 B/clk). With 4 to
    # 8 ldmatrix in flight per partition the loaded latency is ~45-60 cycles, not 30 (ncu:
    # short-scoreboard stalls above the unloaded model's).
    "smem_latency_per_inflight": 4,
    # BAR.SYNC: cycles from the last arrival to the release of the waiting warps (the
    # unfitted model had 20; ncu showed barrier stalls above its).
    "barrier_latency": 40,
    # Instruction fetch: a loop's executed code larger than the scheduler's L0
    # instruction cache misses on every 128-byte line at every pass (LRU). 16 KB per
    # partition is the size microbenchmarks report for Turing's L0, and the H200 rows
    # agree: the three kernels whose tile loops execute 18.5-20.6 KB of lines (gqa64 with
    # both tile sets, gqa256 with sm_90's) ran 15-20% slower than the model without it,
    # those at 10-15.6 KB within ~3%. The miss cost is the fitted value.
    "icache_l0_bytes": 16384,
    "icache_miss_cycles": 7,
    # Per kernel launch: launch, CTA ramp-up and tail (a CUDA-graph replay of the main
    # kernel and the split combine); the unfitted model had 2.0. ncu (caches flushed)
    # put the small shapes' main kernel ~5 us and the combine ~5 us above the unfitted model.
    "launch_us": 3.5,
    # The split combine by programmatic dependent launch (sm_90 and sm_120; the runtime's
    # default there): its CTAs are placed while the main kernel's last CTAs run, so part
    # of its launch is hidden. Measured, not fitted: the H200's A/B (KDTREE_PDL=0 against
    # 1, MLA split shapes, both cache dtypes, uniform splits and stream-K) gained a median
    # 0.5 us a call in CUDA-graph replay (what the model predicts; -1.7 ... +1.2) and 1.1
    # (0.8-2.4) launched back to back, where the graph's own launch savings are absent.
    "pdl_combine_saving_us": 0.5,
    # Thread-block clusters (splits merged in a cluster). Measured on the H200 with
    # bench/dsmem/dsmem_rates.cu (scripts/device_cluster.sh dsmem; clusters of two on
    # every SM, cluster_merge's 16-byte loads): a dependent remote shared-memory load
    # 201 cycles, 15.9 B/clk an SM read from the peer, a cluster barrier (all threads of
    # both CTAs) 353 cycles; public Hopper microbenchmarks had put them at ~180 cycles,
    # ~14 B/clk and a round trip. Not measured on an sm_120: applied to it as they are
    # (the bytes-bound cluster plan stays DRAM-bound at 2.6 GHz even at 8x these costs).
    "dsmem_latency": 200,
    "dsmem_bytes_per_clk_sm": 16,
    "cluster_barrier_cycles": 350,
}

RATES = {
    # H200 SXM (the lent GPU): 132 SMs. ptxas's sm_90 SASS issues one warp's independent
    # HMMA.16816 6 cycles apart: 4096 / 6 FLOP/clk per scheduler = 2731 per SM (2/3 of
    # wgmma's 4096, as mma.sync's measured 647 TFLOP/s is 2/3 of the 989 spec). The
    # pure-issue microbenchmark's 647 TFLOP/s (issue 4) at that rate means the SMs ran at
    # 1.795 GHz under tensor load (the 1.98 GHz maximum boost is not sustained).
    # Device-to-device copy 4.27 TB/s.
    "sm_90": {
        "num_sms": 132,
        "clock_hz": 647e12 / (132 * 4 * 4096 / 6),
        "tensor_flop_per_clk_sm": 4 * 4096 / 6,
        "smem_bytes_per_clk_sm": 128,
        "dram_bytes_per_s": 4.27e12,
        "l2_bytes_per_s": 7e12,           # not measured here: public H100 microbenchmarks ~5.5 TB/s at a lower clock
        "smem_latency": 30,               # ldmatrix / LDS result after the port (Hopper microbenchmarks: 29-33)
        "l1_latency": 40,                 # LDG hitting L1 (page table, tree mask)
        "mem_latency": 1000,              # cp.async from L2/HBM to shared memory, issue to commit complete
        "mufu_latency": 18,
        "pipe_cycles": {"fma": 1, "imad": 2, "alu": 2, "xu": 8},  # cycles per warp instruction and scheduler
        "mio_queue_cycles": 32,           # port backlog at which the MIO queue stops accepting (not published)
        "max_warps_sm": 64,
        "max_ctas_sm": 32,
        "regs_sm": 65536,
        "smem_reserved_cta": 1024,
        "programmatic_launch": True,
    },
    # RTX PRO 6000 Blackwell (the target, sm_120): 188 SMs at ~2.6 GHz, 500 TFLOP/s dense
    # bf16 with fp32 accumulation by specification = 1023 FLOP/clk/SM (the sm_120 SASS
    # agrees: ptxas spaces one warp's independent HMMA.16816 ~16 cycles apart, 4096 /
    # 16 FLOP/clk per scheduler); 1.79 TB/s GDDR7; 128 MB L2; 100 KB shared memory per SM.
    # fp8 with fp32 accumulation: the block-scaled kind::mxf8f6f4 mma.sync (sm_120a SASS:
    # QMMA.SF.16832.F32.E4M3.E4M3.E8) at twice the bf16 rate; plain e4m3 mma.sync
    # (QMMA.16832.F32.E4M3.E4M3) at the bf16 rate per FLOP (public sm_120 microbenchmarks:
    # ~370 TFLOP/s on an RTX 5090, as bf16). ptxas spaces independent QMMA and QMMA.SF
    # 16 cycles apart, as HMMA: the pipe, not the issue, sets the plain QMMA's rate.
    "sm_120": {
        "num_sms": 188,
        "clock_hz": 2.6e9,
        "tensor_flop_per_clk_sm": 500e12 / (188 * 2.6e9),
        "tensor_flop_per_clk_sm_e4m3": 500e12 / (188 * 2.6e9),
        "tensor_flop_per_clk_sm_mxf8": 2 * 500e12 / (188 * 2.6e9),
        "smem_bytes_per_clk_sm": 128,
        "dram_bytes_per_s": 1.79e12,
        "l2_bytes_per_s": 5e12,           # not published: the RTX 4090's measured ~5 TB/s (the largest uncertainty here)
        "smem_latency": 30,
        "l1_latency": 40,
        "mem_latency": 1300,              # GDDR7 at a higher clock: more cycles than HBM3e
        "mufu_latency": 18,
        "pipe_cycles": {"fma": 1, "imad": 2, "alu": 2, "xu": 8},
        "mio_queue_cycles": 32,           # port backlog at which the MIO queue stops accepting (not published)
        "max_warps_sm": 48,
        "max_ctas_sm": 32,
        "regs_sm": 65536,
        "smem_reserved_cta": 1024,
        "programmatic_launch": True,
    },
    # A100 SXM 80 GB (sm_80): 108 SMs at 1.41 GHz, 312 TFLOP/s dense bf16 = 2048 FLOP/clk/SM
    # (mma.sync is the native tensor path there), 2.04 TB/s HBM2e, 164 KB shared memory per SM.
    "sm_80": {
        "num_sms": 108,
        "clock_hz": 1.41e9,
        "tensor_flop_per_clk_sm": 2048,
        "smem_bytes_per_clk_sm": 128,
        "dram_bytes_per_s": 2.04e12,
        "l2_bytes_per_s": 4e12,           # public A100 microbenchmarks: ~4 TB/s
        "smem_latency": 30,
        "l1_latency": 40,
        "mem_latency": 800,
        "mufu_latency": 18,
        "pipe_cycles": {"fma": 2, "imad": 2, "alu": 2, "xu": 8},  # 64 FP32 lanes per SM on sm_80
        "mio_queue_cycles": 32,           # port backlog at which the MIO queue stops accepting (not published)
        "max_warps_sm": 64,
        "max_ctas_sm": 32,
        "regs_sm": 65536,
        "smem_reserved_cta": 1024,
        "programmatic_launch": False,  # sm_80: the combine launches after the main kernel
    },
}


def rates_for(arch: str) -> dict:
    if arch not in RATES:
        raise SystemExit(f"perf_model: no rates for {arch} (known: {', '.join(sorted(RATES))})")
    r = dict(RATES[arch])
    r.update(CALIBRATION)
    r["arch"] = arch
    return r
