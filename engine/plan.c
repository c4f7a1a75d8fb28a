/*
 * plan.c: the offload planner. From a model's per-layer device sizes (in
 * the format each matrix would have on the GPU), the KV cache and the
 * session's buffers for a context length, and the CUDA context's own
 * overhead, it decides what stays resident under a budget and what is
 * streamed from host memory, or refuses with the minimum and what would
 * make it fit. Pure arithmetic: no CUDA call.
 *
 * Policy, cheapest loss first (every weight byte of a layer or of the head
 * is read once per decoded token, so a byte costs the same wherever it is;
 * only the embedding table is read a row at a time):
 *   1. everything resident;
 *   2. the embedding table in host memory (a row per token crosses PCIe);
 *   3. a mixture-of-experts model's routed experts to host memory, one at
 *      a time, spread evenly over the expert layers (each layer's
 *      attention, router and shared expert stay): a token reads k of a
 *      layer's E experts, so a resident expert saves only k / E of its
 *      bytes a token; the CPU runs a token's picks among those on the
 *      host, prompts stream them through the two buffers below;
 *   4. k = 1..n layers streamed, spread evenly among the resident ones so
 *      that each upload has resident layers' compute to hide behind,
 *      through two device buffers of the largest streamed layer (the
 *      minimum for double buffering: layer i+1 uploads while i computes),
 *      an expert layer's experts with it;
 *   5. the output head streamed too, in buffer-sized row blocks.
 * The first of these that fits is the plan, so a smaller budget never
 * streams less. Then, given the host's rate at computing a layer, some of
 * the streamed layers (again spread evenly among them) are left to the CPU
 * for decode, as many as minimise the decode time: the CPU computing some
 * while the copy engine uploads the others, each side's share of the time
 * balanced, and both together no faster than host memory serves them
 * (shared_gbps, when known). Prompts still stream them all (the GPU is far
 * faster there). The bandwidths that price a plan are the caller's: as
 * measured on the device (cuda/measure.c), a known card's (gpus.c), given,
 * or the defaults (an H100's); the totals say which.
 *
 * The KV cache's type is the caller's, or under AUTO chosen here
 * (choose_kv): the default where everything fits, else a smaller cache or
 * streamed weights, whichever decodes faster with the context full. The
 * plan also finds the longest context each type fits, for the report and
 * the refusal.
 */
#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../quant/quant.h"
#include "plan.h"

static uint64_t round_up(uint64_t x, uint64_t to)
{
    return (x + to - 1) / to * to;
}

/* ---------------------------------------------------------------- decision */

typedef struct plan_in {
    int n_layers;
    const uint64_t *layer; /* [n_layers] */
    const uint64_t *mats;  /* [n_layers] the part of each that streams */
    const uint64_t *read;  /* [n_layers] the bytes a token reads of each (an expert layer: its top-k experts) */
    int min_streamed;      /* layers to stream at least */
    bool tied;
    uint64_t emb;          /* the embedding table when untied, else 0 (the head holds it) */
    uint64_t head;         /* lm_head (or the tied table) and out_norm                    */
    uint64_t head_norm;    /* of which out_norm, resident even when the head streams      */
    uint64_t emb_row;      /* one token's embedding row                                   */
    uint64_t kv, act;      /* act: the activation region and the workspace, separately rounded */
    uint64_t context, budget;
    double hbm, pcie;      /* bytes per second */
    double host;           /* bytes per second the CPU computes a layer at (its experts: the PCIe rate when
                              not measured, see fill_in) */
    double shared;         /* bytes per second host memory serves copies and the CPU together; 0: not modelled */
    int host_layers;       /* host-computed layers: -1 the fastest count, else that many */
    /* Mixture-of-experts layers, placed an expert at a time */
    const uint64_t *experts; /* [n_layers] all of a layer's routed experts (0: a dense layer) */
    int n_experts, n_used; /* experts an expert layer, of which a token runs */
    int n_ex_layers;       /* expert layers                                  */
    int moe_cpu;           /* the first this many expert layers keep no expert resident */
    uint64_t cache;        /* device bytes kept for the expert cache                  */
    bool ex_gpu;           /* resident layers' host experts read by the GPU over PCIe for decode, not run by
                              the CPU (engine_moe_host)                                                   */
} plan_in;

typedef struct plan_state {
    int k;              /* layers streamed                */
    int h;              /* of which computed on the host  */
    bool emb_host;      /* embedding rows from the host   */
    bool head_streamed;
    int x;              /* routed experts resident, spread evenly over the resident expert layers past
                           the first mcpu (ex_next)                                                    */
    int mcpu;           /* expert layers keeping all their experts in host memory (moe_cpu)          */
    /* what follows is computed */
    int x_max;          /* the most x can be: those layers times n_experts                           */
    int x_host;         /* experts of resident layers in host memory (the CPU's for decode)          */
    uint64_t resident, streamed, slots, device_total, read, moved, hosted;
    uint64_t ex_moved;  /* of moved: host experts the GPU reads over PCIe (plan_in.ex_gpu)           */
    double tps;
    double balance;     /* the longer of copy and host time alone: ties broken by the smaller */
    bool fits;
} plan_state;

/* Layer i of n is streamed when k are: spread evenly (Bresenham). */
static bool is_streamed(int i, int k, int n)
{
    return (int64_t)(i + 1) * k / n > (int64_t)i * k / n;
}

static bool layer_streamed(const plan_state *s, int i, int n)
{
    return s->k > 0 && is_streamed(i, s->k, n);
}

