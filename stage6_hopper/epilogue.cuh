/*
 * stage6_hopper/epilogue.cuh: the end of a work tile: O = O_acc / l and the LSE of a consumer's
 * rows, to O through shared memory and TMA stores (store_o_staged), straight from the registers
 * (store_o_direct), or, split-KV, the key range's fp32 partial results (store_o_partial).
 */
#pragma once

#include "device/sm80.cuh"  // ld_shared_v4
#include "schedule.cuh"
#include "smem.cuh"

// The end of work tile wt's rows (those past it are not written): N, or (MODEL) its sequence's
// end, a row of Q and O (work_at: packed, the next sequence's rows follow).
template <bool MODEL>
__device__ __forceinline__ int rows_end(const work_tile &wt, const problem &pb) {
    if constexpr (MODEL)
        return wt.q_end;
    else
        return pb.N;
}

// Row `row` of work tile wt in the LSE: [B, H, N] (split: a range's slice of lse_part), or packed
// [H, total_q], row q of Q (a packed row) of head h at h total_q + q.
template <bool MODEL>
__device__ __forceinline__ size_t lse_index(const work_tile &wt, const problem &pb, int row) {
    if constexpr (MODEL) {
        if (is_packed(pb)) return (size_t)heads_of<MODEL>(wt.bh, pb).head * pb.varlen.total_q + row;
        return (size_t)wt.bh * pb.N + row;
    } else {
        return (size_t)wt.bh * pb.N + row;
    }
}

// The sum of a row's l over the 4 lanes of its quad.
__device__ __forceinline__ float quad_sum(float x) {
#pragma unroll
    for (int lanes = 1; lanes < QUAD; lanes *= 2) x += __shfl_xor_sync(FULL_WARP, x, lanes);
    return x;
}

// The four lanes of a quad hold one row: lane t has columns 8i + 2t, +1 of every 8-column chunk
// i. A 4 x 4 exchange inside the quad (two butterfly steps of two shuffles) turns that around
// for chunks 4k .. 4k + 3: afterwards lane t holds all 8 columns of chunk 4k + t, v[r] being
// the pair that lane r had.
__device__ __forceinline__ void quad_transpose(uint32_t (&v)[QUAD], int t) {
#pragma unroll
    for (int b = 1; b < QUAD; b <<= 1) {
#pragma unroll
        for (int r = 0; r < QUAD; ++r) {
            if (r & b) continue;
            const bool upper = t & b;
            const uint32_t got = __shfl_xor_sync(FULL_WARP, upper ? v[r] : v[r | b], b);
            if (upper)
                v[r] = got;
            else
                v[r | b] = got;
        }
    }
}

// O straight from the registers to global memory (where shared memory has no room to stage it),
// in O's layout (its strides; the plain kernels': [B, H, N, D] contiguous), the rows before the
// end (rows_end: N, or a packed sequence's). After quad_transpose each lane writes 16 contiguous
// bytes (one chunk), and a warp's store covers 8 rows x 64 bytes: D / 32 stores per row and
// thread.
template <int D, bool BF16, bool MODEL>
__device__ __forceinline__ void store_o_direct(const float (&O_acc)[D / 2], const float (&inv_l)[2],
                                               const consumer_place &p, const work_tile &wt,
                                               const problem &pb) {
    // Each chunk one 16-byte store: st_global_v4 (warp.cuh) where the address comes from strides
    // (MODEL), which the compiler could split, and at D = 64; the plain D = 128 kernels store
    // through a uint4 pointer. The two are the same instruction, scheduled differently around
    // the main loop (LOG.md, step 23).
    constexpr bool STORE_V4 = MODEL || D == 64;
    const tile_heads hd = heads_of<MODEL>(wt.bh, pb);
    __half *const O_head = pb.O + hd.batch * pb.o_batch + hd.head * pb.o_head;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int row = row_of(wt, p) + FRAG_ROW_STEP * h;
        __half *o_row =
            MODEL ? O_head + (long long)row * pb.o_row : pb.O + ((size_t)wt.bh * pb.N + row) * D;
#pragma unroll
        for (int k = 0; k < D / (QUAD * FRAG_COLS); ++k) {
            uint32_t v[QUAD];  // chunks QUAD k .. QUAD k + 3 of the row
#pragma unroll
            for (int r = 0; r < QUAD; ++r)
                v[r] = pack2_of<BF16>(O_acc[acc_index(QUAD * k + r, h, 0)] * inv_l[h],
                                      O_acc[acc_index(QUAD * k + r, h, 1)] * inv_l[h]);
            quad_transpose(v, p.t);  // (every lane takes part, rows past N too)
            // (MODEL: the chunks inside the shape's D, o_cols; the columns past it are zeros)
            if (row < rows_end<MODEL>(wt, pb) &&
                (!MODEL || FRAG_COLS * (QUAD * k + p.t) < pb.o_cols)) {
                if constexpr (STORE_V4)
                    st_global_v4(o_row + FRAG_COLS * (QUAD * k + p.t),
                                 make_uint4(v[0], v[1], v[2], v[3]));
                else
                    *reinterpret_cast<uint4 *>(o_row + FRAG_COLS * (QUAD * k + p.t)) =
                        make_uint4(v[0], v[1], v[2], v[3]);
            }
        }
    }
}

