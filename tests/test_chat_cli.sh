#!/usr/bin/env bash
# test_chat_cli.sh: chat templates through the tools: tokenize --messages
# (--render byte for byte as Jinja2 renders it, ids with special tokens and
# BOS handled, --no-generation-prompt, variables, --chat-template), infer
# --messages (the same ids as the rendered prompt given by hand), infer --chat
# driven through stdin (the cache reused from turn to turn, /reset, /exit,
# end of input, Ctrl-C at the prompt, a full context), and one line on stderr
# with a non-zero exit for every kind of bad input.
# Expected renders in tests/data/chat/ were made with jinja2 3.1 set up as
# transformers sets it up (sandboxed, trim_blocks, lstrip_blocks).
# usage: test_chat_cli.sh INFER TOKENIZE REPO_ROOT TEST_DATA
set -u
INFER=$1 TOKENIZE=$2 ROOT=$3 DATA=$4
MODEL=$ROOT/models/stories260K
CHAT=$ROOT/tests/data/chat
QWEN=$DATA/tokenizers/qwen3 LLAMA3=$DATA/tokenizers/llama3
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fails=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }

# expect_error NAME PATTERN CMD...: exit status in 1..2, stderr one line matching PATTERN.
expect_error() {
  local name=$1 pattern=$2
  shift 2
  [ "$1" = "$INFER" ] && set -- "$@" --device cpu
  "$@" >"$T/out" 2>"$T/err" </dev/null
  local rc=$?
  if [ $rc -eq 0 ] || [ $rc -ge 3 ]; then
    fail "$name: exit status $rc (want 1 or 2): $(head -c 300 "$T/err")"
  elif [ "$(wc -l <"$T/err")" -ne 1 ]; then
    fail "$name: stderr is not one line: $(cat "$T/err")"
  elif ! grep -Eq -- "$pattern" "$T/err"; then
    fail "$name: message '$(cat "$T/err")' does not match '$pattern'"
  fi
}

# --- tokenize --messages --render: exactly what Jinja2 renders ---------------
"$TOKENIZE" "$QWEN" --messages "$CHAT/conversation.json" --render >"$T/r" 2>"$T/err" || fail "render qwen3: $(cat "$T/err")"
cmp -s "$T/r" "$CHAT/qwen3.txt" || fail "qwen3 render differs: $(head -c 400 "$T/r")"
"$TOKENIZE" "$QWEN/tokenizer_config.json" --messages "$CHAT/conversation.json" --render --no-generation-prompt >"$T/r" 2>"$T/err" ||
  fail "render qwen3 via tokenizer_config.json: $(cat "$T/err")"
cmp -s "$T/r" "$CHAT/qwen3_no_gen.txt" || fail "qwen3 render without the generation prompt differs: $(head -c 400 "$T/r")"
"$TOKENIZE" "$LLAMA3" --messages "$CHAT/conversation.json" --render >"$T/r" 2>"$T/err" || fail "render llama3: $(cat "$T/err")"
cmp -s "$T/r" "$CHAT/llama3.txt" || fail "llama3 render differs: $(head -c 400 "$T/r")"
# A given template, with a variable from the messages file.
"$TOKENIZE" "$MODEL" --messages "$CHAT/today.json" --chat-template "$CHAT/plain.jinja" --render >"$T/r" 2>"$T/err" ||
  fail "render --chat-template: $(cat "$T/err")"
cmp -s "$T/r" "$CHAT/plain_today.txt" || fail "--chat-template render differs: $(head -c 400 "$T/r")"

# --- ids: special tokens matched, BOS once ------------------------------------
ids=$("$TOKENIZE" "$QWEN" --messages "$CHAT/conversation.json" 2>"$T/err") || fail "qwen3 ids: $(cat "$T/err")"
want=$("$TOKENIZE" "$QWEN" --file "$CHAT/qwen3.txt")
[ "$ids" = "$want" ] || fail "qwen3 ids differ from the rendered text's: $ids"
jq -e '.[0] == 151644 and (map(select(. == 151645)) | length) == 4' <<<"$ids" >/dev/null ||
  fail "qwen3 ids: want <|im_start|> first and four <|im_end|>: $ids"
ids=$("$TOKENIZE" "$LLAMA3" --messages "$CHAT/conversation.json" 2>"$T/err") || fail "llama3 ids: $(cat "$T/err")"
jq -e '.[0] == 128000 and .[1] == 128006 and (map(select(. == 128000)) | length) == 1' <<<"$ids" >/dev/null ||
  fail "llama3 ids: want one <|begin_of_text|> then <|start_header_id|>: $(head -c 200 <<<"$ids")"
