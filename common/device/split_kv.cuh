/*
 * common/device/split_kv.cuh: split-KV's pieces that do not depend on the attention kernel, for
 * stage 5 (which teaches it: attention.cu, plan.cuh), stage 6 (whose persistent kernel cuts the
 * keys the same way) and stage 9 (decode: a sequence's cache cut across blocks). When B * H *
 * ceil(N / BR) query tiles leave SMs idle, each query tile's keys are cut into ranges of
 * split_tiles key tiles; each range writes an fp32 O normalised by its own sum and its LSE into a
 * workspace, [splits, B * H, N, D] and [splits, B * H, N], and combine_kernel merges them. Here:
 * which key tiles a query tile has (query_tile_key_tiles), the merge (combine_kernel;
 * combine_kernel_pdl behind its attention kernel), and how many ranges (choose_splits, host code).
 */
#pragma once

#include <cuda_fp16.h>
#include <stdlib.h>
#include <string.h>

#include "attention.h"
#include "warp.cuh"  // pack2_of, the PDL wrappers

// The keys of the query tile whose rows start at q0: [0, N), or, causal with tile skipping, up to
// its last real row (the key tiles after it are skipped). One rule for the kernels (stage 5's
// block_keys, stage 6's work_at), the combine kernel (how many key ranges a row has) and the
// host's wave simulator (choose_splits).
__host__ __device__ __forceinline__ int query_tile_key_end(int q0, int BR, int N,
                                                           bool causal_skip) {
    return causal_skip ? min(q0 + BR, N) : N;
}

// ... and how many key tiles of BC keys they make.
__host__ __device__ __forceinline__ int query_tile_key_tiles(int q0, int BR, int BC, int N,
                                                             bool causal_skip) {
    return (query_tile_key_end(q0, BR, N, causal_skip) + BC - 1) / BC;
}

// The same for N queries against N_k keys (attention.h: causal aligned to the bottom right, query
// i sees keys up to i + N_k - N): query_tile_key_end of the rows moved by N_k - N over N_k keys,
// at least 0 (0: no row of the tile sees a key); stage 6's work_at counts its tiles that way.
__host__ __device__ __forceinline__ int query_tile_key_end_nk(int q0, int BR, int N, int N_k,
                                                              bool causal_skip) {
    return causal_skip ? max(0, min(min(q0 + BR, N) + (N_k - N), N_k)) : N_k;
}
__host__ __device__ __forceinline__ int query_tile_key_tiles_nk(int q0, int BR, int BC, int N,
                                                                int N_k, bool causal_skip) {
    return (query_tile_key_end_nk(q0, BR, N, N_k, causal_skip) + BC - 1) / BC;
}

// Every rule above in one, local windows too: which keys a query tile's rows see, as the kernels
// skip tiles (attention.h's attn_key_range over a tile's rows). Query row i sits on key
// i + N_k - N (its diagonal) and sees `left` keys before it and `right` after it, -1 unbounded:
// causal is (-1, 0), no mask (-1, -1). A kernel that skips no tile (stage 5's noskip) takes
// (-1, -1) and masks every tile.
typedef struct key_rule {
    int N, N_k;       // queries, keys
    int left, right;  // keys a row sees before and after its diagonal; -1: every one
} key_rule;

// The rule of a complete shape: its window (attn_shape_complete wrote it in one form), causal,
// or none; skip = false: every key tile (masked).
static inline key_rule key_rule_of(const attn_shape *s, bool skip) {
    key_rule r = {s->N, s->N_k, -1, -1};
    if (skip) {
        r.left = s->local ? s->window_left : -1;
        r.right = s->causal ? 0 : s->local ? s->window_right : -1;
    }
    return r;
}

// The first key tile (of BC keys) that the rows q0 .. q0 + BR - 1 see: the first row's diagonal
// minus `left`, rounded down to a tile (0 when unbounded).
__host__ __device__ __forceinline__ int query_tile_first_key_tile(const key_rule &r, int q0,
                                                                  int BC) {
    return r.left < 0 ? 0 : max(0, q0 + (r.N_k - r.N) - r.left) / BC;
}

// The end of the keys they see (exclusive, 0 .. N_k): past the last real row's diagonal plus
// `right` (N_k when unbounded).
__host__ __device__ __forceinline__ int query_tile_key_end(const key_rule &r, int q0, int BR) {
    if (r.right < 0) return r.N_k;
    const long long end = (long long)min(q0 + BR, r.N) + (r.N_k - r.N) + r.right;
    return (int)max(0ll, min(end, (long long)r.N_k));
}

