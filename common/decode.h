/*
 * decode.h: the host program's decode path (common/decode.c), for a stage whose descriptor has
 * `decode`: new queries against a KV cache (attention.h's attn_cache). main.c parses the options
 * and calls decode_run or decode_self_test; both files share what is declared here: the CUDA
 * check, the GPU context, the timing protocol (main.c's: L2 flushed, CUDA events, median) and the
 * device allocator that reports an out-of-memory.
 */
#ifndef DECODE_H
#define DECODE_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "attention.h"
#include "common.h"

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

/* The program's GPU: what a stage sees of it, its name, and what the timing protocol uses. */
typedef struct {
    attn_device dev;
    char name[256];
    void *flush; /* written before every timed launch so no run starts with a warm L2 */
    size_t flush_bytes;
    cudaStream_t stream;
    cudaEvent_t start, stop;
} gpu_ctx;

typedef struct {
    double ms_median, ms_min, tflops;
    int repeats;
} timing;

/* ---- main.c's, for the decode path ---- */

/* What a timed launch enqueues on g->stream (arg: the caller's description of the call). */
typedef void (*enqueue_fn)(gpu_ctx *g, const void *arg);
/* How a run is timed: its first launch alone; --bench, the median of launches, each after an L2
 * flush; --bench-graph, tools/compare.py's protocol for the binding: CUDA graphs of back-to-back
 * calls, the L2 as the calls before left it. */
enum { BENCH_NONE, BENCH_LAUNCHES, BENCH_GRAPH };
/* One launch: the L2 flushed, then the call between CUDA events; its milliseconds. */
double time_launch(gpu_ctx *g, enqueue_fn call, const void *arg);
/* The median of repeated launches after a warm-up (the protocol's repeats and seconds; few
 * repeats when first_ms, the first launch's time, is long): ms_median, ms_min, repeats in *t. */
void bench_launches(gpu_ctx *g, enqueue_fn call, const void *arg, double first_ms, timing *t);
/* R back-to-back calls captured in a CUDA graph on g->stream, R for about GRAPH_MS a replay (from
 * first_ms, then from a replay's own time), replayed once untimed and GRAPH_REPLAYS times between
 * events: ms_median the median replay / R, ms_min the fastest / R, repeats R x GRAPH_REPLAYS. */
void bench_graph(gpu_ctx *g, enqueue_fn call, const void *arg, double first_ms, timing *t);
/* bench_launches or bench_graph, as `how` (BENCH_LAUNCHES or BENCH_GRAPH) says. */
void bench(gpu_ctx *g, int how, enqueue_fn call, const void *arg, double first_ms, timing *t);
/* cudaMalloc that reports, rather than dies, when the device is out of memory: 0, or -1 with a
 * line on stderr naming `what`. *total_mb adds the bytes. */
int dev_alloc(void **p, size_t bytes, const char *what, double *total_mb);
/* Out of host memory: one line naming `what`, exit ATTN_EXIT_OOM. */
void die_host_oom(const char *what);

/* ---- the decode path (decode.c) ---- */

/* One decode run: its shape and cache, and how it is checked and timed. */
typedef struct {
    attn_shape shape; /* B, H, N = N_q (new queries), D, causal, scale, H_kv (0: H), N_k = N_max
                         (the most keys a sequence holds: the plan's bound), bf16; the layouts are
                         set by the decode path: Q and O [B, N_q, H, D], the cache's */
    int page_size;    /* keys per page of a paged cache; 0: contiguous [B, N_max, H_kv, D] */
    int ragged;       /* 1: each sequence holds a random number of keys in [0, max_len] */
    int max_len;      /* keys every sequence holds before the call (ragged: at most) */
    int N_new;        /* keys and values the call writes into each sequence's cache */
    uint64_t seed;
    int peaky;            /* Q scaled by 8: each query attends sharply to a few keys */
    long long check_rows; /* query rows checked, over all sequences (-1: all; 0: no check) */
    int bench;            /* BENCH_NONE: the first run's time; else how it is repeated */
    double budget_s;      /* longer first run: over_budget, not repeated */
    int variant;
} decode_options;

typedef struct {
    const char *status; /* ok | FAIL | OOM | unsupported | over_budget (the CSV's) */
    char why[512];      /* unsupported: the reason; FAIL: what differed */
    timing t;
    long long keys;   /* keys the call attends over: the sum of L_b = seqlens[b] + N_new */
    double gbps;      /* bytes of K and V read from the cache per second, in 1e9 */
    check_result chk; /* O and LSE: the worst sequence's errors, rows and NaN/Inf summed */
    int checked;      /* O, LSE and the cache were checked */
    int worst_seq;    /* the sequence chk's errors come from */
    long long empty;  /* rows of sequences without keys that are not O = 0, LSE = -inf */
    long long k_diff; /* K cache elements that differ from what the call should leave */
    long long v_diff; /* V cache elements likewise */
    double device_mb; /* device memory of the run */
} decode_result;

/* Runs one decode call as the options say: the inputs made from the seed, the stage's decode on
 * NaN-poisoned outputs, O and LSE checked against the float64 reference per sequence and the cache
 * against what the call must leave in it, then timed. Returns an exit code of attention.h
 * (unsupported: r->why says why; wrong: r->why says what differed). */
int decode_run(const decode_options *d, gpu_ctx *g, decode_result *r);

/* The run in one line (shape, cache, time, GB/s, errors, status) on f. */
void decode_describe(FILE *f, const decode_options *d, const decode_result *r);

/* The decode self-test matrix on g (smem lowered by --smem-limit already), every variant or the
 * given one (variant < 0: every one), inputs from seed; ends with "N passed, M failed". Returns
 * an exit code (waived as a whole where the stage does not run here). */
int decode_self_test(gpu_ctx *g, uint64_t seed, int variant);

#endif /* DECODE_H */
