/*
 * stage7_backward/smem.cuh: shared-memory tiles: the swizzle (stage 5's), the ldmatrix lane
 * addresses into it, and the cp.async copies of a [rows, D] tile, of a row vector, and of the main
 * kernels' loop tile (Q_i, dO_i, LSE_i, D_i).
 */
#pragma once

#include "config.cuh"
#include "device/sm80.cuh"

// Chunk c of row r of a [rows, COLS] half tile is stored at chunk c ^ (r % 8): conflict-free
// ldmatrix and 16-byte stores (stage 5's swizzle). A row of fewer than 8 chunks (the 32-column dS
// tile of the SMALL configuration) XORs with r % (its chunks): a 2-way conflict there.
template <int COLS>
__host__ __device__ constexpr int swizzle_rows() {
    return COLS / CHUNK_HALVES < MATRIX_ROWS ? COLS / CHUNK_HALVES : MATRIX_ROWS;
}

template <int COLS>
__device__ __forceinline__ uint32_t smem_offset(int row, int chunk) {
    return (uint32_t)(row * (COLS * HALF_BYTES) +
                      (chunk ^ (row % swizzle_rows<COLS>())) * CHUNK_BYTES);
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
