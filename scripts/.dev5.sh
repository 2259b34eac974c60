export OUT=${OUT:-/tmp/out}
L=/tmp/logs; rm -rf $L /tmp/kdtree-out; mkdir -p $L
export LD_LIBRARY_PATH=$PWD/.carry/lib:/usr/local/cuda/lib64
export KDTREE_CACHE_DIR=/tmp/kdtree-cache
.carry/bin/kdtree-gen warm --arch native -j 16 --pages 1,16,32,64,128 > $L/warm.log 2>&1; tail -1 $L/warm.log
timeout 240 bash scripts/device_gpu_run.sh tests > $L/tests.log 2>&1; echo "tests rc $?"
grep -E "parity|test cases|assertions|FAILED|ERROR" $L/tests.log | head -12
timeout 240 bash scripts/device_perf_model.sh > $L/pm.log 2>&1; echo "pm rc $?"
grep -E "^(mla|gqa)|==|SM clock|parity|test cases" $L/pm.log | head -50
OUT=/tmp/pyout timeout 200 bash scripts/device_python.sh tests > $L/py.log 2>&1; echo "py rc $?"; tail -3 $L/py.log
cp /tmp/kdtree-out/* $L/ 2>/dev/null
tar czf $OUT/logs.tgz -C /tmp logs
