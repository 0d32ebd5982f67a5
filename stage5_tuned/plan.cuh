/*
 * stage5_tuned/plan.cuh: what the launcher decides before a launch; host code only.
 *
 * Part of attention.cu's one translation unit: attention.cu includes it after the kernels,
 * whose tunables and templates it uses (it is no header for anything else). For a shape on a
 * device, forward() needs
 *  - the tiles for this head dim, code arch and shared memory (choose_tiles);
 *  - the kernel instantiation of those tiles and the variant (kernel_for), made ready on this
 *    device once (common/device/kernel_cache.cuh: its shared-memory limit, its blocks an SM);
 *  - how many key ranges each query tile's keys are cut into (split-KV: choose_splits in
 *    common/device/split_kv.cuh, from a simulation of the block scheduler's waves);
 *  - all of that once per shape and device, not per launch (make_plan: the plan cache).
 */

#include <pthread.h>
#include <stdlib.h>

#include "device/kernel_cache.cuh"  // current_device, cache_lock, kernel_versions, kernel_blocks_per_sm

/* ---- tiles ----------------------------------------------------------------------------------- */

// D: a compiled head dim (compiled_d); its tiles' rows are row_halves(D) wide.
static size_t smem_bytes(tile_config c, int D) {
    return (size_t)(c.BR + 2 * c.BC) * row_halves(D) * sizeof(__half);
}

// Blocks of `smem` bytes that fit in one SM's shared memory when a block may use at most
// `smem_limit` (an SM holds the per-block limit + 1 KB, and each block reserves 1 KB more).
// This is what a T4 or L4 fits, also when --smem-limit imitates one on a larger GPU.
static int blocks_fit(size_t smem, size_t smem_limit) {
    return (int)((smem_limit + 1024) / (smem + 1024));
}

// Tiles for this compiled head dim, code arch and shared-memory limit. sm_75 code: sm75_tiles.
// sm_80+: windows and softcap, window_tiles; D = 64, 128, the first that fits of sm_80 (two blocks
// per SM; D = 64: one will do), small-smem sm_80 (D = 128), SM75; D = 96 and 256 (MODEL kernels
// only), SM80_D128 and SM80_D256 where they fit, else window_tiles. BR = 0 if none fits.
static tile_config choose_tiles(int D, int arch, size_t smem_limit, bool window_softcap = false) {
    const tile_config none = {0, 0, 0}, sm75 = sm75_tiles(D), w = window_tiles(D);
    if (arch < 80) return smem_bytes(sm75, D) <= smem_limit ? sm75 : none;
    if (window_softcap) return smem_bytes(w, D) <= smem_limit ? w : none;
    if (D == 96 || D == 256) {  // one tile config, else the window kernels' (which run any shape)
        const tile_config c = D == 96 ? SM80_D128 : SM80_D256;
        if (smem_bytes(c, D) <= smem_limit) return c;
        return smem_bytes(w, D) <= smem_limit ? w : none;
    }
    const tile_config c = D == 64 ? SM80_D64 : SM80_D128;
    if (blocks_fit(smem_bytes(c, D), smem_limit) >= 2 ||
        (D == 64 && smem_bytes(c, D) <= smem_limit))
        return c;
    if (D == 128 && smem_bytes(SMALL_SMEM_D128, D) <= smem_limit) return SMALL_SMEM_D128;
    return smem_bytes(SM75, D) <= smem_limit ? SM75 : none;
}

static bool same_tiles(tile_config a, tile_config b) {
    return a.BR == b.BR && a.BC == b.BC && a.WARPS == b.WARPS;
}

/* ---- the kernel cache ------------------------------------------------------------------------ */

// What the driver is asked once per device (or per kernel and device), not per launch: a
// launch of FA2 pays for none of it, and host time between the timing events counts. The
// device's index (current_device), the lock (cache_lock), the kernels' code versions
// (kernel_versions), shared-memory limits (kernel_smem_limit) and blocks an SM
// (kernel_blocks_per_sm) come from common/device/kernel_cache.cuh, which stages 6 and 7 share.

typedef void (*attention_fn)(fwd_params);
typedef void (*attention_model_fn)(fwd_params, model_layout);

