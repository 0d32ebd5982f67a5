/*
 * stage8_hopper_backward/config.cuh: the configuration: the tiles (keys per block, queries per
 * step, the depth of the Q/dO ring), the warpgroups and their registers, how the two consumer
 * warpgroups split dQ_i = dS K_j at each head dim, the block's shared memory (smem_bytes,
 * carve_smem), its mbarriers and named barriers, and the parameters the main kernel reads
 * (bwd_problem).
 *
 * Part of attention.cu's one translation unit, as every .cuh file of this folder.
 */
#pragma once

#include "attention.h"
#include "device/backward_prepost.cuh"  // bwd_params, tensor_strides, ROW_PAD, DQ_SLAB_COLS
#include "device/sm90.cuh"              // WGMMA_M, WARPGROUP, slabs and descriptors, ...

// The main kernel exists only in sm_90a code (HOPPER_KERNELS); other targets compile an empty
// kernel, which the launcher never starts (stage_unsupported), and leave the Hopper-only
// constants below unused.
#if defined(__CUDA_ARCH__) && !HOPPER_KERNELS
#pragma nv_diag_suppress 177  // "declared but never referenced"
#endif

/* ---- tiles and warpgroups -------------------------------------------------------------------- */

// A block owns KEYS keys of one (batch, key/value head): each of the CONSUMERS warpgroups 64 of
// them (wgmma's M), with their dK_j and dV_j in its registers for the whole block. Per step it
// takes qrows<D>() queries of one query head (wgmma's N for S^T and dP^T, and the K of dV and
// dK): FlashAttention-3's tiles, 128 keys x 64 queries at D = 128 and 128 x 128 at D = 64, where
// the products of a step are half as deep and the step's barriers and softmax work would
// otherwise weigh twice as much against them.
constexpr int CONSUMERS = 2;
constexpr int PRODUCER_WARPGROUPS = 1;  // warpgroup 0; the consumers are 1 and 2
constexpr int BLOCK_THREADS = (CONSUMERS + PRODUCER_WARPGROUPS) * WARPGROUP;  // 384
constexpr int KEYS = CONSUMERS * WGMMA_M;                                     // 128
constexpr int CONSUMER_WARPS = CONSUMERS * WARPS_PER_WARPGROUP;
template <int D>
__host__ __device__ constexpr int qrows() {
    return D == SLAB_COLS ? CONSUMERS * WGMMA_M : WGMMA_M;
}

// The Q/dO ring: the producer runs up to Q_STAGES query tiles (Q_i, dO_i, LSE_i, D_i) ahead.
constexpr int Q_STAGES = 2;

// dQ_i = dS K_j reads both warpgroups' dS^T rows (below), so a warpgroup's dQ product waits until
// the other has written its rows. It comes a step late: step i issues dQ_{i-1}'s product after
// its own dV and dK, when the other warpgroup wrote dS^T_{i-1} a step ago unless it lags, so that
// the two need not meet at every step (LOG.md, steps 11 and 17: what it bought at each head dim).
//
// dS^T goes through shared memory: step i's into buffer i % DS_BUFFERS. A warpgroup reads step
// i's in step i + 1; the other starts step i + DS_BUFFERS (and writes the buffer again) only once
// the Q/dO slot of step i + DS_BUFFERS - Q_STAGES is free, which this warpgroup hands back at the
// end of that step (its wgmma all done). So Q_STAGES + 1 buffers are enough, with no barrier for
// a buffer's reuse.
constexpr int DS_BUFFERS = Q_STAGES + 1;

// dQ_i's staging tile: one. A second, so that the consumers stage step i + 1's while the dQ
// warp's reduction still reads step i's, does not fit beside the three dS^T buffers at either head
// dim: smem_bytes() plus a 32 KB staging tile is over SMEM_PER_BLOCK_MAX at both.
constexpr int DQ_BUFFERS = 1;

// The producer warpgroup's warps: one issues every load, one every dQ reduction, one the block's
// dK_j and dV_j stores at its end (the others' registers are spoken for across their loops); the
// fourth leaves at once.
constexpr int LOAD_WARP = 0;
constexpr int DQ_WARP = 1;
constexpr int STORE_WARP = 2;

