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
#include "decode.h"
#include "device_info.h"

#define SELF_TEST_FULL_ROWS 4096 /* self-test checks every row up to this many, else a sample */
#define SELF_TEST_SAMPLE 512
#define MIN_REPEATS 10  /* timing: at least this many launches ... */
#define MIN_SECONDS 0.5 /* ... and this much measured time, */
#define SLOW_MS 1000.0  /* unless one launch takes longer than this: then ... */
#define SLOW_REPEATS 3  /* ... this many launches */
#define MAX_REPEATS 10000
/* --bench-graph, as tools/compare.py times the binding: a replay of about GRAPH_MS (the graph's
 * launch and the events' resolution under 0.1% of it), at most GRAPH_MAX_CALLS calls in it, a
 * graph replaying in under GRAPH_RECAPTURE_BELOW of GRAPH_MS captured again with R from its own
 * time, GRAPH_REPLAYS timed replays after one untimed (SLOW_REPEATS when one call takes over
 * SLOW_MS). */
#define GRAPH_MS 20.0
#define GRAPH_MAX_CALLS 2000
#define GRAPH_RECAPTURE_BELOW 0.5
#define GRAPH_REPLAYS 10
#define MOVE_ROWS_SERIAL_BYTES (8 << 20) /* host copies below this size stay on one thread */
#define DECODE_DEFAULT_N_MAX 1024        /* the decode path's --seq-k when none is given */
/* A packed batch's outputs (--varlen) are allocated this many rows longer than their tensors,
 * poisoned, and checked untouched: a tile of the last sequence written past its end lands there
 * (a tile of another sequence lands on the next sequence's first rows, which are checked). */
#define PACKED_SLACK_ROWS 256
/* The stages with a backward pass, named where a forward-only stage is asked for one (the
 * Makefile passes them from the stages' stage.mk declarations). */
#ifndef ATTN_BACKWARD_STAGES
#define ATTN_BACKWARD_STAGES "no stage"
#endif

/* How Q, K, V (and O, the gradients) lie in memory: the contract's contiguous [B, H, N, D],
 * flash-attn's [B, N, H, D], or Q, K, V as views of one fused projection [B, N, 3, H, D] (O and dO
 * then [B, N, H, D]; dQ, dK, dV views of one fused [B, N, 3, H, D] gradient). */
typedef enum { LAYOUT_BHND = 0, LAYOUT_BNHD, LAYOUT_QKV, LAYOUTS } layout_kind;
static const char *const layout_names[LAYOUTS] = {"bhnd", "bnhd", "qkv"};

typedef struct {
    attn_shape shape;
    int given_B, given_H, given_N, given_D, given_scale, given_N_k;
    layout_kind layout;
    int given_layout;
    int page_size;          /* the decode path's cache: --page-size (0: contiguous), */
    int ragged, N_new;      /* --ragged, --new-tokens */
    const char *varlen;     /* --varlen SPEC as given; NULL: not packed */
    int *cu_q, *cu_k;       /* a packed batch's sequences on the host, [B + 1] each (--varlen) */
    int forward_only;       /* the forward pass alone (the self-test's packed cases a stage's
                               backward does not take) */
    int decode;             /* one of the three given: the decode path */
    const char *shape_from; /* "--q 'q.npy'": the file the shape was taken from, if any */
    int given_run;          /* an option the self-test would ignore (shape, --dist, --check...) */
    uint64_t seed;
    int peaky;
    const char *qpath, *kpath, *vpath, *outpath, *lsepath;
    const char *dOpath, *dqpath, *dkpath, *dvpath; /* the backward pass's input and outputs */
    long long check_rows;                          /* -1: all rows */
    int check_edges; /* a packed batch's: every head's first and last row of each sequence too */
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
/* FLOPs per pass, in units of the forward's (attn_flops): the backward's five matrix products
 * against the forward's two count 2.5 (the FlashAttention papers' rule). */
static const double pass_flops[PASSES] = {1.0, 2.5, 3.5};

/* The forward's FLOPs: 4 B H N N_k D (two matrix products of 2 N N_k D each per head), halved when
 * causal (the FlashAttention papers' rule; plots/measure.py is the Python side's home); with a
 * local window, 4 B H D times the (query, key) pairs attended, exactly: the sum over the rows of
 * hi - lo + 1 (attn_key_range), causal or not. A packed batch: the sum of its sequences' (the
 * shape's cu_seqlens the program's host arrays, as the program keeps them: options). */
static double attn_flops(const attn_shape *s) {
    if (s->varlen.cu_seqlens_q) {
        double sum = 0;
        for (int b = 0; b < s->B; b++) {
            const attn_sequence q = attn_sequence_of(&s->varlen, b, s->H, s->N, s->N_k);
            attn_shape one = *s; /* the sequence alone: its own N and N_k, the shape's mask */
            one.B = 1, one.N = q.N, one.N_k = q.N_k;
            one.varlen = (attn_varlen){0};
            if (q.N > 0 && q.N_k > 0) sum += attn_flops(&one);
        }
        return sum;
    }
    const double N_k = s->N_k ? s->N_k : s->N;
    if (!s->local) return 4.0 * s->B * s->H * (double)s->N * N_k * s->D * (s->causal ? 0.5 : 1.0);
    double pairs = 0;
    for (long long i = 0; i < s->N; i++) {
        long long lo, hi;
        attn_key_range(s, i, &lo, &hi);
        if (hi >= lo) pairs += (double)(hi - lo + 1);
    }
    return 4.0 * s->B * s->H * pairs * s->D;
}

typedef struct {
    const char *status;
    timing t[PASSES];
    check_result chk;       /* the forward's O and LSE */
    long long stray;        /* bytes written in a strided output's gaps (must be 0) */
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
        "  --dim D            head dim: %s (default 128)\n"
        "                     (a stage runs those it compiled, refuses the rest: exit 3)\n"
        "  --causal           query i attends to keys 0..i\n"
        "  --scale S          softmax scale, a positive float (default 1/sqrt(D))\n"
        "                     B x H <= %d; B, H, N, D may also come from the .npy files\n"
        "what models feed (stages 5-7; the others take the defaults):\n"
        "  --kv-heads H_kv    key/value heads, H %% H_kv == 0 (GQA; 1: MQA; default H)\n"
        "  --seq-k N_k        keys (default N); causal: query i sees keys <= i + N_k - N\n"
        "  --dtype f16|bf16   storage of Q, K, V, O (default the stage's: %s)\n"
        "  --layout bhnd|bnhd|qkv  [B, H, N, D] (default), [B, N, H, D] views, or Q, K, V as\n"
        "                     views of one fused [B, N, 3, H, D] projection\n"
        "local windows and softcap (stages 5-8; the others refuse them):\n"
        "  --window L,R       a local window, flash-attn's window_size: query i sees keys\n"
        "                     i + N_k - N - L .. i + N_k - N + R; -1: unbounded on that side\n"
        "                     (--causal makes R 0; -1,-1: no window)\n"
        "  --softcap C        each score s (= scale q.k) becomes C tanh(s / C) before the\n"
        "                     softmax; C >= 0 (0: none, the default)\n"
        "packed batches (flash-attn's varlen; stages 5-8, the others refuse them):\n"
        "  --varlen SPEC      sequences of their own lengths, packed one after another:\n"
        "                     Q, O [total_q, H, D], K, V [total_k, H_kv, D], lse [H, total_q]\n"
        "                     (cu_seqlens); causal and windows align to each sequence's own\n"
        "                     bottom right. SPEC: each sequence's Nq or Nq:Nk (queries:keys),\n"
        "                     comma-separated, e.g. 1000,0,37:512; or random: --batch\n"
        "                     sequences of 0..--seq queries (one in %d empty), keys as many or\n"
        "                     0..--seq-k, from --seed. N, N_k: the longest sequence's.\n"
        "                     --layout bnhd is the default here, bhnd [H, total, D], qkv\n"
        "                     [total, 3, H, D]; --out, --dq/--dk/--dv write [total, H, D],\n"
        "                     --lse [H, total_q]\n"
        "decode (a stage with a KV-cache path, stage 9; any of these three selects it):\n"
        "  --page-size P      a paged cache of P keys per page, a power of two 1..%d, its pages\n"
        "                     scattered by a random block table (default: one contiguous cache\n"
        "                     [B, N_max, H_kv, D])\n"
        "  --ragged           each sequence holds a random number of keys, 0..N_max - N_new\n"
        "                     (--seed; default: every sequence holds N_max - N_new)\n"
        "  --new-tokens N_new keys and values the call writes into each sequence's cache after\n"
        "                     the keys it holds (default 0)\n"
        "                     then --seq is N_q, new queries per sequence, 1 to %d (default 1),\n"
        "                     --seq-k is N_max, the most keys a sequence holds (default %d);\n"
        "                     Q and O [B, N_q, H, D]; --bench adds GB/s of the cache read\n"
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
        "  --bench-graph      time it as tools/compare.py times the binding: the median replay\n"
        "                     of a CUDA graph of back-to-back calls (about %.0f ms), per call\n"
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
        prog, attn_this_stage.name, attn_this_stage.adds, ATTN_HEAD_DIMS, ATTN_MAX_BH,
        attn_this_stage.dtype == ATTN_F16 ? "f16" : "f32", VARLEN_EMPTY_ODDS, ATTN_MAX_PAGE_SIZE,
        ATTN_MAX_DECODE_N, DECODE_DEFAULT_N_MAX,
        attn_this_stage.dtype == ATTN_F16 ? "float16 (bf16 runs: float32)" : "float32", MIN_REPEATS,
        MIN_SECONDS, GRAPH_MS, attn_this_stage.variants, ATTN_EXIT_PASS, ATTN_EXIT_WRONG,
        ATTN_EXIT_USAGE, ATTN_EXIT_UNSUPPORTED, ATTN_EXIT_OOM);
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
    OPT_KV_HEADS,
    OPT_SEQ_K,
    OPT_DTYPE,
    OPT_LAYOUT,
    OPT_WINDOW,
    OPT_SOFTCAP,
    OPT_VARLEN,
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
    OPT_BENCH_GRAPH,
    OPT_BUDGET,
    OPT_CSV,
    OPT_VARIANT,
    OPT_SMEM_LIMIT,
    OPT_SELF_TEST,
    OPT_PAGE_SIZE,
    OPT_RAGGED,
    OPT_NEW_TOKENS
};
static const struct option long_options[] = {
    {"help", no_argument, NULL, OPT_HELP},
    {"batch", required_argument, NULL, OPT_BATCH},
    {"heads", required_argument, NULL, OPT_HEADS},
    {"seq", required_argument, NULL, OPT_SEQ},
    {"dim", required_argument, NULL, OPT_DIM},
    {"causal", no_argument, NULL, OPT_CAUSAL},
    {"scale", required_argument, NULL, OPT_SCALE},
    {"kv-heads", required_argument, NULL, OPT_KV_HEADS},
    {"seq-k", required_argument, NULL, OPT_SEQ_K},
    {"dtype", required_argument, NULL, OPT_DTYPE},
    {"layout", required_argument, NULL, OPT_LAYOUT},
    {"window", required_argument, NULL, OPT_WINDOW},
    {"softcap", required_argument, NULL, OPT_SOFTCAP},
    {"varlen", required_argument, NULL, OPT_VARLEN},
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
    {"bench-graph", no_argument, NULL, OPT_BENCH_GRAPH},
    {"budget", required_argument, NULL, OPT_BUDGET},
    {"csv", no_argument, NULL, OPT_CSV},
    {"variant", required_argument, NULL, OPT_VARIANT},
    {"smem-limit", required_argument, NULL, OPT_SMEM_LIMIT},
    {"self-test", no_argument, NULL, OPT_SELF_TEST},
    {"page-size", required_argument, NULL, OPT_PAGE_SIZE},
    {"ragged", no_argument, NULL, OPT_RAGGED},
    {"new-tokens", required_argument, NULL, OPT_NEW_TOKENS},
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

/* --window L,R: flash-attn's window_size, two integers of -1 or more (-1: unbounded). */
static void parse_window(const char *opt, const char *v, attn_shape *s) {
    char *end, *mid;
    errno = 0;
    const long long l = strtoll(v, &mid, 10);
    const int sep = mid != v && *mid == ',';
    const long long r = sep ? strtoll(mid + 1, &end, 10) : 0;
    if (!sep || errno || end == mid + 1 || *end || l < -1 || r < -1 || l > INT32_MAX ||
        r > INT32_MAX)
        die_usage("%s: '%s' is not L,R: two integers, each -1 (unbounded) or more", opt, v);
    s->local = 1, s->window_left = (int)l, s->window_right = (int)r;
}

/* --softcap C: a number >= 0 that stays itself as a float (0: none). */
static float parse_softcap(const char *opt, const char *v) {
    char *end;
    errno = 0;
    const double c = strtod(v, &end);
    if (end == v || *end || !(c >= 0) || isinf(c))
        die_usage("%s: '%s' is not a number >= 0 (0: none)", opt, v);
    if (c > 0 && (errno || c < FLT_MIN || c > FLT_MAX))
        die_usage("%s: '%s' is outside the float range [%g, %g]", opt, v, (double)FLT_MIN,
                  (double)FLT_MAX);
    return (float)c;
}

/* --batch, --heads, --seq, --dim, --causal, --scale, --kv-heads, --seq-k, --dtype, --layout,
 * --window, --softcap, --varlen: 1 if c is one of them. */
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
        case OPT_KV_HEADS:
            s->H_kv = (int)parse_int(a, v, 1, ATTN_MAX_BH);
            break;
        case OPT_SEQ_K:
            s->N_k = (int)parse_int(a, v, 1, ATTN_MAX_N), o->given_N_k = 1;
            break;
        case OPT_DTYPE:
            if (strcmp(v, "f16") && strcmp(v, "bf16") && strcmp(v, "f32"))
                die_usage("--dtype: '%s' is not one of f16, bf16, f32", v);
            if (strcmp(v, attn_this_stage.dtype == ATTN_F16 ? "f32" : "f16") == 0 ||
                (!strcmp(v, "bf16") && attn_this_stage.dtype != ATTN_F16))
                die_usage("--dtype: %s stores %s", attn_this_stage.name,
                          attn_this_stage.dtype == ATTN_F16 ? "f16 (or bf16)" : "f32");
            s->bf16 = !strcmp(v, "bf16");
            break;
        case OPT_LAYOUT: {
            int l = 0;
            while (l < LAYOUTS && strcmp(v, layout_names[l])) l++;
            if (l == LAYOUTS) die_usage("--layout: '%s' is not one of bhnd, bnhd, qkv", v);
            o->layout = (layout_kind)l;
            o->given_layout = 1;
            break;
        }
        case OPT_WINDOW:
            parse_window(a, v, s);
            break;
        case OPT_SOFTCAP:
            s->softcap = parse_softcap(a, v);
            break;
        case OPT_VARLEN: /* read in check_options, with --batch, --seq and --seq-k */
            o->varlen = v;
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

/* --page-size, --ragged, --new-tokens: 1 if c is one of them. They select the decode path, which
 * only a stage with one has (its descriptor's `decode`). */
static int decode_option(int c, const char *a, const char *v, options *o) {
    if (c != OPT_PAGE_SIZE && c != OPT_RAGGED && c != OPT_NEW_TOKENS) return 0;
    if (!attn_this_stage.decode)
        die_usage("%s: %s has no decode path (a KV cache's option: a decode stage's)", a,
                  attn_this_stage.name);
    switch (c) {
        case OPT_PAGE_SIZE:
            o->page_size = (int)parse_int(a, v, 1, ATTN_MAX_PAGE_SIZE);
            if (o->page_size & (o->page_size - 1))
                die_usage("%s: %d is not a power of two (1, 2, 4, ..., %d)", a, o->page_size,
                          ATTN_MAX_PAGE_SIZE);
            break;
        case OPT_RAGGED:
            o->ragged = 1;
            break;
        default:
            o->N_new = (int)parse_int(a, v, 0, ATTN_MAX_N);
            break;
    }
    o->decode = 1, o->given_run = 1;
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
            o->bench = BENCH_LAUNCHES;
            break;
        case OPT_BENCH_GRAPH:
            o->bench = BENCH_GRAPH;
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
    o->shape = (attn_shape){.B = 1, .H = 1, .N = 1024, .D = 128};
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
        if (!shape_option(c, name, optarg, o) && !file_option(c, name, optarg, o) &&
            !decode_option(c, name, optarg, o))
            run_option(c, name, optarg, o);
    }
    if (optind < argc) die_usage("unknown option '%s'", argv[optind]);
}

