/*
 * stage8_hopper_backward/dq.cuh: dQ across the blocks. Every key tile adds its part of dQ_i to
 * every query tile it meets, so dQ is summed in fp32 in global memory (dQ_acc, zeroed by
 * preprocess_kernel): the consumers put a step's dQ_i into a staging tile (stage_dq), and the
 * producer's dQ warp hands it to the TMA unit's bulk reduce-add (reduce_dq), which adds it to
 * dQ_acc in L2 while the consumers go on; dq_convert_kernel scales and rounds dQ_acc after.
 * Variant atomics adds from the consumers' registers by fp32 atomics instead (add_dq_atomic);
 * variant deterministic orders the dQ warps' reductions into each query tile by key tile.
 */
#pragma once

#include "schedule.cuh"
#include "smem.cuh"

// Where a warpgroup's dQ part (64 x dq_cols) lies in the query tile: at D = 64 rows 64 wg .., all
// columns; at D = 96 and 128 all 64 rows, columns 64 wg .. (dq_part_cols<D>(wg) of them); at
// D = 256 all 64 rows, columns 128 wg .. (config.cuh, dq_splits_rows).
template <int D>
__device__ __forceinline__ int dq_part_row(int wg) {
    return dq_splits_rows<D>() ? wg * WGMMA_M : 0;
}
template <int D>
__device__ __forceinline__ int dq_part_col(int wg) {
    return dq_splits_rows<D>() ? 0 : wg * dq_cols<D>();
}

// The thread's two rows (g and g + 8) of n8 block n of its dQ part, a pair of floats each, to `at`
// and one accumulator row step (FRAG_ROW_STEP rows of row_bytes) past it.
template <int D>
__device__ __forceinline__ void store_block_rows(const float (&dQ_acc)[dq_regs<D>()], int n,
                                                 uint32_t at, int row_bytes) {
#pragma unroll
    for (int h = 0; h < FRAG_LANE_ROWS; ++h)
        st_shared_f2(at + FRAG_ROW_STEP * h * row_bytes, dQ_acc[acc_index(n, h, 0)],
                     dQ_acc[acc_index(n, h, 1)]);
}

// The consumers' side, after the step's dQ wgmma is done: wait until the reduction has read this
// warpgroup's part of the staging tile (by parts; as one tile, the tile) of the step before
// (DQ_EMPTY), write the warpgroup's dQ part there (the accumulator of a 64 x 64 wgmma: register
// acc_index(n, h, c) is row 16 warp + g + 8h, column 8n + 2t + c of its part), make the writes
// visible to the TMA unit (the async proxy), and arrive on DQ_FULL, one arrival per warp. The
// tile is [slabs][qrows][8] floats (config.cuh, staging_slab_bytes): n8 block n of the part lies
// in its slab n, so a warp's store of one n8 block and row half is 8 rows x 32 contiguous bytes,
// no bank conflict. The pairs and phases: dq_pair, dq_phase (smem.cuh).
template <int D, dq_way DQ>
__device__ __forceinline__ void stage_dq(const float (&dQ_acc)[dq_regs<D>()], const smem_tiles &sm,
                                         int wg, int warp, int lane, int it) {
    // the step before has had this part (this tile) read: on its DQ_EMPTY
    const int before = it - DQ_BUFFERS;
    mbar_wait(dq_empty_bar(sm, dq_pair<D, DQ>(before, wg)), dq_phase<D, DQ>(before));
    const int blocks = dq_part_cols<D>(wg) / FRAG_COLS;  // the part's n8 blocks
    const int g = lane / QUAD, t = lane % QUAD;
    const uint32_t row_at = dq_buffer_at<D>(sm, it) +
                            dq_part_col<D>(wg) / DQ_SLAB_COLS * staging_slab_bytes<D>() +
                            (dq_part_row<D>(wg) + WARP_ROWS * warp + g) * DQ_SLAB_ROW_BYTES +
                            FRAG_LANE_COLS * t * (int)sizeof(float);
#pragma unroll
    for (int n = 0; n < dq_cols<D>() / FRAG_COLS; ++n) {
        if (n >= blocks) break;
        store_block_rows<D>(dQ_acc, n, row_at + n * staging_slab_bytes<D>(), DQ_SLAB_ROW_BYTES);
    }
    fence_proxy_async();  // this thread's writes, visible to the TMA unit
    __syncwarp();         // the warp's writes are all in
    if (lane == 0) mbar_arrive(dq_full_bar(sm, dq_pair<D, DQ>(it, wg)));
}

