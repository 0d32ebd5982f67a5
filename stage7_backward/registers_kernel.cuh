/*
 * stage7_backward/registers_kernel.cuh: backward_registers_kernel, the layout with P^T and dS^T in
 * registers: 16 keys a warp for every product. The variant registers, and the fallback where
 * backward_kernel's shared memory does not fit (an L4, a T4).
 */
#pragma once

#include "dq.cuh"
#include "gemm.cuh"
#include "smem.cuh"

// P^T = 2^(scale log2(e) S^T - LSE_i log2(e)), in place: rows are this warp's keys (the first is
// key_row), columns the tile's queries (the first is key index qk0 = q0 + N_k - N: causal query i
// sees keys <= i + N_k - N). mask (the diagonal tile, and the tile holding N_k): keys past N_k
// and, causal, keys after the query's last get P = 0. Queries past N (and those that see no key)
// have LSE = +inf: P = 0.
template <int NB>
__device__ __forceinline__ void probabilities_t(float (&S)[NB][4], uint32_t lse_tile, int key_row,
                                                int qk0, const bwd_params &p, bool mask) {
    // LAB HOLE 1 BEGIN [design]: P^T and dS^T recomputed: P^T, registers layout (probabilities_t)
    // LAB TODO: P^T as in softmax_gradients (smem_kernel.cuh), in this layout: S holds the warp's
    // LAB TODO: 16 keys x QROWS queries of S^T as NB m16n8 blocks, element e of block n at key
    // LAB TODO: key_row + g + 8 h and query column 8 n + 2 t + c (qk0 + the column: the query as a
    // LAB TODO: key index); lse_tile holds LSE_i, a float per query column. Masked only when
    // LAB TODO: `mask` says so.
#pragma unroll
    for (int n = 0; n < NB; ++n) {
        const float2 lse = ld_shared_f2(lse_tile + frag_col(n, 0) * sizeof(float));
#pragma unroll
        for (int e = 0; e < FRAG_REGS; ++e) {
            const int key = key_row + frag_row(e), query = qk0 + frag_col(n, e);  // (a key index)
            const bool off = mask && (key >= p.N_k || (p.causal && key > query));
            const float x = fmaf(S[n][e], p.scale_log2, -(frag_c(e) ? lse.y : lse.x));
            S[n][e] = off ? 0.f : fast_exp2(x);
        }
    }
    // LAB HOLE 1 END
}

// MODEL (a local window, a softcap): P^T as probabilities_t, masked by the window (key_masked), and
// with a softcap c from t = tanh(scale S^T / c): P^T = 2^(t c log2(e) - LSE_i).
template <int NB>
__device__ __forceinline__ void probabilities_model_t(float (&S)[NB][4], uint32_t lse_tile,
                                                      int key_row, int qk0, const bwd_params &p,
                                                      const bwd_model &model, bool mask) {
    // LAB HOLE 1 BEGIN [design]: P^T and dS^T recomputed: P^T, windowed (probabilities_model_t)
    // LAB TODO: probabilities_t's P^T under MODEL's rules: masked (where `mask` says so) by the
    // LAB TODO: sequence's window (model.keys), and with a softcap (model.cap_in > 0) from the
    // LAB TODO: capped score t = tanh(S^T cap_in): P^T = 2^(t cap_log2 - LSE_i). The factor 1 - t^2
    // LAB TODO: of dS^T is softcap_gradients_t's (next).
    const bool softcap = model.cap_in > 0.f;  // the same for every thread
#pragma unroll
    for (int n = 0; n < NB; ++n) {
        const float2 lse = ld_shared_f2(lse_tile + frag_col(n, 0) * sizeof(float));
#pragma unroll
        for (int e = 0; e < FRAG_REGS; ++e) {
            const int key = key_row + frag_row(e), query = qk0 + frag_col(n, e);  // (a key index)
            const bool off = mask && key_masked(model.keys, key, query);
            const float lse_e = frag_c(e) ? lse.y : lse.x;
            const float x = softcap
                                ? fmaf(tanh_approx(S[n][e] * model.cap_in), model.cap_log2, -lse_e)
                                : fmaf(S[n][e], p.scale_log2, -lse_e);
            S[n][e] = off ? 0.f : fast_exp2(x);
        }
    }
    // LAB HOLE 1 END
}

