#!/usr/bin/env bash
# test_trace_svg_cli.sh: --trace-svg on infer, bench and perplexity, and
# build/trace_svg on a trace written elsewhere. Each picture:
#  - is well-formed XML (xmllint --noout), with no script and a sans-serif
#    fallback;
#  - holds every prompt pass and decode step of the trace as a box tagged
#    with the span's exact values (<rect class="step" data-tid data-name
#    data-ts data-dur>), parsed here and compared with jq to the JSON's spans:
#    the same spans, the same numbers;
#  - zooms into a decode step: every box of the zoom (class="span") is a
#    span of the trace with the same numbers, the step's layers among them;
#  - gives each counter series' largest value (data-max) equal to the JSON's;
# and build/trace_svg draws the same picture from the same file as --trace-svg
# does. --trace-svg alone leaves no temporary file. test_trace_svg's synthetic
# pictures (GPU tracks) are well-formed too. That the comparison catches a
# changed number is checked on a doctored picture. Bad input (a missing file,
# invalid JSON, JSON that is not a trace, an unwritable picture) gives one
# line naming the file, a non-zero exit and no picture.
# usage: test_trace_svg_cli.sh INFER BENCH PERPLEXITY TRACE_SVG TEST_TRACE_SVG REPO_ROOT
set -u
INFER=$1 BENCH=$2 PPL=$3 TRACE_SVG=$4 TEST_TRACE_SVG=$5 ROOT=$6
MODEL=$ROOT/models/stories260K
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fails=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }
command -v jq >/dev/null || { echo "SKIP: jq not found"; exit 77; }
command -v xmllint >/dev/null || { echo "SKIP: xmllint not found (Debian: libxml2-utils)"; exit 77; }

# rects CLASS SVG: the tagged boxes of a class as sorted JSON [{tid, name, ts, dur}] (numbers as doubles: + 0).
rects() {
  grep -o "<rect class=\"$1\"[^>]*>" "$2" |
    sed -n 's/.* data-tid="\([^"]*\)" data-name="\([^"]*\)" data-ts="\([^"]*\)" data-dur="\([^"]*\)".*/\1\t\2\t\3\t\4/p' |
    jq -R 'split("\t") | {tid: (.[0] | tonumber + 0), name: .[1], ts: (.[2] | tonumber + 0), dur: (.[3] | tonumber + 0)}' |
    jq -s -c 'sort_by(.ts, .tid, .name)'
}

