#!/usr/bin/env bash
# moe.sh: issue 37's figures, on random-weight mixture-of-experts checkpoints
# of the real shapes written in nf4-dq directly (mkcheckpoint --quant nf4-dq):
#   bench/moe.sh [BIN_DIR] [SCRATCH_DIR]   (BIN_DIR holds bench and mkcheckpoint;
#                                           SCRATCH_DIR needs ~27 GB free: one
#                                           checkpoint at a time, removed after)
#   SECTIONS="qwen3 mixtral" (the default: both) picks what runs:
#     qwen3    Qwen3-30B-A3B all resident, at --vram 8G (the GPU reading the host
#              experts over PCIe, then the CPU running them), at --vram 4G, and at
#              8G with a 1 GiB expert cache (about 3 minutes on the H200 machine)
#     mixtral  Mixtral-8x7B at --vram 16G (about 5 minutes, most of it writing 26 GB)
#     cpu      Qwen3-30B-A3B at --vram 8G with the host experts on the CPU
#              (--moe-host cpu) at 8, 12 and 16 threads, then traced at 16:
#              the mean time of a layer's host experts ("experts of layer"
#              spans) and the rate it gives (about 3 minutes)
# Prints per run bench's table, its JSON line and, for an expert model, the
# line with the plan's bound and the ratio to it (bench/RESULTS.md, rows 48-51).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
B=${1:-$ROOT/build}
S=${2:-/tmp/engine-bench}
SECTIONS=${SECTIONS:-qwen3 mixtral}
on() { [[ " $SECTIONS " == *" $1 "* ]]; }
mkdir -p "$S"
run() { echo "== bench $*"; "$B/bench" "$@"; }
write_checkpoint() { # shape dir: write it, and read it once so that the page cache holds it
  "$B/mkcheckpoint" --shape "$1" --dtype bf16 --quant nf4-dq "$2" >&2
  cat "$2"/*.safetensors >/dev/null
}
if on qwen3; then
  Q=$S/qwen3-30b-a3b-nf4dq
  write_checkpoint qwen3-30b-a3b "$Q"
  run "$Q" --device cuda --prompt 512 --gen 64 --reps 2
  run "$Q" --device cuda --vram 8G --prompt 512 --gen 32 --reps 2
  run "$Q" --device cuda --vram 8G --prompt 512 --gen 32 --reps 2 --moe-host cpu
  run "$Q" --device cuda --vram 4G --prompt 512 --gen 32 --reps 2
  run "$Q" --device cuda --vram 8G --prompt 512 --gen 64 --reps 2 --expert-cache 1G
  rm -rf "$Q"
fi
if on cpu; then
  Q=$S/qwen3-30b-a3b-nf4dq
  [ -d "$Q" ] || write_checkpoint qwen3-30b-a3b "$Q"
  for t in 8 12 16; do
    run "$Q" --device cuda --vram 8G --prompt 64 --gen 32 --reps 2 --moe-host cpu --threads $t
  done
  run "$Q" --device cuda --vram 8G --prompt 64 --gen 32 --reps 1 --moe-host cpu --threads 16 --trace "$S/moe-cpu.json"
  if command -v jq >/dev/null; then
    jq -r '[.traceEvents[] | select(.ph == "X" and (.name | startswith("experts of layer"))) | .dur]
           | "experts of a layer on the CPU: \(length) spans, mean \(add / length) us"' "$S/moe-cpu.json"
  fi
  rm -rf "$Q"
fi
if on mixtral; then
  M=$S/mixtral-8x7b-nf4dq
  write_checkpoint mixtral-8x7b "$M"
  run "$M" --device cuda --vram 16G --prompt 512 --gen 32 --reps 2
  rm -rf "$M"
fi
