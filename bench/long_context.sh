#!/usr/bin/env bash
# long_context.sh: issue 34's figures in one run on one GPU: decode
# attention alone at several depths (attn_decode: the staged kernel and the
# streaming one of long contexts), prefill attention alone on the last
# 512-token chunk of a 32,768-token prompt (attn_prefill), then the 8B shape in nf4-dq with a
# 32,768-token prompt for each KV type at --vram 16G, the same with int8 at
# --vram 8G, bf16 with an f16 cache at depth 4,000 (below the streaming
# kernel's switch), and a 122,880-token prompt (depth 120k).
#   bench/long_context.sh [BIN_DIR] [SCRATCH_DIR]   (BIN_DIR holds bench, mkcheckpoint,
#                                                    attn_decode, attn_prefill; SCRATCH_DIR needs ~17 GB free)
# DEEP=0 skips the 120k run (a minute of prefill). bench prints a JSON line
# per run; its bytes_per_token over the HBM rate (gpubw) is the decode bound.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
B=${1:-$ROOT/build}
S=${2:-/tmp/engine-bench}
mkdir -p "$S"
M=$S/llama-3.1-8b
[ -f "$M/config.json" ] || "$B/mkcheckpoint" --shape llama-3.1-8b --dtype bf16 "$M" >&2
cat "$M"/*.safetensors >/dev/null # page cache: load time is not what is measured
for depth in 2048 4096 8192 32768; do
  echo "== attn_decode --depth $depth"
  "$B/attn_decode" --depth "$depth" --reps 20 --splits 16,32
done
echo "== attn_prefill"
"$B/attn_prefill"
run() { echo "== bench $*"; "$B/bench" "$M" --device cuda "$@" | grep -E '^\{'; }
Q=(--quant nf4-dq --quant-head nf4-dq --reps 1)
for kv in int8 fp8 f16; do run "${Q[@]}" --vram 16G --kv "$kv" --prompt 32768 --gen 64; done
run "${Q[@]}" --vram 8G --kv int8 --prompt 32768 --gen 32
run --reps 2 --kv f16 --prompt 4000 --gen 128
[ "${DEEP:-1}" = 0 ] || run "${Q[@]}" --vram 16G --kv int8 --prompt 122880 --gen 32
