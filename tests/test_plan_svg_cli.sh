#!/usr/bin/env bash
# test_plan_svg_cli.sh: infer --svg end to end. Each picture is well-formed
# XML (xmllint --noout) and every figure it shows equals the one
# `--dry-run --json` printed in the same run: the SVG tags each figure with
# its JSON path and exact value (<tspan data-key="entries.3.weight_bytes"
# data-value="...">), parsed here with xmllint, compared with jq, and the text
# shown must be that value at the precision shown. Every row and the budget's
# parts must be there. test_plan_svg's pictures (synthetic plans and
# measurements) are checked for well-formedness too. Bad input: one line
# naming the file, a non-zero exit, no file left behind.
# usage: test_plan_svg_cli.sh INFER TEST_PLAN_SVG REPO_ROOT
set -u
INFER=$1 TEST_PLAN_SVG=$2 ROOT=$3
MODEL=$ROOT/models/stories260K
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fails=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }

have_xmllint=1
if ! command -v xmllint >/dev/null; then
  have_xmllint=0
  echo "SKIP: xmllint not found (Debian: libxml2-utils): the SVGs' well-formedness and numbers are not checked" >&2
fi

# expect_error NAME PATTERN CMD...: exit status in 1..2, stderr one line matching PATTERN.
expect_error() {
  local name=$1 pattern=$2
  shift 2
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

# The picture's figures as JSON lines {k, v, s}: path, exact value, text shown.
svg_figures() {
  xmllint --xpath '//*[@data-key]' "$1" |
    sed -n 's|^<tspan data-key="\([^"]*\)" data-value="\([^"]*\)">\([^<]*\)</tspan>$|\1\t\2\t\3|p' |
    jq -R -c 'split("\t") | {k: .[0], v: .[1], s: .[2]}'
}

# check_svg NAME SVG JSON: well-formed, and its figures equal the plan's JSON.
check_svg() {
  local name=$1 svg=$2 json=$3
  [ -s "$svg" ] || { fail "$name: no SVG written"; return; }
  grep -q '<script' "$svg" && fail "$name: the SVG has a script"
  grep -q 'font-family="[^"]*sans-serif"' "$svg" || fail "$name: no sans-serif fallback"
  [ $have_xmllint -eq 1 ] || return
  xmllint --noout "$svg" 2>"$T/xmlerr" || { fail "$name: not well-formed: $(head -c 400 "$T/xmlerr")"; return; }
  local n_tagged
  n_tagged=$(xmllint --xpath 'count(//*[@data-key])' "$svg")
  svg_figures "$svg" >"$T/figures.jsonl"
  [ "$(wc -l <"$T/figures.jsonl")" -eq "$n_tagged" ] && [ "$n_tagged" -gt 20 ] ||
    fail "$name: $n_tagged tagged figures, $(wc -l <"$T/figures.jsonl") parsed"
  # Each figure: its value equals the JSON's at its path; the text shown is that value at the precision shown.
  jq -r -n --slurpfile plan "$json" '
    def unit: {"B": 1, "KiB": 1024, "MiB": 1048576, "GiB": 1073741824, "GB/s": 1, "tok/s": 1}[.] // 1;
    $plan[0] as $p
    | inputs
    | . as $f
    | ($p | getpath($f.k | split(".") | map(tonumber? // .))) as $want
    | if $want == null then "\($f.k): not in the JSON"
      elif ($want | type) == "number" then
        if ($f.v | tonumber) != $want then "\($f.k): \($f.v) in the SVG, \($want) in the JSON"
        else ($f.s | capture("^(?<n>[0-9]+(\\.(?<d>[0-9]+))?)( (?<u>.*))?$")) as $c
          | if $c == null then "\($f.k): shown as \"\($f.s)\""
            else (($c.u // "B") | unit) as $m | (($c.d // "") | length) as $dec
              | if (($c.n | tonumber) * $m - $want | fabs) > 0.5 * pow(10; -$dec) * $m + 1e-9
                then "\($f.k): shown as \"\($f.s)\", the JSON has \($want)" else empty end
            end
        end
      elif $f.v != $want then "\($f.k): \"\($f.v)\" in the SVG, \"\($want)\" in the JSON"
      elif $f.s != $f.v and ($f.v != "host" or $f.s != "CPU (decode)") then "\($f.k): shown as \"\($f.s)\""
      else empty end' <"$T/figures.jsonl" >"$T/diff"
  [ ! -s "$T/diff" ] || fail "$name: $(head -n 5 "$T/diff")"
  # Everything is drawn: each row's figures, the budget's parts, the token's bytes and the bound.
  jq -r -n --slurpfile plan "$json" '
    [inputs | .k] as $keys
    | $plan[0] as $p
    | ([range($p.entries | length) as $i | ("format", "weight_bytes", "placement", "bytes_per_token")
        | "entries.\($i).\(.)"]
       + [$p.entries | to_entries[] | select(.value.part == "layer") | "entries.\(.key).kv_bytes"]
       + ["budget", "n_ctx", "n_layers", "n_layers_streamed", "n_layers_host"]
       + (["weights_resident", "stream_buffers", "kv_cache", "activations", "cuda_context", "free", "device_total",
           "weights_streamed", "minimum", "all_resident", "read_per_token", "streamed_per_token", "hbm_gbps",
           "pcie_gbps", "tokens_per_second", "resident_tokens_per_second", "kv_type", "n_batch"]
          + (if $p.fits then ["full_ctx_tokens_per_second"] else [] end)
          + (if $p.n_layers_host > 0 then ["host_per_token", "host_gbps"] else [] end) | map("totals." + .)))
    - $keys | .[] | "missing: \(.)"' <"$T/figures.jsonl" >"$T/missing"
  [ ! -s "$T/missing" ] || fail "$name: $(head -n 5 "$T/missing" | tr '\n' ' ')"
}

# --- the plan, drawn and printed by the same run ---------------------------------------------------------------
# stories260K with a layer of each placement: resident, streamed, computed by the CPU (its rate measured here).
plan_case() {
  local name=$1
  shift
  "$INFER" "$@" --json --svg "$T/$name.svg" >"$T/$name.json" 2>"$T/err"
  echo $?
}
rc=$(plan_case mixed "$MODEL" --dry-run --vram 8G --ctx 64 --stream-layers 3 --host-layers 1)
[ "$rc" = 0 ] || fail "--dry-run --svg exited $rc: $(cat "$T/err")"
[ ! -s "$T/err" ] || fail "--dry-run --svg wrote to stderr: $(cat "$T/err")"
jq -e '[.entries[].placement] | index("resident") and index("streamed") and index("host")' "$T/mixed.json" >/dev/null ||
  fail "the mixed plan lacks a placement: $(jq -c '[.entries[].placement]' "$T/mixed.json")"
check_svg "mixed placements" "$T/mixed.svg" "$T/mixed.json"
rc=$(plan_case resident "$MODEL" --dry-run --vram 8G --ctx 64)
[ "$rc" = 0 ] && check_svg "all resident" "$T/resident.svg" "$T/resident.json" || fail "all resident exited $rc"
rc=$(plan_case nf4 "$MODEL" --dry-run --vram 8G --ctx 64 --quant nf4 --stream-layers 2 --host-layers 0)
[ "$rc" = 0 ] && check_svg "--quant nf4" "$T/nf4.svg" "$T/nf4.json" || fail "--quant nf4 exited $rc"
grep -q '>nf4</tspan>' "$T/nf4.svg" || fail "--quant nf4: no nf4 row"
rc=$(plan_case gpu "$MODEL" --dry-run --gpu "rtx 4060" --ctx 64)
[ "$rc" = 0 ] && check_svg "--gpu" "$T/gpu.svg" "$T/gpu.json" || fail "--gpu exited $rc"
grep -q 'of GPU memory (an RTX 4060)' "$T/gpu.svg" || fail "--gpu: the card is not named"
# Sliding-window layers' rings (mistral_sharded at --batch 4: 13 positions a layer).
rc=$(plan_case ring "$ROOT/tests/data/models/mistral_sharded" --dry-run --vram 8G --batch 4)
[ "$rc" = 0 ] && check_svg "ring" "$T/ring.svg" "$T/ring.json" || fail "ring exited $rc"
# Under the minimum: the one-line refusal, and the picture of why.
"$INFER" "$MODEL" --dry-run --vram 540M --json --svg "$T/refused.svg" >"$T/refused.json" 2>"$T/err" &&
  fail "--dry-run under the minimum exited 0"
[ "$(wc -l <"$T/err")" -eq 1 ] || fail "under the minimum: stderr: $(cat "$T/err")"
check_svg "refused" "$T/refused.svg" "$T/refused.json"
grep -q 'does not fit: ' "$T/refused.svg" || fail "refused: the picture does not say so"

# --report --svg on the CPU: the plan for --vram, drawn before the run; the same figures as the dry run's.
"$INFER" "$MODEL" --prompt-ids 1,403 -n 2 --device cpu --report --vram 8G --ctx 64 --stream-layers 2 --host-layers 0 \
  --svg "$T/report.svg" >/dev/null 2>"$T/err" || fail "--report --svg exited $?: $(cat "$T/err")"
"$INFER" "$MODEL" --dry-run --vram 8G --ctx 64 --stream-layers 2 --host-layers 0 --device cpu --json \
  >"$T/report.json" 2>/dev/null
check_svg "--report --svg" "$T/report.svg" "$T/report.json"

# test_plan_svg's pictures: synthetic plans (8B with each placement, 80 layers, refused) and what a GPU run measures.
mkdir -p "$T/synth"
"$TEST_PLAN_SVG" "$T/synth" >/dev/null || fail "test_plan_svg failed"
n=0
for f in "$T"/synth/*.svg; do
  [ -s "$f" ] || continue
  n=$((n + 1))
  [ $have_xmllint -eq 0 ] || xmllint --noout "$f" 2>"$T/xmlerr" || fail "$(basename "$f"): $(head -c 300 "$T/xmlerr")"
done
[ $n -ge 5 ] || fail "test_plan_svg wrote $n pictures"
grep -q 'Measured in this run' "$T/synth/8b-measured.svg" || fail "no measured section in 8b-measured.svg"

# --- bad input --------------------------------------------------------------------------------------------------
expect_error "--svg to a missing folder" "$T/no-such-dir/p.svg: cannot write the SVG: No such file" \
  "$INFER" "$MODEL" --dry-run --vram 8G --svg "$T/no-such-dir/p.svg"
if [ -w /dev/full ]; then
  expect_error "--svg to a full disk" "/dev/full: cannot write the SVG: No space left" \
    "$INFER" "$MODEL" --dry-run --vram 8G --svg /dev/full
fi
expect_error "--svg without a value" "--svg needs a value" env "$INFER" "$MODEL" --dry-run --vram 8G --svg
expect_error "--svg without --dry-run or --report" "--svg draws the plan: use it with --dry-run or --report" \
  "$INFER" "$MODEL" --prompt hi --svg "$T/x.svg"
expect_error "--svg of a missing model" "nonexistent" "$INFER" "$T/nonexistent" --dry-run --vram 8G --svg "$T/gone.svg"
[ ! -e "$T/gone.svg" ] || fail "--svg of a missing model left $T/gone.svg"
# Nothing drawn: a regular file is removed, anything else kept (a link to /dev/null here: --svg /dev/null).
ln -s /dev/null "$T/null.svg"
expect_error "--svg /dev/null of a missing model" "nonexistent" "$INFER" "$T/nonexistent" --dry-run --vram 8G --svg "$T/null.svg"
[ -L "$T/null.svg" ] || fail "--svg to a link to /dev/null of a missing model removed the link"
expect_error "--report --svg on the CPU without --vram" "--svg .*gone2.svg: no plan to draw: the model runs on the CPU" \
  "$INFER" "$MODEL" --prompt-ids 1,403 -n 2 --report --svg "$T/gone2.svg"
[ ! -e "$T/gone2.svg" ] || fail "--report --svg on the CPU left $T/gone2.svg"

if [ $fails -gt 0 ]; then
  echo "test_plan_svg_cli: $fails check(s) failed" >&2
  exit 1
fi
echo "test_plan_svg_cli: all checks passed"
