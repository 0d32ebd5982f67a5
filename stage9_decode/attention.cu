/*
 * stage9_decode: generation's attention. Each sequence adds 1 to 16 query tokens and reads a KV
 * cache of thousands to hundreds of thousands of keys, contiguous or in pages.
 *
 * What this stage adds over stage 5 (whose mma.sync, ldmatrix, swizzle and online softmax it
 * keeps), one idea per bullet (README.md has the lesson, LOG.md the measurements):
 *  - The work is memory-bound: with g query heads per KV head and N_q queries, each key and value
 *    read from the cache (4 D bytes) feeds 4 g N_q D FLOPs, g N_q FLOPs per byte; an H200
 *    (989 TFLOP/s, 4.8 TB/s) waits on memory below about 200. The figure of merit is the share
 *    of the HBM's bandwidth turned into cache reads.
 *  - GQA packing: the g query heads of one KV head and the N_q queries are the rows of one tile
 *    (g N_q rows, padded to m16 tiles), so each key is read once per KV head, not once per query
 *    head. Warps split a tile's rows when there are enough of them, else its keys.
 *  - Split-KV from the host: the keys of a sequence are cut into ranges so that B x H_kv x
 *    ranges blocks fill the GPU (one KV head of one sequence is otherwise one block on one SM).
 *    The plan reads only the shape (the longest a sequence can be), never the device's lengths:
 *    a call is asynchronous and can be captured in a CUDA graph. Each range writes an fp32
 *    partial O and its LSE; combine_kernel_pdl (common/device/split_kv.cuh, stage 5's merge
 *    launched with PDL) merges them.
 *  - Pages gathered into shared memory: each 16-byte chunk of a K/V tile is copied from wherever
 *    its page lies (block_table), by cp.async in a ring of up to four stages, so that up to three
 *    tiles are in flight while one is computed. A page index is read one tile ahead.
 *  - New keys are written into the cache by the call (append_kernel), then read with the rest.
 * Expected: at least the better of FA2's and cuDNN's decode on every shape (README.md).
 *
 * Run:  make build && build/stage9_decode --seq 1 --seq-k 32768 --heads 32 --kv-heads 8 \
 *           --layout bnhd --bench
 *       build/stage9_decode --seq 4 --seq-k 4096 --heads 32 --kv-heads 8 --page-size 16 \
 *           --ragged --new-tokens 4 --batch 8 --bench      (a paged cache, lengths of their own)
 * Variants (--variant): default, nopack (one tile per query head: the cache read g times),
 * nosplit (one block per KV head and sequence).
 *
 * NOTE: decode ends at the HBM's bandwidth. What is left is reading fewer bytes: a cache stored
 * in 8 bits (FP8 KV caches), or shared by the heads (multi-head latent attention, FlashMLA), and
 * spreading one sequence over several GPUs (stage 10).
 */

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "attention.h"
#include "device/kernel_cache.cuh"  // the driver asked once per kernel and device
#include "device/sm80.cuh"          // mma.sync, ldmatrix, cp.async, the fragment vocabulary
#include "device/split_kv.cuh"      // the merge of the key ranges (combine_kernel_pdl), MAX_SPLITS

/* ---- tunables -------------------------------------------------------------------------------- */

// Four warps a block. A tile's rows (g N_q, padded to m16 tiles) are shared out first: one warp
// per m16 tile, up to all four (ROW_WARPS); the warps left over split each K/V tile's keys and
// merge their results at the end. One query head and one token (g N_q = 1) leaves 15 of the 16
// rows empty: the tensor core's waste is free while memory is the bound.
constexpr int WARPS = 4;
constexpr int THREADS = WARPS * WARP_SIZE;
// Keys per K/V tile: as many as make TILE_HALVES halves of K (and as many of V) at every head dim,
// 64 at D = 128 and 128 at D = 64 (32 KB a stage). A tile's fixed costs (its wait, its barrier,
// its copies' addresses) then weigh the same on every byte read, whatever D.
constexpr int TILE_HALVES = 8192;
__host__ __device__ constexpr int tile_keys(int D) {
    return TILE_HALVES / D;
}
// A warp computes 16 keys at a time: S is two n8 blocks, P one k16 step of P V.
constexpr int SLICE = MMA_K;
// The ring of K/V tiles in shared memory: from 2 stages (a T4's 64 KB at D = 128) to 4. The
// plan takes the count that keeps the most bytes in flight per SM (blocks per SM x stages - 1).
constexpr int MIN_STAGES = 2;
constexpr int MAX_STAGES = 4;
// Split-KV: the fewest key ranges whose blocks fill the GPU's slots within this share of the
// best (FA2's rule, split_kv.cuh's SPLIT_SLACK).
constexpr double FILL_SLACK = SPLIT_SLACK;
// The shortest key range worth a block where the SMs do not need more blocks: a range of fewer
// tiles pays its block's fixed part (Q, the length, the ring's fill, its partial O and LSE and
// their merge) on too few bytes.
constexpr int MIN_RANGE_TILES = 4;
// A contiguous cache from this many keys splits into one round of the merge's loads
// (COMBINE_UNROLL ranges) where the wave would hold more, or one range an SM if that is more:
// the ranges are long enough that one block an SM keeps the HBM busy, and the merge's second and
// third rounds cost more than the second block gains (LOG step 36). A paged cache keeps the
// second block: its table reads want it (step 35).
constexpr int CONTIGUOUS_ONE_ROUND_KEYS = 65536;
// The merge of the key ranges in blocks of one warp (a row or two each): one query of 32 heads is
// 32 rows, which COMBINE_THREADS-thread blocks would put on 8 SMs, each reading 32 ranges a row.
constexpr int MERGE_THREADS = WARP_SIZE;

/* ---- device helpers -------------------------------------------------------------------------- */

// 16-bit storage: fp16 or bf16, moved as raw 16-bit words (only the mma and the packing of
// results know which).
typedef uint16_t elem;

// Shared-memory tiles are [tile_keys(D), D] halves, XOR-swizzled as stage 5's: 16-byte chunk c of
// row r is stored at chunk c ^ (r % 8), so the eight rows of an ldmatrix matrix hit eight bank
// groups.
template <int D>
__device__ __forceinline__ uint32_t tile_offset(int row, int chunk) {
    return (uint32_t)(row * (D * HALF_BYTES) + (chunk ^ (row % MATRIX_ROWS)) * CHUNK_BYTES);
}

// ldmatrix lane offsets in a swizzled tile, for the 16 x 16 block at rows 0-15, chunk pair 0
// (stage 5's): XOR in c * X4_BYTES for chunk pair c (it touches only bits below a row), add whole
// 16-row slices. K (B operand of S = Q K^T, untransposed): matrices (rows 0-7, chunk 0), (rows
// 0-7, chunk 1), (rows 8-15, chunk 0), (rows 8-15, chunk 1), so that each key block's two
// registers come back adjacent. V (B operand of P V, .trans): (rows 0-7, chunk 0), (rows 8-15,
// chunk 0), (rows 0-7, chunk 1), (rows 8-15, chunk 1).
template <int D>
__device__ __forceinline__ uint32_t k_lane_offset(int lane) {
    const int row = lane % MATRIX_ROWS + MATRIX_ROWS * (lane / X4_DIM);
    const int chunk = lane / MATRIX_ROWS % 2;
    return tile_offset<D>(row, chunk);
}
template <int D>
__device__ __forceinline__ uint32_t v_lane_offset(int lane) {
    return tile_offset<D>(lane % X4_DIM, lane / X4_DIM);
}