// setmaxnreg: 384 threads start with 168 registers each (65,536 / 384, rounded down to 8); the
// producer gives most of its share to the consumers: 128 x 24 + 256 x 240 = 64,512.
constexpr int PRODUCER_REGS = 24;
constexpr int CONSUMER_REGS = 240;

// dQ_i = dS K_j (queries x D, summed over the block's 128 keys): the two consumer warpgroups split
// it, each reading both warpgroups' dS^T rows (a named barrier between them). At D = 128 (64
// queries: one wgmma M) by columns: warpgroup w computes D / 2 = 64 of them. At D = 64 (128
// queries) by rows: warpgroup w computes queries 64 w .. 64 w + 63, all 64 columns (a 32-column
// half would be narrower than the 128-byte swizzle's 64 halves: no canonical wgmma layout).
template <int D>
__host__ __device__ constexpr bool dq_splits_rows() {
    return qrows<D>() > WGMMA_M;
}
// Either way a warpgroup's dQ part is 64 x 64 (wgmma's M = 64 queries, N = 64 columns, a slab of
// K_j as B): 32 fp32 registers a thread.
constexpr int DQ_REGS = WGMMA_M * SLAB_COLS / WARPGROUP;
// S^T and dP^T: a warpgroup's 64 keys x qrows<D>() queries; packed as 16-bit A operands, half.
template <int D>
__host__ __device__ constexpr int score_regs() {
    return WGMMA_M * qrows<D>() / WARPGROUP;
}
template <int D>
__host__ __device__ constexpr int packed_regs() {
    return score_regs<D>() / 2;
}
constexpr int WARP_ROWS = WGMMA_M / WARPS_PER_WARPGROUP;  // a warp's 16 rows of a wgmma result

// The variants, in the descriptor's order (attention.cu), and how each adds dQ_i's parts into
// dQ_acc (the main kernel's template parameter): DQ_BULK, the consumers stage the part in shared
// memory and the dQ warp hands it to the TMA unit's bulk reduce-add (the lesson); DQ_ATOMIC
// (atomicdq), each consumer thread adds its registers by fp32 reductions (red.global.add), no
// staging, the dQ warp idle: what the TMA unit's reduction buys; DQ_ORDERED (deterministic), as
// DQ_BULK, but the key tiles add into each query tile in turn, 0, 1, 2, ... (dq.cuh, reduce_dq),
// so that dQ is bit-identical from run to run.
enum { VARIANT_DEFAULT = 0, VARIANT_ATOMICDQ, VARIANT_DETERMINISTIC, VARIANTS };
enum dq_way { DQ_BULK, DQ_ATOMIC, DQ_ORDERED };

/* ---- shared memory --------------------------------------------------------------------------- */

// K_smem, V_smem [D/64][KEYS][64]; Q_STAGES x (Q_smem, dO_smem [D/64][qrows][64]), all in the
// 128-byte swizzle TMA writes; DS_BUFFERS x dS_smem [qrows/64][KEYS][64] (dS^T in 64-query slabs,
// swizzled the same way by the consumers' stmatrix); DQ_BUFFERS x dQ_stage [D/8][qrows][8]
// floats (backward_prepost.cuh's staging layout); Q_STAGES x (LSE_smem, Dsum_smem [qrows]
// floats); the mbarriers. Every tile starts 1024-byte aligned (the swizzle atom): the block's
// shared memory is declared so aligned (kernel.cuh), with no slack to round its start up.
template <int D>
__host__ __device__ constexpr int kv_tile_bytes() {
    return KEYS * D * HALF_BYTES;
}
template <int D>
__host__ __device__ constexpr int q_tile_bytes() {
    return qrows<D>() * D * HALF_BYTES;
}
template <int D>
__host__ __device__ constexpr int ds_tile_bytes() {
    return KEYS * qrows<D>() * HALF_BYTES;
}
template <int D>
__host__ __device__ constexpr int dq_tile_bytes() {
    return qrows<D>() * D * (int)sizeof(float);
}
template <int D>
__host__ __device__ constexpr int vec_bytes() {  // LSE_i or D_i of one query tile
    return qrows<D>() * (int)sizeof(float);
}

