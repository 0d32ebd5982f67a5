/*
 * stage8_hopper_backward/launch.cuh: the host side: the tensor maps, the workspace, and
 * backward(), which runs the preprocess (D_i, LSE_i; dQ_acc zeroed), the main kernel, and dQ's
 * conversion (common/device/backward_prepost.cuh's passes, shared with stage 7), those after the
 * preprocess by programmatic dependent launch (PDL; the preprocess too where the walks split), but
 * in variant nopdl.
 */
#pragma once

#include <limits.h>
#include <string.h>

#include "device/kernel_cache.cuh"  // kernel_versions, kernel_smem_limit: once per device
#include "device/tensor_map.cuh"    // tensor_map_slabs
#include "kernel.cuh"

// attention.cu's: NULL when the stage runs this shape here, else why not.
static const char *stage_unsupported(const attn_shape *s, const attn_device *dev, int variant);

// The query rows of a step of the kernel that runs head dim D (compiled_d).
static int qrows_of(int D) {
    const int d = compiled_d(D);
    return d == 64 ? qrows<64>() : d == 96 ? qrows<96>() : d == 128 ? qrows<128>() : qrows<256>();
}
// ... and its keys a block.
static int block_keys_of(int D) {
    return compiled_d(D) >= SPLIT_D_MIN ? block_keys<256>() : block_keys<128>();
}

// Workspace (bwd_params_of): lse2 and Dsum (bwd_pad_rows floats each), dQ_acc (bwd_acc_rows rows
// of D floats; tiled, bwd_pad_rows rows of the kernel's D), then (variant deterministic) dq_turn,
// an int per qrows rows of lse2 (dq_turns_of), then (a split walk) dkv_part (dkv_part_bytes),
// each at a multiple of WORKSPACE_ALIGN bytes. A packed batch's scale with its total queries plus
// a ROW_PAD per sequence (backward_prepost.cuh), not with B times the longest.
// dQ_acc's columns in the tiled layout (config.cuh, dq_tiled: the kernels that stage dQ in
// 8-float slabs), or 0 (rows of s->D floats).
template <int D>
static bool dq_tiled_at(int variant) {
    return variant == VARIANT_ATOMICS         ? dq_tiled<D, DQ_BY_ATOMICS>()
           : variant == VARIANT_DETERMINISTIC ? dq_tiled<D, DQ_BY_BULK_IN_TURNS>()
                                              : dq_tiled<D, DQ_BY_BULK>();  // (and nolean)
}
// A tile's row holds the kernel's D where the dQ warp adds whole parts by bulk copies (a part is
// whole slabs of the compiled D), the tensors' D where the consumers add from the registers
// (D = 256's kernels, which add no column past it: D = 136 to 248 keep no idle slabs).
static int dq_tiled_cols(const attn_shape *s, int variant) {
    const int d = compiled_d(s->D);
    const bool tiled = d == 64    ? dq_tiled_at<64>(variant)
                       : d == 96  ? dq_tiled_at<96>(variant)
                       : d == 128 ? dq_tiled_at<128>(variant)
                                  : dq_tiled_at<256>(variant);
    return !tiled ? 0 : d >= SPLIT_D_MIN ? s->D : d;
}
static size_t dq_acc_bytes(const attn_shape *s, int variant) {
    const int tiled = dq_tiled_cols(s, variant);
    return tiled ? bwd_pad_rows(s) * tiled * sizeof(float) : bwd_acc_rows(s) * s->D * sizeof(float);
}
static size_t dq_turns(const attn_shape *s) {
    return bwd_pad_rows(s) / qrows_of(s->D);  // (ROW_PAD: a multiple of qrows)
}
static size_t dq_turn_bytes(const attn_shape *s, int variant) {  // (variant deterministic's)
    return variant == VARIANT_DETERMINISTIC ? dq_turns(s) * sizeof(int) : 0;
}
// The shares of a split walk (backward_prepost.cuh: walk_shares_for), 1 where the walks stay whole:
// the deterministic variant (its dQ turns follow whole walks), variant nosplit, a packed batch, and
// every grid that fills more than half of the multiprocessors. A share is a range of the query
// tiles (schedule.cuh's walk_tiles_of): at most as many shares as tiles, and the longest walk,
// every query tile for each of the group's heads, sets the shares' length (a mask's shorter walks
// get shorter shares).
static int walk_shares_of(const attn_shape *s, const attn_device *dev, int variant) {
    if (variant == VARIANT_DETERMINISTIC || variant == VARIANT_NOSPLIT || s->varlen.cu_seqlens_q)
        return 1;
    return walk_shares_for(s, block_keys_of(s->D), qrows_of(s->D), dev->sm_count);
}
// The variants that run a persistent grid where it pays (persistent_grid): the default, and those
// that switch another lesson off (nosplit, nopdl); variant nolean runs none of the lean kernels
// that have one.
static bool persistent_variant(int variant) {
    return variant == VARIANT_DEFAULT || variant == VARIANT_NOSPLIT || variant == VARIANT_NOPDL;
}
// A persistent grid's counter (schedule.cuh's tile_counter): an int, in those variants' workspace.
static size_t tile_counter_bytes(int variant) {
    return persistent_variant(variant) ? sizeof(int) : 0;
}

