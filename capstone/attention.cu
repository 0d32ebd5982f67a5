/*
 * capstone: the whole FlashAttention-2 forward pass, written by you from its specification.
 *
 * The stages built it an idea at a time; here you write it in one piece, behind the same
 * contract as a stage (common/attention.h): your kernels and their launcher, for fp16 storage and
 * head dims 64 and 128. The course's host program runs it with the same inputs, the same float64
 * checker and the same --self-test as every stage, and the report card times it against stage 5
 * (FlashAttention-2, tuned), which is also the capstone's reference solution. LAB.md has the
 * specification at more length, the plan of attack and the hints.
 *
 * Run:  make capstone                  (writes labs/capstone/attention.cu, your copy)
 *       make grade STAGE=capstone      (builds it with the host program, self-test, timing)
 *
 * NOTE: the speed to beat is stage 5's; its lesson (stage5_tuned/README.md) is the map of what
 * makes the difference: tensor cores from registers, swizzled shared memory, loads that overlap
 * the math, and split-KV where the grid leaves the GPU idle.
 */

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "attention.h"

// LAB HOLE 1 BEGIN [design]: FlashAttention-2's forward pass: its kernels and their launcher
// LAB TODO: Write the forward pass and the two functions the contract below calls:
// LAB TODO:   capstone_workspace_bytes(s, dev, variant): the bytes of device scratch your pass
// LAB TODO:     needs for the shape s (0: none); the program allocates them once, before it runs.
// LAB TODO:   capstone_forward(s, dev, Q, K, V, O, lse, workspace, variant, stream): put the whole
// LAB TODO:     pass on `stream` (no synchronization, no allocation) and return the first CUDA
// LAB TODO:     error, cudaSuccess when every launch went in. `variant` is always 0 (default).
// LAB TODO: What it computes, for each batch b < B, head h < H and query row i < N (s holds B, H,
// LAB TODO:   N, D, causal, scale): O[b][h][i] = sum over the keys j of p_ij v_j, where
// LAB TODO:   p_ij = exp(scale q_i.k_j - m_i) / l_i, m_i the row's largest scaled score and l_i the
// LAB TODO:   sum of its exponentials; the keys are j < N, and j <= i when causal. The row's
// LAB TODO:   lse[b][h][i] = m_i + ln(l_i), natural log.
// LAB TODO: Layouts: Q, K, V, O [B, H, N, D], row-major fp16 (__half), contiguous and 16-byte
// LAB TODO:   aligned; lse [B, H, N] float. D is 64 or 128; N is any from 1 (tails); B * H * N * D
// LAB TODO:   may pass 2^31 elements (64-bit offsets). Sums and the softmax in fp32; O rounded to
// LAB TODO:   fp16 once, at the end.
// LAB TODO: The algorithm (stage 1's and stage 5's lessons): a block owns a tile of query rows of
// LAB TODO:   one (b, h); the key and value tiles stream past it through shared memory; a tile's
// LAB TODO:   scores never reach global memory; each row keeps a running max, sum and output,
// LAB TODO:   rescaled when the max grows, and divides by the sum once, at the end. Causal: a
// LAB TODO:   block reads no key tile that lies wholly after its last row.
// LAB TODO: The checker's invariants: every element of O and lse written, for rows below N only;
// LAB TODO:   no NaN or Inf (a masked key adds exactly 0); the error within twice a correct fp16
// LAB TODO:   computation's. Any GPU from sm_75 on; its shared memory per block is
// LAB TODO:   dev->smem_per_block (lowered by --smem-limit on the T4 and L4 paths).
// LAB STUB: static size_t capstone_workspace_bytes(const attn_shape *s, const attn_device *dev,
// LAB STUB:                                        int variant) {
// LAB STUB:     (void)s, (void)dev, (void)variant;
// LAB STUB:     return 0;  // no device scratch
// LAB STUB: }
// LAB STUB:
// LAB STUB: static cudaError_t capstone_forward(const attn_shape *s, const attn_device *dev,
// LAB STUB:                                     const void *Q, const void *K, const void *V,
// LAB STUB:                                     void *O, float *lse, void *workspace, int variant,
// LAB STUB:                                     cudaStream_t stream) {
// LAB STUB:     (void)s, (void)dev, (void)Q, (void)K, (void)V, (void)O, (void)lse, (void)workspace;
// LAB STUB:     (void)variant, (void)stream;
// LAB STUB:     return cudaSuccess;  // nothing written: O keeps the checker's NaN poison
// LAB STUB: }
// The reference solution: stage 5's kernels and launcher, its descriptor under another name.
#define attn_this_stage attn_stage5_tuned
#include "../stage5_tuned/attention.cu"
#undef attn_this_stage

static size_t capstone_workspace_bytes(const attn_shape *s, const attn_device *dev, int variant) {
    return attention_workspace_bytes(s, dev, variant);
}

static cudaError_t capstone_forward(const attn_shape *s, const attn_device *dev, const void *Q,
                                    const void *K, const void *V, void *O, float *lse,
                                    void *workspace, int variant, cudaStream_t stream) {
    return attention_forward(s, dev, Q, K, V, O, lse, workspace, variant, stream);
}
// LAB HOLE 1 END

/* ---- the contract: what the checker runs your pass on (not part of the hole) ---------------- */

// The shapes the capstone takes: fp16, H_kv = H, N_k = N, contiguous (the descriptor's takes is
// 0: the program refuses the rest), head dims 64 and 128.
static const char *capstone_unsupported(const attn_shape *s, const attn_device *dev, int variant) {
    if (s->D != 64 && s->D != 128) return "the capstone takes head dims 64 and 128";
    if (s->B < 1 || s->H < 1 || s->N < 1) return "B, H and N must be >= 1";
    if (dev->cc < 75) return "needs sm_75 or newer";
    if (variant != 0) return "one variant: default";
    return NULL;
}

extern "C" const attn_stage attn_this_stage = {
    "capstone",
    "the whole FlashAttention-2 forward pass, written from its specification",
    ATTN_F16,
    "default",
    capstone_unsupported,
    capstone_workspace_bytes,
    capstone_forward,
    NULL,  // forward only
    NULL,
    0,  // the plain case only
    0,
    NULL,  // no decode pass
    NULL,
};
