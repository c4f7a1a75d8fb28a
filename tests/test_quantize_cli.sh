#!/usr/bin/env bash
# test_quantize_cli.sh: tools/quantize end to end: a good run (sizes,
# statistics, copied files, the result maps and runs in infer and gives
# the same tokens as quantizing while loading), --skip and sharding, bad
# arguments and bad input files (one-line error, exit status 1 or 2, never
# a signal), and that a failed run leaves neither OUT nor its temporary
# folder behind (a failed write past a file-size limit included) and
# never touches an existing OUT.
# infer runs with --device cpu, so the test holds on GPU machines too.
# usage: test_quantize_cli.sh QUANTIZE INFER REPO_ROOT [DISK_FULL_PRELOAD]
set -u
QUANTIZE=$1 INFER=$2 ROOT=$3 DISK_FULL=${4:-}
MODEL=$ROOT/models/stories260K
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fails=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }

# One line on stderr, the given exit status, nothing left behind.
expect_error() { # status out-folder args...
  local want=$1 out=$2
  shift 2
  "$QUANTIZE" "$@" >"$T/o" 2>"$T/e"
  local rc=$?
  [ "$rc" -eq "$want" ] || fail "quantize $* exited $rc, want $want: $(cat "$T/e")"
  [ "$(wc -l <"$T/e")" -ge 1 ] || fail "quantize $*: no message"
  grep -q "^quantize: " "$T/e" || fail "quantize $*: message lacks the tool name: $(head -1 "$T/e")"
  [ -e "$out" ] && fail "quantize $*: left $out behind"
  ls -d "$out".tmp-* >/dev/null 2>&1 && fail "quantize $*: left a temporary folder behind"
  return 0
}

# --- a good run ----------------------------------------------------------------
"$QUANTIZE" "$MODEL" "$T/nf4" --type nf4 --double-quant >"$T/o" 2>"$T/e" || fail "quantize exited $?: $(cat "$T/e")"
grep -q "35 of 47 tensors quantized" "$T/o" || fail "summary: $(cat "$T/o")"
grep -q "MiB -> .* MiB" "$T/o" || fail "no sizes in the summary: $(cat "$T/o")"
grep -q "model.layers.0.mlp.up_proj.weight .* rel rms err 0\.[0-9]" "$T/e" || fail "no per-tensor statistics: $(head -3 "$T/e")"
grep -q "model.embed_tokens.weight .* kept" "$T/e" || fail "embeddings were not kept"
for f in config.json generation_config.json tokenizer.json tokenizer_config.json model.safetensors; do
  [ -f "$T/nf4/$f" ] || fail "output lacks $f"
done
cmp -s "$MODEL/config.json" "$T/nf4/config.json" || fail "config.json was not copied as is"
ls -d "$T"/nf4.tmp-* >/dev/null 2>&1 && fail "a temporary folder is left after success"
[ "$(stat -c %s "$T/nf4/model.safetensors")" -lt "$(stat -c %s "$MODEL/model.safetensors")" ] || fail "output is not smaller"

# infer maps the result; its tokens equal those of quantizing while loading.
a=$("$INFER" "$T/nf4" --device cpu --prompt "Once upon a time" -n 30 --json 2>"$T/e" | tail -n 1) || fail "infer on the output: $(cat "$T/e")"
b=$("$INFER" "$MODEL" --device cpu --quant nf4-dq --prompt "Once upon a time" -n 30 --json 2>/dev/null | tail -n 1)
[ -n "$a" ] && [ "$(jq -c .generated_ids <<<"$a")" = "$(jq -c .generated_ids <<<"$b")" ] ||
  fail "file and on-load nf4-dq differ: $(jq -c .generated_ids <<<"$a") vs $(jq -c .generated_ids <<<"$b")"
jq -e '.memory.weights_mapped > 0' <<<"$a" >/dev/null || fail "weights are not reported as mapped"

# --skip keeps matching tensors; a small --shard-size gives shards and an index.
"$QUANTIZE" "$MODEL" "$T/int8" --type int8 --skip 'model.layers.0.*' --shard-size 100K -q >"$T/o" 2>"$T/e" ||
  fail "quantize --skip exited $?: $(cat "$T/e")"
grep -q "28 of 47 tensors quantized" "$T/o" || fail "--skip: $(cat "$T/o")"
[ -f "$T/int8/model.safetensors.index.json" ] || fail "no index for a sharded output"
[ "$(ls "$T"/int8/model-*-of-*.safetensors | wc -l)" -gt 1 ] || fail "--shard-size 100K gave one shard"
[ -s "$T/e" ] && fail "--quiet still printed: $(head -1 "$T/e")"
"$INFER" "$T/int8" --device cpu --prompt "Once upon a time" -n 8 >/dev/null 2>"$T/e" || fail "infer on sharded int8: $(cat "$T/e")"

