/*
 * fuzz_model: a whole checkpoint from arbitrary bytes, through the public
 * API. The first two bytes (little-endian) give the length of config.json;
 * the rest is model.safetensors. Both land in a private folder, then
 * engine_model_load() (CPU) must refuse them with a message naming a file,
 * or load a model whose session evaluates tokens and generates: binding
 * tensors to the architecture's shapes and the forward pass over whatever
 * the weights hold must stay inside their buffers.
 */
#include "fuzz_util.h"

#include <string.h>

#include "engine.h"

static char dir[64];
static char cfg_path[128], st_path[128];

static void write_file(const char *path, const uint8_t *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f || (n && fwrite(p, 1, n, f) != n) || fclose(f) != 0) {
        perror(path);
        abort();
    }
}

static void remove_dir(void)
{
    unlink(cfg_path);
    unlink(st_path);
    rmdir(dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    snprintf(dir, sizeof dir, "%s/fuzz_model_XXXXXX", access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        exit(1);
    }
    snprintf(cfg_path, sizeof cfg_path, "%s/config.json", dir);
    snprintf(st_path, sizeof st_path, "%s/model.safetensors", dir);
    atexit(remove_dir);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    size_t n_cfg = (size_t)data[0] | (size_t)data[1] << 8;
    if (n_cfg > size - 2)
        n_cfg = size - 2;
    write_file(cfg_path, data + 2, n_cfg);
    write_file(st_path, data + 2 + n_cfg, size - 2 - n_cfg);

    engine_model_params mp = engine_model_default_params();
    mp.device = ENGINE_DEVICE_CPU;
    mp.n_threads = 1;
    engine_model *m = NULL;
    char err[512] = "";
    if (engine_model_load(dir, &mp, &m, err, sizeof err) != ENGINE_OK) {
        FUZZ_ASSERT(m == NULL && strstr(err, dir) != NULL && !strchr(err, '\n'));
        return 0;
    }
    engine_model_info info;
    FUZZ_ASSERT(engine_model_get_info(m, &info) == ENGINE_OK && info.vocab_size > 0);
    engine_session_params sp = engine_session_default_params();
    sp.n_ctx = 6;
    engine_session *s = NULL;
    if (engine_session_create(m, &sp, &s, err, sizeof err) == ENGINE_OK) {
        const int32_t ids[3] = {0, info.vocab_size - 1, info.vocab_size / 2};
        const float *logits = NULL;
        FUZZ_ASSERT(engine_session_eval(s, ids, 3, &logits) == ENGINE_OK && logits);
        engine_generate_params gp = engine_generate_default_params();
        gp.n_predict = 2;
        gp.sampling.temperature = 0.7f; /* NaN logits must not break the sampler either */
        gp.sampling.seed = 1;
        size_t n = 0;
        int32_t out[2];
        const engine_status st = engine_generate(s, ids, 1, &gp, out, 2, &n, NULL);
        /* Weights may well make every logit NaN: that is the one refusal. */
        if (st != ENGINE_OK)
            fprintf(stderr, "engine_generate: %s: %s\n", engine_status_str(st), engine_session_last_error(s));
        FUZZ_ASSERT(st == ENGINE_OK || (st == ENGINE_ERR_FORMAT && strstr(engine_session_last_error(s), "NaN")));
        for (size_t i = 0; i < n; i++)
            FUZZ_ASSERT(out[i] >= 0 && out[i] < info.vocab_size);
        engine_session_free(s);
    } else {
        FUZZ_ASSERT(strchr(err, '\n') == NULL && err[0]);
    }
    engine_model_free(m);
    return 0;
}
