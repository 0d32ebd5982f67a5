/*
 * stage7_backward/launch.cuh: the launcher of the backward pass (host code): the variants, how dQ
 * is added up (dq_way_for), the configuration that fits this device (choose_tiles, smem_p_fits),
 * the kernel instantiations (kernel_for, smem_p_kernel; a window or a softcap: model_kernel,
 * smem_p_model_kernel), the workspace, and backward(), which runs preprocess, the main kernel, then
 * the convert or dq_kernel (the passes before and after: common/device/backward_prepost.cuh, shared
 * with stage 8).
 */
#pragma once

#include <string.h>

#include "device/kernel_cache.cuh"  // kernel_versions, kernel_smem_limit: once per device
#include "dq_kernel.cuh"
#include "registers_kernel.cuh"
#include "smem_kernel.cuh"

/* ---- launcher -------------------------------------------------------------------------------- */

enum {
    VARIANT_DEFAULT = 0,
    VARIANT_DETERMINISTIC = 1,
    VARIANT_REGISTERS = 2,
    VARIANT_ATOMICS = 3,
    VARIANT_NOSPLIT = 4,  // the default without split walks
    VARIANTS = 5
};

// How dQ is added up (dq_way, config.cuh) for a variant on this PTX architecture.
static dq_way dq_way_for(int variant, int arch) {
    if (variant == VARIANT_DETERMINISTIC) return DQ_BY_SECOND_PASS;
    return variant != VARIANT_ATOMICS && dq_bulk(arch) ? DQ_BY_BULK : DQ_BY_ATOMICS;
}

// The PTX architecture the kernels were compiled for on the current device (75 for a compute_75
// PTX build JIT-compiled on an H100): that, not the device, decides whether cp.async is there.
// Asked once per device (kernel_versions).
static cudaError_t kernel_arch(int *arch) {
    int binary = 0;
    ATTN_TRY(kernel_versions((const void *)dq_convert_kernel<64, false>, arch, &binary));
    return cudaSuccess;
}

// The first configuration of the kernel's list (REGISTERS_TILES_D64 ... DQ_TILES_D128, in order)
// whose shared memory fits the block's limit, with two stages only where cp.async is (arch >= 80);
// its index, or -1.
template <int D, bool REGISTERS>
static int choose_tiles_for(size_t smem_limit, int arch) {
    for (int i = 0; i < tile_count<D, REGISTERS>(); ++i) {
        const tile_config c = tiles_for<D, REGISTERS>()[i];
        if (c.STAGES > 1 && arch < 80) continue;
        if ((REGISTERS ? registers_smem_bytes(c, D) : dq_smem_bytes(c, D)) <= smem_limit) return i;
    }
    return -1;
}

// The head dims compiled: 64 and 128 (plain and MODEL kernels), 96 and 256 (MODEL only). A shape's
// D runs in the first of them >= D (32 and 40 .. 56: 64; 72 .. 88: 96; 104 .. 120: 128; above:
// 256), the columns past it masked (bwd_params.D); a D not 64 or 128 runs the MODEL kernels.
static int compiled_d(int D) {
    return D <= 64 ? 64 : (D <= 96 ? 96 : (D <= 128 ? 128 : 256));
}

// D: a compiled head dim.
static int choose_tiles(int D, size_t smem_limit, int arch, bool registers_kernel) {
    if (registers_kernel) {
        switch (D) {
            case 64:
                return choose_tiles_for<64, true>(smem_limit, arch);
            case 96:
                return choose_tiles_for<96, true>(smem_limit, arch);
            case 128:
                return choose_tiles_for<128, true>(smem_limit, arch);
            default:
                return choose_tiles_for<256, true>(smem_limit, arch);  // none: -1
        }
    }
    switch (D) {
        case 64:
            return choose_tiles_for<64, false>(smem_limit, arch);
        case 96:
            return choose_tiles_for<96, false>(smem_limit, arch);
        case 128:
            return choose_tiles_for<128, false>(smem_limit, arch);
        default:
            return choose_tiles_for<256, false>(smem_limit, arch);
    }
}

