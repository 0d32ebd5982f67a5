/*
 * test_common.c: CPU unit tests of the checker, the generator, fp16 conversion and .npy I/O.
 * No GPU needed. `test_common --fixtures DIR` writes the .npy files bad_options.sh feeds the
 * program (good, wrong rank, wrong dtype, wrong shape, truncated).
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention.h"
#include "common.h"
#include "device_info.h"
#include "ring.h"

static int passed, failed;

#define EXPECT(cond, ...)                                            \
    do {                                                             \
        if (cond) {                                                  \
            passed++;                                                \
        } else {                                                     \
            failed++;                                                \
            printf("FAILED %s:%d: %s: ", __FILE__, __LINE__, #cond); \
            printf(__VA_ARGS__);                                     \
            printf("\n");                                            \
        }                                                            \
    } while (0)

static void test_fp16(void) {
    EXPECT(f32_to_f16(1.0f) == 0x3c00, "1.0");
    EXPECT(f32_to_f16(-2.0f) == 0xc000, "-2.0");
    EXPECT(f32_to_f16(65504.0f) == 0x7bff, "max half");
    EXPECT(f32_to_f16(65519.0f) == 0x7bff, "rounds down to max");
    EXPECT(f32_to_f16(65520.0f) == 0x7c00, "rounds to inf");
    EXPECT(f32_to_f16(ldexpf(1, -24)) == 0x0001, "smallest subnormal");
    EXPECT(f32_to_f16(ldexpf(1, -25)) == 0x0000, "half of it ties to even (0)");
    EXPECT(f32_to_f16(ldexpf(3, -26)) == 0x0001, "0.75 ulp rounds up");
    EXPECT(f32_to_f16(ldexpf(3, -25)) == 0x0002, "1.5 ulp ties to even (2)");
    EXPECT(f32_to_f16(1.0f + ldexpf(1, -11)) == 0x3c00, "tie to even, down");
    EXPECT(f32_to_f16(1.0f + ldexpf(3, -11)) == 0x3c02, "tie to even, up");
    EXPECT(f32_to_f16(ldexpf(1023, -24)) == 0x03ff, "largest subnormal");
    EXPECT(isnan(f16_to_f32(f32_to_f16(NAN))), "NaN stays NaN");
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) continue; /* NaN payloads */
        if (f32_to_f16(f16_to_f32((uint16_t)h)) != h) bad++;
    }
    EXPECT(bad == 0, "%d of 65536 halves do not round-trip", bad);
}

static void test_generator(void) {
    size_t n = 200001;
    float *x = malloc(n * sizeof(float)), *y = malloc(n * sizeof(float));
    fill_normal(x, n, 7, 0, 1.0f);
    fill_normal(y, n, 7, 0, 1.0f);
    double mean = 0, var = 0;
    int same = 1;
    for (size_t i = 0; i < n; i++) mean += x[i], same &= x[i] == y[i];
    mean /= (double)n;
    for (size_t i = 0; i < n; i++) var += (x[i] - mean) * (x[i] - mean);
    var /= (double)n;
    EXPECT(same, "same seed, same numbers");
    EXPECT(fabs(mean) < 0.01 && fabs(var - 1) < 0.02, "mean %g var %g", mean, var);
    fill_normal(y, n, 7, 1, 1.0f);
    EXPECT(x[0] != y[0] && x[1000] != y[1000], "another stream differs");
    free(x), free(y);
}

static void test_reference_by_hand(void) {
    /* one query, two keys, D = 1: s = (0, 1), O = (e^-1 * 1 + 1 * 3) / (1 + e^-1) */
    ref_shape s = {1, 1, 2, 1, 0, 1.0, 0, 0, 0, -1, -1, 0.0, NULL, NULL};
    float Q[2] = {1, 0}, K[2] = {0, 1}, V[2] = {1, 3};
    double o, o16, lse, scratch[2];
    ref_row(&s, STORE_F16, Q, K, V, 0, 0, &o, &o16, &lse, scratch);
    double e = exp(-1.0);
    EXPECT(fabs(o - (e + 3) / (1 + e)) < 1e-14, "O = %.17g", o);
    EXPECT(fabs(lse - log(1 + exp(1.0))) < 1e-14, "lse = %.17g", lse);
    /* row 1: q = 0, both scores 0: plain mean of V, lse = log 2 */
    ref_row(&s, STORE_F16, Q, K, V, 0, 1, &o, &o16, &lse, scratch);
    EXPECT(o == 2.0 && o16 == 2.0 && fabs(lse - log(2.0)) < 1e-15, "O = %g lse = %g", o, lse);
    /* causal: row 1 sees keys 0..1, scale 2: s = (0, 2) */
    s.causal = 1;
    s.scale = 2.0;
    ref_row(&s, STORE_F16, Q, K, V, 0, 0, &o, NULL, &lse, scratch);
    EXPECT(o == 1.0 && lse == 0.0, "causal row 0 = V[0]: O = %g lse = %g", o, lse);
}

static void test_causal_first_row(void) {
    ref_shape s = {2, 3, 37, 64, 1, 0.125, 0, 0, 0, -1, -1, 0.0, NULL, NULL};
    size_t n = (size_t)2 * 3 * 37 * 64;
    float *Q = malloc(n * 4), *K = malloc(n * 4), *V = malloc(n * 4);
    fill_normal(Q, n, 3, 0, 8.0f), fill_normal(K, n, 3, 1, 1.0f), fill_normal(V, n, 3, 2, 1.0f);
    for (size_t x = 0; x < n; x++) V[x] = round_f16(V[x]); /* stored fp16: O_f16ref exact too */
    double o[64], o16[64], lse, scratch[37];
    int bad = 0;
    for (long long bh = 0; bh < 6; bh++) {
        ref_row(&s, STORE_F16, Q, K, V, bh, 0, o, o16, &lse, scratch);
        double dot = 0;
        for (int d = 0; d < 64; d++) dot += (double)Q[bh * 37 * 64 + d] * K[bh * 37 * 64 + d];
        for (int d = 0; d < 64; d++) bad += o[d] != V[bh * 37 * 64 + d] || o16[d] != o[d];
        bad += fabs(lse - dot * 0.125) > 1e-12;
    }
    EXPECT(bad == 0, "causal first row is V[0] in every head (%d mismatches)", bad);
    free(Q), free(K), free(V);
}

static void test_bf16(void) {
    EXPECT(f32_to_bf16(1.0f) == 0x3f80 && bf16_to_f32(0x3f80) == 1.0f, "1.0");
    /* 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (1.0); 1 + 3 * 2^-8 rounds up */
    EXPECT(round_bf16(1.0f + 0x1p-8f) == 1.0f, "tie to even: %g", round_bf16(1.0f + 0x1p-8f));
    EXPECT(round_bf16(1.0f + 3 * 0x1p-8f) == 1.0f + 0x1p-6f, "round up");
    EXPECT(round_bf16(-3.0e38f) < -2.9e38f && isinf(round_bf16(3.4028235e38f)), "range, overflow");
    EXPECT(isnan(round_bf16(NAN)), "NaN stays NaN");
    EXPECT(round_store(1.0f + 0x1p-9f, STORE_F16) == 1.0f + 0x1p-9f &&
               round_store(1.0f + 0x1p-9f, STORE_BF16) == 1.0f,
           "fp16 keeps 10 bits, bf16 7");
}

/* How many keys query row i attends to (ref_key_range's lo .. hi). */
static long long keys_of(const ref_shape *s, long long i) {
    long long lo, hi;
    ref_key_range(s, i, &lo, &hi);
    return hi >= lo ? hi - lo + 1 : 0;
}

/* GQA: a query head reads K, V head h / (H / H_kv); the same as MHA with K, V repeated. N_k != N:
 * causal rows see keys up to i + N_k - N; a row that sees none gets O = 0 and lse = -inf. */
static void test_model_inputs(void) {
    enum { B = 2, H = 4, H_KV = 2, N = 5, D = 8 };
    float Q[B * H * N * D], K[B * H_KV * N * D], V[B * H_KV * N * D];
    float Kr[B * H * N * D], Vr[B * H * N * D]; /* K, V repeated per query head */
    fill_normal(Q, sizeof Q / 4, 11, 0, 1.0f);
    fill_normal(K, sizeof K / 4, 11, 1, 1.0f);
    fill_normal(V, sizeof V / 4, 11, 2, 1.0f);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int x = 0; x < N * D; x++) {
                Kr[((b * H + h) * N) * D + x] = K[((b * H_KV + h / 2) * N) * D + x];
                Vr[((b * H + h) * N) * D + x] = V[((b * H_KV + h / 2) * N) * D + x];
            }
    ref_shape g = {B, H, N, D, 1, 0.3, H_KV, 0, 0, -1, -1, 0.0, NULL, NULL},
              m = {B, H, N, D, 1, 0.3, 0, 0, 0, -1, -1, 0.0, NULL, NULL};
    double o1[D], o2[D], l1, l2, scratch[N];
    int bad = 0;
    for (long long bh = 0; bh < B * H; bh++)
        for (long long i = 0; i < N; i++) {
            ref_row(&g, STORE_F32, Q, K, V, bh, i, o1, NULL, &l1, scratch);
            ref_row(&m, STORE_F32, Q, Kr, Vr, bh, i, o2, NULL, &l2, scratch);
            bad += l1 != l2 || memcmp(o1, o2, sizeof o1) != 0;
        }
    EXPECT(bad == 0, "GQA = MHA with K, V repeated (%d rows differ)", bad);
    /* 5 queries against 3 keys, causal: query i sees keys <= i - 2; rows 0, 1 see none */
    ref_shape c = {1, 1, N, D, 1, 0.3, 0, 3, 0, -1, -1, 0.0, NULL, NULL};
    ref_row(&c, STORE_F32, Q, K, V, 0, 1, o1, NULL, &l1, scratch);
    EXPECT(isinf(l1) && l1 < 0 && o1[0] == 0.0 && o1[D - 1] == 0.0, "no key: O = 0, lse = -inf");
    ref_row(&c, STORE_F32, Q, K, V, 0, 2, o1, NULL, &l1, scratch);
    EXPECT(keys_of(&c, 2) == 1 && o1[0] == (double)V[0], "query 2 sees key 0 only: O = V[0]");
    EXPECT(keys_of(&c, 4) == 3 && keys_of(&c, 0) == 0, "the last query sees every key");
    /* 2 queries against 5 keys, causal: query 0 sees keys 0..3, query 1 all 5 */
    ref_shape d = {1, 1, 2, D, 1, 0.3, 0, N, 0, -1, -1, 0.0, NULL, NULL};
    EXPECT(keys_of(&d, 0) == 4 && keys_of(&d, 1) == 5, "bottom-right aligned: %lld %lld",
           keys_of(&d, 0), keys_of(&d, 1));
}

