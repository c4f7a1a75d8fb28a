#!/usr/bin/env bash
# test_mkcheckpoint_cli.sh: mkcheckpoint --quant nf4-dq writes what
# quantize makes of mkcheckpoint's dense file (same seed): the same tensor
# names, and the two checkpoints give the same 24 greedy ids after a prompt
# (bf16 and f16 sources). Also the MoE shapes' refusal of an unknown --quant.
# usage: test_mkcheckpoint_cli.sh MKCHECKPOINT QUANTIZE INFER
set -u
MK=$1 QUANTIZE=$2 INFER=$3
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fails=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }

ids() { # model -> the generated ids of a fixed prompt
  "$INFER" "$1" --device cpu --threads 2 --prompt-ids 1,17,300,42,99,7 -n 24 --json 2>/dev/null | tail -1 |
    sed -n 's/.*"generated_ids":\[\([0-9,]*\)\].*/\1/p'
}
names() { # safetensors file -> its tensor names, sorted
  head -c 200000 "$1" | tail -c +9 | tr ',' '\n' | sed -n 's/^{*"\([^"]*\)":{"dtype".*/\1/p' | sort
}

for dt in bf16 f16; do
  "$MK" --shape tiny --dtype $dt "$T/dense-$dt" 2>"$T/e" || fail "mkcheckpoint $dt: $(cat "$T/e")"
  "$MK" --shape tiny --dtype $dt --quant nf4-dq "$T/mk-$dt" 2>"$T/e" || fail "mkcheckpoint $dt nf4-dq: $(cat "$T/e")"
  "$QUANTIZE" "$T/dense-$dt" "$T/q-$dt" --type nf4 --double-quant >/dev/null 2>"$T/e" || fail "quantize: $(cat "$T/e")"
  a=$(names "$T/mk-$dt/model.safetensors") b=$(names "$T/q-$dt/model.safetensors")
  [ -n "$a" ] && [ "$a" = "$b" ] || fail "$dt: tensor names differ: $(diff <(echo "$a") <(echo "$b") | head -4)"
  grep -q "bitsandbytes__nf4" <<<"$a" || fail "$dt: no quantized tensors in mkcheckpoint's file"
  x=$(ids "$T/mk-$dt") y=$(ids "$T/q-$dt") z=$(ids "$T/dense-$dt")
  [ -n "$x" ] && [ "$x" = "$y" ] || fail "$dt: greedy ids differ: mkcheckpoint [$x], quantize [$y]"
  [ "$x" != "$z" ] || fail "$dt: the nf4-dq file decodes exactly as the dense one ([$x]): was anything quantized?"
done
"$MK" --shape olmoe-1b-7b --dtype bf16 --quant int4 "$T/x" 2>"$T/e"
[ $? -eq 2 ] && grep -q "unknown --quant 'int4'" "$T/e" || fail "--quant int4: $(cat "$T/e")"
[ -e "$T/x/model.safetensors" ] && fail "--quant int4 wrote a file"

[ "$fails" -eq 0 ] && echo "test_mkcheckpoint_cli: all checks passed"
exit $((fails > 0))
