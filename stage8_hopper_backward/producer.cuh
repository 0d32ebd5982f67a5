/*
 * stage8_hopper_backward/producer.cuh: the load warp of the producer warpgroup: its lane 0 copies
 * the block's first K_j and V_j, then for every query tile of every query head of the group of
 * each work tile (a persistent block's, handed out as it goes) Q_i and dO_i by TMA into the next
 * slot of the ring, as the consumers release it, while the whole warp copies LSE_i and D_i (a float
 * per query each) by cp.async, on mbarriers.
 */
#pragma once

#include "schedule.cuh"
#include "smem.cuh"

// Rows row0 .. row0 + ROWS - 1 of head `head` of batch `batch` into dst (a packed tensor: row0
// counts from the batch's first row, batch 0), one TMA copy per 64-column slab, completing on
// `full` (the caller has announced the bytes there).
template <int D, int ROWS>
__device__ __forceinline__ void copy_tile(uint32_t dst, const CUtensorMap *map, uint32_t full,
                                          int row0, int head, int batch) {
#pragma unroll
    for (int c = 0; c < slabs<D>(); ++c)
        tma_load_4d(dst + slab_offset<ROWS>(c), map, full, c * SLAB_COLS, row0, head, batch);
}

// The load warp, for each work tile of the block (a persistent block's in turn). Lane 0 starts
// the block's first step's tiles with its K_j and V_j, in the order the consumers need them: K_j
// and Q_0 on Q_FULL, then V_j and dO_0 on DO_FULL (slot 0, free at the start), so that the first
// S^T waits for no V_j (a persistent block's later work tiles' K_j and V_j are the store warp's
// copies: epilogue.cuh). Then per query tile (the block's it-th), every lane: wait until the
// consumers have released its slot (Q_EMPTY); lane 0 (past the first step) announces the tiles'
// bytes and starts Q_i on Q_FULL and dO_i on DO_FULL (TMA); each lane starts a cp.async of its
// floats of LSE_i and arrives on Q_FULL when it has landed, then the same with D_i on DO_FULL, so
// that S^T = K_j Q_i^T may start before dO_i lands. Rows past N (and keys past N_k) arrive as zeros
// from TMA; lse2 and Dsum are padded to N_pad, a multiple of qrows, so their copies never leave the
// head's rows. A packed batch: Q_i, dO_i (K_j, V_j) rows past the sequence's N (N_k) are the next
// sequence's, finite, whose P the padded LSE
// (+inf past N) and the consumers' mask (keys) make 0; each sequence's rows of lse2 and Dsum are
// padded to a multiple of ROW_PAD (bwd_sequence_of), so a tile's copies stay in them too.
//
// Why the lanes' cp.async, not a bulk copy, moves LSE_i and D_i: the consumers read them with
// ordinary loads (the generic proxy), and a bulk copy writes in the async proxy; writes in one
// proxy after reads in the other need a proxy fence on the reading side, which the PTX memory
// model asks for and compute-sanitizer's racecheck does not see. cp.async writes in the generic
// proxy, so every access to these two rows is ordered by the mbarriers alone: each lane's
// arrival on the full barrier happens once its copies are complete (mbar_arrive_after_cp_async),
// and the consumers' wait acquires it; each consumer thread's loads come before its own arrival
// on Q_EMPTY, which every lane here waits for before it copies into the slot again. The floats
// never pass through the warp's registers (it runs on PRODUCER_REGS of them).
template <int D, dq_way DQ, bool WAIT, bool PERSISTENT>
__device__ __forceinline__ void load_tiles(const smem_tiles &sm, const CUtensorMap *tmQ,
                                           const CUtensorMap *tmK, const CUtensorMap *tmV,
                                           const CUtensorMap *tmdO, const bwd_problem &pb,
                                           int lane) {
    constexpr int ROWS = qrows<D>(), LANE_FLOATS = ROWS / WARP_SIZE;
    constexpr int LANE_BYTES = LANE_FLOATS * (int)sizeof(float);  // one cp.async: 8 or 16
    static_assert(ROW_PAD % ROWS == 0, "N_pad (a multiple of ROW_PAD) is a whole number of tiles");
    const uint32_t lane_bytes = (uint32_t)(lane * LANE_BYTES);  // its floats' place in a row
    // The block's first step's tiles (lane 0), then the PDL wait, ahead of the loop. A persistent
    // block's first work tile is blockIdx.x (never "stop": a block per multiprocessor, fewer than
    // the work tiles), published for the other roles.
    int w = PERSISTENT ? (int)blockIdx.x : 0;
    if (PERSISTENT && lane == 0) publish_work(sm, 0, w);
    {
        const block_place b =
            block_place_of<D>(pb, PERSISTENT ? work_tile_at(pb, w) : own_work_tile());
        int tiles;
        const int first = walk_first<D, DQ>(pb, b, walk_tiles_of<D>(b.keys, b.key0, &tiles));
        if (lane == 0 && tiles > 0) {  // (no step: no tile, and the consumers read none)
            const int k_row = (int)b.seq.seq.k_row + b.key0;
            const int q_row = (int)b.seq.seq.q_row + walk_row<D, DQ>(pb, first);
            const int head = b.kv_head * pb.group;
            const uint32_t q_full = bar_at(sm, BAR_Q_FULL), do_full = bar_at(sm, BAR_DO_FULL);
            mbar_expect_tx(q_full, kv_tile_bytes<D>() + q_tile_bytes<D>());
            copy_tile<D, block_keys<D>()>(sm.K, tmK, q_full, k_row, b.kv_head, b.tile_batch);
            copy_tile<D, ROWS>(sm.Q, tmQ, q_full, q_row, head, b.tile_batch);
            mbar_expect_tx(do_full, kv_tile_bytes<D>() + q_tile_bytes<D>());
            copy_tile<D, block_keys<D>()>(sm.V, tmV, do_full, k_row, b.kv_head, b.tile_batch);
            copy_tile<D, ROWS>(sm.dO, tmdO, do_full, q_row, head, b.tile_batch);
        }
    }
    // PDL (launch.cuh, where the kernel waits: config.cuh's waits_by_pdl): the grid may start
    // while the preprocess ends, which lets it start only once every kernel before that has
    // ended: the call's inputs (K_j, V_j, the first Q_i and dO_i above; cu_seqlens) may be read
    // at once, the preprocess's results (LSE_i, D_i, the zeroed dQ_acc) only after this wait.
    // Every other role's first use of them follows this warp's first Q_FULL. The pass after may
    // be placed on the SMs this grid leaves idle (it waits for this grid's end).
    if constexpr (WAIT) {
        wait_for_previous_kernel();
        let_next_kernel_start();
    }

    // A persistent block's work tiles one after another, the ring's count (it) running on across
    // them; else the block's own, once.
    int it = 0;
    for (int n = 0;; ++n) {
        if (PERSISTENT && w >= pb.work_tiles) break;  // "stop", published
        const block_place b =
            block_place_of<D>(pb, PERSISTENT ? work_tile_at(pb, w) : own_work_tile());
        int tiles;
        const int first = walk_first<D, DQ>(pb, b, walk_tiles_of<D>(b.keys, b.key0, &tiles));
        int head = b.kv_head * pb.group, qt = first;

        // One loop over the work tile's steps (every query tile of every query head of the group,
        // the consumers' order), with the head and the tile carried along and this lane's place in
        // lse2 and Dsum worked out afresh at each step: the warp runs on PRODUCER_REGS registers
        // (LOG.md, step 14: what a 64-bit running offset cost).
        const int head_pad = (int)b.seq.head_pad;  // a head's rows there (N_pad or acc_rows)
        for (const int end = it + pb.group * tiles; it < end; ++it) {
            const int slot = q_pipeline{it}.slot(), q0 = walk_row<D, DQ>(pb, qt);
            const int q_row = (int)b.seq.seq.q_row + q0;  // in Q's and dO's maps
            const size_t row = b.seq.row_pad + (size_t)head * head_pad + q0 + LANE_FLOATS * lane;
            mbar_wait(bar_at(sm, BAR_Q_EMPTY + slot),
                      q_pipeline{it}.empty_phase());  // the slot is free
            const uint32_t q_full = bar_at(sm, BAR_Q_FULL + slot);
            const uint32_t do_full = bar_at(sm, BAR_DO_FULL + slot);
            if (lane == 0 && it > 0) {  // (the block's first step's tiles are on their way)
                mbar_expect_tx(q_full, q_tile_bytes<D>());
                copy_tile<D, ROWS>(sm.Q + slot * q_tile_bytes<D>(), tmQ, q_full, q_row, head,
                                   b.tile_batch);
                mbar_expect_tx(do_full, q_tile_bytes<D>());
                copy_tile<D, ROWS>(sm.dO + slot * q_tile_bytes<D>(), tmdO, do_full, q_row, head,
                                   b.tile_batch);
            }
            cp_async_ca<LANE_BYTES>(sm.lse + slot * vec_bytes<D>() + lane_bytes,
                                    pb.call.lse2 + row);
            mbar_arrive_after_cp_async(q_full);
            cp_async_ca<LANE_BYTES>(sm.Dsum + slot * vec_bytes<D>() + lane_bytes,
                                    pb.call.Dsum + row);
            mbar_arrive_after_cp_async(do_full);
            if (++qt == first + tiles) qt = first, ++head;  // the first tile of the next head
        }
        if constexpr (!PERSISTENT) break;
        // The next work tile, taken from the counter once this one's copies are all issued (the
        // warp runs Q_STAGES steps ahead of the consumers, whose end of the work tile hides the
        // atomic's latency), so that a block takes no work tile while another has time for it
        // (taken sooner, the last ones measured slower: LOG.md, step 84), and published.
        if (lane == 0) {
            w = next_work_tile(pb);
            publish_work(sm, n + 1, w);
        }
        w = __shfl_sync(FULL_WARP, w, 0);
    }
    cp_async_wait_all();  // no copy of this warp's still in flight when it leaves
}