// sm_75 code (T4) states one block per SM as the launch bound: without it ptxas 12.4 holds the
// D = 64 fp16 kernel to 96 registers and spills. Newer targets state none (their kernels, measured
// as they are, use what they need).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#define DECODE_LAUNCH_BOUNDS __launch_bounds__(THREADS, 1)
#else
#define DECODE_LAUNCH_BOUNDS __launch_bounds__(THREADS)
#endif

// One 16-byte chunk global -> shared: cp.async on sm_80+ (zero-filled when !valid), through a
// register on sm_75 (there the copy is done when the call returns).
__device__ __forceinline__ void copy_chunk(uint32_t dst, const elem *src, bool valid) {
    if constexpr (HAS_CP_ASYNC) {
        cp_async_16(dst, src, valid);
    } else {
        st_shared_v4(dst, valid ? *reinterpret_cast<const uint4 *>(src) : make_uint4(0, 0, 0, 0));
    }
}

// The cache's elements at a byte address (key_offset counts bytes).
__device__ __forceinline__ const elem *as_elems(const char *at) {
    return reinterpret_cast<const elem *>(at);
}

// cp.async.wait_group takes its count as an immediate: the ring's depth is the plan's.
__device__ __forceinline__ void cp_async_wait_pending(int pending) {
    switch (pending) {
        case 0:
            cp_async_wait<0>();
            break;
        case 1:
            cp_async_wait<1>();
            break;
        default:
            cp_async_wait<MAX_STAGES - 2>();
            break;
    }
}

/* ---- the kernels' parameters ---------------------------------------------------------------- */

typedef struct {
    const elem *Q;       // [B, N, H, D] by q_* (any layout of 16-byte rows)
    const elem *K, *V;   // the cache: [B, N_max, H_kv, D] or [pages, page_size, H_kv, D] by k_*
    elem *O;             // like Q, by o_*
    float *lse;          // [B, H, N]
    float *O_part;       // split-KV: [splits, B * H * N, D], fp32, normalised by the range's sum
    float *lse_part;     // [splits, B * H * N]
    const int *seqlens;  // [B] keys before the call; NULL: every sequence holds `capacity`
    const int *block_table;  // [B, max_pages]; NULL: contiguous (batch stride = a sequence's)
    long long q_batch, q_head, q_row, o_batch, o_head, o_row;
    long long k_batch, k_head, k_row;  // K's and V's; batch: a sequence's or a page's
    int B, H, H_kv, N;                 // N: queries per sequence (1 to ATTN_MAX_DECODE_N)
    int N_new;                         // keys the call appended (append_kernel ran before)
    int capacity;  // the most keys a sequence holds: the shape's N_k, within the pages
    int page_shift, num_pages, max_pages;  // paged: page_size = 1 << page_shift
    int causal;
    float scale_log2;  // scale x log2(e): scores in base 2
    int tile_heads;    // query heads packed in a tile: H / H_kv, or 1 (nopack)
    int group;         // query heads a KV head: H / H_kv
    int rows;          // a tile's packed rows, tile_heads x N: row i x tile_heads + j is query i
                       // of head h0 + j
    int row_warps;     // warps over a tile's m16 row tiles (1, 2 or 4); the others split keys
    int row_shift;     // log2(row_warps)
    int row_groups;    // blocks over a tile's rows: ceil(rows / (row_warps x 16))
    int splits, split_keys;  // key ranges per sequence, keys per range (whole tiles: tile_keys(D))
    int stages;              // the K/V ring's depth
    unsigned page_bytes, row_bytes;  // paged: k_batch and k_row in bytes (run_decode: they fit)
} decode_params;

// The keys sequence b attends over: its length before the call plus the new ones, clamped to the
// cache (a negative length counts as 0, one past the cache as full: nothing outside is touched).
__device__ __forceinline__ int sequence_keys(const decode_params &p, int b) {
    if (!p.seqlens) return p.capacity;
    const int before = max(p.seqlens[b], 0);
    return (int)min((long long)before + p.N_new, (long long)p.capacity);
}

// The byte offset of key `key` of sequence b in the cache (K's and V's: their strides are the
// same), without its head. Paged, `page` is the key's entry of the block table, one that lies in
// the cache (issue_tile checks it first); a page's bytes and a page's rows fit in 32 bits
// (run_decode refuses a cache whose strides do not): the page's product is one unsigned
// 32 x 32 -> 64-bit multiply, the row's within the page a 32-bit one.
template <bool PAGED>
__device__ __forceinline__ long long key_offset(const decode_params &p, int b, unsigned page,
                                                int key) {
    // LAB HOLE 1 BEGIN [design]: the page gather: where key `key` of sequence b lies in the cache
    // LAB TODO: the byte offset of the key's row in the cache (K's, and V's: the same strides),
    // LAB TODO: without the head and the chunk (issue_tile adds those). A contiguous cache holds
    // LAB TODO: sequence b as its batch b (p.k_batch elements apart), its keys p.k_row elements
    // LAB TODO: apart. A paged one holds pages p.page_bytes apart, each 2^p.page_shift consecutive
    // LAB TODO: keys of one sequence, p.row_bytes apart; `page` is the key's entry of the block
    // LAB TODO: table (next_pages read it, issue_tile checked it). Offsets pass 2^32 bytes in long
    // LAB TODO: caches: the page's product in 64 bits (a 32-bit value widened before it is
    // LAB TODO: multiplied).
    // LAB STUB: return 0;  // until filled: every key reads the cache's first row
    if constexpr (PAGED) {
        (void)b;
        return (long long)((unsigned long long)page * p.page_bytes +
                           (unsigned)(key & ((1 << p.page_shift) - 1)) * p.row_bytes);
    } else {
        (void)page;
        return (b * p.k_batch + (long long)key * p.k_row) * (long long)HALF_BYTES;
    }
    // LAB HOLE 1 END
}

// The block table as a block reads it (paged; a contiguous cache reads none): its sequence's row
// of entries, found once, and the page size as a shift. The empty asm keeps the row in registers:
// without it the compiler folds b x max_pages back into every key row's lookup (a multiply and
// the parameters reloaded, per row and tile).
struct page_table {
    const int *row;
    int shift;
};
template <bool PAGED>
__device__ __forceinline__ page_table table_of(const decode_params &p, int b) {
    if constexpr (PAGED) {
        page_table t = {p.block_table + (long long)b * p.max_pages, p.page_shift};
        asm("" : "+l"(t.row));
        return t;
    } else {
        (void)p, (void)b;
        return {nullptr, 0};
    }
}

// The page of key `key` (paged), read from the block table; -1 past the block's key range.
// `k_limit` is the range's end within the cache, known from the parameters alone: the read does
// not wait for the sequence's length (issue_tile drops the keys past the length).
template <bool PAGED>
__device__ __forceinline__ int page_of(const page_table &t, int key, int k_limit) {
    if constexpr (PAGED) {
        return key < k_limit ? __ldg(t.row + (key >> t.shift)) : -1;
    } else {
        (void)t, (void)key, (void)k_limit;
        return 0;
    }
}