/* ---- local windows and softcap ---- */

/* flash-attn 2's mask for window_size (left, right): mha_fwd's rules (one query is not causal;
 * causal makes right 0; a bound at or past N_k is -1), set_params_fprop's (-1 beside a bound
 * becomes N_k; both -1: no mask), then the mask: query i of N sees key j when i + N_k - N - left <=
 * j <= i + N_k - N + right. */
static int fa_sees(int N, int N_k, int causal, int left, int right, long long i, long long j) {
    if (N == 1) causal = 0;
    if (causal) right = 0;
    if (left >= N_k) left = -1;
    if (right >= N_k) right = -1;
    if (left < 0 && right < 0) return 1;
    if (left < 0) left = N_k;
    if (right < 0) right = N_k;
    const long long diag = i + N_k - N;
    return j >= diag - left && j <= diag + right;
}

static attn_shape window_shape(int N, int N_k, int causal, int local, int left, int right) {
    attn_shape s = {.B = 1, .H = 1, .N = N, .D = 64, .causal = causal, .scale = 0.125f};
    s.N_k = N_k, s.local = local, s.window_left = left, s.window_right = right;
    attn_shape_complete(&s);
    return s;
}

/* attn_shape_complete writes a window in its one form, flash-attn's rules; the mask it leaves
 * (attn_key_range) is flash-attn's for every window, bounds past the keys included. */
static void test_shape_complete(void) {
    attn_shape s = window_shape(8, 10, 1, 1, 5, 7); /* causal makes the right bound 0 */
    EXPECT(s.local && s.causal && s.window_left == 5 && s.window_right == 0, "causal: (%d, %d)",
           s.window_left, s.window_right);
    s = window_shape(8, 10, 0, 1, -1, 0); /* (-1, 0) is causal */
    EXPECT(!s.local && s.causal && s.window_left == -1 && s.window_right == -1,
           "(-1, 0): local %d causal %d (%d, %d)", s.local, s.causal, s.window_left,
           s.window_right);
    s = window_shape(8, 10, 0, 1, -1, -1); /* (-1, -1): no window */
    EXPECT(!s.local && !s.causal, "(-1, -1): local %d causal %d", s.local, s.causal);
    s = window_shape(8, 10, 0, 1, 10, 3); /* a bound at N_k is unbounded */
    EXPECT(s.local && s.window_left == -1 && s.window_right == 3, "(10, 3) of 10 keys: (%d, %d)",
           s.window_left, s.window_right);
    s = window_shape(8, 10, 0, 1, 3, 12); /* beside a left bound, an unbounded right is N_k */
    EXPECT(s.local && s.window_left == 3 && s.window_right == 10, "(3, 12) of 10 keys: (%d, %d)",
           s.window_left, s.window_right);
    s = window_shape(8, 10, 0, 1, 10, 10); /* both past the keys: no window */
    EXPECT(!s.local && !s.causal, "(10, 10) of 10 keys: local %d causal %d", s.local, s.causal);
    s = window_shape(8, 10, 0, 1, 20, 0); /* left past the keys, right 0: causal */
    EXPECT(!s.local && s.causal, "(20, 0) of 10 keys: local %d causal %d", s.local, s.causal);
    s = window_shape(8, 10, 0, 1, -7, 2); /* any negative bound is unbounded */
    EXPECT(s.local && s.window_left == -1 && s.window_right == 2, "(-7, 2): (%d, %d)",
           s.window_left, s.window_right);
    s = window_shape(8, 10, 0, 0, 4, 4); /* no local: the bounds are not read */
    EXPECT(!s.local && s.window_left == -1 && s.window_right == -1, "no window: (%d, %d)",
           s.window_left, s.window_right);
    attn_shape c = {.B = 1, .H = 1, .N = 4, .D = 64, .scale = 1.f, .softcap = -3.f};
    attn_shape_complete(&c);
    EXPECT(c.softcap == 0.f, "a negative softcap is none: %g", (double)c.softcap);
    c.softcap = NAN;
    attn_shape_complete(&c);
    EXPECT(c.softcap == 0.f, "a NaN softcap is none");
    c.softcap = 30.f;
    attn_shape_complete(&c);
    EXPECT(c.softcap == 30.f && (attn_shape_asks(&c, 0) & ATTN_TAKES_SOFTCAP),
           "softcap 30 kept and asked for");
    s = window_shape(8, 10, 0, 1, 2, 2);
    EXPECT((attn_shape_asks(&s, 0) & ATTN_TAKES_LOCAL) &&
               attn_shape_refused(&s, ATTN_TAKES_N_K, 0) &&
               !attn_shape_refused(&s, ATTN_TAKES_N_K | ATTN_TAKES_LOCAL, 0),
           "a window asks ATTN_TAKES_LOCAL");
    /* every window of a few shapes: the completed shape's range is flash-attn's mask */
    const int shapes[][2] = {{1, 1}, {5, 5}, {3, 8}, {8, 3}, {1, 9}, {9, 1}, {7, 16}};
    int bad = 0, runs = 0;
    for (int k = 0; k < (int)(sizeof shapes / sizeof shapes[0]); k++)
        for (int causal = 0; causal < 2; causal++)
            for (int left = -2; left <= 18; left++)
                for (int right = -2; right <= 18; right++) {
                    const int N = shapes[k][0], N_k = shapes[k][1];
                    const attn_shape w = window_shape(N, N_k, causal, 1, left, right);
                    for (long long i = 0; i < N; i++) {
                        long long lo, hi;
                        attn_key_range(&w, i, &lo, &hi);
                        for (long long j = 0; j < N_k; j++)
                            bad +=
                                (j >= lo && j <= hi) != fa_sees(N, N_k, causal, left, right, i, j);
                        bad += lo < 0 || hi >= N_k;
                    }
                    runs++;
                }
    EXPECT(bad == 0, "attn_key_range against flash-attn's mask: %d differences in %d windows", bad,
           runs);
}

/* A few ranges by hand: N_k != N, windows, causal. */
static void test_key_range(void) {
    long long lo, hi;
    attn_shape s = window_shape(4, 6, 0, 1, 0, 0); /* query i sees key i + 2 alone */
    attn_key_range(&s, 0, &lo, &hi);
    EXPECT(lo == 2 && hi == 2, "(0, 0), 4 of 6: row 0 sees %lld..%lld", lo, hi);
    attn_key_range(&s, 3, &lo, &hi);
    EXPECT(lo == 5 && hi == 5, "(0, 0), 4 of 6: row 3 sees %lld..%lld", lo, hi);
    s = window_shape(6, 4, 0, 1, 1, 0); /* 6 queries of 4 keys: rows 0, 1 see none */
    attn_key_range(&s, 1, &lo, &hi);
    EXPECT(lo > hi, "(1, 0), 6 of 4: row 1 sees none (%lld..%lld)", lo, hi);
    attn_key_range(&s, 2, &lo, &hi);
    EXPECT(lo == 0 && hi == 0, "(1, 0), 6 of 4: row 2 sees %lld..%lld", lo, hi);
    attn_key_range(&s, 5, &lo, &hi);
    EXPECT(lo == 2 && hi == 3, "(1, 0), 6 of 4: row 5 sees %lld..%lld", lo, hi);
    s = window_shape(10, 10, 0, 1, 3, 5);
    attn_key_range(&s, 0, &lo, &hi);
    EXPECT(lo == 0 && hi == 5, "(3, 5): row 0 sees %lld..%lld", lo, hi);
    attn_key_range(&s, 6, &lo, &hi);
    EXPECT(lo == 3 && hi == 9, "(3, 5): row 6 sees %lld..%lld", lo, hi);
    s = window_shape(10, 10, 1, 1, 3, 5); /* causal: (3, 0) */
    attn_key_range(&s, 6, &lo, &hi);
    EXPECT(lo == 3 && hi == 6, "causal (3, 5): row 6 sees %lld..%lld", lo, hi);
    s = window_shape(3, 7, 0, 1, -1, 1); /* unbounded left */
    attn_key_range(&s, 0, &lo, &hi);
    EXPECT(lo == 0 && hi == 5, "(-1, 1), 3 of 7: row 0 sees %lld..%lld", lo, hi);
    s = window_shape(3, 7, 1, 0, -1, -1); /* causal alone */
    attn_key_range(&s, 2, &lo, &hi);
    EXPECT(lo == 0 && hi == 6, "causal, 3 of 7: row 2 sees %lld..%lld", lo, hi);
    /* the checker's range is the same */
    ref_shape r = {1, 1, 6, 8, 0, 1.0, 0, 4, 1, 1, 0, 0.0, NULL, NULL};
    EXPECT(keys_of(&r, 1) == 0 && keys_of(&r, 2) == 1 && keys_of(&r, 5) == 2,
           "ref_key_range: %lld %lld %lld", keys_of(&r, 1), keys_of(&r, 2), keys_of(&r, 5));
}

/* Stage 10's schedule (ring.h): every GPU's slice, and over the P steps of every GPU each (query,
 * key) pair of the sequence is computed exactly once where the mask lets it be seen and never where
 * it does not, the diagonal blocks' causal mask included; zigzag gives every GPU the same work. */
static long long ring_token(const ring_slice *sl, long long row) {
    return row < sl->rows[0] ? sl->start[0] + row : sl->start[1] + row - sl->rows[0];
}

