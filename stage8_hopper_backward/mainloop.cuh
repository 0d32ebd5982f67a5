/*
 * stage8_hopper_backward/mainloop.cuh: the consumers: each consumer warpgroup owns 64 of the
 * block's keys and, for every query tile the producer brings, runs the five products on wgmma:
 * S^T and dP^T from shared memory (issue_scores), P^T and dS^T in its registers (probabilities,
 * score_gradients), dV and dK with those as A operands from registers (issue_dkv), dS^T to shared
 * memory (store_ds) and dQ_i's part from it (issue_dq), then hands the Q/dO slot back and dQ_i's
 * part to the dQ warp (consumer_step, consumer).
 */
#pragma once

#include "dq.cuh"
#include "epilogue.cuh"
#include "schedule.cuh"
#include "smem.cuh"

// wgmma's A operand from registers has the accumulator's layout, two 16-bit values a register:
// a 64 x 16 k-step is 4 registers a thread, and register j of a packed 64 x N tile holds the
// accumulator's registers 2j and 2j + 1 (warp.cuh: blocks 2k and 2k + 1 are k-step k).
constexpr int A_REGS_PER_KSTEP = WGMMA_M * WGMMA_K / 2 / WARPGROUP;  // 4

// Start X^T = A B^T for the scores: 64 rows of K_j (or V_j) times Q_i^T (or dO_i^T), D deep, both
// K-major in shared memory (rows of D halves, as TMA wrote them): D / 16 wgmma of N =
// score_cols<D>() (the step's queries; at D = 256 the warpgroup's 32 of them, tile_desc at the
// first), one group.
template <int D, bool BF16>
__device__ __forceinline__ void issue_scores(float (&X)[score_regs<D>()], uint64_t rows_desc,
                                             uint64_t tile_desc) {
    pin_registers(X);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < D / WGMMA_K; ++kk) {
        const uint64_t a = desc_k_major_step<block_keys<D>()>(rows_desc, kk),
                       b = desc_k_major_step<qrows<D>()>(tile_desc, kk);
        wgmma_ss<score_cols<D>(), BF16>(X, a, b, kk > 0);
    }
    wgmma_commit();
}

// Whether a step needs the mask: the key tile runs past the sequence's N_k, or some (key, query)
// pair of the step lies outside the window (schedule.cuh's block_place: see_lo <= j - i <=
// see_hi, the sequence's own bounds), which the corners say: the tile's last key against its
// first query (causal: past the diagonal), its first key against its last query (a left bound).
// Interior steps of a window run unmasked; every key tile that runs past its sequence's keys is
// masked (a packed batch's next sequence lies there). A lean kernel (EXTRAS off: kernel.cuh) has
// no left bound to test.
template <int D, bool EXTRAS>
__host__ __device__ __forceinline__ bool step_needs_mask(const block_place &b, int key0, int q0) {
    return key0 + block_keys<D>() > b.N_k || key0 + block_keys<D>() - 1 - q0 > b.see_hi ||
           (EXTRAS && key0 - (q0 + qrows<D>() - 1) < b.see_lo);
}

// Whether query `query` sees key `key` (the mask of a masked step; EXTRAS: with a left bound).
template <bool EXTRAS>
__host__ __device__ __forceinline__ bool key_seen(const block_place &b, int key, int query) {
    const int d = key - query;
    return key < b.N_k && d <= b.see_hi && (!EXTRAS || d >= b.see_lo);
}

// The thread's column pairs of LSE_i or D_i (a float per query of the tile, in shared memory, from
// the warpgroup's first query of the scores on): queries 8n + 2t and 8n + 2t + 1 of its columns,
// for every n8 block n.
template <int D>
__device__ __forceinline__ void load_columns(float2 (&v)[score_cols<D>() / FRAG_COLS],
                                             uint32_t smem, int t) {
#pragma unroll
    for (int n = 0; n < score_cols<D>() / FRAG_COLS; ++n)
        v[n] = ld_shared_f2(smem + (FRAG_COLS * n + FRAG_LANE_COLS * t) * (int)sizeof(float));
}

// Whether a step loads LSE_i before it waits for S^T: the loads' latency off the softmax's path,
// for registers (score_cols / 4 a thread) that D = 128's and 256's steps have and D = 64's
// 128-query ones do not (they spill).
template <int D>
__device__ __forceinline__ constexpr bool lse_ahead() {
    return score_cols<D>() <= WGMMA_M;
}

// Whether a step up to D = 128 issues the dQ part of the step before ahead of its dV, dK, so that
// the part's hand-over runs while they do: for registers (the part's beside P16 and dS16, which
// dV, dK read) that D = 96's and 128's steps have and D = 64's 128-query ones do not (they spill).
// D = 64's default variant issues it between them instead (dq_between): dV, then once dV is done
// (P16 free) the part, then dK, the hand-over while dK runs (its other variants spill 4 and 8
// bytes so).
template <int D>
__device__ __forceinline__ constexpr bool dq_first() {
    return qrows<D>() == WGMMA_M;
}
template <int D, dq_way DQ>
__device__ __forceinline__ constexpr bool dq_between() {
    return !dq_first<D>() && !splits_dkv<D>() && DQ == DQ_BY_BULK;
}

// S^T has landed: P^T = 2^(S^T scale log2(e) - LSE_i log2(e)) in place, the forward's
// probabilities exactly (lse2 is the LSE in log2 units; +inf on query rows past N and rows that
// see no key, whose P is then 0 with no mask: packed, the next sequence's rows a tile reads past
// N, finite, too). Masked: keys past N_k and keys outside a query's window (causal: past its
// diagonal) get P = 0. The thread's columns are queries q0 + 8n + 2t + c (q0: the warpgroup's
// first query of the scores), its rows keys key_row and key_row + 8.
template <int D, bool EXTRAS>
__device__ __forceinline__ void probabilities(float (&S)[score_regs<D>()], const bwd_problem &pb,
                                              const block_place &b,
                                              const float2 (&lse_cols)[score_cols<D>() / FRAG_COLS],
                                              int key_row, int q0, int t, bool mask) {
    // LAB HOLE 1 BEGIN: P^T and dS^T as A operands: P^T in place of S^T (probabilities)
    // LAB TODO: overwrite S^T with P^T = 2^(S^T scale log2(e) - LSE_i) (pb.scale_log2; LSE_i in
    // LAB TODO: log2 units), element by element. S is the thread's share of the warpgroup's
    // LAB TODO: accumulator: register acc_index(n, h, c) holds key key_row + 8 h (a row) and query
    // LAB TODO: q0 + 8 n + 2 t + c (a column; score_cols<D>() / 8 blocks n), and lse_cols[n]
    // LAB TODO: LSE_i of its columns c = 0, 1 of block n. Where `mask` says so, a key the query
    // LAB TODO: does not see (key_seen: past N_k, outside the window, causal past the diagonal)
    // LAB TODO: gets P^T = 0.
#pragma unroll
    for (int n = 0; n < score_cols<D>() / FRAG_COLS; ++n) {
        const float2 lse = lse_cols[n];
#pragma unroll
        for (int e = 0; e < FRAG_REGS; ++e) {
            const int i = FRAG_REGS * n + e;
            float p = fast_exp2(fmaf(S[i], pb.scale_log2, -(frag_c(e) ? lse.y : lse.x)));
            if (mask) {
                const int key = key_row + FRAG_ROW_STEP * frag_h(e);
                const int query = q0 + FRAG_COLS * n + FRAG_LANE_COLS * t + frag_c(e);
                if (!key_seen<EXTRAS>(b, key, query)) p = 0.f;
            }
            S[i] = p;
        }
    }
    // LAB HOLE 1 END
}

