/*
 * tokenize: text to token ids (and back) with a model's tokenizer.
 *
 *   tokenize PATH --text TEXT [--special]    prints the ids as a JSON array
 *   tokenize PATH --file F [--special]
 *   tokenize PATH --decode 1,2,3 [--skip-special]   prints the text
 *   tokenize PATH --messages FILE.json [--no-generation-prompt] [--render] [--chat-template FILE]
 *                                            the chat template's prompt, as ids or text
 *
 * PATH is a tokenizer.json, a folder holding one, or the
 * tokenizer_config.json beside it. A thin client of include/engine.h.
 */
#define _POSIX_C_SOURCE 200809L /* mmap, clock_gettime, PATH_MAX under -std=c11 */

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat.h"
#include "cli_util.h"
#include "engine.h"

static const char USAGE[] =
    "usage: tokenize PATH (--text TEXT | --file F | --decode IDS | --messages FILE.json) [options]\n"
    "  PATH            tokenizer.json, a folder holding it, or the tokenizer_config.json beside it\n"
    "  --text TEXT     encode TEXT; prints the ids as a JSON array\n"
    "  --file F        encode the contents of F ('-' for stdin)\n"
    "  --special       add BOS/EOS as the tokenizer's config says\n"
    "  --decode IDS    decode comma-separated ids; prints the text\n"
    "  --skip-special  with --decode, leave special tokens out\n"
    "  --messages FILE.json    a conversation ({\"messages\": [{\"role\", \"content\"}...], \"variables\": {}})\n"
    "                  laid out by the chat template; prints the prompt's ids\n"
    "  --render        with --messages, print the rendered text exactly instead (no newline added)\n"
    "  --no-generation-prompt  with --messages, do not open the assistant's turn\n"
    "  --chat-template FILE    a Jinja chat template instead of the tokenizer's\n";

int main(int argc, char **argv)
{
    const char *path = NULL, *text = NULL, *file = NULL, *decode = NULL, *messages = NULL, *chat_template = NULL;
    int special = 0, skip_special = 0, render = 0, gen_prompt = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(USAGE, stdout);
            return 0;
        } else if (!strcmp(a, "--text") || !strcmp(a, "--file") || !strcmp(a, "--decode")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "tokenize: %s needs a value\n", a);
                return 2;
            }
            const char **dst = a[2] == 't' ? &text : a[2] == 'f' ? &file : &decode;
            *dst = argv[++i];
        } else if (!strcmp(a, "--messages") || !strcmp(a, "--chat-template")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "tokenize: %s needs a value\n", a);
                return 2;
            }
            *(a[2] == 'm' ? &messages : &chat_template) = argv[++i];
        } else if (!strcmp(a, "--render")) {
            render = 1;
        } else if (!strcmp(a, "--no-generation-prompt")) {
            gen_prompt = 0;
        } else if (!strcmp(a, "--special")) {
            special = 1;
        } else if (!strcmp(a, "--skip-special")) {
            skip_special = 1;
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "tokenize: unknown option %s\n", a);
            return 2;
        } else if (!path) {
            path = a;
        } else {
            fprintf(stderr, "tokenize: unexpected argument '%s'\n", a);
            return 2;
        }
    }
    if (!path || (!!text + !!file + !!decode + !!messages) != 1) {
        fputs(USAGE, stderr);
        return 2;
    }

    char err[512];
    engine_tokenizer *tok = NULL;
    if (engine_tokenizer_load(path, &tok, err, sizeof err) != ENGINE_OK) {
        fprintf(stderr, "tokenize: %s\n", err);
        return 1;
    }
    int rc = 1;
    char *buf = NULL;
    int32_t *ids = NULL;
    if (messages) {
        size_t len = 0, n = 0;
        if (render) {
            if ((buf = chat_render_file("tokenize", tok, messages, chat_template, gen_prompt, &len)) != NULL) {
                fwrite(buf, 1, len, stdout);
                rc = 0;
            }
        } else if (chat_prompt_ids("tokenize", tok, messages, chat_template, gen_prompt, &ids, &n) == 0) {
            cli_json_ids(stdout, ids, n);
            fputc('\n', stdout);
            rc = 0;
        }
    } else if (decode) {
        long n = cli_parse_ids(decode, &ids);
        if (n < 0) {
            fprintf(stderr, "tokenize: bad id list '%s'\n", decode);
            rc = 2;
            goto done;
        }
        size_t need = 0;
        engine_status st = engine_detokenize(tok, ids, (size_t)n, skip_special, NULL, 0, &need);
        if (st != ENGINE_OK && st != ENGINE_ERR_BUFFER_TOO_SMALL) {
            fprintf(stderr, "tokenize: %s\n", engine_tokenizer_last_error(tok));
            goto done;
        }
        buf = malloc(need + 1);
        if (!buf || engine_detokenize(tok, ids, (size_t)n, skip_special, buf, need + 1, &need) != ENGINE_OK)
            goto done;
        fwrite(buf, 1, need, stdout);
        fputc('\n', stdout);
        rc = 0;
    } else {
        size_t len;
        if (file) {
            buf = cli_read_file(file, &len);
            if (!buf) {
                fprintf(stderr, "tokenize: %s: cannot read: %s\n", file, strerror(errno));
                goto done;
            }
            text = buf;
        } else {
            len = strlen(text);
        }
        size_t n = 0;
        engine_status st = cli_tokenize(tok, text, len, special, &ids, &n);
        if (st != ENGINE_OK) {
            fprintf(stderr, "tokenize: %s\n", st == ENGINE_ERR_OUT_OF_MEMORY ? "out of memory" : engine_tokenizer_last_error(tok));
            goto done;
        }
        cli_json_ids(stdout, ids, n);
        fputc('\n', stdout);
        rc = 0;
    }
done:
    free(ids);
    free(buf);
    engine_tokenizer_free(tok);
    return rc;
}
