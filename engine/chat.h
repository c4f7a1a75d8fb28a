/*
 * chat.h: where a model's chat template comes from, and what it is
 * rendered with (engine/chat.c). The Jinja interpreter itself is jinja/.
 *
 * A tokenizer carries one chat_source, read when it loads: the template
 * text from tokenizer_config.json's chat_template (a string, or a list of
 * {name, template} from which "default" is used, or "tool_use" when the
 * variables give tools), otherwise from chat_template.jinja beside it; and
 * the special-token strings of the config (bos_token, eos_token, unk_token,
 * ...: strings or {"content": ...} objects), passed to the template as
 * transformers passes them. Nothing is parsed until a render asks for it,
 * so a template the interpreter cannot read never stops a model loading.
 */
#ifndef ENGINE_CHAT_H
#define ENGINE_CHAT_H

#include <jansson.h>
#include <stdbool.h>

#include "../loaders/tokenizer.h"
#include "error.h"

typedef struct chat_source {
    char *dflt;         /* the template used without tools; NULL when none        */
    char *tool_use;     /* the "tool_use" template of a named list; NULL if none  */
    char *origin;       /* where the templates came from, for messages: "DIR/tokenizer_config.json
                           (chat_template)" or "DIR/chat_template.jinja"          */
    char *missing;      /* when there is no template at all: the one-line reason  */
    json_t *tokens;     /* {"bos_token": "<s>", ...}: the config's token strings  */
} chat_source;

/*
 * Read the templates and token strings. dir is the folder of the
 * tokenizer; config_path its tokenizer_config.json (NULL when it has
 * none). Only running out of memory, or an unreadable chat_template.jinja,
 * is an error: a model without a template loads, and says why at render.
 */
engine_status chat_source_load(const char *dir, const char *config_path, chat_source **out, err_buf *e);
void chat_source_free(chat_source *c); /* NULL is a no-op */

/*
 * The end-of-turn ids of tok: added special tokens that the template writes
 * and that are end-of-turn markers by name (<|im_end|>, <|eot_id|>, <|end|>,
 * <end_of_turn>, ...). Generation stops at them as at EOS. Writes at most
 * cap ids; returns how many there are.
 */
int chat_end_of_turn_ids(const chat_source *c, const tok_tokenizer *tok, int32_t *ids, int cap);

#endif
