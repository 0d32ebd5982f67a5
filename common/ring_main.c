/*
 * ring_main.c: the context-parallel program (stage 10): one process drives every GPU of the ring
 * (NCCL's ncclCommInitAll), runs stage 10's ring (common/ring.h) with the course's best stage for
 * the GPU inside, checks it and times it.
 *
 *   build/stage10_context_parallel --seq 131072 --heads 32 --kv-heads 8 --causal --backward --bench
 *   build/stage10_context_parallel --self-test        (every GPU here; one GPU: the ring of one)
 *
 * The check: the ring's output and gradients, gathered, against the same inner stage run on the
 * whole sequence on one GPU (every element), and the ring's against the float64 reference of
 * common/reference.c on sampled rows (the course's pass rule). The inputs are made on each GPU
 * from their global index (ring_fill), so every split holds the same tensors.
 * The timing: the ring's pass between two synchronizations of every GPU, median of repeats,
 * beside the one-GPU run of the same shape (the ring of one): efficiency = T_1 / (P T_P).
 *
 * Exit codes as every stage's program (attention.h's attn_exit): pass, wrong, usage, unsupported
 * here (no GPU, no stage library: `make lib`), out of memory.
 */
#define _POSIX_C_SOURCE 200809L
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <libgen.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "attn_lib.h"
#include "common.h"
#include "csv_header.h"
#include "ring.h"

#define PEAKY_MUL 8.0f /* --dist peaky: Q scaled so that each query attends to a few keys */
#define MIN_REPEATS 3  /* timed runs of a pass, at least */
#define MAX_REPEATS 20 /* and at most, within --budget seconds */
#define CHECK_ROWS 24  /* float64 rows checked by default (the first, the last, a spread) */
#define SELF_TEST_PIECE \
    384 /* --self-test: queries and keys a piece of a block on some shapes (ring_pieces) */
enum { T_Q, T_K, T_V, T_DO, INPUTS }; /* the inputs' numbers in ring_fill */

typedef struct {
    int P, B, H, H_kv, D, causal, bf16, peaky, backward, bench, csv, self_test, timeline;
    int float64_only; /* --against float64 */
    long long N, check_rows, smem_limit, piece;
    int repeats;
    double budget;
    unsigned long long seed;
    ring_layout layout;
    const char *inner, *lib_dir;
    float scale;
} options;

static void usage_exit(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "stage10_context_parallel: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, " (--help lists the options)\n");
    va_end(ap);
    exit(ATTN_EXIT_USAGE);
}

static void help(void) {
    printf(
        "usage: stage10_context_parallel [options]\n"
        "  --gpus P             GPUs in the ring (default: every GPU here; 1: the ring of one)\n"
        "  --seq N              tokens of the whole sequence (default 4096)\n"
        "  --batch B --heads H --kv-heads H_kv --dim D   (defaults 1, 8, H, 128)\n"
        "  --causal             the causal mask (zigzag split balances it over the GPUs)\n"
        "  --layout zigzag|contiguous   how the tokens are split (contiguous: the naive ring)\n"
        "  --bf16               bfloat16 storage (default fp16)\n"
        "  --backward           the backward pass too (dQ, dK, dV from a random dO)\n"
        "  --check ROWS|0       float64 rows checked (default %d) and the one-GPU comparison; 0: "
        "none\n"
        "  --against one|float64  one: the ring of one too (default; float64 alone when it does "
        "not fit);\n"
        "                       float64: float64 alone on one (batch, key/value head) group, "
        "every token\n"
        "  --bench              time the ring and the one-GPU run: efficiency T_1 / (P T_P)\n"
        "  --budget SECONDS     time spent on repeats of a timed pass (default 10)\n"
        "  --repeats R          exactly R timed runs of a pass after its warm-up (long shapes)\n"
        "  --smem-limit BYTES   the inner stage's shared memory per block (65536: a T4's path)\n"
        "  --piece ROWS         the backward's unmasked blocks cut into pieces of at most ROWS\n"
        "                       queries and ROWS keys (default 65536)\n"
        "  --csv                one CSV row per timed pass\n"
        "  --timeline           each GPU's steps: when its compute and its transfer ran (ms)\n"
        "  --dist normal|peaky  peaky scales Q by 8 so each query attends to a few keys\n"
        "  --seed S --scale X   inputs' seed, softmax scale (default 1/sqrt(D))\n"
        "  --inner STAGE        the stage library inside (default: stage8_hopper_backward on\n"
        "                       Hopper, else stage7_backward; their forward passes: 6 and 5)\n"
        "  --lib-dir DIR        where the stage libraries are (default: lib/ beside this program)\n"
        "  --self-test          the standard matrix on the ring of one and of every GPU\n",
        CHECK_ROWS);
    exit(ATTN_EXIT_PASS);
}

static long long parse_int(const char *opt, const char *v, long long lo, long long hi) {
    char *end;
    long long x = strtoll(v, &end, 10);
    if (!*v || *end || x < lo || x > hi)
        usage_exit("%s: '%s' is not an integer from %lld to %lld", opt, v, lo, hi);
    return x;
}

