/*
 * decode.c: the host program's decode path, for a stage whose descriptor has `decode` (stage 9):
 * N_q = 1..16 new queries per sequence against a KV cache, contiguous [B, N_max, H_kv, D] or paged
 * [num_pages, page_size, H_kv, D] with a block table, each sequence its own length, and new keys
 * and values the call writes into the cache (attention.h's attn_cache).
 *
 *   build/stage9_decode --seq 4 --seq-k 32768 --heads 32 --kv-heads 8 --page-size 64 --bench
 *   build/stage9_decode --self-test      # the decode matrix, ends with "N passed, M failed"
 *
 * It makes the inputs (every cache row random, rows past a sequence's length too, so a kernel that
 * reads past the length shows as wrong; the pages of one sequence scattered by a random block
 * table, a few pages named by no table), runs the stage's decode on NaN-poisoned outputs, checks
 * O and LSE against the float64 reference of common/reference.c sequence by sequence (its L_b keys
 * gathered from the cache: the old ones, then the new ones) and the whole cache against what the
 * call must leave there (the new keys at seqlens[b].., every other element as it was), and times
 * the call with main.c's protocol.
 */
#define _POSIX_C_SOURCE 200809L
#include "decode.h"

#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "attention.h"
#include "common.h"

#define KV_TENSORS 2   /* K and V: both are read from the cache */
#define SPARE_PAGES 3  /* pages of a paged cache that no block table names: a write there strays */
#define PEAKY_MUL 8.0f /* --dist peaky: Q scaled so that each query attends to a few keys */
#define FLAG_VALUES 2  /* a flag's values in the self-test: off, on */

/* fill_normal's streams: each input tensor its own */
enum { STREAM_Q, STREAM_K, STREAM_V, STREAM_K_NEW, STREAM_V_NEW };

/* One run's inputs on the host: the shape, the cache's description and the stored values. */
typedef struct {
    attn_shape s;    /* complete, with the decode layouts */
    attn_cache c;    /* the cache: host arrays until the device's are allocated */
    store_type st;   /* what the stage stores */
    size_t esz;      /* bytes per stored element */
    long long slots; /* key rows in the cache: B * N_max, or num_pages * page_size */
    size_t row;      /* elements per key row: H_kv * D */
    int *seqlens;    /* [B] keys each sequence holds before the call */
    int *table;      /* [B, max_pages] page indices (paged; NULL: contiguous) */
    float *Qf;       /* [B, H, N_q, D] the stored values as floats (the reference's layout) */
    void *Qs;        /* [B, N_q, H, D] stored: Q's device image */
    void *Kc, *Vc;   /* [slots, H_kv, D] stored: the cache before the call; once on the device,
                        what the call must leave in it (expect_new_keys) */
    void *Kn, *Vn;   /* [B, N_new, H_kv, D] stored: the new keys and values (N_new > 0) */
} decode_inputs;

/* splitmix64: the lengths and the block table, a pure function of the seed */
static uint64_t next_random(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static store_type store_of(const attn_shape *s) {
    return attn_this_stage.dtype == ATTN_F32 ? STORE_F32 : s->bf16 ? STORE_BF16 : STORE_F16;
}

/* Element x of a stored array, its bits. */
static uint32_t stored_bits(const void *p, size_t x, size_t esz) {
    return esz == sizeof(float) ? ((const uint32_t *)p)[x] : ((const uint16_t *)p)[x];
}

/* Element x of a stored array, as a float. */
static float stored_at(const void *p, size_t x, store_type st) {
    if (st == STORE_F32) return ((const float *)p)[x];
    const uint16_t h = ((const uint16_t *)p)[x];
    return st == STORE_BF16 ? bf16_to_f32(h) : f16_to_f32(h);
}

static void *host_alloc(size_t bytes, const char *what) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) die_host_oom(what);
    return p;
}

/* n random normal elements times mul from (seed, stream), stored (esz bytes each); their values
 * as floats into f when f is not NULL. */
static void *random_stored(size_t n, uint64_t seed, uint32_t stream, float mul, store_type st,
                           size_t esz, float *f, const char *what) {
    float *x = f ? f : host_alloc(n * sizeof(float), what);
    fill_normal(x, n, seed, stream, mul);
    void *out = host_alloc(n * esz, what);
#pragma omp parallel for schedule(static)
    for (long long i = 0; i < (long long)n; i++) {
        if (st == STORE_F32) {
            ((float *)out)[i] = x[i];
        } else {
            const uint16_t h = st == STORE_BF16 ? f32_to_bf16(x[i]) : f32_to_f16(x[i]);
            ((uint16_t *)out)[i] = h;
            x[i] = st == STORE_BF16 ? bf16_to_f32(h) : f16_to_f32(h);
        }
    }
    if (!f) free(x);
    return out;
}

