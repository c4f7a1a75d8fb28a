#!/usr/bin/env bash
# gpu.sh: the CUDA backend's speed on random-weight Llama-3.2-1B and
# Llama-3.1-8B checkpoints, against the GPU's measured bandwidth: every
# figure bench/RESULTS.md quotes for the GPU targets, in one run.
#   bench/gpu.sh [BIN_DIR] [SCRATCH_DIR]   (BIN_DIR holds bench, gpubw, mkcheckpoint, quantize;
#                                           SCRATCH_DIR needs ~25 GB free)
#   SECTIONS="bf16 quant stream anchor" (default all of them) picks what runs:
#     bf16    issue 3: bf16 prefill and decode, both shapes
#     quant   issue 4: nf4 and int8 (quantized while loading), both shapes; the
#             issue's target configurations (nf4 with double quantization and a
#             4-bit head, int8 with an int8 head) in both decode shapes
#     stream  issue 5: the 8B shape at --vram 8G (bf16) and 6.5G (int8), streaming
#             alone and with hosted layers
#     anchor  PyTorch + transformers on the same checkpoints (needs torch)
#     long    issue 34: the 8B in nf4-dq at --vram 16G with a 32,768-token
#             prompt (int8, fp8 and f16 KV), decode at depth 120k (int8),
#             --vram 8G at 32k with int8 KV, bf16 with f16 KV at depth 4,000
#             (not in the default SECTIONS: about 4 minutes)
# Decode is timed in two shapes: after a 512-token prompt (--prompt 512, the
# KV cache 512-640 deep) and from an empty context (--prompt 1 --gen 128:
# llama-bench's tg128, which decodes 128 tokens from a cleared cache; the
# llama.cpp anchors in the issues are figures in that shape).
# Prints gpubw's bandwidth line, then per run bench's table and JSON line.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
B=${1:-$ROOT/build}
S=${2:-/tmp/engine-bench}
SECTIONS=${SECTIONS:-bf16 quant stream anchor}
on() { [[ " $SECTIONS " == *" $1 "* ]]; }
mkdir -p "$S"
"$B/gpubw"
for shape in llama-3.2-1b llama-3.1-8b; do
  [ -f "$S/$shape/config.json" ] || "$B/mkcheckpoint" --shape "$shape" --dtype bf16 "$S/$shape" >&2
  cat "$S/$shape"/*.safetensors >/dev/null # page cache: load time is not what is measured
done
run() { echo "== bench $*"; "$B/bench" "$@"; }
for shape in llama-3.2-1b llama-3.1-8b; do
  on bf16 && run "$S/$shape" --device cuda --prompt 512 --gen 128 --reps 5
  for q in nf4 int8; do on quant && run "$S/$shape" --device cuda --prompt 512 --gen 128 --reps 3 --quant $q; done
done
if on quant; then
  for shape in llama-3.2-1b llama-3.1-8b; do
    [ -f "$S/$shape-nf4-dq/config.json" ] || "$B/quantize" "$S/$shape" "$S/$shape-nf4-dq" --type nf4 --double-quant >&2
    for p in 512 1; do
      run "$S/$shape-nf4-dq" --device cuda --prompt $p --gen 128 --reps 3 --quant-head nf4-dq
      run "$S/$shape" --device cuda --prompt $p --gen 128 --reps 3 --quant int8 --quant-head int8
    done
  done
  run "$S/llama-3.2-1b" --device cuda --prompt 1 --gen 128 --reps 3 --quant nf4 --quant-head int8
fi
if on stream; then # streaming alone (--host-layers 0), then with the hosted layers the planner picks
  for h in 0 auto; do
    hl=(); [ "$h" = 0 ] && hl=(--host-layers 0)
    run "$S/llama-3.1-8b" --device cuda --prompt 512 --gen 64 --reps 2 --vram 8G "${hl[@]}"
    run "$S/llama-3.1-8b" --device cuda --prompt 512 --gen 64 --reps 2 --vram 6.5G --quant int8 "${hl[@]}"
  done
fi
if on long; then # issue 34's targets; the weights quantized while loading
  L=(--device cuda --quant nf4-dq --quant-head nf4-dq --reps 1)
  for kv in int8 fp8 f16; do run "$S/llama-3.1-8b" "${L[@]}" --vram 16G --kv $kv --prompt 32768 --gen 64; done
  run "$S/llama-3.1-8b" "${L[@]}" --vram 16G --kv int8 --prompt 122880 --gen 32
  run "$S/llama-3.1-8b" "${L[@]}" --vram 8G --kv int8 --prompt 32768 --gen 32
  run "$S/llama-3.1-8b" --device cuda --reps 2 --kv f16 --prompt 4000 --gen 128
fi
if on anchor; then
  for shape in llama-3.2-1b llama-3.1-8b; do
    echo "== anchor_transformers $shape"
    python3 "$ROOT/bench/anchor_transformers.py" "$S/$shape" --reps 2 || echo "anchor: failed (torch/transformers missing?)"
  done
fi
