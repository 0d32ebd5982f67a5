/*
 * stage7_backward/config.cuh: the configuration: the tiles of the three kernels
 * (backward_kernel, backward_registers_kernel, dq_kernel), in the order the launcher tries them,
 * their shared memory and whether dQ goes through the TMA unit (the parameters every kernel reads,
 * bwd_params, and dQ's staging layout are common/device/backward_prepost.cuh's).
 *
 * Part of attention.cu's one translation unit, as every .cuh file of this folder.
 */
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <limits.h>
#include <stddef.h>
#include <string.h>

#include "device/backward_prepost.cuh"  // bwd_params, ROW_PAD, DQ_SLAB_COLS: shared with stage 8
#include "device/sm80.cuh"              // MMA_M, MMA_K, ...
#include "device/split_kv.cuh"          // key_rule: the keys a query row sees (causal, windows)

/* ---- tunables -------------------------------------------------------------------------------- */

// A tile configuration. WARPS warps of 16 rows each: a block owns 16 WARPS keys
// (backward_registers_kernel) or queries (dq_kernel), and dq_kernel's key tiles have as many rows.
// QROWS: the query tile of backward_registers_kernel's loop (its S^T and dP^T are 16 x QROWS per
// warp, beside dK and dV: at D = 128 those hold 128 registers, and 64-query tiles spill). STAGES =
// 2 double-buffers the loop's tiles (the next arrives during this one's math); 1 loads each tile
// when it is needed.
typedef struct {
    int WARPS, STAGES, QROWS;
} tile_config;

// In the order tried: the first whose shared memory fits the block's limit is used (and two
// stages only where cp.async is). backward_registers_kernel at D = 128: 128 keys a block where they
// fit (an H100's or A100's shared memory; every key tile adds its part to all of dQ, so twice the
// keys is half the atomic traffic, and each Q_i, dO_i tile loaded serves twice the keys), then 64
// keys, then one buffer (a T4's 64 KB): 104.5 KB, 68.5 KB, 52 KB. At D = 64, 64 keys (128 measured
// no faster there): 57 KB, then 40.5 KB.
constexpr tile_config REGISTERS_TILES_D128[] = {{8, 2, 32}, {4, 2, 32}, {4, 1, 32}};
constexpr tile_config REGISTERS_TILES_D64[] = {{4, 2, 64}, {4, 1, 64}};
// dq_kernel (deterministic variant): 64 query rows a block, key tiles double-buffered or not.
constexpr tile_config DQ_TILES_D128[] = {{4, 2, 0}, {4, 1, 0}};
constexpr tile_config DQ_TILES_D64[] = {{4, 2, 0}, {4, 1, 0}};
// D = 96 and 256 run MODEL kernels only (launch.cuh, model_shape), one configuration each, what
// the MODEL kernels of 64 and 128 run: D = 96 as D = 128's last (40.25 KB, 48 KB: a T4's too).
// D = 256: no backward_registers_kernel (a warp's 16 keys of dK and dV would take 256 registers a
// thread); dq_kernel with 2 warps, 32 query rows (dQ_i's 128 registers beside S and dP), 64 KB.
constexpr int REGISTERS_MAX_D = 128;  // above: backward_kernel only (sm_80 on)
constexpr tile_config REGISTERS_TILES_D96[] = {{4, 1, 32}};
constexpr tile_config DQ_TILES_D96[] = {{4, 1, 0}};
constexpr tile_config DQ_TILES_D256[] = {{2, 1, 0}};

