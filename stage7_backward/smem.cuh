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
// tile of the SMALL configuration) XORs with r % (its chunks): a 2-way conflict there. A row of 12
// chunks (D = 96): c ^ (r % 8) would leave the row (chunks 8 .. 11 to 15); rows r and r + 1 start
// 12 chunks apart, half of the 8 16-byte bank groups, so 8 rows' chunk c lands on the group
// 4 (r % 2) + (c ^ (r / 2) % 4) (mod 8): every group once. The XOR with (r / 2) % 4 < 4 keeps a
// chunk within its aligned 4, inside the row, and commutes with the k16 steps' XOR (k * X4_BYTES).
constexpr int SWIZZLE_ROW_PAIR = 2;  // 12-chunk rows: rows r and r + 1 share (r / 2) % 4
template <int COLS>
__host__ __device__ constexpr int swizzle_rows() {
    return COLS / CHUNK_HALVES < MATRIX_ROWS ? COLS / CHUNK_HALVES : MATRIX_ROWS;
}

template <int COLS>
__device__ __forceinline__ uint32_t smem_offset(int row, int chunk) {
    constexpr int CHUNKS = COLS / CHUNK_HALVES;
    if constexpr (CHUNKS > MATRIX_ROWS && CHUNKS % MATRIX_ROWS != 0) {
        static_assert(CHUNKS % (MATRIX_ROWS / SWIZZLE_ROW_PAIR) == 0, "whole groups of 4 chunks");
        return (uint32_t)(row * (COLS * HALF_BYTES) +
                          (chunk ^ (row / SWIZZLE_ROW_PAIR % (MATRIX_ROWS / SWIZZLE_ROW_PAIR))) *
                              CHUNK_BYTES);
    } else {
        return (uint32_t)(row * (COLS * HALF_BYTES) +
                          (chunk ^ (row % swizzle_rows<COLS>())) * CHUNK_BYTES);
    }
}