// Whether the default way's lean kernel runs a persistent grid (config.cuh, has_persistent):
// more work tiles than multiprocessors, and no packed batch, no split walk; a work tile's steps
// (H / H_kv times N / qrows) a short walk (config.cuh, persistent_steps_max), so also fewer than
// the load warp counts (producer.cuh, LOAD_STEPS_MAX, 2^23).
template <int D>
static bool persistent_grid(const attn_shape *s, const attn_device *dev, int variant, bool lean,
                            int shares, long long work_tiles) {
    const long long walk_steps = (long long)(s->H / s->H_kv) * ceil_div(s->N, qrows<D>());
    return has_persistent<D, DQ_BY_BULK, false>() && persistent_variant(variant) && lean &&
           shares == 1 && !s->varlen.cu_seqlens_q && work_tiles > dev->sm_count &&
           walk_steps <= persistent_steps_max<D>() && walk_steps < LOAD_STEPS_MAX;
}

// How a call's walks split (schedule.cuh's bwd_problem): every work tile's in `shares` (the grid's
// z) where the blocks fill at most half of the multiprocessors (walk_shares_of), else, where a
// grid of whole walks of one length (no mask) ends on a part of a wave, the last work tiles'
// (backward_prepost.cuh's tail_split_for; a 1-D grid) where the kernel has one of its own
// (config.cuh's has_tail_split: the default way's lean kernels at D = 64 and 128), but where the
// grid is persistent (its blocks take the work tiles as they free up) and in the variants that
// split no walk; none elsewhere. The work tiles are those of the grid of whole walks, in its order:
// (key tile, (batch, key/value head)), the key tile first.
typedef struct {
    int shares;       // every work tile's walk's (1: none)
    tail_split tail;  // the tail split ({work tiles, 1}: none)
} walk_split;
template <int D>
static walk_split walk_split_at(const attn_shape *s, const attn_device *dev, int variant) {
    const long long key_tiles = ceil_div(s->N_k, block_keys<D>()),
                    work_tiles = key_tiles * s->B * s->H_kv;
    walk_split w = {walk_shares_of(s, dev, variant), {work_tiles, 1}};
    const key_rule keys = key_rule_of(s, true);
    const bool lean = variant != VARIANT_NOLEAN && keys.left < 0 && !(s->softcap > 0.f);
    if (w.shares > 1 || variant == VARIANT_DETERMINISTIC || variant == VARIANT_NOSPLIT ||
        s->varlen.cu_seqlens_q || keys.left >= 0 || keys.right >= 0 ||
        !(lean && variant != VARIANT_ATOMICS && has_tail_split<D, DQ_BY_BULK, false>()) ||
        persistent_grid<D>(s, dev, variant, lean, w.shares, work_tiles))
        return w;
    const long long query_tiles = ceil_div(s->N, qrows<D>());
    w.tail = tail_split_for(work_tiles, (long long)(s->H / s->H_kv) * query_tiles, query_tiles,
                            dev->sm_count);
    if (w.tail.first + (work_tiles - w.tail.first) * w.tail.shares >= INT_MAX)  // (its blocks)
        w.tail = {work_tiles, 1};
    return w;
}
static walk_split walk_split_of(const attn_shape *s, const attn_device *dev, int variant) {
    const int d = compiled_d(s->D);
    return d == 64    ? walk_split_at<64>(s, dev, variant)
           : d == 96  ? walk_split_at<96>(s, dev, variant)
           : d == 128 ? walk_split_at<128>(s, dev, variant)
                      : walk_split_at<256>(s, dev, variant);
}
// A split walk's dkv_part (schedule.cuh's bwd_problem): each share's dK and dV of every key tile's
// keys, or of a tail split's from its first work tile on, in floats of the kernel's D.
static size_t dkv_part_bytes(const attn_shape *s, const walk_split &w) {
    const int keys = block_keys_of(s->D), d = compiled_d(s->D);
    return w.shares > 1
               ? dkv_part_bytes_for(s, w.shares, keys, d)
               : dkv_part_bytes_for(s, w.tail.shares, keys, d, (size_t)w.tail.first * keys);
}
static size_t backward_workspace_bytes(const attn_shape *s, const attn_device *dev, int variant) {
    return 2 * aligned(bwd_pad_rows(s) * sizeof(float)) + aligned(dq_acc_bytes(s, variant)) +
           aligned(dq_turn_bytes(s, variant)) +
           aligned(dkv_part_bytes(s, walk_split_of(s, dev, variant))) +
           aligned(tile_counter_bytes(variant));
}

