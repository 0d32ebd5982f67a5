/*
 * stage8_hopper_backward/epilogue.cuh: the end of a block: dK_j *= scale (S = scale Q K^T: the
 * scale the consumers left out of every step), then dK_j and dV_j, summed over every query tile of
 * every query head of the group in fp32 registers, to global memory in the storage type: the
 * consumers write them over K_j and V_j in shared memory (stage_dkv), the store warp stores them
 * by TMA (store_dkv), in whole 128-byte rows (a warp's 4-byte stores straight from the
 * accumulator layout would write 16 bytes of each of 8 rows); a packed batch's last key tile of a
 * sequence by the consumers' threads, masked at the sequence's end (store_rows_masked). A split
 * walk's share writes its fp32 sums from the registers instead (write_dkv_share), and the pass
 * after the main kernel adds the shares (backward_prepost.cuh's dkv_sum_kernel).
 */
#pragma once

#include "schedule.cuh"
#include "smem.cuh"

// One accumulator (a warpgroup's 64 keys x dkv_cols<D>(); the thread's columns 8n + 2t, +1 of
// rows row and row + 8 of its warp's 16) times `scale`, packed to 16 bits, into a
// [slabs][block_keys][64] tile in the 128-byte swizzle (at D = 256 from the warpgroup's first
// slab on): one 4-byte store a column pair. A warp's store writes 8 rows, each
// row's chunk n at position n ^ (row % 8): 8 different 16-byte bank groups, no bank conflict.
template <int D, bool BF16>
__device__ __forceinline__ void stage_rows(const float (&acc)[dkv_regs<D>()], float scale,
                                           uint32_t tile, int row, int t) {
#pragma unroll
    for (int h = 0; h < FRAG_LANE_ROWS; ++h) {
        const uint32_t base =
            swizzle_row_base(tile, row + FRAG_ROW_STEP * h) + FRAG_LANE_COLS * HALF_BYTES * t;
#pragma unroll
        for (int n = 0; n < dkv_cols<D>() / FRAG_COLS; ++n)
            st_shared_b32(
                swizzled_chunk_at<block_keys<D>()>(base, n),
                pack2_of<BF16>(acc[acc_index(n, h, 0)] * scale, acc[acc_index(n, h, 1)] * scale));
    }
}

// Where the consumers stage dK_j and dV_j for the store warp: over K_j's and V_j's tiles, or, in a
// persistent block, in the dS^T buffers (at D = 128 and the dQ staging tile's first part after
// them: dkv_stage_over_dq), all free at a work tile's end, so that the next work tile's K_j and V_j
// load while the stores read these (LOG.md, step 84). The next work tile writes them only after
// the store warp's copies have read them (DKV_READ, before its first step's dS^T).
template <int D, bool PERSISTENT>
__device__ __forceinline__ uint32_t dk_stage(const smem_tiles &sm) {
    return PERSISTENT ? sm.dS : sm.K;
}
template <int D, bool PERSISTENT>
__device__ __forceinline__ uint32_t dv_stage(const smem_tiles &sm) {
    return PERSISTENT ? sm.dS + kv_tile_bytes<D>() : sm.V;
}

// A packed batch's key tile that runs past its sequence's keys (the sequence's last): a TMA
// store of the whole box would write the next sequence's rows of dK and dV, another block's.
template <int D>
__device__ __forceinline__ bool dkv_masked(const bwd_problem &pb, const block_place &b) {
    return pb.call.varlen.cu_seqlens_q && b.key0 + block_keys<D>() > b.N_k;
}

// Such a tile's first `rows` rows, staged (stage_rows' swizzled layout), to rows row0 .. of head
// `head` of `out` (strides l) by the consumers' threads, a 16-byte chunk each: thread i copies
// chunk i % ROW_CHUNKS of every ROW_STEP-th row from row i / ROW_CHUNKS (whole rows' columns at
// once), columns past the tensors' D (cols, a multiple of 8) skipped as TMA clips them.
template <int D>
__device__ __forceinline__ void store_rows_masked(uint32_t tile, __half *out,
                                                  const tensor_strides &l, int row0, int head,
                                                  int rows, int cols, int thread) {
    constexpr int THREADS = CONSUMERS * WARPGROUP, ROW_CHUNKS = slabs<D>() * CHUNKS_PER_SLAB_ROW;
    constexpr int ROW_STEP = THREADS / ROW_CHUNKS;
    static_assert(THREADS % ROW_CHUNKS == 0, "a thread keeps one chunk of the rows");
    const int chunk = thread % ROW_CHUNKS;
    if (chunk * CHUNK_HALVES >= cols) return;
    // (a packed tensor has no batch stride)
    __half *const column = out + head_offset(l, 0, head) + chunk * CHUNK_HALVES;
#pragma unroll 4
    for (int row = thread / ROW_CHUNKS; row < rows; row += ROW_STEP)
        st_global_v4(column + rows_offset(row0 + row, l.row),
                     ld_shared_v4(tile + swizzled_chunk_offset<block_keys<D>()>(row, chunk)));
}

