#!/usr/bin/env bash
# test_bench_ab.sh: bench/ab.sh, the side-by-side of two bench builds, on
# stories260K with the same bench as both sides: alternated runs, medians
# and ratios read from bench's JSON; and its refusals (a bad round count,
# a side that prints no figures, a failing run), each with a non-zero exit.
#   test_bench_ab.sh BENCH REPO_ROOT
set -u
BENCH=$1 ROOT=$2
M=$ROOT/models/stories260K
AB=$ROOT/bench/ab.sh
command -v jq >/dev/null || { echo "SKIP: jq not found"; exit 77; }
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fails=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }

bash "$AB" --rounds 2 "$BENCH" "$BENCH" -- "$M" --device cpu --prompt 4 --gen 8 --reps 1 >"$T/out" 2>"$T/err" ||
  fail "ab.sh on stories260K: $(tail -n 3 "$T/err")"
[ "$(grep -c '^A round' "$T/out")" = 2 ] && [ "$(grep -c '^B round' "$T/out")" = 2 ] ||
  fail "want 2 rounds of each side, got: $(cat "$T/out")"
# The order alternates: A, B, A, B.
[ "$(grep -o '^[AB] round [0-9]' "$T/out" | tr '\n' ' ')" = "A round 1 B round 1 A round 2 B round 2 " ] ||
  fail "runs not alternated: $(cat "$T/out")"
# The medians are those of the runs printed (two runs: their mean), and the ratio theirs.
want=$(awk '/^A round/ {a += $8} /^B round/ {b += $8} END {printf "%.3f", (b / 2) / (a / 2)}' "$T/out")
got=$(sed -n 's/^B \/ A: prefill [0-9.]*, decode \([0-9.]*\)$/\1/p' "$T/out")
[ -n "$got" ] && awk -v w="$want" -v g="$got" 'BEGIN {exit !(w - g < 0.0015 && g - w < 0.0015)}' ||
  fail "decode ratio '$got', want $want from the runs: $(cat "$T/out")"

bash "$AB" --rounds 0 "$BENCH" "$BENCH" -- "$M" >/dev/null 2>"$T/err" && fail "--rounds 0 accepted"
grep -q "positive number" "$T/err" || fail "--rounds 0: $(cat "$T/err")"
bash "$AB" "$BENCH" /bin/true -- "$M" --device cpu --prompt 4 --gen 4 --reps 1 >/dev/null 2>"$T/err" &&
  fail "a side with no figures accepted"
grep -q "B (/bin/true) printed no figures" "$T/err" || fail "no figures: $(cat "$T/err")"
bash "$AB" "$BENCH" "$BENCH" -- "$T/missing" >/dev/null 2>"$T/err" && fail "a failing run accepted"
grep -q "A ($BENCH) failed: .*missing" "$T/err" || fail "failing run: $(cat "$T/err")"
bash "$AB" "$BENCH" "$BENCH" "$M" >/dev/null 2>"$T/err" && fail "a call without -- accepted"
grep -q "usage" "$T/err" || fail "no usage line: $(cat "$T/err")"

[ $fails = 0 ] && echo "test_bench_ab: alternated runs, medians and ratios as printed, bad calls refused"
exit $((fails > 0))