// The map of a 16-bit operand (tensor_map_slabs): [B, heads, rows, D] by its layout, or, packed,
// [total, heads, D] as one batch of `total` rows (its batch stride unused), where a sequence's
// rows start at its first row (bwd_sequence_of; the kernel's coordinates add it).
static cudaError_t operand_map(CUtensorMap *map, const void *base, const attn_shape *s, int heads,
                               int rows, int total, const attn_layout *l, int box_rows) {
    if (!s->varlen.cu_seqlens_q) return tensor_map_slabs(map, base, s, heads, rows, l, box_rows);
    attn_shape one = *s;
    one.B = 1;
    return tensor_map_slabs(map, base, &one, heads, total, l, box_rows);
}

typedef void (*kernel_fn)(const CUtensorMap, const CUtensorMap, const CUtensorMap,
                          const CUtensorMap, const CUtensorMap, const CUtensorMap,
                          const bwd_problem);

// The main kernel for head dim D, storage type BF16 and the variant's way of adding dQ (none for
// variant atomics where it does not take D, nor for variant deterministic at D = 256:
// stage_unsupported refuses them first). At D = 256 (D = 136 to 256) the default variant adds as
// atomics does (config.cuh: no staging tile fits). `lean` (a shape without a window's left bound
// or softcap, and not variant nolean): the default way's kernel compiled without EXTRAS
// (kernel.cuh), the only way that has one (at D = 256 variant atomics' too); `capped` (a softcap,
// not variant nolean): the same way's kernel compiled with the softcap branch alone (CAPPED).
// *waits: whether the kernel chosen waits for the preprocess itself (config.cuh's waits_by_pdl:
// launched with PDL only then).
// `persistent` (persistent_grid): the lean kernel with a persistent grid; `tail` (a tail split,
// walk_split_at): the lean kernel with one.
template <int D, bool BF16, dq_way DQ>
static kernel_fn default_way_kernel(bool lean, bool capped, bool persistent, bool tail,
                                    bool *waits) {
    *waits = lean ? waits_by_pdl<D, false>() : waits_by_pdl<D, true>();  // (capped: not lean)
    if (capped) return backward_kernel<D, BF16, DQ, true, true>;
    if constexpr (has_persistent<D, DQ, false>())
        if (lean && persistent) return backward_kernel<D, BF16, DQ, false, false, true>;
    if constexpr (has_tail_split<D, DQ, false>())
        if (lean && tail) return backward_kernel<D, BF16, DQ, false, false, false, true>;
    return lean ? backward_kernel<D, BF16, DQ, false> : backward_kernel<D, BF16, DQ>;
}
template <int D, bool BF16>
static kernel_fn kernel_for(int variant, bool lean, bool capped, bool persistent, bool tail,
                            bool *waits) {
    *waits = waits_by_pdl<D, true>();  // (the kernels with EXTRAS)
    if constexpr (splits_dkv<D>()) {
        if (variant == VARIANT_DETERMINISTIC) return NULL;
        return default_way_kernel<D, BF16, DQ_BY_ATOMICS>(lean, capped, false, false, waits);
    } else {
        if (variant == VARIANT_ATOMICS) {
            if constexpr (takes_atomics<D>()) return backward_kernel<D, BF16, DQ_BY_ATOMICS>;
            return NULL;
        }
        if (variant == VARIANT_DETERMINISTIC) return backward_kernel<D, BF16, DQ_BY_BULK_IN_TURNS>;
        return default_way_kernel<D, BF16, DQ_BY_BULK>(lean, capped, persistent, tail, waits);
    }
}

