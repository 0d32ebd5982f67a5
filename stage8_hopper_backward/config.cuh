/*
 * stage8_hopper_backward/config.cuh: the configuration: the tiles (keys per block, queries per
 * step, the depth of the Q/dO ring), the warpgroups and their registers, how the two consumer
 * warpgroups split dQ_i = dS K_j at each head dim, and the variants with their ways of adding dQ
 * (dq_way). The block's shared memory and barriers are smem.cuh's; who works on what (the
 * parameters the main kernel reads, bwd_problem, and a block's walk) schedule.cuh's.
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
constexpr int CONSUMERS = 2;  // (PRODUCER_WARPGROUPS, common/device/sm90.cuh: warpgroup 0)
constexpr int BLOCK_THREADS = (CONSUMERS + PRODUCER_WARPGROUPS) * WARPGROUP;  // 384
constexpr int KEYS = CONSUMERS * WGMMA_M;                                     // 128
constexpr int CONSUMER_WARPS = CONSUMERS * WARPS_PER_WARPGROUP;
template <int D>
__host__ __device__ constexpr int qrows() {
    return D == SLAB_COLS ? CONSUMERS * WGMMA_M : WGMMA_M;
}

// The head dims compiled: 64, 96 and 128. Every other of the contract's up to 128 runs in the next
// one up with the tail of D masked: the tensor maps' inner extent is the tensors' D, so TMA reads
// zeros past it (the products add nothing there) and clips the stores and dQ's reduce-adds to it;
// the passes before and after read and write its columns only (their TAIL). Past 128 no kernel:
// D = 256 needs a kernel of its own: smaller tiles (FlashAttention-3 runs 64 queries x 80 keys on
// Hopper) and dK and dV split across the warpgroups (128 + 128 registers a thread as this kernel
// holds them).
constexpr int COMPILED_DS[] = {64, 96, 128};
static inline int compiled_d(int D) {  // 0: none runs it
    if (D < ATTN_MIN_D || D % ATTN_D_STEP != 0) return 0;
    for (int d : COMPILED_DS)
        if (D <= d) return d;
    return 0;
}
// A tile of D columns in shared memory: slabs<D>() 64-column slabs, 128-byte swizzled (D = 96's
// second slab half used: TMA fills its columns past D with zeros).
template <int D>
__host__ __device__ constexpr int slabs() {
    return (D + SLAB_COLS - 1) / SLAB_COLS;
}
// Variant atomics at D = 64 and 128 only: its adds address dQ_acc by the compiled head dim.
template <int D>
__host__ __device__ constexpr bool takes_atomics() {
    return D % SLAB_COLS == 0;
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
// half would be narrower than the 128-byte swizzle's 64 halves: no canonical wgmma layout). At
// D = 96 by slabs of K_j: warpgroup 0 columns 0 .. 63, warpgroup 1 the second slab's 32.
template <int D>
__host__ __device__ constexpr bool dq_splits_rows() {
    return qrows<D>() > WGMMA_M;
}
// A warpgroup's dQ part is 64 x 64 (wgmma's M = 64 queries, N = 64 columns, a slab of K_j as B):
// 32 fp32 registers a thread. D = 96's warpgroup 1 computes 64 columns too, those past 96 zero
// (K_j's second slab, past D as TMA fills it), and stages its 32: one wgmma shape for both
// warpgroups (N = 32 for the one warpgroup made ptxas serialize the block's wgmma).
constexpr int DQ_REGS = WGMMA_M * SLAB_COLS / WARPGROUP;
template <int D>
__host__ __device__ constexpr int dq_part_cols(int wg) {
    return dq_splits_rows<D>() || D % SLAB_COLS == 0 || D - wg * SLAB_COLS > SLAB_COLS
               ? SLAB_COLS
               : D - wg * SLAB_COLS;
}
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
// dQ_acc (the main kernel's template parameter; stage 7's dq_way names its ways the same):
// DQ_BY_BULK, the consumers stage the part in shared memory and the dQ warp hands it to the TMA
// unit's bulk reduce-add (the lesson); DQ_BY_ATOMICS (variant atomics), each consumer thread adds
// its registers by fp32 reductions (red.global.add), no staging, the dQ warp idle: what the TMA
// unit's reduction buys; DQ_BY_BULK_IN_TURNS (deterministic), as DQ_BY_BULK, but the key tiles
// add into each query tile in turn, 0, 1, 2, ... (dq.cuh, reduce_dq), so that dQ is
// bit-identical from run to run.
enum { VARIANT_DEFAULT = 0, VARIANT_ATOMICS, VARIANT_DETERMINISTIC, VARIANTS };
enum dq_way { DQ_BY_BULK, DQ_BY_ATOMICS, DQ_BY_BULK_IN_TURNS };
