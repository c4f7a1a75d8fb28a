#!/usr/bin/env bash
# trace_check_cuda.sh: --trace and --trace-svg on the GPU, for the GPU
# machine (tests/gpu_checks.sh runs it; CI has no GPU). infer decodes
# stories260K with three layers streamed and one of them computed by the CPU
# during decode, with --report (whose profiled decode steps the GPU times),
# and its trace must pass tests/trace_check.sh's checks with the device
# cuda, and hold:
#  - the load's CUDA steps (pin mappings, upload), prompt passes and decode
#    steps;
#  - a GPU compute track with every layer, a copy engine track with the
#    streamed layers' copies;
#  - a CPU track with the hosted layer's two halves (q/k/v, o + ffn), one
#    pair per decode step at least, for one layer (--host-layers 1), each
#    half after the other and not overlapping the next;
# and the picture (--trace-svg) must be well-formed, its steps the trace's,
# and its zoom a pass with the device's and the CPU's spans.
#   tests/trace_check_cuda.sh INFER MODEL [KEEP_DIR]   (KEEP_DIR: keep the trace and picture there)
set -u
INFER=$1 MODEL=$2 KEEP=${3:-}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fails=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }
command -v jq >/dev/null || { echo "trace_check_cuda: jq not found" >&2; exit 1; }
. "$(dirname "$0")/trace_check.sh"

"$INFER" "$MODEL" --device cuda --stream-layers 3 --host-layers 1 --prompt "Once upon a time" -n 24 --temp 0 \
  --report --trace "$T/cuda.json" --trace-svg "$T/cuda.svg" >/dev/null 2>"$T/err" ||
  { fail "infer --device cuda --trace: $(tail -n 5 "$T/err")"; exit 1; }
[ -z "$KEEP" ] || cp "$T/cuda.json" "$T/cuda.svg" "$KEEP/"
J=$T/cuda.json
TRACE_DEVICE=cuda trace_check "infer cuda streamed, one layer hosted" "$J" load config "map and validate" "bind weights" \
  "pin mappings" upload "prompt pass" "decode step" "layer 0" "copy layer" "q/k/v of layer" "o + ffn of layer"

# tid_of NAME_PREFIX: the track whose thread_name starts so.
tid_of() { jq --arg p "$1" '[.traceEvents[] | select(.ph == "M" and .name == "thread_name" and (.args.name | startswith($p))) | .tid][0] // -1' "$J"; }
gpu=$(tid_of "GPU compute") copy=$(tid_of "GPU copy engine") cpu=$(tid_of "CPU, hosted layers")
[ "$gpu" -ge 0 ] && [ "$copy" -ge 0 ] && [ "$cpu" -ge 0 ] ||
  fail "tracks missing: GPU compute $gpu, GPU copy engine $copy, CPU hosted layers $cpu"
L=$(jq -r '.metadata.model | capture(", (?<n>[0-9]+) layers") | .n' "$J")
jq -e --argjson t "$gpu" --argjson L "${L:-0}" '[.traceEvents[] | select(.ph == "X" and .tid == $t and .cat == "layer"
       and .name != "head") | .name] | unique == ([range($L)] | map("layer \(.)") | sort)' "$J" >/dev/null ||
  fail "the GPU compute track does not hold each of the $L layers"