static void test_ring_schedule(void) {
    static const long long Ns[] = {1, 2, 3, 7, 8, 13, 64};
    for (int P = 1; P <= 4; P++)
        for (int layout = 0; layout < 2; layout++)
            for (int causal = 0; causal < 2; causal++)
                for (size_t ni = 0; ni < sizeof Ns / sizeof Ns[0]; ni++) {
                    const long long N = Ns[ni];
                    int *seen = calloc((size_t)(N * N), sizeof(int)),
                        *owner = calloc((size_t)N, sizeof(int));
                    long long covered = 0, work[4] = {0};
                    for (int r = 0; r < P; r++) {
                        const ring_slice sl = ring_split(N, P, (ring_layout)layout, r);
                        for (long long row = 0; row < sl.n; row++) owner[ring_token(&sl, row)]++;
                        covered += sl.n;
                        for (int t = 0; t < P; t++) {
                            const ring_block b = ring_step(N, P, (ring_layout)layout, causal, r, t);
                            const ring_slice src =
                                ring_split(N, P, (ring_layout)layout, ((r - t) % P + P) % P);
                            for (long long i = b.q_row; i < b.q_row + b.q_rows; i++)
                                for (long long j = b.k_row; j < b.k_row + b.k_rows; j++) {
                                    if (b.causal && j > i) continue; /* the block's own mask */
                                    seen[ring_token(&sl, i) * N + ring_token(&src, j)]++;
                                    work[r]++;
                                }
                        }
                    }
                    int bad = covered != N;
                    for (long long i = 0; i < N; i++) bad |= owner[i] != 1;
                    for (long long i = 0; i < N; i++)
                        for (long long j = 0; j < N; j++)
                            bad |= seen[i * N + j] != (!causal || j <= i);
                    EXPECT(!bad,
                           "ring schedule P=%d %s%s N=%lld: a pair computed twice, never, or "
                           "against the mask",
                           P, layout ? "contiguous" : "zigzag", causal ? " causal" : "", N);
                    if (layout == RING_ZIGZAG && causal && N % (2 * P) == 0) {
                        long long lo = work[0], hi = work[0];
                        for (int r = 1; r < P; r++)
                            lo = work[r] < lo ? work[r] : lo, hi = work[r] > hi ? work[r] : hi;
                        EXPECT(hi - lo <= N / (2 * P), "zigzag P=%d N=%lld: work %lld..%lld", P, N,
                               lo, hi);
                    }
                    free(seen);
                    free(owner);
                }
}

/* The backward's pieces (ring.h: ring_cut_of): along each side of every block the pieces add up to
 * the block, each but the last of ring_piece_rows() rows and the last of 1 to that many; a block is
 * cut only where it is unmasked, P > 1 and longer than a piece; ring_pieces_max bounds them all. */
static void test_ring_pieces(void) {
    static const long long Ns[] = {1, 7, 64, 1000, 4097};
    static const long long pieces[] = {1, 3, 64, 384, 1LL << 20};
    for (int P = 1; P <= 4; P++)
        for (int layout = 0; layout < 2; layout++)
            for (int causal = 0; causal < 2; causal++)
                for (size_t ni = 0; ni < sizeof Ns / sizeof Ns[0]; ni++)
                    for (size_t pi = 0; pi < sizeof pieces / sizeof pieces[0]; pi++) {
                        ring_shape s;
                        memset(&s, 0, sizeof s);
                        s.N = Ns[ni], s.P = P, s.layout = (ring_layout)layout, s.causal = causal;
                        s.piece = pieces[pi];
                        int bad = 0;
                        for (int r = 0; r < P; r++)
                            for (int t = 0; t < P; t++) {
                                const ring_block b = ring_step(s.N, P, s.layout, causal, r, t);
                                if (!b.q_rows || !b.k_rows) continue;
                                for (int side = RING_QUERIES; side <= RING_KEYS; side++) {
                                    const ring_cut c = ring_cut_of(&s, &b, side);
                                    const long long total = side == RING_KEYS ? b.k_rows : b.q_rows;
                                    const int cut = P > 1 && !b.causal && total > s.piece;
                                    bad |= (c.count - 1) * c.rows + c.last != total;
                                    bad |= c.last < 1 || c.last > c.rows;
                                    bad |= (c.count > 1) != cut;
                                    bad |= cut && c.rows != s.piece;
                                    bad |= c.count > ring_pieces_max(&s, side);
                                }
                            }
                        EXPECT(!bad,
                               "ring pieces P=%d %s%s N=%lld piece %lld: the pieces do not "
                               "tile a block, or cut one they should not",
                               P, layout ? "contiguous" : "zigzag", causal ? " causal" : "", s.N,
                               s.piece);
                    }
}

/* The reference's softcap and window against the softmax written out in float64. */
static void test_softcap_forward(void) {
    enum { N = 3, N_K = 5, D = 4 };
    float Q[N * D], K[N_K * D], V[N_K * D];
    fill_normal(Q, N * D, 21, 0, 2.0f), fill_normal(K, N_K * D, 21, 1, 1.0f);
    fill_normal(V, N_K * D, 21, 2, 1.0f);
    const double scale = 0.9, cap = 1.5;
    /* 3 queries of 5 keys, window (1, 0): query i sees keys i + 1 .. i + 2 */
    const ref_shape s = {1, 1, N, D, 0, scale, 0, N_K, 1, 1, 0, cap, NULL, NULL};
    double worst = 0, worst_lse = 0, capped_off = 0;
    for (int i = 0; i < N; i++) {
        double sc[N_K], m = -INFINITY, l = 0, o[D] = {0}, ro[D], ro16[D], rl, scratch[N_K];
        for (int j = i + 1; j <= i + 2; j++) {
            double dot = 0;
            for (int d = 0; d < D; d++) dot += (double)Q[i * D + d] * K[j * D + d];
            sc[j] = cap * tanh(scale * dot / cap);
            capped_off = fmax(capped_off, fabs(sc[j] - scale * dot));
            m = fmax(m, sc[j]);
        }
        for (int j = i + 1; j <= i + 2; j++) {
            l += exp(sc[j] - m);
            for (int d = 0; d < D; d++) o[d] += exp(sc[j] - m) * V[j * D + d];
        }
        ref_row(&s, STORE_F16, Q, K, V, 0, i, ro, ro16, &rl, scratch);
        for (int d = 0; d < D; d++) worst = fmax(worst, fabs(ro[d] - o[d] / l));
        worst_lse = fmax(worst_lse, fabs(rl - (m + log(l))));
    }
    EXPECT(capped_off > 0.1, "the cap bites: scores move by %g", capped_off);
    EXPECT(worst < 1e-14 && worst_lse < 1e-14, "softcap and window: O off by %g, lse by %g", worst,
           worst_lse);
    /* the cap is read: the same row uncapped differs */
    ref_shape u = s;
    u.softcap = 0;
    double a[D], b[D], la, lb, scratch[N_K];
    ref_row(&s, STORE_F32, Q, K, V, 0, 1, a, NULL, &la, scratch);
    ref_row(&u, STORE_F32, Q, K, V, 0, 1, b, NULL, &lb, scratch);
    EXPECT(fabs(la - lb) > 1e-3, "softcap 0 is no cap: lse %g vs %g", la, lb);
}

/* The float64 loss sum_i dO_i . O_i of the reference's forward (every row of every head). */
static double loss_of(const ref_shape *s, const float *Q, const float *K, const float *V,
                      const float *dO) {
    double total = 0, o[8], l, scratch[16];
    for (long long bh = 0; bh < (long long)s->B * s->H; bh++)
        for (long long i = 0; i < s->N; i++) {
            ref_row(s, STORE_F32, Q, K, V, bh, i, o, NULL, &l, scratch);
            for (int d = 0; d < s->D; d++) total += o[d] * dO[(bh * s->N + i) * s->D + d];
        }
    return total;
}

/* The backward reference against central differences of the float64 forward: softcap, windows,
 * GQA, rows with no key. 1 if every gradient agrees to 1e-6 (within `off` of it when the
 * differences are moved by `off`: the comparison can fail). */
static int gradients_match(ref_shape s, double off, double *worst) {
    const int D = s.D, N = s.N, N_k = (int)ref_n_k(&s), H = s.H, H_kv = (int)ref_kv_heads(&s);
    const size_t nq = (size_t)H * N * D, nk = (size_t)H_kv * N_k * D;
    float *Q = malloc(nq * 4), *K = malloc(nk * 4), *V = malloc(nk * 4), *dO = malloc(nq * 4);
    float *O = malloc(nq * 4), *lse = malloc((size_t)H * N * 4);
    float *g[GRADS] = {malloc(nq * 4), malloc(nk * 4), malloc(nk * 4)};
    fill_normal(Q, nq, 31, 0, 2.0f), fill_normal(K, nk, 31, 1, 1.0f);
    fill_normal(V, nk, 31, 2, 1.0f), fill_normal(dO, nq, 31, 3, 1.0f);
    for (long long bh = 0; bh < H; bh++)
        for (long long i = 0; i < N; i++) {
            double o[8], l, scratch[16];
            ref_row(&s, STORE_F32, Q, K, V, bh, i, o, NULL, &l, scratch);
            for (int d = 0; d < D; d++) O[(bh * N + i) * D + d] = (float)o[d];
            lse[bh * N + i] = (float)l;
        }
    float *in[GRADS] = {Q, K, V};
    const size_t count[GRADS] = {nq, nk, nk};
    const float h = 0x1p-10f; /* x +- h is exact for |x| < 2^13 */
    for (int t = 0; t < GRADS; t++)
        for (size_t x = 0; x < count[t]; x++) {
            const float keep = in[t][x];
            in[t][x] = keep + h;
            const double up = loss_of(&s, Q, K, V, dO);
            in[t][x] = keep - h;
            const double down = loss_of(&s, Q, K, V, dO);
            in[t][x] = keep;
            g[t][x] = (float)((up - down) / (2.0 * h) + off);
        }
    long long qrows[64], krows[64];
    for (long long r = 0; r < (long long)H * N; r++) qrows[r] = r;
    for (long long r = 0; r < (long long)H_kv * N_k; r++) krows[r] = r;
    grad_check_result r;
    check_gradients(&s, STORE_F32, Q, K, V, dO, O, lse, g[0], g[1], g[2], qrows, (long long)H * N,
                    krows, (long long)H_kv * N_k, &r);
    *worst = fmax(r.max_abs_err[GRAD_DQ], fmax(r.max_abs_err[GRAD_DK], r.max_abs_err[GRAD_DV]));
    free(Q), free(K), free(V), free(dO), free(O), free(lse);
    for (int t = 0; t < GRADS; t++) free(g[t]);
    return r.nonfinite == 0 && *worst < 1e-5;
}

