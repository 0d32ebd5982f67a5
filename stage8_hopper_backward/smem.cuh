/*
 * stage8_hopper_backward/smem.cuh: the block's shared memory: the layout of K_j, V_j, the Q/dO
 * ring, the dS^T buffers, the dQ staging tile, LSE_i and D_i and the mbarriers (smem_bytes,
 * carve_smem), what each mbarrier and named barrier protects, and the rings' buffers
 * (ds_buffer_at, dq_buffer_at). A ring's bookkeeping (pipeline_state) and the 128-byte swizzled
 * slabs that TMA writes and wgmma reads, with their descriptors, are common/device/sm90.cuh's.
 */
#pragma once

#include "config.cuh"

/* ---- the kernel's shared memory -------------------------------------------------------------- */

// K_smem, V_smem [slabs][keys][64]; Q_STAGES x (Q_smem, dO_smem [slabs][qrows][64]), all in the
// 128-byte swizzle TMA writes; ds_buffers x dS_smem [qrows/64][keys][64] (dS^T in 64-query slabs,
// swizzled the same way by the consumers' stmatrix); at D = 256 pt_buffers x P_smem, P^T the same
// way; dq_buffers x dQ_stage [slabs][qrows][8] floats (config.cuh: staging_slab_bytes,
// dq_parts); Q_STAGES x (LSE_smem, Dsum_smem [qrows] floats); the mbarriers; the work slots
// (WORK_SLOTS ints). Every tile starts
// 1024-byte aligned (the swizzle atom): the block's shared memory is declared so aligned
// (kernel.cuh), with no slack to round its start up.
template <int D>
__host__ __device__ constexpr int kv_tile_bytes() {
    return block_keys<D>() * slabs<D>() * SLAB_ROW_BYTES;
}
template <int D>
__host__ __device__ constexpr int q_tile_bytes() {
    return qrows<D>() * slabs<D>() * SLAB_ROW_BYTES;
}
template <int D>
__host__ __device__ constexpr int ds_tile_bytes() {  // dS^T's, and at D = 256 P^T's
    return block_keys<D>() * qrows<D>() * HALF_BYTES;
}
template <int D>
__host__ __device__ constexpr int dq_part_bytes() {  // a part of the staging tile (dq_parts)
    return qrows<D>() * dq_cols<D>() * (int)sizeof(float);
}
template <int D>
__host__ __device__ constexpr int dq_tile_bytes() {
    return dq_parts<D>() * dq_part_bytes<D>();
}
template <int D>
__host__ __device__ constexpr int vec_bytes() {  // LSE_i or D_i of one query tile
    return qrows<D>() * (int)sizeof(float);
}

// mbarriers, and what each protects:
//   Q_FULL    per ring slot: Q_i has landed (TMA) and LSE_i is stored (the load warp's stores);
//             at the block's first step also K_j (TMA, once).
//   DO_FULL   per slot: dO_i has landed and D_i is stored, the same way; at the first step also
//             V_j.
//   Q_EMPTY   per slot: every consumer thread is done with the slot: its wgmma have read Q_i and
//             dO_i, its loads have read LSE_i and D_i; the load warp may overwrite all four.
//   DS_FULL   per dS^T buffer (dQ comes a step late): every consumer warp has
//             written its rows of a step's dS^T (stmatrix, fenced for the async proxy: the dQ
//             wgmma read them). A barrier that can be waited on a step after its arrivals, as a
//             named barrier cannot (its arrivals count toward whichever meeting comes next).
//             At D = 256, per buffer pair (ds_buffers<256>() of the DS_FULL barriers): every
//             consumer warp has written its part of the step's P^T and dS^T, which the other
//             warpgroup's dV and dK wgmma and both warpgroups' dQ wgmma read; waited in the
//             same step.
//   DQ_FULL   DQ_PAIRS of them (dq_pair): by parts (dq_by_parts), per warpgroup: its part of
//             the staging tile holds the step's dQ_i part (its warps' stores); as one tile, one,
//             or one per dQ warp: the tile holds both parts (every consumer warp's stores).
//   DQ_EMPTY  the same pairs: the dQ warp's reduction has read the part (the tile).
//   WORK_FULL   a persistent block's, per work slot: the load warp has written the index of the
//             block's next work tile there (or "stop"); one arrival.
//   WORK_EMPTY  per work slot: every other role has read it (one arrival a reading warp:
//             WORK_READERS).
//   KV_EMPTY  a persistent block's: both consumer warpgroups' products of the work tile are done
//             (they met on KV_FREE): K_j's and V_j's tiles are free for the next work tile's.
//   KV_FULL   a persistent block's: K_j and V_j of its work tile after the first have landed (the
//             K/V warp's copies).
//   DKV_READ  a persistent block's: the store warp's copies have read the work tile's dK_j and dV_j
//             out of their staging tiles (dS^T's buffers: dk_stage), which the next work tile
//             writes again.
// Each side arrives after its own accesses and waits before the other's, so that every access to
// a buffer is ordered by one barrier's release and acquire (kernel.cuh: who arrives how often).
enum {
    BAR_Q_FULL,
    BAR_DO_FULL = BAR_Q_FULL + Q_STAGES,
    BAR_Q_EMPTY = BAR_DO_FULL + Q_STAGES,
    BAR_DS_FULL = BAR_Q_EMPTY + Q_STAGES,
    BAR_DQ_FULL = BAR_DS_FULL + DS_BUFFERS,  // pair p: DQ_FULL at BAR_DQ_FULL + 2 p, DQ_EMPTY after
    BAR_DQ_EMPTY,
    BAR_WORK_FULL = BAR_DQ_FULL + 2 * DQ_PAIRS,
    BAR_WORK_EMPTY = BAR_WORK_FULL + WORK_SLOTS,
    BAR_KV_EMPTY = BAR_WORK_EMPTY + WORK_SLOTS,
    BAR_KV_FULL,
    BAR_DKV_READ,
    BARRIERS
};