// How many key tiles they see from the first (0: none; a row may still see none within them).
__host__ __device__ __forceinline__ int query_tile_key_tile_count(const key_rule &r, int q0, int BR,
                                                                  int BC) {
    return max(
        0, (query_tile_key_end(r, q0, BR) + BC - 1) / BC - query_tile_first_key_tile(r, q0, BC));
}

/* ---- the merge ------------------------------------------------------------------------------- */

// Merges the key ranges of split-KV, one row at a time (FA2's combine). Range s of a row
// holds O_s (normalised by its own sum l_s) and lse_s = log(l_s) + its max, so the whole
// row's sum is l = sum_s exp(lse_s) and O = sum_s (l_s / l) O_s = sum_s exp(lse_s - lse) O_s.
// One pass over the ranges, as the attention kernels' online softmax: the largest lse_s so far
// is the base m, the sum w = sum_s exp(lse_s - m) and o = sum_s exp(lse_s - m) O_s are rescaled
// when m grows, and O = o / w, lse = m + log(w) at the end (every term <= 1, the largest
// exactly 1: no overflow, and w cannot underflow to 0). Ranges with no key for the row
// (lse_s = -inf) weigh 0. combine_lanes() threads per row, 4 columns each (16-byte loads of
// O_s); UNROLL ranges' loads (their O_s and lse_s) are issued together before any is used, so
// that a row's merge waits for memory once per UNROLL ranges, not once per range or per pass.
constexpr int COMBINE_THREADS = 128;
constexpr int COMBINE_UNROLL = 16;  // ranges a row's merge loads at once: one round of its loads

typedef struct combine_params {
    const float *O_part;    // [splits, B * H, N, D]
    const float *lse_part;  // [splits, B * H, N]
    __half *O;              // [B, H, N, D] in its layout: the strides below (16-bit storage)
    float *lse;             // [B, H, N]
    long long rows;         // B * H * N
    int N, BR, BC;          // shape and the attention kernel's tiles
    int splits, split_tiles;
    key_rule keys;              // the key tiles each query tile has (their ranges: how many)
    int H;                      // query heads
    long long o_batch, o_head;  // O's strides in elements (attention.h's attn_layout)
    int o_row;
} combine_params;

// Threads per row (4 columns each), and rows per block of THREADS threads (COMBINE_THREADS, or
// fewer where a caller's rows are few: stage 9's MERGE_THREADS says why).
template <int D>
__host__ __device__ constexpr int combine_lanes() {
    return D / 4;
}
template <int D, int THREADS = COMBINE_THREADS>
__host__ __device__ constexpr int combine_rows_per_block() {
    static_assert(THREADS % combine_lanes<D>() == 0 || THREADS == COMBINE_THREADS,
                  "a smaller block holds whole rows");
    return THREADS / combine_lanes<D>();
}

// One thread's share of the merge: lane `lane` (of combine_lanes()) of row `row`; O stored as
// bf16 (BF16) or fp16.
template <int D, bool BF16 = false>
__device__ __forceinline__ void combine_row(const combine_params &p, long long row, int lane) {
    constexpr int UNROLL = COMBINE_UNROLL;  // ranges in flight at once: independent loads
    int ranges = p.splits;  // causal, local: as many as this row's query tile was given
    if (p.keys.left >= 0 || p.keys.right >= 0) {
        const int q0 = (int)(row % p.N) / p.BR * p.BR;
        const int tiles = query_tile_key_tile_count(p.keys, q0, p.BR, p.BC);
        ranges = (tiles + p.split_tiles - 1) / p.split_tiles;
    }
    const float *lse_s = p.lse_part + row;  // lse_s[s * rows]: range s (same for the row's lanes)
    const float4 *O_s = reinterpret_cast<const float4 *>(p.O_part + row * D) + lane;
    float m = -INFINITY, w = 0.f;  // the base so far, and sum exp(lse_s - m)
    float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int s0 = 0; s0 < ranges; s0 += UNROLL) {  // UNROLL ranges: loads first, then sums
        float4 x[UNROLL];
        float l[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const bool in = s0 + u < ranges;
            x[u] = in ? O_s[(s0 + u) * p.rows * (D / 4)] : make_float4(0.f, 0.f, 0.f, 0.f);
            l[u] = in ? lse_s[(s0 + u) * p.rows] : -INFINITY;
        }
        float m_new = m;
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) m_new = fmaxf(m_new, l[u]);
        if (m_new == -INFINITY) continue;  // no key in these ranges either: o and w stay 0
        const float corr = m == -INFINITY ? 0.f : expf(m - m_new);  // o, w: 0 while m = -inf
        o.x *= corr, o.y *= corr, o.z *= corr, o.w *= corr, w *= corr;
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const float wt = expf(l[u] - m_new);  // -inf: 0
            w += wt;
            o.x += wt * x[u].x, o.y += wt * x[u].y, o.z += wt * x[u].z, o.w += wt * x[u].w;
        }
        m = m_new;
    }
    const float inv = w > 0.f ? 1.f / w : 0.f;  // no key at all: O = 0, lse = -inf
    const float lse = w > 0.f ? m + logf(w) : -INFINITY;
    const uint2 packed =
        make_uint2(pack2_of<BF16>(o.x * inv, o.y * inv), pack2_of<BF16>(o.z * inv, o.w * inv));
    const long long bh = row / p.N, i = row - bh * p.N;  // (batch, head) and query row
    __half *O = p.O + bh / p.H * p.o_batch + bh % p.H * p.o_head + i * p.o_row;
    reinterpret_cast<uint2 *>(O)[lane] = packed;
    if (lane == 0) p.lse[row] = lse;
}