// dP^T has landed: dS^T = P^T * (dP^T - D_i) (softmax's Jacobian; D_i per query column), and
// P^T and dS^T as wgmma's A operands: 16-bit pairs in the storage type, register j holding the
// accumulator's registers 2j and 2j + 1 (a column pair of one row). Each pair is packed as soon
// as it is computed, so that P^T and dP^T in fp32 die as their packed halves appear.
template <int D, bool BF16>
__device__ __forceinline__ void score_gradients(
    uint32_t (&P16)[packed_regs<D>()], uint32_t (&dS16)[packed_regs<D>()],
    const float (&P)[score_regs<D>()], const float (&dP)[score_regs<D>()],
    const float2 (&D_cols)[score_cols<D>() / FRAG_COLS]) {
    // LAB HOLE 1 BEGIN: P^T and dS^T as A operands: packed, with dS^T (score_gradients)
    // LAB TODO: dS^T = P^T (dP^T - D_i) (P and dP in S's layout; D_cols holds D_i as lse_cols
    // LAB TODO: holds LSE_i), and P^T and dS^T packed as wgmma's A operand: two 16-bit values of
    // LAB TODO: the storage type a register, register j of P16 (dS16) holding the accumulator's
    // LAB TODO: registers 2 j and 2 j + 1, the columns c = 0, 1 of one row. Pack each pair as soon
    // LAB TODO: as it is computed, so that the fp32 values die early (registers are short here).
    // LAB STUB: for (int j = 0; j < packed_regs<D>(); ++j) P16[j] = dS16[j] = 0u;  // until filled
#pragma unroll
    for (int n = 0; n < score_cols<D>() / FRAG_COLS; ++n) {
        const float2 Di = D_cols[n];
#pragma unroll
        for (int h = 0; h < FRAG_LANE_ROWS; ++h) {
            const int i = acc_index(n, h, 0), j = i / FRAG_LANE_COLS;  // columns c = 0, 1
            P16[j] = pack2_of<BF16>(P[i], P[i + 1]);
            dS16[j] = pack2_of<BF16>(P[i] * (dP[i] - Di.x), P[i + 1] * (dP[i + 1] - Di.y));
        }
    }
    // LAB HOLE 1 END
}

// Softcap (pb.cap_log2 > 0), while dP^T runs: each raw score of S^T becomes t = tanh(S^T scale /
// c) in place, or -inf where masked (as probabilities() masks).
template <int D>
__device__ __forceinline__ void capped_scores(float (&S)[score_regs<D>()], const bwd_problem &pb,
                                              const block_place &b, int key_row, int q0, int t,
                                              bool mask) {
#pragma unroll
    for (int n = 0; n < score_cols<D>() / FRAG_COLS; ++n) {
#pragma unroll
        for (int e = 0; e < FRAG_REGS; ++e) {
            const int i = FRAG_REGS * n + e;
            S[i] = tanh_approx(S[i] * pb.cap_in);
            if (mask) {
                const int key = key_row + FRAG_ROW_STEP * frag_h(e);
                const int query = q0 + FRAG_COLS * n + FRAG_LANE_COLS * t + frag_c(e);
                if (!key_seen<true>(b, key, query)) S[i] = -INFINITY;
            }
        }
    }
}

// ... then P^T = 2^(t c log2(e) - LSE_i log2(e)) and G = P^T (1 - t^2), the factor of dS^T that
// the cap's derivative adds (d c tanh(s / c) / ds = 1 - t^2, in [0, 1]; a masked t = -inf, whose
// P^T is 0, must give 0, not NaN: in a CAPPED kernel the fma clamped there, fma_saturate, one
// instruction; in a full one (EXTRAS) max(.., 0) after it, as there the fma's clamp made ptxas
// spill: LOG.md, step 80). A column pair's two floats are overwritten in place by P^T's pair,
// packed as dV's A operand wants it, and G's pair packed in fp16 (G in [0, 1] keeps fp16's 11
// bits in either storage type): the step holds no register beyond the plain one's (the pairs in
// registers of their own spill at D = 64).
template <int D, bool BF16, bool CAPPED>
__device__ __forceinline__ void capped_probabilities(
    float (&S)[score_regs<D>()], const bwd_problem &pb,
    const float2 (&lse_cols)[score_cols<D>() / FRAG_COLS]) {
#pragma unroll
    for (int n = 0; n < score_cols<D>() / FRAG_COLS; ++n) {
#pragma unroll
        for (int h = 0; h < FRAG_LANE_ROWS; ++h) {
            const int i = acc_index(n, h, 0);  // columns c = 0, 1
            float p[FRAG_LANE_COLS], g[FRAG_LANE_COLS];
#pragma unroll
            for (int c = 0; c < FRAG_LANE_COLS; ++c) {
                const float tc = S[i + c];
                p[c] = fast_exp2(fmaf(tc, pb.cap_log2, -(c ? lse_cols[n].y : lse_cols[n].x)));
                g[c] =
                    p[c] * (CAPPED ? fma_saturate(-tc, tc, 1.f) : fmaxf(fmaf(-tc, tc, 1.f), 0.f));
            }
            S[i] = __uint_as_float(pack2_of<BF16>(p[0], p[1]));  // P^T's pair
            S[i + 1] = __uint_as_float(pack_half2(g[0], g[1]));  // G's pair
        }
    }
}

