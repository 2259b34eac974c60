# Sourced by the scripts/device_*.sh that run the binaries carried in .carry/ (scripts/pack_device_carry.sh) on
# the GPU machine: the checkout's root (also the working directory after it), the carry, the output folder
# $out ($OUT, else the sourcing script's $device_out, else /tmp/kdtree-out) and what the binaries need.
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root" || exit 2
carry=$root/.carry
out=${OUT:-${device_out:-/tmp/kdtree-out}}
mkdir -p "$out"
export LD_LIBRARY_PATH=$carry/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}
# The sm_90 cache pack_device_carry.sh compiled, else a fresh one.
if [ -d "$carry/cache" ]; then export KDTREE_CACHE_DIR=${KDTREE_CACHE_DIR:-$carry/cache}; fi
export KDTREE_CACHE_DIR=${KDTREE_CACHE_DIR:-/tmp/kdtree-cache}
# sm_120's MLA kernel over e4m3 caches, as KDTREE_VERIFY_TILES runs it on other GPUs.
sm120_mla=kernel=qsplit,block_m=64,block_n=32,warps=8,stages=4,warp_rows=32,mma=e4m3
