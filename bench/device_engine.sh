#!/bin/bash
# One device call for the GPU engine (carry .devbin; tarball from bench/pack_engine.sh):
#   bench/device_engine.sh first    tests, prefill and python in one call (each part's logs in its folder)
#   bench/device_engine.sh tests    engine + backend GPU tests, memcheck of the engine tests,
#                                   the serve tests (their CLI server runs on the GPU), generate
#   bench/device_engine.sh e2e      fp4kv bench e2e (Qwen3-4B shape)
#   bench/device_engine.sh step     fp4kv bench gemm and bench step (Qwen3-4B shape), and bench e2e's
#                                   TPOT and cache-work parts (PARTS=... overrides)
#   bench/device_engine.sh moe      the Qwen3-MoE path: the CPU runner against transformers on a
#                                   small random Qwen3MoeForCausalLM (bench/hf_moe_reference.py +
#                                   fp4kv check-model), then bench step and bench e2e (TPOT at
#                                   128K, throughput at 128K) of qwen3-30b-a3b:random
#   bench/device_engine.sh moe-check only the transformers check of the MoE path
#   bench/device_engine.sh python   builds the PyTorch extension (pip, scikit-build-core, against the
#                                   machine's torch) into /tmp/fp4kv-py, runs python/tests and
#                                   bench/hf_generate_bench.py (transformers generate at 32K context)
#   bench/device_engine.sh prefill  the chunked-prefill attention tests (and memcheck of a subset),
#                                   fp4kv bench prefill and PyTorch SDPA's causal kernel beside it
#   bench/device_engine.sh serve    fp4kv serve --device cuda + fp4kv load-test (load, then two
#                                   soaks; the server's RSS and GPU memory after each)
#   bench/device_engine.sh eval     pass-key retrieval at 8192 tokens, >= 600 questions per preset
#                                   (~90 s per preset on the H200: PRESETS=a,b,c splits the ten
#                                   presets over calls)
# Logs and JSON go to $OUT. The tests find models/pk8l through /work/main (their compiled-in
# source path), linked to this checkout.
set -o pipefail
WHAT=${1:-tests}
OUT=${OUT:-perf-out}; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
E=/tmp/fp4kv-engine; mkdir -p $E; tar -xJf .devbin/engine.tar.xz -C $E || exit 1
export LD_LIBRARY_PATH=$E:$LD_LIBRARY_PATH
mkdir -p /work && ln -sfn "$PWD" /work/main
# The CLI tests run the binary at its compiled-in path (build-perf/bin/fp4kv of this checkout).
mkdir -p build-perf/bin && ln -sfn $E/fp4kv build-perf/bin/fp4kv
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,memory.used --format=csv,noheader
case $WHAT in
first)  # one call for a tree not yet run on the GPU: the GPU tests, the prefill kernel, the PyTorch extension
  for part in tests prefill python; do
    echo "===== $part"; OUT="$OUT/$part" SKIP_HF_BENCH=1 bash "$0" $part 2>&1 | tail -45
  done
  # One archive: a call brings back at most 8 files.
  tar -czf "$OUT"/first_logs.tgz -C "$OUT" tests prefill python && rm -rf "$OUT"/tests "$OUT"/prefill "$OUT"/python
  ;;
tests)
  (cd $E && timeout 240 ./fp4kv_engine_gpu_tests > "$OUT"/engine_tests.log 2>&1); echo "engine tests rc=$?"
  grep -E "^\[  (FAILED|PASSED)|Failure|pk8l|row " "$OUT"/engine_tests.log | head -20
  (cd $E && timeout 200 compute-sanitizer --tool memcheck ./fp4kv_engine_gpu_tests \
      --gtest_filter='*GraphReplay*:*Batched*:*BadSteps*:*Qwen3Moe*:*OneRequest*:*DecodeStepsContinue*:*BadPrefills*' > "$OUT"/engine_memcheck.log 2>&1)
  echo "engine memcheck rc=$?"; grep -E "ERROR SUMMARY|PASSED|FAILED" "$OUT"/engine_memcheck.log | tail -3
  (cd $E && timeout 60 ./fp4kv_ops_gpu_tests 2>&1 | tail -1)
  (cd $E && timeout 120 compute-sanitizer --tool memcheck ./fp4kv_ops_gpu_tests --gtest_filter='GemmGpu.Gemv*:GemmGpu.Tuned*:MoeGpu.*' \
      2>&1 | grep -E "ERROR SUMMARY|PASSED|FAILED" | tail -3)
  (cd /work/main && timeout 240 $E/fp4kv_serve_tests > "$OUT"/serve_tests.log 2>&1); echo "serve tests rc=$?"
  grep -E "^\[  (FAILED|PASSED)|Failure" "$OUT"/serve_tests.log | head
  timeout 60 $E/fp4kv generate --prompt 'The cat sat on the' --max-tokens 64 2>&1 | tail -2
  ;;
