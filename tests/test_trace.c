/*
 * test_trace.c: engine_trace through the public API on stories260K (CPU).
 * A model loaded with a trace records its load, and its sessions their
 * passes with a span per layer; engine_session_set_trace(NULL) stops a
 * session recording and another trace takes it up; metadata set by the
 * caller is kept; the saved file parses as a trace-event object; bad input
 * fails with the documented codes, an unwritable path with a message
 * naming it. tests/test_trace_cli.sh checks the tools' traces in depth.
 */
#define _POSIX_C_SOURCE 200809L /* mkstemp */

#include <jansson.h>
#include <unistd.h>

#include "engine.h"
#include "test_util.h"

/* Events in the saved file named name (any phase); -1 when it does not parse as a trace. */
static int count_events(const char *path, const char *name)
{
    json_t *root = json_load_file(path, 0, NULL);
    json_t *ev = root ? json_object_get(root, "traceEvents") : NULL;
    if (!json_is_array(ev)) {
        json_decref(root);
        return -1;
    }
    int n = 0;
    size_t i;
    json_t *e;
    json_array_foreach(ev, i, e)
    {
        const char *nm = json_string_value(json_object_get(e, "name"));
        n += nm && !strcmp(nm, name);
    }
    json_decref(root);
    return n;
}

static const char *meta(const char *path, const char *key, char *buf, size_t n)
{
    json_t *root = json_load_file(path, 0, NULL);
    const char *v = json_string_value(json_object_get(json_object_get(root, "metadata"), key));
    snprintf(buf, n, "%s", v ? v : "");
    json_decref(root);
    return buf;
}

int main(void)
{
    char model_path[1024], err[512], buf[256];
    test_src_path(model_path, sizeof model_path, "models/stories260K");

    engine_trace *t = NULL, *t2 = NULL;
    CHECK(engine_trace_create(NULL) == ENGINE_ERR_INVALID_ARG);
    CHECK(engine_trace_create(&t) == ENGINE_OK && t);
    CHECK(engine_trace_create(&t2) == ENGINE_OK && t2);
    engine_trace_free(NULL);
    CHECK(engine_trace_set_metadata(NULL, "k", "v") == ENGINE_ERR_INVALID_ARG);
    CHECK(engine_trace_set_metadata(t, NULL, "v") == ENGINE_ERR_INVALID_ARG);
    CHECK(engine_trace_set_metadata(t, "run", "test_trace") == ENGINE_OK);
    CHECK(engine_trace_save(NULL, "/tmp/x.json", err, sizeof err) == ENGINE_ERR_INVALID_ARG);
    CHECK(engine_session_set_trace(NULL, t) == ENGINE_ERR_INVALID_ARG);

    engine_model_params mp = engine_model_default_params();
    mp.device = ENGINE_DEVICE_CPU;
    mp.n_threads = 2;
    mp.trace = t;
    engine_model *m = NULL;
    engine_session *s = NULL;
    CHECK(engine_model_load(model_path, &mp, &m, err, sizeof err) == ENGINE_OK);
    if (!m) {
        fprintf(stderr, "test_trace: %s\n", err);
        return 1;
    }
    CHECK(engine_session_create(m, NULL, &s, err, sizeof err) == ENGINE_OK && s);
    const int32_t ids[] = {1, 200, 300, 400};
    CHECK(engine_session_eval(s, ids, 4, NULL) == ENGINE_OK);
    CHECK(engine_session_eval(s, ids + 1, 1, NULL) == ENGINE_OK);
    /* Detached: this pass goes nowhere; attached to t2: the next goes there. */
    CHECK(engine_session_set_trace(s, NULL) == ENGINE_OK);
    CHECK(engine_session_eval(s, ids + 2, 1, NULL) == ENGINE_OK);
    CHECK(engine_session_set_trace(s, t2) == ENGINE_OK);
    CHECK(engine_session_eval(s, ids + 3, 1, NULL) == ENGINE_OK);

    char path[] = "/tmp/test_trace_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd >= 0)
        close(fd);
    CHECK(engine_trace_save(t, path, err, sizeof err) == ENGINE_OK);
    CHECK(count_events(path, "load") == 1);
    CHECK(count_events(path, "map and validate") == 1);
    CHECK(count_events(path, "prompt pass") == 1);
    CHECK(count_events(path, "decode step") == 1);
    CHECK(count_events(path, "layer 4") == 2);
    CHECK(count_events(path, "layer 5") == 0); /* stories260K has 5 layers */
    CHECK(!strcmp(meta(path, "run", buf, sizeof buf), "test_trace"));
    CHECK(!strcmp(meta(path, "device", buf, sizeof buf), "cpu"));
    CHECK(strstr(meta(path, "model", buf, sizeof buf), "stories260K") != NULL);
    CHECK(engine_trace_save(t2, path, err, sizeof err) == ENGINE_OK);
    CHECK(count_events(path, "load") == 0);
    CHECK(count_events(path, "decode step") == 1);
    CHECK(count_events(path, "layer 0") == 1);
    remove(path);

    /* An unwritable path: IO, one line naming it. */
    err[0] = '\0';
    CHECK(engine_trace_save(t, "/nonexistent/dir/t.json", err, sizeof err) == ENGINE_ERR_IO);
    CHECK(strstr(err, "/nonexistent/dir/t.json") != NULL && !strchr(err, '\n'));

    engine_session_free(s);
    engine_model_free(m);
    engine_trace_free(t);
    engine_trace_free(t2);
    if (test_failures)
        fprintf(stderr, "test_trace: %d failures\n", test_failures);
    else
        printf("test_trace: load, passes and layers recorded where attached, metadata kept, bad input refused\n");
    return test_failures ? 1 : 0;
}