// One kernel instantiation: a plain one, fn, or a MODEL one, model (how many of its blocks an SM
// holds: kernel_blocks_per_sm, remembered per kernel and device in kernel_cache.cuh).
typedef struct {
    attention_fn fn;
    attention_model_fn model;
} kernel_entry;

static const void *kernel_code(const kernel_entry *k) {
    return k->fn ? (const void *)k->fn : (const void *)k->model;
}

template <int D, int BR, int BC, int WARPS, bool SWIZZLE, bool PIPELINED, bool SKIP, bool LAZY>
static kernel_entry *entry() {
    static kernel_entry e = {attention_kernel<D, BR, BC, WARPS, SWIZZLE, PIPELINED, SKIP, LAZY>,
                             NULL};
    return &e;
}
// A MODEL instantiation, for unpacked shapes or packed batches (PACKED: their own kernels, so that
// the unpacked ones keep the uniform datapath; sequence_of_block).
template <int D, int BR, int BC, int WARPS, bool BF16, bool WINDOW_SOFTCAP>
static kernel_entry *model_entry(bool packed) {
    static kernel_entry unpacked = {
        NULL, attention_kernel_model<D, BR, BC, WARPS, BF16, WINDOW_SOFTCAP, false>};
    static kernel_entry each_sequence = {
        NULL, attention_kernel_model<D, BR, BC, WARPS, BF16, WINDOW_SOFTCAP, true>};
    return packed ? &each_sequence : &unpacked;
}

// What models feed (model: bf16, GQA, strides, N_k != N, a head dim other than 64 and 128) runs in
// the default tiles' MODEL kernels, eager rescaling, bf16 on sm_80 and newer only
// (attention_unsupported says so): sm_75's tiles (sm75_tiles) have no bf16 kernel.
template <int D, int BR, int BC, int WARPS>
static kernel_entry *model_variant_entry(bool bf16, bool packed) {
    if (bf16) {
        constexpr tile_config T = sm75_tiles(D);
        if constexpr (BR == T.BR && BC == T.BC && WARPS == T.WARPS) {
            return NULL;
        } else {
            return model_entry<D, BR, BC, WARPS, true, false>(packed);
        }
    }
    return model_entry<D, BR, BC, WARPS, false, false>(packed);
}

// The variants are instantiations of the same kernel with one lesson switched off (D = 64, 128).
template <int D, int BR, int BC, int WARPS>
static kernel_entry *variant_entry(int variant, bool lazy, bool model, bool bf16, bool packed) {
    if (model) return model_variant_entry<D, BR, BC, WARPS>(bf16, packed);
    switch (variant) {
        case VARIANT_NOSWIZZLE:
            return entry<D, BR, BC, WARPS, false, true, true, false>();
        case VARIANT_SINGLE_STAGE:
            return entry<D, BR, BC, WARPS, true, false, true, false>();
        case VARIANT_NOSKIP:
            return entry<D, BR, BC, WARPS, true, true, false, false>();
        default:  // default, nosplit, eager_rescale, lazy_rescale: the launcher picks LAZY
            return lazy ? entry<D, BR, BC, WARPS, true, true, true, true>()
                        : entry<D, BR, BC, WARPS, true, true, true, false>();
    }
}

#define VARIANT_ENTRY(D_, C) \
    variant_entry<D_, C.BR, C.BC, C.WARPS>(variant, lazy, model, bf16, packed)
#define MODEL_ENTRY(D_, C) model_variant_entry<D_, C.BR, C.BC, C.WARPS>(bf16, packed)

// Local windows and softcap: MODEL kernels of their own, window_tiles (sm_80+) or sm75_tiles
// (fp16), eager rescaling.
template <int D>
static kernel_entry *window_softcap_entry(tile_config c, bool bf16, bool packed) {
    constexpr tile_config W = window_tiles(D);
    if (same_tiles(c, W))
        return bf16 ? model_entry<D, W.BR, W.BC, W.WARPS, true, true>(packed)
                    : model_entry<D, W.BR, W.BC, W.WARPS, false, true>(packed);
    constexpr tile_config T = sm75_tiles(D);
    if (same_tiles(c, T) && !bf16) return model_entry<D, T.BR, T.BC, T.WARPS, false, true>(packed);
    return NULL;
}