# --quant-head: the tied table stays, a quantized lm_head joins it; the
# tokens equal those of quantizing the head while loading.
"$QUANTIZE" "$MODEL" "$T/head" --type nf4 --quant-head int8 >"$T/o" 2>"$T/e" || fail "quantize --quant-head exited $?: $(cat "$T/e")"
grep -q "36 of 47 tensors quantized (nf4, the head int8)" "$T/o" || fail "--quant-head: $(cat "$T/o")"
grep -q "lm_head.weight (quantized from the tied model.embed_tokens.weight" "$T/e" || fail "--quant-head: $(grep lm_head "$T/e")"
a=$("$INFER" "$T/head" --device cpu --prompt "Once upon a time" -n 30 --json 2>"$T/e" | tail -n 1) || fail "infer on the head file: $(cat "$T/e")"
b=$("$INFER" "$MODEL" --device cpu --quant nf4 --quant-head int8 --prompt "Once upon a time" -n 30 --json 2>/dev/null | tail -n 1)
[ -n "$a" ] && [ "$(jq -c .generated_ids <<<"$a")" = "$(jq -c .generated_ids <<<"$b")" ] ||
  fail "file and on-load int8 head differ: $(jq -c .generated_ids <<<"$a") vs $(jq -c .generated_ids <<<"$b")"
expect_error 2 "$T/bad" "$MODEL" "$T/bad" --type nf4 --quant-head int3

# --- corrupted quantized files: infer fails with one line naming the file ------
corrupt() { # what perl-substitution expected-message
  rm -rf "$T/c"
  cp -r "$T/nf4" "$T/c"
  perl -0777 -pi -e "$2" "$T/c/model.safetensors"
  cmp -s "$T/nf4/model.safetensors" "$T/c/model.safetensors" && fail "corrupt $1: the edit did not apply"
  "$INFER" "$T/c" --device cpu --prompt-ids 1,2 -n 1 >/dev/null 2>"$T/e"
  local rc=$?
  [ "$rc" -eq 1 ] || fail "infer on a file with $1 exited $rc: $(cat "$T/e")"
  [ "$(wc -l <"$T/e")" -eq 1 ] || fail "corrupt $1: not one line: $(cat "$T/e")"
  grep -q "model.safetensors: .*$3" "$T/e" || fail "corrupt $1: message $(cat "$T/e")"
}
corrupt "a bad blocksize" 's/"blocksize": 64/"blocksize": 63/' "blocksize must be"
corrupt "a wrong shape" 's/"shape": \[172, 64\]/"shape": [172, 65]/' "shape is not"
corrupt "a missing absmax" 's/up_proj.weight.absmax"/up_proj.weight.absmaz"/' "lacks"
corrupt "a broken quant_state" 's/\{"quant_type": "nf4"/{"quant_type"; "nf4"/' "not a JSON object"

# Scale and code values out of range (NaN, negative, past 1) are refused at
# load, naming the tensor and element.
bad_value() { # what source-folder tensor element little-endian-bytes expected-message
  rm -rf "$T/c"
  cp -r "$2" "$T/c"
  local f="$T/c/model.safetensors" hlen off
  hlen=$(od -An -t u8 -N 8 "$f" | tr -d ' ')
  off=$(head -c $((8 + hlen)) "$f" | tail -c "$hlen" | jq ".[\"$3\"].data_offsets[0]")
  printf "$5" | dd of="$f" bs=1 seek=$((8 + hlen + off + 4 * $4)) conv=notrunc 2>/dev/null
  "$INFER" "$T/c" --device cpu --prompt-ids 1,2 -n 1 >/dev/null 2>"$T/e"
  local rc=$?
  [ "$rc" -eq 1 ] || fail "infer on a file with $1 exited $rc: $(cat "$T/e")"
  [ "$(wc -l <"$T/e")" -eq 1 ] || fail "$1: not one line: $(cat "$T/e")"
  grep -q "model.safetensors: '$3' element $4 is $6" "$T/e" || fail "$1: message $(cat "$T/e")"
}
"$QUANTIZE" "$MODEL" "$T/i8" --type int8 -q >/dev/null 2>"$T/e" || fail "quantize int8: $(cat "$T/e")"
bad_value "a NaN nested absmax" "$T/nf4" model.layers.1.self_attn.o_proj.weight.nested_absmax 0 '\x00\x00\xc0\x7f' \
  "nan, not a finite non-negative scale"
bad_value "a code past 1" "$T/nf4" model.layers.0.mlp.gate_proj.weight.quant_map 3 '\x00\x00\x00\x40' \
  "2, not a code value in \[-1, 1\]"
bad_value "a negative int8 scale" "$T/i8" model.layers.2.mlp.down_proj.weight.scales 5 '\x00\x00\x80\xbf' \
  "-1, not a finite non-negative scale"

# --- bad arguments (exit 2) -----------------------------------------------------
expect_error 2 "$T/x" "$MODEL" "$T/x"
expect_error 2 "$T/x" "$MODEL" "$T/x" --type int3
expect_error 2 "$T/x" "$MODEL" "$T/x" --type int8 --double-quant
expect_error 2 "$T/x" "$MODEL" "$T/x" --type nf4 --bogus
expect_error 2 "$T/x" "$MODEL" "$T/x" --type nf4 --shard-size 12Q
expect_error 2 "$T/x" "$MODEL" "$T/x" --type nf4 --threads 0
expect_error 2 "$T/x" "$MODEL" --type nf4
expect_error 2 "$T/x" "$MODEL" "$T/x" --type

