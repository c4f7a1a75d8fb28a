#!/usr/bin/env bash
# test_cli.sh: the command-line tools end to end: greedy output of infer
# equals the transformers reference, --json and streaming output, sampling
# reproducibility, tokenize, the offload plan (--dry-run, --report, --gpu and
# the bandwidths it is priced with), a clean one-line error with a non-zero exit
# (never a signal) for every kind of bad input, and faults during a long
# generation (Ctrl-C, the weights file truncated).
# usage: test_cli.sh INFER TOKENIZE REPO_ROOT
set -u
INFER=$1 TOKENIZE=$2 ROOT=$3
MODEL=$ROOT/models/stories260K
REF=$ROOT/tests/data/reference/stories260K_reference.json
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fails=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }

# (defined first: the plan checks below use it too)
# expect_error NAME PATTERN CMD...: exit status in 1..2, stderr one line matching PATTERN.
expect_error() {
  local name=$1 pattern=$2
  shift 2
  # infer on the CPU: a CUDA build on a machine without a GPU would add its notice line.
  [ "$1" = "$INFER" ] && set -- "$@" --device cpu
  "$@" >"$T/out" 2>"$T/err"
  local rc=$?
  if [ $rc -eq 0 ] || [ $rc -ge 3 ]; then
    fail "$name: exit status $rc (want 1 or 2): $(head -c 300 "$T/err")"
  elif [ "$(wc -l <"$T/err")" -ne 1 ]; then
    fail "$name: stderr is not one line: $(cat "$T/err")"
  elif ! grep -Eq -- "$pattern" "$T/err"; then
    fail "$name: message '$(cat "$T/err")' does not match '$pattern'"
  fi
}

# --- greedy output equals the reference -------------------------------------
want=$(jq -c '.[0].greedy_ids[5:35]' "$REF")
out=$("$INFER" "$MODEL" --prompt "Once upon a time" -n 30 --json 2>"$T/err") || fail "infer --json exited $?: $(cat "$T/err")"
got=$(tail -n 1 <<<"$out" | jq -c '.generated_ids')
[ "$got" = "$want" ] || fail "greedy ids: got $got want $want"
[ "$(tail -n 1 <<<"$out" | jq -c '.prompt_ids')" = "$(jq -c '.[0].prompt_ids' "$REF")" ] || fail "prompt ids differ"
tail -n 1 <<<"$out" | jq -e '.timings.generated_tokens_per_second > 0 and .memory.kv_cache > 0' >/dev/null ||
  fail "--json lacks timings or memory"
# The generated text is the reference text after the prompt.
ref_text=$(jq -r '.[0].text' "$REF")
got_text=$(tail -n 1 <<<"$out" | jq -r '.text')
case "$ref_text" in "Once upon a time$got_text"*) ;; *) fail "generated text '$got_text' is not a continuation of the reference";; esac

# Same through --prompt-ids, and through a prompt file.
got=$("$INFER" "$MODEL" --prompt-ids 1,403,407,261,378 -n 30 --json 2>/dev/null | tail -n 1 | jq -c '.generated_ids')
[ "$got" = "$want" ] || fail "--prompt-ids greedy ids: got $got"
printf 'Once upon a time' >"$T/prompt.txt"
got=$("$INFER" "$MODEL" --file "$T/prompt.txt" -n 30 --json 2>/dev/null | tail -n 1 | jq -c '.generated_ids')
[ "$got" = "$want" ] || fail "--file greedy ids: got $got"

# Streaming mode prints the prompt and continuation, then a summary on stderr.
"$INFER" "$MODEL" --prompt "Once upon a time" -n 12 >"$T/out" 2>"$T/err" || fail "streaming infer exited $?"
grep -q "^Once upon a time, there was a little girl" "$T/out" || fail "streamed text: $(cat "$T/out")"
grep -q "tok/s" "$T/err" || fail "no summary line: $(cat "$T/err")"

# --device auto (the default): the GPU when there is one; a CUDA build without
# one says so in one line before the summary, and a CPU-only build says nothing.
"$INFER" "$MODEL" --prompt-ids 1,403 -n 2 >"$T/out" 2>"$T/err" || fail "infer --device auto exited $?"
notes=$(grep -vc "tok/s" "$T/err")
[ "$notes" -le 1 ] || fail "--device auto: more than one notice: $(cat "$T/err")"
[ "$notes" -eq 0 ] || grep -q "running on the CPU" "$T/err" || fail "--device auto: unexpected stderr: $(cat "$T/err")"