# stories260K adds BOS: the template writes <s> itself, so it is not added twice.
ids=$("$TOKENIZE" "$MODEL" --messages "$CHAT/today.json" --chat-template "$CHAT/plain.jinja" 2>"$T/err") ||
  fail "stories260K ids: $(cat "$T/err")"
jq -e '.[0] == 1 and .[1] != 1' <<<"$ids" >/dev/null || fail "stories260K ids: want one BOS: $ids"
printf '{{ messages[0].content }}' >"$T/nobos.jinja"
ids=$("$TOKENIZE" "$MODEL" --messages "$CHAT/today.json" --chat-template "$T/nobos.jinja" 2>"$T/err")
jq -e '.[0] == 1 and length == 3' <<<"$ids" >/dev/null || fail "stories260K without <s> in the template: want BOS added: $ids"

# --- infer --messages: one reply, the same as the rendered prompt's ids -------
prompt=$("$TOKENIZE" "$MODEL" --messages "$CHAT/today.json" --chat-template "$CHAT/plain.jinja" | tr -d '[]')
out=$("$INFER" "$MODEL" --messages "$CHAT/today.json" --chat-template "$CHAT/plain.jinja" -n 12 --json --device cpu 2>"$T/err") ||
  fail "infer --messages: $(cat "$T/err")"
ref=$("$INFER" "$MODEL" --prompt-ids "$prompt" -n 12 --json --device cpu 2>/dev/null)
[ "$(tail -n 1 <<<"$out" | jq -c .generated_ids)" = "$(tail -n 1 <<<"$ref" | jq -c .generated_ids)" ] ||
  fail "infer --messages ids differ from --prompt-ids of the rendered prompt"
[ "$(tail -n 1 <<<"$out" | jq -c .prompt_ids | tr -d '[]')" = "$prompt" ] || fail "infer --messages prompt_ids"
tail -n 1 <<<"$out" | jq -e '(.text | length) > 0' >/dev/null || fail "infer --messages: no reply text"
# Streaming: only the reply, then the summary line.
"$INFER" "$MODEL" --messages "$CHAT/today.json" --chat-template "$CHAT/plain.jinja" -n 12 --device cpu >"$T/out" 2>"$T/err"
[ "$(tr -d '\n' <"$T/out")" = "$(tail -n 1 <<<"$out" | jq -j .text)" ] || fail "streamed reply: $(cat "$T/out")"

# --- infer --chat through stdin -----------------------------------------------
chat() { "$INFER" "$MODEL" --chat --chat-template "$CHAT/plain.jinja" --device cpu -n 8 "$@"; }
printf 'Hello there\nTell me more\n/reset\nHello there\n/exit\nnot read\n' | chat --system "Be kind." >"$T/out" 2>"$T/err" ||
  fail "--chat exited $?: $(cat "$T/err")"