// MODEL with a softcap: dS^T gains the cap's derivative, 1 - t^2. score_gradients_t (next, the
// lab's) computes P^T (dP^T - D_i), so here dP^T becomes D_i + (1 - t^2) (dP^T - D_i), whose
// difference from D_i carries the factor. t is read back from P^T, whose log2 is
// t c log2(e) - LSE_i, rather than kept from probabilities_model_t: 16 registers across dP^T's
// product, which this kernel's sm_75 build has not to spare. Where P^T = 0 (masked, or below fp32's
// range) dS^T is 0 whatever t.
template <int NB>
__device__ __forceinline__ void softcap_gradients_t(float (&dP)[NB][4], const float (&P)[NB][4],
                                                    uint32_t lse_tile, uint32_t D_tile,
                                                    const bwd_model &model) {
    const float per_log2 = 1.f / model.cap_log2;
#pragma unroll
    for (int n = 0; n < NB; ++n) {
        const float2 lse = ld_shared_f2(lse_tile + frag_col(n, 0) * sizeof(float));
        const float2 Di = ld_shared_f2(D_tile + frag_col(n, 0) * sizeof(float));
#pragma unroll
        for (int e = 0; e < FRAG_REGS; ++e) {
            const float D_e = frag_c(e) ? Di.y : Di.x;
            const float t = (__log2f(P[n][e]) + (frag_c(e) ? lse.y : lse.x)) * per_log2;
            if (P[n][e] > 0.f) dP[n][e] = fmaf(fmaf(-t, t, 1.f), dP[n][e] - D_e, D_e);
        }
    }
}

// dS^T = P^T * (dP^T - D_i), in place of dP^T; D_i per column (query).
template <int NB>
__device__ __forceinline__ void score_gradients_t(float (&dP)[NB][4], const float (&P)[NB][4],
                                                  uint32_t D_tile) {
    // LAB HOLE 1 BEGIN [design]: P^T and dS^T recomputed: dS^T (score_gradients_t)
    // LAB TODO: dS^T = P^T (dP^T - D_i) in place of dP^T, element by element (P and dP: the
    // LAB TODO: layout of probabilities_t's S); D_tile holds D_i, a float per query column.
#pragma unroll
    for (int n = 0; n < NB; ++n) {
        const float2 Di = ld_shared_f2(D_tile + frag_col(n, 0) * sizeof(float));
#pragma unroll
        for (int e = 0; e < FRAG_REGS; ++e)
            dP[n][e] = P[n][e] * (dP[n][e] - (frag_c(e) ? Di.y : Di.x));
    }
    // LAB HOLE 1 END
}

// This warp's rows of dS^T (A fragments) into dS_smem [ROWS keys, QROWS queries], swizzled: A
// fragment k holds columns 16k.. (a[0], a[1]: rows g, g + 8) and 16k + 8.. (a[2], a[3]).
template <int QROWS, int KC>
__device__ __forceinline__ void store_score_gradients(uint32_t dS_smem, const uint32_t (&dS)[KC][4],
                                                      int warp) {
    const int g = lane_index() / QUAD, t = lane_index() % QUAD;
    const int r = MMA_M * warp + g;
#pragma unroll
    for (int k = 0; k < KC; ++k) {
#pragma unroll
        for (int half = 0; half < N8_PER_K16; ++half) {  // column block 2k + half: chunk 2k + half
            const uint32_t col = t * sizeof(uint32_t);
            st_shared_b32(dS_smem + smem_offset<QROWS>(r, N8_PER_K16 * k + half) + col,
                          dS[k][a_frag_reg(half, 0)]);
            st_shared_b32(
                dS_smem + smem_offset<QROWS>(r + FRAG_ROW_STEP, N8_PER_K16 * k + half) + col,
                dS[k][a_frag_reg(half, 1)]);
        }
    }
}