// mbarriers, and what each protects:
//   KV_FULL   K_j and V_j have landed (TMA, once).
//   Q_FULL    per ring slot: Q_i has landed (TMA) and LSE_i is stored (the load warp's stores).
//   DO_FULL   per slot: dO_i has landed and D_i is stored, the same way.
//   Q_EMPTY   per slot: every consumer thread is done with the slot: its wgmma have read Q_i and
//             dO_i, its loads have read LSE_i and D_i; the load warp may overwrite all four.
//   DS_FULL   per dS^T buffer (dQ comes a step late): every consumer warp has
//             written its rows of a step's dS^T (stmatrix, fenced for the async proxy: the dQ
//             wgmma read them). A barrier that can be waited on a step after its arrivals, as a
//             named barrier cannot (its arrivals count toward whichever meeting comes next).
//   DQ_FULL   per staging buffer: it holds a step's dQ_i parts (the consumers' stores).
//   DQ_EMPTY  per staging buffer: the dQ warp's reduction has read it.
// Each side arrives after its own accesses and waits before the other's, so that every access to
// a buffer is ordered by one barrier's release and acquire (kernel.cuh: who arrives how often).
enum {
    BAR_KV_FULL,
    BAR_Q_FULL,
    BAR_DO_FULL = BAR_Q_FULL + Q_STAGES,
    BAR_Q_EMPTY = BAR_DO_FULL + Q_STAGES,
    BAR_DS_FULL = BAR_Q_EMPTY + Q_STAGES,
    BAR_DQ_FULL = BAR_DS_FULL + DS_BUFFERS,
    BAR_DQ_EMPTY = BAR_DQ_FULL + DQ_BUFFERS,
    BARRIERS = BAR_DQ_EMPTY + DQ_BUFFERS
};

template <int D>
__host__ __device__ constexpr int smem_bytes() {
    return 2 * kv_tile_bytes<D>() + 2 * Q_STAGES * q_tile_bytes<D>() +
           DS_BUFFERS * ds_tile_bytes<D>() + DQ_BUFFERS * dq_tile_bytes<D>() +
           2 * Q_STAGES * vec_bytes<D>() + BARRIERS * MBARRIER_BYTES;
}

static_assert(smem_bytes<64>() <= SMEM_PER_BLOCK_MAX && smem_bytes<128>() <= SMEM_PER_BLOCK_MAX,
              "the block's tiles fit the shared memory a Hopper block may have");

typedef struct {
    uint32_t K, V, Q, dO, dS, dQ, lse, Dsum, bar;  // shared addresses
} smem_tiles;

template <int D>
__device__ __forceinline__ smem_tiles carve_smem(const unsigned char *raw) {
    smem_tiles s;
    s.K = smem_u32(raw);
    s.V = s.K + kv_tile_bytes<D>();
    s.Q = s.V + kv_tile_bytes<D>();
    s.dO = s.Q + Q_STAGES * q_tile_bytes<D>();
    s.dS = s.dO + Q_STAGES * q_tile_bytes<D>();
    s.dQ = s.dS + DS_BUFFERS * ds_tile_bytes<D>();
    s.lse = s.dQ + DQ_BUFFERS * dq_tile_bytes<D>();
    s.Dsum = s.lse + Q_STAGES * vec_bytes<D>();
    s.bar = s.Dsum + Q_STAGES * vec_bytes<D>();
    return s;
}
__device__ __forceinline__ uint32_t bar_at(const smem_tiles &s, int i) {
    return s.bar + MBARRIER_BYTES * i;
}

// The block's rings: its it-th step (counted over all its query tiles and query heads) uses buffer
// it % DEPTH of a ring of DEPTH, in that buffer's phase it / DEPTH, whose parity a wait names.
// The side that fills a buffer waits for its release in the phase before, which a fresh barrier
// counts as complete (waiting for parity 1 returns at once). Three rings: the Q/dO slots
// (Q_STAGES), dS^T's buffers (DS_BUFFERS, at ds_buffer_at) and dQ's staging tiles
// (DQ_BUFFERS, at dq_buffer_at).
template <int DEPTH>
__device__ __forceinline__ int ring_buffer(int it) {
    return it % DEPTH;
}
template <int DEPTH>
__device__ __forceinline__ uint32_t ring_parity(int it) {
    return (uint32_t)(it / DEPTH) & 1;
}
template <int D>
__device__ __forceinline__ uint32_t ds_buffer_at(const smem_tiles &s, int it) {
    return s.dS + ring_buffer<DS_BUFFERS>(it) * ds_tile_bytes<D>();
}
template <int D>
__device__ __forceinline__ uint32_t dq_buffer_at(const smem_tiles &s, int it) {
    return s.dQ + ring_buffer<DQ_BUFFERS>(it) * dq_tile_bytes<D>();
}