/* The decode layouts: Q and O [B, N_q, H, D]; K and V cache rows of H_kv * D elements, a batch
 * stride of a sequence's N_max rows (contiguous) or of a page's page_size rows (paged). */
static void decode_layouts(attn_shape *s, int page_size) {
    attn_shape_complete(s);
    const long long H = s->H, H_kv = s->H_kv, D = s->D, N = s->N;
    const long long rows = page_size ? page_size : s->N_k;
    const attn_layout q = {N * H * D, D, H * D}, k = {rows * H_kv * D, D, H_kv * D};
    s->q = s->o = q;
    s->k = s->v = k;
}

/* The cache row that holds key t of sequence b. */
static long long cache_slot(const decode_inputs *in, int b, long long t) {
    const attn_cache *c = &in->c;
    if (!in->table) return (long long)b * in->s.N_k + t;
    const long long page = in->table[(long long)b * c->max_pages + t / c->page_size];
    return page * c->page_size + t % c->page_size;
}

/* The sequence and key a cache row holds (*b = -1: a page no block table names). */
static void slot_owner(const decode_inputs *in, long long slot, int *b, long long *t) {
    const attn_cache *c = &in->c;
    *b = -1, *t = 0;
    if (!in->table) {
        *b = (int)(slot / in->s.N_k), *t = slot % in->s.N_k;
        return;
    }
    const long long page = slot / c->page_size, entries = (long long)in->s.B * c->max_pages;
    for (long long e = 0; e < entries; e++)
        if (in->table[e] == page) {
            *b = (int)(e / c->max_pages);
            *t = e % c->max_pages * c->page_size + slot % c->page_size;
            return;
        }
}

/* The inputs of a run: lengths, block table, Q, the cache and the new keys, stored. */
static void make_inputs(const decode_options *d, decode_inputs *in) {
    memset(in, 0, sizeof *in);
    in->s = d->shape;
    decode_layouts(&in->s, d->page_size);
    const attn_shape *s = &in->s;
    attn_cache *c = &in->c;
    in->st = store_of(s);
    in->esz = attn_this_stage.dtype == ATTN_F32 ? sizeof(float) : sizeof(uint16_t);
    in->row = (size_t)s->H_kv * s->D;
    uint64_t state = d->seed ^ 0x5eed5eed5eed5eedull;

    in->seqlens = host_alloc(sizeof(int) * (size_t)s->B, "the sequences' lengths");
    for (int b = 0; b < s->B; b++)
        in->seqlens[b] =
            d->ragged ? (int)(next_random(&state) % ((uint64_t)d->max_len + 1)) : d->max_len;
    c->seqlens = in->seqlens;
    c->N_new = d->N_new;
    if (d->page_size) { /* the table's entries: the first B * max_pages of a random permutation */
        c->page_size = d->page_size;
        c->max_pages = ceil_div(s->N_k, d->page_size);
        c->num_pages = s->B * c->max_pages + SPARE_PAGES;
        int *perm = host_alloc(sizeof(int) * (size_t)c->num_pages, "the block table");
        for (int p = 0; p < c->num_pages; p++) perm[p] = p;
        for (int p = c->num_pages - 1; p > 0; p--) { /* Fisher-Yates */
            const int q = (int)(next_random(&state) % (uint64_t)(p + 1)), x = perm[p];
            perm[p] = perm[q], perm[q] = x;
        }
        in->table = perm;
        c->block_table = perm;
        in->slots = (long long)c->num_pages * c->page_size;
    } else {
        in->slots = (long long)s->B * s->N_k;
    }

    const size_t q_elems = (size_t)s->B * s->H * s->N * s->D, head_row = (size_t)s->D * in->esz;
    in->Qf = host_alloc(q_elems * sizeof(float), "Q");
    void *q_bhnd = random_stored(q_elems, d->seed, STREAM_Q, d->peaky ? PEAKY_MUL : 1.0f, in->st,
                                 in->esz, in->Qf, "Q");
    in->Qs = host_alloc(q_elems * in->esz, "Q");
    for (long long b = 0; b < s->B; b++) /* [B, H, N_q, D] -> [B, N_q, H, D] */
        for (long long h = 0; h < s->H; h++)
            for (long long i = 0; i < s->N; i++)
                memcpy((char *)in->Qs + (size_t)(((b * s->N + i) * s->H + h) * s->D) * in->esz,
                       (char *)q_bhnd + (size_t)(((b * s->H + h) * s->N + i) * s->D) * in->esz,
                       head_row);
    free(q_bhnd);

    const size_t cache_elems = (size_t)in->slots * in->row;
    in->Kc = random_stored(cache_elems, d->seed, STREAM_K, 1.0f, in->st, in->esz, NULL, "K cache");
    in->Vc = random_stored(cache_elems, d->seed, STREAM_V, 1.0f, in->st, in->esz, NULL, "V cache");
    if (d->N_new > 0) {
        const size_t new_elems = (size_t)s->B * d->N_new * in->row;
        in->Kn =
            random_stored(new_elems, d->seed, STREAM_K_NEW, 1.0f, in->st, in->esz, NULL, "K_new");
        in->Vn =
            random_stored(new_elems, d->seed, STREAM_V_NEW, 1.0f, in->st, in->esz, NULL, "V_new");
        c->K_new = in->Kn, c->V_new = in->Vn;
        const attn_layout nl = {(long long)d->N_new * (long long)in->row, s->D, (long long)in->row};
        c->k_new = c->v_new = nl;
    }
}