e2e)
  timeout 560 $E/fp4kv bench e2e --model qwen3-4b:random --json "$OUT"/e2e.json --markdown "$OUT"/e2e.md --svg "$OUT"/e2e.svg \
    > "$OUT"/e2e.log 2>&1; echo "e2e rc=$?"; tail -60 "$OUT"/e2e.log
  ;;
step)
  timeout 120 $E/fp4kv bench gemm --model qwen3-4b:random --batches 1,2,4,8,16,64 --json "$OUT"/gemm.json \
    --markdown "$OUT"/gemm.md > "$OUT"/gemm.log 2>&1; echo "gemm rc=$?"; grep -E "step GEMMs|batch +1 " "$OUT"/gemm.log
  timeout 200 $E/fp4kv bench step --model qwen3-4b:random --presets bf16,nvfp4 --contexts 4096,32768 --batches 1,64 \
    --json "$OUT"/step.json --markdown "$OUT"/step.md > "$OUT"/step.log 2>&1; echo "step rc=$?"; cat "$OUT"/step.log
  timeout 300 $E/fp4kv bench e2e --model qwen3-4b:random --parts ${PARTS:-tpot,overhead} --tpot-contexts 262144 \
    --json "$OUT"/e2e.json --markdown "$OUT"/e2e.md > "$OUT"/e2e.log 2>&1; echo "e2e rc=$?"; tail -30 "$OUT"/e2e.log
  ;;
moe-check|moe)
  python3 bench/hf_moe_reference.py /tmp/hf-moe > "$OUT"/moe.log 2>&1 && \
    $E/fp4kv check-model --model /tmp/hf-moe >> "$OUT"/moe.log 2>&1; echo "check-model rc=$?"; tail -12 "$OUT"/moe.log
  [ "$WHAT" = moe-check ] && exit 0
  if [ -z "$MOE_SKIP_STEP" ]; then  # MOE_SKIP_STEP=1 MOE_PARTS=throughput MOE_PRESETS=nvfp4: e2e rows alone
    timeout 200 $E/fp4kv bench step --model qwen3-30b-a3b:random --presets bf16,nvfp4 --contexts 4096,131072 \
      --batches 1,8 --json "$OUT"/moe_step.json --markdown "$OUT"/moe_step.md > "$OUT"/moe_step.log 2>&1
    echo "moe step rc=$?"; cat "$OUT"/moe_step.log
  fi
  timeout ${MOE_E2E_TIMEOUT:-300} $E/fp4kv bench e2e --model qwen3-30b-a3b:random --parts ${MOE_PARTS:-tpot,throughput} \
    --presets ${MOE_PRESETS:-bf16,fp8,nvfp4,nvfp4-native,mxfp4} --tpot-contexts 131072 \
    --throughput-context 131072 --json "$OUT"/moe_e2e.json --markdown "$OUT"/moe_e2e.md --svg "$OUT"/moe_e2e.svg > "$OUT"/moe_e2e.log 2>&1
  echo "moe e2e rc=$?"; tail -30 "$OUT"/moe_e2e.log
  ;;
