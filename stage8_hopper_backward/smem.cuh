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
// dq_parts); Q_STAGES x (LSE_smem, Dsum_smem [qrows] floats); the mbarriers. Every tile starts
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
// Each side arrives after its own accesses and waits before the other's, so that every access to
// a buffer is ordered by one barrier's release and acquire (kernel.cuh: who arrives how often).
enum {
    BAR_Q_FULL,
    BAR_DO_FULL = BAR_Q_FULL + Q_STAGES,
    BAR_Q_EMPTY = BAR_DO_FULL + Q_STAGES,
    BAR_DS_FULL = BAR_Q_EMPTY + Q_STAGES,
    BAR_DQ_FULL = BAR_DS_FULL + DS_BUFFERS,  // pair p: DQ_FULL at BAR_DQ_FULL + 2 p, DQ_EMPTY after
    BAR_DQ_EMPTY,
    BARRIERS = BAR_DQ_FULL + 2 * DQ_PAIRS
};

template <int D>
__host__ __device__ constexpr int smem_bytes() {
    return 2 * kv_tile_bytes<D>() + 2 * Q_STAGES * q_tile_bytes<D>() +
           (ds_buffers<D>() + pt_buffers<D>()) * ds_tile_bytes<D>() +
           dq_buffers<D>() * dq_tile_bytes<D>() + 2 * Q_STAGES * vec_bytes<D>() +
           BARRIERS * MBARRIER_BYTES;
}

static_assert(smem_bytes<64>() <= SMEM_PER_BLOCK_MAX && smem_bytes<96>() <= SMEM_PER_BLOCK_MAX &&
                  smem_bytes<128>() <= SMEM_PER_BLOCK_MAX &&
                  smem_bytes<256>() <= SMEM_PER_BLOCK_MAX,
              "the block's tiles fit the shared memory a Hopper block may have");

typedef struct {
    uint32_t K, V, Q, dO, dS, P, dQ, lse, Dsum, bar;  // shared addresses (P: D = 256's P^T)
} smem_tiles;

template <int D>
__device__ __forceinline__ smem_tiles carve_smem(const unsigned char *raw) {
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

// Named barriers (barrier 0 is __syncthreads'), and what each protects:
//   KV_FREE     the two consumer warpgroups, at the block's end: both warpgroups' wgmma are done,
//               so that no product reads K_j or V_j any more and the consumers may stage dK_j and
//               dV_j there (epilogue.cuh); for a packed batch's key tile past its sequence's keys
//               once more after: both have staged theirs, which they then store (dkv_masked).
//   DKV_STAGED  the consumers (arrive) and the store warp (wait): dK_j and dV_j are staged, fenced
//               for the async proxy, and the store warp's TMA stores may read them.
enum named_barrier {
    NAMED_BARRIER_SYNCTHREADS = 0,
    NAMED_BARRIER_KV_FREE,
    NAMED_BARRIER_DKV_STAGED,
};
