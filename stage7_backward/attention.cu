/*
 * stage7_backward: FlashAttention-2's backward pass (dQ, dK, dV), on the tensor cores of stage 5.
 *
 * What this stage adds: the other half of FlashAttention. The forward pass is stage 5's (this file
 * holds the backward only; the build links stage5_tuned/attention.cu a second time, renamed, and
 * the descriptor below hands its forward over). Given Q, K, V, the forward's O and LSE, and dO:
 *
 *   D_i   = rowsum(dO_i * O_i)                          preprocess_kernel, one row per quad
 *   for each key tile K_j, V_j (one block of 8 warps, 128 keys):       backward_smem_kernel
 *     dK_j = dV_j = 0                                    registers, fp32, for the whole loop
 *     (D = 64: K_j's, V_j's fragments too)               loaded once, read by every S^T, dP^T
 *     for each query tile Q_i, dO_i, LSE_i, D_i (the next one arriving by cp.async):
 *       scores:  S^T  = K_j Q_i^T                        recompute: no N x N buffer anywhere
 *                P^T  = exp(scale S^T - LSE_i)           the forward's probabilities, exactly
 *                dP^T = V_j dO_i^T
 *                dS^T = P^T * (dP^T - D_i)               softmax's Jacobian, row by row
 *                P^T, dS^T -> shared memory (fp16)
 *       dV, dK:  dV_j += P^T dO_i,  dK_j += dS^T Q_i
 *       dQ:      dQ_i += dS K_j                          fp32 atomics into a workspace (default;
 *                                                        sm_90 on: the TMA unit's bulk reductions)
 *     dK_j *= scale; store dK_j, dV_j
 *   dQ = scale * dQ_acc                                  dq_convert_kernel
 *
 * P^T and dS^T go through shared memory so that each phase splits its product over the 8 warps
 * in the shape that reads least shared memory (FlashAttention-2's layout). Where its 161 KB do not
 * fit (an L4, a T4), backward_kernel runs instead: 16 keys a warp for every product, P^T and dS^T
 * kept in registers as the A operands of dV and dK (variant registers runs it anywhere).
 *
 * Variant deterministic: the key-tile loop leaves dQ alone, and dq_kernel computes it in a second
 * pass, query tile outer, key tiles inner, accumulating dQ_i in registers (S and dP recomputed once
 * more): no atomics, so the same inputs give the same bits on every run.
 *
 * Why K/V outside: dK_j and dV_j then stay in registers for a whole block, and only dQ, which
 * every key tile adds to, needs accumulating across blocks. README.md derives the gradients.
 * mma.sync + ldmatrix + cp.async as stage 5: every GPU from sm_75 on (sm_75 loads synchronously).
 *
 * Run:  make build && build/stage7_backward --seq 4096 --heads 16 --dim 128 --causal --bench
 * Variants (--variant): default (dQ by atomics; sm_90 on: bulk reductions), deterministic (dQ by a
 * second pass), registers (backward_kernel's layout), atomics (dQ by atomics on sm_90 too).
 *
 * NOTE: what is left is Hopper's instruction set again: wgmma with dS and P staged through shared
 * memory, TMA and warp specialisation, as FlashAttention-3's backward does (README.md, "What is
 * left").
 */

#include <cuda.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "attention.h"
#include "device/sm80.cuh"        // mma.sync, ldmatrix, cp.async, the fragment vocabulary
#include "device/sm90.cuh"        // sm_90 on: stmatrix, the TMA unit's bulk reductions
#include "device/tensor_map.cuh"  // tensor_map_encoder (DQ_BULK's tensor map)

/* ---- tunables -------------------------------------------------------------------------------- */

// A tile configuration. WARPS warps of 16 rows each: a block owns 16 WARPS keys (backward_kernel)
// or queries (dq_kernel), and dq_kernel's key tiles have as many rows. QROWS: the query tile of
// backward_kernel's loop (its S^T and dP^T are 16 x QROWS per warp, beside dK and dV: at D = 128
// those hold 128 registers, and 64-query tiles spill). STAGES = 2 double-buffers the loop's tiles
// (the next arrives during this one's math); 1 loads each tile when it is needed.
typedef struct {
    int WARPS, STAGES, QROWS;
} tile_config;

// In the order tried: the first whose shared memory fits the block's limit is used (and two
// stages only where cp.async is). backward_kernel at D = 128: 128 keys a block where they fit (an
// H100's or A100's shared memory; every key tile adds its part to all of dQ, so twice the keys is
// half the atomic traffic, and each Q_i, dO_i tile loaded serves twice the keys), then 64 keys,
// then one buffer (a T4's 64 KB): 104.5 KB, 68.5 KB, 52 KB. At D = 64, 64 keys (128 measured no
// faster there): 57 KB, then 40.5 KB.
constexpr tile_config MAIN_TILES_D128[] = {{8, 2, 32}, {4, 2, 32}, {4, 1, 32}};
constexpr tile_config MAIN_TILES_D64[] = {{4, 2, 64}, {4, 1, 64}};
// dq_kernel (deterministic variant): 64 query rows a block, key tiles double-buffered or not.
constexpr tile_config DQ_TILES_D128[] = {{4, 2, 0}, {4, 1, 0}};
constexpr tile_config DQ_TILES_D64[] = {{4, 2, 0}, {4, 1, 0}};

template <int D, bool MAIN>
__host__ __device__ constexpr const tile_config *tiles_for() {
    return MAIN ? (D == 64 ? MAIN_TILES_D64 : MAIN_TILES_D128)
                : (D == 64 ? DQ_TILES_D64 : DQ_TILES_D128);
}
template <int D, bool MAIN>
__host__ __device__ constexpr int tile_count() {
    constexpr size_t bytes = MAIN ? (D == 64 ? sizeof(MAIN_TILES_D64) : sizeof(MAIN_TILES_D128))
                                  : (D == 64 ? sizeof(DQ_TILES_D64) : sizeof(DQ_TILES_D128));
    return (int)(bytes / sizeof(tile_config));
}

/* ---- device helpers (stage 5's, the same instructions) --------------------------------------- */

// Chunk c of row r of a [rows, COLS] half tile is stored at chunk c ^ (r % 8): conflict-free
// ldmatrix and 16-byte stores (stage 5's swizzle). A row of fewer than 8 chunks (the 32-column dS
// tile of the SMALL configuration) XORs with r % (its chunks): a 2-way conflict there.
template <int COLS>
__host__ __device__ constexpr int swizzle_rows() {
    return COLS / CHUNK_HALVES < MATRIX_ROWS ? COLS / CHUNK_HALVES : MATRIX_ROWS;
}

template <int COLS>
__device__ __forceinline__ uint32_t smem_offset(int row, int chunk) {
    return (uint32_t)(row * (COLS * 2) + (chunk ^ (row % swizzle_rows<COLS>())) * CHUNK_BYTES);
}

// 16 bytes global -> shared. sm_80+: cp.async (zero-filled when !valid; completed by
// cp_async_wait). sm_75 has no cp.async: the chunk goes through a register at once.
__device__ __forceinline__ void copy_chunk(uint32_t dst, const void *src, bool valid) {
#if __CUDA_ARCH__ >= 800
    cp_async_16(dst, src, valid);
#else
    st_shared_v4(dst, valid ? *reinterpret_cast<const uint4 *>(src) : make_uint4(0, 0, 0, 0));
#endif
}

// ldmatrix lane offsets into a swizzled [*, COLS] tile (stage 5's a_lane_offset and
// k_lane_offset). A-order (an A operand, or a B operand read .trans): lane l addresses row l % 16,
// chunk l / 16 of the 16 x 16 block. B-order (a B operand read untransposed, two n8 blocks; also an
// A operand read .trans from a tile stored transposed): lane l addresses row l % 8 + 8 (l / 16),
// chunk (l / 8) % 2. XOR with k * X4_BYTES then moves to the k-th 16-column block (the swizzle
// commutes with it), adding r * 8 * ROW_BYTES moves 8 r rows down.
template <int COLS>
__device__ __forceinline__ uint32_t a_lane_offset() {
    const int lane = lane_index();
    return smem_offset<COLS>(lane % X4_DIM, lane / X4_DIM);
}

template <int COLS>
__device__ __forceinline__ uint32_t b_lane_offset() {
    const int lane = lane_index();
    return smem_offset<COLS>(lane % MATRIX_ROWS + lane / X4_DIM * MATRIX_ROWS,
                             lane / MATRIX_ROWS % 2);
}

// Start copying rows [0, ROWS) of a [rows, D] tile (row stride D) into a swizzled shared tile;
// rows >= rows_left become zeros. Consecutive threads move consecutive 16-byte chunks. One
// commit group per call.
template <int ROWS, int D, int THREADS>
__device__ __forceinline__ void tile_issue(uint32_t tile, const __half *src, int rows_left) {
    constexpr int CHUNKS_PER_ROW = D / CHUNK_HALVES;
    static_assert(ROWS * CHUNKS_PER_ROW % THREADS == 0, "tile split over the threads");
#pragma unroll
    for (int i = 0; i < ROWS * CHUNKS_PER_ROW / THREADS; ++i) {
        const int c = (int)threadIdx.x + i * THREADS;
        const int row = c / CHUNKS_PER_ROW, chunk = c % CHUNKS_PER_ROW;
        const bool valid = row < rows_left;
        copy_chunk(tile + smem_offset<D>(row, chunk),
                   src + (valid ? (size_t)row * D + chunk * CHUNK_HALVES : 0), valid);
    }
}

// Start copying ROWS floats (a padded row vector: always in bounds) into shared memory.
template <int ROWS, int THREADS>
__device__ __forceinline__ void vector_issue(uint32_t dst, const float *src) {
    constexpr int CHUNKS = ROWS * (int)sizeof(float) / CHUNK_BYTES;
    for (int c = (int)threadIdx.x; c < CHUNKS; c += THREADS) {
        copy_chunk(dst + c * CHUNK_BYTES, src + c * (CHUNK_BYTES / sizeof(float)), true);
    }
}

/* ---- the warp's matrix products -------------------------------------------------------------- */

