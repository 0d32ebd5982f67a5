/*
 * stage8_hopper_backward/config.cuh: the configuration: the tiles (keys per block, queries per
 * step, the depth of the Q/dO ring), the warpgroups and their registers, how the two consumer
 * warpgroups split the block's work (at D = 256 the scores' queries and dK's, dV's columns) and
 * dQ_i = dS K_j at each head dim, and the variants with their ways of adding dQ
 * (dq_way). The block's shared memory and barriers are smem.cuh's; who works on what (the
 * parameters the main kernel reads, bwd_problem, and a block's walk) schedule.cuh's.
 *
 * Part of attention.cu's one translation unit, as every .cuh file of this folder.
 */
#pragma once

#include "attention.h"
#include "device/backward_prepost.cuh"  // bwd_params, tensor_strides, ROW_PAD, DQ_*_SLAB_COLS
#include "device/sm90.cuh"              // WGMMA_M, WARPGROUP, slabs and descriptors, ...

// The main kernel exists only in sm_90a code (HOPPER_KERNELS); other targets compile an empty
// kernel, which the launcher never starts (stage_unsupported), and leave the Hopper-only
// constants below unused.
#if defined(__CUDA_ARCH__) && !HOPPER_KERNELS
#pragma nv_diag_suppress 177  // "declared but never referenced"
#endif

/* ---- tiles and warpgroups -------------------------------------------------------------------- */

// A block owns block_keys<D>() keys of one (batch, key/value head), with their dK_j and dV_j in the
// CONSUMERS warpgroups' registers for the whole block. Per step it takes qrows<D>() queries of one
// query head: FlashAttention-3's tiles, 128 keys x 64 queries at D = 128 and 128 x 128 at D = 64,
// where the products of a step are half as deep and the step's barriers and softmax work would
// otherwise weigh twice as much against them. Up to D = 128 each warpgroup owns 64 of the keys
// (wgmma's M) and all D columns of their dK_j and dV_j; the step's queries are wgmma's N for S^T
// and dP^T, and the K of dV and dK. At D = 256 (splits_dkv) those would be 128 + 128 fp32
// registers a thread, past setmaxnreg's 240: the block owns 64 keys, both warpgroups' M, and the
// warpgroups split the rest: warpgroup w computes the scores of the step's queries 32 w .. 32 w +
// 31 (score_cols) and owns columns 128 w .. 128 w + 127 of dK_j, dV_j and dQ_i (dkv_cols), so
// that each needs the other's P^T and dS^T (through shared memory, mainloop.cuh).
constexpr int CONSUMERS = 2;       // (PRODUCER_WARPGROUPS, common/device/sm90.cuh: warpgroup 0)
constexpr int ANY_WARPGROUP = -1;  // code both consumer warpgroups run (mainloop.cuh)
constexpr int BLOCK_THREADS = (CONSUMERS + PRODUCER_WARPGROUPS) * WARPGROUP;  // 384
constexpr int CONSUMER_WARPS = CONSUMERS * WARPS_PER_WARPGROUP;
constexpr int SPLIT_D_MIN = 2 * SLAB_COLS + 1;  // past 128: the columns split (D = 256)
template <int D>
__host__ __device__ constexpr bool splits_dkv() {
    return D >= SPLIT_D_MIN;
}
template <int D>
__host__ __device__ constexpr int block_keys() {
    return splits_dkv<D>() ? WGMMA_M : CONSUMERS * WGMMA_M;  // 64 or 128
}
template <int D>
__host__ __device__ constexpr int qrows() {
    return D == SLAB_COLS ? CONSUMERS * WGMMA_M : WGMMA_M;
}
// A warpgroup's share: the queries of its S^T and dP^T (wgmma's N) and the first of them in the
// step; the first of its keys in the block (wgmma's M rows); the columns of its dK_j and dV_j
// (and at D = 256 of dQ_i) and the first of them.
template <int D>
__host__ __device__ constexpr int score_cols() {
    return splits_dkv<D>() ? qrows<D>() / CONSUMERS : qrows<D>();
}
template <int D>
__host__ __device__ __forceinline__ constexpr int wg_query0(int wg) {
    return splits_dkv<D>() ? score_cols<D>() * wg : 0;
}
template <int D>
__host__ __device__ __forceinline__ constexpr int wg_key0(int wg) {
    return splits_dkv<D>() ? 0 : WGMMA_M * wg;
}
template <int D>
__host__ __device__ constexpr int dkv_cols() {
    return splits_dkv<D>() ? D / CONSUMERS : D;
}
template <int D>
__host__ __device__ __forceinline__ constexpr int wg_col0(int wg) {
    return splits_dkv<D>() ? dkv_cols<D>() * wg : 0;
}
template <int D>
__host__ __device__ constexpr int dkv_regs() {  // a 64 x dkv_cols fp32 accumulator, a thread's
    return WGMMA_M * dkv_cols<D>() / WARPGROUP;
}