/* ---- the append: new keys into the cache ----------------------------------------------------- */

// One thread per 16-byte chunk of K_new and V_new ([B, N_new, H_kv, D] by their strides): key j
// of sequence b goes to position seqlens[b] + j, through the block table when paged. Positions
// past the cache, and pages outside it, are not written.
typedef struct {
    const elem *K_new, *V_new;
    long long kn_batch, kn_head, kn_row, vn_batch, vn_head, vn_row;
    elem *K, *V;
    const int *seqlens, *block_table;
    long long k_batch, k_head, k_row, v_batch, v_head, v_row;
    int B, N_new, H_kv, D, capacity, page_shift, num_pages, max_pages;
} append_params;

template <bool PAGED>
__global__ void __launch_bounds__(THREADS) append_kernel(const append_params a) {
    const int chunks = a.D / CHUNK_HALVES;
    const long long total = (long long)a.B * a.N_new * a.H_kv * chunks;
    for (long long x = (long long)blockIdx.x * THREADS + threadIdx.x; x < total;
         x += (long long)gridDim.x * THREADS) {
        const int c = (int)(x % chunks);
        const int hk = (int)(x / chunks % a.H_kv);
        const int j = (int)(x / chunks / a.H_kv % a.N_new);
        const int b = (int)(x / chunks / a.H_kv / a.N_new);
        const long long pos = (long long)max(a.seqlens[b], 0) + j;
        if (pos >= a.capacity) continue;
        long long kdst, vdst;
        if constexpr (PAGED) {
            const int page = a.block_table[(long long)b * a.max_pages + (pos >> a.page_shift)];
            if ((unsigned)page >= (unsigned)a.num_pages) continue;
            const long long r = pos & ((1 << a.page_shift) - 1);
            kdst = page * a.k_batch + r * a.k_row, vdst = page * a.v_batch + r * a.v_row;
        } else {
            kdst = b * a.k_batch + pos * a.k_row, vdst = b * a.v_batch + pos * a.v_row;
        }
        const long long col = (long long)c * CHUNK_HALVES;
        const uint4 *ks = reinterpret_cast<const uint4 *>(a.K_new + b * a.kn_batch + j * a.kn_row +
                                                          hk * a.kn_head + col);
        const uint4 *vs = reinterpret_cast<const uint4 *>(a.V_new + b * a.vn_batch + j * a.vn_row +
                                                          hk * a.vn_head + col);
        *reinterpret_cast<uint4 *>(a.K + kdst + hk * a.k_head + col) = *ks;
        *reinterpret_cast<uint4 *>(a.V + vdst + hk * a.v_head + col) = *vs;
    }
}

/* ---- the decode kernel, by phases ------------------------------------------------------------ */

// Rows of K (and V) one pass of the block's threads copies: each thread one 16-byte chunk.
template <int D>
__host__ __device__ constexpr int copy_rows() {
    return THREADS / (D / CHUNK_HALVES);
}
template <int D>
__host__ __device__ constexpr int copy_passes() {
    return tile_keys(D) / copy_rows<D>();
}

// Phase 1 (once): this warp's 16 rows of the packed Q tile, as A fragments, straight from global
// memory (a few KB per block; never in shared memory). Row r is query r / tile_heads of head
// h0 + r % tile_heads; rows past the tile's are zero (their scores stay finite, never written).
template <int D>
__device__ __forceinline__ void load_q(const decode_params &p, int b, int h0, int row0, int lane,
                                       uint32_t (&q)[D / MMA_K][A_FRAG_REGS]) {
    const int g = lane / QUAD, t = lane % QUAD;
#pragma unroll
    for (int hh = 0; hh < FRAG_LANE_ROWS; ++hh) {
        const int r = row0 + g + FRAG_ROW_STEP * hh;
        const bool real = r < p.rows;
        const elem *row = p.Q + b * p.q_batch + (long long)(r / p.tile_heads) * p.q_row +
                          (long long)(h0 + r % p.tile_heads) * p.q_head;
#pragma unroll
        for (int ks = 0; ks < D / MMA_K; ++ks) {
#pragma unroll
            for (int n = 0; n < N8_PER_K16; ++n) {
                const int col = ks * MMA_K + n * MMA_N + FRAG_LANE_COLS * t;
                q[ks][a_frag_reg(n, hh)] =
                    real ? *reinterpret_cast<const uint32_t *>(row + col) : 0u;
            }
        }
    }
}

// Phase 2 (per K/V tile, all threads): issue the copies of tile `tile` into ring stage `stage`:
// key rows pass x copy_rows + tid / chunks, chunk tid % chunks, from the page `page[pass]` holds
// (read a tile ahead: see next_pages). Keys past the sequence are zero-filled (and masked later),
// as are keys whose entry lies outside the cache. K and V have the same strides: one offset per key
// row serves both. A row's swizzle is the same in every pass (copy_rows is a multiple of 8 rows),
// so a pass adds a constant to the first offset in shared memory; contiguous, also in the cache:
// pass_at, copy_rows keys' stride.
template <int D, bool PAGED>
__device__ __forceinline__ void issue_tile(const decode_params &p, uint32_t k_stage,
                                           uint32_t v_stage, int b, int hk, int key0, int k_end,
                                           const int (&page)[copy_passes<D>()], long long pass_at) {
    constexpr int CHUNKS = D / CHUNK_HALVES;
    constexpr uint32_t PASS_BYTES = copy_rows<D>() * D * HALF_BYTES;
    static_assert(copy_rows<D>() % MATRIX_ROWS == 0, "a pass keeps the rows' swizzle");
    const int tid = (int)threadIdx.x, c = tid % CHUNKS, r0 = tid / CHUNKS;
    // the thread's head and chunk in K and V; key_offset's bytes go on top
    const long long head_chunk = hk * p.k_head + (long long)c * CHUNK_HALVES;
    const char *k_at = reinterpret_cast<const char *>(p.K + head_chunk);
    const char *v_at = reinterpret_cast<const char *>(p.V + head_chunk);
    const uint32_t first = tile_offset<D>(r0, c);
    // contiguous: the first pass's row; each pass copy_rows keys further (pass_at bytes)
    const long long at0 = PAGED ? 0 : key_offset<PAGED>(p, b, 0, key0 + r0);
#pragma unroll
    for (int pass = 0; pass < copy_passes<D>(); ++pass) {
        const int key = key0 + pass * copy_rows<D>() + r0;
        if constexpr (PAGED) {
            (void)pass_at;
            // past the range page_of gave -1; past the sequence, or an entry outside the cache,
            // reads nothing (the copy's address stays in page 0, never read)
            const bool valid = key < k_end && (unsigned)page[pass] < (unsigned)p.num_pages;
            const long long at = key_offset<PAGED>(p, b, valid ? (unsigned)page[pass] : 0u, key);
            copy_chunk(k_stage + first + pass * PASS_BYTES, as_elems(k_at + at), valid);
            copy_chunk(v_stage + first + pass * PASS_BYTES, as_elems(v_at + at), valid);
        } else {
            const bool valid = key < k_end;
            const long long at = valid ? at0 + pass * pass_at : 0;
            copy_chunk(k_stage + first + pass * PASS_BYTES, as_elems(k_at + at), valid);
            copy_chunk(v_stage + first + pass * PASS_BYTES, as_elems(v_at + at), valid);
        }
    }
}

