#!/usr/bin/env bash
# run.sh: build the libFuzzer targets with clang (ASan + UBSan, any report
# fatal) and run each for a bounded time from its committed seed corpus.
# Exits non-zero when a target crashes, leaks, hangs or trips a sanitizer;
# the input that did it is left in $FUZZ_OUT/crash-* (or leak-*, timeout-*).
#
#   FUZZ_SECONDS  time per target (default 60; 0 builds them only)
#   FUZZ_BUILD    build folder (default build-fuzz)
#   FUZZ_OUT      where new corpus entries and crashing inputs go (default $FUZZ_BUILD/out)
#   FUZZ_TARGETS  which targets (default all nine)
#   FUZZ_JOBS     build parallelism (default nproc)
#   FUZZ_PARALLEL targets run at once (default nproc)
set -euo pipefail
cd "$(dirname "$0")/../.."

SECONDS_EACH=${FUZZ_SECONDS:-60}
BUILD=${FUZZ_BUILD:-build-fuzz}
OUT=${FUZZ_OUT:-$BUILD/out}
TARGETS=${FUZZ_TARGETS:-fuzz_safetensors fuzz_st_index fuzz_config fuzz_tok_config fuzz_tokenizer_load fuzz_tokenize fuzz_model fuzz_jinja fuzz_trace_svg}

cmake -S . -B "$BUILD" -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=RelWithDebInfo -DENGINE_CUDA=OFF \
  -DENGINE_WERROR=ON -DENGINE_FUZZ=ON -DENGINE_SANITIZE=address,undefined >/dev/null
cmake --build "$BUILD" -j "${FUZZ_JOBS:-$(nproc)}" --target $TARGETS >/dev/null

if [ "$SECONDS_EACH" -le 0 ]; then
  echo "fuzz: targets built; FUZZ_SECONDS=$SECONDS_EACH, so none run"
  exit 0
fi

# One OpenMP thread: the fuzzed code is single-threaded, and a thread pool
# per process only slows every run.
export OMP_NUM_THREADS=1
# A failed allocation returns NULL, as libc's does (a huge size from a header
# must be an out-of-memory error, not an ASan abort).
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:allocator_may_return_null=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
# One target: 0 when it ran its time out clean; its verdict goes to $OUT/$t.verdict.
run_target() {
  local t=$1
  mkdir -p "$OUT/$t/corpus"
  # Mutations splice in the format's words: JSON syntax plus the target's keys.
  cat tests/fuzz/dict/json.dict "tests/fuzz/dict/$t.dict" >"$OUT/$t.dict"
  # New inputs go to the scratch corpus (first folder); the committed seeds are only read.
  if "$BUILD/tests/fuzz/$t" -dict="$OUT/$t.dict" -max_total_time="$SECONDS_EACH" -timeout=20 -rss_limit_mb=2048 \
       -print_final_stats=1 -artifact_prefix="$OUT/$t/" "$OUT/$t/corpus" "tests/fuzz/corpus/$t" >"$OUT/$t.log" 2>&1; then
    echo "fuzz: $t: $(grep -m1 -o 'stat::number_of_executed_units: *[0-9]*' "$OUT/$t.log" | grep -o '[0-9]*$') runs in ${SECONDS_EACH}s, no findings" >"$OUT/$t.verdict"
  else
    { echo "fuzz: $t FAILED; the report ends:"; grep -v '^#' "$OUT/$t.log" | tail -n 40; } >"$OUT/$t.verdict"
    return 1
  fi
}

# Targets run FUZZ_PARALLEL at a time (default: one per core), each on its own core.
parallel=${FUZZ_PARALLEL:-$(nproc)}
for t in $TARGETS; do
  while [ "$(jobs -rp | wc -l)" -ge "$parallel" ]; do
    wait -n || true
  done
  rm -f "$OUT/$t.verdict"
  run_target "$t" &
done
wait || true
failed=""
for t in $TARGETS; do
  if grep -q "no findings" "$OUT/$t.verdict" 2>/dev/null; then
    cat "$OUT/$t.verdict"
  else
    cat "$OUT/$t.verdict" >&2 2>/dev/null || echo "fuzz: $t: no verdict" >&2
    failed="$failed $t"
  fi
done
if [ -n "$failed" ]; then
  echo "fuzz: failures in:$failed (inputs in $OUT)" >&2
  exit 1
fi