static void test_softcap_backward(void) {
    double worst;
    /* 3 queries of 5 keys, window (1, 1), softcap 1.5, two query heads on one key/value head */
    const ref_shape a = {1, 2, 3, 4, 0, 0.9, 1, 5, 1, 1, 1, 1.5, NULL, NULL};
    EXPECT(gradients_match(a, 0, &worst), "window (1, 1), softcap 1.5, GQA: off by %g", worst);
    EXPECT(!gradients_match(a, 1e-4, &worst), "a gradient moved by 1e-4 fails: off by %g", worst);
    /* 5 queries of 3 keys, causal, window (1, 0), softcap 0.8: rows 0, 1 see no key */
    const ref_shape b = {1, 1, 5, 4, 1, 0.9, 0, 3, 1, 1, 0, 0.8, NULL, NULL};
    EXPECT(gradients_match(b, 0, &worst), "causal window (1, 0), softcap 0.8: off by %g", worst);
    /* the cap's derivative is read: the uncapped reference disagrees with the capped gradients */
    const ref_shape c = {1, 1, 4, 4, 0, 0.9, 0, 6, 1, 2, 3, 0.0, NULL, NULL};
    EXPECT(gradients_match(c, 0, &worst), "window (2, 3), no softcap: off by %g", worst);
}

/* check_output on a windowed, capped shape: the right rows pass (rows with no key: lse -inf), the
 * rows of another window or another cap fail. */
static int window_check(int other_window, double other_cap) {
    enum { H = 2, N = 40, N_K = 24, D = 64 };
    const ref_shape s = {1, H, N, D, 0, 0.125, 1, N_K, 1, 5, 3, 3.0, NULL, NULL};
    ref_shape w = s;
    if (other_window) w.window_left = 6;
    if (other_cap > 0) w.softcap = other_cap;
    const size_t nq = (size_t)H * N * D, nk = (size_t)N_K * D;
    float *Q = malloc(nq * 4), *K = malloc(nk * 4), *V = malloc(nk * 4), *O = malloc(nq * 4);
    float lse[H * N];
    fill_normal(Q, nq, 41, 0, 8.0f), fill_normal(K, nk, 41, 1, 1.0f),
        fill_normal(V, nk, 41, 2, 1.0f);
    for (size_t x = 0; x < nq; x++) Q[x] = round_f16(Q[x]);
    for (size_t x = 0; x < nk; x++) K[x] = round_f16(K[x]), V[x] = round_f16(V[x]);
    for (long long r = 0; r < H * N; r++) {
        double o[D], o16[D], l, scratch[N_K];
        ref_row(&w, STORE_F16, Q, K, V, r / N, r % N, o, o16, &l, scratch);
        for (int d = 0; d < D; d++) O[r * D + d] = (float)o16[d];
        lse[r] = (float)l;
    }
    long long rows[H * N];
    const long long n = pick_rows(H * N, -1, 1, rows);
    check_result c;
    check_output(&s, STORE_F16, Q, K, V, O, lse, rows, n, &c);
    free(Q), free(K), free(V), free(O);
    return c.pass;
}

static void test_window_pass_rule(void) {
    EXPECT(window_check(0, 0), "window (5, 3), softcap 3, 40 of 24 keys: the right rows pass");
    EXPECT(!window_check(1, 0), "the rows of window (6, 3) fail");
    EXPECT(!window_check(0, 3.5), "the rows of softcap 3.5 fail");
}

static void test_pick_rows(void) {
    long long rows[100];
    long long n = pick_rows(1000, 10, 5, rows);
    int ok = n == 10 && rows[0] == 0 && rows[9] == 999;
    for (int i = 1; i < 10; i++) ok &= rows[i] > rows[i - 1];
    EXPECT(ok, "first, last, increasing");
    EXPECT(pick_rows(7, -1, 5, rows) == 7 && rows[6] == 6, "all rows");
    EXPECT(pick_rows(7, 50, 5, rows) == 7, "more than there are: all");
    EXPECT(pick_rows(7, 0, 5, rows) == 0, "none");
}

/* Builds an output from the reference (optionally with a mistake) and checks it. */
typedef enum { RIGHT, NAN_UNCHECKED, SHIFTED_MASK, ROW_SWAP, SKIPPED_KEY } mistake;

static int check_with(int f16, mistake m, int causal) {
    ref_shape s = {1, 2, 97, 64, causal, 0.125, 0, 0, 0, -1, -1, 0.0, NULL, NULL};
    size_t n = (size_t)2 * 97 * 64, rows = 2 * 97;
    float *Q = malloc(n * 4), *K = malloc(n * 4), *V = malloc(n * 4), *O = malloc(n * 4);
    float *lse = malloc(rows * 4);
    fill_normal(Q, n, 11, 0, 1.0f), fill_normal(K, n, 11, 1, 1.0f), fill_normal(V, n, 11, 2, 1.0f);
    if (f16)
        for (size_t x = 0; x < n; x++)
            Q[x] = round_f16(Q[x]), K[x] = round_f16(K[x]), V[x] = round_f16(V[x]);
    double o[64], o16[64], l, scratch[97];
    for (long long r = 0; r < (long long)rows; r++) {
        ref_shape t = s;
        long long bh = r / 97, i = r % 97;
        if (m == SHIFTED_MASK && causal) { /* off by one: row i also sees key i+1 */
            if (i + 1 < 97) {
                t.causal = 0;
                t.N = (int)(i + 2);
                /* rows of a shorter sequence: same K, V prefix, but Q row index i */
                float *Qs = malloc((size_t)(i + 2) * 64 * 4),
                      *Ks = malloc((size_t)(i + 2) * 64 * 4);
                float *Vs = malloc((size_t)(i + 2) * 64 * 4);
                memcpy(Qs, Q + (bh * 97) * 64, (size_t)(i + 2) * 64 * 4);
                memcpy(Ks, K + (bh * 97) * 64, (size_t)(i + 2) * 64 * 4);
                memcpy(Vs, V + (bh * 97) * 64, (size_t)(i + 2) * 64 * 4);
                ref_row(&t, STORE_F16, Qs, Ks, Vs, 0, i, o, o16, &l, scratch);
                free(Qs), free(Ks), free(Vs);
            } else {
                ref_row(&t, STORE_F16, Q, K, V, bh, i, o, o16, &l, scratch);
            }
        } else if (m == ROW_SWAP && i > 0) {
            ref_row(&t, STORE_F16, Q, K, V, bh, i - 1, o, o16, &l, scratch);
        } else if (m == SKIPPED_KEY) { /* key 0 left out of every row but the first */
            ref_row(&t, STORE_F16, Q, K, V, bh, i, o, o16, &l, scratch);
            if (i > 0) {
                ref_shape u = t;
                u.N = (int)(97 - 1);
                /* drop key 0 by shifting K and V by one row */
                float *Ks = K + bh * 97 * 64 + 64, *Vs = V + bh * 97 * 64 + 64;
                float *Kt = malloc(97 * 64 * 4), *Vt = malloc(97 * 64 * 4),
                      *Qt = malloc(97 * 64 * 4);
                memcpy(Kt, Ks, 96 * 64 * 4), memcpy(Vt, Vs, 96 * 64 * 4);
                memcpy(Qt + 64, Q + (bh * 97 + i) * 64, 64 * 4);
                ref_row(&u, STORE_F16, Qt, Kt, Vt, 0, causal ? i - 1 : 1, o, o16, &l, scratch);
                free(Kt), free(Vt), free(Qt);
            }
        } else {
            ref_row(&t, STORE_F16, Q, K, V, bh, i, o, o16, &l, scratch);
        }
        for (int d = 0; d < 64; d++) O[r * 64 + d] = (float)(f16 ? o16[d] : o[d]);
        lse[r] = (float)l;
    }
    long long picked[2 * 97]; /* a right answer is checked at every row, mistakes at a sample */
    long long np = pick_rows((long long)rows, m == RIGHT ? -1 : 8, 1, picked);
    if (m == NAN_UNCHECKED) { /* poison an element of a row that is not checked */
        long long r = picked[1] + 1;
        O[r * 64 + 5] = NAN;
    }
    check_result c;
    check_output(&s, f16, Q, K, V, O, lse, picked, np, &c);
    free(Q), free(K), free(V), free(O), free(lse);
    return c.pass;
}

static void test_pass_rule(void) {
    for (int f16 = 0; f16 < 2; f16++) {
        for (int causal = 0; causal < 2; causal++) {
            EXPECT(check_with(f16, RIGHT, causal), "f16=%d causal=%d: right answer passes", f16,
                   causal);
            EXPECT(!check_with(f16, NAN_UNCHECKED, causal),
                   "f16=%d causal=%d: NaN in an unchecked row fails", f16, causal);
            EXPECT(!check_with(f16, ROW_SWAP, causal), "f16=%d causal=%d: row i-1 fails", f16,
                   causal);
            EXPECT(!check_with(f16, SKIPPED_KEY, causal), "f16=%d causal=%d: a skipped key fails",
                   f16, causal);
        }
        EXPECT(!check_with(f16, SHIFTED_MASK, 1), "f16=%d: causal mask off by one fails", f16);
    }
}

/* ---- packed batches ---- */