static tile_config tiles_at(int D, bool registers_kernel, int i) {
    if (registers_kernel) {
        return D == 64 ? REGISTERS_TILES_D64[i]
                       : (D == 96 ? REGISTERS_TILES_D96[i] : REGISTERS_TILES_D128[i]);
    }
    return D == 64 ? DQ_TILES_D64[i]
                   : (D == 96 ? DQ_TILES_D96[i] : (D == 128 ? DQ_TILES_D128[i] : DQ_TILES_D256[i]));
}

// The last configuration of a kernel's list at compiled head dim D (the MODEL kernels'), or -1.
static int last_tiles(int D, bool registers_kernel) {
    if (registers_kernel) {
        return D == 64 ? tile_count<64, true>() - 1
                       : (D == 96 ? tile_count<96, true>() - 1
                                  : (D == 128 ? tile_count<128, true>() - 1 : -1));
    }
    return D == 64
               ? tile_count<64, false>() - 1
               : (D == 96
                      ? tile_count<96, false>() - 1
                      : (D == 128 ? tile_count<128, false>() - 1 : tile_count<256, false>() - 1));
}

static smem_p_config smem_p_tiles_of(int D) {
    return D == 64 ? smem_p_tiles<64>()
                   : (D == 96 ? smem_p_tiles<96>()
                              : (D == 128 ? smem_p_tiles<128>() : smem_p_tiles<256>()));
}

typedef void (*kernel_fn)(bwd_params, bwd_model);
typedef void (*smem_kernel_fn)(bwd_params, CUtensorMap, bwd_model);  // + dQ_acc's map (DQ_BY_BULK)

// The kernel of configuration i of its list: backward_registers_kernel (REGISTERS, dQ by atomics or
// not) or dq_kernel, every configuration instantiated (BF16: for bf16 storage).
template <int D, bool REGISTERS, bool BF16, int I = 0>
static kernel_fn kernel_for(int i, bool atomic) {
    if constexpr (I < tile_count<D, REGISTERS>()) {
        constexpr tile_config c = tiles_for<D, REGISTERS>()[I];
        if (i != I) return kernel_for<D, REGISTERS, BF16, I + 1>(i, atomic);
        if constexpr (REGISTERS) {
            return atomic ? backward_registers_kernel<D, c.WARPS, c.STAGES, c.QROWS, true, BF16>
                          : backward_registers_kernel<D, c.WARPS, c.STAGES, c.QROWS, false, BF16>;
        } else {
            return dq_kernel<D, c.WARPS, c.STAGES, BF16>;
        }
    } else {
        (void)i, (void)atomic;
        return NULL;
    }
}

// backward_kernel where cp.async is and its shared memory fits the block's limit (D: compiled).
static bool smem_p_fits(int D, size_t smem_limit, int arch, dq_way dq) {
    const smem_p_config c = smem_p_tiles_of(D);
    return arch >= 80 && smem_p_bytes(c, D, dq == DQ_BY_BULK) <= smem_limit;
}

template <int D, bool BF16>
static smem_kernel_fn smem_p_kernel(dq_way dq) {
    constexpr smem_p_config c = smem_p_tiles<D>();
    switch (dq) {
        case DQ_BY_SECOND_PASS:
            return backward_kernel<D, c.KEYS, c.QROWS, c.STAGES, c.SCORE_PASSES, c.KV_REGS, false,
                                   false, BF16>;
        case DQ_BY_ATOMICS:
            return backward_kernel<D, c.KEYS, c.QROWS, c.STAGES, c.SCORE_PASSES, c.KV_REGS, true,
                                   false, BF16>;
        default:
            return backward_kernel<D, c.KEYS, c.QROWS, c.STAGES, c.SCORE_PASSES, c.KV_REGS, true,
                                   true, BF16>;
    }
}

// A local window, a softcap (bwd_model), a head dim not 64 or 128 (its tail masked: bwd_params.D)
// or a packed batch (bwd_sequence_of) runs the MODEL kernels: one backward_kernel per head dim and
// storage type (dQ's way a runtime value), and for the others the last configuration of their
// lists, which fits wherever one does (one buffer: every architecture): so that the plain cases'
// kernels carry none of it, with few instantiations more.
static bool model_shape(const attn_shape *s) {
    return (attn_shape_asks(s, 1) & (ATTN_TAKES_LOCAL | ATTN_TAKES_SOFTCAP | ATTN_TAKES_VARLEN)) !=
               0 ||
           (s->D != 64 && s->D != 128);
}

