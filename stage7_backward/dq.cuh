/*
 * stage7_backward/dq.cuh: dQ, which every key tile adds to: fp32 atomics into dQ_acc (add_pair),
 * or from sm_90 on the TMA unit's bulk tensor reductions of a staging tile (stage_dq_fragments,
 * add_staged_dq_tile; dq_tensor_map, the host's description of dQ_acc for it, is
 * common/device/backward_prepost.cuh's).
 */
#pragma once

#include "config.cuh"
#include "device/sm90.cuh"

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

// DQ_BY_BULK: the warp's fp32 fragments (MT m16 blocks of rows from row0, NT n8 blocks of columns
// from col0, col0 a multiple of DQ_SLAB_COLS) into the dQ staging tile's slabs, made visible to
// the bulk reduction (add_staged_dq_tile, after the next barrier).
template <int QROWS, int MT, int NT>
__device__ __forceinline__ void stage_dq_fragments(uint32_t dq_stage, const float (&C)[MT][NT][4],
                                                   int row0, int col0) {
    constexpr int SLAB_BYTES = QROWS * DQ_SLAB_ROW_BYTES, FLOAT_BYTES = sizeof(float);
    static_assert(MMA_N == DQ_SLAB_COLS, "an n8 block of columns is one slab");
    const int g = lane_index() / QUAD, t = lane_index() % QUAD;
    const uint32_t at = dq_stage + col0 / DQ_SLAB_COLS * SLAB_BYTES +
                        (row0 + g) * DQ_SLAB_ROW_BYTES + FRAG_LANE_COLS * t * FLOAT_BYTES;
#pragma unroll
    for (int m = 0; m < MT; ++m) {
#pragma unroll
        for (int h = 0; h < FRAG_LANE_ROWS; ++h) {
#pragma unroll
            for (int n = 0; n < NT; ++n) {
                st_shared_f2(
                    at + n * SLAB_BYTES + (MMA_M * m + FRAG_ROW_STEP * h) * DQ_SLAB_ROW_BYTES,
                    C[m][n][frag_reg(h, 0)], C[m][n][frag_reg(h, 1)]);
            }
        }
    }
    fence_proxy_async();
}

// DQ_BY_BULK: the tensor-map coordinates {row, (batch, head) or head} of row q0 of query head h
// in dQ_acc: the plain kernels' [B * H, N, D], or (MODEL) sequence s's rows (bwd_sequence_of,
// dq_map_coords: packed, its rows of [H, acc_rows, D]).
template <bool MODEL>
__device__ __forceinline__ int2 dq_tile_coords(const bwd_params &p, const bwd_sequence &s, int b,
                                               int h, int q0) {
    if constexpr (MODEL) {
        return dq_map_coords(p, s, b, h, q0);
    } else {
        (void)s;
        return make_int2(q0, b * p.H + h);
    }
}

// DQ_BY_BULK: after a barrier that follows every warp's stage_dq_fragments, thread 0 hands the
// staging tile to one bulk tensor reduction into the QROWS rows of dQ_acc from `at`
// (dq_tile_coords; rows past the map's skipped by the TMA unit: unpacked, past N; packed, the rows
// past the sequence's end are its own padding, never read, so its box never reaches the next
// sequence's rows).
__device__ __forceinline__ void add_staged_dq_tile(const CUtensorMap *dq_map, uint32_t dq_stage,
                                                   int2 at) {
    if (threadIdx.x != 0) return;
    tma_reduce_add_4d(dq_map, dq_stage, 0, at.x, 0, at.y);
    bulk_commit();
}