/* Layer i (streamed when k are) is computed on the host when h of the streamed are. */
static bool is_hosted(int i, const plan_state *s, int n)
{
    if (s->h <= 0 || !is_streamed(i, s->k, n))
        return false;
    const int j = (int)((int64_t)(i + 1) * s->k / n) - 1; /* its index among the streamed */
    return is_streamed(j, s->h, s->k);
}

/*
 * Which expert layers keep how many experts resident in a state: walk the
 * layers in order, ex_begin first, then ex_next for each. The layers that
 * may keep experts (resident, past the first mcpu expert layers) share x
 * evenly, each floor(x / n) or one more, the earlier ones taking the
 * remainder; the others keep none (a streamed layer's experts go with it).
 */
typedef struct ex_walk {
    int eligible;   /* expert layers that may keep experts */
    int seen, seen_eligible;
} ex_walk;

static bool ex_eligible(const plan_in *in, const plan_state *s, int i, int index)
{
    return in->experts[i] > 0 && index >= s->mcpu && !layer_streamed(s, i, in->n_layers);
}

static void ex_begin(const plan_in *in, const plan_state *s, ex_walk *w)
{
    memset(w, 0, sizeof *w);
    for (int i = 0, e = 0; i < in->n_layers; i++)
        if (in->experts[i] > 0)
            w->eligible += ex_eligible(in, s, i, e++);
}

static int ex_next(const plan_in *in, const plan_state *s, ex_walk *w, int i)
{
    if (in->experts[i] == 0 || !ex_eligible(in, s, i, w->seen++))
        return 0;
    const int j = w->seen_eligible++, r = s->x / w->eligible + (j < s->x % w->eligible);
    return r < in->n_experts ? r : in->n_experts;
}

/* One expert's device bytes in layer i (they are all one size). */
static uint64_t expert_bytes(const plan_in *in, int i)
{
    return in->n_experts > 0 ? in->experts[i] / (uint64_t)in->n_experts : 0;
}

/* The bytes of layer i's experts the CPU reads a token when r are resident: k picks, (E - r) / E of them there. */
static uint64_t ex_cpu_read(const plan_in *in, int i, int r)
{
    if (in->experts[i] == 0)
        return 0;
    return expert_bytes(in, i) * (uint64_t)in->n_used * (uint64_t)(in->n_experts - r) / (uint64_t)in->n_experts;
}

/*
 * A decode step with hosted layers, as it runs: the layers in order, each
 * on the GPU (its bytes at the HBM rate) or, hosted, on the CPU (at its
 * rate); the copy engine uploading the copied layers, then the head's
 * blocks, one at a time and at most two slots ahead of the GPU (a slot is
 * free once the layer in it has been computed); while the CPU and the
 * copy engine both read host memory, each at its own rate times
 * shared / (pcie + host) where that is below 1. Sums of rates miss what
 * this catches: a copied layer waits for its copy, and a copy for a slot,
 * while the CPU works alone (H100 machine, 8B bf16 at 8 GiB, 12 hosted:
 * the sums gave 15.4 tok/s, this 13.5, the run 12.6). Seconds, or a
 * negative value when it cannot run (out of memory).
 */
static double simulate_step(const plan_in *in, const plan_state *s, uint64_t slot)
{
    const int n = in->n_layers;
    const uint64_t head = in->head - in->head_norm;
    const int blocks = s->head_streamed && slot > 0 ? (int)((head + slot - 1) / slot) : 0;
    const int cap = 2 * n + (blocks > 0 ? blocks : 1); /* a layer with experts on the host is two items */
    /* per item: bytes, on the CPU or not, the copy it needs (-1 none); per copy: bytes and its item */
    uint64_t *bytes = malloc((size_t)cap * sizeof *bytes), *cbytes = malloc((size_t)cap * sizeof *cbytes);
    int *need = malloc((size_t)cap * sizeof *need), *citem = malloc((size_t)cap * sizeof *citem);
    char *cpu = malloc((size_t)cap * sizeof *cpu); /* 0: the GPU from its memory, 1: the CPU, 2: the GPU over PCIe */
    double t = -1.0;
    if (!bytes || !cbytes || !need || !citem || !cpu)
        goto out;
    int nc = 0, items = 0;
    ex_walk w;
    ex_begin(in, s, &w);
    for (int i = 0; i < n; i++) {
        const int r = ex_next(in, s, &w, i);
        const bool streamed = layer_streamed(s, i, n), hosted = streamed && is_hosted(i, s, n);
        /* a resident layer's experts in host memory: the CPU runs its picks after the GPU's part, or the
         * GPU reads them over PCIe (ex_gpu) */
        const uint64_t ex_cpu = streamed ? 0 : ex_cpu_read(in, i, r);
        cpu[items] = hosted ? 1 : 0;
        bytes[items] = hosted ? in->mats[i] - (in->layer[i] - in->read[i]) : in->read[i] - ex_cpu;
        need[items] = -1;
        if (streamed && !hosted) {
            need[items] = nc;
            cbytes[nc] = in->mats[i];
            citem[nc++] = items;
        }
        items++;
        if (ex_cpu > 0) {
            cpu[items] = in->ex_gpu ? 2 : 1, bytes[items] = ex_cpu, need[items] = -1;
            items++;
        }
    }
    for (int b = 0; b < (blocks > 0 ? blocks : 1); b++, items++) {
        cpu[items] = 0;
        bytes[items] = blocks > 0 ? (b + 1 < blocks ? slot : head - (uint64_t)(blocks - 1) * slot) : in->head;
        need[items] = -1;
        if (blocks > 0) {
            need[items] = nc;
            cbytes[nc] = bytes[items];
            citem[nc++] = items;
        }
    }
    const double f = in->shared > 0 && in->shared < in->pcie + in->host ? in->shared / (in->pcie + in->host) : 1.0;
    int next_copy = 0, copy = -1, item = 0, done_copies = 0;
    bool active = false;
    double crem = 0.0, irem = 0.0;
    t = 0.0;
    while (item < items) {
        if (copy < 0 && next_copy < nc && (next_copy < 2 || citem[next_copy - 2] < item)) {
            copy = next_copy++;
            crem = (double)cbytes[copy];
        }
        if (!active && (need[item] < 0 || need[item] < done_copies)) {
            active = true;
            irem = (double)bytes[item];
        }
        if (!active && copy < 0) /* cannot happen: a layer waits only for a copy under way */
            break;
        /* The CPU and the copies share host memory; reads over PCIe and the copies share PCIe. */
        const bool both = copy >= 0 && active;
        const double share = both && cpu[item] == 1 ? f : both && cpu[item] == 2 ? 0.5 : 1.0;
        const double rc = in->pcie * share;
        const double ri = cpu[item] == 1 ? in->host * share : cpu[item] == 2 ? in->pcie * share : in->hbm;
        double dt = copy >= 0 ? crem / rc : INFINITY;
        if (active && irem / ri < dt)
            dt = irem / ri;
        t += dt;
        if (copy >= 0 && (crem -= rc * dt) <= 1.0) {
            copy = -1;
            done_copies++;
        }
        if (active && (irem -= ri * dt) <= 1.0) {
            active = false;
            item++;
        }
    }
out:
    free(bytes), free(cbytes), free(need), free(citem), free(cpu);
    return t;
}

