/*
 * stage8_hopper_backward/producer.cuh: the load warp of the producer warpgroup: its lane 0 copies
 * the block's K_j and V_j once, then for every query tile of every query head of the group Q_i and
 * dO_i by TMA into the next slot of the ring, as the consumers release it, while the whole warp
 * copies LSE_i and D_i (a float per query each) by cp.async, on mbarriers. A persistent block's
 * load warp does so for one work tile after another, taking each next one from the counter, and
 * its K/V warp copies each work tile's K_j and V_j.
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

// The same rows into the L2 cache (tma_prefetch_4d), for a copy_tile of them that waits.
template <int D, int ROWS>
__device__ __forceinline__ void prefetch_tile(const CUtensorMap *map, int row0, int head,
                                              int batch) {
#pragma unroll
    for (int c = 0; c < slabs<D>(); ++c) tma_prefetch_4d(map, c * SLAB_COLS, row0, head, batch);
}

// The block's first step's tiles with its K_j and V_j (lane 0 of the load warp; load_tiles says
// in which order).
template <int D, dq_way DQ>
__device__ __forceinline__ void load_first_tiles(const smem_tiles &sm, const CUtensorMap *tmQ,
                                                 const CUtensorMap *tmK, const CUtensorMap *tmV,
                                                 const CUtensorMap *tmdO, const bwd_problem &pb,
                                                 const block_place &b, int first) {
    const int k_row = (int)b.seq.seq.k_row + b.key0;
    const int q_row = (int)b.seq.seq.q_row + walk_row<D, DQ>(pb, first);
    const int head = b.kv_head * pb.group;
    const uint32_t q_full = bar_at(sm, BAR_Q_FULL), do_full = bar_at(sm, BAR_DO_FULL);
    mbar_expect_tx(q_full, kv_tile_bytes<D>() + q_tile_bytes<D>());
    copy_tile<D, block_keys<D>()>(sm.K, tmK, q_full, k_row, b.kv_head, b.tile_batch);
    copy_tile<D, qrows<D>()>(sm.Q, tmQ, q_full, q_row, head, b.tile_batch);
    mbar_expect_tx(do_full, kv_tile_bytes<D>() + q_tile_bytes<D>());
    copy_tile<D, block_keys<D>()>(sm.V, tmV, do_full, k_row, b.kv_head, b.tile_batch);
    copy_tile<D, qrows<D>()>(sm.dO, tmdO, do_full, q_row, head, b.tile_batch);
}

// PDL (launch.cuh, where the kernel waits: config.cuh's waits_by_pdl): the grid may start while
// the preprocess ends, which lets it start only once every kernel before that has ended: the
// call's inputs (K_j, V_j, the first Q_i and dO_i; cu_seqlens) may be read at once, the
// preprocess's results (LSE_i, D_i, the zeroed dQ_acc) only after this wait. Every other role's
// first use of them follows this warp's first Q_FULL. The pass after may be placed on the SMs this
// grid leaves idle (it waits for this grid's end).
template <bool WAIT>
__device__ __forceinline__ void load_after_preprocess() {
    if constexpr (WAIT) {
        wait_for_previous_kernel();
        let_next_kernel_start();
    }
}

// One step (ring state q): wait until its slot is free; lane 0 starts Q_i and dO_i of query tile
// row q_row (in the maps) of head `head` (unless `copies` is false: the block's first step's are
// on their way; load_step_tiles); every lane its floats of LSE_i and D_i from `row` of lse2 and
// Dsum (load_step_rows).
template <int D>
__device__ __forceinline__ void load_step_tiles(const smem_tiles &sm, const CUtensorMap *tmQ,
                                                const CUtensorMap *tmdO, q_pipeline q, bool copies,
                                                int q_row, int head, int tile_batch) {
    const int slot = q.slot();
    mbar_wait(bar_at(sm, BAR_Q_EMPTY + slot), q.empty_phase());  // the slot is free
    if (copies) {
        const uint32_t q_full = bar_at(sm, BAR_Q_FULL + slot);
        const uint32_t do_full = bar_at(sm, BAR_DO_FULL + slot);
        mbar_expect_tx(q_full, q_tile_bytes<D>());
        copy_tile<D, qrows<D>()>(sm.Q + slot * q_tile_bytes<D>(), tmQ, q_full, q_row, head,
                                 tile_batch);
        mbar_expect_tx(do_full, q_tile_bytes<D>());
        copy_tile<D, qrows<D>()>(sm.dO + slot * q_tile_bytes<D>(), tmdO, do_full, q_row, head,
                                 tile_batch);
    }
}
template <int D>
__device__ __forceinline__ void load_step_rows(const smem_tiles &sm, const bwd_problem &pb,
                                               q_pipeline q, size_t row, uint32_t lane_bytes) {
    constexpr int LANE_BYTES = qrows<D>() / WARP_SIZE * (int)sizeof(float);  // 8 or 16
    const int slot = q.slot();
    cp_async_ca<LANE_BYTES>(sm.lse + slot * vec_bytes<D>() + lane_bytes, pb.call.lse2 + row);
    mbar_arrive_after_cp_async(bar_at(sm, BAR_Q_FULL + slot));
    cp_async_ca<LANE_BYTES>(sm.Dsum + slot * vec_bytes<D>() + lane_bytes, pb.call.Dsum + row);
    mbar_arrive_after_cp_async(bar_at(sm, BAR_DO_FULL + slot));
}

// The load warp of a block with one work tile (a persistent block's: load_tiles_persistent, below).
// Lane 0 starts the first step's tiles with the block's K_j and V_j, in the order the consumers
// need them: K_j and Q_0 on Q_FULL, then V_j and dO_0 on DO_FULL (slot 0, free at the start), so
// that the first S^T waits for no V_j (load_first_tiles). Then per query tile (the block's it-th),
// every lane: wait until the consumers have released its slot (Q_EMPTY); lane 0 (past the first
// step) announces the tiles' bytes and starts Q_i on Q_FULL and dO_i on DO_FULL (TMA); each lane
// starts a cp.async of its floats of LSE_i and arrives on Q_FULL when it has landed, then the same
// with D_i on DO_FULL, so that S^T = K_j Q_i^T may start before dO_i lands. Rows past N (and keys
// past N_k) arrive as zeros from TMA; lse2 and Dsum are padded to N_pad, a multiple of qrows, so
// their copies never leave the head's rows. A packed batch: Q_i, dO_i (K_j, V_j) rows past the
// sequence's N (N_k) are the next sequence's, finite, whose P the padded LSE
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
template <int D, dq_way DQ, bool WAIT, bool TAIL>
__device__ __forceinline__ void load_tiles(const smem_tiles &sm, const CUtensorMap *tmQ,
                                           const CUtensorMap *tmK, const CUtensorMap *tmV,
                                           const CUtensorMap *tmdO, const bwd_problem &pb,
                                           int lane) {
    constexpr int ROWS = qrows<D>(), LANE_FLOATS = ROWS / WARP_SIZE;
    static_assert(ROW_PAD % ROWS == 0, "N_pad (a multiple of ROW_PAD) is a whole number of tiles");
    const block_place b = block_place_of<D>(pb, own_work_tile<TAIL>(pb));
    int tiles;
    const int first =
        walk_first<D, DQ>(pb, b, walk_tiles_of<D, true, TAIL>(pb, b.keys, b.key0, &tiles));
    int head = b.kv_head * pb.group, qt = first;
    // (no step: no tile, and the consumers read none)
    if (lane == 0 && tiles > 0) load_first_tiles<D, DQ>(sm, tmQ, tmK, tmV, tmdO, pb, b, first);
    load_after_preprocess<WAIT>();

    // One loop over the block's steps (every query tile of every query head of the group, the
    // consumers' order), with the head and the tile carried along and this lane's place in lse2
    // and Dsum worked out afresh at each step: the warp runs on PRODUCER_REGS registers (LOG.md,
    // step 14: what a 64-bit running offset cost).
    const uint32_t lane_bytes = (uint32_t)(lane * LANE_FLOATS * (int)sizeof(float));
    const int head_pad = (int)b.seq.head_pad;  // a head's rows there (N_pad or acc_rows: 32 bits)
    for (int it = 0; it < pb.group * tiles; ++it) {
        const int q0 = walk_row<D, DQ>(pb, qt);
        const size_t row = b.seq.row_pad + (size_t)head * head_pad + q0 + LANE_FLOATS * lane;
        load_step_tiles<D>(sm, tmQ, tmdO, q_pipeline{it}, lane == 0 && it > 0,
                           (int)b.seq.seq.q_row + q0, head, b.tile_batch);
        load_step_rows<D>(sm, pb, q_pipeline{it}, row, lane_bytes);
        if (++qt == first + tiles) qt = first, ++head;  // the first tile of the next head
    }
    cp_async_wait_all();  // no copy of this warp's still in flight when it leaves
}

// A persistent load warp's counts, in one register (it has 24): its steps so far modulo the Q/dO
// ring's period (2 Q_STAGES), its work tiles so far modulo the work slots' (2 WORK_SLOTS), whether
// it is past the block's first step (whose rows wait for the preprocess), and the work tile's steps
// still to go (fewer than LOAD_STEPS_MAX: launch.cuh's persistent_grid).
typedef struct {
    uint32_t bits;  // steps | tiles << LOAD_TILES_SHIFT | LOAD_PAST_FIRST | left << LOAD_LEFT_SHIFT
} load_counts;
constexpr uint32_t LOAD_STEPS = 2 * Q_STAGES, LOAD_TILES = 2 * WORK_SLOTS, LOAD_TILES_SHIFT = 4;
constexpr uint32_t LOAD_PAST_FIRST = 1u << (LOAD_TILES_SHIFT + 4), LOAD_LEFT_SHIFT = 9;
constexpr long long LOAD_STEPS_MAX = 1ll << (32 - LOAD_LEFT_SHIFT);
static_assert(LOAD_STEPS <= (1u << LOAD_TILES_SHIFT) && LOAD_TILES <= 16 &&
                  (LOAD_STEPS & (LOAD_STEPS - 1)) == 0 && (LOAD_TILES & (LOAD_TILES - 1)) == 0 &&
                  LOAD_PAST_FIRST < (1u << LOAD_LEFT_SHIFT),
              "the counts' periods are powers of two, and every field fits its bits");
__device__ __forceinline__ int load_step_count(load_counts c) {
    return (int)(c.bits & (LOAD_STEPS - 1));
}
__device__ __forceinline__ int load_tile_count(load_counts c) {
    return (int)((c.bits >> LOAD_TILES_SHIFT) & (LOAD_TILES - 1));
}
__device__ __forceinline__ bool past_first_step(load_counts c) {
    return (c.bits & LOAD_PAST_FIRST) != 0;
}
__device__ __forceinline__ int steps_left(load_counts c) {
    return (int)(c.bits >> LOAD_LEFT_SHIFT);
}
__device__ __forceinline__ load_counts counts_with_steps(load_counts c, int steps) {
    return {(c.bits & ((1u << LOAD_LEFT_SHIFT) - 1)) | (uint32_t)steps << LOAD_LEFT_SHIFT};
}
__device__ __forceinline__ load_counts counts_after_step(load_counts c) {  // (left > 0)
    const uint32_t step = (c.bits + 1) & (LOAD_STEPS - 1);
    return {((c.bits & ~(LOAD_STEPS - 1)) | step | LOAD_PAST_FIRST) - (1u << LOAD_LEFT_SHIFT)};
}
__device__ __forceinline__ load_counts counts_after_work_tile(load_counts c) {
    const uint32_t tiles = ((c.bits >> LOAD_TILES_SHIFT) + 1) & (LOAD_TILES - 1);
    return {(c.bits & ~((LOAD_TILES - 1) << LOAD_TILES_SHIFT)) | tiles << LOAD_TILES_SHIFT};
}

// A persistent block's load warp: its work tiles one after another, the first blockIdx.x
// (never "stop": a block per multiprocessor, fewer than the work tiles), each next one taken from
// the counter once this one's copies are all issued (the warp runs Q_STAGES steps ahead of the
// consumers, whose end of the work tile hides the atomic's latency), so that no block takes a work
// tile while another has time for it (taken sooner, the last ones measured slower: LOG.md, step
// 84), and published for the other roles. Every work tile's K_j and V_j are the K/V warp's, and
// the first step's Q_i and dO_i are copied in the loop before the PDL wait, so that the warp holds
// no tensor map of K or V. The work tile, the lane and the work tile's place are read or worked
// out afresh at each step (the work tile's index from its slot, where it stays until this warp
// publishes the one after next), so that the warp holds none of them across the loop: on
// PRODUCER_REGS registers they spilled.
template <int D, dq_way DQ, bool WAIT>
__device__ __forceinline__ void load_tiles_persistent(const smem_tiles &sm, const CUtensorMap *tmQ,
                                                      const CUtensorMap *tmdO,
                                                      const bwd_problem &pb, int lane) {
    constexpr int LANE_FLOATS = qrows<D>() / WARP_SIZE;
    int w = (int)blockIdx.x;
    if (lane == 0) publish_work(sm, 0, w);
    load_counts c = {0};
    while (w < pb.work_tiles) {
        int head, qt;  // the first step's head and tile
        {
            const block_place b = block_place_of<D>(pb, work_tile_at(pb, w));
            int tiles;
            qt = walk_first<D, DQ>(pb, b,
                                   walk_tiles_of<D, false, false>(pb, b.keys, b.key0, &tiles));
            head = b.kv_head * pb.group;
            c = counts_with_steps(c, pb.group * tiles);
        }
        for (; steps_left(c) > 0; c = counts_after_step(c)) {
            const int l = lane_index();
            const int wt = read_work_slot_by_warp(&sm.work[load_tile_count(c) % WORK_SLOTS], l);
            const block_place b = block_place_of<D>(pb, work_tile_at(pb, wt));
            int tiles;
            const int first = walk_first<D, DQ>(
                pb, b, walk_tiles_of<D, false, false>(pb, b.keys, b.key0, &tiles));
            const int q0 = walk_row<D, DQ>(pb, qt);
            const q_pipeline q = {load_step_count(c)};
            load_step_tiles<D>(sm, tmQ, tmdO, q, l == 0, (int)b.seq.seq.q_row + q0, head,
                               b.tile_batch);
            if (!past_first_step(c)) load_after_preprocess<WAIT>();  // (its rows are the pass's)
            load_step_rows<D>(sm, pb, q,
                              b.seq.row_pad + (size_t)head * b.seq.head_pad + q0 + LANE_FLOATS * l,
                              (uint32_t)(l * LANE_FLOATS * (int)sizeof(float)));
            if (++qt == first + tiles) qt = first, ++head;  // the first tile of the next head
        }
        int next = 0;  // (w is not held across the steps)
        if (lane_index() == 0) {
            next = next_work_tile(pb);
            publish_work(sm, load_tile_count(c) + 1, next);  // (or "stop")
        }
        w = __shfl_sync(FULL_WARP, next, 0);
        c = counts_after_work_tile(c);
    }
    cp_async_wait_all();  // no copy of this warp's still in flight when it leaves
}

// A persistent block's K/V warp (its lane 0): each work tile's K_j and V_j into their tiles on
// KV_FULL (the first at once: they are the call's inputs, read before the PDL wait), each later
// one's as soon as the consumers' products of the work tile before are done with them (KV_EMPTY;
// its dK_j and dV_j are staged elsewhere: epilogue.cuh's dk_stage), as the load warp publishes the
// work tiles; at D = 64 brought into the L2 first, before the wait (prefetches_next_kv). Its own
// warp and loop: in the load warp, the tensor maps' addresses live across its loop spilled it.
template <int D>
__device__ __forceinline__ void load_kv(const smem_tiles &sm, const CUtensorMap *tmK,
                                        const CUtensorMap *tmV, const bwd_problem &pb) {
    for (int n = 0;; ++n) {
        const int w = take_work(sm, n);
        if (w >= pb.work_tiles) return;
        // the tiles wait for the work tile before's products; where the next K_j and V_j go to
        // the L2 meanwhile, their place is worked out before the wait
        if constexpr (!prefetches_next_kv<D>())
            if (n > 0) mbar_wait(bar_at(sm, BAR_KV_EMPTY), (uint32_t)(n - 1) & 1);
        const block_place b = block_place_of<D>(pb, work_tile_at(pb, w));
        const int k_row = (int)b.seq.seq.k_row + b.key0;
        if constexpr (prefetches_next_kv<D>())
            if (n > 0) {
                prefetch_tile<D, block_keys<D>()>(tmK, k_row, b.kv_head, b.tile_batch);
                prefetch_tile<D, block_keys<D>()>(tmV, k_row, b.kv_head, b.tile_batch);
                mbar_wait(bar_at(sm, BAR_KV_EMPTY), (uint32_t)(n - 1) & 1);
            }
        const uint32_t full = bar_at(sm, BAR_KV_FULL);
        mbar_arrive_expect_tx(full, 2 * kv_tile_bytes<D>());
        copy_tile<D, block_keys<D>()>(sm.K, tmK, full, k_row, b.kv_head, b.tile_batch);
        copy_tile<D, block_keys<D>()>(sm.V, tmV, full, k_row, b.kv_head, b.tile_batch);
    }
}