/* The layouts of --layout (the shape's strides; contiguous ones left zero, then filled in). A
 * packed batch's: bnhd [total, H, D] (attention.h's attn_packed), bhnd [H, total, D], qkv [total,
 * 3, H, D]; their batch stride unused. */
static void set_layout(options *o) {
    attn_shape *s = &o->shape;
    attn_shape_complete(s); /* H_kv, N_k */
    const long long D = s->D, H = s->H, N = s->N, Hk = s->H_kv, Nk = s->N_k;
    if (s->varlen.cu_seqlens_q) { /* packed: the tensors' rows are the batch's tokens */
        const long long tq = s->varlen.total_q, tk = s->varlen.total_k;
        attn_layout q = attn_packed((int)H, (int)D), k = attn_packed((int)Hk, (int)D);
        if (o->layout == LAYOUT_BHND) /* [heads, total, D] */
            q = (attn_layout){0, tq * D, D}, k = (attn_layout){0, tk * D, D};
        s->q = s->o = s->dO = s->dQ = q;
        s->k = s->v = s->dK = s->dV = k;
        if (o->layout == LAYOUT_QKV) { /* [total, 3, H, D] */
            const attn_layout qkv = {0, D, 3 * H * D};
            s->q = s->k = s->v = s->dQ = s->dK = s->dV = qkv;
        }
        return;
    }
    if (o->layout == LAYOUT_BNHD || o->layout == LAYOUT_QKV) {
        const attn_layout q = {N * H * D, D, H * D}, k = {Nk * Hk * D, D, Hk * D};
        s->q = s->o = s->dO = s->dQ = q;
        s->k = s->v = s->dK = s->dV = k;
    }
    if (o->layout == LAYOUT_QKV) { /* [B, N, 3, H, D]: Q, K, V (and dQ, dK, dV) interleaved */
        const attn_layout qkv = {3 * N * H * D, D, 3 * H * D};
        s->q = s->k = s->v = s->dQ = s->dK = s->dV = qkv;
    }
}

/* --varlen: its sequences (a list, or random from --batch, --seq, --seq-k and --seed) in o->cu_q
 * and o->cu_k, and the shape they make: B sequences, N and N_k the longest's (N_k 0, no key in
 * the batch, completes to N: a batch with nothing to compute, attn_packed_empty), the packed
 * layouts (bnhd unless --layout says otherwise). The shape's cu_seqlens are the host arrays until
 * a run puts the device's in a copy of it (enqueue): no stage reads them on the host. */
static void setup_varlen(options *o) {
    attn_shape *s = &o->shape;
    if (o->decode)
        die_usage(
            "--varlen: the decode path (--page-size, --ragged, --new-tokens) takes no packed "
            "batch");
    const char *const names[] = {"--q", "--k", "--v", "--dO"};
    const char *const paths[] = {o->qpath, o->kpath, o->vpath, o->dOpath};
    for (int f = 0; f < (int)(sizeof paths / sizeof paths[0]); f++)
        if (paths[f]) die_usage("%s: a packed batch (--varlen) makes its own inputs", names[f]);
    int B = s->B;
    if (!strcmp(o->varlen, "random")) {
        o->cu_q = malloc(sizeof(int) * (size_t)(B + 1));
        o->cu_k = malloc(sizeof(int) * (size_t)(B + 1));
        if (!o->cu_q || !o->cu_k) die_host_oom("the sequences' lengths");
        if (varlen_random(B, s->N, o->given_N_k ? s->N_k : -1, o->seed, o->cu_q, o->cu_k) != 0)
            die_usage(
                "--varlen random: these %d sequences pass %d tokens in all (a smaller --batch "
                "or --seq)",
                B, ATTN_MAX_N);
    } else {
        if (o->given_N || o->given_N_k)
            die_usage(
                "%s: --varlen's list sets the sequences' lengths (--varlen random takes --seq "
                "and --seq-k as their bounds)",
                o->given_N ? "--seq" : "--seq-k");
        char err[256];
        const int rc = varlen_parse(o->varlen, &B, &o->cu_q, &o->cu_k, err, sizeof err);
        if (rc == NPY_ERR_NOMEM) die_host_oom(err);
        if (rc != 0) die_usage("--varlen: %s", err);
        if (o->given_B && B != s->B)
            die_usage("--batch: %d, but --varlen lists %d sequences", s->B, B);
    }
    int most_q = 0, most_k = 0, same = 1;
    for (int b = 0; b < B; b++) {
        const int n_q = o->cu_q[b + 1] - o->cu_q[b], n_k = o->cu_k[b + 1] - o->cu_k[b];
        most_q = n_q > most_q ? n_q : most_q, most_k = n_k > most_k ? n_k : most_k;
        same &= n_q == n_k;
    }
    s->B = B, s->N = most_q, s->N_k = most_k;
    s->varlen = (attn_varlen){o->cu_q, o->cu_k, o->cu_q[B], o->cu_k[B]};
    if (!o->given_layout) o->layout = LAYOUT_BNHD;
    if (o->layout == LAYOUT_QKV && ((s->H_kv && s->H_kv != s->H) || !same))
        die_usage(
            "--layout qkv: one fused projection has as many key/value heads as query heads "
            "and every sequence as many keys as queries");
}

