/*
 * stage6_hopper/schedule.cuh: who works on what. The work tiles (a batch*head, its rows, a range of
 * their key tiles) as the persistent blocks take them from a global counter (work_at,
 * take_next_work), the problem every thread of the kernel reads, and a consumer thread's rows in
 * a work tile (its consumer_place, common/device/sm90.cuh's: its warpgroup, warp and fragment
 * rows).
 */
#pragma once

#include "config.cuh"

// Division by a number fixed for the launch, in two instructions instead of a division's
// dozen: n / d = (umulhi(n, mul) + n) >> shift for 0 <= n < 2^31, with shift = ceil(log2 d) and
// mul = floor(2^32 (2^shift - d) / d) + 1 worked out by the host (Granlund and Montgomery's
// method, as CUTLASS's FastDivmod). The work tiles' decoding uses it: the producer thread has 24
// registers, too few for two divisions' temporaries.
typedef struct {
    uint32_t mul, shift;
} fast_divisor;

static fast_divisor make_fast_divisor(uint32_t d) {
    fast_divisor f;
    f.shift = 0;
    while ((1ull << f.shift) < d) ++f.shift;
    f.mul = (uint32_t)(((1ull << 32) * ((1ull << f.shift) - d)) / d + 1);
    return f;
}

__device__ __forceinline__ int fast_divide(int n, fast_divisor f) {
    return (int)((__umulhi((uint32_t)n, f.mul) + (uint32_t)n) >> f.shift);
}

// The problem as the producer and the consumers see it: N queries against N_k keys, how a query
// tile's key tiles are cut (split-KV: into ranges of split_tiles key tiles, at most `splits` of
// them; splits = 1: one range, all of them), the softmax scale times log2(e), and where the
// results go. The plain case's fields come first, as the plain kernels (MODEL off: fp16, [B, H,
// N, D] contiguous, H_kv = H, N_k = N) read them; what models feed (MODEL on) adds the rest, and
// softcap_scale in the padding after scale_log2: the plain fields and the kernel's parameters
// after the problem keep their offsets, and the plain kernels their machine code. The keys a row
// sees are split_kv.cuh's key_rule: query row i plus N_k - N is its diagonal key, and it sees
// window_left keys before that one and window_right after it, -1 unbounded (causal is (-1, 0):
// the MODEL kernels read the window, not `causal`). Counts the host can work out are launch
// constants there, not computed in the kernel: the producer thread has 24 registers, and the
// compiler would hold such values in some of them across its loops (LOG.md step 25). The MODEL
// kernels read the window, not `causal`: its place holds the shape's D, the columns of O the
// direct stores write.
// A packed batch (attention.h's attn_varlen) runs unsplit in the MODEL kernels: its sequences'
// boundaries take the place of split-KV's partial results, which an unsplit launch has none of,
// and `packed` says which of the two the place holds (the split kernels clear it: their code has
// no packed batch's). Its N and N_k are the longest sequence's, what the grid is planned with;
// each work tile reads its own sequence's (work_at).
typedef struct {
    int N;
    union {
        int causal;  // (plain) 1: query i sees keys 0 .. i
        int o_cols;  // (MODEL) O's columns, the shape's D (<= the kernel's D; the rest masked)
    };
    int splits, split_tiles;
    fast_divisor per_head, per_query_tile;  // work tiles: of a head, of a query tile (splits)
    float scale_log2;     // scale log2(e); softcap c: c log2(e), the capped scores' scale
    float softcap_scale;  // (MODEL) softcap: scale / c (raw scores to tanh's argument); 0: none
    __half *O;            // [B, H, N, D]                  (splits = 1, where not staged)
    float *lse;           // [B, H, N] (packed: [H, total_q]) (splits = 1)
    union {
        struct {
            float *O_part;    // [splits, B * H, N, D], fp32   (splits > 1: combine_kernel merges)
            float *lse_part;  // [splits, B * H, N]            (splits > 1)
            long long rows;   // B * H * N
        };
        attn_varlen varlen;  // (MODEL, splits = 1, packed = 1) a packed batch's sequences
    };
    const CUtensorMap *tmO;  // O in boxes of 16 rows x 64 columns, for the staged stores
    // what models feed (MODEL)
    int N_k;                              // keys
    int window_left, window_right;        // key_rule_of(shape, true)'s left and right
    int q_tiles, works_per_head;          // ceil(N / BR); q_tiles * splits work tiles a head
    int H;                                // query heads (a work tile's bh = batch * H + head)
    int o_row;                            // O's row stride, elements (<= INT_MAX: unsupported())
    int packed;                           // 1: a packed batch (varlen above; unsplit)
    fast_divisor per_batch, per_kv_head;  // bh / H = batch; head / (H / H_kv) = K/V head (GQA)
    long long o_batch, o_head;            // O's batch and head strides, elements
    int section_shift;  // work tiles by sections of 2^section_shift heads (work_at; 0: by heads)
} problem;
static_assert(
    offsetof(problem, softcap_scale) + sizeof(float) == offsetof(problem, O),
    "softcap_scale fills the padding after scale_log2: the plain fields keep their place");
