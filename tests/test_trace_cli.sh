#!/usr/bin/env bash
# test_trace_cli.sh: --trace FILE.json on infer, bench and perplexity (CPU).
# Each file is parsed with jq and checked (tests/trace_check.sh):
#  - a trace-event JSON object: {"traceEvents": [...]}, every event with the
#    fields Perfetto requires (name, ph, ts, pid, tid; dur for "X"), every
#    track named by a thread_name event;
#  - the spans of a track nest and never overlap;
#  - counters never exceed their budget (KV positions their capacity,
#    device bytes the budget in the metadata where one is given);
#  - the layer spans of each prompt pass or decode step (embed, the layers,
#    the head) sum to within 5% of the step's span;
#  - the load's steps, the passes, and the metadata (model, device, plan,
#    budget) are there.
# Bad input: an unwritable path gives one line naming it and a non-zero exit.
# usage: test_trace_cli.sh INFER BENCH PERPLEXITY REPO_ROOT
set -u
INFER=$1 BENCH=$2 PPL=$3 ROOT=$4
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fails=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }
export OMP_NUM_THREADS=2
command -v jq >/dev/null || { echo "SKIP: jq not found"; exit 77; }

# The checks above on one trace (tests/trace_check.sh, shared with the GPU checks).
. "$(dirname "$0")/trace_check.sh"
check() { trace_check "$@"; }

# decode_steps FILE: how many decode steps the trace holds.
decode_steps() { jq '[.traceEvents[] | select(.ph == "X" and .name == "decode step")] | length' "$1"; }

MODEL=$ROOT/models/stories260K
"$INFER" "$MODEL" --device cpu --prompt "Once upon a time" -n 12 --temp 0 --trace "$T/infer.json" >/dev/null 2>"$T/err" ||
  fail "infer --trace: $(cat "$T/err")"
check "infer stories260K" "$T/infer.json"
n=$(decode_steps "$T/infer.json")
[ "$n" -ge 11 ] || fail "infer: $n decode steps in the trace, want at least 11"

# A fixture with a different shape (q/k norms), its prompt as ids, in two passes (--batch 3).
FIX=$ROOT/tests/data/models/qwen3_f32
"$INFER" "$FIX" --device cpu --prompt-ids 1,2,3,4,5,6,7 --batch 3 -n 4 --temp 0 --trace "$T/fix.json" >/dev/null 2>"$T/err" ||
  fail "infer qwen3_f32 --trace: $(cat "$T/err")"
check "infer qwen3_f32" "$T/fix.json"
n=$(jq '[.traceEvents[] | select(.ph == "X" and .name == "prompt pass")] | length' "$T/fix.json")
[ "$n" -eq 3 ] || fail "infer qwen3_f32 --batch 3: $n prompt passes for 7 tokens, want 3"

"$BENCH" "$MODEL" --device cpu --prompt 16 --gen 8 --reps 1 --trace "$T/bench.json" >/dev/null 2>"$T/err" ||
  fail "bench --trace: $(cat "$T/err")"
check "bench" "$T/bench.json"
n=$(decode_steps "$T/bench.json")
[ "$n" -ge 14 ] || fail "bench: $n decode steps (two repetitions of 8 tokens), want at least 14"

IDS=$(seq -s, 1 40)
"$PPL" "$MODEL" --device cpu --ids "$IDS" --ctx 16 --trace "$T/ppl.json" >/dev/null 2>"$T/err" ||
  fail "perplexity --trace: $(cat "$T/err")"
check "perplexity" "$T/ppl.json"

# The checks catch what they look for: a span overlapping its neighbour, a
# counter over its capacity, a layer stretched past its step, a missing field.
jq '(.traceEvents[] | select(.ph == "X" and .name == "layer 1") | .dur) |= . * 3' "$T/infer.json" >"$T/bad1.json"
jq '(.traceEvents[] | select(.ph == "C" and .name == "KV cache positions") | .args.filled) |= . + 100000' \
  "$T/infer.json" >"$T/bad2.json"
jq 'del(.traceEvents[] | select(.ph == "X" and .name == "head") | .tid)' "$T/infer.json" >"$T/bad3.json"
for b in 1 2 3; do
  before=$fails
  check "corrupted $b" "$T/bad$b.json" 2>/dev/null
  [ $fails -gt $before ] && fails=$before || fail "the checks pass a corrupted trace (bad$b.json)"
done
# The device the metadata must name is a parameter (the GPU checks pass cuda): a CPU trace is not a CUDA one.
before=$fails
TRACE_DEVICE=cuda check "as a CUDA trace" "$T/infer.json" 2>/dev/null
[ $fails -gt $before ] && fails=$before || fail "TRACE_DEVICE=cuda passes a CPU trace"

# Without --trace nothing is written (and nothing is recorded: engine/trace.h).
mkdir "$T/quiet"
( cd "$T/quiet" && "$INFER" "$MODEL" --device cpu --prompt "Once" -n 2 >/dev/null 2>&1 )
[ -z "$(ls -A "$T/quiet")" ] || fail "a run without --trace wrote a file: $(ls "$T/quiet")"

# Bad input: one line naming the file, a non-zero exit, for each tool.
BAD=$T/no/such/dir/trace.json
expect_bad() {
  local name=$1
  shift
  "$@" >/dev/null 2>"$T/err"
  local rc=$?
  if [ $rc -eq 0 ]; then
    fail "$name: exit status 0 with an unwritable --trace"
  elif [ "$(wc -l <"$T/err")" -ne 1 ] || ! grep -q "$BAD" "$T/err"; then
    fail "$name: want one line naming $BAD, got: $(cat "$T/err")"
  fi
}
expect_bad infer "$INFER" "$MODEL" --device cpu --prompt x -n 2 --trace "$BAD"
expect_bad bench "$BENCH" "$MODEL" --device cpu --prompt 4 --gen 2 --reps 1 --trace "$BAD"
expect_bad perplexity "$PPL" "$MODEL" --device cpu --ids "$IDS" --ctx 16 --trace "$BAD"
"$INFER" "$MODEL" --device cpu --trace >/dev/null 2>"$T/err" && fail "infer --trace without a value exits 0"
"$INFER" "$MODEL" --dry-run --vram 1G --trace "$T/x.json" >/dev/null 2>"$T/err" && fail "infer --dry-run --trace exits 0"

[ $fails = 0 ] && echo "test_trace_cli: infer, bench and perplexity traces valid, nested, within budget, layers within 5% of their steps"
exit $((fails > 0))