/* The host's cache becomes what the call must leave: new key t of sequence b at its key
 * seqlens[b] + t, every other element as it was. */
static void expect_new_keys(decode_inputs *in) {
    const size_t row_bytes = in->row * in->esz;
    for (int b = 0; b < in->s.B; b++)
        for (long long t = 0; t < in->c.N_new; t++) {
            const size_t to = (size_t)cache_slot(in, b, in->seqlens[b] + t) * row_bytes;
            const size_t from = (size_t)((long long)b * in->c.N_new + t) * row_bytes;
            memcpy((char *)in->Kc + to, (char *)in->Kn + from, row_bytes);
            memcpy((char *)in->Vc + to, (char *)in->Vn + from, row_bytes);
        }
}

static void free_inputs(decode_inputs *in) {
    free(in->seqlens), free(in->table), free(in->Qf), free(in->Qs);
    free(in->Kc), free(in->Vc), free(in->Kn), free(in->Vn);
    memset(in, 0, sizeof *in);
}

/* ---- the run on the device ---- */

/* The device buffers of one run. */
enum { DB_Q, DB_O, DB_LSE, DB_K, DB_V, DB_K_NEW, DB_V_NEW, DB_SEQLENS, DB_TABLE, DB_WS, DBS };

/* One decode call, as main.c's timing protocol launches it. */
typedef struct {
    const attn_shape *s;
    const attn_cache *c; /* device pointers */
    void *const *b;      /* the DBS buffers */
    int variant;
} decode_call;

static void enqueue_decode(gpu_ctx *g, const void *arg) {
    const decode_call *k = arg;
    CUDA_CHECK(attn_this_stage.decode(k->s, k->c, &g->dev, k->b[DB_Q], k->b[DB_K], k->b[DB_V],
                                      k->b[DB_O], (float *)k->b[DB_LSE], k->b[DB_WS], k->variant,
                                      g->stream));
}

/* The device buffers, the inputs copied in, and *dc the cache with the device's pointers. 0, or
 * -1 when the device is out of memory (what is allocated stays in b). */
