/*
 * stage7_backward/gemm.cuh: the warps' matrix products on mma.sync: C = A B^T of two row-major
 * tiles (gemm_rows_by_rows, gemm_nt), C += A B with A in registers or in shared memory
 * (gemm_frags_by_tile, gemm_nn), and the fragments' way out: packed to A fragments, to shared
 * memory (store_fragments), to global memory (store_rows). BF16: the 16-bit operands are bf16
 * (mma.sync .bf16, bf16 packing), else fp16.
 */
#pragma once

#include "device/sm80.cuh"
#include "device/sm90.cuh"  // stmatrix (store_fragments, sm_90 on)
#include "smem.cuh"

// C = A B^T for one warp: A is the warp's 16 rows of a [*, D] tile at A_rows, B the COLS rows of
// another [*, D] tile at B_tile, both in shared memory: C[n] = C fragment of columns 8n..8n+7.
// S^T = K Q^T, dP^T = V dO^T (main kernel); S = Q K^T, dP = dO V^T (dq_kernel).
template <bool BF16, int D, int NB>
__device__ __forceinline__ void gemm_rows_by_rows(float (&C)[NB][4], uint32_t A_rows,
                                                  uint32_t B_tile) {
    constexpr int ROW_BYTES = D * HALF_BYTES;
    const uint32_t a_off = a_lane_offset<D>(), b_off = b_lane_offset<D>();
#pragma unroll
    for (int n = 0; n < NB; ++n) {
#pragma unroll
        for (int e = 0; e < FRAG_REGS; ++e) C[n][e] = 0.f;
    }
#pragma unroll
    for (int k = 0; k < D / MMA_K; ++k) {
        uint32_t a[4];
        ldmatrix_x4(a, A_rows + lane_xor<D>(a_off, k * X4_BYTES));
#pragma unroll
        for (int n = 0; n < NB; n += X4_BLOCKS) {
            uint32_t b[4];  // b0, b1 of columns 8n..; b0, b1 of columns 8n + 8..
            ldmatrix_x4(b, B_tile + lane_xor<D>(b_off, k * X4_BYTES) + n * MMA_N * ROW_BYTES);
            mma_16816_of<BF16>(C[n], a, b[0], b[1]);
            mma_16816_of<BF16>(C[n + 1], a, b[2], b[3]);
        }
    }
}

// C += A B for one warp: A (16 x 16 KC) in registers as A fragments, B the [16 KC, D] tile at
// B_tile, row-major (read .trans): dV += P^T dO, dK += dS^T Q (main kernel), dQ += dS K
// (dq_kernel). C[n] = C fragment of head-dim columns 8n..8n+7.
template <bool BF16, int D, int KC>
__device__ __forceinline__ void gemm_frags_by_tile(float (&C)[D / MMA_N][4],
                                                   const uint32_t (&A)[KC][4], uint32_t B_tile) {
    constexpr int ROW_BYTES = D * HALF_BYTES;
    const uint32_t off = a_lane_offset<D>();
#pragma unroll
    for (int k = 0; k < KC; ++k) {
#pragma unroll
        for (int n = 0; n < D / MMA_N; n += X4_BLOCKS) {
            uint32_t b[4];
            ldmatrix_x4_trans(
                b, B_tile + lane_xor<D>(off, n / X4_BLOCKS * X4_BYTES) + k * MMA_K * ROW_BYTES);
            mma_16816_of<BF16>(C[n], A[k], b[0], b[1]);
            mma_16816_of<BF16>(C[n + 1], A[k], b[2], b[3]);
        }
    }
}

// C fragments of column blocks 2k, 2k+1 are, register for register, the A fragment of k16 step k
// (stage 5's P): pack them to halves.
template <bool BF16, int NB>
__device__ __forceinline__ void to_a_fragments(uint32_t (&A)[NB / N8_PER_K16][4],
                                               const float (&C)[NB][4]) {
#pragma unroll
    for (int k = 0; k < NB / N8_PER_K16; ++k) {
        A[k][0] = pack2_of<BF16>(C[N8_PER_K16 * k][0], C[N8_PER_K16 * k][1]);
        A[k][1] = pack2_of<BF16>(C[N8_PER_K16 * k][2], C[N8_PER_K16 * k][3]);
        A[k][2] = pack2_of<BF16>(C[N8_PER_K16 * k + 1][0], C[N8_PER_K16 * k + 1][1]);
        A[k][3] = pack2_of<BF16>(C[N8_PER_K16 * k + 1][2], C[N8_PER_K16 * k + 1][3]);
    }
}