// Softcap, once dP^T has landed: P^T's packed pairs to P16 as they are, and dS^T = G * (dP^T -
// D_i) = P^T (dP^T - D_i) (1 - t^2) packed (score_gradients' work).
template <int D, bool BF16>
__device__ __forceinline__ void capped_gradients(
    uint32_t (&P16)[packed_regs<D>()], uint32_t (&dS16)[packed_regs<D>()],
    const float (&PG)[score_regs<D>()], const float (&dP)[score_regs<D>()],
    const float2 (&D_cols)[score_cols<D>() / FRAG_COLS]) {
#pragma unroll
    for (int n = 0; n < score_cols<D>() / FRAG_COLS; ++n) {
        const float2 Di = D_cols[n];
#pragma unroll
        for (int h = 0; h < FRAG_LANE_ROWS; ++h) {
            const int i = acc_index(n, h, 0), j = i / FRAG_LANE_COLS;  // columns c = 0, 1
            const float2 g = unpack2_of<false>(__float_as_uint(PG[i + 1]));
            P16[j] = __float_as_uint(PG[i]);
            dS16[j] = pack2_of<BF16>(g.x * (dP[i] - Di.x), g.y * (dP[i + 1] - Di.y));
        }
    }
}

// The warpgroup's block of dS^T (rows: its 64 keys; columns: its score_cols queries) into
// dS_smem [qrows/64][block_keys][64], 16-bit, in the 128-byte swizzle (a slab row of 64 queries is
// 128 bytes), by stmatrix: instruction k writes chunks (8 queries) 2k and 2k + 1 of its columns in
// the warp's 16 rows, four 8 x 8 matrices straight from the A registers (matrix 0: rows 0-7 of
// chunk 2k, 1: rows 8-15, 2 and 3: the same of chunk 2k + 1); lane L addresses row L % 8 of matrix
// L / 8. At D = 256 the same for P^T, into its tile (the warpgroups share the block's keys, and
// each writes its 32 queries' chunks, from chunk 4 wg on). announce_ds() makes them visible to the
// wgmma that read them (the async proxy).
template <int D>
__device__ __forceinline__ void store_ds(const uint32_t (&dS)[packed_regs<D>()], uint32_t dS_tile,
                                         const consumer_place &p) {
    // LAB HOLE 3 BEGIN [design]: the dS^T hand-over: this warp's rows into shared memory (store_ds)
    // LAB TODO: write the warp's 16 rows of the warpgroup's dS^T block into dS_tile (rows: its
    // LAB TODO: keys, wg_key0<D>(wg) + 16 warp .. of the block's block_keys<D>(); columns: its
    // LAB TODO: queries of the scores, score_cols<D>() of them from wg_query0<D>(wg) on: up to
    // LAB TODO: D = 128 64 wg and all the step's qrows; at D = 256 all 64 keys, 32 wg and 32),
    // LAB TODO: where the dQ wgmma of both warpgroups reads it through a descriptor, MN-major:
    // LAB TODO: qrows / 64 slabs of [block_keys rows][64 queries] 16-bit values, each 128-byte
    // LAB TODO: row swizzled (its 16-byte chunk c at chunk position c ^ (row % 8)). dS is the
    // LAB TODO: block as wgmma's A operand: for k-step k (its queries 16 k ..) its registers
    // LAB TODO: 4 k .. 4 k + 3 are four 8 x 8 matrices in the accumulator layout: rows 0-7 and
    // LAB TODO: 8-15 of the warp's rows, at its query chunk 2 k, then the same at chunk 2 k + 1:
    // LAB TODO: stmatrix stores four such matrices in one instruction, each lane giving the
    // LAB TODO: address of one row of one of them (4-byte stores of a register each would work
    // LAB TODO: too, more slowly). (At D = 256 the same call stores P^T into its own tile.)
    const int row = wg_key0<D>(p.wg) + WARP_ROWS * p.warp +
                    STMATRIX_ROWS * (p.lane / STMATRIX_ROWS % 2) + p.lane % STMATRIX_ROWS;
    const int second = p.lane / (2 * STMATRIX_ROWS);   // this lane's matrix is of chunk 2k + 1
    const int first = wg_query0<D>(p.wg) / FRAG_COLS;  // the warpgroup's first chunk (even)
    // chunk first + 2k + second: the odd one's swizzle bit folded into the row's base, so that
    // each address is the base and a constant (first + 2k is even: its bit 0 is free)
    const uint32_t row_base = swizzle_row_base(dS_tile, row) ^ (uint32_t)(second * CHUNK_BYTES);
#pragma unroll
    for (int k = 0; k < score_cols<D>() / (2 * FRAG_COLS); ++k)
        stmatrix_x4(swizzled_chunk_at<block_keys<D>()>(row_base, first + 2 * k),
                    dS[A_REGS_PER_KSTEP * k], dS[A_REGS_PER_KSTEP * k + 1],
                    dS[A_REGS_PER_KSTEP * k + 2], dS[A_REGS_PER_KSTEP * k + 3]);
    // LAB HOLE 3 END
}

// acc (64 keys x dkv_cols) += A B over the warpgroup's score_cols queries: A a packed 64 x
// score_cols tile in registers, B (desc, at its first query's row) score_cols x dkv_cols in shared
// memory, MN-major; score_cols / 16 wgmma, no fence, no commit (issue_dkv's).
template <int D, bool BF16>
__device__ __forceinline__ void accumulate_rs(float (&acc)[dkv_regs<D>()],
                                              const uint32_t (&A)[packed_regs<D>()],
                                              uint64_t desc) {
    // LAB HOLE 2 BEGIN: dV_j and dK_j with A from registers (accumulate_rs)
    // LAB TODO: acc (the warpgroup's 64 keys x dkv_cols<D>() columns, fp32) += A B, summed over
    // LAB TODO: the score_cols<D>() queries of A (the K dimension; up to D = 128 the step's
    // LAB TODO: qrows<D>(), at D = 256 the warpgroup's 32): one wgmma m64 x n(dkv_cols) x k16 per
    // LAB TODO: k-step kk, each adding to acc (issue_dkv fences before and commits after). A:
    // LAB TODO: k-step kk's 64 x 16 slice of the packed tile, in registers (A_REGS_PER_KSTEP of
    // LAB TODO: them a k-step, in order). B: desc's queries x dkv_cols tile, MN-major (its rows
    // LAB TODO: are the queries, its columns contiguous), k-step kk 16 rows further down. N =
    // LAB TODO: dkv_cols<D>() (64, 96 or 128; D = 256: 128): wgmma_rs<N, BF16>, sm90.cuh's
    // LAB TODO: wrappers by N.
#pragma unroll
    for (int kk = 0; kk < score_cols<D>() / WGMMA_K; ++kk)
        wgmma_rs<dkv_cols<D>(), BF16>(acc, &A[A_REGS_PER_KSTEP * kk], desc_mn_major_step(desc, kk),
                                      1);
    // LAB HOLE 2 END
}

