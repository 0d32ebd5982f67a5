/*
 * common.h: host helpers shared by the program and its CPU tests (C11, no CUDA).
 *   fp16 <-> float conversion (round to nearest even), the input generator,
 *   .npy read/write, the float64 reference and the pass rule.
 */
#ifndef COMMON_H
#define COMMON_H

#include <stddef.h>
#include <stdint.h>

#include "attention.h"

/* ---- fp16 (IEEE binary16) on the host ---- */
uint16_t f32_to_f16(float f); /* round to nearest even, overflow to inf, NaN kept */
float f16_to_f32(uint16_t h);
static inline float round_f16(float f) {
    return f16_to_f32(f32_to_f16(f));
}
/* bfloat16: the top 16 bits of a float, rounded to nearest even (NaN kept quiet) */
uint16_t f32_to_bf16(float f);
float bf16_to_f32(uint16_t h);
static inline float round_bf16(float f) {
    return bf16_to_f32(f32_to_bf16(f));
}
/* Storage types of the checked values: what a 16-bit stage rounds to. */
typedef enum { STORE_F32 = 0, STORE_F16 = 1, STORE_BF16 = 2 } store_type;
static inline float round_store(float f, store_type t) {
    return t == STORE_F16 ? round_f16(f) : t == STORE_BF16 ? round_bf16(f) : f;
}

/* ---- inputs: a counter-based generator, so any element can be made on any thread ---- */
/* Fills x[0..n) with N(0,1) samples times `mul`, a pure function of (seed, stream, index). */
void fill_normal(float *x, size_t n, uint64_t seed, uint32_t stream, float mul);

/* ---- .npy (version 1.0/2.0, little-endian, C order) ---- */
typedef enum { NPY_F16 = 2, NPY_F32 = 4 } npy_dtype;
typedef struct {
    npy_dtype dtype;
    int ndim;
    long long shape[8];
    void *data; /* malloc'd, dtype elements in C order */
} npy_array;
/* 0 on success; else -1 (a bad or unreadable file) or NPY_ERR_NOMEM (no host memory for
 * the data), with a one-line reason in err. */
#define NPY_ERR_NOMEM (-2)
int npy_read(const char *path, npy_array *out, char *err, size_t errlen);
int npy_write(const char *path, npy_dtype dtype, int ndim, const long long *shape, const void *data,
              char *err, size_t errlen);
size_t npy_count(const npy_array *a);

/* ---- reference (float64) ---- */
typedef struct {
    int B, H, N, D, causal;
    double scale;
    int H_kv, N_k; /* key/value heads and keys; 0: H and N */
    /* a local window and a softcap, as a complete attn_shape has them (zero: none) */
    int local, window_left, window_right;
    double softcap;
    /* A packed batch (attention.h's attn_varlen) on the host: B sequences, sequence b's N_b =
     * cu_q[b + 1] - cu_q[b] queries and N_k_b = cu_k[b + 1] - cu_k[b] keys, cumulative from 0;
     * N and N_k are then the longest sequence's (bounds only). NULL: not packed. */
    const int *cu_q, *cu_k;
} ref_shape;

/* The checker's view of a complete shape: its sizes, scale, mask and softcap. */
static inline ref_shape ref_of(const attn_shape *s) {
    return (ref_shape){.B = s->B,
                       .H = s->H,
                       .N = s->N,
                       .D = s->D,
                       .causal = s->causal,
                       .scale = (double)s->scale,
                       .H_kv = s->H_kv,
                       .N_k = s->N_k,
                       .local = s->local,
                       .window_left = s->window_left,
                       .window_right = s->window_right,
                       .softcap = (double)s->softcap};
}

/* H_kv and N_k of a ref_shape, zero meaning H and N; the group size H / H_kv. */
static inline long long ref_kv_heads(const ref_shape *s) {
    return s->H_kv ? s->H_kv : s->H;
}
static inline long long ref_n_k(const ref_shape *s) {
    return s->N_k ? s->N_k : s->N;
}
/* The keys query row i attends to, lo .. hi inclusive (lo > hi: none): attention.h's
 * attn_key_range, the one home of the mask (causal, local windows), on this shape. */
void ref_key_range(const ref_shape *s, long long i, long long *lo, long long *hi);
/* The [B * H_kv, N_k] key/value row index of key j for query head bh (= b * H + h). */
static inline long long ref_kv_row(const ref_shape *s, long long bh, long long j) {
    const long long H = s->H, group = H / ref_kv_heads(s);
    return ((bh / H) * ref_kv_heads(s) + (bh % H) / group) * ref_n_k(s) + j;
}

