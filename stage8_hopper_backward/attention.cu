/*
 * stage8_hopper_backward: FlashAttention-3's backward pass (dQ, dK, dV) on Hopper (sm_90a), written
 * out instruction by instruction. README.md is the lesson; LOG.md the optimization log.
 *
 * New over stage 7 (the same algorithm on mma.sync): the five products on wgmma, 64 rows a
 * warpgroup, with P^T and dS^T as A operands straight from the registers the scores left them
 * in; Q_i, dO_i, LSE_i and D_i brought by TMA into a ring on mbarriers; a producer warpgroup that
 * issues every copy and every dQ reduction and gives its registers (setmaxnreg) to two consumer
 * warpgroups that only compute. The forward pass is stage 6's, linked (stage.mk).
 *
 *   D_i = rowsum(dO_i * O_i), LSE_i * log2(e)           preprocess_kernel (stage 7's, shared)
 *   backward_kernel: one block per (key tile j of 128 keys, batch, key/value head; D = 256: 64)
 *     producer warpgroup, load warp (load_tiles):
 *       for each query head h of the group, each query tile i that sees the keys (it-th):
 *         wait Q_EMPTY[it % 2]; TMA Q_i, the warp stores LSE_i (Q_FULL); TMA dO_i, D_i (DO_FULL)
 *         (the first step's also K_j with Q_0 and V_j with dO_0, once: S^T waits for no V_j)
 *     producer warpgroup, dQ warp (reduce_dq), for the same walk:
 *         wait DQ_FULL; dQ_acc[h, i] += the staging tile (TMA bulk reduce-add); wait until
 *         read; arrive DQ_EMPTY (D = 96, 128: per warpgroup's part, each on its own DQ_FULL,
 *         DQ_EMPTY; deterministic: the whole tile in turns, and at D = 96, 128 two dQ warps,
 *         each every other step with its own DQ_FULL, DQ_EMPTY)
 *     each of the two consumer warpgroups, keys 64 wg .. 64 wg + 63 of the tile (consumer):
 *       dK = dV = 0 (fp32 registers, for the whole block)
 *       for the same walk (consumer_step):
 *         wait Q_FULL;  S^T  = K_j Q_i^T         wgmma SS, K-major both        (issue_scores)
 *         wait DO_FULL; dP^T = V_j dO_i^T        wgmma SS, K-major both
 *         wait S^T:     P^T  = 2^(S^T scale log2(e) - LSE_i), masked        (probabilities)
 *         wait dP^T:    dS^T = P^T * (dP^T - D_i)                         (score_gradients)
 *           softcap c: t = tanh(S^T scale / c), P^T = 2^(t c log2(e) - LSE_i) and
 *           G = P^T (1 - t^2) (capped_scores, capped_probabilities); dS^T = G (dP^T - D_i)
 *                                                                        (capped_gradients)
 *         dS^T -> dS_smem[it % 3] (stmatrix, 128-byte swizzle)                 (store_ds)
 *         arrive DS_FULL[it % 3]                                             (announce_ds)
 *         dV += P^T dO_i, dK += dS^T Q_i         wgmma RS: A from registers (issue_dkv)
 *         c = it - 1 (dQ a step late; none in the first step)
 *         wait until both warpgroups wrote dS^T_c: DS_FULL[c % 3]                 (wait_ds)
 *         dQ_c part = dS_c K_j                   wgmma SS, MN-major both       (issue_dq)
 *         wait all; arrive Q_EMPTY; wait DQ_EMPTY; part -> staging; arrive DQ_FULL (stage_dq)
 *       the last step's dQ part the same way                                      (last_dq)
 *       dK *= scale; store dK_j, dV_j                                            (store_dkv)
 *   dQ = scale dQ_acc, in the storage type                 dq_convert_kernel (stage 7's, shared)
 *
 * Split walks: where the grid's blocks fill at most half of the GPU (few heads, short batches, one
 * long head), each key tile's query tiles are cut into shares, one block each (the grid's z,
 * walk_tiles_of); a share's dK_j, dV_j leave in fp32 (write_dkv_share) and dkv_sum_kernel adds
 * the shares in order, scales dK and stores both.
 *
 * The passes follow one another by programmatic dependent launch (PDL, launch.cuh): each kernel
 * lets the next one be placed on the multiprocessors its last blocks leave idle, and waits for the
 * one before it to end before it touches what that one writes: a launch's latency, a block's setup
 * and its first tiles' loads under the kernel ahead's last wave (the preprocess itself launched so
 * where the walks split, the calls of tens of microseconds).
 *
 * At D = 256 (consumer_step_split): 64 keys a block; warpgroup w computes S^T, dP^T for the step's
 * queries 32 w .. and owns columns 128 w .. of dK, dV and dQ; both store P^T and dS^T (DS_FULL,
 * waited in the same step), dV and dK over the other's queries read them from shared memory, dQ's
 * part goes to dQ_acc by red.global.add from the registers (four floats a lane: add_dq_atomic).
 * D = 136 to 248 run in it masked (its adds skip dQ_acc's columns past the tensors' D).
 *
 * Variants: atomics (dQ by the consumers' fp32 atomics, the dQ warp idle), deterministic (each
 * query tile's dQ adds in a fixed key-tile order, by a counter in global memory: bit-identical dQ;
 * dq_turn_of() says the order), nolean (the default's kernels with a window's left bound and
 * softcap in their code for every shape, not only for those that ask for them: kernel.cuh's
 * EXTRAS and CAPPED), nosplit (no split walks: every block walks its key tile's whole walk),
 * nopdl (each pass launched only after the one before it has ended), nopersistent (one block per
 * work tile where the default runs a persistent grid: launch.cuh's persistent_grid).
 *
 * Run:  make build && build/stage8_hopper_backward --seq 4096 --heads 16 --dim 128 --causal --bench
 * Only on an H100/H200 with a build that has sm_90a code (make picks it on a Hopper GPU; the fat
 * build has it); everywhere else the stage reports itself unsupported (exit 3).
 * What models feed: GQA (a block walks the query heads of its key/value head, so dK_j and dV_j sum
 * over them in registers), strided layouts (4-D tensor maps; dQ's conversion by strided stores),
 * N_k != N (causal aligned bottom right), local windows (a key tile walks only the query tiles
 * whose rows see it, masked at both bounds: query_tiles_of), softcap (a branch per step:
 * capped_probabilities), packed batches (cu_seqlens: each block reads its sequence's rows,
 * lengths and mask, block_place_of; a key tile past its sequence's keys leaves at once, the last
 * one's dK and dV are stored masked, store_rows_masked) and bf16 (a template parameter: wgmma's
 * .bf16 products); all but bf16 are runtime parameters of the same kernels (bwd_problem). The
 * default variant runs the shapes with neither a window's left bound nor softcap in lean kernels,
 * compiled without that code (EXTRAS off, kernel.cuh), and those with a softcap in kernels
 * without the other branch (CAPPED).
 *
 * NOTE: what is left (LOG.md, steps 13 to 17, 50, 69, 72, 81): ahead of cuDNN's backward at every
 * fa2 and long shape; ahead of FA3-class's on the long sweep's small grids since step 81 (split
 * walks) and level with it over the fa2 shapes since step 69, but behind it on the shortest
 * heads, at the work tile's ends: D = 64's main kernel at N = 1,024 and 2,048, most under a
 * causal mask (step 72's per-kernel times; FA3's 80-query steps at D = 128 are worked out in step
 * 13, not built); and the last wave of a grid a little past a whole number of waves (shares there
 * cost more than they saved: step 81). dQ's adds land in any order (variant deterministic orders
 * them).
 */

