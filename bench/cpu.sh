#!/usr/bin/env bash
# cpu.sh: CPU decode and prefill speed of stories260K and of a random-weight
# Llama-3.2-1B-shaped bf16 checkpoint, against the host's read bandwidth.
#   bench/cpu.sh [BUILD_DIR] [SCRATCH_DIR]    (needs ~2.5 GB free in SCRATCH_DIR)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
B=${1:-$ROOT/build}
S=${2:-/tmp/engine-bench}
mkdir -p "$S"
cc -O3 -march=native -fopenmp "$ROOT/bench/membw.c" -o "$S/membw"
"$S/membw"
[ -f "$S/llama-3.2-1b/config.json" ] || "$B/mkcheckpoint" --shape llama-3.2-1b --dtype bf16 "$S/llama-3.2-1b"
IDS=$(seq 1000 1777 113000 | head -n 64 | paste -sd,)
report() { # name json
  jq -r --arg n "$1" '"\($n): prompt \(.prompt_ids|length) tokens at \(.timings.prompt_tokens_per_second) tok/s, decode \(.generated_ids|length) tokens at \(.timings.generated_tokens_per_second) tok/s, weights \(.memory.weights_mapped) bytes"'
}
"$B/infer" "$ROOT/models/stories260K" --prompt "Once upon a time" -n 256 --json 2>/dev/null | tail -n 1 | report stories260K
# Warm the page cache so the first run measures compute, not the disk.
cat "$S/llama-3.2-1b/model.safetensors" >/dev/null
"$B/infer" "$S/llama-3.2-1b" --prompt-ids "$IDS" -n 32 --json 2>/dev/null | tail -n 1 | report llama-3.2-1b-bf16
