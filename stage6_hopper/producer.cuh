/*
 * stage6_hopper/producer.cuh: the producer: one thread of warpgroup 0 hands each work tile to the
 * consumers (its Q into a free Q buffer) and copies its K and V tiles into the ring as the
 * consumers release the slots, by TMA on mbarriers.
 */
#pragma once

#include "schedule.cuh"
#include "smem.cuh"

// Announce a tile's bytes on its "full" barrier and copy rows row0 .. row0 + ROWS - 1 of head
// `head` of batch `batch`, one TMA copy per 64-column slab.
template <int D, int ROWS>
__device__ __forceinline__ void copy_tile(uint32_t dst, const CUtensorMap *map, uint32_t full,
                                          int row0, int head, int batch) {
    mbar_arrive_expect_tx(full, ROWS * D * HALF_BYTES);
#pragma unroll
    for (int c = 0; c < D / SLAB_COLS; ++c)
        tma_load_4d(dst + slab_offset<ROWS>(c), map, full, c * SLAB_COLS, row0, head, batch);
}

// K or V of the key tile that starts at key0 (of K/V head and batch hd) into ring slot kv.slot()
// once the consumers have released it (ring = sm.K or sm.V; FULL and EMPTY = BAR_K_FULL and
// BAR_K_EMPTY, or V's).
template <int D, int BC, int FULL, int EMPTY>
__device__ __forceinline__ void load_key_tile(const smem_tiles &sm, uint32_t ring,
                                              const CUtensorMap *map, kv_pipeline kv,
                                              const tile_heads &hd, int key0) {
    wait_empty(sm, EMPTY, kv);  // the consumers are done with the slot's last key tile
    copy_tile<D, BC>(ring + kv.slot() * kv_bytes<D, BC>(), map, bar_at(sm, FULL + kv.slot()), key0,
                     hd.kv_head, hd.batch);
}

// Hand the block's t-th work tile, index w, to the consumers: wait until Q buffer t % QB and its
// index slot are free, write the index, start Q's copy. w >= works hands over "stop" (no copy).
template <int D, int C, int BC>
__device__ __forceinline__ void publish_work(const smem_tiles &sm, const CUtensorMap *tmQ, int t,
                                             int w, const work_tile &wt, const problem &pb,
                                             int works) {
    const pipeline_state<q_buffers<D, C, BC>()> q = {t};
    const uint32_t full = bar_at(sm, BAR_Q_FULL + q.slot());
    wait_empty(sm, BAR_Q_EMPTY, q);     // the consumers are done with the buffer's last work tile
    atomicExch(&sm.work[q.slot()], w);  // (an atomic, like the consumers' read: see take_work())
    if (w >= works) {
        mbar_arrive(full);  // no copy: the consumers read "stop"
        return;
    }
    const tile_heads hd = heads_of(wt.bh, pb);
    copy_tile<D, block_rows<C>()>(q_stage<D, C, BC>(sm, t), tmQ, full, wt.q0, hd.head, hd.batch);
}

// One thread issues every copy: for each work tile, hand it over (Q into its buffer as soon as
// the consumers are done with the work tile QB before it), then K_j and V_j into the next ring
// slot as soon as the consumers have released it. Separate barriers let S = Q K_j^T start
// before V_j lands. The counter's atomic for the next work tile is taken right after a
// hand-over, so that its latency hides under the copies.
template <int D, int C, int BC>
__device__ __forceinline__ void producer(const smem_tiles &sm, const CUtensorMap *tmQ,
                                         const CUtensorMap *tmK, const CUtensorMap *tmV,
                                         const problem &pb, int works, int *next_work) {
    kv_pipeline kv = {0};  // counts the key tiles issued so far
    work_tile wt;
    int w = take_next_work<C, BC>(blockIdx.x, pb, works, next_work, wt);
    for (int t = 0;; ++t) {
        publish_work<D, C, BC>(sm, tmQ, t, w, wt, pb, works);
        if (w >= works) return;  // that was "stop"
        // The range's key tiles by their first keys (two registers for the loop, not three:
        // the thread has 24, and the 4-D copies' K/V head and batch take one more than bh did).
        const tile_heads hd = heads_of(wt.bh, pb);  // (publish_work's, worked out once)
        const int key_end = key_tile_start<BC>(wt, wt.n_tiles);
        for (int key0 = key_tile_start<BC>(wt, 0); key0 < key_end; key0 += BC, kv = kv.next()) {
            load_key_tile<D, BC, BAR_K_FULL, BAR_K_EMPTY>(sm, sm.K, tmK, kv, hd, key0);
            load_key_tile<D, BC, BAR_V_FULL, BAR_V_EMPTY>(sm, sm.V, tmV, kv, hd, key0);
        }
        w = take_next_work<C, BC>(next_work_index(works, next_work), pb, works, next_work, wt);
    }
}