#include <cuda.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <limits.h>
#include <stdint.h>
#include <string.h>

#include "attention.h"
#include "device/backward_prepost.cuh"  // bwd_params; D_i and LSE_i before, dQ's conversion after
#include "device/linked_forward.cuh"    // the forward pass: stage 6's, linked
#include "device/sm80.cuh"              // plain shared-memory loads and stores by address
#include "device/sm90.cuh"              // mbarriers, TMA, wgmma, stmatrix, named barriers
#include "device/tensor_map.cuh"        // tensor_map_4d

// The stage, one file per role, in reading order (clang-format would sort them):
// clang-format off
#include "config.cuh"    // tiles, warpgroups, registers, variants and their ways of adding dQ
#include "smem.cuh"      // the block's shared memory, its mbarriers and named barriers, the rings
#include "schedule.cuh"  // bwd_problem, the block's key tile and its walk over the query tiles
#include "producer.cuh"  // the load warp: K_j, V_j, then Q_i, dO_i, LSE_i, D_i by TMA
#include "dq.cuh"        // dQ: the consumers' staging, the dQ warp's bulk reduce-add
#include "epilogue.cuh"  // dK_j, dV_j to global memory
#include "mainloop.cuh"  // the consumers: the five products
#include "kernel.cuh"    // backward_kernel: the warpgroups' roles
#include "launch.cuh"    // tensor maps, workspace, the three passes (backward)
// clang-format on

