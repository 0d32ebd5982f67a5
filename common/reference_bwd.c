/*
 * reference_bwd.c: the float64 reference of the backward pass, for chosen rows, and its pass rule
 * (common.h, check_gradients). The same idea as the forward's (reference.c): the exact stored
 * values in, float64 over every term of a checked row, and beside it the same computation with
 * the fp16 roundings a correct kernel makes, whose distance from float64 sets the bound.
 *
 * A query row's dQ_i needs its row of P and dS (every key: O(N D)); a key row's dK_j and dV_j need
 * column j of P and dS (every query), so every query's lse_i and D_i: lse is the forward's (already
 * checked against its own reference) and D_i = dO_i . O_i is computed here from the stored O, both
 * O(N D) per head. 64 rows at N = 262,144 cost a few seconds.
 *
 * A query row takes the keys lo .. hi of attn_key_range (ref_key_range), a key row the queries
 * whose range holds it: a row with no key contributes nothing. With a softcap c, a score s =
 * scale q.k is capped to c t, t = tanh(s / c): P = exp(c t - lse) and dS = P (dP - D_i) (1 - t^2),
 * the cap's derivative; the 16-bit computation takes t rounded to fp16, as the forward's does.
 * A packed batch is checked one sequence at a time, as the forward's (reference.c).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

static double dot(const float *a, const float *b, long long D) {
    double s = 0;
    for (long long d = 0; d < D; d++) s += (double)a[d] * b[d];
    return s;
}

/* One entry of P and dS: query i, key j of head bh (rows already offset to the head); and the
 * same with a softcap's tanh rounded to fp16 (P16, dS16: before the storage type's rounding). */
typedef struct {
    double P, dS, P16, dS16;
} prob_grad;

static prob_grad entry(const ref_shape *s, const float *q, const float *k, const float *v,
                       const float *dout, double lse, double Di) {
    prob_grad e;
    const double score = s->scale * dot(q, k, s->D), dP = dot(dout, v, s->D) - Di;
    if (s->softcap > 0) {
        const double c = s->softcap, t = tanh(score / c), t16 = (double)round_f16((float)t);
        e.P = exp(c * t - lse), e.P16 = exp(c * t16 - lse);
        e.dS = e.P * dP * (1.0 - t * t), e.dS16 = e.P16 * dP * (1.0 - t16 * t16);
    } else {
        e.P = e.P16 = exp(score - lse);
        e.dS = e.dS16 = e.P * dP;
    }
    return e;
}

/* Accumulates err statistics of one gradient row g (floats) against exact ge and fp16 gf. */
typedef struct {
    double max_err, f16_err, max_ref, sq_err, sq_ref;
} stats;

static void add_row(stats *st, const float *g, const double *ge, const double *gf, long long D) {
    for (long long d = 0; d < D; d++) {
        double e = fabs((double)g[d] - ge[d]);
        if (!(e <= st->max_err)) st->max_err = isnan(e) ? INFINITY : e;
        st->sq_err += isfinite(e) ? e * e : INFINITY;
        st->sq_ref += ge[d] * ge[d];
        if (fabs(ge[d]) > st->max_ref) st->max_ref = fabs(ge[d]);
        if (fabs(gf[d] - ge[d]) > st->f16_err) st->f16_err = fabs(gf[d] - ge[d]);
    }
}

static void merge(stats *to, const stats *from) {
    if (!(from->max_err <= to->max_err)) to->max_err = from->max_err;
    if (from->f16_err > to->f16_err) to->f16_err = from->f16_err;
    if (from->max_ref > to->max_ref) to->max_ref = from->max_ref;
    to->sq_err += from->sq_err, to->sq_ref += from->sq_ref;
}

/* One query row's or key row's terms: query i of head bh against key j (rows of [B*H, N] and
 * [B*H_kv, N_k]), added to the float64 gradient rows (ge, and ve for dV) and to the ones with
 * the storage type's roundings (gf, vf). */
static void add_pair(const ref_shape *s, store_type st, const float *Q, const float *K,
                     const float *V, const float *dO, const float *lse, const double *Dsum,
                     long long qrow, long long krow, int is_query, double *ge, double *gf,
                     double *ve, double *vf) {
    const long long D = s->D;
    const prob_grad e =
        entry(s, Q + qrow * D, K + krow * D, V + krow * D, dO + qrow * D, lse[qrow], Dsum[qrow]);
    const double dS16 = round_store((float)e.dS16, st), P16 = round_store((float)e.P16, st);
    /* query row: dQ_i += dS k_j; key row: dK_j += dS q_i, dV_j += P dO_i */
    const float *src = is_query ? K + krow * D : Q + qrow * D;
    const float *dout = dO + qrow * D;
    for (long long d = 0; d < D; d++) {
        ge[d] += e.dS * src[d], gf[d] += dS16 * src[d];
        if (!is_query) ve[d] += e.P * dout[d], vf[d] += P16 * dout[d];
    }
}

/* The float64 gradient row of one checked row: for a query row (an index into [B*H, N]) dQ_i into
 * ge (exact) and gf (the storage type's roundings); for a key row (an index into [B*H_kv, N_k])
 * dK_j into ge, gf and dV_j into ve, vf, summed over the query heads that share the key/value
 * head (GQA). Dsum[B*H*N]: D_i = dO_i . O_i. */