# Sampling: the same seed repeats, another seed (almost surely) differs.
s1=$("$INFER" "$MODEL" --prompt "Once" -n 40 --temp 1.0 --top-p 0.95 --seed 11 --json 2>/dev/null | tail -n 1 | jq -c .generated_ids)
s2=$("$INFER" "$MODEL" --prompt "Once" -n 40 --temp 1.0 --top-p 0.95 --seed 11 --json 2>/dev/null | tail -n 1 | jq -c .generated_ids)
s3=$("$INFER" "$MODEL" --prompt "Once" -n 40 --temp 1.0 --top-p 0.95 --seed 12 --json 2>/dev/null | tail -n 1 | jq -c .generated_ids)
[ -n "$s1" ] && [ "$s1" = "$s2" ] || fail "same seed gave $s1 and $s2"
[ "$s1" != "$s3" ] || fail "seeds 11 and 12 gave the same 40 tokens"

# tokenize prints the ids as a JSON array; --special adds BOS.
got=$("$TOKENIZE" "$MODEL" --text "Once upon a time" --special)
[ "$got" = "[1,403,407,261,378]" ] || fail "tokenize --special: $got"
got=$("$TOKENIZE" "$MODEL/tokenizer.json" --text "Once upon a time")
[ "$got" = "[403,407,261,378]" ] || fail "tokenize: $got"
got=$("$TOKENIZE" "$MODEL" --decode 1,403,407,261,378 --skip-special)
[ "$got" = "Once upon a time" ] || fail "tokenize --decode: $got"

# --- the offload plan: --dry-run (no device needed), --json, --report -------------
"$INFER" "$MODEL" --dry-run --vram 8G --ctx 64 >"$T/out" 2>"$T/err" || fail "--dry-run exited $?: $(cat "$T/err")"
[ ! -s "$T/err" ] || fail "--dry-run wrote to stderr: $(cat "$T/err")"
[ "$(grep -c '^  layer [0-4] ' "$T/out")" -eq 5 ] || fail "--dry-run: not one row per layer: $(cat "$T/out")"
grep -q '^  embeddings .*tied' "$T/out" && grep -q '^  output ' "$T/out" || fail "--dry-run: no embeddings/output rows"
grep -q '^all resident: .* of the 8.00 GiB budget' "$T/out" || fail "--dry-run: no verdict: $(tail -n 1 "$T/out")"
grep -q 'CUDA context' "$T/out" && grep -q 'decode bound' "$T/out" || fail "--dry-run: totals missing"
# JSON: one object; a layer of stories260K in f32 is q/k/v 128x64 + o 64x64 + gate/up 344x64 + down 64x172 + 2 norms.
"$INFER" "$MODEL" --dry-run --vram 8G --ctx 64 --json >"$T/plan.json" 2>"$T/err" || fail "--dry-run --json exited $?"
[ "$(wc -l <"$T/plan.json")" -eq 1 ] || fail "--dry-run --json is not one line"
jq -e '.fits == true and (.entries | length) == 7 and .n_ctx == 64 and .n_layers_streamed == 0
  and ([.entries[] | select(.part == "layer")] | length) == 5
  and .entries[1].weight_bytes == 181760 and .entries[1].format == "f32" and .entries[1].kv_bytes == 16384
  and .entries[1].placement == "resident" and .totals.kv_cache == 81920
  and .totals.device_total + .totals.free == .budget and .budget == 8589934592
  and .totals.cuda_context == 536870912 and (.options | length) == 5' "$T/plan.json" >/dev/null ||
  fail "--dry-run --json: $(head -c 600 "$T/plan.json")"
got=$("$INFER" "$MODEL" --dry-run --vram 8G --quant nf4 --json 2>/dev/null | jq -r '.entries[1].format, .entries[1].weight_bytes < 181760')
[ "$got" = "$(printf 'nf4\ntrue')" ] || fail "--dry-run --quant nf4: $got"
# Too small: one line with the minimum, exit 1; --json still prints the plan, marked as not fitting.
expect_error "--dry-run under the minimum" "needs at least 552.0 MiB .*budget is 540.0 MiB" "$INFER" "$MODEL" --dry-run --vram 540M
"$INFER" "$MODEL" --dry-run --vram 540M --json >"$T/out" 2>/dev/null && fail "--dry-run under the minimum exited 0"
jq -e '.fits == false and .totals.minimum == 578813952' "$T/out" >/dev/null || fail "refused --json: $(cat "$T/out")"
expect_error "--dry-run without --vram" "dry-run needs --vram" "$INFER" "$MODEL" --dry-run
expect_error "--dry-run with a bad --vram" "vram" "$INFER" "$MODEL" --dry-run --vram 8X
expect_error "--dry-run with --vram 0" "vram" "$INFER" "$MODEL" --dry-run --vram 0
expect_error "--dry-run of a missing model" "nonexistent" "$INFER" "$T/nonexistent" --dry-run --vram 8G
# --report prints the plan on stderr, then generates as usual; under the minimum it stops before loading.
out=$("$INFER" "$MODEL" --prompt-ids 1,403,407,261,378 -n 30 --json --report --vram 8G --device cpu 2>"$T/err") ||
  fail "--report exited $?"
