/*
 * stage7_backward/smem_kernel.cuh: backward_kernel, the main kernel (FlashAttention-2's layout;
 * backward_registers_kernel is the fallback where its shared memory does not fit): P^T and dS^T
 * through shared memory, so that each of the five products splits over the 8 warps in the shape
 * that reads least shared memory. One block per key tile; per query tile, three phases between two
 * barriers (scores, dV and dK, dQ).
 */
#pragma once

#include "dq.cuh"
#include "gemm.cuh"
#include "smem.cuh"

// In place: S^T becomes P^T = 2^(c S^T - LSE_i) and dP^T becomes dS^T = P^T (dP^T - D_i), for
// keys key_row.. (MT m16 blocks) x queries q_col.. of the tile whose first query is key index qk0
// (q0 + N_k - N: causal query i sees keys <= i + N_k - N) (NT n8 blocks). MASK: keys past N_k
// and, causal, keys after the query's last get P = 0. MODEL: the mask is the window's
// (key_masked), and with a softcap the score is c tanh(scale S^T / c): P^T = 2^(t c log2(e) -
// LSE_i) with t = tanh(scale S^T / c), and dS^T gains the cap's derivative, 1 - t^2.
template <int QROWS, int MT, int NT, bool MASK, bool MODEL>
__device__ __forceinline__ void softmax_gradients(float (&S)[MT][NT][4], float (&dP)[MT][NT][4],
                                                  const bwd_params &p, const bwd_model &model,
                                                  uint32_t vec_tile, int key_row, int qk0,
                                                  int q_col) {
    // LAB HOLE 1 BEGIN [smem>=132096] [design]: P^T and dS^T recomputed (softmax_gradients)
    // LAB TODO: S and dP hold this warp's S^T = K_j Q_i^T and dP^T = V_j dO_i^T as m16n8
    // LAB TODO: accumulator fragments: element e of block (m, n) is key key_row + 16 m + g + 8 h
    // LAB TODO: (its row) and query q_col + 8 n + 2 t + c of the tile (its column), where g, t are
    // LAB TODO: the lane's quad and place in it, h, c the element's row half and column. Keys run
    // LAB TODO: along the rows, queries along the columns. Overwrite, element by element, S^T with
    // LAB TODO: P^T = exp(scale S^T - LSE_i) and dP^T with dS^T = P^T (dP^T - D_i), LSE_i and
    // LAB TODO: D_i = rowsum(dO_i * O_i) those of the element's query. vec_tile holds the tile's
    // LAB TODO: QROWS floats of LSE (log2 units: P^T is a power of 2, p.scale_log2 = scale
    // LAB TODO: log2(e)), then its QROWS of D, one per query column.
    // LAB TODO: MASK (the diagonal tile, the tile holding N_k): keys past N_k and, causal, keys
    // LAB TODO: past the query's diagonal get P^T = 0 (qk0 is the tile's first query as a key
    // LAB TODO: index: the last key it sees); MODEL: keys outside the sequence's window
    // LAB TODO: (model.keys) instead.
    // LAB TODO: MODEL with a softcap (model.cap_in > 0): the score is t = tanh(S^T cap_in) and
    // LAB TODO: P^T = 2^(t cap_log2 - LSE_i); dS^T gains the cap's derivative, a factor 1 - t^2.
    // LAB TODO: Query rows past N need no mask: their LSE is +inf.
    const bool softcap = MODEL && model.cap_in > 0.f;  // the same for every thread
#pragma unroll
    for (int m = 0; m < MT; ++m) {
#pragma unroll
        for (int n = 0; n < NT; ++n) {
            const int col = q_col + frag_col(n, 0);
            const float2 lse = ld_shared_f2(vec_tile + col * sizeof(float));
            const float2 Di = ld_shared_f2(vec_tile + (QROWS + col) * sizeof(float));
#pragma unroll
            for (int e = 0; e < FRAG_REGS; ++e) {
                const float lse_e = frag_c(e) ? lse.y : lse.x;
                float t = 0.f;  // softcap: the capped score's tanh
                float x;
                if (softcap) {
                    t = tanh_approx(S[m][n][e] * model.cap_in);
                    x = fmaf(t, model.cap_log2, -lse_e);
                } else {
                    x = fmaf(S[m][n][e], p.scale_log2, -lse_e);
                }
                S[m][n][e] = fast_exp2(x);
                if (MASK) {
                    const int key = key_row + MMA_M * m + frag_row(e);
                    const int query = qk0 + col + frag_c(e);  // as a key index
                    const bool off = MODEL ? key_masked(model.keys, key, query)
                                           : key >= p.N_k || (p.causal && key > query);
                    if (off) S[m][n][e] = 0.f;
                }
                dP[m][n][e] = S[m][n][e] * (dP[m][n][e] - (frag_c(e) ? Di.y : Di.x));
                if (softcap) dP[m][n][e] *= fmaf(-t, t, 1.f);  // d(c tanh(s / c)) / ds
            }
        }
    }
    // LAB HOLE 1 END
}

