/*
 * main.c: the one program every stage links. It owns everything that is not the algorithm:
 * options, inputs, device memory, the check against the float64 reference, timing, CSV.
 *
 *   build/<stage> --seq 4096 --dim 128 --heads 16 --causal --bench --csv
 *   build/<stage> --self-test            # the standard matrix, ends with "N passed, M failed"
 *
 * Exit codes: the attn_exit enum of attention.h (pass; a wrong result or a CUDA fault; bad usage:
 * options or input files; unsupported here: no NVIDIA GPU, or a shape or variant this stage
 * cannot run; out of device or host memory), which --help lists with their numbers. Every bad
 * input gets one line on stderr naming the option or file.
 */
#define _POSIX_C_SOURCE 200809L
#include <ctype.h>
#include <errno.h>
#include <float.h>
#include <getopt.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "attention.h"
#include "common.h"
#include "csv_header.h"
#include "device_info.h"

/* Every CUDA call outside a stage goes through this: the call's text, file and line. */
#define CUDA_CHECK(call)                                                               \
    do {                                                                               \
        cudaError_t err_ = (call);                                                     \
        if (err_ != cudaSuccess) {                                                     \
            fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call,       \
                    cudaGetErrorString(err_));                                         \
            exit(err_ == cudaErrorMemoryAllocation ? ATTN_EXIT_OOM : ATTN_EXIT_WRONG); \
        }                                                                              \
    } while (0)

#define SELF_TEST_FULL_ROWS 4096 /* self-test checks every row up to this many, else a sample */
#define SELF_TEST_SAMPLE 512
#define MIN_REPEATS 10  /* timing: at least this many launches ... */
#define MIN_SECONDS 0.5 /* ... and this much measured time, */
#define SLOW_MS 1000.0  /* unless one launch takes longer than this: then ... */
#define SLOW_REPEATS 3  /* ... this many launches */
#define MAX_REPEATS 10000
/* The stages with a backward pass, named where a forward-only stage is asked for one (the
 * Makefile passes them from the stages' stage.mk declarations). */
#ifndef ATTN_BACKWARD_STAGES
#define ATTN_BACKWARD_STAGES "no stage"
#endif

typedef struct {
    attn_shape shape;
    int given_B, given_H, given_N, given_D, given_scale;
    const char *shape_from; /* "--q 'q.npy'": the file the shape was taken from, if any */
    int given_run;          /* an option the self-test would ignore (shape, --dist, --check...) */
    uint64_t seed;
    int peaky;
    const char *qpath, *kpath, *vpath, *outpath, *lsepath;
    const char *dOpath, *dqpath, *dkpath, *dvpath; /* the backward pass's input and outputs */
    long long check_rows;                          /* -1: all rows */
    int bench, csv, self_test, variant, variant_given;
    double budget_s;
    long long smem_limit;
} options;

typedef struct { /* host inputs: float copies hold exactly the stored values */
    float *Qf, *Kf, *Vf, *dOf;
    void *Qs, *Ks, *Vs, *dOs; /* storage-typed (aliases of the float arrays for fp32 stages) */
} host_inputs;

/* What a timed run enqueues: the forward pass, the backward pass alone (given the forward's O
 * and LSE), or both, as a training step runs them. The CSV's pass column. */
typedef enum { PASS_FWD = 0, PASS_BWD = 1, PASS_BOTH = 2, PASSES = 3 } pass_kind;
static const char *const pass_names[PASSES] = {"fwd", "bwd", "fwd+bwd"};
/* FLOPs per pass, in units of the forward's 4 B H N^2 D (halved when causal): the backward's
 * five matrix products against the forward's two count 2.5 (the FlashAttention papers' rule). */
static const double pass_flops[PASSES] = {1.0, 2.5, 3.5};

/* The forward's FLOPs: 4 B H N^2 D (two matrix products of 2 N^2 D each per head), halved when
 * causal (the FlashAttention papers' rule; plots/flops.py is the Python side's home). */
static double attn_flops(const attn_shape *s) {
    return 4.0 * s->B * s->H * (double)s->N * s->N * s->D * (s->causal ? 0.5 : 1.0);
}

typedef struct {
    double ms_median, ms_min, tflops;
    int repeats;
} timing;

typedef struct {
    const char *status;
    timing t[PASSES];
    check_result chk;       /* the forward's O and LSE */
    grad_check_result gchk; /* the backward's dQ, dK, dV */
    int checked, gchecked;
    double device_mb;
} run_result;

static const char *prog = "attention";

static void die_usage(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s: error: ", prog);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, " (see --help)\n");
    va_end(ap);
    exit(ATTN_EXIT_USAGE);
}

/* ---- options ---- */

static void usage(void) {
    printf(
        "usage: %s [options]\n"
        "%s: %s\n\n"
        "shape:\n"
        "  --batch B          batch size (default 1)\n"
        "  --heads H          heads (default 1)\n"
        "  --seq N            tokens, N >= 1 (default 1024)\n"
        "  --dim D            head dim: 64 or 128 (default 128)\n"
        "  --causal           query i attends to keys 0..i\n"
        "  --scale S          softmax scale, a positive float (default 1/sqrt(D))\n"
        "                     B x H <= %d; B, H, N, D may also come from the .npy files\n"
        "inputs and outputs:\n"
        "  --seed N           random inputs seed (default 1)\n"
        "  --dist normal|peaky  peaky scales Q by 8 so each query attends to a few keys\n"
        "  --q/--k/--v FILE   read Q, K or V from a .npy [B, H, N, D] float16 or float32\n"
        "  --out FILE         write O as .npy [B, H, N, D] in the stage's storage type (%s)\n"
        "  --lse FILE         write LSE as .npy [B, H, N] float32\n"
        "  --dO FILE          the backward pass's dO, .npy [B, H, N, D] (default: random normal)\n"
        "  --dq/--dk/--dv FILE  write dQ, dK or dV as .npy [B, H, N, D] (stages with a backward)\n"
        "run:\n"
        "  --check ROWS|all|0 rows checked against the float64 reference (default 64)\n"
        "  --bench            time the kernel (median of >= %d launches and %.1f s)\n"
        "  --budget SECONDS   longest one launch may take before the row is over_budget "
        "(default 60)\n"
        "  --csv              print a CSV header and row on stdout\n"
        "  --variant NAME     one of: %s\n"
        "  --smem-limit BYTES lower the shared memory per block the stage may use\n"
        "                     (65536 = T4, 101376 = L4)\n"
        "  --self-test        run the standard test matrix; ends with 'N passed, M failed'\n"
        "                     (its own shapes and inputs: no shape, input or run options)\n"
        "  --help             this text\n"
        "exit codes: %d pass, %d wrong result, %d bad usage, %d unsupported here (no NVIDIA "
        "GPU, or the shape), %d out of device or host memory\n",
        prog, attn_this_stage.name, attn_this_stage.adds, ATTN_MAX_BH,
        attn_this_stage.dtype == ATTN_F16 ? "float16" : "float32", MIN_REPEATS, MIN_SECONDS,
        attn_this_stage.variants, ATTN_EXIT_PASS, ATTN_EXIT_WRONG, ATTN_EXIT_USAGE,
        ATTN_EXIT_UNSUPPORTED, ATTN_EXIT_OOM);
}