// Element e of a C fragment of column block n sits at row g + 8 (e / 2), column 8n + 2t +
// frag_c(e).
__device__ __forceinline__ int frag_row(int e) {
    return lane_index() / QUAD + FRAG_ROW_STEP * frag_h(e);
}
__device__ __forceinline__ int frag_col(int n, int e) {
    return FRAG_COLS * n + FRAG_LANE_COLS * (lane_index() % QUAD) + frag_c(e);
}

// A warp's C fragments of 16 rows (the first is `row`) x D columns, times `mul`, stored as fp16
// (BF16: bf16) for rows < N and columns < cols (a multiple of 8: whole n8 blocks), rows ld
// elements apart.
template <bool BF16, int D>
__device__ __forceinline__ void store_rows(__half *out, const float (&C)[D / MMA_N][4], int row,
                                           int N, float mul, unsigned ld, int cols = D) {
    const int g = lane_index() / QUAD, t = lane_index() % QUAD;
#pragma unroll
    for (int h = 0; h < FRAG_LANE_ROWS; ++h) {
        const int r = row + g + FRAG_ROW_STEP * h;
        if (r >= N) continue;
#pragma unroll
        for (int n = 0; n < D / MMA_N; ++n) {
            if (MMA_N * n >= cols) continue;
            *reinterpret_cast<uint32_t *>(out + rows_offset(r, ld) + MMA_N * n + 2 * t) =
                pack2_of<BF16>(C[n][frag_reg(h, 0)] * mul, C[n][frag_reg(h, 1)] * mul);
        }
    }
}

// A split walk's share (common/device/backward_prepost.cuh: dkv_part): a warp's fp32 C fragments
// of 16 rows x NT n8 blocks, unscaled, to `out` (the first row's first column), rows row_step
// floats apart: one 8-byte store a pair. Every row and column is written (the shares' rows hold
// whole key tiles and the kernel's D columns; the sum pass reads the tensors' only).
template <int NT>
__device__ __forceinline__ void write_share_rows(float *out, const float (&C)[NT][4],
                                                 size_t row_step) {
    const int g = lane_index() / QUAD, t = lane_index() % QUAD;
#pragma unroll
    for (int h = 0; h < FRAG_LANE_ROWS; ++h) {
        float *const row = out + (g + FRAG_ROW_STEP * h) * row_step + FRAG_LANE_COLS * t;
#pragma unroll
        for (int n = 0; n < NT; ++n)
            *reinterpret_cast<float2 *>(row + MMA_N * n) =
                make_float2(C[n][frag_reg(h, 0)], C[n][frag_reg(h, 1)]);
    }
}

// Where a split block's share of dK_j and dV_j rows from `key` on lie in m.dkv_part
// (common/device/backward_prepost.cuh's dkv_part_at; the block's place, place_of_block; key tiles
// of KEYS keys; a tail split's rows from its first work tile's first key on): dK's row; dV's is D
// floats further, the next key's dkv_row_step<D>() floats.
template <int D, int KEYS>
__device__ __forceinline__ float *dkv_share_at(const bwd_model &m, const block_place &place,
                                               int key) {
    const size_t head_keys = (size_t)m.key_tiles * KEYS;
    const size_t first_key = m.tail_first == INT_MAX ? 0 : (size_t)m.tail_first * KEYS;
    return m.dkv_part +
           dkv_part_at(place.bh, head_keys, key, place.shares, place.share, D, first_key);
}
template <int D>
__device__ __forceinline__ size_t dkv_row_step(const block_place &place) {
    return (size_t)place.shares * 2 * D;
}

// One k16 step of C (+)= A B^T for one warp, MT x NT fragments, A's fragments a given (MT m16
// blocks, in registers), B = NT n8 row blocks of a [*, D] tile from B_rows, NT / 2 ldmatrix.x4.
// FIRST: C = the product (the first step: nothing to clear).
template <bool BF16, int D, int MT, int NT, bool FIRST>
__device__ __forceinline__ void mma_rows_step(float (&C)[MT][NT][4], const uint32_t (&a)[MT][4],
                                              uint32_t B_rows, uint32_t b_off, int k) {
    constexpr int ROW_BYTES = D * HALF_BYTES;
#pragma unroll
    for (int n = 0; n < NT; n += X4_BLOCKS) {
        uint32_t b[4];  // b0, b1 of rows 8n..; b0, b1 of rows 8n + 8..
        ldmatrix_x4(b, B_rows + lane_xor<D>(b_off, k * X4_BYTES) + n * MMA_N * ROW_BYTES);
#pragma unroll
        for (int m = 0; m < MT; ++m) {
            if (FIRST) {
                mma_16816_zero_of<BF16>(C[m][n], a[m], b[0], b[1]);
                mma_16816_zero_of<BF16>(C[m][n + 1], a[m], b[2], b[3]);
            } else {
                mma_16816_of<BF16>(C[m][n], a[m], b[0], b[1]);
                mma_16816_of<BF16>(C[m][n + 1], a[m], b[2], b[3]);
            }
        }
    }
}