/* The device total of a state's resident bytes and slots, and whether it fits the budget. */
static void fit(const plan_in *in, plan_state *s)
{
    const uint64_t g = PLAN_GRANULARITY;
    const uint64_t mapped =
        round_up(s->resident, g) + round_up(s->slots, g) + round_up(in->kv, g) + in->act + round_up(in->cache, g);
    s->device_total = in->context + mapped;
    /* arena_create rounds its budget down to the granularity. */
    const uint64_t arena = in->budget > in->context ? (in->budget - in->context) / g * g : 0;
    s->fits = mapped <= arena;
}

/*
 * A state's device bytes and the bytes a token moves: each layer resident
 * (less its experts in host memory), streamed (its norms, biases and
 * expert tables resident) or hosted; the embeddings and the head. *slot
 * gets the bytes a stream slot must hold.
 */
static void size_state(const plan_in *in, plan_state *s, uint64_t *slot_out)
{
    /* hosted: the bytes the CPU reads (an expert layer's top-k experts); hosted_mats: what is not copied;
     * ex_host: experts of resident layers kept in host memory */
    uint64_t slot = 0, hosted = 0, hosted_mats = 0, ex_host = 0, ex_moved = 0;
    s->resident = s->streamed = s->read = s->moved = 0;
    s->x_host = 0;
    ex_walk w;
    ex_begin(in, s, &w);
    s->x_max = w.eligible * in->n_experts;
    for (int i = 0; i < in->n_layers; i++) {
        const int r = ex_next(in, s, &w, i);
        if (layer_streamed(s, i, in->n_layers)) {
            s->streamed += in->mats[i];
            if (is_hosted(i, s, in->n_layers)) {
                hosted_mats += in->mats[i];
                hosted += in->mats[i] - (in->layer[i] - in->read[i]);
            }
            s->resident += in->layer[i] - in->mats[i]; /* norms and biases stay */
            s->read += in->layer[i] - in->mats[i];
            if (in->mats[i] > slot)
                slot = in->mats[i];
        } else {
            /* Its experts past the r resident: the CPU runs a token's picks among them, prompts stream them
             * all through the slots. */
            const int off = in->experts[i] > 0 ? in->n_experts - r : 0;
            const uint64_t off_bytes = (uint64_t)off * expert_bytes(in, i), cpu = ex_cpu_read(in, i, r);
            s->x_host += off;
            s->resident += in->layer[i] - off_bytes;
            s->read += in->read[i] - cpu;
            if (in->ex_gpu)
                ex_moved += cpu;
            else
                hosted += cpu;
            ex_host += off_bytes;
            if (off_bytes > slot)
                slot = off_bytes;
        }
    }
    s->moved = s->streamed - hosted_mats + ex_moved;
    s->ex_moved = ex_moved;
    s->streamed += ex_host;
    s->hosted = hosted;
    if (s->emb_host) {
        s->streamed += in->emb;
        s->moved += in->emb_row;
    } else {
        s->resident += in->emb;
    }
    if (s->head_streamed) {
        s->streamed += in->head - in->head_norm;
        s->moved += in->head - in->head_norm;
        s->resident += in->head_norm;
        if (slot == 0) /* no layers: the head streams through buffers of its own size */
            slot = in->head;
    } else {
        s->resident += in->head;
        s->read += in->head;
    }
    s->slots = s->k > 0 || s->head_streamed || s->x_host > 0 ? 2 * slot : 0;
    fit(in, s);
    if (slot_out)
        *slot_out = slot;
}