// The passes before and after for head dim D: at D = 64, 128 and 256 the tensors' own where
// s->D = D; every other head dim runs the TAIL instances of tail_pass_d<D>() (the preprocess's
// lanes a row: a power of two, for its shuffles), which read and write s->D columns: D = 128's
// up to 128 (16 lanes a row), D = 256's for D = 136 to 248 (32 lanes): two pairs of kernels
// each, not one a D.
constexpr int TAIL_PASS_D = 128;
template <int D>
constexpr int tail_pass_d() {
    return splits_dkv<D>() ? D : TAIL_PASS_D;
}
template <int D>
constexpr bool tiles_dq_acc() {  // a variant's kernels of head dim D keep dQ_acc tiled
    return dq_tiled<D, DQ_BY_BULK>() || dq_tiled<D, DQ_BY_BULK_IN_TURNS>() ||
           dq_tiled<D, DQ_BY_ATOMICS>();
}
template <int D>
constexpr bool rows_dq_acc() {  // a variant's kernels of head dim D keep it in rows of D floats
    return !dq_tiled<D, DQ_BY_BULK>() || !dq_tiled<D, DQ_BY_BULK_IN_TURNS>() ||
           (takes_atomics<D>() && !dq_tiled<D, DQ_BY_ATOMICS>());
}
// The passes' TILE_ROWS where a call's dQ_acc lies tiled (p.dq_tiled, set by dq_tiled_cols): the
// kernel's query tile, for the head dims whose kernels tile it; 0 elsewhere. Each pass runs its
// instance of D (OWN) or the TAIL one, tiled or in rows, each instantiated only for the head dims
// whose kernels lay dQ_acc out so (D = 256's all tile it).
template <int D>
constexpr int pass_tile_rows() {
    return tiles_dq_acc<D>() ? qrows<D>() : 0;
}
// The two passes' instances for one call, chosen once for both: the preprocess and the
// conversion of the same head dim (pass_d: the preprocess's grid), TAIL and TILE_ROWS.
typedef void (*pass_kernel)(const bwd_params);
typedef struct {
    pass_kernel preprocess, convert;
    int pass_d;
} pass_pair;
template <int PASS_D, bool BF16, bool TAIL, int TILE_ROWS>
static pass_pair pass_pair_of() {
    return {preprocess_kernel<PASS_D, BF16, TAIL, TILE_ROWS>,
            dq_convert_kernel<PASS_D, BF16, TAIL, TILE_ROWS>, PASS_D};
}
template <int D, bool BF16>
static pass_pair passes_for(const attn_shape *s, const bwd_params &p) {
    constexpr int OWN = D % SLAB_COLS == 0 ? D : TAIL_PASS_D;  // D = 96: none of its own
    constexpr int TAIL_D = tail_pass_d<D>(), TILED = pass_tile_rows<D>();
    if (p.dq_tiled) {
        if constexpr (TILED > 0)
            return s->D == OWN ? pass_pair_of<OWN, BF16, false, TILED>()
                               : pass_pair_of<TAIL_D, BF16, true, TILED>();
    } else if constexpr (rows_dq_acc<D>()) {
        return s->D == OWN ? pass_pair_of<OWN, BF16, false, 0>()
                           : pass_pair_of<TAIL_D, BF16, true, 0>();
    }
    return {NULL, NULL, 0};  // (a layout no kernel of D keeps: unreachable)
}

