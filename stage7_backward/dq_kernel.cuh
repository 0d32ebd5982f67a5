/*
 * stage7_backward/dq_kernel.cuh: dq_kernel, the deterministic variant's second pass: one block per
 * query tile, its dQ_i accumulated in registers over the key tiles (no atomics).
 */
#pragma once

#include "gemm.cuh"
#include "smem.cuh"

// MODEL (dq_kernel): S becomes P and dP becomes dS, for the warp's 16 queries (the first is q_row)
// x keys k0.. : the window's mask (key_masked) where the tile needs one, and with a softcap c,
// t = tanh(scale S / c), P = 2^(t c log2(e) - LSE), dS = P (dP - D_i) (1 - t^2). lse2, Di: the
// lane's rows g and g + 8. key_shift: the sequence's N_k - N.
template <int NB>
__device__ __forceinline__ void model_score_gradients(float (&S)[NB][4], float (&dP)[NB][4],
                                                      const bwd_params &p, const bwd_model &model,
                                                      const float (&lse2)[FRAG_LANE_ROWS],
                                                      const float (&Di)[FRAG_LANE_ROWS], int k0,
                                                      int q_row, int key_shift, bool mask) {
    const bool softcap = model.cap_in > 0.f;  // the same for every thread
#pragma unroll
    for (int n = 0; n < NB; ++n) {
#pragma unroll
        for (int e = 0; e < FRAG_REGS; ++e) {
            const int key = k0 + frag_col(n, e);
            const int query = q_row + frag_row(e) + key_shift;  // as a key index
            const bool off = mask && key_masked(model.keys, key, query);
            float t = 0.f, x;  // softcap: the capped score's tanh
            if (softcap) {
                t = tanh_approx(S[n][e] * model.cap_in);
                x = fmaf(t, model.cap_log2, -lse2[frag_h(e)]);
            } else {
                x = fmaf(S[n][e], p.scale_log2, -lse2[frag_h(e)]);
            }
            const float P = off ? 0.f : fast_exp2(x);
            dP[n][e] = P * (dP[n][e] - Di[frag_h(e)]) * fmaf(-t, t, 1.f);  // dS
        }
    }
}