python)
  # pip + scikit-build-core as python/README.md says; where pip cannot run the backend, the same
  # CMake project directly (the package folder plus the built module)
  python3 -c "import scikit_build_core.build; print('scikit-build-core', scikit_build_core.__version__)" 2>&1 | tail -1
  python3 -c "from transformers.cache_utils import CacheLayerMixin; print('abstract:', sorted(CacheLayerMixin.__abstractmethods__))"
  cp "$(python3 -c 'import transformers.cache_utils as c; print(c.__file__)')" "$OUT"/
  rm -rf /tmp/fp4kv-py  # pip --target keeps an existing package: a warm machine would test the old one
  CMAKE_BUILD_PARALLEL_LEVEL=16 timeout 300 python3 -m pip install --no-build-isolation --no-deps --break-system-packages \
    --config-settings=build-dir=/tmp/fp4kv-pybuild \
    --target /tmp/fp4kv-py -v ./python > "$OUT"/pip.log 2>&1; RC=$?; echo "pip rc=$RC"
  # The module must export no C++ runtime of its own (python/CMakeLists.txt, --exclude-libs): 0 expected
  M=/tmp/fp4kv-py/fp4kv/_C.so
  echo "libstdc++ symbols exported by _C.so: $(nm -D --defined-only $M | grep -cE 'St7codecvt|_M_insertIl|__throw_ios_failure')"
  if [ $RC != 0 ]; then
    grep -E "Error|error:" "$OUT"/pip.log | tail -3
    (cmake -S python -B /tmp/pybuild -G Ninja -DCMAKE_BUILD_TYPE=Release -DPython3_EXECUTABLE="$(command -v python3)" \
      && cmake --build /tmp/pybuild -j16 && mkdir -p /tmp/fp4kv-py && cp -r python/fp4kv /tmp/fp4kv-py/ \
      && cp /tmp/pybuild/_C*.so /tmp/fp4kv-py/fp4kv/) > "$OUT"/cmake_py.log 2>&1; echo "cmake build rc=$?"
    grep -E "error|Error" "$OUT"/cmake_py.log | head -20
  fi
  (cd /tmp && PYTHONPATH=/tmp/fp4kv-py timeout 300 python3 -m pytest -v -rs /work/main/python/tests ${PYTEST_ARGS} \
    > "$OUT"/pytest.log 2>&1); RC=$?; echo "pytest rc=$RC"
  grep -E "(PASSED|FAILED|SKIPPED|ERROR)( |$)|passed|failed|Fatal" "$OUT"/pytest.log | cut -c1-150 | head -40
  sed -n '/= FAILURES =/,/short test summary/p' "$OUT"/pytest.log | grep -E "^E |Error|error|^_+ test" | head -30
  PYTHONPATH=/tmp/fp4kv-py timeout 120 python3 bench/py_error_probe.py
  if [ $RC = 139 ]; then  # a crash: the error test alone, with the named native backtrace of the SIGSEGV
    gcc -shared -fPIC -o /tmp/segv.so bench/segv_backtrace.c
    (cd /tmp && PYTHONPATH=/tmp/fp4kv-py LD_PRELOAD=/tmp/segv.so timeout 300 python3 -m pytest -q -s -rs -p no:faulthandler \
      /work/main/python/tests/test_ops.py -k errors) > "$OUT"/crash.log 2>&1
    python3 bench/symbolize_backtrace.py "$OUT"/crash.log | head -40
  fi
  if [ -z "$SKIP_HF_BENCH" ]; then
    PYTHONPATH=/tmp/fp4kv-py timeout ${BENCH_TIMEOUT:-240} python3 bench/hf_generate_bench.py --context 32768 \
      --new-tokens 128 --presets nvfp4,bf16 --json "$OUT"/hf_generate.json 2>&1 | grep -v Warning | tail -12
  fi
  ;;
prefill)
  (cd $E && timeout 200 ./fp4kv_attention_prefill_tests > "$OUT"/prefill_tests.log 2>&1); echo "prefill tests rc=$?"
  grep -E "^\[  (FAILED|PASSED)|Failure|max_rel" "$OUT"/prefill_tests.log | head -60
  (cd $E && timeout 200 compute-sanitizer --tool memcheck ./fp4kv_attention_prefill_tests \
      --gtest_filter='*nvfp4_d128_s129_T77*:*nvfp4_d128_s700_T65_w256*:*bf16_d64*:*mxfp4_d128_s300*:*rows128*:PrefillErrors.*' \
      2>&1 | grep -E "ERROR SUMMARY|PASSED|FAILED" | tail -3)
  timeout 200 $E/fp4kv bench prefill --presets ${PRESETS:-bf16,nvfp4} --contexts 4096,32768 --json "$OUT"/prefill.json \
    --markdown "$OUT"/prefill.md 2>&1 | tail -8
  timeout 100 python3 bench/sdpa_prefill_baseline.py --contexts 4096,32768
  ;;
serve)
  $E/fp4kv serve --device cuda --port 18500 --max-batch 32 > "$OUT"/serve.log 2>&1 &
  SERVER=$!
  memory() {  # the server's resident set and GPU memory
    echo "$1: RSS $(awk '/VmRSS/{print $2, $3}' /proc/$SERVER/status), GPU $(nvidia-smi --query-gpu=memory.used --format=csv,noheader)"
  }
  for i in $(seq 60); do grep -q listening "$OUT"/serve.log && break; sleep 1; done; cat "$OUT"/serve.log
  memory "started"
  timeout 200 $E/fp4kv load-test --port 18500 --clients 32 --requests 8 --max-tokens 64 --json "$OUT"/load.json
  echo "load rc=$?"; memory "after the load run"
  for soak in 1 2; do
    timeout 200 $E/fp4kv load-test --port 18500 --clients 32 --requests 100 --max-tokens 8 --cancel-fraction 0.3 \
      --json "$OUT"/soak$soak.json; echo "soak $soak rc=$?"; memory "after soak $soak"
  done
  kill -TERM $SERVER; wait $SERVER; echo "server exit $?"
  ;;
eval)
  timeout 560 $E/fp4kv eval --device cuda --context 512 --windows 1 --retrieval-docs 64 --retrieval-context 8192 \
    --baseline nvfp4-native --quiet --json "$OUT"/ret8192.json \
    --configs ${PRESETS:-bf16,nvfp4,nvfp4-native,mxfp4-native} \
    > "$OUT"/ret8192.txt 2>&1; echo "eval rc=$?"; tail -14 "$OUT"/ret8192.txt
  ;;
esac