/* attn_sequence_of (attention.h) on the host: unpacked, packed, and arrays that lie. */
static void test_sequence_of(void) {
    attn_varlen none = {NULL, NULL, 0, 0};
    attn_sequence q = attn_sequence_of(&none, 2, 3, 10, 7);
    EXPECT(q.q_row == 0 && q.k_row == 0 && q.lse_row == 2 * 3 * 10 && q.lse_head == 10 &&
               q.N == 10 && q.N_k == 7,
           "unpacked: rows 0 (the batch stride places b), lse [B, H, N]: %lld %lld %lld %lld %d %d",
           q.q_row, q.k_row, q.lse_row, q.lse_head, q.N, q.N_k);
    const int cq[] = {0, 5, 5, 12}, ck[] = {0, 3, 7, 7};
    const attn_varlen v = {cq, ck, 12, 7};
    q = attn_sequence_of(&v, 0, 4, 7, 4);
    EXPECT(q.q_row == 0 && q.k_row == 0 && q.N == 5 && q.N_k == 3 && q.lse_row == 0 &&
               q.lse_head == 12,
           "packed, sequence 0: %lld %lld %d %d", q.q_row, q.k_row, q.N, q.N_k);
    q = attn_sequence_of(&v, 1, 4, 7, 4);
    EXPECT(q.q_row == 5 && q.k_row == 3 && q.N == 0 && q.N_k == 4,
           "packed, sequence 1 (no query): %lld %lld %d %d", q.q_row, q.k_row, q.N, q.N_k);
    q = attn_sequence_of(&v, 2, 4, 7, 4);
    EXPECT(q.q_row == 5 && q.k_row == 7 && q.N == 7 && q.N_k == 0 && q.lse_row == 5,
           "packed, sequence 2 (no key): %lld %lld %d %d", q.q_row, q.k_row, q.N, q.N_k);
    /* arrays that lie: negative, decreasing, past the tensors, longer than N: clamped inside */
    const int bq[] = {-4, 3, 1, 40, 50}, bk[] = {2, 100, -1, 6, 6};
    const attn_varlen w = {bq, bk, 30, 6};
    int bad = 0;
    for (int b = 0; b < 4; b++) {
        const attn_sequence s = attn_sequence_of(&w, b, 2, 5, 3);
        bad += s.q_row < 0 || s.q_row + s.N > 30 || s.k_row < 0 || s.k_row + s.N_k > 6;
        bad += s.N < 0 || s.N > 5 || s.N_k < 0 || s.N_k > 3 || s.lse_row + s.N > 30;
    }
    const attn_sequence s0 = attn_sequence_of(&w, 0, 2, 5, 3),
                        s2 = attn_sequence_of(&w, 2, 2, 5, 3);
    EXPECT(bad == 0 && s0.q_row == 0 && s0.N == 3 && s0.k_row == 2 && s0.N_k == 3 &&
               s2.q_row == 1 && s2.N == 5 && s2.N_k == 3,
           "bad arrays stay inside the tensors (%d out): %lld %d %lld %d / %lld %d %d", bad,
           s0.q_row, s0.N, s0.k_row, s0.N_k, s2.q_row, s2.N, s2.N_k);
}

/* varlen_parse: --varlen's lists; the errors name the entry. */
static void test_varlen_parse(void) {
    int B, *q, *k;
    char err[256];
    int rc = varlen_parse("1000,0,37:512", &B, &q, &k, err, sizeof err);
    EXPECT(rc == 0 && B == 3 && q[0] == 0 && q[1] == 1000 && q[2] == 1000 && q[3] == 1037 &&
               k[1] == 1000 && k[2] == 1000 && k[3] == 1512,
           "1000,0,37:512: rc %d B %d", rc, B);
    if (rc == 0) free(q), free(k);
    rc = varlen_parse("0:5", &B, &q, &k, err, sizeof err);
    EXPECT(rc == 0 && B == 1 && q[1] == 0 && k[1] == 5, "0:5: rc %d", rc);
    if (rc == 0) free(q), free(k);
    rc = varlen_parse("1073741824", &B, &q, &k, err, sizeof err);
    EXPECT(rc == 0 && q[1] == ATTN_MAX_N, "one sequence of ATTN_MAX_N: rc %d", rc);
    if (rc == 0) free(q), free(k);
    const char *bad[][2] = {{"", "'' (sequence 1)"},
                            {",", "'' (sequence 1)"},
                            {"1,,2", "'' (sequence 2)"},
                            {"4,", "'' (sequence 2)"},
                            {"a", "'a' (sequence 1)"},
                            {"-1", "'-1'"},
                            {"+1", "'+1'"},
                            {" 1", "' 1'"},
                            {"1 ", "'1 '"},
                            {"3:", "'3:'"},
                            {":3", "':3'"},
                            {"1:2:3", "'1:2:3'"},
                            {"5,7x", "'7x' (sequence 2)"},
                            {"1073741825", "lengths of 0 to 1073741824"},
                            {"99999999999999999999", "'99999999999999999999'"},
                            {"1073741824,1", "more than 1073741824 query tokens"},
                            {"1:1073741824,0:1", "more than 1073741824 key tokens"}};
    int wrong = 0;
    for (int t = 0; t < (int)(sizeof bad / sizeof bad[0]); t++) {
        err[0] = 0;
        rc = varlen_parse(bad[t][0], &B, &q, &k, err, sizeof err);
        if (rc != -1 || !strstr(err, bad[t][1]) || q || k) {
            wrong++;
            printf("  varlen_parse('%s'): rc %d, '%s' (want '%s')\n", bad[t][0], rc, err,
                   bad[t][1]);
        }
    }
    EXPECT(wrong == 0, "%d bad lists not refused as they should be", wrong);
    /* more sequences than a grid's B x H holds */
    char *many = malloc(2 * (ATTN_MAX_BH + 1) + 1);
    for (int b = 0; b <= ATTN_MAX_BH; b++) many[2 * b] = '1', many[2 * b + 1] = ',';
    many[2 * ATTN_MAX_BH + 1] = 0;
    rc = varlen_parse(many, &B, &q, &k, err, sizeof err);
    char over[64];
    snprintf(over, sizeof over, "%d sequences", ATTN_MAX_BH + 1);
    EXPECT(rc == -1 && strstr(err, over), "ATTN_MAX_BH + 1 sequences: rc %d '%s'", rc, err);
    many[2 * ATTN_MAX_BH - 1] = 0;
    rc = varlen_parse(many, &B, &q, &k, err, sizeof err);
    EXPECT(rc == 0 && B == ATTN_MAX_BH && q[B] == ATTN_MAX_BH, "ATTN_MAX_BH sequences: rc %d", rc);
    if (rc == 0) free(q), free(k);
    free(many);
}

/* varlen_random: a pure function of the seed, in bounds, empty sequences among them, keys as many
 * as queries unless bounded apart. */
static void test_varlen_random(void) {
    enum { B = 400 };
    int q[B + 1], k[B + 1], q2[B + 1], k2[B + 1];
    EXPECT(varlen_random(B, 100, -1, 5, q, k) == 0 && varlen_random(B, 100, -1, 5, q2, k2) == 0 &&
               !memcmp(q, q2, sizeof q) && !memcmp(k, k2, sizeof k),
           "same seed, same lengths");
    int empty = 0, full = 0, out = 0, apart = 0;
    for (int b = 0; b < B; b++) {
        const int n = q[b + 1] - q[b];
        empty += n == 0, full += n == 100, out += n < 0 || n > 100, apart += n != k[b + 1] - k[b];
    }
    EXPECT(out == 0 && apart == 0 && empty > B / VARLEN_EMPTY_ODDS / 2 && full > 0,
           "0 .. 100, keys as many: %d out, %d apart, %d empty, %d of 100", out, apart, empty,
           full);
    varlen_random(B, 100, 30, 5, q2, k2);
    int kout = 0, kempty = 0;
    apart = 0;
    for (int b = 0; b < B; b++) {
        const int n = k2[b + 1] - k2[b];
        kout += n < 0 || n > 30, kempty += n == 0, apart += n != q2[b + 1] - q2[b];
    }
    EXPECT(kout == 0 && kempty > B / VARLEN_EMPTY_ODDS / 2 && apart > B / 2 && q2[B] == q[B],
           "keys 0 .. 30 apart, queries the same: %d out, %d empty, %d apart", kout, kempty, apart);
    varlen_random(B, 100, -1, 6, q2, k2);
    EXPECT(memcmp(q, q2, sizeof q) != 0, "another seed, other lengths");
    int big_q[9], big_k[9];
    const int rc = varlen_random(8, ATTN_MAX_N, -1, 1, big_q, big_k);
    EXPECT(rc == -1 || (rc == 0 && big_q[8] <= ATTN_MAX_N), "tokens past ATTN_MAX_N refused");
    int tiny_q[2], tiny_k[2];
    EXPECT(varlen_random(1, 0, 0, 9, tiny_q, tiny_k) == 0 && tiny_q[1] == 0 && tiny_k[1] == 0,
           "bounds of 0: one empty sequence");
}

/* flash-attn's varlen mask, written out: the window (left, right) completed on the whole batch
 * (attn_shape_complete: its bounds against the longest sequence's keys), then applied to
 * sequence b as its own attention of N_b queries and N_k_b keys, aligned to its bottom right. */
static int packed_sees(const attn_shape *w, int N_b, int N_k_b, long long i, long long j) {
    const long long diag = i + N_k_b - N_b;
    if (j < 0 || j >= N_k_b) return 0;
    if (w->causal && j > diag) return 0;
    if (w->local && w->window_left >= 0 && j < diag - w->window_left) return 0;
    if (w->local && w->window_right >= 0 && j > diag + w->window_right) return 0;
    return 1;
}

enum { PK_B = 6, PK_H = 2, PK_HKV = 1, PK_D = 8 };
static const int pk_q[PK_B + 1] = {0, 5, 5, 12, 15, 19, 20},
                             pk_k[PK_B + 1] = {0, 3, 7, 14, 14, 23, 24};

/* Query row i of a sequence by a direct float64 softmax over packed_sees(w, mask_N, mask_N_k):
 * o = sum_j e^(s_j - m) V_j (unnormalised, PK_D of them), *m the row's max score, *l the sum of
 * e^(s_j - m) (0: the row sees no key); the scores softcapped where w has a softcap. */
static void packed_row(const attn_shape *w, int mask_N, int mask_N_k, int i, const float *q,
                       const float *K, const float *V, int N_k_b, double *o, double *m, double *l) {
    double sc[24];
    *m = -INFINITY, *l = 0;
    for (int d = 0; d < PK_D; d++) o[d] = 0;
    for (int j = 0; j < N_k_b; j++) {
        if (!packed_sees(w, mask_N, mask_N_k, i, j)) continue;
        double dot = 0;
        for (int d = 0; d < PK_D; d++) dot += (double)q[d] * K[j * PK_D + d];
        sc[j] = w->scale * dot;
        if (w->softcap > 0) sc[j] = w->softcap * tanh(sc[j] / w->softcap);
        *m = fmax(*m, sc[j]);
    }
    for (int j = 0; j < N_k_b; j++) {
        if (!packed_sees(w, mask_N, mask_N_k, i, j)) continue;
        *l += exp(sc[j] - *m);
        for (int d = 0; d < PK_D; d++) o[d] += exp(sc[j] - *m) * V[j * PK_D + d];
    }
}

