/*
 * ring.h: the contract between the context-parallel program (common/ring_main.c) and stage 10's
 * ring (stage10_context_parallel/ring.cu), as attention.h is between common/main.c and a stage.
 *
 * A sequence of N tokens is split along its tokens over P GPUs. Every GPU keeps the queries of its
 * own slice and passes the keys and values around a ring (NCCL, GPU r sends to r + 1 and receives
 * from r - 1), so that in P steps each slice of queries meets every slice of keys; the partial
 * outputs of the steps are merged by their log-sum-exp. The backward pass sends dK and dV around
 * the same ring with the keys they belong to, home after P steps.
 *
 * How the tokens are split (ring_split, the one home of the rule; the Python binding's
 * flashcourse.ring_sizes follows it):
 *   RING_ZIGZAG      the sequence in 2P chunks, chunk i of N / 2P tokens (the first N % 2P one
 *                    more); GPU r holds chunks r and 2P - 1 - r, in that order. Under a causal
 *                    mask every GPU then has the same work at every step.
 *   RING_CONTIGUOUS  P blocks, block r of N / P tokens (the first N % P one more): the naive ring,
 *                    whose causal work is unbalanced (GPU 0 sees one block, GPU P - 1 all of them).
 *
 * Tensors on GPU r (contiguous, the course's layout): q, o, dO, dQ [B, H, n_r, D] and k, v, dK, dV
 * [B, H_kv, n_r, D] in the storage type (fp16 or bf16), lse [B, H, n_r] float32, its rows in the
 * order of its chunks.
 */
#ifndef RING_H
#define RING_H

#include <stddef.h>

#include "attn_lib.h"