static long long parse_int(const char *opt, const char *s, long long lo, long long hi) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        die_usage("%s: '%s' is not an integer in [%lld, %lld]", opt, s, lo, hi);
    return v;
}

static double parse_pos(const char *opt, const char *s) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v > 0) || !isfinite(v))
        die_usage("%s: '%s' is not a positive number", opt, s);
    return v;
}

/* A positive number that stays itself as a float: no underflow to 0 or subnormal, no inf. */
static float parse_pos_float(const char *opt, const char *s) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end || !(v > 0) || isnan(v))
        die_usage("%s: '%s' is not a positive number", opt, s);
    if (errno || v < FLT_MIN || v > FLT_MAX)
        die_usage("%s: '%s' is outside the float range [%g, %g]", opt, s, (double)FLT_MIN,
                  (double)FLT_MAX);
    return (float)v;
}

/* An output path must be writable before the kernel runs, not after. */
static void check_writable(const char *opt, const char *path) {
    struct stat st;
    if (stat(path, &st) == 0) {
        if (S_ISDIR(st.st_mode)) die_usage("%s: '%s' is a directory", opt, path);
        if (access(path, W_OK) != 0)
            die_usage("%s: cannot write '%s': %s", opt, path, strerror(errno));
        return;
    }
    FILE *f = fopen(path, "wb");
    if (!f) die_usage("%s: cannot write '%s': %s", opt, path, strerror(errno));
    fclose(f);
    remove(path);
}

/* The options: getopt_long's table. Every option but --help (-h) and the flags takes a value;
 * "--seq 4096" and "--seq=4096" both work, and so does a unique prefix ("--caus"). */
enum {
    OPT_HELP = 'h',
    OPT_BATCH = 256,
    OPT_HEADS,
    OPT_SEQ,
    OPT_DIM,
    OPT_CAUSAL,
    OPT_SCALE,
    OPT_SEED,
    OPT_DIST,
    OPT_Q,
    OPT_K,
    OPT_V,
    OPT_OUT,
    OPT_LSE,
    OPT_DO,
    OPT_DQ,
    OPT_DK,
    OPT_DV,
    OPT_CHECK,
    OPT_BENCH,
    OPT_BUDGET,
    OPT_CSV,
    OPT_VARIANT,
    OPT_SMEM_LIMIT,
    OPT_SELF_TEST
};
static const struct option long_options[] = {
    {"help", no_argument, NULL, OPT_HELP},
    {"batch", required_argument, NULL, OPT_BATCH},
    {"heads", required_argument, NULL, OPT_HEADS},
    {"seq", required_argument, NULL, OPT_SEQ},
    {"dim", required_argument, NULL, OPT_DIM},
    {"causal", no_argument, NULL, OPT_CAUSAL},
    {"scale", required_argument, NULL, OPT_SCALE},
    {"seed", required_argument, NULL, OPT_SEED},
    {"dist", required_argument, NULL, OPT_DIST},
    {"q", required_argument, NULL, OPT_Q},
    {"k", required_argument, NULL, OPT_K},
    {"v", required_argument, NULL, OPT_V},
    {"out", required_argument, NULL, OPT_OUT},
    {"lse", required_argument, NULL, OPT_LSE},
    {"dO", required_argument, NULL, OPT_DO},
    {"dq", required_argument, NULL, OPT_DQ},
    {"dk", required_argument, NULL, OPT_DK},
    {"dv", required_argument, NULL, OPT_DV},
    {"check", required_argument, NULL, OPT_CHECK},
    {"bench", no_argument, NULL, OPT_BENCH},
    {"budget", required_argument, NULL, OPT_BUDGET},
    {"csv", no_argument, NULL, OPT_CSV},
    {"variant", required_argument, NULL, OPT_VARIANT},
    {"smem-limit", required_argument, NULL, OPT_SMEM_LIMIT},
    {"self-test", no_argument, NULL, OPT_SELF_TEST},
    {NULL, 0, NULL, 0},
};

/* The option as typed, without any "=value": what an error message names. */
static const char *typed_option(const char *arg) {
    static char buf[64];
    size_t n = strcspn(arg, "=");
    if (n >= sizeof buf) n = sizeof buf - 1;
    memcpy(buf, arg, n);
    buf[n] = 0;
    return buf;
}

/* getopt_long found no such option: which it is, in one line (a flag given a value, a prefix of
 * several options, or no option at all). */
static void die_unknown_option(const char *typed) {
    if (optopt && optopt < 256) die_usage("unknown option '-%c'", optopt);
    /* the long options the typed one names: itself, or those it is a prefix of */
    const char *t = typed_option(typed);
    const struct option *hit = NULL;
    char matches[256] = "";
    int n_match = 0;
    for (const struct option *l = long_options; !strncmp(t, "--", 2) && l->name; l++) {
        if (strncmp(t + 2, l->name, strlen(t + 2))) continue;
        if (!strcmp(t + 2, l->name)) { /* exact: no other counts */
            hit = l, n_match = 1;
            break;
        }
        hit = l, n_match++;
        snprintf(matches + strlen(matches), sizeof matches - strlen(matches), "%s--%s",
                 n_match > 1 ? ", " : "", l->name);
    }
    if (n_match > 1) die_usage("option '%s' is ambiguous (%s)", t, matches);
    if (hit && strchr(typed, '=') && hit->has_arg == no_argument)
        die_usage("--%s takes no value", hit->name);
    die_usage("unknown option '%s'", t);
}

