/*
 * stage6_hopper: FlashAttention-3's machinery on Hopper (sm_90a), written out instruction by
 * instruction. README.md is the lesson; LOG.md is the optimization log (each step with its
 * prediction and measurement, and what did not work).
 *
 * New over stage 5: the tensor memory accelerator (TMA) copies Q, K and V tiles into shared
 * memory, already swizzled, and counts their bytes on mbarriers; wgmma multiplies 64 rows per
 * warpgroup with its operands read from shared memory through descriptors (P from registers);
 * one producer warpgroup issues every copy and hands its registers (setmaxnreg) to two or three
 * consumer warpgroups that only compute; the softmax of one key tile starts under the P V of the
 * key tile before; the consumers take turns at issuing their GEMMs (ping-pong); one persistent
 * block per SM takes work tiles from a global counter; where those leave SMs idle, a work tile
 * is a range of a query tile's keys (split-KV, stage 5's rule and merge), on the smallest grids
 * of 64 rows (one consumer warpgroup), and the merge starts the moment the attention kernel ends
 * (programmatic dependent launch).
 * Expected gain: about 1.4x over stage 5 where the grid fills the GPU (the fa2 shapes; README.md,
 * Measured, has the reference run's figures).
 *
 * The kernel, one block per SM (attention_kernel); Q_FULL, K_EMPTY, ... are mbarriers:
 *
 *   producer warpgroup, one thread (producer):
 *     take_next_work:     w = blockIdx.x (or the next one with key tiles)
 *     for each of the block's work tiles t (w: BR query rows of one batch*head, and a range of
 *     their key tiles: all of them unless split):
 *       publish_work:     wait Q_EMPTY[t % QB]; write w; TMA Q -> Q buffer t % QB      (Q_FULL)
 *       next_work_index:  w' = the next work tile from the global counter
 *       for each key tile j of its range, the block's it-th:         (ring slot it % STAGES)
 *         load_key_tile:  wait K_EMPTY; TMA K_j -> K ring slot                        (K_FULL)
 *         load_key_tile:  wait V_EMPTY; TMA V_j -> V ring slot                        (V_FULL)
 *       take_next_work:   w = w', or the next one after it with key tiles
 *     publish_work "stop"
 *
 *   each consumer warpgroup, 64 query rows (consumer_overlapped): one pipeline over every key
 *   tile of every work tile the block takes
 *     take_work (wait Q_FULL); start_rows: O = 0, m = -inf, l = 0
 *     first_scores:    [wait my turn] S = Q K_0^T [pass the turn]; wait S; scores_done
 *     loop:
 *       retire_pv:     wait for the last P V; release its V; if it ended a work tile, write
 *                      that tile's O / l and LSE (epilogue); O *= alpha; exp_pack: P =
 *                      fp16(2^(S - m)), l (the exponentials beside the rescale and packing)
 *       next_key_tile: j + 1; after the work tile's last, end_rows (keep its m, l for its
 *                      epilogue; start new rows) and key tile 0 of the next one (take_work), or
 *                      leave the loop
 *       issue_turn:    [wait my turn] issue S = Q K_next^T; issue O += P V_j [pass the turn]
 *       wait for S (P V may still run)
 *       scores_done:   release K (and Q after its last key tile); mask; row max -> m, alpha
 *                      (and, with two consumers, the first two chunks' exponentials)
 *     last_pv:         [wait my turn] O += P V [pass the turn]; wait; release V; epilogue
 *   (epilogue, split: the range's O / l in fp32 and its LSE to the workspace; after the kernel,
 *   combine_kernel_pdl merges the ranges into O and LSE)
 *
 *   (variant nooverlap: consumer_serial, every wgmma waited for before the next step)
 *
 * Run:  make build && build/stage6_hopper --seq 16384 --heads 16 --dim 128 --causal --bench
 * Variants (--variant): default, nopersistent, nopingpong, nooverlap, nosplit (no split-KV and
 * no one-consumer tiles), nopdl, nosections (causal work tiles head by head), nolean (D = 256's
 * MODEL kernels with the window's left bound and softcap for every shape): each switches one
 * step off.
 * Only on an H100/H200 with a build that has sm_90a code (make picks it on a Hopper GPU; the fat
 * build has it); everywhere else the stage reports itself unsupported (exit 3).
 * What models feed: GQA (--kv-heads), strided layouts (--layout bnhd|qkv) and N_k != N (--seq-k),
 * through 4-D tensor maps with each tensor's strides; local windows (--window L,R: each query
 * tile's key tiles from its first row's window to its last row's, the boundary tiles masked) and
 * softcap (--softcap C: tanh on the scores), values of the problem; and bf16 storage (--dtype
 * bf16: a template parameter of the kernels, wgmma's .bf16 products), in the MODEL kernels; the
 * plain case (fp16 [B, H, N, D], H_kv = H, N_k = N) has kernels of its own with its own code
 * alone, at D = 64 and 128.
 * Head dims: kernels of D = 64, 96, 128 and 256 (96 and 256 only as MODEL kernels of the default
 * schedule; D = 256's also lean, without the window's left bound and softcap, for the shapes that
 * ask for neither: config.cuh's KERNEL_CONFIGS); any other multiple of 8 from 32 to 256 runs in the
 * next of them (compiled_d), in the MODEL kernels, with the tail of D masked by the tensor maps:
 * their inner extent is the shape's D, so TMA reads zeros past it and clips the O stores to it; the
 * direct O stores and the merge write the shape's D columns (problem's o_cols,
 * combine_cols_kernel_pdl). Packed batches (cu_seqlens, flash-attn's varlen): in the MODEL kernels,
 * unsplit. The tensor maps cover the packed tensors whole; a work tile (sequence, head, query tile,
 * numbered over the longest sequence) reads its sequence's first rows and lengths (work_at:
 * attn_sequence_of), the producer skips those past a sequence's end (skip_work), the masks take the
 * sequence's N_k, and a warp whose rows cross its sequence's end copies the rows before it to O
 * itself, not by TMA (store_o_rows).
 *
 * NOTE: what is left (LOG.md, "Where this leaves stage 6"): at D = 64, the instructions a pass
 * runs besides the softmax and the GEMMs (the ring's slot and phase arithmetic, descriptors
 * rebuilt from addresses); on one head at N <= 2048 stage 6 is only a few percent ahead of
 * stage 5.
 */

