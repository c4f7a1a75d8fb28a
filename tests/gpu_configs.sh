#!/usr/bin/env bash
# gpu_configs.sh: tests/gpu_checks.sh in the five configurations that make
# one Hopper GPU stand in for the GPUs users have (issue 31): the default
# build (sm_75, sm_80, sm_90a code and compute_90 PTX) with the capability
# uncapped and capped to 8.9, 8.0 and 7.5 by ENGINE_CUDA_CC (the paths a
# lesser GPU takes), and a PTX-only compute_75 build (Turing's instructions
# only, compiled by the driver).
#   tests/gpu_configs.sh DEFAULT_BIN_DIR PTX75_BIN_DIR
# Environment: GPU_CHECKS_QUICK=1 skips the sanitizer runs (gpu_checks.sh);
# GPU_CONFIGS_ONLY="default 89 80 75 ptx" (any of those words) runs only
# those configurations, to spread them over several commands: without the
# sanitizers one takes about 250 s on an H200 (test_arena and
# test_stream_cuda most of it). Run configurations one after another, not
# side by side: test_stream_cuda's budget checks read the device's free
# memory, which other processes move.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
B=${1:?default build folder}
B75=${2:?PTX-only 75-virtual build folder}
for w in ${GPU_CONFIGS_ONLY:-}; do
  case $w in default | 89 | 80 | 75 | ptx) ;; *) echo "gpu_configs: GPU_CONFIGS_ONLY: unknown configuration '$w' (default, 89, 80, 75, ptx)" >&2; exit 2 ;; esac
done
failed=""
want() { [ -z "${GPU_CONFIGS_ONLY:-}" ] || [[ " $GPU_CONFIGS_ONLY " == *" $1 "* ]]; }
run() { # LABEL BIN_DIR CAP
  echo "=== $1"
  if ENGINE_CUDA_CC=$3 "$ROOT/tests/gpu_checks.sh" "$2"; then echo "=== $1: pass"; else echo "=== $1: FAIL"; failed="$failed [$1]"; fi
}
want default && run "default build" "$B" ""
for cc in 89 80 75; do want $cc && run "default build, ENGINE_CUDA_CC=$cc" "$B" $cc; done
want ptx && run "75-virtual (PTX-only) build" "$B75" ""
echo "gpu_configs: ${failed:-every configuration run passes} (${GPU_CONFIGS_ONLY:-all five})"
[ -z "$failed" ]
