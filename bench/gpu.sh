#!/usr/bin/env bash
# gpu.sh: the CUDA backend's speed on random-weight Llama-3.2-1B and
# Llama-3.1-8B checkpoints (bf16), against the GPU's measured bandwidth.
#   bench/gpu.sh [BIN_DIR] [SCRATCH_DIR]   (BIN_DIR holds bench, gpubw, mkcheckpoint;
#                                           SCRATCH_DIR needs ~19 GB free)
# Prints gpubw's bandwidth line, then per model bench's table and JSON line.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
B=${1:-$ROOT/build}
S=${2:-/tmp/engine-bench}
mkdir -p "$S"
"$B/gpubw"
for shape in llama-3.2-1b llama-3.1-8b; do
  [ -f "$S/$shape/config.json" ] || "$B/mkcheckpoint" --shape "$shape" --dtype bf16 "$S/$shape" >&2
  cat "$S/$shape"/*.safetensors >/dev/null # page cache: load time is not what is measured
  "$B/bench" "$S/$shape" --device cuda --prompt 512 --gen 128 --reps 5
done