template <int D, bool BF16>
static smem_kernel_fn smem_p_model_kernel() {
    constexpr smem_p_config c = smem_p_tiles<D>();
    return backward_kernel<D, c.KEYS, c.QROWS, c.STAGES, c.SCORE_PASSES, c.KV_REGS, true, true,
                           BF16, true>;
}

// The MODEL kernel of a list (REGISTERS: backward_registers_kernel, dQ added or not at run time;
// else dq_kernel), at its last configuration.
// (NULL: backward_registers_kernel at D = 256, not compiled).
template <int D, bool REGISTERS, bool BF16>
static kernel_fn model_kernel() {
    if constexpr (tile_count<D, REGISTERS>() == 0) {
        return NULL;
    } else {
        constexpr tile_config c = tiles_for<D, REGISTERS>()[tile_count<D, REGISTERS>() - 1];
        if constexpr (REGISTERS) {
            return backward_registers_kernel<D, c.WARPS, c.STAGES, c.QROWS, true, BF16, true>;
        } else {
            return dq_kernel<D, c.WARPS, c.STAGES, BF16, true>;
        }
    }
}

// The MODEL kernels of compiled head dim D.
template <bool BF16>
static smem_kernel_fn smem_p_model_kernel_of(int D) {
    switch (D) {
        case 64:
            return smem_p_model_kernel<64, BF16>();
        case 96:
            return smem_p_model_kernel<96, BF16>();
        case 128:
            return smem_p_model_kernel<128, BF16>();
        default:
            return smem_p_model_kernel<256, BF16>();
    }
}
template <bool REGISTERS, bool BF16>
static kernel_fn model_kernel_of(int D) {
    switch (D) {
        case 64:
            return model_kernel<64, REGISTERS, BF16>();
        case 96:
            return model_kernel<96, REGISTERS, BF16>();
        case 128:
            return model_kernel<128, REGISTERS, BF16>();
        default:
            return model_kernel<256, REGISTERS, BF16>();
    }
}

// The passes before and after at a head dim not 64 or 128: preprocess_kernel and
// dq_convert_kernel's TAIL instantiations, which read p.D (dQ_acc's rows are p.D floats); D only
// sets the preprocess's lanes a row (16-byte chunks, a power of two).
template <bool BF16>
static void preprocess_tail(int D, size_t rows, cudaStream_t stream, const bwd_params &p) {
    constexpr int LANES_64 = 64, LANES_128 = 128, LANES_256 = 256;  // the instantiations' D
    if (D <= LANES_64) {
        preprocess_kernel<LANES_64, BF16, true>
            <<<preprocess_grid(rows, LANES_64), PREPROCESS_THREADS, 0, stream>>>(p);
    } else if (D <= LANES_128) {
        preprocess_kernel<LANES_128, BF16, true>
            <<<preprocess_grid(rows, LANES_128), PREPROCESS_THREADS, 0, stream>>>(p);
    } else {
        preprocess_kernel<LANES_256, BF16, true>
            <<<preprocess_grid(rows, LANES_256), PREPROCESS_THREADS, 0, stream>>>(p);
    }
}

template <typename FN, typename... ARGS>
static cudaError_t launch(FN fn, dim3 grid, int threads, size_t smem, cudaStream_t stream,
                          const ARGS &...args) {
    ATTN_TRY(kernel_smem_limit((const void *)fn, (int)smem));  // once per kernel and device
    fn<<<grid, threads, smem, stream>>>(args...);
    ATTN_TRY(cudaGetLastError());
    return cudaSuccess;
}