#include <cuda.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <limits.h>
#include <stdint.h>
#include <string.h>

#include "attention.h"
#include "device/sm80.cuh"        // ld_shared_v4 (a packed sequence's last rows of O)
#include "device/sm90.cuh"        // mbarriers, TMA, wgmma, setmaxnreg, PDL, the fragment vocabulary
#include "device/split_kv.cuh"    // split-KV: key ranges, their merge, how many
#include "device/tensor_map.cuh"  // tensor_map_encoder

// The stage, one file per role, in reading order (clang-format would sort them):
// clang-format off
#include "config.cuh"    // tunables, variants, the kernel configuration for a shape
#include "smem.cuh"      // shared memory: slabs, Q buffers, K/V ring, mbarriers
#include "schedule.cuh"  // work tiles, the persistent blocks' counter, a consumer's rows
#include "producer.cuh"  // warpgroup 0: Q, K, V by TMA
#include "softmax.cuh"   // the online softmax on the consumers' registers
#include "epilogue.cuh"  // O and LSE of a finished work tile
#include "mainloop.cuh"  // the consumers: GEMMs, turns, the schedules
#include "kernel.cuh"    // attention_kernel
#include "launch.cuh"    // tensor maps, split-KV's plan, the launch
// clang-format on

/* ---- the stage's descriptor ------------------------------------------------------------------ */

