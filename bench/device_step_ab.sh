#!/bin/bash
# A/B of the engine's decode step in one device call, both trees built on the device (no
# cpp-httplib there: the CLI without `serve`, enough for the benchmarks). The new tree is this
# checkout; the base is it with PATCH reversed (PATCH=.devbin/ab.patch, from `git diff BASE >
# .devbin/ab.patch` here; carry .devbin). Then, on the new build (TEST_SIDE=base: the base
# build): the ops and engine GPU tests (TESTS=0 skips); SANITIZE=1 adds memcheck, and racecheck
# of the MoE block, the fused QK-norm + append and the GEMV; ATTENTION=1 the decode attention
# and MLA tests (with SANITIZE=1 the decode kernels' memcheck and racecheck); CACHE=1 the cache
# tests. Then, alternated base/new REPS times (default 3): `fp4kv bench gemm` at batch 1-8 (GEMM=0 skips),
# `fp4kv bench step` (STEP=0 skips) with bench/compare_step.py's median ratios, and with
# DECODE_CONTEXTS=4096,131072 the decode sweep (bench/compare_sweeps.py; DECODE_SHAPES=qwen3-4b one
# shape; DECODE_ARGS: more `bench decode` options, e.g. "--sms 96"; AB_TARGETS: the targets
# built, when the calls above need fewer). To $OUT: step_ab.md,
# step_ab_logs.tgz, decode_ab.md.
#   REPS=3 [MODEL=qwen3-30b-a3b:random] [TPOT_CONTEXTS=262144] [GENERATE=1] bash bench/device_step_ab.sh
set -o pipefail
OUT=${OUT:-perf-out}; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
NEW=$PWD; BASE=/tmp/ab-base-src; REPS=${REPS:-3}
rm -rf $BASE && cp -r "$NEW" $BASE && (cd $BASE && patch -s -R -p1 < "$NEW/${PATCH:-.devbin/ab.patch}") || exit 1
TARGETS=${AB_TARGETS:-"fp4kv fp4kv_ops_gpu_tests fp4kv_engine_gpu_tests fp4kv_attention_tests fp4kv_attention_prefill_tests fp4kv_attention_mla_tests fp4kv_cache_tests"}
for side in new base; do
  SRC=$([ $side = new ] && echo "$NEW" || echo $BASE)
  (cmake -S "$SRC" -B /tmp/ab-build-$side -G Ninja -DCMAKE_BUILD_TYPE=Release -DFP4KV_PTXAS_VERBOSE=ON > /tmp/cfg-$side.log 2>&1 \
    && cmake --build /tmp/ab-build-$side -j16 --target $TARGETS > /tmp/build-$side.log 2>&1)
  echo "build $side rc=$?"; grep -E "error" /tmp/build-$side.log | head -5
done
rm -rf /tmp/ab-logs; mkdir -p /tmp/ab-logs; cp /tmp/build-new.log /tmp/ab-logs/  # a warm machine keeps the last call's logs
mkdir -p /work && ln -sfn "$NEW" /work/main  # the tests find models/pk8l at their compiled-in path
B=/tmp/ab-build-${TEST_SIDE:-new}  # the build the tests and sanitizers run on
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
if [ "${TESTS:-1}" = 1 ]; then
  (timeout 120 $B/tests/ops/fp4kv_ops_gpu_tests > /tmp/ab-logs/ops_tests.log 2>&1); echo "ops tests rc=$?"; tail -1 /tmp/ab-logs/ops_tests.log
  (timeout 240 $B/tests/engine/fp4kv_engine_gpu_tests > /tmp/ab-logs/engine_tests.log 2>&1); echo "engine tests rc=$?"
  grep -E "^\[  (FAILED|PASSED)|Failure" /tmp/ab-logs/engine_tests.log | head
  (timeout 200 $B/tests/attention/fp4kv_attention_prefill_tests > /tmp/ab-logs/prefill_tests.log 2>&1); echo "prefill tests rc=$?"
  grep -E "^\[  (FAILED|PASSED)|Failure" /tmp/ab-logs/prefill_tests.log | head -5
fi
if [ "${SANITIZE:-0}" = 1 ]; then  # memcheck of the GEMV, the norms, the MoE block and the engine's graph steps
  (timeout 120 compute-sanitizer --tool memcheck $B/tests/ops/fp4kv_ops_gpu_tests --gtest_filter='GemmGpu.Gemv*:GemmGpu.Tuned*:OpsGpu.*:MoeGpu.*:QkNormRopeAppendGpu.*' \
    2>&1 | grep -E "ERROR SUMMARY|PASSED|FAILED" | tail -3)
  (timeout 200 compute-sanitizer --tool memcheck $B/tests/engine/fp4kv_engine_gpu_tests \
    --gtest_filter='*GraphReplay*:*Batched*:*OneRequest*:*DecodeStepsContinue*:*Moe*' 2>&1 | grep -E "ERROR SUMMARY|PASSED|FAILED" | tail -3)
  (timeout 120 compute-sanitizer --tool racecheck $B/tests/ops/fp4kv_ops_gpu_tests --gtest_filter='MoeGpu.*:QkNormRopeAppendGpu.*:GemmGpu.Gemv*' \
    2>&1 | grep -E "RACECHECK SUMMARY|PASSED|FAILED" | tail -3)
