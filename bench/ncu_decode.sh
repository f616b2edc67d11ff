#!/bin/bash
# Nsight Compute counters of the decode kernel for a few presets at one point, and the SASS
# of the d = 128 decode kernels (xz), into $OUT (run on the device after bench/device_perf.sh
# unpacked the binaries, or with B set).
#   [SMS=96] bench/ncu_decode.sh [presets] [context] [batch] [shape]
# SMS: the kernels on that many SMs (`bench decode --sms`: an H100 at the H200's bandwidth per SM).
B=${B:-/tmp/fp4kv-bin}; export LD_LIBRARY_PATH=$B:$LD_LIBRARY_PATH
OUT=${OUT:-perf-out}; mkdir -p "$OUT"
PRESETS=${1:-nvfp4,nvfp4-native}; CTX=${2:-131072}; BATCH=${3:-64}; SHAPE=${4:-qwen3-4b}
cuobjdump --dump-sass $B/fp4kv_attention_tests | awk '/Function :/ {p = ($3 ~ /decode_kernelINS1_[0-9]+[A-Za-z0-9]+PageELi128E/)} p' | xz -9 > "$OUT"/decode_d128.sass.xz
for p in ${PRESETS//,/ }; do
  timeout 120 ncu --clock-control none -k regex:decode_kernel --launch-skip 3 --launch-count 1 \
    --section SpeedOfLight --section WarpStateStats --section Occupancy --section LaunchStats \
    --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,smsp__inst_executed.sum,sm__cycles_elapsed.avg,sm__cycles_active.max,sm__cycles_active.avg,regex:smsp__inst_executed_pipe_.*\.sum,regex:sm__inst_executed_pipe_[^.]*\.avg\.pct_of_peak_sustained_active$" \
    $B/fp4kv_bench bench decode --contexts $CTX --batches $BATCH --shapes $SHAPE --presets $p --runs 1 --rotate-gb 0 ${SMS:+--sms $SMS} \
    --json /tmp/n.json --markdown /tmp/n.md --svg /tmp/n.svg > "$OUT"/ncu_$p.txt 2>&1
  echo "== ncu $p rc=$?"
  grep -E "stalled|Throughput|Warp Cycles|Achieved Occupancy|Duration|inst_executed.sum|cycles_elapsed|cycles_active|Registers|pipe_(alu|fma|fmaheavy|fmalite|fp16|lsu|tensor|xu|uniform|adu|cbu).*(sum|pct_of_peak_sustained_active) " "$OUT"/ncu_$p.txt | awk '($NF+0 > 0.05 || !/stalled/) && !/n\/a/' | head -60
done
