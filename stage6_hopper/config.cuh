/*
 * stage6_hopper/config.cuh: the configuration: the tunables (consumer warpgroups, keys per K/V
 * tile, depth of the K/V ring, Q buffers, registers per role), the variants, and the one choice of
 * a kernel configuration for a shape (config_for), from which the checks (attention_unsupported),
 * the split-KV plan (plan_splits) and the launch (launch_schedule) all read.
 *
 * Part of attention.cu's one translation unit, as every .cuh file of this folder.
 */
#pragma once

#include "attention.h"
#include "device/sm90.cuh"      // WGMMA_M, WARPGROUP, ...
#include "device/split_kv.cuh"  // choose_splits, combine_kernel

// The kernels exist only in sm_90a code (HOPPER_KERNELS); other targets compile an empty kernel,
// which the launcher never starts (attention_unsupported), and leave the Hopper-only constants
// below unused.
#if defined(__CUDA_ARCH__) && !HOPPER_KERNELS
#pragma nv_diag_suppress 177  // "declared but never referenced"
#endif

/* ---- shapes and tunables --------------------------------------------------------------------- */

// wgmma's fixed shape for fp16 (common/device/sm90.cuh): a warpgroup computes WGMMA_M = 64 rows,
// WGMMA_K = 16 deep, and any N from 8 to 256 in steps of 8 (here BC keys for S, D columns for O).
// (PRODUCER_WARPGROUPS, common/device/sm90.cuh: warpgroup 0; the consumers are 1 .. C)

// C consumer warpgroups of 64 query rows each, one producer warpgroup in front of them, one
// block per SM. Two consumers: 128 rows per work tile, 384 threads. Three (D = 64, FlashAttention-
// 3's choice there): 192 rows, 512 threads; at D = 64 the softmax costs as much per key as at
// D = 128 but the GEMMs half as much, and a third warpgroup's softmax helps to fill the tensor
// pipe. Causal rows below this N keep two (192-row tiles balance short causal rows worse;
// LOG.md, steps 5 and 10).
constexpr int THREE_CONSUMERS_MIN_N_CAUSAL = 2048;
// D = 96's third consumer (192-row work tiles of 112-key tiles) pays only on longer rows: at N =
// 1,024 a ninth of its rows are padding; it measured slower there and causal at N = 4,096, faster
// non-causal from N = 2,048 and causal from N = 8,192 (LOG.md, steps 31-36).
constexpr int D96_THREE_MIN_N = 2048;
constexpr int D96_THREE_MIN_N_CAUSAL = 8192;
template <int C>
__host__ __device__ constexpr int block_rows() {  // BR
    return C * WGMMA_M;
}
template <int C>
__host__ __device__ constexpr int block_threads() {
    return (C + PRODUCER_WARPGROUPS) * WARPGROUP;
}

// Keys per K/V tile, BC (a template parameter of the kernel): 176 with two consumers at D = 128
// without a causal mask from N_k = 4096 keys (FlashAttention-3's choice), 128 otherwise (one
// consumer runs only on grids far smaller). S is BC / 2 fp32 registers per consumer thread and P
// another BC / 4; with O_acc (D / 2) that is 196 of the 240 registers at D = 128, BC = 176. Longer
// key tiles spread the fixed costs of a tile (the waits, the turn, O's rescale, the row maxima's
// shuffles) over more keys; but with 176 keys shared memory has room for neither a second Q buffer
// nor the O staging tiles (o_staged()), which short rows need more; causal rows waste more of a
// long tile on the diagonal; and the three-consumer D = 64 kernels (160 registers) would spill
// (LOG.md, steps 9 and 14).
// At D = 256 (FlashAttention-3's choice there) 80 keys: O_acc alone is 128 registers, S 40 and P
// 20 more; and shared memory holds Q (64 KB) and two stages of K and V (40 KB each) in 224 KB.
constexpr int KEY_TILE_SHORT = 128;
constexpr int KEY_TILE_LONG = 176;
constexpr int KEY_TILE_LONG_MIN_N = 4096;
constexpr int KEY_TILE_D256 = 80;
// D = 96 with three consumers: S 56, P 28 and O_acc 48 registers of setmaxnreg's 160 (128-key
// tiles spill: S 64, P 32).
constexpr int KEY_TILE_D96_THREE = 112;
static int key_tile_for(const attn_shape *s, int D, int consumers) {
    if (D == 256) return KEY_TILE_D256;
    if (D == 96 && consumers == 3) return KEY_TILE_D96_THREE;
    return consumers == 2 && D == 128 && !s->causal && s->N_k >= KEY_TILE_LONG_MIN_N
               ? KEY_TILE_LONG
               : KEY_TILE_SHORT;
}

// Causal work tiles by sections of heads, each section's longest first (launch.cuh's
// section_shift_of): as many heads a section as keep their K and V within SECTION_KV_BYTES of the
// 50 MB L2 of an H100 or H200. 16 MB measured best, against 8 MB's sections and 32 MB's (stage
// 8's budget for its rows) (LOG.md, step 43).
constexpr size_t SECTION_KV_BYTES = (size_t)16 << 20;

// K/V ring depth: the producer runs up to STAGES tiles ahead of the consumers.
constexpr int STAGES = 2;

// Q buffers: with two, the next work tile's Q lands while this one's last key tiles run, and the
// consumers go from one work tile to the next without waiting for it. Two where shared memory
// has room (a block may have 227 KB), else one: at D = 128, BC = 176 the K/V ring alone takes
// 2 x (K 44 KB + V 44 KB) = 176 KB, and Q 32 KB.
constexpr int Q_BUFFERS_MAX = 2;
// (the 227 KB a block may have: SMEM_PER_BLOCK_MAX, common/device/sm90.cuh)

