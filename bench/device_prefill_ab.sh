#!/bin/bash
# A/B of the prefill attention kernels in one device call, both trees built on the device.
# The new tree is this checkout; the base is it with PATCH reversed (PATCH=.devbin/ab.patch,
# from `git diff BASE -- fp4kv tests > .devbin/ab.patch` here; carry .devbin). Then: the prefill
# tests of the new build, compute-sanitizer (memcheck, racecheck, synccheck) over its wgmma
# cases, `fp4kv bench prefill` alternated base/new REPS times (default 2), and PyTorch SDPA
# in the same call. To $OUT: prefill_ab.log and the JSON of every run.
#   REPS=2 [MMA=warpgroup] [CONTEXTS=4096,16384,32768] bash bench/device_prefill_ab.sh
set -o pipefail
OUT=${OUT:-perf-out}; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
NEW=$PWD; BASE=/tmp/ab-base-src; REPS=${REPS:-2}; CONTEXTS=${CONTEXTS:-4096,16384,32768}
rm -rf $BASE && cp -r "$NEW" $BASE && (cd $BASE && patch -s -R -p1 < "$NEW/${PATCH:-.devbin/ab.patch}") || exit 1
for side in new base; do
  SRC=$([ $side = new ] && echo "$NEW" || echo $BASE)
  (cmake -S "$SRC" -B /tmp/ab-build-$side -G Ninja -DCMAKE_BUILD_TYPE=Release -DFP4KV_PTXAS_VERBOSE=ON > /tmp/cfg-$side.log 2>&1 \
    && cmake --build /tmp/ab-build-$side -j16 --target fp4kv fp4kv_attention_prefill_tests > /tmp/build-$side.log 2>&1)
  echo "build $side rc=$?"; grep -E " error" /tmp/build-$side.log | head -5
done
grep -A2 "prefill_wgmma_kernel" /tmp/build-new.log | grep -E "registers|spill" | head -4
mkdir -p /work && ln -sfn "$NEW" /work/main  # the tests find models/pk8l at their compiled-in path
B=/tmp/ab-build-new/tests/attention/fp4kv_attention_prefill_tests
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
(timeout 200 $B > "$OUT/prefill_tests.log" 2>&1); echo "prefill tests rc=$?"
grep -E "^\[  (FAILED|PASSED)|Failure" "$OUT/prefill_tests.log" | head -5
if [ "${SANITIZE:-1}" = 1 ]; then
  for tool in memcheck racecheck synccheck; do
    echo "$tool:"; (timeout 150 compute-sanitizer --tool $tool $B --gtest_filter='*wgmma*' 2>&1 | grep -E "SUMMARY|PASSED|FAILED" | tail -2)
  done
fi
for rep in $(seq 1 "$REPS"); do
  for side in base new; do
    timeout 120 /tmp/ab-build-$side/bin/fp4kv bench prefill --presets bf16,nvfp4 --contexts "$CONTEXTS" \
      --mma "${MMA:-warpgroup}" --json "$OUT/prefill_${side}_$rep.json" 2>&1 | grep -E "^\|" | sed "s/^/$side $rep /"
  done
done
timeout 100 python3 bench/sdpa_prefill_baseline.py --contexts "$CONTEXTS" 2>&1 | tail -6