// The row of this thread (>= p.rows: none), and its lane in the row.
template <int D, int THREADS = COMBINE_THREADS>
__device__ __forceinline__ long long combine_thread_row(int *lane) {
    *lane = (int)threadIdx.x % combine_lanes<D>();
    return (long long)blockIdx.x * combine_rows_per_block<D, THREADS>() +
           threadIdx.x / combine_lanes<D>();
}

template <int D, bool BF16 = false>
__global__ void __launch_bounds__(COMBINE_THREADS) combine_kernel(const combine_params p) {
    int lane;
    const long long row = combine_thread_row<D>(&lane);
    if (row < p.rows) combine_row<D, BF16>(p, row, lane);
}

// The same merge launched with PDL right behind the attention kernel (stages 6 and 9): its blocks
// are placed on idle SMs (or as attention blocks leave) while that kernel runs, and start merging
// the moment it ends (wait_for_previous_kernel: the key ranges' O and LSE are written). Blocks
// of THREADS threads (combine_rows_per_block<D, THREADS>() rows each).
template <int D, bool BF16 = false, int THREADS = COMBINE_THREADS>
__global__ void __launch_bounds__(THREADS) combine_kernel_pdl(const combine_params p) {
    let_next_kernel_start();
    wait_for_previous_kernel();
    int lane;
    const long long row = combine_thread_row<D, THREADS>(&lane);
    if (row < p.rows) combine_row<D, BF16>(p, row, lane);
}

// The same behind stage 6's MODEL kernels, whose D may be larger than the shape's: O_part has D
// columns a row (those past `cols` zero) and only the lanes of the first `cols` columns merge
// and write (cols: a multiple of 8, so a lane's 4 columns are all in or all out). Where D / 4
// lanes do not divide the block (D = 96: 5 rows of 24), the threads past its last whole row idle.
template <int D, bool BF16>
__global__ void __launch_bounds__(COMBINE_THREADS)
    combine_cols_kernel_pdl(const combine_params p, int cols) {
    constexpr int COLS_PER_LANE = D / combine_lanes<D>();
    let_next_kernel_start();
    wait_for_previous_kernel();
    int lane;
    const long long row = combine_thread_row<D>(&lane);
    const bool whole_row = threadIdx.x < combine_rows_per_block<D>() * combine_lanes<D>();
    if (whole_row && row < p.rows && lane * COLS_PER_LANE < cols)
        combine_row<D, BF16>(p, row, lane);
}

/* ---- split-KV: how many key ranges ----------------------------------------------------------- */

