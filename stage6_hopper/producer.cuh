/*
 * stage6_hopper/producer.cuh: the producer: one thread of warpgroup 0 hands each work tile to the
 * consumers (its Q into a free Q buffer) and copies its K and V tiles into the ring as the
 * consumers release the slots, by TMA on mbarriers.
 */
#pragma once

#include "schedule.cuh"
#include "smem.cuh"

// Announce a tile's bytes on its "full" barrier and copy rows row0 .. row0 + ROWS - 1 of head
// `head` of batch `batch`, one TMA copy per 64-column slab (columns past the tensor's D and rows
// past its end read as zeros, and their bytes count; a packed sequence's tile that crosses its
// end reads the next sequence's rows, which the masks and the epilogue leave out).
template <int D, int ROWS>
__device__ __forceinline__ void copy_tile(uint32_t dst, const CUtensorMap *map, uint32_t full,
                                          int row0, int head, int batch) {
    // LAB HOLE 1 BEGIN: the TMA copy of a tile onto its full barrier
    // LAB TODO: one arrival on the tile's full barrier that also announces the bytes the copies
    // LAB TODO: will bring (mbar_arrive_expect_tx: ROWS rows x slabs<D>() x SLAB_ROW_BYTES), then
    // LAB TODO: one TMA copy per 64-column slab c < slabs<D>(): tma_load_4d into dst +
    // LAB TODO: slab_offset<ROWS>(c),
    // LAB TODO: completing on `full`, at the tensor coordinates (column c * SLAB_COLS, row row0,
    // LAB TODO: head, batch). The phase completes when the arrival is in and every announced byte
    // LAB TODO: has landed: announce too many and the consumers wait forever.
    // LAB STUB: mbar_arrive(full);  // until filled: no copy, the consumers read a stale tile
    mbar_arrive_expect_tx(full, ROWS * slabs<D>() * SLAB_ROW_BYTES);  // (zeros past D count too)
#pragma unroll
    for (int c = 0; c < slabs<D>(); ++c)
        tma_load_4d(dst + slab_offset<ROWS>(c), map, full, c * SLAB_COLS, row0, head, batch);
    // LAB HOLE 1 END
}

// K or V of the key tile that starts at key0 (of K/V head and batch hd) into ring slot kv.slot()
// once the consumers have released it (ring = sm.K or sm.V; FULL and EMPTY = BAR_K_FULL and
// BAR_K_EMPTY, or V's).
template <int D, int BC, int FULL, int EMPTY>
__device__ __forceinline__ void load_key_tile(const smem_tiles &sm, uint32_t ring,
                                              const CUtensorMap *map, kv_pipeline kv,
                                              const tile_heads &hd, int key0) {
    // LAB HOLE 2 BEGIN: the ring's waits: a K or V slot
    // LAB TODO: wait until the consumers have released ring slot kv.slot() (its empty barrier,
    // LAB TODO: EMPTY + slot: wait_empty with the pipeline state kv, which knows the phase), then
    // LAB TODO: copy_tile the key tile's BC rows (from key0, K/V head hd.kv_head, batch hd.batch)
    // LAB TODO: into the slot's buffer (ring + slot * kv_bytes<D, BC>()), completing on the slot's
    // LAB TODO: full barrier (bar_at FULL + slot). Copy without the wait and the copy overwrites a
    // LAB TODO: tile still being read, or completes a full barrier's phase twice before a consumer
    // LAB TODO: looks: its parity wait then never returns. The stub stops the kernel with a message
    // LAB TODO: instead (the consumers would wait forever).
    // LAB STUB: printf("lab hole 2 unfilled: load_key_tile\n"), __trap();  // stops the kernel
    wait_empty(sm, EMPTY, kv);  // the consumers are done with the slot's last key tile
    copy_tile<D, BC>(ring + kv.slot() * kv_bytes<D, BC>(), map, bar_at(sm, FULL + kv.slot()), key0,
                     hd.kv_head, hd.batch);
    // LAB HOLE 2 END
}

