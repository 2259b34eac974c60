"""Per-arch rates of the model, set once from first principles and public or
measured figures (sources beside each number); nothing here is fitted to the
verify_attention measurements.

Latencies in cycles of the SM clock. Result latencies of fixed-latency
instructions (HMMA accumulators, ALU) are not here: they come from the
compiler's stall counts in the SASS.
"""

RATES = {
    # H200 SXM (the lent GPU): 132 SMs; 1.98 GHz under this load (docs/PERFORMANCE.md);
    # mma.sync bf16 with fp32 accumulation measured at 647 TFLOP/s by a pure-issue
    # microbenchmark (issue 4) = 2476 FLOP/clk/SM; device-to-device copy 4.27 TB/s.
    "sm_90": {
        "num_sms": 132,
        "clock_hz": 1.98e9,
        "tensor_flop_per_clk_sm": 647e12 / (132 * 1.98e9),
        "smem_bytes_per_clk_sm": 128,
        "dram_bytes_per_s": 4.27e12,
        "l2_bytes_per_s": 7e12,           # not measured here: public H100 microbenchmarks ~5.5 TB/s at a lower clock
        "smem_latency": 30,               # ldmatrix / LDS result after the port (Hopper microbenchmarks: 29-33)
        "l1_latency": 40,                 # LDG hitting L1 (page table, tree mask)
        "mem_latency": 1000,              # cp.async from L2/HBM to shared memory, issue to commit complete
        "mufu_latency": 18,
        "pipe_cycles": {"fma": 1, "imad": 2, "alu": 2, "xu": 8},  # cycles per warp instruction and scheduler
        "barrier_latency": 20,
        "mio_queue_cycles": 32,           # port backlog at which the MIO queue stops accepting (not published)
        "launch_us": 2.0,                 # kernel launch and drain per launch, back to back
        "max_warps_sm": 64,
        "max_ctas_sm": 32,
        "regs_sm": 65536,
        "smem_reserved_cta": 1024,
    },
    # RTX PRO 6000 Blackwell (the target, sm_120): 188 SMs at ~2.6 GHz, 500 TFLOP/s dense
    # bf16 with fp32 accumulation by specification = 1023 FLOP/clk/SM (the sm_120 SASS
    # agrees: ptxas spaces one warp's independent HMMA.16816 ~16 cycles apart, 4096 /
    # 16 FLOP/clk per scheduler); 1.79 TB/s GDDR7; 128 MB L2; 100 KB shared memory per SM.
    "sm_120": {
        "num_sms": 188,
        "clock_hz": 2.6e9,
        "tensor_flop_per_clk_sm": 500e12 / (188 * 2.6e9),
        "smem_bytes_per_clk_sm": 128,
        "dram_bytes_per_s": 1.79e12,
        "l2_bytes_per_s": 5e12,           # not published: the RTX 4090's measured ~5 TB/s (the largest uncertainty here)
        "smem_latency": 30,
        "l1_latency": 40,
        "mem_latency": 1300,              # GDDR7 at a higher clock: more cycles than HBM3e
        "mufu_latency": 18,
        "pipe_cycles": {"fma": 1, "imad": 2, "alu": 2, "xu": 8},
        "barrier_latency": 20,
        "mio_queue_cycles": 32,           # port backlog at which the MIO queue stops accepting (not published)
        "launch_us": 2.0,
        "max_warps_sm": 48,
        "max_ctas_sm": 32,
        "regs_sm": 65536,
        "smem_reserved_cta": 1024,
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
        "barrier_latency": 20,
        "mio_queue_cycles": 32,           # port backlog at which the MIO queue stops accepting (not published)
        "launch_us": 2.0,
        "max_warps_sm": 64,
        "max_ctas_sm": 32,
        "regs_sm": 65536,
        "smem_reserved_cta": 1024,
    },
}


def rates_for(arch: str) -> dict:
    if arch not in RATES:
        raise SystemExit(f"perf_model: no rates for {arch} (known: {', '.join(sorted(RATES))})")
    r = dict(RATES[arch])
    r["arch"] = arch
    return r