// C = A B^T for one warp: A is the warp's 16 rows of a [*, D] tile at A_rows, B the COLS rows of
// another [*, D] tile at B_tile, both in shared memory: C[n] = C fragment of columns 8n..8n+7.
// S^T = K Q^T, dP^T = V dO^T (main kernel); S = Q K^T, dP = dO V^T (dq_kernel).
template <int D, int NB>
__device__ __forceinline__ void gemm_rows_by_rows(float (&C)[NB][4], uint32_t A_rows,
                                                  uint32_t B_tile) {
    constexpr int ROW_BYTES = D * 2;
    const uint32_t a_off = a_lane_offset<D>(), b_off = b_lane_offset<D>();
#pragma unroll
    for (int n = 0; n < NB; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) C[n][e] = 0.f;
    }
#pragma unroll
    for (int k = 0; k < D / MMA_K; ++k) {
        uint32_t a[4];
        ldmatrix_x4(a, A_rows + (a_off ^ (k * X4_BYTES)));
#pragma unroll
        for (int n = 0; n < NB; n += X4_BLOCKS) {
            uint32_t b[4];  // b0, b1 of columns 8n..; b0, b1 of columns 8n + 8..
            ldmatrix_x4(b, B_tile + (b_off ^ (k * X4_BYTES)) + n * MMA_N * ROW_BYTES);
            mma_16816(C[n], a, b[0], b[1]);
            mma_16816(C[n + 1], a, b[2], b[3]);
        }
    }
}

// C += A B for one warp: A (16 x 16 KC) in registers as A fragments, B the [16 KC, D] tile at
// B_tile, row-major (read .trans): dV += P^T dO, dK += dS^T Q (main kernel), dQ += dS K
// (dq_kernel). C[n] = C fragment of head-dim columns 8n..8n+7.
template <int D, int KC>
__device__ __forceinline__ void gemm_frags_by_tile(float (&C)[D / MMA_N][4],
                                                   const uint32_t (&A)[KC][4], uint32_t B_tile) {
    constexpr int ROW_BYTES = D * 2;
    const uint32_t off = a_lane_offset<D>();
#pragma unroll
    for (int k = 0; k < KC; ++k) {
#pragma unroll
        for (int n = 0; n < D / MMA_N; n += X4_BLOCKS) {
            uint32_t b[4];
            ldmatrix_x4_trans(b,
                              B_tile + (off ^ (n / X4_BLOCKS * X4_BYTES)) + k * MMA_K * ROW_BYTES);
            mma_16816(C[n], A[k], b[0], b[1]);
            mma_16816(C[n + 1], A[k], b[2], b[3]);
        }
    }
}

// C fragments of column blocks 2k, 2k+1 are, register for register, the A fragment of k16 step k
// (stage 5's P): pack them to halves.
template <int NB>
__device__ __forceinline__ void to_a_fragments(uint32_t (&A)[NB / 2][4], const float (&C)[NB][4]) {
#pragma unroll
    for (int k = 0; k < NB / 2; ++k) {
        A[k][0] = pack_half2(C[2 * k][0], C[2 * k][1]);
        A[k][1] = pack_half2(C[2 * k][2], C[2 * k][3]);
        A[k][2] = pack_half2(C[2 * k + 1][0], C[2 * k + 1][1]);
        A[k][3] = pack_half2(C[2 * k + 1][2], C[2 * k + 1][3]);
    }
}

// Element e of a C fragment of column block n sits at row g + 8 (e / 2), column 8n + 2t + e % 2.
__device__ __forceinline__ int frag_row(int e) {
    return lane_index() / QUAD + MMA_M / 2 * (e / 2);
}
__device__ __forceinline__ int frag_col(int n, int e) {
    return MMA_N * n + 2 * (lane_index() % QUAD) + e % 2;
}

/* ---- kernels --------------------------------------------------------------------------------- */

typedef struct bwd_params {
    const __half *Q, *K, *V, *O, *dO;  // [B, H, N, D]
    const float *lse;                  // [B, H, N] natural log (the forward's)
    __half *dQ, *dK, *dV;              // [B, H, N, D]
    float *dQ_acc;                     // [B, H, N, D] fp32, zeroed by preprocess_kernel (atomics)
    float *lse2;                       // [B * H, N_pad]: LSE * log2(e), +inf past N
    float *Dsum;                       // [B * H, N_pad]: D_i = rowsum(dO_i * O_i), 0 past N
    int N, N_pad, causal;
    float scale, scale_log2;  // scale, scale * log2(e)
} bwd_params;

// D_i = rowsum(dO_i * O_i) in fp32, and LSE_i in log2 units, for the padded rows of every head:
// rows past N get D = 0 and LSE = +inf, so that their P = 2^(s - inf) = 0 without a mask.
// With dQ by atomics or bulk reductions, the row of dQ_acc they add into is zeroed here too (as
// FlashAttention-2's preprocess does: no separate pass over dQ_acc). PREPROCESS_LANES lanes per
// row, D / 8 halves each; the grid covers B * H * N_pad rows exactly (N_pad is a multiple of
// ROW_PAD).
constexpr int PREPROCESS_THREADS = 128;
constexpr int PREPROCESS_LANES = 8;
constexpr int ROW_PAD = 128;  // N_pad: N rounded up to this, a multiple of every tile's rows

template <int D>
__global__ void __launch_bounds__(PREPROCESS_THREADS) preprocess_kernel(const bwd_params p) {
    constexpr int PER_LANE = D / PREPROCESS_LANES;  // halves
    const size_t row =                              // in [B * H, N_pad]
        ((size_t)blockIdx.x * PREPROCESS_THREADS + threadIdx.x) / PREPROCESS_LANES;
    const int sub = (int)threadIdx.x % PREPROCESS_LANES;
    const size_t bh = row / (size_t)p.N_pad;
    const int i = (int)(row - bh * p.N_pad);
    const bool inside = i < p.N;
    float sum = 0.f;
    if (inside) {
        const size_t at = ((size_t)bh * p.N + i) * D + sub * PER_LANE;
        if (p.dQ_acc) {  // (the dQ by atomics or bulk reductions adds into it)
            constexpr int FLOAT4_FLOATS = 4;
            float4 *const acc = reinterpret_cast<float4 *>(p.dQ_acc + at);
#pragma unroll
            for (int c = 0; c < PER_LANE / FLOAT4_FLOATS; ++c)
                acc[c] = make_float4(0.f, 0.f, 0.f, 0.f);
        }
#pragma unroll
        for (int c = 0; c < PER_LANE; c += CHUNK_HALVES) {
            const uint4 o = *reinterpret_cast<const uint4 *>(p.O + at + c);
            const uint4 d = *reinterpret_cast<const uint4 *>(p.dO + at + c);
            const __half2 *oh = reinterpret_cast<const __half2 *>(&o);
            const __half2 *dh = reinterpret_cast<const __half2 *>(&d);
#pragma unroll
            for (int x = 0; x < CHUNK_HALVES / 2; ++x) {
                const float2 of = __half22float2(oh[x]), df = __half22float2(dh[x]);
                sum = fmaf(of.x, df.x, fmaf(of.y, df.y, sum));
            }
        }
    }
#pragma unroll
    for (int s = PREPROCESS_LANES / 2; s > 0; s /= 2) sum += __shfl_xor_sync(FULL_WARP, sum, s);
    if (sub == 0) {
        p.Dsum[row] = inside ? sum : 0.f;
        p.lse2[row] = inside ? p.lse[bh * p.N + i] * LOG2E : INFINITY;
    }
}

// Shared memory of the two kernels, in bytes. ROWS = 16 WARPS: the block's rows.
__host__ __device__ constexpr int tile_rows(tile_config c) {
    return MMA_M * c.WARPS;
}
// backward_kernel: K_j, V_j [ROWS, D]; STAGES x (Q_i, dO_i [QROWS, D]); dS^T [ROWS, QROWS];
// STAGES x (LSE_i, D_i [QROWS] floats)
__host__ __device__ constexpr size_t main_smem_bytes(tile_config c, int D) {
    return (2 * (size_t)tile_rows(c) + 2 * (size_t)c.STAGES * c.QROWS) * D * sizeof(__half) +
           (size_t)tile_rows(c) * c.QROWS * sizeof(__half) +
           2 * (size_t)c.STAGES * c.QROWS * sizeof(float);
}
// dq_kernel: Q_i, dO_i; STAGES x (K_j, V_j), all [ROWS, D]
__host__ __device__ constexpr size_t dq_smem_bytes(tile_config c, int D) {
    return (2 + 2 * (size_t)c.STAGES) * tile_rows(c) * D * sizeof(__half);
}

// The main kernel's loop tile: Q_i and dO_i ([ROWS, D]) and LSE_i, D_i ([ROWS] floats) of query
// tile q0, copied into buffer `at`. One commit group.
template <int D, int ROWS, int THREADS>
__device__ __forceinline__ void issue_query_tile(const bwd_params &p, uint32_t Q_tile,
                                                 uint32_t dO_tile, uint32_t vec_tile, size_t head,
                                                 size_t vec, int q0) {
    tile_issue<ROWS, D, THREADS>(Q_tile, p.Q + head + (size_t)q0 * D, p.N - q0);
    tile_issue<ROWS, D, THREADS>(dO_tile, p.dO + head + (size_t)q0 * D, p.N - q0);
    vector_issue<ROWS, THREADS>(vec_tile, p.lse2 + vec + q0);
    vector_issue<ROWS, THREADS>(vec_tile + ROWS * sizeof(float), p.Dsum + vec + q0);
    cp_async_commit();
}

// P^T = 2^(scale log2(e) S^T - LSE_i log2(e)), in place: rows are this warp's keys (the first is
// key_row), columns the tile's queries (from q0). MASK (the diagonal tile, and the tile holding N):
// keys past N and, causal, keys after the query get P = 0. Queries past N have LSE = +inf: P = 0.
template <int NB>
__device__ __forceinline__ void probabilities_t(float (&S)[NB][4], uint32_t lse_tile, int key_row,
                                                int q0, const bwd_params &p, bool mask) {
#pragma unroll
    for (int n = 0; n < NB; ++n) {
        const float2 lse = ld_shared_f2(lse_tile + frag_col(n, 0) * sizeof(float));
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int key = key_row + frag_row(e), query = q0 + frag_col(n, e);
            const bool off = mask && (key >= p.N || (p.causal && key > query));
            const float x = fmaf(S[n][e], p.scale_log2, -(e % 2 ? lse.y : lse.x));
            S[n][e] = off ? 0.f : fast_exp2(x);
        }
    }
}