/* A packed batch's host copies (sequence-major, common.h) with O and lse by a direct float64
 * softmax over packed_sees; in float. `whole`: the mask aligned to the whole batch's N and N_k
 * (7 and 9) rather than each sequence's, a kernel's mistake. */
typedef struct {
    float Q[PK_H * 20 * PK_D], K[PK_HKV * 24 * PK_D], V[PK_HKV * 24 * PK_D], dO[PK_H * 20 * PK_D];
    float O[PK_H * 20 * PK_D], lse[PK_H * 20];
} packed_data;

static void packed_direct(const attn_shape *w, packed_data *p, uint64_t seed, int whole) {
    fill_normal(p->Q, sizeof p->Q / 4, seed, 0, 2.0f),
        fill_normal(p->K, sizeof p->K / 4, seed, 1, 1.0f);
    fill_normal(p->V, sizeof p->V / 4, seed, 2, 1.0f),
        fill_normal(p->dO, sizeof p->dO / 4, seed, 3, 1.0f);
    for (int b = 0; b < PK_B; b++) {
        const int N_b = pk_q[b + 1] - pk_q[b], N_k_b = pk_k[b + 1] - pk_k[b];
        const int mask_N = whole ? 7 : N_b, mask_N_k = whole ? 9 : N_k_b;
        for (int h = 0; h < PK_H; h++)
            for (int i = 0; i < N_b; i++) {
                const float *q = p->Q + ((long long)PK_H * pk_q[b] + h * N_b + i) * PK_D;
                const float *K = p->K + (long long)PK_HKV * pk_k[b] * PK_D; /* one kv head */
                const float *V = p->V + (long long)PK_HKV * pk_k[b] * PK_D;
                double m, l, o[PK_D];
                packed_row(w, mask_N, mask_N_k, i, q, K, V, N_k_b, o, &m, &l);
                const long long row = (long long)PK_H * pk_q[b] + h * N_b + i;
                for (int d = 0; d < PK_D; d++)
                    p->O[row * PK_D + d] = l > 0 ? (float)(o[d] / l) : 0.f;
                p->lse[row] = l > 0 ? (float)(m + log(l)) : -INFINITY;
            }
    }
}

static ref_shape packed_ref(const attn_shape *w) {
    ref_shape r = ref_of(w);
    r.cu_q = pk_q, r.cu_k = pk_k;
    return r;
}

/* The packed batch's shape: sequences 5:3, 0:4, 7:7, 3:0, 4:9, 1:1, the window completed against
 * the longest sequence (9 keys). */
static attn_shape packed_shape(int causal, int local, int left, int right, float softcap) {
    attn_shape w = {.B = PK_B,
                    .H = PK_H,
                    .N = 7,
                    .D = PK_D,
                    .causal = causal,
                    .scale = 0.4f,
                    .H_kv = PK_HKV,
                    .N_k = 9,
                    .local = local,
                    .window_left = left,
                    .window_right = right,
                    .softcap = softcap};
    w.varlen = (attn_varlen){pk_q, pk_k, pk_q[PK_B], pk_k[PK_B]};
    attn_shape_complete(&w);
    return w;
}

/* The checker's per-sequence reference against the direct answer, every mask; and what it must
 * catch: a row of another sequence's keys, an unwritten row, a finite lse of a row without keys,
 * the mask aligned to the whole batch rather than the sequence. */
static void test_packed_check(void) {
    static packed_data p;
    const int masks[][5] = {{0, 0, 0, 0, 0},  {1, 0, 0, 0, 0}, {0, 1, 0, 0, 0}, {0, 1, 2, 0, 0},
                            {0, 1, -1, 1, 0}, {1, 1, 3, 0, 0}, {0, 1, 1, 2, 1}, {1, 0, 0, 0, 1}};
    long long rows[PK_H * 20], n;
    int wrong = 0;
    for (int m = 0; m < (int)(sizeof masks / sizeof masks[0]); m++) {
        const attn_shape w = packed_shape(masks[m][0], masks[m][1], masks[m][2], masks[m][3],
                                          masks[m][4] ? 1.5f : 0.f);
        packed_direct(&w, &p, 50 + m, 0);
        const ref_shape r = packed_ref(&w);
        n = pick_sequence_rows(&r, 0, -1, 0, 1, rows);
        check_result c;
        check_output(&r, STORE_F32, p.Q, p.K, p.V, p.O, p.lse, rows, n, &c);
        if (!c.pass || c.max_abs_err > 1e-6 || c.lse_err > 1e-6 || n != PK_H * 20) {
            wrong++;
            printf("  mask %d: pass %d, O off by %g, lse by %g, %lld rows, %lld NaN/Inf\n", m,
                   c.pass, c.max_abs_err, c.lse_err, n, c.nonfinite);
        }
    }
    EXPECT(wrong == 0, "the per-sequence reference = the direct answer (%d masks differ)", wrong);

    const attn_shape w = packed_shape(1, 1, 2, 0, 0.f);
    const ref_shape r = packed_ref(&w);
    n = pick_sequence_rows(&r, 0, -1, 0, 1, rows);
    check_result c;
    packed_direct(&w, &p, 60, 0);
    /* sequence 4's first row (query 0 of head 0) as sequence 2's last query sees its keys */
    const long long first4 = (long long)PK_H * pk_q[4];
    for (int d = 0; d < PK_D; d++) p.O[first4 * PK_D + d] = p.O[(PK_H * pk_q[3] - 1) * PK_D + d];
    check_output(&r, STORE_F32, p.Q, p.K, p.V, p.O, p.lse, rows, n, &c);
    EXPECT(!c.pass, "another sequence's row in a sequence's first row fails (err %g)",
           c.max_abs_err);
    packed_direct(&w, &p, 60, 0);
    p.O[(PK_H * pk_q[2] + 3) * PK_D + 1] = NAN; /* a row of sequence 2, unchecked */
    check_output(&r, STORE_F32, p.Q, p.K, p.V, p.O, p.lse, rows, 2, &c);
    EXPECT(!c.pass && c.nonfinite == 1, "an unwritten row of a middle sequence fails (%lld)",
           c.nonfinite);
    packed_direct(&w, &p, 60, 0);
    p.lse[PK_H * pk_q[3] + 1] = 0.f; /* sequence 3 has no key: lse must stay -inf */
    check_output(&r, STORE_F32, p.Q, p.K, p.V, p.O, p.lse, rows, n, &c);
    EXPECT(!c.pass, "a finite lse in a sequence without keys fails");
    packed_direct(&w, &p, 60, 0);
    /* the mask aligned to the whole batch's N, N_k (7, 9) instead of each sequence's */
    packed_direct(&w, &p, 60, 1);
    check_output(&r, STORE_F32, p.Q, p.K, p.V, p.O, p.lse, rows, n, &c);
    EXPECT(!c.pass, "the mask aligned to the whole batch fails (O err %g, lse err %g)",
           c.max_abs_err, c.lse_err);
}

/* The float64 loss sum dO . O of a packed batch, by the direct softmax. */
static double packed_loss(const attn_shape *w, packed_data *p) {
    double total = 0;
    for (int b = 0; b < PK_B; b++) {
        const int N_b = pk_q[b + 1] - pk_q[b], N_k_b = pk_k[b + 1] - pk_k[b];
        for (int h = 0; h < PK_H; h++)
            for (int i = 0; i < N_b; i++) {
                const long long row = (long long)PK_H * pk_q[b] + h * N_b + i;
                const float *q = p->Q + row * PK_D;
                const float *K = p->K + (long long)pk_k[b] * PK_D,
                            *V = p->V + (long long)pk_k[b] * PK_D;
                double m, l, o[PK_D];
                packed_row(w, N_b, N_k_b, i, q, K, V, N_k_b, o, &m, &l);
                for (int d = 0; d < PK_D; d++)
                    total += (l > 0 ? o[d] / l : 0.0) * p->dO[row * PK_D + d];
            }
    }
    return total;
}

/* check_gradients on a packed batch against central differences of the direct loss: every
 * sequence (no query: dK = dV = 0; no key: dQ = 0), GQA, a window and a softcap. */
static void test_packed_gradients(void) {
    static packed_data p;
    static float g[GRADS][PK_H * 24 * PK_D];
    const attn_shape w = packed_shape(1, 1, 3, 0, 1.5f);
    packed_direct(&w, &p, 70, 0);
    float *in[GRADS] = {p.Q, p.K, p.V};
    const size_t count[GRADS] = {(size_t)PK_H * pk_q[PK_B] * PK_D,
                                 (size_t)PK_HKV * pk_k[PK_B] * PK_D,
                                 (size_t)PK_HKV * pk_k[PK_B] * PK_D};
    const float h = 0x1p-10f;
    for (int t = 0; t < GRADS; t++)
        for (size_t x = 0; x < count[t]; x++) {
            const float keep = in[t][x];
            in[t][x] = keep + h;
            const double up = packed_loss(&w, &p);
            in[t][x] = keep - h;
            const double down = packed_loss(&w, &p);
            in[t][x] = keep;
            g[t][x] = (float)((up - down) / (2.0 * h));
        }
    const ref_shape r = packed_ref(&w);
    long long qrows[PK_H * 24], krows[PK_HKV * 24];
    const long long nq = pick_sequence_rows(&r, 0, -1, 0, 1, qrows),
                    nk = pick_sequence_rows(&r, 1, -1, 0, 1, krows);
    grad_check_result c;
    check_gradients(&r, STORE_F32, p.Q, p.K, p.V, p.dO, p.O, p.lse, g[0], g[1], g[2], qrows, nq,
                    krows, nk, &c);
    const double worst =
        fmax(c.max_abs_err[GRAD_DQ], fmax(c.max_abs_err[GRAD_DK], c.max_abs_err[GRAD_DV]));
    EXPECT(c.nonfinite == 0 && worst < 1e-5 && nq == PK_H * 20 && nk == PK_HKV * 24,
           "packed gradients = central differences: off by %g (%lld, %lld rows)", worst, nq, nk);
    /* sequence 1 has no query: its keys' gradients are 0; a stray value there fails */
    g[1][(long long)pk_k[1] * PK_D + 2] = 0.01f;
    check_gradients(&r, STORE_F32, p.Q, p.K, p.V, p.dO, p.O, p.lse, g[0], g[1], g[2], qrows, nq,
                    krows, nk, &c);
    EXPECT(!c.pass, "dK of a sequence without queries must be 0 (err %g)", c.max_abs_err[GRAD_DK]);
    g[1][(long long)pk_k[1] * PK_D + 2] = 0.f;
    g[0][(long long)PK_H * pk_q[3] * PK_D] = 0.01f; /* sequence 3 has no key: dQ = 0 */
    check_gradients(&r, STORE_F32, p.Q, p.K, p.V, p.dO, p.O, p.lse, g[0], g[1], g[2], qrows, nq,
                    krows, nk, &c);
    EXPECT(!c.pass, "dQ of a sequence without keys must be 0 (err %g)", c.max_abs_err[GRAD_DQ]);
}