static const char *attention_unsupported(const attn_shape *s, const attn_device *dev, int variant) {
    if (s->D < ATTN_MIN_D || s->D > ATTN_MAX_D || s->D % ATTN_D_STEP)
        return "head dim must be a multiple of 8 from 32 to 256";
    if (!(s->scale > 0.f)) return "scale must be positive";
    if (s->B < 1 || s->H < 1 || s->N < 1) return "B, H and N must be >= 1";
    if (s->H_kv < 1 || s->H % s->H_kv)
        return "H must be a multiple of H_kv (query heads per KV head)";
    if (s->N_k < 1) return "N_k must be >= 1";
    // A packed batch (its N and N_k the longest sequence's): one batch of total_q queries and
    // total_k keys (tensor_maps_model).
    const bool packed = s->varlen.cu_seqlens_q != NULL;
    const attn_varlen *v = &s->varlen;
    if (packed && !v->cu_seqlens_k) return "a packed batch needs cu_seqlens_k";
    if (packed && (v->total_q < 1 || v->total_k < 1))  // (attn_packed_empty: the caller's)
        return "a packed batch with no query or no key rows has nothing to compute";
    // Q, K, V and O go through TMA tensor maps (tensor_map_4d): each stride a multiple of 16 bytes
    // (8 halves) and below 2^40 bytes; rows at least D apart, so that O's rows do not overlap, and
    // at most INT_MAX elements (the row strides of the merge, combine_params, and of the problem).
    const attn_layout *l[] = {&s->q, &s->k, &s->v, &s->o};
    const int heads[] = {s->H, s->H_kv, s->H_kv, s->H};
    const int rows[] = {packed ? v->total_q : s->N, packed ? v->total_k : s->N_k,
                        packed ? v->total_k : s->N_k, packed ? v->total_q : s->N};
    for (int t = 0; t < 4; t++) {
        if (!tensor_map_takes(l[t], packed ? 1 : s->B, heads[t], rows[t], HALF_BYTES) ||
            (rows[t] > 1 && (l[t]->row < s->D || l[t]->row > INT_MAX)))
            return "strides must be multiples of 8 elements (16 bytes, TMA's rule) below 2^39, "
                   "rows "
                   "at least D apart";
    }
    if (variant < 0 || variant >= VARIANTS) return "unknown variant";
    // The head dims past 128 or between 64 and 128 run in kernels of D = 96 or 256, compiled for
    // the default schedule alone (config_for: model_only).
    if (compiled_d(s->D) != 64 && compiled_d(s->D) != 128 &&
        (variant == VARIANT_NOPINGPONG || variant == VARIANT_NOOVERLAP))
        return "variants nopingpong and nooverlap run head dims up to 64 and from 104 to 128";
    // So do packed batches: their kernels (kernel_for's PACKED) are the default schedule's.
    if (packed && (variant == VARIANT_NOPINGPONG || variant == VARIANT_NOOVERLAP))
        return "packed batches run in the default schedule (variants default, nopersistent, "
               "nosplit, nopdl)";
    if (dev->cc != 90) return "needs a Hopper GPU (sm_90): TMA, wgmma and setmaxnreg";
    if (!hopper_code_here((const void *)attention_kernel<64, 2, KEY_TILE_SHORT, SCHEDULE_PINGPONG,
                                                         false, false, false, false>))
        return "this build has no sm_90a code (build on the Hopper GPU, or the fat build)";
    // The kernel's shared memory layout is fixed when it is compiled (q_buffers(), o_staged()):
    // a smaller limit (--smem-limit) makes the shape unsupported, it picks no other layout.
    const kernel_config c = config_for(s, dev, variant);
    const size_t smem = config_smem_bytes(c);
    if (smem > dev->smem_per_block) {
        static char why_smem[96];
        snprintf(why_smem, sizeof why_smem, "needs %zu bytes of shared memory per block at D = %d",
                 smem, s->D);
        return why_smem;
    }
    const int BR = c.consumers * WGMMA_M;  // block_rows<C>()
    if ((long long)s->B * s->H * ((s->N + BR - 1) / BR) > (long long)INT_MAX)
        return "too many work tiles (B * H * ceil(N / rows per tile) must be below 2^31)";
    // The kernels count a packed batch's rows in ints, up to a tile past a sequence's end.
    if (packed && ((long long)v->total_q + s->N + BR > INT_MAX ||
                   (long long)v->total_k + s->N_k + c.key_tile > INT_MAX))
        return "a packed batch's rows must stay below 2^31 (total_q + N, total_k + N_k)";
    return NULL;
}