static void evaluate(const plan_in *in, plan_state *s)
{
    uint64_t slot;
    size_state(in, s, &slot);
    /*
     * The copies of the streamed layers overlap the host's work on the
     * others, and both read host memory: with hosted layers neither side can
     * beat all of those bytes at the rate host memory serves the two
     * together (DESIGN.md, "Host memory is shared").
     */
    const uint64_t hosted = s->hosted;
    const double copy = s->moved / in->pcie, host = hosted > 0 ? hosted / in->host : 0.0;
    s->balance = copy > host ? copy : host;
    double side = s->balance;
    if (hosted > 0 && in->shared > 0 && (double)(s->moved + hosted) / in->shared > side)
        side = (double)(s->moved + hosted) / in->shared;
    double t = s->read / in->hbm + side;
    if (hosted > 0) { /* the step as it runs, where copies and the CPU interleave */
        const double sim = simulate_step(in, s, slot);
        if (sim > 0)
            t = sim;
    }
    s->tps = t > 0 ? 1.0 / t : 0.0;
}

/* The number of the streamed layers to compute on the host that decodes fastest. */
static void choose_hosted(const plan_in *in, plan_state *s)
{
    if (in->host_layers == 0 || s->k == 0)
        return;
    if (in->host_layers > 0) {
        s->h = in->host_layers < s->k ? in->host_layers : s->k;
        evaluate(in, s);
        return;
    }
    /* Where shared host memory bounds a range of counts equally, the one balancing copies and CPU. */
    plan_state best = *s, t = *s;
    for (t.h = 1; t.h <= s->k; t.h++) {
        evaluate(in, &t);
        if (t.tps > best.tps || (t.tps == best.tps && t.balance < best.balance))
            best = t;
    }
    *s = best;
}

/* The states decide() has seen: the first that fits, and the least of those with experts in host memory. */
typedef struct scan {
    plan_state *chosen, split;
    bool found, have_split;
} scan;

static void consider(scan *sc, const plan_state *s)
{
    if (!sc->found && s->fits) {
        *sc->chosen = *s;
        sc->found = true;
    }
    if (s->x_host > 0 && (!sc->have_split || s->device_total < sc->split.device_total)) {
        sc->split = *s;
        sc->have_split = true;
    }
}

/*
 * Experts leave the device one at a time, x down to 0, each from the last
 * of the layers holding the most (ex_next's spread): one layer changes a
 * step, so each state is sized from the one before in constant time, for
 * the fit only (the device bytes, the slots, x_host; decide evaluates the
 * states it keeps afresh). A layer's experts in host memory only grow on
 * the way down, so the slot they need is a running maximum.
 */
static void experts_down(const plan_in *in, plan_state *s, scan *sc)
{
    if (s->x == 0)
        return;
    const int n = in->n_layers;
    int *layer = malloc((size_t)n * sizeof *layer), *off = malloc((size_t)n * sizeof *off);
    if (!layer || !off) { /* the same states, each sized in full */
        free(layer), free(off);
        while (s->x > 0) {
            s->x--;
            size_state(in, s, NULL);
            consider(sc, s);
        }
        return;
    }
    uint64_t slot;
    size_state(in, s, &slot);
    ex_walk w;
    ex_begin(in, s, &w);
    int ne = 0;
    for (int i = 0, e = 0; i < n; i++) {
        const int r = ex_next(in, s, &w, i);
        if (in->experts[i] > 0 && ex_eligible(in, s, i, e++)) {
            layer[ne] = i;
            off[ne++] = in->n_experts - r;
        }
    }
    while (s->x > 0) {
        const int j = (s->x - 1) % ne;
        const uint64_t eb = expert_bytes(in, layer[j]);
        s->x--;
        off[j]++;
        s->x_host++;
        s->resident -= eb;
        s->streamed += eb;
        if ((uint64_t)off[j] * eb > slot)
            slot = (uint64_t)off[j] * eb;
        s->slots = 2 * slot;
        fit(in, s);
        consider(sc, s);
    }
    free(layer), free(off);
    size_state(in, s, NULL); /* every figure of x = 0 for the steps after */
}

/*
 * Evaluate the states in order; *chosen is the first that fits (or the
 * last), *first every weight resident, *least the minimum: the last state
 * (everything streamed), or where it takes less, one keeping expert
 * layers resident with experts in host memory. The order, cheapest loss
 * first: everything resident (but what min_streamed and moe_cpu move);
 * the embedding table to the host; routed experts to the host one at a
 * time, spread evenly over the expert layers; whole layers streamed, the
 * experts of those left resident all in host memory; the head streamed.
 */
static void decide(const plan_in *in, plan_state *chosen, plan_state *first, plan_state *least)
{
    plan_state s = {0};
    s.x = in->n_ex_layers * in->n_experts;
    evaluate(in, &s);
    *first = s; /* all resident, whatever the minimum streamed and moe_cpu */
    s.k = in->min_streamed < in->n_layers ? in->min_streamed : in->n_layers;
    if (in->min_streamed > in->n_layers) /* more than there are: everything streams, the head too */
        s.emb_host = s.head_streamed = true;
    s.mcpu = in->moe_cpu;
    size_state(in, &s, NULL);
    s.x = s.x_max;
    size_state(in, &s, NULL);
    *chosen = s;
    scan sc = {chosen, s, s.fits, false};
    sc.have_split = s.x_host > 0;
    for (int step = 0;; step++) {
        if (step == 0) {
            if (in->tied || in->emb == 0)
                continue;
            s.emb_host = true;
        } else if (s.x > 0) {
            experts_down(in, &s, &sc);
            continue;
        } else if (s.k < in->n_layers) { /* whole layers, their experts with them */
            s.k++;
            s.emb_host = !in->tied && in->emb > 0;
        } else if (!s.head_streamed) {
            s.head_streamed = true;
            s.emb_host = true; /* tied: the table is the streamed head, so rows come from the host */
        } else {
            break;
        }
        size_state(in, &s, NULL);
        consider(&sc, &s);
    }
    *least = sc.have_split && sc.split.device_total < s.device_total ? sc.split : s;
    evaluate(in, least);
    if (!sc.found)
        *chosen = s;
    evaluate(in, chosen);
    if (chosen->fits)
        choose_hosted(in, chosen);
}

