export OUT=${OUT:-/tmp/out}
L=/tmp/logs; rm -rf $L; mkdir -p $L
export LD_LIBRARY_PATH=$PWD/.carry/lib:/usr/local/cuda/lib64
export KDTREE_CACHE_DIR=/tmp/kdtree-cache
.carry/bin/kdtree-gen warm --arch native -j 16 --pages 1,16,32,64,128 > $L/warm.log 2>&1; tail -1 $L/warm.log
timeout 200 .carry/bin/kdtree_gpu_tests -tc="*qsplit*" > $L/gpu_tests_q.log 2>&1; echo "qsplit tests rc $?"
grep -E "parity|test cases|assertions|FAILED|ERROR" $L/gpu_tests_q.log | head
for sched in "" stream splits; do
  KDTREE_VERIFY_SCHEDULE=$sched KDTREE_VERIFY_TILES=64,16,8,4,32,qsplit timeout 120 .carry/bin/bench_verify --shape mla --iters 20 > $L/bench_q_${sched:-auto}.txt 2>&1
  echo "== qsplit schedule=${sched:-auto}"; tail -7 $L/bench_q_${sched:-auto}.txt
done
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
KDTREE_VERIFY_SCHEDULE=stream KDTREE_VERIFY_TILES=64,16,8,4,32,qsplit $ncu --clock-control none -k regex:kdtree_verify --launch-skip 10 -c 2 --metrics gpu__time_duration.sum .carry/bin/bench_verify --shape mla_b32 --iters 3 2>&1 | grep -E 'kdtree_verify|gpu__time'
S=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for tool in racecheck; do
  timeout 150 $S --tool $tool --error-exitcode 3 --print-limit 20 .carry/bin/kdtree_gpu_tests -tc="verify_attention GPU: qsplit*" > $L/san_$tool.log 2>&1; echo "$tool rc $?"
  grep -E "SUMMARY|test cases" $L/san_$tool.log
done
tar czf $OUT/logs.tgz -C /tmp logs