// One warp's block of the scores phase: keys key0.. (MT m16 blocks, from the block's k0) x
// queries q_col.. (NT n8 blocks, from the tile's q0) of S^T = K_j Q_i^T and dP^T = V_j dO_i^T
// (K_j, V_j from shared memory, or KV_REGS from their fragments K_frag, V_frag), then P^T and
// dS^T (softmax_gradients), stored to P_smem and dS_smem as fp16. mask: the
// diagonal tile, and the tile holding N_k; queries past N (and those that see no key) have LSE =
// +inf, so P = 0 there without a mask. qk0: the query tile's first query as a key index. MODEL:
// the window's mask and the softcap (softmax_gradients).
template <bool BF16, int D, int QROWS, int MT, int NT, bool KV_REGS, int KF, bool MODEL>
__device__ __forceinline__ void score_gradients(
    const bwd_params &p, const bwd_model &model, uint32_t K_smem, uint32_t V_smem,
    const uint32_t (&K_frag)[KF][MT][4], const uint32_t (&V_frag)[KF][MT][4], uint32_t Q_tile,
    uint32_t dO_tile, uint32_t vec_tile, uint32_t P_smem, uint32_t dS_smem, int k0, int key0,
    int qk0, int q_col, bool mask) {
    constexpr int ROW_BYTES = D * HALF_BYTES;
    float S[MT][NT][4], dP[MT][NT][4];
    if constexpr (KV_REGS) {
        gemm_nt_regs<BF16, D, MT, NT>(S, K_frag, Q_tile + q_col * ROW_BYTES);
        gemm_nt_regs<BF16, D, MT, NT>(dP, V_frag, dO_tile + q_col * ROW_BYTES);
    } else {
        gemm_nt<BF16, D, MT, NT>(S, K_smem, Q_tile + q_col * ROW_BYTES);    // S^T = K_j Q_i^T
        gemm_nt<BF16, D, MT, NT>(dP, V_smem, dO_tile + q_col * ROW_BYTES);  // dP^T = V_j dO_i^T
    }
    if (mask) {  // the same for the whole warp: the tiles without a mask test nothing
        softmax_gradients<QROWS, MT, NT, true, MODEL>(S, dP, p, model, vec_tile, k0 + key0, qk0,
                                                      q_col);
    } else {
        softmax_gradients<QROWS, MT, NT, false, MODEL>(S, dP, p, model, vec_tile, k0 + key0, qk0,
                                                       q_col);
    }
    store_fragments<BF16, QROWS>(P_smem, S, key0, q_col);
    store_fragments<BF16, QROWS>(dS_smem, dP, key0, q_col);
}