// dS^T = P^T * (dP^T - D_i), in place of dP^T; D_i per column (query).
template <int NB>
__device__ __forceinline__ void score_gradients_t(float (&dP)[NB][4], const float (&P)[NB][4],
                                                  uint32_t D_tile) {
#pragma unroll
    for (int n = 0; n < NB; ++n) {
        const float2 Di = ld_shared_f2(D_tile + frag_col(n, 0) * sizeof(float));
#pragma unroll
        for (int e = 0; e < 4; ++e) dP[n][e] = P[n][e] * (dP[n][e] - (e % 2 ? Di.y : Di.x));
    }
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
        for (int half = 0; half < 2; ++half) {  // column block 2k + half: chunk 2k + half
            const uint32_t col = t * sizeof(uint32_t);
            st_shared_b32(dS_smem + smem_offset<QROWS>(r, 2 * k + half) + col, dS[k][2 * half]);
            st_shared_b32(dS_smem + smem_offset<QROWS>(r + MMA_M / 2, 2 * k + half) + col,
                          dS[k][2 * half + 1]);
        }
    }
}

// to[0] += x, to[1] += y in global memory by fp32 atomics (red.global.add; both floats in one
// instruction on sm_90): the dQ accumulator's adds.
__device__ __forceinline__ void add_pair(float *to, float x, float y) {
#if __CUDA_ARCH__ >= 900
    atomicAdd(reinterpret_cast<float2 *>(to), make_float2(x, y));
#else
    atomicAdd(to, x);
    atomicAdd(to + 1, y);
#endif
}

// dQ_acc[q0 + QROWS rows] += dS K_j, split over the warps: warp w takes the 16 query rows of
// slice w % (QROWS / 16) and its share of the head dim. A = those rows of dS (read .trans from
// dS_smem, where they are columns), B = K_j (.trans); two head-dim blocks at a time, each added to
// global memory by fp32 atomics (red.global.add; two floats at once on sm_90).
template <int D, int ROWS, int QROWS, int WARPS>
__device__ __forceinline__ void accumulate_dq(const bwd_params &p, uint32_t dS_smem,
                                              uint32_t K_smem, size_t head, int q0) {
    constexpr int KC = ROWS / MMA_K;            // k16 steps over the keys
    constexpr int SLICES = QROWS / MMA_M;       // m16 slices of the query tile
    constexpr int PARTS = WARPS / SLICES;       // warps per slice
    constexpr int DB_PART = D / MMA_N / PARTS;  // n8 blocks of the head dim per warp
    constexpr int ROW_BYTES_S = QROWS * 2, ROW_BYTES = D * 2;
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
    constexpr bool A_WHOLE = KC * 4 <= X4_BLOCKS * MMA_N * 2;
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
                ldmatrix_x4_trans(
                    b, K_smem + (b_off ^ (n / X4_BLOCKS * X4_BYTES)) + k * MMA_K * ROW_BYTES);
                mma_16816(C[nn], a, b[0], b[1]);
                mma_16816(C[nn + 1], a, b[2], b[3]);
            }
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int row = q0 + MMA_M * slice + g + MMA_M / 2 * h;
            if (row >= p.N) continue;
#pragma unroll
            for (int nn = 0; nn < NC; ++nn) {
                float *to =
                    p.dQ_acc + head + (size_t)row * D + MMA_N * (part * DB_PART + nn0 + nn) + 2 * t;
                add_pair(to, C[nn][2 * h], C[nn][2 * h + 1]);
            }
        }
    }
}

// A warp's C fragments of 16 rows (the first is `row`) x D columns, times `mul`, stored as fp16
// for rows < N.
template <int D>
__device__ __forceinline__ void store_rows(__half *out, const float (&C)[D / MMA_N][4], int row,
                                           int N, float mul) {
    const int g = lane_index() / QUAD, t = lane_index() % QUAD;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int r = row + g + MMA_M / 2 * h;
        if (r >= N) continue;
#pragma unroll
        for (int n = 0; n < D / MMA_N; ++n) {
            *reinterpret_cast<uint32_t *>(out + (size_t)r * D + MMA_N * n + 2 * t) =
                pack_half2(C[n][2 * h] * mul, C[n][2 * h + 1] * mul);
        }
    }
}

// One block = one key tile K_j, V_j of one (batch, head), ROWS keys, 16 per warp; it loops over
// the query tiles that see it (causal: from its own diagonal on). DQ_ATOMIC: the block also adds
// its part of dQ (the default); the deterministic variant leaves dQ to dq_kernel.
template <int D, int WARPS, int STAGES, int QROWS, bool DQ_ATOMIC>
__global__ void __launch_bounds__(WARPS *WARP_SIZE) backward_kernel(const bwd_params p) {
    constexpr tile_config CFG = {WARPS, STAGES, QROWS};
    constexpr int THREADS = WARPS * WARP_SIZE;
    constexpr int ROWS = tile_rows(CFG);  // keys per block
    constexpr int ROW_BYTES = D * 2;      // one row of a [*, D] tile in shared memory
    constexpr int NB = QROWS / MMA_N;     // n8 blocks of S^T per warp (queries)
    constexpr int KC = QROWS / MMA_K;     // k16 steps over the queries
    constexpr int DB = D / MMA_N;         // n8 blocks of dK, dV (head dim)
    constexpr uint32_t KV_TILE = ROWS * ROW_BYTES, Q_TILE = QROWS * ROW_BYTES;
    constexpr uint32_t VEC = 2 * QROWS * sizeof(float);  // LSE_i, then D_i
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
    // sm_75 code has no cp.async to fill a second buffer with: the launcher picks one stage there
    // (kernel_arch), and the two-stage kernels are not compiled for it.
    if constexpr (STAGES == 2) {
        __trap();
        return;
    }
#endif

    const int k0 = (int)blockIdx.x * ROWS;             // the block's first key
    const size_t head = (size_t)blockIdx.y * p.N * D;  // (batch, head) offset
    const size_t vec = (size_t)blockIdx.y * p.N_pad;   // its rows of lse2 and Dsum
    const int warp = (int)threadIdx.x / WARP_SIZE;
    const int key_row = k0 + MMA_M * warp;  // this warp's first key
    const int q_begin = p.causal ? k0 : 0;  // earlier queries see no key here
    const int q_tiles = (p.N - q_begin + QROWS - 1) / QROWS;

    // Shared memory: K_smem, V_smem [ROWS, D]; per stage Q_smem, dO_smem [QROWS, D]; dS_smem
    // [ROWS keys, QROWS queries]; per stage vec_smem [2, QROWS] floats. Tiles swizzled.
    extern __shared__ __align__(128) unsigned char smem[];
    const uint32_t K_smem = smem_u32(smem), V_smem = K_smem + KV_TILE;
    const uint32_t Q_smem = V_smem + KV_TILE, dO_smem = Q_smem + STAGES * Q_TILE;
    const uint32_t dS_smem = dO_smem + STAGES * Q_TILE;
    const uint32_t vec_smem = dS_smem + ROWS * QROWS * sizeof(__half);

    tile_issue<ROWS, D, THREADS>(K_smem, p.K + head + (size_t)k0 * D, p.N - k0);
    tile_issue<ROWS, D, THREADS>(V_smem, p.V + head + (size_t)k0 * D, p.N - k0);
    cp_async_commit();
    if (STAGES == 2) {
        issue_query_tile<D, QROWS, THREADS>(p, Q_smem, dO_smem, vec_smem, head, vec, q_begin);
    }

    float dK[DB][4] = {}, dV[DB][4] = {};  // this warp's 16 keys x D, fp32
    for (int it = 0; it < q_tiles; ++it) {
        const int q0 = q_begin + it * QROWS;
        const int buf = STAGES == 2 ? it % 2 : 0;
        const uint32_t Q_tile = Q_smem + buf * Q_TILE, dO_tile = dO_smem + buf * Q_TILE;
        const uint32_t vec_tile = vec_smem + buf * VEC;
        if (STAGES == 1) {
            __syncthreads();  // every warp is done with the last tile's Q, dO, LSE, D and dS
            issue_query_tile<D, QROWS, THREADS>(p, Q_tile, dO_tile, vec_tile, head, vec, q0);
        }
        cp_async_wait<0>();
        __syncthreads();  // tile it (and K_j, V_j) visible to all; with two stages, every warp is
                          // also done with tile it - 1 (its buffer is refilled next) and dS_smem
        if (STAGES == 2 && it + 1 < q_tiles) {
            issue_query_tile<D, QROWS, THREADS>(p, Q_smem + (1 - buf) * Q_TILE,
                                                dO_smem + (1 - buf) * Q_TILE,
                                                vec_smem + (1 - buf) * VEC, head, vec, q0 + QROWS);
        }
        const uint32_t K_warp = K_smem + warp * MMA_M * ROW_BYTES;  // this warp's keys
        const uint32_t V_warp = V_smem + warp * MMA_M * ROW_BYTES;

        float S[NB][4], dP[NB][4];
        uint32_t A[KC][4];
        gemm_rows_by_rows<D>(S, K_warp, Q_tile);  // S^T = K_j Q_i^T
        const bool mask = k0 + ROWS > p.N || (p.causal && q0 < k0 + ROWS - 1);
        probabilities_t(S, vec_tile, key_row, q0, p, mask);  // P^T
        gemm_rows_by_rows<D>(dP, V_warp, dO_tile);           // dP^T = V_j dO_i^T
        to_a_fragments(A, S);
        gemm_frags_by_tile<D>(dV, A, dO_tile);                       // dV_j += P^T dO_i
        score_gradients_t(dP, S, vec_tile + QROWS * sizeof(float));  // dS^T
        to_a_fragments(A, dP);
        gemm_frags_by_tile<D>(dK, A, Q_tile);  // dK_j += dS^T Q_i
        if (DQ_ATOMIC) {
            store_score_gradients<QROWS>(dS_smem, A, warp);
            __syncthreads();  // dS_smem written by every warp, visible to all
            accumulate_dq<D, ROWS, QROWS, WARPS>(p, dS_smem, K_smem, head, q0);
        }
    }
    store_rows<D>(p.dK + head, dK, key_row, p.N, p.scale);
    store_rows<D>(p.dV + head, dV, key_row, p.N, 1.f);
}

/* ---- the shared-memory layout: P^T and dS^T through shared memory (FlashAttention-2's) ------- */

