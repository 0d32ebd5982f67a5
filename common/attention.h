/*
 * attention.h: the contract between the one host program (common/main.c) and a stage.
 *
 * Every stage's attention.cu defines `attn_this_stage` and nothing else is exported.
 * The host program owns inputs, outputs, checking and timing; a stage owns the algorithm.
 *
 * Layouts (row-major, contiguous):
 *   Q, K, V, O : [B, H, N, D]  in the stage's storage type (float or IEEE half)
 *   lse        : [B, H, N]     float32, natural log: LSE_i = m_i + log(l_i), where m_i is the
 *                              row maximum of scale * q_i . k_j over the keys the row attends to
 * Causal means query i attends to keys j <= i (same N for queries and keys).
 */
#ifndef ATTENTION_H
#define ATTENTION_H

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int B, H, N, D; /* batch, heads, tokens, head dim */
    int causal;     /* 1: query i sees keys 0..i */
    float scale;    /* softmax scale, 1/sqrt(D) unless given */
} attn_shape;

typedef struct {
    int cc;                /* compute capability as major*10+minor, e.g. 75, 89, 90 */
    size_t smem_per_block; /* opt-in dynamic shared memory per block; lowered by --smem-limit */
    int sm_count;          /* multiprocessors */
} attn_device;

typedef enum { ATTN_F32 = 0, ATTN_F16 = 1 } attn_dtype;

typedef struct {
    const char *name;     /* "stage3_cp_async" */
    const char *adds;     /* one line: what this stage adds over the previous one */
    attn_dtype dtype;     /* storage type of Q, K, V, O */
    const char *variants; /* comma-separated; index 0 is always "default", the rest switch
                             this stage's lesson off ("default,sync") */
    /* NULL if the shape runs here, else a short reason (exit code 3, status "unsupported") */
    const char *(*unsupported)(const attn_shape *s, const attn_device *dev, int variant);
    /* device scratch the forward pass needs (0 for fused stages); allocated by the host */
    size_t (*workspace_bytes)(const attn_shape *s, const attn_device *dev, int variant);
    /* enqueue the whole forward pass on `stream`; returns the first CUDA error, if any */
    cudaError_t (*forward)(const attn_shape *s, const attn_device *dev, const void *Q,
                           const void *K, const void *V, void *O, float *lse, void *workspace,
                           int variant, cudaStream_t stream);
    /* Optional, NULL in forward-only stages: the backward pass. From the forward's inputs, its
     * outputs O and lse, and dO = dLoss/dO ([B, H, N, D], storage type), compute dQ, dK, dV
     * ([B, H, N, D], storage type). The workspace is zeroed by nobody: the stage clears what
     * it needs itself, on `stream`. The same variant index is passed to both passes. */
    size_t (*backward_workspace_bytes)(const attn_shape *s, const attn_device *dev, int variant);
    cudaError_t (*backward)(const attn_shape *s, const attn_device *dev, const void *Q,
                            const void *K, const void *V, const void *O, const float *lse,
                            const void *dO, void *dQ, void *dK, void *dV, void *workspace,
                            int variant, cudaStream_t stream);
} attn_stage;

/* The one reader of a stage's `variants` list ("default,nopad"): the program and the library
 * both go through these (the Python binding reads the names from the descriptor). */
static inline int attn_variant_count(const char *list) {
    int n = 1;
    for (const char *p = list; *p; p++) n += *p == ',';
    return n;
}

/* The index of `name` in the list, or -1. */
static inline int attn_variant_index(const char *list, const char *name) {
    size_t n = strlen(name);
    int idx = 0;
    for (const char *p = list; *p; idx++) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == n && strncmp(p, name, n) == 0) return idx;
        if (!e) break;
        p = e + 1;
    }
    return -1;
}

/* The name at `idx` into buf[len] (truncated; empty when there is no such variant). */
static inline void attn_variant_name(const char *list, int idx, char *buf, size_t len) {
    const char *p = list;
    for (int i = 0; i < idx && p; i++) {
        p = strchr(p, ',');
        if (p) p++;
    }
    const char *e = p ? strchr(p, ',') : NULL;
    size_t n = p ? (e ? (size_t)(e - p) : strlen(p)) : 0;
    if (n >= len) n = len - 1;
    memcpy(buf, p ? p : "", n);
    buf[n] = 0;
}

/* The one home of the exit codes: the program exits with them and the library returns them
 * (python/flashcourse reads them from the library: attn_lib_exit_codes). */
typedef enum {
    ATTN_EXIT_PASS = 0,        /* ran, and the checked rows are right */
    ATTN_EXIT_WRONG = 1,       /* a wrong result, or a CUDA fault */
    ATTN_EXIT_USAGE = 2,       /* bad usage: an option, an input file, an argument */
    ATTN_EXIT_UNSUPPORTED = 3, /* no NVIDIA GPU, or a shape or variant this stage cannot run */
    ATTN_EXIT_OOM = 4          /* out of device or host memory */
} attn_exit;

/* The one home of the shape limits every stage accepts (the program, the library and the
 * binding check them before a stage sees the shape). */
#define ATTN_MAX_GRID_Y 65535       /* CUDA's limit on gridDim.y (and gridDim.z) */
#define ATTN_MAX_BH ATTN_MAX_GRID_Y /* B x H: grids put (batch, head) in blockIdx.y */
#define ATTN_MAX_N (1 << 30)        /* tokens */

extern const attn_stage attn_this_stage;

/* Inside a launcher: on error, name the call and where it was, and return the error so the
 * host program can report it (an out-of-memory is reported, not fatal to a sweep). */
#define ATTN_TRY(call)                                                           \
    do {                                                                         \
        cudaError_t attn_err_ = (call);                                          \
        if (attn_err_ != cudaSuccess) {                                          \
            fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call, \
                    cudaGetErrorString(attn_err_));                              \
            return attn_err_;                                                    \
        }                                                                        \
    } while (0)

#ifdef __cplusplus
}
#endif

#endif /* ATTENTION_H */