template <int D, bool REGISTERS>
__host__ __device__ constexpr const tile_config *tiles_for() {
    if (REGISTERS)
        return D == 64 ? REGISTERS_TILES_D64
                       : (D == 96 ? REGISTERS_TILES_D96 : (D == 128 ? REGISTERS_TILES_D128 : NULL));
    return D == 64 ? DQ_TILES_D64
                   : (D == 96 ? DQ_TILES_D96 : (D == 128 ? DQ_TILES_D128 : DQ_TILES_D256));
}
template <int D, bool REGISTERS>
__host__ __device__ constexpr int tile_count() {
    constexpr size_t bytes =
        REGISTERS
            ? (D == 64 ? sizeof(REGISTERS_TILES_D64)
                       : (D == 96 ? sizeof(REGISTERS_TILES_D96)
                                  : (D == 128 ? sizeof(REGISTERS_TILES_D128) : 0)))
            : (D == 64 ? sizeof(DQ_TILES_D64)
                       : (D == 96 ? sizeof(DQ_TILES_D96)
                                  : (D == 128 ? sizeof(DQ_TILES_D128) : sizeof(DQ_TILES_D256))));
    return (int)(bytes / sizeof(tile_config));
}

// The main kernels' loop tile carries two row vectors besides Q_i and dO_i: LSE_i and D_i.
constexpr int LOOP_VECTORS = 2;

// Shared memory of the two kernels, in bytes. ROWS = 16 WARPS: the block's rows.
__host__ __device__ constexpr int tile_rows(tile_config c) {
    return MMA_M * c.WARPS;
}
// backward_registers_kernel: K_j, V_j [ROWS, D]; STAGES x (Q_i, dO_i [QROWS, D]); dS^T [ROWS,
// QROWS]; STAGES x (LSE_i, D_i [QROWS] floats)
__host__ __device__ constexpr size_t registers_smem_bytes(tile_config c, int D) {
    return (2 * (size_t)tile_rows(c) + 2 * (size_t)c.STAGES * c.QROWS) * D * sizeof(__half) +
           (size_t)tile_rows(c) * c.QROWS * sizeof(__half) +
           LOOP_VECTORS * (size_t)c.STAGES * c.QROWS * sizeof(float);
}
// dq_kernel: Q_i, dO_i; STAGES x (K_j, V_j), all [ROWS, D]
__host__ __device__ constexpr size_t dq_smem_bytes(tile_config c, int D) {
    return (2 + 2 * (size_t)c.STAGES) * tile_rows(c) * D * sizeof(__half);
}

/* ---- backward_kernel: P^T and dS^T through shared memory (FlashAttention-2's) ---------------- */

// A tile configuration of backward_kernel: 8 warps, KEYS keys a block, QROWS queries a loop
// tile, STAGES buffers of Q_i, dO_i. P^T and dS^T go through shared memory, so that each of the
// five products splits its output over the 8 warps in the shape that reads least shared memory
// for it (32 x 32 or 32 x 64 fragments a warp; see the phases below), instead of all five
// following the 16 keys a warp owns in backward_registers_kernel. The scores phase goes over the
// warp's queries in SCORE_PASSES blocks (fewer registers for S^T and dP^T); KV_REGS: the warp's
// fragments of K_j and V_j (the A operands of S^T and dP^T, the same for every query tile) are
// loaded into registers once, so that the scores phase reads only Q_i and dO_i.
typedef struct {
    int KEYS, QROWS, STAGES, SCORE_PASSES;
    bool KV_REGS;
} smem_p_config;

// D = 128: 128 keys x 64 queries (161 KB: an H100, H200 or A100); D = 64: 128 x 128 (162 KB), K_j
// and V_j in 64 registers (at D = 128 they would take 128, beside dK and dV's 128). Where it does
// not fit (an L4's 99 KB, a T4's 64 KB) the launcher falls back to backward_registers_kernel.
// D = 96: as D = 128 (129 KB; 153 KB with sm_90's dQ staging tile). D = 256: 64 keys (a warp's 16
// keys x 128 columns of dK and dV: 128 registers, as D = 128's 32 x 64) x 32 queries, 136.5 KB
// (168.5 KB with the staging tile): an A100's or H100's; it has no fallback (registers_kernel_for).
constexpr smem_p_config SMEM_P_TILES_D128 = {128, 64, 2, 1, false};
constexpr smem_p_config SMEM_P_TILES_D64 = {128, 128, 2, 4, true};
constexpr smem_p_config SMEM_P_TILES_D96 = {128, 64, 2, 1, false};
constexpr smem_p_config SMEM_P_TILES_D256 = {64, 32, 2, 1, false};
constexpr int SMEM_P_WARPS = 8;
constexpr int SMEM_P_KEY_WARPS = 4;  // S^T, dP^T, dK, dV: the warps split the keys 4 ways...
constexpr int SMEM_P_COL_WARPS = SMEM_P_WARPS / SMEM_P_KEY_WARPS;  // ... and their columns 2 ways
constexpr int DQ_WARP_ROWS = 32;  // dQ: each warp 32 query rows x its share of the head dim