mapfile -t turns < <(grep '^\[prompt' "$T/err")
[ ${#turns[@]} = 3 ] || fail "--chat: want 3 turn summaries: $(cat "$T/err")"
[[ "${turns[0]:-}" =~ ^\[prompt\ ([0-9]+)\ tokens:\ 0\ reused ]] || fail "--chat turn 1: ${turns[0]:-}"
first=${BASH_REMATCH[1]:-0}
[[ "${turns[1]:-}" =~ :\ ([0-9]+)\ reused ]] && [ "${BASH_REMATCH[1]}" -ge "$first" ] ||
  fail "--chat turn 2 reused fewer than turn 1's $first prompt tokens: ${turns[1]:-}"
[[ "${turns[2]:-}" =~ tokens:\ 0\ reused ]] || fail "--chat after /reset: ${turns[2]:-}"
grep -q "conversation reset" "$T/err" || fail "--chat: /reset not acknowledged"
[ "$(wc -l <"$T/out")" = 3 ] || fail "--chat: want 3 reply lines: $(cat "$T/out")"
[ "$(sed -n 1p "$T/out")" = "$(sed -n 3p "$T/out")" ] || fail "--chat: the reply after /reset differs from the first"
# The first reply is what --messages gives for the same conversation.
printf '{"messages":[{"role":"system","content":"Be kind."},{"role":"user","content":"Hello there"}]}' >"$T/m.json"
want=$("$INFER" "$MODEL" --messages "$T/m.json" --chat-template "$CHAT/plain.jinja" -n 8 --json --device cpu 2>/dev/null | tail -n 1 | jq -r .text)
[ "$(sed -n 1p "$T/out")" = "$want" ] || fail "--chat reply '$(sed -n 1p "$T/out")' differs from --messages '$want'"
# End of input ends it too.
printf 'Hi\n' | chat >/dev/null 2>"$T/err" || fail "--chat at end of input exited $?"
# Ctrl-C at the prompt does not end the program.
mkfifo "$T/in"
chat <"$T/in" >"$T/out" 2>"$T/err" &
pid=$!
exec 3>"$T/in"
sleep 1
kill -INT $pid 2>/dev/null
sleep 0.3
printf 'Hi\n/exit\n' >&3
exec 3>&-
wait $pid
rc=$?
[ $rc = 0 ] || fail "--chat after Ctrl-C at the prompt: exit $rc: $(cat "$T/err")"
grep -q '^\[prompt' "$T/err" || fail "--chat after Ctrl-C: no turn: $(cat "$T/err")"
# A context too small for the conversation says which --ctx would do.
printf 'Tell me a long story about a cat and a dog who lived in a small house\n/exit\n' | chat --ctx 12 >/dev/null 2>"$T/err"
grep -q -- "--ctx [0-9]" "$T/err" || fail "--chat with a full context: $(cat "$T/err")"

# --- bad input: one line naming the file and the place ------------------------
printf 'Hello {%% if %%}' >"$T/syntax.jinja"
expect_error "template syntax error" "syntax\.jinja: line 1, column [0-9]+" "$TOKENIZE" "$MODEL" --messages "$CHAT/today.json" --chat-template "$T/syntax.jinja" --render
printf 'line one\n{{ raise_exception("Only user and assistant roles are supported!") }}' >"$T/raise.jinja"
expect_error "raise_exception" "raise\.jinja: .*Only user and assistant roles are supported!" "$INFER" "$MODEL" --messages "$CHAT/today.json" --chat-template "$T/raise.jinja"
printf '{{ nothing.here }}' >"$T/undef.jinja"
expect_error "undefined variable" "undef\.jinja: .*nothing" "$TOKENIZE" "$MODEL" --messages "$CHAT/today.json" --chat-template "$T/undef.jinja"
printf '{%% macro f(n) %%}{{ f(n) }}{%% endmacro %%}{{ f(1) }}' >"$T/deep.jinja"
expect_error "recursion limit" "deep\.jinja: " "$TOKENIZE" "$MODEL" --messages "$CHAT/today.json" --chat-template "$T/deep.jinja" --render
printf '{"messages": [{"role": "user", "content": "Hi"}' >"$T/trunc.json"
expect_error "messages not JSON" "trunc\.json: line 1, column [0-9]+" "$TOKENIZE" "$QWEN" --messages "$T/trunc.json"
printf '{"messages": [{"role": "user", "content": "Hi"}, {"content": "no role"}]}' >"$T/norole.json"
expect_error "message without a role" 'norole\.json: messages\[1\] has no "role"' "$INFER" "$MODEL" --messages "$T/norole.json" --chat-template "$CHAT/plain.jinja"
printf '{"messages": [{"role": "user"}]}' >"$T/nocontent.json"
expect_error "message without content" 'nocontent\.json: messages\[0\] has no "content"' "$TOKENIZE" "$QWEN" --messages "$T/nocontent.json"
printf '{"msgs": []}' >"$T/nomessages.json"
expect_error "no messages list" 'nomessages\.json: no "messages"' "$TOKENIZE" "$QWEN" --messages "$T/nomessages.json"
expect_error "missing messages file" "nothere\.json: cannot read" "$TOKENIZE" "$QWEN" --messages "$T/nothere.json"
expect_error "missing template file" "nothere\.jinja: cannot read" "$TOKENIZE" "$QWEN" --messages "$CHAT/today.json" --chat-template "$T/nothere.jinja"
expect_error "no chat template" "tokenizer_config\.json has no chat_template.*--chat-template" "$TOKENIZE" "$MODEL" --messages "$CHAT/today.json"
expect_error "no chat template (--chat)" "tokenizer_config\.json has no chat_template.*--chat-template" "$INFER" "$MODEL" --chat

[ $fails = 0 ] && echo "test_chat_cli: all checks passed"
exit $((fails > 0))