/* --batch, --heads, --seq, --dim, --causal, --scale: 1 if c is one of them. */
static int shape_option(int c, const char *a, const char *v, options *o) {
    attn_shape *s = &o->shape;
    switch (c) {
        case OPT_BATCH:
            s->B = (int)parse_int(a, v, 1, ATTN_MAX_BH), o->given_B = 1;
            break;
        case OPT_HEADS:
            s->H = (int)parse_int(a, v, 1, ATTN_MAX_BH), o->given_H = 1;
            break;
        case OPT_SEQ:
            s->N = (int)parse_int(a, v, 1, ATTN_MAX_N), o->given_N = 1;
            break;
        case OPT_DIM:
            s->D = (int)parse_int(a, v, 1, 1 << 20), o->given_D = 1;
            break;
        case OPT_CAUSAL:
            s->causal = 1;
            break;
        case OPT_SCALE:
            s->scale = parse_pos_float(a, v), o->given_scale = 1;
            break;
        default:
            return 0;
    }
    o->given_run = 1;
    return 1;
}

/* The input and output files: 1 if c names one. The backward pass's only for a stage with one. */
static int file_option(int c, const char *a, const char *v, options *o) {
    const char **path = c == OPT_Q     ? &o->qpath
                        : c == OPT_K   ? &o->kpath
                        : c == OPT_V   ? &o->vpath
                        : c == OPT_OUT ? &o->outpath
                        : c == OPT_LSE ? &o->lsepath
                        : c == OPT_DO  ? &o->dOpath
                        : c == OPT_DQ  ? &o->dqpath
                        : c == OPT_DK  ? &o->dkpath
                        : c == OPT_DV  ? &o->dvpath
                                       : NULL;
    if (!path) return 0;
    if (path >= &o->dOpath && path <= &o->dvpath && !attn_this_stage.backward)
        die_usage("%s: %s has no backward pass (%s %s)", a, attn_this_stage.name,
                  ATTN_BACKWARD_STAGES, strchr(ATTN_BACKWARD_STAGES, ' ') ? "have" : "has");
    *path = v;
    return 1;
}

/* --seed, --dist, --check, --bench, --budget, --csv, --variant, --smem-limit, --self-test. */
static void run_option(int c, const char *a, const char *v, options *o) {
    const int sets_run =
        c != OPT_SEED && c != OPT_VARIANT && c != OPT_SMEM_LIMIT && c != OPT_SELF_TEST;
    switch (c) {
        case OPT_SEED:
            o->seed = (uint64_t)parse_int(a, v, 0, INT64_MAX);
            break;
        case OPT_DIST:
            if (strcmp(v, "normal") && strcmp(v, "peaky"))
                die_usage("--dist: '%s' is not one of normal, peaky", v);
            o->peaky = !strcmp(v, "peaky");
            break;
        case OPT_CHECK:
            o->check_rows = !strcmp(v, "all") ? -1 : parse_int(a, v, 0, INT64_MAX);
            break;
        case OPT_BENCH:
            o->bench = 1;
            break;
        case OPT_BUDGET:
            o->budget_s = parse_pos(a, v);
            break;
        case OPT_CSV:
            o->csv = 1;
            break;
        case OPT_VARIANT:
            o->variant = attn_variant_index(attn_this_stage.variants, v);
            if (o->variant < 0)
                die_usage("--variant: '%s' is not one of %s", v, attn_this_stage.variants);
            o->variant_given = 1;
            break;
        case OPT_SMEM_LIMIT:
            o->smem_limit = parse_int(a, v, 16384, 1 << 30);
            break;
        case OPT_SELF_TEST:
            o->self_test = 1;
            break;
    }
    if (sets_run) o->given_run = 1;
}

static void parse_args(int argc, char **argv, options *o) {
    memset(o, 0, sizeof *o);
    o->shape = (attn_shape){1, 1, 1024, 128, 0, 0.0f};
    o->seed = 1;
    o->check_rows = 64;
    o->budget_s = 60.0;
    opterr = 0; /* the messages below, not getopt's */
    /* "+": stop at the first non-option (reported as unknown); ":": a missing value returns ':' */
    for (int c, idx; idx = -1, (c = getopt_long(argc, argv, "+:h", long_options, &idx)) != -1;) {
        const char *typed = argv[optind - 1];
        if (c == '?') die_unknown_option(typed);
        if (c == ':') die_usage("%s needs a value", typed_option(typed));
        if (c == OPT_HELP) {
            usage();
            exit(ATTN_EXIT_PASS);
        }
        char name[64]; /* the option's full name, "--seq", for the messages */
        snprintf(name, sizeof name, "--%s", long_options[idx].name);
        if (!shape_option(c, name, optarg, o) && !file_option(c, name, optarg, o))
            run_option(c, name, optarg, o);
    }
    if (optind < argc) die_usage("unknown option '%s'", argv[optind]);
}

/* ---- inputs ---- */

/* Out of host memory: one line, exit 4 (like the device's out-of-memory). */
static void die_host_oom(const char *what) {
    fprintf(stderr, "%s: out of host memory: %s\n", prog, what);
    exit(ATTN_EXIT_OOM);
}

/* Reads one of Q/K/V: must be 4-D; its shape becomes the run's shape unless options (or an
 * earlier file) set it, and a mismatch names where the other value came from. */