// Named barriers (barrier 0 is __syncthreads'), and what each protects:
//   KV_FREE     the two consumer warpgroups, at the block's end: both warpgroups' wgmma are done,
//               so that no product reads K_j or V_j any more and the consumers may stage dK_j and
//               dV_j there (epilogue.cuh).
//   DKV_STAGED  the consumers (arrive) and the store warp (wait): dK_j and dV_j are staged, fenced
//               for the async proxy, and the store warp's TMA stores may read them.
enum named_barrier {
    NAMED_BARRIER_SYNCTHREADS = 0,
    NAMED_BARRIER_KV_FREE,
    NAMED_BARRIER_DKV_STAGED,
};

/* ---- the main kernel's parameters ------------------------------------------------------------ */

// One block: key tile j = block_key_tile() (keys key0 = KEYS j ..) of (batch, key/value head)
// blockIdx.y = batch * H_kv + kv_head; it walks the group's query heads kv_head * group ..
// (kv_head + 1) * group - 1, each over the query tiles that see its keys.
typedef struct {
    int N, N_k, N_pad;      // queries, keys, N rounded up to ROW_PAD (lse2's and Dsum's rows)
    int H, H_kv, group;     // query heads, key/value heads, H / H_kv
    int causal, key_shift;  // key_shift = N_k - N: causal query i sees keys j <= i + key_shift
    int q_tiles;            // ceil(N / qrows<D>())
    int key_tiles;          // ceil(N_k / KEYS): the grid's x
    int diagonal_order;     // DQ_ORDERED under a causal mask: see dq_turn_of()
    float scale, scale_log2;
    const float *lse2;  // [B * H, N_pad]: LSE * log2(e), +inf past N (preprocess_kernel)
    const float *Dsum;  // [B * H, N_pad]: D_i = rowsum(dO_i * O_i), 0 past N
    float *dQ_acc;      // [B * H, N, D] fp32, contiguous (DQ_ATOMIC's adds; DQ_BULK's via tmdQ)
    int *dq_turn;       // [B * H, q_tiles]: key tiles that have added into the tile (DQ_ORDERED)
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

// DQ_ORDERED: how many key tiles add into query tile qt before key tile j does (its turn). The key
// tiles that meet a query tile are always 0 .. j_max (causal: j_max is the key tile of the last
// key its last query sees). In key-tile order (no mask) j's turn is j: every block starts at query
// tile 0. Under a causal mask (diagonal_order) the adds go from j_max down to 0, so the block that
// starts at a query tile, the one on its diagonal, adds first there and never waits at its start,
// and each block waits only for the one above it (key tile j + 1), a step ahead on the same walk.
// In key-tile order instead, key tile j would wait at its first query tile for key tiles
// 0 .. j - 1 to walk up to it: a staircase of idle blocks (LOG.md, step 4's measurement).
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

// A consumer thread's place: its warpgroup (0 or 1: keys 64 wg .. 64 wg + 63 of the block), its
// warp in the warpgroup (16 of those keys), its lane, and the lane's fragment row g and column
// pair t.
typedef struct {
    int wg, warp, lane, g, t;
} consumer_place;

__device__ __forceinline__ consumer_place consumer_place_of_thread() {
    consumer_place p;
    p.wg = __shfl_sync(FULL_WARP, (int)threadIdx.x / WARPGROUP, 0) - PRODUCER_WARPGROUPS;
    p.warp = (int)(threadIdx.x / WARP_SIZE) % WARPS_PER_WARPGROUP;
    p.lane = (int)threadIdx.x % WARP_SIZE;
    p.g = p.lane / QUAD;
    p.t = p.lane % QUAD;
    return p;
}