// dQ's query rows a warp (accumulate_dq_tile): DQ_WARP_ROWS, or 16 where a warp's share of the
// head dim would be an odd number of n8 blocks (D = 96: 3), which ldmatrix_x4 reads in pairs.
template <int D, int QROWS>
__host__ __device__ constexpr int dq_warp_rows() {
    return D / (SMEM_P_WARPS / (QROWS / DQ_WARP_ROWS)) / MMA_N % X4_BLOCKS ? MMA_M : DQ_WARP_ROWS;
}

template <int D>
__host__ __device__ constexpr smem_p_config smem_p_tiles() {
    return D == 64
               ? SMEM_P_TILES_D64
               : (D == 96 ? SMEM_P_TILES_D96 : (D == 128 ? SMEM_P_TILES_D128 : SMEM_P_TILES_D256));
}

// From sm_90 on, the dQ tile reaches dQ_acc through the TMA unit (DQ_BY_BULK): each warp stores its
// fp32 fragments into a staging tile in shared memory, and one thread hands the whole tile to a
// bulk tensor reduction, cp.reduce.async.bulk.tensor .add, which adds it to global memory without
// the warps' atomics (their queue was what the dQ phase waited on: LOG.md, steps 5 and 6).
// Elsewhere the warps add it by red.global.add themselves (accumulate_dq_tile).
constexpr int DQ_BULK_ARCH = 90;
// From this arch on, code has no MODEL dq_kernel at D = 64 (dq_kernel.cuh: it would spill).
constexpr int DQ_MODEL_D64_ABSENT_ARCH = 120;
__host__ __device__ constexpr bool dq_bulk(int arch) {
    return arch >= DQ_BULK_ARCH;
}
// How dQ is added up: DQ_BY_SECOND_PASS (deterministic: dq_kernel), DQ_BY_ATOMICS (the warps'
// red.global.add), DQ_BY_BULK (backward_kernel on sm_90 on: the TMA unit's bulk reductions;
// variant atomics switches them off).
enum dq_way { DQ_BY_SECOND_PASS, DQ_BY_ATOMICS, DQ_BY_BULK };

// Whether a kernel that adds dQ (ADDS_DQ) and may add it by bulk reductions (BULK_OK) does so in
// this target's code: from sm_90 on (host code: never).
template <bool ADDS_DQ, bool BULK_OK>
__host__ __device__ constexpr bool dq_by_bulk_here() {
#ifdef __CUDA_ARCH__
    return ADDS_DQ && BULK_OK && dq_bulk(__CUDA_ARCH__ / 10);
#else
    return false;
#endif
}

// K_j, V_j [KEYS, D]; STAGES x (Q_i, dO_i [QROWS, D]); P^T, dS^T [KEYS, QROWS]; STAGES x (LSE_i,
// D_i [QROWS] floats); with DQ_BY_BULK (bulk), the dQ staging tile, QROWS x D floats.
__host__ __device__ constexpr size_t smem_p_bytes(smem_p_config c, int D, bool bulk) {
    return (2 * (size_t)c.KEYS + 2 * (size_t)c.STAGES * c.QROWS) * D * sizeof(__half) +
           2 * (size_t)c.KEYS * c.QROWS * sizeof(__half) +
           LOOP_VECTORS * (size_t)c.STAGES * c.QROWS * sizeof(float) +
           (bulk ? (size_t)c.QROWS * D * sizeof(float) : 0);
}

/* ---- local windows and softcap: the MODEL kernels ------------------------------------------- */