# Every decode step through the graph, stamped on the device: a "GPU decode step" span holding its L layers and
# the head (trace_check's 5% test: they add up to it), one per position, as many as the host's decode steps, and
# on the copy engine's track the streamed layers' copies, as many in each step, each streamed layer holding its
# wait for its copy.
out=$(jq -r --argjson t "$gpu" --argjson c "$copy" --argjson L "${L:-0}" '[.traceEvents[] | select(.ph == "X")] as $x
  | [$x[] | select(.tid == $t and .name == "GPU decode step")] as $g
  | ([$x[] | select(.name == "decode step")] | length) as $host
  | if ($g | length) == 0 then "no GPU decode step spans"
    elif ($g | length) < $host - 2 then "\($g | length) GPU decode steps for \($host) on the host"
    elif ([$g[].args.pos] | unique | length) != ($g | length) then "GPU decode steps repeat a position"
    else ($g[] as $s | [$x[] | select(.tid == $t and .cat == "layer" and .ts >= $s.ts - 0.001
                                and .ts + .dur <= $s.ts + $s.dur + 0.001)] | length as $n
          | select($n != $L + 1) | "GPU decode step at pos \($s.args.pos) holds \($n) spans, want \($L + 1)"),
         ([$g[] as $s | [$x[] | select(.tid == $c and .cat == "copy" and .ts >= $s.ts - 0.001
                                and .ts + .dur <= $s.ts + $s.dur + 0.001)] | length] | unique
          | select(length != 1 or .[0] == 0) | "GPU decode steps hold \(.) copies, want the same number > 0"),
         (($g[0] as $s | [$x[] | select(.tid == $c and (.name | startswith("copy layer")) and .ts >= $s.ts - 0.001
                                 and .ts + .dur <= $s.ts + $s.dur + 0.001)] | length) as $nc
          | $g[] as $s | [$x[] | select(.tid == $t and .cat == "wait" and .ts >= $s.ts - 0.001
                                 and .ts + .dur <= $s.ts + $s.dur + 0.001)] | length as $n
          | select($n != $nc) | "GPU decode step at pos \($s.args.pos) holds \($n) copy waits for \($nc) layer copies")
    end' "$J" | head -n 3)
[ -z "$out" ] || fail "stamped decode steps: $out"
jq -e --argjson t "$copy" 'any(.traceEvents[]; .ph == "X" and .tid == $t and .cat == "copy" and .args.bytes > 0)' "$J" \
  >/dev/null || fail "no copies with their bytes on the copy engine's track"
# The CPU's halves: in time order q/k/v, o + ffn, q/k/v, ... of one layer, at least one pair a decode step.
out=$(jq -r --argjson t "$cpu" '[.traceEvents[] | select(.ph == "X" and .tid == $t)] as $all
  | ($all | sort_by(.ts)) as $h
  | [.traceEvents[] | select(.ph == "X" and .name == "decode step")] | length as $steps
  | ($h | map(.name | sub(" [0-9]+$"; "")) ) as $kinds
  | ($h | map(.name | capture("(?<n>[0-9]+)$").n) | unique) as $layers
  | if ($h | length) < 2 * $steps then "\($h | length) CPU spans for \($steps) decode steps"
    elif ([range(0; $kinds | length)] | any(. as $i | $kinds[$i] != (if $i % 2 == 0 then "q/k/v of layer" else "o + ffn of layer" end)))
      then "the CPU spans do not alternate q/k/v, o + ffn: \($kinds[:6])"
    elif ($layers | length) != 1 then "CPU spans for layers \($layers), want one (--host-layers 1)"
    elif any($h[]; .cat != "host") then "CPU spans not of category host"
    else empty end' "$J")
[ -z "$out" ] || fail "hosted layers: $out"

if command -v xmllint >/dev/null; then
  xmllint --noout "$T/cuda.svg" 2>"$T/xmlerr" || fail "the picture is not well-formed: $(head -c 300 "$T/xmlerr")"
else
  echo "trace_check_cuda: xmllint not found (Debian: libxml2-utils): the picture's XML is not checked" >&2
fi
n_svg=$(grep -c '<rect class="step"' "$T/cuda.svg")
n_json=$(jq '[.traceEvents[] | select(.ph == "X" and .cat == "step")] | length' "$J")
[ "$n_svg" -eq "$n_json" ] || fail "the picture has $n_svg step boxes, the trace $n_json steps"
for want in 'class="span"[^>]*data-name="copy layer' 'class="span"[^>]*data-name="layer 0"' \
  'class="span"[^>]*data-name="q/k/v of layer'; do
  grep -q "$want" "$T/cuda.svg" || fail "the picture's zoom lacks $want"
done

[ $fails = 0 ] && echo "trace_check_cuda: the CUDA trace valid, GPU compute, copy engine and CPU hosted-layer tracks filled, its picture well-formed"
exit $((fails > 0))