// The main kernel of a call and its tiles: backward_kernel (smem_p: P^T and dS^T through shared
// memory) or backward_registers_kernel (configuration mi of its list), dq_kernel's configuration
// di (the deterministic variant), how dQ is added (dq), the main kernel's key tile and query
// tile, and its split walks: every walk's shares (common/device/backward_prepost.cuh's
// walk_shares_for: where the grid fills at most half of the multiprocessors), or else where a
// grid of whole walks of one length (no mask) ends on a part of a wave, the last work tiles' (a
// tail split: tail_split_for, over the blocks the multiprocessors hold at once; a 1-D grid,
// config.cuh's place_of_block; the plain kernels only); neither in variant nosplit nor for a
// packed batch.
// enqueue_backward launches it; backward_workspace_bytes makes room for the shares.
typedef struct {
    bool smem_p;
    dq_way dq;
    int mi, di;
    int keys, qrows;
    int shares;
    tail_split tail;  // ({work tiles, 1}: none)
} main_plan;

// The main kernel of a plan (enqueue_backward launches it): its code (smem_p: sk, else mk), its
// block's threads and dynamic shared memory.
typedef struct {
    smem_kernel_fn sk;
    kernel_fn mk;
    int threads;
    size_t smem;
} main_kernel;
template <bool BF16>
static main_kernel main_kernel_of(const attn_shape *s, const main_plan *pl) {
    const int D = compiled_d(s->D);
    const bool model = model_shape(s);
    main_kernel k = {NULL, NULL, 0, 0};
    if (pl->smem_p) {
        const smem_p_config c = smem_p_tiles_of(D);
        k.sk = model
                   ? smem_p_model_kernel_of<BF16>(D)
                   : (D == 64 ? smem_p_kernel<64, BF16>(pl->dq) : smem_p_kernel<128, BF16>(pl->dq));
        k.threads = SMEM_P_WARPS * WARP_SIZE, k.smem = smem_p_bytes(c, D, pl->dq == DQ_BY_BULK);
    } else {
        const tile_config mc = tiles_at(D, true, pl->mi);
        const bool atomic = pl->dq != DQ_BY_SECOND_PASS;
        k.mk = model ? model_kernel_of<true, BF16>(D)
                     : (D == 64 ? kernel_for<64, true, BF16>(pl->mi, atomic)
                                : kernel_for<128, true, BF16>(pl->mi, atomic));
        k.threads = mc.WARPS * WARP_SIZE, k.smem = registers_smem_bytes(mc, D);
    }
    return k;
}

// The tail split of a plan's grid (main_plan), from the blocks of its main kernel that the
// multiprocessors hold at once.
static cudaError_t plan_tail(const attn_shape *s, const attn_device *dev, main_plan *pl) {
    const long long work_tiles = (long long)ceil_div(s->N_k, pl->keys) * s->B * s->H_kv;
    const main_kernel k = s->bf16 ? main_kernel_of<true>(s, pl) : main_kernel_of<false>(s, pl);
    const void *fn = k.sk ? (const void *)k.sk : (const void *)k.mk;
    int per_sm = 1;
    if (fn) ATTN_TRY(kernel_blocks_per_sm(fn, k.threads, (int)k.smem, &per_sm));
    const long long query_tiles = ceil_div(s->N, pl->qrows);
    pl->tail = tail_split_for(work_tiles, (long long)(s->H / s->H_kv) * query_tiles, query_tiles,
                              dev->sm_count * per_sm);
    if (pl->tail.first + (work_tiles - pl->tail.first) * pl->tail.shares >= INT_MAX)  // its blocks
        pl->tail = {work_tiles, 1};
    return cudaSuccess;
}

static cudaError_t plan_main(const attn_shape *s, const attn_device *dev, int variant,
                             main_plan *pl) {
    int arch = 0;
    ATTN_TRY(kernel_arch(&arch));
    const int D = compiled_d(s->D);  // the kernels' head dim (s->D: its first columns)
    pl->dq = dq_way_for(variant, arch);
    pl->smem_p = variant != VARIANT_REGISTERS && smem_p_fits(D, dev->smem_per_block, arch, pl->dq);
    pl->mi = choose_tiles(D, dev->smem_per_block, arch, true);
    pl->di = choose_tiles(D, dev->smem_per_block, arch, false);
    if ((!pl->smem_p && pl->mi < 0) || (variant == VARIANT_DETERMINISTIC && pl->di < 0))
        return cudaErrorInvalidConfiguration;  // stage_unsupported says why
    if (model_shape(s)) {  // the MODEL kernels' configurations: their lists' last
        pl->mi = last_tiles(D, true);
        pl->di = last_tiles(D, false);
    }
    if (pl->smem_p) {
        const smem_p_config c = smem_p_tiles_of(D);
        pl->keys = c.KEYS, pl->qrows = c.QROWS;
    } else {
        const tile_config mc = tiles_at(D, true, pl->mi);
        pl->keys = tile_rows(mc), pl->qrows = mc.QROWS;
    }
    pl->shares = 1;
    pl->tail = {(long long)ceil_div(s->N_k, pl->keys) * s->B * s->H_kv, 1};
    if (variant == VARIANT_NOSPLIT || s->varlen.cu_seqlens_q) return cudaSuccess;
    pl->shares = walk_shares_for(s, pl->keys, pl->qrows, dev->sm_count);
    const key_rule keys = key_rule_of(s, true);
    if (pl->shares == 1 && !model_shape(s) && keys.left < 0 && keys.right < 0)
        ATTN_TRY(plan_tail(s, dev, pl));
    return cudaSuccess;
}

