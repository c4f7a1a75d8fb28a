/*
 * fuzz_config: arbitrary bytes as config.json and as generation_config.json.
 * A parse either fails with a message naming the file or yields a shape the
 * engine can size buffers from: the invariants below are the ones
 * session.c and arch.c rely on.
 */
#include "fuzz_util.h"

#include <string.h>

#include "loaders/config.h"

static fuzz_file input;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *path = fuzz_file_write(&input, data, size);
    err_buf e;
    err_clear(&e);
    cfg_model m;
    memset(&m, 0xA5, sizeof m); /* written only on success */
    cfg_model before = m;
    if (cfg_load_model(path, &m, &e) != ENGINE_OK) {
        FUZZ_ASSERT(memcmp(&m, &before, sizeof m) == 0);
        FUZZ_ASSERT(strncmp(e.msg, path, strlen(path)) == 0);
    } else {
        FUZZ_ASSERT(m.dim > 0 && m.n_layers > 0 && m.n_heads > 0 && m.n_kv_heads > 0 && m.head_dim > 0);
        FUZZ_ASSERT(m.ffn_dim > 0 && m.vocab_size > 0 && m.max_position > 0);
        FUZZ_ASSERT(m.n_heads % m.n_kv_heads == 0);
        /* arch.c and session.c form these products in int. */
        FUZZ_ASSERT((int64_t)m.n_heads * m.head_dim <= INT32_MAX);
        FUZZ_ASSERT((int64_t)m.n_kv_heads * m.head_dim <= INT32_MAX);
        FUZZ_ASSERT(m.head_dim % 2 == 0); /* RoPE rotates halves */
        FUZZ_ASSERT(m.n_eos >= 0 && m.n_eos <= CFG_MAX_EOS);
        FUZZ_ASSERT(memchr(m.architecture, 0, sizeof m.architecture) && memchr(m.model_type, 0, sizeof m.model_type));
        FUZZ_ASSERT(memchr(m.hidden_act, 0, sizeof m.hidden_act) && memchr(m.torch_dtype, 0, sizeof m.torch_dtype));
    }
    cfg_generation g;
    memset(&g, 0, sizeof g);
    err_clear(&e);
    if (cfg_load_generation(path, &g, &e) != ENGINE_OK)
        FUZZ_ASSERT(strncmp(e.msg, path, strlen(path)) == 0);
    else
        FUZZ_ASSERT(g.n_eos >= 0 && g.n_eos <= CFG_MAX_EOS);
    return 0;
}
