/*
 * stage8_hopper_backward/schedule.cuh: who works on what. The parameters every thread of the main
 * kernel reads (bwd_problem), a block's key tile and (batch, key/value head) (block_place_of), the
 * query tiles it meets (query_tiles_of) and its walk over them, step by step (walk_step,
 * next_step), and the deterministic variant's order of the adds into a query tile (dq_turn_of).
 * A consumer thread's place in its warpgroups (consumer_place) is common/device/sm90.cuh's.
 */
#pragma once

#include "config.cuh"

// One block: key tile j = block_key_tile() (keys key0 = KEYS j ..) of (batch, key/value head)
// blockIdx.y = batch * H_kv + kv_head; it walks the group's query heads kv_head * group ..
// (kv_head + 1) * group - 1, each over the query tiles that see its keys.
typedef struct {
    int N, N_k, N_pad;      // queries, keys, N rounded up to ROW_PAD (lse2's and Dsum's rows)
    int H, H_kv, group;     // query heads, key/value heads, H / H_kv
    int causal, key_shift;  // key_shift = N_k - N: causal query i sees keys j <= i + key_shift
    int q_tiles;            // ceil(N / qrows<D>())
    int key_tiles;          // ceil(N_k / KEYS): the grid's x
    int diagonal_order;     // DQ_BY_BULK_IN_TURNS under a causal mask: see dq_turn_of()
    float scale, scale_log2;
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
// The key tiles that meet a query tile are always 0 .. j_max (causal: j_max is the key tile of the
// last key its last query sees). In key-tile order (no mask) j's turn is j: every block starts at
// query tile 0. Under a causal mask (diagonal_order) the adds go from j_max down to 0, so the block
// that starts at a query tile, the one on its diagonal, adds first there and never waits at its
// start, and each block waits only for the one above it (key tile j + 1), a step ahead on the same
// walk. In key-tile order instead, key tile j would wait at its first query tile for key tiles 0 ..
// j - 1 to walk up to it: a staircase of idle blocks (LOG.md, step 4's measurement).
template <int D>
__host__ __device__ __forceinline__ int dq_turn_of(const bwd_problem &pb, int j, int qt) {
    if (!pb.diagonal_order) return j;
    const int last_query = min((qt + 1) * qrows<D>(), pb.N) - 1;
    const int last_key = min(pb.N_k - 1, last_query + pb.key_shift);
    return last_key / KEYS - j;
}

// The query tiles a key tile meets: all of them, or causal, from the first whose last query sees
// the tile's first key (query i sees key j when j <= i + key_shift). Returns that first tile;
// *count the number (0: no query sees these keys; their dK, dV are zero).
template <int D>
__host__ __device__ __forceinline__ int query_tiles_of(const bwd_problem &pb, int key0,
                                                       int *count) {
    int first = 0;
    if (pb.causal) {
        const int first_query = key0 - pb.key_shift;  // the first query that sees key0
        first = first_query <= 0 ? 0 : first_query / qrows<D>();
    }
    *count = first < pb.q_tiles ? pb.q_tiles - first : 0;
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