// The heads a section of the grid (schedule.cuh's block_head_index), as a shift: where a mask
// with a right bound (causal) makes a head's blocks of different lengths, the default and atomics
// variants start the longest of 2^shift heads first; the most heads, a power of two dividing
// B H_kv, whose rows' Q, dO (2 D bytes each), dQ_acc (4 D), LSE_i and D_i (4 each) fit
// L2_SECTION_BYTES. 0 elsewhere: no right bound (blocks of one length), a packed batch, and the
// deterministic variant (its diagonal order).
static int section_shift_of(const attn_shape *s, int variant, key_rule keys) {
    if (variant == VARIANT_DETERMINISTIC || keys.right < 0 || s->varlen.cu_seqlens_q) return 0;
    const size_t row_bytes =
        (size_t)s->D * (2 * sizeof(__half) + sizeof(float)) + 2 * sizeof(float);
    const size_t head_bytes = (size_t)(s->H / s->H_kv) * s->N * row_bytes;
    return section_shift_for(s->B * s->H_kv, head_bytes, L2_SECTION_BYTES);
}

// The three passes for head dim D (compiled; the tensors' s->D <= D) and storage type BF16.
template <int D, bool BF16>
static cudaError_t enqueue_backward(const attn_shape *s, const attn_device *dev,
                                    const bwd_params &p, int *dq_turn, float *dkv_part,
                                    int *tile_counter, int variant, cudaStream_t stream) {
    // (packed: the preprocess's grid is planned with the longest sequence; its rows past a
    // sequence's padding do nothing)
    const size_t rows = (size_t)s->B * s->H * p.N_pad;
    const pass_pair passes = passes_for<D, BF16>(s, p);
    if (!passes.preprocess) return cudaErrorInvalidConfiguration;
    // The kernels after the preprocess launched with PDL (but variant nopdl): placed while the
    // one ahead of it ends, each waits for it before touching global memory
    // (wait_for_previous_kernel). The preprocess too where the walks split (a call of tens of
    // microseconds): elsewhere, placed under the conversion of a call before, it measured slower.
    const bool pdl = variant != VARIANT_NOPDL;
    const walk_split split = walk_split_at<D>(s, dev, variant);
    const int shares = split.shares;
    const bool tail = split.tail.shares > 1;
    cudaLaunchAttribute attr;
    // The lean kernels (a shape without a window's left bound or softcap, and not variant
    // nolean); a persistent grid (persistent_grid)
    const key_rule keys = key_rule_of(s, true);  // the tiles each key tile meets, masked there
    const bool lean = variant != VARIANT_NOLEAN && keys.left < 0 && !(s->softcap > 0.f);
    const int key_tiles = ceil_div(s->N_k, block_keys<D>());
    const bool persistent =
        persistent_grid<D>(s, dev, variant, lean, shares, (long long)key_tiles * s->B * s->H_kv);
    // (memsets: no kernel, so they go first, where they part no two kernels)
    if (dq_turn)  // every query tile's counter starts at 0: no key tile has added
        ATTN_TRY(cudaMemsetAsync(dq_turn, 0, dq_turns(s) * sizeof(int), stream));
    if (persistent)  // the persistent grid's counter: no work tile past the first blocks' taken
        ATTN_TRY(cudaMemsetAsync(tile_counter, 0, sizeof(int), stream));
    const cudaLaunchConfig_t pre =
        pdl_launch_config(preprocess_grid(rows, passes.pass_d), PREPROCESS_THREADS, 0, stream,
                          pdl && shares > 1, &attr);
    ATTN_TRY(cudaLaunchKernelEx(&pre, passes.preprocess, p));

    CUtensorMap tmQ, tmK, tmV, tmdO, tmdK, tmdV;
    const int total_q = s->varlen.total_q, total_k = s->varlen.total_k;  // (packed)
    ATTN_TRY(operand_map(&tmQ, p.Q, s, s->H, s->N, total_q, &s->q, qrows<D>()));
    ATTN_TRY(operand_map(&tmK, p.K, s, s->H_kv, s->N_k, total_k, &s->k, block_keys<D>()));
    ATTN_TRY(operand_map(&tmV, p.V, s, s->H_kv, s->N_k, total_k, &s->v, block_keys<D>()));
    ATTN_TRY(operand_map(&tmdO, p.dO, s, s->H, s->N, total_q, &s->dO, qrows<D>()));
    ATTN_TRY(operand_map(&tmdK, p.dK, s, s->H_kv, s->N_k, total_k, &s->dK, block_keys<D>()));
    ATTN_TRY(operand_map(&tmdV, p.dV, s, s->H_kv, s->N_k, total_k, &s->dV, block_keys<D>()));
    bwd_problem pb;
    memset(&pb, 0, sizeof pb);
    pb.H = s->H, pb.H_kv = s->H_kv, pb.group = s->H / s->H_kv;
    pb.keys = keys;
    pb.key_tiles = key_tiles;
    pb.diagonal_order = variant == VARIANT_DETERMINISTIC && pb.keys.right >= 0;  // dq_turn_of()
    const int shift = section_shift_of(s, variant, pb.keys);
    const int query_tiles = ceil_div(s->N, qrows<D>());
    if (variant == VARIANT_DETERMINISTIC && pb.keys.left < 0 && pb.keys.right < 0 &&
        s->varlen.cu_seqlens_q == NULL && pb.key_tiles <= query_tiles)
        // a rotated walk waits for blocks of higher index too: only where the GPU holds every
        // block of a head at once (one block per multiprocessor); and where it measured faster
        // (config.cuh: few key tiles a head, or few waves)
        pb.rotated_walk = pb.key_tiles <= dev->sm_count &&
                          (pb.key_tiles <= rotated_walk_max_key_tiles<D>() ||
                           (long long)pb.key_tiles * s->B * s->H_kv <=
                               (long long)ROTATED_WALK_MAX_WAVES * dev->sm_count);
    pb.walk_rows = pb.rotated_walk ? query_tiles * qrows<D>() : INT_MAX;
    pb.scale = s->scale, pb.scale_log2 = s->scale * LOG2E;
    if (s->softcap > 0.f) pb.cap_in = s->scale / s->softcap, pb.cap_log2 = s->softcap * LOG2E;
    pb.call = p, pb.dq_turn = dq_turn;
    pb.dkv_part = shares > 1 || tail ? dkv_part : NULL;
    pb.tail_first = tail ? (int)split.tail.first : INT_MAX, pb.tail_shares = split.tail.shares;
    const bool capped = variant != VARIANT_NOLEAN && pb.cap_log2 > 0.f;
    // (packed: a block per key tile of the longest sequence; those past a sequence's keys leave.
    // A packed batch whose longest sequence has no key has no block: no dK, dV row to write)
    dim3 grid((unsigned)pb.key_tiles << shift, (unsigned)(s->B * s->H_kv) >> shift,
              (unsigned)shares);
    pb.grid_x = (int)grid.x, pb.work_tiles = (int)(grid.x * grid.y);
    if (persistent) {  // a block per multiprocessor, the counter zeroed above
        pb.tile_counter = tile_counter;
        grid = dim3((unsigned)dev->sm_count);
    }
    if (tail)  // the whole walks' blocks, then the split ones' shares (schedule.cuh's
               // own_work_tile)
        grid = dim3((unsigned)(pb.tail_first + (pb.work_tiles - pb.tail_first) * pb.tail_shares));
    bool waits;  // (the kernel waits for the preprocess: launched with PDL)
    const kernel_fn kernel = kernel_for<D, BF16>(variant, lean, capped, persistent, tail, &waits);
    ATTN_TRY(kernel_smem_limit((const void *)kernel, smem_bytes<D>()));  // once per device
    if (pb.key_tiles > 0) {
        const cudaLaunchConfig_t main =
            pdl_launch_config(grid, BLOCK_THREADS, smem_bytes<D>(), stream, pdl && waits, &attr);
        ATTN_TRY(cudaLaunchKernelEx(&main, kernel, tmQ, tmK, tmV, tmdO, tmdK, tmdV, pb));
    }
    if ((shares > 1 || tail) && pb.key_tiles > 0) {  // the shares' dK and dV added
        // (backward_prepost.cuh; a tail split's from its first work tile's (batch, key/value head)
        // on: its grid's rows are those, no mask)
        const int head_keys = pb.key_tiles * block_keys<D>();
        const long long first_key = tail ? (long long)pb.tail_first * block_keys<D>() : 0;
        const cudaLaunchConfig_t sum = pdl_launch_config(
            dkv_sum_grid(s, (int)(first_key / head_keys)), DKV_SUM_THREADS, 0, stream, pdl, &attr);
        ATTN_TRY(cudaLaunchKernelEx(&sum, dkv_sum_kernel<BF16>, p, (const float *)dkv_part, D,
                                    head_keys, tail ? pb.tail_shares : shares, first_key));
    }
    const cudaLaunchConfig_t convert =
        pdl_launch_config(convert_grid(s), CONVERT_THREADS, 0, stream, pdl, &attr);
    return cudaLaunchKernelEx(&convert, passes.convert, p);
}

