# trace_check.sh: the checks of one --trace file, sourced by
# test_trace_cli.sh (CPU traces, in CI) and by the GPU checks (a CUDA
# trace of a model that streams layers and computes some on the CPU).
#
#   trace_check NAME FILE [SPAN...]
#
# With jq, FAILs (through the caller's fail function) unless FILE is:
#  - a trace-event JSON object: {"traceEvents": [...]}, every event with the
#    fields Perfetto requires (name, ph, ts, pid, tid; dur for "X"), every
#    track named by a thread_name event;
#  - spans that nest and never overlap on each track;
#  - counters within their budgets (KV positions their capacity, device
#    bytes the budget in the metadata where one is given);
#  - on each track that holds layer spans (the CPU's: on a GPU they are on
#    the device's compute track, away from the host's steps), each prompt
#    pass or decode step's layer spans (embed, the layers, the head) summing
#    to within 5% of the step's span;
#  - a span whose name starts with each SPAN (default: the load's steps, a
#    prompt pass, layer 0 and the head), a KV cache counter, and the
#    metadata: model, plan and budget, and device equal to $TRACE_DEVICE
#    (default cpu).
trace_check() {
  local name=$1 f=$2 out
  shift 2
  [ $# -gt 0 ] || set -- load config "map and validate" "bind weights" "prompt pass" "layer 0" head
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
  # The layer spans of each step on a track with layers sum to its span within 5%.
  out=$(jq -r '[.traceEvents[] | select(.ph == "X")] as $x
               | [$x[] | select(.cat == "layer") | .tid] as $with_layers
               | $x[] | select(.cat == "step" and (.tid as $t | $with_layers | index($t))) as $s
               | ([$x[] | select(.cat == "layer" and .tid == $s.tid and .ts >= $s.ts - 0.001
                                 and .ts + .dur <= $s.ts + $s.dur + 0.001) | .dur] | add // 0) as $sum
               | select($sum < 0.95 * $s.dur or $sum > 1.05 * $s.dur)
               | "\($s.name) at \($s.ts): layers \($sum) us of \($s.dur) us"' "$f")
  [ -z "$out" ] || fail "$name: layer spans do not add up to their step: $(head -n 3 <<<"$out")"
  local span
  for span in "$@"; do
    jq -e --arg n "$span" 'any(.traceEvents[]; .ph == "X" and (.name | startswith($n)))' "$f" >/dev/null ||
      fail "$name: no '$span' span"
  done
  jq -e 'any(.traceEvents[]; .ph == "C" and .name == "KV cache positions" and .args.filled > 0)' "$f" >/dev/null ||
    fail "$name: no KV cache counter"
  jq -e --arg d "${TRACE_DEVICE:-cpu}" '.metadata | (.model | type == "string") and (.device == $d)
         and (.plan | type == "string") and (.budget | type == "string")' "$f" >/dev/null ||
    fail "$name: metadata lacks model, plan or budget, or its device is not ${TRACE_DEVICE:-cpu}"
}
