/*
 * stage8_hopper_backward/producer.cuh: the load warp of the producer warpgroup: one thread copies
 * the block's K_j and V_j once, then for every query tile of every query head of the group
 * Q_i with LSE_i and dO_i with D_i into the next slot of the ring, as the consumers release it,
 * by TMA (the tiles) and plain bulk copies (the two rows of floats) on mbarriers.
 */
#pragma once

#include "config.cuh"

// Rows row0 .. row0 + ROWS - 1 of head `head` of batch `batch` into dst, one TMA copy per
// 64-column slab, completing on `full` (the caller has announced the bytes there).
template <int D, int ROWS>
__device__ __forceinline__ void copy_tile(uint32_t dst, const CUtensorMap *map, uint32_t full,
                                          int row0, int head, int batch) {
#pragma unroll
    for (int c = 0; c < D / SLAB_COLS; ++c)
        tma_load_4d(dst + slab_offset<ROWS>(c), map, full, c * SLAB_COLS, row0, head, batch);
}

// The one loading thread. K_j, V_j for the whole block on KV_FULL; then per query tile (the
// block's it-th): wait until the consumers have released its slot (Q_EMPTY), then Q_i and LSE_i
// on Q_FULL and dO_i and D_i on DO_FULL, so that S^T = K_j Q_i^T may start before dO_i lands.
// Rows past N (and keys past N_k) arrive as zeros from TMA; lse2 and Dsum are padded to N_pad,
// a multiple of QROWS, so their copies never leave the head's rows.
template <int D>
__device__ __forceinline__ void load_tiles(const smem_tiles &sm, const CUtensorMap *tmQ,
                                           const CUtensorMap *tmK, const CUtensorMap *tmV,
                                           const CUtensorMap *tmdO, const bwd_problem &pb) {
    const int key0 = blockIdx.x * KEYS;
    const int batch = (int)blockIdx.y / pb.H_kv, kv_head = (int)blockIdx.y % pb.H_kv;
    const uint32_t kv_full = bar_at(sm, BAR_KV_FULL);
    mbar_arrive_expect_tx(kv_full, 2 * kv_tile_bytes<D>());
    copy_tile<D, KEYS>(sm.K, tmK, kv_full, key0, kv_head, batch);
    copy_tile<D, KEYS>(sm.V, tmV, kv_full, key0, kv_head, batch);

    int tiles;
    const int first = query_tiles_of(pb, key0, &tiles);
    int it = 0;
    for (int hh = 0; hh < pb.group; ++hh) {
        const int head = kv_head * pb.group + hh;
        const size_t vec = ((size_t)batch * pb.H + head) * pb.N_pad;  // its rows of lse2, Dsum
        for (int qt = first; qt < first + tiles; ++qt, ++it) {
            const int slot = ring_slot(it), q0 = qt * QROWS;
            mbar_wait(bar_at(sm, BAR_Q_EMPTY + slot), ring_phase(it) ^ 1);  // the slot is free
            const uint32_t q_full = bar_at(sm, BAR_Q_FULL + slot);
            mbar_arrive_expect_tx(q_full, q_tile_bytes<D>() + VEC_BYTES);
            copy_tile<D, QROWS>(sm.Q + slot * q_tile_bytes<D>(), tmQ, q_full, q0, head, batch);
            bulk_load(sm.lse + slot * VEC_BYTES, pb.lse2 + vec + q0, VEC_BYTES, q_full);
            const uint32_t do_full = bar_at(sm, BAR_DO_FULL + slot);
            mbar_arrive_expect_tx(do_full, q_tile_bytes<D>() + VEC_BYTES);
            copy_tile<D, QROWS>(sm.dO + slot * q_tile_bytes<D>(), tmdO, do_full, q0, head, batch);
            bulk_load(sm.Dsum + slot * VEC_BYTES, pb.Dsum + vec + q0, VEC_BYTES, do_full);
        }
    }
}