// dQ_acc[q0 + QROWS rows] += dS K_j, split over the 8 warps: warp (qw, dw) takes 32 query rows
// (D = 96: 16; A = dS, read .trans from dS_smem where they are columns) x D / DQ_COL_WARPS head-dim
// columns (B = K_j, .trans). BULK: into the staging tile (stage_dq_fragments). Else added to global
// memory by fp32 atomics (red.global.add), one address a thread, its fragment rows and columns
// constant offsets, rows past the sequence's end skipped (MODEL: sequence s's). head: the query
// head's first row of dQ_acc, in floats. TAIL: dQ_acc's rows are p.D floats, and the columns past
// them are skipped.
template <bool BF16, int D, int KEYS, int QROWS, bool BULK, bool TAIL, bool MODEL>
__device__ __forceinline__ void accumulate_dq_tile(const bwd_params &p, const bwd_sequence &s,
                                                   uint32_t dS_smem, uint32_t K_smem,
                                                   uint32_t dq_stage, size_t head, int q0) {
    constexpr int WARP_ROWS = dq_warp_rows<D, QROWS>();  // query rows a warp
    constexpr int DQ_ROW_WARPS = QROWS / WARP_ROWS, DQ_COL_WARPS = SMEM_P_WARPS / DQ_ROW_WARPS;
    constexpr int MQ = WARP_ROWS / MMA_M, NT_Q = D / DQ_COL_WARPS / MMA_N;
    static_assert(SMEM_P_WARPS % DQ_ROW_WARPS == 0 && NT_Q % X4_BLOCKS == 0, "dQ over the warps");
    const int warp = (int)threadIdx.x / WARP_SIZE;
    const int qw = warp % DQ_ROW_WARPS, dw = warp / DQ_ROW_WARPS;
    float C[MQ][NT_Q][4];
    gemm_nn<BF16, MQ, NT_Q, KEYS / MMA_K, true, QROWS, D, true>(
        C, dS_smem, WARP_ROWS * qw / CHUNK_HALVES, K_smem, NT_Q * MMA_N * dw / CHUNK_HALVES);
    if (BULK) {
        stage_dq_fragments<QROWS, MQ, NT_Q>(dq_stage, C, WARP_ROWS * qw, NT_Q * MMA_N * dw);
        return;
    }
    const int g = lane_index() / QUAD, t = lane_index() % QUAD;
    const int row0 = q0 + WARP_ROWS * qw + g;
    const int ld = TAIL ? p.D : D;  // dQ_acc's row
    float *const acc = p.dQ_acc + head + (size_t)row0 * ld + MMA_N * NT_Q * dw + FRAG_LANE_COLS * t;
#pragma unroll
    for (int m = 0; m < MQ; ++m) {
#pragma unroll
        for (int h = 0; h < FRAG_LANE_ROWS; ++h) {
            const int r = MMA_M * m + FRAG_ROW_STEP * h;  // the fragment row, from row0
            if (row0 + r >= queries_of<MODEL>(p, s)) continue;
#pragma unroll
            for (int n = 0; n < NT_Q; ++n) {
                if (TAIL && MMA_N * (NT_Q * dw + n) >= p.D) continue;
                float *to = acc + r * ld + MMA_N * n;
                add_pair(to, C[m][n][frag_reg(h, 0)], C[m][n][frag_reg(h, 1)]);
            }
        }
    }
}