// A plan's split walks as the workspace and the sum pass count them: the shares of each split
// walk, and the first key whose walk is split (a tail split's first work tile's; else 0).
static int split_shares(const main_plan *pl) {
    return pl->tail.shares > 1 ? pl->tail.shares : pl->shares;
}
static long long split_first_key(const main_plan *pl) {
    return pl->tail.shares > 1 ? pl->tail.first * pl->keys : 0;
}

// Workspace (bwd_params_of): lse2 and Dsum, then (every variant but deterministic) dQ_acc; packed,
// rows of the total tokens plus ROW_PAD a sequence (bwd_pad_rows, bwd_acc_rows), not of B times
// the longest; then a split walk's shares (dkv_part).
static size_t dq_acc_bytes(const attn_shape *s, int variant) {
    return variant == VARIANT_DETERMINISTIC ? 0 : bwd_acc_rows(s) * s->D * sizeof(float);
}
// where dkv_part starts: its bytes from the workspace's start
static size_t dkv_part_offset(const attn_shape *s, int variant) {
    return 2 * aligned(bwd_pad_rows(s) * sizeof(float)) + aligned(dq_acc_bytes(s, variant));
}
static size_t backward_workspace_bytes(const attn_shape *s, const attn_device *dev, int variant) {
    main_plan pl;
    size_t part = 0;
    if (plan_main(s, dev, variant, &pl) == cudaSuccess)
        part = dkv_part_bytes_for(s, split_shares(&pl), pl.keys, compiled_d(s->D),
                                  (size_t)split_first_key(&pl));
    else
        (void)cudaGetLastError();  // (no plan: the call is refused before it runs)
    return dkv_part_offset(s, variant) + aligned(part);
}

