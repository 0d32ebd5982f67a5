/*
 * stage8_hopper_backward/producer.cuh: the load warp of the producer warpgroup: its lane 0 copies
 * the block's K_j and V_j once, then for every query tile of every query head of the group Q_i
 * and dO_i by TMA into the next slot of the ring, as the consumers release it, while the whole
 * warp copies LSE_i and D_i (64 floats each) with ordinary loads and stores, on mbarriers.
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

// The load warp. Lane 0: K_j, V_j for the whole block on KV_FULL. Then per query tile (the
// block's it-th), every lane: wait until the consumers have released its slot (Q_EMPTY); lane 0
// announces the tiles' bytes and starts Q_i on Q_FULL and dO_i on DO_FULL (TMA); each lane stores
// two floats of LSE_i and arrives on Q_FULL, then two of D_i and arrives on DO_FULL, so that
// S^T = K_j Q_i^T may start before dO_i lands. Rows past N (and keys past N_k) arrive as zeros
// from TMA; lse2 and Dsum are padded to N_pad, a multiple of QROWS, so their loads never leave
// the head's rows.
//
// Why the warp, not a bulk copy, moves LSE_i and D_i: the consumers read them with ordinary loads
// (the generic proxy), and a bulk copy writes in the async proxy; writes in one proxy after
// reads in the other need a proxy fence on the reading side, which the PTX memory model asks
// for and compute-sanitizer's racecheck does not see. Ordinary stores keep every access to
// these two rows in one proxy, ordered by the mbarriers alone: each lane's stores come before
// its own arrival on the full barrier (release), which the consumers' wait acquires; each
// consumer thread's loads come before its own arrival on Q_EMPTY, which every lane here waits
// for before it stores into the slot again.
template <int D>
__device__ __forceinline__ void load_tiles(const smem_tiles &sm, const CUtensorMap *tmQ,
                                           const CUtensorMap *tmK, const CUtensorMap *tmV,
                                           const CUtensorMap *tmdO, const bwd_problem &pb,
                                           int lane) {
    static_assert(QROWS == 2 * WARP_SIZE, "a lane moves two floats of LSE_i and of D_i");
    const int key0 = block_key_tile(pb) * KEYS;
    const int batch = (int)blockIdx.y / pb.H_kv, kv_head = (int)blockIdx.y % pb.H_kv;
    if (lane == 0) {
        const uint32_t kv_full = bar_at(sm, BAR_KV_FULL);
        mbar_arrive_expect_tx(kv_full, 2 * kv_tile_bytes<D>());
        copy_tile<D, KEYS>(sm.K, tmK, kv_full, key0, kv_head, batch);
        copy_tile<D, KEYS>(sm.V, tmV, kv_full, key0, kv_head, batch);
    }

    // One loop over the block's steps (every query tile of every query head of the group, the
    // consumers' order), with the head, the tile and this lane's place in lse2 and Dsum carried
    // along: the warp runs on PRODUCER_REGS registers.
    int tiles;
    const int first = query_tiles_of(pb, key0, &tiles);
    const uint32_t lane_bytes = (uint32_t)(lane * 2 * sizeof(float));  // its two floats of a row
    int head = kv_head * pb.group, qt = first;
    size_t row = ((size_t)batch * pb.H + head) * pb.N_pad + (size_t)first * QROWS + 2 * lane;
    for (int it = 0; it < pb.group * tiles; ++it) {
        const int slot = ring_slot(it), q0 = qt * QROWS;
        // the two rows' loads in flight while the slot drains
        const float2 lse = __ldg(reinterpret_cast<const float2 *>(pb.lse2 + row));
        const float2 Di = __ldg(reinterpret_cast<const float2 *>(pb.Dsum + row));
        mbar_wait(bar_at(sm, BAR_Q_EMPTY + slot), ring_phase(it) ^ 1);  // the slot is free
        const uint32_t q_full = bar_at(sm, BAR_Q_FULL + slot);
        const uint32_t do_full = bar_at(sm, BAR_DO_FULL + slot);
        if (lane == 0) {
            mbar_expect_tx(q_full, q_tile_bytes<D>());
            copy_tile<D, QROWS>(sm.Q + slot * q_tile_bytes<D>(), tmQ, q_full, q0, head, batch);
            mbar_expect_tx(do_full, q_tile_bytes<D>());
            copy_tile<D, QROWS>(sm.dO + slot * q_tile_bytes<D>(), tmdO, do_full, q0, head, batch);
        }
        st_shared_f2(sm.lse + slot * VEC_BYTES + lane_bytes, lse.x, lse.y);
        mbar_arrive(q_full);
        st_shared_f2(sm.Dsum + slot * VEC_BYTES + lane_bytes, Di.x, Di.y);
        mbar_arrive(do_full);
        if (++qt < first + tiles) {  // the next tile of this head
            row += QROWS;
        } else {  // the first tile of the next head
            row += pb.N_pad - (size_t)(tiles - 1) * QROWS;
            qt = first, ++head;
        }
    }
}
