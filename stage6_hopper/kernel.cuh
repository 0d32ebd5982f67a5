/*
 * stage6_hopper/kernel.cuh: the kernel: attention_kernel (one block per SM: barriers set up, then
 * warpgroup 0 the producer and the others consumers, each with its registers). Split-KV's key
 * ranges are merged behind it by combine_kernel_pdl (common/device/split_kv.cuh).
 */
#pragma once

#include "mainloop.cuh"
#include "producer.cuh"

// Every buffer's "full" barrier waits for the producer's one expect_tx arrival (and the bytes);
// every "empty" one for one arrival per consumer warp. Thread 0 initialises them.
template <int D, int C, int BC>
__device__ __forceinline__ void init_barriers(const smem_tiles &sm) {
    constexpr int CONSUMER_WARPS = C * WARPS_PER_WARPGROUP;
    for (int qs = 0; qs < q_buffers<D, C, BC>(); ++qs) {
        mbar_init(bar_at(sm, BAR_Q_FULL + qs), 1);
        mbar_init(bar_at(sm, BAR_Q_EMPTY + qs), CONSUMER_WARPS);
    }
    for (int st = 0; st < STAGES; ++st) {
        mbar_init(bar_at(sm, BAR_K_FULL + st), 1);
        mbar_init(bar_at(sm, BAR_V_FULL + st), 1);
        mbar_init(bar_at(sm, BAR_K_EMPTY + st), CONSUMER_WARPS);
        mbar_init(bar_at(sm, BAR_V_EMPTY + st), CONSUMER_WARPS);
    }
    fence_barrier_init();  // visible to the copy engine (the async proxy)
}

// Q, O: [B, H, N, D] fp16 (bf16 where BF16), K, V: [B, H_kv, N_k, D], each in its own layout (the
// tensor maps describe them as (D, rows, heads, B) with its strides; O is written through tmO where
// o_staged(), else directly); the rest of the problem in prob (its tmO is set here). works = B * H
// * ceil(N / BR) * splits work tiles. SPLIT: compiled for split-KV; without it splits is the
// constant 1, and the work tiles' decoding, the producer's skipping of empty ones and the
// epilogue's fp32 path fold away. MODEL: compiled for what models feed (GQA, strides, N_k != N,
// local windows and softcap, runtime values of the problem, and bf16, which only MODEL kernels
// take); without it the kernel is the plain case's, [B, H, N, D] fp16 with H_kv = H and N_k = N,
// whose maps fold batch and head into one dimension, and whose code is the plain case's alone
// (LOG.md, step 23). PACKED (MODEL, unsplit): a packed batch's, whose work tiles read their
// sequences from cu_seqlens; the other kernels know at compile time that theirs is no packed
// batch, and keep the shape's lengths, which every work tile shares, out of per-thread registers
// (LOG.md, step 28). EXTRAS (MODEL): what some models add, a window's left bound (sliding
// windows) and softcap; a lean MODEL kernel (EXTRAS off, config.cuh's `lean`) masks the tail and
// a right bound only (causal, or a window open to the left), and has no softcap code (LOG.md,
// step 47).
template <int D, int C, int BC, int SCHEDULE, bool SPLIT, bool BF16, bool MODEL, bool PACKED,
          bool EXTRAS = MODEL>
__global__ void __launch_bounds__(block_threads<C>(), 1)
    attention_kernel(const __grid_constant__ CUtensorMap tmQ,
                     const __grid_constant__ CUtensorMap tmK,
                     const __grid_constant__ CUtensorMap tmV,
                     const __grid_constant__ CUtensorMap tmO, const problem prob, int works,
                     int *next_work) {
#if HOPPER_KERNELS
    extern __shared__ unsigned char smem_raw[];
    const smem_tiles sm = carve_smem<D, C, BC>(smem_raw);
    if (threadIdx.x == 0) {
        init_barriers<D, C, BC>(sm);
        prefetch_tensor_map(&tmQ), prefetch_tensor_map(&tmK), prefetch_tensor_map(&tmV);
    }
    __syncthreads();  // the barriers are initialised before anyone waits on or signals them
    // PDL: the merge (split-KV) or the next call's kernel may take the SMs this grid leaves
    // idle, and it waits for this one; this one reads Q, K, V and writes O only after the kernel
    // ahead of it is done.
    let_next_kernel_start();
    wait_for_previous_kernel();

    problem pb = prob;
    static_assert(MODEL || !BF16, "bf16 storage runs in the MODEL kernels");
    static_assert(!PACKED || (MODEL && !SPLIT), "a packed batch runs unsplit in MODEL kernels");
    static_assert(EXTRAS == MODEL || (MODEL && !PACKED), "lean: the unpacked MODEL kernels");
    if (!SPLIT) {  // one range: all of a query tile's keys
        pb.splits = 1, pb.split_tiles = INT_MAX;
        if (MODEL) pb.works_per_head = pb.q_tiles;
        pb.per_query_tile.mul = 1, pb.per_query_tile.shift = 0;  // n / 1
    }
    pb.packed = PACKED;                         // (is_packed: a constant from here on)
    if (SPLIT || PACKED) pb.section_shift = 0;  // (sections: unsplit, unpacked; section_shift_of)
    pb.tmO = &tmO;
    if (threadIdx.x < PRODUCER_WARPGROUPS * WARPGROUP) {
        registers_decrease<producer_regs<C>()>();
        if (threadIdx.x == 0) producer<D, C, BC, MODEL>(sm, &tmQ, &tmK, &tmV, pb, works, next_work);
    } else {
        registers_increase<consumer_regs<C>()>();
        consumer<D, C, BC, SCHEDULE, BF16, MODEL, EXTRAS>(sm, pb, works);
    }
#else
    (void)tmQ, (void)tmK, (void)tmV, (void)tmO, (void)prob, (void)works, (void)next_work;
#endif
}