// A tile configuration of backward_smem_kernel: 8 warps, KEYS keys a block, QROWS queries a loop
// tile, STAGES buffers of Q_i, dO_i. P^T and dS^T go through shared memory, so that each of the
// five products splits its output over the 8 warps in the shape that reads least shared memory
// for it (32 x 32 or 32 x 64 fragments a warp; see the phases below), instead of all five
// following the 16 keys a warp owns in backward_kernel. The scores phase goes over the warp's
// queries in SCORE_PASSES blocks (fewer registers for S^T and dP^T); KV_REGS: the warp's
// fragments of K_j and V_j (the A operands of S^T and dP^T, the same for every query tile) are
// loaded into registers once, so that the scores phase reads only Q_i and dO_i.
typedef struct {
    int KEYS, QROWS, STAGES, SCORE_PASSES;
    bool KV_REGS;
} smem_p_config;

// D = 128: 128 keys x 64 queries (161 KB: an H100, H200 or A100); D = 64: 128 x 128 (162 KB), K_j
// and V_j in 64 registers (at D = 128 they would take 128, beside dK and dV's 128). Where it does
// not fit (an L4's 99 KB, a T4's 64 KB) the launcher falls back to backward_kernel.
constexpr smem_p_config SMEM_P_TILES_D128 = {128, 64, 2, 1, false};
constexpr smem_p_config SMEM_P_TILES_D64 = {128, 128, 2, 4, true};
constexpr int SMEM_P_WARPS = 8;
constexpr int SMEM_P_KEY_WARPS = 4;  // S^T, dP^T, dK, dV: the warps split the keys 4 ways...
constexpr int SMEM_P_COL_WARPS = SMEM_P_WARPS / SMEM_P_KEY_WARPS;  // ... and their columns 2 ways
constexpr int DQ_WARP_ROWS = 32;  // dQ: each warp 32 query rows x its share of the head dim

template <int D>
__host__ __device__ constexpr smem_p_config smem_p_tiles() {
    return D == 64 ? SMEM_P_TILES_D64 : SMEM_P_TILES_D128;
}

// From sm_90 on, the dQ tile reaches dQ_acc through the TMA unit (DQ_BULK): each warp stores its
// fp32 fragments into a staging tile in shared memory, and one thread hands the whole tile to a
// bulk tensor reduction, cp.reduce.async.bulk.tensor .add, which adds it to global memory without
// the warps' atomics (their queue was what the dQ phase waited on: LOG.md, steps 5 and 6).
// Elsewhere the warps add it by red.global.add themselves (accumulate_dq_tile).
constexpr int DQ_BULK_ARCH = 90;
__host__ __device__ constexpr bool dq_bulk(int arch) {
    return arch >= DQ_BULK_ARCH;
}
// The staging tile holds the QROWS x D floats in slabs of DQ_SLAB_COLS columns, [D / DQ_SLAB_COLS]
// [QROWS][DQ_SLAB_COLS]: a slab row is 32 bytes, so the 4 rows a half-warp's fragment store
// writes are 128 contiguous bytes, every bank once. The tensor map (dq_tensor_map) walks dQ_acc
// in the same order: column within the slab, row, slab, (batch, head).
constexpr int DQ_SLAB_COLS = 8;
constexpr int DQ_SLAB_ROW_BYTES = DQ_SLAB_COLS * (int)sizeof(float);
constexpr int DQ_MAP_RANK = 4;

// K_j, V_j [KEYS, D]; STAGES x (Q_i, dO_i [QROWS, D]); P^T, dS^T [KEYS, QROWS]; STAGES x (LSE_i,
// D_i [QROWS] floats); with DQ_BULK (bulk), the dQ staging tile, QROWS x D floats.
__host__ __device__ constexpr size_t smem_p_bytes(smem_p_config c, int D, bool bulk) {
    return (2 * (size_t)c.KEYS + 2 * (size_t)c.STAGES * c.QROWS) * D * sizeof(__half) +
           2 * (size_t)c.KEYS * c.QROWS * sizeof(__half) +
           2 * (size_t)c.STAGES * c.QROWS * sizeof(float) +
           (bulk ? (size_t)c.QROWS * D * sizeof(float) : 0);
}

// One k16 step of C (+)= A B^T for one warp, MT x NT fragments, A's fragments a given (MT m16
// blocks, in registers), B = NT n8 row blocks of a [*, D] tile from B_rows, NT / 2 ldmatrix.x4.
// FIRST: C = the product (the first step: nothing to clear).
template <int D, int MT, int NT, bool FIRST>
__device__ __forceinline__ void mma_rows_step(float (&C)[MT][NT][4], const uint32_t (&a)[MT][4],
                                              uint32_t B_rows, uint32_t b_off, int k) {
    constexpr int ROW_BYTES = D * 2;
#pragma unroll
    for (int n = 0; n < NT; n += X4_BLOCKS) {
        uint32_t b[4];  // b0, b1 of rows 8n..; b0, b1 of rows 8n + 8..
        ldmatrix_x4(b, B_rows + (b_off ^ (k * X4_BYTES)) + n * MMA_N * ROW_BYTES);
#pragma unroll
        for (int m = 0; m < MT; ++m) {
            if (FIRST) {
                mma_16816_zero(C[m][n], a[m], b[0], b[1]);
                mma_16816_zero(C[m][n + 1], a[m], b[2], b[3]);
            } else {
                mma_16816(C[m][n], a[m], b[0], b[1]);
                mma_16816(C[m][n + 1], a[m], b[2], b[3]);
            }
        }
    }
}

// C = A B^T for one warp, MT x NT fragments: A = MT m16 row blocks of a [*, D] tile from A_rows,
// B = NT n8 row blocks of another [*, D] tile from B_rows: S^T = K_j Q_i^T, dP^T = V_j dO_i^T.
// Each k16 step reads MT + NT / 2 ldmatrix.x4 for MT NT mma.
template <int D, int MT, int NT, bool FIRST>
__device__ __forceinline__ void gemm_nt_step(float (&C)[MT][NT][4], uint32_t A_rows,
                                             uint32_t B_rows, uint32_t a_off, uint32_t b_off,
                                             int k) {
    constexpr int ROW_BYTES = D * 2;
    uint32_t a[MT][4];
#pragma unroll
    for (int m = 0; m < MT; ++m) {
        ldmatrix_x4(a[m], A_rows + (a_off ^ (k * X4_BYTES)) + m * MMA_M * ROW_BYTES);
    }
    mma_rows_step<D, MT, NT, FIRST>(C, a, B_rows, b_off, k);
}

template <int D, int MT, int NT>
__device__ __forceinline__ void gemm_nt(float (&C)[MT][NT][4], uint32_t A_rows, uint32_t B_rows) {
    const uint32_t a_off = a_lane_offset<D>(), b_off = b_lane_offset<D>();
    gemm_nt_step<D, MT, NT, true>(C, A_rows, B_rows, a_off, b_off, 0);
#pragma unroll 4
    for (int k = 1; k < D / MMA_K; ++k) {
        gemm_nt_step<D, MT, NT, false>(C, A_rows, B_rows, a_off, b_off, k);
    }
}

// The warp's A fragments of a [*, D] tile, MT m16 blocks of rows from A_rows, every k16 step: for
// a product whose A stays the same for every query tile (K_j in S^T, V_j in dP^T), loaded once.
template <int D, int MT>
__device__ __forceinline__ void load_row_fragments(uint32_t (&A)[D / MMA_K][MT][4],
                                                   uint32_t A_rows) {
    constexpr int ROW_BYTES = D * 2;
    const uint32_t a_off = a_lane_offset<D>();
#pragma unroll
    for (int k = 0; k < D / MMA_K; ++k) {
#pragma unroll
        for (int m = 0; m < MT; ++m)
            ldmatrix_x4(A[k][m], A_rows + (a_off ^ (k * X4_BYTES)) + m * MMA_M * ROW_BYTES);
    }
}

// gemm_nt with A's fragments in registers (load_row_fragments): each k16 step reads NT / 2
// ldmatrix.x4 of B only.
template <int D, int MT, int NT>
__device__ __forceinline__ void gemm_nt_regs(float (&C)[MT][NT][4],
                                             const uint32_t (&A)[D / MMA_K][MT][4],
                                             uint32_t B_rows) {
    const uint32_t b_off = b_lane_offset<D>();
    mma_rows_step<D, MT, NT, true>(C, A[0], B_rows, b_off, 0);
#pragma unroll
    for (int k = 1; k < D / MMA_K; ++k) mma_rows_step<D, MT, NT, false>(C, A[k], B_rows, b_off, k);
}

// C += A B for one warp over KSTEPS k16 steps, MT x NT fragments. B: a [16 KSTEPS, B_COLS] tile
// stored row-major (read .trans), the warp's columns from chunk b_chunk. A: A_T = false, a
// [*, A_COLS] tile row-major, the warp's rows from A_rows (dV += P^T dO_i, dK += dS^T Q_i);
// A_T = true, stored transposed, [16 KSTEPS, A_COLS] with the warp's rows as columns from chunk
// a_chunk (dQ_i += dS K_j, dS read from dS^T).
template <int MT, int NT, bool A_T, int A_COLS, int B_COLS, bool FIRST>
__device__ __forceinline__ void gemm_nn_step(float (&C)[MT][NT][4], uint32_t A, int a_chunk,
                                             uint32_t B, int b_chunk, uint32_t a_off,
                                             uint32_t b_off, int k) {
    constexpr int A_ROW_BYTES = A_COLS * 2, B_ROW_BYTES = B_COLS * 2;
    uint32_t a[MT][4];
#pragma unroll
    for (int m = 0; m < MT; ++m) {
        if (A_T) {
            ldmatrix_x4_trans(a[m], A + (a_off ^ ((a_chunk + m * X4_BLOCKS) * CHUNK_BYTES)) +
                                        k * MMA_K * A_ROW_BYTES);
        } else {
            ldmatrix_x4(a[m], A + (a_off ^ (k * X4_BYTES)) + m * MMA_M * A_ROW_BYTES);
        }
    }
#pragma unroll
    for (int n = 0; n < NT; n += X4_BLOCKS) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, B + (b_off ^ ((b_chunk + n) * CHUNK_BYTES)) + k * MMA_K * B_ROW_BYTES);
