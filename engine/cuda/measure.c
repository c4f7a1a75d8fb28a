/*
 * measure.c: this device's bandwidths and the host's shared read rate, for
 * the planner (measure.h says what each is).
 *
 * Device memory: a device-to-device copy between two buffers each at
 * least twice the L2 cache (64-256 MiB), counting bytes read + written.
 * Decode reads weights and writes next to nothing, so a read-only figure
 * would be the exact one; a copy is what the runtime offers without a
 * kernel of our own, and on HBM it comes within 1-2% of it: the H100's
 * copy measured 3,020 GB/s where a read-only reduction measured 3,053
 * (../shared/HARDWARE.md) and bench/gpubw 3,075-3,076 on later machines,
 * the figure bench/RESULTS.md divides its decode results by. The
 * planner's decode bound on that machine is so 1-2% below RESULTS' (on
 * the safe side), and 0.7% above the 3,000 GB/s default it used before.
 * The copies run after a warm-up of about 30 ms (consumer cards lower
 * their memory clock when idle) and the median of eight is taken.
 *
 * Host to device: copies of a 64 MiB pinned buffer into the same region,
 * median of four after a warm-up (an idle PCIe link may run at a lower
 * generation until traffic retrains it). On the H100 machine pinned
 * copies ran at 53-55 GB/s (HARDWARE.md), beside the 54.7 GB/s RESULTS'
 * streaming bounds use.
 *
 * The cache: the two device figures are kept per device ordinal for the
 * process, in a small table behind a mutex. It is the library's second
 * piece of process-wide state (the SIGBUS guard is the first; DESIGN.md),
 * because a measurement costs tens of milliseconds and a device's
 * bandwidth does not change between the models a process loads; the lock
 * also keeps two loads from measuring at once and disturbing each other.
 */
#define _POSIX_C_SOURCE 200809L

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include "../gpus.h"
#include "arena.h"
#include "backend.h"
#include "measure.h"

#define MiB ((uint64_t)1 << 20)
#define UNIT (2 * MiB)              /* the arena's granularity                        */
#define COPY_MIN (64 * MiB)         /* each side of the device copy, at least ...     */
#define COPY_MAX (256 * MiB)        /* ... and at most                                */
#define COPY_TIMED 8
#define H2D_BYTES (64 * MiB)
#define H2D_TIMED 4
#define SHARED_HOST (256 * MiB)     /* pinned source of the shared measurement's copies */
#define SHARED_PIECE (32 * MiB)     /* one copy, and the device region it lands in      */
#define SHARED_DEPTH 4              /* copies in flight                                 */
#define CPU_PASSES 3                /* cpu_layer_rate reads each layer this many times  */
#define MAX_DEVICES 64

static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    int done;
    double device_gbps, h2d_gbps;
} cache[MAX_DEVICES];

uint64_t cuda_measure_room(uint64_t vram_budget)
{
    uint64_t reserve = 0;
    if (vram_budget == 0)
        return UINT64_MAX;
    if (cuda_device_reserve(&reserve, NULL) != ENGINE_OK)
        return 0;
    return vram_budget > reserve ? vram_budget - reserve : 0;
}

static engine_status cuda_err(err_buf *e, const char *what, cudaError_t ce)
{
    cudaGetLastError();
    return err_set(e, ENGINE_ERR_CUDA, "measuring bandwidth: %s: %s", what, cudaGetErrorString(ce));
}

/* A region of `bytes` device memory in an arena of its own. */
typedef struct scratch {
    arena *a;
    void *p;
} scratch;

static void scratch_close(scratch *s)
{
    if (s->a) {
        arena_free(s->a, s->p);
        arena_destroy(s->a);
    }
    s->a = NULL;
    s->p = NULL;
}

static engine_status scratch_open(scratch *s, uint64_t bytes, err_buf *e)
{
    s->a = NULL;
    s->p = NULL;
    engine_status st = arena_create(bytes, getenv("ENGINE_ARENA_PLAIN") != NULL, &s->a, e);
    if (!st)
        st = arena_alloc(s->a, bytes, ARENA_WORKSPACE, "a bandwidth measurement", &s->p, e);
    if (st)
        scratch_close(s);
    return st;
}

