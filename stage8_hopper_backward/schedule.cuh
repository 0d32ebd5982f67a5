/*
 * stage8_hopper_backward/schedule.cuh: who works on what. The parameters every thread of the main
 * kernel reads (bwd_problem), a block's key tile and (batch, key/value head) (block_place_of), the
 * query tiles it meets (query_tiles_of) and its walk over them, step by step (walk_step,
 * next_step), and the deterministic variant's order of the adds into a query tile (dq_turn_of).
 * A consumer thread's place in its warpgroups (consumer_place) is common/device/sm90.cuh's.
 */
#pragma once

#include "config.cuh"
#include "device/split_kv.cuh"  // key_rule: which keys a query row sees (causal, local windows)

// One block: key tile j = block_key_tile() (keys key0 = KEYS j ..) of (batch, key/value head)
// blockIdx.y = batch * H_kv + kv_head; it walks the group's query heads kv_head * group ..
// (kv_head + 1) * group - 1, each over the query tiles that see its keys.
typedef struct {
    int N, N_k, N_pad;   // queries, keys, N rounded up to ROW_PAD (lse2's and Dsum's rows)
    int H, H_kv, group;  // query heads, key/value heads, H / H_kv
    // The mask (attention.h's attn_key_range): query i sits on key i + N_k - N and sees `left`
    // keys before it and `right` after it, -1 unbounded (split_kv.cuh's key_rule: causal is
    // (-1, 0)); the same bounds on j - i: key j is seen by query i when
    // see_lo <= j - i <= see_hi (INT_MIN, INT_MAX when unbounded).
    key_rule keys;
    int see_lo, see_hi;
    int q_tiles;         // ceil(N / qrows<D>())
    int key_tiles;       // ceil(N_k / KEYS): the grid's x
    int diagonal_order;  // DQ_BY_BULK_IN_TURNS with a right bound (causal): see dq_turn_of()
    float scale, scale_log2;
    // Softcap c (attention.h): the capped score in log2 units is c log2(e) tanh(S scale / c), S
    // the raw q . k: cap_in = scale / c, cap_log2 = c log2(e); both 0 without a softcap.
    float cap_in, cap_log2;
    const float *lse2;  // [B * H, N_pad]: LSE * log2(e), +inf past N (preprocess_kernel)
    const float *Dsum;  // [B * H, N_pad]: D_i = rowsum(dO_i * O_i), 0 past N
    float *dQ_acc;  // [B * H, N, D] fp32, contiguous (DQ_BY_ATOMICS's adds; DQ_BY_BULK's via tmdQ)
    int *
        dq_turn;  // [B * H, q_tiles]: key tiles that have added into the tile (DQ_BY_BULK_IN_TURNS)
} bwd_problem;

// The block's key tile: blockIdx.x, or with diagonal_order the last key tile first (the grid
// runs them from the diagonal's end down, so that the tile a block waits for started earlier).
__device__ __forceinline__ int block_key_tile(const bwd_problem &pb) {
    return pb.diagonal_order ? pb.key_tiles - 1 - (int)blockIdx.x : (int)blockIdx.x;
}

// Where the block works: its first key (key0 = KEYS block_key_tile()), batch and key/value head.
typedef struct {
    int key0, batch, kv_head;
} block_place;

__device__ __forceinline__ block_place block_place_of(const bwd_problem &pb) {
    block_place b;
    b.key0 = block_key_tile(pb) * KEYS;
    b.batch = (int)blockIdx.y / pb.H_kv;
    b.kv_head = (int)blockIdx.y % pb.H_kv;
    return b;
}

// DQ_BY_BULK_IN_TURNS: how many key tiles add into query tile qt before key tile j does (its turn).
// The key tiles that meet a query tile are always j_min .. j_max, the keys its rows see (0 ..
// N_k - 1 with no mask; a left bound raises j_min, causal or a right bound lowers j_max:
// split_kv.cuh's rule, the forward's). In key-tile order j's turn is j - j_min: with no left
// bound every block starts at query tile 0. With a right bound (diagonal_order) the adds go from
// j_max down to j_min, so the block that starts at a query tile, the one on its diagonal, adds
// first there and never waits at its start, and each block waits only for the one above it (key
// tile j + 1), a step ahead on the same walk. In key-tile order instead, key tile j would wait at
// its first query tile for key tiles j_min .. j - 1 to walk up to it: a staircase of idle blocks
// (LOG.md, step 4's measurement).
template <int D>
__host__ __device__ __forceinline__ int dq_turn_of(const bwd_problem &pb, int j, int qt) {
    const int q0 = qt * qrows<D>();
    if (!pb.diagonal_order) return j - query_tile_first_key_tile(pb.keys, q0, KEYS);
    return (query_tile_key_end(pb.keys, q0, qrows<D>()) - 1) / KEYS - j;
}

// The query tiles a key tile meets: the inverse of split_kv.cuh's rule (the key tiles a query
// tile sees). Query i sees key j when i + shift - left <= j <= i + shift + right (shift = N_k -
// N; a bound -1 is no bound), so the keys key0 .. last_key are seen by the rows from
// key0 - shift - right (with a right bound, else 0) to last_key - shift + left (with a left
// bound, else N - 1), clipped to 0 .. N - 1 (none when the first is past the last): every row
// between sees one of them, as its keys run from its own lo to hi and both grow by one a row.
// Returns the first tile of those rows; *count the number (0: no query sees these keys; their
// dK, dV are zero). Each bound below 2^31: N, N_k <= 2^30.
template <int D>
__host__ __device__ __forceinline__ int query_tiles_of(const bwd_problem &pb, int key0,
                                                       int *count) {
    const key_rule &r = pb.keys;
    const int shift = r.N_k - r.N, last_key = min(key0 + KEYS, r.N_k) - 1;
    const int first_row = r.right < 0 ? 0 : max(0, key0 - shift - r.right);
    const int end_row = r.left < 0 ? r.N : min(r.N, last_key - shift + r.left + 1);  // past last
    const int first = first_row / qrows<D>();
    *count = first_row < end_row ? (end_row + qrows<D>() - 1) / qrows<D>() - first : 0;
    return first;
}

// A step of the block's walk (every query tile that meets its keys, of every query head of the
// group, head by head): its place in it (the rings' count), the (batch, head) of dQ_acc it adds
// into and its first query.
typedef struct {
    int it, bh, q0;
} walk_step;

// The next step of the walk: the next query tile of the head, or the first of the next head.
__device__ __forceinline__ walk_step next_step(walk_step s, int first, int tiles, int rows) {
    ++s.it;
    s.q0 += rows;
    if (s.q0 == (first + tiles) * rows) s.q0 = first * rows, ++s.bh;
    return s;
}