/* ---- inputs ---- */

/* Out of host memory: one line, exit 4 (like the device's out-of-memory). */
void die_host_oom(const char *what) {
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
        die_usage("%s: '%s' has D = %lld, which is not a head dim (" ATTN_HEAD_DIMS ")", opt, path,
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

/* ---- the run's tensors: their shapes, storage and layouts ---- */

/* Device buffers of one run; the backward's are allocated only for a stage that has one, the
 * sequences' boundaries (cu_seqlens_q, cu_seqlens_k) only for a packed batch. */
enum {
    BUF_Q,
    BUF_K,
    BUF_V,
    BUF_O,
    BUF_LSE,
    BUF_WS,
    BUF_DO,
    BUF_DQ,
    BUF_DK,
    BUF_DV,
    BUF_BWS,
    BUF_CU_Q,
    BUF_CU_K,
    BUFS
};

/* The storage type of the run (what the checker rounds to), and its element size. */
static store_type store_of(const attn_shape *s) {
    return attn_this_stage.dtype == ATTN_F32 ? STORE_F32 : s->bf16 ? STORE_BF16 : STORE_F16;
}
static size_t esz_of(void) {
    return attn_this_stage.dtype == ATTN_F16 ? 2 : 4;
}

/* Whether the run has a backward pass: the stage has one and the case is not its forward alone. */
static int has_backward(const options *o) {
    return attn_this_stage.backward && !o->forward_only;
}

/* malloc of at least one byte (a packed batch's side without a token has no element). */
static void *host_alloc(size_t bytes) {
    return malloc(bytes ? bytes : 1);
}

/* Whether a tensor has the keys' shape [B, H_kv, N_k, D] (else the queries' [B, H, N, D]). */
static int key_tensor(int buf) {
    return buf == BUF_K || buf == BUF_V || buf == BUF_DK || buf == BUF_DV;
}

/* A tensor's elements, [B, heads, rows, D] as the checker sees it (contiguous); a packed batch's
 * [total, heads, D] (the checker's copy sequence-major: common.h). */
static size_t elems_of(const attn_shape *s, int buf) {
    if (s->varlen.cu_seqlens_q) /* packed: [total, heads, D] */
        return key_tensor(buf) ? (size_t)s->varlen.total_k * s->H_kv * s->D
                               : (size_t)s->varlen.total_q * s->H * s->D;
    return (size_t)s->B * (key_tensor(buf) ? (size_t)s->H_kv * s->N_k : (size_t)s->H * s->N) * s->D;
}

/* Its layout in device memory (the shape's strides) and its first element's offset there (Q, K,
 * V of one fused projection: K and V start H * D elements after the one before). */
static const attn_layout *layout_of(const attn_shape *s, int buf) {
    switch (buf) {
        case BUF_Q:
            return &s->q;
        case BUF_K:
            return &s->k;
        case BUF_V:
            return &s->v;
        case BUF_O:
            return &s->o;
        case BUF_DO:
            return &s->dO;
        case BUF_DQ:
            return &s->dQ;
        case BUF_DK:
            return &s->dK;
        default:
            return &s->dV;
    }
}
static size_t offset_of(const options *o, int buf) {
    if (o->layout != LAYOUT_QKV) return 0;
    const size_t hd = (size_t)o->shape.H * o->shape.D;
    return buf == BUF_K || buf == BUF_DK ? hd : buf == BUF_V || buf == BUF_DV ? 2 * hd : 0;
}
/* The elements its device buffer spans: offset, then up to its last element. */
static size_t span_of(const options *o, int buf) {
    const attn_shape *s = &o->shape;
    const attn_layout *l = layout_of(s, buf);
    const int heads = key_tensor(buf) ? s->H_kv : s->H;
    const long long rows = !o->cu_q          ? (key_tensor(buf) ? s->N_k : s->N)
                           : key_tensor(buf) ? s->varlen.total_k
                                             : s->varlen.total_q;
    if (rows == 0) return 0; /* a packed batch without a token of this side */
    return offset_of(o, buf) + (size_t)(s->B - 1) * l->batch + (size_t)(heads - 1) * l->head +
           (size_t)(rows - 1) * l->row + s->D;
}

/* Whether a tensor is one of the outputs (O, dQ, dK, dV). */
static int output_tensor(int buf) {
    return buf == BUF_O || buf == BUF_DQ || buf == BUF_DK || buf == BUF_DV;
}

/* The elements its device buffer holds: the span, and after a packed batch's outputs
 * PACKED_SLACK_ROWS rows more, poisoned (the download counts what a run writes there). */
static size_t alloc_of(const options *o, int buf) {
    const size_t span = span_of(o, buf);
    if (!o->cu_q || !output_tensor(buf) || span == 0) return span;
    return span + (size_t)PACKED_SLACK_ROWS * layout_of(&o->shape, buf)->row;
}

/* The checker's view of the run: its shape, and a packed batch's sequences (common.h). */
static ref_shape checker_shape(const options *o) {
    ref_shape rs = ref_of(&o->shape);
    rs.cu_q = o->cu_q, rs.cu_k = o->cu_k;
    return rs;
}

/* Where row r of a tensor's host copy (contiguous [B, heads, rows, D]; a packed batch's
 * sequence-major, common.h) lies in the tensor: the batch, head and row its layout's strides
 * multiply (rs: checker_shape's). */
static void row_place(const options *o, const ref_shape *rs, int buf, long long r, long long *b,
                      long long *h, long long *i) {
    const attn_shape *s = &o->shape;
    const int keys = key_tensor(buf);
    const long long heads = keys ? s->H_kv : s->H;
    if (!o->cu_q) {
        const long long rows = keys ? s->N_k : s->N;
        *b = r / (heads * rows), *h = r / rows % heads, *i = r % rows;
        return;
    }
    /* the sequence's first row and length, as a kernel reads them (the host's own arrays) */
    const long long seq = ref_sequence_of_row(rs, keys, r);
    const attn_sequence q = attn_sequence_of(&s->varlen, (int)seq, s->H, s->N, s->N_k);
    const long long first = heads * (keys ? o->cu_k : o->cu_q)[seq], len = keys ? q.N_k : q.N;
    *b = 0, *h = (r - first) / len, *i = (keys ? q.k_row : q.q_row) + (r - first) % len;
}

/* Each [D] row of a tensor between its host copy (host, elements of esz bytes; row_place's order)
 * and its device image (img, alloc_of elements): host into img (ROWS_SCATTER), img into host
 * (ROWS_GATHER), or the rows in img set to 0xff bytes (ROWS_ERASE: what is left is the layout's
 * gaps and a packed output's slack rows). */
typedef enum { ROWS_SCATTER, ROWS_GATHER, ROWS_ERASE } rows_move;
static void move_rows(const options *o, int buf, void *host, void *img, rows_move how) {
    const attn_shape *s = &o->shape;
    const attn_layout *l = layout_of(s, buf);
    const size_t esz = esz_of(), row_bytes = (size_t)s->D * esz, off = offset_of(o, buf);
    const long long all = (long long)(elems_of(s, buf) / (size_t)s->D);
    const ref_shape rs = checker_shape(o);
    /* threads only where there is work for them: the self-test's small cases run three programs
     * side by side, where idle OpenMP threads spinning at a barrier cost more than the copy */
#pragma omp parallel for schedule(static) if (all * (long long)row_bytes > MOVE_ROWS_SERIAL_BYTES)
    for (long long r = 0; r < all; r++) {
        long long b, h, i;
        row_place(o, &rs, buf, r, &b, &h, &i);
        char *at = (char *)img + (off + b * l->batch + h * l->head + i * l->row) * esz;
        char *row = (char *)host + r * row_bytes;
        if (how == ROWS_SCATTER)
            memcpy(at, row, row_bytes);
        else if (how == ROWS_GATHER)
            memcpy(row, at, row_bytes);
        else
            memset(at, 0xff, row_bytes);
    }
}

/* Makes the stored inputs: from files where given, else random; rounded to the storage type. */
/* dO (the backward pass's input) only for a stage with a backward pass. */
static int make_inputs(const options *o, float *fileq, float *filek, float *filev, float *filedo,
                       host_inputs *in) {
    const attn_shape *s = &o->shape;
    const store_type st = store_of(s);
    float *src[4] = {fileq, filek, filev, filedo};
    float **dst[4] = {&in->Qf, &in->Kf, &in->Vf, &in->dOf};
    void **stored[4] = {&in->Qs, &in->Ks, &in->Vs, &in->dOs};
    const int bufs[4] = {BUF_Q, BUF_K, BUF_V, BUF_DO};
    memset(in, 0, sizeof *in);
    for (int t = 0; t < (has_backward(o) ? 4 : 3); t++) {
        const size_t n = elems_of(s, bufs[t]);
        float *f = src[t] ? src[t] : host_alloc(n * sizeof(float));
        if (!f) return -1;
        if (!src[t]) fill_normal(f, n, o->seed, (uint32_t)t, (t == 0 && o->peaky) ? 8.0f : 1.0f);
        if (st != STORE_F32) {
            uint16_t *h = host_alloc(n * sizeof(uint16_t));
            if (!h) return -1;
#pragma omp parallel for schedule(static)
            for (long long x = 0; x < (long long)n; x++) {
                h[x] = st == STORE_BF16 ? f32_to_bf16(f[x]) : f32_to_f16(f[x]);
                f[x] = st == STORE_BF16 ? bf16_to_f32(h[x]) : f16_to_f32(h[x]);
            }
            *stored[t] = h;
        } else {
            *stored[t] = f;
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

/* 0xff bytes (NaN in fp16, bf16 and fp32) over an output's device buffer before a checked run. */
static void poison(void *p, size_t bytes) {
    if (bytes) CUDA_CHECK(cudaMemset(p, 0xff, bytes));
}

/* The stage's unsupported() of a shape. A packed batch with nothing to compute, which no stage
 * sees (attention.h's attn_packed_empty), asks it of the same batch with a token on each side,
 * so that it is refused where any packed batch of its kind is (a head dim the stage did not
 * compile, a type this GPU has no instruction for). */
static const char *stage_unsupported(const attn_shape *s, const attn_device *dev, int variant) {
    if (!attn_packed_empty(s)) return attn_this_stage.unsupported(s, dev, variant);
    attn_shape one = *s;
    one.N = one.N_k = 1;
    one.varlen.total_q = one.varlen.total_k = 1;
    return attn_this_stage.unsupported(&one, dev, variant);
}

/* cudaMalloc that reports, rather than dies, when the device is out of memory. */
int dev_alloc(void **p, size_t bytes, const char *what, double *total_mb) {
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

/* Zero every row of a packed tensor (t: its first element), head by head in its layout. */
static void zero_rows(gpu_ctx *g, const options *o, void *t, int buf) {
    const attn_shape *s = &o->shape;
    const attn_layout *l = layout_of(s, buf);
    const int heads = key_tensor(buf) ? s->H_kv : s->H;
    const int rows = key_tensor(buf) ? s->varlen.total_k : s->varlen.total_q;
    const size_t esz = esz_of();
    for (int h = 0; rows > 0 && h < heads; h++)
        CUDA_CHECK(cudaMemset2DAsync((char *)t + (size_t)h * l->head * esz, (size_t)l->row * esz, 0,
                                     (size_t)s->D * esz, (size_t)rows, g->stream));
}

/* A packed batch with nothing to compute (attention.h's attn_packed_empty) calls no stage: the
 * program writes what the library writes, flash-attn's answer: O = 0 and lse = -inf on every
 * query row (the forward), dQ = dK = dV = 0 (the backward). */
static void fill_empty(gpu_ctx *g, const options *o, void *const t[BUFS], pass_kind pass) {
    const attn_shape *s = &o->shape;
    if (pass != PASS_BWD) {
        zero_rows(g, o, t[BUF_O], BUF_O);
        const size_t n = (size_t)s->H * s->varlen.total_q;
        float *none = host_alloc(n * sizeof(float));
        if (!none) die_host_oom("the lse of a batch without keys");
        for (size_t x = 0; x < n; x++) none[x] = -INFINITY;
        if (n) /* (from pageable memory: staged before the call returns, so none may go) */
            CUDA_CHECK(cudaMemcpyAsync(t[BUF_LSE], none, n * sizeof(float), cudaMemcpyHostToDevice,
                                       g->stream));
        free(none);
    }
    if (pass != PASS_FWD)
        for (int buf = BUF_DQ; buf <= BUF_DV; buf++) zero_rows(g, o, t[buf], buf);
}

static void enqueue(gpu_ctx *g, const options *o, void *const b[BUFS], pass_kind pass) {
    attn_shape packed = o->shape; /* a packed batch's: the sequences' boundaries on the device */
    packed.varlen.cu_seqlens_q = b[BUF_CU_Q], packed.varlen.cu_seqlens_k = b[BUF_CU_K];
    const attn_shape *s = o->cu_q ? &packed : &o->shape;
    void *t[BUFS]; /* each tensor's first element (Q, K, V of a fused projection: one after another)
                    */
    for (int i = 0; i < BUFS; i++) t[i] = b[i] ? (char *)b[i] + offset_of(o, i) * esz_of() : NULL;
    if (attn_packed_empty(s)) {
        fill_empty(g, o, t, pass);
        return;
    }
    if (pass != PASS_BWD)
        CUDA_CHECK(attn_this_stage.forward(s, &g->dev, t[BUF_Q], t[BUF_K], t[BUF_V], t[BUF_O],
                                           (float *)t[BUF_LSE], t[BUF_WS], o->variant, g->stream));
    if (pass != PASS_FWD)
        CUDA_CHECK(attn_this_stage.backward(
            s, &g->dev, t[BUF_Q], t[BUF_K], t[BUF_V], t[BUF_O], (const float *)t[BUF_LSE],
            t[BUF_DO], t[BUF_DQ], t[BUF_DK], t[BUF_DV], t[BUF_BWS], o->variant, g->stream));
}

/* A call between CUDA events on g->stream: its milliseconds. */
static double time_between_events(gpu_ctx *g, enqueue_fn call, const void *arg) {
    CUDA_CHECK(cudaEventRecord(g->start, g->stream));
    call(g, arg);
    CUDA_CHECK(cudaEventRecord(g->stop, g->stream));
    CUDA_CHECK(cudaEventSynchronize(g->stop));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, g->start, g->stop));
    return ms;
}

/* The timing protocol (decode.h): one launch of any call, L2 flushed, between events. */
double time_launch(gpu_ctx *g, enqueue_fn call, const void *arg) {
    CUDA_CHECK(cudaMemsetAsync(g->flush, 0, g->flush_bytes, g->stream));
    return time_between_events(g, call, arg);
}

/* One pass of this run, as time_launch's call. */
typedef struct {
    const options *o;
    void *const *b;
    pass_kind pass;
} pass_call;
static void enqueue_pass(gpu_ctx *g, const void *arg) {
    const pass_call *p = arg;
    enqueue(g, p->o, p->b, p->pass);
}

static double timed_launch(gpu_ctx *g, const options *o, void *const b[BUFS], pass_kind pass) {
    const pass_call p = {o, b, pass};
    return time_launch(g, enqueue_pass, &p);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Times one call: the median of at least MIN_REPEATS launches and MIN_SECONDS (SLOW_REPEATS when
 * the first took over SLOW_MS), after a warm-up. */
void bench_launches(gpu_ctx *g, enqueue_fn call, const void *arg, double first_ms, timing *t) {
    double *ms = malloc(sizeof(double) * MAX_REPEATS), total = 0;
    if (!ms) die_host_oom("the timing samples");
    int k = 0;
    if (first_ms < SLOW_MS) (void)time_launch(g, call, arg); /* warm-up */
    while (k < MAX_REPEATS) {
        ms[k] = time_launch(g, call, arg);
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

/* A CUDA graph of `calls` back-to-back calls captured on g->stream, instantiated. */
static cudaGraphExec_t capture_calls(gpu_ctx *g, enqueue_fn call, const void *arg, int calls) {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CUDA_CHECK(cudaStreamBeginCapture(g->stream, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < calls; i++) call(g, arg);
    CUDA_CHECK(cudaStreamEndCapture(g->stream, &graph));
    CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    CUDA_CHECK(cudaGraphDestroy(graph));
    return exec;
}

/* One replay of a graph (arg: its cudaGraphExec_t), as time_between_events' call. */
static void enqueue_replay(gpu_ctx *g, const void *arg) {
    CUDA_CHECK(cudaGraphLaunch(*(const cudaGraphExec_t *)arg, g->stream));
}
static double time_replay(gpu_ctx *g, cudaGraphExec_t exec) {
    return time_between_events(g, enqueue_replay, &exec);
}

/* R: calls in one graph so that a replay lasts about GRAPH_MS. */
static int graph_calls(double ms_per_call) {
    if (!(ms_per_call > 0)) return GRAPH_MAX_CALLS;
    const double r = GRAPH_MS / ms_per_call + 0.5;
    return r < 1 ? 1 : r > GRAPH_MAX_CALLS ? GRAPH_MAX_CALLS : (int)r;
}

void bench_graph(gpu_ctx *g, enqueue_fn call, const void *arg, double first_ms, timing *t) {
    int calls = graph_calls(first_ms);
    cudaGraphExec_t exec = capture_calls(g, call, arg, calls);
    double warm = time_replay(g, exec); /* untimed: the replay's own length */
    /* the first launch (an L2 flushed, lazily loaded kernels) overestimates a short call */
    if (warm < GRAPH_RECAPTURE_BELOW * GRAPH_MS && calls < GRAPH_MAX_CALLS) {
        CUDA_CHECK(cudaGraphExecDestroy(exec));
        calls = graph_calls(warm / calls);
        exec = capture_calls(g, call, arg, calls);
        (void)time_replay(g, exec);
    }
    const int replays = first_ms > SLOW_MS ? SLOW_REPEATS : GRAPH_REPLAYS;
    double ms[GRAPH_REPLAYS];
    for (int k = 0; k < replays; k++) ms[k] = time_replay(g, exec) / calls;
    CUDA_CHECK(cudaGraphExecDestroy(exec));
    qsort(ms, (size_t)replays, sizeof(double), cmp_double);
    t->ms_median = ms[replays / 2]; /* the upper median, as compare.py takes it */
    t->ms_min = ms[0];
    t->repeats = calls * replays;
}

void bench(gpu_ctx *g, int how, enqueue_fn call, const void *arg, double first_ms, timing *t) {
    if (how == BENCH_GRAPH)
        bench_graph(g, call, arg, first_ms, t);
    else
        bench_launches(g, call, arg, first_ms, t);
}

/* A tensor from its device buffer (its layout) to the host: contiguous floats, and in *raw the
 * stored values, contiguous (for --out and the like; the floats themselves for fp32 storage; bf16
 * as floats). *stray: elements of the buffer outside the tensor's own (a strided layout's gaps,
 * poisoned with 0xff bytes before the run) that the run wrote over. */
static float *download(const options *o, const void *dev_buf, int buf, void **raw,
                       long long *stray) {
    const size_t count = elems_of(&o->shape, buf), span = alloc_of(o, buf), esz = esz_of();
    const store_type st = store_of(&o->shape);
    float *f = host_alloc(count * sizeof(float));
    void *r = esz == 4 ? (void *)f : host_alloc(count * esz);
    unsigned char *img = host_alloc(span * esz);
    if (!f || !r || !img) die_host_oom("the copy of an output");
    if (span) CUDA_CHECK(cudaMemcpy(img, dev_buf, span * esz, cudaMemcpyDeviceToHost));
    move_rows(o, buf, r, img, ROWS_GATHER);
    long long written = 0;
    if (span != count) { /* a strided layout's gaps, a packed output's slack: still the poison */
        move_rows(o, buf, NULL, img, ROWS_ERASE);
#pragma omp parallel for reduction(+ : written) \
    schedule(static) if (span * esz > MOVE_ROWS_SERIAL_BYTES)
        for (long long x = 0; x < (long long)(span * esz); x++) written += img[x] != 0xff;
    }
    *stray = written;
    if (esz == 2) {
#pragma omp parallel for schedule(static)
        for (long long x = 0; x < (long long)count; x++) {
            const uint16_t h = ((uint16_t *)r)[x];
            f[x] = st == STORE_BF16 ? bf16_to_f32(h) : f16_to_f32(h);
        }
    }
    free(img);
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

/* The lse's elements, [B, H, N] (a packed batch's [H, total_q]), and those of its device buffer:
 * a packed batch's PACKED_SLACK_ROWS more, poisoned, as its outputs' (alloc_of). */
static size_t lse_rows(const options *o) {
    const attn_shape *s = &o->shape;
    return o->cu_q ? (size_t)s->H * s->varlen.total_q : (size_t)s->B * s->H * s->N;
}
static size_t lse_alloc(const options *o) {
    return lse_rows(o) + (o->cu_q && lse_rows(o) ? PACKED_SLACK_ROWS : 0);
}

/* lse float32 (always contiguous) to the host as it lies on the device, [B, H, N] or [H, total_q];
 * *stray: bytes of a packed batch's slack written over. */
static float *download_lse(const options *o, const void *dev_lse, long long *stray) {
    const size_t rows = lse_rows(o), alloc = lse_alloc(o);
    float *f = host_alloc(alloc * sizeof(float));
    if (!f) die_host_oom("the copy of the lse");
    if (alloc) CUDA_CHECK(cudaMemcpy(f, dev_lse, alloc * sizeof(float), cudaMemcpyDeviceToHost));
    const unsigned char *slack = (const unsigned char *)(f + rows);
    long long written = 0;
    for (size_t x = 0; x < (alloc - rows) * sizeof(float); x++) written += slack[x] != 0xff;
    *stray = written;
    return f;
}

/* The lse as the checker reads it: a packed batch's [H, total_q] sequence-major (common.h), a
 * copy; else lse itself. */
static float *checker_lse(const options *o, float *lse) {
    if (!o->cu_q) return lse;
    const attn_shape *s = &o->shape;
    float *c = host_alloc(lse_rows(o) * sizeof(float));
    if (!c) die_host_oom("the copy of the lse");
    for (int b = 0; b < s->B; b++) {
        const long long first = o->cu_q[b], len = o->cu_q[b + 1] - first;
        for (long long h = 0; h < s->H; h++)
            for (long long i = 0; i < len; i++)
                c[s->H * first + h * len + i] = lse[h * s->varlen.total_q + first + i];
    }
    return c;
}

/* An output to a .npy file, [B, heads, rows, D] (a packed batch's [total, heads, D]): the stored
 * values (bf16: as float32). */
static void write_tensor(const char *opt, const char *path, const options *o, int buf,
                         const float *f, const void *raw) {
    const attn_shape *s = &o->shape;
    const store_type st = store_of(s);
    const void *data = st == STORE_F16 ? raw : f;
    const int heads = key_tensor(buf) ? s->H_kv : s->H;
    if (!path) return;
    if (!o->cu_q) {
        long long shp[4] = {s->B, heads, key_tensor(buf) ? s->N_k : s->N, s->D};
        write_npy(opt, path, st == STORE_F16 ? NPY_F16 : NPY_F32, 4, shp, data);
        return;
    }
    /* packed: the host copy's rows in the tensor's order */
    const size_t esz = st == STORE_F16 ? 2 : 4, row_bytes = (size_t)s->D * esz;
    const long long rows = (long long)(elems_of(s, buf) / (size_t)s->D);
    char *packed = host_alloc((size_t)rows * row_bytes);
    if (!packed) die_host_oom("the packed copy of an output");
    const ref_shape rs = checker_shape(o);
    for (long long r = 0; r < rows; r++) {
        long long b, h, i;
        row_place(o, &rs, buf, r, &b, &h, &i);
        memcpy(packed + (i * heads + h) * row_bytes, (const char *)data + r * row_bytes, row_bytes);
    }
    long long shp[3] = {rows / heads, heads, s->D};
    write_npy(opt, path, st == STORE_F16 ? NPY_F16 : NPY_F32, 3, shp, packed);
    free(packed);
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

/* A packed batch's: the query rows (keys 0) or key rows (keys 1) of every sequence, about
 * o->check_rows in all (pick_sequence_rows; with o->check_edges every head's first and last). */
static long long *sequence_rows_to_check(const options *o, int keys, uint64_t seed, long long *n) {
    const ref_shape rs = checker_shape(o);
    const long long count =
        pick_sequence_rows(&rs, keys, o->check_rows, o->check_edges, seed, NULL);
    long long *rl = count < 0 ? NULL : host_alloc(sizeof(long long) * (size_t)count);
    if (!rl) die_host_oom("the list of rows to check");
    *n = pick_sequence_rows(&rs, keys, o->check_rows, o->check_edges, seed, rl);
    if (*n < 0) die_host_oom("the list of rows to check");
    return rl;
}

/* The backward pass once on poisoned dQ, dK, dV; then its outputs written and checked against
 * the float64 reference, with the forward's stored O and lse (host copies). Returns its time. */
static double run_backward(const options *o, gpu_ctx *g, const host_inputs *in, void *const b[BUFS],
                           const float *O, const float *lse, run_result *r) {
    const attn_shape *s = &o->shape;
    for (int x = BUF_DQ; x <= BUF_DV; x++) poison(b[x], alloc_of(o, x) * esz_of());
    const double ms = timed_launch(g, o, b, PASS_BWD);
    if (o->check_rows == 0 && !o->dqpath && !o->dkpath && !o->dvpath) return ms;
    void *raw[3];
    float *grad[3];
    const char *opts[3] = {"--dq", "--dk", "--dv"};
    const char *paths[3] = {o->dqpath, o->dkpath, o->dvpath};
    for (int t = 0; t < 3; t++) {
        long long stray;
        grad[t] = download(o, b[BUF_DQ + t], BUF_DQ + t, &raw[t], &stray);
        r->stray += stray;
        write_tensor(opts[t], paths[t], o, BUF_DQ + t, grad[t], raw[t]);
    }
    if (o->check_rows != 0) {
        long long nq, nk;
        const long long qrows = (long long)s->B * s->H * s->N;
        const long long krows = (long long)s->B * s->H_kv * s->N_k;
        const uint64_t key_seed = o->seed ^ 0x9e3779b97f4a7c15ull;
        long long *qr = o->cu_q ? sequence_rows_to_check(o, 0, o->seed, &nq)
                                : rows_to_check(o, qrows, o->seed, &nq);
        long long *kr = o->cu_q ? sequence_rows_to_check(o, 1, key_seed, &nk)
                                : rows_to_check(o, krows, key_seed, &nk);
        const ref_shape rs = checker_shape(o);
        check_gradients(&rs, store_of(s), in->Qf, in->Kf, in->Vf, in->dOf, O, lse, grad[0], grad[1],
                        grad[2], qr, nq, kr, nk, &r->gchk);
        r->gchecked = 1;
        free(qr), free(kr);
    }
    for (int t = 0; t < 3; t++) free_download(grad[t], raw[t]);
    return ms;
}

/* The device buffers of one run (the backward's only for a stage with a backward pass; a packed
 * batch's sequences, and its outputs PACKED_SLACK_ROWS longer: alloc_of), each as long as its
 * layout spans, the inputs copied in. 0, or -1 when the device is out of memory (what
 * is allocated stays in b). */
static int alloc_buffers(const options *o, gpu_ctx *g, const host_inputs *in, void *b[BUFS],
                         run_result *r) {
    const attn_shape *s = &o->shape;
    const int bwd = has_backward(o), empty = attn_packed_empty(s); /* empty: no stage runs */
    const size_t esz = esz_of(), sequences = o->cu_q ? (size_t)(s->B + 1) * sizeof(int) : 0;
    const char *what[BUFS] = {"Q",
                              "K",
                              "V",
                              "O",
                              "lse",
                              "workspace",
                              "dO",
                              "dQ",
                              "dK",
                              "dV",
                              "the backward's workspace",
                              "cu_seqlens_q",
                              "cu_seqlens_k"};
    size_t bytes[BUFS];
    for (int i = 0; i < BUFS; i++)
        bytes[i] = (i >= BUF_DO && i <= BUF_BWS && !bwd) || ((i == BUF_WS || i == BUF_BWS) && empty)
                       ? 0
                   : i == BUF_LSE ? lse_alloc(o) * sizeof(float)
                   : i == BUF_WS  ? attn_this_stage.workspace_bytes(s, &g->dev, o->variant)
                   : i == BUF_BWS ? attn_this_stage.backward_workspace_bytes(s, &g->dev, o->variant)
                   : i == BUF_CU_Q || i == BUF_CU_K ? sequences
                                                    : alloc_of(o, i) * esz;
    for (int i = 0; i < BUFS; i++)
        if (dev_alloc(&b[i], bytes[i], what[i], &r->device_mb) != 0) return -1;
    if (sequences) {
        CUDA_CHECK(cudaMemcpy(b[BUF_CU_Q], o->cu_q, sequences, cudaMemcpyHostToDevice));
        CUDA_CHECK(cudaMemcpy(b[BUF_CU_K], o->cu_k, sequences, cudaMemcpyHostToDevice));
    }
    void *const host[4] = {in->Qs, in->Ks, in->Vs, in->dOs};
    const int bufs[4] = {BUF_Q, BUF_K, BUF_V, BUF_DO};
    for (int t = 0; t < (bwd ? 4 : 3); t++) {
        if (!bytes[bufs[t]]) continue; /* a packed batch's side without a token */
        void *img = malloc(bytes[bufs[t]]);
        if (!img) die_host_oom("the device image of an input");
        memset(img, 0, bytes[bufs[t]]); /* a strided layout's gaps */
        move_rows(o, bufs[t], host[t], img, ROWS_SCATTER);
        CUDA_CHECK(cudaMemcpy(b[bufs[t]], img, bytes[bufs[t]], cudaMemcpyHostToDevice));
        free(img);
    }
    return 0;
}

/* The forward's O and LSE to the host: written where asked, checked against the float64
 * reference, then the backward pass (a stage with one) given them. The passes' first times. */
static void check_outputs(const options *o, gpu_ctx *g, const host_inputs *in, void *const b[BUFS],
                          double first_ms[PASSES], run_result *r) {
    const attn_shape *s = &o->shape;
    const int bwd = has_backward(o);
    const long long rows = (long long)s->B * s->H * s->N;
    const int need_out = o->check_rows != 0 || o->outpath || o->lsepath;
    if (!need_out && !(bwd && (o->dqpath || o->dkpath || o->dvpath))) {
        if (bwd) first_ms[PASS_BWD] = run_backward(o, g, in, b, NULL, NULL, r);
        return;
    }
    void *raw;
    long long lse_stray;
    float *O = download(o, b[BUF_O], BUF_O, &raw, &r->stray);
    float *lse = download_lse(o, b[BUF_LSE], &lse_stray);
    r->stray += lse_stray;
    write_tensor("--out", o->outpath, o, BUF_O, O, raw);
    long long shp[3] = {s->B, s->H, s->N}, packed_shp[2] = {s->H, s->varlen.total_q};
    write_npy("--lse", o->lsepath, NPY_F32, o->cu_q ? 2 : 3, o->cu_q ? packed_shp : shp, lse);
    float *lse_c = checker_lse(o, lse);
    if (o->check_rows != 0) {
        long long nr;
        long long *rl = o->cu_q ? sequence_rows_to_check(o, 0, o->seed, &nr)
                                : rows_to_check(o, rows, o->seed, &nr);
        const ref_shape rs = checker_shape(o);
        check_output(&rs, store_of(s), in->Qf, in->Kf, in->Vf, O, lse_c, rl, nr, &r->chk);
        r->checked = 1;
        free(rl);
    }
    if (bwd) first_ms[PASS_BWD] = run_backward(o, g, in, b, O, lse_c, r);
    free_download(O, raw);
    if (lse_c != lse) free(lse_c);
    free(lse);
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
        if (p != PASS_FWD && !has_backward(o)) continue;
        if (first_ms[p] > o->budget_s * 1000.0) {
            r->status = "over_budget";
        } else if (o->bench && !(p == PASS_FWD && !own_forward())) {
            const pass_call call = {o, b, (pass_kind)p};
            bench(g, o->bench, enqueue_pass, &call, first_ms[p], t);
        }
        t->tflops = pass_flops[p] * flops / (t->ms_median * 1e-3) / 1e12;
    }
}

/* One run: allocate, run once on poisoned output, check, then time. Returns an exit code. */
static int run_case(const options *o, gpu_ctx *g, const host_inputs *in, run_result *r) {
    memset(r, 0, sizeof *r);
    r->status = "ok";
    const char *why = attn_shape_refused(&o->shape, attn_this_stage.takes, 0);
    if (!why && has_backward(o))
        why = attn_shape_refused(&o->shape, attn_this_stage.backward_takes, 1);
    if (!why) why = stage_unsupported(&o->shape, &g->dev, o->variant);
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
        poison(b[BUF_O], alloc_of(o, BUF_O) * esz_of());
        poison(b[BUF_LSE], lse_alloc(o) * sizeof(float));
        double first_ms[PASSES] = {timed_launch(g, o, b, PASS_FWD), 0, 0};
        check_outputs(o, g, in, b, first_ms, r);
        if ((r->checked && !r->chk.pass) || (r->gchecked && !r->gchk.pass) || r->stray) {
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
static int reported(const options *o, pass_kind p) {
    return p == PASS_FWD ? own_forward() : has_backward(o);
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
        if (!reported(o, (pass_kind)p)) continue;
        const timing *t = &r->t[p];
        printf("%s,%s,%s,%s,%d,%d,%d,%d,%d,%s,", g ? g->name : "none", attn_this_stage.name, vname,
               pass_names[p], s->B, s->H, s->N, s->D, s->causal,
               store_of(s) == STORE_BF16  ? "bf16"
               : store_of(s) == STORE_F16 ? "f16"
                                          : "f32");
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
    fprintf(f, "%s %s B=%d H=%d N=%d D=%d%s%s", attn_this_stage.name, vname, s->B, s->H, s->N, s->D,
            s->causal ? " causal" : "", o->peaky ? " peaky" : "");
    if (s->H_kv != s->H) fprintf(f, " H_kv=%d", s->H_kv);
    if (s->N_k != s->N) fprintf(f, " N_k=%d", s->N_k);
    if (s->bf16) fprintf(f, " bf16");
    if (o->layout != LAYOUT_BHND || o->cu_q) fprintf(f, " layout=%s", layout_names[o->layout]);
    if (s->local) fprintf(f, " window=%d,%d", s->window_left, s->window_right);
    if (s->softcap > 0) fprintf(f, " softcap=%g", (double)s->softcap);
    if (o->cu_q) /* the list as --varlen takes it back (random: its seed's) */
        fprintf(f, " varlen=%s (total_q=%d total_k=%d)", o->varlen, s->varlen.total_q,
                s->varlen.total_k);
    fprintf(f, ":");
    if (r->stray) fprintf(f, " %lld bytes written outside the outputs' elements,", r->stray);
    if (!strcmp(r->status, "ok") || !strcmp(r->status, "over_budget")) {
        for (int p = 0; p < PASSES; p++) {
            if (!reported(o, (pass_kind)p)) continue;
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
    memset(&o.shape, 0, sizeof o.shape);
    o.shape.B = self_test_BH[bh][0], o.shape.H = self_test_BH[bh][1], o.shape.N = self_test_N[ni];
    o.shape.D = D, o.shape.causal = causal, o.shape.scale = 1.0f / sqrtf((float)D);
    o.layout = LAYOUT_BHND;
    set_layout(&o);
    o.variant = v;
    o.peaky = peaky;
    o.bench = BENCH_NONE;
    o.seed = base->seed * 1000003ull + case_no;
    long long rows = (long long)o.shape.B * o.shape.H * o.shape.N;
    o.check_rows = rows <= SELF_TEST_FULL_ROWS ? -1 : SELF_TEST_SAMPLE;
    return o;
}

/* What models feed, for a stage whose descriptor takes it: keys N_k, queries N_q in {1, 17,
 * N_k / 2, N_k, 2 N_k}, D, causal, bf16 and fp16; per case (H, H_kv) (GQA ratios 1, 2, 8 = MQA,
 * and 3), the layout (contiguous, [B, N, H, D], fused QKV where the shapes allow it), B and the
 * distribution in turn. A case asking what the stage does not take is left out. */
static const int model_N_k[] = {17, 128, 1000};
static const int model_heads[][2] = {{8, 8}, {8, 4}, {8, 1}, {6, 2}};
#define MODEL_NQ 5
#define MODEL_FULL_ROWS 1024 /* what-models-feed cases check every row up to this many, else: */
#define MODEL_SAMPLE 128
#define MODEL_CASES (COUNT(model_N_k) * MODEL_NQ * COUNT(self_test_D) * 2 * 2)

static options model_case(const options *base, int v, int c, uint64_t case_no) {
    const int N_k = model_N_k[c % COUNT(model_N_k)], q = c / COUNT(model_N_k) % MODEL_NQ;
    const int rest = c / (COUNT(model_N_k) * MODEL_NQ);
    const int D = self_test_D[rest % COUNT(self_test_D)];
    const int causal = rest / COUNT(self_test_D) % 2, bf16 = rest / COUNT(self_test_D) / 2 % 2;
    const int N_q[MODEL_NQ] = {1, 17, N_k / 2, N_k, 2 * N_k};
    const int *heads = model_heads[c % COUNT(model_heads)];
    options o = *base;
    memset(&o.shape, 0, sizeof o.shape);
    o.shape = (attn_shape){.B = 1 + c % 2,
                           .H = heads[0],
                           .N = N_q[q],
                           .D = D,
                           .causal = causal,
                           .scale = 1.0f / sqrtf((float)D),
                           .H_kv = heads[1],
                           .N_k = N_k,
                           .bf16 = bf16};
    o.layout = (layout_kind)(c / COUNT(model_heads) % LAYOUTS);
    if (o.layout == LAYOUT_QKV && (heads[1] != heads[0] || N_q[q] != N_k)) o.layout = LAYOUT_BNHD;
    set_layout(&o);
    o.variant = v;
    o.peaky = c / 2 % 2;
    o.bench = BENCH_NONE;
    o.seed = base->seed * 1000003ull + case_no;
    /* a key row's gradient sums over its group's query heads: a smaller sample than the matrix's */
    long long rows = (long long)o.shape.B * o.shape.H * o.shape.N;
    o.check_rows = rows <= MODEL_FULL_ROWS ? -1 : MODEL_SAMPLE;
    return o;
}

/* Local windows and softcap, for a stage whose descriptor takes them: keys N_k from a tile's
 * edges to past 2,000 (N_k = 1 included), D 64 and 128, and per N_k and D each of the masks and
 * caps below: the six windows (-1: unbounded) without causal, two with causal (their right bound
 * becomes 0), a softcap of 30, 50 or 5 (the inputs peaky, so that the cap bites) alone, with a
 * window, and 5 alone, causal or not. Per case in turn, as the models-feed cases: the queries
 * N_q in {1, 17, N_k / 2, N_k, 2 N_k} (rows of no key when N_q > N_k and the window is narrow),
 * (H, H_kv), bf16, the layout, B. A case asking what the stage does not take is left out. */
static const int local_N_k[] = {1, 63, 64, 65, 129, 1000, 2047};
static const int local_windows[][3] = {/* left, right, causal */
                                       {0, 0, 0}, {127, 0, 0},  {1000, 1000, 0}, {-1, 64, 0},
                                       {3, 5, 0}, {16, 300, 0}, {127, 9, 1},     {1000, 33, 1}};
static const float local_softcaps[] = {30.f, 50.f, 5.f};
#define LOCAL_WINDOWS 8 /* rows of local_windows */
#define LOCAL_MASKS 11  /* the windows, then a softcap alone, with a window, and 5 alone */
#define LOCAL_CASES (COUNT(local_N_k) * COUNT(self_test_D) * LOCAL_MASKS)

static options local_case(const options *base, int v, int c, uint64_t case_no) {
    const int N_k = local_N_k[c % COUNT(local_N_k)];
    const int D = self_test_D[c / COUNT(local_N_k) % COUNT(self_test_D)];
    const int mask = c / (COUNT(local_N_k) * COUNT(self_test_D));
    const int half = N_k / 2 > 0 ? N_k / 2 : 1, N_q[MODEL_NQ] = {1, 17, half, N_k, 2 * N_k};
    const int *heads = model_heads[c % COUNT(model_heads)];
    /* the window: one of the list (mask < LOCAL_WINDOWS), one in turn (a softcap with a window),
     * or none */
    const int w = mask < LOCAL_WINDOWS        ? mask
                  : mask == LOCAL_WINDOWS + 1 ? c / 2 % LOCAL_WINDOWS
                                              : -1;
    const int capped = mask >= LOCAL_WINDOWS;
    options o = *base;
    memset(&o.shape, 0, sizeof o.shape);
    o.shape = (attn_shape){.B = 1 + c % 2,
                           .H = heads[0],
                           .N = N_q[c % MODEL_NQ],
                           .D = D,
                           .causal = w >= 0 ? local_windows[w][2] : (c + c / 7) % 2,
                           .scale = 1.0f / sqrtf((float)D),
                           .H_kv = heads[1],
                           .N_k = N_k,
                           .bf16 = c / 3 % 2,
                           .local = w >= 0,
                           .window_left = w >= 0 ? local_windows[w][0] : 0,
                           .window_right = w >= 0 ? local_windows[w][1] : 0,
                           .softcap = !capped                   ? 0.f
                                      : mask == LOCAL_MASKS - 1 ? 5.f
                                                                : local_softcaps[c % 3]};
    o.layout = (layout_kind)(c / COUNT(model_heads) % LAYOUTS);
    if (o.layout == LAYOUT_QKV && (heads[1] != heads[0] || o.shape.N != N_k))
        o.layout = LAYOUT_BNHD;
    set_layout(&o);
    o.variant = v;
    o.peaky = capped || c / 2 % 2;
    o.bench = BENCH_NONE;
    o.seed = base->seed * 1000003ull + case_no;
    long long rows = (long long)o.shape.B * o.shape.H * o.shape.N;
    o.check_rows = rows <= MODEL_FULL_ROWS ? -1 : MODEL_SAMPLE;
    return o;
}

/* Whether the stage takes a case's inputs (its descriptor's takes, both passes). */
static int stage_takes(const options *o) {
    return !attn_shape_refused(&o->shape, attn_this_stage.takes, 0) &&
           !(has_backward(o) && attn_shape_refused(&o->shape, attn_this_stage.backward_takes, 1));
}

/* What both passes of the stage take beyond the plain case (ATTN_TAKES_*). */
static unsigned stage_takes_bits(void) {
    return attn_this_stage.takes &
           (attn_this_stage.backward ? attn_this_stage.backward_takes : ~0u);
}

/* Head dims besides the standard matrix's 64 and 128, for every stage: each D of the list, N in
 * {1, 63, 64, 65, 129, 1000} (queries, and keys unless the case turns N_k != N), causal and not.
 * Per case in turn, where the stage takes them (so that a stage of the plain case runs every D
 * plainly): bf16, (H, H_kv) (GQA), N_k != N, the layout, a local window (one of the list, sized
 * to bite at these N; -1: unbounded); B and the distribution too. A D the stage did not compile its
 * unsupported() refuses: the case is waived. */
static const int head_dim_D[] = {32, 40, 80, 96, 104, 160, 192, 256};
static const int head_dim_N[] = {1, 63, 64, 65, 129, 1000};
static const int head_dim_windows[][2] = {{0, 0}, {3, 5}, {16, 7}, {31, 0}, {-1, 8}, {100, 17}};
#define HEAD_DIM_CASES (COUNT(head_dim_D) * COUNT(head_dim_N) * 2)

static options head_dim_case(const options *base, int v, int c, uint64_t case_no) {
    const int N = head_dim_N[c % COUNT(head_dim_N)], causal = c / COUNT(head_dim_N) % 2;
    const int j = c / (COUNT(head_dim_N) * 2), D = head_dim_D[j];
    const unsigned takes = stage_takes_bits();
    /* the rotations: each shifted by the D's index j, so that a (N, causal) pair meets them in
     * turn across the head dims */
    const int *heads = model_heads[(takes & ATTN_TAKES_GQA) ? (c + j) % COUNT(model_heads) : 0];
    const int other_keys = (takes & ATTN_TAKES_N_K) && (c + 2 * j) % 3 == 2;
    const int window = (takes & ATTN_TAKES_LOCAL) && (c + j) % 3 == 1;
    const int *w = head_dim_windows[c / 3 % COUNT(head_dim_windows)];
    options o = *base;
    memset(&o.shape, 0, sizeof o.shape);
    o.shape = (attn_shape){.B = 1 + (c + j) % 2,
                           .H = heads[0],
                           .N = N,
                           .D = D,
                           .causal = causal,
                           .scale = 1.0f / sqrtf((float)D),
                           .H_kv = heads[1],
                           .N_k = !other_keys ? N
                                  : N > 64    ? N / 2 + 1
                                              : N + 37,
                           .bf16 = (takes & ATTN_TAKES_BF16) && (c / 2 + j) % 2,
                           .local = window,
                           .window_left = window ? w[0] : 0,
                           .window_right = window ? w[1] : 0};
    o.layout = (takes & ATTN_TAKES_STRIDES) ? (layout_kind)((c / 4 + j) % LAYOUTS) : LAYOUT_BHND;
    if (o.layout == LAYOUT_QKV && (heads[1] != heads[0] || o.shape.N_k != N))
        o.layout = LAYOUT_BNHD;
    set_layout(&o);
    o.variant = v;
    o.peaky = c / 7 % 2;
    o.bench = BENCH_NONE;
    o.seed = base->seed * 1000003ull + case_no;
    long long rows = (long long)o.shape.B * o.shape.H * o.shape.N;
    o.check_rows = rows <= MODEL_FULL_ROWS ? -1 : MODEL_SAMPLE;
    return o;
}

/* Wide grids, for a stage with a backward pass: more (batch, key/value head) pairs than a GPU has
 * multiprocessors (B = 2, 160 key/value heads: 320 pairs, past any GPU's 148), so that a grid
 * holding one block per multiprocessor takes several work tiles per block (stage 8's persistent
 * grid; its short walks: N <= 300, so at most five query tiles a key tile), D 64 and 128, causal
 * and not. Per case in turn, where the stage takes them: query heads 160 or 320 (GQA 2), N_k != N,
 * bf16, the layout, the distribution. Rows sampled as the models-feed cases'. */
static const int wide_N[] = {65, 300};
#define WIDE_B 2
#define WIDE_KV_HEADS 160
#define WIDE_CASES (COUNT(wide_N) * COUNT(self_test_D) * 2)

/* A grid case (wide grids, grids past whole waves): `shape` with the layout case c picks (where
 * the stage takes strides; the packed one only for one head group and N_k = N), the variant, the
 * distribution, and rows sampled as the models-feed cases'. */
static options grid_case(const options *base, int v, int c, uint64_t case_no, attn_shape shape,
                         int peaky) {
    options o = *base;
    o.shape = shape;
    o.layout = (stage_takes_bits() & ATTN_TAKES_STRIDES) ? (layout_kind)(c % LAYOUTS) : LAYOUT_BHND;
    if (o.layout == LAYOUT_QKV && (shape.H != shape.H_kv || shape.N_k != shape.N))
        o.layout = LAYOUT_BNHD;
    set_layout(&o);
    o.variant = v;
    o.peaky = peaky;
    o.bench = BENCH_NONE;
    o.seed = base->seed * 1000003ull + case_no;
    o.check_rows = MODEL_SAMPLE;
    return o;
}

static options wide_case(const options *base, int v, int c, uint64_t case_no) {
    const int N = wide_N[c % COUNT(wide_N)], causal = c / COUNT(wide_N) % 2;
    const int D = self_test_D[c / (COUNT(wide_N) * 2) % COUNT(self_test_D)];
    const unsigned takes = stage_takes_bits();
    const int group = (takes & ATTN_TAKES_GQA) && c % 3 != 1 ? 2 : 1;
    const int other_keys = (takes & ATTN_TAKES_N_K) && c % 3 != 0;
    const attn_shape shape = {.B = WIDE_B,
                              .H = group * WIDE_KV_HEADS,
                              .N = N,
                              .D = D,
                              .causal = causal,
                              .scale = 1.0f / sqrtf((float)D),
                              .H_kv = WIDE_KV_HEADS,
                              .N_k = other_keys ? N + N / 2 + 3 : N,
                              .bf16 = (takes & ATTN_TAKES_BF16) && c / 2 % 2};
    return grid_case(base, v, c, case_no, shape, c / 4 % 2);
}

/* Grids just past whole waves, for a stage with a backward pass: B = 2, 68 key/value heads (136
 * pairs, a part of a wave past 132 or 114 multiprocessors, whole Hoppers' and PCIe's), one or two
 * key tiles each (N_k 128, 200), N = 4,100 queries (long walks: no persistent grid), no mask: the
 * grid of whole walks ends on a part-filled wave, where stage 8 splits the last walks (its tail
 * split, at D = 64 and 128). Head dims 64, 96, 128 and 256; per head dim, case 0 fp16 with N_k
 * 128, case 1 GQA 2 with N_k 200 in bf16 (where the stage takes them), the layout and the
 * distribution in turn. Rows sampled as the models-feed cases'. */
static const int tail_D[] = {64, 96, 128, 256};
#define TAIL_B 2
#define TAIL_KV_HEADS 68
#define TAIL_N 4100
#define TAIL_CASES (COUNT(tail_D) * 2)

static options tail_case(const options *base, int v, int c, uint64_t case_no) {
    const int D = tail_D[c / 2 % COUNT(tail_D)], second = c % 2;
    const unsigned takes = stage_takes_bits();
    const int group = (takes & ATTN_TAKES_GQA) && second ? 2 : 1;
    const attn_shape shape = {.B = TAIL_B,
                              .H = group * TAIL_KV_HEADS,
                              .N = TAIL_N,
                              .D = D,
                              .causal = 0,
                              .scale = 1.0f / sqrtf((float)D),
                              .H_kv = TAIL_KV_HEADS,
                              .N_k = (takes & ATTN_TAKES_N_K) ? (second ? 200 : 128) : TAIL_N,
                              .bf16 = (takes & ATTN_TAKES_BF16) && second};
    return grid_case(base, v, c, case_no, shape, c / 2 % 2);
}

/* Packed batches (--varlen), for a stage whose descriptor takes them: the lists below (lengths 1
 * to 5,000; sequences without queries and without keys; more keys than queries and fewer; tile
 * edges), each with every mask and cap: none, causal, the windows (0, 0), (127, 0), (1000, 1000),
 * (-1, 64), softcap 30 (causal in turn), softcap 50 with a window in turn; twice, with two of
 * the head dims 64, 96, 128, 256, so that each list meets each D four times and each mask every
 * D. Per case in turn: (H, H_kv) (fewer heads beside the long sequences: the float64 reference's
 * cost), bf16, the layout (packed [total, H, D], [H, total, D], fused [total, 3, H, D] where
 * every sequence has as many keys as queries and H_kv = H, else [H, total, D]; such a case
 * takes it for [total, H, D] too), the distribution. Then the batches with nothing to compute (no
 * query; no key: no stage runs). A case the stage's backward does not take runs its forward alone.
 * Every row is checked up to PACKED_FULL_PAIRS (query, key) pairs x heads, else PACKED_SAMPLE rows
 * spread over the sequences and every head's first and last row of each (where a tile written past
 * a sequence's end lands). */
static const char *const packed_lists[] = {
    "1,0,17,63,64,65,0:9,127,128,129,5:0,2", "5000,1,0,300,1000,2",
    "127:200,200:127,64:65,1:1000,1000:1,0:0,333:334,48:16",
    "731:1520,0:12,2047:2047,45:0,1500:731,12:45,260:259,1:1,0:0,64:64,177:90,31:32"};
static const int packed_long[] = {0, 1, 0, 1}; /* the lists with sequences over 1,000 */
static const int packed_long_heads[][2] = {{4, 4}, {4, 2}, {4, 1}, {2, 1}};
static const char *const packed_empty[] = {"0,0,0", "5:0,3:0,0", "0:4,0:9"};
static const int packed_D[] = {64, 96, 128, 256};
static const int packed_windows[][2] = {{0, 0}, {127, 0}, {1000, 1000}, {-1, 64}};
#define PACKED_MASKS 8  /* none, causal, the four windows, softcap 30, softcap 50 with a window */
#define PACKED_PASSES 2 /* head dims per list and mask */
#define PACKED_LIST_CASES (COUNT(packed_lists) * PACKED_MASKS * PACKED_PASSES)
#define PACKED_CASES (PACKED_LIST_CASES + COUNT(packed_empty))
#define PACKED_FULL_PAIRS (1 << 17) /* (query, key) pairs x heads */
#define PACKED_SAMPLE 64

static options packed_case(const options *base, int v, int c, uint64_t case_no) {
    const int lists = COUNT(packed_lists), list = c % lists, empty = c >= PACKED_LIST_CASES;
    const int mask = empty ? 0 : c / lists % PACKED_MASKS, pass = c / (lists * PACKED_MASKS);
    /* the head dims of a (list, mask): two apart, so that every D meets every list and mask */
    const int D = packed_D[empty ? 0 : (mask + list + 2 * pass) % COUNT(packed_D)];
    const int w = mask >= 2 && mask < 6 ? mask - 2
                  : mask == 7           ? (list + pass) % COUNT(packed_windows)
                                        : -1;
    const int turn = (c + c / lists) % COUNT(model_heads);
    const int *heads = packed_long[list] && !empty ? packed_long_heads[turn] : model_heads[turn];
    options o = *base;
    memset(&o.shape, 0, sizeof o.shape);
    o.shape = (attn_shape){.B = 1,
                           .H = heads[0],
                           .N = 1,
                           .D = D,
                           .causal = mask == 1 || (mask == 6 && (list + pass) % 2),
                           .scale = 1.0f / sqrtf((float)D),
                           .H_kv = heads[1],
                           .bf16 = (c / 2 + mask) % 2,
                           .local = w >= 0,
                           .window_left = w >= 0 ? packed_windows[w][0] : 0,
                           .window_right = w >= 0 ? packed_windows[w][1] : 0,
                           .softcap = mask == 6   ? 30.f
                                      : mask == 7 ? 50.f
                                                  : 0.f};
    o.varlen = empty ? packed_empty[c - PACKED_LIST_CASES] : packed_lists[list];
    o.given_B = o.given_N = o.given_N_k = 0;
    o.given_layout = 1, o.layout = LAYOUT_BNHD;
    setup_varlen(&o);
    int same = heads[0] == heads[1];
    for (int b = 0; b < o.shape.B; b++) same &= o.cu_q[b + 1] == o.cu_k[b + 1];
    o.layout = (layout_kind)((c / 3 + list) % LAYOUTS);
    if (o.layout == LAYOUT_QKV && !same) o.layout = LAYOUT_BHND;
    if (o.layout == LAYOUT_BNHD && same) o.layout = LAYOUT_QKV; /* (few cases can have it) */
    set_layout(&o);
    o.variant = v;
    o.peaky = o.shape.softcap > 0 || c / 4 % 2;
    o.bench = BENCH_NONE;
    o.seed = base->seed * 1000003ull + case_no;
    double pairs = 0;
    for (int b = 0; b < o.shape.B; b++)
        pairs += (double)o.shape.H * (o.cu_q[b + 1] - o.cu_q[b]) * (o.cu_k[b + 1] - o.cu_k[b]);
    o.check_rows = pairs <= PACKED_FULL_PAIRS ? -1 : PACKED_SAMPLE;
    o.check_edges = 1;
    return o;
}

/* What a case allocated (a packed batch's sequences). */
static void release_case(options *o) {
    free(o->cu_q), free(o->cu_k);
    o->cu_q = o->cu_k = NULL;
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
    attn_shape probe = {.B = 1, .H = 1, .N = 128, .D = 64, .scale = 0.125f};
    attn_shape_complete(&probe);
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
        int vp = 0, vn = SELF_TEST_CASES;
        for (int c = 0; c < SELF_TEST_CASES; c++) {
            const options o = self_test_case(base, v, c, case_no++);
            vp += self_test_run(&o, g);
        }
        const struct {
            int count;
            options (*make)(const options *, int, int, uint64_t);
            const char *what;
            int forward_alone; /* a case the backward does not take: the forward alone */
        } groups[] = {
            {MODEL_CASES, model_case, "what models feed (bf16, GQA, strides, N_k != N)", 0},
            {LOCAL_CASES, local_case, "local windows and softcap", 0},
            {HEAD_DIM_CASES, head_dim_case, "head dims", 0},
            {attn_this_stage.backward ? WIDE_CASES : 0, wide_case, "wide grids", 0},
            {attn_this_stage.backward ? TAIL_CASES : 0, tail_case, "grids past whole waves", 0},
            {PACKED_CASES, packed_case, "packed batches (varlen)", 1}};
        for (int k = 0; k < COUNT(groups); k++) {
            int mp = 0, mn = 0, waived = 0;
            for (int c = 0; c < groups[k].count; c++) {
                options o = groups[k].make(base, v, c, case_no++);
                if (groups[k].forward_alone && !stage_takes(&o)) o.forward_only = 1;
                if (!stage_takes(&o)) {
                    release_case(&o);
                    continue;
                }
                const char *why = stage_unsupported(&o.shape, &g->dev, v);
                if (why) { /* a type this code path has no instruction for (bf16 on sm_75), a
                            * head dim the stage did not compile */
                    if (!waived++)
                        printf("%s variant %s: waived here: %s\n", attn_this_stage.name, vname,
                               why);
                    release_case(&o);
                    continue;
                }
                mn++, mp += self_test_run(&o, g);
                release_case(&o);
            }
            if (mn || waived)
                printf("%s variant %s, %s: %d passed, %d failed, %d waived\n", attn_this_stage.name,
                       vname, groups[k].what, mp, mn - mp, waived);
            vp += mp, vn += mn;
        }
        printf("%s variant %s: %d passed, %d failed\n", attn_this_stage.name, vname, vp, vn - vp);
        passed += vp, failed += vn - vp;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    printf("%s self-test on %s (smem/block %zu): %.1f s\n", attn_this_stage.name, g->name,
           g->dev.smem_per_block, (t1.tv_sec - t0.tv_sec) + 1e-9 * (t1.tv_nsec - t0.tv_nsec));
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? ATTN_EXIT_WRONG : ATTN_EXIT_PASS;
}

/* The decode path's options together: N_q (--seq) and N_max (--seq-k) with their defaults, the
 * new keys within N_max, Q and O [B, N_q, H, D], and no file (it makes its own inputs). */
static void check_decode_options(options *o) {
    attn_shape *s = &o->shape;
    const char *const names[] = {"--q",  "--k",  "--v",  "--out", "--lse",
                                 "--dO", "--dq", "--dk", "--dv"};
    const char *const paths[] = {o->qpath,  o->kpath,  o->vpath,  o->outpath, o->lsepath,
                                 o->dOpath, o->dqpath, o->dkpath, o->dvpath};
    for (int f = 0; f < COUNT(paths); f++)
        if (paths[f])
            die_usage(
                "%s: the decode path (--page-size, --ragged, --new-tokens) makes its own inputs "
                "and writes no file",
                names[f]);
    if (s->local || s->softcap > 0)
        die_usage("%s: the decode path takes no local window or softcap",
                  s->local ? "--window" : "--softcap");
    if (o->given_layout && o->layout != LAYOUT_BNHD)
        die_usage(
            "--layout: the decode path lays Q and O out [B, N_q, H, D] (bnhd) and the cache "
            "[B, N_max, H_kv, D] or in pages");
    if (!o->given_N)
        s->N = 1;
    else if (s->N > ATTN_MAX_DECODE_N)
        die_usage("--seq: %d queries per sequence; the decode path takes 1 to %d", s->N,
                  ATTN_MAX_DECODE_N);
    if (!s->N_k) s->N_k = DECODE_DEFAULT_N_MAX;
    if (o->N_new > s->N_k)
        die_usage("--new-tokens: %d is more than --seq-k %d, the keys a sequence can hold",
                  o->N_new, s->N_k);
    o->layout = LAYOUT_BNHD;
}

/* The options together: the shape's rules, the default scale, what --self-test takes, and the
 * output files writable before anything runs. */
static void check_options(options *o) {
    attn_shape *s = &o->shape;
    if (o->decode) check_decode_options(o);
    if (o->varlen && !o->self_test) setup_varlen(o); /* (the self-test refuses it below) */
    attn_shape rules = *s; /* the shape rules, on a packed batch's without a query too */
    if (rules.N < 1) rules.N = 1;
    if (!attn_head_dim_ok(s->D))
        die_usage("--dim: %d is not a head dim (" ATTN_HEAD_DIMS ")", s->D);
    if (attn_shape_check(&rules) == ATTN_SHAPE_BH)
        die_usage("--batch x --heads: %lld is over %d%s", (long long)s->B * s->H, ATTN_MAX_BH,
                  o->cu_q ? " (--varlen's sequences x --heads)" : "");
    if (!o->given_scale) s->scale = 1.0f / sqrtf((float)s->D);
    if (attn_shape_check(&rules) == ATTN_SHAPE_KV_HEADS)
        die_usage(
            "--kv-heads: %d does not divide --heads %d (each key/value head serves H / H_kv "
            "query heads)",
            s->H_kv, s->H);
    if (o->layout == LAYOUT_QKV && ((s->H_kv && s->H_kv != s->H) || (s->N_k && s->N_k != s->N)))
        die_usage(
            "--layout qkv: one fused projection has as many key/value heads and keys as "
            "queries (no --kv-heads or --seq-k)");
    if ((s->H_kv || s->N_k) && (o->kpath || o->vpath))
        die_usage("--k/--v files take the queries' heads and tokens (no --kv-heads or --seq-k)");
    set_layout(o);
    if (o->self_test && (o->qpath || o->kpath || o->vpath || o->outpath || o->lsepath ||
                         o->dOpath || o->dqpath || o->dkpath || o->dvpath))
        die_usage(
            "--self-test makes its own inputs; it takes no --q/--k/--v/--out/--lse/--dO/--dq/"
            "--dk/--dv");
    if (o->self_test && o->given_run)
        die_usage(
            "--self-test runs its own shapes and checks every row; it takes no --batch, "
            "--heads, --seq, --dim, --causal, --scale, --kv-heads, --seq-k, --dtype, --layout, "
            "--window, --softcap, --varlen, --dist, --check, --bench, --budget, --csv, "
            "--page-size, --ragged, --new-tokens");
    if (o->outpath) check_writable("--out", o->outpath);
    if (o->lsepath) check_writable("--lse", o->lsepath);
    if (o->dqpath) check_writable("--dq", o->dqpath);
    if (o->dkpath) check_writable("--dk", o->dkpath);
    if (o->dvpath) check_writable("--dv", o->dvpath);
}

/* The decode path (--page-size, --ragged, --new-tokens; common/decode.c): one call made, checked,
 * timed and described; its CSV row is the forward's, N being N_q. */
static int run_decode(const options *o, gpu_ctx *g) {
    const decode_options d = {.shape = o->shape,
                              .page_size = o->page_size,
                              .ragged = o->ragged,
                              .max_len = o->shape.N_k - o->N_new,
                              .N_new = o->N_new,
                              .seed = o->seed,
                              .peaky = o->peaky,
                              .check_rows = o->check_rows,
                              .bench = o->bench,
                              .budget_s = o->budget_s,
                              .variant = o->variant};
    decode_result dr;
    const int rc = decode_run(&d, g, &dr);
    if (rc == ATTN_EXIT_UNSUPPORTED) fprintf(stderr, "%s: unsupported here: %s\n", prog, dr.why);
    if (rc == ATTN_EXIT_WRONG) fprintf(stderr, "%s: FAIL: %s\n", prog, dr.why);
    decode_describe(o->csv ? stderr : stdout, &d, &dr);
    if (o->csv) {
        run_result r = {
            .status = dr.status, .chk = dr.chk, .checked = dr.checked, .device_mb = dr.device_mb};
        r.t[PASS_FWD] = dr.t;
        print_csv(o, g, &r);
    }
    return rc;
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
    if (o.self_test && attn_this_stage.decode) /* a decode stage's own matrix */
        return decode_self_test(&g, o.seed, o.variant_given ? o.variant : -1);
    if (o.self_test) return self_test(&o, &g);
    if (o.decode) return run_decode(&o, &g);

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