// The dQ warp's lane 0: add part `part` of step it's staging tile (by parts the warpgroup's
// slabs, dq_part_cols of them from dq_part_col on; else the whole tile, part 0) to the query tile
// whose first row, counted as lse2's, is row0 (a multiple of qrows; reduce_dq), not committed.
// dQ_acc lies tiled as the staging tile does ([slabs][qrows][DQ_SLAB_COLS] floats a tile,
// dq_tiled_offset), a part's slabs together: one bulk copy, whole 128-byte lines (LOG.md, steps
// 56-59). Variant atomics' dQ warp adds nothing (it does not run).
template <int D, dq_way DQ>
__device__ __forceinline__ void reduce_dq_part(const smem_tiles &sm, const bwd_problem &pb, int it,
                                               int part, int row0) {
    if constexpr (DQ != DQ_BY_ATOMICS) {
        static_assert(dq_tiled<D, DQ>() && DQ_BUFFERS == 1, "the staging tile: one dQ_acc tile");
        constexpr int TILE_ROWS = qrows<D>();
        const int cols = dq_by_parts<D, DQ>() ? dq_part_cols<D>(part) : D;
        // (rows in 32 bits: dQ_acc's rows of D floats number far fewer than 2^31)
        float *const at =
            pb.call.dQ_acc + (size_t)(unsigned)row0 * D + dq_part_col<D>(part) * TILE_ROWS;
        bulk_reduce_add_f32(at, dq_part_at<D>(sm, it, part),
                            (uint32_t)(cols * TILE_ROWS * (int)sizeof(float)));
    } else {
        (void)sm, (void)pb, (void)it, (void)part, (void)row0;
    }
}

// The columns of a row of dQ_acc, the tensors' D, as the adds from the registers of a kernel for
// head dim D know it: D itself where it runs only its own (variant atomics up to D = 128), else
// the call's (TAIL: the default variant's last part, last_dq_by_reds; D = 256's kernels, which
// run D = 136 to 256): a smaller D's tail masked, its columns skipped.
template <int D, bool TAIL>
__device__ __forceinline__ int dq_acc_cols(const bwd_problem &pb) {
    return TAIL || splits_dkv<D>() ? pb.call.D : D;
}

// DQ_BY_ATOMICS: a lane's four columns after the exchange below (one float4), and the columns of
// the two n8 blocks the exchange works on.
inline constexpr int RED_LANE_COLS = 2 * FRAG_LANE_COLS;
inline constexpr int RED_PAIR_COLS = 2 * FRAG_COLS;

