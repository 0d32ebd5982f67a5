/*
 * stage6_hopper/smem.cuh: the block's shared memory: the layout of the Q buffers, the K/V ring, the
 * O staging tiles and the mbarriers (carve_smem), and the rings' waits (wait_full, wait_empty).
 * A ring's bookkeeping (pipeline_state) and the 128-byte swizzled slabs that TMA writes and wgmma
 * reads, with their descriptors (slab_offset, desc_k_major, desc_mn_major, ...), are
 * common/device/sm90.cuh's.
 */
#pragma once

#include "config.cuh"

/* ---- the kernel's shared memory -------------------------------------------------------------- */

// Q_smem q_buffers() x [slabs<D>()][BR rows][64], then the K and V rings, each STAGES x
// [slabs][BC][64], then (where it fits, o_staged()) one O staging tile [slabs][64][64] per consumer
// warpgroup, then the mbarriers and the work tile indices. Every tile starts 1024-byte aligned
// (the swizzle atom). A tile is whole 64-column slabs: at D = 96 two, the second half of the
// second slab zeros (TMA reads past the tensor's D as zeros) that no wgmma reads. One swizzle for
// every head dim: the descriptors, the stmatrix addresses and the tensor maps stay the same; a
// 64-byte swizzle (192-byte rows as three 32-column slabs) would save a quarter of the tiles'
// bytes, which shared memory does not need at D = 96 (two Q buffers and the O staging fit).
template <int D>
__host__ __device__ constexpr int slabs() {
    return (D + SLAB_COLS - 1) / SLAB_COLS;
}
template <int D, int C>
__host__ __device__ constexpr int q_bytes() {
    return block_rows<C>() * slabs<D>() * SLAB_ROW_BYTES;
}
template <int D, int BC>
__host__ __device__ constexpr int kv_bytes() {
    return BC * slabs<D>() * SLAB_ROW_BYTES;
}
enum {
    BAR_Q_FULL,
    BAR_Q_EMPTY = BAR_Q_FULL + Q_BUFFERS_MAX,
    BAR_K_FULL = BAR_Q_EMPTY + Q_BUFFERS_MAX,
    BAR_K_EMPTY = BAR_K_FULL + STAGES,
    BAR_V_FULL = BAR_K_EMPTY + STAGES,
    BAR_V_EMPTY = BAR_V_FULL + STAGES,
    BARRIERS = BAR_V_EMPTY + STAGES
};
template <int D>
__host__ __device__ constexpr int o_stage_bytes() {  // one consumer warpgroup's 64 rows of O
    return WGMMA_M * slabs<D>() * SLAB_ROW_BYTES;
}
template <int D, int C, int BC, int QB, bool STAGED>
__host__ __device__ constexpr int smem_bytes_with() {
    return SWIZZLE_ATOM_BYTES /* alignment slack */ + QB * q_bytes<D, C>() +
           2 * STAGES * kv_bytes<D, BC>() + (STAGED ? C * o_stage_bytes<D>() : 0) +
           BARRIERS * MBARRIER_BYTES +
           Q_BUFFERS_MAX * (int)sizeof(int) /* the work tile indices the producer hands over */;
}
// Two Q buffers come first. O is staged in shared memory and stored by TMA (store_o_staged) with
// two consumers where there is room: not at D = 128 with BC = 176 (K, V and Q take 208 KB), nor
// at D = 256 (one Q buffer, 64 KB, and the K/V ring's 160 KB: 224 KB). With
// three consumers (D = 64) the direct stores measured faster (LOG.md, step 13).
// These are compile-time choices, made against SMEM_PER_BLOCK_MAX, not against the device's
// limit: --smem-limit can only make a configuration unsupported, never pick another.
template <int D, int C, int BC>
__host__ __device__ constexpr int q_buffers() {
    return smem_bytes_with<D, C, BC, Q_BUFFERS_MAX, false>() <= SMEM_PER_BLOCK_MAX ? Q_BUFFERS_MAX
                                                                                   : 1;
}
template <int D, int C, int BC>
__host__ __device__ constexpr bool o_staged() {
    return C < 3 && smem_bytes_with<D, C, BC, q_buffers<D, C, BC>(), true>() <= SMEM_PER_BLOCK_MAX;
}
template <int D, int C, int BC>
__host__ __device__ constexpr int smem_bytes() {
    return smem_bytes_with<D, C, BC, q_buffers<D, C, BC>(), o_staged<D, C, BC>()>();
}

