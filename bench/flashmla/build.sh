#!/usr/bin/env bash
# Builds bench_flashmla: FlashMLA's sm90 dense decode kernels (compiled from a FlashMLA
# checkout) driven by our torch-free harness, flashmla_bench.cu. Not part of the CMake
# build or CI: it needs FlashMLA and CUTLASS sources, which CI cannot download.
#
# usage: bench/flashmla/build.sh [OUT_DIR]
#   FLASHMLA_DIR  a FlashMLA checkout (default /work/ext/flashmla)
#   CUTLASS_DIR   a CUTLASS 3.x/4.x checkout with cute (default $FLASHMLA_DIR/csrc/cutlass,
#                 FlashMLA's submodule)
#   OUT_DIR       where bench_flashmla goes (default .carry/bin); objects go to a temporary
#                 folder, removed afterwards, so OUT_DIR holds only the binary
#   NVCC          (default nvcc on PATH, else /usr/local/cuda/bin/nvcc)
#   FLASHMLA_REV  the FlashMLA commit, printed by the binary (default: git rev-parse in
#                 FLASHMLA_DIR; set it when FLASHMLA_DIR is an export without .git)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
FLASHMLA_DIR="${FLASHMLA_DIR:-/work/ext/flashmla}"
CUTLASS_DIR="${CUTLASS_DIR:-$FLASHMLA_DIR/csrc/cutlass}"
OUT_DIR="${1:-${OUT_DIR:-$repo/.carry/bin}}"
NVCC="${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}"

FLASHMLA_REV="${FLASHMLA_REV:-$(git -C "$FLASHMLA_DIR" rev-parse HEAD 2>/dev/null || echo unknown)}"
src="$FLASHMLA_DIR/csrc"
for f in "$src/params.h" "$src/sm90/decode/dense/splitkv_mla.cuh" \
         "$src/smxx/decode/combine/combine.cu" \
         "$src/smxx/decode/get_decoding_sched_meta/get_decoding_sched_meta.cu" \
         "$CUTLASS_DIR/include/cute/tensor.hpp"; do
  [[ -f "$f" ]] || { echo "build.sh: missing $f (set FLASHMLA_DIR / CUTLASS_DIR)" >&2; exit 2; }
done

mkdir -p "$OUT_DIR"
OUT_DIR="$(cd "$OUT_DIR" && pwd)"
obj="$(mktemp -d "${TMPDIR:-/tmp}/bench_flashmla-obj.XXXXXX")"
trap 'rm -rf "$obj"' EXIT

# FlashMLA's own nvcc flags (setup.py), minus torch and the sm100 targets. sm_90a only:
# the kernel uses wgmma/setmaxnreg, which need the arch-specific target. Static cudart
# (nvcc's default, spelled out) so the binary needs only the driver on the GPU machine.
flags=(-O3 -std=c++20 -DNDEBUG -D_USE_MATH_DEFINES -DFLASH_MLA_DISABLE_FP16
       -Wno-deprecated-declarations --expt-relaxed-constexpr --expt-extended-lambda
       --use_fast_math -gencode arch=compute_90a,code=sm_90a --cudart static
       -I"$src" -I"$src/kerutils/include" -I"$src/sm90"
       -I"$CUTLASS_DIR/include" -I"$CUTLASS_DIR/tools/util/include" -I"$repo/bench"
       ${NVCC_EXTRA_FLAGS:-})

# FlashMLA's translation units for dense bf16 decode: the split-KV MLA kernel (its bf16
# instantiation), the scheduler-metadata kernel and the combine kernel.
units=(sm90/decode/dense/instantiations/bf16.cu
       smxx/decode/get_decoding_sched_meta/get_decoding_sched_meta.cu
       smxx/decode/combine/combine.cu)

# The four compiles run in parallel (the MLA kernel's is the long one, ~60 s).
start=$(date +%s)
pids=()
objs=()
compile() {  # src obj [extra flags]
  "$NVCC" "${flags[@]}" "${@:3}" -c "$1" -o "$2" || { echo "build.sh: failed: $1" >&2; return 1; }
}
for u in "${units[@]}"; do
  o="$obj/$(echo "$u" | tr / _).o"
  objs+=("$o")
  compile "$src/$u" "$o" &
  pids+=($!)
done
o="$obj/flashmla_bench.o"
objs+=("$o")
compile "$here/flashmla_bench.cu" "$o" -DBENCH_FLASHMLA_REV="\"$FLASHMLA_REV\"" &
pids+=($!)
fail=0
for p in "${pids[@]}"; do wait "$p" || fail=1; done
(( fail == 0 )) || exit 1

"$NVCC" -gencode arch=compute_90a,code=sm_90a --cudart static "${objs[@]}" -o "$OUT_DIR/bench_flashmla"
end=$(date +%s)

echo "built $OUT_DIR/bench_flashmla ($(du -h "$OUT_DIR/bench_flashmla" | cut -f1), $((end - start)) s, FlashMLA $FLASHMLA_REV)"