// dQ_acc[q0 + QROWS rows] += dS K_j (head: the offset of the query head's [N, D] in dQ_acc),
// split over the warps: warp w takes the 16 query rows of
// slice w % (QROWS / 16) and its share of the head dim. A = those rows of dS (read .trans from
// dS_smem, where they are columns), B = K_j (.trans); two head-dim blocks at a time, each added to
// global memory by fp32 atomics (red.global.add; two floats at once on sm_90), rows past the
// sequence's end skipped (MODEL: sequence s's). TAIL: dQ_acc's rows are p.D floats, and the
// columns past them are skipped.
template <bool BF16, int D, int ROWS, int QROWS, int WARPS, bool TAIL, bool MODEL>
__device__ __forceinline__ void accumulate_dq(const bwd_params &p, const bwd_sequence &s,
                                              uint32_t dS_smem, uint32_t K_smem, size_t head,
                                              int q0) {
    constexpr int KC = ROWS / MMA_K;            // k16 steps over the keys
    constexpr int SLICES = QROWS / MMA_M;       // m16 slices of the query tile
    constexpr int PARTS = WARPS / SLICES;       // warps per slice
    constexpr int DB_PART = D / MMA_N / PARTS;  // n8 blocks of the head dim per warp
    constexpr int ROW_BYTES_S = QROWS * HALF_BYTES, ROW_BYTES = D * HALF_BYTES;
    static_assert(WARPS % SLICES == 0 && DB_PART % X4_BLOCKS == 0, "dQ split over the warps");
    const int warp = (int)threadIdx.x / WARP_SIZE;
    const int slice = warp % SLICES, part = warp / SLICES;
    const uint32_t at_off = b_lane_offset<QROWS>() ^ (slice * X4_BYTES);
    const uint32_t b_off = a_lane_offset<D>();
    const int g = lane_index() / QUAD, t = lane_index() % QUAD;
    // Registers: with 64 keys (KC = 4) the whole A (16 registers) is loaded once and two head-dim
    // blocks accumulated at a time; with 128 keys A would take 32, so the loop runs over the keys
    // outside, one k16 step of A at a time, and every head-dim block of the warp (16 registers)
    // accumulates at once.
    constexpr bool A_WHOLE = KC * A_FRAG_REGS <= X4_BLOCKS * MMA_N * 2;
    constexpr int NC = A_WHOLE ? X4_BLOCKS : DB_PART;  // n8 blocks accumulated at once
#pragma unroll
    for (int nn0 = 0; nn0 < DB_PART; nn0 += NC) {
        float C[NC][4] = {};
        uint32_t A[A_WHOLE ? KC : 1][4];
#pragma unroll
        for (int k = 0; k < KC; ++k) {
            uint32_t(&a)[4] = A[A_WHOLE ? k : 0];
            if (!A_WHOLE || nn0 == 0) {
                ldmatrix_x4_trans(a, dS_smem + at_off + k * MMA_K * ROW_BYTES_S);
            }
#pragma unroll
            for (int nn = 0; nn < NC; nn += X4_BLOCKS) {
                const int n = part * DB_PART + nn0 + nn;  // head-dim blocks n, n + 1
                uint32_t b[4];
                ldmatrix_x4_trans(b, K_smem + lane_xor<D>(b_off, n / X4_BLOCKS * X4_BYTES) +
                                         k * MMA_K * ROW_BYTES);
                mma_16816_of<BF16>(C[nn], a, b[0], b[1]);
                mma_16816_of<BF16>(C[nn + 1], a, b[2], b[3]);
            }
        }
#pragma unroll
        for (int h = 0; h < FRAG_LANE_ROWS; ++h) {
            const int row = q0 + MMA_M * slice + g + FRAG_ROW_STEP * h;
            if (row >= queries_of<MODEL>(p, s)) continue;
#pragma unroll
            for (int nn = 0; nn < NC; ++nn) {
                const int col = MMA_N * (part * DB_PART + nn0 + nn);
                if (TAIL && col >= p.D) continue;
                float *to =
                    p.dQ_acc + head + (size_t)row * (TAIL ? p.D : D) + col + FRAG_LANE_COLS * t;
                add_pair(to, C[nn][frag_reg(h, 0)], C[nn][frag_reg(h, 1)]);
            }
        }
    }
}