// A persistent block's K/V warp (its lane 0): each work tile's K_j and V_j but the first's (the
// load warp's) into their tiles on KV_FULL, as soon as the consumers' products of the work tile
// before are done with them (KV_EMPTY; its dK_j and dV_j are staged elsewhere: epilogue.cuh's
// dk_stage), as the load warp publishes the work tiles. Its own
// warp and loop: in the load warp, the tensor maps' addresses live across its loop spilled it.
template <int D>
__device__ __forceinline__ void load_kv(const smem_tiles &sm, const CUtensorMap *tmK,
                                        const CUtensorMap *tmV, const bwd_problem &pb) {
    for (int n = 0;; ++n) {
        const int w = take_work(sm, n);
        if (w >= pb.work_tiles) return;
        if (n == 0) continue;  // (the load warp's)
        mbar_wait(bar_at(sm, BAR_KV_EMPTY), (uint32_t)(n - 1) & 1);
        const block_place b = block_place_of<D>(pb, work_tile_at(pb, w));
        const int k_row = (int)b.seq.seq.k_row + b.key0;
        const uint32_t full = bar_at(sm, BAR_KV_FULL);
        mbar_arrive_expect_tx(full, 2 * kv_tile_bytes<D>());
        copy_tile<D, block_keys<D>()>(sm.K, tmK, full, k_row, b.kv_head, b.tile_batch);
        copy_tile<D, block_keys<D>()>(sm.V, tmV, full, k_row, b.kv_head, b.tile_batch);
    }
}