#pragma unroll
        for (int m = 0; m < MT; ++m) {
            if (FIRST) {
                mma_16816_zero(C[m][n], a[m], b[0], b[1]);
                mma_16816_zero(C[m][n + 1], a[m], b[2], b[3]);
            } else {
                mma_16816(C[m][n], a[m], b[0], b[1]);
                mma_16816(C[m][n + 1], a[m], b[2], b[3]);
            }
        }
    }
}

// ZERO: C = A B (C's old contents ignored), else C += A B.
template <int MT, int NT, int KSTEPS, bool A_T, int A_COLS, int B_COLS, bool ZERO = false>
__device__ __forceinline__ void gemm_nn(float (&C)[MT][NT][4], uint32_t A, int a_chunk, uint32_t B,
                                        int b_chunk) {
    const uint32_t a_off = A_T ? b_lane_offset<A_COLS>() : a_lane_offset<A_COLS>();
    const uint32_t b_off = a_lane_offset<B_COLS>();
    gemm_nn_step<MT, NT, A_T, A_COLS, B_COLS, ZERO>(C, A, a_chunk, B, b_chunk, a_off, b_off, 0);
#pragma unroll
    for (int k = 1; k < KSTEPS; ++k) {
        gemm_nn_step<MT, NT, A_T, A_COLS, B_COLS, false>(C, A, a_chunk, B, b_chunk, a_off, b_off,
                                                         k);
    }
}

// The warp's fragments of a [*, COLS] fp32 tile as fp16 into a swizzled shared tile: fragment
// (m, n) covers rows row0 + 16m.., columns col0 + 8n.. (P^T and dS^T; row0 a multiple of 8, col0
// of 16). From sm_90 on, one stmatrix_x4 per 16 x 16 block (fragments n and n + 1 of m16 block m:
// the A-fragment order, so that a lane addresses the row and chunk ldmatrix_x4 would read):
// a quarter of the store instructions. Before sm_90, one 4-byte store per fragment row.
template <int COLS, int MT, int NT>
__device__ __forceinline__ void store_fragments(uint32_t tile, const float (&C)[MT][NT][4],
                                                int row0, int col0) {
#if __CUDA_ARCH__ >= 900
    const uint32_t lane_off = a_lane_offset<COLS>();
#pragma unroll
    for (int m = 0; m < MT; ++m) {
#pragma unroll
        for (int n = 0; n < NT; n += X4_BLOCKS) {
            const uint32_t chunk = col0 / CHUNK_HALVES + n;  // even: the XOR moves whole pairs
            stmatrix_x4(tile + (row0 + MMA_M * m) * (COLS * 2) + (lane_off ^ (chunk * CHUNK_BYTES)),
                        pack_half2(C[m][n][0], C[m][n][1]), pack_half2(C[m][n][2], C[m][n][3]),
                        pack_half2(C[m][n + 1][0], C[m][n + 1][1]),
                        pack_half2(C[m][n + 1][2], C[m][n + 1][3]));
        }
    }
#else
    const int g = lane_index() / QUAD, t = lane_index() % QUAD;
#pragma unroll
    for (int m = 0; m < MT; ++m) {
#pragma unroll
        for (int n = 0; n < NT; ++n) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {  // rows g and g + 8
                const int r = row0 + MMA_M * m + g + MMA_M / 2 * h;
                st_shared_b32(
                    tile + smem_offset<COLS>(r, col0 / CHUNK_HALVES + n) + t * sizeof(uint32_t),
                    pack_half2(C[m][n][2 * h], C[m][n][2 * h + 1]));
            }
        }
    }
#endif
}

// In place: S^T becomes P^T = 2^(c S^T - LSE_i) and dP^T becomes dS^T = P^T (dP^T - D_i), for
// keys key_row.. (MT m16 blocks) x queries q_col.. of the tile at q0 (NT n8 blocks). MASK: keys
// past N and, causal, keys after the query get P = 0.
template <int QROWS, int MT, int NT, bool MASK>
__device__ __forceinline__ void softmax_gradients(float (&S)[MT][NT][4], float (&dP)[MT][NT][4],
                                                  const bwd_params &p, uint32_t vec_tile,
                                                  int key_row, int q0, int q_col) {
#pragma unroll
    for (int m = 0; m < MT; ++m) {
#pragma unroll
        for (int n = 0; n < NT; ++n) {
            const int col = q_col + frag_col(n, 0);
            const float2 lse = ld_shared_f2(vec_tile + col * sizeof(float));
            const float2 Di = ld_shared_f2(vec_tile + (QROWS + col) * sizeof(float));
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const float x = fmaf(S[m][n][e], p.scale_log2, -(e % 2 ? lse.y : lse.x));
                S[m][n][e] = fast_exp2(x);
                if (MASK) {
                    const int key = key_row + MMA_M * m + frag_row(e), query = q0 + col + e % 2;
                    if (key >= p.N || (p.causal && key > query)) S[m][n][e] = 0.f;
                }
                dP[m][n][e] = S[m][n][e] * (dP[m][n][e] - (e % 2 ? Di.y : Di.x));
            }
        }
    }
}

// One warp's block of the scores phase: keys key0.. (MT m16 blocks, from the block's k0) x
// queries q_col.. (NT n8 blocks, from the tile's q0) of S^T = K_j Q_i^T and dP^T = V_j dO_i^T
// (K_j, V_j from shared memory, or KV_REGS from their fragments K_frag, V_frag), then P^T and
// dS^T (softmax_gradients), stored to P_smem and dS_smem as fp16. mask: the
// diagonal tile, and the tile holding N; queries past N have LSE = +inf, so P = 0 there without
// a mask.
template <int D, int QROWS, int MT, int NT, bool KV_REGS, int KF>
__device__ __forceinline__ void score_gradients(
    const bwd_params &p, uint32_t K_smem, uint32_t V_smem, const uint32_t (&K_frag)[KF][MT][4],
    const uint32_t (&V_frag)[KF][MT][4], uint32_t Q_tile, uint32_t dO_tile, uint32_t vec_tile,
    uint32_t P_smem, uint32_t dS_smem, int k0, int key0, int q0, int q_col, bool mask) {
    constexpr int ROW_BYTES = D * 2;
    float S[MT][NT][4], dP[MT][NT][4];
    if constexpr (KV_REGS) {
        gemm_nt_regs<D, MT, NT>(S, K_frag, Q_tile + q_col * ROW_BYTES);
        gemm_nt_regs<D, MT, NT>(dP, V_frag, dO_tile + q_col * ROW_BYTES);
    } else {
        gemm_nt<D, MT, NT>(S, K_smem, Q_tile + q_col * ROW_BYTES);    // S^T = K_j Q_i^T
        gemm_nt<D, MT, NT>(dP, V_smem, dO_tile + q_col * ROW_BYTES);  // dP^T = V_j dO_i^T
    }
    if (mask) {  // the same for the whole warp: the tiles without a mask test nothing
        softmax_gradients<QROWS, MT, NT, true>(S, dP, p, vec_tile, k0 + key0, q0, q_col);
    } else {
        softmax_gradients<QROWS, MT, NT, false>(S, dP, p, vec_tile, k0 + key0, q0, q_col);
    }
    store_fragments<QROWS>(P_smem, S, key0, q_col);
    store_fragments<QROWS>(dS_smem, dP, key0, q_col);
}

// DQ_BULK: the warp's fp32 fragments (MT m16 blocks of rows from row0, NT n8 blocks of columns
// from col0, col0 a multiple of DQ_SLAB_COLS) into the dQ staging tile's slabs, made visible to
// the bulk reduction (add_staged_dq_tile, after the next barrier).
template <int QROWS, int MT, int NT>
__device__ __forceinline__ void stage_dq_fragments(uint32_t dq_stage, const float (&C)[MT][NT][4],
                                                   int row0, int col0) {
    constexpr int SLAB_BYTES = QROWS * DQ_SLAB_ROW_BYTES, FLOAT_BYTES = sizeof(float);
    static_assert(MMA_N == DQ_SLAB_COLS, "an n8 block of columns is one slab");
    const int g = lane_index() / QUAD, t = lane_index() % QUAD;
    const uint32_t at = dq_stage + col0 / DQ_SLAB_COLS * SLAB_BYTES +
                        (row0 + g) * DQ_SLAB_ROW_BYTES + 2 * t * FLOAT_BYTES;
#pragma unroll
    for (int m = 0; m < MT; ++m) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
#pragma unroll
            for (int n = 0; n < NT; ++n) {
                st_shared_f2(at + n * SLAB_BYTES + (MMA_M * m + MMA_M / 2 * h) * DQ_SLAB_ROW_BYTES,
                             C[m][n][2 * h], C[m][n][2 * h + 1]);
            }
        }
    }
    fence_proxy_async();
}

// DQ_BULK: after a barrier that follows every warp's stage_dq_fragments, thread 0 hands the
// staging tile to one bulk tensor reduction into rows q0 .. q0 + QROWS of dQ_acc (rows past N
// skipped by the TMA unit).
__device__ __forceinline__ void add_staged_dq_tile(const CUtensorMap *dq_map, uint32_t dq_stage,
                                                   int q0) {
    if (threadIdx.x != 0) return;
    tma_reduce_add_4d(dq_map, dq_stage, 0, q0, 0, (int)blockIdx.y);
    bulk_commit();
}