// A consumer thread's part of dK_j = scale dK_acc and dV_j = dV_acc, over its rows of K_j's and
// V_j's tiles (the same layout; a persistent block's in the dS^T buffers: dk_stage); then visible
// to the copy engine, and announced to the store warp (DKV_STAGED: a persistent block's consumers
// meet it once a work tile, the next time only after the store warp has, as the next work tile's
// first step waits for its copies to have read these tiles, DKV_READ). The tiles are free once both
// warpgroups' wgmma are done (KV_FREE): the dQ products read all the block's keys of K_j (at D =
// 256 the scores of each warpgroup all of K_j and V_j, whose columns the warpgroups stage half
// each). A packed batch's tile past its sequence's keys (dkv_masked): once both warpgroups have
// staged their rows (KV_FREE again), the consumers store the sequence's rows themselves
// (store_rows_masked), the store warp none.
template <int D, bool BF16, bool PERSISTENT>
__device__ __forceinline__ void stage_dkv(const float (&dK)[dkv_regs<D>()],
                                          const float (&dV)[dkv_regs<D>()], const smem_tiles &sm,
                                          const consumer_place &p, const bwd_problem &pb,
                                          const block_place &b, int last_hand) {
    named_barrier_sync<CONSUMERS * WARPGROUP>(NAMED_BARRIER_KV_FREE);
    if constexpr (PERSISTENT) {
        // K_j and V_j are free: the next work tile's may come (the K/V warp; one arrival, the
        // first consumer thread's), and dK_j, dV_j go to the staging tiles (the work tile's first
        // step waited until the store warp had read the work tile before's there: every work tile
        // of a persistent block has a step) once the dQ warp has read the work tile's last dQ part
        // where they overlap it
        if (threadIdx.x == PRODUCER_WARPGROUPS * WARPGROUP) mbar_arrive(bar_at(sm, BAR_KV_EMPTY));
        if constexpr (dkv_stage_over_dq<D>())
            mbar_wait(dq_empty_bar(sm, 0), dq_pipeline{last_hand}.phase());
    } else {
        (void)last_hand;
    }
    const int row = wg_key0<D>(p.wg) + WARP_ROWS * p.warp + p.g;  // the thread's first row
    const int slab = wg_col0<D>(p.wg) / SLAB_COLS;                // its first column's slab
    stage_rows<D, BF16>(dK, pb.scale,
                        dk_stage<D, PERSISTENT>(sm) + slab_offset<block_keys<D>()>(slab), row, p.t);
    stage_rows<D, BF16>(dV, 1.f, dv_stage<D, PERSISTENT>(sm) + slab_offset<block_keys<D>()>(slab),
                        row, p.t);
    fence_proxy_async();  // this thread's stores are visible to the copy engine
    named_barrier_arrive<CONSUMERS * WARPGROUP + WARP_SIZE>(NAMED_BARRIER_DKV_STAGED);
    if (dkv_masked<D>(pb, b)) {
        named_barrier_sync<CONSUMERS * WARPGROUP>(NAMED_BARRIER_KV_FREE);  // both staged theirs
        const int thread = (p.wg * WARPS_PER_WARPGROUP + p.warp) * WARP_SIZE + p.lane;
        const int k_row = (int)b.seq.seq.k_row + b.key0, rows = b.N_k - b.key0;  // (> 0)
        store_rows_masked<D>(sm.K, pb.call.dK, pb.call.layout.dK, k_row, b.kv_head, rows, pb.call.D,
                             thread);
        store_rows_masked<D>(sm.V, pb.call.dV, pb.call.layout.dV, k_row, b.kv_head, rows, pb.call.D,
                             thread);
    }
}