static void reference_row(const ref_shape *s, store_type st, const float *Q, const float *K,
                          const float *V, const float *dO, const float *lse, const double *Dsum,
                          long long row, int is_query, double *ge, double *gf, double *ve,
                          double *vf) {
    const long long N = s->N, D = s->D, H = s->H, N_k = ref_n_k(s), H_kv = ref_kv_heads(s);
    if (is_query) { /* keys lo .. hi */
        const long long bh = row / N, i = row % N;
        long long lo, hi;
        ref_key_range(s, i, &lo, &hi);
        for (long long j = lo; j <= hi; j++)
            add_pair(s, st, Q, K, V, dO, lse, Dsum, row, ref_kv_row(s, bh, j), 1, ge, gf, ve, vf);
    } else { /* every query of every head of the group whose range holds key j */
        const long long bk = row / N_k, j = row % N_k, b = bk / H_kv, group = H / H_kv;
        for (long long i = 0; i < N; i++) {
            long long lo, hi;
            ref_key_range(s, i, &lo, &hi);
            if (j < lo || j > hi) continue;
            for (long long h = bk % H_kv * group; h < (bk % H_kv + 1) * group; h++)
                add_pair(s, st, Q, K, V, dO, lse, Dsum, (b * H + h) * N + i, row, 0, ge, gf, ve,
                         vf);
        }
    }
    for (long long d = 0; d < D; d++) {
        ge[d] *= s->scale;
        gf[d] = round_store((float)(gf[d] * s->scale), st);
        vf[d] = round_store((float)vf[d], st);
    }
}

/* The pass rule per gradient, from the statistics of every checked row. */
static void judge(const stats st[GRADS], long long nonfinite, long long rows,
                  grad_check_result *r) {
    r->pass = nonfinite == 0;
    for (int t = 0; t < GRADS; t++) {
        r->max_abs_err[t] = st[t].max_err;
        r->rel_err[t] = st[t].sq_ref > 0 ? sqrt(st[t].sq_err / st[t].sq_ref) : sqrt(st[t].sq_err);
        r->f16_err[t] = st[t].f16_err;
        r->bound[t] = 2.0 * st[t].f16_err + CHECK_F16_FLOOR * (1.0 + st[t].max_ref);
        if (!(st[t].max_err <= r->bound[t])) r->pass = 0;
    }
    r->rows_checked = rows;
    r->nonfinite = nonfinite;
}

/* One checked row of the host copies (a query row, an index into ref_rows(s, 0), or a key row,
 * into ref_rows(s, 1)): reference_row on its sequence as an unpacked batch of one (common.h); a
 * query row of a sequence without keys has dQ = 0, a key row of one without queries dK = dV = 0. */
static void reference_of_row(const ref_shape *s, store_type st, const float *Q, const float *K,
                             const float *V, const float *dO, const float *lse, const double *Dsum,
                             long long row, int is_query, double *ge, double *gf, double *ve,
                             double *vf) {
    const ref_sequence q = ref_sequence_at(s, ref_sequence_of_row(s, !is_query, row));
    const long long D = s->D;
    if (is_query && q.keys == 0) return; /* no key: dQ = 0 */
    reference_row(&q.s, st, Q + q.q_row * D, K + q.k_row * D, V + q.k_row * D, dO + q.q_row * D,
                  lse + q.q_row, Dsum + q.q_row, row - (is_query ? q.q_row : q.k_row), is_query, ge,
                  gf, ve, vf);
}

void check_gradients(const ref_shape *s, store_type st, const float *Q, const float *K,
                     const float *V, const float *dO, const float *O, const float *lse,
                     const float *dQ, const float *dK, const float *dV, const long long *qrows,
                     long long nq, const long long *krows, long long nk, grad_check_result *r) {
    const long long D = s->D, total = ref_rows(s, 0), kv_total = ref_rows(s, 1);
    long long nonfinite = 0;
#pragma omp parallel for reduction(+ : nonfinite) schedule(static)
    for (long long x = 0; x < total * D; x++) nonfinite += !isfinite(dQ[x]);
#pragma omp parallel for reduction(+ : nonfinite) schedule(static)
    for (long long x = 0; x < kv_total * D; x++) nonfinite += !isfinite(dK[x]) + !isfinite(dV[x]);

    double *Dsum = malloc(sizeof(double) * (size_t)(total > 0 ? total : 1));
    if (!Dsum) {
        memset(r, 0, sizeof *r);
        r->nonfinite = nonfinite, r->pass = 0;
        return;
    }
#pragma omp parallel for schedule(static)
    for (long long x = 0; x < total; x++) Dsum[x] = dot(dO + x * D, O + x * D, D);

    stats all[GRADS];
    memset(all, 0, sizeof all);
#pragma omp parallel
    {
        stats mine[GRADS];
        memset(mine, 0, sizeof mine);
        double *buf = malloc(sizeof(double) * (size_t)(4 * D));
        double *ge = buf, *gf = buf + D, *ve = buf + 2 * D, *vf = buf + 3 * D;
#pragma omp for schedule(dynamic, 1) nowait
        for (long long x = 0; x < nq + nk; x++) {
            const int is_query = x < nq;
            const long long row = is_query ? qrows[x] : krows[x - nq];
            memset(buf, 0, sizeof(double) * (size_t)(4 * D));
            reference_of_row(s, st, Q, K, V, dO, lse, Dsum, row, is_query, ge, gf, ve, vf);
            add_row(&mine[is_query ? GRAD_DQ : GRAD_DK], (is_query ? dQ : dK) + row * D, ge, gf, D);
            if (!is_query) add_row(&mine[GRAD_DV], dV + row * D, ve, vf, D);
        }
        free(buf);
#pragma omp critical
        for (int t = 0; t < GRADS; t++) merge(&all[t], &mine[t]);
    }
    free(Dsum);
    judge(all, nonfinite, nq + nk, r);
}