[ "$(tail -n 1 <<<"$out" | jq -c '.generated_ids')" = "$want" ] || fail "--report changed the output"
grep -q '^all resident' "$T/err" && grep -q '^  layer 4 ' "$T/err" || fail "--report: no plan on stderr: $(cat "$T/err")"
expect_error "--report under the minimum" "needs at least" "$INFER" "$MODEL" --prompt hi --report --vram 100M

# --- experts placed one by one (--moe-cpu N: the first N expert layers' experts in host memory) ------------
# mixtral_f32: 2 expert layers of 8 experts, top-2. Whatever the budget holds, --moe-cpu 1 leaves layer 0's 8 on
# the host (the CPU runs a token's picks there) and layer 1's on the device; more than there are: all 16.
MOE=$ROOT/tests/data/models/mixtral_f32
"$INFER" "$MOE" --dry-run --vram 8G --ctx 64 --moe-cpu 1 >"$T/out" 2>"$T/err" ||
  fail "--moe-cpu 1 exited $?: $(cat "$T/err")"
grep -q 'experts dev/host' "$T/out" && grep -Eq '^  layer 0 .* resident .* 0/8 ' "$T/out" &&
  grep -Eq '^  layer 1 .* resident .* 8/0 ' "$T/out" || fail "--moe-cpu 1: the layers' experts: $(cat "$T/out")"
grep -q '^  experts: 2 layers of 8, 2 run a token: 8 on the device, 8 in host memory' "$T/out" ||
  fail "--moe-cpu 1: no experts line: $(grep experts "$T/out")"
grep -q '^keeps 8 of 16 experts resident, 8 in host memory: the GPU reads a token.s picks among them over PCIe' \
  "$T/out" || fail "--moe-cpu 1: summary: $(tail -n 1 "$T/out")"
# --moe-host: who runs decode's host experts (default auto: the GPU over PCIe, faster than this CPU).
"$INFER" "$MOE" --dry-run --vram 8G --ctx 64 --moe-cpu 1 --moe-host cpu >"$T/out" 2>"$T/err" ||
  fail "--moe-host cpu exited $?: $(cat "$T/err")"
grep -q '^keeps 8 of 16 experts resident, 8 in host memory: the CPU runs a token.s picks among them for decode' \
  "$T/out" || fail "--moe-host cpu: summary: $(tail -n 1 "$T/out")"
"$INFER" "$MOE" --dry-run --vram 8G --ctx 64 --moe-cpu 1 --moe-host cpu --json 2>/dev/null |
  jq -e '.totals.experts_host_gpu == false and .totals.host_per_token > 0' >/dev/null ||
  fail "--moe-host cpu --json: not the CPU's"
expect_error "--moe-host x" "bad value 'x' for --moe-host" "$INFER" "$MOE" --dry-run --vram 8G --moe-host x
# --expert-cache: its bytes kept out of the placement and shown in the plan.
"$INFER" "$MOE" --dry-run --vram 8G --ctx 64 --moe-cpu 1 --expert-cache 3M >"$T/out" 2>"$T/err" ||
  fail "--expert-cache 3M exited $?: $(cat "$T/err")"
grep -Eq '^  expert cache +3.0 MiB' "$T/out" || fail "--expert-cache: no line in the plan: $(grep -i cache "$T/out")"
got=$("$INFER" "$MOE" --dry-run --vram 8G --ctx 64 --moe-cpu 1 --expert-cache 3M --json 2>/dev/null | jq '.totals.expert_cache')
[ "$got" = "3145728" ] || fail "--expert-cache --json: $got"
expect_error "--expert-cache x" "bad value 'x' for --expert-cache" "$INFER" "$MOE" --dry-run --vram 8G --expert-cache x
# --report counts the router's picks: qwen3moe_f32 has expert layers 1 and 3 (16 experts, 4 a token); 5 prompt
# tokens and 5 decoded ones (the sixth generated id is never evaluated) make 40 picks in each.
Q3M=$ROOT/tests/data/models/qwen3moe_f32
"$INFER" "$Q3M" --device cpu --prompt-ids 1,2,3,4,5 -n 6 --report >/dev/null 2>"$T/err" || fail "--report on qwen3moe_f32 exited $?"
grep -q '^expert picks (4 of 16 experts a token)' "$T/err" && grep -Eq '^  layer 1 +40 ' "$T/err" &&
  grep -Eq '^  layer 3 +40 ' "$T/err" && ! grep -Eq '^  layer [02] ' "$T/err" ||
  fail "--report: expert picks: $(grep -A3 'expert picks' "$T/err")"