// D: the compiled head dim (compiled_d); 96 and 256 only through the MODEL kernels (model), as
// packed batches (packed: a MODEL shape).
static kernel_entry *kernel_for(int D, tile_config c, int variant, bool lazy, bool model, bool bf16,
                                bool window_softcap, bool packed) {
    const bool new_d = D == 96 || D == 256;  // MODEL kernels only
    if (window_softcap || (new_d && same_tiles(c, window_tiles(D)))) {
        switch (D) {
            case 64:
                return window_softcap_entry<64>(c, bf16, packed);
            case 96:
                return window_softcap_entry<96>(c, bf16, packed);
            case 128:
                return window_softcap_entry<128>(c, bf16, packed);
            default:
                return window_softcap_entry<256>(c, bf16, packed);
        }
    }
    if (new_d && !model) return NULL;
    if (D == 96 && same_tiles(c, SM80_D128)) return MODEL_ENTRY(96, SM80_D128);
    if (D == 96 && same_tiles(c, SM75)) return MODEL_ENTRY(96, SM75);
    if (D == 256 && same_tiles(c, SM80_D256)) return MODEL_ENTRY(256, SM80_D256);
    if (D == 256 && same_tiles(c, SM75_D256)) return MODEL_ENTRY(256, SM75_D256);
    if (D == 64 && same_tiles(c, SM80_D64)) return VARIANT_ENTRY(64, SM80_D64);
    if (D == 64 && same_tiles(c, SM75)) return VARIANT_ENTRY(64, SM75);
    if (D == 128 && same_tiles(c, SM80_D128)) return VARIANT_ENTRY(128, SM80_D128);
    if (D == 128 && same_tiles(c, SMALL_SMEM_D128)) return VARIANT_ENTRY(128, SMALL_SMEM_D128);
    if (D == 128 && same_tiles(c, SM75)) return VARIANT_ENTRY(128, SM75);
    return NULL;
}

// The PTX architecture the kernels were compiled for on this device (75 for a compute_75 PTX
// build JIT-compiled on an H100): that, not the device, decides whether cp.async is there.
// Asked once per device (kernel_versions).
static cudaError_t kernel_arch(int *arch) {
    int binary = 0;
    *arch = 0;
    return kernel_versions(
        (const void *)attention_kernel<64, SM75.BR, SM75.BC, SM75.WARPS, true, true, true, false>,
        arch, &binary);
}

// What a key range costs besides its key tiles, in key tiles (choose_splits): a prologue (Q and
// its first K tile) and an fp32 epilogue, an estimate: about 48 KB of loads and 64 KB of stores
// against 32 KB of K and V per tile.
constexpr double SPLIT_OVERHEAD_TILES = 1.0;

/* ---- the launch plan ------------------------------------------------------------------------- */

// Everything forward() decides before launching, computed once per shape and device (the last
// one is kept; a benchmark launches the same shape many times).
typedef struct {
    attn_shape shape;  // key: shape, device, variant, limits, whether a workspace is given
    int device, variant, sm_count, allow_split;
    size_t smem_limit;
    tile_config tiles;  // value
    kernel_entry *kernel;
    size_t smem;
    int splits, split_tiles;
    bool skip;  // key tiles outside the causal diagonal or the window are skipped (not noskip)
    int model;  // the shape asks more than the plain case (attn_shape_asks) or its D is not 64 or
                // 128: MODEL kernels
    int d;      // the compiled head dim it runs in (compiled_d)
} fwd_plan;

// MODEL kernels: what models feed beyond the plain case, and every head dim but 64 and 128.
static bool plan_is_model(const attn_shape *s) {
    return attn_shape_asks(s, 0) != 0 || (s->D != 64 && s->D != 128);
}

