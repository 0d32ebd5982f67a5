/*
 * stage6_hopper/launch.cuh: the host side of a launch: the tensor maps, split-KV's plan for a
 * shape (plan_splits), and the launch of the chosen configuration's kernel, then of the merge
 * (launch_schedule, launch).
 */
#pragma once

#include <cudaTypedefs.h>
#include <limits.h>
#include <pthread.h>
#include <string.h>

#include "device/kernel_cache.cuh"  // kernel_versions, kernel_smem_limit: once per device
#include "device/tensor_map.cuh"    // tensor_map_slabs
#include "kernel.cuh"

// The heads a section of the work tiles (schedule.cuh's work_at), as a shift: under a mask with
// a right bound (causal) a head's query tiles have different numbers of key tiles, and the
// persistent blocks take the longest of 2^shift heads first; the most heads, a power of two
// dividing B H, whose K and V (2 N_k D halves a key/value head, shared by H / H_kv query heads)
// fit SECTION_KV_BYTES (config.cuh; common/device/sm90.cuh's section_shift_for). 0 elsewhere: no
// right bound (one length), a packed batch, split-KV (choose_splits simulates the heads one after
// another), the variant nosections.
static int section_shift_of(const attn_shape *s, int variant, int splits) {
    if (variant == VARIANT_NOSECTIONS || splits > 1 || s->varlen.cu_seqlens_q ||
        key_rule_of(s, true).right < 0)
        return 0;
    const size_t head_bytes = 2 * (size_t)s->N_k * s->D * sizeof(__half) / (s->H / s->H_kv);
    return section_shift_for(s->B * s->H, head_bytes, SECTION_KV_BYTES);
}

// Split-KV, by stage 5's rule (choose_splits): key ranges per query tile where the work tiles
// leave SMs idle or make a short last wave, with one slot per SM (the persistent blocks). Decided
// once per shape and device (the last one is kept: a benchmark launches the same shape many
// times). Not for a packed batch: the host knows only its longest sequence's lengths (the plan
// would cut keys that most sequences do not have), and its sequences' rows take split-KV's place
// in the problem; its short sequences make many work tiles anyway.
// What a key range costs besides its key tiles (Q's copy, the first K tile's wait, the fp32 O
// and LSE stores), in key tiles: stage 5's estimate (LOG.md, step 15).
constexpr double SPLIT_OVERHEAD_TILES = 1.0;
typedef struct {
    attn_shape shape;  // key: the shape (not its scale; its heads, window, softcap, packed or
                       // not), SMs, variant
    int sm_count, variant;
    kernel_config config;     // value: config_for(),
    int splits, split_tiles;  // key ranges,
    int section_shift;        // and the work tiles' sections of heads (section_shift_of)
} split_plan;

static split_plan plan_splits(const attn_shape *s, const attn_device *dev, int variant) {
    static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    static split_plan last;  // last.splits == 0: none yet
    split_plan p;
    memset(&p, 0, sizeof p);
    p.shape = *s, p.shape.scale = 0.f, p.sm_count = dev->sm_count, p.variant = variant;
    pthread_mutex_lock(&lock);
    const bool packed = s->varlen.cu_seqlens_q != NULL;
    const bool hit =
        last.splits > 0 && (last.shape.varlen.cu_seqlens_q != NULL) == packed &&
        last.shape.B == s->B && last.shape.H == s->H && last.shape.H_kv == s->H_kv &&
        last.shape.N == s->N && last.shape.N_k == s->N_k && last.shape.D == s->D &&
        last.shape.causal == s->causal && last.shape.local == s->local &&
        last.shape.window_left == s->window_left && last.shape.window_right == s->window_right &&
        last.shape.softcap == s->softcap && last.sm_count == p.sm_count && last.variant == variant;
    if (hit) p = last;
    pthread_mutex_unlock(&lock);
    if (hit) return p;
    p.config = config_for(s, dev, variant);
    const int BR = p.config.consumers * WGMMA_M;  // block_rows<C>()
    const int BC = p.config.key_tile;
    p.splits = 1, p.split_tiles = ceil_div(s->N_k, BC);
    if (variant != VARIANT_NOSPLIT && dev->sm_count > 0 && !packed)
        p.splits = choose_splits(s, BR, BC, key_rule_of(s, true), dev->sm_count,
                                 SPLIT_OVERHEAD_TILES, &p.split_tiles);
    p.section_shift = section_shift_of(s, variant, p.splits);
    pthread_mutex_lock(&lock);
    last = p;
    pthread_mutex_unlock(&lock);
    return p;
}