static int by_value(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/*
 * Seconds one copy of `bytes` from src to dst takes on stream st: copies
 * for warm seconds first, then the median of n timed one by one.
 */
static engine_status time_copy(cudaStream_t st, void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind,
                               double warm, int n, double *seconds, err_buf *e)
{
    cudaEvent_t ev[COPY_TIMED + 1] = {0};
    double t[COPY_TIMED];
    int made = 0;
    cudaError_t ce = cudaSuccess;
    for (; made <= n && ce == cudaSuccess; made++)
        ce = cudaEventCreate(&ev[made]);
    const double t0 = model_seconds();
    for (int round = 0; ce == cudaSuccess && (round < 2 || model_seconds() - t0 < warm); round++) {
        for (int k = 0; k < 2 && ce == cudaSuccess; k++)
            ce = cudaMemcpyAsync(dst, src, bytes, kind, st);
        if (ce == cudaSuccess)
            ce = cudaStreamSynchronize(st);
    }
    for (int i = 0; i < n && ce == cudaSuccess; i++) {
        ce = cudaEventRecord(ev[i], st);
        if (ce == cudaSuccess)
            ce = cudaMemcpyAsync(dst, src, bytes, kind, st);
    }
    if (ce == cudaSuccess)
        ce = cudaEventRecord(ev[n], st);
    if (ce == cudaSuccess)
        ce = cudaStreamSynchronize(st);
    for (int i = 0; i < n && ce == cudaSuccess; i++) {
        float ms = 0.0f;
        ce = cudaEventElapsedTime(&ms, ev[i], ev[i + 1]);
        t[i] = ms / 1e3;
    }
    for (int i = 0; i < made; i++)
        if (ev[i])
            cudaEventDestroy(ev[i]);
    if (ce != cudaSuccess)
        return cuda_err(e, "timed copies", ce);
    qsort(t, (size_t)n, sizeof t[0], by_value);
    *seconds = n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
    return *seconds > 0.0 ? ENGINE_OK : err_set(e, ENGINE_ERR_CUDA, "measuring bandwidth: a copy took no time");
}

/* The measurement itself (cuda_measure_device without the cache). */
static engine_status measure_device(int dev, uint64_t room, double *dev_gbps, double *h2d_gbps, err_buf *e)
{
    int l2 = 0;
    cudaError_t ce = cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev);
    if (ce != cudaSuccess)
        return cuda_err(e, "L2 size", ce);
    /* Each side twice the L2 at least: a copy then streams three L2s' worth, so next to nothing hits. */
    const uint64_t need = 2 * (uint64_t)l2 > 16 * MiB ? 2 * (uint64_t)l2 : 16 * MiB;
    uint64_t side = (need + UNIT - 1) / UNIT * UNIT;
    side = side < COPY_MIN ? COPY_MIN : side > COPY_MAX ? COPY_MAX : side;
    if (2 * side > room)
        side = room / 2 / UNIT * UNIT;
    if (side < need)
        return err_set(e, ENGINE_ERR_OVER_BUDGET,
                       "measuring bandwidth: %.0f MiB of device memory is too little (two buffers of %.0f MiB needed)",
                       room / (double)MiB, (need + UNIT - 1) / UNIT * UNIT / (double)MiB);
    scratch s;
    engine_status st = scratch_open(&s, 2 * side, e);
    if (st)
        return st;
    cudaStream_t stream = NULL;
    void *host = NULL;
    const size_t h2d = H2D_BYTES < 2 * side ? H2D_BYTES : 2 * side;
    double t_dev = 0.0, t_h2d = 0.0;
    ce = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    if (ce != cudaSuccess)
        st = cuda_err(e, "stream", ce);
    if (!st)
        st = time_copy(stream, (char *)s.p + side, s.p, side, cudaMemcpyDeviceToDevice, 0.03, COPY_TIMED, &t_dev, e);
    if (!st && (ce = cudaHostAlloc(&host, h2d, cudaHostAllocDefault)) != cudaSuccess)
        st = cuda_err(e, "pinned buffer", ce);
    if (!st) {
        memset(host, 0x5a, h2d);
        st = time_copy(stream, s.p, host, h2d, cudaMemcpyHostToDevice, 0.02, H2D_TIMED, &t_h2d, e);
    }
    if (host)
        cudaFreeHost(host);
    if (stream)
        cudaStreamDestroy(stream);
    scratch_close(&s);
    if (st)
        return st;
    *dev_gbps = 2.0 * (double)side / t_dev / 1e9;
    *h2d_gbps = (double)h2d / t_h2d / 1e9;
    return ENGINE_OK;
}