// The pages of the keys this thread copies in the tile at key0 (paged; else nothing is read), up
// to the block's range end k_limit.
template <int D, bool PAGED>
__device__ __forceinline__ void next_pages(const page_table &t, int key0, int k_limit,
                                           int (&page)[copy_passes<D>()]) {
    constexpr int CHUNKS = D / CHUNK_HALVES;
#pragma unroll
    for (int pass = 0; pass < copy_passes<D>(); ++pass)
        page[pass] =
            page_of<PAGED>(t, key0 + pass * copy_rows<D>() + (int)threadIdx.x / CHUNKS, k_limit);
}

// A warp's running softmax state for its two rows (g and g + 8 of its m16 tile): the max m in
// base 2, this thread's share of the sum l, and O_acc, D / 8 accumulator blocks.
template <int D>
struct row_state {
    float m[FRAG_LANE_ROWS], l[FRAG_LANE_ROWS];
    float o[D / MMA_N][FRAG_REGS];
};

// Phase 3 (per 16-key slice, per warp): S = Q K^T over the slice's keys, the mask (keys past the
// range; causal: key j > i + L - N for query i), the online softmax, O_acc += P V.
template <int D, bool BF16>
__device__ __forceinline__ void attend_slice(const decode_params &p,
                                             const uint32_t (&q)[D / MMA_K][A_FRAG_REGS],
                                             uint32_t k_slice, uint32_t v_slice, int key0,
                                             int k_end, int L, int row0, int lane,
                                             row_state<D> &st) {
    float s[N8_PER_K16][FRAG_REGS];
    const uint32_t k_lane = k_slice + k_lane_offset<D>(lane);
#pragma unroll
    for (int ks = 0; ks < D / MMA_K; ++ks) {
        uint32_t kb[4];
        ldmatrix_x4(kb, k_lane ^ (uint32_t)(ks * X4_BYTES));
        if (ks == 0) {
            mma_16816_zero_of<BF16>(s[0], q[ks], kb[0], kb[1]);
            mma_16816_zero_of<BF16>(s[1], q[ks], kb[2], kb[3]);
        } else {
            mma_16816_of<BF16>(s[0], q[ks], kb[0], kb[1]);
            mma_16816_of<BF16>(s[1], q[ks], kb[2], kb[3]);
        }
    }
    const int g = lane / QUAD, t = lane % QUAD;
    uint32_t pa[A_FRAG_REGS];
    float alpha[FRAG_LANE_ROWS];  // each row's rescale of O_acc
#pragma unroll
    for (int hh = 0; hh < FRAG_LANE_ROWS; ++hh) {
        const int r = row0 + g + FRAG_ROW_STEP * hh;
        const int last = p.causal ? r / p.tile_heads + L - p.N : INT_MAX;  // last key it sees
        float mx = -INFINITY;
#pragma unroll
        for (int n = 0; n < N8_PER_K16; ++n) {
#pragma unroll
            for (int c = 0; c < FRAG_LANE_COLS; ++c) {
                const int key = key0 + n * MMA_N + FRAG_LANE_COLS * t + c;
                float &x = s[n][frag_reg(hh, c)];
                x = key < k_end && key <= last ? x * p.scale_log2 : -INFINITY;
                mx = fmaxf(mx, x);
            }
        }
        mx = fmaxf(mx, __shfl_xor_sync(FULL_WARP, mx, 1));  // the row's quad
        mx = fmaxf(mx, __shfl_xor_sync(FULL_WARP, mx, 2));
        const float m_new = fmaxf(st.m[hh], mx);
        const float base = m_new == -INFINITY ? 0.f : m_new;  // no key yet: every p is 0
        const float corr = st.m[hh] == -INFINITY ? 1.f : fast_exp2(st.m[hh] - base);
        float sum = 0.f;
#pragma unroll
        for (int n = 0; n < N8_PER_K16; ++n) {
#pragma unroll
            for (int c = 0; c < FRAG_LANE_COLS; ++c) {
                float &x = s[n][frag_reg(hh, c)];
                x = fast_exp2(x - base);
                sum += x;
            }
            pa[a_frag_reg(n, hh)] = pack2_of<BF16>(s[n][frag_reg(hh, 0)], s[n][frag_reg(hh, 1)]);
        }
        st.l[hh] = st.l[hh] * corr + sum;
        st.m[hh] = m_new;
        alpha[hh] = corr;
    }
    // O_acc is rescaled only when some row of the warp has a new max (after the first few slices
    // hardly ever: a row's max of 16 more keys rarely beats its max so far); a row that had no key
    // yet has O_acc = 0, which needs no rescale either.
    if (__any_sync(FULL_WARP, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
        for (int n = 0; n < D / MMA_N; ++n) {
#pragma unroll
            for (int e = 0; e < FRAG_REGS; ++e) st.o[n][e] *= alpha[frag_h(e)];
        }
    }
    const uint32_t v_lane = v_slice + v_lane_offset<D>(lane);
#pragma unroll
    for (int dc = 0; dc < D / MMA_K; ++dc) {
        uint32_t vb[4];
        ldmatrix_x4_trans(vb, v_lane ^ (uint32_t)(dc * X4_BYTES));
        mma_16816_of<BF16>(st.o[N8_PER_K16 * dc], pa, vb[0], vb[1]);
        mma_16816_of<BF16>(st.o[N8_PER_K16 * dc + 1], pa, vb[2], vb[3]);
    }
}

// Where key warp kw leaves row `block_row` (of the block's row_warps x 16 rows) of its state in
// shared memory (the ring, no longer needed): O_acc's D columns, then m and l. Rows are
// state_floats() apart, a multiple of 4 floats: each row's columns stay 16-byte aligned for the
// merge's float4 reads.
__host__ __device__ constexpr int state_floats(int D) {
    return D + 4;  // O_acc, m, l, two floats of padding
}
template <int D>
__device__ __forceinline__ int state_row(int row_warps, int kw, int block_row) {
    return (kw * row_warps * MMA_M + block_row) * state_floats(D);
}

// Phase 4 (once, every warp): leave this warp's rows of the tile's real rows (the padding rows
// past p.rows are never merged) in shared memory, O_acc in the accumulator's order: column
// n * MMA_N + 2t + c of row g (+ 8) is st.o[n][frag_reg(h, c)].
template <int D>
__device__ __forceinline__ void leave_state(const decode_params &p, float *smem_f, int m_warp,
                                            int key_warp, int row0, int lane,
                                            const row_state<D> &st) {
    const int g = lane / QUAD, t = lane % QUAD;
#pragma unroll
    for (int hh = 0; hh < FRAG_LANE_ROWS; ++hh) {
        const int r = g + FRAG_ROW_STEP * hh;
        if (row0 + r >= p.rows) continue;
        float *row = smem_f + state_row<D>(p.row_warps, key_warp, m_warp * MMA_M + r);
#pragma unroll
        for (int n = 0; n < D / MMA_N; ++n)
            *reinterpret_cast<float2 *>(row + n * MMA_N + FRAG_LANE_COLS * t) =
                make_float2(st.o[n][frag_reg(hh, 0)], st.o[n][frag_reg(hh, 1)]);
        if (t == 0) row[D] = st.m[hh], row[D + 1] = st.l[hh];
    }
}

// Phase 5a (per output item: a row and four of its columns): the key warps' states of that row,
// each over its own keys of the range, folded into one state of all of them, unnormalised:
// m = max m_w, l = sum l_w 2^(m_w - m), O = sum O_w 2^(m_w - m).
template <int D>
__device__ __forceinline__ void merge_key_warps(const float *smem_f, int row_warps, int key_warps,
                                                int block_row, int col, float *m, float *l,
                                                float4 *o) {
    // LAB HOLE 2 BEGIN [design]: the key warps' merge of one row's four columns
    // LAB TODO: key warp kw (0 .. key_warps - 1) left its state of the row at smem_f +
    // LAB TODO: state_row<D>(row_warps, kw, block_row): O_acc's D columns, then m (base 2), then
    // LAB TODO: l. Write into *m, *l and *o (columns col .. col + 3 of O_acc) what one warp that
    // LAB TODO: saw every key would hold: the largest m, and every warp's l and O_acc weighed by
    // LAB TODO: 2 to the power (its m - that m) before they are summed. A row no warp saw a key
    // LAB TODO: of has m = -inf in every state and must come out with l = 0 and O_acc = 0, never
    // LAB TODO: a NaN.
    // LAB STUB: const float *row = smem_f + state_row<D>(row_warps, 0, block_row);  // warp 0's
    // LAB STUB: *m = row[D], *l = row[D + 1], *o = *reinterpret_cast<const float4 *>(row + col);
    // LAB STUB: (void)key_warps;  // until filled: the row keeps key warp 0's keys only
    float mx = -INFINITY;
#pragma unroll
    for (int kw = 0; kw < WARPS; ++kw)  // (unrolled: key_warps is 1, 2 or 4)
        if (kw < key_warps) mx = fmaxf(mx, smem_f[state_row<D>(row_warps, kw, block_row) + D]);
    const float base = mx == -INFINITY ? 0.f : mx;  // no key: every weight 2^-inf = 0
    float sum = 0.f;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int kw = 0; kw < WARPS; ++kw) {
        if (kw >= key_warps) break;
        const float *row = smem_f + state_row<D>(row_warps, kw, block_row);
        const float w = fast_exp2(row[D] - base);
        const float4 x = *reinterpret_cast<const float4 *>(row + col);
        sum += w * row[D + 1];
        acc.x += w * x.x, acc.y += w * x.y, acc.z += w * x.z, acc.w += w * x.w;
    }
    *m = mx, *l = sum, *o = acc;
    // LAB HOLE 2 END
}