/* The rows the checker picks in a packed batch: inside the sequences, increasing, every sequence
 * with rows its first and last, with edges every head's; all of them when asked. */
static void test_sequence_rows(void) {
    const attn_shape w = packed_shape(0, 0, 0, 0, 0.f);
    const ref_shape r = packed_ref(&w);
    EXPECT(ref_rows(&r, 0) == PK_H * 20 && ref_rows(&r, 1) == PK_HKV * 24, "ref_rows %lld %lld",
           ref_rows(&r, 0), ref_rows(&r, 1));
    int bad = 0;
    for (long long x = 0; x < PK_H * 20; x++) {
        const long long b = ref_sequence_of_row(&r, 0, x);
        bad += x < (long long)PK_H * pk_q[b] || x >= (long long)PK_H * pk_q[b + 1];
    }
    for (long long x = 0; x < PK_HKV * 24; x++) {
        const long long b = ref_sequence_of_row(&r, 1, x);
        bad += x < (long long)PK_HKV * pk_k[b] || x >= (long long)PK_HKV * pk_k[b + 1];
    }
    EXPECT(bad == 0, "ref_sequence_of_row: %d rows in the wrong sequence (empty ones between)",
           bad);
    long long rows[PK_H * 24];
    for (int edges = 0; edges < 2; edges++) {
        const long long n = pick_sequence_rows(&r, 0, 4, edges, 3, rows);
        int first = 0, last = 0, order = 0;
        for (long long k = 0; k < n; k++) order += k > 0 && rows[k] <= rows[k - 1];
        for (int b = 0; b < PK_B; b++) {
            const long long len = pk_q[b + 1] - pk_q[b];
            for (int h = 0; h < (edges ? PK_H : 1); h++)
                for (long long k = 0; len && k < n; k++) {
                    first += rows[k] == PK_H * pk_q[b] + h * len;
                    last += rows[k] == PK_H * pk_q[b] + (edges ? h : PK_H - 1) * len + len - 1;
                }
        }
        const int want = edges ? PK_H * 5 : 5; /* 5 sequences with queries */
        EXPECT(order == 0 && first == want && last == want &&
                   n == pick_sequence_rows(&r, 0, 4, edges, 3, NULL),
               "edges %d: %lld rows, %d firsts, %d lasts (want %d), %d out of order", edges, n,
               first, last, want, order);
    }
    EXPECT(pick_sequence_rows(&r, 1, -1, 0, 3, rows) == PK_HKV * 24 && rows[23] == 23,
           "every key row");
}

/* The checker on an unpacked batch and the same as a packed batch of sequences of one length:
 * the same rows, the same numbers. */
static void test_packed_as_unpacked(void) {
    enum { B = 3, H = 2, N = 6, D = 8 };
    float Q[B * H * N * D], K[B * H * N * D], V[B * H * N * D], O[B * H * N * D], lse[B * H * N];
    fill_normal(Q, sizeof Q / 4, 80, 0, 1.0f), fill_normal(K, sizeof K / 4, 80, 1, 1.0f);
    fill_normal(V, sizeof V / 4, 80, 2, 1.0f), fill_normal(O, sizeof O / 4, 80, 3, 0.1f);
    for (int x = 0; x < B * H * N; x++) lse[x] = 1.f;
    const int cu[B + 1] = {0, N, 2 * N, 3 * N};
    ref_shape u = {B, H, N, D, 1, 0.3, 0, 0, 0, -1, -1, 0.0, NULL, NULL}, p = u;
    p.cu_q = p.cu_k = cu;
    long long rows[B * H * N];
    const long long n = pick_rows(B * H * N, -1, 1, rows);
    check_result a, b;
    check_output(&u, STORE_F16, Q, K, V, O, lse, rows, n, &a);
    check_output(&p, STORE_F16, Q, K, V, O, lse, rows, n, &b);
    /* (rel_err sums over threads in any order: its last bits may differ) */
    EXPECT(a.max_abs_err == b.max_abs_err && fabs(a.rel_err - b.rel_err) <= 1e-12 * a.rel_err &&
               a.lse_err == b.lse_err && a.f16_err == b.f16_err && a.nonfinite == b.nonfinite,
           "unpacked %g %g, packed %g %g", a.max_abs_err, a.lse_err, b.max_abs_err, b.lse_err);
}

static void test_npy(const char *dir) {
    char path[512], err[256];
    long long shp[4] = {2, 1, 3, 4};
    float f[24];
    uint16_t h[24];
    for (int i = 0; i < 24; i++) f[i] = (float)i * 0.5f - 3, h[i] = f32_to_f16(f[i]);
    snprintf(path, sizeof path, "%s/rt32.npy", dir);
    EXPECT(npy_write(path, NPY_F32, 4, shp, f, err, sizeof err) == 0, "%s", err);
    npy_array a;
    int rc = npy_read(path, &a, err, sizeof err);
    EXPECT(rc == 0 && a.dtype == NPY_F32 && a.ndim == 4 && a.shape[2] == 3 &&
               memcmp(a.data, f, sizeof f) == 0,
           "f32 round trip: %s", rc ? err : "content differs");
    if (rc == 0) free(a.data);
    snprintf(path, sizeof path, "%s/rt16.npy", dir);
    long long shp1[1] = {24};
    EXPECT(npy_write(path, NPY_F16, 1, shp1, h, err, sizeof err) == 0, "%s", err);
    rc = npy_read(path, &a, err, sizeof err);
    EXPECT(rc == 0 && a.dtype == NPY_F16 && a.ndim == 1 && a.shape[0] == 24 &&
               memcmp(a.data, h, sizeof h) == 0,
           "f16 round trip: %s", rc ? err : "content differs");
    if (rc == 0) free(a.data);
    snprintf(path, sizeof path, "%s/missing.npy", dir);
    EXPECT(npy_read(path, &a, err, sizeof err) != 0 && strstr(err, "cannot open"), "missing: %s",
           err);
}

/* The usage rule of head dims (device_info.h): a multiple of 8 from 32 to 256, each edge. */
static void test_head_dim_rule(void) {
    const int ok[] = {32, 40, 64, 96, 128, 248, 256},
              refused[] = {0, -8, 8, 24, 31, 36, 100, 257, 264, 512};
    for (int t = 0; t < (int)(sizeof ok / sizeof ok[0]); t++)
        EXPECT(attn_head_dim_ok(ok[t]), "D = %d is a head dim", ok[t]);
    for (int t = 0; t < (int)(sizeof refused / sizeof refused[0]); t++)
        EXPECT(!attn_head_dim_ok(refused[t]), "D = %d is not a head dim", refused[t]);
    EXPECT(!strcmp(ATTN_HEAD_DIMS, "a multiple of 8 from 32 to 256"), "ATTN_HEAD_DIMS is '%s'",
           ATTN_HEAD_DIMS);
}

/* A head dim other than 64 and 128 (D = 40, 256) in the checker: the reference against a direct
 * float64 softmax(scale Q K^T) V and its gradients on a tiny shape (GQA, N_k != N, causal), the
 * pass rule passing them and failing a wrong value in the last column of D (where a kernel that
 * masks the tail of D in a wider tile would go wrong). */
enum { HD_B = 1, HD_H = 2, HD_HKV = 1, HD_N = 3, HD_NK = 5, HD_MAXD = 256 };

static void head_dim_direct(const ref_shape *s, const float *Q, const float *K, const float *V,
                            const float *dO, double *O, double *lse, double *dQ, double *dK,
                            double *dV) {
    const int D = s->D, shift = HD_NK - HD_N;
    memset(dK, 0, sizeof(double) * HD_HKV * HD_NK * D);
    memset(dV, 0, sizeof(double) * HD_HKV * HD_NK * D);
    for (int h = 0; h < HD_H; h++) {
        for (int i = 0; i < HD_N; i++) {
            const float *q = Q + (h * HD_N + i) * D, *g = dO + (h * HD_N + i) * D;
            double *o = O + (h * HD_N + i) * D, *dq = dQ + (h * HD_N + i) * D;
            double p[HD_NK], m = -INFINITY, l = 0, Di = 0;
            const int last = s->causal ? i + shift : HD_NK - 1;
            for (int j = 0; j <= last; j++) {
                double dot = 0;
                for (int d = 0; d < D; d++) dot += (double)q[d] * K[j * D + d];
                p[j] = s->scale * dot, m = fmax(m, p[j]);
            }
            for (int j = 0; j <= last; j++) p[j] = exp(p[j] - m), l += p[j];
            for (int d = 0; d < D; d++) {
                o[d] = 0;
                for (int j = 0; j <= last; j++) o[d] += p[j] / l * V[j * D + d];
                Di += g[d] * o[d];
            }
            lse[h * HD_N + i] = m + log(l);
            memset(dq, 0, sizeof(double) * D);
            for (int j = 0; j <= last; j++) {
                double dp = 0;
                for (int d = 0; d < D; d++) dp += (double)g[d] * V[j * D + d];
                const double P = p[j] / l, dS = P * (dp - Di);
                for (int d = 0; d < D; d++) {
                    dq[d] += s->scale * dS * K[j * D + d];
                    dK[j * D + d] += s->scale * dS * q[d];
                    dV[j * D + d] += P * g[d];
                }
            }
        }
    }
}