// The head dims compiled: 64, 96, 128 and 256. Every other of the contract's runs in the next one
// up with the tail of D masked: the tensor maps' inner extent is the tensors' D, so TMA reads
// zeros past it (the products add nothing there) and clips the stores and dQ's reduce-adds to it;
// the passes before and after read and write its columns only (their TAIL). D = 136 to 248 run in
// D = 256's kernels, whose dQ adds from the registers address dQ_acc by the tensors' D and skip
// the columns past it (dq_acc_cols, dq.cuh), as D = 64's adds of a block's last part do.
constexpr int COMPILED_DS[] = {64, 96, 128, 256};
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
// Variant atomics' kernels: at D = 64 and 128, whose adds address dQ_acc by the compiled head dim
// (they run that D only), and at D = 256, the default variant's kernel there, whose adds take the
// tensors' D (they run D = 136 to 256). No D = 96 kernel of its own.
template <int D>
__host__ __device__ constexpr bool takes_atomics() {
    return D % SLAB_COLS == 0;
}
static inline bool atomics_run(int D) {  // the tensors' head dim D in variant atomics
    const int d = compiled_d(D);
    return d >= SPLIT_D_MIN || (d == D && d % SLAB_COLS == 0);
}

// The Q/dO ring: the producer runs up to Q_STAGES query tiles (Q_i, dO_i, LSE_i, D_i) ahead.
constexpr int Q_STAGES = 2;

// dQ_i = dS K_j reads both warpgroups' dS^T rows (below), so a warpgroup's dQ product waits until
// the other has written its rows. Up to D = 128 it comes a step late: step i issues dQ_{i-1}'s
// product after its own dV and dK, when the other warpgroup wrote dS^T_{i-1} a step ago unless it
// lags, so that the two need not meet at every step (LOG.md, steps 11 and 17: what it bought at
// each head dim). At D = 256 the warpgroups meet in every step anyway (each one's dV and dK need
// the other's P^T and dS^T), and dQ_i's product comes in its own step.
//
// dS^T goes through shared memory: step i's into buffer i % ds_buffers<D>() (at D = 256 P^T too,
// into a buffer of its own beside it). Up to D = 128 a warpgroup reads step i's in step i + 1; the
// other starts step i + DS_BUFFERS (and writes the buffer again) only once the Q/dO slot of step
// i + DS_BUFFERS - Q_STAGES is free, which this warpgroup hands back at the end of that step (its
// wgmma all done). So Q_STAGES + 1 buffers are enough, with no barrier for a buffer's reuse. At
// D = 256 every read of step i's buffers is in step i, before the reader hands the slot back:
// Q_STAGES buffers, by the same argument.
constexpr int DS_BUFFERS = Q_STAGES + 1;
template <int D>
__host__ __device__ constexpr int ds_buffers() {
    return splits_dkv<D>() ? Q_STAGES : DS_BUFFERS;
}
template <int D>
__host__ __device__ constexpr int pt_buffers() {  // P^T's, beside dS^T's (D = 256)
    return splits_dkv<D>() ? ds_buffers<D>() : 0;
}

// dQ_i's staging tile: one. A second, so that the consumers stage step i + 1's while the dQ
// warp's reduction still reads step i's, does not fit beside the three dS^T buffers at either head
// dim: smem_bytes() plus a 32 KB staging tile is over SMEM_PER_BLOCK_MAX at both. None at D = 256,
// whose dQ parts are added from the registers (DQ_BY_ATOMICS, below): a 64 x 256 fp32 tile does
// not fit beside its tiles.
constexpr int DQ_BUFFERS = 1;
template <int D>
__host__ __device__ constexpr int dq_buffers() {
    return splits_dkv<D>() ? 0 : DQ_BUFFERS;
}

// The producer warpgroup's warps: one issues every load, one every dQ reduction, one the block's
// dK_j and dV_j stores at its end (the others' registers are spoken for across their loops); the
// fourth leaves at once, except where the deterministic variant has two dQ warps (dq_warps):
// then DQ_WARP takes the even steps and DQ_WARP_ODD the odd ones.
constexpr int LOAD_WARP = 0;
constexpr int DQ_WARP = 1;
constexpr int STORE_WARP = 2;
constexpr int DQ_WARP_ODD = 3;
constexpr int KV_WARP = 3;  // a persistent grid's (below): its kernels have one dQ warp