// Start dV_j += P^T dO_i and dK_j += dS^T Q_i: score_cols / 16 wgmma each, A from registers (P^T,
// dS^T: rows are the warpgroup's keys, the K dimension the queries), B from shared memory
// MN-major (dO_i's and Q_i's rows are queries = K, their D columns N: the transpose bit), one
// group. At D = 256 the warpgroup's own queries' half of the sums (issue_dkv_other the rest).
template <int D, bool BF16>
__device__ __forceinline__ void issue_dkv(float (&dV)[dkv_regs<D>()], float (&dK)[dkv_regs<D>()],
                                          const uint32_t (&P)[packed_regs<D>()],
                                          const uint32_t (&dS)[packed_regs<D>()], uint64_t dO_desc,
                                          uint64_t Q_desc) {
    pin_registers(dV);
    pin_registers(dK);
    wgmma_fence();
    accumulate_rs<D, BF16>(dV, P, dO_desc);
    accumulate_rs<D, BF16>(dK, dS, Q_desc);
    wgmma_commit();
}

// One of issue_dkv's two sums as a group of its own (D = 64's step: dq_between).
template <int D, bool BF16>
__device__ __forceinline__ void issue_rs_sum(float (&acc)[dkv_regs<D>()],
                                             const uint32_t (&A)[packed_regs<D>()], uint64_t desc) {
    pin_registers(acc);
    wgmma_fence();
    accumulate_rs<D, BF16>(acc, A, desc);
    wgmma_commit();
}

// D = 256: start dV_j += P^T dO_i and dK_j += dS^T Q_i over the other warpgroup's queries of the
// step, k-steps k0 .. k0 + score_cols / 16 - 1 of the sums, both operands from shared memory: A =
// P^T or dS^T as the other warpgroup stored them (store_ds: rows are the keys = M, the queries K
// contiguous: K-major), B = dO_i or Q_i at the warpgroup's columns (MN-major, as issue_dkv's); one
// group. Chained on the accumulators of issue_dkv's group, which may still run: wgmma of one shape
// on one accumulator need no fence between them.
template <int D, bool BF16>
__device__ __forceinline__ void issue_dkv_other(float (&dV)[dkv_regs<D>()],
                                                float (&dK)[dkv_regs<D>()], uint64_t P_desc,
                                                uint64_t dS_desc, uint64_t dO_desc, uint64_t Q_desc,
                                                int k0) {
    wgmma_fence();
#pragma unroll
    for (int kk = k0; kk < k0 + score_cols<D>() / WGMMA_K; ++kk)
        wgmma_ss<dkv_cols<D>(), BF16, 0, 1>(dV, desc_k_major_step<block_keys<D>()>(P_desc, kk),
                                            desc_mn_major_step(dO_desc, kk), 1);
#pragma unroll
    for (int kk = k0; kk < k0 + score_cols<D>() / WGMMA_K; ++kk)
        wgmma_ss<dkv_cols<D>(), BF16, 0, 1>(dK, desc_k_major_step<block_keys<D>()>(dS_desc, kk),
                                            desc_mn_major_step(Q_desc, kk), 1);
    wgmma_commit();
}

// Start this warpgroup's part of dQ_i = dS K_j (64 queries x dq_cols columns, over all the
// block's keys; config.cuh says which part): A = dS read from dS^T in shared memory (its rows are
// keys = K, its 64 contiguous queries of a slab M: MN-major, the transpose bit for A), B = K_j as
// stored (rows are keys = K, D columns N: MN-major). The first k-step overwrites dQ_part.
template <int D, bool BF16, int WG = ANY_WARPGROUP>
__device__ __forceinline__ void issue_dq(float (&dQ_part)[dq_regs<D>()], const smem_tiles &sm,
                                         uint32_t dS_tile, int wg) {
    // D = 64: its 64-query slab of dS^T, all of K_j; D = 96, 128: dS^T, its slab of K_j (D = 96's
    // warpgroup 1, WG = 1: the second slab's 32 columns, N = 32, into dQ_part's first 16 registers,
    // which stage_dq stages); D = 256: dS^T, its two slabs of K_j
    constexpr int ROWS = block_keys<D>(), K_SLABS = dq_cols<D>() / SLAB_COLS;
    const uint64_t dS_desc =
        desc_mn_major<ROWS>(dS_tile + (dq_splits_rows<D>() ? slab_offset<ROWS>(wg) : 0));
    const uint64_t K_desc =
        desc_mn_major<ROWS>(sm.K + (dq_splits_rows<D>() ? 0 : slab_offset<ROWS>(K_SLABS * wg)));
    pin_registers(dQ_part);
    wgmma_fence();
    if constexpr (WG == CONSUMERS - 1 && D % SLAB_COLS != 0) {
        constexpr int TAIL_COLS = D % SLAB_COLS;  // (N = 32's accumulator: N = 64's first blocks)
        float(&part)[TAIL_COLS / 2] = reinterpret_cast<float(&)[TAIL_COLS / 2]>(dQ_part);
#pragma unroll
        for (int kk = 0; kk < ROWS / WGMMA_K; ++kk)
            wgmma_ss<TAIL_COLS, BF16, 1, 1>(part, desc_mn_major_step(dS_desc, kk),
                                            desc_mn_major_step(K_desc, kk), kk > 0);
    } else {
#pragma unroll
        for (int kk = 0; kk < ROWS / WGMMA_K; ++kk)
            wgmma_ss<dq_cols<D>(), BF16, 1, 1>(dQ_part, desc_mn_major_step(dS_desc, kk),
                                               desc_mn_major_step(K_desc, kk), kk > 0);
    }
    wgmma_commit();
}