// Phase 5 (once, every thread): the block's real rows, four columns an item; a thread's items
// are the same four columns of every ROWS_PER_PASS-th row. Each row is merged (merge_key_warps),
// then O = O_acc / l and LSE = (m + log2 l) ln 2 go into O and lse (one range) or into the range's
// slot of O_part and lse_part (split: combine_kernel_pdl merges the ranges). A row that saw no
// key: O = 0, LSE = -inf. A packed row r is query r / tile_heads of head h0 + r % tile_heads:
// worked out once a thread, then carried from row to row.
template <int D, bool BF16>
__device__ __forceinline__ void store_rows(const decode_params &p, const float *smem_f, int b,
                                           int h0, int first, int split) {
    constexpr int ITEMS_PER_ROW = D / 4;  // a float4 of O's columns each
    constexpr int ROWS_PER_PASS = THREADS / ITEMS_PER_ROW;
    static_assert(THREADS % ITEMS_PER_ROW == 0, "a thread keeps its columns from row to row");
    const int key_warps = WARPS / p.row_warps;
    const int rows = min(p.rows - first, p.row_warps * MMA_M);
    const long long part_rows = (long long)p.B * p.H * p.N;
    const int col = (int)threadIdx.x % ITEMS_PER_ROW * 4;
    int block_row = (int)threadIdx.x / ITEMS_PER_ROW;
    int i = (first + block_row) / p.tile_heads, hh = (first + block_row) % p.tile_heads;
    for (; block_row < rows; block_row += ROWS_PER_PASS) {
        float m, l;
        float4 o;
        merge_key_warps<D>(smem_f, p.row_warps, key_warps, block_row, col, &m, &l, &o);
        const int h = h0 + hh;
        const float inv = l > 0.f ? __fdividef(1.f, l) : 0.f;       // l <= the range's keys
        const long long prow = ((long long)b * p.H + h) * p.N + i;  // [B, H, N] row
        if (p.splits == 1) {
            elem *out =
                p.O + b * p.o_batch + (long long)i * p.o_row + (long long)h * p.o_head + col;
            *reinterpret_cast<uint2 *>(out) = make_uint2(pack2_of<BF16>(o.x * inv, o.y * inv),
                                                         pack2_of<BF16>(o.z * inv, o.w * inv));
        } else {
            *reinterpret_cast<float4 *>(p.O_part + ((long long)split * part_rows + prow) * D +
                                        col) =
                make_float4(o.x * inv, o.y * inv, o.z * inv, o.w * inv);
        }
        if (col == 0) {
            const float lse = l > 0.f ? (m + __log2f(l)) * LN2 : -INFINITY;
            (p.splits == 1 ? p.lse[prow] : p.lse_part[(long long)split * part_rows + prow]) = lse;
        }
        for (hh += ROWS_PER_PASS; hh >= p.tile_heads; hh -= p.tile_heads) ++i;  // the next row's
    }
}

// Where a block works: key range blockIdx.x of query heads h0 .. h0 + tile_heads - 1 (head tile
// blockIdx.y, of KV head hk) of sequence b, its rows from `first` (row group g of row_warps m16
// tiles: blockIdx.z = b x row_groups + g). Without a division where the shape allows (one row
// group, packed heads: one head tile a KV head), so that the length's load is among the block's
// first instructions.
struct block_place {
    int b, h0, hk, first;
};
__device__ __forceinline__ block_place block_place_of(const decode_params &p) {
    const int z = (int)blockIdx.z, y = (int)blockIdx.y;
    const int b = p.row_groups == 1 ? z : z / p.row_groups;
    const int g = z - b * p.row_groups;
    const int h0 = y * p.tile_heads;
    return {b, h0, p.tile_heads == p.group ? y : h0 / p.group, g * p.row_warps * MMA_M};
}