static bool same_key(const fwd_plan *a, const fwd_plan *b) {
    return a->shape.B == b->shape.B && a->shape.H == b->shape.H && a->shape.N == b->shape.N &&
           a->shape.N_k == b->shape.N_k && a->shape.H_kv == b->shape.H_kv &&
           a->shape.bf16 == b->shape.bf16 && a->model == b->model && a->shape.D == b->shape.D &&
           a->shape.causal == b->shape.causal && a->shape.local == b->shape.local &&
           a->shape.window_left == b->shape.window_left &&
           a->shape.window_right == b->shape.window_right && a->shape.softcap == b->shape.softcap &&
           a->device == b->device && a->variant == b->variant && a->sm_count == b->sm_count &&
           a->allow_split == b->allow_split && a->smem_limit == b->smem_limit &&
           !a->shape.varlen.cu_seqlens_q == !b->shape.varlen.cu_seqlens_q;
}

static cudaError_t make_plan(const attn_shape *s, const attn_device *dev, int variant,
                             bool allow_split, fwd_plan *plan) {
    static fwd_plan last;  // last.kernel == NULL: none yet
    memset(plan, 0, sizeof *plan);
    plan->shape = *s, plan->shape.scale = 0.f;  // the scale does not change the plan
    plan->variant = variant, plan->sm_count = dev->sm_count, plan->allow_split = allow_split;
    plan->smem_limit = dev->smem_per_block;
    plan->model = plan_is_model(s);
    plan->d = compiled_d(s->D);
    ATTN_TRY(current_device(&plan->device));
    pthread_mutex_lock(&cache_lock);
    const bool hit = last.kernel && same_key(&last, plan);
    if (hit) *plan = last;
    pthread_mutex_unlock(&cache_lock);
    if (hit) return cudaSuccess;

    int arch = 0;
    ATTN_TRY(kernel_arch(&arch));
    const bool window_softcap = s->local || s->softcap > 0.f;
    const tile_config c = choose_tiles(plan->d, arch, dev->smem_per_block, window_softcap);
    const size_t smem = smem_bytes(c, plan->d);
    const int threads = c.WARPS * WARP_SIZE;
    const bool packed = s->varlen.cu_seqlens_q != NULL;
    kernel_entry *k =
        kernel_for(plan->d, c, variant, false, plan->model, s->bf16, window_softcap, packed);
    if (!k) return cudaErrorInvalidConfiguration;  // attention_unsupported() rejects these
    int per_sm = 1;  // (kernel_blocks_per_sm also raises its shared-memory limit)
    ATTN_TRY(kernel_blocks_per_sm(kernel_code(k), threads, (int)smem, &per_sm));
    const int fit = blocks_fit(smem, dev->smem_per_block);  // an imitated T4 or L4 fits fewer
    per_sm = fit < per_sm ? (fit > 0 ? fit : 1) : per_sm;

    plan->tiles = c, plan->smem = smem;
    plan->skip = variant != VARIANT_NOSKIP;
    plan->split_tiles = ceil_div(s->N_k, c.BC), plan->splits = 1;
    // A packed batch is not split: split-KV's workspace and merge index [B * H, N] rows, B times
    // the longest sequence's N, where a packed batch's tensors hold total_q rows (a thousand short
    // documents beside one long one would need a thousand long ones' workspace).
    if (allow_split && !packed && variant != VARIANT_NOSPLIT && dev->sm_count > 0) {
        plan->splits =
            choose_splits(s, c.BR, c.BC, key_rule_of(s, plan->skip), dev->sm_count * per_sm,
                          SPLIT_OVERHEAD_TILES, &plan->split_tiles);
    }
    // Lazy rescaling pays from LAZY_MIN_N keys per block on (eager_rescale: never).
    const long long keys = (long long)plan->split_tiles * c.BC;
    const bool lazy = variant == VARIANT_LAZY_RESCALE ||
                      ((variant == VARIANT_DEFAULT || variant == VARIANT_NOSPLIT) &&
                       (keys < s->N_k ? keys : s->N_k) >= LAZY_MIN_N);
    plan->kernel =
        kernel_for(plan->d, c, variant, lazy, plan->model, s->bf16, window_softcap, packed);
    ATTN_TRY(kernel_smem_limit(kernel_code(plan->kernel), (int)smem));
    pthread_mutex_lock(&cache_lock);
    last = *plan;
    pthread_mutex_unlock(&cache_lock);
    return cudaSuccess;
}
