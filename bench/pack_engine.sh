#!/bin/bash
# Packs what the engine's device runs need into .devbin/engine.tar.xz: the CLI (generate,
# eval, serve, load-test, bench step/e2e/gemm/prefill), the engine, serve, ops and prefill
# attention test binaries (stripped), the
# CUDA runtime and the cpp-httplib library the CLI links (the device machine has neither
# package). Usage: bench/pack_engine.sh [build-dir]
set -e
BD=${1:-build-perf}
T=$(mktemp -d)
cp $BD/bin/fp4kv $BD/tests/engine/fp4kv_engine_gpu_tests $BD/tests/serve/fp4kv_serve_tests $BD/tests/ops/fp4kv_ops_gpu_tests \
   $BD/tests/attention/fp4kv_attention_prefill_tests $T/
strip $T/*
cp -L /usr/local/cuda/lib64/libcudart.so.13 $T/ 2>/dev/null || cp -L /usr/local/cuda/lib/libcudart.so.13 $T/
cp -L /usr/lib/x86_64-linux-gnu/libcpp-httplib.so.0.11 $T/
mkdir -p .devbin
tar -C $T -cJf .devbin/engine.tar.xz .
ls -la .devbin/engine.tar.xz
rm -rf $T