// A query tile's B * H * ceil(N / BR) blocks fill the GPU's slots (SMs x blocks per SM) in
// waves; a grid of 32 blocks on 264 slots (B = H = 1, N = 4096, H200) leaves 88% of them idle,
// and 384 blocks (N = 49,152) make 1.45 waves: the second wave runs at 45%. Cutting each query
// tile's keys into ranges gives more, shorter blocks. FA2 (num_splits_heuristic) estimates the
// wave efficiency of each split count and takes the smallest within 85% of the best; here the
// same rule, with the efficiency taken from the block scheduler's own rule: in launch order,
// each block goes to the slot that frees first. Causal query tiles have different numbers of
// key tiles, so the keys are cut by work: every range has split_tiles key tiles (the tile's
// last range fewer), and a short query tile gets fewer ranges. Each range also pays for a
// prologue (Q and its first K tile) and an fp32 epilogue: `overhead` key tiles' worth, which
// each stage estimates for its own kernel (stage 5: SPLIT_OVERHEAD_TILES).
constexpr int MAX_SPLITS = 128;         // FA2's cap; bounds the workspace too
constexpr double SPLIT_SLACK = 0.85;    // the fewest splits within this share of the best
constexpr int FULL_WAVES = 6;           // from 6 waves on, the last one costs < 1/7: no split
constexpr int MAX_SIMULATED_WAVES = 8;  // split counts beyond this many waves are not tried

// Useful work / (slots x time), in key tiles, for ranges of `per` tiles: the blocks in launch
// order (heads, then query tiles, heaviest first if causal, then ranges), each to the slot
// that frees first (a binary min-heap of the slots' finish times).
[[maybe_unused]] static double split_efficiency(const attn_shape *s, int BR, int BC,
                                                const key_rule &keys, int slots, double overhead,
                                                int per, double *heap) {
    const int q_tiles = ceil_div(s->N, BR);
    double work = 0.;
    for (int i = 0; i < slots; ++i) heap[i] = 0.;
    for (int bh = 0; bh < s->B * s->H; ++bh) {
        for (int qi = 0; qi < q_tiles; ++qi) {
            const int q = keys.right >= 0 ? q_tiles - 1 - qi : qi;  // the kernel's order
            const int tiles = query_tile_key_tile_count(keys, q * BR, BR, BC);
            for (int k = 0; k < tiles; k += per) {
                const int t = tiles - k < per ? tiles - k : per;
                work += t;
                heap[0] += t + overhead;  // the earliest-free slot takes it
                for (int i = 0;;) {       // sift down
                    int j = 2 * i + 1;
                    if (j >= slots) break;
                    if (j + 1 < slots && heap[j + 1] < heap[j]) ++j;
                    if (heap[i] <= heap[j]) break;
                    const double x = heap[i];
                    heap[i] = heap[j], heap[j] = x, i = j;
                }
            }
        }
    }
    double end = 0.;
    for (int i = 0; i < slots; ++i) end = heap[i] > end ? heap[i] : end;
    return work / (slots * end);
}

// Key ranges per query tile (1: no split) and key tiles per range.
[[maybe_unused]] static int choose_splits(const attn_shape *s, int BR, int BC, const key_rule &keys,
                                          int slots, double overhead, int *split_tiles) {
    const long long blocks = (long long)s->B * s->H * ceil_div(s->N, BR);
    *split_tiles = ceil_div(s->N_k, BC);
    if (blocks >= (long long)FULL_WAVES * slots) return 1;
    int T = 0;  // the most key tiles a query tile has (a window: fewer than N_k's)
    for (int q0 = 0; q0 < s->N; q0 += BR) {
        const int t = query_tile_key_tile_count(keys, q0, BR, BC);
        T = t > T ? t : T;
    }
    *split_tiles = T > 0 ? T : 1;
    if (T < 2) return 1;
    double *heap = (double *)malloc(sizeof(double) * slots);
    if (!heap) return 1;
    double eff[MAX_SPLITS + 1] = {0.}, best = 0.;
    const int most = T < MAX_SPLITS ? T : MAX_SPLITS;
    for (int n = 1; n <= most; ++n) {
        // n ranges of ceil(T / n) tiles; skip n when that is the same cut as n - 1 (FA2's
        // "eligible" splits) and stop past MAX_SIMULATED_WAVES waves of blocks.
        if (n > 1 && ceil_div(T, n) == ceil_div(T, n - 1)) continue;
        if (n > 1 && blocks * n > (long long)MAX_SIMULATED_WAVES * slots) break;
        eff[n] = split_efficiency(s, BR, BC, keys, slots, overhead, ceil_div(T, n), heap);
        best = eff[n] > best ? eff[n] : best;
    }
    free(heap);
    for (int n = 1; n <= most; ++n) {
        if (eff[n] > 0. && eff[n] >= SPLIT_SLACK * best) {
            *split_tiles = ceil_div(T, n);
            return ceil_div(T, *split_tiles);
        }
    }
    return 1;
}