// One block (block_place_of says which). The loop's schedule: the ring holds
// `stages` K/V tiles; tile j + stages - 1 is issued as tile j is computed.
template <int D, bool BF16, bool PAGED>
__global__ void DECODE_LAUNCH_BOUNDS decode_kernel(const decode_params p) {
    extern __shared__ __align__(128) unsigned char smem[];
    constexpr int KT = tile_keys(D), SLICES = KT / SLICE;  // keys a tile, slices a tile
    constexpr uint32_t TILE_BYTES = KT * D * HALF_BYTES;
    constexpr uint32_t STAGE_BYTES = 2 * TILE_BYTES;  // K, then V
    const int split = blockIdx.x;
    const block_place at = block_place_of(p);
    const int b = at.b, h0 = at.h0, hk = at.hk;
    const int warp = (int)threadIdx.x / WARP_SIZE, lane = (int)threadIdx.x % WARP_SIZE;
    const int m_warp = warp & (p.row_warps - 1), key_warp = warp >> p.row_shift;
    const int key_warps = WARPS >> p.row_shift;
    const int row0 = at.first + m_warp * MMA_M;

    let_next_kernel_start();  // the merge may be placed on the SMs (it waits for this grid)
    const int k_begin = split * p.split_keys;
    const int k_limit = min(p.capacity, k_begin + p.split_keys);  // the range, from parameters
    // tile 0's pages: their reads go out beside the length's, not after it
    const page_table table = table_of<PAGED>(p, b);
    int page[copy_passes<D>()];
    next_pages<D, PAGED>(table, k_begin, k_limit, page);
    const int L = sequence_keys(p, b);
    const int k_end = min(L, k_limit);
    const int tiles = k_end > k_begin ? (k_end - k_begin + KT - 1) / KT : 0;
    const uint32_t ring = smem_u32(smem), ring_end = ring + (uint32_t)p.stages * STAGE_BYTES;
    const long long pass_at = copy_rows<D>() * p.k_row * HALF_BYTES;  // contiguous: a pass's keys

    // the prologue: tiles 0 .. stages - 2 in flight, one commit group each (empty past the range);
    // tile j + 1's pages read once tile j's copies are out
    for (int j = 0; j < p.stages - 1; ++j) {
        if (j < tiles)
            issue_tile<D, PAGED>(p, ring + j * STAGE_BYTES, ring + j * STAGE_BYTES + TILE_BYTES, b,
                                 hk, k_begin + j * KT, k_end, page, pass_at);
        cp_async_commit();
        next_pages<D, PAGED>(table, k_begin + (j + 1) * KT, k_limit, page);
    }

    uint32_t q[D / MMA_K][A_FRAG_REGS];
    load_q<D>(p, b, h0, row0, lane, q);
    row_state<D> st;
#pragma unroll
    for (int hh = 0; hh < FRAG_LANE_ROWS; ++hh) st.m[hh] = -INFINITY, st.l[hh] = 0.f;
#pragma unroll
    for (int n = 0; n < D / MMA_N; ++n) {
#pragma unroll
        for (int e = 0; e < FRAG_REGS; ++e) st.o[n][e] = 0.f;
    }

    // the ring's stages, carried from tile to tile: tile j's, and the one tile j - 1 left (where
    // tile j + stages - 1 goes)
    uint32_t stage = ring, free_stage = ring + (uint32_t)(p.stages - 1) * STAGE_BYTES;
    for (int j = 0; j < tiles; ++j) {
        cp_async_wait_pending(p.stages - 2);  // this thread's copies of tile j have landed
        __syncthreads();  // everyone's have; and every warp is done with tile j - 1's stage
        const int next = j + p.stages - 1;  // into the stage tile j - 1 left
        if (next < tiles)
            issue_tile<D, PAGED>(p, free_stage, free_stage + TILE_BYTES, b, hk, k_begin + next * KT,
                                 k_end, page, pass_at);
        cp_async_commit();
        // tile next + 1's pages, in flight meanwhile
        next_pages<D, PAGED>(table, k_begin + (next + 1) * KT, k_limit, page);
        free_stage = stage;  // tile j's, once it is computed

        const int key0 = k_begin + j * KT;
        for (int sl = key_warp; sl < SLICES && key0 + sl * SLICE < k_end; sl += key_warps) {
            const uint32_t off = (uint32_t)(sl * SLICE * D * HALF_BYTES);
            attend_slice<D, BF16>(p, q, stage + off, stage + TILE_BYTES + off, key0 + sl * SLICE,
                                  k_end, L, row0, lane, st);
        }
        stage = stage + STAGE_BYTES == ring_end ? ring : stage + STAGE_BYTES;  // tile j + 1's
    }
#pragma unroll
    for (int hh = 0; hh < FRAG_LANE_ROWS; ++hh) {  // each row's sum over its quad
        st.l[hh] += __shfl_xor_sync(FULL_WARP, st.l[hh], 1);
        st.l[hh] += __shfl_xor_sync(FULL_WARP, st.l[hh], 2);
    }
    cp_async_wait<0>();
    __syncthreads();  // every warp is done with the ring: the states may overwrite it
    float *state = reinterpret_cast<float *>(smem);
    leave_state<D>(p, state, m_warp, key_warp, row0, lane, st);
    __syncthreads();  // every key warp's state is in shared memory
    store_rows<D, BF16>(p, state, b, h0, at.first, split);
}

/* ---- the plan (host) ------------------------------------------------------------------------- */

enum { VARIANT_DEFAULT = 0, VARIANT_NOPACK, VARIANT_NOSPLIT, VARIANTS };

typedef struct {
    int tile_heads, rows, row_warps, row_groups;
    int splits, split_keys, stages;
    size_t smem;
} decode_plan;

// Bytes of one ring stage (a K and a V tile), and of the key warps' merge (every warp's 16 rows
// of O, m and l: it reuses the ring).
static size_t stage_bytes(int D) {
    return (size_t)2 * tile_keys(D) * D * HALF_BYTES;
}
static size_t merge_bytes(int D) {
    return (size_t)WARPS * MMA_M * state_floats(D) * sizeof(float);
}

// Which code the kernels have on this device (a compute_75 PTX build JIT-compiled on an H100: 75).
static cudaError_t kernel_arch(int *arch) {
    int binary = 0;
    *arch = 0;
    return kernel_versions((const void *)decode_kernel<64, false, false>, arch, &binary);
}

// The key ranges of n (at most): `tiles` K/V tiles cut into ranges of whole tiles, as even as
// whole tiles allow (the last range may be shorter, so there may be fewer than n).
static void cut_ranges(decode_plan *pl, int tiles, int n, int tile_k) {
    const int per = ceil_div(tiles, n);
    pl->split_keys = per * tile_k;
    pl->splits = ceil_div(tiles, per);
}

