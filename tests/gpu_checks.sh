#!/usr/bin/env bash
# gpu_checks.sh: the GPU half of the test suite, for the GPU machine (CI has
# no GPU): every GPU test, then compute-sanitizer memcheck and racecheck on
# the kernel tests (the mixture-of-experts ones too) and on end-to-end runs
# (greedy through the decode graph, sampled, with layers streamed), memcheck
# on the parity, plan, streaming and arena tests.
#   tests/gpu_checks.sh [BIN_DIR]   (a build folder, or one folder holding
#                                    infer and the test binaries; default build)
# GPU_CHECKS_QUICK=1: the tests only, without the sanitizer runs.
# GPU_CHECKS_ONLY=REGEX: only the steps whose names match (e.g. "^memcheck
# test_parity", "racecheck"), to spread the sanitizer runs, which take
# minutes each, over several commands; every step prints its time.
# ENGINE_CUDA_CC caps the capability the engine acts on (tests/gpu_configs.sh).
# Exits non-zero if any test fails or a sanitizer reports an error.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
B=${1:-$ROOT/build}
export ENGINE_SOURCE_DIR=$ROOT ENGINE_TEST_DATA=${ENGINE_TEST_DATA:-$ROOT/tests/data}
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
bin() { [ -x "$B/tests/$1" ] && echo "$B/tests/$1" || echo "$B/$1"; }
fails=0
check() { # NAME COMMAND...: run, print one status line, keep the log's tail on failure
  local name=$1 log; shift
  if [ -n "${GPU_CHECKS_ONLY:-}" ] && ! [[ $name =~ $GPU_CHECKS_ONLY ]]; then return; fi
  log=$(mktemp)
  local t0=$SECONDS
  "$@" >"$log" 2>&1
  local rc=$?
  echo "$name: rc=$rc ($((SECONDS - t0)) s)"
  if [ "$rc" -ne 0 ]; then tail -20 "$log"; fails=$((fails + 1)); fi
  rm -f "$log"
}
for t in test_kernels_cuda test_attention_cuda test_moe_cuda test_arch_cuda test_arena test_parity_cuda test_plan_cuda test_stream_cuda; do check "$t" "$(bin $t)"; done
check test_model_cuda env ENGINE_TEST_DEVICE=cuda "$(bin test_model)"
M=$ROOT/models/stories260K
# --trace and --trace-svg on the GPU: 3 layers streamed, 1 computed by the CPU (tests/trace_check.sh's checks, device cuda)
check "trace cuda streamed hosted" bash "$ROOT/tests/trace_check_cuda.sh" "$B/infer" "$M"
if [ -n "${GPU_CHECKS_QUICK:-}" ]; then # the tests alone, no sanitizer runs
  echo "gpu_checks: $fails failure(s)"
  [ "$fails" -eq 0 ]
  exit
fi
for tool in memcheck racecheck; do
  check "$tool infer greedy" "$CS" --tool $tool --error-exitcode 9 "$B/infer" "$M" --device cuda --prompt "Once upon a time" -n 40
  check "$tool infer sampled" "$CS" --tool $tool --error-exitcode 9 "$B/infer" "$M" --device cuda --prompt "Once upon a time" -n 40 --temp 0.8 --top-p 0.9
  # ENGINE_TEST_QUICK: the kernel tests skip their deepest decode cases under the sanitizers (cuda_test_util.h)
  check "$tool test_kernels_cuda" env ENGINE_TEST_QUICK=1 "$CS" --tool $tool --error-exitcode 9 "$(bin test_kernels_cuda)"
  check "$tool test_attention_cuda" env ENGINE_TEST_QUICK=1 "$CS" --tool $tool --error-exitcode 9 "$(bin test_attention_cuda)"
  check "$tool test_moe_cuda" "$CS" --tool $tool --error-exitcode 9 "$(bin test_moe_cuda)"
  check "$tool infer streamed" "$CS" --tool $tool --error-exitcode 9 "$B/infer" "$M" --device cuda --prompt "Once upon a time" -n 40 --stream-layers 3
done
check "memcheck test_parity_cuda" "$CS" --tool memcheck --error-exitcode 9 "$(bin test_parity_cuda)"
check "memcheck test_plan_cuda" "$CS" --tool memcheck --error-exitcode 9 "$(bin test_plan_cuda)"
check "memcheck test_stream_cuda" "$CS" --tool memcheck --error-exitcode 9 "$(bin test_stream_cuda)"
check "memcheck test_arena (20 cycles)" env ENGINE_GPU_CYCLES=20 "$CS" --tool memcheck --error-exitcode 9 "$(bin test_arena)"
echo "gpu_checks: $fails failure(s)"
[ "$fails" -eq 0 ]