static int alloc_buffers(const decode_inputs *in, gpu_ctx *g, int variant, void *b[DBS],
                         attn_cache *dc, double *mb) {
    const attn_shape *s = &in->s;
    const size_t q_bytes = (size_t)s->B * s->N * s->H * s->D * in->esz;
    const size_t cache_bytes = (size_t)in->slots * in->row * in->esz;
    const size_t new_bytes = (size_t)s->B * in->c.N_new * in->row * in->esz;
    const size_t table_bytes = in->table ? sizeof(int) * (size_t)s->B * in->c.max_pages : 0;
    const size_t bytes[DB_WS] = {q_bytes,
                                 q_bytes,
                                 sizeof(float) * (size_t)s->B * s->H * s->N,
                                 cache_bytes,
                                 cache_bytes,
                                 new_bytes,
                                 new_bytes,
                                 sizeof(int) * (size_t)s->B,
                                 table_bytes};
    const void *const host[DB_WS] = {in->Qs, NULL,   NULL,        in->Kc,   in->Vc,
                                     in->Kn, in->Vn, in->seqlens, in->table};
    const char *const what[DB_WS] = {"Q",     "O",     "lse",     "the K cache",    "the V cache",
                                     "K_new", "V_new", "seqlens", "the block table"};
    for (int i = 0; i < DB_WS; i++) {
        if (dev_alloc(&b[i], bytes[i], what[i], mb) != 0) return -1;
        if (host[i] && bytes[i])
            CUDA_CHECK(cudaMemcpy(b[i], host[i], bytes[i], cudaMemcpyHostToDevice));
    }
    *dc = in->c;
    dc->seqlens = b[DB_SEQLENS];
    dc->block_table = in->table ? b[DB_TABLE] : NULL;
    dc->K_new = in->c.N_new ? b[DB_K_NEW] : NULL;
    dc->V_new = in->c.N_new ? b[DB_V_NEW] : NULL;
    const size_t ws = attn_this_stage.decode_workspace_bytes
                          ? attn_this_stage.decode_workspace_bytes(s, dc, &g->dev, variant)
                          : 0;
    return dev_alloc(&b[DB_WS], ws, "the decode workspace", mb);
}

/* ---- the check ---- */

/* Appends a clause to r->why ("; " between clauses). */
static void add_why(decode_result *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void add_why(decode_result *r, const char *fmt, ...) {
    size_t n = strlen(r->why);
    if (n && n + 2 < sizeof r->why) strcpy(r->why + n, "; "), n += 2;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->why + n, sizeof r->why - n, fmt, ap);
    va_end(ap);
}

/* Elements of the downloaded cache `got` that differ from `want` (byte for byte); the first named
 * in r->why. */
static long long cache_differs(const decode_inputs *in, const void *got, const void *want,
                               const char *name, decode_result *r) {
    const size_t n = (size_t)in->slots * in->row, esz = in->esz;
    long long diff = 0, first = LLONG_MAX;
#pragma omp parallel for reduction(+ : diff) reduction(min : first) schedule(static)
    for (long long x = 0; x < (long long)n; x++)
        if (stored_bits(got, (size_t)x, esz) != stored_bits(want, (size_t)x, esz)) {
            diff++;
            if (x < first) first = x;
        }
    if (!diff) return 0;
    const long long slot = first / (long long)in->row, h = first % (long long)in->row / in->s.D;
    int b;
    long long t;
    slot_owner(in, slot, &b, &t);
    char where[160];
    if (b < 0)
        snprintf(where, sizeof where, "in page %lld, which no block table names",
                 slot / in->c.page_size);
    else
        snprintf(where, sizeof where, "sequence %d key %lld (it holds %d%s)", b, t, in->seqlens[b],
                 in->c.N_new ? " before the new keys" : "");
    add_why(r,
            "the %s cache: %lld elements differ from what the call must leave, the first at %s, "
            "head %lld element %lld: %g, want %g",
            name, diff, where, h, first % in->s.D, stored_at(got, (size_t)first, in->st),
            stored_at(want, (size_t)first, in->st));
    return diff;
}

/* Keys 0 .. L - 1 of sequence b of a cache ([slots, H_kv, D] stored) as floats [H_kv, L, D]. */
static void gather_keys(const decode_inputs *in, const void *cache, int b, long long L,
                        float *out) {
    const long long H_kv = in->s.H_kv, D = in->s.D;
#pragma omp parallel for schedule(static) if (L * H_kv * D > (1 << 16))
    for (long long t = 0; t < L; t++) {
        const size_t at = (size_t)cache_slot(in, b, t) * in->row;
        for (long long h = 0; h < H_kv; h++)
            for (long long e = 0; e < D; e++)
                out[(h * L + t) * D + e] = stored_at(cache, at + (size_t)(h * D + e), in->st);
    }
}

/* How far a sequence's check is from failing: its worst error over its bound. */
static double check_margin(const check_result *c) {
    const double o = c->bound > 0 ? c->max_abs_err / c->bound : c->max_abs_err;
    const double l = c->lse_bound > 0 ? c->lse_err / c->lse_bound : c->lse_err;
    return isnan(o) || isnan(l) ? INFINITY : o > l ? o : l;
}

/* O ([B, H, N_q, D] floats) and lse ([B, H, N_q]) at the picked rows, sequence by sequence, against
 * the float64 reference over its L_b keys (a sequence without keys: O = 0 and LSE = -inf in every
 * row). r->chk: the worst sequence's errors; rows and NaN/Inf counted over all. */