// The plan of a shape: how rows and keys are shared out, the ring's depth, how many key ranges.
// split: whether the caller gives the workspace split-KV needs; paged: a paged cache (a plan for
// the workspace's size takes it paged: never fewer ranges). The shared memory per SM is taken
// as the per-block limit plus the 1 KB the driver reserves per block: an imitated T4 or L4
// (--smem-limit) then fits the blocks that GPU would.
static void make_plan(const attn_shape *s, const attn_device *dev, int variant, bool split,
                      bool paged, decode_plan *pl) {
    const int group = s->H / s->H_kv;
    pl->tile_heads = variant == VARIANT_NOPACK ? 1 : group;
    pl->rows = pl->tile_heads * s->N;
    const int m_tiles = ceil_div(pl->rows, MMA_M);
    pl->row_warps = m_tiles >= 3 ? WARPS : m_tiles;  // 1, 2 or 4: the key warps divide 4
    pl->row_groups = ceil_div(pl->rows, (long long)pl->row_warps * MMA_M);

    const size_t per_sm = dev->smem_per_block + 1024, reserve = 1024;
    int best = 0;
    pl->stages = 0;
    for (int st = MIN_STAGES; st <= MAX_STAGES; ++st) {
        const size_t bytes = (size_t)st * stage_bytes(s->D);
        if (bytes > dev->smem_per_block) break;
        const int blocks = (int)(per_sm / (bytes + reserve));
        if (blocks * (st - 1) > best) best = blocks * (st - 1), pl->stages = st;
    }
    pl->smem = (size_t)pl->stages * stage_bytes(s->D);  // the merge reuses it: it fits
    if (pl->smem < merge_bytes(s->D)) pl->smem = merge_bytes(s->D);
    const int blocks_per_sm = pl->stages ? (int)(per_sm / (pl->smem + reserve)) : 1;

    const int tile_k = tile_keys(s->D);  // keys a tile
    const int tiles = ceil_div(s->N_k, tile_k);
    pl->splits = 1, pl->split_keys = tiles * tile_k;
    if (!split || variant == VARIANT_NOSPLIT || dev->sm_count < 1) return;
    const long long units = (long long)s->B * (s->H / pl->tile_heads) * pl->row_groups;
    const long long slots = (long long)dev->sm_count * (blocks_per_sm > 0 ? blocks_per_sm : 1);
    // Fewer units (packed query tiles) than slots: as many ranges as one wave holds, so that
    // every SM gets the same number of blocks (the blocks share an SM's issue slots: an SM with
    // one block less idles while the others finish); but ranges of at least MIN_RANGE_TILES
    // tiles, with no fewer asked for than one block per SM.
    if (units <= slots) {
        const long long fill = slots / units, per_sm = dev->sm_count / units;
        const long long longest = tiles / MIN_RANGE_TILES;
        long long n = fill < longest ? fill : longest;
        n = n > per_sm ? n : per_sm;
        if (!paged && s->N_k >= CONTIGUOUS_ONE_ROUND_KEYS && n > COMBINE_UNROLL)
            n = per_sm > COMBINE_UNROLL ? per_sm : COMBINE_UNROLL;
        n = n < tiles ? n : tiles;
        n = n < MAX_SPLITS ? n : MAX_SPLITS;
        cut_ranges(pl, tiles, (int)n, tile_k);
        return;
    }
    // More: the fewest ranges whose blocks fill the slots in whole waves within FILL_SLACK of the
    // best (FA2's rule), for every count from one range up.
    double eff_best = 0.;
    double eff[MAX_SPLITS + 1] = {0.};
    for (int n = 1; n <= MAX_SPLITS && n <= tiles; ++n) {
        const long long blocks = units * n, waves = (blocks + slots - 1) / slots;
        eff[n] = (double)blocks / (double)(waves * slots);
        if (eff[n] > eff_best) eff_best = eff[n];
    }
    for (int n = 1; n <= MAX_SPLITS && n <= tiles; ++n) {
        if (eff[n] >= FILL_SLACK * eff_best) {
            cut_ranges(pl, tiles, n, tile_k);
            return;
        }
    }
}

/* ---- the launcher ---------------------------------------------------------------------------- */

static const char *decode_unsupported(const attn_shape *s, const attn_device *dev, int variant) {
    if (s->D != 64 && s->D != 128) return "head dim must be 64 or 128";
    if (!(s->scale > 0.f)) return "scale must be positive";
    if (s->B < 1 || s->H < 1) return "B and H must be >= 1";
    if (s->N < 1 || s->N > ATTN_MAX_DECODE_N)
        return "decode takes 1 to 16 queries per sequence (--seq; longer prompts: stages 5 and 6)";
    if (s->N_k < 1) return "the cache must hold at least one key (N_k >= 1)";
    if (dev->cc < 75) return "needs sm_75 or newer (mma.sync, ldmatrix)";
    if (variant < 0 || variant >= VARIANTS) return "unknown variant";
    if (s->H_kv < 1 || s->H % s->H_kv)
        return "H must be a multiple of H_kv (query heads per KV head)";
    // the grid's z is B x row groups: a tile's rows (at most 16 a query head) make at most H groups
    if ((long long)s->B * s->H > ATTN_MAX_GRID_Y) return "B * H is more than a grid's z holds";
    if (s->k.batch != s->v.batch || s->k.head != s->v.head || s->k.row != s->v.row)
        return "the K and V caches must have the same strides";
    const attn_layout *l[] = {&s->q, &s->k, &s->v, &s->o};
    const char *why = attn_strides_refused(l, 4, s->D, LLONG_MAX);
    if (why) return why;
    if ((size_t)MIN_STAGES * stage_bytes(s->D) > dev->smem_per_block)
        return "needs 32 KB (D = 64) or 64 KB (D = 128) of shared memory per block";
    int arch = 0;
    if (kernel_arch(&arch) != cudaSuccess) {
        cudaGetLastError();
        return "no kernel image for this device";
    }
    if (s->bf16 && arch < 80)
        return "bf16 needs sm_80 or newer (mma.sync has no bf16 form on sm_75)";
    return NULL;
}

// Split-KV's partial results: O_part [splits, B * H * N, D] then lse_part [splits, B * H * N].
static size_t decode_workspace(const attn_shape *s, const attn_device *dev, int variant) {
    if (decode_unsupported(s, dev, variant)) return 0;
    decode_plan pl;
    make_plan(s, dev, variant, true, true, &pl);
    if (pl.splits == 1) return 0;
    return (size_t)pl.splits * s->B * s->H * s->N * (s->D + 1) * sizeof(float);
}

typedef void (*decode_fn)(const decode_params);

static decode_fn kernel_for(int D, bool bf16, bool paged) {
    if (D == 64) {
        return bf16 ? (paged ? decode_kernel<64, true, true> : decode_kernel<64, true, false>)
                    : (paged ? decode_kernel<64, false, true> : decode_kernel<64, false, false>);
    }
    return bf16 ? (paged ? decode_kernel<128, true, true> : decode_kernel<128, true, false>)
                : (paged ? decode_kernel<128, false, true> : decode_kernel<128, false, false>);
}