static void parse(int argc, char **argv, options *o) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define VALUE() (v ? (i++, v) : (usage_exit("%s needs a value", a), ""))
        if (!strcmp(a, "--help") || !strcmp(a, "-h"))
            help();
        else if (!strcmp(a, "--gpus"))
            o->P = (int)parse_int(a, VALUE(), 1, RING_MAX_GPUS);
        else if (!strcmp(a, "--seq"))
            o->N = parse_int(a, VALUE(), 1, ATTN_MAX_N);
        else if (!strcmp(a, "--batch"))
            o->B = (int)parse_int(a, VALUE(), 1, ATTN_MAX_BH);
        else if (!strcmp(a, "--heads"))
            o->H = (int)parse_int(a, VALUE(), 1, ATTN_MAX_BH);
        else if (!strcmp(a, "--kv-heads"))
            o->H_kv = (int)parse_int(a, VALUE(), 1, ATTN_MAX_BH);
        else if (!strcmp(a, "--dim"))
            o->D = (int)parse_int(a, VALUE(), ATTN_MIN_D, ATTN_MAX_D);
        else if (!strcmp(a, "--causal"))
            o->causal = 1;
        else if (!strcmp(a, "--bf16"))
            o->bf16 = 1;
        else if (!strcmp(a, "--backward"))
            o->backward = 1;
        else if (!strcmp(a, "--bench"))
            o->bench = 1;
        else if (!strcmp(a, "--csv"))
            o->csv = 1;
        else if (!strcmp(a, "--self-test"))
            o->self_test = 1;
        else if (!strcmp(a, "--timeline"))
            o->timeline = 1;
        else if (!strcmp(a, "--seed"))
            o->seed = (unsigned long long)parse_int(a, VALUE(), 0, 1LL << 62);
        else if (!strcmp(a, "--inner"))
            o->inner = VALUE();
        else if (!strcmp(a, "--smem-limit"))
            o->smem_limit = parse_int(a, VALUE(), 1, 1LL << 30);
        else if (!strcmp(a, "--piece"))
            o->piece = parse_int(a, VALUE(), 1, 1LL << 40);
        else if (!strcmp(a, "--repeats"))
            o->repeats = (int)parse_int(a, VALUE(), 1, MAX_REPEATS);
        else if (!strcmp(a, "--lib-dir"))
            o->lib_dir = VALUE();
        else if (!strcmp(a, "--check")) {
            const char *c = VALUE();
            o->check_rows = !strcmp(c, "all") ? -1 : parse_int("--check", c, 0, ATTN_MAX_N);
        } else if (!strcmp(a, "--budget")) {
            const char *b = VALUE();
            char *end;
            o->budget = strtod(b, &end);
            if (*end || !(o->budget > 0)) usage_exit("--budget: '%s' is not a positive number", b);
        } else if (!strcmp(a, "--scale")) {
            const char *b = VALUE();
            char *end;
            o->scale = strtof(b, &end);
            if (*end || !(o->scale > 0) || !isfinite(o->scale))
                usage_exit("--scale: '%s' is not a positive number", b);
        } else if (!strcmp(a, "--layout")) {
            const char *l = VALUE();
            if (strcmp(l, "zigzag") && strcmp(l, "contiguous"))
                usage_exit("--layout: '%s' is not one of zigzag, contiguous", l);
            o->layout = strcmp(l, "zigzag") ? RING_CONTIGUOUS : RING_ZIGZAG;
        } else if (!strcmp(a, "--against")) {
            const char *c = VALUE();
            if (strcmp(c, "one") && strcmp(c, "float64"))
                usage_exit("--against: '%s' is not one of one, float64", c);
            o->float64_only = !strcmp(c, "float64");
        } else if (!strcmp(a, "--dist")) {
            const char *d = VALUE();
            if (strcmp(d, "normal") && strcmp(d, "peaky"))
                usage_exit("--dist: '%s' is not one of normal, peaky", d);
            o->peaky = !strcmp(d, "peaky");
        } else
            usage_exit("unknown option '%s'", a);
#undef VALUE
    }
    if (o->D % ATTN_D_STEP) usage_exit("--dim: %d is not a multiple of %d", o->D, ATTN_D_STEP);
    if (!o->H_kv) o->H_kv = o->H;
    if (o->H % o->H_kv) usage_exit("--kv-heads: %d does not divide --heads %d", o->H_kv, o->H);
    if ((long long)o->B * o->H > ATTN_MAX_BH) usage_exit("--batch x --heads over %d", ATTN_MAX_BH);
}

/* ---- the inner stage: a stage library, loaded ---- */

static int load_inner(const char *dir, const char *stage, ring_inner *in, char *err, size_t len) {
    char path[4096];
    snprintf(path, sizeof path, "%.3000s/lib%.500s.so", dir, stage);
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(err, len, "cannot load %.500s (make lib builds it): %.400s", path, dlerror());
        return ATTN_EXIT_UNSUPPORTED;
    }
    int (*abi)(void) = (int (*)(void))dlsym(h, "attn_lib_abi");
    size_t (*plan_bytes)(void) = (size_t (*)(void))dlsym(h, "attn_lib_plan_bytes");
    *(void **)&in->plan = dlsym(h, "attn_lib_plan");
    *(void **)&in->forward = dlsym(h, "attn_lib_forward");
    *(void **)&in->backward = dlsym(h, "attn_lib_backward");
    *(void **)&in->last_error = dlsym(h, "attn_lib_last_error");
    if (!abi || !plan_bytes || !in->plan || !in->forward || !in->backward || !in->last_error ||
        abi() != ATTN_LIB_ABI) {
        snprintf(err, len, "%.900s is not a stage library of this checkout (ABI %d): make lib",
                 path, ATTN_LIB_ABI);
        return ATTN_EXIT_UNSUPPORTED;
    }
    in->plan_bytes = plan_bytes();
    return ATTN_EXIT_PASS;
}

