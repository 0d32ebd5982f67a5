/*
 * stage6_hopper/softmax.cuh: the online softmax of one key tile on a consumer's registers, in two
 * steps that the main loop places around the P V before (row_max while it runs; exp_pack and
 * rescale_o after its wait), the causal and tail mask (mask_scores), and what models add before
 * it: a local window's mask (mask_window) and the softcap (cap_scores).
 */
#pragma once

#include "schedule.cuh"

// Scores of keys past N_k (tail tile) or past the row's diagonal (causal) become -inf. Only the
// diagonal and the tail tile need it. row0 is the thread's first row as a key index (row + N_k -
// N: the last key it sees, causal; below 0 it sees none). Element (i, h, c) of the thread is key
// key0 + 2t + 8i + c of row row0 + 8h: it is kept while its offset 8i + c (a constant) is below a
// bound the thread works out once per row, so each element costs one compare and one select.
template <int BC>
__device__ __forceinline__ void mask_scores(float (&S)[BC / 2], const consumer_place &p, int row0,
                                            int key0, int N_k, int causal) {
    const int first = key0 + 2 * p.t;  // the key of offset 0
    int bound[2];
#pragma unroll
    for (int h = 0; h < 2; ++h)
        bound[h] = (causal ? min(N_k, row0 + FRAG_ROW_STEP * h + 1) : N_k) - first;
#pragma unroll
    for (int i = 0; i < BC / FRAG_COLS; ++i) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
#pragma unroll
            for (int c = 0; c < 2; ++c)
                if (FRAG_COLS * i + c >= bound[h]) S[acc_index(i, h, c)] = -INFINITY;
        }
    }
}

// What models feed (MODEL kernels): the mask of a local window, both of its bounds and the tail.
// diagonal0 is the thread's first row as a key index (row + N_k - N); a row sees the keys from
// its diagonal - left to its diagonal + right (-1: unbounded on that side; causal: right = 0),
// below N_k. As in mask_scores, the thread works out per row the offsets of its first key kept and
// of the first one past them, and each element costs two compares against its constant offset
// and one select. The boundary tiles on both sides come here (needs_mask), and so does a row that
// sees none of the tile's keys, or none at all: all -inf.
template <int BC>
__device__ __forceinline__ void mask_window(float (&S)[BC / 2], const consumer_place &p,
                                            int diagonal0, int key0, int N_k, int left, int right) {
    const int first = key0 + 2 * p.t;  // the key of offset 0
    int lo[2], hi[2];                  // offsets kept: lo[h] <= offset < hi[h]
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int diagonal = diagonal0 + FRAG_ROW_STEP * h;
        lo[h] = (left < 0 ? 0 : diagonal - left) - first;
        hi[h] = (right < 0 ? N_k : min(N_k, diagonal + right + 1)) - first;
    }
#pragma unroll
    for (int i = 0; i < BC / FRAG_COLS; ++i) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
#pragma unroll
            for (int c = 0; c < 2; ++c) {
                const int offset = FRAG_COLS * i + c;
                if (offset < lo[h] || offset >= hi[h]) S[acc_index(i, h, c)] = -INFINITY;
            }
        }
    }
}

// Softcap (MODEL kernels, where the shape asks it): each raw score q.k becomes tanh(q.k scale / c)
// (softcap_scale = scale / c, tanh.approx), the capped score c tanh(s / c) divided by c; the
// softmax's scale_log2 is then c log2(e) (the host's), which turns it into the capped score in
// the log2 domain in the multiply the softmax does anyway. Before the mask, so that a masked score
// stays -inf, and before the row max, which is of the capped scores (and the LSE with it).
template <int BC>
__device__ __forceinline__ void cap_scores(float (&S)[BC / 2], float softcap_scale) {
#pragma unroll
    for (int i = 0; i < BC / 2; ++i) S[i] = tanh_approx(S[i] * softcap_scale);
}

