/*
 * chat.h: the tools' chat commands (tools/chat.c): a messages file
 * rendered with the model's chat template (tokenize --messages, infer
 * --messages) and the interactive chat of infer --chat. Errors are printed
 * as one line on stderr, prefixed with the program's name.
 */
#ifndef TOOLS_CHAT_H
#define TOOLS_CHAT_H

#include <stddef.h>
#include <stdint.h>

#include "engine.h"

/*
 * Render the messages file at path (an object with "messages" and optional
 * "variables") with tok's template, or the one in template_path when not
 * NULL. Returns the malloc'd text (free() it) and its length, or NULL
 * after printing why.
 */
char *chat_render_file(const char *prog, const engine_tokenizer *tok, const char *path, const char *template_path,
                       int add_generation_prompt, size_t *len);

/* The same, tokenized as a chat prompt (engine_chat_tokenize): *ids malloc'd. Returns 0 or 1. */
int chat_prompt_ids(const char *prog, const engine_tokenizer *tok, const char *path, const char *template_path,
                    int add_generation_prompt, int32_t **ids, size_t *n_ids);

/*
 * infer --chat: read user turns from stdin, one a line, until /exit or the
 * end of input (/reset starts over), and stream each reply to stdout. Every
 * turn renders the whole conversation and evaluates only what the session's
 * cache does not hold already; a summary line per turn goes to stderr.
 * Ctrl-C stops the reply being generated. Returns the exit status.
 */
int chat_interactive(engine_model *model, engine_session *s, const engine_generate_params *gp, const char *system,
                     const char *template_path);

#endif
