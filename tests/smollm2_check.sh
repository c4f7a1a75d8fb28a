#!/usr/bin/env bash
# smollm2_check.sh: the end-to-end chat check of issue 32 on a real instruct
# model. `infer MODEL --messages tests/data/smollm2/messages.json` on the CPU
# (the chat template rendered by the engine, tokenized, generated greedily)
# must give the reply ids of tests/data/smollm2/reference.json, which
# tests/fixtures/smollm2_reference.py computed in float64 from the same
# weights (the ChatML render that transformers makes, Hugging Face
# tokenizers, an independent numpy forward pass).
#   tests/smollm2_check.sh INFER MODEL_DIR
# MODEL_DIR: SmolLM2-135M-Instruct converted as ../shared/models/smollm2-135m-instruct/README.md
# says (not in the repository: 257 MiB); without it (or ENGINE_SMOLLM2_DIR) the check is skipped (77).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
INFER=${1:?infer binary}
M=${2:-${ENGINE_SMOLLM2_DIR:-}}
if [ -z "$M" ] || [ ! -f "$M/model.safetensors" ]; then
  echo "smollm2_check: SKIP: no SmolLM2-135M-Instruct weights (set ENGINE_SMOLLM2_DIR)"
  exit 77
fi
D=$ROOT/tests/data/smollm2
n=$(jq '.reply_ids | length' "$D/reference.json")
got=$("$INFER" "$M" --messages "$D/messages.json" -n "$n" --temp 0 --device cpu --json 2>/dev/null | tail -1)
want_prompt=$(jq -c '.prompt_ids' "$D/reference.json")
want=$(jq -c '.reply_ids' "$D/reference.json")
have_prompt=$(echo "$got" | jq -c '.prompt_ids')
have=$(echo "$got" | jq -c '.generated_ids')
[ "$have_prompt" = "$want_prompt" ] || { echo "smollm2_check: prompt ids differ: $have_prompt, want $want_prompt"; exit 1; }
[ "$have" = "$want" ] || { echo "smollm2_check: reply ids differ: $have, want $want"; exit 1; }
echo "smollm2_check: $n reply ids equal to the float64 reference"
