#!/usr/bin/env bash
# build.sh: set up, build and run on a fresh Debian 12 machine.
#   ./build.sh demo   install what is missing, build, generate text with the bundled model
#   ./build.sh test   install what is missing, build, run the whole test suite (what CI runs)
#   ./build.sh build  install what is missing and build only
set -euo pipefail
cd "$(dirname "$0")"

PACKAGES="build-essential cmake pkg-config libjansson-dev libpcre2-dev libutf8proc-dev xz-utils jq"
BUILD_DIR=${BUILD_DIR:-build}

install_missing() {
  local missing=""
  for p in $PACKAGES; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
  done
  [ -z "$missing" ] && return 0
  echo "build.sh: installing$missing" >&2
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends $missing >/dev/null
}

build() {
  install_missing
  cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release -DENGINE_WERROR=ON >/dev/null
  cmake --build "$BUILD_DIR" -j "$(nproc)"
}

case "${1:-}" in
  demo)
    build
    "$BUILD_DIR/infer" models/stories260K --prompt "Once upon a time" -n 200
    ;;
  test)
    build
    ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$(nproc)" -LE gpu
    ;;
  build)
    build
    ;;
  *)
    echo "usage: ./build.sh demo|test|build" >&2
    exit 2
    ;;
esac