static_assert(offsetof(problem, varlen) == offsetof(problem, O_part) &&
                  sizeof(attn_varlen) == offsetof(problem, tmO) - offsetof(problem, O_part),
              "the packed batch takes split-KV's place exactly: the plain fields keep theirs");
// The kernel's parameters after the problem (works, next_work) sit at offsets its size sets: a
// field added moves them in every kernel's machine code.
constexpr size_t PROBLEM_BYTES = 160;
static_assert(sizeof(problem) == PROBLEM_BYTES, "the problem's size is the kernels' ABI");

// A packed batch (MODEL kernels, unsplit): the work tiles read their sequences' rows.
__device__ __forceinline__ bool is_packed(const problem &pb) {
    return pb.packed != 0;
}

// A work tile: one batch*head, BR query rows and a range of their key tiles, [j0, j0 + n_tiles)
// (all of them unless split). Numbered head by head; inside a head, the query tiles with the most
// key tiles (causal) first, then their ranges. Under a causal mask, by sections of 2^s heads
// (s = section_shift, launch.cuh's section_shift_of): a section's heads' longest query tiles
// first, one head after the other (w's low s bits are the head within its section), then their
// next longest, and so on, so that the work tiles handed out last are short ones, whatever the
// heads; a head's tiles one after another would leave the last head's longest tile to start with
// few tiles left to even out beside it (LOG.md, step 43). A query tile's key tiles are those some
// row of it sees (split_kv.cuh's key_rule): causal, none past its last row's diagonal; a local
// window (MODEL), none before its first row's window either, so they start at the tile
// query_tile_first_key_tile() names, and a window's query tiles have about the same number (the
// order matters little there). A causal or windowed query tile has fewer key tiles, so fewer
// ranges, than the longest: its last ranges are empty (n_tiles = 0) and nobody takes them
// (take_next_work). A query tile that sees no key at all (N > N_k: even its last row's diagonal,
// plus the window's right bound, comes before the first key; or a sequence with no key) still
// takes one key tile when unsplit, key tile 0, wholly masked: its rows end with l = 0 and
// m = -inf, so O = 0 and LSE = -inf (epilogue); split, its ranges are all empty and the merge
// writes those. A persistent block (one per SM) starts with work tile blockIdx.x and then takes
// the next one not yet taken from a global counter, so work tiles of different lengths even out
// over the SMs as they would with one block per tile (the variant nopersistent, which launches
// exactly that). t numbers the block's work tiles: it is the count of the Q buffers'
// pipeline_state.
// The MODEL kernels read a work tile's sequence from it: q0 and q_end (the end of the sequence's
// queries) are rows of Q and O as the tensor maps count them, n_k is the sequence's keys and
// key_tile_start() counts them from its first, row k_row of K and V. Unpacked that is the batch's
// N, N_k and rows from 0; packed (attn_sequence_of), each sequence's, its query tiles numbered
// over the longest sequence's: those that start past the sequence's end, the first `skip` of the
// head from this one, hold none of its rows and nobody takes them (take_next_work).
typedef struct {
    int bh, q0, j0, n_tiles, split, t;
    int q_end, n_k, k_row, skip;  // (MODEL) the work tile's sequence
} work_tile;

