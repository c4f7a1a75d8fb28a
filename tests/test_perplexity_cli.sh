#!/usr/bin/env bash
# test_perplexity_cli.sh: tools/perplexity against references it did not make.
#  1. Every fixture and stories260K: the perplexity of the token after the
#     reference prompt equals exp(-log_softmax(transformers' float64 logits)[t])
#     within 1e-4 relative (the logits in reference.json).
#     And whole windows (stories260K, a fixture) against a float64 scorer.
#  2. Windows: sliding and non-overlapping cuts score the expected number
#     of tokens, and a text run gives a finite perplexity.
#  3. KL of a model against itself is 0 with top-1 1; int8 against the f32
#     base equals test_quant_model's figure on the same positions.
#     --ctx max, --batch (the same perplexity) and --kv (close to the base).
#  4. Bad input: one line on stderr and a non-zero exit.
# usage: test_perplexity_cli.sh PERPLEXITY TEST_QUANT_MODEL SOURCE_DIR TEST_DATA
set -u
PPL=$1 TQM=$2 SRC=$3 DATA=$4
T=$(mktemp -d) && trap 'rm -rf "$T"' EXIT
fails=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }
export OMP_NUM_THREADS=2

# 1. transformers' logits after the prompt.
check_ref() { # MODEL_DIR REFERENCE_JSON (object or the first of a list)
  local args
  args=$(python3 - "$2" <<'PY'
import json, math, sys
d = json.load(open(sys.argv[1]))
d = d[0] if isinstance(d, list) else d
p, l = d["prompt_ids"], d["prompt_logits_last"]
t = d["greedy_ids"][len(p)] if "prompt" in d else d["greedy_ids"][0]
m = max(l); lse = m + math.log(sum(math.exp(x - m) for x in l))
print(",".join(map(str, p + [t])), len(p) + 1, len(p), math.exp(-(l[t] - lse)))
PY
) || { fail "$2: unreadable"; return; }
  set -- "$1" $args
  local out
  out=$("$PPL" "$1" --device cpu --ids "$2" --ctx "$3" --score-from "$4" --json 2>"$T/err") || { fail "$1: $(cat "$T/err")"; return; }
  python3 - "$out" "$5" "$1" <<'PY' || fails=$((fails + 1))
import json, sys
got, want = json.loads(sys.argv[1])["ppl"], float(sys.argv[2])
ok = abs(got - want) <= 1e-4 * want
print(("ok" if ok else "FAIL") + f": {sys.argv[3]}: ppl {got:.8g}, transformers float64 {want:.8g}", file=sys.stderr if not ok else sys.stdout)
sys.exit(0 if ok else 1)
PY
}
check_ref "$SRC/models/stories260K" "$SRC/tests/data/reference/stories260K_reference.json"
for d in "$SRC"/tests/data/models/*/; do
  check_ref "${d%/}" "$d/reference.json"
done

# 1b. Whole windows: every position from score_from on, against the float64 scorer
# tests/fixtures/perplexity_reference.py (an independent numpy forward pass).
while read -r model ids ctx from want; do
  out=$("$PPL" "$SRC/$model" --device cpu --ids "$ids" --ctx "$ctx" --score-from "$from" --json 2>"$T/err") ||
    { fail "$model window: $(cat "$T/err")"; continue; }
  python3 -c "import json,sys; g=json.loads(sys.argv[1])['ppl']; w=float(sys.argv[2]); sys.exit(abs(g-w) > 1e-4*w)" \
    "$out" "$want" || fail "$model: window of $ctx scored from $from: $out, want ppl $want"
done < <(python3 -c "
import json
for e in json.load(open('$SRC/tests/data/perplexity/reference.json')):
    print(e['model'], ','.join(map(str, e['ids'])), e['ctx'], e['score_from'], repr(e['ppl']))")

# The reference sequence of test_quant_model (prompt + continuation) and one more id, so that
# scoring from 1 covers the logits after each of its ids.
SEQ=$(python3 -c "
import json; d = json.load(open('$SRC/tests/data/reference/stories260K_reference.json'))[0]
s = d['prompt_ids'] + d['greedy_ids'][len(d['prompt_ids']):]
print(','.join(map(str, s + [s[0]])))")
N=$(tr ',' '\n' <<<"$SEQ" | wc -l)
M=$SRC/models/stories260K

# 2. Window cuts: 64-token windows every 32 scored from 32 (two windows over 96 ids), one of 96 from 32.
a=$("$PPL" "$M" --device cpu --ids "$(cut -d, -f1-96 <<<"$SEQ")" --ctx 64 --stride 32 --json 2>/dev/null)
b=$("$PPL" "$M" --device cpu --ids "$(cut -d, -f1-96 <<<"$SEQ")" --ctx 96 --score-from 32 --json 2>/dev/null)
python3 -c "
import json, sys
a, b = json.loads('''$a'''), json.loads('''$b''')
assert a['windows'] == 2 and a['tokens'] == 64 and b['tokens'] == 64, (a, b)
" 2>/dev/null || fail "window cuts: $a / $b"
printf 'Once upon a time, there was a little girl named Lily. She loved to play in the park with her friends. One day she saw a big red ball under a tree.\n' >"$T/text.txt"
out=$("$PPL" "$M" --device cpu --file "$T/text.txt" --ctx 16 --json 2>"$T/err") &&
  python3 -c "import json,math,sys; d=json.loads(sys.argv[1]); sys.exit(not (d['tokens']>0 and 1<d['ppl']<100 and math.isfinite(d['ppl_se'])))" "$out" ||
  fail "text run: $out $(cat "$T/err")"

# 3. KL: self, and int8 against test_quant_model's figure.
"$PPL" "$M" --device cpu --ids "$SEQ" --ctx "$N" --score-from 1 --save-logits "$T/base.bin" --json >"$T/base.json" 2>"$T/err" ||
  fail "save: $(cat "$T/err")"
self=$("$PPL" "$M" --device cpu --ids "$SEQ" --ctx "$N" --score-from 1 --kl-base "$T/base.bin" --json 2>"$T/err") || fail "self: $(cat "$T/err")"
python3 -c "import json,sys; d=json.loads(sys.argv[1]); sys.exit(not (abs(d['kl_mean'])<1e-12 and d['kl_max']<1e-12 and d['top1']==1 and abs(d['ppl_ratio']-1)<1e-6))" "$self" ||
  fail "KL against itself: $self"
q=$("$PPL" "$M" --device cpu --quant int8 --ids "$SEQ" --ctx "$N" --score-from 1 --kl-base "$T/base.bin" --json 2>"$T/err") || fail "int8: $(cat "$T/err")"
want=$(ENGINE_SOURCE_DIR=$SRC ENGINE_TEST_DATA=$DATA "$TQM" 2>/dev/null | awk '$2 == "stories260K" && $3 == "int8" {print $(NF-2)}')
python3 -c "
import json, sys
d = json.loads(sys.argv[1]); w = float(sys.argv[2])
ok = abs(d['kl_mean'] - w) <= 6e-6 and d['kl_mean'] > 0
print(('ok' if ok else 'FAIL') + ': int8 KL %.7f, test_quant_model %.5f' % (d['kl_mean'], w))
sys.exit(not ok)" "$q" "${want:-nan}" || fails=$((fails + 1))

# 3b. Issue 34's options: --ctx max is the model's maximum (512 for stories260K); --batch cuts the
# prompt into passes without changing the scores beyond rounding; --kv runs and stays close to the base.
LONG=$(python3 -c "s='$SEQ'.split(','); print(','.join((s * 20)[:600]))")
out=$("$PPL" "$M" --device cpu --ids "$LONG" --ctx max --score-from 500 --json 2>"$T/err") &&
  python3 -c "import json,math,sys; d=json.loads(sys.argv[1]); sys.exit(not (d['ctx']==512 and d['windows']==1 and d['tokens']==12 and math.isfinite(d['ppl'])))" "$out" ||
  fail "--ctx max: $out $(cat "$T/err")"
one=$("$PPL" "$M" --device cpu --ids "$SEQ" --ctx "$N" --score-from 1 --json 2>/dev/null)
four=$("$PPL" "$M" --device cpu --ids "$SEQ" --ctx "$N" --score-from 1 --batch 4 --json 2>"$T/err") || fail "--batch 4: $(cat "$T/err")"
python3 -c "import json,sys; a,b=json.loads(sys.argv[1]),json.loads(sys.argv[2]); sys.exit(not abs(a['ppl']-b['ppl'])<=1e-5*a['ppl'])" "$one" "$four" ||
  fail "--batch 4 changed the perplexity: $one / $four"
for kv in int8 fp8 bf16 f16; do
  out=$("$PPL" "$M" --device cpu --kv $kv --ids "$SEQ" --ctx "$N" --score-from 1 --kl-base "$T/base.bin" --json 2>"$T/err") &&
    python3 -c "import json,math,sys; d=json.loads(sys.argv[1]); sys.exit(not (math.isfinite(d['kl_mean']) and d['kl_mean']>=0 and d['top1']>=0.9))" "$out" ||
    fail "--kv $kv: $out $(cat "$T/err")"
done

# 4. Bad input: exactly one line on stderr, exit non-zero.
bad() { # LABEL ARGS...
  local label=$1; shift
  if "$PPL" "$@" >/dev/null 2>"$T/err"; then fail "$label: exit 0"; return; fi
  [ "$(wc -l <"$T/err")" = 1 ] || fail "$label: stderr is not one line: $(cat "$T/err")"
}
: >"$T/empty.txt"
bad "empty file" "$M" --device cpu --file "$T/empty.txt"
bad "too short" "$M" --device cpu --file "$T/text.txt" --ctx 512
bad "missing file" "$M" --device cpu --file "$T/nope.txt"
bad "no input" "$M" --device cpu
bad "bad --kv" "$M" --device cpu --ids "$SEQ" --kv q8
bad "bad --batch" "$M" --device cpu --ids "$SEQ" --batch 0
bad "bad --ctx" "$M" --device cpu --ids "$SEQ" --ctx maxx
bad "--ctx max beyond the ids" "$M" --device cpu --ids "$SEQ" --ctx max
bad "other text" "$M" --device cpu --ids "$(cut -d, -f2- <<<"$SEQ"),5" --ctx "$N" --score-from 1 --kl-base "$T/base.bin"
bad "other model" "$SRC/tests/data/models/llama_f32" --device cpu --ids "$(cut -d, -f1-40 <<<"$SEQ")" --ctx 40 --score-from 1 --kl-base "$T/base.bin"
bad "other windows" "$M" --device cpu --ids "$SEQ" --ctx "$N" --score-from 2 --kl-base "$T/base.bin"
head -c 5000 "$T/base.bin" >"$T/trunc.bin"
bad "truncated base" "$M" --device cpu --ids "$SEQ" --ctx "$N" --score-from 1 --kl-base "$T/trunc.bin"
cp "$T/base.bin" "$T/corrupt.bin"
printf '\x7f' | dd of="$T/corrupt.bin" bs=1 seek=3000 conv=notrunc status=none
bad "corrupted base" "$M" --device cpu --ids "$SEQ" --ctx "$N" --score-from 1 --kl-base "$T/corrupt.bin"
bad "not a base" "$M" --device cpu --ids "$SEQ" --ctx "$N" --score-from 1 --kl-base "$T/text.txt"

[ $fails = 0 ] && echo "test_perplexity_cli: all checks passed"
exit $((fails > 0))