// The epilogue: the warp's dK_j (times the scale: S = scale Q K^T) and dV_j, keys key_row ..
// (MT m16 blocks) x head-dim columns col0 .. (NT n8 blocks) of (batch b, key/value head hk), to
// global memory in the storage type (keys past the sequence's skipped: packed, the next
// sequence's rows; TAIL: columns past cols too). MODEL: sequence s's keys (packed: from row
// s.seq.k_row).
template <bool BF16, int MT, int NT, bool TAIL, bool MODEL>
__device__ __forceinline__ void store_dkv_fragments(const bwd_params &p, const bwd_sequence &s,
                                                    const float (&dK)[MT][NT][4],
                                                    const float (&dV)[MT][NT][4], int b, int hk,
                                                    int key_row, int col0, int cols) {
    __half *dK_rows = p.dK + head_offset(p.layout.dK, b, hk);  // [N_k, D] of (b, hk)
    __half *dV_rows = p.dV + head_offset(p.layout.dV, b, hk);
    if constexpr (MODEL) {  // the sequence's first key
        dK_rows += rows_offset((int)s.seq.k_row, p.layout.dK.row);
        dV_rows += rows_offset((int)s.seq.k_row, p.layout.dV.row);
    }
#pragma unroll
    for (int m = 0; m < MT; ++m) {
        const int g = lane_index() / QUAD, t = lane_index() % QUAD;
#pragma unroll
        for (int h = 0; h < FRAG_LANE_ROWS; ++h) {
            const int r = key_row + MMA_M * m + g + FRAG_ROW_STEP * h;
            if (r >= keys_of<MODEL>(p, s)) continue;
#pragma unroll
            for (int n = 0; n < NT; ++n) {
                if (TAIL && col0 + MMA_N * n >= cols) continue;
                const int col = col0 + MMA_N * n + FRAG_LANE_COLS * t;
                *reinterpret_cast<uint32_t *>(dK_rows + rows_offset(r, p.layout.dK.row) + col) =
                    pack2_of<BF16>(dK[m][n][frag_reg(h, 0)] * p.scale,
                                   dK[m][n][frag_reg(h, 1)] * p.scale);
                *reinterpret_cast<uint32_t *>(dV_rows + rows_offset(r, p.layout.dV.row) + col) =
                    pack2_of<BF16>(dV[m][n][frag_reg(h, 0)], dV[m][n][frag_reg(h, 1)]);
            }
        }
    }
}

// One block = one key tile K_j, V_j of one (batch, key/value head), KEYS keys; it loops over the
// query tiles that see it (causal: from its own diagonal on) of every query head of its group
// (GQA: H / H_kv heads, one after the other, dK_j and dV_j summed over them in registers). Per
// query tile, three phases between two barriers:
//   scores:    warp (kw, qw) of a 4 x 2 grid: its 32 keys x QROWS / 2 queries of S^T and dP^T, so
//              P^T and dS^T, in registers; stored to P_smem, dS_smem as fp16 (KV_REGS: K_j's and
//              V_j's fragments from registers, loaded after the first barrier)
//   dV, dK:    warp (kw, dw): its 32 keys x D / 2 columns of dV += P^T dO_i, dK += dS^T Q_i
//              (accumulators for the whole loop)
//   dQ:        warp (qw', dw'): 32 queries x its share of D of dS K_j, added by fp32 atomics
//              (sm_90 on: stored to a staging tile, which goes to dQ_acc by one bulk tensor
//              reduction issued after the next iteration's first barrier)
// MODEL (a local window, a softcap: bwd_model): the loop runs over the query tiles whose rows see
// the key tile (key_tile_first_query .. key_tile_query_end), the tiles crossing a bound masked,
// and how dQ is added is the launcher's (model.dq; instantiated with ADDS_DQ and DQ_BY_BULK_OK).
// MODEL also runs packed batches: blockIdx.y's batch is then a sequence (bwd_sequence_of), a key
// tile at or past its N_k_b keys does nothing, and every rule above is the sequence's.
template <int D, int KEYS, int QROWS, int STAGES, int SCORE_PASSES, bool KV_REGS, bool ADDS_DQ,
          bool DQ_BY_BULK_OK, bool BF16, bool MODEL = false>
