#!/bin/bash
# A/B of two builds in one device call: the decode sweep at 4K and 128K (batch 1/8/64, both
# shapes, every preset), alternated base/new/base/new so clock and thermal drift hit both,
# and the page-loop SASS counts of both; bench/compare_sweeps.py prints the ratios.
#   bench/device_ab.sh .devbin/base.tar.xz .devbin/perf.tar.xz
# (each tarball from bench/pack_device.sh BUILD_DIR NAME). Results go to $OUT.
set -o pipefail
BASE=$1; NEW=$2
OUT=${OUT:-perf-out}; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
for side in base new; do
  mkdir -p /tmp/ab-$side
  tar -xJf "$([ $side = base ] && echo "$BASE" || echo "$NEW")" -C /tmp/ab-$side || exit 1
  cuobjdump --dump-sass /tmp/ab-$side/fp4kv_attention_tests > /tmp/ab-$side.sass 2>&1
done
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
{
  # The base names its formats by an int template parameter (0 NVFP4, 1 MXFP4, 2 FP8, 3 BF16),
  # the new kernel by its page traits type.
  for k in "0 9NvFp4Page 0 nvfp4-mixed" "0 9NvFp4Page 2 nvfp4-native" "1 9MxFp4Page 0 mxfp4-mixed" \
           "1 9MxFp4Page 2 mxfp4-native" "2 7Fp8Page 0 fp8" "3 8Bf16Page 0 bf16"; do
    set -- $k
    python3 bench/sass_count.py /tmp/ab-base.sass "decode_kernelILi$1ELi128ELi$3ELi1E" "base $4"
    python3 bench/sass_count.py /tmp/ab-new.sass "decode_kernelINS1_$2ELi128ELi$3ELi1E" "new $4"
  done
} > "$OUT"/ab_sass.txt 2>&1
grep -E "^==|page loop" "$OUT"/ab_sass.txt
ARGS="bench decode --contexts 4096,131072 --batches 1,8,64 --runs 15"
for rep in 1 2; do
  for side in base new; do
    (cd /tmp/ab-$side && LD_LIBRARY_PATH=/tmp/ab-$side timeout 140 ./fp4kv_bench $ARGS --json "$OUT"/ab_${side}_$rep.json \
      > /tmp/ab_${side}_$rep.log 2>&1); echo "$side $rep rc=$?"
  done
done
python3 bench/compare_sweeps.py "$OUT"/ab_base_1.json "$OUT"/ab_new_1.json "$OUT"/ab_base_2.json "$OUT"/ab_new_2.json \
  | tee "$OUT"/ab.md | tail -3