fi
if [ "${CACHE:-0}" = 1 ]; then  # the cache GPU tests (after a change to the control kernel or the planner), memcheck of the control kernel's
  (timeout 200 $B/tests/cache/fp4kv_cache_tests > /tmp/ab-logs/cache_tests.log 2>&1); echo "cache tests rc=$?"
  tail -1 /tmp/ab-logs/cache_tests.log; grep -E "^\[  FAILED|Failure" /tmp/ab-logs/cache_tests.log | head -5
  (timeout 120 compute-sanitizer --tool memcheck $B/tests/cache/fp4kv_cache_tests --gtest_filter='ControlKernel.*' \
    2>&1 | grep -E "ERROR SUMMARY|PASSED|FAILED" | tail -3)
fi
if [ "${ATTENTION:-0}" = 1 ]; then  # the decode attention tests (after a change to the decode kernel)
  (timeout 200 $B/tests/attention/fp4kv_attention_tests > /tmp/ab-logs/attention_tests.log 2>&1); echo "attention tests rc=$?"
  tail -1 /tmp/ab-logs/attention_tests.log; grep -E "^\[  FAILED|Failure" /tmp/ab-logs/attention_tests.log | head -5
  (timeout 120 $B/tests/attention/fp4kv_attention_mla_tests > /tmp/ab-logs/mla_tests.log 2>&1); echo "mla tests rc=$?"
  tail -1 /tmp/ab-logs/mla_tests.log; grep -E "^\[  FAILED|Failure" /tmp/ab-logs/mla_tests.log | head -5
  if [ "${SANITIZE:-0}" = 1 ]; then  # memcheck and racecheck of the decode kernel: short, long, mixed rows, head dims
    F='DecodeAttention.*:Small/*:MixedLengths/*:HeadDims/*:Bf16/*'
    for tool in memcheck racecheck; do
      (timeout 240 compute-sanitizer --tool $tool $B/tests/attention/fp4kv_attention_tests --gtest_filter="$F" \
        2>&1 | grep -E "ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED" | tail -3)
    done
  fi
fi
MODEL=${MODEL:-qwen3-4b:random}  # every benchmark below runs this model shape
GEMM_ARGS="bench gemm --model $MODEL --batches ${GEMM_BATCHES:-1,4,8}"
STEP_ARGS="bench step --model $MODEL --presets ${STEP_PRESETS:-bf16,nvfp4} --contexts ${STEP_CONTEXTS:-4096,32768} --batches ${STEP_BATCHES:-1,8} --runs 20"
for rep in $(seq 1 "$REPS"); do
  for side in base new; do
    if [ "${GEMM:-1}" = 1 ]; then
      timeout 150 /tmp/ab-build-$side/bin/fp4kv $GEMM_ARGS --json /tmp/ab-logs/gemm_${side}_$rep.json > /tmp/ab-logs/gemm_${side}_$rep.log 2>&1
      echo "gemm $side $rep rc=$?"
    fi
    [ "${STEP:-1}" = 1 ] || continue
    timeout 200 /tmp/ab-build-$side/bin/fp4kv $STEP_ARGS --json /tmp/ab-logs/step_${side}_$rep.json > /tmp/ab-logs/step_${side}_$rep.log 2>&1
    echo "step $side $rep rc=$?"
  done
done
if [ -n "$DECODE_CONTEXTS" ]; then  # the decode attention sweep, alternated base/new REPS times
  PAIRS=()
  for rep in $(seq 1 "$REPS"); do
    for side in base new; do
      timeout 200 /tmp/ab-build-$side/bin/fp4kv bench decode --contexts "$DECODE_CONTEXTS" --batches "${DECODE_BATCHES:-1,8,64}" \
        --presets "${DECODE_PRESETS:-bf16,fp8,nvfp4,mxfp4,nvfp4-native}" ${DECODE_SHAPES:+--shapes $DECODE_SHAPES} $DECODE_ARGS --runs 15 --json /tmp/ab-logs/decode_${side}_$rep.json \
        > /tmp/ab-logs/decode_${side}_$rep.log 2>&1
      echo "decode $side $rep rc=$?"
    done
    PAIRS+=(/tmp/ab-logs/decode_base_$rep.json /tmp/ab-logs/decode_new_$rep.json)
  done
  python3 bench/compare_sweeps.py "${PAIRS[@]}" > "$OUT"/decode_ab.md; tail -40 "$OUT"/decode_ab.md
fi
if [ -n "$TPOT_CONTEXTS" ]; then  # bench e2e's TPOT (bf16 and nvfp4, batch 1), once per side
  for side in base new; do
    timeout 240 /tmp/ab-build-$side/bin/fp4kv bench e2e --model $MODEL --parts tpot --presets bf16,nvfp4 \
      --tpot-contexts "$TPOT_CONTEXTS" --tpot-batches 1 --json /tmp/ab-logs/tpot_$side.json > /tmp/ab-logs/tpot_$side.log 2>&1
    echo "tpot $side rc=$?"; grep -E "^\| (bf16|nvfp4) " /tmp/ab-logs/tpot_$side.log
  done
fi
if [ -n "$GENERATE" ]; then  # fp4kv generate's default path (untuned plans): its time per output token, per side
  for rep in 1 2; do for side in base new; do
    echo "generate $side: $(timeout 120 /tmp/ab-build-$side/bin/fp4kv generate --model $MODEL --prompt 'The cat sat on the' \
      --max-tokens 128 --seed 1 2>&1 >/dev/null | grep -iE 'per output token|tokens/s' | tr '\n' ' ')"
  done; done
fi
if [ "${STEP:-1}" = 1 ]; then
  python3 bench/compare_step.py /tmp/ab-logs "$REPS" > "$OUT"/step_ab.md; cat "$OUT"/step_ab.md
fi
tar -C /tmp -czf "$OUT"/step_ab_logs.tgz ab-logs