// DQ_BY_ATOMICS (variant atomics), after the step's dQ wgmma is done, and the default variant's
// last part of a block (last_dq_by_reds): the thread's part of dQ_i straight from its registers
// into rows q0 .. of query head `head` of the block's sequence in dQ_acc (bwd_sequence_of places
// them), no staging tile, no barrier: the adds leave from 256 threads instead of one TMA
// instruction. The warpgroup's part: dq_part_row, dq_part_col.
// Four floats a reduction: lanes t and t ^ 1 of a quad swap pairs (quad_pairs_to_float4) so that,
// of two n8 blocks n and n + 1 of a row, lane t holds the four consecutive columns 8 (n + (t & 1))
// + 4 (t >> 1) .. + 3 (it keeps its own pair of block n + (t & 1) and takes its partner's pair of
// that block); a warp's reduction then covers 8 rows x 64 bytes where one of two floats a lane
// covered 16 rows x 32 bytes, half the instructions and a quarter of the (row, instruction) pairs
// the L1 works through (16 a thread; rows past the sequence's N skipped). D = 64, 96 and 128 keep
// two floats a lane (16 a thread): their kernels have no register left for the swap (4 bytes
// spilled). A row is dq_acc_cols long, and the part's n8 blocks of columns at or past it (zeros:
// K_j is zero there) are skipped, as the bulk reductions' clipping does (the tensors' D is a
// multiple of 8: a block is all in or all out; at D = 256 a part ending on an odd block adds that
// block two floats a lane).
//
// TILED (dq_tiled): dQ_acc tiled as the staging tile, a row's n8 block n of the part in its slab
// dq_part_col / DQ_SLAB_COLS + n: a warp's reduction covers 8 slab rows, 256 contiguous bytes (at
// D = 256 two such runs, one a slab of the pair), where rows of D floats put each of its 8 rows in
// a line of its own (LOG.md, step 64).
template <int D, bool TAIL = false, bool TILED = false>
__device__ __forceinline__ void add_dq_atomic(const float (&dQ_part)[dq_regs<D>()],
                                              const bwd_problem &pb, const block_place &b, int wg,
                                              int warp, int lane, int head, int q0) {
    static_assert(dq_cols<D>() % RED_PAIR_COLS == 0, "a part's n8 blocks come in pairs");
    const int g = lane / QUAD, t = lane % QUAD;
    const int cols = dq_acc_cols<D, TAIL>(pb);
    float *const rows = pb.call.dQ_acc + (size_t)(b.seq.row_acc + head * b.seq.head_acc) * cols;
    const long long tiled_row = b.seq.row_pad + head * b.seq.head_pad;  // (TILED: row 0's)
    // from a row's n8 block n of the part to n + 1: the next slab (TILED), or the next 8 floats
    constexpr int BLOCK_STEP = TILED ? qrows<D>() * DQ_SLAB_COLS : FRAG_COLS;
    const int blocks = TAIL || splits_dkv<D>()  // the part's inside the tensors' D
                           ? (cols - dq_part_col<D>(wg)) / FRAG_COLS
                           : dq_cols<D>() / FRAG_COLS;
    if constexpr (!splits_dkv<D>()) {  // D <= 128: two floats a lane (no register to spare)
#pragma unroll
        for (int h = 0; h < FRAG_LANE_ROWS; ++h) {
            const int row = q0 + dq_part_row<D>(wg) + WARP_ROWS * warp + g + FRAG_ROW_STEP * h;
            if (row >= b.N) continue;
            const int col = dq_part_col<D>(wg) + FRAG_LANE_COLS * t;
            float *const out = TILED
                                   ? pb.call.dQ_acc + dq_tiled_offset(tiled_row + row, col,
                                                                      pb.call.dq_tiled, qrows<D>())
                                   : rows + (size_t)row * cols + col;
#pragma unroll
            for (int n = 0; n < dq_cols<D>() / FRAG_COLS; ++n) {
                if (n >= blocks) break;  // the tail of a smaller D
                red_add_f32x2(out + BLOCK_STEP * n, dQ_part[acc_index(n, h, 0)],
                              dQ_part[acc_index(n, h, 1)]);
            }
        }
    } else {
        // D = 256: lane t keeps its pair of block n + odd. TILED: the part's slabs in the query
        // tile at q0 (row_pad and head_pad are multiples of its rows), a row's 8 floats a slab.
        const bool odd = t & 1;
        float *const part = TILED ? pb.call.dQ_acc + (size_t)(tiled_row + q0) * pb.call.dq_tiled +
                                        dq_part_col<D>(wg) * qrows<D>()
                                  : rows + (size_t)q0 * cols + dq_part_col<D>(wg);
        const int row_floats = TILED ? DQ_SLAB_COLS : cols;
#pragma unroll
        for (int h = 0; h < FRAG_LANE_ROWS; ++h) {
            const int r = dq_part_row<D>(wg) + WARP_ROWS * warp + g + FRAG_ROW_STEP * h;
            const bool in = q0 + r < b.N;  // the quad's row: the swap below needs every lane
            float *const out = part + r * row_floats;
#pragma unroll
            for (int n = 0; n < dq_cols<D>() / FRAG_COLS; n += 2) {
                if (n >= blocks) break;
                const float a0 = dQ_part[acc_index(n, h, 0)], a1 = dQ_part[acc_index(n, h, 1)];
                if (n + 1 >= blocks) {  // the pair's second block is past D
                    if (in) red_add_f32x2(out + BLOCK_STEP * n + FRAG_LANE_COLS * t, a0, a1);
                    break;
                }
                const float4 v = quad_pairs_to_float4(a0, a1, dQ_part[acc_index(n + 1, h, 0)],
                                                      dQ_part[acc_index(n + 1, h, 1)], odd);
                if (in)
                    red_add_f32x4(out + BLOCK_STEP * (n + odd) + RED_LANE_COLS * (t / 2), v.x, v.y,
                                  v.z, v.w);
            }
        }
    }
}