// (MODEL) What turns a row of the work tile (a row of Q, row_of) into its diagonal key (a key of
// its sequence): the sequence's row i sees up to key i + n_k - N_b, and its row of Q is
// q_end - N_b + i.
__device__ __forceinline__ int diagonal_shift(const work_tile &wt) {
    return wt.n_k - wt.q_end;
}

template <int C, int BC, bool MODEL>
__device__ __forceinline__ work_tile work_at(int w, const problem &pb) {
    constexpr int BR = block_rows<C>();
    work_tile t;
    const int s = pb.section_shift;
    const int in_sections = w >> s;  // the work tile's index with its section's heads as one
    const int section = fast_divide(in_sections, pb.per_head);
    t.bh = (section << s) | (w & ((1 << s) - 1));
    int tiles, first = 0;  // the query tile's key tiles: `tiles` of them from tile `first`
    if constexpr (MODEL) {
        const int q_tiles = pb.q_tiles;
        const int in_head = in_sections - section * pb.works_per_head;
        const int q_index = fast_divide(in_head, pb.per_query_tile);
        t.split = in_head - q_index * pb.splits;
        t.q0 = (q_tiles - 1 - q_index) * BR;  // (its sequence's row)
        t.q_end = pb.N, t.n_k = pb.N_k, t.k_row = 0, t.skip = 0;
        if (is_packed(pb)) {  // sequence b = bh / H: its rows of the packed tensors, its lengths
            const attn_sequence seq =
                attn_sequence_of(&pb.varlen, fast_divide(t.bh, pb.per_batch), pb.H, pb.N, pb.N_k);
            t.skip = max(0, q_tiles - q_index - (seq.N + BR - 1) / BR);
            t.q0 += (int)seq.q_row;
            t.q_end = (int)seq.q_row + seq.N;
            t.n_k = seq.N_k;
            t.k_row = (int)seq.k_row;
        }
        // The one rule of split_kv.cuh (the merge and the split planner read it too): from the
        // first row's window to the last row's, 0 tiles where no row sees a key. Taken on the
        // rows moved onto their diagonals (as n_k queries against n_k keys): the same tiles.
        const key_rule keys = {t.n_k, t.n_k, pb.window_left, pb.window_right};
        const int diagonal0 = t.q0 + diagonal_shift(t);  // the first row's diagonal key
        first = query_tile_first_key_tile(keys, diagonal0, BC);
        tiles = query_tile_key_tile_count(keys, diagonal0, BR, BC);
        if (pb.splits == 1) tiles = max(tiles, 1);  // unsplit: at least one (see above; first = 0)
    } else {
        const int q_tiles = (pb.N + BR - 1) / BR;
        const int in_head = in_sections - section * q_tiles * pb.splits;
        const int q_index = fast_divide(in_head, pb.per_query_tile);
        t.split = in_head - q_index * pb.splits;
        t.q0 = (q_tiles - 1 - q_index) * BR;
        tiles = query_tile_key_tiles(t.q0, BR, BC, pb.N, pb.causal);
        t.q_end = pb.N, t.n_k = pb.N, t.k_row = 0, t.skip = 0;  // (one sequence, N_k = N)
    }
    const int before = t.split * pb.split_tiles;  // the query tile's key tiles in earlier ranges
    t.j0 = first + before;
    t.n_tiles = max(0, min(tiles - before, pb.split_tiles));
    t.t = 0;
    return t;
}

