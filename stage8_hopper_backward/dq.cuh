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

// Where a consumer thread's first float of its dQ part goes in the swizzled staging tile (its
// slot's, DQ_BUFFERS being one): its part's first slab, its row (16 warp + g of the part's rows)
// and, in the row, the chunk of its first column pair (2t, 2t + 1 of an n8 block: chunk t / 2,
// XORed with the row's place in its swizzle atom, row % 8 = g) and the pair's place in it. The
// thread carries it through its steps (stage_dq), one register.
template <int D>
__device__ __forceinline__ uint32_t staging_lane_at(const smem_tiles &sm, int wg, int warp,
                                                    int lane) {
    static_assert(DQ_BUFFERS == 1, "one staging tile: the address is the same every step");
    constexpr int FLOAT_BYTES = sizeof(float), CHUNK_FLOATS = CHUNK_BYTES / FLOAT_BYTES;
    const int g = lane / QUAD, lane_col = FRAG_LANE_COLS * (lane % QUAD);
    return sm.dQ + dq_part_col<D>(wg) / DQ_SWIZZLED_SLAB_COLS * staging_slab_bytes<D>() +
           (dq_part_row<D>(wg) + WARP_ROWS * warp + g) * SLAB_ROW_BYTES +
           (g ^ lane_col / CHUNK_FLOATS) * CHUNK_BYTES + lane_col % CHUNK_FLOATS * FLOAT_BYTES;
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
// visible to the TMA unit (the async proxy), and arrive on DQ_FULL, one arrival per warp.
// Swizzled staging (D = 96, 128; config.cuh): n8 block n = 4s + k of the part lies in slab s at
// chunk pair k of the row, whose position is the thread's first XOR 32 k bytes (the swizzle
// permutes a row's chunks by XOR): `at` (staging_lane_at) is XORed in place with 32, 64, 32 and 64
// bytes in turn, visiting the pairs 0, 1, 3, 2 and coming back, so that the thread needs no
// register for the other three; each XOR is inline PTX so that it happens where it is written
// (the compiler would fold the four into constants off the one address: registers the consumers
// lack). A warp's store of one n8 block and row half (8 rows x 32 bytes) finds every bank twice.
// Else ([slabs][qrows][8] floats) it is 8 rows x 32 contiguous bytes. Neither has a bank
// conflict. The pairs and phases: dq_pair, dq_phase (smem.cuh).
template <int D, dq_way DQ>
__device__ __forceinline__ void stage_dq(const float (&dQ_acc)[dq_regs<D>()], const smem_tiles &sm,
                                         int wg, int warp, int lane, int it, uint32_t &at) {
    // the step before has had this part (this tile) read: on its DQ_EMPTY
    const int before = it - DQ_BUFFERS;
    mbar_wait(dq_empty_bar(sm, dq_pair<D, DQ>(before, wg)), dq_phase<D, DQ>(before));
    const int blocks = dq_part_cols<D>(wg) / FRAG_COLS;  // the part's n8 blocks
    if constexpr (swizzled_staging<D>()) {
        constexpr int PAIR_BYTES = FRAG_COLS * (int)sizeof(float);        // an n8 block's in a row
        constexpr int SLAB_BLOCKS = DQ_SWIZZLED_SLAB_COLS / FRAG_COLS;    // n8 blocks a slab
        constexpr int PART_SLABS = dq_cols<D>() / DQ_SWIZZLED_SLAB_COLS;  // slabs a part
        constexpr int GRAY[SLAB_BLOCKS] = {0, 1, 3, 2};  // the chunk pairs in turn: one bit apart
#pragma unroll
        for (int i = 0; i < SLAB_BLOCKS; ++i) {
            const int k = GRAY[i];
#pragma unroll
            for (int s = 0; s < PART_SLABS; ++s) {
                const int n = SLAB_BLOCKS * s + k;
                if (n >= blocks) continue;
                store_block_rows<D>(dQ_acc, n, at + s * staging_slab_bytes<D>(), SLAB_ROW_BYTES);
            }
            const uint32_t flip = (uint32_t)((k ^ GRAY[(i + 1) % SLAB_BLOCKS]) * PAIR_BYTES);
            asm volatile("xor.b32 %0, %0, %1;" : "+r"(at) : "r"(flip));  // the next pair's
        }
    } else {
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
    }
    fence_proxy_async();  // this thread's writes, visible to the TMA unit
    __syncwarp();         // the warp's writes are all in
    if (lane == 0) mbar_arrive(dq_full_bar(sm, dq_pair<D, DQ>(it, wg)));
}

// The dQ warp's lane 0: add part `part` of step it's staging tile (dq_reduced_cols of its columns
// from dq_part_col on: by parts the warpgroup's, else the whole tile, part 0) to the query tile
// whose first row is row0 of the map's head map_head (not committed). Swizzled staging: one bulk
// tensor reduction a slab, a slab whose columns all lie past the call's D (a kernel compiled for
// a larger head dim, or D = 96's padding) not issued; else one for the part's box of 8-float
// slabs (dq_tensor_map), the columns past D clipped.
template <int D, dq_way DQ>
__device__ __forceinline__ void reduce_dq_part(const CUtensorMap *tmdQ, const smem_tiles &sm,
                                               const bwd_problem &pb, int it, int part, int row0,
                                               int map_head) {
    const int col0 = dq_part_col<D>(part);
    if constexpr (swizzled_staging<D>()) {
#pragma unroll
        for (int slab = 0; slab < dq_reduced_cols<D, DQ>() / DQ_SWIZZLED_SLAB_COLS; ++slab) {
            const int col = col0 + slab * DQ_SWIZZLED_SLAB_COLS;
            if (col < pb.call.D)
                tma_reduce_add_3d(tmdQ,
                                  dq_part_at<D>(sm, it, part) + slab * staging_slab_bytes<D>(), col,
                                  row0, map_head);
        }
    } else if constexpr (dq_tiled<D, DQ>()) {
        // the staging tile is the query tile's [slabs][qrows][DQ_SLAB_COLS] floats of dQ_acc as
        // they lie there, a part's slabs together: one bulk copy of the part (by parts; the part's
        // columns, D = 96's second part 32) or of the tile. row0: the tile's first row counted as
        // lse2's (reduce_dq), a multiple of qrows
        static_assert(DQ_BUFFERS == 1, "the staging tile: one dQ_acc tile");
        constexpr int TILE_ROWS = qrows<D>();
        const int cols = dq_by_parts<D, DQ>() ? dq_part_cols<D>(part) : D;
        (void)tmdQ, (void)map_head;
        // (rows in 32 bits: dQ_acc's rows of D floats number far fewer than 2^31)
        float *const at = pb.call.dQ_acc + (size_t)(unsigned)row0 * D + col0 * TILE_ROWS;
        bulk_reduce_add_f32(at, dq_part_at<D>(sm, it, part),
                            (uint32_t)(cols * TILE_ROWS * (int)sizeof(float)));
    } else {  // (instantiated for variant atomics, whose dQ warp adds nothing)
        tma_reduce_add_4d(tmdQ, dq_part_at<D>(sm, it, part), 0, row0, col0 / DQ_SLAB_COLS,
                          map_head);
    }
}

// The columns of a row of dQ_acc, the tensors' D, as the adds from the registers of a kernel for
// head dim D know it: D itself where it runs only its own (variant atomics up to D = 128), else
// the call's (TAIL: the default variant's last part, last_dq_by_reds; D = 256's kernels, which
// run D = 136 to 256): a smaller D's tail masked, its columns skipped as the bulk reductions'
// clipping through tmdQ skips them.
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
// Four floats a reduction: lanes t and t ^ 1 of a quad swap pairs so that, of two n8 blocks n and
// n + 1 of a row, lane t holds the four consecutive columns 8 (n + (t & 1)) + 4 (t >> 1) .. + 3 (it
// keeps its own pair of block n + (t & 1) and takes its partner's pair of that block); a warp's
// reduction then covers 8 rows x 64 bytes where one of two floats a lane covered 16 rows x 32
// bytes, half the instructions and a quarter of the (row, instruction) pairs the L1 works through
// (16 a thread; rows past the sequence's N skipped). D = 64, 96 and 128 keep two floats a lane
// (16 a thread): their kernels have no register left for the swap (4 bytes spilled). A row is
// dq_acc_cols long, and the part's n8 blocks of columns at or past it (zeros: K_j is zero there)
// are skipped, as the bulk reductions' clipping does (the tensors' D is a multiple of 8: a block
// is all in or all out; at D = 256 a part ending on an odd block adds that block two floats a
// lane).
// TILED (dq_tiled): dQ_acc tiled as the staging tile, a row's n8 block n in slab n.
template <int D, bool TAIL = false, bool TILED = false>
__device__ __forceinline__ void add_dq_atomic(const float (&dQ_part)[dq_regs<D>()],
                                              const bwd_problem &pb, const block_place &b, int wg,
                                              int warp, int lane, int head, int q0) {
    static_assert(dq_cols<D>() % RED_PAIR_COLS == 0, "a part's n8 blocks come in pairs");
    static_assert(!TILED || !splits_dkv<D>(), "tiled: D = 64's rows of 8-float slabs");
    const int g = lane / QUAD, t = lane % QUAD;
    const int cols = dq_acc_cols<D, TAIL>(pb);
    float *const rows = pb.call.dQ_acc + (size_t)(b.seq.row_acc + head * b.seq.head_acc) * cols;
    const long long tiled_row = b.seq.row_pad + head * b.seq.head_pad;  // (TILED: row 0's)
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
            // the next n8 block: the next slab (TILED), or the next 8 floats of the row
            constexpr int BLOCK_STEP = TILED ? qrows<D>() * DQ_SLAB_COLS : FRAG_COLS;
#pragma unroll
            for (int n = 0; n < dq_cols<D>() / FRAG_COLS; ++n) {
                if (n >= blocks) break;  // the tail of a smaller D
                red_add_f32x2(out + BLOCK_STEP * n, dQ_part[acc_index(n, h, 0)],
                              dQ_part[acc_index(n, h, 1)]);
            }
        }
    } else {
        // D = 256: lane t keeps its pair of block n + odd
        const bool odd = t & 1;
#pragma unroll
        for (int h = 0; h < FRAG_LANE_ROWS; ++h) {
            const int row = q0 + dq_part_row<D>(wg) + WARP_ROWS * warp + g + FRAG_ROW_STEP * h;
            const bool in = row < b.N;  // the quad's row: the swap below needs every lane
            float *const out = rows + (size_t)row * cols + dq_part_col<D>(wg);
#pragma unroll
            for (int n = 0; n < dq_cols<D>() / FRAG_COLS; n += 2) {
                if (n >= blocks) break;
                const float a0 = dQ_part[acc_index(n, h, 0)], a1 = dQ_part[acc_index(n, h, 1)];
                if (n + 1 >= blocks) {  // the pair's second block is past D
                    if (in) red_add_f32x2(out + FRAG_COLS * n + FRAG_LANE_COLS * t, a0, a1);
                    break;
                }
                const float b0 = dQ_part[acc_index(n + 1, h, 0)];
                const float b1 = dQ_part[acc_index(n + 1, h, 1)];
                const float r0 = __shfl_xor_sync(FULL_WARP, odd ? a0 : b0, 1);  // the partner's
                const float r1 = __shfl_xor_sync(FULL_WARP, odd ? a1 : b1, 1);  // pair of my block
                if (in)
                    red_add_f32x4(out + FRAG_COLS * (n + odd) + RED_LANE_COLS * (t / 2),
                                  odd ? r0 : a0, odd ? r1 : a1, odd ? b0 : r0, odd ? b1 : r1);
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
__device__ __forceinline__ void wait_for_turn(const bwd_problem &pb, const key_rule &keys,
                                              const int *turn, int q0) {
    const int mine = dq_turn_of<D>(pb, keys, block_key_tile(pb), q0);
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

// The dQ warp's lane 0: for each step of the block (the same walk as the loads), add the staged
// dQ_i to rows q0 .. q0 + qrows - 1 of the query head's rows of dQ_acc (at dq_map_coords:
// unpacked, rows past N skipped by the TMA unit; packed, the rows past the sequence's N are its
// padding, which nothing reads, and those it adds there are zeros: P = 0 past N). DQ_BY_BULK, by
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
template <int D, dq_way DQ>
__device__ __forceinline__ void reduce_dq(const smem_tiles &sm, const CUtensorMap *tmdQ,
                                          const bwd_problem &pb, int lane, int odd) {
    const block_place b = block_place_of<D>(pb);
    if (lane != 0) return;  // one thread issues the reductions
    int tiles;
    const int first = walk_first<D, DQ>(pb, query_tiles_of<D>(b.keys, b.key0, &tiles));
    // one loop over the block's steps (the load warp's walk), the head and the tile carried along
    // as the map's coordinates and the counters' place: the warp runs on PRODUCER_REGS registers.
    // dq_map_coords of (head, row i) is its row 0's {row + i, head}, and head h + 1's head
    // coordinate is h's plus one.
    const int head = b.kv_head * pb.group;  // the group's first query head
    const int2 at = dq_map_coords(pb.call, b.seq, b.batch, head, 0);
    int map_head = at.y;
    constexpr bool TILES = DQ == DQ_BY_BULK_IN_TURNS || dq_tiled<D, DQ>();  // counted as tiles
    int turns = TILES ? dq_turns_of<D>(b, head) : 0;
    const int turns_apart = (int)(b.seq.head_pad / qrows<D>());  // a head's counters
    int qt = first;                                              // the tile
    // two dQ warps (TWO): this one's steps are odd, odd + 2, ...; the walk's place carried along
    constexpr bool TWO = two_dq_warps<D, DQ>();
    constexpr int STRIDE = TWO ? 2 : 1;
    if constexpr (TWO)
        if (odd && ++qt == first + tiles) qt = first, ++map_head, turns += turns_apart;
    // the block's steps whose part the consumers stage (last_dq_by_reds: all but the last)
    const int staged = pb.group * tiles - (last_dq_by_reds<D, DQ>() ? 1 : 0);
    for (int it = TWO ? odd : 0; it < staged; it += STRIDE) {
        const int q0 = walk_row<D, DQ>(pb, qt);
        int *const turn = pb.dq_turn + turns + q0 / qrows<D>();  // the query tile's counter
        // the query tile's first row: of the map's head (at.x: packed, the sequence's first), or
        // counted as lse2's (dq_tiled)
        const int row0 = dq_tiled<D, DQ>() ? turns * qrows<D>() + q0 : at.x + q0;
        // LAB HOLE 4 BEGIN: dQ_i added by the TMA unit (reduce_dq)
        // LAB TODO: the consumers stage the step's dQ_i in the staging tile (128-byte swizzled
        // LAB TODO: slabs of 32 floats, the boxes tmdQ adds: columns, row, head);
        // LAB TODO: reduce_dq_part<D, DQ>(tmdQ, sm, pb, it, part, row0, map_head) adds part
        // LAB TODO: `part` of it to the step's rows of dQ_acc by bulk tensor reductions of this
        // LAB TODO: thread. By parts (dq_by_parts: the default at D = 96, 128) warpgroup wg's part
        // LAB TODO: is part wg on pair wg (dq_full_bar(sm, wg), dq_empty_bar(sm, wg)): add each
        // LAB TODO: part as soon as it is staged and hand it back once read, so that neither
        // LAB TODO: warpgroup waits for the other's. Else the tile is part 0 on pair
        // LAB TODO: dq_pair<D, DQ>(it, 0),
        // LAB TODO: handed back once read. Deterministic (DQ_BY_BULK_IN_TURNS): the adds into a
        // LAB TODO: query tile in key-tile order, this key tile's after its turn at `turn`
        // LAB TODO: (wait_for_turn) and the next tile's after these are complete (pass_turn);
        // LAB TODO: keep both waits off the consumers' path: the turn's before their stores are
        // LAB TODO: in, the completion's after the tile is back. This warp's steps are every
        // LAB TODO: staged step, or with two dQ warps (TWO) every other one; phases:
        // LAB TODO: dq_phase<D, DQ>(it).
        // LAB STUB: for (int wg = 0; wg < (dq_by_parts<D, DQ>() ? CONSUMERS : 1); ++wg) {
        // LAB STUB:     mbar_wait(dq_full_bar(sm, dq_pair<D, DQ>(it, wg)), dq_phase<D, DQ>(it));
        // LAB STUB:     mbar_arrive(dq_empty_bar(sm, dq_pair<D, DQ>(it, wg)));  // nothing added
        // LAB STUB: }
        // LAB STUB: (void)row0, (void)turn;
        if constexpr (dq_by_parts<D, DQ>()) {
#pragma unroll
            for (int wg = 0; wg < CONSUMERS; ++wg) {
                mbar_wait(dq_full_bar(sm, wg), dq_phase<D, DQ>(it));  // the warpgroup's part staged
                reduce_dq_part<D, DQ>(tmdQ, sm, pb, it, wg, row0, map_head);
                bulk_commit();
                bulk_wait<true>();                  // the reduction has read the part
                mbar_arrive(dq_empty_bar(sm, wg));  // the part goes back
            }
            (void)turn;
        } else {
            const int pair = dq_pair<D, DQ>(it, 0);
            // the query tile's turn first, while the consumers still compute the step
            if constexpr (DQ == DQ_BY_BULK_IN_TURNS) wait_for_turn<D>(pb, b.keys, turn, q0);
            mbar_wait(dq_full_bar(sm, pair), dq_phase<D, DQ>(it));  // the consumers' parts staged
            reduce_dq_part<D, DQ>(tmdQ, sm, pb, it, 0, row0, map_head);  // the tile
            bulk_commit();
            bulk_wait<true>();                    // the reduction has read the staging tile
            mbar_arrive(dq_empty_bar(sm, pair));  // the tile goes back
            // the adds complete while the consumers stage the next step's tile; the next turn
            if constexpr (DQ == DQ_BY_BULK_IN_TURNS) pass_turn(turn);
        }
        // LAB HOLE 4 END
#pragma unroll
        for (int k = 0; k < STRIDE; ++k)  // the next step of this warp's
            if (++qt == first + tiles) qt = first, ++map_head, turns += turns_apart;  // next head
    }
    bulk_wait<false>();  // every reduction done before the block's shared memory goes
}
