#!/bin/bash
# One device call: unpack the carried binaries, SASS counts, the GPU tests,
# the PyTorch SDPA baseline and the `fp4kv bench decode` sweep (SDPA column merged). The
# Nsight Compute counters are bench/ncu_decode.sh. Logs and results go to $OUT.
#   bench/device_perf.sh .devbin/perf.tar.xz [full|tests|bench|mla] [extra bench args...]
# CONTEXTS=4096,131072 limits both the SDPA baseline and the bench to those contexts.
# SANITIZE / SANITIZE_CACHE: gtest filters of attention / cache tests run under memcheck,
# racecheck and synccheck (tests mode).
set -o pipefail
TAR=${1:-.devbin/perf.tar.xz}; WHAT=${2:-full}; shift 2
OUT=${OUT:-perf-out}; mkdir -p "$OUT"
B=/tmp/fp4kv-bin; mkdir -p $B; tar -xJf "$TAR" -C $B || exit 1
export LD_LIBRARY_PATH=$B:$LD_LIBRARY_PATH
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
cuobjdump --dump-sass $B/fp4kv_attention_tests > /tmp/new.sass 2>&1
{
  # decode_kernel<page traits, d, operand mode, n-tiles> (decode_kernel.cuh)
  for k in "decode_kernelINS1_9NvFp4PageELi128ELi0ELi1E nvfp4-d128-mixed" \
           "decode_kernelINS1_9NvFp4PageELi128ELi2ELi1E nvfp4-d128-native" \
           "decode_kernelINS1_9MxFp4PageELi128ELi0ELi1E mxfp4-d128-mixed" \
           "decode_kernelINS1_7Fp8PageELi128ELi0ELi1E fp8-d128" "decode_kernelINS1_8Bf16PageELi128ELi0ELi1E bf16-d128"; do
    fn=${k%% *}; lab=${k#* }
    python3 bench/sass_count.py /tmp/new.sass "$fn" "$lab"
  done
  cat /tmp/new.sass | awk '/Function :/ {n=$3} /LDL|STL/ {c[n]++} END {for (k in c) print "local memory:", k, c[k]}' | grep decode_kernel
} > "$OUT"/sass.txt 2>&1
grep -E "^==|per tile|page loop" "$OUT"/sass.txt
if [ "$WHAT" != bench ] && [ "$WHAT" != mla ]; then
  $B/fp4kv_attention_fragment_tests 2>&1 | tail -1
  timeout 200 $B/fp4kv_attention_tests > "$OUT"/tests.log 2>&1; echo "attention tests rc=$?"
  grep -E "^\[  (FAILED|PASSED)|Failure|tests ran" "$OUT"/tests.log | head -20
  timeout 120 $B/fp4kv_attention_mla_tests > /tmp/mla.log 2>&1; st=$?; cat /tmp/mla.log >> "$OUT"/tests.log; (exit $st); echo "mla tests rc=$?"
  grep -E "^\[  (FAILED|PASSED)|Failure|error" /tmp/mla.log | head -70
  timeout 120 compute-sanitizer --tool memcheck $B/fp4kv_attention_mla_tests 2>&1 | grep -E "ERROR SUMMARY" | tail -1
  timeout 120 $B/fp4kv_attention_step_tests > /tmp/step.log 2>&1; st=$?; cat /tmp/step.log >> "$OUT"/tests.log; (exit $st); echo "step tests rc=$?"
  grep -E "^\[  (FAILED|PASSED)|Failure|tests ran" /tmp/step.log | head -10
  timeout 200 $B/fp4kv_cache_tests > /tmp/cache.log 2>&1; st=$?; cat /tmp/cache.log >> "$OUT"/tests.log; (exit $st); echo "cache tests rc=$?"
  grep -E "^\[  (FAILED|PASSED)|Failure|tests ran" /tmp/cache.log | head -10
  if [ -x $B/fp4kv_ops_gpu_tests ]; then
    timeout 200 $B/fp4kv_ops_gpu_tests > /tmp/ops.log 2>&1; st=$?; cat /tmp/ops.log >> "$OUT"/tests.log; (exit $st); echo "ops tests rc=$?"
    grep -E "^\[  (FAILED|PASSED)|Failure|tests ran" /tmp/ops.log | head -10
  fi
  if [ -n "$SANITIZE" ]; then  # a gtest filter
    for tool in memcheck racecheck synccheck; do
      timeout 150 compute-sanitizer --tool $tool $B/fp4kv_attention_tests --gtest_filter="$SANITIZE" > "$OUT"/$tool.log 2>&1
      echo "$tool rc=$?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED" "$OUT"/$tool.log | tail -3
    done
  fi
  if [ -n "$SANITIZE_CACHE" ]; then  # a gtest filter over the cache tests
    for tool in memcheck racecheck synccheck; do
      timeout 150 compute-sanitizer --tool $tool $B/fp4kv_cache_tests --gtest_filter="$SANITIZE_CACHE" \
        > "$OUT"/cache_$tool.log 2>&1
      echo "cache $tool rc=$?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED" "$OUT"/cache_$tool.log | tail -3
    done
  fi
fi
if [ "$WHAT" = mla ]; then  # the MLA decode tests and the BF16 latent baseline's sweep
  timeout 120 $B/fp4kv_attention_mla_tests 2>&1 | grep -E "^\[  (FAILED|PASSED)|Failure|max error" | head -12
  timeout 300 $B/fp4kv_bench bench mla --json "$OUT"/mla.json --markdown "$OUT"/mla.md > "$OUT"/mla.log 2>&1
  echo "bench mla rc=$?"; cat "$OUT"/mla.log | tail -20
  exit 0
fi
if [ "$WHAT" != tests ]; then
  CTX=${CONTEXTS:+--contexts $CONTEXTS}  # empty: the tools' own default contexts
  PYTHONUNBUFFERED=1 timeout 150 python3 bench/sdpa_baseline.py --json "$OUT"/sdpa.json --runs 15 $CTX > /tmp/sdpa.log 2>&1
  echo "sdpa rc=$?"; grep -E "131072" /tmp/sdpa.log | head -12
  timeout 380 $B/fp4kv_bench bench decode --runs 15 --sdpa "$OUT"/sdpa.json --json "$OUT"/bench.json \
    --markdown "$OUT"/bench.md --svg "$OUT"/bench.svg $CTX "$@" > "$OUT"/bench.log 2>&1
  echo "bench rc=$?"; head -1 "$OUT"/bench.log; grep -E " (131072|4096) " "$OUT"/bench.log | grep -E "qwen3-4b" | head -70
  # The docs/PERF.md tables from the sweep's JSON (`fp4kv bench-report` re-renders it anywhere).
  $B/fp4kv_bench bench-report --json "$OUT"/bench.json --perf-tables "$OUT"/perf_tables.md; echo "report rc=$?"
fi
