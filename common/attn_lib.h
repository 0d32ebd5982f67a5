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
 *   attn_lib_decode       the stage's decode() of a plan (a decode stage's: stage 9) over a KV
 *                         cache, likewise
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
 * 6: attn_lib_plan takes one attn_lib_request; attn_lib_limits; 7: decode over a KV cache (the
 * pass ATTN_LIB_DECODE, the request's cache fields, attn_lib_decode); 8: local windows and softcap
 * (the request's local, window_left, window_right, softcap); 9: packed batches (the request's
 * varlen, total_q, total_k; attn_lib_forward's and attn_lib_backward's cu_seqlens_q, cu_seqlens_k)
 */
#define ATTN_LIB_ABI 9

/* attn_lib_request.pass */
enum { ATTN_LIB_FORWARD = 0, ATTN_LIB_BACKWARD = 1, ATTN_LIB_DECODE = 2 };

/* One pass to plan: which pass, where, and the shape (attention.h's attn_shape, flattened).
 *
 * A decode (ATTN_LIB_DECODE; attention.h's attn_cache): N (1 to 16) new queries per sequence, q
 * and o [B, N, H, D] by their strides; the cache's keys and values by the k and v strides, a
 * contiguous cache [B, N_max, H_kv, D] (paged 0, N_k = N_max) or a paged one [num_pages,
 * page_size, H_kv, D] (paged 1, N_k = max_pages * page_size, or 0 for that); N_new new keys per
 * sequence [B, N_new, H_kv, D] by new_strides, written into the cache by the call. The lengths,
 * the block table and the new keys are pointers of the run (attn_lib_decode): the host never
 * reads them. */
typedef struct {
    int pass;             /* ATTN_LIB_FORWARD, ATTN_LIB_BACKWARD or ATTN_LIB_DECODE */
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
    /* decode: the KV cache (forward and backward: all zero) */
    int paged;                           /* 1: pages and a block table [B, max_pages] int32 */
    int page_size, num_pages, max_pages; /* keys per page, pages in the cache, table row length */
    int N_new;                           /* new keys per sequence written by the call (0: none) */
    long long new_strides[6]; /* {batch, head, row} of k_new, v_new; three zero: contiguous */
    /* a local window, flash-attn's window_size (local 0: none; -1: unbounded on that side), and
     * a softcap (> 0: scores s become softcap * tanh(s / softcap)); attention.h's attn_shape */
    int local, window_left, window_right;
    float softcap;
    /* a packed batch (attention.h's attn_varlen; forward and backward): varlen 1, B sequences of
     * at most N queries and N_k keys (flash-attn's max_seqlen_q, max_seqlen_k), q, o, dO, dQ
     * [total_q, H, D] and k, v, dK, dV [total_k, H_kv, D] by their head and row strides (the
     * batch stride unused; all three zero: packed contiguous), lse [H, total_q]; the sequences'
     * boundaries are pointers of the run (cu_seqlens_q, cu_seqlens_k [B + 1] int32 on the
     * device), never read by the host */
    int varlen;
    int total_q, total_k;
} attn_lib_request;

int attn_lib_abi(void);
size_t attn_lib_plan_bytes(void);
int attn_lib_plan(const attn_lib_request *request, void *plan, size_t plan_bytes,
                  size_t *workspace_bytes);
/* cu_seqlens_q, cu_seqlens_k: a packed plan's sequences (device, [B + 1] int32), else NULL */
int attn_lib_forward(const void *plan, const void *Q, const void *K, const void *V, void *O,
                     float *lse, const int *cu_seqlens_q, const int *cu_seqlens_k, void *workspace,
                     size_t workspace_bytes, void *stream);
int attn_lib_backward(const void *plan, const void *Q, const void *K, const void *V, const void *O,
                      const float *lse, const void *dO, void *dQ, void *dK, void *dV,
                      const int *cu_seqlens_q, const int *cu_seqlens_k, void *workspace,
                      size_t workspace_bytes, void *stream);
/* seqlens [B] int32 and block_table [B, max_pages] int32 (NULL for a contiguous cache) on the
 * device; K_new, V_new NULL where the plan has no new keys; the cache written in place. */
int attn_lib_decode(const void *plan, const void *Q, void *K_cache, void *V_cache,
                    const int *seqlens, const int *block_table, const void *K_new,
                    const void *V_new, void *O, float *lse, void *workspace, size_t workspace_bytes,
                    void *stream);
const char *attn_lib_last_error(void);
const char *attn_lib_exit_codes(void);
const char *attn_lib_limits(void);

#ifdef __cplusplus
}
#endif

#endif /* ATTN_LIB_H */
