/*
 * stage7_backward: FlashAttention-2's backward pass (dQ, dK, dV), on the tensor cores of stage 5.
 *
 * What this stage adds: the other half of FlashAttention. The forward pass is stage 5's (this
 * folder holds the backward only; the build links stage5_tuned/attention.cu a second time, renamed,
 * and the descriptor below hands its forward over). Given Q, K, V, the forward's O and LSE, and dO:
 *
 *   D_i   = rowsum(dO_i * O_i)                          preprocess_kernel, one row per quad
 *   for each key tile K_j, V_j (one block of 8 warps, 128 keys):       backward_kernel
 *     dK_j = dV_j = 0                                    registers, fp32, for the whole loop
 *     (D = 64: K_j's, V_j's fragments too)               loaded once, read by every S^T, dP^T
 *     for each query tile Q_i, dO_i, LSE_i, D_i (the next one arriving by cp.async):
 *       scores:  S^T  = K_j Q_i^T                        recompute: no N x N buffer anywhere
 *                P^T  = exp(scale S^T - LSE_i)           the forward's probabilities, exactly
 *                dP^T = V_j dO_i^T
 *                dS^T = P^T * (dP^T - D_i)               softmax's Jacobian, row by row
 *                P^T, dS^T -> shared memory (fp16)
 *       dV, dK:  dV_j += P^T dO_i,  dK_j += dS^T Q_i
 *       dQ:      dQ_i += dS K_j                          fp32 atomics into a workspace (default;
 *                                                        sm_90 on: the TMA unit's bulk reductions)
 *     dK_j *= scale; store dK_j, dV_j
 *   dQ = scale * dQ_acc                                  dq_convert_kernel
 *
 * P^T and dS^T go through shared memory so that each phase splits its product over the 8 warps
 * in the shape that reads least shared memory (FlashAttention-2's layout). Where its 161 KB do not
 * fit (an L4, a T4), backward_registers_kernel runs instead: 16 keys a warp for every product, P^T
 * and dS^T kept in registers as the A operands of dV and dK (variant registers runs it anywhere).
 *
 * Variant deterministic: the key-tile loop leaves dQ alone, and dq_kernel computes it in a second
 * pass, query tile outer, key tiles inner, accumulating dQ_i in registers (S and dP recomputed once
 * more): no atomics, so the same inputs give the same bits on every run.
 *
 * Why K/V outside: dK_j and dV_j then stay in registers for a whole block, and only dQ, which
 * every key tile adds to, needs accumulating across blocks. README.md derives the gradients.
 * What models feed: grouped-query heads (a block walks its key/value head's query heads in turn,
 * so dK_j and dV_j sum over them in registers), strided tensors, N_k != N (causal aligned to the
 * bottom right), bf16 (sm_80 on: the kernels' BF16 switch), and local windows and softcap, in
 * MODEL instantiations of the three kernels (config.cuh, bwd_model: a key tile loops over the query
 * tiles whose rows see it; dS gains the cap's derivative, 1 - t^2), which the plain cases' kernels
 * do not carry; so do packed batches of variable-length sequences (cu_seqlens: a block reads its
 * sequence's rows through bwd_sequence_of, and a tile past the sequence's end does nothing).
 * mma.sync + ldmatrix + cp.async as stage 5: every GPU from sm_75 on (sm_75 loads synchronously).
 *
 * Run:  make build && build/stage7_backward --seq 4096 --heads 16 --dim 128 --causal --bench
 * Variants (--variant): default (dQ by atomics; sm_90 on: bulk reductions), deterministic (dQ by a
 * second pass), registers (backward_registers_kernel's layout), atomics (dQ by atomics on sm_90
 * too).
 *
 * NOTE: what is left is Hopper's instruction set again: wgmma with dS and P staged through shared
 * memory, TMA and warp specialisation, as FlashAttention-3's backward does (README.md, "What is
 * left").
 */

#include <cuda.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "attention.h"
#include "device/backward_prepost.cuh"  // bwd_params; D_i and LSE_i before, dQ to fp16 after
#include "device/linked_forward.cuh"    // the forward pass: stage 5's, linked
#include "device/sm80.cuh"              // mma.sync, ldmatrix, cp.async, the fragment vocabulary
#include "device/sm90.cuh"              // sm_90 on: stmatrix, the TMA unit's bulk reductions
#include "device/tensor_map.cuh"        // tensor_map_encoder (DQ_BY_BULK's tensor map)

// The stage, one file per role, in reading order (clang-format would sort them):
// clang-format off
#include "config.cuh"            // tiles of the three kernels, their shared memory
#include "smem.cuh"              // swizzled tiles, ldmatrix lane addresses, cp.async copies
#include "gemm.cuh"              // the warps' products on mma.sync, fragments out
#include "dq.cuh"                // dQ's accumulation: atomics, or the TMA unit's reductions
#include "smem_kernel.cuh"       // backward_kernel: P^T, dS^T through shared memory
#include "registers_kernel.cuh"  // backward_registers_kernel: P^T, dS^T in registers (small GPUs)
#include "dq_kernel.cuh"         // dq_kernel: the deterministic second pass
#include "launch.cuh"            // the launcher: configurations, kernels, backward()
// clang-format on