// Every call: the append (if any), the decode kernel, the merge (if split).
static cudaError_t run_decode(const char *who, const attn_shape *s, const attn_cache *c,
                              const attn_device *dev, const void *Q, void *K, void *V, void *O,
                              float *lse, void *workspace, int variant, cudaStream_t stream) {
    const char *why = decode_unsupported(s, dev, variant);
    if (why) {
        fprintf(stderr, "stage9_decode: %s: %s\n", who, why);
        return cudaErrorInvalidValue;
    }
    if (((uintptr_t)Q | (uintptr_t)K | (uintptr_t)V | (uintptr_t)O | (uintptr_t)c->K_new |
         (uintptr_t)c->V_new) %
        CHUNK_BYTES) {
        fprintf(stderr, "stage9_decode: %s: every tensor must be 16-byte aligned\n", who);
        return cudaErrorMisalignedAddress;
    }
    const bool paged = c->block_table != NULL;
    // key_offset counts a page's bytes and a page's rows' in 32 bits: the standard [pages,
    // page_size, H_kv, D] holds page_size x H_kv x D x 2 <= 1,024 x H_kv x 256 bytes a page, under
    // 2^32 up to 16,383 KV heads; only a strided view of a larger tensor can pass it
    if (paged && (s->k.batch < 0 || s->k.row < 0 || s->k.batch * HALF_BYTES > UINT_MAX ||
                  s->k.row * HALF_BYTES * c->page_size > UINT_MAX)) {
        fprintf(stderr,
                "stage9_decode: %s: a paged cache's page stride and a page's rows must be "
                "non-negative and span under 2^32 bytes\n",
                who);
        return cudaErrorInvalidValue;
    }
    decode_plan pl;
    make_plan(s, dev, variant, workspace != NULL, paged, &pl);
    int shift = 0;
    while (paged && (1 << shift) < c->page_size) ++shift;
    // the most keys a sequence holds: the shape's N_k (what the plan cut), within the pages
    long long capacity = s->N_k;
    if (paged && (long long)c->max_pages * c->page_size < capacity)
        capacity = (long long)c->max_pages * c->page_size;

    if (c->N_new > 0) {
        const append_params a = {(const elem *)c->K_new,
                                 (const elem *)c->V_new,
                                 c->k_new.batch,
                                 c->k_new.head,
                                 c->k_new.row,
                                 c->v_new.batch,
                                 c->v_new.head,
                                 c->v_new.row,
                                 (elem *)K,
                                 (elem *)V,
                                 c->seqlens,
                                 c->block_table,
                                 s->k.batch,
                                 s->k.head,
                                 s->k.row,
                                 s->v.batch,
                                 s->v.head,
                                 s->v.row,
                                 s->B,
                                 c->N_new,
                                 s->H_kv,
                                 s->D,
                                 (int)(capacity < INT_MAX ? capacity : INT_MAX),
                                 shift,
                                 c->num_pages,
                                 c->max_pages};
        const long long chunks = (long long)s->B * c->N_new * s->H_kv * (s->D / CHUNK_HALVES);
        const unsigned blocks =
            (unsigned)(chunks < 65536LL * THREADS ? ceil_div(chunks, THREADS) : 65536);
        (paged ? append_kernel<true> : append_kernel<false>)<<<blocks, THREADS, 0, stream>>>(a);
        ATTN_TRY(cudaGetLastError());
    }

    decode_params p;
    p.Q = (const elem *)Q, p.K = (const elem *)K, p.V = (const elem *)V, p.O = (elem *)O;
    p.lse = lse;
    const long long part_rows = (long long)s->B * s->H * s->N;
    p.O_part = pl.splits > 1 ? (float *)workspace : NULL;
    p.lse_part = pl.splits > 1 ? p.O_part + (size_t)pl.splits * part_rows * s->D : NULL;
    p.seqlens = c->seqlens, p.block_table = c->block_table;
    p.q_batch = s->q.batch, p.q_head = s->q.head, p.q_row = s->q.row;
    p.o_batch = s->o.batch, p.o_head = s->o.head, p.o_row = s->o.row;
    p.k_batch = s->k.batch, p.k_head = s->k.head, p.k_row = s->k.row;
    p.B = s->B, p.H = s->H, p.H_kv = s->H_kv, p.N = s->N, p.N_new = c->N_new;
    p.capacity = (int)(capacity < INT_MAX ? capacity : INT_MAX);
    p.page_shift = shift, p.num_pages = c->num_pages, p.max_pages = c->max_pages;
    p.page_bytes = paged ? (unsigned)(s->k.batch * HALF_BYTES) : 0;
    p.row_bytes = paged ? (unsigned)(s->k.row * HALF_BYTES) : 0;
    p.causal = s->causal, p.scale_log2 = s->scale * LOG2E;
    p.tile_heads = pl.tile_heads, p.group = s->H / s->H_kv, p.rows = pl.rows;
    p.row_warps = pl.row_warps, p.row_groups = pl.row_groups;
    for (p.row_shift = 0; (1 << p.row_shift) < pl.row_warps;) ++p.row_shift;
    p.splits = pl.splits, p.split_keys = pl.split_keys, p.stages = pl.stages;

    const decode_fn fn = kernel_for(s->D, s->bf16, paged);
    ATTN_TRY(kernel_smem_limit((const void *)fn, (int)pl.smem));
    const dim3 grid((unsigned)pl.splits, (unsigned)(s->H / pl.tile_heads),
                    (unsigned)(s->B * pl.row_groups));
    fn<<<grid, THREADS, pl.smem, stream>>>(p);
    ATTN_TRY(cudaGetLastError());
    if (pl.splits == 1) return cudaSuccess;

    // The merge, launched with PDL: its blocks wait on the SMs while the decode kernel ends, and
    // the launch's latency is hidden behind it (on GPUs before sm_90 an ordinary launch).
    const combine_params cp = {p.O_part,
                               p.lse_part,
                               (__half *)O,
                               lse,
                               part_rows,
                               s->N,
                               1,
                               tile_keys(s->D),
                               pl.splits,
                               pl.split_keys / tile_keys(s->D),
                               {s->N, (int)capacity, -1, -1},
                               s->H,
                               s->o.batch,
                               s->o.head,
                               (int)s->o.row};
    const unsigned rows_per_block = s->D == 64 ? combine_rows_per_block<64, MERGE_THREADS>()
                                               : combine_rows_per_block<128, MERGE_THREADS>();
    cudaLaunchAttribute attr;
    const cudaLaunchConfig_t merge =
        pdl_launch_config(dim3((unsigned)((part_rows + rows_per_block - 1) / rows_per_block)),
                          MERGE_THREADS, 0, stream, true, &attr);
    void (*const merge_kernel)(const combine_params) =
        s->D == 64 ? (s->bf16 ? combine_kernel_pdl<64, true, MERGE_THREADS>
                              : combine_kernel_pdl<64, false, MERGE_THREADS>)
                   : (s->bf16 ? combine_kernel_pdl<128, true, MERGE_THREADS>
                              : combine_kernel_pdl<128, false, MERGE_THREADS>);
    ATTN_TRY(cudaLaunchKernelEx(&merge, merge_kernel, cp));
    return cudaSuccess;
}

// The contract's forward: N queries against a full contiguous cache of N_k keys (every sequence
// holds them all), K and V [B, H_kv, N_k, D] or any layout of 16-byte rows.
static cudaError_t decode_forward(const attn_shape *s, const attn_device *dev, const void *Q,
                                  const void *K, const void *V, void *O, float *lse,
                                  void *workspace, int variant, cudaStream_t stream) {
    attn_cache full;
    memset(&full, 0, sizeof(full));
    return run_decode("forward", s, &full, dev, Q, (void *)K, (void *)V, O, lse, workspace, variant,
                      stream);
}

static size_t decode_workspace_bytes(const attn_shape *s, const attn_cache *c,
                                     const attn_device *dev, int variant) {
    (void)c;
    return decode_workspace(s, dev, variant);
}

static cudaError_t decode(const attn_shape *s, const attn_cache *c, const attn_device *dev,
                          const void *Q, void *K_cache, void *V_cache, void *O, float *lse,
                          void *workspace, int variant, cudaStream_t stream) {
    const char *why = attn_cache_refused(s, c);
    if (why) {
        fprintf(stderr, "stage9_decode: %s\n", why);
        return cudaErrorInvalidValue;
    }
    return run_decode("decode", s, c, dev, Q, K_cache, V_cache, O, lse, workspace, variant, stream);
}

extern "C" const attn_stage attn_this_stage = {
    "stage9_decode",
    "decode: 1-16 queries against a (paged) KV cache; GQA heads packed in one tile, the keys "
    "split across blocks by a host plan, pages gathered by cp.async, the ranges merged by LSE",
    ATTN_F16,
    "default,nopack,nosplit",
    decode_unsupported,
    decode_workspace,
    decode_forward,
    NULL,  // no backward pass: generation does not train
    NULL,
    ATTN_TAKES_BF16 | ATTN_TAKES_GQA | ATTN_TAKES_STRIDES | ATTN_TAKES_N_K,
    0,
    decode_workspace_bytes,
    decode,
};
