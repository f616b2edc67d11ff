#!/bin/bash
# A/B of two builds in one device call: the decode sweep at 4K and 128K (batch 1/8/64, both
# shapes, every preset), alternated base/new REPS times (default 4) so clock and thermal drift
# hit both, and the page-loop SASS counts of both (when a tarball holds the attention tests);
# bench/compare_sweeps.py prints the median ratio per point over the pairs.
#   REPS=4 bench/device_ab.sh .devbin/base.tar.xz .devbin/perf.tar.xz
# (each tarball from bench/pack_device.sh BUILD_DIR NAME; fp4kv_bench alone is enough). Results
# go to $OUT: ab.md (the ratios), ab_sass.txt, ab_sweeps.tar.xz (every sweep's JSON), so a
# call brings back three files whatever REPS is.
set -o pipefail
BASE=$1; NEW=$2; REPS=${REPS:-4}
OUT=${OUT:-perf-out}; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
for side in base new; do
  rm -rf /tmp/ab-$side; mkdir -p /tmp/ab-$side
  tar -xJf "$([ $side = base ] && echo "$BASE" || echo "$NEW")" -C /tmp/ab-$side || exit 1
done
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
for side in base new; do
  [ -x /tmp/ab-$side/fp4kv_attention_tests ] || { echo "== $side: no attention tests binary, no SASS"; continue; }
  cuobjdump --dump-sass /tmp/ab-$side/fp4kv_attention_tests > /tmp/ab-$side.sass 2>&1
  # decode_kernel<page traits, d, operand mode, n-tiles> (decode_kernel.cuh)
  for k in "9NvFp4Page 0 nvfp4-mixed" "9NvFp4Page 2 nvfp4-native" "9MxFp4Page 0 mxfp4-mixed" \
           "9MxFp4Page 2 mxfp4-native" "7Fp8Page 0 fp8" "8Bf16Page 0 bf16"; do
    set -- $k
    python3 bench/sass_count.py /tmp/ab-$side.sass "decode_kernelINS1_$1ELi128ELi$2ELi1E" "$side $3"
  done
done > "$OUT"/ab_sass.txt 2>&1
grep -E "^==|page loop" "$OUT"/ab_sass.txt
ARGS="bench decode --contexts 4096,131072 --batches 1,8,64 --runs 15"
mkdir -p /tmp/ab-sweeps; rm -f /tmp/ab-sweeps/*.json
PAIRS=()
for rep in $(seq 1 "$REPS"); do
  for side in base new; do
    (cd /tmp/ab-$side && LD_LIBRARY_PATH=/tmp/ab-$side timeout 140 ./fp4kv_bench $ARGS \
      --json /tmp/ab-sweeps/ab_${side}_$rep.json > /tmp/ab_${side}_$rep.log 2>&1)
    echo "$side $rep rc=$?"
  done
  PAIRS+=(/tmp/ab-sweeps/ab_base_$rep.json /tmp/ab-sweeps/ab_new_$rep.json)
done
tar -C /tmp/ab-sweeps -cJf "$OUT"/ab_sweeps.tar.xz .
python3 bench/compare_sweeps.py "${PAIRS[@]}" | tee "$OUT"/ab.md | tail -3