// (MODEL) A packed sequence's warp whose rows cross the sequence's end: its lanes copy the rows
// before the end from the warp's block of the staging tile to O, one 16-byte chunk at a time (the
// swizzle undone), the chunks inside the shape's D (o_cols). A loop, not unrolled: it runs once per
// sequence end and warpgroup, and the kernels keep one copy of it per epilogue. The warp's next
// epilogue writes the block after a __syncwarp, when these loads are done.
template <int D, bool MODEL>
__device__ __forceinline__ void store_o_rows(uint32_t stage, const consumer_place &p,
                                             const work_tile &wt, const problem &pb) {
    constexpr int ROW_CHUNKS = D / CHUNK_HALVES;
    const int row0 = warpgroup_row0(wt, p) + warp_row0(p);  // the warp's first row, a row of O
    const int chunks = max(0, min(WARP_ROWS, wt.q_end - row0)) * ROW_CHUNKS;
    const tile_heads hd = heads_of<MODEL>(wt.bh, pb);
    __half *const O_head = pb.O + hd.batch * pb.o_batch + hd.head * pb.o_head;
#pragma unroll 1
    for (int i = p.lane; i < chunks; i += WARP_SIZE) {
        const int r = i / ROW_CHUNKS, c = i - r * ROW_CHUNKS;  // row r of the warp's, chunk c
        if (CHUNK_HALVES * c < pb.o_cols)
            st_global_v4(O_head + (long long)(row0 + r) * pb.o_row + CHUNK_HALVES * c,
                         ld_shared_v4(stage + swizzled_chunk_offset<WGMMA_M>(warp_row0(p) + r, c)));
    }
}

// O through shared memory (o_staged()), one warp at a time: stmatrix writes the warp's 16 x D
// block of O into its part of the warpgroup's staging tile, in the 128-byte swizzle the TMA
// reads, four 8 x 8 matrices per instruction straight from the accumulator layout (D / 16 a
// thread: no shuffles, no global stores); then lane 0 stores the block with D / 64 TMA copies,
// which leave out the rows past N. The warp does not wait for them: its next epilogue, a work
// tile later, first makes sure they have read the block. No barrier across warps. The copies clip
// to the tensor's D: at D = 96 the second slab's last 32 columns, never written, are not stored,
// nor are the zero columns of a D masked in a larger kernel. They clip to the tensor's rows too,
// not to a packed sequence's: a warp whose rows cross its sequence's end copies the rows before
// it itself (store_o_rows; past it lies the next sequence's O, another block's).
template <int D, bool BF16, bool MODEL>
__device__ __forceinline__ void store_o_staged(const float (&O_acc)[D / 2], const float (&inv_l)[2],
                                               const consumer_place &p, const work_tile &wt,
                                               const problem &pb, uint32_t stage) {
    if (p.lane == 0) bulk_wait<true>();
    __syncwarp();  // the warp's last store has read its rows of the staging tile
    // stmatrix k covers chunks (8 columns) 2k and 2k + 1 of the warp's 16 rows: matrix 0 is rows
    // 0-7 of chunk 2k, 1 rows 8-15 of it, 2 and 3 the same of chunk 2k + 1. Lane L addresses row
    // L % 8 of matrix L / 8; in the swizzle the 16-byte chunk c of a row r sits at c ^ (r % 8).
    const int row =
        warp_row0(p) + STMATRIX_ROWS * (p.lane / STMATRIX_ROWS % 2) + p.lane % STMATRIX_ROWS;
    const int second = p.lane / (2 * STMATRIX_ROWS);  // this lane's matrix is of chunk 2k + 1
#pragma unroll
    for (int k = 0; k < D / (2 * FRAG_COLS); ++k) {
        const int chunk = 2 * k + second;
        const uint32_t addr = stage + swizzled_chunk_offset<WGMMA_M>(row, chunk);
        const float *o = &O_acc[8 * k];  // chunk 2k: o[0..3], chunk 2k + 1: o[4..7]
        stmatrix_x4(addr, pack2_of<BF16>(o[0] * inv_l[0], o[1] * inv_l[0]),
                    pack2_of<BF16>(o[2] * inv_l[1], o[3] * inv_l[1]),
                    pack2_of<BF16>(o[4] * inv_l[0], o[5] * inv_l[0]),
                    pack2_of<BF16>(o[6] * inv_l[1], o[7] * inv_l[1]));
    }
    fence_proxy_async();  // each lane's stmatrix writes are visible to the copy engine
    __syncwarp();         // the warp's block is written
    if constexpr (MODEL) {
        if (is_packed(pb) && warpgroup_row0(wt, p) + warp_row0(p) + WARP_ROWS > wt.q_end) {
            store_o_rows<D, MODEL>(stage, p, wt, pb);  // (the warp's rows: one branch for all)
            return;
        }
    }
    if (p.lane == 0) {
        const tile_heads hd = heads_of<MODEL>(wt.bh, pb);
#pragma unroll
        for (int c = 0; c < slabs<D>(); ++c)
            tma_store_4d(pb.tmO, stage + slab_offset<WGMMA_M>(c) + warp_row0(p) * SLAB_ROW_BYTES,
                         c * SLAB_COLS, warpgroup_row0(wt, p) + warp_row0(p), hd.head, hd.batch);
        bulk_commit();
    }
}

