export OUT=${OUT:-/tmp/out}
L=/tmp/logs; rm -rf $L; mkdir -p $L
export LD_LIBRARY_PATH=$PWD/.carry/lib:/usr/local/cuda/lib64
export KDTREE_CACHE_DIR=/tmp/kdtree-cache
( time .carry/bin/kdtree-gen warm --arch native -j 16 --pages 1,16,32,64,128 ) > $L/warm.log 2>&1
tail -2 $L/warm.log
timeout 300 bash scripts/device_gpu_run.sh tests > $L/tests.log 2>&1; echo "tests rc $?"
grep -E "parity|test cases|assertions|FAILED|ERROR" $L/tests.log | head -30
cp /tmp/kdtree-out/gpu_tests.log $L/ 2>/dev/null
KDTREE_VERIFY_TILES=64,16,8,3,32,qsplit timeout 100 .carry/bin/kdtree_gpu_tests -tc="*parity: mla576/512" > $L/parity_q3.log 2>&1; echo "q3 rc $?"; grep -E "parity|test cases" $L/parity_q3.log
timeout 200 bash scripts/device_perf_model.sh > $L/pm.log 2>&1; echo "pm rc $?"
grep -v '^$' $L/pm.log | tail -40
S=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for tool in racecheck memcheck synccheck; do
  timeout 120 $S --tool $tool --error-exitcode 3 --print-limit 20 .carry/bin/kdtree_gpu_tests -tc="verify_attention GPU: qsplit*" > $L/san_$tool.log 2>&1; echo "$tool rc $?"
  grep -E "SUMMARY|test cases" $L/san_$tool.log
done
cp /tmp/kdtree-out/* $L/ 2>/dev/null
tar czf $OUT/logs.tgz -C /tmp logs
