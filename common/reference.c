/*
 * reference.c: everything the checker trusts. Host fp16 conversion, the input generator,
 * the float64 reference for chosen rows, and the pass rule.
 *
 * The reference sees exactly the values the GPU saw (inputs already rounded to the stage's
 * storage type) and takes every key of a checked row, lo .. hi of attn_key_range (all N_k keys,
 * the causal prefix, or a local window), in float64, so a few dozen rows at N = 262,144 cost
 * about a second. Every element of O and lse is scanned for NaN/Inf: the host poisons both with
 * NaN before a checked run, so unwritten output fails.
 *
 * Pass rule, fp16 or bf16 storage: max|O - O_ref| <= 2 * max|O_16ref - O_ref| + CHECK_F16_FLOOR,
 * where O_16ref is the float64 computation with P rounded to the storage type before PV and O
 * rounded to it: the error a correct 16-bit kernel makes (FlashAttention's own tests use this
 * rule, for bf16 with the reference rounded to bf16). With a softcap, O_16ref also rounds the
 * cap's tanh(s / softcap) to fp16 before multiplying by the softcap: the kernels take the
 * hardware's tanh.approx.f32, whose error (about 2^-11) is an fp16 result's precision, whatever
 * the storage type; the LSE bound then grows by twice the distance of that computation's LSE
 * from the float64 one (relative to 1 + |lse_ref|), as O's does.
 * fp32 storage: max|O - O_ref| <= CHECK_F32_TOL * (1 + max|O_ref|). LSE in both cases.
 *
 * A packed batch (ref_shape's cu_q, cu_k) is checked one sequence at a time, each an unpacked
 * batch of one over its own rows of the host copies (common.h: sequence-major), against its own
 * keys and its own bottom-right mask; the scans for NaN/Inf cover every sequence. Here too: the
 * lengths of --varlen (a list, or random ones).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention.h"
#include "common.h"

uint16_t f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) /* inf, or NaN kept quiet */
        return (uint16_t)(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u | ((ax >> 13) & 0x3ffu) : 0));
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520 rounds to inf */
    if (ax < 0x38800000u) {                                   /* below 2^-14: subnormal */
        if (ax <= 0x33000000u) return (uint16_t)sign;         /* <= 2^-25 rounds to 0 */
        uint32_t mant = (ax & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126u - (ax >> 23); /* value = mant * 2^(e-150); unit 2^-24 */
        uint32_t r = mant >> shift, rem = mant & ((1u << shift) - 1u), half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (r & 1u))) r++;
        return (uint16_t)(sign | r);
    }
    uint32_t r = (ax >> 13) - (112u << 10), rem = ax & 0x1fffu; /* rebias 127 -> 15 */
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) r++;
    return (uint16_t)(sign | r);
}

float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, x;
    if (e == 0) {
        float v = ldexpf((float)m, -24);
        memcpy(&x, &v, 4);
        x |= sign;
    } else if (e == 31) {
        x = sign | 0x7f800000u | (m << 13);
    } else {
        x = sign | ((e + 112u) << 23) | (m << 13);
    }
    float f;
    memcpy(&f, &x, 4);
    return f;
}

uint16_t f32_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u); /* NaN: quiet */
    x += 0x7fffu + ((x >> 16) & 1u); /* round to nearest even; overflow reaches inf */
    return (uint16_t)(x >> 16);
}

float bf16_to_f32(uint16_t h) {
    uint32_t x = (uint32_t)h << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
}

