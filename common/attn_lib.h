/*
 * attn_lib.h: the C entry point of a stage library (build/lib/lib<stage>.so, `make lib`), as its
 * callers see it: common/attn_lib.c defines these calls, python/flashcourse mirrors the request
 * once in ctypes (_library.py: _Request) and the eager operator (python/flashcourse/_eager.cpp)
 * includes this header. No CUDA header is needed to read it.
 *
 *   attn_lib_abi          ATTN_LIB_ABI: a caller refuses a library of another version
 *   attn_lib_plan         every check the program makes before a pass, for one request (below);
 *                         on success the workspace the pass needs and, if the caller gives room
 *                         for one (attn_lib_plan_bytes), a plan: the checked facts, kept by the
 *                         caller and handed back to every run
 *   attn_lib_forward      the stage's forward() of a plan on the caller's pointers and stream
 *   attn_lib_backward     the stage's backward() of a plan, likewise
 *   attn_lib_last_error   the calling thread's last failure, one line
 *   attn_lib_exit_codes   "pass=<n>,wrong=<n>,usage=<n>,unsupported=<n>,oom=<n>": the return
 *                         codes by name, from the attn_exit enum of attention.h
 *   attn_lib_limits       "max_bh=<n>,max_n=<n>": the shape limits of attention.h by name (a
 *                         caller splits a call over them into calls under them)
 */
#ifndef ATTN_LIB_H
#define ATTN_LIB_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* 4: plans (attn_lib_plan once, attn_lib_forward / attn_lib_backward per call), errors by
 * attn_lib_last_error; 5: attn_lib_plan takes what models feed (H_kv, N_k, bf16, strides);
 * 6: attn_lib_plan takes one attn_lib_request; attn_lib_limits */
#define ATTN_LIB_ABI 6

enum { ATTN_LIB_FORWARD = 0, ATTN_LIB_BACKWARD = 1 }; /* attn_lib_request.pass */

/* One pass to plan: which pass, where, and the shape (attention.h's attn_shape, flattened). */
typedef struct {
    int pass;             /* ATTN_LIB_FORWARD or ATTN_LIB_BACKWARD */
    int device;           /* CUDA device index */
    long long smem_limit; /* > 0: shared memory per block lowered to this (65536: a T4's) */
    int B, H, N, D;       /* batch, query heads, queries, head dim */
    int causal;           /* 1: query i sees keys 0 .. i + N_k - N */
    float scale;          /* softmax scale */
    int variant;          /* index into the stage's variants */
    int H_kv, N_k;        /* key/value heads and keys (0: H and N) */
    int bf16;             /* 1: bfloat16 storage (a float16 stage that takes it) */
    /* {batch, head, row} of q, k, v, o, dO, dQ, dK, dV in elements; a tensor's three zero: its
     * contiguous layout */
    long long strides[24];
} attn_lib_request;

int attn_lib_abi(void);
size_t attn_lib_plan_bytes(void);
int attn_lib_plan(const attn_lib_request *request, void *plan, size_t plan_bytes,
                  size_t *workspace_bytes);
int attn_lib_forward(const void *plan, const void *Q, const void *K, const void *V, void *O,
                     float *lse, void *workspace, size_t workspace_bytes, void *stream);
int attn_lib_backward(const void *plan, const void *Q, const void *K, const void *V, const void *O,
                      const float *lse, const void *dO, void *dQ, void *dK, void *dV,
                      void *workspace, size_t workspace_bytes, void *stream);
const char *attn_lib_last_error(void);
const char *attn_lib_exit_codes(void);
const char *attn_lib_limits(void);

#ifdef __cplusplus
}
#endif

#endif /* ATTN_LIB_H */