/* ---- the stage's descriptor: the forward pass is stage 6's ----------------------------------- */

// (linked_forward, common/device/linked_forward.cuh: stage 6's object, linked beside this file)

static const char *stage_unsupported(const attn_shape *s, const attn_device *dev, int variant) {
    if (variant < 0 || variant >= VARIANTS) return "unknown variant";
    const bool packed = s->varlen.cu_seqlens_q != NULL;
    if (packed && !(attn_forward_stage.takes & ATTN_TAKES_VARLEN))
        return "a packed batch: the linked forward (stage 6's) does not take one";
    const char *why = attn_forward_stage.unsupported(s, dev, LINKED_FORWARD_VARIANT);
    if (why) return why;  // D, Hopper, the sm_90a code, Q/K/V/O strides for TMA
    // dO, dK and dV go through tensor maps too; every stride a multiple of 8 elements (16 bytes),
    // rows at least D apart and in 32 bits (dQ's conversion walks rows by them).
    const attn_layout *l[] = {&s->dO, &s->dQ, &s->dK, &s->dV};
    why = attn_strides_refused(l, (int)(sizeof l / sizeof *l), s->D, INT_MAX);
    if (why) return why;
    // (a packed batch: each tensor one batch of its total rows, as launch.cuh's operand_map)
    const int maps_B = packed ? 1 : s->B, q_rows = packed ? s->varlen.total_q : s->N,
              k_rows = packed ? s->varlen.total_k : s->N_k;
    if (!tensor_map_takes(&s->dO, maps_B, s->H, q_rows, HALF_BYTES) ||
        !tensor_map_takes(&s->dK, maps_B, s->H_kv, k_rows, HALF_BYTES) ||
        !tensor_map_takes(&s->dV, maps_B, s->H_kv, k_rows, HALF_BYTES))
        return "dO's, dK's and dV's strides must be below 2^39 elements (TMA's limit)";
    const int d = compiled_d(s->D);
    if (!d) return "the backward runs the head dims that are a multiple of 8 from 32 to 256";
    if (variant == VARIANT_DETERMINISTIC && splits_dkv<256>() && d == 256)
        return "variant deterministic runs head dims up to 128: from D = 136 on dQ is added from "
               "the registers in no fixed order (no staging tile fits beside the tiles)";
    if (variant == VARIANT_ATOMICS && !atomics_run(s->D))
        return "variant atomics runs D = 64, 128 and 136 to 256 (up to 128 its adds address dQ_acc "
               "by the kernel's head dim; no D = 96 kernel of its own)";
    if (!hopper_code_here((const void *)backward_kernel<64, false, DQ_BY_BULK>))
        return "this build has no sm_90a code (build on the Hopper GPU, or the fat build)";
    const size_t smem = d == 64    ? smem_bytes<64>()
                        : d == 96  ? smem_bytes<96>()
                        : d == 128 ? smem_bytes<128>()
                                   : smem_bytes<256>();
    if (smem > dev->smem_per_block) {
        static char why_smem[96];
        snprintf(why_smem, sizeof why_smem,
                 "the backward needs %zu bytes of shared memory per block at D = %d", smem, s->D);
        return why_smem;
    }
    return NULL;
}

extern "C" const attn_stage attn_this_stage = {
    "stage8_hopper_backward",
    "FA3's backward on Hopper: the five products on wgmma (P^T, dS^T from registers), Q, dO, LSE, "
    "D by TMA into a ring on mbarriers, producer/consumer warpgroups, dQ by the TMA unit's "
    "reduce-add (atomics: fp32 atomics from the registers; deterministic: the adds in key-tile "
    "order); forward = stage 6's",
    ATTN_F16,
    "default,atomics,deterministic,nolean,nosplit,nopdl,nopersistent",
    stage_unsupported,
    linked_forward_workspace_bytes,
    linked_forward,
    backward_workspace_bytes,
    backward,
    ATTN_TAKES_BF16 | ATTN_TAKES_GQA | ATTN_TAKES_STRIDES | ATTN_TAKES_N_K | ATTN_TAKES_LOCAL |
        ATTN_TAKES_SOFTCAP | ATTN_TAKES_VARLEN,  // its forward's (stage 6's: stage_unsupported)
    ATTN_TAKES_BF16 | ATTN_TAKES_GQA | ATTN_TAKES_STRIDES | ATTN_TAKES_N_K | ATTN_TAKES_LOCAL |
        ATTN_TAKES_SOFTCAP | ATTN_TAKES_VARLEN,  // the backward's
    NULL,  // no decode pass: attention against a KV cache is stage 9's
    NULL,
};