// Query head `head` of the block's sequence's first query tile counted in tiles of qrows<D>() rows
// of lse2 (every sequence's rows of a head are padded to a multiple of ROW_PAD, itself of qrows:
// no tile shared between sequences; packed: the total queries plus a ROW_PAD per sequence, a head,
// fewer than 2^31); the next head's seq.head_pad / qrows tiles further. DQ_BY_BULK_IN_TURNS: where
// the head's counters start in dq_turn, query tile qt's at [qt]. dq_tiled: times ROW_PAD (qrows),
// the row of dQ_acc where its tiles start.
template <int D>
__host__ __device__ __forceinline__ int dq_turns_of(const block_place &b, int head) {
    return (int)((b.seq.row_pad + head * b.seq.head_pad) / qrows<D>());
}

// DQ_BY_BULK_IN_TURNS: wait for this key tile's turn at the query tile at q0 (dq_turn_of, under
// the rule of the block's sequence), whose counter is `turn`: until the key tiles before it in
// the order have all added theirs and the counter reads their number. Then the ordinary acquire
// is ordered before the bulk reduction that follows (a proxy fence).
template <int D>
__device__ __forceinline__ void wait_for_turn(const bwd_problem &pb, const block_place &b,
                                              const int *turn, int q0) {
    const int mine = dq_turn_of<D>(pb, b.keys, b.key_tile, q0);
    while (ld_acquire_gpu(turn) != mine) {
    }
    fence_proxy_async_global();
}

// DQ_BY_BULK_IN_TURNS: this key tile's reductions are complete (not only read: their adds are in
// dQ_acc), ordered before the ordinary release that follows (a proxy fence); the next key tile's
// turn.
__device__ __forceinline__ void pass_turn(int *turn) {
    bulk_wait<false>();
    fence_proxy_async_global();
    red_release_gpu_add(turn, 1);
}