static void test_reference_head_dims(void) {
    const int dims[] = {40, 256};
    static float Q[HD_H * HD_N * HD_MAXD], K[HD_HKV * HD_NK * HD_MAXD], V[HD_HKV * HD_NK * HD_MAXD],
        dO[HD_H * HD_N * HD_MAXD], Of[HD_H * HD_N * HD_MAXD], lsef[HD_H * HD_N],
        dQf[HD_H * HD_N * HD_MAXD], dKf[HD_HKV * HD_NK * HD_MAXD], dVf[HD_HKV * HD_NK * HD_MAXD];
    static double O[HD_H * HD_N * HD_MAXD], lse[HD_H * HD_N], dQ[HD_H * HD_N * HD_MAXD],
        dK[HD_HKV * HD_NK * HD_MAXD], dV[HD_HKV * HD_NK * HD_MAXD];
    for (int t = 0; t < 2; t++) {
        const int D = dims[t], causal = t; /* D = 256 causal: row 0 sees keys 0 .. 2 */
        const ref_shape s = {HD_B,   HD_H,  HD_N, D,  causal, 1.0 / sqrt((double)D),
                             HD_HKV, HD_NK, 0,    -1, -1,     0.0,
                             NULL,   NULL};
        const size_t nq = (size_t)HD_H * HD_N * D, nk = (size_t)HD_HKV * HD_NK * D;
        fill_normal(Q, nq, 40 + t, 0, 2.0f), fill_normal(K, nk, 40 + t, 1, 1.0f);
        fill_normal(V, nk, 40 + t, 2, 1.0f), fill_normal(dO, nq, 40 + t, 3, 1.0f);
        head_dim_direct(&s, Q, K, V, dO, O, lse, dQ, dK, dV);
        double worst = 0, worst_lse = 0, ro[HD_MAXD], rl, scratch[HD_NK];
        for (int bh = 0; bh < HD_H; bh++)
            for (int i = 0; i < HD_N; i++) {
                ref_row(&s, STORE_F32, Q, K, V, bh, i, ro, NULL, &rl, scratch);
                for (int d = 0; d < D; d++)
                    worst = fmax(worst, fabs(ro[d] - O[(bh * HD_N + i) * D + d]));
                worst_lse = fmax(worst_lse, fabs(rl - lse[bh * HD_N + i]));
            }
        EXPECT(worst < 1e-12 && worst_lse < 1e-12, "D = %d: O off by %g, lse by %g", D, worst,
               worst_lse);
        for (size_t x = 0; x < nq; x++) Of[x] = (float)O[x], dQf[x] = (float)dQ[x];
        for (size_t x = 0; x < nk; x++) dKf[x] = (float)dK[x], dVf[x] = (float)dV[x];
        for (int x = 0; x < HD_H * HD_N; x++) lsef[x] = (float)lse[x];
        long long qrows[HD_H * HD_N], krows[HD_HKV * HD_NK];
        const long long n_q = pick_rows(HD_H * HD_N, -1, 1, qrows);
        const long long n_k = pick_rows(HD_HKV * HD_NK, -1, 1, krows);
        check_result c;
        grad_check_result g;
        check_output(&s, STORE_F32, Q, K, V, Of, lsef, qrows, n_q, &c);
        check_gradients(&s, STORE_F32, Q, K, V, dO, Of, lsef, dQf, dKf, dVf, qrows, n_q, krows, n_k,
                        &g);
        EXPECT(c.pass && g.pass, "D = %d: the direct float64 answer passes (O %g, dQ %g, dK %g)", D,
               c.max_abs_err, g.max_abs_err[GRAD_DQ], g.max_abs_err[GRAD_DK]);
        /* a wrong last column: O of the last row, dK of the last key */
        Of[nq - 1] += 0.01f;
        check_output(&s, STORE_F32, Q, K, V, Of, lsef, qrows, n_q, &c);
        Of[nq - 1] -= 0.01f;
        EXPECT(!c.pass, "D = %d: O off by 0.01 in column D - 1 fails (err %g, bound %g)", D,
               c.max_abs_err, c.bound);
        dKf[nk - 1] += 0.01f;
        check_gradients(&s, STORE_F32, Q, K, V, dO, Of, lsef, dQf, dKf, dVf, qrows, n_q, krows, n_k,
                        &g);
        EXPECT(!g.pass, "D = %d: dK off by 0.01 in column D - 1 fails (err %g, bound %g)", D,
               g.max_abs_err[GRAD_DK], g.bound[GRAD_DK]);
    }
}

/* Raw header with any descr (quoted unless it is a list), for the bad-file fixtures. */
static void write_raw(const char *path, const char *descr, const char *shape, size_t bytes) {
    char dict[256];
    const char *q = descr[0] == '[' ? "" : "'";
    int len =
        snprintf(dict, sizeof dict, "{'descr': %s%s%s, 'fortran_order': False, 'shape': %s, }", q,
                 descr, q, shape);
    size_t hlen = (size_t)len + 1 + (64 - (10 + (size_t)len + 1) % 64) % 64;
    FILE *f = fopen(path, "wb");
    if (!f) return;
    unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)hlen, 0};
    fwrite(pre, 1, 10, f);
    fwrite(dict, 1, (size_t)len, f);
    for (size_t i = (size_t)len; i + 1 < hlen; i++) fputc(' ', f);
    fputc('\n', f);
    for (size_t i = 0; i < bytes; i++) fputc(0, f);
    fclose(f);
}

static int fixtures(const char *dir) {
    char p[512], err[256];
    size_t n = 16 * 64;
    float *x = calloc(n, sizeof(float));
    long long good[4] = {1, 1, 16, 64}, rank3[3] = {1, 16, 64}, dim24[4] = {1, 1, 32, 24};
    int rc = 0;
    snprintf(p, sizeof p, "%s/good.npy", dir);
    rc |= npy_write(p, NPY_F32, 4, good, x, err, sizeof err);
    snprintf(p, sizeof p, "%s/rank3.npy", dir);
    rc |= npy_write(p, NPY_F32, 3, rank3, x, err, sizeof err);
    snprintf(p, sizeof p, "%s/dim24.npy", dir); /* below the head dims */
    rc |= npy_write(p, NPY_F32, 4, dim24, x, err, sizeof err);
    snprintf(p, sizeof p, "%s/int32.npy", dir);
    write_raw(p, "<i4", "(1, 1, 16, 64)", n * 4);
    snprintf(p, sizeof p, "%s/short.npy", dir);
    write_raw(p, "<f4", "(1, 1, 16, 64)", n * 2);
    snprintf(p, sizeof p, "%s/struct.npy", dir);
    write_raw(p, "[('a', '<f4'), ('b', '<f4')]", "(1, 1, 16, 64)", n * 8);
    snprintf(p, sizeof p, "%s/absurd.npy", dir); /* 2^40 elements claimed, 64 bytes given */
    write_raw(p, "<f4", "(1024, 1024, 1024, 1024)", 64);
    snprintf(p, sizeof p, "%s/overflow.npy", dir); /* the element count overflows 64 bits */
    write_raw(p, "<f4", "(4294967296, 4294967296, 65536, 64)", 64);
    long long n32[4] = {1, 1, 32, 64};
    float *y = calloc(32 * 64, sizeof(float));
    snprintf(p, sizeof p, "%s/good32.npy", dir);
    rc |= !y || npy_write(p, NPY_F32, 4, n32, y, err, sizeof err);
    free(y);
    /* the shape of good.npy but D = 96 (a head dim) and D = 100 (not a multiple of 8) */
    long long n96[4] = {1, 1, 16, 96}, n100[4] = {1, 1, 16, 100};
    float *z = calloc(16 * 100, sizeof(float));
    snprintf(p, sizeof p, "%s/dim96.npy", dir);
    rc |= !z || npy_write(p, NPY_F32, 4, n96, z, err, sizeof err);
    snprintf(p, sizeof p, "%s/dim100.npy", dir);
    rc |= !z || npy_write(p, NPY_F32, 4, n100, z, err, sizeof err);
    free(z);
    /* 8 GiB of float32 data [1, 1, 2^25, 64] in a sparse file (no disk used): under a 2 GiB
     * address-space limit reading it runs out of host memory */
    snprintf(p, sizeof p, "%s/big.npy", dir);
    write_raw(p, "<f4", "(1, 1, 33554432, 64)", 0);
    FILE *b = fopen(p, "r+b");
    if (b) {
        rc |= fseek(b, 0, SEEK_END) != 0;
        long hdr = ftell(b);
        rc |= hdr < 0 || fseek(b, hdr + (8L << 30) - 1, SEEK_SET) != 0 || fputc(0, b) == EOF;
        fclose(b);
    } else {
        rc = 1;
    }
    snprintf(p, sizeof p, "%s/notnpy.npy", dir);
    FILE *f = fopen(p, "w");
    if (f) fputs("hello\n", f), fclose(f);
    free(x);
    if (rc) fprintf(stderr, "fixtures: %s\n", err);
    return rc ? 1 : 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "--fixtures")) return fixtures(argv[2]);
    const char *dir = argc > 1 ? argv[1] : "/tmp";
    test_fp16();
    test_generator();
    test_reference_by_hand();
    test_causal_first_row();
    test_bf16();
    test_model_inputs();
    test_shape_complete();
    test_key_range();
    test_softcap_forward();
    test_softcap_backward();
    test_window_pass_rule();
    test_pick_rows();
    test_ring_schedule();
    test_ring_pieces();
    test_pass_rule();
    test_head_dim_rule();
    test_reference_head_dims();
    test_sequence_of();
    test_varlen_parse();
    test_varlen_random();
    test_packed_check();
    test_packed_gradients();
    test_sequence_rows();
    test_packed_as_unpacked();
    test_npy(dir);
    printf("test_common: %d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