// The online softmax of one key tile for the thread's two rows (h = 0, 1), in two steps, the two
// rows side by side in each. row_max: the rows' new max (4 lanes share a row: two shuffles),
// alpha = 2^(m_old - m_new), which O_acc and l_i are to be scaled by, the exponent's shift
// m_new * scale_log2, and the exponentials of the first EARLY 8-column chunks (their sums too).
// It only reads S, so it can run while the P V before is still in flight; the early
// exponentials keep the multi-function unit busy while the P V finishes (LOG.md, step 19).
// row_step is what it hands to exp_pack() and rescale_o(), across that P V's wait.
template <int EARLY>
__host__ __device__ constexpr int early_regs() {  // (an array needs at least one element)
    return EARLY > 0 ? EARLY * FRAG_REGS : 1;
}
template <int EARLY>
struct row_step {
    float alpha[2], shift[2];
    float p[early_regs<EARLY>()];  // the early chunks, in acc_index order
    float sum[2];                  // their sums, per row
};
// Two chunks with two consumers; with three (D = 64) the 160 registers do not hold them.
constexpr int EARLY_CHUNKS_TWO_CONSUMERS = 2;
template <int C>
__host__ __device__ constexpr int early_chunks() {
    return C == 3 ? 0 : EARLY_CHUNKS_TWO_CONSUMERS;
}
template <int BC, int EARLY>
__device__ __forceinline__ void row_max(const float (&S)[BC / 2], float (&m_i)[2], float scale_log2,
                                        row_step<EARLY> &r) {
    // LAB HOLE 4 BEGIN [design]: the softmax on the wgmma accumulator: the rows' max (row_max)
    // LAB TODO: S is this thread's part of the warpgroup's 64 x BC tile of raw scores q.k (-inf
    // LAB TODO: where masked), in wgmma's accumulator layout: element acc_index(i, h, c) is row
    // LAB TODO: g + 8h of the warp's 16 rows (g = lane / 4), column 8i + 2t + c of the tile
    // LAB TODO: (t = lane % 4), i < BC / 8; a row's columns are spread over the four lanes of its
    // LAB TODO: quad. For each of the thread's two rows h: m_i[h] becomes the larger of its old
    // LAB TODO: value and the row's max over the tile, the same in the quad's four lanes, kept in
    // LAB TODO: raw-score units (the epilogue scales it: LSE = (m scale_log2 + log2 l) ln 2). Into
    // LAB TODO: r: alpha[h] = 2^((old max - new max) scale_log2), by which O_acc and l_i are to be
    // LAB TODO: multiplied; shift[h], the new max in log2 units, which exp_pack subtracts from
    // LAB TODO: S scale_log2 in the exponent; and the exponentials 2^(S scale_log2 - shift) of the
    // LAB TODO: first EARLY 8-column blocks (i < EARLY) at their acc_index in r.p, with their sums
    // LAB TODO: per row in r.sum (0 where EARLY is 0). A row that has seen only masked keys keeps
    // LAB TODO: max -inf: its shift must be 0 and its alpha 0, never NaN (no -inf - (-inf)
    // LAB TODO: anywhere). The P V before may still be in flight: read S, write m_i and r, and
    // LAB TODO: touch neither O_acc nor P.
    // LAB STUB: (void)S, (void)m_i, (void)scale_log2;
    // LAB STUB: r = row_step<EARLY>{};  // until filled: every alpha, shift and sum 0
    float mx[2] = {m_i[0], m_i[1]};
#pragma unroll
    for (int i = 0; i < BC / FRAG_COLS; ++i) {
#pragma unroll
        for (int h = 0; h < 2; ++h)
            mx[h] = fmaxf(mx[h], fmaxf(S[acc_index(i, h, 0)], S[acc_index(i, h, 1)]));
    }
#pragma unroll
    for (int lanes = 1; lanes < QUAD; lanes *= 2) {  // the row's max over its quad
#pragma unroll
        for (int h = 0; h < 2; ++h) mx[h] = fmaxf(mx[h], __shfl_xor_sync(FULL_WARP, mx[h], lanes));
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        // A row that has seen only masked keys keeps m = -inf; use 0 so that no inf - inf appears.
        const float m_use = mx[h] == -INFINITY ? 0.f : mx[h];
        r.alpha[h] = fast_exp2((m_i[h] - m_use) * scale_log2);
        m_i[h] = mx[h];
        r.shift[h] = m_use * scale_log2;
    }
    r.sum[0] = r.sum[1] = 0.f;
#pragma unroll
    for (int i = 0; i < EARLY; ++i) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
#pragma unroll
            for (int c = 0; c < 2; ++c) {
                const float x = fast_exp2(fmaf(S[acc_index(i, h, c)], scale_log2, -r.shift[h]));
                r.p[acc_index(i, h, c)] = x;
                r.sum[h] += x;
            }
        }
    }
    // LAB HOLE 4 END
}

