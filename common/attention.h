/*
 * attention.h: the contract between the one host program (common/main.c) and a stage.
 *
 * Every stage's attention.cu defines `attn_this_stage` and nothing else is exported.
 * The host program owns inputs, outputs, checking and timing; a stage owns the algorithm.
 *
 * Layouts (row-major; by default contiguous):
 *   Q, O       : [B, H, N, D]      in the stage's storage type (float, IEEE half or bfloat16)
 *   K, V       : [B, H_kv, N_k, D] (H_kv = H and N_k = N unless the shape says otherwise)
 *   lse        : [B, H, N]         float32, always contiguous, natural log: LSE_i = m_i + log(l_i),
 *                                  where m_i is the row maximum of scale * q_i . k_j over the keys
 *                                  the row attends to; a row that attends to no key: O = 0 and
 *                                  LSE = -inf
 * Causal means query i attends to keys j <= i + N_k - N (aligned to the bottom right, as
 * FlashAttention 2.1 and later: with N_k = N, keys j <= i). A local (sliding) window bounds the
 * keys on both sides, as flash-attn's window_size = (left, right): query i attends to keys
 * i + N_k - N - left <= j <= i + N_k - N + right (attn_key_range). A softcap c > 0 turns each
 * scaled score s = scale * q_i . k_j into c * tanh(s / c) before the softmax (LSE and m are then
 * of the capped scores).
 *
 * Packed variable-length batches (flash-attn's varlen; attn_varlen below): the B sequences lie one
 * after another along the rows, Q, O [total_q, H, D] and K, V [total_k, H_kv, D] by default;
 * sequence b is its own attention of N_b queries and N_k_b keys (causal and windows aligned to
 * its own bottom right), and lse is [H, total_q].
 *
 * The plain case is what every stage takes: its storage type, H_kv = H, N_k = N, contiguous
 * tensors. What models feed beyond it (bf16, grouped-query heads, strided views, queries shorter
 * or longer than the keys) a stage takes when its descriptor's `takes` says so; the program and
 * the library refuse the rest before the stage sees it (attn_shape_refused).
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

/* One tensor's strides in elements (the last dimension is contiguous: stride 1). All zero: the
 * contiguous layout, [B, H, N, D] (K, V: [B, H_kv, N_k, D]). E.g. [B, N, H, D] (flash-attn's
 * layout) is {N * H * D, D, H * D}; q of a fused [B, N, 3, H, D] projection {3 N H D, D, 3 H D}. */
typedef struct {
    long long batch, head, row;
} attn_layout;

/* A packed batch: sequence b's queries are rows cu_seqlens_q[b] .. cu_seqlens_q[b + 1] - 1 of Q, O
 * (dO, dQ), its keys rows cu_seqlens_k[b] .. cu_seqlens_k[b + 1] - 1 of K, V (dK, dV); every
 * tensor's batch stride is unused. The shape's N and N_k are then the longest sequence's
 * (flash-attn's max_seqlen_q, max_seqlen_k: what grids are planned with, the host never reads the
 * device's arrays) and total_q, total_k the rows of the tensors. A kernel reads a sequence's rows
 * through attn_sequence_of, which keeps them inside the tensors whatever the arrays hold. */
typedef struct {
    const int *cu_seqlens_q, *cu_seqlens_k; /* [B + 1] int32 on the device; NULL: not packed */
    int total_q, total_k;                   /* rows of Q and of K */
} attn_varlen;

typedef struct {
    int B, H, N, D; /* batch (packed: sequences), query heads, queries, head dim */
    int causal;     /* 1: query i sees keys 0 .. i + N_k - N */
    float scale;    /* softmax scale, 1/sqrt(D) unless given */
    /* Beyond the plain case (zero: the plain case; attn_shape_complete fills them in): */
    int H_kv; /* key/value heads, H % H_kv == 0: query head h reads K, V head h / (H / H_kv) */
    int N_k;  /* keys (N is the queries) */
    int bf16; /* 1: storage is bfloat16 (a stage whose type is IEEE half) */
    attn_layout q, k, v, o;     /* the forward's tensors (O: any layout, often q's) */
    attn_layout dO, dQ, dK, dV; /* the backward's (dQ, dK, dV: often q's, k's, v's) */
    /* Local attention: with `local`, query i sees keys i + N_k - N - window_left ..
     * i + N_k - N + window_right, a negative bound being unbounded on its side (flash-attn's
     * window_size; causal makes window_right 0). attn_shape_complete writes every window in one
     * form: causal for (-1, 0), the plain case for (-1, -1) or bounds past the keys. */
    int local, window_left, window_right;
    float softcap;      /* > 0: scores s become softcap * tanh(s / softcap) (s = scale * q . k) */
    attn_varlen varlen; /* a packed batch (cu_seqlens_q set), else all zero */
} attn_shape;