// dQ_acc[q0 + QROWS rows] += dS K_j, split over the 8 warps: warp (qw, dw) takes 32 query rows
// (A = dS, read .trans from dS_smem where they are columns) x D / DQ_COL_WARPS head-dim columns
// (B = K_j, .trans). BULK: into the staging tile (stage_dq_fragments). Else added to global memory
// by fp32 atomics (red.global.add), one address a thread, its fragment rows and columns constant
// offsets.
template <int D, int KEYS, int QROWS, bool BULK>
__device__ __forceinline__ void accumulate_dq_tile(const bwd_params &p, uint32_t dS_smem,
                                                   uint32_t K_smem, uint32_t dq_stage, size_t head,
                                                   int q0) {
    constexpr int DQ_ROW_WARPS = QROWS / DQ_WARP_ROWS, DQ_COL_WARPS = SMEM_P_WARPS / DQ_ROW_WARPS;
    constexpr int MQ = DQ_WARP_ROWS / MMA_M, NT_Q = D / DQ_COL_WARPS / MMA_N;
    static_assert(SMEM_P_WARPS % DQ_ROW_WARPS == 0 && NT_Q % X4_BLOCKS == 0, "dQ over the warps");
    const int warp = (int)threadIdx.x / WARP_SIZE;
    const int qw = warp % DQ_ROW_WARPS, dw = warp / DQ_ROW_WARPS;
    float C[MQ][NT_Q][4];
    gemm_nn<MQ, NT_Q, KEYS / MMA_K, true, QROWS, D, true>(
        C, dS_smem, DQ_WARP_ROWS * qw / CHUNK_HALVES, K_smem, NT_Q * MMA_N * dw / CHUNK_HALVES);
    if (BULK) {
        stage_dq_fragments<QROWS, MQ, NT_Q>(dq_stage, C, DQ_WARP_ROWS * qw, NT_Q * MMA_N * dw);
        return;
    }
    const int g = lane_index() / QUAD, t = lane_index() % QUAD;
    const int row0 = q0 + DQ_WARP_ROWS * qw + g;
    float *const acc = p.dQ_acc + head + (size_t)row0 * D + MMA_N * NT_Q * dw + 2 * t;
#pragma unroll
    for (int m = 0; m < MQ; ++m) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int r = MMA_M * m + MMA_M / 2 * h;  // the fragment row, from row0
            if (row0 + r >= p.N) continue;
#pragma unroll
            for (int n = 0; n < NT_Q; ++n) {
                float *to = acc + r * D + MMA_N * n;
                add_pair(to, C[m][n][2 * h], C[m][n][2 * h + 1]);
            }
        }
    }
}

// One block = one key tile K_j, V_j of one (batch, head), KEYS keys; it loops over the query
// tiles that see it (causal: from its own diagonal on). Per query tile, three phases between two
// barriers:
//   scores:    warp (kw, qw) of a 4 x 2 grid: its 32 keys x QROWS / 2 queries of S^T and dP^T, so
//              P^T and dS^T, in registers; stored to P_smem, dS_smem as fp16 (KV_REGS: K_j's and
//              V_j's fragments from registers, loaded after the first barrier)
//   dV, dK:    warp (kw, dw): its 32 keys x D / 2 columns of dV += P^T dO_i, dK += dS^T Q_i
//              (accumulators for the whole loop)
//   dQ:        warp (qw', dw'): 32 queries x its share of D of dS K_j, added by fp32 atomics
//              (sm_90 on: stored to a staging tile, which goes to dQ_acc by one bulk tensor
//              reduction issued after the next iteration's first barrier)
template <int D, int KEYS, int QROWS, int STAGES, int SCORE_PASSES, bool KV_REGS, bool DQ_ATOMIC,
          bool DQ_BULK_OK>
__global__ void __launch_bounds__(SMEM_P_WARPS *WARP_SIZE)
    backward_smem_kernel(const bwd_params p, const __grid_constant__ CUtensorMap dq_map) {
    constexpr int THREADS = SMEM_P_WARPS * WARP_SIZE;
    constexpr int ROW_BYTES = D * 2;
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
    constexpr uint32_t VEC = 2 * QROWS * sizeof(float);  // LSE_i, then D_i
#ifdef __CUDA_ARCH__
    constexpr bool BULK = DQ_ATOMIC && DQ_BULK_OK && dq_bulk(__CUDA_ARCH__ / 10);  // dQ by bulk
                                                                                   // reductions
#else
    constexpr bool BULK = false;
#endif
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
    // sm_75 has no cp.async for a second buffer, and a T4's shared memory is too small for this
    // kernel: the launcher never picks it there.
    __trap();
    return;
#endif

    const int k0 = (int)blockIdx.x * KEYS;             // the block's first key
    const size_t head = (size_t)blockIdx.y * p.N * D;  // (batch, head) offset
    const size_t vec = (size_t)blockIdx.y * p.N_pad;   // its rows of lse2 and Dsum
    const int warp = (int)threadIdx.x / WARP_SIZE;
    const int kw = warp % SMEM_P_KEY_WARPS, cw = warp / SMEM_P_KEY_WARPS;
    const int q_begin = p.causal ? k0 : 0;  // earlier queries see no key here
    const int q_tiles = (p.N - q_begin + QROWS - 1) / QROWS;

    // Shared memory: K_smem, V_smem [KEYS, D]; per stage Q_smem, dO_smem [QROWS, D]; P_smem,
    // dS_smem [KEYS, QROWS]; per stage vec_smem [2, QROWS] floats; BULK: dq_stage [D / 8
    // slabs][QROWS][8] floats. The half tiles swizzled.
    extern __shared__ __align__(128) unsigned char smem[];
    const uint32_t K_smem = smem_u32(smem), V_smem = K_smem + KV_TILE;
    const uint32_t Q_smem = V_smem + KV_TILE, dO_smem = Q_smem + STAGES * Q_TILE;
    const uint32_t P_smem = dO_smem + STAGES * Q_TILE, dS_smem = P_smem + PS_TILE;
    const uint32_t vec_smem = dS_smem + PS_TILE, dq_stage = vec_smem + STAGES * VEC;

    tile_issue<KEYS, D, THREADS>(K_smem, p.K + head + (size_t)k0 * D, p.N - k0);
    tile_issue<KEYS, D, THREADS>(V_smem, p.V + head + (size_t)k0 * D, p.N - k0);
    cp_async_commit();
    issue_query_tile<D, QROWS, THREADS>(p, Q_smem, dO_smem, vec_smem, head, vec, q_begin);

    float dK[MT][NT_KV][4] = {}, dV[MT][NT_KV][4] = {};  // keys kw x columns cw, fp32
    constexpr int KF = KV_REGS ? D / MMA_K : 1;          // k16 steps of K_frag, V_frag (unused: 1)
    uint32_t K_frag[KF][MT][4], V_frag[KF][MT][4];
    for (int it = 0; it < q_tiles; ++it) {
        const int q0 = q_begin + it * QROWS;
        const int buf = STAGES == 2 ? it % 2 : 0;
        const uint32_t Q_tile = Q_smem + buf * Q_TILE, dO_tile = dO_smem + buf * Q_TILE;
        const uint32_t vec_tile = vec_smem + buf * VEC;
        cp_async_wait<0>();
        __syncthreads();  // tile it (and K_j, V_j) visible to all; every warp is done with tile
                          // it - 1 (its buffer is refilled next) and with P_smem and dS_smem;
                          // BULK: tile it - 1's dQ is staged
        if (BULK && it > 0) add_staged_dq_tile(&dq_map, dq_stage, q0 - QROWS);
        if constexpr (KV_REGS) {  // K_j and V_j have arrived with tile 0: into registers
            if (it == 0) {
                load_row_fragments<D, MT>(K_frag, K_smem + WARP_KEYS * kw * ROW_BYTES);
                load_row_fragments<D, MT>(V_frag, V_smem + WARP_KEYS * kw * ROW_BYTES);
            }
        }
        if (it + 1 < q_tiles) {
            issue_query_tile<D, QROWS, THREADS>(p, Q_smem + (1 - buf) * Q_TILE,
                                                dO_smem + (1 - buf) * Q_TILE,
                                                vec_smem + (1 - buf) * VEC, head, vec, q0 + QROWS);
        }

        // Scores: S^T, P^T, dP^T, dS^T of keys kw, queries cw (SCORE_PASSES column blocks, so
        // that fewer registers hold S^T and dP^T beside dK and dV; unrolled, so that one
        // block's products run while the warp computes another's P^T and dS^T).
#pragma unroll
        for (int pass = 0; pass < SCORE_PASSES; ++pass) {
            score_gradients<D, QROWS, MT, NT_S, KV_REGS, KF>(
                p, K_smem + WARP_KEYS * kw * ROW_BYTES, V_smem + WARP_KEYS * kw * ROW_BYTES, K_frag,
                V_frag, Q_tile, dO_tile, vec_tile, P_smem, dS_smem, k0, WARP_KEYS * kw, q0,
                WARP_QUERIES * cw + pass * PASS_QUERIES,
                k0 + KEYS > p.N || (p.causal && q0 < k0 + KEYS - 1));
        }
        if (BULK) bulk_wait<true>();  // the staged tile thread 0 handed over is read
        __syncthreads();  // P_smem and dS_smem written by every warp, visible to all; BULK:
                          // dq_stage free

        // dV_j += P^T dO_i, dK_j += dS^T Q_i: keys kw, head-dim columns cw.
        const int col_chunk = WARP_COLS * cw / CHUNK_HALVES;
        gemm_nn<MT, NT_KV, QROWS / MMA_K, false, QROWS, D>(dV, P_smem + WARP_KEYS * kw * QROWS * 2,
                                                           0, dO_tile, col_chunk);
        gemm_nn<MT, NT_KV, QROWS / MMA_K, false, QROWS, D>(dK, dS_smem + WARP_KEYS * kw * QROWS * 2,
                                                           0, Q_tile, col_chunk);
        // dQ_i += dS K_j, by fp32 atomics or staged for bulk reductions (last: LOG.md, step 4's
        // try)
        if (DQ_ATOMIC)
            accumulate_dq_tile<D, KEYS, QROWS, BULK>(p, dS_smem, K_smem, dq_stage, head, q0);
    }
    if (BULK) {           // the last tile's dQ
        __syncthreads();  // every warp's part of it is staged
        add_staged_dq_tile(&dq_map, dq_stage, q_begin + (q_tiles - 1) * QROWS);
        bulk_wait<false>();
    }
#pragma unroll
    for (int m = 0; m < MT; ++m) {
        const int g = lane_index() / QUAD, t = lane_index() % QUAD;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int r = k0 + WARP_KEYS * kw + MMA_M * m + g + MMA_M / 2 * h;
            if (r >= p.N) continue;
#pragma unroll
            for (int n = 0; n < NT_KV; ++n) {
                const size_t at = head + (size_t)r * D + WARP_COLS * cw + MMA_N * n + 2 * t;
                *reinterpret_cast<uint32_t *>(p.dK + at) =
                    pack_half2(dK[m][n][2 * h] * p.scale, dK[m][n][2 * h + 1] * p.scale);
                *reinterpret_cast<uint32_t *>(p.dV + at) =
                    pack_half2(dV[m][n][2 * h], dV[m][n][2 * h + 1]);
            }
        }
    }
}