// setmaxnreg: 384 threads start with 168 registers each (65,536 / 384, rounded down to 8); the
// producer gives most of its share to the consumers: 128 x 24 + 256 x 240 = 64,512.
constexpr int PRODUCER_REGS = 24;
constexpr int CONSUMER_REGS = 240;

// dQ_i = dS K_j (queries x D, summed over the block's keys): the two consumer warpgroups split
// it, each reading both warpgroups' dS^T rows. At D = 128 (64 queries: one wgmma M) by columns:
// warpgroup w computes D / 2 = 64 of them. At D = 64 (128 queries) by rows: warpgroup w computes
// queries 64 w .. 64 w + 63, all 64 columns (a 32-column half would be narrower than the 128-byte
// swizzle's 64 halves: no canonical wgmma layout). At D = 96 by slabs of K_j: warpgroup 0 columns
// 0 .. 63, warpgroup 1 the second slab's 32. At D = 256 by columns, as dK and dV: warpgroup w
// columns 128 w .. 128 w + 127, over the block's 64 keys.
template <int D>
__host__ __device__ constexpr bool dq_splits_rows() {
    return qrows<D>() > WGMMA_M;
}
// A warpgroup's dQ part is 64 x 64 (wgmma's M = 64 queries, N = 64 columns, a slab of K_j as B):
// 32 fp32 registers a thread; at D = 256 64 x 128, 64 registers. D = 96's warpgroup 1 computes its
// 32 columns (N = 32) into the first 16 of them (N = 32's accumulator is N = 64's first four n8
// blocks), in code of its own (mainloop.cuh's consumer_walk): a branch between the two shapes in
// one code made ptxas serialize the block's wgmma (LOG.md, steps 21 and 65).
template <int D>
__host__ __device__ constexpr int dq_cols() {  // the columns of a warpgroup's dQ wgmma
    return splits_dkv<D>() ? dkv_cols<D>() : SLAB_COLS;
}
template <int D>
__host__ __device__ constexpr int dq_regs() {
    return WGMMA_M * dq_cols<D>() / WARPGROUP;
}
template <int D>
__host__ __device__ constexpr int dq_part_cols(int wg) {
    return dq_splits_rows<D>() || D % SLAB_COLS == 0 || D - wg * SLAB_COLS > SLAB_COLS
               ? dq_cols<D>()
               : D - wg * SLAB_COLS;
}
// The staging tile: the query tile's rows in slabs of 8 floats, 32-byte rows ([slabs][qrows][8]),
// as dQ_acc's tiles lie (dq_tiled), so that a part goes to L2 by one bulk copy of whole lines
// (LOG.md, steps 56-59; steps 47-50's 128-byte swizzled slab rows at D = 96 and 128 measured
// slower at D = 128). Where the warpgroups split dQ_i by columns (D = 96, 128) each warpgroup's
// part is whole slabs (D = 96's second part, 32 columns, padded to 64: the tile is 32 KB); where
// they split it by rows (D = 64) the parts share every slab. dq_parts<D>(): the parts the tile has
// as slabs.
template <int D>
__host__ __device__ constexpr int staging_slab_bytes() {
    return qrows<D>() * DQ_SLAB_ROW_BYTES;
}
template <int D>
__host__ __device__ constexpr int dq_parts() {
    return dq_splits_rows<D>() ? 1 : CONSUMERS;
}
// S^T and dP^T: a warpgroup's 64 keys x score_cols<D>() queries; packed as 16-bit A operands, half.
template <int D>
__host__ __device__ constexpr int score_regs() {
    return WGMMA_M * score_cols<D>() / WARPGROUP;
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
// bit-identical from run to run. At D = 256 the default variant adds as atomics does (no staging
// tile fits) and deterministic is refused (attention.cu). Variant nolean is the default without
// its lean and capped kernels (kernel.cuh's EXTRAS and CAPPED: every shape runs the kernel that has
// softcap's and a window's left bound's code). Variant nosplit is the default without split walks
// (below); variant nopdl the default with each pass launched only once the one before has ended
// (launch.cuh: without programmatic dependent launch); variant nopersistent the default with one
// block per work tile (below: has_persistent).
enum {
    VARIANT_DEFAULT = 0,
    VARIANT_ATOMICS,
    VARIANT_DETERMINISTIC,
    VARIANT_NOLEAN,
    VARIANT_NOSPLIT,
    VARIANT_NOPDL,
    VARIANT_NOPERSISTENT,
    VARIANTS
};
enum dq_way { DQ_BY_BULK, DQ_BY_ATOMICS, DQ_BY_BULK_IN_TURNS };

// A persistent grid (LOG.md, step 84): one block per multiprocessor, each working one work tile
// (a key tile of a (batch, key/value head): schedule.cuh) after another as a global counter hands
// them out, so that the next work tile's Q_i, dO_i, LSE_i and D_i land under this one's end and no
// block's start-up is paid again; dK_j and dV_j are staged in the dS^T buffers (epilogue.cuh's
// dk_stage), so that the next K_j and V_j load while the stores read them. Where there are more
// work tiles than multiprocessors and each walk is short (persistent_steps_max), in the default
// way's lean kernels at D = 64 and 128 (has_persistent; launch.cuh's persistent_grid), every work
// tile with a step (no left bound: every key tile is seen), not for a packed batch or a split
// walk; variant nopersistent launches one block per work tile. The load warp takes the work tiles
// and publishes each in a ring of WORK_SLOTS (smem.cuh), read by one thread of each of WORK_READERS
// warps; the K/V warp (the producer warpgroup's fourth, idle there) copies each one's K_j and V_j.
constexpr int WORK_SLOTS = 2;
constexpr int WORK_READERS = CONSUMER_WARPS + 3;  // the consumer warps, dQ, store and K/V warps
template <int D, dq_way DQ, bool EXTRAS>
__host__ __device__ constexpr bool has_persistent() {
    return DQ == DQ_BY_BULK && !EXTRAS && (D == 64 || D == 128);
}
// The longest walk (a work tile's steps, queries over qrows) a persistent grid takes: 1,024
// queries at D = 64, 2,048 at D = 128. Past it a block's start and end are a small part of the
// block's time, and the persistent kernel's steps cost a little more than the plain kernel's
// (LOG.md, step 84: at D = 64 from 2,048 queries on).
constexpr int PERSISTENT_QUERIES_D64 = 1024, PERSISTENT_QUERIES_D128 = 2048;
template <int D>
__host__ __device__ constexpr int persistent_steps_max() {
    return (D == SLAB_COLS ? PERSISTENT_QUERIES_D64 : PERSISTENT_QUERIES_D128) / qrows<D>();
}
// Whether the K/V warp brings the next work tile's K_j and V_j into the L2 while it waits for the
// consumers to free their tiles (producer.cuh's load_kv), so that the copy after the wait reads
// the L2: at D = 64; at D = 128 it measured no gain (LOG.md, step 86).
template <int D>
__host__ __device__ constexpr bool prefetches_next_kv() {
    return D == SLAB_COLS;
}

// Whether the main kernel of head dim D (with or without EXTRAS: kernel.cuh) is launched with
// programmatic dependent launch and waits for the preprocess itself (producer.cuh's load_tiles):
// every kernel but D = 96's lean ones, which launch after the preprocess has ended (LOG.md, step
// 82: with the wait in them ptxas serializes their wgmma).
template <int D, bool EXTRAS>
__host__ __device__ constexpr bool waits_by_pdl() {
    return D != 96 || EXTRAS;
}
// Whether a kernel of its own runs a tail split (launch.cuh's walk_split_at, schedule.cuh's
// own_work_tile; kernel.cuh's TAIL): the default way's lean kernels at D = 64 and 128, the fa2
// shapes' (LOG.md, step 87). Its own, so that every other kernel keeps the plain grid's machine
// code: with the split's arithmetic in them the plain grids' causal shapes ran slower (D = 64),
// and in D = 96's lean kernels ptxas serialized the wgmma (C7511).
template <int D, dq_way DQ, bool EXTRAS>
__host__ __device__ constexpr bool has_tail_split() {
    return DQ == DQ_BY_BULK && !EXTRAS && (D == 64 || D == 128);
}

// How the staging tile is handed over (smem.cuh: DQ_FULL, DQ_EMPTY; LOG.md, step 39). By parts
// (DQ_BY_BULK where each part is whole slabs): each warpgroup's part on a DQ_FULL/DQ_EMPTY pair of
// its own, reduced as soon as that warpgroup has staged it, so that neither warpgroup's next part
// waits for the other's. As one tile (D = 64; DQ_BY_BULK_IN_TURNS, whose key tile's turn at the
// query tile is the whole tile's): on one pair, or one per dQ warp.
template <int D, dq_way DQ>
__host__ __device__ constexpr bool dq_by_parts() {
    return DQ == DQ_BY_BULK && dq_parts<D>() == CONSUMERS;
}
// The block's last dQ part (up to D = 128 the parts come a step late: the last one after the
// loop, last_dq) added from the consumers' registers (add_dq_atomic) instead of staged, where one
// dQ warp reduces the whole tile (D = 64): staged, it waits for the reduction to have read the
// tile before it, a step's work earlier elsewhere but only the last part's product earlier here,
// with nothing left to hide the wait. At D = 96 and 128 (parts by warpgroup, each on its own
// barriers) the adds cost more than the wait (LOG.md, step 51). Not in the deterministic variant,
// whose adds into a query tile keep their key tiles' order.
template <int D, dq_way DQ>
__host__ __device__ constexpr bool last_dq_by_reds() {
    return DQ == DQ_BY_BULK && !splits_dkv<D>() && !dq_by_parts<D, DQ>();
}
// dQ_acc tiled as the staging tile of 8-float slabs lies (backward_prepost.cuh's dq_tiled:
// [tiles][slabs][qrows][DQ_SLAB_COLS] floats a head), so that the dQ warp adds a step's tile (by
// parts, a warpgroup's slabs) by one bulk copy, whole 128-byte lines, where a tensor map's box of
// 32-byte slab rows makes four requests a line (LOG.md, steps 56 and 59). The default and
// deterministic variants' (the dQ warp finds the tile's row from its counters' place: LOG.md,
// step 58), and D = 256's, whose adds from the registers then cover whole lines too (add_dq_atomic;
// LOG.md, step 64); variant atomics up to D = 128 adds into rows of D floats.
template <int D, dq_way DQ>
__host__ __device__ constexpr bool dq_tiled() {
    return splits_dkv<D>() || DQ != DQ_BY_ATOMICS;
}
constexpr int DQ_PAIRS = 2;  // DQ_FULL/DQ_EMPTY pairs: a warpgroup's part's, or a dQ warp's
static_assert(DQ_PAIRS == CONSUMERS && DQ_BUFFERS == 1, "a pair per part of the one staging tile");

// DQ_BY_BULK_IN_TURNS: the dQ warps. Two, each taking every other step with a DQ_FULL/DQ_EMPTY
// pair of its own (the staging tile is still one), so that one warp's wait for its adds to
// complete and its pass of the turn run while the other hands the next step's tile to the TMA
// unit (LOG.md, step 37). At D = 64 one: its steps are twice as long, and the one warp keeps up.
template <int D>
__host__ __device__ constexpr int dq_warps() {
    return D == 64 ? 1 : 2;
}
template <int D, dq_way DQ>
__host__ __device__ constexpr bool two_dq_warps() {
    return DQ == DQ_BY_BULK_IN_TURNS && dq_warps<D>() == 2;
}
// The DQ_FULL/DQ_EMPTY pairs a kernel uses (dq_pair): one per part (dq_by_parts), one per dQ
// warp (two_dq_warps), else one.
template <int D, dq_way DQ>
__host__ __device__ constexpr int dq_pairs_used() {
    return dq_by_parts<D, DQ>() || two_dq_warps<D, DQ>() ? DQ_PAIRS : 1;
}

// DQ_BY_BULK_IN_TURNS: whether the kernel can walk a block's query tiles from the tile of its key
// tile's index on (bwd_problem.rotated_walk, schedule.cuh's walk_first; LOG.md, step 38).
template <dq_way DQ>
__host__ __device__ constexpr bool rotates_walk() {
    return DQ == DQ_BY_BULK_IN_TURNS;
}
// Where the blocks walk rotated (LOG.md, step 38): a grid of at most ROTATED_WALK_MAX_WAVES
// blocks a multiprocessor, or heads of at most rotated_walk_max_key_tiles<D>() key tiles. Past
// both, many waves of heads of many blocks, the rotated walk measured slower than the plain one.
constexpr int ROTATED_WALK_MAX_WAVES = 2;

// The grid's heads by sections under a causal mask (launch.cuh's section_shift_of; LOG.md, step
// 63): as many heads a section, a power of two, as keep their Q, dO, dQ_acc, LSE_i and D_i within
// L2_SECTION_BYTES, so that the 50 MB L2 of an H100 or H200 holds a section's beside K_j, V_j and
// the stores.
constexpr size_t L2_SECTION_BYTES = (size_t)32 << 20;
template <int D>
__host__ __device__ constexpr int rotated_walk_max_key_tiles() {
    return D == 64 ? 64 : 32;
}