typedef struct {
    const void *Q, *K, *V;  // [B, H, N, D] fp16 or bf16; K, V [B, H_kv, N_k, D]; in their layouts
                            // (packed: [total_q, H, D], [total_k, H_kv, D])
    __half *O;              // [B, H, N, D] fp16 or bf16 (s->bf16) in its layout (packed: as Q)
    float *lse;             // [B, H, N] (packed: [H, total_q])
    int *next_work;         // the persistent blocks' work tile counter (the workspace)
    float *O_part;          // split-KV's partial results (the workspace after the counter)
    split_plan split;
    int persistent_blocks;  // one per SM, or 0: one block per work tile (variant nopersistent)
    bool pdl;               // launched with PDL (all but variant nopdl)
    bool lean;              // a lean configuration's lean kernels where they fit (but nolean)
    cudaStream_t stream;
} launch_args;

// A launch's configuration, with programmatic stream serialization when `pdl` (PDL:
// let_next_kernel_start(); warp.cuh's pdl_launch_config); `attr` is where it points for it.
static cudaLaunchConfig_t launch_config(unsigned blocks, int threads, size_t smem,
                                        const launch_args *a, cudaLaunchAttribute *attr) {
    return pdl_launch_config(dim3(blocks), threads, smem, a->stream, a->pdl, attr);
}

typedef void (*kernel_fn)(const CUtensorMap, const CUtensorMap, const CUtensorMap,
                          const CUtensorMap, const problem, int, int *);

// An unpacked MODEL kernel, split or not, fp16 or bf16 storage, with EXTRAS or lean.
template <int D, int C, int BC, int SCHEDULE, bool EXTRAS>
static kernel_fn model_kernel_for(bool split, bool bf16) {
    if (bf16)
        return split ? attention_kernel<D, C, BC, SCHEDULE, true, true, true, false, EXTRAS>
                     : attention_kernel<D, C, BC, SCHEDULE, false, true, true, false, EXTRAS>;
    return split ? attention_kernel<D, C, BC, SCHEDULE, true, false, true, false, EXTRAS>
                 : attention_kernel<D, C, BC, SCHEDULE, false, false, true, false, EXTRAS>;
}

// The configuration's kernel for split-KV or not: the plain case's, or for what models feed
// (model; bf16 storage too), or a packed batch's (packed: MODEL, unsplit, the default schedule
// alone: attention_unsupported). A model_only configuration has the MODEL kernels alone; a LEAN
// one also has them without EXTRAS, for a shape that asks for no window's left bound and no
// softcap (extras false).
template <int D, int C, int BC, int SCHEDULE, bool MODEL_ONLY, bool LEAN>
static kernel_fn kernel_for(bool split, bool model, bool bf16, bool packed, bool extras) {
    if (packed) {
        if constexpr (SCHEDULE == SCHEDULE_PINGPONG)
            return bf16 ? attention_kernel<D, C, BC, SCHEDULE, false, true, true, true>
                        : attention_kernel<D, C, BC, SCHEDULE, false, false, true, true>;
        return NULL;
    }
    if (MODEL_ONLY || model || bf16) {
        if constexpr (LEAN)
            if (!extras) return model_kernel_for<D, C, BC, SCHEDULE, false>(split, bf16);
        return model_kernel_for<D, C, BC, SCHEDULE, true>(split, bf16);
    }
    if constexpr (!MODEL_ONLY)
        return split ? attention_kernel<D, C, BC, SCHEDULE, true, false, false, false>
                     : attention_kernel<D, C, BC, SCHEDULE, false, false, false, false>;
    return NULL;
}