// Preprocess, the main kernel, then the convert or dq_kernel, for one storage type (BF16: bf16).
template <bool BF16>
static cudaError_t enqueue_backward(const attn_shape *s, const attn_device *dev,
                                    const bwd_params &p, int variant, cudaStream_t stream) {
    const int BH = s->B * s->H;
    const size_t rows = (size_t)BH * p.N_pad;
    const bool atomic = variant != VARIANT_DETERMINISTIC;
    const int D = compiled_d(s->D);  // the kernels' head dim (s->D: its first columns)
    const bool tail = s->D != 64 && s->D != 128;
    const dim3 pre_grid = preprocess_grid(rows, s->D);
    if (tail) {
        preprocess_tail<BF16>(s->D, rows, stream, p);
    } else if (D == 64) {
        preprocess_kernel<64, BF16><<<pre_grid, PREPROCESS_THREADS, 0, stream>>>(p);
    } else {
        preprocess_kernel<128, BF16><<<pre_grid, PREPROCESS_THREADS, 0, stream>>>(p);
    }
    ATTN_TRY(cudaGetLastError());
    const unsigned BH_kv = (unsigned)(s->B * s->H_kv);  // the main kernels' (batch, K/V head)s

    const bool model = model_shape(s);
    main_plan pl;
    ATTN_TRY(plan_main(s, dev, variant, &pl));
    const dq_way dq = pl.dq;
    const int di = pl.di;
    const bool tail_grid = pl.tail.shares > 1;  // a tail split's 1-D grid
    const int key_tiles = ceil_div(s->N_k, pl.keys);
    bwd_model m = bwd_model_of(s, dq);
    // a split walk's shares after lse2, Dsum and dQ_acc (backward_workspace_bytes)
    float *const dkv_part = (float *)((char *)p.lse2 + dkv_part_offset(s, variant));
    m.dkv_part = split_shares(&pl) > 1 ? dkv_part : NULL;
    m.key_tiles = key_tiles;
    if (tail_grid) m.tail_first = (int)pl.tail.first, m.tail_shares = pl.tail.shares;
    // the plain grid: key tiles, (batch, K/V head)s, every walk's shares; a tail split's, 1-D:
    // the whole walks' blocks, then the split ones' shares (place_of_block)
    const dim3 grid =
        tail_grid ? dim3((unsigned)(pl.tail.first + ((long long)key_tiles * BH_kv - pl.tail.first) *
                                                        pl.tail.shares))
                  : dim3((unsigned)key_tiles, BH_kv, (unsigned)pl.shares);
    const main_kernel k = main_kernel_of<BF16>(s, &pl);
    if (pl.smem_p) {
        CUtensorMap dq_map;
        memset(&dq_map, 0, sizeof dq_map);  // unread but by the DQ_BY_BULK kernels
        // (dQ_acc's rows are s->D floats; the staging tile's D columns past them are not added)
        if (dq == DQ_BY_BULK)
            ATTN_TRY(dq_tensor_map(&dq_map, p.dQ_acc, s, smem_p_tiles_of(D).QROWS, D));
        ATTN_TRY(launch(k.sk, grid, k.threads, k.smem, stream, p, dq_map, m));
    } else {
        ATTN_TRY(launch(k.mk, grid, k.threads, k.smem, stream, p, m));
    }
    if (split_shares(&pl) > 1) {  // the shares' dK and dV added (backward_prepost.cuh; a tail
                                  // split's from its first work tile's (batch, K/V head) on)
        const int head_keys = key_tiles * pl.keys;
        const long long first_key = split_first_key(&pl);
        dkv_sum_kernel<BF16>
            <<<dkv_sum_grid(s, (int)(first_key / head_keys)), DKV_SUM_THREADS, 0, stream>>>(
                p, dkv_part, D, head_keys, split_shares(&pl), first_key);
        ATTN_TRY(cudaGetLastError());
    }
    if (atomic) {
        const dim3 grid = convert_grid(s);
        if (tail) {  // (dQ_acc's rows are s->D floats: any instantiation's D)
            dq_convert_kernel<64, BF16, true><<<grid, CONVERT_THREADS, 0, stream>>>(p);
        } else if (D == 64) {
            dq_convert_kernel<64, BF16><<<grid, CONVERT_THREADS, 0, stream>>>(p);
        } else {
            dq_convert_kernel<128, BF16><<<grid, CONVERT_THREADS, 0, stream>>>(p);
        }
        ATTN_TRY(cudaGetLastError());
    } else {
        const tile_config dc = tiles_at(D, false, di);
        const kernel_fn dk = model ? model_kernel_of<false, BF16>(D)
                                   : (D == 64 ? kernel_for<64, false, BF16>(di, false)
                                              : kernel_for<128, false, BF16>(di, false));
        ATTN_TRY(launch(dk, dim3((unsigned)ceil_div(s->N, tile_rows(dc)), (unsigned)BH),
                        dc.WARPS * WARP_SIZE, dq_smem_bytes(dc, D), stream, p, m));
    }
    return cudaSuccess;
}

static cudaError_t backward(const attn_shape *s, const attn_device *dev, const void *Q,
                            const void *K, const void *V, const void *O, const float *lse,
                            const void *dO, void *dQ, void *dK, void *dV, void *workspace,
                            int variant, cudaStream_t stream) {
    const bwd_params p = bwd_params_of(s, Q, K, V, O, lse, dO, dQ, dK, dV, workspace,
                                       variant != VARIANT_DETERMINISTIC);  // (dQ by atomics)
    return s->bf16 ? enqueue_backward<true>(s, dev, p, variant, stream)
                   : enqueue_backward<false>(s, dev, p, variant, stream);
}