// C = A B^T for one warp, MT x NT fragments: A = MT m16 row blocks of a [*, D] tile from A_rows,
// B = NT n8 row blocks of another [*, D] tile from B_rows: S^T = K_j Q_i^T, dP^T = V_j dO_i^T.
// Each k16 step reads MT + NT / 2 ldmatrix.x4 for MT NT mma.
template <bool BF16, int D, int MT, int NT, bool FIRST>
__device__ __forceinline__ void gemm_nt_step(float (&C)[MT][NT][4], uint32_t A_rows,
                                             uint32_t B_rows, uint32_t a_off, uint32_t b_off,
                                             int k) {
    constexpr int ROW_BYTES = D * HALF_BYTES;
    uint32_t a[MT][4];
#pragma unroll
    for (int m = 0; m < MT; ++m) {
        ldmatrix_x4(a[m], A_rows + lane_xor<D>(a_off, k * X4_BYTES) + m * MMA_M * ROW_BYTES);
    }
    mma_rows_step<BF16, D, MT, NT, FIRST>(C, a, B_rows, b_off, k);
}

template <bool BF16, int D, int MT, int NT>
__device__ __forceinline__ void gemm_nt(float (&C)[MT][NT][4], uint32_t A_rows, uint32_t B_rows) {
    const uint32_t a_off = a_lane_offset<D>(), b_off = b_lane_offset<D>();
    gemm_nt_step<BF16, D, MT, NT, true>(C, A_rows, B_rows, a_off, b_off, 0);
#pragma unroll 4
    for (int k = 1; k < D / MMA_K; ++k) {
        gemm_nt_step<BF16, D, MT, NT, false>(C, A_rows, B_rows, a_off, b_off, k);
    }
}

// The warp's A fragments of a [*, D] tile, MT m16 blocks of rows from A_rows, every k16 step: for
// a product whose A stays the same for every query tile (K_j in S^T, V_j in dP^T), loaded once.
template <int D, int MT>
__device__ __forceinline__ void load_row_fragments(uint32_t (&A)[D / MMA_K][MT][4],
                                                   uint32_t A_rows) {
    constexpr int ROW_BYTES = D * HALF_BYTES;
    const uint32_t a_off = a_lane_offset<D>();
#pragma unroll
    for (int k = 0; k < D / MMA_K; ++k) {
#pragma unroll
        for (int m = 0; m < MT; ++m)
            ldmatrix_x4(A[k][m], A_rows + lane_xor<D>(a_off, k * X4_BYTES) + m * MMA_M * ROW_BYTES);
    }
}

// gemm_nt with A's fragments in registers (load_row_fragments): each k16 step reads NT / 2
// ldmatrix.x4 of B only.
template <bool BF16, int D, int MT, int NT>
__device__ __forceinline__ void gemm_nt_regs(float (&C)[MT][NT][4],
                                             const uint32_t (&A)[D / MMA_K][MT][4],
                                             uint32_t B_rows) {
    const uint32_t b_off = b_lane_offset<D>();
    mma_rows_step<BF16, D, MT, NT, true>(C, A[0], B_rows, b_off, 0);
#pragma unroll
    for (int k = 1; k < D / MMA_K; ++k)
        mma_rows_step<BF16, D, MT, NT, false>(C, A[k], B_rows, b_off, k);
}