// A shape with a local window or a softcap (attention.h) runs MODEL instantiations of the three
// kernels, one per head dim and storage type: the plain ones (MODEL = false) carry neither. What
// they read beyond bwd_params, the shape's runtime values:
//   keys:     the keys each query row sees (key_rule_of: causal, the window), for the loops' tile
//             ranges and the masks of the tiles that cross a bound
//   cap_in, cap_log2: softcap c: a raw score q . k becomes c tanh(q . k scale / c), so
//             t = tanh(q . k cap_in) with cap_in = scale / c and the score in log2 units is
//             t cap_log2, cap_log2 = c log2(e); cap_in = 0: no softcap
//   dq:       how dQ is added up (dq_way): one MODEL backward_kernel serves every way, and the
//             MODEL backward_registers_kernel adds dQ or not at run time
// and beyond bwd_model, the shape's head dim p.D, a multiple of 8 up to the kernel's D: a head dim
// that is not 64 or 128 runs the MODEL kernels of the next compiled size (launch.cuh), whose loads
// of Q, K, V, dO zero-fill the 16-byte chunks at columns >= p.D and whose stores of dK, dV, dQ
// and adds to dQ_acc ([B, H, N, p.D] floats) skip them.
typedef struct bwd_model {
    key_rule keys;
    float cap_in, cap_log2;
    int dq;
    float *dkv_part;  // split walks (every kernel: the grid's z): the shares' fp32 dK_j, dV_j
    int key_tiles;    // the plain grid's key tiles a (batch, key/value head): gridDim.x
    int tail_first, tail_shares;  // a tail split (launch.cuh's main_plan): INT_MAX and 1 if none
} bwd_model;

// The MODEL values of a complete shape (the plain kernels take them too and read none).
static inline bwd_model bwd_model_of(const attn_shape *s, dq_way dq) {
    bwd_model m;
    memset(&m, 0, sizeof m);
    m.keys = key_rule_of(s, true);
    if (s->softcap > 0.f) m.cap_in = s->scale / s->softcap, m.cap_log2 = s->softcap * LOG2E;
    m.dq = dq;
    m.tail_first = INT_MAX, m.tail_shares = 1;
    return m;
}

// Where a block works: its key tile, its (batch, key/value head) and its share of the walk (share
// of shares; shares 1: the whole walk). A plain grid (tail_first INT_MAX): blockIdx.x, .y and .z,
// every walk in gridDim.z shares (1: none). A tail split's grid (1-D, launch.cuh's main_plan): the
// plain grid's work tiles in its order (key tile first) before tail_first, then tail_shares blocks
// for each work tile from tail_first on, a share each. The MODEL kernels take no tail split (their
// registers are full: the launcher plans none for them).
typedef struct {
    int key_tile, bh, share, shares;
} block_place;
template <bool MODEL>
__device__ __forceinline__ block_place place_of_block(const bwd_model &m) {
    if (MODEL || m.tail_first == INT_MAX)
        return {(int)blockIdx.x, (int)blockIdx.y, (int)blockIdx.z, (int)gridDim.z};
    const int block = (int)blockIdx.x, past = block - m.tail_first;
    if (past < 0) return {block % m.key_tiles, block / m.key_tiles, 0, 1};
    const int tile = m.tail_first + past / m.tail_shares;
    return {tile % m.key_tiles, tile / m.key_tiles, past % m.tail_shares, m.tail_shares};
}

// A packed batch (attention.h's attn_varlen) runs the MODEL kernels too: a block reads its
// sequence through bwd_sequence_of (common/device/backward_prepost.cuh), and the rule of the keys
// its rows see is the shape's with the sequence's queries and keys (causal and the window aligned
// to its own bottom right; the window's bounds and the softcap are the shape's).
// (MODEL; the plain kernels read none of it.)
template <bool MODEL>
__device__ __forceinline__ bwd_model sequence_model(bwd_model m, const bwd_sequence &s) {
    if constexpr (MODEL) m.keys.N = s.seq.N, m.keys.N_k = s.seq.N_k;
    (void)s;
    return m;
}