/* ---- the stage's descriptor: the forward pass is stage 5's ----------------------------------- */

// (linked_forward, common/device/linked_forward.cuh: stage 5's object, linked beside this file)

static const char *stage_unsupported(const attn_shape *s, const attn_device *dev, int variant) {
    if (variant < 0 || variant >= VARIANTS) return "unknown variant";
    const char *why = attn_forward_stage.unsupported(s, dev, LINKED_FORWARD_VARIANT);
    // what stage 5 does not take (the descriptor's `takes` below lists what it takes)
    if (!why) why = attn_shape_refused(s, attn_forward_stage.takes, 0);
    if (why) return why;
    // Packed: the workspace's rows per head (total_q and a ROW_PAD a sequence) in 32 bits.
    if (s->varlen.cu_seqlens_q &&
        (long long)s->varlen.total_q + (long long)s->B * ROW_PAD > INT_MAX - ROW_PAD)
        return "a packed batch's total_q + 128 B must be below 2^31 - 128";
    // The preprocess's grid: a thread per 16-byte chunk of B H N_pad rows (packed: N_pad of the
    // longest sequence), in the lanes of its instantiation for D (64, 128 or 256), in grid x.
    const int pre_d = s->D <= 64 ? 64 : (s->D <= 128 ? 128 : 256);
    if ((long long)s->B * s->H * padded_rows(s->N) * preprocess_lanes(pre_d) / PREPROCESS_THREADS >
        INT_MAX)
        return "B x H x N (packed: the longest sequence's N) is more rows than the preprocess's "
               "grid holds";
    // Every tile moves by 16-byte chunks (cp.async), every row by a 32-bit stride (tile_issue).
    const attn_layout *l[] = {&s->q, &s->k, &s->v, &s->o, &s->dO, &s->dQ, &s->dK, &s->dV};
    why = attn_strides_refused(l, (int)(sizeof l / sizeof *l), s->D, INT_MAX);
    if (why) return why;
    int arch = 0;
    if (kernel_arch(&arch) != cudaSuccess) {
        (void)cudaGetLastError();
        return "no kernel image for this device";
    }
    // A head dim runs in the next compiled one (64, 96, 128, 256: compiled_d), its tail masked.
    const int D = compiled_d(s->D);
    if (D > REGISTERS_MAX_D) {  // backward_kernel only: no backward_registers_kernel (config.cuh)
        if (variant == VARIANT_REGISTERS)
            return "D > 128: the registers layout would hold 256 registers a thread of dK and dV";
        if (!smem_p_fits(D, dev->smem_per_block, arch, dq_way_for(variant, arch)))
            return "D > 128 needs sm_80 and 136.5 KB of shared memory per block (168.5 KB on "
                   "sm_90)";
    }
    if ((D <= REGISTERS_MAX_D && choose_tiles(D, dev->smem_per_block, arch, true) < 0) ||
        choose_tiles(D, dev->smem_per_block, arch, false) < 0)
        return "the backward needs 64 KB (D = 128), 48 KB (D = 96), 40.5 KB (D = 64) or 64 KB "
               "(D > 128) of shared memory per block";
    if (s->bf16 && arch < 80)
        return "bf16 needs sm_80 or newer (mma.sync has no bf16 form on sm_75)";
    if (variant == VARIANT_DETERMINISTIC && model_shape(s) && D == 64 &&
        arch >= DQ_MODEL_D64_ABSENT_ARCH)
        return "sm_120: the deterministic variant runs no local window, softcap or head dim below "
               "64 there (dq_kernel.cuh: its kernel for them would spill)";
    return NULL;
}

extern "C" const attn_stage attn_this_stage = {
    "stage7_backward",
    "FA2's backward: D = rowsum(dO * O), S and P recomputed from Q, K and LSE, dK/dV in registers "
    "per K/V tile, dQ by fp32 atomics (or a second pass: deterministic); forward = stage 5's",
    ATTN_F16,
    "default,deterministic,registers,atomics,nosplit",
    stage_unsupported,
    linked_forward_workspace_bytes,
    linked_forward,
    backward_workspace_bytes,
    backward,
    ATTN_TAKES_BF16 | ATTN_TAKES_GQA | ATTN_TAKES_STRIDES | ATTN_TAKES_N_K | ATTN_TAKES_LOCAL |
        ATTN_TAKES_SOFTCAP | ATTN_TAKES_VARLEN,  // its forward's (stage 5's: stage_unsupported)
    ATTN_TAKES_BF16 | ATTN_TAKES_GQA | ATTN_TAKES_STRIDES | ATTN_TAKES_N_K | ATTN_TAKES_LOCAL |
        ATTN_TAKES_SOFTCAP | ATTN_TAKES_VARLEN,  // the backward's
    NULL,  // no decode pass: attention against a KV cache is stage 9's
    NULL,
};