static void check_attention(const decode_options *d, const decode_inputs *in, const float *O,
                            const float *lse, decode_result *r) {
    const attn_shape *s = &in->s;
    const long long per_seq = (long long)s->H * s->N, total = s->B * per_seq, D = s->D;
    const long long want = d->check_rows;
    long long *rows =
        host_alloc(sizeof(long long) * (size_t)(want < 0 || want > total ? total : want),
                   "the list of rows to check");
    const long long nrows = pick_rows(total, want, d->seed, rows);
    long long most = 0;
    for (int b = 0; b < s->B; b++)
        if (in->seqlens[b] + in->c.N_new > most) most = in->seqlens[b] + in->c.N_new;
    float *Kb = host_alloc(sizeof(float) * (size_t)(most * s->H_kv * D), "the reference's keys");
    float *Vb = host_alloc(sizeof(float) * (size_t)(most * s->H_kv * D), "the reference's values");
    long long *local = host_alloc(sizeof(long long) * (size_t)(per_seq), "the rows to check");
    check_result *w = &r->chk;
    memset(w, 0, sizeof *w);
    w->pass = 1;
    r->worst_seq = -1;
    long long k = 0; /* rows[] ascends: sequence b's rows follow sequence b - 1's */
    for (int b = 0; b < s->B; b++) {
        const long long L = in->seqlens[b] + in->c.N_new, first = b * per_seq;
        long long n = 0;
        for (; k < nrows && rows[k] < first + per_seq; k++) local[n++] = rows[k] - first;
        if (L == 0) { /* no key: every row O = 0, LSE = -inf */
            long long wrong = 0;
            for (long long x = 0; x < per_seq; x++) {
                int zero = lse[first + x] == -INFINITY;
                for (long long e = 0; e < D; e++) zero &= O[(first + x) * D + e] == 0.0f;
                wrong += !zero;
            }
            if (wrong)
                add_why(r,
                        "sequence %d holds no key: %lld of its %lld rows are not O = 0, LSE = -inf",
                        b, wrong, per_seq);
            r->empty += wrong;
            w->rows_checked += n;
            continue;
        }
        gather_keys(in, in->Kc, b, L, Kb);
        gather_keys(in, in->Vc, b, L, Vb);
        ref_shape rs = ref_of(s); /* one sequence: its L keys gathered */
        rs.B = 1, rs.N_k = (int)L;
        check_result c;
        check_output(&rs, in->st, in->Qf + first * D, Kb, Vb, O + first * D, lse + first, local, n,
                     &c);
        const long long rows_so_far = w->rows_checked + c.rows_checked;
        const long long nonfinite = w->nonfinite + c.nonfinite;
        const int pass = w->pass && c.pass;
        if (r->worst_seq < 0 || (!c.pass && w->pass) ||
            (c.pass == w->pass && check_margin(&c) > check_margin(w))) {
            *w = c;
            r->worst_seq = b;
        }
        w->rows_checked = rows_so_far, w->nonfinite = nonfinite, w->pass = pass;
        if (!c.pass)
            add_why(r,
                    "O and LSE differ from the float64 reference in sequence %d (%lld keys): "
                    "max_abs_err %.2e (bound %.2e), lse_err %.2e (bound %.1e), %lld NaN/Inf",
                    b, L, c.max_abs_err, c.bound, c.lse_err, c.lse_bound, c.nonfinite);
    }
    r->checked = 1;
    free(rows), free(Kb), free(Vb), free(local);
}

