#!/usr/bin/env bash
# Builds the GPU-side programs here and packs them (stripped, with libfmt) into
# .carry/ for a GPU machine that has CUDA but not fmt/CLI11/doctest.
set -euo pipefail
build=${1:-build}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release > /dev/null
cmake --build "$build" -j2
rm -rf .carry && mkdir -p .carry/bin .carry/lib
for b in kdtree_gpu_tests verify_mla verify_step bench_verify bench_tree_build_accept bench_sample_compact bench_host_overhead kdtree-gen; do
  [ -x "$build/$b" ] && strip -o ".carry/bin/$b" "$build/$b"
done
cp -L "$build/libkdtree.so.0" .carry/lib/libkdtree.so.0
cp -L "$(ldconfig -p | awk '/libfmt.so.9 /{print $NF; exit}')" .carry/lib/libfmt.so.9
# FlashMLA beside bench_verify (bench/flashmla; FLASHMLA_DIR: a FlashMLA checkout, CUTLASS_DIR optional).
if [ -n "${FLASHMLA_DIR:-}" ]; then
  bench/flashmla/build.sh .carry/bin
fi
# The GPU machine is an H200 (sm_90): its kernels can be compiled here (same NVRTC) so
# the GPU's time goes to tests and benchmarks; device_gpu_run.sh uses this cache when
# present. KDTREE_CARRY_CACHE=0 skips it (a 16-core GPU machine warms the grid in
# seconds: `kdtree-gen warm --arch native` there).
if [ "${KDTREE_CARRY_CACHE:-1}" != 0 ]; then
  "$build/kdtree-gen" warm --arch sm_90 --cache-dir .carry/cache | tail -1
fi
du -sh .carry
