#!/bin/bash
# Issue 19's measurements, one call on a host of two or more GPUs (a kind such as
# nvidia-h200-x2): the CLI and the engine GPU tests built there, then, each part skipped when
# fewer seconds than it needs are left before DEADLINE (default 560, for a 600-s call):
#   the tensor-parallel GPU tests (NcclTwoGpusMatchOneGpu runs only with two GPUs);
#   `fp4kv generate` greedy on pk8l at TP = 1 and 2: the same text;
#   `fp4kv bench step` of Qwen3-30B-A3B at 128K, batch 1 and 16, TP = 1 and 2 (the collectives'
#   share of a step is its "collectives us" column);
#   `fp4kv bench e2e` throughput of Qwen3-30B-A3B at 128K over concurrency 1, 4, 16, 64, TP = 2
#   then TP = 1 (tokens/s of the group and per GPU).
# NCCL's settings stay the environment's, but NVLink multicast is off (NCCL_NVLS_ENABLE=0).
# Logs and tables to $OUT/tp.tgz (packed after every part).
#   [DEADLINE=560] bash bench/device_tensor_parallel.sh
set -o pipefail
OUT=${OUT:-perf-out}; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
DEADLINE=${DEADLINE:-560}; source "$(dirname "$0")/device_clock.sh"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader; nvidia-smi topo -m | head -5
export NCCL_NVLS_ENABLE=0
L=/tmp/tp; rm -rf $L; mkdir -p $L; pack() { tar -C /tmp -czf "$OUT"/tp.tgz tp; }
(cmake -S . -B /tmp/tp-build -G Ninja -DCMAKE_BUILD_TYPE=Release > $L/configure.log 2>&1 \
  && cmake --build /tmp/tp-build -j32 --target fp4kv fp4kv_engine_gpu_tests > $L/build.log 2>&1); el "build rc=$?"
grep -h "NCCL\|error" $L/configure.log $L/build.log | head -5
mkdir -p /work && ln -sfn "$PWD" /work/main  # the tests find models/pk8l at their compiled-in path
F=/tmp/tp-build/bin/fp4kv
(timeout 200 /tmp/tp-build/tests/engine/fp4kv_engine_gpu_tests --gtest_filter='TensorParallel*' > $L/tests.log 2>&1)
el "tensor-parallel tests rc=$?"; grep -E "^\[  (FAILED|PASSED|SKIPPED)|Failure" $L/tests.log | head -12; pack
for n in 1 2; do
  timeout 60 $F generate --prompt "The history of" --max-tokens 64 --temperature 0 --tensor-parallel $n \
    > $L/generate$n.txt 2> $L/generate$n.err; el "generate TP=$n rc=$?"
done
cmp -s $L/generate1.txt $L/generate2.txt && el "greedy text identical" || el "greedy text DIFFERS"; pack
for n in 1 2; do room 120 "step TP=$n" || continue
  timeout 100 $F bench step --model qwen3-30b-a3b:random --presets bf16,nvfp4 --contexts 131072 --batches 1,16 \
    --runs 10 --tensor-parallel $n --markdown $L/step$n.md --json $L/step$n.json > $L/step$n.log 2>&1
  el "step TP=$n rc=$?"; cat $L/step$n.md; pack
done
for n in 2 1; do room 150 "throughput TP=$n" || continue
  timeout $(( DEADLINE - $(now) - 10 )) $F bench e2e --model qwen3-30b-a3b:random --parts throughput --presets bf16,nvfp4 \
    --throughput-context 131072 --concurrency 1,4,16,64 --tensor-parallel $n --svg "" \
    --markdown $L/e2e$n.md --json $L/e2e$n.json > $L/e2e$n.log 2>&1
  el "throughput TP=$n rc=$?"; cat $L/e2e$n.md; pack
done