static float *load_npy(const char *opt, const char *path, options *o) {
    npy_array a;
    char err[512];
    int rc = npy_read(path, &a, err, sizeof err);
    if (rc == NPY_ERR_NOMEM) die_host_oom(err);
    if (rc != 0) die_usage("%s: %s", opt, err);
    if (a.ndim != 4)
        die_usage("%s: '%s' has %d dimensions, want 4 [B, H, N, D]", opt, path, a.ndim);
    if (!attn_head_dim_ok(a.shape[3]))
        die_usage("%s: '%s' has D = %lld, which is not supported (" ATTN_HEAD_DIMS ")", opt, path,
                  a.shape[3]);
    long long want[4] = {o->shape.B, o->shape.H, o->shape.N, o->shape.D};
    int given[4] = {o->given_B, o->given_H, o->given_N, o->given_D};
    const char *names[4] = {"B", "H", "N", "D"};
    const char *flags[4] = {"--batch", "--heads", "--seq", "--dim"};
    for (int d = 0; d < 4; d++) {
        if (given[d] && a.shape[d] != want[d]) {
            if (o->shape_from)
                die_usage("%s: '%s' has %s = %lld, but %s has %s = %lld", opt, path, names[d],
                          a.shape[d], o->shape_from, names[d], want[d]);
            die_usage("%s: '%s' has %s = %lld, but %s %lld was given", opt, path, names[d],
                      a.shape[d], flags[d], want[d]);
        }
        if (a.shape[d] < 1 || a.shape[d] > (d == 2 ? ATTN_MAX_N : ATTN_MAX_BH))
            die_usage("%s: '%s' has %s = %lld, out of range [1, %d]", opt, path, names[d],
                      a.shape[d], d == 2 ? ATTN_MAX_N : ATTN_MAX_BH);
    }
    static char from[4][600];
    int slot = opt[2] == 'q' ? 0 : opt[2] == 'k' ? 1 : opt[2] == 'v' ? 2 : 3;
    if (!o->shape_from && !(o->given_B && o->given_H && o->given_N && o->given_D)) {
        snprintf(from[slot], sizeof from[slot], "%s '%s'", opt, path);
        o->shape_from = from[slot];
    }
    o->shape.B = (int)a.shape[0], o->shape.H = (int)a.shape[1];
    o->shape.N = (int)a.shape[2], o->shape.D = (int)a.shape[3];
    o->given_B = o->given_H = o->given_N = o->given_D = 1;
    size_t n = npy_count(&a);
    float *f = malloc(n * sizeof(float));
    if (!f) die_host_oom(path);
    for (size_t x = 0; x < n; x++)
        f[x] = a.dtype == NPY_F32 ? ((float *)a.data)[x] : f16_to_f32(((uint16_t *)a.data)[x]);
    free(a.data);
    return f;
}

static size_t elems_of(const attn_shape *s) {
    return (size_t)s->B * s->H * s->N * s->D;
}

/* Makes the stored inputs: from files where given, else random; rounded to the storage type. */
/* dO (the backward pass's input) only for a stage with a backward pass. */
static int make_inputs(const options *o, float *fileq, float *filek, float *filev, float *filedo,
                       host_inputs *in) {
    const attn_shape *s = &o->shape;
    size_t n = elems_of(s);
    float *src[4] = {fileq, filek, filev, filedo};
    float **dst[4] = {&in->Qf, &in->Kf, &in->Vf, &in->dOf};
    void **st[4] = {&in->Qs, &in->Ks, &in->Vs, &in->dOs};
    memset(in, 0, sizeof *in);
    for (int t = 0; t < (attn_this_stage.backward ? 4 : 3); t++) {
        float *f = src[t] ? src[t] : malloc(n * sizeof(float));
        if (!f) return -1;
        if (!src[t]) fill_normal(f, n, o->seed, (uint32_t)t, (t == 0 && o->peaky) ? 8.0f : 1.0f);
        if (attn_this_stage.dtype == ATTN_F16) {
            uint16_t *h = malloc(n * sizeof(uint16_t));
            if (!h) return -1;
#pragma omp parallel for schedule(static)
            for (long long x = 0; x < (long long)n; x++) {
                h[x] = f32_to_f16(f[x]);
                f[x] = f16_to_f32(h[x]);
            }
            *st[t] = h;
        } else {
            *st[t] = f;
        }
        *dst[t] = f;
    }
    return 0;
}

static void free_inputs(host_inputs *in) {
    if (attn_this_stage.dtype == ATTN_F16) free(in->Qs), free(in->Ks), free(in->Vs), free(in->dOs);
    free(in->Qf), free(in->Kf), free(in->Vf), free(in->dOf);
    memset(in, 0, sizeof *in);
}

/* ---- device ---- */

typedef struct {
    attn_device dev;
    char name[256];
    void *flush; /* written before every timed launch so no run starts with a warm L2 */
    size_t flush_bytes;
    cudaStream_t stream;
    cudaEvent_t start, stop;
} gpu_ctx;

static int gpu_init(const options *o, gpu_ctx *g) {
    int count = 0;
    char why[512];
    if (attn_gpu_probe("program", &count, why, sizeof why) != 0) {
        fprintf(stderr, "%s: %s\n", prog, why);
        return -1;
    }
    size_t l2 = 0;
    CUDA_CHECK(attn_device_query(0, o->smem_limit, &g->dev, g->name, sizeof g->name, &l2));
    g->flush_bytes = 2 * l2;
    if (g->flush_bytes < ((size_t)64 << 20)) g->flush_bytes = (size_t)64 << 20;
    CUDA_CHECK(cudaMalloc(&g->flush, g->flush_bytes));
    CUDA_CHECK(cudaStreamCreate(&g->stream));
    CUDA_CHECK(cudaEventCreate(&g->start));
    CUDA_CHECK(cudaEventCreate(&g->stop));
    return 0;
}

/* cudaMalloc that reports, rather than dies, when the device is out of memory. */
static int dev_alloc(void **p, size_t bytes, const char *what, double *total_mb) {
    *p = NULL;
    if (bytes == 0) return 0;
    cudaError_t e = cudaMalloc(p, bytes);
    if (e == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();
        size_t fr = 0, tot = 0;
        (void)cudaMemGetInfo(&fr, &tot);
        fprintf(stderr, "%s: out of device memory: %s needs %.0f MiB, %.0f MiB of %.0f MiB free\n",
                prog, what, bytes / 1048576.0, fr / 1048576.0, tot / 1048576.0);
        *p = NULL;
        return -1;
    }
    CUDA_CHECK(e);
    *total_mb += bytes / 1048576.0;
    return 0;
}

