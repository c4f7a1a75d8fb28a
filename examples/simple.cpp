// simple.cpp: simple.c again, in C++ with RAII. libengine stays a C
// library; the few wrappers an application wants are written here:
//
//   - a handle lives in a std::unique_ptr (or shared_ptr) whose deleter is
//     the matching engine_*_free, so every path frees it exactly once;
//   - a failed call becomes an exception carrying the status and message;
//   - a session holds a shared_ptr to its model, so the model is freed only
//     after its last session (the order engine.h asks for);
//   - the token callback takes any callable, and an exception thrown in it
//     stops the generation and is rethrown after engine_generate returns
//     (it must never unwind through the C library's frames).
//
//   simple_cpp MODEL [PROMPT] [N]
//
// Prints exactly what simple.c prints.
#include <engine.h>

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace eng {

class error : public std::runtime_error {
public:
    error(engine_status status, const std::string &what)
        : std::runtime_error(what + " (" + engine_status_str(status) + ")"), status_(status) {}
    engine_status status() const { return status_; }

private:
    engine_status status_;
};

class model {
public:
    explicit model(const std::string &path, engine_model_params params = engine_model_default_params())
    {
        char err[512] = "";
        engine_model *m = nullptr;
        engine_status st = engine_model_load(path.c_str(), &params, &m, err, sizeof err);
        if (st != ENGINE_OK)
            throw error(st, err);
        handle_.reset(m, engine_model_free);
    }

    std::vector<int32_t> tokenize(const std::string &text, bool add_special = true) const
    {
        const engine_tokenizer *tok = engine_model_tokenizer(get());
        if (!tok)
            throw error(ENGINE_ERR_UNSUPPORTED, "the model has no tokenizer");
        size_t n = 0;
        engine_status st = engine_tokenize(tok, text.data(), text.size(), add_special, nullptr, 0, &n);
        std::vector<int32_t> ids(n);
        if (st == ENGINE_OK || st == ENGINE_ERR_BUFFER_TOO_SMALL)
            st = engine_tokenize(tok, text.data(), text.size(), add_special, ids.data(), ids.size(), &n);
        if (st != ENGINE_OK)
            throw error(st, engine_tokenizer_last_error(tok));
        return ids;
    }

    engine_model *get() const { return handle_.get(); }
    const std::shared_ptr<engine_model> &shared() const { return handle_; }

private:
    std::shared_ptr<engine_model> handle_;
};

class session {
public:
    explicit session(const model &m, int n_ctx = 0) : model_(m.shared())
    {
        engine_session_params params = engine_session_default_params();
        params.n_ctx = n_ctx;
        char err[512] = "";
        engine_session *s = nullptr;
        engine_status st = engine_session_create(model_.get(), &params, &s, err, sizeof err);
        if (st != ENGINE_OK)
            throw error(st, err);
        handle_.reset(s);
    }

    // Generates after prompt; on_text(const char *text, size_t len) returns
    // false to stop. Returns the timings and the reason it stopped.
    template <class F>
    engine_generate_stats generate(const std::vector<int32_t> &prompt, int n_predict, F &&on_text)
    {
        struct relay {
            F *fn;
            std::exception_ptr failure;
            static int call(int32_t, const char *text, size_t len, void *user)
            {
                relay *r = static_cast<relay *>(user);
                try {
                    return (*r->fn)(text, len) ? 0 : 1;
                } catch (...) {
                    r->failure = std::current_exception();
                    return 1; // stop; rethrown below, outside the C library
                }
            }
        } r{&on_text, nullptr};
        engine_generate_params params = engine_generate_default_params();
        params.n_predict = n_predict;
        params.on_token = &relay::call;
        params.user = &r;
        engine_generate_stats stats;
        engine_status st =
            engine_generate(get(), prompt.data(), prompt.size(), &params, nullptr, 0, nullptr, &stats);
        if (r.failure)
            std::rethrow_exception(r.failure);
        if (st != ENGINE_OK)
            throw error(st, engine_session_last_error(get()));
        return stats;
    }

    engine_memory_report memory() const
    {
        engine_memory_report r;
        engine_status st = engine_session_memory(get(), &r);
        if (st != ENGINE_OK)
            throw error(st, "engine_session_memory");
        return r;
    }

    engine_session *get() const { return handle_.get(); }

private:
    struct free_session {
        void operator()(engine_session *s) const { engine_session_free(s); }
    };
    // Declared first, destroyed last: the model outlives the session.
    std::shared_ptr<engine_model> model_;
    std::unique_ptr<engine_session, free_session> handle_;
};

} // namespace eng

int main(int argc, char **argv)
{
    if (argc < 2) {
        std::fprintf(stderr, "usage: %s MODEL [PROMPT] [N]\n", argv[0]);
        return 2;
    }
    const std::string prompt = argc > 2 ? argv[2] : "Once upon a time";
    const int n_predict = argc > 3 ? std::atoi(argv[3]) : 40;
    try {
        engine_model_params mp = engine_model_default_params();
        mp.log = [](engine_log_level level, const char *msg, void *) {
            if (level <= ENGINE_LOG_WARN)
                std::fprintf(stderr, "engine: %s\n", msg);
        };
        eng::model model(argv[1], mp);
        eng::session session(model, 256);
        std::vector<int32_t> ids = model.tokenize(prompt);

        std::fputs(prompt.c_str(), stdout);
        engine_generate_stats stats = session.generate(ids, n_predict, [](const char *text, size_t len) {
            std::fwrite(text, 1, len, stdout);
            std::fflush(stdout);
            return true;
        });
        std::fputc('\n', stdout);
        std::fprintf(stderr, "%zu prompt tokens, %zu generated in %.3f s\n", stats.n_prompt, stats.n_generated,
                     stats.prompt_seconds + stats.gen_seconds);
        engine_memory_report mem = session.memory();
        std::printf("memory: weights %" PRIu64 " B mapped, KV cache %" PRIu64 " B, activations %" PRIu64
                    " B, host total %" PRIu64 " B\n",
                    mem.weights_mapped, mem.kv_cache, mem.activations, mem.host_total);
        if (mem.device_budget) // on a GPU
            std::printf("device: %" PRIu64 " B in use, peak mapped %" PRIu64 " B of a %" PRIu64 " B budget\n",
                        mem.device_total, mem.device_peak, mem.device_budget);
    } catch (const eng::error &e) {
        std::fprintf(stderr, "engine: %s\n", e.what());
        return 1;
    }
    return 0;
}