/* The prompt tokens a pass is sized for: the caller's, else CUDA's default; never more than the context. */
static int batch_of(const engine_plan_params *p, int n_ctx)
{
    const int nb = p->n_batch > 0 ? p->n_batch : PLAN_CUDA_BATCH;
    return nb < n_ctx ? nb : n_ctx;
}

static void fill_in(plan_in *in, const engine_model *m, const plan_weights *w, const engine_plan_params *p, int n_ctx,
                    engine_kv_type kv)
{
    const cfg_model *c = &m->cfg;
    const k_dtype wt = m->tok_emb.dtype;
    memset(in, 0, sizeof *in);
    in->n_layers = c->n_layers;
    in->layer = w->layer;
    in->mats = w->layer_mats;
    in->read = w->layer_read;
    in->min_streamed = p->min_layers_streamed > 0 ? p->min_layers_streamed : 0;
    in->tied = m->lm_head.data == m->tok_emb.data;
    in->emb = in->tied ? 0 : w->emb;
    in->head = in->tied ? w->head + w->emb : w->head;
    in->head_norm = round_up((uint64_t)c->dim * sizeof(float), PLAN_ALIGN);
    in->emb_row = (uint64_t)c->dim * k_dtype_size(wt);
    const uint64_t act = plan_session_layout(c, wt, batch_of(p, n_ctx), n_ctx, w->deq_elems, PLAN_ARGMAX_SCRATCH,
                                             NULL, NULL);
    in->kv = plan_kv_bytes(c, kv, n_ctx, batch_of(p, n_ctx));
    in->act = round_up(act, PLAN_GRANULARITY) + round_up(PLAN_WORKSPACE, PLAN_GRANULARITY);
    in->context = p->cuda_context_bytes;
    in->budget = p->vram_budget;
    in->hbm = p->hbm_gbps * 1e9;
    in->pcie = p->pcie_gbps * 1e9;
    /* Hosted layers need the CPU's rate (engine_plan_create checks); experts left in host memory are run by
     * the CPU whether or not its rate is known, and without it their bytes are priced at the PCIe rate, as if
     * copied: the bound stays on the safe side where the CPU reads host memory faster than PCIe moves it. */
    in->host = p->host_gbps > 0 ? p->host_gbps * 1e9 : in->pcie;
    in->shared = p->shared_gbps * 1e9;
    in->host_layers = p->host_layers;
    in->experts = w->layer_experts;
    for (int l = 0; l < c->n_layers; l++)
        in->n_ex_layers += w->layer_experts[l] > 0;
    in->n_experts = in->n_ex_layers > 0 ? c->n_experts : 0;
    in->n_used = in->n_ex_layers > 0 ? c->n_experts_used : 0;
    in->moe_cpu = p->moe_cpu < in->n_ex_layers ? p->moe_cpu : in->n_ex_layers;
    in->cache = in->n_ex_layers > 0 ? p->expert_cache : 0;
    in->ex_gpu = p->moe_host == ENGINE_MOE_HOST_GPU ||
                 (p->moe_host == ENGINE_MOE_HOST_AUTO && !(p->host_gbps > 0 && p->host_gbps * 1e9 > in->pcie));
}

/* ---------------------------------------------------------------- KV type */

/* One KV type planned: its inputs and the states decide() found. */
typedef struct plan_run {
    engine_kv_type kv;
    plan_in in;
    plan_state chosen, first, least;
} plan_run;

static void run_kv(plan_run *r, const engine_model *m, const plan_weights *w, const engine_plan_params *p, int n_ctx,
                   engine_kv_type kv)
{
    r->kv = kv;
    fill_in(&r->in, m, w, p, n_ctx, kv);
    decide(&r->in, &r->chosen, &r->first, &r->least);
}

/*
 * The decode bound with the cache full: each token's attention reads every
 * K and V byte once, on top of the weights (at 128k tokens an 8B model's
 * fp16 cache is 16 GiB, three times its nf4 weights). With hosted layers
 * the read is added to the stepped time too: their attention runs on the
 * GPU between the CPU's products, so it does not overlap them.
 */
static double full_ctx_tps(const plan_run *r)
{
    const plan_state *s = &r->chosen;
    if (!s->fits || !(s->tps > 0))
        return 0.0;
    return 1.0 / (1.0 / s->tps + (double)r->in.kv / r->in.hbm);
}

/* s fits and moves nothing off the device beyond what min_layers_streamed and moe_cpu force (the embeddings
 * counted or not). */
static bool keeps_resident(const plan_in *in, const plan_state *s, bool count_emb)
{
    const bool all = in->min_streamed > in->n_layers;
    const int k0 = all ? in->n_layers : in->min_streamed;
    return s->fits && s->k == k0 && s->head_streamed == all && (!count_emb || s->emb_host == all) &&
           s->x == s->x_max;
}