// The store warp, for each work tile of the block (a persistent block's as the load warp
// publishes them): once the consumers have staged dK_j and dV_j (DKV_STAGED), lane 0 stores them
// to keys key0 .. of (batch, kv_head) of dK and dV (tmdK, tmdV: block_keys-row boxes; keys past N_k
// are not written; columns past the tensors' D neither), slabs<D>() TMA copies each, and waits
// until they have read the tiles: the block's shared memory lives until then, and a persistent
// block's next work tile writes its dS^T there (DKV_READ). A packed batch: at the
// sequence's rows of the packed tensors (from k_row, batch 0), where the whole box lies in them
// (else the consumers store the rows: dkv_masked).
template <int D, bool PERSISTENT, bool TAIL>
__device__ __forceinline__ void store_dkv(const smem_tiles &sm, const CUtensorMap *tmdK,
                                          const CUtensorMap *tmdV, const bwd_problem &pb,
                                          int lane) {
    if (own_walk_split<TAIL>(pb)) return;  // a split walk: the consumers write the share's sums
    for (int n = 0;; ++n) {
        int w = 0;
        if constexpr (PERSISTENT) {
            w = take_work_by_warp(sm, n, lane);
            if (w >= pb.work_tiles) break;  // that was "stop"
        }
        named_barrier_sync<CONSUMERS * WARPGROUP + WARP_SIZE>(NAMED_BARRIER_DKV_STAGED);
        const block_place b =
            block_place_of<D>(pb, PERSISTENT ? work_tile_at(pb, w) : own_work_tile<TAIL>(pb));
        if (lane == 0 && !dkv_masked<D>(pb, b)) {
            const int k_row = (int)b.seq.seq.k_row + b.key0;
#pragma unroll
            for (int c = 0; c < slabs<D>(); ++c) {
                tma_store_4d(tmdK, dk_stage<D, PERSISTENT>(sm) + slab_offset<block_keys<D>()>(c),
                             c * SLAB_COLS, k_row, b.kv_head, b.tile_batch);
                tma_store_4d(tmdV, dv_stage<D, PERSISTENT>(sm) + slab_offset<block_keys<D>()>(c),
                             c * SLAB_COLS, k_row, b.kv_head, b.tile_batch);
            }
            bulk_commit();
            bulk_wait<true>();  // the copies have read the tiles
            if constexpr (PERSISTENT) mbar_arrive(bar_at(sm, BAR_DKV_READ));
        }
        if constexpr (!PERSISTENT) break;
    }
}

// A split walk's share (own_share): the thread's dK_j and dV_j sums, fp32 and unscaled, to the
// share's place in pb.dkv_part (dkv_part_at: head_keys key_tiles block_keys, from a tail split's
// first work tile's first key on; its grid's rows are the (batch, key/value head)s, no mask). A
// thread holds two columns of rows g and g + 8 of each 8-column block (acc_index); lanes t and t ^
// 1 swap a pair (quad_pairs_to_float4) so that the even lane holds four columns of row g and the
// odd lane four of row g + 8: one 16-byte store each, a warp's store 32 whole bytes of each of 16
// rows. (4-byte stores straight from the layout, half a sector each, made this the block's longest
// phase: LOG.md, step 81.) Rows past N_k are written too (the array holds whole key tiles; the sum
// pass reads none of them). A share with no step writes its zeros: the sum pass adds every share.
template <int D>
__device__ __forceinline__ void write_share_rows(const float (&acc)[dkv_regs<D>()], float *row0,
                                                 size_t row_step, int t) {
    const bool odd = t % 2;  // the lane that stores row g + 8
    float *const to = row0 + (odd ? FRAG_ROW_STEP * row_step : 0) + FRAG_LANE_COLS * (t & ~1);
#pragma unroll
    for (int n = 0; n < dkv_cols<D>() / FRAG_COLS; ++n) {
        // row g's pair and row g + 8's (constant indices: the accumulator stays in registers)
        *reinterpret_cast<float4 *>(to + FRAG_COLS * n) =
            quad_pairs_to_float4(acc[acc_index(n, 0, 0)], acc[acc_index(n, 0, 1)],
                                 acc[acc_index(n, 1, 0)], acc[acc_index(n, 1, 1)], odd);
    }
}
template <int D, bool TAIL>
__device__ __forceinline__ void write_dkv_share(const float (&dK)[dkv_regs<D>()],
                                                const float (&dV)[dkv_regs<D>()],
                                                const consumer_place &p, const bwd_problem &pb,
                                                const block_place &b) {
    constexpr int KEY_FLOATS = 2 * D;  // a share's dK and dV of one key
    const walk_share own = own_share<TAIL>(pb);
    const size_t head_keys = (size_t)pb.key_tiles * block_keys<D>();
    const size_t first_key = !TAIL || gridDim.z > 1 ? 0 : (size_t)pb.tail_first * block_keys<D>();
    const int row = b.key0 + wg_key0<D>(p.wg) + WARP_ROWS * p.warp + p.g;  // the thread's first
    float *const share = pb.dkv_part +
                         dkv_part_at((size_t)b.batch * pb.H_kv + b.kv_head, head_keys, row,
                                     own.shares, own.z, D, first_key) +
                         wg_col0<D>(p.wg);
    const size_t row_step = (size_t)own.shares * KEY_FLOATS;  // a key's floats, every share's
    write_share_rows<D>(dK, share, row_step, p.t);
    write_share_rows<D>(dV, share + D, row_step, p.t);
}