// dQ = scale * dQ_acc, as fp16: four elements a thread.
constexpr int CONVERT_THREADS = 256;
__global__ void __launch_bounds__(CONVERT_THREADS)
    dq_convert_kernel(const bwd_params p, size_t count4) {
    const size_t i = (size_t)blockIdx.x * CONVERT_THREADS + threadIdx.x;
    if (i >= count4) return;
    const float4 a = reinterpret_cast<const float4 *>(p.dQ_acc)[i];
    uint2 h;
    h.x = pack_half2(a.x * p.scale, a.y * p.scale);
    h.y = pack_half2(a.z * p.scale, a.w * p.scale);
    reinterpret_cast<uint2 *>(p.dQ)[i] = h;
}

// The deterministic variant's second pass: one block = one query tile Q_i, dO_i of one (batch,
// head), 16 rows per warp; it loops over the key tiles it sees and keeps dQ_i in registers:
//   S = Q_i K_j^T, P = 2^(c S - LSE_i), dP = dO_i V_j^T, dS = P (dP - D_i), dQ_i += dS K_j.
template <int D, int WARPS, int STAGES>
__global__ void __launch_bounds__(WARPS *WARP_SIZE) dq_kernel(const bwd_params p) {
    constexpr tile_config CFG = {WARPS, STAGES, 0};
    constexpr int THREADS = WARPS * WARP_SIZE;
    constexpr int ROWS = tile_rows(CFG);
    constexpr int ROW_BYTES = D * 2;
    constexpr int NB = ROWS / MMA_N, KC = ROWS / MMA_K, DB = D / MMA_N;
    constexpr uint32_t TILE = ROWS * ROW_BYTES;

    // Causal: the last query tiles have the most key tiles; launch them first.
    const int q_index = p.causal ? (int)gridDim.x - 1 - (int)blockIdx.x : (int)blockIdx.x;
    const int q0 = q_index * ROWS;
    const size_t head = (size_t)blockIdx.y * p.N * D;
    const size_t vec = (size_t)blockIdx.y * p.N_pad;
    const int warp = (int)threadIdx.x / WARP_SIZE;
    const int q_row = q0 + MMA_M * warp;  // this warp's first query
    const int kv_end = p.causal ? min(q0 + ROWS, p.N) : p.N;
    const int k_tiles = (kv_end + ROWS - 1) / ROWS;

    // Shared memory: Q_smem, dO_smem [ROWS, D]; per stage K_smem, V_smem [ROWS, D]; swizzled.
    extern __shared__ __align__(128) unsigned char smem[];
    const uint32_t Q_smem = smem_u32(smem), dO_smem = Q_smem + TILE;
    const uint32_t K_smem = dO_smem + TILE, V_smem = K_smem + STAGES * TILE;

    tile_issue<ROWS, D, THREADS>(Q_smem, p.Q + head + (size_t)q0 * D, p.N - q0);
    tile_issue<ROWS, D, THREADS>(dO_smem, p.dO + head + (size_t)q0 * D, p.N - q0);
    cp_async_commit();
    if (STAGES == 2) {
        tile_issue<ROWS, D, THREADS>(K_smem, p.K + head, p.N);
        tile_issue<ROWS, D, THREADS>(V_smem, p.V + head, p.N);
        cp_async_commit();
    }
    const int g = lane_index() / QUAD;
    float lse2[2], Di[2];  // rows g and g + 8 of this warp (padded arrays: always in bounds)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        lse2[h] = p.lse2[vec + q_row + g + MMA_M / 2 * h];
        Di[h] = p.Dsum[vec + q_row + g + MMA_M / 2 * h];
    }

    float dQ[DB][4] = {};
    for (int it = 0; it < k_tiles; ++it) {
        const int k0 = it * ROWS;
        const int buf = STAGES == 2 ? it % 2 : 0;
        const uint32_t K_tile = K_smem + buf * TILE, V_tile = V_smem + buf * TILE;
        if (STAGES == 1) {
            __syncthreads();  // every warp is done with the last K_j, V_j
            tile_issue<ROWS, D, THREADS>(K_tile, p.K + head + (size_t)k0 * D, p.N - k0);
            tile_issue<ROWS, D, THREADS>(V_tile, p.V + head + (size_t)k0 * D, p.N - k0);
            cp_async_commit();
        }
        cp_async_wait<0>();
        __syncthreads();  // K_j, V_j (and Q_i, dO_i) visible to all; with two stages, every warp
                          // is also done with K_{j-1}, V_{j-1}, whose buffer is refilled next
        if (STAGES == 2 && it + 1 < k_tiles) {
            tile_issue<ROWS, D, THREADS>(K_smem + (1 - buf) * TILE,
                                         p.K + head + (size_t)(k0 + ROWS) * D, p.N - k0 - ROWS);
            tile_issue<ROWS, D, THREADS>(V_smem + (1 - buf) * TILE,
                                         p.V + head + (size_t)(k0 + ROWS) * D, p.N - k0 - ROWS);
            cp_async_commit();
        }
        const uint32_t Q_warp = Q_smem + warp * MMA_M * ROW_BYTES;
        const uint32_t dO_warp = dO_smem + warp * MMA_M * ROW_BYTES;
        float S[NB][4], dP[NB][4];
        uint32_t A[KC][4];
        gemm_rows_by_rows<D>(S, Q_warp, K_tile);  // S = Q_i K_j^T
        const bool mask = k0 + ROWS > p.N || (p.causal && k0 + ROWS - 1 > q0);
#pragma unroll
        for (int n = 0; n < NB; ++n) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {  // P = 2^(c S - LSE); masked keys: P = 0
                const int key = k0 + frag_col(n, e), query = q_row + frag_row(e);
                const bool off = mask && (key >= p.N || (p.causal && key > query));
                const float x = fmaf(S[n][e], p.scale_log2, -lse2[e / 2]);
                S[n][e] = off ? 0.f : fast_exp2(x);
            }
        }
        gemm_rows_by_rows<D>(dP, dO_warp, V_tile);  // dP = dO_i V_j^T
#pragma unroll
        for (int n = 0; n < NB; ++n) {
#pragma unroll
            for (int e = 0; e < 4; ++e) dP[n][e] = S[n][e] * (dP[n][e] - Di[e / 2]);  // dS
        }
        to_a_fragments(A, dP);
        gemm_frags_by_tile<D>(dQ, A, K_tile);  // dQ_i += dS K_j
    }
    store_rows<D>(p.dQ + head, dQ, q_row, p.N, p.scale);
}

/* ---- launcher -------------------------------------------------------------------------------- */

enum {
    VARIANT_DEFAULT = 0,
    VARIANT_DETERMINISTIC = 1,
    VARIANT_REGISTERS = 2,
    VARIANT_ATOMICS = 3,
    VARIANTS = 4
};

// How dQ is added up: DQ_SECOND_PASS (deterministic: dq_kernel), DQ_BY_ATOMICS (the warps'
// red.global.add), DQ_BY_BULK (backward_smem_kernel on sm_90 on: the TMA unit's bulk reductions;
// variant atomics switches them off).
enum dq_way { DQ_SECOND_PASS, DQ_BY_ATOMICS, DQ_BY_BULK };
static dq_way dq_way_for(int variant, int arch) {
    if (variant == VARIANT_DETERMINISTIC) return DQ_SECOND_PASS;
    return variant != VARIANT_ATOMICS && dq_bulk(arch) ? DQ_BY_BULK : DQ_BY_ATOMICS;
}

// The forward pass is stage 5's: its attention.cu, compiled a second time with its descriptor
// renamed to attn_forward_stage (Makefile), linked beside this file.
extern "C" const attn_stage attn_forward_stage;

static int ceil_div(int a, int b) {
    return (a + b - 1) / b;
}

static int padded_rows(int N) {
    return ceil_div(N, ROW_PAD) * ROW_PAD;
}

// The PTX architecture the kernels were compiled for on the current device (75 for a compute_75
// PTX build JIT-compiled on an H100): that, not the device, decides whether cp.async is there.
static cudaError_t kernel_arch(int *arch) {
    cudaFuncAttributes fa;
    ATTN_TRY(cudaFuncGetAttributes(&fa, (const void *)dq_convert_kernel));
    *arch = fa.ptxVersion;  // major * 10 + minor
    return cudaSuccess;
}

// The first configuration of the kernel's list (MAIN_TILES_D64 ... DQ_TILES_D128, in order) whose
// shared memory fits the block's limit, with two stages only where cp.async is (arch >= 80); its
// index, or -1.
template <int D, bool MAIN>
static int choose_tiles_for(size_t smem_limit, int arch) {
    for (int i = 0; i < tile_count<D, MAIN>(); ++i) {
        const tile_config c = tiles_for<D, MAIN>()[i];
        if (c.STAGES > 1 && arch < 80) continue;
        if ((MAIN ? main_smem_bytes(c, D) : dq_smem_bytes(c, D)) <= smem_limit) return i;
    }
    return -1;
}

static int choose_tiles(int D, size_t smem_limit, int arch, bool main_kernel) {
    if (main_kernel) {
        return D == 64 ? choose_tiles_for<64, true>(smem_limit, arch)
                       : choose_tiles_for<128, true>(smem_limit, arch);
    }
    return D == 64 ? choose_tiles_for<64, false>(smem_limit, arch)
                   : choose_tiles_for<128, false>(smem_limit, arch);
}

static tile_config tiles_at(int D, bool main_kernel, int i) {
    if (main_kernel) return D == 64 ? MAIN_TILES_D64[i] : MAIN_TILES_D128[i];
    return D == 64 ? DQ_TILES_D64[i] : DQ_TILES_D128[i];
}

typedef void (*kernel_fn)(bwd_params);
typedef void (*smem_kernel_fn)(bwd_params, CUtensorMap);  // + dQ_acc's map (DQ_BULK)

// The kernel of configuration i of its list: backward_kernel (MAIN, dQ by atomics or not) or
// dq_kernel, every configuration instantiated.
template <int D, bool MAIN, int I = 0>
static kernel_fn kernel_for(int i, bool atomic) {
    if constexpr (I < tile_count<D, MAIN>()) {
        constexpr tile_config c = tiles_for<D, MAIN>()[I];
        if (i != I) return kernel_for<D, MAIN, I + 1>(i, atomic);
        if constexpr (MAIN) {
            return atomic ? backward_kernel<D, c.WARPS, c.STAGES, c.QROWS, true>
                          : backward_kernel<D, c.WARPS, c.STAGES, c.QROWS, false>;
        } else {
            return dq_kernel<D, c.WARPS, c.STAGES>;
        }
    } else {
        (void)i, (void)atomic;
        return NULL;
    }
}