template <int D>
__host__ __device__ constexpr int smem_bytes() {
    return 2 * kv_tile_bytes<D>() + 2 * Q_STAGES * q_tile_bytes<D>() +
           (ds_buffers<D>() + pt_buffers<D>()) * ds_tile_bytes<D>() +
           dq_buffers<D>() * dq_tile_bytes<D>() + 2 * Q_STAGES * vec_bytes<D>() +
           BARRIERS * MBARRIER_BYTES + WORK_SLOTS * (int)sizeof(int) /* the work slots */;
}

static_assert(smem_bytes<64>() <= SMEM_PER_BLOCK_MAX && smem_bytes<96>() <= SMEM_PER_BLOCK_MAX &&
                  smem_bytes<128>() <= SMEM_PER_BLOCK_MAX &&
                  smem_bytes<256>() <= SMEM_PER_BLOCK_MAX,
              "the block's tiles fit the shared memory a Hopper block may have");

// A persistent block stages dK_j and dV_j (2 kv_tile_bytes) in the dS^T buffers and, where they are
// too few (D = 128), the dQ staging tile's first part, which lies after them (epilogue.cuh's
// dk_stage): the staging tile's part 0 is then free only once the dQ warp has read it.
template <int D>
__host__ __device__ constexpr bool dkv_stage_over_dq() {
    return 2 * kv_tile_bytes<D>() > (ds_buffers<D>() + pt_buffers<D>()) * ds_tile_bytes<D>();
}
static_assert(
    2 * kv_tile_bytes<64>() <=
            (ds_buffers<64>() + pt_buffers<64>()) * ds_tile_bytes<64>() + dq_part_bytes<64>() &&
        2 * kv_tile_bytes<128>() <=
            (ds_buffers<128>() + pt_buffers<128>()) * ds_tile_bytes<128>() + dq_part_bytes<128>(),
    "a persistent block's dK_j and dV_j fit the dS^T buffers and the staging tile's part 0");

typedef struct {
    uint32_t K, V, Q, dO, dS, P, dQ, lse, Dsum, bar;  // shared addresses (P: D = 256's P^T)
    int *work;  // [WORK_SLOTS] a persistent block's next work tiles (the load warp's)
} smem_tiles;

template <int D>
__device__ __forceinline__ smem_tiles carve_smem(unsigned char *raw) {
    smem_tiles s;
    s.K = smem_u32(raw);
    s.V = s.K + kv_tile_bytes<D>();
    s.Q = s.V + kv_tile_bytes<D>();
    s.dO = s.Q + Q_STAGES * q_tile_bytes<D>();
    s.dS = s.dO + Q_STAGES * q_tile_bytes<D>();
    s.P = s.dS + ds_buffers<D>() * ds_tile_bytes<D>();
    s.dQ = s.P + pt_buffers<D>() * ds_tile_bytes<D>();
    s.lse = s.dQ + dq_buffers<D>() * dq_tile_bytes<D>();
    s.Dsum = s.lse + Q_STAGES * vec_bytes<D>();
    s.bar = s.Dsum + Q_STAGES * vec_bytes<D>();
    s.work = (int *)(raw + (s.bar - s.K) + BARRIERS * MBARRIER_BYTES);
    return s;
}
__device__ __forceinline__ uint32_t bar_at(const smem_tiles &s, int i) {
    return s.bar + MBARRIER_BYTES * i;
}