// One block = one key tile K_j, V_j of one (batch, key/value head), ROWS keys, 16 per warp; it
// loops over the query tiles that see it (causal: from its own diagonal on) of every query head of
// its group (GQA: one head after the other, dK_j and dV_j summed over them in registers).
// ADDS_DQ: the block also adds its part of dQ (the default); the deterministic variant leaves dQ
// to dq_kernel. MODEL (a local window, a softcap: bwd_model): the query tiles whose rows see the
// key tile, the window's masks, the softcap (probabilities_model_t), and whether dQ is added is
// the launcher's (model.dq; instantiated with ADDS_DQ). MODEL also runs packed batches (as
// backward_kernel: the block's sequence, bwd_sequence_of, and its rule).
template <int D, int WARPS, int STAGES, int QROWS, bool ADDS_DQ, bool BF16, bool MODEL = false>
__global__ void __launch_bounds__(WARPS *WARP_SIZE)
    backward_registers_kernel(const bwd_params p, const bwd_model shape_model) {
    constexpr tile_config CFG = {WARPS, STAGES, QROWS};
    constexpr int THREADS = WARPS * WARP_SIZE;
    constexpr int ROWS = tile_rows(CFG);       // keys per block
    constexpr int ROW_BYTES = D * HALF_BYTES;  // one row of a [*, D] tile in shared memory
    constexpr int NB = QROWS / MMA_N;          // n8 blocks of S^T per warp (queries)
    constexpr int KC = QROWS / MMA_K;          // k16 steps over the queries
    constexpr int DB = D / MMA_N;              // n8 blocks of dK, dV (head dim)
    constexpr uint32_t KV_TILE = ROWS * ROW_BYTES, Q_TILE = QROWS * ROW_BYTES;
    constexpr uint32_t VEC = LOOP_VECTORS * QROWS * sizeof(float);  // LSE_i, then D_i
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
    // sm_75 code has no cp.async to fill a second buffer with: the launcher picks one stage there
    // (kernel_arch), and the two-stage kernels are not compiled for it; nor has it a bf16 mma
    // (stage_unsupported refuses bf16 there first).
    if constexpr (STAGES == 2 || BF16) {
        __trap();
        return;
    }
#endif

    const block_place place =
        place_of_block<MODEL>(shape_model);                   // key tile, (batch, K/V head), share
    const int k0 = place.key_tile * ROWS;                     // the block's first key
    const int b = place.bh / p.H_kv, hk = place.bh % p.H_kv;  // batch, K/V head
    // MODEL: the sequence (packed: b's rows of the batch; unpacked: the batch b) and its rule
    const bwd_sequence s = kernel_sequence<MODEL>(p, b);
    // packed: a key tile at or past the sequence's keys does nothing (the rows past N_k_b are
    // the next sequence's: nothing written)
    if (MODEL && k0 >= s.seq.N_k) return;
    const bwd_model model = sequence_model<MODEL>(shape_model, s);
    const int warp = (int)threadIdx.x / WARP_SIZE;
    const int key_row = k0 + MMA_M * warp;  // this warp's first key
    // Earlier queries see no key here (causal: query i sees keys <= i + key_shift); from a
    // whole query tile, so that LSE_i and D_i stay within their padded rows. MODEL: nor do the
    // queries past a window's end.
    int q_begin = p.causal ? max(k0 - key_shift_of<MODEL>(p, s), 0) / QROWS * QROWS : 0,
        q_end = queries_of<MODEL>(p, s);
    if constexpr (MODEL) {  // (q_end: the plain kernels' p.N)
        q_begin = key_tile_first_query<QROWS>(model.keys, k0);
        q_end = key_tile_query_end(model.keys, k0, ROWS);
    }
    walk_share<QROWS>(q_begin, q_end, place);  // (a split walk: the block's share of the tiles)
    const int tiles = max((q_end - q_begin + QROWS - 1) / QROWS, 0) * p.group;  // all heads' tiles
    const bool adds_dq = ADDS_DQ && (!MODEL || model.dq != DQ_BY_SECOND_PASS);

    // Shared memory: K_smem, V_smem [ROWS, D]; per stage Q_smem, dO_smem [QROWS, D]; dS_smem
    // [ROWS keys, QROWS queries]; per stage vec_smem [2, QROWS] floats. Tiles swizzled.
    extern __shared__ __align__(128) unsigned char smem[];
    const uint32_t K_smem = smem_u32(smem), V_smem = K_smem + KV_TILE;
    const uint32_t Q_smem = V_smem + KV_TILE, dO_smem = Q_smem + STAGES * Q_TILE;
    const uint32_t dS_smem = dO_smem + STAGES * Q_TILE;
    const uint32_t vec_smem = dS_smem + ROWS * QROWS * sizeof(__half);

    // (a walk of no step issues no copy: a split walk's empty share may start at the head's padded
    // end, past its rows of LSE_i and D_i)
    const int cols = MODEL ? p.D : D;     // the head dim's columns the tensors hold
    int hq = hk * p.group, q0 = q_begin;  // the loop tile: query head hq (GQA: of hk's group), q0
    if (tiles > 0) {
        issue_key_tile<D, ROWS, THREADS, MODEL>(p, s, K_smem, V_smem, b, hk, k0, cols);
        if (STAGES == 2)
            issue_query_tile<D, QROWS, THREADS, true, MODEL>(p, s, Q_smem, dO_smem, vec_smem, b, hq,
                                                             q0, cols);
    }

    float dK[DB][4] = {}, dV[DB][4] = {};  // this warp's 16 keys x D, fp32
    for (int it = 0; it < tiles; ++it) {
        const int buf = STAGES == 2 ? it % STAGES : 0;
        const uint32_t Q_tile = Q_smem + buf * Q_TILE, dO_tile = dO_smem + buf * Q_TILE;
        const uint32_t vec_tile = vec_smem + buf * VEC;
        if (STAGES == 1) {    // (the T4's configuration: its sm_75 code unrolls every copy)
            __syncthreads();  // every warp is done with the last tile's Q, dO, LSE, D and dS
            issue_query_tile<D, QROWS, THREADS, false, MODEL>(p, s, Q_tile, dO_tile, vec_tile, b,
                                                              hq, q0, cols);
        }
        cp_async_wait<0>();
        __syncthreads();  // tile it (and K_j, V_j) visible to all; with two stages, every warp is
                          // also done with tile it - 1 (its buffer is refilled next) and dS_smem
        if (STAGES == 2 && it + 1 < tiles) {
            int hq_next = hq, q0_next = q0;
            next_query_tile<QROWS>(hq_next, q0_next, q_begin, q_end);
            issue_query_tile<D, QROWS, THREADS, true, MODEL>(
                p, s, Q_smem + (STAGES - 1 - buf) * Q_TILE, dO_smem + (STAGES - 1 - buf) * Q_TILE,
                vec_smem + (STAGES - 1 - buf) * VEC, b, hq_next, q0_next, cols);
        }
        const uint32_t K_warp = K_smem + warp * MMA_M * ROW_BYTES;  // this warp's keys
        const uint32_t V_warp = V_smem + warp * MMA_M * ROW_BYTES;

        float S[NB][4], dP[NB][4];
        uint32_t A[KC][4];
        gemm_rows_by_rows<BF16, D>(S, K_warp, Q_tile);   // S^T = K_j Q_i^T
        const int qk0 = q0 + key_shift_of<MODEL>(p, s);  // the tile's first query as a key index
        if constexpr (MODEL) {
            probabilities_model_t(S, vec_tile, key_row, qk0, p, model,
                                  tile_needs_mask(model.keys, k0, ROWS, qk0, QROWS));  // P^T
            gemm_rows_by_rows<BF16, D>(dP, V_warp, dO_tile);  // dP^T = V_j dO_i^T
            if (model.cap_in > 0.f)
                softcap_gradients_t(dP, S, vec_tile, vec_tile + QROWS * sizeof(float), model);
        } else {
            const bool mask = k0 + ROWS > p.N_k || (p.causal && qk0 < k0 + ROWS - 1);
            probabilities_t(S, vec_tile, key_row, qk0, p, mask);  // P^T
            gemm_rows_by_rows<BF16, D>(dP, V_warp, dO_tile);      // dP^T = V_j dO_i^T
        }
        // LAB HOLE 2 BEGIN: dK_j, dV_j accumulated: from P^T and dS^T in registers
        // LAB TODO: here S holds P^T and dP holds dP^T: the warp's 16 keys x QROWS queries as
        // LAB TODO: accumulator fragments. dV_j += P^T dO_i, then dK_j += dS^T Q_i, with P^T and
        // LAB TODO: dS^T as the A operand straight from registers: the accumulators of two n8
        // LAB TODO: blocks are, register for register, the A fragment of one k16 step once packed
        // LAB TODO: to 16 bits (gemm.cuh: the packing, and A fragments times a [QROWS, D] tile).
        // LAB TODO: dS^T is score_gradients_t's (D_i after LSE_i in vec_tile). A must hold dS^T
        // LAB TODO: at the end: dQ below reads it.
        // LAB STUB: to_a_fragments<BF16>(A, S);  // until filled: dK and dV stay 0, dQ reads P^T
        to_a_fragments<BF16>(A, S);
        gemm_frags_by_tile<BF16, D>(dV, A, dO_tile);                 // dV_j += P^T dO_i
        score_gradients_t(dP, S, vec_tile + QROWS * sizeof(float));  // dS^T
        to_a_fragments<BF16>(A, dP);
        gemm_frags_by_tile<BF16, D>(dK, A, Q_tile);  // dK_j += dS^T Q_i
        // LAB HOLE 2 END
        if (adds_dq) {
            store_score_gradients<QROWS>(dS_smem, A, warp);
            __syncthreads();  // dS_smem written by every warp, visible to all
            accumulate_dq<BF16, D, ROWS, QROWS, WARPS, MODEL, MODEL>(
                p, s, dS_smem, K_smem,
                MODEL ? (size_t)(s.row_acc + hq * s.head_acc) * cols
                      : (size_t)(b * p.H + hq) * p.N * cols,
                q0);
        }
        next_query_tile<QROWS>(hq, q0, q_begin, q_end);
    }
    // A key tile no row sees (a window, a split walk's empty share) ran no loop, issued no copy,
    // and stores dK_j = dV_j = 0.
    if (place.shares > 1) {  // a split walk's share: fp32 sums for the sum pass
        float *const at = dkv_share_at<D, ROWS>(model, place, key_row);
        write_share_rows(at, dK, dkv_row_step<D>(place));
        write_share_rows(at + D, dV, dkv_row_step<D>(place));
        return;
    }
    // (MODEL: the sequence's keys, from its first; packed, the rows past them are the next one's)
    store_rows<BF16, D>(p.dK + head_offset(p.layout.dK, b, hk) +
                            (MODEL ? rows_offset((int)s.seq.k_row, p.layout.dK.row) : 0),
                        dK, key_row, keys_of<MODEL>(p, s), p.scale, p.layout.dK.row, cols);
    store_rows<BF16, D>(p.dV + head_offset(p.layout.dV, b, hk) +
                            (MODEL ? rows_offset((int)s.seq.k_row, p.layout.dV.row) : 0),
                        dV, key_row, keys_of<MODEL>(p, s), 1.f, p.layout.dV.row, cols);
}