/* ---- one run: the ring's tensors on every GPU ---- */

typedef struct {
    void *t[INPUTS]; /* q, k, v, dO */
    void *o, *dq, *dk, *dv;
    float *lse;
    cudaStream_t stream;
} gpu_tensors;

typedef struct {
    ring_shape s;
    ring *g;
    gpu_tensors x[RING_MAX_GPUS];
} run;

static size_t elems(const ring_shape *s, int r, int heads) {
    return (size_t)s->B * heads * ring_split(s->N, s->P, s->layout, r).n * s->D;
}

static void free_run(run *u) {
    for (int r = 0; r < u->s.P; r++) {
        gpu_tensors *x = &u->x[r];
        if (cudaSetDevice(u->s.devices[r]) != cudaSuccess) continue;
        void *p[] = {x->t[0], x->t[1], x->t[2], x->t[3], x->o, x->dq, x->dk, x->dv, x->lse};
        for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) cudaFree(p[i]);
        if (x->stream) cudaStreamDestroy(x->stream);
    }
    ring_destroy(u->g);
    memset(u, 0, sizeof *u);
    /* a failed allocation (a run that did not fit) leaves its error as the thread's last one: the
     * next launch's check (cudaGetLastError) would read it as its own */
    (void)cudaGetLastError();
}