#ifdef __cplusplus
extern "C" {
#endif

#define RING_MAX_GPUS 64

typedef enum { RING_ZIGZAG = 0, RING_CONTIGUOUS = 1 } ring_layout;

/* One GPU's slice: up to two chunks of the sequence, in the order its rows hold them. */
typedef struct {
    int parts;          /* chunks: 2 (zigzag) or 1 (contiguous) */
    long long start[2]; /* each chunk's first token in the sequence */
    long long rows[2];  /* each chunk's tokens (0 when N < 2P leaves it empty) */
    long long n;        /* the slice's tokens: rows[0] + rows[1] */
} ring_slice;

/* GPU r's slice of N tokens over P GPUs. */
static inline ring_slice ring_split(long long N, int P, ring_layout layout, int r) {
    ring_slice s = {0, {0, 0}, {0, 0}, 0};
    const long long chunks = layout == RING_ZIGZAG ? 2LL * P : P;
    const long long base = N / chunks, extra = N % chunks;
    const long long which[2] = {r, layout == RING_ZIGZAG ? 2LL * P - 1 - r : -1};
    s.parts = layout == RING_ZIGZAG ? 2 : 1;
    for (int p = 0; p < s.parts; p++) {
        const long long c = which[p];
        s.start[p] = c * base + (c < extra ? c : extra);
        s.rows[p] = base + (c < extra ? 1 : 0);
        s.n += s.rows[p];
    }
    return s;
}

/* What GPU r computes at step t, when it holds the keys of GPU s = (r - t) mod P: queries q_row ..
 * q_row + q_rows - 1 of its slice against keys k_row .. k_row + k_rows - 1 of GPU s's, with or
 * without the causal mask; q_rows or k_rows 0: nothing. The derivation is stage 10's lesson's. */
typedef struct {
    long long q_row, q_rows, k_row, k_rows;
    int causal;
} ring_block;

static inline ring_block ring_step(long long N, int P, ring_layout layout, int causal, int r,
                                   int t) {
    const int s = ((r - t) % P + P) % P;
    const ring_slice mine = ring_split(N, P, layout, r), theirs = ring_split(N, P, layout, s);
    ring_block b = {0, mine.n, 0, theirs.n, 0};
    if (!causal) return b; /* every query sees every key */
    if (s == r) { /* the diagonal: the slice's own order keeps the mask a plain causal one */
        b.causal = 1;
        return b;
    }
    if (layout == RING_CONTIGUOUS) {
        if (s > r) b.q_rows = b.k_rows = 0; /* every key of a later block is masked */
        return b;
    }
    if (s < r) /* zigzag: every query sees GPU s's first chunk, none of its second */
        b.k_rows = theirs.rows[0];
    else { /* s > r: the second chunk's queries see both of GPU s's chunks, the first's neither */
        b.q_row = mine.rows[0];
        b.q_rows = mine.rows[1];
    }
    return b;
}

/* The attention the ring runs inside (a stage library's C entry point, attn_lib.h: stage 6's
 * forward and stage 8's backward on Hopper, stages 5 and 7 elsewhere). */
typedef struct {
    int (*plan)(const attn_lib_request *, void *, size_t, size_t *);
    int (*forward)(const void *, const void *, const void *, const void *, void *, float *,
                   const int *, const int *, void *, size_t, void *);
    int (*backward)(const void *, const void *, const void *, const void *, const void *,
                    const float *, const void *, void *, void *, void *, const int *, const int *,
                    void *, size_t, void *);
    const char *(*last_error)(void);
    size_t plan_bytes;
} ring_inner;

/* The ring's shape: the whole sequence's (N tokens), the GPUs and the split. */
typedef struct {
    int B, H, H_kv, D, causal, bf16;
    long long N;
    float scale;
    int P;
    ring_layout layout;
    int devices[RING_MAX_GPUS]; /* the CUDA device of ring position r */
    int backward;               /* 1: also plan and allocate for the backward pass */
    long long smem_limit;       /* > 0: the inner stage's shared memory per block lowered to it */
    long long piece;            /* > 0: ring_piece_rows; 0: RING_PIECE_ROWS */
} ring_shape;

/* The backward pass runs an unmasked block (P > 1) of more than ring_piece_rows() queries or keys
 * as pieces of at most that many query rows and key rows, the last of each side shorter: stage 8's
 * backward walks every query tile of its block from each key tile, and slows down once its walks
 * pass 128k rows or its key tiles 128k keys, as its reads lose their reuse in L2; pieces of 64k
 * measured faster than 128k and no slower than 32k (stage10_context_parallel/LOG.md, steps 8-10).
 * The pieces of one key range each give its keys a partial dK and dV, those of one query range each
 * a partial dQ, added up in the storage type: one more rounding a piece. */
#define RING_PIECE_ROWS 65536
enum { RING_QUERIES, RING_KEYS }; /* a block's two sides */
static inline long long ring_piece_rows(const ring_shape *s) {
    return s->piece > 0 ? s->piece : RING_PIECE_ROWS;
}
/* The pieces of block b along one side (RING_QUERIES or RING_KEYS). */
static inline long long ring_pieces(const ring_shape *s, const ring_block *b, int side) {
    if (s->P == 1 || b->causal || b->q_rows == 0 || b->k_rows == 0) return 1;
    const long long rows = side == RING_KEYS ? b->k_rows : b->q_rows;
    return (rows + ring_piece_rows(s) - 1) / ring_piece_rows(s);
}
/* A block's pieces along one side: how many, the rows of each but the last, and the last's. */
typedef struct {
    long long count, rows, last;
} ring_cut;
static inline ring_cut ring_cut_of(const ring_shape *s, const ring_block *b, int side) {
    const long long total = side == RING_KEYS ? b->k_rows : b->q_rows;
    const long long count = ring_pieces(s, b, side), rows = count > 1 ? ring_piece_rows(s) : total;
    const ring_cut c = {count, rows, total - (count - 1) * rows};
    return c;
}
/* The most pieces along one side of a block of any GPU and step (the check's extra roundings: dK
 * and dV gain one for each further query piece, dQ one for each further key piece). */
static inline long long ring_pieces_max(const ring_shape *s, int side) {
    long long most = 1;
    for (int r = 0; r < s->P; r++)
        for (int t = 0; t < s->P; t++) {
            const ring_block b = ring_step(s->N, s->P, s->layout, s->causal, r, t);
            const long long n = ring_pieces(s, &b, side);
            most = n > most ? n : most;
        }
    return most;
}

typedef struct ring ring; /* the plans, buffers, streams and NCCL communicators: ring.cu's */

/* Plans every step of every GPU with `inner` and allocates the ring's buffers; 0 (ATTN_EXIT_PASS)
 * or an attn_exit code with one line in err (a shape the inner stage refuses, no memory, NCCL). */
int ring_create(const ring_shape *s, const ring_inner *inner, ring **out, char *err, size_t errlen);
void ring_destroy(ring *g);
/* Device bytes the ring allocates on GPU r beyond the caller's tensors. */
size_t ring_bytes(const ring *g, int r);

/* The forward pass: per GPU r (arrays of P), its q, k, v in, o and lse out, enqueued on streams[r]
 * (cudaStream_t) and returning at once; 0 or ATTN_EXIT_WRONG with one line in err. */
int ring_forward(ring *g, const void *const *q, const void *const *k, const void *const *v,
                 void *const *o, float *const *lse, void *const *streams, char *err, size_t errlen);
/* The backward pass from the forward's o and lse and dO: dQ, dK, dV per GPU. */
int ring_backward(ring *g, const void *const *q, const void *const *k, const void *const *v,
                  const void *const *o, const float *const *lse, const void *const *dO,
                  void *const *dQ, void *const *dK, void *const *dV, void *const *streams,
                  char *err, size_t errlen);

/* The timeline: after ring_timeline_on, every pass records, per GPU and step, when its compute
 * began and ended and when its transfer of keys to the next GPU began and ended; ring_timeline
 * reads them after the pass (ms from the pass's start on that GPU; -1: none, as the last step's
 * transfer). */
int ring_timeline_on(ring *g, char *err, size_t errlen);
int ring_timeline(const ring *g, int r, int t, float ms[4]);

/* The program's inputs, made on each GPU (returns the launch's cudaError_t, 0: none): element (b,
 * h, token, d) of a [B, heads, N, D] tensor is a normal sample times mul, a function of (seed,
 * tensor, b, h, token, d) alone, so every split of the sequence holds the same values; x is GPU r's
 * slice ([B, heads, n_r, D]). */
int ring_fill(void *x, int bf16, const ring_slice *slice, long long N, int B, int heads, int D,
              unsigned long long seed, unsigned tensor, float mul, void *stream);

#ifdef __cplusplus
}
#endif

#endif /* RING_H */
