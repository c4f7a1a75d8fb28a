/*
 * gpus.c: what the planner knows of GPUs. The table of known cards
 * (gpu_table.h) with the two figures the planner takes from a row, a
 * forgiving lookup by name, and the public entry points to this machine's
 * measured figures (cuda/measure.c), which also honour the test override
 * ENGINE_MEASURED_GBPS in a build without CUDA.
 *
 * The planner's figures from a datasheet row:
 *   memory: the datasheet bandwidth x ENGINE_GPU_MEM_EFFICIENCY (0.90). The
 *     H100 SXM's datasheet says 3,350 GB/s; a device-to-device copy
 *     measured 3,020 GB/s (read + written, ../shared/HARDWARE.md) and a
 *     read-only reduction 3,053: 0.90-0.91. One card's ratio, applied to
 *     all: a card's own measurement replaces it when the card is present.
 *   host to device: lanes x the link's per-direction rate after encoding
 *     (PCIe 3.0: 8 GT/s x 128/130 / 8 bits = 0.985 GB/s a lane; 4.0: 1.969;
 *     5.0: 3.938) x ENGINE_GPU_PCIE_EFFICIENCY (0.85). PCIe 5.0 x16 gives
 *     63.0 GB/s, and pinned copies on the H100 machine ran at 53-55 GB/s
 *     (53.2 during decode): 0.84-0.87. So 4.0 x16 plans at 26.8 GB/s (the
 *     25-27 GB/s pinned copies usually reach), 4.0 x8 at 13.4.
 */
#define _POSIX_C_SOURCE 200809L

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_table.h"
#include "gpus.h"
#include "model.h"
#ifdef ENGINE_HAVE_CUDA
#include "cuda/backend.h"
#include "cuda/measure.h"
#endif

#define N_GPUS (sizeof GPU_TABLE / sizeof GPU_TABLE[0])
#define NAME_MAX_LEN 64

/* GB/s a lane, per direction, after line encoding; index: PCIe generation. */
static const double PCIE_LANE_GBPS[] = {0.0, 0.25, 0.5, 8.0 * 128 / 130 / 8, 16.0 * 128 / 130 / 8,
                                        32.0 * 128 / 130 / 8};

size_t engine_gpu_count(void)
{
    return N_GPUS;
}

static void fill(const gpu_row *r, engine_gpu_info *out)
{
    const int gen = r->pcie_gen >= 0 && r->pcie_gen < (int)(sizeof PCIE_LANE_GBPS / sizeof PCIE_LANE_GBPS[0])
                        ? r->pcie_gen
                        : 0;
    *out = (engine_gpu_info){r->name, r->vram_gb, r->mem_gbps, r->pcie_gen, r->pcie_lanes, r->cc_major, r->cc_minor,
                             r->source, r->mem_gbps * ENGINE_GPU_MEM_EFFICIENCY,
                             r->pcie_lanes * PCIE_LANE_GBPS[gen] * ENGINE_GPU_PCIE_EFFICIENCY};
}

engine_status engine_gpu_at(size_t i, engine_gpu_info *out)
{
    if (!out || i >= N_GPUS)
        return ENGINE_ERR_INVALID_ARG;
    fill(&GPU_TABLE[i], out);
    return ENGINE_OK;
}

/* s lower-cased without spaces, dashes and underscores; with core, also without a leading vendor word. */
static void normalize(const char *s, bool core, char *out, size_t n)
{
    size_t k = 0;
    for (; *s && k + 1 < n; s++)
        if (!strchr(" -_\t", *s))
            out[k++] = (char)tolower((unsigned char)*s);
    out[k] = '\0';
    static const char *const PREFIXES[] = {"nvidia", "geforce", "rtx", "tesla"};
    for (size_t i = 0; core && i < sizeof PREFIXES / sizeof PREFIXES[0]; i++) {
        const size_t p = strlen(PREFIXES[i]);
        if (!strncmp(out, PREFIXES[i], p) && out[p])
            memmove(out, out + p, strlen(out + p) + 1);
    }
}

/* Edit distance of two short strings (for "did you mean"). */
static int distance(const char *a, const char *b)
{
    int row[NAME_MAX_LEN + 1];
    const int m = (int)strlen(b) < NAME_MAX_LEN ? (int)strlen(b) : NAME_MAX_LEN;
    for (int j = 0; j <= m; j++)
        row[j] = j;
    for (int i = 1; a[i - 1]; i++) {
        int diag = row[0];
        row[0] = i;
        for (int j = 1; j <= m; j++) {
            const int up = row[j];
            const int sub = diag + (a[i - 1] != b[j - 1]);
            row[j] = sub < up + 1 ? sub : up + 1;
            if (row[j - 1] + 1 < row[j])
                row[j] = row[j - 1] + 1;
            diag = up;
        }
    }
    return row[m];
}

/* Append "NAME, NAME" of the rows marked in pick (at most max) to buf. */
static void list_names(char *buf, size_t n, const bool *pick, size_t max)
{
    size_t len = strlen(buf), shown = 0;
    for (size_t i = 0; i < N_GPUS && shown < max && len + 1 < n; i++)
        if (pick[i]) {
            snprintf(buf + len, n - len, "%s%s", shown ? ", " : "", GPU_TABLE[i].name);
            len = strlen(buf);
            shown++;
        }
}