"$INFER" "$MOE" --dry-run --vram 8G --ctx 64 --moe-cpu 1 --json 2>/dev/null |
  jq -e '.fits and .totals.n_experts_resident == 8 and .totals.n_experts_host == 8 and .totals.host_per_token == 0
    and .totals.experts_host_gpu and .totals.streamed_per_token > 0
    and .entries[1].n_experts == 8 and .entries[1].experts_resident == 0 and .entries[2].experts_resident == 8
    and .entries[1].expert_bytes == 36864 and .entries[0].n_experts == 0 and .totals.stream_buffers > 0' \
  >/dev/null || fail "--moe-cpu 1 --json: $(head -c 900 "$T/out")"
got=$("$INFER" "$MOE" --dry-run --vram 8G --ctx 64 --moe-cpu 99 --json 2>/dev/null |
  jq -c '[.totals.n_experts_resident, .totals.n_experts_host, .n_layers_streamed]')
[ "$got" = "[0,16,0]" ] || fail "--moe-cpu 99: $got"
got=$("$INFER" "$MOE" --dry-run --vram 8G --ctx 64 --json 2>/dev/null | jq -c '[.totals.n_experts_resident, .totals.n_experts_host]')
[ "$got" = "[16,0]" ] || fail "--dry-run of an MoE model without --moe-cpu: $got"
# A dense model has no experts: the option changes nothing.
"$INFER" "$MODEL" --dry-run --vram 8G --ctx 64 >"$T/dense" 2>/dev/null
"$INFER" "$MODEL" --dry-run --vram 8G --ctx 64 --moe-cpu 3 >"$T/out" 2>/dev/null || fail "--moe-cpu on a dense model exited $?"
cmp -s "$T/dense" "$T/out" || fail "--moe-cpu changed a dense model's plan: $(diff "$T/dense" "$T/out" | head -5)"
expect_error "--moe-cpu -1" "bad value '-1' for --moe-cpu" "$INFER" "$MOE" --dry-run --vram 8G --moe-cpu -1
expect_error "--moe-cpu x" "bad value 'x' for --moe-cpu" "$INFER" "$MOE" --dry-run --vram 8G --moe-cpu x
# (through env: expect_error would append --device cpu, which would be taken as the value)
expect_error "--moe-cpu without a value" "--moe-cpu needs a value" env "$INFER" "$MOE" --dry-run --vram 8G --moe-cpu

# --- the plan priced for a known card (--gpu), measured figures, overrides --------
"$INFER" --gpu list >"$T/out" 2>"$T/err" || fail "--gpu list exited $?: $(cat "$T/err")"
[ ! -s "$T/err" ] || fail "--gpu list wrote to stderr: $(cat "$T/err")"
grep -Eq '^RTX 4090 +24 GiB +1008 .* 4\.0 x16 +26\.8 +8\.9 ' "$T/out" || fail "--gpu list: no RTX 4090 row: $(cat "$T/out")"
grep -Eq '^RTX 4060 +8 GiB +272 .* 4\.0 x8 +13\.4 ' "$T/out" || fail "--gpu list: the 4060 is not PCIe 4.0 x8"
[ "$(grep -c ' GiB ' "$T/out")" -ge 23 ] || fail "--gpu list: fewer than 23 cards"
"$INFER" --gpu list --json | jq -e 'length >= 23 and (.[] | select(.name == "RTX 5060 Ti 16G")
  | .pcie_gen == 5 and .pcie_lanes == 8 and .mem_gbps == 448)' >/dev/null || fail "--gpu list --json"
# --dry-run --gpu: the card's memory less 512 MiB is the budget, its figures price the plan (4060: 272 x 0.90,
# PCIe 4.0 x8 = 8 x 1.969 x 0.85 GB/s), and the plan says so.
"$INFER" "$MODEL" --dry-run --gpu "rtx 4060" --ctx 64 >"$T/out" 2>"$T/err" || fail "--dry-run --gpu exited $?: $(cat "$T/err")"
grep -q "^budget: the RTX 4060's 8 GiB less the 512 MiB" "$T/out" || fail "--dry-run --gpu: no budget line: $(head -n 2 "$T/out")"
grep -q '^plan for .*(GPU: RTX 4060): .*budget 7.50 GiB' "$T/out" || fail "--dry-run --gpu: header: $(cat "$T/out")"
grep -q 'device memory 244.8 GB/s (from the table: RTX 4060), host to device 13.4 GB/s (from the table: RTX 4060)' \
  "$T/out" || fail "--dry-run --gpu: sources: $(grep bandwidths "$T/out")"