# --- bad input (exit 1) ---------------------------------------------------------
expect_error 1 "$T/x" "$T/missing" "$T/x" --type nf4
printf 'not a safetensors file at all' >"$T/garbage.safetensors"
cp "$MODEL/config.json" "$T/"
expect_error 1 "$T/x" "$T/garbage.safetensors" "$T/x" --type nf4
head -c 1000 "$MODEL/model.safetensors" >"$T/cut.safetensors"
expect_error 1 "$T/x" "$T/cut.safetensors" "$T/x" --type nf4
grep -q "cut.safetensors" "$T/e" || fail "truncated input: message does not name the file: $(cat "$T/e")"

# A tensor holding inf fails midway (after the temporary folder exists):
# nothing named like a result may remain.
mkdir "$T/inf"
cp "$MODEL"/*.json "$T/inf/"
cp "$MODEL/model.safetensors" "$T/inf/"
hlen=$(od -An -t u8 -N 8 "$T/inf/model.safetensors" | tr -d ' ')
off=$(head -c $((8 + hlen)) "$T/inf/model.safetensors" | tail -c "$hlen" |
  jq '.["model.layers.3.mlp.up_proj.weight"].data_offsets[0]')
printf '\x00\x00\x80\x7f' | dd of="$T/inf/model.safetensors" bs=1 seek=$((8 + hlen + off + 40)) conv=notrunc 2>/dev/null
expect_error 1 "$T/y" "$T/inf" "$T/y" --type nf4
grep -q "inf/model.safetensors: tensor 'model.layers.3.mlp.up_proj.weight': element .* is infinite" "$T/e" ||
  fail "inf input: $(cat "$T/e")"

# Past a file-size limit (ulimit -f: 100 blocks, below the 0.4 MB output)
# the write fails with EFBIG, not SIGXFSZ: one line naming the file, exit 1,
# nothing left behind.
(ulimit -f 100 && "$QUANTIZE" "$MODEL" "$T/big" --type int8 -q) >"$T/o" 2>"$T/e"
rc=$?
[ "$rc" -eq 1 ] || fail "over the file-size limit: exit $rc, want 1: $(cat "$T/e")"
grep -q "^quantize: .*model.safetensors: cannot write: File too large" "$T/e" ||
  fail "over the file-size limit: $(cat "$T/e")"
[ -e "$T/big" ] && fail "over the file-size limit: left OUT behind"
ls -d "$T"/big.tmp-* >/dev/null 2>&1 && fail "over the file-size limit: left a temporary folder behind"

# The disk full midway (pwrite fails with ENOSPC after 100 KB, below the
# 0.4 MB output; a preload library stands in for a full file system): one
# line naming the file, exit 1, nothing left behind.
if [ -n "$DISK_FULL" ]; then
  LD_PRELOAD=$DISK_FULL ENGINE_FAULT_DISK_BYTES=100000 ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0 \
    "$QUANTIZE" "$MODEL" "$T/full" --type int8 -q >"$T/o" 2>"$T/e"
  rc=$?
  [ "$rc" -eq 1 ] || fail "disk full: exit $rc, want 1: $(cat "$T/e")"
  grep -q "^quantize: .*model.safetensors: .*No space left on device$" "$T/e" ||
    fail "disk full: $(cat "$T/e")"
  [ "$(wc -l <"$T/e")" -eq 1 ] || fail "disk full: more than one line: $(cat "$T/e")"
  [ -e "$T/full" ] && fail "disk full: left OUT behind"
  ls -d "$T"/full.tmp-* >/dev/null 2>&1 && fail "disk full: left a temporary folder behind"
  # The same library with room to spare: the run completes (the shim itself is sound).
  LD_PRELOAD=$DISK_FULL ENGINE_FAULT_DISK_BYTES=100000000 ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0 \
    "$QUANTIZE" "$MODEL" "$T/roomy" --type int8 -q >"$T/o" 2>"$T/e" || fail "disk with room: $(cat "$T/e")"
  [ -f "$T/roomy/model.safetensors" ] || fail "disk with room: no output"
fi

# An existing OUT is refused and left as it was.
mkdir "$T/exists"
echo keep >"$T/exists/file"
"$QUANTIZE" "$MODEL" "$T/exists" --type nf4 >/dev/null 2>"$T/e" && fail "quantize overwrote an existing folder"
grep -q "already exists" "$T/e" || fail "existing OUT: $(cat "$T/e")"
[ "$(cat "$T/exists/file")" = keep ] && [ "$(ls "$T/exists" | wc -l)" -eq 1 ] || fail "existing OUT was modified"

if [ "$fails" -ne 0 ]; then
  echo "test_quantize_cli: $fails failure(s)" >&2
  exit 1
fi
echo "test_quantize_cli: all checks passed"
