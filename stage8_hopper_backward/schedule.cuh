/*
 * stage8_hopper_backward/schedule.cuh: who works on what. The parameters every thread of the main
 * kernel reads (bwd_problem), a block's key tile, (sequence, key/value head) and its sequence's
 * rows (block_place_of), the query tiles it meets (query_tiles_of) and its walk over them, step by
 * step (walk_step, next_step), and the deterministic variant's order of the adds into a query tile
 * (dq_turn_of). A consumer thread's place in its warpgroups (consumer_place) is
 * common/device/sm90.cuh's.
 */
#pragma once

#include "config.cuh"
#include "device/split_kv.cuh"  // key_rule: which keys a query row sees (causal, local windows)

// One work tile: key tile j = block_key_tile() (keys key0 = block_keys<D>() j .. of its sequence)
// of (batch, key/value head) block_head_index() = batch * H_kv + kv_head; it walks the group's
// query heads kv_head * group .. (kv_head + 1) * group - 1, each over the query tiles that see its
// keys. A block works one work tile, its place in the grid, or, persistent (tile_counter), one
// after another as they are handed out (work_tile). A packed batch (call.varlen) plans the grid
// with the longest sequence's N_k: a block whose key tile starts at or past its own sequence's
// keys does nothing (block_has_keys), every role alike. The shape's N, N_k (packed: the longest
// sequence's) are call's.
typedef struct {
    int H, H_kv, group;  // query heads, key/value heads, H / H_kv
    // The mask (attention.h's attn_key_range): query i sits on key i + N_k - N and sees `left`
    // keys before it and `right` after it, -1 unbounded (split_kv.cuh's key_rule: causal is
    // (-1, 0)); a block applies it with its sequence's own N and N_k (block_place).
    key_rule keys;
    int key_tiles;       // ceil(N_k / block_keys<D>()): the grid's x (section_shift: its part)
    int diagonal_order;  // DQ_BY_BULK_IN_TURNS with a right bound (causal): see dq_turn_of()
    float scale, scale_log2;
    // Softcap c (attention.h): the capped score in log2 units is c log2(e) tanh(S scale / c), S
    // the raw q . k: cap_in = scale / c, cap_log2 = c log2(e); both 0 without a softcap.
    float cap_in, cap_log2;
    // The call as the passes before and after read it (common/device/backward_prepost.cuh): the
    // tensors and their strides, a packed batch's cu_seqlens, and the workspace: lse2, Dsum
    // (LSE * log2(e) and D_i, a float per padded query row; +inf and 0 past a sequence's N) and
    // dQ_acc (fp32, contiguous: DQ_BY_ATOMICS's adds; DQ_BY_BULK's go through tmdQ), each
    // sequence's rows where bwd_sequence_of() places them.
    bwd_params call;
    // DQ_BY_BULK_IN_TURNS: per query tile of every (sequence, head), the key tiles that have added
    // into it, at the tile's first row's place in lse2 divided by qrows<D>() (dq_turns_of)
    int *dq_turn;
    // DQ_BY_BULK_IN_TURNS with no mask, one length for every sequence and as many query tiles as
    // key tiles at least: each block's walk starts at the query tile of its key tile's index and
    // wraps (walk_first, walk_row, dq_turn_of), where the GPU holds every block of a head at once
    // (key_tiles <= its multiprocessors) and the walk measured faster (launch.cuh)
    int rotated_walk;
    int walk_rows;  // rotated_walk: a head's query tiles' rows (T qrows), else INT_MAX (walk_row)
    // Split walks (own_share, walk_tiles_of): every work tile's walk in gridDim.z shares (a grid
    // that fills at most half of the GPU), or a tail split's, the walks of the work tiles from
    // tail_first on in tail_shares shares each (a 1-D grid: launch.cuh, backward_prepost.cuh's
    // tail_split_for; tail_first INT_MAX and tail_shares 1 elsewhere). Each share's dK_j and dV_j
    // in fp32, unscaled, [B H_kv][key_tiles block_keys][shares][2][D] floats (D the kernel's; dK's
    // D, then dV's) from the first split work tile's first key on (dkv_part_at), for
    // dkv_sum_kernel; NULL where no walk is split
    float *dkv_part;
    // The grid of work tiles (key_tiles << s, B H_kv >> s): its width (section_shift) and the
    // number of work tiles. A persistent grid (one block per multiprocessor, 1-D): its blocks start
    // with work tile blockIdx.x and take the next from the counter (next_work_tile), zeroed before
    // the call's preprocess (launch.cuh); NULL where the grid is the work tiles' own.
    int grid_x, work_tiles;
    int *tile_counter;
    int tail_first, tail_shares;  // (last: the plain kernels' parameters keep their places)
} bwd_problem;