engine_status cuda_measure_device(uint64_t room, double *device_gbps, double *h2d_gbps, err_buf *e)
{
    int dev = 0;
    cudaError_t ce = cudaGetDevice(&dev);
    if (ce != cudaSuccess)
        return cuda_err(e, "device", ce);
    const int cached = dev >= 0 && dev < MAX_DEVICES;
    pthread_mutex_lock(&cache_lock);
    engine_status st = ENGINE_OK;
    if (!cached || !cache[dev].done) {
        double d = 0.0, h = 0.0;
        st = measure_device(dev, room, &d, &h, e);
        if (!st && cached)
            cache[dev].done = 1, cache[dev].device_gbps = d, cache[dev].h2d_gbps = h;
        if (!st && !cached)
            *device_gbps = d, *h2d_gbps = h;
    }
    if (!st && cached)
        *device_gbps = cache[dev].device_gbps, *h2d_gbps = cache[dev].h2d_gbps;
    pthread_mutex_unlock(&cache_lock);
    return st;
}

/* ---- host memory shared by the copy engine and the CPU ---- */

typedef struct feeder {
    int device;
    cudaStream_t stream;
    cudaEvent_t done[SHARED_DEPTH];
    const char *src; /* [SHARED_HOST] pinned */
    void *dst;       /* [SHARED_PIECE] device */
    atomic_int stop;
    atomic_long n_done; /* copies seen complete */
    atomic_int failed;
    cudaError_t err;    /* read after the thread is joined */
} feeder;

/* Keep SHARED_DEPTH copies in flight, counting each as it completes, until told to stop. */
static void *feed(void *arg)
{
    feeder *f = arg;
    cudaError_t ce = cudaSetDevice(f->device);
    const long pieces = (long)(SHARED_HOST / SHARED_PIECE);
    for (long k = 0; ce == cudaSuccess && !atomic_load(&f->stop); k++) {
        const int slot = (int)(k % SHARED_DEPTH);
        if (k >= SHARED_DEPTH) {
            ce = cudaEventSynchronize(f->done[slot]); /* sleeps: blocking-sync events */
            if (ce != cudaSuccess)
                break;
            atomic_fetch_add(&f->n_done, 1);
        }
        ce = cudaMemcpyAsync(f->dst, f->src + (size_t)(k % pieces) * SHARED_PIECE, SHARED_PIECE,
                             cudaMemcpyHostToDevice, f->stream);
        if (ce == cudaSuccess)
            ce = cudaEventRecord(f->done[slot], f->stream);
    }
    cudaError_t drain = cudaStreamSynchronize(f->stream);
    f->err = ce != cudaSuccess ? ce : drain;
    atomic_store(&f->failed, f->err != cudaSuccess);
    return NULL;
}

static void nap(void)
{
    const struct timespec ts = {0, 200000};
    nanosleep(&ts, NULL);
}

engine_status cuda_measure_shared(const engine_model *m, uint64_t room, cuda_shared_rates *r, err_buf *e)
{
    const cfg_model *c = &m->cfg;
    if (c->n_layers <= 0)
        return err_set(e, ENGINE_ERR_INVALID_ARG, "measuring shared bandwidth: the model has no layers");
    if (room < SHARED_PIECE)
        return err_set(e, ENGINE_ERR_OVER_BUDGET, "measuring shared bandwidth: needs %.0f MiB of device memory",
                       SHARED_PIECE / (double)MiB);
    int layers[CPU_RATE_LAYERS], n = 0;
    uint64_t bytes = 0;
    for (int l = c->n_layers - 1; l >= 0 && n < CPU_RATE_LAYERS; l--) {
        layers[n++] = l;
        bytes += cpu_layer_bytes(m, l);
    }
    feeder f;
    memset(&f, 0, sizeof f);
    atomic_init(&f.stop, 0);
    atomic_init(&f.n_done, 0);
    atomic_init(&f.failed, 0);
    scratch s;
    engine_status st = scratch_open(&s, SHARED_PIECE, e);
    if (st)
        return st;
    f.dst = s.p;
    void *host = NULL;
    cudaError_t ce = cudaGetDevice(&f.device);
    if (ce == cudaSuccess)
        ce = cudaStreamCreateWithFlags(&f.stream, cudaStreamNonBlocking);
    for (int i = 0; i < SHARED_DEPTH && ce == cudaSuccess; i++)
        ce = cudaEventCreateWithFlags(&f.done[i], cudaEventBlockingSync | cudaEventDisableTiming);
    if (ce == cudaSuccess)
        ce = cudaHostAlloc(&host, SHARED_HOST, cudaHostAllocDefault);
    pthread_t thread;
    bool started = false;
    double t0 = 0.0, t1 = 0.0, cpu = 0.0;
    long before = 0, after = 0;
    if (ce != cudaSuccess) {
        st = cuda_err(e, "setup", ce);
    } else {
        memset(host, 0x5a, SHARED_HOST);
        f.src = host;
        started = pthread_create(&thread, NULL, feed, &f) == 0;
        if (!started)
            st = err_set(e, ENGINE_ERR_OUT_OF_MEMORY, "measuring shared bandwidth: cannot start a thread");
    }
    if (started) {
        /* Start the CPU once copies stream; count those completed while it computes. */
        const double wait0 = model_seconds();
        while (atomic_load(&f.n_done) < 2 && model_seconds() - wait0 < 2.0 && !atomic_load(&f.failed))
            nap();
        before = atomic_load(&f.n_done);
        t0 = model_seconds();
        cpu = cpu_layer_rate(m, layers, n, model_host_threads(m));
        t1 = model_seconds();
        after = atomic_load(&f.n_done);
        atomic_store(&f.stop, 1);
        pthread_join(thread, NULL);
        if (f.err != cudaSuccess)
            st = cuda_err(e, "copies", f.err);
        else if (before < 2 || after <= before)
            st = err_set(e, ENGINE_ERR_CUDA, "measuring shared bandwidth: the copies did not run");
        else if (cpu <= 0.0)
            st = err_set(e, ENGINE_ERR_OUT_OF_MEMORY, "measuring shared bandwidth: out of memory");
    }
    if (host)
        cudaFreeHost(host);
    for (int i = 0; i < SHARED_DEPTH; i++)
        if (f.done[i])
            cudaEventDestroy(f.done[i]);
    if (f.stream)
        cudaStreamDestroy(f.stream);
    scratch_close(&s);
    if (st)
        return st;
    const double secs = t1 - t0;
    r->copy_gbps = (double)(after - before) * SHARED_PIECE / secs / 1e9;
    r->host_gbps = (double)CPU_PASSES * bytes / secs / 1e9;
    r->shared_gbps = r->copy_gbps + r->host_gbps;
    return ENGINE_OK;
}