/* What a stage takes beyond the plain case (its descriptor's `takes`, a set of these). */
enum {
    ATTN_TAKES_BF16 = 1,     /* bf16 storage (an fp16 stage) */
    ATTN_TAKES_GQA = 2,      /* H_kv < H */
    ATTN_TAKES_STRIDES = 4,  /* non-contiguous layouts */
    ATTN_TAKES_N_K = 8,      /* N_k != N */
    ATTN_TAKES_LOCAL = 16,   /* a local window (local = 1) */
    ATTN_TAKES_SOFTCAP = 32, /* softcap > 0 */
    ATTN_TAKES_VARLEN = 64   /* a packed batch (varlen.cu_seqlens_q set) */
};

#ifdef __CUDACC__
#define ATTN_HOST_DEVICE __host__ __device__
#else
#define ATTN_HOST_DEVICE
#endif

/* One sequence of a batch as a kernel reads it: row i of its queries is row q_row + i of Q's
 * layout (key j: row k_row + j of K's), its lse at lse[lse_row + h * lse_head + i]. Unpacked,
 * q_row = k_row = 0 (the batch stride places the sequence), N and N_k are the shape's and lse is
 * [B, H, N]; packed, the rows come from cu_seqlens (clamped to the tensors and to N, N_k: a
 * wrong array gives wrong rows, never an access outside) and lse is [H, total_q]. */
typedef struct {
    long long q_row, k_row;
    long long lse_row, lse_head;
    int N, N_k;
} attn_sequence;

static inline ATTN_HOST_DEVICE attn_sequence attn_sequence_of(const attn_varlen *v, int b, int H,
                                                              int N, int N_k) {
    attn_sequence q;
    if (!v->cu_seqlens_q) {
        q.q_row = q.k_row = 0;
        q.lse_row = (long long)b * H * N, q.lse_head = N;
        q.N = N, q.N_k = N_k;
        return q;
    }
    int q0 = v->cu_seqlens_q[b], q1 = v->cu_seqlens_q[b + 1];
    int k0 = v->cu_seqlens_k[b], k1 = v->cu_seqlens_k[b + 1];
    q0 = q0 < 0 ? 0 : (q0 > v->total_q ? v->total_q : q0);
    q1 = q1 < q0 ? q0 : (q1 > v->total_q ? v->total_q : q1);
    k0 = k0 < 0 ? 0 : (k0 > v->total_k ? v->total_k : k0);
    k1 = k1 < k0 ? k0 : (k1 > v->total_k ? v->total_k : k1);
    q.q_row = q0, q.k_row = k0;
    q.lse_row = q0, q.lse_head = v->total_q;
    q.N = q1 - q0 < N ? q1 - q0 : N;
    q.N_k = k1 - k0 < N_k ? k1 - k0 : N_k;
    return q;
}

/* A packed batch with nothing to compute: no query rows, no key rows, or no query in any sequence
 * (N = 0). No stage sees one: the program and the library write its outputs themselves, what
 * flash-attn returns: O = 0 and lse = -inf on every query row, dQ = dK = dV = 0 on every row. */
static inline int attn_packed_empty(const attn_shape *s) {
    return s->varlen.cu_seqlens_q && (s->N < 1 || s->varlen.total_q < 1 || s->varlen.total_k < 1);
}