# check_svg NAME SVG JSON: the checks above.
check_svg() {
  local name=$1 svg=$2 json=$3 out
  [ -s "$svg" ] || { fail "$name: no SVG written"; return; }
  grep -q '<script' "$svg" && fail "$name: the SVG has a script"
  grep -q 'font-family="[^"]*sans-serif"' "$svg" || fail "$name: no sans-serif fallback"
  xmllint --noout "$svg" 2>"$T/xmlerr" || { fail "$name: not well-formed: $(head -c 400 "$T/xmlerr")"; return; }
  rects step "$svg" >"$T/svg_steps.json"
  jq -c '[.traceEvents[] | select(.ph == "X" and .cat == "step") | {tid, name, ts: (.ts + 0), dur: (.dur + 0)}]
         | sort_by(.ts, .tid, .name)' "$json" >"$T/json_steps.json"
  jq -e 'length > 0' "$T/json_steps.json" >/dev/null || fail "$name: the trace has no steps"
  jq -e -n --slurpfile a "$T/svg_steps.json" --slurpfile b "$T/json_steps.json" '$a[0] == $b[0]' >/dev/null ||
    fail "$name: the step boxes differ from the trace's steps: $(head -c 300 "$T/svg_steps.json") against $(head -c 300 "$T/json_steps.json")"
  # The zoom: every box a span of the trace, a decode step and its layers among them.
  rects span "$svg" >"$T/svg_zoom.json"
  out=$(jq -r -n --slurpfile z "$T/svg_zoom.json" --slurpfile j "$json" '
          [$j[0].traceEvents[] | select(.ph == "X") | {tid, name, ts: (.ts + 0), dur: (.dur + 0)}] as $all
          | $z[0][] | select(. as $b | $all | index([$b]) | not) | tostring')
  [ -z "$out" ] || fail "$name: zoomed boxes that are no span of the trace: $(head -c 300 <<<"$out")"
  jq -e '(map(select(.name == "decode step")) | length) == 1 and any(.[]; .name == "layer 0")' "$T/svg_zoom.json" \
    >/dev/null || fail "$name: the zoom does not hold one decode step and its layers: $(head -c 300 "$T/svg_zoom.json")"
  # Each counter series' largest value.
  grep -o '<tspan data-counter="[^"]*" data-series="[^"]*" data-max="[^"]*"' "$svg" |
    sed 's/.*data-counter="\([^"]*\)" data-series="\([^"]*\)" data-max="\([^"]*\)"/\1\t\2\t\3/' >"$T/maxes"
  [ -s "$T/maxes" ] || fail "$name: no counter series"
  while IFS=$'\t' read -r c s v; do
    jq -e --arg c "$c" --arg s "$s" --arg v "$v" \
      '[.traceEvents[] | select(.ph == "C" and .name == $c) | .args[$s] | select(. != null)] | max + 0 == ($v | tonumber + 0)' \
      "$json" >/dev/null || fail "$name: counter '$c' series '$s': the picture's largest value $v is not the trace's"
  done <"$T/maxes"
}

"$INFER" "$MODEL" --device cpu --prompt "Once upon a time" -n 24 --temp 0 --trace "$T/infer.json" \
  --trace-svg "$T/infer.svg" >/dev/null 2>"$T/err" || fail "infer --trace-svg: $(cat "$T/err")"
check_svg "infer" "$T/infer.svg" "$T/infer.json"

# The tool draws a trace written elsewhere: the same picture from the same file.
mkdir "$T/elsewhere"
cp "$T/infer.json" "$T/elsewhere/infer.json"
"$TRACE_SVG" "$T/elsewhere/infer.json" "$T/tool.svg" 2>"$T/err" || fail "trace_svg: $(cat "$T/err")"
[ -s "$T/err" ] && fail "trace_svg printed: $(cat "$T/err")"
cmp -s "$T/infer.svg" "$T/tool.svg" || fail "trace_svg draws infer's trace differently from infer --trace-svg"
"$TRACE_SVG" "$T/infer.json" "$T/note.svg" --note "Placeholder: a CPU trace" 2>"$T/err" || fail "trace_svg --note: $(cat "$T/err")"
grep -q 'Placeholder: a CPU trace' "$T/note.svg" || fail "trace_svg --note: the note is not in the picture"
check_svg "trace_svg --note" "$T/note.svg" "$T/infer.json"

# The comparison catches a changed number: a step's duration, a zoomed layer's start, a counter's largest value.
sed '0,/class="step"\(.*\) data-dur="\([0-9]*\)/s//class="step"\1 data-dur="\21/' "$T/infer.svg" >"$T/bad1.svg"
sed '0,/class="span"\(.*data-name="layer 0"\) data-ts="\([0-9]*\)/s//class="span"\1 data-ts="\21/' "$T/infer.svg" >"$T/bad2.svg"
sed '0,/data-series="filled" data-max="\([0-9]*\)/s//data-series="filled" data-max="\11/' "$T/infer.svg" >"$T/bad3.svg"
for b in 1 2 3; do
  cmp -s "$T/infer.svg" "$T/bad$b.svg" && { fail "doctoring bad$b.svg changed nothing"; continue; }
  before=$fails
  check_svg "doctored $b" "$T/bad$b.svg" "$T/infer.json" 2>/dev/null
  [ $fails -gt $before ] && fails=$before || fail "the checks pass a doctored picture (bad$b.svg)"
done

# --trace-svg alone: the JSON lives in a temporary file, removed after drawing.
mkdir "$T/tmp"
TMPDIR=$T/tmp "$INFER" "$MODEL" --device cpu --prompt "Once" -n 8 --temp 0 --trace-svg "$T/alone.svg" \
  >/dev/null 2>"$T/err" || fail "infer --trace-svg alone: $(cat "$T/err")"
xmllint --noout "$T/alone.svg" 2>/dev/null || fail "infer --trace-svg alone: not well-formed"
[ -z "$(ls -A "$T/tmp")" ] || fail "infer --trace-svg alone left $(ls "$T/tmp")"

"$BENCH" "$MODEL" --device cpu --prompt 16 --gen 8 --reps 1 --trace "$T/bench.json" --trace-svg "$T/bench.svg" \
  >/dev/null 2>"$T/err" || fail "bench --trace-svg: $(cat "$T/err")"
check_svg "bench" "$T/bench.svg" "$T/bench.json"
# Perplexity's passes are prompt passes only: well-formed, its steps exact (no decode step to zoom into).
"$PPL" "$MODEL" --device cpu --ids "$(seq -s, 1 40)" --ctx 16 --trace "$T/ppl.json" --trace-svg "$T/ppl.svg" \
  >/dev/null 2>"$T/err" || fail "perplexity --trace-svg: $(cat "$T/err")"
xmllint --noout "$T/ppl.svg" 2>/dev/null || fail "perplexity --trace-svg: not well-formed"
rects step "$T/ppl.svg" >"$T/a.json"
jq -c '[.traceEvents[] | select(.ph == "X" and .cat == "step") | {tid, name, ts: (.ts + 0), dur: (.dur + 0)}]
       | sort_by(.ts, .tid, .name)' "$T/ppl.json" >"$T/b.json"
jq -e -n --slurpfile a "$T/a.json" --slurpfile b "$T/b.json" '$a[0] == $b[0] and ($a[0] | length) > 1' >/dev/null ||
  fail "perplexity: the step boxes differ from the trace's"

# test_trace_svg's synthetic pictures: the GPU's tracks, the CPU's hosted layers, crowded names.
mkdir "$T/synth"
"$TEST_TRACE_SVG" "$T/synth" >"$T/out" 2>&1 || fail "test_trace_svg: $(tail -n 5 "$T/out")"
for f in "$T"/synth/*.svg; do
  xmllint --noout "$f" 2>"$T/xmlerr" || fail "$(basename "$f"): not well-formed: $(head -c 300 "$T/xmlerr")"
done
[ "$(ls "$T"/synth/*.svg | wc -l)" -ge 4 ] || fail "test_trace_svg wrote $(ls "$T"/synth | wc -l) pictures, want 4"

# Bad input: one line naming the file, a non-zero exit, no picture.
expect_bad() {
  local name=$1 file=$2 svg=$3
  shift 3
  rm -f "$svg"
  "$@" >/dev/null 2>"$T/err"
  local rc=$?
  if [ $rc -eq 0 ]; then
    fail "$name: exit status 0"
  elif [ "$(wc -l <"$T/err")" -ne 1 ] || ! grep -qF -- "$file" "$T/err"; then
    fail "$name: want one line naming $file, got: $(cat "$T/err")"
  fi
  [ -e "$svg" ] && [ "$file" != "$svg" ] && fail "$name: a picture was left at $svg"
}
printf '{"traceEvents": [' >"$T/broken.json"
printf '{"events": []}' >"$T/other.json"
printf '[1, 2, 3]' >"$T/numbers.json"
printf '{"traceEvents": [{"name": "c", "ph": "C", "ts": 1, "pid": 1, "tid": 0, "args": {"v": 1}}]}' >"$T/nospans.json"
expect_bad "missing file" "$T/none.json" "$T/x.svg" "$TRACE_SVG" "$T/none.json" "$T/x.svg"
expect_bad "invalid JSON" "$T/broken.json" "$T/x.svg" "$TRACE_SVG" "$T/broken.json" "$T/x.svg"
expect_bad "not a trace" "$T/other.json" "$T/x.svg" "$TRACE_SVG" "$T/other.json" "$T/x.svg"
expect_bad "not events" "$T/numbers.json" "$T/x.svg" "$TRACE_SVG" "$T/numbers.json" "$T/x.svg"
expect_bad "no spans" "$T/nospans.json" "$T/x.svg" "$TRACE_SVG" "$T/nospans.json" "$T/x.svg"
BAD=$T/no/such/dir/x.svg
expect_bad "unwritable picture" "$BAD" "$BAD" "$TRACE_SVG" "$T/infer.json" "$BAD"
expect_bad "infer unwritable picture" "$BAD" "$BAD" "$INFER" "$MODEL" --device cpu --prompt x -n 2 --trace-svg "$BAD"
expect_bad "bench unwritable picture" "$BAD" "$BAD" "$BENCH" "$MODEL" --device cpu --prompt 4 --gen 2 --reps 1 --trace-svg "$BAD"
"$TRACE_SVG" "$T/infer.json" >/dev/null 2>&1
[ $? -eq 2 ] || fail "trace_svg with one argument: want exit status 2 (usage)"
"$INFER" "$MODEL" --dry-run --vram 1G --trace-svg "$T/x.svg" >/dev/null 2>&1 && fail "infer --dry-run --trace-svg exits 0"

[ $fails = 0 ] && echo "test_trace_svg_cli: pictures well-formed, their steps, zoomed spans and counter maxima equal the traces', bad input refused"
exit $((fails > 0))