// setmaxnreg: the block's threads start with an even share of the 65,536 registers (168 each
// for 384 threads, 128 for 512); the producer gives most of its share to the consumers. Two
// consumers: 128 x 24 + 256 x 240 = 64,512. Three: 128 x 32 + 384 x 160 = 65,536 (O_acc is 32
// floats at D = 64, S 64, P 32). One (small grids): 256 threads, 128 x 32 + 128 x 240.
template <int C>
__host__ __device__ constexpr int producer_regs() {
    return C == 2 ? 24 : 32;
}
template <int C>
__host__ __device__ constexpr int consumer_regs() {
    return C == 3 ? 160 : 240;
}

// A warp's rows of a warpgroup's 64 (the accumulator fragment of wgmma, common/device/warp.cuh).
constexpr int WARP_ROWS = WGMMA_M / WARPS_PER_WARPGROUP;  // 16

enum {
    VARIANT_DEFAULT = 0,
    VARIANT_NOPERSISTENT,
    VARIANT_NOPINGPONG,
    VARIANT_NOOVERLAP,
    VARIANT_NOSPLIT,
    VARIANT_NOPDL,
    VARIANT_NOSECTIONS,
    VARIANT_NOLEAN,
    VARIANTS
};

/* ---- the kernel configuration ---------------------------------------------------------------- */

// Consumer warpgroups for this shape (see THREE_CONSUMERS_MIN_N_CAUSAL), and one on grids too
// small for two: where 128-row work tiles cut down to one key tile each (split-KV's finest cut)
// still leave SMs idle, 64-row work tiles make twice as many, each with half the work on its
// critical path (B = H = 1, N = 1024: 128 work tiles for 132 SMs instead of 64). The variant
// nosplit keeps two or three.
// The head dims 96 and 256 have no kernels of one (fewer to compile); D = 96 takes three on long
// rows (FlashAttention-3's 192-row tiles up to D = 96), in 112-key tiles (KEY_TILE_D96_THREE).
static int consumers_for(const attn_shape *s, int D, const attn_device *dev, int variant) {
    if (D == 96) return s->N >= (s->causal ? D96_THREE_MIN_N_CAUSAL : D96_THREE_MIN_N) ? 3 : 2;
    if (D != 64 && D != 128) return 2;
    const long long finest =
        (long long)s->B * s->H * ceil_div(s->N, block_rows<2>()) * ceil_div(s->N_k, KEY_TILE_SHORT);
    if (variant != VARIANT_NOSPLIT && finest < dev->sm_count) return 1;
    return D == 64 && (!s->causal || s->N >= THREE_CONSUMERS_MIN_N_CAUSAL) ? 3 : 2;
}

// A kernel configuration: head dim D, consumer warpgroups C, keys per K/V tile BC (the kernel's
// template parameters; its shared memory, rows per work tile and registers per role follow from
// them at compile time; the K/V ring's depth, STAGES, is one for all, and q_buffers() fits the Q
// buffers to each). A configuration is compiled for each schedule, with and without split-KV, as
// the plain kernels and the MODEL ones; one that is model_only (the head dims besides 64 and 128)
// only as the MODEL kernels of the default schedule, which is all a shape of its head dims runs
// (fewer kernels to compile). One that is `lean` has its unpacked MODEL kernels also compiled
// without EXTRAS (kernel.cuh: no window's left bound, no softcap), which the shapes without those
// run (where that pays: LOG.md, step 47). config_for() picks the configuration for a shape, and
// nothing else picks.
typedef struct {
    int D, consumers, key_tile;
    bool model_only, lean;
} kernel_config;

constexpr kernel_config KERNEL_CONFIGS[] = {
    {64, 1, KEY_TILE_SHORT, false, false},  {128, 1, KEY_TILE_SHORT, false, false},
    {64, 2, KEY_TILE_SHORT, false, false},  {64, 3, KEY_TILE_SHORT, false, false},
    {128, 2, KEY_TILE_SHORT, false, false}, {128, 2, KEY_TILE_LONG, false, false},
    {96, 2, KEY_TILE_SHORT, true, false},   {96, 3, KEY_TILE_D96_THREE, true, false},
    {256, 2, KEY_TILE_D256, true, true},
};
constexpr int KERNEL_CONFIG_COUNT = (int)(sizeof(KERNEL_CONFIGS) / sizeof(KERNEL_CONFIGS[0]));

static bool same_config(kernel_config a, kernel_config b) {
    return a.D == b.D && a.consumers == b.consumers && a.key_tile == b.key_tile;
}

// The compiled head dims, and the one a shape's D runs in: the smallest at least D. A D between
// them runs with the tail of its columns masked: the tensor maps take the shape's D as the
// inner extent, so TMA reads zeros past it (they add nothing to Q K^T, and make O's columns
// past it zero) and clips the O stores to it (attention.cu, the header).
constexpr int COMPILED_D[] = {64, 96, 128, 256};
static int compiled_d(int D) {
    for (int d : COMPILED_D)
        if (D <= d) return d;
    return 0;  // (past ATTN_MAX_D: attention_unsupported() refuses it first)
}

// The configuration for a shape: its compiled head dim, consumers_for(), then key_tile_for().
static kernel_config config_for(const attn_shape *s, const attn_device *dev, int variant) {
    kernel_config c;
    c.D = compiled_d(s->D);
    c.consumers = consumers_for(s, c.D, dev, variant);
    c.key_tile = key_tile_for(s, c.D, c.consumers);
    c.model_only = c.D != 64 && c.D != 128;
    c.lean = false;  // (a property of KERNEL_CONFIGS' entries; same_config() ignores it)
    return c;
}