// The dQ warp's lane 0: for each step of a work tile (the same walk as the loads), add the staged
// dQ_i to rows q0 .. q0 + qrows - 1 of the query head's tiles of dQ_acc (rows counted as lse2's:
// the rows past the sequence's N are its padding, which nothing reads, and those it adds there
// are zeros: P = 0 past N). DQ_BY_BULK, by
// parts: for each warpgroup in turn, wait until its warps have staged its part (its DQ_FULL), add
// the part, wait until the reduction has read it and hand it back (its DQ_EMPTY), so that a
// warpgroup ahead waits only for its own part's read; the adds of different blocks into the same
// rows land in any order, fp32 sums, not bitwise reproducible. DQ_BY_BULK_IN_TURNS
// (deterministic), as one tile: wait for the key tile's turn, then until every consumer warp has
// staged (DQ_FULL), add both parts, hand the tile back once read (DQ_EMPTY), wait until the adds
// are complete and pass the turn on. It waits for the turn before DQ_FULL (the poll off the path
// from the consumers' stores to the reduction) and hands the tile back once read, its adds
// completing while the consumers stage the next step's (LOG.md, step 36). With two dQ warps
// (dq_warps, `odd` which of them) each takes every other step on its own pair of barriers
// (dq_full_bar, dq_empty_bar): one waits for its adds and passes its turn while the other hands the
// next step's tile to the TMA unit. At the end it waits for its reductions to complete.
//
// Why DQ_BY_BULK_IN_TURNS cannot deadlock: a key tile waits only for key tiles earlier in its query
// tile's order (j' < j; under diagonal_order j' > j) of the same (sequence, key/value head), all
// below the sequence's keys (the blocks past them leave at once, block_has_keys), and the
// grid (key_tiles, B * H_kv) maps them to blocks of lower linear index (block_key_tile: under
// diagonal_order block x is key tile key_tiles - 1 - x); the GPU starts blocks in increasing
// linear index, so they are running or done when a block waits, and the lowest unfinished block
// waits for no one. They need not all be resident at once (as FlashAttention-3's deterministic
// backward, which relies on the same order). Two dQ warps add no cycle: a warp waits for its
// turn (other blocks) and for its own pair's DQ_FULL, which needs the consumers' stores, which
// need the other warp's DQ_EMPTY of the step before, which needs only that warp's turn. A
// rotated walk (walk_first) also waits for blocks of higher index: the host chooses it only where
// a head's key tiles are at most the GPU's multiprocessors (one block each), so that all of a
// head's blocks get one: those of earlier heads never wait for them, and later heads' start only
// after the last of them.
template <int D, dq_way DQ, bool TAIL>
__device__ __forceinline__ void reduce_dq_walk(const smem_tiles &sm, const bwd_problem &pb,
                                               const block_place &b, int odd, int &hand) {
    int tiles;
    const int first =
        walk_first<D, DQ>(pb, b, walk_tiles_of<D, true, TAIL>(pb, b.keys, b.key0, &tiles));
    // one loop over the block's steps (the load warp's walk), the head and the tile carried along
    // as the counters' place, the head's first tile counted as lse2's rows over qrows
    // (dq_turns_of): the warp runs on PRODUCER_REGS registers.
    const int head = b.kv_head * pb.group;  // the group's first query head
    int turns = dq_turns_of<D>(b, head);
    const int turns_apart = (int)(b.seq.head_pad / qrows<D>());  // a head's tiles
    int qt = first;                                              // the tile
    // two dQ warps (TWO): this one's steps are odd, odd + 2, ...; the walk's place carried along
    constexpr bool TWO = two_dq_warps<D, DQ>();
    constexpr int STRIDE = TWO ? 2 : 1;
    if constexpr (TWO)
        if (odd && ++qt == first + tiles) qt = first, turns += turns_apart;
    // the block's steps whose part the consumers stage (last_dq_by_reds: all but the last)
    // (every work tile of a persistent block has a step)
    const int staged = hand + pb.group * tiles - (last_dq_by_reds<D, DQ>() ? 1 : 0);
    for (int it = hand + (TWO ? odd : 0); it < staged; it += STRIDE) {
        const int q0 = walk_row<D, DQ>(pb, qt);
        int *const turn = pb.dq_turn + turns + q0 / qrows<D>();  // the query tile's counter
        const int row0 = turns * qrows<D>() + q0;  // the query tile's first row, as lse2's
        // LAB HOLE 4 BEGIN: dQ_i added by the TMA unit (reduce_dq_walk)
        // LAB TODO: the consumers stage the step's dQ_i in the staging tile (slabs of 8 floats, as
        // LAB TODO: dQ_acc's tiles lie); reduce_dq_part<D, DQ>(sm, pb, it, part, row0) adds part
        // LAB TODO: `part` of it to the query tile of dQ_acc at row0 by one bulk reduce-add of this
        // LAB TODO: thread. By parts (dq_by_parts: the default at D = 96, 128) warpgroup wg's part
        // LAB TODO: is part wg on pair wg (dq_full_bar(sm, wg), dq_empty_bar(sm, wg)): add each
        // LAB TODO: part as soon as it is staged and hand it back once read, so that neither
        // LAB TODO: warpgroup waits for the other's. Else the tile is part 0 on pair
        // LAB TODO: dq_pair<D, DQ>(it, 0), handed back once read. Deterministic
        // LAB TODO: (DQ_BY_BULK_IN_TURNS): the adds into a query tile in key-tile order, this key
        // LAB TODO: tile's after its turn at `turn` (wait_for_turn) and the next tile's after these
        // LAB TODO: are complete (pass_turn); keep both waits off the consumers' path: the turn's
        // LAB TODO: before their stores are in, the completion's after the tile is back. This
        // LAB TODO: warp's steps are every staged step, or with two dQ warps (TWO) every other one;
        // LAB TODO: phases: dq_phase<D, DQ>(it).
        // LAB STUB: for (int wg = 0; wg < (dq_by_parts<D, DQ>() ? CONSUMERS : 1); ++wg) {
        // LAB STUB:     mbar_wait(dq_full_bar(sm, dq_pair<D, DQ>(it, wg)), dq_phase<D, DQ>(it));
        // LAB STUB:     mbar_arrive(dq_empty_bar(sm, dq_pair<D, DQ>(it, wg)));  // nothing added
        // LAB STUB: }
        // LAB STUB: (void)row0, (void)turn;
        if constexpr (dq_by_parts<D, DQ>()) {
#pragma unroll
            for (int wg = 0; wg < CONSUMERS; ++wg) {
                mbar_wait(dq_full_bar(sm, wg), dq_phase<D, DQ>(it));  // the warpgroup's part staged
                reduce_dq_part<D, DQ>(sm, pb, it, wg, row0);
                bulk_commit();
                bulk_wait<true>();                  // the reduction has read the part
                mbar_arrive(dq_empty_bar(sm, wg));  // the part goes back
            }
            (void)turn;
        } else {
            const int pair = dq_pair<D, DQ>(it, 0);
            // the query tile's turn first, while the consumers still compute the step
            if constexpr (DQ == DQ_BY_BULK_IN_TURNS) wait_for_turn<D>(pb, b, turn, q0);
            mbar_wait(dq_full_bar(sm, pair), dq_phase<D, DQ>(it));  // the consumers' parts staged
            reduce_dq_part<D, DQ>(sm, pb, it, 0, row0);             // the tile
            bulk_commit();
            bulk_wait<true>();                    // the reduction has read the staging tile
            mbar_arrive(dq_empty_bar(sm, pair));  // the tile goes back
            // the adds complete while the consumers stage the next step's tile; the next turn
            if constexpr (DQ == DQ_BY_BULK_IN_TURNS) pass_turn(turn);
        }
        // LAB HOLE 4 END
#pragma unroll
        for (int k = 0; k < STRIDE; ++k)  // the next step of this warp's
            if (++qt == first + tiles) qt = first, turns += turns_apart;  // the next head
    }
    hand = staged;
}

// The dQ warp's lane 0 over the block's work tiles: its own, or a persistent block's as the load
// warp publishes them (take_work), each one's walk (reduce_dq_walk) counting its hand-overs
// (it there) on from the work tile before's.
template <int D, dq_way DQ, bool PERSISTENT, bool TAIL>
__device__ __forceinline__ void reduce_dq(const smem_tiles &sm, const bwd_problem &pb, int lane,
                                          int odd) {
    if (lane != 0) return;  // one thread issues the reductions
    int hand = 0;
    for (int n = 0;; ++n) {
        int w = 0;
        if constexpr (PERSISTENT) {
            w = take_work(sm, n);
            if (w >= pb.work_tiles) break;
        }
        const block_place b =
            block_place_of<D>(pb, PERSISTENT ? work_tile_at(pb, w) : own_work_tile<TAIL>(pb));
        reduce_dq_walk<D, DQ, TAIL>(sm, pb, b, odd, hand);
        if constexpr (!PERSISTENT) break;
    }
    bulk_wait<false>();  // every reduction done before the block's shared memory goes
}