// This warp's rows of step it's dS^T (at D = 256 and of P^T) are in their buffers (store_ds):
// visible to the async proxy, through which the wgmma read them, then one arrival per warp on
// the buffer's DS_FULL.
template <int D>
__device__ __forceinline__ void announce_ds(const smem_tiles &sm, const consumer_place &p, int it) {
    // LAB HOLE 3 BEGIN [design]: the dS^T hand-over: this warp's rows announced (announce_ds)
    // LAB TODO: this thread's stores (store_ds) must first become visible to the async proxy,
    // LAB TODO: through which wgmma reads. Step it's dS^T buffer (ring slot it % ds_buffers<D>())
    // LAB TODO: has a DS_FULL mbarrier that completes a phase after CONSUMER_WARPS arrivals: one
    // LAB TODO: per consumer warp, made once every lane of the warp has stored (and fenced) its
    // LAB TODO: part of the warp's rows.
    // LAB STUB: printf("lab hole 3 unfilled: announce_ds\n"), __trap();  // stops the kernel
    fence_proxy_async();
    __syncwarp();  // the warp's stores are all in
    if (p.lane == 0) mbar_arrive(bar_at(sm, BAR_DS_FULL + ds_pipeline<D>{it}.slot()));
    // LAB HOLE 3 END
}

// Every consumer warp has written its part of step it's dS^T: both warpgroups' keys (at D = 256
// both warpgroups' queries, of P^T too), all of which the dQ wgmma reads. Up to D = 128 waited a
// step after the arrivals: the buffer's DS_FULL, long complete unless the other warpgroup lags;
// at D = 256 in the same step, where the warpgroups meet.
template <int D>
__device__ __forceinline__ void wait_ds(const smem_tiles &sm, int it) {
    // LAB HOLE 3 BEGIN [design]: the dS^T hand-over: both warpgroups' rows awaited (wait_ds)
    // LAB TODO: wait until step it's DS_FULL has completed its phase for this use of the buffer
    // LAB TODO: (the buffer's (it / ds_buffers<D>())-th: a wait names the phase's parity). Without
    // LAB TODO: it the dQ wgmma may read rows the other warpgroup has not written yet.
    // LAB STUB: printf("lab hole 3 unfilled: wait_ds\n"), __trap();  // stops the kernel
    mbar_wait(bar_at(sm, BAR_DS_FULL + ds_pipeline<D>{it}.slot()), ds_pipeline<D>{it}.phase());
    // LAB HOLE 3 END
}

// Step s's dQ part, its wgmma done: to the staging tile (its hand-over: hand_over_of; or, variant
// atomics, to dQ_acc).
template <int D, dq_way DQ>
__device__ __forceinline__ void hand_over_dq(const float (&dQ_part)[dq_regs<D>()],
                                             const smem_tiles &sm, const consumer_place &p,
                                             const bwd_problem &pb, const block_place &b,
                                             walk_step s) {
    if constexpr (DQ == DQ_BY_ATOMICS)
        add_dq_atomic<D, false, dq_tiled<D, DQ>()>(dQ_part, pb, b, p.wg, p.warp, p.lane, s.head,
                                                   s.q0);
    else
        stage_dq<D, DQ>(dQ_part, sm, p.wg, p.warp, p.lane, hand_over_of(s));
}

// The scores of a step issued (S^T, then dP^T: two groups): P^T while dP^T runs; then dS^T, both
// packed (P16, dS16). LSE_i's columns in lse (loaded here unless lse_ahead), D_i's from ring slot
// `slot`, from the warpgroup's first query of the scores on (its byte col_bytes in the rows);
// the thread's columns are queries q0 + 8n + 2t + c, its rows keys key_row and key_row + 8. With a
// softcap the same two halves: t, P^T and G = P^T (1 - t^2) (capped_scores,
// capped_probabilities), then dS^T = G (dP^T - D_i); each branch has its own wait, so that neither
// holds the other's values across it. Each mask case is a call of its own (the mask a constant):
// with one call and a select per element, ptxas moved most of the exponentials past the wait, off
// dP^T's shadow. A lean kernel (EXTRAS off) has no softcap branch and no left bound; a CAPPED
// kernel the softcap branch alone.
template <int D, bool BF16, bool EXTRAS, bool CAPPED>
__device__ __forceinline__ void gradients(uint32_t (&P16)[packed_regs<D>()],
                                          uint32_t (&dS16)[packed_regs<D>()],
                                          float (&S)[score_regs<D>()], float (&dP)[score_regs<D>()],
                                          float2 (&lse)[score_cols<D>() / FRAG_COLS],
                                          const smem_tiles &sm, const bwd_problem &pb,
                                          const block_place &b, int key_row, int q0, int t,
                                          bool mask, int slot, int col_bytes) {
    float2 Di[score_cols<D>() / FRAG_COLS];
    wgmma_wait<1>();
    pin_registers(S);
    if constexpr (!lse_ahead<D>())
        load_columns<D>(lse, sm.lse + slot * vec_bytes<D>() + col_bytes, t);
    if (CAPPED || (EXTRAS && pb.cap_log2 > 0.f)) {
        if (mask)
            capped_scores<D>(S, pb, b, key_row, q0, t, true);
        else
            capped_scores<D>(S, pb, b, key_row, q0, t, false);
        capped_probabilities<D, BF16, CAPPED>(S, pb, lse);
        wgmma_wait<0>();
        pin_registers(dP);
        load_columns<D>(Di, sm.Dsum + slot * vec_bytes<D>() + col_bytes, t);
        capped_gradients<D, BF16>(P16, dS16, S, dP, Di);
    } else if constexpr (!CAPPED) {
        if (mask)
            probabilities<D, EXTRAS>(S, pb, b, lse, key_row, q0, t, true);
        else
            probabilities<D, EXTRAS>(S, pb, b, lse, key_row, q0, t, false);
        wgmma_wait<0>();
        pin_registers(dP);
        load_columns<D>(Di, sm.Dsum + slot * vec_bytes<D>() + col_bytes, t);
        score_gradients<D, BF16>(P16, dS16, S, dP, Di);
    }
}

