/*
 * stage8_hopper_backward/launch.cuh: the host side: whether this build has the sm_90a kernel, the
 * tensor maps, the workspace, and backward(), which runs the preprocess (D_i, LSE_i; dQ_acc
 * zeroed), the main kernel, and dQ's conversion (common/device/backward_prepost.cuh's passes,
 * shared with stage 7).
 */
#pragma once

#include <string.h>

#include "device/kernel_cache.cuh"  // kernel_versions, kernel_smem_limit: once per device
#include "device/tensor_map.cuh"    // tensor_map_4d
#include "kernel.cuh"

// attention.cu's: NULL when the stage runs this shape here, else why not.
static const char *stage_unsupported(const attn_shape *s, const attn_device *dev, int variant);

static int ceil_div(int a, int b) {
    return (a + b - 1) / b;
}

// Whether the main kernel on this device is the sm_90a one (a compute_75 PTX build JIT-compiled
// on an H100 has only the empty kernel).
static int hopper_code_here(void) {
    int ptx = 0, binary = 0;
    if (kernel_versions((const void *)backward_kernel<64, false, DQ_BULK>, &ptx, &binary) !=
        cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return ptx >= 90 && binary >= 90;
}

// Q, K, V or dO, a [B, heads, rows, D] 16-bit tensor in its layout l, as the 4-D tensor map
// (D, rows, heads, B) seen in boxes of [1, 1, box_rows, 64] (one 128-byte-swizzled slab); rows
// past the tensor's read as zeros.
static cudaError_t tensor_map(CUtensorMap *map, const void *base, const attn_shape *s, int heads,
                              int rows, const attn_layout *l, int box_rows) {
    const CUtensorMapDataType type =
        s->bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
    return tensor_map_4d(map, type, HALF_BYTES, base, s->B, heads, rows, s->D, l, SLAB_COLS,
                         box_rows, CU_TENSOR_MAP_SWIZZLE_128B);
}

// Workspace: lse2 and Dsum [B * H, N_pad] floats, then dQ_acc [B, H, N, D] floats, then (variant
// deterministic) dq_turn [B * H, ceil(N / QROWS)] ints, each starting at a multiple of
// WORKSPACE_ALIGN bytes.
constexpr size_t WORKSPACE_ALIGN = 256;
static size_t aligned(size_t bytes) {
    return (bytes + WORKSPACE_ALIGN - 1) / WORKSPACE_ALIGN * WORKSPACE_ALIGN;
}
static int padded_rows(int N) {
    return ceil_div(N, ROW_PAD) * ROW_PAD;
}

static size_t backward_workspace_bytes(const attn_shape *s, const attn_device *dev, int variant) {
    (void)dev;
    const size_t rows = (size_t)s->B * s->H * padded_rows(s->N);
    const size_t turns =
        variant == VARIANT_DETERMINISTIC ? (size_t)s->B * s->H * ceil_div(s->N, QROWS) : 0;
    return 2 * aligned(rows * sizeof(float)) +
           aligned((size_t)s->B * s->H * s->N * s->D * sizeof(float)) +
           aligned(turns * sizeof(int));
}

typedef void (*kernel_fn)(const CUtensorMap, const CUtensorMap, const CUtensorMap,
                          const CUtensorMap, const CUtensorMap, const bwd_problem);

// The main kernel for head dim D, storage type BF16 and the variant's way of adding dQ.
template <int D, bool BF16>
static kernel_fn kernel_for(int variant) {
    return variant == VARIANT_ATOMICDQ        ? backward_kernel<D, BF16, DQ_ATOMIC>
           : variant == VARIANT_DETERMINISTIC ? backward_kernel<D, BF16, DQ_ORDERED>
                                              : backward_kernel<D, BF16, DQ_BULK>;
}

// The three passes for head dim D and storage type BF16.
template <int D, bool BF16>
static cudaError_t enqueue_backward(const attn_shape *s, const bwd_params &p, int *dq_turn,
                                    int variant, cudaStream_t stream) {
    const size_t rows = (size_t)s->B * s->H * p.N_pad;
    const dim3 pre_grid((unsigned)(rows * PREPROCESS_LANES / PREPROCESS_THREADS));
    preprocess_kernel<D, BF16><<<pre_grid, PREPROCESS_THREADS, 0, stream>>>(p);
    ATTN_TRY(cudaGetLastError());

    CUtensorMap tmQ, tmK, tmV, tmdO, tmdQ;
    ATTN_TRY(tensor_map(&tmQ, p.Q, s, s->H, s->N, &s->q, QROWS));
    ATTN_TRY(tensor_map(&tmK, p.K, s, s->H_kv, s->N_k, &s->k, KEYS));
    ATTN_TRY(tensor_map(&tmV, p.V, s, s->H_kv, s->N_k, &s->v, KEYS));
    ATTN_TRY(tensor_map(&tmdO, p.dO, s, s->H, s->N, &s->dO, QROWS));
    ATTN_TRY(dq_tensor_map(&tmdQ, p.dQ_acc, s, QROWS));
    bwd_problem pb;
    memset(&pb, 0, sizeof pb);
    pb.N = s->N, pb.N_k = s->N_k, pb.N_pad = p.N_pad;
    pb.H = s->H, pb.H_kv = s->H_kv, pb.group = s->H / s->H_kv;
    pb.causal = s->causal, pb.key_shift = s->N_k - s->N;
    pb.q_tiles = ceil_div(s->N, QROWS);
    pb.key_tiles = ceil_div(s->N_k, KEYS);
    pb.diagonal_order = variant == VARIANT_DETERMINISTIC && s->causal;  // dq_turn_of()
    pb.scale = s->scale, pb.scale_log2 = s->scale * LOG2E;
    pb.lse2 = p.lse2, pb.Dsum = p.Dsum, pb.dQ_acc = p.dQ_acc, pb.dq_turn = dq_turn;
    if (dq_turn)  // every query tile's counter starts at 0: no key tile has added
        ATTN_TRY(
            cudaMemsetAsync(dq_turn, 0, (size_t)s->B * s->H * pb.q_tiles * sizeof(int), stream));
    pb.dK = p.dK, pb.dV = p.dV, pb.dk = p.layout.dK, pb.dv = p.layout.dV;
    const kernel_fn kernel = kernel_for<D, BF16>(variant);
    ATTN_TRY(kernel_smem_limit((const void *)kernel, smem_bytes<D>()));  // once per device
    const dim3 grid((unsigned)pb.key_tiles, (unsigned)(s->B * s->H_kv));
    kernel<<<grid, BLOCK_THREADS, smem_bytes<D>(), stream>>>(tmQ, tmK, tmV, tmdO, tmdQ, pb);
    ATTN_TRY(cudaGetLastError());

    const size_t head_threads = (size_t)s->N * D / CONVERT_FLOATS;  // a (batch, head)'s
    const dim3 convert_grid((unsigned)((head_threads + CONVERT_THREADS - 1) / CONVERT_THREADS),
                            (unsigned)(s->B * s->H));
    dq_convert_kernel<D, BF16><<<convert_grid, CONVERT_THREADS, 0, stream>>>(p);
    ATTN_TRY(cudaGetLastError());
    return cudaSuccess;
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
    // TMA reads from 16-byte aligned addresses.
    if (((uintptr_t)Q | (uintptr_t)K | (uintptr_t)V | (uintptr_t)dO) % 16) {
        fprintf(stderr, "stage8_hopper_backward: Q, K, V and dO must be 16-byte aligned\n");
        return cudaErrorMisalignedAddress;
    }
    const int N_pad = padded_rows(s->N);
    const size_t rows = (size_t)s->B * s->H * N_pad;
    bwd_params p;
    memset(&p, 0, sizeof p);
    p.Q = (const __half *)Q, p.K = (const __half *)K, p.V = (const __half *)V;
    p.O = (const __half *)O, p.dO = (const __half *)dO, p.lse = lse;
    p.dQ = (__half *)dQ, p.dK = (__half *)dK, p.dV = (__half *)dV;
    const attn_layout *from[] = {&s->q, &s->k, &s->v, &s->o, &s->dO, &s->dQ, &s->dK, &s->dV};
    tensor_strides *to[] = {&p.layout.q,  &p.layout.k,  &p.layout.v,  &p.layout.o,
                            &p.layout.dO, &p.layout.dQ, &p.layout.dK, &p.layout.dV};
    for (size_t t = 0; t < sizeof from / sizeof *from; ++t)
        *to[t] = {from[t]->batch, from[t]->head, (unsigned)from[t]->row};
    p.lse2 = (float *)workspace;
    p.Dsum = (float *)((char *)workspace + aligned(rows * sizeof(float)));
    p.dQ_acc = (float *)((char *)workspace + 2 * aligned(rows * sizeof(float)));
    int *const dq_turn =
        variant == VARIANT_DETERMINISTIC
            ? (int *)((char *)p.dQ_acc + aligned((size_t)s->B * s->H * s->N * s->D * sizeof(float)))
            : NULL;
    p.H = s->H, p.H_kv = s->H_kv, p.group = s->H / s->H_kv;
    p.N = s->N, p.N_k = s->N_k, p.N_pad = N_pad, p.causal = s->causal;
    p.causal_shift = s->N_k - s->N;
    p.scale = s->scale, p.scale_log2 = s->scale * LOG2E;
    if (s->D == 64)
        return s->bf16 ? enqueue_backward<64, true>(s, p, dq_turn, variant, stream)
                       : enqueue_backward<64, false>(s, p, dq_turn, variant, stream);
    return s->bf16 ? enqueue_backward<128, true>(s, p, dq_turn, variant, stream)
                   : enqueue_backward<128, false>(s, p, dq_turn, variant, stream);
}