// The block's rings, each a pipeline_state (common/device/sm90.cuh) whose count is the block's
// step, it (counted over all its query tiles and query heads): the Q/dO slots (Q_STAGES), dS^T's
// buffers (ds_buffers<D>(), at ds_buffer_at; at D = 256 P^T's beside them, at pt_buffer_at) and
// dQ's staging tile (DQ_BUFFERS, at dq_buffer_at; its parts at dq_part_at).
typedef pipeline_state<Q_STAGES> q_pipeline;
template <int D>
using ds_pipeline = pipeline_state<ds_buffers<D>()>;
typedef pipeline_state<DQ_BUFFERS> dq_pipeline;
template <int D>
__device__ __forceinline__ uint32_t ds_buffer_at(const smem_tiles &s, int it) {
    return s.dS + ds_pipeline<D>{it}.slot() * ds_tile_bytes<D>();
}
template <int D>
__device__ __forceinline__ uint32_t pt_buffer_at(const smem_tiles &s, int it) {
    return s.P + ds_pipeline<D>{it}.slot() * ds_tile_bytes<D>();
}
template <int D>
__device__ __forceinline__ uint32_t dq_buffer_at(const smem_tiles &s, int it) {
    return s.dQ + dq_pipeline{it}.slot() * dq_tile_bytes<D>();
}
template <int D>
__device__ __forceinline__ uint32_t dq_part_at(const smem_tiles &s, int it, int part) {
    return dq_buffer_at<D>(s, it) + part * dq_part_bytes<D>();
}
// The DQ_FULL/DQ_EMPTY pair of step it's hand-over of warpgroup wg's part (config.cuh,
// dq_by_parts): by parts the warpgroup's; as one tile with two dQ warps the step's warp's, it % 2;
// else the one. The phase of step it's hand-over on it: a pair used every step flips each step,
// one of two dQ warps' every other step. Step -1 (before the first) reads as a phase already
// complete.
template <int D, dq_way DQ>
__device__ __forceinline__ int dq_pair(int it, int wg) {
    if constexpr (dq_by_parts<D, DQ>()) return wg;
    if constexpr (two_dq_warps<D, DQ>()) return it & 1;
    return 0;
}
template <int D, dq_way DQ>
__device__ __forceinline__ uint32_t dq_phase(int it) {
    if constexpr (two_dq_warps<D, DQ>()) return pipeline_state<2>{it}.phase();
    return dq_pipeline{it}.phase();
}
__device__ __forceinline__ uint32_t dq_full_bar(const smem_tiles &s, int pair) {
    return bar_at(s, BAR_DQ_FULL + 2 * pair);
}
__device__ __forceinline__ uint32_t dq_empty_bar(const smem_tiles &s, int pair) {
    return bar_at(s, BAR_DQ_EMPTY + 2 * pair);
}

// A persistent block's work slots, a ring whose count is the block's n-th work tile: the load
// warp publishes each (publish_work: the work tile's index, or "stop"), one thread of every other
// role's warps takes it (take_work) and hands the slot back (common/device/sm90.cuh's
// write_work_slot, read_work_slot).
typedef pipeline_state<WORK_SLOTS> work_pipeline;
__device__ __forceinline__ void publish_work(const smem_tiles &s, int n, int w) {
    const work_pipeline q = {n};
    mbar_wait(bar_at(s, BAR_WORK_EMPTY + q.slot()), q.empty_phase());  // every reader has read
    write_work_slot(&s.work[q.slot()], w);
    mbar_arrive(bar_at(s, BAR_WORK_FULL + q.slot()));
}
__device__ __forceinline__ int take_work(const smem_tiles &s, int n) {
    const work_pipeline q = {n};
    mbar_wait(bar_at(s, BAR_WORK_FULL + q.slot()), q.phase());
    const int w = read_work_slot(&s.work[q.slot()]);
    mbar_arrive(bar_at(s, BAR_WORK_EMPTY + q.slot()));
    return w;
}
__device__ __forceinline__ int take_work_by_warp(const smem_tiles &s, int n, int lane) {
    int w = 0;
    if (lane == 0) w = take_work(s, n);
    return __shfl_sync(FULL_WARP, w, 0);
}

// Named barriers (barrier 0 is __syncthreads'), and what each protects:
//   KV_FREE     the two consumer warpgroups, at the block's end: both warpgroups' wgmma are done,
//               so that no product reads K_j or V_j any more and the consumers may stage dK_j and
//               dV_j there (epilogue.cuh); for a packed batch's key tile past its sequence's keys
//               once more after: both have staged theirs, which they then store (dkv_masked).
//   DKV_STAGED  the consumers (arrive) and the store warp (wait): dK_j and dV_j are staged, fenced
//               for the async proxy, and the store warp's TMA stores may read them.
//   TILE_START  a persistent block's two consumer warpgroups, at the start of a work tile after its
//               first: every consumer thread's staging of the work tile before (dK_j, dV_j in the
//               dS^T buffers and at D = 128 the dQ staging tile) comes before any thread's writes
//               of this one there (each also waits for the store warp's read, DKV_READ: that
//               orders them through the store warp; this, among the consumers themselves).
enum named_barrier {
    NAMED_BARRIER_SYNCTHREADS = 0,
    NAMED_BARRIER_KV_FREE,
    NAMED_BARRIER_DKV_STAGED,
    NAMED_BARRIER_TILE_START,
};