// One step up to D = 128: query tile cur.q0 (ring slot cur.it % Q_STAGES) against the warpgroup's
// 64 keys, and the dQ part of the step before (dq; none in the block's first step). dS^T goes to
// buffer cur.it % DS_BUFFERS (config.cuh says why no step overwrites one still read); in a
// persistent block's first step of a work tile after its first, once the store warp has read the
// work tile before's dK_j and dV_j out of those buffers (dkv_read: DKV_READ's parity, else -1).
// The mask is the block's sequence's (b).
template <int D, bool BF16, dq_way DQ, bool EXTRAS, bool CAPPED, bool FIRST, int WG>
__device__ __forceinline__ void consumer_step(float (&dV)[dkv_regs<D>()],
                                              float (&dK)[dkv_regs<D>()], const smem_tiles &sm,
                                              const consumer_place &p, const bwd_problem &pb,
                                              const block_place &b, uint64_t K_desc,
                                              uint64_t V_desc, walk_step cur, walk_step dq,
                                              int dkv_read = -1) {
    constexpr bool WITH_DQ = !FIRST;
    const int slot = q_pipeline{cur.it}.slot();
    const uint32_t Q_tile = sm.Q + slot * q_tile_bytes<D>(),
                   dO_tile = sm.dO + slot * q_tile_bytes<D>();
    const int key0 = b.key0, q0 = cur.q0;
    const int key_row = key0 + wg_key0<D>(p.wg) + WARP_ROWS * p.warp + p.g;  // the thread's first
    float S[score_regs<D>()], dP[score_regs<D>()], dQ_part[dq_regs<D>()];
    uint32_t P16[packed_regs<D>()], dS16[packed_regs<D>()];
    float2 lse[score_cols<D>() / FRAG_COLS];

    // S^T = K_j Q_i^T, then dP^T = V_j dO_i^T, each as soon as its tile has landed; at D = 128
    // LSE_i (landed with Q_i) into registers while they run (lse_ahead)
    mbar_wait(bar_at(sm, BAR_Q_FULL + slot), q_pipeline{cur.it}.phase());
    issue_scores<D, BF16>(S, K_desc, desc_k_major(Q_tile));
    if constexpr (lse_ahead<D>()) load_columns<D>(lse, sm.lse + slot * vec_bytes<D>(), p.t);
    mbar_wait(bar_at(sm, BAR_DO_FULL + slot), q_pipeline{cur.it}.phase());
    issue_scores<D, BF16>(dP, V_desc, desc_k_major(dO_tile));

    // P^T while dP^T runs; then dS^T, both packed
    const bool mask = step_needs_mask<D, EXTRAS>(b, key0, q0);
    gradients<D, BF16, EXTRAS, CAPPED>(P16, dS16, S, dP, lse, sm, pb, b, key_row, q0, p.t, mask,
                                       slot, 0);

    // dS^T to shared memory (the other warpgroup's dQ reads it); dV, dK from registers and the
    // dQ part from shared memory, once both warpgroups' dS^T of its step are there. With
    // dq_first the part goes first, and its hand-over runs while dV, dK do (groups complete in
    // order: waiting for all but the last is the part's); with dq_between after dV (done: P16
    // free) and before dK, its hand-over while dK runs; else after dV, dK, and the hand-over
    // once all are done
    constexpr bool EARLY = WITH_DQ && dq_first<D>(), BETWEEN = WITH_DQ && dq_between<D, DQ>();
    constexpr bool LATE = WITH_DQ && !EARLY && !BETWEEN;
    if constexpr (FIRST)  // a persistent block's work tile after its first: the buffers are free
        if (dkv_read >= 0) mbar_wait(bar_at(sm, BAR_DKV_READ), (uint32_t)dkv_read);
    store_ds<D>(dS16, ds_buffer_at<D>(sm, cur.it), p);
    announce_ds<D>(sm, p, cur.it);
    if constexpr (EARLY) {
        wait_ds<D>(sm, dq.it);
        issue_dq<D, BF16, WG>(dQ_part, sm, ds_buffer_at<D>(sm, dq.it), p.wg);
    }
    if constexpr (BETWEEN) {
        issue_rs_sum<D, BF16>(dV, P16, desc_mn_major<qrows<D>()>(dO_tile));
        wait_ds<D>(sm, dq.it);
        wgmma_wait<0>();  // dV: P16 read
        pin_registers(dV);
        pin_registers(P16);
        issue_dq<D, BF16, WG>(dQ_part, sm, ds_buffer_at<D>(sm, dq.it), p.wg);
        issue_rs_sum<D, BF16>(dK, dS16, desc_mn_major<qrows<D>()>(Q_tile));
    } else {
        issue_dkv<D, BF16>(dV, dK, P16, dS16, desc_mn_major<qrows<D>()>(dO_tile),
                           desc_mn_major<qrows<D>()>(Q_tile));
    }
    if constexpr (LATE) {
        wait_ds<D>(sm, dq.it);
        issue_dq<D, BF16, WG>(dQ_part, sm, ds_buffer_at<D>(sm, dq.it), p.wg);
    }
    if constexpr (EARLY || BETWEEN) {
        wgmma_wait<1>();  // the part's group
        pin_registers(dQ_part);
        // (dV, dK or dK on the tensor cores meanwhile)
        hand_over_dq<D, DQ>(dQ_part, sm, p, pb, b, dq);
    }
    wgmma_wait<0>();
    pin_registers(dV);
    pin_registers(dK);
    if constexpr (LATE) pin_registers(dQ_part);
    pin_registers(P16);
    pin_registers(dS16);

    // Q_i, dO_i (read by the step's wgmma, all done) and LSE_i, D_i (read by this thread's loads)
    // are no longer needed: every thread arrives, so that its own loads are ordered before the
    // load warp's next stores into the slot (producer.cuh).
    mbar_arrive(bar_at(sm, BAR_Q_EMPTY + slot));
    if constexpr (LATE) hand_over_dq<D, DQ>(dQ_part, sm, p, pb, b, dq);
}