"$INFER" "$MODEL" --dry-run --gpu 4060 --ctx 64 --json >"$T/plan.json" 2>"$T/err" || fail "--dry-run --gpu --json exited $?"
jq -e '.budget == 8053063680 and .totals.hbm_gbps == 244.8 and .totals.pcie_gbps == 13.39
  and .totals.hbm_source == "table" and .totals.pcie_source == "table" and .totals.gpu == "RTX 4060"
  and ((.totals.tokens_per_second - 244.8e9 / .totals.read_per_token) | fabs) < 0.01 * .totals.tokens_per_second' \
  "$T/plan.json" >/dev/null || fail "--dry-run --gpu --json: $(head -c 900 "$T/plan.json")"
# The command line wins over the table, each figure on its own.
"$INFER" "$MODEL" --dry-run --gpu 4060 --gpu-bandwidth 500 --ctx 64 --json 2>/dev/null |
  jq -e '.totals.hbm_gbps == 500 and .totals.hbm_source == "given" and .totals.pcie_source == "table"
    and .totals.pcie_gbps == 13.39' >/dev/null || fail "--gpu-bandwidth over --gpu"
"$INFER" "$MODEL" --dry-run --gpu 4060 --vram 2G --pcie-bandwidth 20 --gpu-bandwidth 123.5 --ctx 64 >"$T/out" 2>/dev/null ||
  fail "--dry-run with both overrides exited $?"
grep -q 'budget 2.00 GiB' "$T/out" && ! grep -q '^budget:' "$T/out" || fail "--vram over --gpu's memory: $(head -n 2 "$T/out")"
grep -q 'device memory 123.5 GB/s (given on the command line), host to device 20.0 GB/s (given on the command line)' \
  "$T/out" || fail "overrides: $(grep bandwidths "$T/out")"
# No card named: this machine's device measured (ENGINE_MEASURED_GBPS stands in for a GPU here), else the default.
ENGINE_MEASURED_GBPS=900,25 "$INFER" "$MODEL" --dry-run --vram 8G --ctx 64 >"$T/out" 2>"$T/err" ||
  fail "--dry-run measured exited $?: $(cat "$T/err")"
grep -q 'device memory 900.0 GB/s (measured on this device), host to device 25.0 GB/s (measured on this device)' \
  "$T/out" || fail "--dry-run measured: $(grep bandwidths "$T/out")"
"$INFER" "$MODEL" --dry-run --vram 8G --ctx 64 --device cpu >"$T/out" 2>/dev/null
grep -q 'device memory 3000.0 GB/s (the built-in default, an H100.s), host to device 54.7 GB/s (the built-in default' \
  "$T/out" || fail "--dry-run --device cpu: $(grep bandwidths "$T/out")"
"$INFER" "$MODEL" --dry-run --vram 8G --ctx 64 >"$T/out" 2>/dev/null
grep -Eq 'bandwidths: device memory .* \((measured on this device|the built-in default, an H100.s)\)' "$T/out" ||
  fail "--dry-run: $(grep bandwidths "$T/out")"
# --report names the figures' source too (on the CPU: the plan for --vram).
"$INFER" "$MODEL" --prompt-ids 1,403 -n 2 --report --vram 8G --device cpu --gpu-bandwidth 700 >/dev/null 2>"$T/err" ||
  fail "--report --gpu-bandwidth exited $?"
grep -q 'device memory 700.0 GB/s (given on the command line)' "$T/err" || fail "--report sources: $(cat "$T/err")"
# Refusals: one line, non-zero exit.
expect_error "--gpu unknown" "unknown GPU '4095'.*RTX 4090" "$INFER" "$MODEL" --dry-run --gpu 4095
expect_error "--gpu ambiguous" "ambiguous.*A100 40GB PCIe.*A100 80GB PCIe.*A100 80GB SXM" "$INFER" "$MODEL" --dry-run --gpu a100
expect_error "--gpu without --dry-run" "gpu.*--dry-run" "$INFER" "$MODEL" --prompt hi --gpu 4090
expect_error "--dry-run --gpu under the minimum" "needs at least 552.0 MiB .*budget is 540.0 MiB.* on the RTX 4060" \
  "$INFER" "$MODEL" --dry-run --gpu 4060 --vram 540M
for bad in 0 -5 abc 1e400 nan inf 12x ''; do
  expect_error "--gpu-bandwidth '$bad'" "bad value .* for --gpu-bandwidth" "$INFER" "$MODEL" --dry-run --gpu 4090 --gpu-bandwidth "$bad"
  expect_error "--pcie-bandwidth '$bad'" "bad value .* for --pcie-bandwidth" "$INFER" "$MODEL" --dry-run --vram 8G --pcie-bandwidth "$bad"
done