/*
 * The KV type to plan with: the caller's, or for AUTO the default type
 * when everything fits with it. When it does not, two ways out: (S) shrink
 * the cache to the least lossy type that keeps every layer resident (f32
 * to f16 first, then int8; int8 rather than fp8: the same bytes, and finer
 * steps for every value above a fourteenth of its row's largest, max/127
 * against e4m3's 3 mantissa bits), or int8 with what streaming it still
 * needs; (T) stream weights with the default type, or when even that does
 * not fit, S. The faster at full context wins, a tie keeping the default.
 * On bytes alone S always wins where it fits: its smaller cache leaves
 * more room, so it streams no more than T, and it reads fewer KV bytes;
 * the comparison stays so that a cost the bytes do not show (a slower
 * attention over a quantized cache, say) would be weighed in one place.
 * *alt gets the way not taken (alt->kv AUTO when there was none).
 */
static void choose_kv(plan_run *out, plan_run *alt, const engine_model *m, const plan_weights *w,
                      const engine_plan_params *p, int n_ctx)
{
    const cfg_model *c = &m->cfg;
    const engine_kv_type def = plan_kv_default(m->tok_emb.dtype);
    alt->kv = ENGINE_KV_AUTO;
    if (p->kv_type != ENGINE_KV_AUTO) {
        run_kv(out, m, w, p, n_ctx, p->kv_type);
        return;
    }
    run_kv(out, m, w, p, n_ctx, def);
    if (keeps_resident(&out->in, &out->chosen, true))
        return;
    static const engine_kv_type SHRINK[] = {ENGINE_KV_F16, ENGINE_KV_INT8}; /* least loss first */
    plan_run s;
    s.kv = ENGINE_KV_AUTO;
    for (size_t i = 0; i < sizeof SHRINK / sizeof SHRINK[0]; i++) {
        if (plan_kv_token_bytes(c, SHRINK[i]) >= plan_kv_token_bytes(c, def))
            continue;
        run_kv(&s, m, w, p, n_ctx, SHRINK[i]);
        if (keeps_resident(&s.in, &s.chosen, false))
            break;
    }
    if (s.kv == ENGINE_KV_AUTO)
        return;
    if (!out->chosen.fits || (s.chosen.fits && full_ctx_tps(&s) > full_ctx_tps(out))) {
        *alt = *out;
        *out = s;
    } else {
        *alt = s;
    }
}