/* A KV cache (decode, stage 9), as flash-attn's flash_attn_with_kvcache takes it: B sequences, each
 * its own length, their keys and values read in place.
 *   contiguous (block_table NULL): K_cache, V_cache [B, N_max, H_kv, D]; key t of sequence b is
 *               row t of batch b (the shape's k and v layouts: batch, head and row strides)
 *   paged:      K_cache, V_cache [num_pages, page_size, H_kv, D] and block_table [B, max_pages];
 *               key t of sequence b is row t % page_size of page block_table[b * max_pages +
 *               t / page_size] (the k and v layouts' batch stride is then a page's)
 * seqlens[b] keys are in the cache before the call. With N_new > 0 the call first writes K_new and
 * V_new ([B, N_new, H_kv, D], their layouts below) at keys seqlens[b] .. seqlens[b] + N_new - 1,
 * then attends over L_b = seqlens[b] + N_new keys; causal, query i sees keys j <= i + L_b - N (the
 * bottom-right rule of every stage, per sequence). A sequence with no key: O = 0, LSE = -inf.
 * seqlens and block_table live on the device: the host never reads them (a call stays
 * asynchronous and capturable in a CUDA graph), so the kernels clamp what they read to the cache:
 * a length past it or a page index out of range reads and writes nothing outside it. */
typedef struct {
    const int *seqlens;     /* [B] int32, device */
    const int *block_table; /* [B, max_pages] int32, device; NULL: a contiguous cache */
    int page_size;          /* keys per page (paged) */
    int num_pages;          /* pages in K_cache and V_cache (paged) */
    int max_pages;          /* block_table's row length (paged) */
    int N_new;              /* new keys per sequence written into the cache by the call (0: none) */
    const void *K_new, *V_new; /* [B, N_new, H_kv, D] */
    attn_layout k_new, v_new;  /* their strides; all zero: contiguous */
} attn_cache;

#define ATTN_MAX_DECODE_N 16    /* queries per sequence a decode call takes */
#define ATTN_MAX_PAGE_SIZE 1024 /* keys per page */

/* The keys sequence b of a cache can hold: N_max, or max_pages * page_size. */
static inline long long attn_cache_capacity(const attn_shape *s, const attn_cache *c) {
    return c->block_table ? (long long)c->max_pages * c->page_size : (long long)s->N_k;
}

/* NULL when a decode call's shape and cache are consistent, else why not (the program and the
 * library refuse it with that line): the shape's N_k is the plan's bound on L_b. */
static inline const char *attn_cache_refused(const attn_shape *s, const attn_cache *c) {
    if (s->N < 1 || s->N > ATTN_MAX_DECODE_N) return "decode takes 1 to 16 queries per sequence";
    if (!c->seqlens) return "decode needs the sequences' lengths (cache_seqlens)";
    if (c->N_new < 0 || (c->N_new > 0 && (!c->K_new || !c->V_new)))
        return "new keys need both K_new and V_new";
    if (c->block_table) {
        if (c->page_size < 1 || c->page_size > ATTN_MAX_PAGE_SIZE ||
            (c->page_size & (c->page_size - 1)))
            return "page size must be a power of two from 1 to 1024";
        if (c->num_pages < 1 || c->max_pages < 1)
            return "a paged cache needs pages and a block table";
        if ((long long)c->max_pages * c->page_size < s->N_k)
            return "the block table's pages hold fewer keys than the plan's N_k";
    }
    if (c->N_new > s->N_k) return "more new keys than the cache holds";
    return NULL;
}

typedef struct {
    int cc;                /* compute capability as major*10+minor, e.g. 75, 89, 90 */
    size_t smem_per_block; /* opt-in dynamic shared memory per block; lowered by --smem-limit */
    int sm_count;          /* multiprocessors */
} attn_device;

typedef enum {
    ATTN_F32 = 0,
    ATTN_F16 = 1
} attn_dtype; /* a stage's storage type (fp16: bf16 too, with ATTN_TAKES_BF16) */

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
    /* Beyond the plain case, what the forward pass takes (ATTN_TAKES_*; 0: the plain case only),
     * and what the backward pass takes. */
    unsigned takes, backward_takes;
    /* Optional, NULL but in a decode stage: the forward pass over a KV cache (attn_cache, below).
     * Q and O are [B, N, H, D] by their layouts in the shape (N: the new queries, 1 to
     * ATTN_MAX_DECODE_N); the shape's N_k is the most keys a sequence can hold (what the host
     * plans with: no device value is read on the host); its k and v layouts are the cache's. */
    size_t (*decode_workspace_bytes)(const attn_shape *s, const attn_cache *c,
                                     const attn_device *dev, int variant);
    cudaError_t (*decode)(const attn_shape *s, const attn_cache *c, const attn_device *dev,
                          const void *Q, void *K_cache, void *V_cache, void *O, float *lse,
                          void *workspace, int variant, cudaStream_t stream);
} attn_stage;