# --- the KV cache type, --ctx max and --batch (issue 34) -------------------------------
# stories260K: 5 layers, 4 kv heads of 8: a token of f32 KV is 2 x 5 x 4 x 8 x 4 = 1280 bytes, of f16/bf16
# 640, of int8/fp8 2 x 5 x 4 x (8 + 4) = 480 (a byte an element and an fp32 scale a row). max_position is 512.
"$INFER" "$MODEL" --dry-run --vram 8G --ctx max --json >"$T/plan.json" 2>"$T/err" || fail "--ctx max exited $?: $(cat "$T/err")"
jq -e '.n_ctx == 512 and .totals.kv_type == "f32" and .totals.kv_auto == true and .totals.kv_bytes_per_token == 1280
  and .totals.kv_cache == 512 * 1280 and .totals.n_batch == 512
  and .totals.max_ctx_by_kv == {"f32": 512, "f16": 512, "bf16": 512, "int8": 512, "fp8": 512}
  and .totals.full_ctx_tokens_per_second > 0 and .totals.full_ctx_tokens_per_second < .totals.tokens_per_second' \
  "$T/plan.json" >/dev/null || fail "--ctx max --json: $(head -c 900 "$T/plan.json")"
for kv in f32:1280 f16:640 bf16:640 int8:480 fp8:480; do
  "$INFER" "$MODEL" --dry-run --vram 8G --ctx 64 --kv "${kv%:*}" --json 2>/dev/null | jq -e --arg t "${kv%:*}" \
    --argjson b "${kv#*:}" '.totals.kv_type == $t and .totals.kv_auto == false and .totals.kv_bytes_per_token == $b
      and .totals.kv_cache == 64 * $b and .entries[1].kv_bytes == 64 * $b / 5' >/dev/null || fail "--dry-run --kv $kv"
done
"$INFER" "$MODEL" --dry-run --vram 8G --ctx 64 --kv int8 --batch 16 >"$T/out" 2>"$T/err" || fail "--kv int8 --batch exited $?"
grep -q '^  KV cache  *30.0 KiB  (int8: 6.0 KiB a layer; a token takes 480 B, 96 B a layer)' "$T/out" &&
  grep -Eq '^  at full context \(64 tokens\): .* and the whole 30.0 KiB KV cache read per token, decode bound [0-9.]+ tok/s' \
    "$T/out" && grep -q '^  longest context in this budget: 512 tokens with f32 KV, 512 with f16 or bf16, 512 with int8' \
    "$T/out" && grep -q 'int8 KV cache, decode bound .* with all 64 tokens in it' "$T/out" ||
  fail "--dry-run --kv int8: $(grep -E 'KV|full|longest|^all' "$T/out")"
grep -q '(f32, chosen by --kv auto:' <("$INFER" "$MODEL" --dry-run --vram 8G --ctx 64 2>/dev/null) || fail "--kv auto not reported"
"$INFER" "$MODEL" --dry-run --vram 8G --ctx 64 --batch 16 --json 2>/dev/null | jq -e '.totals.n_batch == 16' >/dev/null ||
  fail "--dry-run --batch 16"
# Sliding-window layers keep a ring of window + n_batch + 1 positions: mistral_sharded (2 layers, window 8, 2 kv
# heads of 16, f32: 256 B a layer and position) at --batch 4 keeps 13 of its 256; at the default 512 a pass, no ring.
MISTRAL=$ROOT/tests/data/models/mistral_sharded
"$INFER" "$MISTRAL" --dry-run --vram 8G --batch 4 --json 2>/dev/null | jq -e '.totals.kv_ring_rows == 13
  and .totals.kv_window_layers == 2 and .totals.kv_cache == 2 * 13 * 256 and .totals.kv_bytes_per_token == 512
  and ([.entries[] | select(.part == "layer") | .kv_bytes] == [3328, 3328])' >/dev/null || fail "--dry-run ring"
"$INFER" "$MISTRAL" --dry-run --vram 8G --json 2>/dev/null | jq -e '.totals.kv_ring_rows == 0
  and .totals.kv_window_layers == 0 and .totals.kv_cache == 256 * 512' >/dev/null || fail "--dry-run without a ring"
grep -q '^  KV cache  *6.5 KiB  (f32, chosen by --kv auto: a token takes 512 B, 256 B a layer; 2 window layers, a ring of 13 positions, 3.2 KiB each)' \
  <("$INFER" "$MISTRAL" --dry-run --vram 8G --batch 4 2>/dev/null) || fail "--dry-run: the ring's KV line"
# Nothing fits at all: the refusal says so for every type.
expect_error "--dry-run refused, per KV type" "needs at least .*int8 KV cache .*no context fits with any KV type" \
  "$INFER" "$MODEL" --dry-run --vram 540M
# Runs: --ctx max is the model's maximum; --batch does not change greedy output; --kv is accepted.
out=$("$INFER" "$MODEL" --prompt-ids 1,403,407,261,378 -n 30 --ctx max --batch 2 --json --device cpu 2>"$T/err") ||
  fail "--ctx max --batch 2 exited $?: $(cat "$T/err")"