static cudaError_t backward(const attn_shape *s, const attn_device *dev, const void *Q,
                            const void *K, const void *V, const void *O, const float *lse,
                            const void *dO, void *dQ, void *dK, void *dV, void *workspace,
                            int variant, cudaStream_t stream) {
    const char *why = stage_unsupported(s, dev, variant);
    if (why) {
        fprintf(stderr, "stage8_hopper_backward: %s\n", why);
        return cudaErrorInvalidValue;
    }
    // TMA reads and writes 16-byte aligned addresses.
    if (((uintptr_t)Q | (uintptr_t)K | (uintptr_t)V | (uintptr_t)dO | (uintptr_t)dK |
         (uintptr_t)dV) %
        16) {
        fprintf(stderr, "stage8_hopper_backward: Q, K, V, dO, dK and dV must be 16-byte aligned\n");
        return cudaErrorMisalignedAddress;
    }
    bwd_params p = bwd_params_of(s, Q, K, V, O, lse, dO, dQ, dK, dV, workspace, true);
    p.dq_tiled = dq_tiled_cols(s, variant);
    char *const after_acc = (char *)p.dQ_acc + aligned(dq_acc_bytes(s, variant));
    int *const dq_turn = variant == VARIANT_DETERMINISTIC ? (int *)after_acc : NULL;
    float *const dkv_part = (float *)(after_acc + aligned(dq_turn_bytes(s, variant)));  // (split)
    int *const tile_counter =  // (persistent)
        (int *)((char *)dkv_part + aligned(dkv_part_bytes(s, walk_split_of(s, dev, variant))));
    const int d = compiled_d(s->D);  // the kernels that run s->D (stage_unsupported: one does)
    if (d == 64)
        return s->bf16 ? enqueue_backward<64, true>(s, dev, p, dq_turn, dkv_part, tile_counter,
                                                    variant, stream)
                       : enqueue_backward<64, false>(s, dev, p, dq_turn, dkv_part, tile_counter,
                                                     variant, stream);
    if (d == 96)
        return s->bf16 ? enqueue_backward<96, true>(s, dev, p, dq_turn, dkv_part, tile_counter,
                                                    variant, stream)
                       : enqueue_backward<96, false>(s, dev, p, dq_turn, dkv_part, tile_counter,
                                                     variant, stream);
    if (d == 256)
        return s->bf16 ? enqueue_backward<256, true>(s, dev, p, dq_turn, dkv_part, tile_counter,
                                                     variant, stream)
                       : enqueue_backward<256, false>(s, dev, p, dq_turn, dkv_part, tile_counter,
                                                      variant, stream);
    return s->bf16 ? enqueue_backward<128, true>(s, dev, p, dq_turn, dkv_part, tile_counter,
                                                 variant, stream)
                   : enqueue_backward<128, false>(s, dev, p, dq_turn, dkv_part, tile_counter,
                                                  variant, stream);
}