/* The checker's host copies of a packed batch: sequence-major, sequence b's rows of a query tensor
 * ([total_q, H, D] on the device) as one [H, N_b, D] block at row H * cu_q[b] (its lse, [H,
 * total_q] on the device, as [H, N_b] at H * cu_q[b]), those of a key tensor as [H_kv, N_k_b, D]
 * at row H_kv * cu_k[b]: each sequence is an unpacked batch of one, so the reference below runs on
 * it unchanged. An unpacked batch [B, H, N, D] is the same with cu_q[b] = b N, cu_k[b] = b N_k.
 * The rows of a tensor (query rows: ref_rows(s, 0); key rows: ref_rows(s, 1)), and the sequence
 * of a row (an index into them). */
long long ref_rows(const ref_shape *s, int keys);
long long ref_sequence_of_row(const ref_shape *s, int keys, long long row);
/* Sequence b as an unpacked batch of one: its shape (B = 1, its N_b queries and N_k_b keys, the
 * mask's bounds as the whole shape has them), its first query row and key row in the host copies
 * (rows of [.., D]; lse: q_row) and its keys (s.N_k = 0, no keys, would read as N_b: a caller
 * checks keys first). */
typedef struct {
    ref_shape s;
    long long q_row, k_row;
    long long keys;
} ref_sequence;
ref_sequence ref_sequence_at(const ref_shape *s, long long b);

/* One output row (b*H + h, query i) from float inputs laid out [B, H, N, D] (Q) and
 * [B, H_kv, N_k, D] (K, V), over the keys ref_key_range gives it. o_exact[D] and lse: float64
 * softmax(scores) V, a score being s = scale q.k, or softcap * tanh(s / softcap) with a softcap;
 * a row that attends to no key gets O = 0 and lse = -inf.
 * o_16[D] (may be NULL): the same with P rounded to the storage type before PV and O rounded to
 * it, and a softcap's tanh(s / softcap) rounded to fp16, that is, what a correct 16-bit kernel
 * computes (normalised by its own row sum, unrounded). scratch holds N_k doubles. */
void ref_row(const ref_shape *s, store_type st, const float *Q, const float *K, const float *V,
             long long bh, long long i, double *o_exact, double *o_16, double *lse,
             double *scratch);

/* The rows to check: the first, the last and a spread of the rest (jittered by seed so the
 * checked rows fall at different positions inside tiles). Returns how many were written
 * (min(want, total)); want < 0 means all rows. */
long long pick_rows(long long total, long long want, uint64_t seed, long long *rows);
/* The rows of a packed batch to check (s->cu_q set): in every sequence with rows, its first and
 * last row and a spread (pick_rows), about `want` rows in all in proportion to the sequences'
 * rows but at least two of each (want < 0: all rows), and with `edges` the first and last row of
 * every head too (where a tile written past a sequence's end lands: the next one's first rows);
 * query rows (keys 0) or key rows (keys 1), increasing, as indices into ref_rows. Returns how
 * many (-1: no host memory); rows NULL: only counts them. */
long long pick_sequence_rows(const ref_shape *s, int keys, long long want, int edges, uint64_t seed,
                             long long *rows);

/* ---- packed batches: the sequences' lengths (--varlen) ---- */
/* SPEC: a comma-separated list of sequences, each Nq or Nq:Nk (queries, keys; Nk = Nq when not
 * given), lengths 0 to ATTN_MAX_N, at most ATTN_MAX_BH sequences and ATTN_MAX_N tokens of each
 * side. 0 and *B sequences, cu_q and cu_k [B + 1] malloc'd (cumulative from 0); -1 and one line in
 * err (a bad list); NPY_ERR_NOMEM (no host memory). */
int varlen_parse(const char *spec, int *B, int **cu_q, int **cu_k, char *err, size_t errlen);
/* B random sequences into cu_q and cu_k [B + 1]: queries uniform in 0 .. max_q, keys as many
 * (max_k < 0) or uniform in 0 .. max_k, each side empty one time in VARLEN_EMPTY_ODDS besides, a
 * pure function of seed. 0, or -1 when the tokens of a side pass ATTN_MAX_N. */
#define VARLEN_EMPTY_ODDS 8
int varlen_random(int B, int max_q, int max_k, uint64_t seed, int *cu_q, int *cu_k);