// Split-KV: O of one key range, normalised by the range's own l, in fp32 to its slice of O_part
// for combine_kernel; each lane's two columns of a chunk as one 8-byte store.
template <int D>
__device__ __forceinline__ void store_o_partial(const float (&O_acc)[D / 2],
                                                const float (&inv_l)[2], const consumer_place &p,
                                                const work_tile &wt, const problem &pb) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int row = row_of(wt, p) + FRAG_ROW_STEP * h;
        if (row >= pb.N) continue;
        float *o_row =
            pb.O_part + ((size_t)wt.split * pb.rows + (size_t)wt.bh * pb.N + row) * D + 2 * p.t;
#pragma unroll
        for (int i = 0; i < D / FRAG_COLS; ++i)
            *reinterpret_cast<float2 *>(o_row + FRAG_COLS * i) = make_float2(
                O_acc[acc_index(i, h, 0)] * inv_l[h], O_acc[acc_index(i, h, 1)] * inv_l[h]);
    }
}

// The end of a work tile: O = O_acc / l (fp16) and LSE = (m + log2 l) ln 2 for the thread's two
// rows (those inside N; MODEL: before the sequence's end, wt.q_end), LSE [B, H, N] (packed:
// [H, total_q], row q of Q of head h at h total_q + q); with split-KV, the key range's O (fp32)
// and LSE into the workspace. l >= 1 for a row with any key (its max contributes 2^0), so the
// fast reciprocal and logarithm (MUFU.RCP, MUFU.LG2) are accurate here; a row with no key in its
// range (causal, split) has l = 0 and m = -inf: O = 0 and LSE = -inf, which the merge weighs 0.
// In two parts: finish_rows (the LSE, and 1 / l for O) and store_o; the MODEL kernels' overlapped
// schedule takes the first as the rows end (end_rows), before their last P V is done.
template <bool MODEL>
__device__ __forceinline__ void finish_rows(const float (&m_i)[2], const float (&l_i)[2],
                                            const consumer_place &p, const work_tile &wt,
                                            const problem &pb, float (&inv_l)[2]) {
    const bool split = pb.splits > 1;
    float *const lse = split ? pb.lse_part + (size_t)wt.split * pb.rows : pb.lse;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const float l = quad_sum(l_i[h]);
        inv_l[h] = l > 0.f ? __fdividef(1.f, l) : 0.f;
        const int row = row_of(wt, p) + FRAG_ROW_STEP * h;
        // m_i is in raw-score units: scale, then natural log.
        if (p.t == 0 && row < rows_end<MODEL>(wt, pb))
            lse[lse_index<MODEL>(wt, pb, row)] = (m_i[h] * pb.scale_log2 + __log2f(l)) * LN2;
    }
}

template <int D, int C, int BC, bool BF16, bool MODEL>
__device__ __forceinline__ void store_o(const float (&O_acc)[D / 2], const float (&inv_l)[2],
                                        const consumer_place &p, const smem_tiles &sm,
                                        const work_tile &wt, const problem &pb) {
    if (pb.splits > 1)
        store_o_partial<D>(O_acc, inv_l, p, wt, pb);
    else if constexpr (o_staged<D, C, BC>())
        store_o_staged<D, BF16, MODEL>(O_acc, inv_l, p, wt, pb, sm.O + p.wg * o_stage_bytes<D>());
    else
        store_o_direct<D, BF16, MODEL>(O_acc, inv_l, p, wt, pb);
}

template <int D, int C, int BC, bool BF16, bool MODEL>
__device__ __forceinline__ void epilogue(const float (&O_acc)[D / 2], const float (&m_i)[2],
                                         const float (&l_i)[2], const consumer_place &p,
                                         const smem_tiles &sm, const work_tile &wt,
                                         const problem &pb) {
    float inv_l[2];
    finish_rows<MODEL>(m_i, l_i, p, wt, pb, inv_l);
    store_o<D, C, BC, BF16, MODEL>(O_acc, inv_l, p, sm, wt, pb);
}
