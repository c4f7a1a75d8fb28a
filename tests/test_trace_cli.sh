#!/usr/bin/env bash
# test_trace_cli.sh: --trace FILE.json on infer, bench and perplexity (CPU).
# Each file is parsed with jq and checked:
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

# check NAME FILE [EXPECT_LAYERS]: the checks above on one trace.
check() {
  local name=$1 f=$2 out
  jq -e 'type == "object" and (.traceEvents | type == "array") and (.traceEvents | length > 0)' "$f" >/dev/null 2>&1 ||
    { fail "$name: not a trace-event JSON object"; return; }
  out=$(jq -r '.traceEvents[] | select((.name | type) != "string" or (.ph | type) != "string" or (.ts | type) != "number"
               or (.pid | type) != "number" or (.tid | type) != "number"
               or (.ph == "X" and ((.dur | type) != "number" or .dur < 0))) | tostring' "$f")
  [ -z "$out" ] || fail "$name: events lacking a required field: $(head -c 300 <<<"$out")"
  out=$(jq -r '[.traceEvents[] | select(.ph == "M" and .name == "thread_name") | .tid] as $named
               | [.traceEvents[] | select(.ph == "X") | .tid] | unique - $named | .[] | tostring' "$f")
  [ -z "$out" ] || fail "$name: tracks without a thread_name: $out"
  # Nesting: on each track, sorted by start (longest first), a span that
  # starts inside an open one must end inside it (1 ns for rounding).
  out=$(jq -r '[.traceEvents[] | select(.ph == "X")] | group_by(.tid)[] | sort_by(.ts, -.dur)
               | reduce .[] as $e ({open: [], bad: []};
                   .open |= map(select(.ts + .dur > $e.ts + 0.001))
                   | if (.open | length) > 0 and (.open[-1].ts + .open[-1].dur < $e.ts + $e.dur - 0.001)
                     then .bad += ["\($e.name) at \($e.ts) overlaps \(.open[-1].name) at \(.open[-1].ts)"] else . end
                   | .open += [$e])
               | .bad[]' "$f")
  [ -z "$out" ] || fail "$name: spans overlap on a track: $(head -n 3 <<<"$out")"
  # Counters within their budgets.
  out=$(jq -r '(.metadata.budget_bytes // null) as $b | .traceEvents[] | select(.ph == "C")
               | select((.args | type) != "object" or ([.args[] | type == "number"] | all | not)
                        or (.args.capacity != null and .args.filled > .args.capacity)
                        or (.args.budget != null and ([.args | to_entries[] | select(.key != "budget") | .value] | max) > .args.budget)
                        or ($b != null and .name == "device memory" and .args.mapped > $b))
               | tostring' "$f")
  [ -z "$out" ] || fail "$name: counters over their budget: $(head -c 300 <<<"$out")"
  # The layer spans of each step sum to its span within 5%.
  out=$(jq -r '[.traceEvents[] | select(.ph == "X")] as $x | $x[] | select(.cat == "step") as $s
               | ([$x[] | select(.cat == "layer" and .tid == $s.tid and .ts >= $s.ts - 0.001
                                 and .ts + .dur <= $s.ts + $s.dur + 0.001) | .dur] | add // 0) as $sum
               | select($sum < 0.95 * $s.dur or $sum > 1.05 * $s.dur)
               | "\($s.name) at \($s.ts): layers \($sum) us of \($s.dur) us"' "$f")
  [ -z "$out" ] || fail "$name: layer spans do not add up to their step: $(head -n 3 <<<"$out")"
  for span in load config "map and validate" "bind weights" "prompt pass" "layer 0" head; do
    jq -e --arg n "$span" 'any(.traceEvents[]; .ph == "X" and .name == $n)' "$f" >/dev/null ||
      fail "$name: no '$span' span"
  done
  jq -e 'any(.traceEvents[]; .ph == "C" and .name == "KV cache positions" and .args.filled > 0)' "$f" >/dev/null ||
    fail "$name: no KV cache counter"
  jq -e '.metadata | (.model | type == "string") and (.device == "cpu") and (.plan | type == "string")
         and (.budget | type == "string")' "$f" >/dev/null || fail "$name: metadata lacks model, device, plan or budget"
}

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
