#!/usr/bin/env bash
# svg_to_png.sh: render an SVG (infer --svg's plan picture, --trace-svg's or
# build/trace_svg's timeline) to a PNG with headless Chromium, to look at it
# as a browser shows it: labels that overlap, text that runs out of the
# picture. Not part of CI (Chromium is large); Debian: apt-get install chromium.
#   tools/svg_to_png.sh PICTURE.svg [OUT.png]     (default OUT: PICTURE.png)
# SCALE=2 renders at twice the size, to read small labels.
# The window is the SVG's own width and height, read from its root element.
set -euo pipefail
if [ $# -lt 1 ] || [ $# -gt 2 ]; then
  echo "usage: tools/svg_to_png.sh PICTURE.svg [OUT.png]" >&2
  exit 2
fi
svg=$1
png=${2:-${svg%.svg}.png}
[ -r "$svg" ] || { echo "svg_to_png: $svg: cannot read" >&2; exit 1; }
browser=$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)
[ -n "$browser" ] || { echo "svg_to_png: no chromium (Debian: apt-get install chromium)" >&2; exit 1; }
# The root element's width and height (both writers give them as plain numbers of px).
root=$(grep -m1 -o '<svg [^>]*>' "$svg")
w=$(sed -n 's/.* width="\([0-9.]*\)".*/\1/p' <<<"$root")
h=$(sed -n 's/.* height="\([0-9.]*\)".*/\1/p' <<<"$root")
[ -n "$w" ] && [ -n "$h" ] || { echo "svg_to_png: $svg: no width and height on <svg>" >&2; exit 1; }
abs=$(cd "$(dirname "$svg")" && pwd)/$(basename "$svg")
out=$(cd "$(dirname "$png")" && pwd)/$(basename "$png")
# A profile of its own, so that a running browser or a read-only home does not interfere.
profile=$(mktemp -d)
trap 'rm -rf "$profile"' EXIT
"$browser" --headless --no-sandbox --disable-gpu --hide-scrollbars --user-data-dir="$profile" \
  --force-device-scale-factor="${SCALE:-1}" --window-size="${w%.*},${h%.*}" --screenshot="$out" "file://$abs" \
  >"$profile/log" 2>&1 || { cat "$profile/log" >&2; exit 1; }
[ -s "$out" ] || { echo "svg_to_png: chromium wrote no $out" >&2; cat "$profile/log" >&2; exit 1; }
echo "$out"