[ "$(tail -n 1 <<<"$out" | jq -c '.generated_ids')" = "$want" ] || fail "--ctx max --batch 2 changed the output"
for kv in int8 fp8 bf16; do
  "$INFER" "$MODEL" --prompt-ids 1,403 -n 8 --kv $kv --json --device cpu 2>"$T/err" | tail -n 1 |
    jq -e '.generated_ids | length == 8' >/dev/null || fail "--kv $kv run: $(cat "$T/err")"
done
for bad in q8 INT8 '' auto8; do
  expect_error "--kv '$bad'" "bad value '$bad' for --kv \(auto, f32, f16, bf16, int8 or fp8\)" "$INFER" "$MODEL" --kv "$bad"
done
for bad in maxx -1 0 '' 1.5; do
  expect_error "--ctx '$bad'" "bad value '$bad' for --ctx" "$INFER" "$MODEL" --ctx "$bad"
done
for bad in 0 -3 x ''; do
  expect_error "--batch '$bad'" "bad value '$bad' for --batch" "$INFER" "$MODEL" --batch "$bad"
done
# (expect_error appends --device cpu to infer's arguments, which would become the value)
"$INFER" "$MODEL" --device cpu --kv >/dev/null 2>"$T/err" && fail "--kv without a value exited 0"
[ "$(cat "$T/err")" = "infer: --kv needs a value (see infer --help)" ] || fail "--kv without a value: $(cat "$T/err")"

# --- bad input: one line on stderr naming the problem, exit 1 or 2, no signal --

