#!/bin/bash
# Packs the binaries one device call needs into .devbin/perf.tar.xz (stripped, with the
# CUDA runtime). Usage: bench/pack_device.sh [build-dir] [old-objects-dir]
set -e
BD=${1:-build-perf}; OLD=${2:-}
T=$(mktemp -d)
cp $BD/tests/attention/fp4kv_attention_tests $BD/tests/attention/fp4kv_attention_step_tests \
   $BD/tests/attention/fp4kv_attention_fragment_tests $BD/tests/cache/fp4kv_cache_tests $BD/bin/fp4kv_bench $T/
strip $T/fp4kv_attention_tests $T/fp4kv_attention_step_tests $T/fp4kv_attention_fragment_tests \
   $T/fp4kv_cache_tests $T/fp4kv_bench
cp -L /usr/local/cuda/lib64/libcudart.so.13 $T/ 2>/dev/null || cp -L /usr/local/cuda/lib/libcudart.so.13 $T/
if [ -n "$OLD" ]; then
  for f in nvfp4:nv mxfp4:mx fp8:fp8 bf16:bf16; do
    src=$OLD/decode_${f##*:}_d128.cu.o
    if [ -f $src ]; then cp $src $T/old_${f%%:*}128.o; fi
  done
fi
mkdir -p .devbin
tar -C $T -cJf .devbin/perf.tar.xz .
ls -la .devbin/perf.tar.xz
rm -rf $T