/* The outputs and the cache to the host, checked: r->chk, r->empty, r->k_diff, r->v_diff. */
static void check_run(const decode_options *d, const decode_inputs *in, void *const b[DBS],
                      decode_result *r) {
    const attn_shape *s = &in->s;
    const size_t q_elems = (size_t)s->B * s->N * s->H * s->D, rows = (size_t)s->B * s->H * s->N;
    const size_t cache_bytes = (size_t)in->slots * in->row * in->esz;
    void *img = host_alloc(q_elems * in->esz > cache_bytes ? q_elems * in->esz : cache_bytes,
                           "the copy of an output");
    float *O = host_alloc(q_elems * sizeof(float), "the copy of O");
    float *lse = host_alloc(rows * sizeof(float), "the copy of the lse");
    CUDA_CHECK(cudaMemcpy(img, b[DB_O], q_elems * in->esz, cudaMemcpyDeviceToHost));
#pragma omp parallel for schedule(static) if (q_elems > (1 << 16))
    for (long long x = 0; x < (long long)q_elems; x++) { /* [B, N_q, H, D] -> [B, H, N_q, D] */
        const long long e = x % s->D, h = x / s->D % s->H, i = x / s->D / s->H % s->N;
        const long long bb = x / ((long long)s->D * s->H * s->N);
        O[((bb * s->H + h) * s->N + i) * s->D + e] = stored_at(img, (size_t)x, in->st);
    }
    CUDA_CHECK(cudaMemcpy(lse, b[DB_LSE], rows * sizeof(float), cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(img, b[DB_K], cache_bytes, cudaMemcpyDeviceToHost));
    r->k_diff = cache_differs(in, img, in->Kc, "K", r);
    CUDA_CHECK(cudaMemcpy(img, b[DB_V], cache_bytes, cudaMemcpyDeviceToHost));
    r->v_diff = cache_differs(in, img, in->Vc, "V", r);
    check_attention(d, in, O, lse, r);
    free(img), free(O), free(lse);
}

/* ---- one run ---- */

int decode_run(const decode_options *d, gpu_ctx *g, decode_result *r) {
    memset(r, 0, sizeof *r);
    r->status = "ok";
    r->worst_seq = -1;
    attn_shape s = d->shape;
    decode_layouts(&s, d->page_size);
    /* the decode layouts and key counts are the contract's; what the stage may not take: bf16 */
    const char *why =
        attn_shape_refused(&s, attn_this_stage.takes | ATTN_TAKES_STRIDES | ATTN_TAKES_N_K, 0);
    if (!why) why = attn_this_stage.unsupported(&s, &g->dev, d->variant);
    decode_inputs in;
    memset(&in, 0, sizeof in);
    if (!why) {
        make_inputs(d, &in);
        why = attn_cache_refused(&in.s, &in.c); /* the host's arrays: it reads no element */
    }
    if (why) {
        snprintf(r->why, sizeof r->why, "%s", why);
        r->status = "unsupported";
        free_inputs(&in);
        return ATTN_EXIT_UNSUPPORTED;
    }
    for (int b = 0; b < s.B; b++) r->keys += in.seqlens[b] + d->N_new;
    void *b[DBS] = {0};
    attn_cache dc;
    int rc = ATTN_EXIT_PASS;
    if (alloc_buffers(&in, g, d->variant, b, &dc, &r->device_mb) != 0) {
        r->status = "OOM";
        rc = ATTN_EXIT_OOM;
    } else {
        expect_new_keys(&in);
        /* first run: on NaN-poisoned output (0xff bytes are NaN in fp16, bf16 and fp32) */
        const size_t rows = (size_t)s.B * s.H * s.N;
        CUDA_CHECK(cudaMemset(b[DB_O], 0xff, rows * s.D * in.esz));
        CUDA_CHECK(cudaMemset(b[DB_LSE], 0xff, rows * sizeof(float)));
        const decode_call call = {&in.s, &dc, b, d->variant};
        const double first_ms = time_launch(g, enqueue_decode, &call);
        if (d->check_rows != 0) {
            check_run(d, &in, b, r);
            if (!r->chk.pass || r->empty || r->k_diff || r->v_diff) {
                r->status = "FAIL";
                rc = ATTN_EXIT_WRONG;
            }
        }
        r->t = (timing){first_ms, first_ms, 0.0, 1};
        if (rc == ATTN_EXIT_PASS && first_ms > d->budget_s * 1e3)
            r->status = "over_budget";
        else if (rc == ATTN_EXIT_PASS && d->bench)
            bench(g, d->bench, enqueue_decode, &call, first_ms, &r->t);
        /* FLOPs: QK^T and PV over every key a query reads, 2 D each (causal's saving at N_q <= 16
         * is negligible); bytes: K and V of every key read once */
        const double flops = 4.0 * s.H * s.N * (double)r->keys * s.D;
        const double bytes = (double)r->keys * s.H_kv * s.D * KV_TENSORS * (double)in.esz;
        r->t.tflops = flops / (r->t.ms_median * 1e-3) / 1e12;
        r->gbps = bytes / (r->t.ms_median * 1e-3) / 1e9;
    }
    for (int i = 0; i < DBS; i++)
        if (b[i]) CUDA_CHECK(cudaFree(b[i]));
    free_inputs(&in);
    return rc;
}

void decode_describe(FILE *f, const decode_options *d, const decode_result *r) {
    char vname[64];
    attn_variant_name(attn_this_stage.variants, d->variant, vname, sizeof vname);
    const attn_shape *s = &d->shape;
    fprintf(f, "%s %s B=%d H=%d H_kv=%d N_q=%d N_max=%d D=%d%s%s%s", attn_this_stage.name, vname,
            s->B, s->H, s->H_kv ? s->H_kv : s->H, s->N, s->N_k, s->D, s->causal ? " causal" : "",
            d->peaky ? " peaky" : "", s->bf16 ? " bf16" : "");
    if (d->page_size)
        fprintf(f, " page_size=%d", d->page_size);
    else
        fprintf(f, " contiguous");
    fprintf(f, "%s N_new=%d:", d->ragged ? " ragged" : "", d->N_new);
    if (!strcmp(r->status, "ok") || !strcmp(r->status, "over_budget"))
        fprintf(f, " %lld keys, %.4f ms (%s of %d), %.1f GB/s of cache read, %.2f TFLOP/s,",
                r->keys, r->t.ms_median, r->t.repeats > 1 ? "median" : "one run", r->t.repeats,
                r->gbps, r->t.tflops);
    if (r->checked) {
        if (r->worst_seq >= 0)
            fprintf(f, " max_abs_err %.2e (bound %.2e), lse_err %.2e (bound %.1e) in sequence %d,",
                    r->chk.max_abs_err, r->chk.bound, r->chk.lse_err, r->chk.lse_bound,
                    r->worst_seq);
        fprintf(f, " %lld rows,", r->chk.rows_checked);
        if (r->chk.nonfinite) fprintf(f, " %lld NaN/Inf,", r->chk.nonfinite);
        if (r->empty) fprintf(f, " %lld rows without keys not O = 0, LSE = -inf,", r->empty);
        if (r->k_diff || r->v_diff)
            fprintf(f, " cache: %lld K and %lld V elements wrong,", r->k_diff, r->v_diff);
        else
            fprintf(f, " the cache as it must be,");
    }
    fprintf(f, " %s\n", r->status);
}

/* ---- the decode self-test matrix ---- */

/* Cases per variant. Factor f of case c takes its value ((stride_f c + f) mod CASES) mod count_f:
 * CASES is prime, so (stride_f c + f) mod CASES runs over every case once as c does, and each value
 * of each factor appears in CASES / count_f cases, give or take one; the strides are chosen so that
 * every value of one factor meets every value of any other in some case. */
#define DECODE_TEST_CASES 193
#define DECODE_TEST_WORK (1 << 20) /* rows x keys the reference reads per case, at most ... */
#define DECODE_TEST_MIN_ROWS 16    /* ... but at least this many rows */
static const int test_N_q[] = {1, 2, 4, 16};
/* cache lengths (before the call); 32768 once for each two rounds of the others: its cases cost
 * the most */
static const int test_L[] = {0, 1, 63, 64, 65, 1000, 4097, 32768, 0, 1, 63, 64, 65, 1000, 4097};
static const int test_page[] = {0, 1, 16, 64, 256};                   /* 0: a contiguous cache */
static const int test_batch[][2] = {{1, 0}, {3, 1}, {2, 0}};          /* B, ragged */
static const int test_heads[][2] = {{4, 4}, {8, 2}, {16, 2}, {8, 1}}; /* H, H_kv: 1, 4, 8:1, MQA */
static const int test_D[] = {64, 128};
static const int test_N_new[] = {0, 1, 3};
enum { F_N_Q, F_L, F_PAGE, F_BATCH, F_HEADS, F_CAUSAL, F_D, F_BF16, F_N_NEW, F_PEAKY, FACTORS };
static const int test_stride[FACTORS] = {1, 21, 136, 183, 76, 75, 8, 142, 145, 55};
#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))
#define MAX_REASONS 8 /* distinct reasons for waived cases printed per variant */

static int test_factor(int c, int f, int count) {
    return (int)(((long long)test_stride[f] * c + f) % DECODE_TEST_CASES % count);
}

/* Case c of the matrix for variant v. */
static decode_options decode_test_case(int c, int v, uint64_t seed) {
    const int *bt = test_batch[test_factor(c, F_BATCH, COUNT(test_batch))];
    const int *heads = test_heads[test_factor(c, F_HEADS, COUNT(test_heads))];
    const int L = test_L[test_factor(c, F_L, COUNT(test_L))];
    const int P = test_page[test_factor(c, F_PAGE, COUNT(test_page))];
    const int N_new = test_N_new[test_factor(c, F_N_NEW, COUNT(test_N_new))];
    const int D = test_D[test_factor(c, F_D, COUNT(test_D))];
    int N_max = L + N_new > 1 ? L + N_new : 1; /* rounded up to whole pages */
    if (P) N_max = ceil_div(N_max, P) * P;
    decode_options d = {
        .shape = {.B = bt[0],
                  .H = heads[0],
                  .N = test_N_q[test_factor(c, F_N_Q, COUNT(test_N_q))],
                  .D = D,
                  .causal = test_factor(c, F_CAUSAL, FLAG_VALUES),
                  .scale = 1.0f / sqrtf((float)D),
                  .H_kv = heads[1],
                  .N_k = N_max,
                  .bf16 = attn_this_stage.dtype == ATTN_F16 && test_factor(c, F_BF16, FLAG_VALUES)},
        .page_size = P,
        .ragged = bt[1],
        .max_len = L,
        .N_new = N_new,
        .seed = seed,
        .peaky = test_factor(c, F_PEAKY, FLAG_VALUES),
        .bench = BENCH_NONE,
        .budget_s = INFINITY,
        .variant = v};
    const long long rows = (long long)d.shape.B * d.shape.H * d.shape.N;
    d.check_rows = rows * N_max <= DECODE_TEST_WORK                  ? -1
                   : DECODE_TEST_WORK / N_max > DECODE_TEST_MIN_ROWS ? DECODE_TEST_WORK / N_max
                                                                     : DECODE_TEST_MIN_ROWS;
    return d;
}

int decode_self_test(gpu_ctx *g, uint64_t seed, int variant) {
    int passed = 0, failed = 0;
    const int nv = attn_variant_count(attn_this_stage.variants);
    uint64_t case_no = 0;
    struct timespec t0, t1;
    /* a stage that cannot run here at all is waived as a whole, with its reason */
    attn_shape probe = {.B = 1, .H = 1, .N = 1, .D = 64, .scale = 0.125f, .N_k = 64};
    decode_layouts(&probe, 0);
    const char *why = attn_this_stage.unsupported(&probe, &g->dev, 0);
    if (why) {
        printf("%s: self-test waived on %s: %s\n", attn_this_stage.name, g->name, why);
        return ATTN_EXIT_UNSUPPORTED;
    }
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int v = 0; v < nv; v++) {
        if (variant >= 0 && v != variant) continue;
        char vname[64];
        attn_variant_name(attn_this_stage.variants, v, vname, sizeof vname);
        int vp = 0, vn = 0, waived = 0, reasons = 0;
        char seen[MAX_REASONS][sizeof((decode_result *)0)->why];
        for (int c = 0; c < DECODE_TEST_CASES; c++) {
            const decode_options d = decode_test_case(c, v, seed * 1000003ull + case_no++);
            decode_result r;
            const int rc = decode_run(&d, g, &r);
            if (rc == ATTN_EXIT_UNSUPPORTED) { /* what the stage refuses here (bf16 on sm_75) */
                int r_seen = 0;
                for (int k = 0; k < reasons; k++) r_seen |= !strcmp(seen[k], r.why);
                if (!r_seen) /* each reason once */
                    printf("%s variant %s: waived here: %s\n", attn_this_stage.name, vname, r.why);
                if (!r_seen && reasons < MAX_REASONS) strcpy(seen[reasons++], r.why);
                waived++;
                continue;
            }
            vn++;
            if (rc == ATTN_EXIT_PASS) {
                vp++;
                continue;
            }
            fprintf(stderr, "FAILED: ");
            decode_describe(stderr, &d, &r);
            if (r.why[0]) fprintf(stderr, "  %s\n", r.why);
        }
        printf("%s variant %s, decode: %d passed, %d failed, %d waived\n", attn_this_stage.name,
               vname, vp, vn - vp, waived);
        passed += vp, failed += vn - vp;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    printf("%s decode self-test on %s (smem/block %zu): %.1f s\n", attn_this_stage.name, g->name,
           g->dev.smem_per_block, (t1.tv_sec - t0.tv_sec) + 1e-9 * (t1.tv_nsec - t0.tv_nsec));
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? ATTN_EXIT_WRONG : ATTN_EXIT_PASS;
}