#define TRY_CUDA(call)                                                                \
    do {                                                                              \
        cudaError_t e_ = (call);                                                      \
        if (e_ != cudaSuccess) {                                                      \
            snprintf(err, errlen, "%s: %s", #call, cudaGetErrorString(e_));           \
            return e_ == cudaErrorMemoryAllocation ? ATTN_EXIT_OOM : ATTN_EXIT_WRONG; \
        }                                                                             \
    } while (0)

/* Allocates and fills every GPU's slice of the inputs, plans the ring. */
static int make_run(run *u, const ring_shape *s, const ring_inner *inner, const options *o,
                    char *err, size_t errlen) {
    memset(u, 0, sizeof *u);
    u->s = *s;
    int rc = ring_create(s, inner, &u->g, err, errlen);
    if (rc) return rc;
    const size_t e = 2; /* fp16, bf16 */
    for (int r = 0; r < s->P; r++) {
        gpu_tensors *x = &u->x[r];
        const ring_slice sl = ring_split(s->N, s->P, s->layout, r);
        const size_t qn = elems(s, r, s->H), kn = elems(s, r, s->H_kv);
        TRY_CUDA(cudaSetDevice(s->devices[r]));
        TRY_CUDA(cudaStreamCreateWithFlags(&x->stream, cudaStreamNonBlocking));
        const size_t sizes[INPUTS] = {qn, kn, kn, qn};
        for (int t = 0; t < INPUTS; t++) {
            if (t == T_DO && !s->backward) continue;
            TRY_CUDA(cudaMalloc(&x->t[t], sizes[t] * e + 1));
            const int heads = (t == T_K || t == T_V) ? s->H_kv : s->H;
            const float mul = (t == T_Q && o->peaky) ? PEAKY_MUL : 1.0f;
            TRY_CUDA((cudaError_t)ring_fill(x->t[t], s->bf16, &sl, s->N, s->B, heads, s->D, o->seed,
                                            (unsigned)t, mul, x->stream));
        }
        TRY_CUDA(cudaMalloc(&x->o, qn * e + 1));
        TRY_CUDA(cudaMalloc((void **)&x->lse, (size_t)s->B * s->H * sl.n * sizeof(float) + 4));
        if (s->backward) {
            TRY_CUDA(cudaMalloc(&x->dq, qn * e + 1));
            TRY_CUDA(cudaMalloc(&x->dk, kn * e + 1));
            TRY_CUDA(cudaMalloc(&x->dv, kn * e + 1));
        }
    }
    return ATTN_EXIT_PASS;
}

static int sync_all(const run *u, char *err, size_t errlen) {
    for (int r = 0; r < u->s.P; r++) {
        TRY_CUDA(cudaSetDevice(u->s.devices[r]));
        TRY_CUDA(cudaDeviceSynchronize());
    }
    return ATTN_EXIT_PASS;
}

static int forward(run *u, char *err, size_t errlen) {
    const void *q[RING_MAX_GPUS], *k[RING_MAX_GPUS], *v[RING_MAX_GPUS];
    void *o[RING_MAX_GPUS], *st[RING_MAX_GPUS];
    float *lse[RING_MAX_GPUS];
    for (int r = 0; r < u->s.P; r++) {
        q[r] = u->x[r].t[T_Q], k[r] = u->x[r].t[T_K], v[r] = u->x[r].t[T_V];
        o[r] = u->x[r].o, lse[r] = u->x[r].lse, st[r] = u->x[r].stream;
    }
    return ring_forward(u->g, q, k, v, o, lse, st, err, errlen);
}

static int backward(run *u, char *err, size_t errlen) {
    const void *q[RING_MAX_GPUS], *k[RING_MAX_GPUS], *v[RING_MAX_GPUS], *o[RING_MAX_GPUS],
        *dO[RING_MAX_GPUS];
    void *dq[RING_MAX_GPUS], *dk[RING_MAX_GPUS], *dv[RING_MAX_GPUS], *st[RING_MAX_GPUS];
    const float *lse[RING_MAX_GPUS];
    for (int r = 0; r < u->s.P; r++) {
        const gpu_tensors *x = &u->x[r];
        q[r] = x->t[T_Q], k[r] = x->t[T_K], v[r] = x->t[T_V], o[r] = x->o, dO[r] = x->t[T_DO];
        lse[r] = x->lse, dq[r] = x->dq, dk[r] = x->dk, dv[r] = x->dv, st[r] = x->stream;
    }
    return ring_backward(u->g, q, k, v, o, lse, dO, dq, dk, dv, st, err, errlen);
}

/* ---- gathering: every GPU's slice into the whole sequence's tensor as floats ---- */

/* Heads first .. first + count - 1 of the flattened (batch, head) pairs of a [B, heads, N, cols]
 * tensor (0 and B heads: all of it), every token in the sequence's order: out [count, N, cols]. A
 * slice holds them as one span of its rows. */
static int gather(const run *u, int which, long long first, long long count, int cols, float *out,
                  char *err, size_t errlen) {
    const ring_shape *s = &u->s;
    for (int r = 0; r < s->P; r++) {
        const ring_slice sl = ring_split(s->N, s->P, s->layout, r);
        const size_t n = (size_t)count * sl.n * cols;
        if (!n) continue;
        const gpu_tensors *x = &u->x[r];
        const void *src = which < INPUTS        ? x->t[which]
                          : which == INPUTS     ? x->o
                          : which == INPUTS + 1 ? (const void *)x->lse
                          : which == INPUTS + 2 ? x->dq
                          : which == INPUTS + 3 ? x->dk
                                                : x->dv;
        const int is_lse = which == INPUTS + 1;
        const size_t elem = is_lse ? sizeof(float) : 2;
        const size_t bytes = n * elem;
        unsigned char *h = malloc(bytes);
        if (!h) {
            snprintf(err, errlen, "no host memory for the gathered tensors");
            return ATTN_EXIT_OOM;
        }
        TRY_CUDA(cudaSetDevice(s->devices[r]));
        TRY_CUDA(cudaMemcpy(h, (const unsigned char *)src + (size_t)first * sl.n * cols * elem,
                            bytes, cudaMemcpyDeviceToHost));
        for (long long bh = 0; bh < count; bh++)
            for (long long row = 0; row < sl.n; row++) {
                const long long token =
                    row < sl.rows[0] ? sl.start[0] + row : sl.start[1] + row - sl.rows[0];
                for (int c = 0; c < cols; c++) {
                    const size_t from = ((size_t)bh * sl.n + row) * cols + c;
                    float val;
                    if (is_lse)
                        memcpy(&val, h + from * sizeof(float), sizeof(float));
                    else {
                        uint16_t b;
                        memcpy(&b, h + from * 2, 2);
                        val = s->bf16 ? bf16_to_f32(b) : f16_to_f32(b);
                    }
                    out[((size_t)bh * s->N + token) * cols + c] = val;
                }
            }
        free(h);
    }
    return ATTN_EXIT_PASS;
}

/* ---- checking ---- */

typedef struct {
    /* o, lse, dq, dk, dv: max |ring - one GPU|, and its bound: twice the float64 check's bound
     * past one ulp of the one-GPU value (their sums are rounded in different orders) */
    double diff[5], bound[5];
    int worst;   /* the first tensor past its bound, -1: none */
    int one_gpu; /* 1: compared with the ring of one; 0: it did not fit, float64 on one group */
    long long group_batch, group_head; /* that group: its batch and key/value head */
    check_result out;
    grad_check_result grads;
    int pass;
} verdict;

/* One unit in the last place of x in the storage type (10 or 7 fraction bits): two correct results
 * rounded from slightly different sums can differ by it. */
static double ulp(double x, int bf16) {
    int e;
    frexp(fabs(x), &e);
    return ldexp(1.0, e - 1 - (bf16 ? 7 : 10));
}

static double max_abs(const float *a, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fabs((double)a[i]) > m ? fabs((double)a[i]) : m;
    return m;
}

/* max |a - b| over n values (relative: |a - b| / (1 + |b|), as the checker takes lse), and into
 * *excess the most any |a - b| passes one ulp of b (16-bit values); equal infinities agree, a NaN
 * makes both NaN (never a pass). */
static double max_diff(const float *a, const float *b, size_t n, int relative, int bf16,
                       double *excess) {
    double m = 0, x = 0;
    for (size_t i = 0; i < n; i++) {
        if (isinf(a[i]) && isinf(b[i]) && (a[i] > 0) == (b[i] > 0)) continue;
        const double d =
            fabs((double)a[i] - (double)b[i]) / (relative ? 1 + fabs((double)b[i]) : 1);
        const double over = relative ? d : d - ulp(b[i], bf16);
        if (!(d <= m)) m = d;
        if (!(over <= x)) x = over;
    }
    *excess = x;
    return m;
}

/* Tensors of a check, in gather's numbering: q k v dO (inputs), then o lse dq dk dv. */
enum { CHECKED = 9 };

/* The roundings tensor i (gather's numbering: 4 o, 6 dq, 7 dk, 8 dv) of the ring has beyond one
 * GPU's run: each step's partial result rounded to the storage type before it is added, P - 1 of
 * them, and a gradient one more for each further piece of a block (ring_pieces): dQ along the
 * block's keys, dK and dV along its queries. Each is at most an ulp of the largest value. */
static double extra_roundings(const ring_shape *s, int i) {
    const long long pieces = i == 6   ? ring_pieces_max(s, RING_KEYS)
                             : i >= 7 ? ring_pieces_max(s, RING_QUERIES)
                                      : 1;
    return (s->P - 1) + s->P * (double)(pieces - 1);
}

/* The float64 check of the ring's results (t: the gathered tensors of B batches, H query heads and
 * H_kv key/value heads of the whole sequence: all of it, or one group) on sampled rows, the
 * course's pass rule, with the ring's extra roundings (extra_roundings) allowed beside it. */
static int check_float64(const ring_shape *s, int B, int H, int H_kv, float *const *t,
                         const options *o, verdict *vd, char *err, size_t errlen) {
    const ref_shape rs = {.B = B,
                          .H = H,
                          .N = (int)s->N,
                          .D = s->D,
                          .causal = s->causal,
                          .scale = s->scale,
                          .H_kv = H_kv,
                          .N_k = (int)s->N};
    const store_type st = s->bf16 ? STORE_BF16 : STORE_F16;
    const long long total = (long long)rs.B * rs.H * rs.N,
                    ktotal = (long long)rs.B * rs.H_kv * rs.N;
    const size_t qn = (size_t)total * rs.D, kn = (size_t)ktotal * rs.D;
    long long *rows = malloc(sizeof(long long) * (size_t)(total + ktotal));
    if (!rows) {
        snprintf(err, errlen, "no host memory for the check's rows");
        return ATTN_EXIT_OOM;
    }
    const long long nq = pick_rows(total, o->check_rows, o->seed, rows);
    const long long nk = pick_rows(ktotal, o->check_rows, o->seed + 1, rows + nq);
    check_output(&rs, st, t[T_Q], t[T_K], t[T_V], t[4], t[5], rows, nq, &vd->out);
    vd->out.pass = vd->out.nonfinite == 0 &&
                   vd->out.max_abs_err <=
                       vd->out.bound + extra_roundings(s, 4) * ulp(max_abs(t[4], qn), s->bf16) &&
                   vd->out.lse_err <= vd->out.lse_bound;
    vd->pass = vd->out.pass;
    if (s->backward) {
        check_gradients(&rs, st, t[T_Q], t[T_K], t[T_V], t[T_DO], t[4], t[5], t[6], t[7], t[8],
                        rows, nq, rows + nq, nk, &vd->grads);
        const size_t count[GRADS] = {qn, kn, kn};
        vd->grads.pass = vd->grads.nonfinite == 0;
        for (int gi = 0; gi < GRADS; gi++)
            vd->grads.pass &= vd->grads.max_abs_err[gi] <=
                              vd->grads.bound[gi] + extra_roundings(s, 6 + gi) *
                                                        ulp(max_abs(t[6 + gi], count[gi]), s->bf16);
        vd->pass &= vd->grads.pass;
    }
    free(rows);
    return ATTN_EXIT_PASS;
}

/* Gathers tensors `which` of the problem whose (batch, head) pairs start at qfirst (query heads,
 * qcount of them) and kfirst (key/value heads, kcount) into t (allocated here; the caller frees).
 */
static int gather_all(const run *u, long long qfirst, long long qcount, long long kfirst,
                      long long kcount, int inputs, int outputs, float **t, char *err,
                      size_t errlen) {
    const ring_shape *s = &u->s;
    for (int i = 0; i < CHECKED; i++) {
        const int is_input = i < INPUTS;
        if ((is_input && !inputs) || (!is_input && !outputs)) continue;
        if (!s->backward && (i == T_DO || i >= 6)) continue;
        const int keys = i == T_K || i == T_V || i == 7 || i == 8;
        const long long first = keys ? kfirst : qfirst, count = keys ? kcount : qcount;
        const int cols = i == 5 ? 1 : s->D;
        t[i] = malloc((size_t)count * s->N * cols * sizeof(float) + 4);
        if (!t[i]) {
            snprintf(err, errlen, "no host memory for the check");
            return ATTN_EXIT_OOM;
        }
        const int rc = gather(u, i, first, count, cols, t[i], err, errlen);
        if (rc) return rc;
    }
    return ATTN_EXIT_PASS;
}

/* When the whole sequence does not fit one GPU: float64 alone, on one group of the ring's results
 * (a batch and key/value head picked by the seed, its query heads: every token of each), the
 * inputs gathered from the ring itself (ring_fill makes the same tensors in any split). */
static int check_group(const run *ring_run, const options *o, verdict *vd, char *err,
                       size_t errlen) {
    const ring_shape *s = &ring_run->s;
    const int group = s->H / s->H_kv;
    const long long kv = (long long)(o->seed % (unsigned long long)((long long)s->B * s->H_kv));
    vd->one_gpu = 0;
    vd->group_batch = kv / s->H_kv, vd->group_head = kv % s->H_kv;
    const long long qfirst = vd->group_batch * s->H + vd->group_head * group;
    float *t[CHECKED] = {0};
    int rc = gather_all(ring_run, qfirst, group, kv, 1, 1, 1, t, err, errlen);
    if (!rc) rc = check_float64(s, 1, group, 1, t, o, vd, err, errlen);
    for (int i = 0; i < CHECKED; i++) free(t[i]);
    return rc;
}

/* The ring (P GPUs) against the ring of one on devices[0] (every element) and against float64 on
 * sampled rows; when the ring of one does not fit, float64 alone on one group (check_group). */
static int check_ring(run *ring_run, const ring_inner *inner, const options *o, verdict *vd,
                      char *err, size_t errlen) {
    const ring_shape *s = &ring_run->s;
    memset(vd, 0, sizeof *vd);
    vd->worst = -1;
    if (o->float64_only) return check_group(ring_run, o, vd, err, errlen);
    ring_shape one = *s;
    one.P = 1;
    run single;
    int rc = make_run(&single, &one, inner, o, err, errlen);
    if (!rc) rc = forward(&single, err, errlen);
    if (!rc && s->backward) rc = backward(&single, err, errlen);
    if (!rc) rc = sync_all(&single, err, errlen);
    if (rc == ATTN_EXIT_OOM && s->P > 1) {
        free_run(&single);
        return check_group(ring_run, o, vd, err, errlen);
    }
    vd->one_gpu = 1;
    const long long bh = (long long)s->B * s->H, bh_kv = (long long)s->B * s->H_kv;
    float *t1[CHECKED] = {0}, *tp[CHECKED] = {0};
    if (!rc) rc = gather_all(&single, 0, bh, 0, bh_kv, 1, 1, t1, err, errlen);
    if (!rc) rc = gather_all(ring_run, 0, bh, 0, bh_kv, 0, 1, tp, err, errlen);
    if (!rc) {
        for (int i = 0; i < INPUTS; i++) tp[i] = t1[i], t1[i] = NULL; /* the same inputs */
        rc = check_float64(s, s->B, s->H, s->H_kv, tp, o, vd, err, errlen);
    }
    if (!rc) {
        /* twice the float64 rule's bound, and as there P - 1 more roundings of the partial results
         * (an ulp of the largest value each: where partials cancel, as under a peaked softmax,
         * their roundings are far above the sum's) */
        const size_t qn = (size_t)bh * s->N * s->D, kn = (size_t)bh_kv * s->N * s->D;
        const size_t count[5] = {qn, (size_t)bh * s->N, qn, kn, kn};
        vd->bound[0] = 2 * vd->out.bound, vd->bound[1] = 2 * vd->out.lse_bound;
        for (int gi = 0; s->backward && gi < GRADS; gi++)
            vd->bound[2 + gi] = 2 * vd->grads.bound[gi];
        for (int i = 4; i < CHECKED; i++)
            if (i != 5 && t1[i])
                vd->bound[i - 4] +=
                    extra_roundings(s, i) * ulp(max_abs(t1[i], count[i - 4]), s->bf16);
        for (int i = 4; i < CHECKED; i++) {
            if (!tp[i]) continue;
            double excess;
            vd->diff[i - 4] = max_diff(tp[i], t1[i], count[i - 4], i == 5, s->bf16, &excess);
            if (!(excess <= vd->bound[i - 4])) vd->pass = 0, vd->worst = i - 4;
        }
    }
    for (int i = 0; i < CHECKED; i++) free(t1[i]), free(tp[i]);
    free_run(&single);
    return rc;
}

/* ---- timing ---- */

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median seconds of a pass (0: forward, 1: backward, after a forward) over repeats. */
static int time_pass(run *u, int pass, double budget, int repeats, double *median, char *err,
                     size_t errlen) {
    double t[MAX_REPEATS];
    int n = 0, rc;
    const double begin = now();
    for (int warm = 1; n < (repeats ? repeats : MAX_REPEATS); warm = 0) {
        if ((rc = sync_all(u, err, errlen))) return rc;
        const double t0 = now();
        rc = pass ? backward(u, err, errlen) : forward(u, err, errlen);
        if (!rc) rc = sync_all(u, err, errlen);
        if (rc) return rc;
        if (!warm) t[n++] = now() - t0;
        if (!repeats && n >= MIN_REPEATS && now() - begin > budget) break;
    }
    qsort(t, (size_t)n, sizeof t[0], cmp_double);
    *median = t[n / 2];
    return ATTN_EXIT_PASS;
}

static double flops(const ring_shape *s) { /* the forward's: 4 B H N^2 D, halved when causal */
    return 4.0 * s->B * s->H * (double)s->N * (double)s->N * s->D * (s->causal ? 0.5 : 1.0);
}

/* ---- the program ---- */

static const char *layout_name(ring_layout l) {
    return l == RING_ZIGZAG ? "zigzag" : "contiguous";
}

/* One more forward (and backward) pass with the timeline on: per GPU and step, ms from the pass's
 * start when the step's compute began and ended, and when its transfer of the next slice did. */
static void print_timeline(run *u, const char *what) {
    char err[512];
    if (ring_timeline_on(u->g, err, sizeof err)) {
        printf("timeline: %s\n", err);
        return;
    }
    for (int pass = 0; pass <= u->s.backward; pass++) {
        if ((pass ? backward(u, err, sizeof err) : forward(u, err, sizeof err)) ||
            sync_all(u, err, sizeof err)) {
            printf("timeline: %s\n", err);
            return;
        }
        printf("timeline of %s, %s (ms from the pass's start on each GPU):\n", what,
               pass ? "backward" : "forward");
        for (int r = 0; r < u->s.P; r++)
            for (int t = 0; t < u->s.P; t++) {
                float ms[4];
                ring_timeline(u->g, r, t, ms);
                printf("  GPU %d step %d (keys of GPU %d): compute %9.3f .. %9.3f", r, t,
                       ((r - t) % u->s.P + u->s.P) % u->s.P, ms[0], ms[1]);
                if (ms[2] >= 0) printf("   next slice sent %9.3f .. %9.3f", ms[2], ms[3]);
                printf("\n");
            }
    }
}

static int one_shape(const ring_shape *s, const ring_inner *inner, const char *inner_name,
                     const options *o, const char *gpu, int *failed) {
    char err[1024] = "";
    run u;
    int rc = make_run(&u, s, inner, o, err, sizeof err);
    if (!rc) rc = forward(&u, err, sizeof err);
    if (!rc && s->backward) rc = backward(&u, err, sizeof err);
    if (!rc) rc = sync_all(&u, err, sizeof err);
    char what[256];
    snprintf(what, sizeof what, "P=%d %s B=%d H=%d H_kv=%d N=%lld D=%d%s %s%s", s->P,
             layout_name(s->layout), s->B, s->H, s->H_kv, s->N, s->D, s->causal ? " causal" : "",
             s->bf16 ? "bf16" : "fp16", s->backward ? " fwd+bwd" : " fwd");
    verdict vd = {0};
    vd.pass = 1;
    if (!rc && o->check_rows) rc = check_ring(&u, inner, o, &vd, err, sizeof err);
    if (rc) {
        printf("%-64s %s: %s\n", what,
               rc == ATTN_EXIT_OOM           ? "OOM"
               : rc == ATTN_EXIT_UNSUPPORTED ? "unsupported"
                                             : "FAIL",
               err);
        free_run(&u);
        *failed += rc != ATTN_EXIT_OOM && rc != ATTN_EXIT_UNSUPPORTED;
        return rc;
    }
    if (o->timeline) print_timeline(&u, what);
    if (o->check_rows && vd.one_gpu) {
        printf("%-64s %s  o %.2e (vs 1 GPU %.2e <= %.2e) lse %.2e", what, vd.pass ? "ok  " : "FAIL",
               vd.out.max_abs_err, vd.diff[0], vd.bound[0], vd.diff[1]);
        if (s->backward)
            printf(" dq %.2e dk %.2e dv %.2e (vs 1 GPU %.1e %.1e %.1e)", vd.grads.max_abs_err[0],
                   vd.grads.max_abs_err[1], vd.grads.max_abs_err[2], vd.diff[2], vd.diff[3],
                   vd.diff[4]);
    } else if (o->check_rows) {
        printf("%-64s %s  o %.2e lse %.2e", what, vd.pass ? "ok  " : "FAIL", vd.out.max_abs_err,
               vd.out.lse_err);
        if (s->backward)
            printf(" dq %.2e dk %.2e dv %.2e", vd.grads.max_abs_err[0], vd.grads.max_abs_err[1],
                   vd.grads.max_abs_err[2]);
        printf(" (float64 alone%s: batch %lld, key/value head %lld)",
               o->float64_only ? "" : ", one GPU out of memory", vd.group_batch, vd.group_head);
    }
    if (o->check_rows) {
        static const char *names[5] = {"o", "lse", "dq", "dk", "dv"};
        if (!vd.pass)
            printf("  [%s]", vd.worst >= 0  ? names[vd.worst]
                             : !vd.out.pass ? "o against float64"
                                            : "gradients against float64");
        printf("\n");
        *failed += !vd.pass;
    }
    if (o->bench && !*failed) {
        double tf = 0, tb = 0, tf1 = 0, tb1 = 0;
        rc = time_pass(&u, 0, o->budget, o->repeats, &tf, err, sizeof err);
        if (!rc && s->backward) rc = time_pass(&u, 1, o->budget, o->repeats, &tb, err, sizeof err);
        free_run(&u);
        ring_shape one = *s;
        one.P = 1;
        if (!rc) rc = make_run(&u, &one, inner, o, err, sizeof err);
        if (!rc) rc = time_pass(&u, 0, o->budget, o->repeats, &tf1, err, sizeof err);
        if (!rc && s->backward) rc = time_pass(&u, 1, o->budget, o->repeats, &tb1, err, sizeof err);
        if (rc == ATTN_EXIT_OOM && tf > 0 && s->P > 1) { /* the ring's times stand alone */
            printf("%-64s forward %.3f ms (%.0f TFLOP/s per GPU)", what, 1e3 * tf,
                   flops(s) / tf / s->P * 1e-12);
            if (s->backward) printf(" backward %.3f ms", 1e3 * tb);
            printf(" (one GPU out of memory)  [%s]\n", inner_name);
            free_run(&u);
            fflush(stdout);
            return ATTN_EXIT_PASS;
        }
        if (rc) {
            printf("%-64s %s: %s\n", what, rc == ATTN_EXIT_OOM ? "OOM (timing)" : "FAIL", err);
            free_run(&u);
            *failed += rc != ATTN_EXIT_OOM;
            return rc;
        }
        const double eff_f = tf1 / (s->P * tf), eff_fb = (tf1 + tb1) / (s->P * (tf + tb));
        printf("%-64s forward %.3f ms (1 GPU %.3f, efficiency %.3f, %.0f TFLOP/s per GPU)", what,
               1e3 * tf, 1e3 * tf1, eff_f, flops(s) / tf / s->P * 1e-12);
        if (s->backward)
            printf(" backward %.3f ms (1 GPU %.3f) fwd+bwd efficiency %.3f", 1e3 * tb, 1e3 * tb1,
                   eff_fb);
        printf("  [%s]\n", inner_name);
        if (o->csv) { /* the backward's columns empty for a forward alone */
            printf("csv,%s,%d,%s,%s,%d,%d,%d,%lld,%d,%d,%s,%.4f,%.4f,%.4f,", gpu, s->P,
                   layout_name(s->layout), inner_name, s->B, s->H, s->H_kv, s->N, s->D, s->causal,
                   s->bf16 ? "bf16" : "fp16", 1e3 * tf, 1e3 * tf1, eff_f);
            if (s->backward)
                printf("%.4f,%.4f,%.4f\n", 1e3 * tb, 1e3 * tb1, eff_fb);
            else
                printf(",,\n");
        }
    }
    fflush(stdout);
    free_run(&u);
    return ATTN_EXIT_PASS;
}

static int self_test(ring_shape base, const ring_inner *inner, const char *inner_name,
                     const options *o, const char *gpu, int gpus) {
    static const long long Ns[] = {1, 3, 64, 1000, 4097};
    static const int heads[][3] = {{1, 2, 2}, {2, 4, 2}}; /* B, H, H_kv */
    int failed = 0, passed = 0, unsupported = 0;
    const int Ps[2] = {1, gpus};
    for (int pi = 0; pi < (gpus > 1 ? 2 : 1); pi++)
        for (int layout = 0; layout < 2; layout++)
            for (int causal = 0; causal < 2; causal++)
                for (size_t ni = 0; ni < sizeof Ns / sizeof Ns[0]; ni++)
                    for (int hi = 0; hi < 2; hi++) {
                        if (Ps[pi] == 1 && layout == RING_CONTIGUOUS) continue; /* the same */
                        ring_shape s = base;
                        s.P = Ps[pi], s.layout = (ring_layout)layout, s.causal = causal;
                        s.N = Ns[ni], s.B = heads[hi][0], s.H = heads[hi][1];
                        s.H_kv = heads[hi][2], s.backward = 1;
                        s.D = (ni + hi) % 2 ? 64 : 128, s.bf16 = (int)(ni % 2);
                        s.scale = 1.0f / sqrtf((float)s.D);
                        /* the backward's blocks in pieces (ring_pieces): of 384 queries and 384
                         * keys, on the long shapes of the second head set */
                        s.piece = Ns[ni] >= 1000 && hi ? SELF_TEST_PIECE : 0;
                        /* N = 1000 with a peaked softmax (Q x 8): partials that cancel */
                        options po = *o;
                        po.peaky = Ns[ni] == 1000;
                        const int before = failed;
                        const int rc = one_shape(&s, inner, inner_name, &po, gpu, &failed);
                        passed += failed == before && rc != ATTN_EXIT_UNSUPPORTED;
                        unsupported += rc == ATTN_EXIT_UNSUPPORTED;
                    }
    printf("%d passed, %d failed, %d unsupported by %s here\n", passed, failed, unsupported,
           inner_name);
    return failed ? ATTN_EXIT_WRONG : ATTN_EXIT_PASS;
}

int main(int argc, char **argv) {
    options o = {.B = 1,
                 .H = 8,
                 .D = 128,
                 .N = 4096,
                 .check_rows = CHECK_ROWS,
                 .budget = 10,
                 .seed = 1,
                 .layout = RING_ZIGZAG};
    parse(argc, argv, &o);
    int gpus = 0;
    if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus < 1) {
        fprintf(stderr, "stage10_context_parallel: no NVIDIA GPU here (waived)\n");
        return ATTN_EXIT_UNSUPPORTED;
    }
    if (!o.P) o.P = gpus > RING_MAX_GPUS ? RING_MAX_GPUS : gpus;
    if (o.P > gpus) usage_exit("--gpus: %d, but this machine has %d GPU(s)", o.P, gpus);
    struct cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) {
        fprintf(stderr, "stage10_context_parallel: cannot read GPU 0's properties\n");
        return ATTN_EXIT_UNSUPPORTED;
    }
    const int cc = prop.major * 10 + prop.minor;
    const char *inner_name = o.inner    ? o.inner
                             : cc == 90 ? "stage8_hopper_backward"
                                        : "stage7_backward";
    char dir[4096], err[1024];
    if (o.lib_dir)
        snprintf(dir, sizeof dir, "%.4000s", o.lib_dir);
    else {
        char self[4096] = "";
        const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
        if (n > 0) self[n] = 0;
        snprintf(dir, sizeof dir, "%.4000s/lib", n > 0 ? dirname(self) : ".");
    }
    ring_inner inner;
    const int rc = load_inner(dir, inner_name, &inner, err, sizeof err);
    if (rc) {
        fprintf(stderr, "stage10_context_parallel: %s\n", err);
        return rc;
    }
    ring_shape s = {.B = o.B,
                    .H = o.H,
                    .H_kv = o.H_kv,
                    .D = o.D,
                    .causal = o.causal,
                    .bf16 = o.bf16,
                    .N = o.N,
                    .P = o.P,
                    .layout = o.layout,
                    .backward = o.backward,
                    .smem_limit = o.smem_limit,
                    .piece = o.piece};
    s.scale = o.scale > 0 ? o.scale : 1.0f / sqrtf((float)o.D);
    for (int r = 0; r < RING_MAX_GPUS; r++) s.devices[r] = r;
    printf("stage10_context_parallel: %d x %s, ring of %d, inner %s\n", gpus, prop.name, o.P,
           inner_name);
    if (o.csv) printf("csv,%s\n", RING_CSV_HEADER);
    if (o.self_test) return self_test(s, &inner, inner_name, &o, prop.name, o.P);
    int failed = 0;
    const int r = one_shape(&s, &inner, inner_name, &o, prop.name, &failed);
    return r ? r : failed ? ATTN_EXIT_WRONG : ATTN_EXIT_PASS;
}
