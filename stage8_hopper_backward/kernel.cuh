/*
 * stage8_hopper_backward/kernel.cuh: the main kernel: one block per (key tile, batch, key/value
 * head); its barriers set up, then warpgroup 0 the producer (a load warp, a dQ warp, a store warp;
 * deterministic at D = 96, 128 a second dQ warp) with few registers and warpgroups 1 and 2 the
 * consumers with many. A packed batch's block past its sequence's keys leaves before any of it.
 */
#pragma once

#include "dq.cuh"
#include "mainloop.cuh"
#include "producer.cuh"

// What each barrier counts (smem.cuh says what it protects): Q_FULL and DO_FULL every lane of
// the load warp (once its cp.async of LSE_i or D_i has landed; lane 0 also announces the tile's
// bytes, a work tile's first step's with K_j's or V_j's); Q_EMPTY every consumer thread (after its
// loads of LSE_i and D_i and its wgmma reads of the tiles); DS_FULL one arrival per consumer warp;
// DQ_FULL one per warp of its warpgroup (by parts) or per consumer warp (as one tile); DQ_EMPTY
// its dQ warp's; WORK_FULL the load warp's lane 0, WORK_EMPTY one thread of each reading warp,
// KV_EMPTY one consumer thread, KV_FULL the K/V warp's lane 0 (with K_j's and V_j's bytes),
// DKV_READ the store warp's lane 0.
// Thread 0 initialises them.
template <int D, dq_way DQ>
__device__ __forceinline__ void init_barriers(const smem_tiles &sm) {
    for (int st = 0; st < Q_STAGES; ++st) {
        mbar_init(bar_at(sm, BAR_Q_FULL + st), WARP_SIZE);
        mbar_init(bar_at(sm, BAR_DO_FULL + st), WARP_SIZE);
        mbar_init(bar_at(sm, BAR_Q_EMPTY + st), CONSUMERS * WARPGROUP);
    }
    for (int b = 0; b < ds_buffers<D>(); ++b)
        mbar_init(bar_at(sm, BAR_DS_FULL + b), CONSUMER_WARPS);
    for (int pair = 0; pair < dq_pairs_used<D, DQ>(); ++pair) {
        mbar_init(dq_full_bar(sm, pair),
                  dq_by_parts<D, DQ>() ? WARPS_PER_WARPGROUP : CONSUMER_WARPS);
        mbar_init(dq_empty_bar(sm, pair), 1);
    }
    for (int slot = 0; slot < WORK_SLOTS; ++slot) {
        mbar_init(bar_at(sm, BAR_WORK_FULL + slot), 1);
        mbar_init(bar_at(sm, BAR_WORK_EMPTY + slot), WORK_READERS);
    }
    mbar_init(bar_at(sm, BAR_KV_EMPTY), 1);
    mbar_init(bar_at(sm, BAR_KV_FULL), 1);
    mbar_init(bar_at(sm, BAR_DKV_READ), 1);
    fence_barrier_init();  // visible to the copy engine (the async proxy)
}

// Q, dO: [B, H, N, D] and K, V, dK, dV: [B, H_kv, N_k, D], 16-bit (bf16 where BF16), each through
// its tensor map (D, rows, heads, B) with its strides, in 128-byte swizzled boxes of 64 columns
// (qrows<D>() rows for Q and dO, block_keys<D>() for the others); dQ_acc (fp32) and the rest in
// pb. Grid: (ceil(N_k / block_keys<D>()), B * H_kv) (schedule.cuh: by sections under a causal
// mask), or PERSISTENT (a block per multiprocessor), BLOCK_THREADS threads. A packed batch: Q, dO
// [total_q, H, D] and K, V, dK, dV [total_k, H_kv, D], each map one batch of total rows; dQ_acc [H,
// acc_rows, D]; N, N_k the longest sequence's. EXTRAS: what some models add, a window's left bound
// (sliding windows) and softcap, in the code of every step; a lean kernel (EXTRAS off: the default
// variant's, for the shapes without either, launch.cuh's kernel_for) masks the tail and causal
// only. CAPPED: the softcap branch alone (the default variant's kernel for the shapes with a
// softcap). PERSISTENT: a grid of one block per multiprocessor, each taking work tiles as they are
// handed out (config.cuh, has_persistent; the grid 1-D). TAIL: a tail split's grid, 1-D, the
// whole walks' blocks then the split ones' shares (config.cuh, has_tail_split; schedule.cuh's
// own_work_tile).
template <int D, bool BF16, dq_way DQ, bool EXTRAS = true, bool CAPPED = false,
          bool PERSISTENT = false, bool TAIL = false>
