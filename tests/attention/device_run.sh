#!/bin/bash
# One call on the GPU machine for the attention kernels: tests, compute-sanitizer
# (memcheck + racecheck on a small subset), SASS checks (HMMA present, no local memory) and
# the first timings. Binaries are built elsewhere and carried: $1 = folder holding
# fp4kv_attention_tests, fp4kv_attention_fragment_tests, fp4kv_attention_bench (and
# libcudart.so.13). Logs go to $OUT (or ./attn-out).
#   usage: tests/attention/device_run.sh build-attn/dev [tests|sanitize|bench|all]
set -o pipefail
BIN=${1:-build-attn/dev}
WHAT=${2:-all}
OUT=${OUT:-attn-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$BIN:$LD_LIBRARY_PATH
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
if [ "$WHAT" = all ] || [ "$WHAT" = tests ]; then
  "$BIN"/fp4kv_attention_fragment_tests 2>&1 | tail -1
  timeout ${TEST_TIMEOUT:-200} "$BIN"/fp4kv_attention_tests ${TEST_FILTER:+--gtest_filter=$TEST_FILTER} > "$OUT"/tests.log 2>&1
  echo "tests rc=$?"
  grep -E "^\s+[a-z0-9]|^\[  (FAILED|PASSED)|Failure|^\[       OK|^\[  FAILED" "$OUT"/tests.log | cut -c1-200 | tail -${TEST_LINES:-120}
  if [ -x "$BIN"/fp4kv_attention_step_tests ]; then
    timeout 120 "$BIN"/fp4kv_attention_step_tests > "$OUT"/step_tests.log 2>&1
    echo "step tests rc=$?"; grep -E "decode step|Failure|^\[  (FAILED|PASSED)" "$OUT"/step_tests.log | cut -c1-200
  fi
fi
if [ "$WHAT" = all ] || [ "$WHAT" = sanitize ]; then
  timeout 90 compute-sanitizer --tool memcheck --print-limit 20 "$BIN"/fp4kv_attention_tests \
    --gtest_filter='*SmallAllFormats*:*EmptyRows*' > "$OUT"/memcheck.log 2>&1
  echo "memcheck rc=$?"; grep -E "ERROR SUMMARY|PASSED|FAILED" "$OUT"/memcheck.log | tail -3
  timeout 90 compute-sanitizer --tool racecheck --racecheck-report all "$BIN"/fp4kv_attention_tests \
    --gtest_filter='*SmallAllFormats*' > "$OUT"/racecheck.log 2>&1
  echo "racecheck rc=$?"; grep -E "RACECHECK SUMMARY|ERROR SUMMARY|PASSED|FAILED" "$OUT"/racecheck.log | tail -3
  if [ -x "$BIN"/fp4kv_attention_step_tests ]; then
    timeout 90 compute-sanitizer --tool memcheck --print-limit 20 "$BIN"/fp4kv_attention_step_tests \
      --gtest_filter='*nvfp4_native*' > "$OUT"/memcheck_step.log 2>&1
    echo "memcheck (decode step) rc=$?"; grep -E "ERROR SUMMARY|PASSED|FAILED" "$OUT"/memcheck_step.log | tail -3
  fi
  cuobjdump --dump-sass "$BIN"/fp4kv_attention_tests | awk '
    /Function :/ { if (name != "") printf "%-80s HMMA %4d  LDL/STL %d\n", name, h, l; name = $3; h = 0; l = 0 }
    /HMMA/ { h++ } /LDL|STL/ { l++ }
    END { printf "%-80s HMMA %4d  LDL/STL %d\n", name, h, l }' | grep -E "decode_kernel|combine" > "$OUT"/sass_summary.txt
  echo "sass: kernels $(wc -l < "$OUT"/sass_summary.txt), without HMMA: $(grep -c 'HMMA    0' "$OUT"/sass_summary.txt), with local memory: $(grep -vc 'LDL/STL 0$' "$OUT"/sass_summary.txt)"
fi
if [ "$WHAT" = all ] || [ "$WHAT" = bench ]; then
  timeout ${BENCH_TIMEOUT:-150} "$BIN"/fp4kv_attention_bench ${BENCH_ARGS} 2>&1 | tee "$OUT"/bench.log
fi
