#!/bin/bash
# Packs the binaries one device call needs into .devbin/perf.tar.xz (stripped, with the
# CUDA runtime). Usage: bench/pack_device.sh [build-dir] [name]   (-> .devbin/NAME.tar.xz)
set -e
BD=${1:-build-perf}
NAME=${2:-perf}
T=$(mktemp -d)
cp $BD/tests/attention/fp4kv_attention_tests $BD/tests/attention/fp4kv_attention_step_tests \
   $BD/tests/attention/fp4kv_attention_fragment_tests $BD/tests/attention/fp4kv_attention_mla_tests \
   $BD/tests/cache/fp4kv_cache_tests $BD/bin/fp4kv_bench $T/
# The GPU ops tests, where the tree has them (cuBLASLt is the device machine's own: too large
# to carry).
if [ -x $BD/tests/ops/fp4kv_ops_gpu_tests ]; then
  cp $BD/tests/ops/fp4kv_ops_gpu_tests $T/ && strip $T/fp4kv_ops_gpu_tests
fi
strip $T/fp4kv_attention_tests $T/fp4kv_attention_step_tests $T/fp4kv_attention_fragment_tests $T/fp4kv_attention_mla_tests \
   $T/fp4kv_cache_tests $T/fp4kv_bench
cp -L /usr/local/cuda/lib64/libcudart.so.13 $T/ 2>/dev/null || cp -L /usr/local/cuda/lib/libcudart.so.13 $T/
mkdir -p .devbin
tar -C $T -cJf .devbin/$NAME.tar.xz .
ls -la .devbin/$NAME.tar.xz
rm -rf $T