/* Device buffers of one run; the backward's are allocated only for a stage that has one. */
enum { BUF_Q, BUF_K, BUF_V, BUF_O, BUF_LSE, BUF_WS, BUF_DO, BUF_DQ, BUF_DK, BUF_DV, BUF_BWS, BUFS };

static void enqueue(gpu_ctx *g, const options *o, void *const b[BUFS], pass_kind pass) {
    const attn_shape *s = &o->shape;
    if (pass != PASS_BWD)
        CUDA_CHECK(attn_this_stage.forward(s, &g->dev, b[BUF_Q], b[BUF_K], b[BUF_V], b[BUF_O],
                                           (float *)b[BUF_LSE], b[BUF_WS], o->variant, g->stream));
    if (pass != PASS_FWD)
        CUDA_CHECK(attn_this_stage.backward(
            s, &g->dev, b[BUF_Q], b[BUF_K], b[BUF_V], b[BUF_O], (const float *)b[BUF_LSE],
            b[BUF_DO], b[BUF_DQ], b[BUF_DK], b[BUF_DV], b[BUF_BWS], o->variant, g->stream));
}

static double timed_launch(gpu_ctx *g, const options *o, void *const b[BUFS], pass_kind pass) {
    CUDA_CHECK(cudaMemsetAsync(g->flush, 0, g->flush_bytes, g->stream));
    CUDA_CHECK(cudaEventRecord(g->start, g->stream));
    enqueue(g, o, b, pass);
    CUDA_CHECK(cudaEventRecord(g->stop, g->stream));
    CUDA_CHECK(cudaEventSynchronize(g->stop));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, g->start, g->stop));
    return ms;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Times one pass: the median of at least MIN_REPEATS launches and MIN_SECONDS (SLOW_REPEATS when
 * the first took over SLOW_MS), after a warm-up. */
static void bench_pass(gpu_ctx *g, const options *o, void *const b[BUFS], pass_kind pass,
                       double first_ms, timing *t) {
    double *ms = malloc(sizeof(double) * MAX_REPEATS), total = 0;
    if (!ms) die_host_oom("the timing samples");
    int k = 0;
    if (first_ms < SLOW_MS) (void)timed_launch(g, o, b, pass); /* warm-up */
    while (k < MAX_REPEATS) {
        ms[k] = timed_launch(g, o, b, pass);
        total += ms[k++];
        if (ms[0] > SLOW_MS ? k >= SLOW_REPEATS : (k >= MIN_REPEATS && total >= MIN_SECONDS * 1e3))
            break;
    }
    qsort(ms, (size_t)k, sizeof(double), cmp_double);
    t->ms_median = k % 2 ? ms[k / 2] : 0.5 * (ms[k / 2 - 1] + ms[k / 2]);
    t->ms_min = ms[0];
    t->repeats = k;
    free(ms);
}

/* A device array [count] of the storage type, to the host as floats (raw: the stored bytes, for
 * --out and the like; may alias the floats for fp32 stages). */
static float *download(const void *dev_ptr, size_t count, size_t esz, void **raw) {
    float *f = malloc(count * sizeof(float));
    void *r = esz == 4 ? (void *)f : malloc(count * esz);
    if (!f || !r) die_host_oom("the copy of an output");
    CUDA_CHECK(cudaMemcpy(r, dev_ptr, count * esz, cudaMemcpyDeviceToHost));
    if (esz == 2) {
#pragma omp parallel for schedule(static)
        for (long long x = 0; x < (long long)count; x++) f[x] = f16_to_f32(((uint16_t *)r)[x]);
    }
    *raw = r;
    return f;
}

static void write_npy(const char *opt, const char *path, npy_dtype dt, int ndim,
                      const long long *shape, const void *data) {
    char err[512];
    if (path && npy_write(path, dt, ndim, shape, data, err, sizeof err) != 0) {
        fprintf(stderr, "%s: %s: %s\n", prog, opt, err);
        exit(ATTN_EXIT_USAGE);
    }
}

static void free_download(float *f, void *raw) {
    if (raw != (void *)f) free(raw);
    free(f);
}

/* The rows to check: o->check_rows of them (all: -1), spread by seed. */
static long long *rows_to_check(const options *o, long long rows, uint64_t seed, long long *n) {
    long long want = o->check_rows;
    long long *rl = malloc(sizeof(long long) * (size_t)(want < 0 || want > rows ? rows : want));
    if (!rl) die_host_oom("the list of rows to check");
    *n = pick_rows(rows, want, seed, rl);
    return rl;
}

/* The backward pass once on poisoned dQ, dK, dV; then its outputs written and checked against
 * the float64 reference, with the forward's stored O and lse (host copies). Returns its time. */
static double run_backward(const options *o, gpu_ctx *g, const host_inputs *in, void *const b[BUFS],
                           const float *O, const float *lse, run_result *r) {
    const attn_shape *s = &o->shape;
    const size_t n = elems_of(s), rows = (size_t)s->B * s->H * s->N;
    const size_t esz = attn_this_stage.dtype == ATTN_F16 ? 2 : 4;
    for (int x = BUF_DQ; x <= BUF_DV; x++) CUDA_CHECK(cudaMemset(b[x], 0xff, n * esz));
    const double ms = timed_launch(g, o, b, PASS_BWD);
    if (o->check_rows == 0 && !o->dqpath && !o->dkpath && !o->dvpath) return ms;
    void *raw[3];
    float *grad[3];
    const char *opts[3] = {"--dq", "--dk", "--dv"};
    const char *paths[3] = {o->dqpath, o->dkpath, o->dvpath};
    long long shp[4] = {s->B, s->H, s->N, s->D};
    for (int t = 0; t < 3; t++) {
        grad[t] = download(b[BUF_DQ + t], n, esz, &raw[t]);
        write_npy(opts[t], paths[t], esz == 2 ? NPY_F16 : NPY_F32, 4, shp, raw[t]);
    }
    if (o->check_rows != 0) {
        long long nq, nk;
        long long *qr = rows_to_check(o, (long long)rows, o->seed, &nq);
        long long *kr = rows_to_check(o, (long long)rows, o->seed ^ 0x9e3779b97f4a7c15ull, &nk);
        ref_shape rs = {s->B, s->H, s->N, s->D, s->causal, (double)s->scale};
        check_gradients(&rs, in->Qf, in->Kf, in->Vf, in->dOf, O, lse, grad[0], grad[1], grad[2], qr,
                        nq, kr, nk, &r->gchk);
        r->gchecked = 1;
        free(qr), free(kr);
    }
    for (int t = 0; t < 3; t++) free_download(grad[t], raw[t]);
    return ms;
}