// A lane offset into a swizzled [*, COLS] tile moved x bytes within its row (x: whole chunk
// pairs, the k16 steps' k * X4_BYTES or an n8 pair's chunk): the chunk's XOR, which the swizzle
// commutes with. A row of 64, 128 or 256 halves is a power of two bytes, its start in bits above
// the chunk's, so the whole offset takes the XOR (stage 5's). A 12-chunk row (D = 96) starts at a
// multiple of 192 bytes, whose bits 6 and 7 the XOR would flip (row 1's chunk 4 read as row 0's
// chunk 8): the row's start is kept aside and only the offset within the row takes the XOR.
template <int COLS>
__device__ __forceinline__ uint32_t lane_xor(uint32_t lane_off, uint32_t x) {
    constexpr uint32_t ROW_BYTES = COLS * HALF_BYTES;
    if constexpr ((ROW_BYTES & (ROW_BYTES - 1)) == 0) {
        return lane_off ^ x;
    } else {
        const uint32_t in_row = lane_off % ROW_BYTES;
        return lane_off - in_row + (in_row ^ x);
    }
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
// chunk (l / 8) % 2. lane_xor with k * X4_BYTES then moves to the k-th 16-column block (the
// swizzle commutes with it), adding r * 8 * ROW_BYTES moves 8 r rows down.
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

// Start copying rows [0, ROWS) of a [rows, D] tile (row stride ld elements) into a swizzled
// shared tile; rows >= rows_left and the chunks at columns >= cols (a head dim run in the next
// compiled D: bwd_params.D) become zeros. Thread tid moves the chunks (row0 + i STEP, chunk0 +
// j ROW_THREADS), i = 0, 1, ..., j < COL_REPS: consecutive threads read consecutive 16 bytes, and
// STEP rows is a multiple of 8, so every chunk of a thread has the same swizzle, i STEP rows after
// the first (and j ROW_THREADS chunks, a multiple of 8, to the right). A row's chunks take
// ROW_THREADS threads, COL_REPS chunks each (D = 256 with 128 threads: 16 threads x 2); a pass
// covers STEP rows, whole swizzle periods (D = 96: 12 chunks a row, so 96 of 128 threads copy 8
// rows a pass, 192 of 256 16). WHOLE_UNROLLED: a whole tile of contiguous rows (ld = D, the
// [B, H, N, D] layout; every tile but a sequence's last) is copied unrolled, every chunk a
// compile-time offset from the thread's first. Else, sm_80 on: one address walked down the
// thread's rows in a loop, not one per chunk (the rows are a runtime stride apart: unrolled, each
// chunk would hold a 64-bit address of its own, beside dK and dV's accumulators). One commit
// group per call.
template <int ROWS, int D, int THREADS, bool WHOLE_UNROLLED = true>
__device__ __forceinline__ void tile_issue(uint32_t tile, const __half *src, unsigned ld,
                                           int rows_left, int cols = D) {
    constexpr int CHUNKS_PER_ROW = D / CHUNK_HALVES;
    constexpr int COL_REPS = CHUNKS_PER_ROW * MATRIX_ROWS > THREADS
                                 ? CHUNKS_PER_ROW * MATRIX_ROWS / THREADS
                                 : 1;  // a thread's chunks of a row
    constexpr int ROW_THREADS = CHUNKS_PER_ROW / COL_REPS;
    constexpr int STEP = THREADS / ROW_THREADS / MATRIX_ROWS *
                         MATRIX_ROWS;           // rows from one of a thread's chunks to the next
    constexpr int ACTIVE = STEP * ROW_THREADS;  // the threads that copy
    constexpr uint32_t STEP_BYTES = STEP * D * HALF_BYTES;
    constexpr int REP_CHUNKS = ROW_THREADS;  // chunks from one of a thread's columns to the next
    static_assert(
        CHUNKS_PER_ROW % COL_REPS == 0 && (COL_REPS == 1 || REP_CHUNKS % MATRIX_ROWS == 0),
        "a row's chunks split over its threads, one swizzle a thread");
    static_assert(STEP > 0 && ROWS % STEP == 0,
                  "tile split over the threads, one swizzle a thread");
    if (ACTIVE < THREADS && (int)threadIdx.x >= ACTIVE) return;
    const int row0 = (int)threadIdx.x / ROW_THREADS, chunk0 = (int)threadIdx.x % ROW_THREADS;
    const uint32_t to = tile + smem_offset<D>(row0, chunk0);
    const __half *from = src + rows_offset(row0, ld) + chunk0 * CHUNK_HALVES;
    if (WHOLE_UNROLLED && ld == D && rows_left >= ROWS && cols >= D) {  // the same for the block
#pragma unroll
        for (int i = 0; i < ROWS / STEP; ++i) {
#pragma unroll
            for (int j = 0; j < COL_REPS; ++j) {
                copy_chunk(to + i * STEP_BYTES + j * REP_CHUNKS * CHUNK_BYTES,
                           from + i * STEP * D + j * REP_CHUNKS * CHUNK_HALVES, true);
            }
        }
        return;
    }
    const size_t step = (size_t)STEP * ld;  // elements from one of this thread's rows to the next
    if constexpr (COL_REPS == 1) {
        const bool col_valid = cols >= D || chunk0 * CHUNK_HALVES < cols;  // (the same every row)
#if __CUDA_ARCH__ >= 800
#pragma unroll 1
#else
#pragma unroll
#endif
        for (int i = 0; i < ROWS / STEP; ++i, from += step) {
            const bool valid = row0 + i * STEP < rows_left && col_valid;
            // rows past the end, columns past cols: zero-filled, their source address replaced by
            // the tile's first chunk (inside)
            copy_chunk(to + i * STEP_BYTES, valid ? from : src, valid);
        }
    } else {
#if __CUDA_ARCH__ >= 800
#pragma unroll 1
#else
#pragma unroll
#endif
        for (int i = 0; i < ROWS / STEP; ++i, from += step) {
#pragma unroll
            for (int j = 0; j < COL_REPS; ++j) {
                const bool valid =
                    row0 + i * STEP < rows_left && (chunk0 + j * REP_CHUNKS) * CHUNK_HALVES < cols;
                copy_chunk(to + i * STEP_BYTES + j * REP_CHUNKS * CHUNK_BYTES,
                           valid ? from + j * REP_CHUNKS * CHUNK_HALVES : src, valid);
            }
        }
    }
}

// Start copying ROWS floats (a padded row vector: always in bounds) into shared memory: one
// 16-byte chunk for each of the block's first threads.
template <int ROWS, int THREADS>
__device__ __forceinline__ void vector_issue(uint32_t dst, const float *src) {
    constexpr int CHUNKS = ROWS * (int)sizeof(float) / CHUNK_BYTES;
    static_assert(CHUNKS <= THREADS, "one chunk a thread at most");
    const int c = (int)threadIdx.x;
    if (c < CHUNKS)
        copy_chunk(dst + c * CHUNK_BYTES, src + c * (CHUNK_BYTES / sizeof(float)), true);
}

// The query tile after (hq, q0) in a main kernel's loop: the next rows of query head hq (up to
// q_end: N, or a window's end), or the first tile (q0 = q_begin) of the next head (GQA: the next
// of the key/value head's group).
template <int QROWS>
__device__ __forceinline__ void next_query_tile(int &hq, int &q0, int q_begin, int q_end) {
    q0 += QROWS;
    if (q0 >= q_end) q0 = q_begin, ++hq;
}

// A split walk (launch.cuh: every walk's, the grid's z; or a tail split's): the block's share
// (place_of_block) of its key tile's query tiles q_begin .. q_end (QROWS rows each;
// common/device/backward_prepost.cuh's share_of_tiles), walked for every head of the group as a
// whole walk is. An empty share ends at or before its first row (its loop runs no step).
template <int QROWS>
__device__ __forceinline__ void walk_share(int &q_begin, int &q_end, const block_place &place) {
    if (place.shares == 1) return;
    int count = max((q_end - q_begin + QROWS - 1) / QROWS, 0), first = 0;
    share_of_tiles(&count, &first, place.shares, place.share);
    q_begin += first * QROWS;
    q_end = min(q_end, q_begin + count * QROWS);
}

/* ---- local windows (MODEL kernels): which query tiles a key tile has, which elements -----------
 */

// The inverse of split_kv.cuh's rule (query_tile_first_key_tile, query_tile_key_end: the key tiles
// a query tile sees): the rows that see some key of k0 .. k0 + KEYS - 1. Row i sits on key
// i + N_k - N (its diagonal) and sees `left` keys before it and `right` after it (-1: every one;
// causal: right = 0), so the first row to see the tile's first key has its diagonal `right` keys
// before it, and the last to see its last key (N_k - 1 at most) `left` keys after it. The first
// row is rounded down to a whole query tile (LSE_i and D_i are read a tile at a time from their
// padded rows); the end is exclusive, 0 .. N (at or before the first: no row sees the tile).
template <int QROWS>
__device__ __forceinline__ int key_tile_first_query(const key_rule &r, int k0) {
    return r.right < 0 ? 0 : max(0, k0 - r.right - (r.N_k - r.N)) / QROWS * QROWS;
}
__device__ __forceinline__ int key_tile_query_end(const key_rule &r, int k0, int keys) {
    if (r.left < 0) return r.N;
    const long long last_key = min(k0 + keys, r.N_k) - 1;
    const long long end = last_key + r.left - (r.N_k - r.N) + 1;  // past the last row that sees it
    return (int)max(0ll, min(end, (long long)r.N));
}

// Whether some pair of queries qk0 .. qk0 + qrows - 1 (as key indices: their diagonals) and keys
// k0 .. k0 + keys - 1 lies outside the rule, or a key past N_k: the tile then tests each element
// (key_masked); the tiles inside every row's window test none.
__device__ __forceinline__ bool tile_needs_mask(const key_rule &r, int k0, int keys, int qk0,
                                                int qrows) {
    return k0 + keys > r.N_k || (r.right >= 0 && k0 + keys - 1 - qk0 > r.right) ||
           (r.left >= 0 && qk0 + qrows - 1 - k0 > r.left);
}

// Whether the query whose diagonal is key `diagonal` does not see key `key` (past N_k: none does):
// attention.h's attn_key_range, element by element.
__device__ __forceinline__ bool key_masked(const key_rule &r, int key, int diagonal) {
    return key >= r.N_k || (r.right >= 0 && key - diagonal > r.right) ||
           (r.left >= 0 && diagonal - key > r.left);
}

// The sequence a block of a MODEL kernel works on (packed or not: bwd_sequence_of reads
// cu_seqlens); the plain kernels read none: their rows are the unpacked batch's, from bwd_params.
template <bool MODEL>
__device__ __forceinline__ bwd_sequence kernel_sequence(const bwd_params &p, int b) {
    if constexpr (MODEL) {
        return bwd_sequence_of(p, b);
    } else {
        (void)p, (void)b;
        return bwd_sequence{};
    }
}

// The queries, keys and N_k - N a kernel's rows are bounded by: MODEL, its sequence's (s); the
// plain kernels', the shape's, read from bwd_params where they are used.
template <bool MODEL>
__device__ __forceinline__ int queries_of(const bwd_params &p, const bwd_sequence &s) {
    return MODEL ? s.seq.N : p.N;
}
template <bool MODEL>
__device__ __forceinline__ int keys_of(const bwd_params &p, const bwd_sequence &s) {
    return MODEL ? s.seq.N_k : p.N_k;
}
template <bool MODEL>
__device__ __forceinline__ int key_shift_of(const bwd_params &p, const bwd_sequence &s) {
    return MODEL ? s.seq.N_k - s.seq.N : p.key_shift;
}

// The block's key tile: K_j and V_j ([ROWS, D], keys k0 .. of key/value head hk of batch b; keys
// past the sequence's and columns past cols as zeros) into K_smem and V_smem. MODEL: of sequence
// s (packed: its keys from row s.seq.k_row). One commit group.
template <int D, int ROWS, int THREADS, bool MODEL = false>
__device__ __forceinline__ void issue_key_tile(const bwd_params &p, const bwd_sequence &s,
                                               uint32_t K_smem, uint32_t V_smem, int b, int hk,
                                               int k0, int cols = D) {
    const int row = MODEL ? (int)s.seq.k_row + k0 : k0;  // the tile's first row in K's, V's layouts
    tile_issue<ROWS, D, THREADS>(
        K_smem, p.K + head_offset(p.layout.k, b, hk) + rows_offset(row, p.layout.k.row),
        p.layout.k.row, keys_of<MODEL>(p, s) - k0, cols);
    tile_issue<ROWS, D, THREADS>(
        V_smem, p.V + head_offset(p.layout.v, b, hk) + rows_offset(row, p.layout.v.row),
        p.layout.v.row, keys_of<MODEL>(p, s) - k0, cols);
    cp_async_commit();
}

// The main kernel's loop tile: Q_i and dO_i ([ROWS, D]) and LSE_i, D_i ([ROWS] floats) of query
// tile q0 of query head h of batch b (rows past the sequence's end and columns past cols as
// zeros), copied into buffer `at`. MODEL: of sequence s (packed or not): its rows in Q and dO from
// s.seq.q_row, its lse2 and Dsum rows from s.row_pad. One commit group.
template <int D, int ROWS, int THREADS, bool WHOLE_UNROLLED = true, bool MODEL = false>
__device__ __forceinline__ void issue_query_tile(const bwd_params &p, const bwd_sequence &s,
                                                 uint32_t Q_tile, uint32_t dO_tile,
                                                 uint32_t vec_tile, int b, int h, int q0,
                                                 int cols = D) {
    const size_t vec = MODEL ? (size_t)(s.row_pad + h * s.head_pad + q0)
                             : (size_t)(b * p.H + h) * p.N_pad + q0;  // its rows of lse2 and Dsum
    const int row = MODEL ? (int)s.seq.q_row + q0 : q0;  // its first row in Q's and dO's layouts
    vector_issue<ROWS, THREADS>(vec_tile, p.lse2 + vec);
    vector_issue<ROWS, THREADS>(vec_tile + ROWS * sizeof(float), p.Dsum + vec);
    tile_issue<ROWS, D, THREADS, WHOLE_UNROLLED>(
        Q_tile, p.Q + head_offset(p.layout.q, b, h) + rows_offset(row, p.layout.q.row),
        p.layout.q.row, queries_of<MODEL>(p, s) - q0, cols);
    tile_issue<ROWS, D, THREADS, WHOLE_UNROLLED>(
        dO_tile, p.dO + head_offset(p.layout.dO, b, h) + rows_offset(row, p.layout.dO.row),
        p.layout.dO.row, queries_of<MODEL>(p, s) - q0, cols);
    cp_async_commit();
}