// The plain case's Q, K, V or O, [B, H, N, D] fp16 contiguous, as the plain kernels see it: one
// batch of B * H heads, so that a work tile's batch*head is the head coordinate (heads_of).
static cudaError_t tensor_map_plain(CUtensorMap *map, const void *base, const attn_shape *s,
                                    int box_rows) {
    const attn_layout folded = attn_contiguous(s->B * s->H, s->N, s->D);
    return tensor_map_4d(map, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, HALF_BYTES, base, 1, s->B * s->H,
                         s->N, s->D, &folded, SLAB_COLS, box_rows, CU_TENSOR_MAP_SWIZZLE_128B);
}

// The MODEL kernels' Q, K, V and O maps: [B, heads, rows, D] by each tensor's strides, the shape's
// D as the inner extent. A packed batch's tensors are one batch of total_q (total_k) rows, the
// sequences' rows one after another (the work tiles add a sequence's first row).
static cudaError_t tensor_maps_model(CUtensorMap *tmQ, CUtensorMap *tmK, CUtensorMap *tmV,
                                     CUtensorMap *tmO, const attn_shape *s, const launch_args *a,
                                     int q_box, int k_box, int o_box) {
    attn_shape maps = *s;
    int q_rows = s->N, k_rows = s->N_k;
    if (s->varlen.cu_seqlens_q) maps.B = 1, q_rows = s->varlen.total_q, k_rows = s->varlen.total_k;
    ATTN_TRY(tensor_map_slabs(tmQ, a->Q, &maps, s->H, q_rows, &s->q, q_box));
    ATTN_TRY(tensor_map_slabs(tmK, a->K, &maps, s->H_kv, k_rows, &s->k, k_box));
    ATTN_TRY(tensor_map_slabs(tmV, a->V, &maps, s->H_kv, k_rows, &s->v, k_box));
    ATTN_TRY(tensor_map_slabs(tmO, a->O, &maps, s->H, q_rows, &s->o, o_box));
    return cudaSuccess;
}