typedef struct {
    uint32_t Q, K, V, O, bar;  // shared addresses: Q_smem, K ring, V ring, O staging, barriers
    int *work;  // [Q_BUFFERS_MAX] the work tile whose Q is in Q buffer i (the producer's)
} smem_tiles;

template <int D, int C, int BC>
__device__ __forceinline__ smem_tiles carve_smem(unsigned char *raw) {
    smem_tiles s;
    constexpr uint32_t ALIGN = SWIZZLE_ATOM_BYTES;
    const uint32_t pad = ((smem_u32(raw) + ALIGN - 1) & ~(ALIGN - 1)) - smem_u32(raw);
    s.Q = smem_u32(raw) + pad;
    s.K = s.Q + q_buffers<D, C, BC>() * q_bytes<D, C>();
    s.V = s.K + STAGES * kv_bytes<D, BC>();
    s.O = s.V + STAGES * kv_bytes<D, BC>();
    s.bar = s.O + (o_staged<D, C, BC>() ? C * o_stage_bytes<D>() : 0);
    s.work = (int *)(raw + pad + (s.bar - s.Q) + BARRIERS * MBARRIER_BYTES);
    return s;
}
__device__ __forceinline__ uint32_t bar_at(const smem_tiles &s, int i) {
    return s.bar + MBARRIER_BYTES * i;
}

// The K/V ring's pipeline_state: its count is the number of key tiles the block has gone
// through, over all its work tiles. The Q buffers' count is the number of work tiles (t below).
typedef pipeline_state<STAGES> kv_pipeline;

// Wait until this use's buffer is full (the consumers), or empty again (the producer); `full` and
// `empty` name the first barrier of the kind (BAR_K_FULL, ...), one per slot.
template <int SLOTS>
__device__ __forceinline__ void wait_full(const smem_tiles &sm, int full,
                                          pipeline_state<SLOTS> ps) {
    mbar_wait(bar_at(sm, full + ps.slot()), ps.phase());
}
template <int SLOTS>
__device__ __forceinline__ void wait_empty(const smem_tiles &sm, int empty,
                                           pipeline_state<SLOTS> ps) {
    mbar_wait(bar_at(sm, empty + ps.slot()), ps.empty_phase());
}

// K and V ring slot st, and the Q buffer of the block's t-th work tile.
template <int D, int BC>
__device__ __forceinline__ uint32_t k_stage(const smem_tiles &s, int st) {
    return s.K + st * kv_bytes<D, BC>();
}
template <int D, int BC>
__device__ __forceinline__ uint32_t v_stage(const smem_tiles &s, int st) {
    return s.V + st * kv_bytes<D, BC>();
}
template <int D, int C, int BC>
__device__ __forceinline__ uint32_t q_stage(const smem_tiles &s, int t) {
    return s.Q + pipeline_state<q_buffers<D, C, BC>()>{t}.slot() * q_bytes<D, C>();
}

// The shared memory of kernel configuration c (one of KERNEL_CONFIGS; 0 for any other).
template <int I = 0>
static size_t config_smem_bytes(kernel_config c) {
    if constexpr (I < KERNEL_CONFIG_COUNT) {
        constexpr kernel_config k = KERNEL_CONFIGS[I];
        if (same_config(c, k)) return smem_bytes<k.D, k.consumers, k.key_tile>();
        return config_smem_bytes<I + 1>(c);
    } else {
        (void)c;
        return 0;
    }
}