// C += A B for one warp over KSTEPS k16 steps, MT x NT fragments. B: a [16 KSTEPS, B_COLS] tile
// stored row-major (read .trans), the warp's columns from chunk b_chunk. A: A_T = false, a
// [*, A_COLS] tile row-major, the warp's rows from A_rows (dV += P^T dO_i, dK += dS^T Q_i);
// A_T = true, stored transposed, [16 KSTEPS, A_COLS] with the warp's rows as columns from chunk
// a_chunk (dQ_i += dS K_j, dS read from dS^T).
template <bool BF16, int MT, int NT, bool A_T, int A_COLS, int B_COLS, bool FIRST>
__device__ __forceinline__ void gemm_nn_step(float (&C)[MT][NT][4], uint32_t A, int a_chunk,
                                             uint32_t B, int b_chunk, uint32_t a_off,
                                             uint32_t b_off, int k) {
    constexpr int A_ROW_BYTES = A_COLS * HALF_BYTES, B_ROW_BYTES = B_COLS * HALF_BYTES;
    uint32_t a[MT][4];
#pragma unroll
    for (int m = 0; m < MT; ++m) {
        if (A_T) {
            ldmatrix_x4_trans(a[m],
                              A + lane_xor<A_COLS>(a_off, (a_chunk + m * X4_BLOCKS) * CHUNK_BYTES) +
                                  k * MMA_K * A_ROW_BYTES);
        } else {
            ldmatrix_x4(a[m], A + lane_xor<A_COLS>(a_off, k * X4_BYTES) + m * MMA_M * A_ROW_BYTES);
        }
    }
#pragma unroll
    for (int n = 0; n < NT; n += X4_BLOCKS) {
        uint32_t b[4];
        ldmatrix_x4_trans(
            b, B + lane_xor<B_COLS>(b_off, (b_chunk + n) * CHUNK_BYTES) + k * MMA_K * B_ROW_BYTES);
#pragma unroll
        for (int m = 0; m < MT; ++m) {
            if (FIRST) {
                mma_16816_zero_of<BF16>(C[m][n], a[m], b[0], b[1]);
                mma_16816_zero_of<BF16>(C[m][n + 1], a[m], b[2], b[3]);
            } else {
                mma_16816_of<BF16>(C[m][n], a[m], b[0], b[1]);
                mma_16816_of<BF16>(C[m][n + 1], a[m], b[2], b[3]);
            }
        }
    }
}

// ZERO: C = A B (C's old contents ignored), else C += A B.
template <bool BF16, int MT, int NT, int KSTEPS, bool A_T, int A_COLS, int B_COLS,
          bool ZERO = false>
__device__ __forceinline__ void gemm_nn(float (&C)[MT][NT][4], uint32_t A, int a_chunk, uint32_t B,
                                        int b_chunk) {
    const uint32_t a_off = A_T ? b_lane_offset<A_COLS>() : a_lane_offset<A_COLS>();
    const uint32_t b_off = a_lane_offset<B_COLS>();
    gemm_nn_step<BF16, MT, NT, A_T, A_COLS, B_COLS, ZERO>(C, A, a_chunk, B, b_chunk, a_off, b_off,
                                                          0);
#pragma unroll
    for (int k = 1; k < KSTEPS; ++k) {
        gemm_nn_step<BF16, MT, NT, A_T, A_COLS, B_COLS, false>(C, A, a_chunk, B, b_chunk, a_off,
                                                               b_off, k);
    }
}

// The warp's fragments of a [*, COLS] fp32 tile as fp16 (BF16: bf16) into a swizzled shared tile:
// fragment (m, n) covers rows row0 + 16m.., columns col0 + 8n.. (P^T and dS^T; row0 a multiple
// of 8, col0 of 16). From sm_90 on, one stmatrix_x4 per 16 x 16 block (fragments n and n + 1 of
// m16 block m: the A-fragment order, so that a lane addresses the row and chunk ldmatrix_x4 would
// read): a quarter of the store instructions. Before sm_90, one 4-byte store per fragment row.
template <bool BF16, int COLS, int MT, int NT>
__device__ __forceinline__ void store_fragments(uint32_t tile, const float (&C)[MT][NT][4],
                                                int row0, int col0) {
#if __CUDA_ARCH__ >= 900
    const uint32_t lane_off = a_lane_offset<COLS>();
#pragma unroll
    for (int m = 0; m < MT; ++m) {
#pragma unroll
        for (int n = 0; n < NT; n += X4_BLOCKS) {
            const uint32_t chunk = col0 / CHUNK_HALVES + n;  // even: the XOR moves whole pairs
            stmatrix_x4(tile + (row0 + MMA_M * m) * (COLS * HALF_BYTES) +
                            lane_xor<COLS>(lane_off, chunk * CHUNK_BYTES),
                        pack2_of<BF16>(C[m][n][0], C[m][n][1]),
                        pack2_of<BF16>(C[m][n][2], C[m][n][3]),
                        pack2_of<BF16>(C[m][n + 1][0], C[m][n + 1][1]),
                        pack2_of<BF16>(C[m][n + 1][2], C[m][n + 1][3]));
        }
    }
#else
    const int g = lane_index() / QUAD, t = lane_index() % QUAD;
#pragma unroll
    for (int m = 0; m < MT; ++m) {
#pragma unroll
        for (int n = 0; n < NT; ++n) {
#pragma unroll
            for (int h = 0; h < FRAG_LANE_ROWS; ++h) {  // rows g and g + 8
                const int r = row0 + MMA_M * m + g + FRAG_ROW_STEP * h;
                st_shared_b32(
                    tile + smem_offset<COLS>(r, col0 / CHUNK_HALVES + n) + t * sizeof(uint32_t),
                    pack2_of<BF16>(C[m][n][frag_reg(h, 0)], C[m][n][frag_reg(h, 1)]));
            }
        }
    }
#endif
}