/* The device buffers of one run (the backward's only for a stage with a backward pass), the
 * inputs copied in. 0, or -1 when the device is out of memory (what is allocated stays in b). */
static int alloc_buffers(const options *o, gpu_ctx *g, const host_inputs *in, void *b[BUFS],
                         run_result *r) {
    const attn_shape *s = &o->shape;
    const int bwd = attn_this_stage.backward != NULL;
    const size_t n = elems_of(s), rows = (size_t)s->B * s->H * s->N;
    const size_t esz = attn_this_stage.dtype == ATTN_F16 ? 2 : 4;
    const char *what[BUFS] = {
        "Q", "K", "V", "O", "lse", "workspace", "dO", "dQ", "dK", "dV", "the backward's workspace"};
    size_t bytes[BUFS] = {
        n * esz,
        n * esz,
        n * esz,
        n * esz,
        rows * sizeof(float),
        attn_this_stage.workspace_bytes(s, &g->dev, o->variant),
        bwd ? n * esz : 0,
        bwd ? n * esz : 0,
        bwd ? n * esz : 0,
        bwd ? n * esz : 0,
        bwd ? attn_this_stage.backward_workspace_bytes(s, &g->dev, o->variant) : 0};
    for (int i = 0; i < BUFS; i++)
        if (dev_alloc(&b[i], bytes[i], what[i], &r->device_mb) != 0) return -1;
    CUDA_CHECK(cudaMemcpy(b[BUF_Q], in->Qs, bytes[BUF_Q], cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(b[BUF_K], in->Ks, bytes[BUF_K], cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(b[BUF_V], in->Vs, bytes[BUF_V], cudaMemcpyHostToDevice));
    if (bwd) CUDA_CHECK(cudaMemcpy(b[BUF_DO], in->dOs, bytes[BUF_DO], cudaMemcpyHostToDevice));
    return 0;
}

/* The forward's O and LSE to the host: written where asked, checked against the float64
 * reference, then the backward pass (a stage with one) given them. The passes' first times. */
static void check_outputs(const options *o, gpu_ctx *g, const host_inputs *in, void *const b[BUFS],
                          double first_ms[PASSES], run_result *r) {
    const attn_shape *s = &o->shape;
    const int bwd = attn_this_stage.backward != NULL;
    const size_t n = elems_of(s), rows = (size_t)s->B * s->H * s->N;
    const size_t esz = attn_this_stage.dtype == ATTN_F16 ? 2 : 4;
    const int need_out = o->check_rows != 0 || o->outpath || o->lsepath;
    if (!need_out && !(bwd && (o->dqpath || o->dkpath || o->dvpath))) {
        if (bwd) first_ms[PASS_BWD] = run_backward(o, g, in, b, NULL, NULL, r);
        return;
    }
    void *raw, *lraw;
    float *O = download(b[BUF_O], n, esz, &raw);
    float *lse = download(b[BUF_LSE], rows, sizeof(float), &lraw);
    long long shp[4] = {s->B, s->H, s->N, s->D};
    write_npy("--out", o->outpath, esz == 2 ? NPY_F16 : NPY_F32, 4, shp, raw);
    write_npy("--lse", o->lsepath, NPY_F32, 3, shp, lse);
    if (o->check_rows != 0) {
        long long nr;
        long long *rl = rows_to_check(o, (long long)rows, o->seed, &nr);
        ref_shape rs = {s->B, s->H, s->N, s->D, s->causal, (double)s->scale};
        check_output(&rs, esz == 2, in->Qf, in->Kf, in->Vf, O, lse, rl, nr, &r->chk);
        r->checked = 1;
        free(rl);
    }
    if (bwd) first_ms[PASS_BWD] = run_backward(o, g, in, b, O, lse, r);
    free_download(O, raw);
    free_download(lse, lraw);
}

/* The descriptor of the stage whose forward pass this stage links (its stage.mk's FORWARD: that
 * stage's object, its descriptor renamed), which that stage reports and times; a weak reference,
 * absent (NULL) where the stage runs a forward pass of its own. */
extern const attn_stage attn_forward_stage __attribute__((weak));

static int own_forward(void) {
    return &attn_forward_stage == NULL;
}

/* The passes' times and TFLOP/s: the first run's, or with --bench the median of repeats (a pass
 * over the budget is not repeated). */
static void time_passes(const options *o, gpu_ctx *g, void *const b[BUFS],
                        const double first_ms[PASSES], run_result *r) {
    const double flops = attn_flops(&o->shape);
    for (int p = 0; p < PASSES; p++) {
        timing *t = &r->t[p];
        t->ms_median = t->ms_min = first_ms[p];
        t->repeats = 1;
        if (p != PASS_FWD && !attn_this_stage.backward) continue;
        if (first_ms[p] > o->budget_s * 1000.0) {
            r->status = "over_budget";
        } else if (o->bench && !(p == PASS_FWD && !own_forward())) {
            bench_pass(g, o, b, (pass_kind)p, first_ms[p], t);
        }
        t->tflops = pass_flops[p] * flops / (t->ms_median * 1e-3) / 1e12;
    }
}

/* One run: allocate, run once on poisoned output, check, then time. Returns an exit code. */
static int run_case(const options *o, gpu_ctx *g, const host_inputs *in, run_result *r) {
    memset(r, 0, sizeof *r);
    r->status = "ok";
    const char *why = attn_this_stage.unsupported(&o->shape, &g->dev, o->variant);
    if (why) {
        fprintf(stderr, "%s: unsupported here: %s\n", prog, why);
        r->status = "unsupported";
        return ATTN_EXIT_UNSUPPORTED;
    }
    void *b[BUFS] = {0};
    int rc = ATTN_EXIT_PASS;
    if (alloc_buffers(o, g, in, b, r) != 0) {
        r->status = "OOM";
        rc = ATTN_EXIT_OOM;
    } else {
        /* first run: on NaN-poisoned output (0xff bytes are NaN in fp16 and fp32) */
        const size_t esz = attn_this_stage.dtype == ATTN_F16 ? 2 : 4;
        const size_t rows = (size_t)o->shape.B * o->shape.H * o->shape.N;
        CUDA_CHECK(cudaMemset(b[BUF_O], 0xff, rows * o->shape.D * esz));
        CUDA_CHECK(cudaMemset(b[BUF_LSE], 0xff, rows * sizeof(float)));
        double first_ms[PASSES] = {timed_launch(g, o, b, PASS_FWD), 0, 0};
        check_outputs(o, g, in, b, first_ms, r);
        if ((r->checked && !r->chk.pass) || (r->gchecked && !r->gchk.pass)) {
            r->status = "FAIL";
            rc = ATTN_EXIT_WRONG;
        }
        first_ms[PASS_BOTH] = first_ms[PASS_FWD] + first_ms[PASS_BWD];
        if (rc == ATTN_EXIT_PASS)
            time_passes(o, g, b, first_ms, r);
        else
            for (int p = 0; p < PASSES; p++) r->t[p] = (timing){first_ms[p], first_ms[p], 0.0, 1};
    }
    for (int i = 0; i < BUFS; i++)
        if (b[i]) CUDA_CHECK(cudaFree(b[i]));
    return rc;
}

/* The passes a stage reports: its forward when the forward is its own (a linked forward is its
 * stage's to report), and for a stage with a backward pass the backward alone and both. */
static int reported(pass_kind p) {
    return p == PASS_FWD ? own_forward() : attn_this_stage.backward != NULL;
}

static double max3(const double v[GRADS]) {
    double m = v[0];
    for (int t = 1; t < GRADS; t++) m = v[t] > m || isnan(v[t]) ? v[t] : m;
    return m;
}

static void print_csv(const options *o, const gpu_ctx *g, const run_result *r) {
    char vname[64];
    attn_variant_name(attn_this_stage.variants, o->variant, vname, sizeof vname);
    const attn_shape *s = &o->shape;
    printf(CSV_HEADER "\n");
    for (int p = 0; p < PASSES; p++) {
        if (!reported((pass_kind)p)) continue;
        const timing *t = &r->t[p];
        printf("%s,%s,%s,%s,%d,%d,%d,%d,%d,%s,", g ? g->name : "none", attn_this_stage.name, vname,
               pass_names[p], s->B, s->H, s->N, s->D, s->causal,
               attn_this_stage.dtype == ATTN_F16 ? "f16" : "f32");
        int timed = !strcmp(r->status, "ok") || !strcmp(r->status, "over_budget");
        if (timed)
            printf("%.4f,%.4f,%d,%.3f,", t->ms_median, t->ms_min, t->repeats, t->tflops);
        else
            printf(",,,,");
        if (p == PASS_FWD && r->checked)
            printf("%.3g,%.3g,%.3g,%lld,", r->chk.max_abs_err, r->chk.rel_err, r->chk.lse_err,
                   r->chk.rows_checked);
        else if (p != PASS_FWD && r->gchecked)
            printf("%.3g,%.3g,%.3g,%lld,", max3(r->gchk.max_abs_err), max3(r->gchk.rel_err),
                   r->checked ? r->chk.lse_err : 0.0, r->gchk.rows_checked);
        else
            printf(",,,0,");
        printf("%.1f,%s\n", r->device_mb, r->status);
    }
    fflush(stdout);
}

static void describe(FILE *f, const options *o, const run_result *r) {
    char vname[64];
    attn_variant_name(attn_this_stage.variants, o->variant, vname, sizeof vname);
    const attn_shape *s = &o->shape;
    fprintf(f, "%s %s B=%d H=%d N=%d D=%d%s%s:", attn_this_stage.name, vname, s->B, s->H, s->N,
            s->D, s->causal ? " causal" : "", o->peaky ? " peaky" : "");
    if (!strcmp(r->status, "ok") || !strcmp(r->status, "over_budget")) {
        for (int p = 0; p < PASSES; p++) {
            if (!reported((pass_kind)p)) continue;
            const timing *t = &r->t[p];
            fprintf(f, " %s%s%.3f ms (%s of %d), %.1f TFLOP/s,",
                    attn_this_stage.backward ? pass_names[p] : "",
                    attn_this_stage.backward ? " " : "", t->ms_median,
                    t->repeats > 1 ? "median" : "one run", t->repeats, t->tflops);
        }
    }
    if (r->checked)
        fprintf(f, " max_abs_err %.2e (bound %.2e), lse_err %.2e (bound %.1e), %lld rows,",
                r->chk.max_abs_err, r->chk.bound, r->chk.lse_err, r->chk.lse_bound,
                r->chk.rows_checked);
    if (r->checked && r->chk.nonfinite) fprintf(f, " %lld NaN/Inf,", r->chk.nonfinite);
    if (r->gchecked) {
        const char *names[GRADS] = {"dQ", "dK", "dV"};
        for (int t = 0; t < GRADS; t++)
            fprintf(f, " %s %.2e (bound %.2e),", names[t], r->gchk.max_abs_err[t],
                    r->gchk.bound[t]);
        fprintf(f, " %lld gradient rows,", r->gchk.rows_checked);
        if (r->gchk.nonfinite) fprintf(f, " %lld NaN/Inf in dQ/dK/dV,", r->gchk.nonfinite);
    }
    fprintf(f, " %s\n", r->status);
}

/* ---- the standard matrix ---- */

static const int self_test_N[] = {1, 2, 17, 63, 64, 65, 127, 128, 129, 255, 1000, 1024, 2047, 4097};
static const int self_test_D[] = {64, 128};
static const int self_test_BH[][2] = {{1, 1}, {2, 3}};
#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))
/* The matrix per variant: D, causal, (B, H), dist, N; N running fastest. */
#define SELF_TEST_CASES (COUNT(self_test_D) * 2 * COUNT(self_test_BH) * 2 * COUNT(self_test_N))

/* Case c of the matrix (0 .. SELF_TEST_CASES - 1) for variant v: its shape, inputs and rows. */
static options self_test_case(const options *base, int v, int c, uint64_t case_no) {
    const int ni = c % COUNT(self_test_N), peaky = c / COUNT(self_test_N) % 2;
    const int bh = c / (COUNT(self_test_N) * 2) % COUNT(self_test_BH);
    const int causal = c / (COUNT(self_test_N) * 2 * COUNT(self_test_BH)) % 2;
    const int D = self_test_D[c / (COUNT(self_test_N) * 2 * COUNT(self_test_BH) * 2)];
    options o = *base;
    o.shape = (attn_shape){self_test_BH[bh][0],   self_test_BH[bh][1], self_test_N[ni], D, causal,
                           1.0f / sqrtf((float)D)};
    o.variant = v;
    o.peaky = peaky;
    o.bench = 0;
    o.seed = base->seed * 1000003ull + case_no;
    long long rows = (long long)o.shape.B * o.shape.H * o.shape.N;
    o.check_rows = rows <= SELF_TEST_FULL_ROWS ? -1 : SELF_TEST_SAMPLE;
    return o;
}

/* One case: inputs, run, check; a failure described on stderr. 1 if it passed. */
static int self_test_run(const options *o, gpu_ctx *g) {
    host_inputs in;
    if (make_inputs(o, NULL, NULL, NULL, NULL, &in) != 0) die_host_oom("the inputs");
    run_result r;
    int rc = run_case(o, g, &in, &r);
    free_inputs(&in);
    if (rc == ATTN_EXIT_PASS) return 1;
    fprintf(stderr, "FAILED: ");
    describe(stderr, o, &r);
    return 0;
}

static int self_test(const options *base, gpu_ctx *g) {
    int passed = 0, failed = 0, nv = attn_variant_count(attn_this_stage.variants);
    uint64_t case_no = 0;
    struct timespec t0, t1;
    /* A stage that cannot run on this GPU at all (stage 6 off Hopper, or a build without its
     * code) is waived as a whole, with its reason and exit 3, rather than failing every case. */
    const attn_shape probe = {1, 1, 128, 64, 0, 0.125f};
    const char *why = attn_this_stage.unsupported(&probe, &g->dev, 0);
    if (why) {
        printf("%s: self-test waived on %s: %s\n", attn_this_stage.name, g->name, why);
        return ATTN_EXIT_UNSUPPORTED;
    }
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int v = 0; v < nv; v++) {
        if (base->variant_given && v != base->variant) continue;
        char vname[64];
        attn_variant_name(attn_this_stage.variants, v, vname, sizeof vname);
        int vp = 0;
        for (int c = 0; c < SELF_TEST_CASES; c++) {
            const options o = self_test_case(base, v, c, case_no++);
            vp += self_test_run(&o, g);
        }
        printf("%s variant %s: %d passed, %d failed\n", attn_this_stage.name, vname, vp,
               SELF_TEST_CASES - vp);
        passed += vp, failed += SELF_TEST_CASES - vp;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    printf("%s self-test on %s (smem/block %zu): %.1f s\n", attn_this_stage.name, g->name,
           g->dev.smem_per_block, (t1.tv_sec - t0.tv_sec) + 1e-9 * (t1.tv_nsec - t0.tv_nsec));
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? ATTN_EXIT_WRONG : ATTN_EXIT_PASS;
}

/* The options together: the shape's rules, the default scale, what --self-test takes, and the
 * output files writable before anything runs. */
static void check_options(options *o) {
    attn_shape *s = &o->shape;
    if (!attn_head_dim_ok(s->D)) die_usage("--dim: %d is not supported (" ATTN_HEAD_DIMS ")", s->D);
    if (attn_shape_check(s) == ATTN_SHAPE_BH)
        die_usage("--batch x --heads: %lld is over %d", (long long)s->B * s->H, ATTN_MAX_BH);
    if (!o->given_scale) s->scale = 1.0f / sqrtf((float)s->D);
    if (o->self_test && (o->qpath || o->kpath || o->vpath || o->outpath || o->lsepath ||
                         o->dOpath || o->dqpath || o->dkpath || o->dvpath))
        die_usage(
            "--self-test makes its own inputs; it takes no --q/--k/--v/--out/--lse/--dO/--dq/"
            "--dk/--dv");
    if (o->self_test && o->given_run)
        die_usage(
            "--self-test runs its own shapes and checks every row; it takes no --batch, "
            "--heads, --seq, --dim, --causal, --scale, --dist, --check, --bench, --budget, "
            "--csv");
    if (o->outpath) check_writable("--out", o->outpath);
    if (o->lsepath) check_writable("--lse", o->lsepath);
    if (o->dqpath) check_writable("--dq", o->dqpath);
    if (o->dkpath) check_writable("--dk", o->dkpath);
    if (o->dvpath) check_writable("--dv", o->dvpath);
}

int main(int argc, char **argv) {
    const char *slash = strrchr(argv[0], '/');
    prog = slash ? slash + 1 : argv[0];
    options o;
    parse_args(argc, argv, &o);
    float *fq = o.qpath ? load_npy("--q", o.qpath, &o) : NULL;
    float *fk = o.kpath ? load_npy("--k", o.kpath, &o) : NULL;
    float *fv = o.vpath ? load_npy("--v", o.vpath, &o) : NULL;
    float *fdo = o.dOpath ? load_npy("--dO", o.dOpath, &o) : NULL;
    check_options(&o);

    gpu_ctx g;
    memset(&g, 0, sizeof g);
    if (gpu_init(&o, &g) != 0) {
        if (o.csv) {
            run_result r = {.status = "unsupported"};
            print_csv(&o, NULL, &r);
        }
        return ATTN_EXIT_UNSUPPORTED;
    }
    if (o.self_test) return self_test(&o, &g);

    host_inputs in;
    if (make_inputs(&o, fq, fk, fv, fdo, &in) != 0) die_host_oom("the inputs");
    run_result r;
    int rc = run_case(&o, &g, &in, &r);
    if (!strcmp(r.status, "FAIL"))
        fprintf(stderr, "%s: FAIL: output differs from the float64 reference\n", prog);
    describe(o.csv ? stderr : stdout, &o, &r);
    if (o.csv) print_csv(&o, &g, &r);
    free_inputs(&in);
    return rc;
}