// A work tile's place in the grid of work tiles, as a key tile's index and a (batch, key/value
// head)'s. The GPU starts blocks in blockIdx.x's order first, and a persistent grid hands the work
// tiles out in the same order (x first). Under a causal mask (launch.cuh's section_shift_of) the
// grid is (key_tiles << s, B H_kv >> s): heads by sections of 2^s, whose key tile 0 starts
// first, then their key tile 1, and so on, the longest blocks first among heads few enough that
// their Q, dO and dQ_acc stay in the L2. Elsewhere s = 0: (key_tiles, B H_kv). s is the grid's
// width over key_tiles, as a shift.
// (grid_x: the grid's width, the block's own gridDim.x or a persistent grid's pb.grid_x)
typedef struct {
    int x, y, grid_x;
} work_tile;
__device__ __forceinline__ work_tile work_tile_at(const bwd_problem &pb, int w) {  // (w: its index)
    const int y = w / pb.grid_x;
    return {w - y * pb.grid_x, y, pb.grid_x};
}
// The grid's block's own work tile: its place in the grid, or in a tail split's 1-D grid the
// work tile of its index, the split ones' blocks tail_shares to a work tile (the walks' shares
// one after another).
template <bool TAIL>
__device__ __forceinline__ work_tile own_work_tile(const bwd_problem &pb) {
    const int block = (int)blockIdx.x;
    if (!TAIL || pb.tail_first == INT_MAX) return {block, (int)blockIdx.y, (int)gridDim.x};
    const int past = block - pb.tail_first;
    return work_tile_at(pb, past < 0 ? block : pb.tail_first + past / pb.tail_shares);
}
// Whether the block's walk is split (own_share's shares > 1, without its arithmetic).
template <bool TAIL>
__device__ __forceinline__ bool own_walk_split(const bwd_problem &pb) {
    return gridDim.z > 1 || (TAIL && (int)blockIdx.x >= pb.tail_first);
}
// The block's share of its work tile's walk, and the walk's shares (one: the whole walk).
typedef struct {
    int z, shares;
} walk_share;
template <bool TAIL>
__device__ __forceinline__ walk_share own_share(const bwd_problem &pb) {
    if (!TAIL || gridDim.z > 1) return {(int)blockIdx.z, (int)gridDim.z};
    const int past = (int)blockIdx.x - pb.tail_first;  // (a tail split's grid is 1-D)
    return past < 0 ? walk_share{0, 1} : walk_share{past % pb.tail_shares, pb.tail_shares};
}
__device__ __forceinline__ int section_shift(const bwd_problem &pb, work_tile wt) {
    return __clz(pb.key_tiles) - __clz(wt.grid_x);
}
__device__ __forceinline__ int block_key_index(const bwd_problem &pb, work_tile wt) {
    return wt.x >> section_shift(pb, wt);
}
__device__ __forceinline__ int block_head_index(const bwd_problem &pb, work_tile wt) {
    const int shift = section_shift(pb, wt);
    return (wt.y << shift) | (wt.x & ((1 << shift) - 1));
}

// The work tile's key tile: block_key_index(), or with diagonal_order the last key tile first (the
// grid runs them from the diagonal's end down, so that the tile a block waits for started
// earlier).
__device__ __forceinline__ int block_key_tile(const bwd_problem &pb, work_tile wt) {
    const int j = block_key_index(pb, wt);
    return pb.diagonal_order ? pb.key_tiles - 1 - j : j;
}