// The workspace: the work tile counter of the persistent blocks (zeroed before each launch),
// then with split-KV the key ranges' O_part [splits, B * H, N, D] and lse_part [splits, B * H, N],
// fp32, 16-byte aligned; D the kernel's (compiled_d: a masked D's rows have its zero columns).
// A packed batch runs unsplit (plan_splits): the counter alone, whatever its lengths.
constexpr size_t PART_ALIGN = 16;
static size_t attention_workspace_bytes(const attn_shape *s, const attn_device *dev, int variant) {
    if (attention_unsupported(s, dev, variant)) return sizeof(int);  // forward() reports it
    const split_plan sp = plan_splits(s, dev, variant);
    if (sp.splits == 1) return sizeof(int);
    return PART_ALIGN + (size_t)sp.splits * s->B * s->H * s->N * (sp.config.D + 1) * sizeof(float);
}

static cudaError_t attention_forward(const attn_shape *s, const attn_device *dev, const void *Q,
                                     const void *K, const void *V, void *O, float *lse,
                                     void *workspace, int variant, cudaStream_t stream) {
    const char *why = attention_unsupported(s, dev, variant);
    if (why) {
        fprintf(stderr, "stage6_hopper: %s\n", why);
        return cudaErrorInvalidValue;
    }
    // TMA reads from 16-byte aligned addresses; the O stores are 16 bytes wide.
    if (((uintptr_t)Q | (uintptr_t)K | (uintptr_t)V | (uintptr_t)O) % 16) {
        fprintf(stderr, "stage6_hopper: Q, K, V and O must be 16-byte aligned\n");
        return cudaErrorMisalignedAddress;
    }
    launch_args a;
    memset(&a, 0, sizeof a);
    a.Q = Q, a.K = K, a.V = V, a.O = (__half *)O, a.lse = lse, a.next_work = (int *)workspace;
    a.split = plan_splits(s, dev, variant);
    if (a.split.splits > 1) a.O_part = (float *)((char *)workspace + PART_ALIGN);
    a.persistent_blocks = variant == VARIANT_NOPERSISTENT ? 0 : dev->sm_count;
    a.pdl = variant != VARIANT_NOPDL;
    a.lean = variant != VARIANT_NOLEAN;
    a.stream = stream;
    switch (variant) {
        case VARIANT_NOOVERLAP:
            return launch_schedule<SCHEDULE_SERIAL>(s, &a);
        case VARIANT_NOPINGPONG:
            return launch_schedule<SCHEDULE_OVERLAPPED>(s, &a);
        default:
            return launch_schedule<SCHEDULE_PINGPONG>(s, &a);
    }
}

extern "C" const attn_stage attn_this_stage = {
    "stage6_hopper",
    "FA3-style on Hopper: TMA bulk copies on mbarriers, wgmma from shared-memory descriptors, "
    "producer/consumer warpgroups with setmaxnreg",
    ATTN_F16,
    "default,nopersistent,nopingpong,nooverlap,nosplit,nopdl,nosections,nolean",
    attention_unsupported,
    attention_workspace_bytes,
    attention_forward,
    NULL,  // a forward-only stage: no backward pass
    NULL,
    ATTN_TAKES_BF16 | ATTN_TAKES_GQA | ATTN_TAKES_STRIDES | ATTN_TAKES_N_K | ATTN_TAKES_LOCAL |
        ATTN_TAKES_SOFTCAP | ATTN_TAKES_VARLEN,  // beyond the plain case (the MODEL kernels)
    0,
    NULL,  // no decode pass: attention against a KV cache is stage 9's
    NULL,
};