// backward_smem_kernel where cp.async is and its shared memory fits the block's limit.
static bool smem_p_fits(int D, size_t smem_limit, int arch, dq_way dq) {
    const smem_p_config c = D == 64 ? smem_p_tiles<64>() : smem_p_tiles<128>();
    return arch >= 80 && smem_p_bytes(c, D, dq == DQ_BY_BULK) <= smem_limit;
}

template <int D>
static smem_kernel_fn smem_p_kernel(dq_way dq) {
    constexpr smem_p_config c = smem_p_tiles<D>();
    switch (dq) {
        case DQ_SECOND_PASS:
            return backward_smem_kernel<D, c.KEYS, c.QROWS, c.STAGES, c.SCORE_PASSES, c.KV_REGS,
                                        false, false>;
        case DQ_BY_ATOMICS:
            return backward_smem_kernel<D, c.KEYS, c.QROWS, c.STAGES, c.SCORE_PASSES, c.KV_REGS,
                                        true, false>;
        default:
            return backward_smem_kernel<D, c.KEYS, c.QROWS, c.STAGES, c.SCORE_PASSES, c.KV_REGS,
                                        true, true>;
    }
}

// DQ_BULK: dQ_acc [B * H, N, D] floats seen as [B * H][D / DQ_SLAB_COLS slabs][N rows]
// [DQ_SLAB_COLS] (innermost last: the layout of the staging tile), in boxes of one whole query
// tile, rows past N out of bounds.
static cudaError_t dq_tensor_map(CUtensorMap *map, float *dQ_acc, const attn_shape *s, int qrows) {
    PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
    if (!encode) return cudaErrorSymbolNotFound;
    const cuuint64_t row = (cuuint64_t)s->D * sizeof(float);
    const cuuint64_t dims[DQ_MAP_RANK] = {
        DQ_SLAB_COLS, (cuuint64_t)s->N, (cuuint64_t)(s->D / DQ_SLAB_COLS), (cuuint64_t)s->B * s->H};
    const cuuint64_t strides[DQ_MAP_RANK - 1] = {row, DQ_SLAB_ROW_BYTES, row * s->N};  // bytes
    const cuuint32_t box[DQ_MAP_RANK] = {DQ_SLAB_COLS, (cuuint32_t)qrows,
                                         (cuuint32_t)(s->D / DQ_SLAB_COLS), 1};
    const cuuint32_t elem_strides[DQ_MAP_RANK] = {1, 1, 1, 1};
    const CUresult r =
        encode(map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, DQ_MAP_RANK, dQ_acc, dims, strides, box,
               elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
               CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

template <typename FN, typename... ARGS>
static cudaError_t launch(FN fn, dim3 grid, int threads, size_t smem, cudaStream_t stream,
                          const ARGS &...args) {
    ATTN_TRY(cudaFuncSetAttribute((const void *)fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  (int)smem));
    fn<<<grid, threads, smem, stream>>>(args...);
    ATTN_TRY(cudaGetLastError());
    return cudaSuccess;
}

// Workspace: lse2 and Dsum [B * H, N_pad] floats, then (default variant) dQ_acc [B, H, N, D]
// floats, each starting at a multiple of WORKSPACE_ALIGN bytes.
constexpr size_t WORKSPACE_ALIGN = 256;
static size_t aligned(size_t bytes) {
    return (bytes + WORKSPACE_ALIGN - 1) / WORKSPACE_ALIGN * WORKSPACE_ALIGN;
}

static size_t backward_workspace_bytes(const attn_shape *s, const attn_device *dev, int variant) {
    (void)dev;
    const size_t rows = (size_t)s->B * s->H * padded_rows(s->N);
    const size_t acc =
        variant == VARIANT_DETERMINISTIC ? 0 : (size_t)s->B * s->H * s->N * s->D * sizeof(float);
    return 2 * aligned(rows * sizeof(float)) + aligned(acc);
}

static cudaError_t backward(const attn_shape *s, const attn_device *dev, const void *Q,
                            const void *K, const void *V, const void *O, const float *lse,
                            const void *dO, void *dQ, void *dK, void *dV, void *workspace,
                            int variant, cudaStream_t stream) {
    const int BH = s->B * s->H, N_pad = padded_rows(s->N);
    const size_t rows = (size_t)BH * N_pad;
    const bool atomic = variant != VARIANT_DETERMINISTIC;
    bwd_params p;
    p.Q = (const __half *)Q, p.K = (const __half *)K, p.V = (const __half *)V;
    p.O = (const __half *)O, p.dO = (const __half *)dO, p.lse = lse;
    p.dQ = (__half *)dQ, p.dK = (__half *)dK, p.dV = (__half *)dV;
    p.lse2 = (float *)workspace;
    p.Dsum = (float *)((char *)workspace + aligned(rows * sizeof(float)));
    p.dQ_acc = atomic ? (float *)((char *)workspace + 2 * aligned(rows * sizeof(float))) : NULL;
    p.N = s->N, p.N_pad = N_pad, p.causal = s->causal;
    p.scale = s->scale, p.scale_log2 = s->scale * LOG2E;

    const dim3 pre_grid((unsigned)(rows * PREPROCESS_LANES / PREPROCESS_THREADS));
    if (s->D == 64) {
        preprocess_kernel<64><<<pre_grid, PREPROCESS_THREADS, 0, stream>>>(p);
    } else {
        preprocess_kernel<128><<<pre_grid, PREPROCESS_THREADS, 0, stream>>>(p);
    }
    ATTN_TRY(cudaGetLastError());
    const size_t elems = (size_t)BH * s->N * s->D;

    int arch = 0;
    ATTN_TRY(kernel_arch(&arch));
    const int mi = choose_tiles(s->D, dev->smem_per_block, arch, true);
    const int di = choose_tiles(s->D, dev->smem_per_block, arch, false);
    if (mi < 0 || di < 0) return cudaErrorInvalidConfiguration;  // stage_unsupported says why
    const dq_way dq = dq_way_for(variant, arch);
    if (variant != VARIANT_REGISTERS && smem_p_fits(s->D, dev->smem_per_block, arch, dq)) {
        const smem_p_config c = s->D == 64 ? smem_p_tiles<64>() : smem_p_tiles<128>();
        const smem_kernel_fn sk = s->D == 64 ? smem_p_kernel<64>(dq) : smem_p_kernel<128>(dq);
        CUtensorMap dq_map;
        memset(&dq_map, 0, sizeof dq_map);  // unread but by the DQ_BULK kernels
        if (dq == DQ_BY_BULK) ATTN_TRY(dq_tensor_map(&dq_map, p.dQ_acc, s, c.QROWS));
        ATTN_TRY(launch(sk, dim3((unsigned)ceil_div(s->N, c.KEYS), (unsigned)BH),
                        SMEM_P_WARPS * WARP_SIZE, smem_p_bytes(c, s->D, dq == DQ_BY_BULK), stream,
                        p, dq_map));
    } else {
        const tile_config mc = tiles_at(s->D, true, mi);
        const kernel_fn mk =
            s->D == 64 ? kernel_for<64, true>(mi, atomic) : kernel_for<128, true>(mi, atomic);
        ATTN_TRY(launch(mk, dim3((unsigned)ceil_div(s->N, tile_rows(mc)), (unsigned)BH),
                        mc.WARPS * WARP_SIZE, main_smem_bytes(mc, s->D), stream, p));
    }
    if (atomic) {
        const size_t count4 = elems / 4;
        dq_convert_kernel<<<(unsigned)((count4 + CONVERT_THREADS - 1) / CONVERT_THREADS),
                            CONVERT_THREADS, 0, stream>>>(p, count4);
        ATTN_TRY(cudaGetLastError());
    } else {
        const tile_config dc = tiles_at(s->D, false, di);
        const kernel_fn dk =
            s->D == 64 ? kernel_for<64, false>(di, false) : kernel_for<128, false>(di, false);
        ATTN_TRY(launch(dk, dim3((unsigned)ceil_div(s->N, tile_rows(dc)), (unsigned)BH),
                        dc.WARPS * WARP_SIZE, dq_smem_bytes(dc, s->D), stream, p));
    }
    return cudaSuccess;
}

static const char *stage_unsupported(const attn_shape *s, const attn_device *dev, int variant) {
    if (variant < 0 || variant >= VARIANTS) return "unknown variant";
    const char *why = attn_forward_stage.unsupported(s, dev, VARIANT_DEFAULT);
    if (why) return why;
    int arch = 0;
    if (kernel_arch(&arch) != cudaSuccess) {
        (void)cudaGetLastError();
        return "no kernel image for this device";
    }
    if (choose_tiles(s->D, dev->smem_per_block, arch, true) < 0 ||
        choose_tiles(s->D, dev->smem_per_block, arch, false) < 0)
        return "the backward needs 64 KB (D = 128) or 40.5 KB (D = 64) of shared memory per block";
    return NULL;
}

static size_t stage_workspace_bytes(const attn_shape *s, const attn_device *dev, int variant) {
    (void)variant;
    return attn_forward_stage.workspace_bytes(s, dev, VARIANT_DEFAULT);
}

// The forward pass: stage 5's default, whatever this stage's variant.
static cudaError_t stage_forward(const attn_shape *s, const attn_device *dev, const void *Q,
                                 const void *K, const void *V, void *O, float *lse, void *workspace,
                                 int variant, cudaStream_t stream) {
    (void)variant;
    return attn_forward_stage.forward(s, dev, Q, K, V, O, lse, workspace, VARIANT_DEFAULT, stream);
}

extern "C" const attn_stage attn_this_stage = {
    "stage7_backward",
    "FA2's backward: D = rowsum(dO * O), S and P recomputed from Q, K and LSE, dK/dV in registers "
    "per K/V tile, dQ by fp32 atomics (or a second pass: deterministic); forward = stage 5's",
    ATTN_F16,
    "default,deterministic,registers,atomics",
    stage_unsupported,
    stage_workspace_bytes,
    stage_forward,
    backward_workspace_bytes,
    backward,
};