// A persistent block's next work tile: the next one not yet taken (the counter hands out work
// tiles gridDim.x, gridDim.x + 1, ...; the blocks start with 0 .. gridDim.x - 1), or past the
// last one, "stop" (work_tiles or more). Read only after the pass that zeroes the counter has
// ended (producer.cuh: after the PDL wait).
__device__ __forceinline__ int next_work_tile(const bwd_problem &pb) {
    // (the counter's address read here, not once ahead of the load warp's loop and held across it
    // in two of its 24 registers)
    int *const counter = *(int *const volatile *)&pb.tile_counter;
    return take_from_counter(counter);
}

// Where a work tile lies: its first key key0 = block_keys<D>() block_key_tile() (within its
// sequence), the sequence (batch) and key/value head, and the sequence's rows (bwd_sequence_of: in
// the tensors, seq.seq.q_row and k_row, 0 unpacked; in lse2, Dsum and dQ_acc) with its own lengths
// N, N_k and mask (keys: the shape's window over them; see_lo, see_hi: the same bounds on j - i,
// key j seen by query i when see_lo <= j - i <= see_hi, INT_MIN and INT_MAX unbounded, and j <
// N_k). tile_batch: the batch coordinate of the tensor maps, 0 for a packed batch (one [total,
// heads, D] tensor each: launch.cuh).
// key_index: block_key_index() (walk_first), key_tile: block_key_tile() (the dQ turns).
typedef struct {
    int key0, batch, kv_head, tile_batch;
    int key_index, key_tile;
    int N, N_k;  // the sequence's queries and keys
    bwd_sequence seq;
    key_rule keys;
    int see_lo, see_hi;
} block_place;

// The mask of a sequence of N queries and N_k keys (b.N, b.N_k): query i sits on key i + N_k - N.
__host__ __device__ __forceinline__ void sequence_mask(block_place &b, const bwd_problem &pb) {
    b.keys = {b.N, b.N_k, pb.keys.left, pb.keys.right};
    const int shift = b.N_k - b.N;  // (each below 2^30: no overflow)
    b.see_lo = pb.keys.left < 0 ? INT_MIN : shift - pb.keys.left;
    b.see_hi = pb.keys.right < 0 ? INT_MAX : shift + pb.keys.right;
}

template <int D>
__device__ __forceinline__ block_place block_place_of(const bwd_problem &pb, work_tile wt) {
    block_place b;
    b.key_index = block_key_index(pb, wt);
    b.key_tile = block_key_tile(pb, wt);
    b.key0 = b.key_tile * block_keys<D>();
    const int bh = block_head_index(pb, wt);
    b.batch = bh / pb.H_kv;
    b.kv_head = bh % pb.H_kv;
    const bool packed = pb.call.varlen.cu_seqlens_q != NULL;
    b.tile_batch = packed ? 0 : b.batch;
    b.seq = bwd_sequence_of(pb.call, b.batch);
    b.N = b.seq.seq.N, b.N_k = b.seq.seq.N_k;
    sequence_mask(b, pb);
    return b;
}

// Whether the block's key tile holds keys of its sequence (unpacked always: the grid covers N_k):
// one that does not (a packed sequence shorter than the longest) has no keys to give gradients
// to, and no query tile of its sequence waits for it (dq_turn_of counts the key tiles below N_k).
template <int D>
__device__ __forceinline__ bool block_has_keys(const bwd_problem &pb, work_tile wt) {
    const block_place b = block_place_of<D>(pb, wt);
    return b.key0 < b.N_k;
}

