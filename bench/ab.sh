#!/usr/bin/env bash
# ab.sh: two builds of bench side by side on one model, alternated, so that
# a change is measured against its base in the same call (a GPU machine's
# figures move between leases and within one by a few percent; only runs
# taken together compare).
#   bench/ab.sh [--rounds N] BENCH_A BENCH_B -- BENCH_ARGS...
# Runs A, B, A, B, ... (N rounds, default 2) of `BENCH_X BENCH_ARGS` and
# prints each run's prefill and decode tok/s (bench's JSON line), then
# their medians and B / A. Exits non-zero if a run fails or prints no
# figures. Needs jq.
set -euo pipefail
rounds=2
if [ "${1:-}" = --rounds ]; then
  rounds=${2:?--rounds needs a number}
  shift 2
fi
if [ $# -lt 3 ] || [ "$3" != -- ]; then
  echo "usage: bench/ab.sh [--rounds N] BENCH_A BENCH_B -- BENCH_ARGS..." >&2
  exit 2
fi
case $rounds in '' | *[!0-9]* | 0) echo "ab.sh: --rounds wants a positive number, not '$rounds'" >&2; exit 2 ;; esac
A=$1 B=$2
shift 3
command -v jq >/dev/null || { echo "ab.sh: jq not found (Debian: jq)" >&2; exit 1; }
for b in "$A" "$B"; do [ -x "$b" ] || { echo "ab.sh: $b: not an executable" >&2; exit 1; }; done
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
for i in $(seq "$rounds"); do
  for side in A B; do
    bin=$A
    [ $side = B ] && bin=$B
    if ! "$bin" "$@" >"$T/out" 2>"$T/err"; then
      echo "ab.sh: $side ($bin) failed: $(tail -n 3 "$T/err")" >&2
      exit 1
    fi
    line=$(grep -m1 '^{"model"' "$T/out" || true)
    fig=$(jq -r '"\(.prefill_tok_s) \(.decode_tok_s)"' <<<"$line" 2>/dev/null || true)
    case $fig in
      [0-9]*' '[0-9]*) ;;
      *) echo "ab.sh: $side ($bin) printed no figures" >&2; exit 1 ;;
    esac
    echo "$side $fig" >>"$T/runs"
    printf '%s round %d: prefill %s tok/s, decode %s tok/s\n' "$side" "$i" ${fig}
  done
done
# Medians of each side's runs, and B / A.
jq -Rrs '
  def median: sort | if length % 2 == 1 then .[length / 2 | floor] else (.[length / 2 - 1] + .[length / 2]) / 2 end;
  [split("\n")[] | select(length > 0) | split(" ") | {side: .[0], p: (.[1] | tonumber), d: (.[2] | tonumber)}] as $r
  | ([$r[] | select(.side == "A")]) as $a | ([$r[] | select(.side == "B")]) as $b
  | ([$a[].p] | median) as $ap | ([$a[].d] | median) as $ad | ([$b[].p] | median) as $bp | ([$b[].d] | median) as $bd
  | "median A: prefill \($ap) decode \($ad)\nmedian B: prefill \($bp) decode \($bd)\n"
    + "B / A: prefill \(if $ap > 0 then ($bp / $ap * 1000 | round / 1000) else "-" end)"
    + ", decode \(if $ad > 0 then ($bd / $ad * 1000 | round / 1000) else "-" end)"' "$T/runs"