// exp_pack: P = 2^(S scale_log2 - shift) (the early chunks' from row_max), to fp16 (bf16 where
// BF16) straight into the A-operand layout of the P V wgmma, which is the S layout (register k of
// P packs elements 2k and 2k + 1: columns 2t and 2t + 1 of one row); l_i = l_i alpha + the rows'
// sums. P's registers are the A operand of the P V before, so this comes after that wgmma's wait.
template <int BC, int EARLY, bool BF16>
__device__ __forceinline__ void exp_pack(const float (&S)[BC / 2], uint32_t (&P)[BC / 4],
                                         float (&l_i)[2], float scale_log2,
                                         const row_step<EARLY> &r) {
    // LAB HOLE 4 BEGIN [design]: the softmax on the wgmma accumulator: P and l (exp_pack)
    // LAB TODO: P = 2^(S scale_log2 - r.shift) of each of the thread's scores (those of the first
    // LAB TODO: EARLY blocks are in r.p already), in the storage type (bf16 where BF16, else fp16),
    // LAB TODO: two a register. P is the A operand of the P V wgmma from registers, whose layout is
    // LAB TODO: the accumulator's: register k of P holds elements 2k (low half) and 2k + 1 (high
    // LAB TODO: half) of S, columns 2t and 2t + 1 of one row. And each row's
    // LAB TODO: sum: l_i[h] becomes l_i[h] times r.alpha[h], plus this lane's sum of the row's p
    // LAB TODO: over the tile (r.sum has the early blocks' part; the epilogue adds the quad's four
    // LAB TODO: partial sums). This runs after the P V before has been waited for: until then P's
    // LAB TODO: registers are that wgmma's operand.
    // LAB STUB: (void)S, (void)l_i, (void)scale_log2, (void)r;
    // LAB STUB: for (uint32_t &x : P) x = 0u;  // until filled: P = 0, so O stays 0
    float sum[2] = {r.sum[0], r.sum[1]};
#pragma unroll
    for (int i = 0; i < BC / FRAG_COLS; ++i) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            float x[2];
#pragma unroll
            for (int c = 0; c < 2; ++c) {
                if (i < EARLY) {
                    x[c] = r.p[acc_index(i, h, c)];
                } else {
                    x[c] = fast_exp2(fmaf(S[acc_index(i, h, c)], scale_log2, -r.shift[h]));
                    sum[h] += x[c];
                }
            }
            P[acc_index(i, h, 0) / 2] = pack2_of<BF16>(x[0], x[1]);
        }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) l_i[h] = l_i[h] * r.alpha[h] + sum[h];
    // LAB HOLE 4 END
}

template <int D>
__device__ __forceinline__ void rescale_o(float (&O_acc)[D / 2], const float (&alpha)[2]) {
    // LAB HOLE 4 BEGIN [design]: the softmax on the wgmma accumulator: O's rescale (rescale_o)
    // LAB TODO: O_acc, this thread's part of the warpgroup's 64 x D output rows in the same
    // LAB TODO: accumulator layout (D / 8 blocks of 8 columns): each element times its row's alpha
    // LAB TODO: (alpha[h] for row g + 8h).
    // LAB STUB: (void)O_acc, (void)alpha;  // until filled: O never rescaled
#pragma unroll
    for (int i = 0; i < D / FRAG_COLS; ++i) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
#pragma unroll
            for (int c = 0; c < 2; ++c) O_acc[acc_index(i, h, c)] *= alpha[h];
        }
    }
    // LAB HOLE 4 END
}