// One step at D = 256 (splits_dkv): query tile cur.q0 (ring slot cur.it % Q_STAGES) against the
// block's 64 keys, warpgroup w on the step's queries 32 w .. 32 w + 31 for the scores and columns
// 128 w .. 128 w + 127 for dV_j, dK_j and dQ_i. Its P^T and dS^T go to shared memory (buffers
// cur.it % ds_buffers: config.cuh says why no step overwrites one still read) and are announced
// (DS_FULL); dV and dK over its own queries start from registers while the other warpgroup
// finishes its softmax; once both warpgroups' are there (wait_ds, the same step), dV and dK over
// the other's queries and dQ_i's part, all from shared memory; the part then to dQ_acc from the
// registers (hand_over_dq: DQ_BY_ATOMICS). One meeting a step.
template <int D, bool BF16, dq_way DQ, bool EXTRAS, bool CAPPED>
__device__ __forceinline__ void consumer_step_split(float (&dV)[dkv_regs<D>()],
                                                    float (&dK)[dkv_regs<D>()],
                                                    const smem_tiles &sm, const consumer_place &p,
                                                    const bwd_problem &pb, const block_place &b,
                                                    uint64_t K_desc, uint64_t V_desc,
                                                    walk_step cur) {
    static_assert(splits_dkv<D>() && DQ == DQ_BY_ATOMICS, "D = 256's step: the columns split");
    constexpr int Q_ROWS = qrows<D>();
    const int slot = q_pipeline{cur.it}.slot();
    const uint32_t Q_tile = sm.Q + slot * q_tile_bytes<D>(),
                   dO_tile = sm.dO + slot * q_tile_bytes<D>();
    const int own = wg_query0<D>(p.wg), other = wg_query0<D>(1 - p.wg);  // first queries
    const int key0 = b.key0, q0 = cur.q0 + own;  // the warpgroup's first query of the scores
    const int key_row = key0 + wg_key0<D>(p.wg) + WARP_ROWS * p.warp + p.g;  // the thread's first
    // the rows of its queries in Q_i and dO_i; the slabs of its columns there
    const uint32_t own_rows = own * SLAB_ROW_BYTES;
    const uint32_t cols = slab_offset<Q_ROWS>(wg_col0<D>(p.wg) / SLAB_COLS);
    float S[score_regs<D>()], dP[score_regs<D>()], dQ_part[dq_regs<D>()];
    uint32_t P16[packed_regs<D>()], dS16[packed_regs<D>()];
    float2 lse[score_cols<D>() / FRAG_COLS];

    // S^T = K_j Q_i^T and dP^T = V_j dO_i^T over its queries, each as soon as its tile has
    // landed, LSE_i into registers while they run; then P^T and dS^T
    mbar_wait(bar_at(sm, BAR_Q_FULL + slot), q_pipeline{cur.it}.phase());
    issue_scores<D, BF16>(S, K_desc, desc_k_major(Q_tile + own_rows));
    static_assert(lse_ahead<D>(), "LSE_i loaded while S^T runs");
    load_columns<D>(lse, sm.lse + slot * vec_bytes<D>() + own * (int)sizeof(float), p.t);
    mbar_wait(bar_at(sm, BAR_DO_FULL + slot), q_pipeline{cur.it}.phase());
    issue_scores<D, BF16>(dP, V_desc, desc_k_major(dO_tile + own_rows));
    const bool mask = step_needs_mask<D, EXTRAS>(b, key0, cur.q0);
    gradients<D, BF16, EXTRAS, CAPPED>(P16, dS16, S, dP, lse, sm, pb, b, key_row, q0, p.t, mask,
                                       slot, own * (int)sizeof(float));

    // P^T and dS^T to shared memory (the other warpgroup's dV and dK, both warpgroups' dQ read
    // them); dV, dK over its own queries from registers (group 1); then, once both warpgroups'
    // are there, dQ_i's part (group 2) and dV, dK over the other's queries (group 3), both from
    // shared memory. dQ's part goes first so that its adds run while group 3 does: groups
    // complete in order, so waiting for all but the last is groups 1 (P16 and dS16 read) and 2
    const uint32_t P_tile = pt_buffer_at<D>(sm, cur.it), dS_tile = ds_buffer_at<D>(sm, cur.it);
    store_ds<D>(P16, P_tile, p);
    store_ds<D>(dS16, dS_tile, p);
    announce_ds<D>(sm, p, cur.it);
    issue_dkv<D, BF16>(dV, dK, P16, dS16, desc_mn_major<Q_ROWS>(dO_tile + cols + own_rows),
                       desc_mn_major<Q_ROWS>(Q_tile + cols + own_rows));
    wait_ds<D>(sm, cur.it);
    issue_dq<D, BF16>(dQ_part, sm, dS_tile, p.wg);
    issue_dkv_other<D, BF16>(dV, dK, desc_k_major(P_tile), desc_k_major(dS_tile),
                             desc_mn_major<Q_ROWS>(dO_tile + cols),
                             desc_mn_major<Q_ROWS>(Q_tile + cols), other / WGMMA_K);
    wgmma_wait<1>();  // groups 1 and 2
    pin_registers(P16);
    pin_registers(dS16);
    pin_registers(dQ_part);
    hand_over_dq<D, DQ>(dQ_part, sm, p, pb, b, cur);  // (group 3 on the tensor cores meanwhile)
    wgmma_wait<0>();
    pin_registers(dV);
    pin_registers(dK);

    // Q_i, dO_i (read by the step's wgmma, all done), LSE_i, D_i (read by this thread's loads),
    // and the step's P^T and dS^T buffers (read by both warpgroups' wgmma before their arrivals
    // here) are no longer needed: every thread arrives (producer.cuh)
    mbar_arrive(bar_at(sm, BAR_Q_EMPTY + slot));
}

// The dQ part of the block's last step, after the loop: added from the registers where
// last_dq_by_reds (no wait for the staging tile), else handed over as every other.
template <int D, bool BF16, dq_way DQ, int WG>
__device__ __forceinline__ void last_dq(const smem_tiles &sm, const consumer_place &p,
                                        const bwd_problem &pb, const block_place &b, walk_step dq) {
    float dQ_part[dq_regs<D>()];
    wait_ds<D>(sm, dq.it);
    issue_dq<D, BF16, WG>(dQ_part, sm, ds_buffer_at<D>(sm, dq.it), p.wg);
    wgmma_wait<0>();
    pin_registers(dQ_part);
    if constexpr (last_dq_by_reds<D, DQ>())
        add_dq_atomic<D, true, dq_tiled<D, DQ>()>(dQ_part, pb, b, p.wg, p.warp, p.lane, dq.head,
                                                  dq.q0);
    else
        hand_over_dq<D, DQ>(dQ_part, sm, p, pb, b, dq);
}