__global__ void __launch_bounds__(SMEM_P_WARPS *WARP_SIZE)
    backward_kernel(const bwd_params p, const __grid_constant__ CUtensorMap dq_map,
                    const bwd_model shape_model) {
    constexpr int THREADS = SMEM_P_WARPS * WARP_SIZE;
    constexpr int ROW_BYTES = D * HALF_BYTES;
    constexpr int WARP_KEYS = KEYS / SMEM_P_KEY_WARPS;         // keys of a warp, every phase but dQ
    constexpr int WARP_QUERIES = QROWS / SMEM_P_COL_WARPS;     // scores: queries of a warp
    constexpr int WARP_COLS = D / SMEM_P_COL_WARPS;            // dV, dK: head-dim columns of a warp
    constexpr int MT = WARP_KEYS / MMA_M;                      // m16 blocks of keys
    constexpr int PASS_QUERIES = WARP_QUERIES / SCORE_PASSES;  // scores: queries a pass
    constexpr int NT_S = PASS_QUERIES / MMA_N, NT_KV = WARP_COLS / MMA_N;
    static_assert(STAGES == 2, "the next query tile arrives during this one's math");
    static_assert(ROW_PAD % QROWS == 0, "lse2 and Dsum are padded to whole query tiles");
    static_assert(WARP_KEYS % MMA_M == 0 && NT_S % X4_BLOCKS == 0 && NT_KV % X4_BLOCKS == 0,
                  "the warps' fragments tile the block's products");
    constexpr uint32_t KV_TILE = KEYS * ROW_BYTES, Q_TILE = QROWS * ROW_BYTES;
    constexpr uint32_t PS_TILE = KEYS * QROWS * sizeof(__half);
    constexpr uint32_t VEC = LOOP_VECTORS * QROWS * sizeof(float);    // LSE_i, then D_i
    constexpr bool BULK = dq_by_bulk_here<ADDS_DQ, DQ_BY_BULK_OK>();  // dQ by bulk reductions
    // ... in this call (MODEL: as the launcher says; else the instantiation's, at compile time)
    const bool adds_dq = ADDS_DQ && (!MODEL || shape_model.dq != DQ_BY_SECOND_PASS);
    const bool bulk = BULK && (!MODEL || shape_model.dq == DQ_BY_BULK);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
    // sm_75 has no cp.async for a second buffer, and a T4's shared memory is too small for this
    // kernel: the launcher never picks it there.
    __trap();
    return;
#endif

    const block_place place =
        place_of_block<MODEL>(shape_model);                   // key tile, (batch, K/V head), share
    const int k0 = place.key_tile * KEYS;                     // the block's first key
    const int b = place.bh / p.H_kv, hk = place.bh % p.H_kv;  // batch, K/V head
    // MODEL: the sequence (packed: b's rows of the batch; unpacked: the batch b) and its rule
    const bwd_sequence s = kernel_sequence<MODEL>(p, b);
    // packed: a key tile at or past the sequence's keys does nothing (the rows past N_k_b are
    // the next sequence's: nothing written)
    if (MODEL && k0 >= s.seq.N_k) return;
    const bwd_model model = sequence_model<MODEL>(shape_model, s);
    const int warp = (int)threadIdx.x / WARP_SIZE;
    const int kw = warp % SMEM_P_KEY_WARPS, cw = warp / SMEM_P_KEY_WARPS;
    // Earlier queries see no key here (causal: query i sees keys <= i + key_shift); from a
    // whole query tile, so that LSE_i and D_i stay within their padded rows. MODEL: nor do the
    // queries past a window's end.
    int q_begin = p.causal ? max(k0 - key_shift_of<MODEL>(p, s), 0) / QROWS * QROWS : 0,
        q_end = queries_of<MODEL>(p, s);
    if constexpr (MODEL) {  // (q_end: the plain kernels' p.N)
        q_begin = key_tile_first_query<QROWS>(model.keys, k0);
        q_end = key_tile_query_end(model.keys, k0, KEYS);
    }
    walk_share<QROWS>(q_begin, q_end, place);  // (a split walk: the block's share of the tiles)
    const int tiles = max((q_end - q_begin + QROWS - 1) / QROWS, 0) * p.group;  // all heads' tiles

    // Shared memory: K_smem, V_smem [KEYS, D]; per stage Q_smem, dO_smem [QROWS, D]; P_smem,
    // dS_smem [KEYS, QROWS]; per stage vec_smem [2, QROWS] floats; BULK: dq_stage [D / 8
    // slabs][QROWS][8] floats. The half tiles swizzled.
    extern __shared__ __align__(128) unsigned char smem[];
    const uint32_t K_smem = smem_u32(smem), V_smem = K_smem + KV_TILE;
    const uint32_t Q_smem = V_smem + KV_TILE, dO_smem = Q_smem + STAGES * Q_TILE;
    const uint32_t P_smem = dO_smem + STAGES * Q_TILE, dS_smem = P_smem + PS_TILE;
    const uint32_t vec_smem = dS_smem + PS_TILE, dq_stage = vec_smem + STAGES * VEC;

    // The prologue: K_j, V_j and the first loop tile (none for a walk of no step: a split walk's
    // empty share may start at the head's padded end, past its rows of LSE_i and D_i).
    const int cols = MODEL ? p.D : D;     // the head dim's columns the tensors hold
    int hq = hk * p.group, q0 = q_begin;  // the loop tile: query head hq (GQA: of hk's group), q0
    if (tiles > 0) {
        issue_key_tile<D, KEYS, THREADS, MODEL>(p, s, K_smem, V_smem, b, hk, k0, cols);
        issue_query_tile<D, QROWS, THREADS, true, MODEL>(p, s, Q_smem, dO_smem, vec_smem, b, hq, q0,
                                                         cols);
    }

    float dK[MT][NT_KV][4] = {}, dV[MT][NT_KV][4] = {};  // keys kw x columns cw, fp32
    constexpr int KF = KV_REGS ? D / MMA_K : 1;          // k16 steps of K_frag, V_frag (unused: 1)
    uint32_t K_frag[KF][MT][4], V_frag[KF][MT][4];
    int hq_prev = hq, q0_prev = q0;  // BULK: the tile staged in the last iteration
    for (int it = 0; it < tiles; ++it) {
        const int buf = STAGES == 2 ? it % STAGES : 0;
        const uint32_t Q_tile = Q_smem + buf * Q_TILE, dO_tile = dO_smem + buf * Q_TILE;
        const uint32_t vec_tile = vec_smem + buf * VEC;
        cp_async_wait<0>();
        __syncthreads();  // tile it (and K_j, V_j) visible to all; every warp is done with tile
                          // it - 1 (its buffer is refilled next) and with P_smem and dS_smem;
                          // BULK: tile it - 1's dQ is staged
        if (bulk && it > 0)
            add_staged_dq_tile(&dq_map, dq_stage, dq_tile_coords<MODEL>(p, s, b, hq_prev, q0_prev));
        if constexpr (KV_REGS) {  // K_j and V_j have arrived with tile 0: into registers
            if (it == 0) {
                load_row_fragments<D, MT>(K_frag, K_smem + WARP_KEYS * kw * ROW_BYTES);
                load_row_fragments<D, MT>(V_frag, V_smem + WARP_KEYS * kw * ROW_BYTES);
            }
        }
        if (it + 1 < tiles) {
            int hq_next = hq, q0_next = q0;
            next_query_tile<QROWS>(hq_next, q0_next, q_begin, q_end);
            issue_query_tile<D, QROWS, THREADS, true, MODEL>(
                p, s, Q_smem + (STAGES - 1 - buf) * Q_TILE, dO_smem + (STAGES - 1 - buf) * Q_TILE,
                vec_smem + (STAGES - 1 - buf) * VEC, b, hq_next, q0_next, cols);
        }

        // Scores: S^T, P^T, dP^T, dS^T of keys kw, queries cw (SCORE_PASSES column blocks, so
        // that fewer registers hold S^T and dP^T beside dK and dV; unrolled, so that one
        // block's products run while the warp computes another's P^T and dS^T).
#pragma unroll
        for (int pass = 0; pass < SCORE_PASSES; ++pass) {
            score_gradients<BF16, D, QROWS, MT, NT_S, KV_REGS, KF, MODEL>(
                p, model, K_smem + WARP_KEYS * kw * ROW_BYTES, V_smem + WARP_KEYS * kw * ROW_BYTES,
                K_frag, V_frag, Q_tile, dO_tile, vec_tile, P_smem, dS_smem, k0, WARP_KEYS * kw,
                q0 + key_shift_of<MODEL>(p, s), WARP_QUERIES * cw + pass * PASS_QUERIES,
                MODEL ? tile_needs_mask(model.keys, k0, KEYS, q0 + key_shift_of<MODEL>(p, s), QROWS)
                      : k0 + KEYS > p.N_k || (p.causal && q0 + p.key_shift < k0 + KEYS - 1));
        }
        if (bulk) bulk_wait<true>();  // the staged tile thread 0 handed over is read
        __syncthreads();  // P_smem and dS_smem written by every warp, visible to all; BULK:
                          // dq_stage free

        // dV_j += P^T dO_i, dK_j += dS^T Q_i: keys kw, head-dim columns cw.
        // LAB HOLE 2 BEGIN [smem>=132096]: dK_j, dV_j accumulated from shared memory's P^T, dS^T
        // LAB TODO: add this query tile's share to the warp's blocks of dV_j and dK_j, fp32
        // LAB TODO: accumulators that live across every query tile: keys kw (WARP_KEYS rows from
        // LAB TODO: WARP_KEYS * kw) x head-dim columns cw (WARP_COLS from WARP_COLS * cw).
        // LAB TODO: dV += P^T dO_i and dK += dS^T Q_i, each summed over the tile's QROWS queries
        // LAB TODO: (the products' K). P^T and dS^T lie in P_smem and dS_smem, [KEYS][QROWS]
        // LAB TODO: halves; dO_i and Q_i in dO_tile and Q_tile, [QROWS][D]; all swizzled in 16-byte
        // LAB TODO: chunks. gemm.cuh has a warp's product of two such row-major tiles (A's rows by
        // LAB TODO: B's columns). dK's factor `scale` is applied once, when dK_j is stored.
        const int col_chunk = WARP_COLS * cw / CHUNK_HALVES;
        gemm_nn<BF16, MT, NT_KV, QROWS / MMA_K, false, QROWS, D>(
            dV, P_smem + WARP_KEYS * kw * QROWS * HALF_BYTES, 0, dO_tile, col_chunk);
        gemm_nn<BF16, MT, NT_KV, QROWS / MMA_K, false, QROWS, D>(
            dK, dS_smem + WARP_KEYS * kw * QROWS * HALF_BYTES, 0, Q_tile, col_chunk);
        // LAB HOLE 2 END
        // dQ_i += dS K_j: fp32 atomics, or staged for bulk reductions (LOG.md, step 4's try)
        if (adds_dq) {
            // its head of dQ_acc (MODEL: the sequence's rows, bwd_sequence_of)
            const size_t acc = MODEL ? (size_t)(s.row_acc + hq * s.head_acc) * cols
                                     : (size_t)(b * p.H + hq) * p.N * cols;
            if (bulk) {
                accumulate_dq_tile<BF16, D, KEYS, QROWS, BULK, MODEL, MODEL>(p, s, dS_smem, K_smem,
                                                                             dq_stage, acc, q0);
            } else {  // the atomics (also a MODEL kernel called without bulk reductions)
                accumulate_dq_tile<BF16, D, KEYS, QROWS, false, MODEL, MODEL>(p, s, dS_smem, K_smem,
                                                                              dq_stage, acc, q0);
            }
        }
        hq_prev = hq, q0_prev = q0;
        next_query_tile<QROWS>(hq, q0, q_begin, q_end);
    }
    if (bulk && tiles > 0) {  // the last tile's dQ
        __syncthreads();      // every warp's part of it is staged
        add_staged_dq_tile(&dq_map, dq_stage, dq_tile_coords<MODEL>(p, s, b, hq_prev, q0_prev));
        bulk_wait<false>();
    }
    // A key tile no row sees (a window, a split walk's empty share) ran no loop, issued no copy,
    // and stores dK_j = dV_j = 0.
    if (place.shares > 1) {  // a split walk's share: fp32 sums for the sum pass
        const int key_row = k0 + WARP_KEYS * kw;
#pragma unroll
        for (int m = 0; m < MT; ++m) {
            float *const at =
                dkv_share_at<D, KEYS>(model, place, key_row + MMA_M * m) + WARP_COLS * cw;
            write_share_rows(at, dK[m], dkv_row_step<D>(place));
            write_share_rows(at + D, dV[m], dkv_row_step<D>(place));
        }
        return;
    }
    store_dkv_fragments<BF16, MT, NT_KV, MODEL, MODEL>(p, s, dK, dV, b, hk, k0 + WARP_KEYS * kw,
                                                       WARP_COLS * cw, cols);
}
