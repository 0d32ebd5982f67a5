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
#include <dlfcn.h>
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

static void parse_args(int argc, char **argv, options *o) {
    memset(o, 0, sizeof *o);
    o->shape = (attn_shape){1, 1, 1024, 128, 0, 0.0f};
    o->seed = 1;
    o->check_rows = 64;
    o->budget_s = 60.0;
    opterr = 0; /* the messages below, not getopt's */
    /* "+": stop at the first non-option (reported as unknown); ":": a missing value returns ':' */
    for (;;) {
        int idx = -1;
        int c = getopt_long(argc, argv, "+:h", long_options, &idx);
        if (c == -1) break;
        const char *typed = argv[optind - 1];
        if (c == '?') {
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
        if (c == ':') die_usage("%s needs a value", typed_option(typed));
        char name[64]; /* the option's full name, "--seq", for the messages */
        snprintf(name, sizeof name, "--%s", idx >= 0 ? long_options[idx].name : "help");
        const char *a = name, *v = optarg;
        switch (c) {
            case OPT_HELP:
                usage();
                exit(ATTN_EXIT_PASS);
            case OPT_BATCH:
                o->shape.B = (int)parse_int(a, v, 1, ATTN_MAX_BH);
                o->given_B = o->given_run = 1;
                break;
            case OPT_HEADS:
                o->shape.H = (int)parse_int(a, v, 1, ATTN_MAX_BH);
                o->given_H = o->given_run = 1;
                break;
            case OPT_SEQ:
                o->shape.N = (int)parse_int(a, v, 1, ATTN_MAX_N);
                o->given_N = o->given_run = 1;
                break;
            case OPT_DIM:
                o->shape.D = (int)parse_int(a, v, 1, 1 << 20);
                o->given_D = o->given_run = 1;
                break;
            case OPT_CAUSAL:
                o->shape.causal = 1;
                o->given_run = 1;
                break;
            case OPT_SCALE:
                o->shape.scale = parse_pos_float(a, v);
                o->given_scale = o->given_run = 1;
                break;
            case OPT_SEED:
                o->seed = (uint64_t)parse_int(a, v, 0, INT64_MAX);
                break;
            case OPT_DIST:
                if (!strcmp(v, "normal"))
                    o->peaky = 0;
                else if (!strcmp(v, "peaky"))
                    o->peaky = 1;
                else
                    die_usage("--dist: '%s' is not one of normal, peaky", v);
                o->given_run = 1;
                break;
            case OPT_Q:
                o->qpath = v;
                break;
            case OPT_K:
                o->kpath = v;
                break;
            case OPT_V:
                o->vpath = v;
                break;
            case OPT_OUT:
                o->outpath = v;
                break;
            case OPT_LSE:
                o->lsepath = v;
                break;
            case OPT_DO:
            case OPT_DQ:
            case OPT_DK:
            case OPT_DV:
                if (!attn_this_stage.backward)
                    die_usage("%s: %s has no backward pass (stage7_backward has)", a,
                              attn_this_stage.name);
                *(c == OPT_DQ   ? &o->dqpath
                  : c == OPT_DK ? &o->dkpath
                  : c == OPT_DV ? &o->dvpath
                                : &o->dOpath) = v;
                break;
            case OPT_CHECK:
                o->check_rows = !strcmp(v, "all") ? -1 : parse_int(a, v, 0, INT64_MAX);
                o->given_run = 1;
                break;
            case OPT_BENCH:
                o->bench = o->given_run = 1;
                break;
            case OPT_BUDGET:
                o->budget_s = parse_pos(a, v);
                o->given_run = 1;
                break;
            case OPT_CSV:
                o->csv = o->given_run = 1;
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
    if (a.shape[3] != 64 && a.shape[3] != 128)
        die_usage("%s: '%s' has D = %lld, which is not supported (64 or 128)", opt, path,
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
    /* Without the driver library the runtime says "CUDA driver version is insufficient",
     * which sends a learner to upgrade a driver they do not have: say what is missing. */
    void *libcuda = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
    if (!libcuda) {
        fprintf(stderr, "%s: no NVIDIA GPU here (no NVIDIA driver: libcuda.so.1 not found)\n",
                prog);
        return -1;
    }
    dlclose(libcuda);
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e == cudaErrorNoDevice || (e == cudaSuccess && count == 0)) {
        fprintf(stderr, "%s: no NVIDIA GPU here (the driver finds no device)\n", prog);
        return -1;
    }
    if (e != cudaSuccess) {
        int drv = 0, rt = 0;
        (void)cudaDriverGetVersion(&drv), (void)cudaRuntimeGetVersion(&rt);
        fprintf(stderr,
                "%s: the NVIDIA driver cannot run this program: %s (driver supports CUDA "
                "%d.%d, program built with %d.%d)\n",
                prog, cudaGetErrorString(e), drv / 1000, drv % 1000 / 10, rt / 1000,
                rt % 1000 / 10);
        return -1;
    }
    struct cudaDeviceProp p;
    CUDA_CHECK(cudaGetDeviceProperties(&p, 0));
    snprintf(g->name, sizeof g->name, "%s", p.name);
    for (char *c = g->name; *c; c++)
        if (*c == ',') *c = ' ';
    g->dev.cc = p.major * 10 + p.minor;
    g->dev.smem_per_block = p.sharedMemPerBlockOptin;
    g->dev.sm_count = p.multiProcessorCount;
    if (o->smem_limit > 0 && (size_t)o->smem_limit < g->dev.smem_per_block)
        g->dev.smem_per_block = (size_t)o->smem_limit;
    g->flush_bytes = 2 * (size_t)p.l2CacheSize;
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

/* One run: allocate, run once on poisoned output, check, then time. Returns an exit code. */
static int run_case(const options *o, gpu_ctx *g, const host_inputs *in, run_result *r) {
    const attn_shape *s = &o->shape;
    memset(r, 0, sizeof *r);
    r->status = "ok";
    const char *why = attn_this_stage.unsupported(s, &g->dev, o->variant);
    if (why) {
        fprintf(stderr, "%s: unsupported here: %s\n", prog, why);
        r->status = "unsupported";
        return ATTN_EXIT_UNSUPPORTED;
    }
    const int bwd = attn_this_stage.backward != NULL;
    const size_t n = elems_of(s), rows = (size_t)s->B * s->H * s->N;
    const size_t esz = attn_this_stage.dtype == ATTN_F16 ? 2 : 4;
    void *b[BUFS] = {0};
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
    int rc = ATTN_EXIT_PASS;
    for (int i = 0; i < BUFS; i++) {
        if (dev_alloc(&b[i], bytes[i], what[i], &r->device_mb) != 0) {
            r->status = "OOM";
            rc = ATTN_EXIT_OOM;
            goto done;
        }
    }
    CUDA_CHECK(cudaMemcpy(b[BUF_Q], in->Qs, bytes[BUF_Q], cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(b[BUF_K], in->Ks, bytes[BUF_K], cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(b[BUF_V], in->Vs, bytes[BUF_V], cudaMemcpyHostToDevice));
    if (bwd) CUDA_CHECK(cudaMemcpy(b[BUF_DO], in->dOs, bytes[BUF_DO], cudaMemcpyHostToDevice));

    /* first run: on NaN-poisoned output (0xff bytes are NaN in fp16 and fp32) */
    CUDA_CHECK(cudaMemset(b[BUF_O], 0xff, bytes[BUF_O]));
    CUDA_CHECK(cudaMemset(b[BUF_LSE], 0xff, bytes[BUF_LSE]));
    double first_ms[PASSES] = {timed_launch(g, o, b, PASS_FWD), 0, 0};
    const int need_out = o->check_rows != 0 || o->outpath || o->lsepath;
    if (need_out || (bwd && (o->dqpath || o->dkpath || o->dvpath))) {
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
    } else if (bwd) {
        first_ms[PASS_BWD] = run_backward(o, g, in, b, NULL, NULL, r);
    }
    if ((r->checked && !r->chk.pass) || (r->gchecked && !r->gchk.pass)) {
        r->status = "FAIL";
        rc = ATTN_EXIT_WRONG;
    }
    first_ms[PASS_BOTH] = first_ms[PASS_FWD] + first_ms[PASS_BWD];
    const double flops = 4.0 * s->B * s->H * (double)s->N * s->N * s->D * (s->causal ? 0.5 : 1.0);
    for (int p = 0; p < PASSES; p++) {
        timing *t = &r->t[p];
        t->ms_median = t->ms_min = first_ms[p];
        t->repeats = 1;
        if (rc != ATTN_EXIT_PASS || (p != PASS_FWD && !bwd)) continue;
        if (first_ms[p] > o->budget_s * 1000.0) {
            r->status = "over_budget";
        } else if (o->bench && !(bwd && p == PASS_FWD)) { /* stage 7's forward is stage 5's */
            bench_pass(g, o, b, (pass_kind)p, first_ms[p], t);
        }
        t->tflops = pass_flops[p] * flops / (t->ms_median * 1e-3) / 1e12;
    }
done:
    for (int i = 0; i < BUFS; i++)
        if (b[i]) CUDA_CHECK(cudaFree(b[i]));
    return rc;
}

/* The passes a stage reports: the forward, or for a stage with a backward pass the backward
 * alone and both (its forward is another stage's, reported there). */
static int reported(pass_kind p) {
    return attn_this_stage.backward ? p != PASS_FWD : p == PASS_FWD;
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

static int self_test(const options *base, gpu_ctx *g) {
    static const int Ns[] = {1, 2, 17, 63, 64, 65, 127, 128, 129, 255, 1000, 1024, 2047, 4097};
    static const int Ds[] = {64, 128};
    static const int BH[][2] = {{1, 1}, {2, 3}};
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
        int vp = 0, vf = 0;
        for (int di = 0; di < 2; di++)
            for (int causal = 0; causal < 2; causal++)
                for (int bh = 0; bh < 2; bh++)
                    for (int peaky = 0; peaky < 2; peaky++)
                        for (size_t ni = 0; ni < sizeof Ns / sizeof Ns[0]; ni++) {
                            options o = *base;
                            o.shape =
                                (attn_shape){BH[bh][0], BH[bh][1], Ns[ni],
                                             Ds[di],    causal,    1.0f / sqrtf((float)Ds[di])};
                            o.variant = v;
                            o.peaky = peaky;
                            o.bench = 0;
                            o.seed = base->seed * 1000003ull + case_no++;
                            long long rows = (long long)o.shape.B * o.shape.H * o.shape.N;
                            o.check_rows = rows <= SELF_TEST_FULL_ROWS ? -1 : SELF_TEST_SAMPLE;
                            host_inputs in;
                            if (make_inputs(&o, NULL, NULL, NULL, NULL, &in) != 0)
                                die_host_oom("the inputs");
                            run_result r;
                            int rc = run_case(&o, g, &in, &r);
                            free_inputs(&in);
                            if (rc == ATTN_EXIT_PASS) {
                                vp++;
                            } else {
                                vf++;
                                fprintf(stderr, "FAILED: ");
                                describe(stderr, &o, &r);
                            }
                        }
        printf("%s variant %s: %d passed, %d failed\n", attn_this_stage.name, vname, vp, vf);
        passed += vp, failed += vf;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    printf("%s self-test on %s (smem/block %zu): %.1f s\n", attn_this_stage.name, g->name,
           g->dev.smem_per_block, (t1.tv_sec - t0.tv_sec) + 1e-9 * (t1.tv_nsec - t0.tv_nsec));
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? ATTN_EXIT_WRONG : ATTN_EXIT_PASS;
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
    attn_shape *s = &o.shape;
    if (s->D != 64 && s->D != 128) die_usage("--dim: %d is not supported (64 or 128)", s->D);
    if ((long long)s->B * s->H > ATTN_MAX_BH)
        die_usage("--batch x --heads: %lld is over %d", (long long)s->B * s->H, ATTN_MAX_BH);
    if (!o.given_scale) s->scale = 1.0f / sqrtf((float)s->D);
    if (o.self_test && (o.qpath || o.kpath || o.vpath || o.outpath || o.lsepath || o.dOpath ||
                        o.dqpath || o.dkpath || o.dvpath))
        die_usage(
            "--self-test makes its own inputs; it takes no --q/--k/--v/--out/--lse/--dO/--dq/"
            "--dk/--dv");
    if (o.self_test && o.given_run)
        die_usage(
            "--self-test runs its own shapes and checks every row; it takes no --batch, "
            "--heads, --seq, --dim, --causal, --scale, --dist, --check, --bench, --budget, "
            "--csv");
    if (o.outpath) check_writable("--out", o.outpath);
    if (o.lsepath) check_writable("--lse", o.lsepath);
    if (o.dqpath) check_writable("--dq", o.dqpath);
    if (o.dkpath) check_writable("--dk", o.dkpath);
    if (o.dvpath) check_writable("--dv", o.dvpath);

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
