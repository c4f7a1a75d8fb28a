#!/usr/bin/env bash
# test_symbols.sh: libengine.so exports the public API and nothing else:
# every defined dynamic symbol starts with engine_, and every function
# engine.h declares with ENGINE_API is among them.
# usage: test_symbols.sh LIBENGINE_SO ENGINE_H
set -u
SO=$1 HEADER=$2
fails=0
exported=$(nm -D --defined-only "$SO" | awk '{print $3}' | sort -u)
[ -n "$exported" ] || { echo "FAIL: nm found no exported symbols in $SO" >&2; exit 1; }
stray=$(grep -v '^engine_' <<<"$exported")
if [ -n "$stray" ]; then
  echo "FAIL: $SO exports symbols outside the API:" >&2
  head -n 20 <<<"$stray" >&2
  fails=1
fi
# Declarations may wrap: join the header, then take each name before "(" in an ENGINE_API declaration.
declared=$(tr '\n' ' ' <"$HEADER" | grep -o 'ENGINE_API [^;]*;' | grep -o 'engine_[a-z0-9_]* *(' | tr -d ' (' | sort -u)
[ "$(wc -l <<<"$declared")" -ge 20 ] || { echo "FAIL: found only $(wc -l <<<"$declared") declarations in $HEADER" >&2; fails=1; }
missing=$(comm -23 <(echo "$declared") <(echo "$exported"))
if [ -n "$missing" ]; then
  echo "FAIL: declared in engine.h but not exported: $missing" >&2
  fails=1
fi
[ $fails = 0 ] && echo "test_symbols: $(wc -l <<<"$exported") symbols, all engine_*, every declared function exported"
exit $fails