/* The contiguous layout of a [B, heads, rows, D] tensor. */
static inline attn_layout attn_contiguous(int heads, int rows, int D) {
    attn_layout l = {(long long)heads * rows * D, (long long)rows * D, D};
    return l;
}

/* Tiles of b rows that cover a rows (a >= 0, b > 0): the launchers' grid arithmetic. */
static inline int ceil_div(long long a, long long b) {
    return (int)((a + b - 1) / b);
}

/* A packed tensor's layout, [total, heads, D] (the batch stride unused: attn_varlen). */
static inline attn_layout attn_packed(int heads, int D) {
    attn_layout l = {0, D, (long long)heads * D};
    return l;
}

static inline int attn_layout_unset(const attn_layout *l) {
    return l->batch == 0 && l->head == 0 && l->row == 0;
}

/* Fills in what the shape leaves zero: H_kv = H, N_k = N, contiguous layouts; and writes a
 * window in its one form (flash-attn's rules): causal makes window_right 0; a bound at or past
 * the keys (window_left >= N_k, window_right >= N_k) is unbounded (-1); a window unbounded on
 * the left and 0 on the right is causal (local = 0, causal = 1); one unbounded on both sides is
 * no window (local = 0); beside a bounded left, an unbounded right is N_k (flash-attn's). Every
 * caller of a stage completes its shape first (the program and the library do); a stage reads it
 * whole. */
static inline void attn_shape_complete(attn_shape *s) {
    if (s->H_kv == 0) s->H_kv = s->H;
    if (s->N_k == 0) s->N_k = s->N;
    if (s->local) {
        if (s->causal) s->window_right = 0;
        if (s->window_left < 0 || s->window_left >= s->N_k) s->window_left = -1;
        if (s->window_right < 0 || s->window_right >= s->N_k) s->window_right = -1;
        if (s->window_left < 0 && s->window_right == 0) s->local = 0, s->causal = 1;
        if (s->window_left < 0 && s->window_right < 0) s->local = 0;
        /* flash-attn bounds an unbounded side beside a bounded one at N_k keys (set_params_fprop):
         * with more queries than keys, its first rows see fewer keys on the right than all */
        if (s->local && s->window_right < 0) s->window_right = s->N_k;
    }
    if (!s->local) s->window_left = s->window_right = -1;
    if (!(s->softcap > 0.f)) s->softcap = 0.f;
    attn_layout *qs[] = {&s->q, &s->o, &s->dO, &s->dQ}, *ks[] = {&s->k, &s->v, &s->dK, &s->dV};
    for (int t = 0; t < 4; t++) {
        if (s->varlen.cu_seqlens_q) { /* packed: [total, heads, D] unless given; no batch stride */
            if (attn_layout_unset(qs[t])) *qs[t] = attn_packed(s->H, s->D);
            if (attn_layout_unset(ks[t])) *ks[t] = attn_packed(s->H_kv, s->D);
            qs[t]->batch = ks[t]->batch = 0;
            continue;
        }
        if (attn_layout_unset(qs[t])) *qs[t] = attn_contiguous(s->H, s->N, s->D);
        if (attn_layout_unset(ks[t])) *ks[t] = attn_contiguous(s->H_kv, s->N_k, s->D);
    }
}

static inline int attn_layout_is(const attn_layout *l, attn_layout want) {
    return l->batch == want.batch && l->head == want.head && l->row == want.row;
}

/* What a complete shape asks beyond the plain case (ATTN_TAKES_*); `backward`: its backward
 * tensors' layouts too. */