__global__ void __launch_bounds__(BLOCK_THREADS, 1)
    backward_kernel(const __grid_constant__ CUtensorMap tmQ,
                    const __grid_constant__ CUtensorMap tmK,
                    const __grid_constant__ CUtensorMap tmV,
                    const __grid_constant__ CUtensorMap tmdO,
                    const __grid_constant__ CUtensorMap tmdK,
                    const __grid_constant__ CUtensorMap tmdV, const bwd_problem pb) {
    static_assert(EXTRAS || !CAPPED, "a capped kernel keeps the window's left bound");
    static_assert(!PERSISTENT || has_persistent<D, DQ, EXTRAS>(),
                  "a kernel with a persistent grid");
    static_assert(!TAIL || (has_tail_split<D, DQ, EXTRAS>() && !PERSISTENT),
                  "a kernel with a tail split");
#if HOPPER_KERNELS
    // a key tile past its sequence's keys: every thread leaves here, before any barrier exists
    // (a persistent grid: no packed batch)
    if (!PERSISTENT && !block_has_keys<D>(pb, own_work_tile<TAIL>(pb))) return;
    extern __shared__ __align__(SWIZZLE_ATOM_BYTES) unsigned char smem_raw[];
    if (smem_u32(smem_raw) % SWIZZLE_ATOM_BYTES != 0) __trap();  // the tiles' swizzle needs it
    const smem_tiles sm = carve_smem<D>(smem_raw);
    if (threadIdx.x == 0) {
        init_barriers<D, DQ>(sm);
        prefetch_tensor_map(&tmQ), prefetch_tensor_map(&tmK), prefetch_tensor_map(&tmV);
        prefetch_tensor_map(&tmdO);
        prefetch_tensor_map(&tmdK), prefetch_tensor_map(&tmdV);
    }
    __syncthreads();  // the barriers are initialised before anyone waits on or signals them
    if (threadIdx.x < PRODUCER_WARPGROUPS * WARPGROUP) {
        registers_decrease<PRODUCER_REGS>();
        const int warp = (int)threadIdx.x / WARP_SIZE, lane = (int)threadIdx.x % WARP_SIZE;
        if (PERSISTENT && warp == LOAD_WARP)
            load_tiles_persistent<D, DQ, waits_by_pdl<D, EXTRAS>()>(sm, &tmQ, &tmdO, pb, lane);
        else if (warp == LOAD_WARP)
            load_tiles<D, DQ, waits_by_pdl<D, EXTRAS>(), TAIL>(sm, &tmQ, &tmK, &tmV, &tmdO, pb,
                                                               lane);
        else if (DQ != DQ_BY_ATOMICS && warp == DQ_WARP)
            reduce_dq<D, DQ, PERSISTENT, TAIL>(sm, pb, lane,
                                               0);  // (DQ_BY_ATOMICS: the consumers add dQ)
        else if (two_dq_warps<D, DQ>() && warp == DQ_WARP_ODD)
            reduce_dq<D, DQ, PERSISTENT, TAIL>(sm, pb, lane, 1);  // the odd steps
        else if (warp == STORE_WARP)
            store_dkv<D, PERSISTENT, TAIL>(sm, &tmdK, &tmdV, pb, lane);
        else if (PERSISTENT && warp == KV_WARP && lane == 0)
            load_kv<D>(sm, &tmK, &tmV, pb);
    } else {
        registers_increase<CONSUMER_REGS>();
        consumer<D, BF16, DQ, EXTRAS, CAPPED, PERSISTENT, TAIL>(sm, pb);
    }
#else
    (void)tmQ, (void)tmK, (void)tmV, (void)tmdO, (void)tmdK, (void)tmdV, (void)pb;
#endif
}