typedef struct {
    double max_abs_err; /* max |O - O_ref| over checked rows */
    double rel_err;     /* ||O - O_ref|| / ||O_ref|| over checked rows */
    double lse_err;     /* max |lse - lse_ref| / (1 + |lse_ref|) */
    double f16_err;     /* max |O_f16ref - O_ref|: the error of a correct fp16 computation */
    double bound;       /* the max_abs_err allowed */
    double lse_bound;
    long long rows_checked;
    long long nonfinite; /* NaN/Inf anywhere in O or lse (all of it is scanned) */
    int pass;
} check_result;

/* Checks O ([B,H,N,D], as floats) and lse ([B,H,N]) at the given rows; every element of O and
 * lse must be finite, but lse = -inf exactly where a row attends to no key. A packed batch
 * (s->cu_q): O and lse as the host copies hold them (sequence-major, above), each sequence against
 * its own keys (a sequence without keys: O = 0, lse = -inf), rows indices into ref_rows(s, 0).
 * st: the storage type (16-bit: pass rule 2x that reference's error + floor; fp32: tight). */
void check_output(const ref_shape *s, store_type st, const float *Q, const float *K, const float *V,
                  const float *O, const float *lse, const long long *rows, long long nrows,
                  check_result *r);

/* ---- the backward pass (reference_bwd.c) ---- */
enum { GRAD_DQ = 0, GRAD_DK = 1, GRAD_DV = 2, GRADS = 3 };
typedef struct {
    double max_abs_err[GRADS]; /* max |g - g_ref| over the checked rows, per gradient */
    double rel_err[GRADS];     /* ||g - g_ref|| / ||g_ref|| over the checked rows */
    double f16_err[GRADS];     /* max |g_f16ref - g_ref|: the error of a correct fp16 computation */
    double bound[GRADS];       /* the max_abs_err allowed */
    long long rows_checked;    /* query rows (dQ) + key rows (dK, dV) */
    long long nonfinite;       /* NaN/Inf anywhere in dQ, dK or dV (all of them are scanned) */
    int pass;
} grad_check_result;

/* Checks dQ at the query rows qrows (indices into [B*H, N]) and dK, dV at the key rows krows
 * (indices into [B*H_kv, N_k]); dQ [B, H, N, D], dK and dV [B, H_kv, N_k, D], as floats; a key
 * row's gradient sums over the query heads that share its head (GQA); a packed batch (s->cu_q)
 * sequence by sequence, as check_output (a sequence without keys: dQ = 0; without queries: dK =
 * dV = 0), qrows and krows indices into ref_rows(s, 0) and ref_rows(s, 1). The reference takes the
 * stored inputs Q, K, V, dO and the forward's stored O and lse (checked by check_output first): D_i
 * = dO_i . O_i, P_ij = exp(scale q_i.k_j - lse_i), dS_ij = P_ij (dO_i.v_j - D_i); dQ_i = scale
 * sum_j dS_ij k_j, dK_j = scale sum_i dS_ij q_i, dV_j = sum_i P_ij dO_i, in float64, over every key
 * of a query row and every query of a key row (ref_key_range's). With a softcap c: t_ij =
 * tanh(scale q_i.k_j / c), P_ij = exp(c t_ij - lse_i), dS_ij = P_ij (dO_i.v_j - D_i) (1 - t_ij^2).
 * The 16-bit reference rounds P (for dV) and dS (for dQ, dK) to the storage type, a softcap's t to
 * fp16, and the results, as a correct 16-bit kernel does. Pass rule per gradient: max_abs_err <=
 * 2 f16_err + CHECK_F16_FLOOR (1 + max|g_ref|). */
void check_gradients(const ref_shape *s, store_type st, const float *Q, const float *K,
                     const float *V, const float *dO, const float *O, const float *lse,
                     const float *dQ, const float *dK, const float *dV, const long long *qrows,
                     long long nq, const long long *krows, long long nk, grad_check_result *r);

#define CHECK_F16_FLOOR 1e-4 /* absolute floor for fp16 stages: cases where fp16 is exact */
#define CHECK_F32_TOL 1e-4   /* fp32 stages: |O - O_ref| <= tol * (1 + max|O_ref|) */
#define CHECK_LSE_F32 5e-5   /* lse tolerance relative to 1 + |lse_ref| */
#define CHECK_LSE_F16 5e-4

#endif /* COMMON_H */