// Hand the block's t-th work tile, index w, to the consumers: wait until Q buffer t % QB and its
// index slot are free, write the index, start Q's copy. w >= works hands over "stop" (no copy).
template <int D, int C, int BC, bool MODEL>
__device__ __forceinline__ void publish_work(const smem_tiles &sm, const CUtensorMap *tmQ, int t,
                                             int w, const work_tile &wt, const problem &pb,
                                             int works) {
    const pipeline_state<q_buffers<D, C, BC>()> q = {t};
    const uint32_t full = bar_at(sm, BAR_Q_FULL + q.slot());
    // LAB HOLE 2 BEGIN: the ring's waits: a Q buffer and its work index
    // LAB TODO: wait until Q buffer q.slot() is free (BAR_Q_EMPTY, state q), then publish the work
    // LAB TODO: index w in sm.work[q.slot()] (write_work_slot: the consumers read it atomically),
    // LAB TODO: and: for w >= works ("stop") one plain arrival on `full`, no copy; otherwise
    // LAB TODO: copy_tile Q's block_rows<C>() rows from wt.q0 (head and batch:
    // LAB TODO: heads_of<MODEL>(wt.bh, pb)) into q_stage<D, C, BC>(sm, t), completing on `full`.
    // LAB STUB: printf("lab hole 2 unfilled: publish_work\n"), __trap();  // stops the kernel
    // LAB STUB: (void)full;
    wait_empty(sm, BAR_Q_EMPTY, q);  // the consumers are done with the buffer's last work tile
    write_work_slot(&sm.work[q.slot()], w);
    if (w >= works) {
        mbar_arrive(full);  // no copy: the consumers read "stop"
        return;
    }
    const tile_heads hd = heads_of<MODEL>(wt.bh, pb);
    copy_tile<D, block_rows<C>()>(q_stage<D, C, BC>(sm, t), tmQ, full, wt.q0, hd.head, hd.batch);
    // LAB HOLE 2 END
}

// One thread issues every copy: for each work tile, hand it over (Q into its buffer as soon as
// the consumers are done with the work tile QB before it), then K_j and V_j into the next ring
// slot as soon as the consumers have released it. Separate barriers let S = Q K_j^T start
// before V_j lands. The counter's atomic for the next work tile is taken right after a
// hand-over, so that its latency hides under the copies.
template <int D, int C, int BC, bool MODEL>
__device__ __forceinline__ void producer(const smem_tiles &sm, const CUtensorMap *tmQ,
                                         const CUtensorMap *tmK, const CUtensorMap *tmV,
                                         const problem &pb, int works, int *next_work) {
    kv_pipeline kv = {0};  // counts the key tiles issued so far
    work_tile wt;
    int w = take_next_work<C, BC, MODEL>(blockIdx.x, pb, works, next_work, wt);
    for (int t = 0;; ++t) {
        publish_work<D, C, BC, MODEL>(sm, tmQ, t, w, wt, pb, works);
        if (w >= works) return;                            // that was "stop"
        const tile_heads hd = heads_of<MODEL>(wt.bh, pb);  // (publish_work's, worked out once)
        if constexpr (MODEL) {
            // The range's key tiles by their first keys' rows of K and V (the sequence's first
            // row, k_row, added once; two registers for the loop, not three: the thread has 24,
            // and the K/V head and batch take one more than bh does).
            const int key_end = wt.k_row + key_tile_start<BC>(wt, wt.n_tiles);
            for (int key0 = wt.k_row + key_tile_start<BC>(wt, 0); key0 < key_end;
                 key0 += BC, kv = kv.next()) {
                load_key_tile<D, BC, BAR_K_FULL, BAR_K_EMPTY>(sm, sm.K, tmK, kv, hd, key0);
                load_key_tile<D, BC, BAR_V_FULL, BAR_V_EMPTY>(sm, sm.V, tmV, kv, hd, key0);
            }
        } else {
            for (int j = 0; j < wt.n_tiles; ++j, kv = kv.next()) {
                load_key_tile<D, BC, BAR_K_FULL, BAR_K_EMPTY>(sm, sm.K, tmK, kv, hd,
                                                              key_tile_start<BC>(wt, j));
                load_key_tile<D, BC, BAR_V_FULL, BAR_V_EMPTY>(sm, sm.V, tmV, kv, hd,
                                                              key_tile_start<BC>(wt, j));
            }
        }
        w = take_next_work<C, BC, MODEL>(next_work_index(works, next_work), pb, works, next_work,
                                         wt);
    }
}