// A consumer warpgroup's walk: wait for K_j, V_j; one step per query tile of each query head of
// the group (the producer's walk, in the same order), each with the dQ part of the step before
// (the last step's after the loop; at D = 256 each with its own). No query tile sees the keys (a
// window, or causal with N > N_k; a packed sequence with no query): no step. A split walk: the
// block's share of those tiles (walk_tiles_of). WG: the warpgroup, where its code differs
// (issue_dq: D = 96's second), else ANY_WARPGROUP.
template <int D, bool BF16, dq_way DQ, bool EXTRAS, bool CAPPED, int WG, bool TAIL>
__device__ __forceinline__ int consumer_walk(float (&dV)[dkv_regs<D>()], float (&dK)[dkv_regs<D>()],
                                             const smem_tiles &sm, const bwd_problem &pb,
                                             const consumer_place &p, const block_place &b, int it0,
                                             int hands_behind, int dkv_read) {
    // this warpgroup's 64 rows of K_j and V_j (at D = 256 the block's 64: wg_key0), the A
    // operands of S^T and dP^T
    const int rows_at = splits_dkv<D>() ? 0 : p.wg * WGMMA_M * SLAB_ROW_BYTES;
    const uint64_t K_desc = desc_k_major(sm.K + rows_at);
    const uint64_t V_desc = desc_k_major(sm.V + rows_at);

    int tiles;
    const int first = walk_tiles_of<D, true, TAIL>(pb, b.keys, b.key0, &tiles);
    const int steps = pb.group * tiles;
    if (steps > 0) {
        // the first Q_i has landed, and with it K_j (a persistent block's came on KV_FULL)
        mbar_wait(bar_at(sm, BAR_Q_FULL + q_pipeline{it0}.slot()), q_pipeline{it0}.phase());
        const int q_first = first * qrows<D>(), q_end = q_first + tiles * qrows<D>();
        walk_step cur = {it0, hands_behind, b.kv_head * pb.group, q_first};
        if constexpr (splits_dkv<D>()) {  // D = 256: each step's dQ part in the step
            for (int it = 0; it < steps; ++it) {
                consumer_step_split<D, BF16, DQ, EXTRAS, CAPPED>(dV, dK, sm, p, pb, b, K_desc,
                                                                 V_desc, cur);
                cur = next_step(cur, q_first, q_end, qrows<D>());
            }
        } else {  // the dQ part a step late, the last one's after the loop
            consumer_step<D, BF16, DQ, EXTRAS, CAPPED, true, WG>(dV, dK, sm, p, pb, b, K_desc,
                                                                 V_desc, cur, cur, dkv_read);
            for (int it = 1; it < steps; ++it) {
                const walk_step prev = cur;
                cur = next_step(cur, q_first, q_end, qrows<D>());
                consumer_step<D, BF16, DQ, EXTRAS, CAPPED, false, WG>(dV, dK, sm, p, pb, b, K_desc,
                                                                      V_desc, cur, prev);
            }
            last_dq<D, BF16, DQ, WG>(sm, p, pb, b, cur);
        }
    }
    return steps;
}

// One consumer thread, for each work tile of the block (a persistent block's as the load warp
// publishes them, the rings' counts running on across them): dK_j, dV_j = 0; its warpgroup's walk
// (D = 96: each warpgroup's own code, so that the second's dQ product is its 32 columns, N = 32,
// LOG.md, step 65; its warpgroup's index a constant there, or the lean kernel's wgmma are
// serialized, step 70); dK_j *= scale; store both (stage_dkv: one code for both warpgroups, as its
// named barriers need: bar.sync is aligned, every thread that meets one meets it at the same
// instruction). A split walk's share writes its fp32 sums instead (write_dkv_share), the whole
// block alike.
template <int D, bool BF16, dq_way DQ, bool EXTRAS, bool CAPPED, bool PERSISTENT, bool TAIL>
__device__ __forceinline__ void consumer(const smem_tiles &sm, const bwd_problem &pb) {
    const consumer_place place = consumer_place_of_thread();
    block_counts c = {0};  // (a persistent block's: see schedule.cuh)
    for (;;) {
        // The thread's place; in a persistent block hidden from the compiler at each work tile, so
        // that what the walk works out of it is worked out in each work tile's walk, not once
        // ahead of the loop and held across every walk (which spilled at D = 128)
        consumer_place p = place;
        if constexpr (PERSISTENT)
            asm volatile("" : "+r"(p.wg), "+r"(p.warp), "+r"(p.lane), "+r"(p.g), "+r"(p.t));
        const int it = counted_steps(c), n = counted_tiles(c);
        const bool later = PERSISTENT && past_first_tile(c);  // not the block's first work tile
        // how far the dQ hand-overs lag the steps: one for each work tile before whose last part
        // went by reductions (every work tile of a persistent block has a step); only the
        // hand-overs' parity is used
        const int behind = last_dq_by_reds<D, DQ>() ? n : 0;
        int w = 0;
        if constexpr (PERSISTENT) {
            w = take_work_by_warp(sm, n, p.lane);
            if (w >= pb.work_tiles) break;                        // that was "stop"
            mbar_wait(bar_at(sm, BAR_KV_FULL), (uint32_t)n & 1);  // K_j, V_j
            if (later) named_barrier_sync<CONSUMERS * WARPGROUP>(NAMED_BARRIER_TILE_START);
        }
        const block_place b =
            block_place_of<D>(pb, PERSISTENT ? work_tile_at(pb, w) : own_work_tile<TAIL>(pb));
        float dV[dkv_regs<D>()], dK[dkv_regs<D>()];
#pragma unroll
        for (int i = 0; i < dkv_regs<D>(); ++i) dV[i] = dK[i] = 0.f;
        // (persistent, past the first work tile: the parity of DKV_READ's phase that frees the
        // dS^T buffers, the work tile before's)
        const int dkv_read = later ? (n - 1) & 1 : -1;
        int steps;
        if constexpr (D % SLAB_COLS != 0) {
            consumer_place q = p;
            if (p.wg == CONSUMERS - 1) {
                q.wg = CONSUMERS - 1;
                steps = consumer_walk<D, BF16, DQ, EXTRAS, CAPPED, CONSUMERS - 1, TAIL>(
                    dV, dK, sm, pb, q, b, it, behind, dkv_read);
            } else {
                q.wg = 0;
                steps = consumer_walk<D, BF16, DQ, EXTRAS, CAPPED, 0, TAIL>(dV, dK, sm, pb, q, b,
                                                                            it, behind, dkv_read);
            }
        } else {
            steps = consumer_walk<D, BF16, DQ, EXTRAS, CAPPED, ANY_WARPGROUP, TAIL>(
                dV, dK, sm, pb, p, b, it, behind, dkv_read);
        }
        if (own_walk_split<TAIL>(pb))  // a split walk: this share's sums, for the sum pass
            write_dkv_share<D, TAIL>(dK, dV, p, pb, b);
        else  // (the work tile's last hand-over, where its last part is staged)
            stage_dkv<D, BF16, PERSISTENT>(dK, dV, sm, p, pb, b, it + steps - 1 - behind);
        if constexpr (!PERSISTENT) break;
        c = counts_after_tile(c, steps);
    }
}
