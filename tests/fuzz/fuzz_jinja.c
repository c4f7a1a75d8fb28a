/*
 * fuzz_jinja: arbitrary bytes as a chat template, parsed and rendered with a
 * small fixed conversation and tight limits. A parse either fails with a
 * "line L, column C:" message or yields a template; a render either fails
 * with one "line L:" line or returns exactly *out_len bytes, NUL-terminated,
 * within the output limit.
 */
#include "fuzz_util.h"

#include <string.h>

#include <jansson.h>

#include "jinja/jinja.h"

static const char *CTX =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"},"
    " {\"role\": \"user\", \"content\": \"Hi \\u00fc\"},"
    " {\"role\": \"assistant\", \"content\": \"Hello\", \"tool_calls\": [{\"type\": \"function\","
    " \"function\": {\"name\": \"f\", \"arguments\": {\"a\": 1, \"b\": [true, null, 2.5]}}}]},"
    " {\"role\": \"tool\", \"content\": \"42\"}],"
    " \"add_generation_prompt\": true, \"bos_token\": \"<s>\", \"eos_token\": \"</s>\","
    " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"type\": \"object\"}}}]}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static json_t *ctx;
    if (!ctx) {
        ctx = json_loads(CTX, 0, NULL);
        FUZZ_ASSERT(ctx);
    }
    char err[256];
    jinja_template *t = jinja_parse((const char *)data, size, err, sizeof err);
    if (!t) {
        FUZZ_ASSERT(!strncmp(err, "line ", 5) && strstr(err, ", column "));
        return 0;
    }
    jinja_limits lim = {.max_output = 1 << 16, .max_depth = 16, .max_steps = 20000, .now = 1721952000};
    char *out = NULL;
    size_t n = 0;
    if (jinja_render(t, ctx, &lim, &out, &n, err, sizeof err) == 0) {
        FUZZ_ASSERT(out && out[n] == 0 && n <= lim.max_output);
        free(out);
    } else {
        FUZZ_ASSERT(!out && !strncmp(err, "line ", 5) && !strchr(err, '\n'));
    }
    jinja_free(t);
    return 0;
}