engine_status engine_gpu_find(const char *name, engine_gpu_info *out, char *err, size_t err_size)
{
    err_buf e;
    err_clear(&e);
    if (!name || !out) {
        err_set(&e, ENGINE_ERR_INVALID_ARG, "engine_gpu_find: name and out must not be NULL");
        err_copy_out(&e, err, err_size);
        return ENGINE_ERR_INVALID_ARG;
    }
    char full[NAME_MAX_LEN], core[NAME_MAX_LEN], row_full[NAME_MAX_LEN], row_core[NAME_MAX_LEN];
    normalize(name, false, full, sizeof full);
    normalize(name, true, core, sizeof core);
    bool part[N_GPUS] = {false};
    size_t n_part = 0, found = N_GPUS;
    /* An exact name first (with or without the vendor words), then a unique part of one. */
    for (size_t i = 0; i < N_GPUS && found == N_GPUS && core[0]; i++) {
        normalize(GPU_TABLE[i].name, false, row_full, sizeof row_full);
        normalize(GPU_TABLE[i].name, true, row_core, sizeof row_core);
        if (!strcmp(full, row_full) || !strcmp(core, row_core))
            found = i;
        else if (strstr(row_core, core) || strstr(row_full, full))
            part[i] = true, n_part++;
    }
    if (found == N_GPUS && n_part == 1)
        for (size_t i = 0; i < N_GPUS; i++)
            if (part[i])
                found = i;
    if (found < N_GPUS) {
        fill(&GPU_TABLE[found], out);
        return ENGINE_OK;
    }
    char names[256] = "";
    if (n_part > 1) {
        list_names(names, sizeof names, part, 8);
        err_set(&e, ENGINE_ERR_INVALID_ARG, "GPU '%s' is ambiguous: %s (give more of the name; --gpu list)", name,
                names);
    } else {
        /* Unknown: the rows closest by edit distance. */
        bool close[N_GPUS] = {false};
        int best = 1 << 30;
        for (size_t i = 0; i < N_GPUS; i++) {
            normalize(GPU_TABLE[i].name, true, row_core, sizeof row_core);
            const int d = distance(core, row_core);
            best = d < best ? d : best;
        }
        for (size_t i = 0; i < N_GPUS; i++) {
            normalize(GPU_TABLE[i].name, true, row_core, sizeof row_core);
            close[i] = distance(core, row_core) <= best + 1;
        }
        list_names(names, sizeof names, close, 5);
        err_set(&e, ENGINE_ERR_INVALID_ARG, "unknown GPU '%s'; the closest known: %s (--gpu list shows all)", name,
                names);
    }
    err_copy_out(&e, err, err_size);
    return ENGINE_ERR_INVALID_ARG;
}

int gpus_measured_override(double *dev, double *h2d, double *shared)
{
    const char *s = getenv("ENGINE_MEASURED_GBPS");
    if (!s || !*s)
        return 0;
    double v[3] = {0.0, 0.0, 0.0};
    int n = 0;
    char *end;
    while (n < 3) {
        v[n] = strtod(s, &end);
        if (end == s || !(v[n] > 0.0) || !isfinite(v[n]))
            return -1;
        n++;
        if (*end != ',')
            break;
        s = end + 1;
    }
    if (*end || n < 2)
        return -1;
    *dev = v[0], *h2d = v[1], *shared = n == 3 ? v[2] : 0.0;
    return 1;
}

engine_status engine_device_bandwidths(uint64_t vram_budget, double *device_gbps, double *h2d_gbps)
{
    if (!device_gbps || !h2d_gbps)
        return ENGINE_ERR_INVALID_ARG;
    double shared;
    const int o = gpus_measured_override(device_gbps, h2d_gbps, &shared);
    if (o)
        return o > 0 ? ENGINE_OK : ENGINE_ERR_INVALID_ARG;
#ifdef ENGINE_HAVE_CUDA
    char why[256];
    if (!cuda_available(why, sizeof why))
        return ENGINE_ERR_UNSUPPORTED;
    return cuda_measure_device(cuda_measure_room(vram_budget), device_gbps, h2d_gbps, NULL);
#else
    (void)vram_budget;
    return ENGINE_ERR_UNSUPPORTED;
#endif
}

engine_status engine_host_shared_rate(const engine_model *m, uint64_t vram_budget, double *gbps)
{
    if (!m || !gbps)
        return ENGINE_ERR_INVALID_ARG;
    double dev, h2d;
    const int o = gpus_measured_override(&dev, &h2d, gbps);
    if (o)
        return o < 0 ? ENGINE_ERR_INVALID_ARG : *gbps > 0.0 ? ENGINE_OK : ENGINE_ERR_UNSUPPORTED;
#ifdef ENGINE_HAVE_CUDA
    char why[256];
    if (!cuda_available(why, sizeof why))
        return ENGINE_ERR_UNSUPPORTED;
    cuda_shared_rates r;
    engine_status st = cuda_measure_shared(m, cuda_measure_room(vram_budget), &r, NULL);
    *gbps = st ? 0.0 : r.shared_gbps;
    return st;
#else
    (void)vram_budget;
    return ENGINE_ERR_UNSUPPORTED;
#endif
}