# A folder with stories260K's config and tokenizer and a weights file we craft.
mkmodel() { # mkmodel NAME -> prints the folder
  local d=$T/$1
  mkdir -p "$d"
  cp "$MODEL/config.json" "$MODEL/tokenizer.json" "$MODEL/tokenizer_config.json" "$d/"
  echo "$d"
}
# le64 N: 8 little-endian bytes
le64() {
  local n=$1 i
  for i in 0 1 2 3 4 5 6 7; do printf "\\x$(printf %02x $(((n >> (8 * i)) & 255)))"; done
}
# st_file PATH HEADER_JSON DATA_BYTES
st_file() {
  { le64 ${#2}; printf '%s' "$2"; head -c "$3" /dev/zero; } >"$1"
}

d=$(mkmodel empty); : >"$d/model.safetensors"
expect_error "empty file" "model.safetensors" "$INFER" "$d" --prompt hi
d=$(mkmodel truncated); head -c 100000 "$MODEL/model.safetensors" >"$d/model.safetensors"
expect_error "truncated file" "model.safetensors" "$INFER" "$d" --prompt hi
d=$(mkmodel hdrlen); { le64 999999; printf '{}'; } >"$d/model.safetensors"
expect_error "header length beyond file" "model.safetensors.*header" "$INFER" "$d" --prompt hi
d=$(mkmodel badjson); st_file "$d/model.safetensors" '{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]' 8
expect_error "invalid header JSON" "model.safetensors" "$INFER" "$d" --prompt hi
d=$(mkmodel dtype); st_file "$d/model.safetensors" '{"a": {"dtype": "Q9", "shape": [2], "data_offsets": [0, 8]}}' 8
expect_error "unknown dtype" "Q9" "$INFER" "$d" --prompt hi
d=$(mkmodel offsets); st_file "$d/model.safetensors" '{"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}' 8
expect_error "offsets not matching shape" "model.safetensors" "$INFER" "$d" --prompt hi
d=$(mkmodel outside); st_file "$d/model.safetensors" '{"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}' 8
expect_error "offsets outside the data" "model.safetensors" "$INFER" "$d" --prompt hi
d=$(mkmodel missing_tensor); st_file "$d/model.safetensors" '{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}' 8
expect_error "missing tensor" "model.embed_tokens.weight.*missing" "$INFER" "$d" --prompt hi

d=$(mkmodel cfgjson); cp "$MODEL/model.safetensors" "$d/"; printf '{"architectures": [' >"$d/config.json"
expect_error "invalid config JSON" "config.json" "$INFER" "$d" --prompt hi
d=$(mkmodel heads); cp "$MODEL/model.safetensors" "$d/"
sed -i 's/"head_dim": 8,//; s/"num_attention_heads": 8/"num_attention_heads": 7/' "$d/config.json"
expect_error "heads not dividing width" "config.json.*(divisible|divide)" "$INFER" "$d" --prompt hi
d=$(mkmodel arch); cp "$MODEL/model.safetensors" "$d/"; sed -i 's/LlamaForCausalLM/GPTNeoXForCausalLM/' "$d/config.json"
expect_error "unknown architecture" "GPTNeoXForCausalLM.*LlamaForCausalLM" "$INFER" "$d" --prompt hi
d=$(mkmodel layers); cp "$MODEL/model.safetensors" "$d/"; sed -i 's/"num_hidden_layers": 5/"num_hidden_layers": 6/' "$d/config.json"
expect_error "tensor missing for a layer" "model.layers.5.*missing" "$INFER" "$d" --prompt hi
d=$(mkmodel shape); cp "$MODEL/model.safetensors" "$d/"; sed -i 's/"intermediate_size": 172/"intermediate_size": 170/' "$d/config.json"
expect_error "tensor shape not matching config" "mlp.*shape" "$INFER" "$d" --prompt hi
d=$(mkmodel noconfig); cp "$MODEL/model.safetensors" "$d/"; rm "$d/config.json"
expect_error "missing config.json" "config.json" "$INFER" "$d" --prompt hi
d=$T/notok; mkdir -p "$d"; cp "$MODEL/model.safetensors" "$MODEL/config.json" "$d/"
expect_error "text prompt without a tokenizer" "tokenizer" "$INFER" "$d" --prompt hi
"$INFER" "$d" --prompt-ids 1,403 -n 3 --json >/dev/null 2>&1 || fail "ids prompt without a tokenizer should work"
d=$(mkmodel badtok); cp "$MODEL/model.safetensors" "$d/"; printf '{"model": ' >"$d/tokenizer.json"
expect_error "invalid tokenizer.json" "tokenizer.json" "$INFER" "$d" --prompt hi
expect_error "no such model" "nonexistent" "$INFER" "$T/nonexistent" --prompt hi
expect_error "prompt longer than the context" "context" "$INFER" "$MODEL" --prompt "Once upon a time there was" --ctx 4
expect_error "prompt id outside the vocabulary" "vocabulary" "$INFER" "$MODEL" --prompt-ids 1,600
expect_error "unknown option" "unknown option" "$INFER" "$MODEL" --bogus
expect_error "bad number" "-n" "$INFER" "$MODEL" -n abc
expect_error "bad top-p" "top-p" "$INFER" "$MODEL" --top-p 1.5
expect_error "bad --vram unit" "vram" "$INFER" "$MODEL" --vram 8Q
expect_error "zero --vram" "vram" "$INFER" "$MODEL" --vram 0
expect_error "negative --vram" "vram" "$INFER" "$MODEL" --vram -2G
expect_error "tokenize of a missing file" "nonexistent" "$TOKENIZE" "$T/nonexistent.json" --text hi

# --- faults during a long generation ----------------------------------------
# start_long NAME MODEL: greedy generation that would run for minutes (stories260K
# never says EOS greedily), in the background; returns once past the prompt,
# i.e. once infer's SIGINT handler is in place. Sets $pid.
start_long() {
  "$INFER" "$2" --prompt "Once upon a time" -n 20000 --ctx 20000 --device cpu --threads 1 \
    >"$T/$1.out" 2>"$T/$1.err" &
  pid=$!
  for _ in $(seq 400); do
    [ "$(wc -c <"$T/$1.out")" -gt 60 ] && return 0
    kill -0 $pid 2>/dev/null || return 1
    sleep 0.05
  done
  return 1
}
finish_long() { # waits up to 20 s, then kills; sets $rc
  for _ in $(seq 400); do
    kill -0 $pid 2>/dev/null || break
    sleep 0.05
  done
  kill -KILL $pid 2>/dev/null
  wait $pid
  rc=$?
}

# Ctrl-C stops generation cleanly: exit 130, the summary still printed, even
# when a second SIGINT follows at once (it used to find the handler reset).
if start_long sigint "$MODEL"; then
  kill -INT $pid
  kill -INT $pid
  finish_long
  [ $rc -eq 130 ] || fail "SIGINT: exit status $rc (want 130): $(cat "$T/sigint.err")"
  grep -q "stop: interrupted" "$T/sigint.err" || fail "SIGINT: no summary: $(cat "$T/sigint.err")"
else
  fail "SIGINT: infer did not start generating: $(cat "$T/sigint.err")"
fi

# The weights file truncated under a running generation: one line naming the file, exit 1, no SIGBUS.
d=$(mkmodel shrink); cp "$MODEL/model.safetensors" "$d/"
if start_long shrink "$d"; then
  truncate -s 4096 "$d/model.safetensors"
  finish_long
  [ $rc -eq 1 ] || fail "truncated while generating: exit status $rc (want 1): $(cat "$T/shrink.err")"
  [ "$(wc -l <"$T/shrink.err")" -eq 1 ] && grep -q "model.safetensors.*truncated" "$T/shrink.err" ||
    fail "truncated while generating: stderr: $(cat "$T/shrink.err")"
else
  fail "truncation: infer did not start generating: $(cat "$T/shrink.err")"
fi

if [ $fails -ne 0 ]; then
  echo "test_cli: $fails failure(s)" >&2
  exit 1
fi
echo "test_cli: all checks passed"