/* The longest context in [0, cap] whose plan fits with type kv (the minimum grows with the context). */
static int longest_ctx(const engine_model *m, const plan_weights *w, const engine_plan_params *p, engine_kv_type kv,
                       int cap)
{
    engine_plan_params q = *p;
    q.host_layers = 0; /* hosted layers change no device bytes */
    int lo = 0, hi = cap;
    while (lo < hi) {
        const int mid = lo + (hi - lo + 1) / 2;
        plan_run r;
        run_kv(&r, m, w, &q, mid, kv);
        if (r.chosen.fits)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

/* ------------------------------------------------------------- public API */

engine_plan_params engine_plan_default_params(void)
{
    engine_plan_params p;
    memset(&p, 0, sizeof p);
    p.cuda_context_bytes = ENGINE_PLAN_CUDA_CONTEXT_BYTES;
    p.hbm_gbps = ENGINE_PLAN_HBM_GBPS;
    p.pcie_gbps = ENGINE_PLAN_PCIE_GBPS;
    return p;
}

/* What the summary says of a state. */
static plan_placed placed(const plan_state *s)
{
    return (plan_placed){s->k, s->x_host, s->emb_host, s->head_streamed, s->slots};
}

static bool bad_rate(double v)
{
    return !(v > 0.0) || !isfinite(v);
}

static bool bad_source(engine_figure_source s)
{
    return (int)s < ENGINE_FIGURE_DEFAULT || (int)s > ENGINE_FIGURE_TABLE;
}

engine_status engine_plan_create(const engine_model *m, const engine_plan_params *params, engine_plan **out,
                                 char *err, size_t err_size)
{
    err_buf e;
    err_clear(&e);
    if (out)
        *out = NULL;
    engine_plan_params p = params ? *params : engine_plan_default_params();
    if (p.cuda_context_bytes == 0)
        p.cuda_context_bytes = ENGINE_PLAN_CUDA_CONTEXT_BYTES;
    /* A figure left at zero is the default; one changed without saying where it came from was given. */
    if (p.hbm_gbps == 0.0)
        p.hbm_gbps = ENGINE_PLAN_HBM_GBPS, p.hbm_source = ENGINE_FIGURE_DEFAULT;
    else if (p.hbm_source == ENGINE_FIGURE_DEFAULT && p.hbm_gbps != ENGINE_PLAN_HBM_GBPS)
        p.hbm_source = ENGINE_FIGURE_GIVEN;
    if (p.pcie_gbps == 0.0)
        p.pcie_gbps = ENGINE_PLAN_PCIE_GBPS, p.pcie_source = ENGINE_FIGURE_DEFAULT;
    else if (p.pcie_source == ENGINE_FIGURE_DEFAULT && p.pcie_gbps != ENGINE_PLAN_PCIE_GBPS)
        p.pcie_source = ENGINE_FIGURE_GIVEN;
    const char *bad = !m || !out                                          ? "model and out must not be NULL"
                      : p.vram_budget == 0                                ? "vram_budget must be above 0"
                      : p.n_ctx < 0 && p.n_ctx != ENGINE_CTX_MAX          ? "n_ctx must be >= 0 or ENGINE_CTX_MAX"
                      : (int)p.kv_type < 0 || (int)p.kv_type > ENGINE_KV_FP8 ? "unknown kv_type"
                      : p.n_batch < 0                                     ? "n_batch must not be negative"
                      : p.min_layers_streamed < 0                         ? "min_layers_streamed must not be negative"
                      : p.moe_cpu < 0                                     ? "moe_cpu must not be negative"
                      : p.moe_host < ENGINE_MOE_HOST_AUTO || p.moe_host > ENGINE_MOE_HOST_GPU ? "moe_host must be an engine_moe_host"
                      : (int)p.quant < 0 || (int)p.quant > ENGINE_QUANT_FP4 ? "unknown quantization"
                      : bad_rate(p.hbm_gbps) || bad_rate(p.pcie_gbps)     ? "bandwidths must be positive"
                      : p.host_layers < -1                                ? "host_layers must be -1 or more"
                      : p.host_layers != 0 && bad_rate(p.host_gbps)       ? "host_layers needs a positive host_gbps"
                      : p.shared_gbps != 0.0 && bad_rate(p.shared_gbps)   ? "shared_gbps must be 0 or positive"
                      : bad_source(p.hbm_source) || bad_source(p.pcie_source) ? "unknown bandwidth source"
                                                                          : NULL;
    if (bad) {
        err_set(&e, ENGINE_ERR_INVALID_ARG, "engine_plan_create: %s", bad);
        err_copy_out(&e, err, err_size);
        return ENGINE_ERR_INVALID_ARG;
    }
    const cfg_model *c = &m->cfg;
    const int n_ctx = plan_resolve_ctx(c, p.n_ctx);
    if (n_ctx <= 0) {
        err_set(&e, ENGINE_ERR_INVALID_ARG, "engine_plan_create: context length %d is not positive", n_ctx);
        err_copy_out(&e, err, err_size);
        return ENGINE_ERR_INVALID_ARG;
    }
    engine_plan *plan = calloc(1, sizeof *plan);
    plan_weights w = {0};
    engine_status st = plan ? plan_weights_of(m, p.quant, &w, &e)
                            : err_set(&e, ENGINE_ERR_OUT_OF_MEMORY, "plan: out of memory");
    if (!st) {
        plan->n_entries = (size_t)c->n_layers + 2;
        plan->entries = calloc(plan->n_entries, sizeof *plan->entries);
        if (!plan->entries)
            st = err_set(&e, ENGINE_ERR_OUT_OF_MEMORY, "plan: out of memory");
    }
    if (st) {
        if (plan)
            free(w.layer);
        engine_plan_free(plan);
        err_copy_out(&e, err, err_size);
        return st;
    }

    plan_run run, alt;
    choose_kv(&run, &alt, m, &w, &p, n_ctx);
    const plan_in in = run.in;
    const plan_state chosen = run.chosen, first = run.first, least = run.least;
    plan->alt_kv = alt.kv;
    if (alt.kv != ENGINE_KV_AUTO) {
        plan->alt_k = alt.chosen.k;
        plan->alt_x_host = alt.chosen.x_host;
        plan->alt_fits = alt.chosen.fits;
        plan->alt_emb_host = alt.chosen.emb_host;
        plan->alt_head_streamed = alt.chosen.head_streamed;
        plan->alt_full_tps = full_ctx_tps(&alt);
    }

    engine_plan_totals *t = &plan->totals;
    t->budget = p.vram_budget;
    t->n_ctx = n_ctx;
    t->fits = chosen.fits;
    t->n_layers = c->n_layers;
    t->n_layers_streamed = chosen.k;
    t->n_layers_host = chosen.fits ? chosen.h : 0;
    t->host_per_token = chosen.fits ? chosen.hosted : 0;
    t->experts_host_gpu = in.ex_gpu;
    t->expert_cache = in.cache;
    t->host_gbps = p.host_gbps;
    t->weights_resident = chosen.resident;
    t->weights_streamed = chosen.streamed;
    t->stream_buffers = chosen.slots;
    t->kv_cache = in.kv;
    t->activations = in.act;
    t->cuda_context = in.context;
    t->device_total = chosen.device_total;
    t->free_bytes = chosen.fits && chosen.device_total < p.vram_budget ? p.vram_budget - chosen.device_total : 0;
    t->minimum = least.device_total;
    t->all_resident = first.device_total;
    t->read_per_token = chosen.read;
    t->streamed_per_token = chosen.moved;
    t->tokens_per_second = chosen.fits ? chosen.tps : 0.0;
    t->resident_tokens_per_second = first.tps;
    t->hbm_gbps = p.hbm_gbps;
    t->pcie_gbps = p.pcie_gbps;
    t->hbm_source = p.hbm_source;
    t->pcie_source = p.pcie_source;
    snprintf(t->gpu_name, sizeof t->gpu_name, "%s", p.gpu_name ? p.gpu_name : "");
    t->shared_gbps = p.shared_gbps;
    t->kv_type = run.kv;
    t->kv_auto = p.kv_type == ENGINE_KV_AUTO;
    t->kv_bytes_per_token = plan_kv_token_bytes(c, run.kv);
    t->full_ctx_tokens_per_second = full_ctx_tps(&run);
    t->n_batch = batch_of(&p, n_ctx);
    t->kv_ring_rows = model_kv_ring(c, n_ctx, t->n_batch);
    for (int l = 0; l < c->n_layers && t->kv_ring_rows > 0; l++)
        t->kv_window_layers += model_layer_window(c, l) > 0;
    t->n_expert_layers = in.n_ex_layers;
    t->n_experts = in.n_experts;
    t->n_experts_used = in.n_used;

    /* Rows: the embeddings, the layers (each with its own cache: a window layer's may be a ring), the output
     * head. */
    engine_plan_entry *r = plan->entries;
    const char *dense = plan_format_label(&m->tok_emb, ENGINE_QUANT_NONE, m->tok_emb.dtype);
    r[0] = (engine_plan_entry){ENGINE_PLAN_EMBEDDINGS, -1, in.tied ? "tied" : dense, in.emb,
                               chosen.emb_host ? ENGINE_PLACE_STREAMED : ENGINE_PLACE_RESIDENT, 0,
                               chosen.emb_host ? in.emb_row : 0};
    ex_walk xw;
    ex_begin(&in, &chosen, &xw);
    for (int l = 0; l < c->n_layers; l++) {
        const bool str = chosen.k > 0 && is_streamed(l, chosen.k, c->n_layers);
        const bool host = str && chosen.fits && is_hosted(l, &chosen, c->n_layers);
        const int n_ex = in.experts[l] > 0 ? in.n_experts : 0, x = ex_next(&in, &chosen, &xw, l);
        r[1 + l] = (engine_plan_entry){ENGINE_PLAN_LAYER, l, w.format, w.layer[l],
                                       host ? ENGINE_PLACE_HOST : str ? ENGINE_PLACE_STREAMED : ENGINE_PLACE_RESIDENT,
                                       plan_kv_layer_bytes(c, run.kv, l, n_ctx, t->n_batch),
                                       str && !host ? w.layer_mats[l] : 0, n_ex, x, expert_bytes(&in, l)};
        t->n_experts_resident += x;
        t->n_experts_host += n_ex - x;
    }
    const k_weight *head_w = in.tied ? &m->tok_emb : &m->lm_head;
    r[1 + c->n_layers] = (engine_plan_entry){ENGINE_PLAN_OUTPUT, -1, plan_format_label(head_w, ENGINE_QUANT_NONE,
                                                                                  m->tok_emb.dtype),
                                             in.head, chosen.head_streamed ? ENGINE_PLACE_STREAMED
                                                                           : ENGINE_PLACE_RESIDENT,
                                             0, chosen.head_streamed ? in.head - in.head_norm : 0};

    /* The longest context each KV type fits (bf16 has f16's bytes, fp8 int8's); when refused, the planned
     * type's is below n_ctx. */
    const int cap = n_ctx > c->max_position ? n_ctx : c->max_position;
    int *by = t->max_ctx_by_kv;
    by[ENGINE_KV_F32] = longest_ctx(m, &w, &p, ENGINE_KV_F32, cap);
    by[ENGINE_KV_F16] = by[ENGINE_KV_BF16] = longest_ctx(m, &w, &p, ENGINE_KV_F16, cap);
    by[ENGINE_KV_INT8] = by[ENGINE_KV_FP8] = longest_ctx(m, &w, &p, ENGINE_KV_INT8, cap);
    by[ENGINE_KV_AUTO] = by[ENGINE_KV_INT8]; /* the smallest type reaches furthest */
    if (!t->fits)
        t->max_ctx_that_fits = by[run.kv];
    free(w.layer);

    /* The other formats, each planned the same way. */
    for (int q = ENGINE_QUANT_INT8; q <= ENGINE_QUANT_FP4 && !st; q++) {
        if (q == (int)p.quant)
            continue;
        plan_weights wq;
        if ((st = plan_weights_of(m, (engine_quant)q, &wq, &e)))
            break;
        plan_in inq;
        plan_state a, b, z;
        fill_in(&inq, m, &wq, &p, n_ctx, run.kv); /* under the plan's KV type */
        decide(&inq, &a, &b, &z);
        engine_plan_option *o = &plan->options[plan->n_options++];
        *o = (engine_plan_option){(engine_quant)q, plan_quant_name((engine_quant)q), wq.total, z.device_total,
                                  b.device_total, a.fits, b.fits, a.fits ? a.tps : 0.0};
        free(wq.layer);
    }
    if (st) {
        engine_plan_free(plan);
        err_copy_out(&e, err, err_size);
        return st;
    }
    const plan_placed pc = placed(&chosen), pl = placed(&least);
    plan_write_summary(plan, &pc, &pl, m->tok_emb.dtype == K_F32);
    *out = plan;
    if (!t->fits) {
        err_set(&e, ENGINE_ERR_OVER_BUDGET, "%s", plan->summary);
        err_copy_out(&e, err, err_size);
        return ENGINE_ERR_OVER_BUDGET;
    }
    return ENGINE_OK;
}

void engine_plan_free(engine_plan *plan)
{
    if (!plan)
        return;
    free(plan->entries);
    free(plan);
}

/* Accessors: NULL plans and rows out of range give NULL, 0 or "". */
const engine_plan_totals *engine_plan_get_totals(const engine_plan *p) { return p ? &p->totals : NULL; }
size_t engine_plan_n_entries(const engine_plan *p) { return p ? p->n_entries : 0; }
size_t engine_plan_n_options(const engine_plan *p) { return p ? p->n_options : 0; }
const char *engine_plan_summary(const engine_plan *p) { return p ? p->summary : ""; }

const engine_plan_entry *engine_plan_entry_at(const engine_plan *p, size_t i)
{
    return p && i < p->n_entries ? &p->entries[i] : NULL;
}

const engine_plan_option *engine_plan_option_at(const engine_plan *p, size_t i)
{
    return p && i < p->n_options ? &p->options[i] : NULL;
}