/* ---- for the placement ---- */

void cuda_plan_bandwidths(engine_plan_params *pp, const engine_model *m, uint64_t room)
{
    double dev = 0.0, h2d = 0.0, shared = 0.0;
    err_buf e;
    err_clear(&e);
    engine_status st = ENGINE_OK;
    if (m->hbm_gbps == 0.0 || m->pcie_gbps == 0.0) {
        const int o = gpus_measured_override(&dev, &h2d, &shared);
        st = o > 0   ? ENGINE_OK
             : o < 0 ? err_set(&e, ENGINE_ERR_INVALID_ARG, "ENGINE_MEASURED_GBPS is malformed")
                     : cuda_measure_device(room, &dev, &h2d, &e);
        if (!st) {
            pp->hbm_gbps = dev, pp->hbm_source = ENGINE_FIGURE_MEASURED;
            pp->pcie_gbps = h2d, pp->pcie_source = ENGINE_FIGURE_MEASURED;
            model_log(m, ENGINE_LOG_INFO, "CUDA: this device's memory measured at %.0f GB/s (a copy, read + "
                      "written), host to device at %.1f GB/s (pinned)", dev, h2d);
        } else {
            model_log(m, ENGINE_LOG_INFO, "CUDA: bandwidths not measured (%s): planning with %.0f and %.1f GB/s",
                      e.msg, pp->hbm_gbps, pp->pcie_gbps);
        }
    }
    if (m->hbm_gbps != 0.0)
        pp->hbm_gbps = m->hbm_gbps, pp->hbm_source = ENGINE_FIGURE_GIVEN;
    if (m->pcie_gbps != 0.0)
        pp->pcie_gbps = m->pcie_gbps, pp->pcie_source = ENGINE_FIGURE_GIVEN;
}

void cuda_plan_shared(engine_plan_params *pp, const engine_model *m, uint64_t room)
{
    double dev, h2d, shared = 0.0;
    err_buf e;
    err_clear(&e);
    const int o = gpus_measured_override(&dev, &h2d, &shared);
    if (o) {
        pp->shared_gbps = o > 0 ? shared : 0.0;
        return;
    }
    cuda_shared_rates r;
    if (cuda_measure_shared(m, room, &r, &e) != ENGINE_OK) {
        model_log(m, ENGINE_LOG_INFO, "CUDA: host memory sharing not measured (%s); the plan ignores it", e.msg);
        pp->shared_gbps = 0.0;
        return;
    }
    pp->shared_gbps = r.shared_gbps;
    model_log(m, ENGINE_LOG_INFO, "CUDA: host memory read by copies and the CPU at once: %.1f + %.1f = %.1f GB/s "
              "(alone %.1f and %.1f)", r.copy_gbps, r.host_gbps, r.shared_gbps, pp->pcie_gbps, pp->host_gbps);
}