// The plain kernels take the plain case at their own D; a D masked in a larger kernel (s->D < D),
// or one of a model_only configuration, runs in the MODEL kernels (the tensor maps with the
// shape's D, tensor_map_slabs), and so does a packed batch (unsplit: plan_splits).
template <int D, int C, int BC, int SCHEDULE, bool MODEL_ONLY, bool LEAN>
static cudaError_t launch(const attn_shape *s, const launch_args *a) {
    constexpr int BR = block_rows<C>();
    CUtensorMap tmQ, tmK, tmV, tmO;  // (tmO: staged O, a warp's rows)
    const bool model = MODEL_ONLY || s->D != D || attn_shape_asks(s, 0) != 0;
    if (model) {
        ATTN_TRY(tensor_maps_model(&tmQ, &tmK, &tmV, &tmO, s, a, BR, BC, WARP_ROWS));
    } else {
        ATTN_TRY(tensor_map_plain(&tmQ, a->Q, s, BR));
        ATTN_TRY(tensor_map_plain(&tmK, a->K, s, BC));
        ATTN_TRY(tensor_map_plain(&tmV, a->V, s, BC));
        ATTN_TRY(tensor_map_plain(&tmO, a->O, s, WARP_ROWS));
    }
    const int smem = smem_bytes<D, C, BC>();
    const key_rule keys = key_rule_of(s, true);  // (the MODEL kernels' window; causal: (-1, 0))
    const bool softcap = s->softcap > 0.f;
    const kernel_fn kernel = kernel_for<D, C, BC, SCHEDULE, MODEL_ONLY, LEAN>(
        a->split.splits > 1, model, s->bf16, s->varlen.cu_seqlens_q != NULL,
        !a->lean || keys.left >= 0 || softcap);
    ATTN_TRY(kernel_smem_limit((const void *)kernel, smem));  // once per kernel and device
    const int works = s->B * s->H * ceil_div(s->N, BR) * a->split.splits;
    const int blocks = a->persistent_blocks > 0 && a->persistent_blocks < works
                           ? a->persistent_blocks
                           : works;  // (with one block per work tile the counter is never read)
    if (blocks < works) ATTN_TRY(cudaMemsetAsync(a->next_work, 0, sizeof(int), a->stream));
    problem pb;
    memset(&pb, 0, sizeof pb);
    pb.N = s->N, pb.N_k = s->N_k;
    if (model)
        pb.o_cols = s->D;  // (MODEL: in causal's place)
    else
        pb.causal = s->causal;
    pb.window_left = keys.left, pb.window_right = keys.right;
    pb.splits = a->split.splits, pb.split_tiles = a->split.split_tiles;
    pb.H = s->H;
    pb.q_tiles = ceil_div(s->N, BR), pb.works_per_head = pb.q_tiles * pb.splits;
    pb.per_head = make_fast_divisor((uint32_t)pb.works_per_head);
    pb.per_query_tile = make_fast_divisor((uint32_t)pb.splits);
    pb.per_batch = make_fast_divisor((uint32_t)s->H);
    pb.per_kv_head = make_fast_divisor((uint32_t)(s->H / s->H_kv));
    // log2(e) folded into the scale. Softcap c: the kernel's scores are tanh(q.k scale / c)
    // (cap_scores), and c log2(e) makes them the capped scores in the log2 domain.
    pb.scale_log2 = (softcap ? s->softcap : s->scale) * LOG2E;
    pb.softcap_scale = softcap ? s->scale / s->softcap : 0.f;
    pb.O = a->O, pb.lse = a->lse;
    pb.o_batch = s->o.batch, pb.o_head = s->o.head, pb.o_row = (int)s->o.row;
    pb.rows = (long long)s->B * s->H * s->N;
    pb.O_part = a->O_part;
    pb.lse_part = a->O_part ? a->O_part + (size_t)pb.splits * pb.rows * D : NULL;
    if (s->varlen.cu_seqlens_q) pb.varlen = s->varlen, pb.packed = 1;  // (unsplit: plan_splits)
    pb.section_shift = a->split.section_shift;
    cudaLaunchAttribute attr;
    const cudaLaunchConfig_t config = launch_config(blocks, block_threads<C>(), smem, a, &attr);
    ATTN_TRY(cudaLaunchKernelEx(&config, kernel, tmQ, tmK, tmV, tmO, pb, works, a->next_work));
    if (pb.splits == 1) return cudaSuccess;

    // Merge the key ranges (stage 5's merge; causal and windowed query tiles have fewer ranges).
    const combine_params cp = {pb.O_part, pb.lse_part, a->O,       a->lse,    pb.rows,
                               s->N,      BR,          BC,         pb.splits, pb.split_tiles,
                               keys,      s->H,        s->o.batch, s->o.head, (int)s->o.row};
    // O_part has the kernel's D columns a row; the MODEL kernels' merge writes the shape's D.
    const unsigned merge_blocks = (unsigned)ceil_div(pb.rows, combine_rows_per_block<D>());
    const cudaLaunchConfig_t merge = launch_config(merge_blocks, COMBINE_THREADS, 0, a, &attr);
    if (model) {
        void (*const merge_cols)(const combine_params, int) =
            s->bf16 ? combine_cols_kernel_pdl<D, true> : combine_cols_kernel_pdl<D, false>;
        ATTN_TRY(cudaLaunchKernelEx(&merge, merge_cols, cp, s->D));
        return cudaSuccess;
    }
    if constexpr (!MODEL_ONLY)
        ATTN_TRY(cudaLaunchKernelEx(&merge, combine_kernel_pdl<D, false>, cp));
    return cudaSuccess;
}

// The kernel of the plan's configuration (config_for()), one of KERNEL_CONFIGS, with SCHEDULE (a
// model_only one has the default schedule alone).
template <int SCHEDULE, int I = 0>
static cudaError_t launch_schedule(const attn_shape *s, const launch_args *a) {
    if constexpr (I < KERNEL_CONFIG_COUNT) {
        constexpr kernel_config k = KERNEL_CONFIGS[I];
        if constexpr (!k.model_only || SCHEDULE == SCHEDULE_PINGPONG) {
            if (same_config(a->split.config, k))
                return launch<k.D, k.consumers, k.key_tile, SCHEDULE, k.model_only, k.lean>(s, a);
        }
        return launch_schedule<SCHEDULE, I + 1>(s, a);
    } else {
        (void)s, (void)a;
        return cudaErrorInvalidConfiguration;  // attention_unsupported() rejects these
    }
}