static inline unsigned attn_shape_asks(const attn_shape *s, int backward) {
    const int packed = s->varlen.cu_seqlens_q != NULL;
    const attn_layout qc = packed ? attn_packed(s->H, s->D) : attn_contiguous(s->H, s->N, s->D),
                      kc = packed ? attn_packed(s->H_kv, s->D)
                                  : attn_contiguous(s->H_kv, s->N_k, s->D);
    unsigned a = (s->bf16 ? ATTN_TAKES_BF16 : 0) | (s->H_kv != s->H ? ATTN_TAKES_GQA : 0) |
                 (s->N_k != s->N ? ATTN_TAKES_N_K : 0) | (s->local ? ATTN_TAKES_LOCAL : 0) |
                 (s->softcap > 0.f ? ATTN_TAKES_SOFTCAP : 0) | (packed ? ATTN_TAKES_VARLEN : 0);
    if (!attn_layout_is(&s->q, qc) || !attn_layout_is(&s->k, kc) || !attn_layout_is(&s->v, kc) ||
        !attn_layout_is(&s->o, qc))
        a |= ATTN_TAKES_STRIDES;
    if (backward && (!attn_layout_is(&s->dO, qc) || !attn_layout_is(&s->dQ, qc) ||
                     !attn_layout_is(&s->dK, kc) || !attn_layout_is(&s->dV, kc)))
        a |= ATTN_TAKES_STRIDES;
    return a;
}

/* The one home of the 16-byte row rule of the stages that move tiles by 16-byte chunks (cp.async,
 * 16-byte loads and stores): NULL when each of the `count` layouts has every stride a multiple of 8
 * elements (16 bytes of a 16-bit type), rows at least D apart and at most max_row elements apart
 * (what the stage's row arithmetic holds), else why not. */
#define ATTN_CHUNK_ELEMENTS 8 /* 16-bit elements in 16 bytes */
static inline const char *attn_strides_refused(const attn_layout *const *l, int count, int D,
                                               long long max_row) {
    for (int t = 0; t < count; t++) {
        if (l[t]->batch % ATTN_CHUNK_ELEMENTS || l[t]->head % ATTN_CHUNK_ELEMENTS ||
            l[t]->row % ATTN_CHUNK_ELEMENTS || l[t]->row < D || l[t]->row > max_row)
            return "strides must be multiples of 8 elements (16-byte rows), rows at least D apart";
    }
    return NULL;
}

/* NULL when a stage that takes `takes` runs this complete shape's inputs, else what it does not
 * take, in a learner's words. */
static inline const char *attn_shape_refused(const attn_shape *s, unsigned takes, int backward) {
    const unsigned missing = attn_shape_asks(s, backward) & ~takes;
    if (missing & ATTN_TAKES_BF16) return "bf16 storage (this stage stores fp16 or fp32)";
    if (missing & ATTN_TAKES_GQA) return "fewer key/value heads than query heads (GQA, MQA)";
    if (missing & ATTN_TAKES_N_K) return "a number of keys other than of queries (N_k != N)";
    if (missing & ATTN_TAKES_STRIDES) return "strided tensors (this stage takes contiguous ones)";
    if (missing & ATTN_TAKES_LOCAL) return "a local window (window_size; stages 5-8 take it)";
    if (missing & ATTN_TAKES_SOFTCAP) return "a softcap (stages 5-8 take it)";
    if (missing & ATTN_TAKES_VARLEN) return "a packed batch (cu_seqlens; stages 5-8 take it)";
    return NULL;
}

/* The keys query row i (0 .. N - 1) of a complete shape attends to: lo .. hi, inclusive, clipped
 * to 0 .. N_k - 1 (lo > hi: none). The one home of the mask: the checker's reference and the
 * tests read it; a kernel applies the same bounds per tile. */
static inline void attn_key_range(const attn_shape *s, long long i, long long *lo, long long *hi) {
    const long long diagonal = i + s->N_k - s->N; /* query i as a key index */
    long long l = 0, h = s->N_k - 1;
    if (s->causal && diagonal < h) h = diagonal;
    if (s->local && s->window_right >= 0 && diagonal + s->window_right < h)
        h = diagonal + s->window_right;
    if (s->local && s->window_left >= 0 && diagonal - s->window_left > l)
        l = diagonal - s->window_left;
    *lo = l, *hi = h;
}

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
/* Head dims: a multiple of ATTN_D_STEP from ATTN_MIN_D to ATTN_MAX_D (flash-attn's range); a
 * stage runs those it compiled and refuses the rest (its unsupported()); stages 5-8 run every one,
 * in the next compiled size with the tail of D masked. */
#define ATTN_MIN_D 32
#define ATTN_MAX_D 256
#define ATTN_D_STEP 8 /* 16 bytes of a 16-bit type: a row's last chunk is whole */

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