// DQ_BY_BULK_IN_TURNS: how many key tiles add into the query tile at q0 before key tile j does (its
// turn), under `keys`, the rule of the block's sequence (block_place: its own N, N_k, so that
// j_max is below its own key tiles).
// The key tiles that meet a query tile are always j_min .. j_max, the keys its rows see (0 ..
// N_k - 1 with no mask; a left bound raises j_min, causal or a right bound lowers j_max:
// split_kv.cuh's rule, the forward's). In key-tile order j's turn is j - j_min: with no left
// bound every block starts at query tile 0. With a right bound (diagonal_order) the adds go from
// j_max down to j_min, so the block that starts at a query tile, the one on its diagonal, adds
// first there and never waits at its start, and each block waits only for the one above it (key
// tile j + 1), a step ahead on the same walk. In key-tile order instead, key tile j would wait at
// its first query tile for key tiles j_min .. j - 1 to walk up to it: a staircase of idle blocks
// (LOG.md, step 4's measurement).
// With a right bound, j_max is query_tile_key_end's last key's tile, here in 32 bits (the dQ warp
// works it out at each step on PRODUCER_REGS registers): the end of the keys the tile's rows see,
// min(last row's diagonal + 1 + right, N_k), as min(.., N_k - right) + right, every term below
// 2^31 in magnitude (N, N_k <= 2^30, right <= the shape's N_k); at least the block's first key
// + 1, as the block meets the tile.
// With rotated_walk (no mask: every key tile 0 .. J - 1 meets every query tile 0 .. T - 1, J <=
// T) block j starts at query tile j and wraps, so it reaches tile q at step (q - j) mod T, and
// the turns at q follow those steps: the blocks j <= m = min(q, J - 1) first, from m down (steps
// q - m .. q), then the rest from J - 1 down (steps past T - J + q). A block meets no block one
// step ahead on its own tile until the walk wraps: no staircase at the start (LOG.md, step 38).
template <int D>
__host__ __device__ __forceinline__ int dq_turn_of(const bwd_problem &pb, const key_rule &keys,
                                                   int j, int q0) {
    if (pb.rotated_walk) {  // (the deterministic variant's alone, as the turns)
        const int m = min(q0 / qrows<D>(), pb.key_tiles - 1);
        return j <= m ? m - j : m + pb.key_tiles - j;
    }
    if (!pb.diagonal_order) return j - query_tile_first_key_tile(keys, q0, block_keys<D>());
    const int diagonal_end = min(q0 + qrows<D>(), keys.N) + keys.N_k - keys.N;
    const int key_end = min(diagonal_end, keys.N_k - keys.right) + keys.right;
    return (key_end - 1) / block_keys<D>() - j;
}

// The query tiles a key tile meets: the inverse of split_kv.cuh's rule (the key tiles a query
// tile sees). Query i sees key j when i + shift - left <= j <= i + shift + right (shift = N_k -
// N; a bound -1 is no bound), so the keys key0 .. last_key are seen by the rows from
// key0 - shift - right (with a right bound, else 0) to last_key - shift + left (with a left
// bound, else N - 1), clipped to 0 .. N - 1 (none when the first is past the last): every row
// between sees one of them, as its keys run from its own lo to hi and both grow by one a row.
// Returns the first tile of those rows; *count the number (0: no query sees these keys; their
// dK, dV are zero). Each bound below 2^31: N, N_k <= 2^30. r: the rule of the block's sequence
// (block_place.keys; packed, its own N and N_k).
template <int D>
__host__ __device__ __forceinline__ int query_tiles_of(const key_rule &r, int key0, int *count) {
    const int shift = r.N_k - r.N, last_key = min(key0 + block_keys<D>(), r.N_k) - 1;
    const int first_row = r.right < 0 ? 0 : max(0, key0 - shift - r.right);
    const int end_row = r.left < 0 ? r.N : min(r.N, last_key - shift + r.left + 1);  // past last
    const int first = first_row / qrows<D>();
    *count = first_row < end_row ? (end_row + qrows<D>() - 1) / qrows<D>() - first : 0;
    return first;
}
// The query tiles of the block's walk: query_tiles_of's, or where the walk is split (own_share;
// backward_prepost.cuh: WALK_SHARES_MAX) the block's share of them (share_of_tiles), walked for
// every head of the group as a whole walk is (so every role's loop is the whole walk's, over fewer
// tiles). SPLIT false: a grid that splits no walk (a persistent one).
template <int D, bool SPLIT, bool TAIL>
__device__ __forceinline__ int walk_tiles_of(const bwd_problem &pb, const key_rule &r, int key0,
                                             int *count) {
    int first = query_tiles_of<D>(r, key0, count);
    if constexpr (SPLIT) {
        const walk_share share = own_share<TAIL>(pb);
        share_of_tiles(count, &first, share.shares, share.z);
    }
    return first;
}

