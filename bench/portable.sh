#!/usr/bin/env bash
# portable.sh: issue 31's figures in one run on one GPU: the 8B shape on
# the paths the device takes by itself, then capped by ENGINE_CUDA_CC to
# the paths an Ampere (80) and a Turing (75) GPU take, so each portable
# figure has its Hopper figure from the same call beside it.
#   bench/portable.sh [BIN_DIR] [SCRATCH_DIR]   (BIN_DIR holds bench, mkcheckpoint, quantize;
#                                                SCRATCH_DIR needs ~25 GB free)
#   CAPS="none 80 75" (default) picks the configurations; SHAPE=llama-3.1-8b (default) the model.
# Per configuration: bf16 prefill of 512 and decode after it; decode in the
# tg128 shape (--prompt 1 --gen 128) for bf16, int8 with an int8 head and
# nf4-dq with an nf4-dq head; nf4 prefill of 512. bench prints a JSON line per run.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
B=${1:-$ROOT/build}
S=${2:-/tmp/engine-bench}
CAPS=${CAPS:-none 80 75}
SHAPE=${SHAPE:-llama-3.1-8b}
mkdir -p "$S"
M=$S/$SHAPE
[ -f "$M/config.json" ] || "$B/mkcheckpoint" --shape "$SHAPE" --dtype bf16 "$M" >&2
[ -f "$M-nf4-dq/config.json" ] || "$B/quantize" "$M" "$M-nf4-dq" --type nf4 --double-quant >&2
cat "$M"/*.safetensors "$M-nf4-dq"/*.safetensors >/dev/null # page cache: load time is not what is measured
run() { echo "== ENGINE_CUDA_CC=${cap} bench $*"; ENGINE_CUDA_CC=$cc "$B/bench" "$@" | grep -E '^\{' ; }
for cap in $CAPS; do
  cc=$cap; [ "$cap" = none ] && cc=
  run "$M" --device cuda --prompt 512 --gen 128 --reps 3
  run "$M" --device cuda --prompt 1 --gen 128 --reps 3
  run "$M" --device cuda --prompt 1 --gen 128 --reps 3 --quant int8 --quant-head int8
  run "$M-nf4-dq" --device cuda --prompt 1 --gen 128 --reps 3 --quant-head nf4-dq
  run "$M" --device cuda --prompt 512 --gen 16 --reps 3 --quant nf4
done
