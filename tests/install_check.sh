#!/usr/bin/env bash
# install_check.sh: libengine as an application sees it. Installs the build
# to a temporary prefix, checks the layout, then builds every program in
# examples/ against the installed package four ways (pkg-config and CMake,
# each with the shared and with the static library) and runs them on the
# bundled model.
# usage: install_check.sh SOURCE_DIR BUILD_DIR   (CC and CXX name the compilers)
set -u
SRC=$1 BUILD=$2
CC=${CC:-cc} CXX=${CXX:-c++}
MODEL=$SRC/models/stories260K
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fails=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }
have_cxx=1
command -v "$CXX" >/dev/null || { have_cxx=0; echo "install_check: no C++ compiler, skipping simple.cpp"; }

# --- install and layout ------------------------------------------------------
P=$T/prefix
cmake --install "$BUILD" --prefix "$P" >"$T/install.log" 2>&1 || { cat "$T/install.log" >&2; fail "cmake --install"; exit 1; }
LIB=$(dirname "$(find "$P" -name libengine.a | head -n 1)")
[ -d "$LIB" ] || { fail "no libengine.a under $P"; exit 1; }
for f in "$P/include/engine.h" "$P/bin/infer" "$P/bin/tokenize" "$LIB/libengine.so" "$LIB/pkgconfig/engine.pc" \
  "$LIB/pkgconfig/engine-static.pc" "$LIB/cmake/engine/engineConfig.cmake" "$LIB/cmake/engine/engineConfigVersion.cmake"; do
  [ -e "$f" ] || fail "not installed: ${f#"$P"/}"
done
soname=$(readelf -d "$LIB/libengine.so" | sed -n 's/.*Library soname: \[\(.*\)\]/\1/p')
[ -n "$soname" ] && [ -e "$LIB/$soname" ] || fail "SONAME '$soname' of libengine.so is not installed beside it"
"$P/bin/infer" --version | grep -q "libengine" || fail "installed infer --version"

# --- running the examples ----------------------------------------------------
# The text greedy decoding of stories260K gives (tests/data/reference/).
WANT="Once upon a time, there was a little girl named Lily. She loved to play outside in the park."
# run_examples DIR LABEL LINKAGE: run simple, simple_cpp and two_sessions from DIR;
# LINKAGE (shared|static) is checked against what the binaries load.
run_examples() {
  local dir=$1 label=$2 linkage=$3
  for exe in simple two_sessions $([ $have_cxx = 1 ] && echo simple_cpp); do
    [ -x "$dir/$exe" ] || { fail "$label: $exe was not built"; continue; }
    if readelf -d "$dir/$exe" | grep -q "NEEDED.*libengine\.so"; then
      [ "$linkage" = shared ] || fail "$label: $exe loads libengine.so"
    else
      [ "$linkage" = static ] || fail "$label: $exe does not load libengine.so"
    fi
  done
  "$dir/simple" "$MODEL" >"$T/out.c" 2>"$T/err" || fail "$label: simple exited $?: $(cat "$T/err")"
  grep -qF "$WANT" "$T/out.c" || fail "$label: simple printed: $(head -c 300 "$T/out.c")"
  grep -q "^memory: weights [1-9][0-9]* B mapped, KV cache [1-9]" "$T/out.c" || fail "$label: simple printed no memory report"
  if [ $have_cxx = 1 ]; then
    "$dir/simple_cpp" "$MODEL" >"$T/out.cpp" 2>"$T/err" || fail "$label: simple_cpp exited $?: $(cat "$T/err")"
    cmp -s "$T/out.c" "$T/out.cpp" || fail "$label: simple_cpp printed something else than simple: $(head -c 300 "$T/out.cpp")"
    "$dir/simple_cpp" /nonexistent >/dev/null 2>"$T/err" && fail "$label: simple_cpp succeeded on a missing model"
    grep -q "^engine: /nonexistent.*(I/O error)" "$T/err" || fail "$label: simple_cpp error: $(cat "$T/err")"
  fi
  "$dir/two_sessions" "$MODEL" >"$T/out.two" 2>"$T/err" || fail "$label: two_sessions exited $?: $(cat "$T/err")"
  [ "$(grep -c "^session [01]: " "$T/out.two")" = 2 ] || fail "$label: two_sessions printed: $(cat "$T/out.two")"
}

# --- through pkg-config ------------------------------------------------------
# Strict C11 and C++17: the installed header is held to what test_header_* ask of the tree's.
export PKG_CONFIG_PATH=$LIB/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
for linkage in shared static; do
  pc=engine
  [ $linkage = static ] && pc=engine-static
  d=$T/pc-$linkage
  mkdir -p "$d"
  flags=$(pkg-config --cflags --libs $pc) || { fail "pkg-config $pc"; continue; }
  rpath=""
  [ $linkage = shared ] && rpath="-Wl,-rpath,$(pkg-config --variable=libdir $pc)"
  # shellcheck disable=SC2086 # flags are words
  {
    "$CC" -std=c11 -pedantic -Wall -Wextra -Werror "$SRC/examples/simple.c" -o "$d/simple" $flags $rpath &&
      "$CC" -std=c11 -pedantic -Wall -Wextra -Werror -pthread "$SRC/examples/two_sessions.c" -o "$d/two_sessions" $flags $rpath &&
      { [ $have_cxx = 0 ] || "$CXX" -std=c++17 -pedantic -Wall -Wextra -Werror "$SRC/examples/simple.cpp" -o "$d/simple_cpp" $flags $rpath; }
  } 2>"$T/err" || { fail "pkg-config $linkage: build: $(head -c 2000 "$T/err")"; continue; }
  run_examples "$d" "pkg-config $linkage" $linkage
done

# --- through the CMake package -----------------------------------------------
# One build folder, reconfigured for the static library: the compilers are
# probed once.
d=$T/cmake
cxx_flag=""
[ $have_cxx = 1 ] && cxx_flag=-DCMAKE_CXX_COMPILER=$CXX
for linkage in shared static; do
  static=OFF
  [ $linkage = static ] && static=ON
  if cmake -S "$SRC/examples" -B "$d" -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$P" -DENGINE_EXAMPLES_STATIC=$static \
    -DCMAKE_C_COMPILER="$CC" ${cxx_flag:+"$cxx_flag"} -DCMAKE_C_FLAGS=-Werror -DCMAKE_CXX_FLAGS=-Werror \
    >"$T/cmake.log" 2>&1 && cmake --build "$d" -j 2 >>"$T/cmake.log" 2>&1; then
    run_examples "$d" "cmake $linkage" $linkage
  else
    fail "cmake $linkage: $(tail -n 30 "$T/cmake.log")"
  fi
done
# An unknown component is refused.
mkdir -p "$T/badcomp"
printf 'cmake_minimum_required(VERSION 3.20)\nproject(p NONE)\nfind_package(engine CONFIG REQUIRED COMPONENTS nonesuch)\n' \
  >"$T/badcomp/CMakeLists.txt"
cmake -S "$T/badcomp" -B "$T/badcomp/b" -DCMAKE_PREFIX_PATH="$P" >"$T/cmake.log" 2>&1 &&
  fail "find_package(engine COMPONENTS nonesuch) succeeded"
grep -q "unknown component 'nonesuch'" "$T/cmake.log" || fail "bad component message: $(tail -n 5 "$T/cmake.log")"

[ $fails = 0 ] && echo "install_check: all checks passed"
[ $fails = 0 ]