// Where work tile rows of batch*head bh lie in the 4-D tensor maps (D, rows, heads, B): the batch,
// the query head (Q, O) and the key/value head it reads (K, V; GQA: head / (H / H_kv)). The plain
// kernels' maps fold batch and head into one dimension (one batch of B * H heads): bh is the head.
// A packed batch's maps have one batch (its sequences are rows: work_at's q0, k_row).
typedef struct {
    int batch, head, kv_head;
} tile_heads;
template <bool MODEL>
__device__ __forceinline__ tile_heads heads_of(int bh, const problem &pb) {
    tile_heads t;
    if constexpr (MODEL) {
        t.batch = fast_divide(bh, pb.per_batch);
        t.head = bh - t.batch * pb.H;
        t.kv_head = fast_divide(t.head, pb.per_kv_head);
        if (is_packed(pb)) t.batch = 0;
    } else {
        t.batch = 0, t.head = t.kv_head = bh;
    }
    return t;
}

// The first key of key tile j of work tile wt (j counts from the start of its range; MODEL: a key
// of its sequence, row k_row + key of K and V).
template <int BC>
__device__ __forceinline__ int key_tile_start(const work_tile &wt, int j) {
    return (wt.j0 + j) * BC;
}

// The work tile a block takes after its current one: the next one not yet taken (a global
// counter), or none (works) when every block has one work tile at most.
__device__ __forceinline__ int next_work_index(int works, int *next_work) {
    return (int)gridDim.x >= works ? works : take_from_counter(next_work);
}

// Work tiles before `end` hold no rows (packed: they start past their sequence's end): the counter
// jumps to it (it hands out work tile gridDim.x + its value), so that each such run costs one
// atomic, not one per work tile. What it jumps over lies between a work tile of the run this block
// took and the run's end: none of it is work; what lies past the end stays the counter's to hand
// out. A block that has taken another work tile of the run jumps the same way.
__device__ __forceinline__ void skip_work(int end, int works, int *next_work) {
    if ((int)gridDim.x < works) atomicMax(next_work, end - (int)gridDim.x);
}

// Work tile w (wt), or past it the first one with key tiles (a causal split leaves empty ones)
// and rows (packed), or none (works). Only the producer takes work tiles: the consumers take the
// ones it hands over (take_work), so every role skips the same ones.
template <int C, int BC, bool MODEL>
__device__ __forceinline__ int take_next_work(int w, const problem &pb, int works, int *next_work,
                                              work_tile &wt) {
    for (;; w = next_work_index(works, next_work)) {
        if (w >= works) return works;
        wt = work_at<C, BC, MODEL>(w, pb);
        if constexpr (MODEL) {
            if (wt.skip > 0) {  // this one and the skip - 1 after it: no rows
                skip_work(w + wt.skip, works, next_work);
                continue;
            }
        }
        if (wt.n_tiles > 0 || pb.splits == 1) return w;  // (unsplit, every one has key tiles)
    }
}

/* ---- a consumer thread's rows ---------------------------------------------------------------- */

// The consumer thread's place (consumer_place_of_thread, common/device/sm90.cuh): warpgroup wg
// (0 .. C - 1) owns block rows 64 wg .. 64 wg + 63; in it, warp w owns 16 rows, and lane (g, t)
// rows g and g + 8 of those (the fragment above).
//
// The first row of the thread's warpgroup (a row of the head), of its warp (a row of the
// warpgroup's 64), and of the thread's own two rows (a row of the head; the other is 8 further).
__device__ __forceinline__ int warpgroup_row0(const work_tile &wt, const consumer_place &p) {
    return wt.q0 + p.wg * WGMMA_M;
}
__device__ __forceinline__ int warp_row0(const consumer_place &p) {
    return WARP_ROWS * p.warp;
}
__device__ __forceinline__ int row_of(const work_tile &wt, const consumer_place &p) {
    return warpgroup_row0(wt, p) + warp_row0(p) + p.g;
}