// The deterministic variant's second pass: one block = one query tile Q_i, dO_i of one (batch,
// head), 16 rows per warp; it loops over the key tiles it sees (of its key/value head h / group:
// GQA; causal: keys <= query + N_k - N) and keeps dQ_i in registers (rows that see no key: 0):
//   S = Q_i K_j^T, P = 2^(c S - LSE_i), dP = dO_i V_j^T, dS = P (dP - D_i), dQ_i += dS K_j.
// MODEL (a local window, a softcap: bwd_model): the key tiles the tile's rows see (split_kv.cuh's
// rule, as the forward's), the window's masks, and with a softcap c, t = tanh(scale S / c):
// P = 2^(t c log2(e) - LSE_i), dS = P (dP - D_i) (1 - t^2). MODEL also runs packed batches: the
// batch of blockIdx.y is then a sequence (bwd_sequence_of), a query tile at or past its N_b rows
// does nothing, and the rule is the sequence's.
template <int D, int WARPS, int STAGES, bool BF16, bool MODEL = false>
__global__ void __launch_bounds__(WARPS *WARP_SIZE)
    dq_kernel(const bwd_params p, const bwd_model shape_model) {
    constexpr tile_config CFG = {WARPS, STAGES, 0};
    constexpr int THREADS = WARPS * WARP_SIZE;
    constexpr int ROWS = tile_rows(CFG);
    constexpr int ROW_BYTES = D * HALF_BYTES;
    constexpr int NB = ROWS / MMA_N, KC = ROWS / MMA_K, DB = D / MMA_N;
    constexpr uint32_t TILE = ROWS * ROW_BYTES;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
    // sm_75 has no bf16 mma, nor backward_kernel, which D > 128 needs: stage_unsupported refuses
    // both there first.
    if constexpr (BF16 || D > REGISTERS_MAX_D) {
        __trap();
        return;
    }
#endif
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1200
    // sm_120 (RTX 50): ptxas (CUDA 13.0) spills 8 bytes in the MODEL kernel at D = 64, so there is
    // none there: stage_unsupported refuses its shapes in the deterministic variant
    // (DQ_MODEL_D64_ABSENT_ARCH).
    if constexpr (MODEL && D == 64) {
        __trap();
        return;
    }
#endif

    // Causal: the last query tiles have the most key tiles; launch them first.
    const int q_index = p.causal ? (int)gridDim.x - 1 - (int)blockIdx.x : (int)blockIdx.x;
    const int q0 = q_index * ROWS;
    const int b = (int)blockIdx.y / p.H, h = (int)blockIdx.y % p.H;  // batch, query head
    // MODEL: the sequence (packed: b's rows of the batch; unpacked: the batch b) and its rule
    const bwd_sequence s = kernel_sequence<MODEL>(p, b);
    // packed: a query tile at or past the sequence's rows does nothing (the rows past N_b are
    // the next sequence's: nothing written)
    if (MODEL && q0 >= s.seq.N) return;
    const bwd_model model = sequence_model<MODEL>(shape_model, s);
    const size_t vec = MODEL ? (size_t)(s.row_pad + h * s.head_pad)
                             : (size_t)blockIdx.y * p.N_pad;  // its rows of lse2 and Dsum
    // (MODEL: the sequence's first key row, and below its first query row: packed, not 0)
    const __half *const K_rows = p.K + head_offset(p.layout.k, b, h / p.group) +
                                 (MODEL ? rows_offset((int)s.seq.k_row, p.layout.k.row) : 0);
    const __half *const V_rows = p.V + head_offset(p.layout.v, b, h / p.group) +
                                 (MODEL ? rows_offset((int)s.seq.k_row, p.layout.v.row) : 0);
    const unsigned k_ld = p.layout.k.row, v_ld = p.layout.v.row;
    const int warp = (int)threadIdx.x / WARP_SIZE;
    const int q_row = q0 + MMA_M * warp;  // this warp's first query
    // Causal: the tile's last query (or N's) sees keys up to it + N_k - N (none: no key tile).
    // MODEL: from the first key tile its first row sees (kv0) to the last its last row sees.
    const int kv_end = p.causal ? max(0, min(min(q0 + ROWS, p.N) + p.key_shift, p.N_k)) : p.N_k;
    const int kv0 = MODEL ? query_tile_first_key_tile(model.keys, q0, ROWS) * ROWS : 0;
    const int k_tiles =
        MODEL ? query_tile_key_tile_count(model.keys, q0, ROWS, ROWS) : (kv_end + ROWS - 1) / ROWS;

    // Shared memory: Q_smem, dO_smem [ROWS, D]; per stage K_smem, V_smem [ROWS, D]; swizzled.
    extern __shared__ __align__(128) unsigned char smem[];
    const uint32_t Q_smem = smem_u32(smem), dO_smem = Q_smem + TILE;
    const uint32_t K_smem = dO_smem + TILE, V_smem = K_smem + STAGES * TILE;
    const int cols = MODEL ? p.D : D;  // the head dim's columns the tensors hold

    const int row = MODEL ? (int)s.seq.q_row + q0 : q0;  // the tile's first in Q's, dO's layouts
    tile_issue<ROWS, D, THREADS>(
        Q_smem, p.Q + head_offset(p.layout.q, b, h) + rows_offset(row, p.layout.q.row),
        p.layout.q.row, (MODEL ? s.seq.N : p.N) - q0, cols);
    tile_issue<ROWS, D, THREADS>(
        dO_smem, p.dO + head_offset(p.layout.dO, b, h) + rows_offset(row, p.layout.dO.row),
        p.layout.dO.row, (MODEL ? s.seq.N : p.N) - q0, cols);
    cp_async_commit();
    if (STAGES == 2 && (!MODEL || k_tiles > 0)) {  // K_j, V_j of the first key tile (MODEL: kv0)
        tile_issue<ROWS, D, THREADS>(K_smem, MODEL ? K_rows + rows_offset(kv0, k_ld) : K_rows, k_ld,
                                     (MODEL ? s.seq.N_k : p.N_k) - kv0, cols);
        tile_issue<ROWS, D, THREADS>(V_smem, MODEL ? V_rows + rows_offset(kv0, v_ld) : V_rows, v_ld,
                                     (MODEL ? s.seq.N_k : p.N_k) - kv0, cols);
        cp_async_commit();
    }
    const int g = lane_index() / QUAD;
    float lse2[FRAG_LANE_ROWS],
        Di[FRAG_LANE_ROWS];  // rows g and g + 8 of this warp (padded arrays: always in bounds)
#pragma unroll
    for (int h = 0; h < FRAG_LANE_ROWS; ++h) {
        lse2[h] = p.lse2[vec + q_row + g + FRAG_ROW_STEP * h];
        Di[h] = p.Dsum[vec + q_row + g + FRAG_ROW_STEP * h];
    }

    float dQ[DB][4] = {};
    for (int it = 0; it < k_tiles; ++it) {
        const int k0 = kv0 + it * ROWS;
        // MODEL: the sequence read again (cu_seqlens, from L1) rather than held in registers across
        // the loop: beside dQ_i, S and dP ptxas would spill them (D = 96 on sm_80 to sm_89, D = 256
        // on sm_100)
        const bwd_sequence s_it = kernel_sequence<MODEL>(p, b);
        const int buf = STAGES == 2 ? it % STAGES : 0;
        const uint32_t K_tile = K_smem + buf * TILE, V_tile = V_smem + buf * TILE;
        if (STAGES == 1) {
            __syncthreads();  // every warp is done with the last K_j, V_j
            tile_issue<ROWS, D, THREADS>(K_tile, K_rows + rows_offset(k0, k_ld), k_ld,
                                         (MODEL ? s_it.seq.N_k : p.N_k) - k0, cols);
            tile_issue<ROWS, D, THREADS>(V_tile, V_rows + rows_offset(k0, v_ld), v_ld,
                                         (MODEL ? s_it.seq.N_k : p.N_k) - k0, cols);
            cp_async_commit();
        }
        cp_async_wait<0>();
        __syncthreads();  // K_j, V_j (and Q_i, dO_i) visible to all; with two stages, every warp
                          // is also done with K_{j-1}, V_{j-1}, whose buffer is refilled next
        if (STAGES == 2 && it + 1 < k_tiles) {
            tile_issue<ROWS, D, THREADS>(K_smem + (STAGES - 1 - buf) * TILE,
                                         K_rows + rows_offset(k0 + ROWS, k_ld), k_ld,
                                         (MODEL ? s_it.seq.N_k : p.N_k) - k0 - ROWS, cols);
            tile_issue<ROWS, D, THREADS>(V_smem + (STAGES - 1 - buf) * TILE,
                                         V_rows + rows_offset(k0 + ROWS, v_ld), v_ld,
                                         (MODEL ? s_it.seq.N_k : p.N_k) - k0 - ROWS, cols);
            cp_async_commit();
        }
        const uint32_t Q_warp = Q_smem + warp * MMA_M * ROW_BYTES;
        const uint32_t dO_warp = dO_smem + warp * MMA_M * ROW_BYTES;
        float S[NB][4], dP[NB][4];
        uint32_t A[KC][4];
        gemm_rows_by_rows<BF16, D>(S, Q_warp, K_tile);  // S = Q_i K_j^T
        if constexpr (MODEL) {  // dP first: P and dS in one pass, the cap's t read by both
            gemm_rows_by_rows<BF16, D>(dP, dO_warp, V_tile);  // dP = dO_i V_j^T
            const bwd_model model_it = sequence_model<MODEL>(shape_model, s_it);
            const int key_shift = key_shift_of<MODEL>(p, s_it);  // the sequence's N_k - N
            model_score_gradients(S, dP, p, model_it, lse2, Di, k0, q_row, key_shift,
                                  tile_needs_mask(model_it.keys, k0, ROWS, q0 + key_shift, ROWS));
        } else {
            const bool mask = k0 + ROWS > p.N_k || (p.causal && k0 + ROWS - 1 > q0 + p.key_shift);
#pragma unroll
            for (int n = 0; n < NB; ++n) {
#pragma unroll
                for (int e = 0; e < FRAG_REGS; ++e) {  // P = 2^(c S - LSE); masked keys: P = 0
                    const int key = k0 + frag_col(n, e);
                    const int query = q_row + frag_row(e) + p.key_shift;  // as a key index
                    const bool off = mask && (key >= p.N_k || (p.causal && key > query));
                    const float x = fmaf(S[n][e], p.scale_log2, -lse2[frag_h(e)]);
                    S[n][e] = off ? 0.f : fast_exp2(x);
                }
            }
            gemm_rows_by_rows<BF16, D>(dP, dO_warp, V_tile);  // dP = dO_i V_j^T
#pragma unroll
            for (int n = 0; n < NB; ++n) {
#pragma unroll
                for (int e = 0; e < FRAG_REGS; ++e)
                    dP[n][e] = S[n][e] * (dP[n][e] - Di[frag_h(e)]);  // dS
            }
        }
        to_a_fragments<BF16>(A, dP);
        gemm_frags_by_tile<BF16, D>(dQ, A, K_tile);  // dQ_i += dS K_j
    }
    cp_async_wait<0>();  // (no key tile: Q_i's, dO_i's copies land before the block ends)
    const bwd_sequence s_end = kernel_sequence<MODEL>(p, b);  // (MODEL: read again, as s_it)
    store_rows<BF16, D>(p.dQ + head_offset(p.layout.dQ, b, h) +
                            (MODEL ? rows_offset((int)s_end.seq.q_row, p.layout.dQ.row) : 0),
                        dQ, q_row, (MODEL ? s_end.seq.N : p.N), p.scale, p.layout.dQ.row, cols);
}