// A persistent block's consumers carry their counts from one work tile to the next in one register
// (their walks leave few: two registers for them spilled at D = 128, LOG.md, step 84): the block's
// steps so far modulo RING_STEPS, with which every ring's slots and phases repeat (the Q/dO slots
// every 2 Q_STAGES steps, the dS^T buffers every 2 DS_BUFFERS, the staging tile every 2), and its
// work tiles so far modulo WORK_PERIOD (the work slots every 2 WORK_SLOTS, the barriers met once a
// work tile every 2), and whether the block is past its first work tile.
constexpr int RING_STEPS = 12, WORK_PERIOD = 4;
constexpr int COUNT_TILES_SHIFT = 4, COUNT_LATER = 1 << (COUNT_TILES_SHIFT + 2);
static_assert(RING_STEPS % (2 * Q_STAGES) == 0 && RING_STEPS % (2 * DS_BUFFERS) == 0 &&
                  RING_STEPS % (2 * DQ_BUFFERS) == 0 && RING_STEPS < (1 << COUNT_TILES_SHIFT) &&
                  WORK_PERIOD % (2 * WORK_SLOTS) == 0 && WORK_PERIOD == 4,
              "every ring repeats within the counts' periods, which fit their bits");
typedef struct {
    int bits;  // steps (mod RING_STEPS) | work tiles (mod WORK_PERIOD) << 4 | COUNT_LATER
} block_counts;
__device__ __forceinline__ int counted_steps(block_counts c) {
    return c.bits & ((1 << COUNT_TILES_SHIFT) - 1);
}
__device__ __forceinline__ int counted_tiles(block_counts c) {
    return (c.bits >> COUNT_TILES_SHIFT) & (WORK_PERIOD - 1);
}
__device__ __forceinline__ bool past_first_tile(block_counts c) {
    return c.bits >= COUNT_LATER;
}
__device__ __forceinline__ block_counts counts_after_tile(block_counts c, int steps) {
    const int tiles = (counted_tiles(c) + 1) % WORK_PERIOD;
    return {(counted_steps(c) + steps) % RING_STEPS | tiles << COUNT_TILES_SHIFT | COUNT_LATER};
}

// A step of the block's walk (every query tile that meets its keys, of every query head of the
// group, head by head): its place in the block's steps (it: the rings' count, which runs on over
// a persistent block's work tiles), how far the staging tile's count lags it (hands_behind: the
// work tiles before whose last dQ part went by reductions, last_dq_by_reds; its hand-over is
// it - hands_behind), the query head and its first query (within the sequence).
typedef struct {
    int it, hands_behind, head, q0;
} walk_step;
__device__ __forceinline__ int hand_over_of(const walk_step &s) {
    return s.it - s.hands_behind;
}

// The next step of the walk: the next query tile of the head, or, past the head's last (q_end),
// the first (q_first) of the next head.
__device__ __forceinline__ walk_step next_step(walk_step s, int q_first, int q_end, int rows) {
    ++s.it;
    s.q0 += rows;
    if (s.q0 == q_end) s.q0 = q_first, ++s.head;
    return s;
}

// A rotated walk (rotates_walk, rotated_walk): block j walks each head's tiles j, j + 1, ..,
// T - 1, 0, .., j - 1 (dq_turn_of). The load warp and the dQ warps run it as the plain walk over
// the tiles j .. j + T - 1 (walk_first: the first of them; with no mask the plain first is 0),
// and the tile a step reads is its index less T past the last (walk_row, against walk_rows in the
// parameters: INT_MAX when not rotated), so that their loops on PRODUCER_REGS registers are the
// plain ones and each step adds a compare with a constant. The consumers walk in the plain order
// either way: a rotated walk has no mask, where a step's query tile decides nothing the consumers
// compute (step_needs_mask and key_seen compare it only with the bounds, absent), and their ring
// slots and phases are the step's count.
template <int D, dq_way DQ>
__device__ __forceinline__ int walk_first(const bwd_problem &pb, const block_place &b, int first) {
    if constexpr (rotates_walk<DQ>())
        if (pb.rotated_walk) return b.key_index;
    return first;
}
// The first row of the tile step qt of a walk reads (see walk_first).
template <int D, dq_way DQ>
__device__ __forceinline__ int walk_row(const bwd_problem &pb, int qt) {
    int q0 = qt * qrows<D>();
    if constexpr (rotates_walk<DQ>())
        if (q0 >= pb.walk_rows) q0 -= pb.walk_rows;
    return q0;
}