static uint64_t mix64(uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void fill_normal(float *x, size_t n, uint64_t seed, uint32_t stream, float mul) {
    const uint64_t key = mix64(seed ^ ((uint64_t)stream << 56));
    const long long pairs = (long long)((n + 1) / 2);
#pragma omp parallel for schedule(static)
    for (long long p = 0; p < pairs; p++) { /* Box-Muller on two 24-bit uniforms */
        uint64_t a = mix64(key ^ mix64((uint64_t)p));
        float u1 = (float)((a >> 40) + 1) * 0x1p-24f; /* (0, 1] */
        float u2 = (float)(a & 0xffffffu) * 0x1p-24f; /* [0, 1) */
        float r = sqrtf(-2.0f * logf(u1)) * mul, t = 6.283185307f * u2;
        x[2 * p] = r * cosf(t);
        if ((size_t)(2 * p + 1) < n) x[2 * p + 1] = r * sinf(t);
    }
}

/* ---- packed batches: the sequences' lengths ---- */

/* One length of a --varlen list at *p: digits only, 0 .. ATTN_MAX_N; -1 if there is none. */
static long long varlen_length(const char **p) {
    long long v = 0;
    const char *start = *p;
    while (**p >= '0' && **p <= '9' && v <= ATTN_MAX_N) v = v * 10 + (*(*p)++ - '0');
    return *p == start || v > ATTN_MAX_N ? -1 : v;
}

int varlen_parse(const char *spec, int *B, int **cu_q, int **cu_k, char *err, size_t errlen) {
    *B = 0, *cu_q = *cu_k = NULL;
    long long n = 1;
    for (const char *c = spec; *c; c++) n += *c == ',';
    if (n > ATTN_MAX_BH) {
        snprintf(err, errlen, "%lld sequences, more than %d", n, ATTN_MAX_BH);
        return -1;
    }
    int *q = malloc(sizeof(int) * (size_t)(n + 1)), *k = malloc(sizeof(int) * (size_t)(n + 1));
    if (!q || !k) {
        free(q), free(k);
        snprintf(err, errlen, "no host memory for %lld sequences", n);
        return NPY_ERR_NOMEM;
    }
    q[0] = k[0] = 0;
    const char *p = spec;
    for (long long b = 0; b < n; b++) {
        const char *entry = p;
        const long long nq = varlen_length(&p);
        long long nk = nq; /* Nq alone: as many keys */
        if (nq >= 0 && *p == ':') {
            p++;
            nk = varlen_length(&p);
        }
        if (nq < 0 || nk < 0 || (*p != ',' && *p != 0)) {
            const int len = (int)strcspn(entry, ",");
            snprintf(err, errlen,
                     "'%.*s' (sequence %lld) is not Nq or Nq:Nk, lengths of 0 to %d tokens", len,
                     entry, b + 1, ATTN_MAX_N);
            free(q), free(k);
            return -1;
        }
        if (q[b] + nq > ATTN_MAX_N || k[b] + nk > ATTN_MAX_N) {
            snprintf(err, errlen, "more than %d %s tokens in all", ATTN_MAX_N,
                     q[b] + nq > ATTN_MAX_N ? "query" : "key");
            free(q), free(k);
            return -1;
        }
        q[b + 1] = (int)(q[b] + nq), k[b + 1] = (int)(k[b] + nk);
        if (*p == ',') p++;
    }
    *B = (int)n, *cu_q = q, *cu_k = k;
    return 0;
}

/* The stream of the lengths' random numbers (fill_normal's: the tensors' 0 .. 3), and each
 * sequence's draws: its queries', then its keys'. */
#define VARLEN_STREAM 16
#define VARLEN_DRAWS 2

int varlen_random(int B, int max_q, int max_k, uint64_t seed, int *cu_q, int *cu_k) {
    const uint64_t key = mix64(seed ^ ((uint64_t)VARLEN_STREAM << 56));
    cu_q[0] = cu_k[0] = 0;
    for (int b = 0; b < B; b++) {
        /* per side: empty one time in VARLEN_EMPTY_ODDS, else uniform in 0 .. max */
        const uint64_t draw = (uint64_t)b * VARLEN_DRAWS;
        const uint64_t a = mix64(key ^ mix64(draw)), c = mix64(key ^ mix64(draw + 1));
        const long long nq = a % VARLEN_EMPTY_ODDS == 0
                                 ? 0
                                 : (long long)(a / VARLEN_EMPTY_ODDS % ((uint64_t)max_q + 1));
        const long long nk = max_k < 0 ? nq
                             : c % VARLEN_EMPTY_ODDS == 0
                                 ? 0
                                 : (long long)(c / VARLEN_EMPTY_ODDS % ((uint64_t)max_k + 1));
        if (cu_q[b] + nq > ATTN_MAX_N || cu_k[b] + nk > ATTN_MAX_N) return -1;
        cu_q[b + 1] = (int)(cu_q[b] + nq), cu_k[b + 1] = (int)(cu_k[b] + nk);
    }
    return 0;
}

void ref_key_range(const ref_shape *s, long long i, long long *lo, long long *hi) {
    attn_shape m = {.N = s->N,
                    .N_k = (int)ref_n_k(s),
                    .causal = s->causal,
                    .local = s->local,
                    .window_left = s->window_left,
                    .window_right = s->window_right};
    attn_key_range(&m, i, lo, hi);
}

/* A score's softcap: c tanh(s / c), and in *capped16 the same with tanh rounded to fp16 (the
 * 16-bit kernels' tanh.approx.f32); no softcap: s itself, both. */
static double cap_score(double s, double c, double *capped16) {
    if (!(c > 0)) return *capped16 = s;
    const double t = tanh(s / c);
    *capped16 = c * (double)round_f16((float)t);
    return c * t;
}

/* ref_row, with the 16-bit computation's lse in *lse16 (where o_16 is given). */
static void row_reference(const ref_shape *s, store_type st, const float *Q, const float *K,
                          const float *V, long long bh, long long i, double *o_exact, double *o_16,
                          double *lse, double *lse16, double *scratch) {
    const long long N = s->N, D = s->D;
    const float *q = Q + (bh * N + i) * D;          /* [D] */
    const float *Kb = K + ref_kv_row(s, bh, 0) * D; /* [N_k, D]: this head's keys */
    const float *Vb = V + ref_kv_row(s, bh, 0) * D; /* [N_k, D] */
    long long lo, hi;
    ref_key_range(s, i, &lo, &hi);
    double m = -INFINITY, m16 = -INFINITY;
    for (long long j = lo; j <= hi; j++) { /* scratch[j]: the scaled score, uncapped */
        double dot = 0.0, c16;
        for (long long d = 0; d < D; d++) dot += (double)q[d] * (double)Kb[j * D + d];
        scratch[j] = dot * s->scale;
        const double c = cap_score(scratch[j], s->softcap, &c16);
        if (c > m) m = c;
        if (c16 > m16) m16 = c16;
    }
    for (long long d = 0; d < D; d++) {
        o_exact[d] = 0.0;
        if (o_16) o_16[d] = 0.0;
    }
    double l = 0.0, l16 = 0.0;
    for (long long j = lo; j <= hi; j++) {
        double c16;
        const double c = cap_score(scratch[j], s->softcap, &c16);
        const double p = exp(c - m), e16 = exp(c16 - m16), p16 = round_store((float)e16, st);
        const float *v = Vb + j * D;
        l += p, l16 += e16;
        for (long long d = 0; d < D; d++) o_exact[d] += p * (double)v[d];
        if (o_16)
            for (long long d = 0; d < D; d++) o_16[d] += p16 * (double)v[d];
    }
    for (long long d = 0; d < D; d++) { /* no key at all: O = 0 (l = 0) */
        o_exact[d] = l > 0 ? o_exact[d] / l : 0.0;
        if (o_16) o_16[d] = l16 > 0 ? round_store((float)(o_16[d] / l16), st) : 0.0;
    }
    *lse = lo <= hi ? m + log(l) : -INFINITY;
    if (lse16) *lse16 = lo <= hi ? m16 + log(l16) : -INFINITY;
}

void ref_row(const ref_shape *s, store_type st, const float *Q, const float *K, const float *V,
             long long bh, long long i, double *o_exact, double *o_16, double *lse,
             double *scratch) {
    row_reference(s, st, Q, K, V, bh, i, o_exact, o_16, lse, NULL, scratch);
}

/* ---- packed batches: one sequence at a time ---- */

long long ref_rows(const ref_shape *s, int keys) {
    const long long heads = keys ? ref_kv_heads(s) : s->H;
    if (s->cu_q) return heads * (keys ? s->cu_k : s->cu_q)[s->B];
    return (long long)s->B * heads * (keys ? ref_n_k(s) : s->N);
}

long long ref_sequence_of_row(const ref_shape *s, int keys, long long row) {
    const long long heads = keys ? ref_kv_heads(s) : s->H;
    if (!s->cu_q) return row / (heads * (keys ? ref_n_k(s) : s->N));
    const int *cu = keys ? s->cu_k : s->cu_q;
    /* the last sequence whose rows start at or before row (an empty one starts where the next
     * does: the last of them is the one that holds the row) */
    long long lo = 0, hi = s->B - 1;
    while (lo < hi) {
        const long long mid = (lo + hi + 1) / 2;
        if (heads * cu[mid] <= row)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

ref_sequence ref_sequence_at(const ref_shape *s, long long b) {
    ref_sequence q = {.s = *s};
    const long long H = s->H, H_kv = ref_kv_heads(s);
    if (s->cu_q) {
        q.s.N = s->cu_q[b + 1] - s->cu_q[b];
        q.keys = s->cu_k[b + 1] - s->cu_k[b];
        q.q_row = H * s->cu_q[b], q.k_row = H_kv * s->cu_k[b];
    } else {
        q.keys = ref_n_k(s);
        q.q_row = b * H * s->N, q.k_row = b * H_kv * q.keys;
    }
    q.s.B = 1, q.s.H_kv = (int)H_kv, q.s.N_k = (int)q.keys;
    q.s.cu_q = q.s.cu_k = NULL;
    return q;
}

/* The most keys of a sequence: the scratch a row's reference needs. */
static long long most_keys(const ref_shape *s) {
    if (!s->cu_q) return ref_n_k(s);
    long long most = 0;
    for (int b = 0; b < s->B; b++)
        if (s->cu_k[b + 1] - s->cu_k[b] > most) most = s->cu_k[b + 1] - s->cu_k[b];
    return most;
}

static int cmp_row(const void *a, const void *b) {
    const long long x = *(const long long *)a, y = *(const long long *)b;
    return (x > y) - (x < y);
}

long long pick_sequence_rows(const ref_shape *s, int keys, long long want, int edges, uint64_t seed,
                             long long *rows) {
    const long long total = ref_rows(s, keys), heads = keys ? ref_kv_heads(s) : s->H;
    const int *cu = keys ? s->cu_k : s->cu_q;
    long long n = 0;
    for (int b = 0; b < s->B; b++) {
        const long long first = heads * cu[b], len = cu[b + 1] - cu[b], count = heads * len;
        if (count == 0) continue;
        if (want < 0) { /* every row */
            for (long long k = 0; rows && k < count; k++) rows[n + k] = first + k;
            n += count;
            continue;
        }
        /* the sequence's share of want, rounded, at least its first and last row (pick_rows'),
         * and with edges the first and last row of every head */
        long long share = (want * count + total / 2) / total;
        share = share < 2 ? 2 : share > count ? count : share;
        long long *mine = malloc(sizeof(long long) * (size_t)(share + 2 * heads));
        if (!mine) return -1;
        long long got = pick_rows(count, share, seed ^ mix64((uint64_t)b), mine);
        for (long long h = 0; edges && h < heads; h++)
            mine[got++] = h * len, mine[got++] = h * len + len - 1;
        qsort(mine, (size_t)got, sizeof *mine, cmp_row);
        long long unique = 0;
        for (long long k = 0; k < got; k++)
            if (k == 0 || mine[k] != mine[k - 1]) mine[unique++] = mine[k];
        for (long long k = 0; rows && k < unique; k++) rows[n + k] = first + mine[k];
        n += unique;
        free(mine);
    }
    return n;
}

long long pick_rows(long long total, long long want, uint64_t seed, long long *rows) {
    if (want < 0 || want >= total) {
        for (long long r = 0; r < total; r++) rows[r] = r;
        return total;
    }
    if (want == 0) return 0;
    rows[0] = 0;
    if (want == 1) return 1;
    rows[want - 1] = total - 1;
    for (long long k = 1; k < want - 1; k++) { /* one row from each of want-2 equal bins */
        long long lo = 1 + (k - 1) * (total - 2) / (want - 2);
        long long hi = 1 + k * (total - 2) / (want - 2);
        rows[k] = lo + (long long)(mix64(seed ^ (uint64_t)k) % (uint64_t)(hi - lo));
    }
    return want;
}

/* The reference of query row `row` of the host copies (an index into ref_rows(s, 0)): its
 * sequence's keys (none: O = 0, lse = -inf). */
static void reference_of_row(const ref_shape *s, store_type st, const float *Q, const float *K,
                             const float *V, long long row, double *o_exact, double *o_16,
                             double *lse, double *lse16, double *scratch) {
    const ref_sequence q = ref_sequence_at(s, ref_sequence_of_row(s, 0, row));
    const long long D = s->D, local = row - q.q_row;
    if (q.keys == 0) {
        for (long long d = 0; d < D; d++) {
            o_exact[d] = 0.0;
            if (o_16) o_16[d] = 0.0;
        }
        *lse = -INFINITY;
        if (lse16) *lse16 = -INFINITY;
        return;
    }
    row_reference(&q.s, st, Q + q.q_row * D, K + q.k_row * D, V + q.k_row * D, local / q.s.N,
                  local % q.s.N, o_exact, o_16, lse, lse16, scratch);
}

/* Whether query row `row` of the host copies attends to no key (its lse must be -inf). */
static int row_sees_none(const ref_shape *s, long long row) {
    const ref_sequence q = ref_sequence_at(s, ref_sequence_of_row(s, 0, row));
    if (q.keys == 0) return 1;
    long long lo, hi;
    ref_key_range(&q.s, (row - q.q_row) % q.s.N, &lo, &hi);
    return lo > hi;
}

void check_output(const ref_shape *s, store_type st, const float *Q, const float *K, const float *V,
                  const float *O, const float *lse, const long long *rows, long long nrows,
                  check_result *r) {
    const long long D = s->D, total = ref_rows(s, 0);
    const int f16 = st != STORE_F32; /* a 16-bit storage type's pass rule */
    long long nonfinite = 0;
#pragma omp parallel for reduction(+ : nonfinite) schedule(static)
    for (long long x = 0; x < total * D; x++) nonfinite += !isfinite(O[x]);
    /* lse: finite, but -inf exactly where the row attends to no key */
#pragma omp parallel for reduction(+ : nonfinite) schedule(static)
    for (long long x = 0; x < total; x++)
        nonfinite += row_sees_none(s, x) ? !(lse[x] == -INFINITY) : !isfinite(lse[x]);

    double max_err = 0, f16_err = 0, lse_err = 0, lse16_err = 0, max_ref = 0, sq_err = 0,
           sq_ref = 0;
    const long long keys = most_keys(s);
#pragma omp parallel reduction(max : max_err, f16_err, lse_err, lse16_err, max_ref) \
    reduction(+ : sq_err, sq_ref)
    {
        double *scratch = malloc(sizeof(double) * (size_t)(keys + 2 * D));
        double *oe = scratch + keys, *of = oe + D;
#pragma omp for schedule(dynamic, 1)
        for (long long k = 0; k < nrows; k++) {
            double l_ref, l16;
            reference_of_row(s, st, Q, K, V, rows[k], oe, f16 ? of : NULL, &l_ref, &l16, scratch);
            const float *o = O + rows[k] * D;
            for (long long d = 0; d < D; d++) {
                double e = fabs((double)o[d] - oe[d]);
                if (!(e <= max_err)) max_err = isnan(e) ? INFINITY : e;
                sq_err += isfinite(e) ? e * e : INFINITY;
                sq_ref += oe[d] * oe[d];
                if (fabs(oe[d]) > max_ref) max_ref = fabs(oe[d]);
                if (f16 && fabs(of[d] - oe[d]) > f16_err) f16_err = fabs(of[d] - oe[d]);
            }
            /* no key: lse must be -inf (the full scan above counts any other value) */
            double le =
                isinf(l_ref) ? 0.0 : fabs((double)lse[rows[k]] - l_ref) / (1.0 + fabs(l_ref));
            if (!(le <= lse_err)) lse_err = isnan(le) ? INFINITY : le;
            /* the softcap's fp16 tanh moves a correct kernel's lse too (without one: 0) */
            if (f16 && s->softcap > 0 && !isinf(l_ref) &&
                fabs(l16 - l_ref) / (1.0 + fabs(l_ref)) > lse16_err)
                lse16_err = fabs(l16 - l_ref) / (1.0 + fabs(l_ref));
        }
        free(scratch);
    }
    r->max_abs_err = max_err;
    r->rel_err = sq_ref > 0 ? sqrt(sq_err / sq_ref) : sqrt(sq_err);
    r->lse_err = lse_err;
    r->f16_err = f16_err;
    r->bound = f16 ? 2.0 * f16_err + CHECK_F16_FLOOR : CHECK_F32_TOL * (1.0 + max_ref);
    r->lse_bound = f16 ? CHECK_LSE_F16 + 2.0 * lse16_err : CHECK_LSE_F32;
    r->rows_checked = nrows;
    r->nonfinite = nonfinite;
    r->pass = nonfinite == 0 && max_err <= r->bound && lse_err <= r->lse_bound;
}
