/*
 * stage8_hopper_backward/epilogue.cuh: the end of a block: dK_j *= scale (S = scale Q K^T: the
 * scale the consumers left out of every step), then dK_j and dV_j, summed over every query tile of
 * every query head of the group in fp32 registers, to global memory in the storage type.
 */
#pragma once

#include "config.cuh"

// One accumulator (a warpgroup's 64 keys x D, the thread's rows key_row and key_row + 8, columns
// 8n + 2t, +1) times `scale`, packed to 16 bits, into rows key_row.. of (batch, kv_head) of a
// [B, H_kv, N_k, D] tensor with strides st; rows past N_k are left alone. One 4-byte store a
// column pair (a TMA store through shared memory is LOG.md's next step for it).
template <int D, bool BF16>
__device__ __forceinline__ void store_rows(const float (&acc)[D / 2], float scale, __half *base,
                                           const tensor_strides &st, int batch, int kv_head,
                                           int key_row, int N_k, int t) {
    __half *const head = base + head_offset(st, batch, kv_head);
#pragma unroll
    for (int h = 0; h < FRAG_LANE_ROWS; ++h) {
        const int row = key_row + FRAG_ROW_STEP * h;
        if (row >= N_k) continue;
        __half *const out = head + rows_offset(row, st.row) + FRAG_LANE_COLS * t;
#pragma unroll
        for (int n = 0; n < D / FRAG_COLS; ++n)
            *reinterpret_cast<uint32_t *>(out + FRAG_COLS * n) =
                pack2_of<BF16>(acc[acc_index(n, h, 0)] * scale, acc[acc_index(n, h, 1)] * scale);
    }
}

// dK_j = scale dK_acc and dV_j = dV_acc, this thread's part (key_row: its first key).
template <int D, bool BF16>
__device__ __forceinline__ void store_dkv(const float (&dK)[D / 2], const float (&dV)[D / 2],
                                          const consumer_place &p, const bwd_problem &pb,
                                          int key_row, int batch, int kv_head) {
    store_rows<D, BF16>(dK, pb.scale, pb.dK, pb.dk, batch, kv_head, key_row, pb.N_k, p.t);
    store_rows<D, BF16>(dV, 1.f, pb.dV, pb.dv, batch, kv_head, key_row, pb.N_k, p.t);
}
