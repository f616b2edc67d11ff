#!/bin/bash
# One device call: the open performance targets of this tree, measured on whichever card
# comes (the targets are set on the H200; ONLY_H200=1 stops on another card). The tree is
# built on the device (the CLI only), then, each part skipped when fewer seconds than it
# needs are left before DEADLINE (default 540, for a 600-s call):
#   bench e2e TPOT at 256K, batch 1, bf16 / nvfp4         (issue 14: >= 1.9x)
#   bench e2e throughput at 64K, 64 requests, bf16 / nvfp4 (issue 14: >= 2.4x)
#   bench step at 4K, batch 1, bf16 / nvfp4               (issue 13: <= 1.3x the weight floor)
#   bench decode at 4K and 128K, batch 1 / 8 / 64         (issue 18: fractions of the read
#                                                          bandwidth, 4K batch 1 against bf16)
# Markdown and JSON go to $OUT/targets.tgz (packed after every part), the tables to stdout.
#   [ONLY_H200=1] [DEADLINE=540] bash bench/device_targets.sh
set -o pipefail
OUT=${OUT:-perf-out}; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
DEADLINE=${DEADLINE:-540}; source "$(dirname "$0")/device_clock.sh"
L=/tmp/targets; rm -rf $L; mkdir -p $L
pack() { tar -C /tmp -czf "$OUT"/targets.tgz targets; }
GPU=$(nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader); echo "$GPU"
if [ "${ONLY_H200:-0}" = 1 ] && ! echo "$GPU" | grep -q H200; then echo "not an H200: nothing run"; exit 3; fi
(cmake -S . -B /tmp/targets-build -G Ninja -DCMAKE_BUILD_TYPE=Release > $L/configure.log 2>&1 \
  && cmake --build /tmp/targets-build -j16 --target fp4kv > $L/build.log 2>&1) || { tail -20 $L/build.log; exit 1; }
F=/tmp/targets-build/bin/fp4kv; M=qwen3-4b:random
echo "[t=$(now)s] built"
if room 70 "TPOT"; then
  timeout 150 $F bench e2e --model $M --parts tpot --presets bf16,nvfp4 --tpot-contexts 262144 --tpot-batches 1 \
    --json $L/tpot.json --markdown $L/tpot.md --svg "" > $L/tpot.log 2>&1; echo "[t=$(now)s] tpot rc=$?"; cat $L/tpot.md; pack
fi
if room 90 "throughput"; then
  timeout $(( DEADLINE - $(now) )) $F bench e2e --model $M --parts throughput --presets bf16,nvfp4 --concurrency 64 \
    --json $L/throughput.json --markdown $L/throughput.md --svg "" > $L/throughput.log 2>&1
  echo "[t=$(now)s] throughput rc=$?"; cat $L/throughput.md; pack
fi
if room 40 "step"; then
  timeout 90 $F bench step --model $M --presets bf16,nvfp4 --contexts 4096 --batches 1 --runs 20 \
    --json $L/step.json --markdown $L/step.md > $L/step.log 2>&1; echo "[t=$(now)s] step rc=$?"; cat $L/step.md; pack
fi
if room 100 "decode sweep"; then
  timeout $(( DEADLINE - $(now) )) $F bench decode --contexts 4096,131072 --batches 1,8,64 --runs 15 \
    --json $L/decode.json --markdown $L/decode.md --svg $L/decode.svg > $L/decode.log 2>&1; echo "[t=$(now)s] decode rc=$?"; cat $L/decode.md; pack
fi
