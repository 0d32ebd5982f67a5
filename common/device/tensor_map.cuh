/*
 * common/device/tensor_map.cuh: the driver's tensor-map encoder (cuTensorMapEncodeTiled), fetched
 * once through the runtime, so that no stage links -lcuda; host code. Stages 6 and 8 describe
 * their Q, K, V, O and dO tiles with it (tensor_map_slabs over tensor_map_4d: a [B, heads, rows,
 * D] tensor in its attn_layout); stages 7 and 8 their dQ reductions. NULL where the driver has none
 * (older than CUDA 12).
 */
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include "attention.h"  // attn_layout
#include "sm90.cuh"     // SLAB_COLS, HALF_BYTES: the slab wgmma's descriptors read

static PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder(void) {
    static PFN_cuTensorMapEncodeTiled_v12000 fn = NULL;
    if (!fn) {
        void *p = NULL;
        cudaDriverEntryPointQueryResult found;
#if CUDART_VERSION >= 12050
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault,
                                             &found) == cudaSuccess &&
            found == cudaDriverEntryPointSuccess)
#else
        if (cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &p, cudaEnableDefault, &found) ==
                cudaSuccess &&
            found == cudaDriverEntryPointSuccess)
#endif
            fn = (PFN_cuTensorMapEncodeTiled_v12000)p;
    }
    return fn;
}

// TMA's limits on a tensor in global memory (cuTensorMapEncodeTiled): every stride but the
// innermost dimension's (contiguous) a multiple of 16 bytes and below 2^40 bytes; every extent at
// most 2^32 (the course's int extents are).
constexpr long long TMA_STRIDE_ALIGN = 16;
constexpr long long TMA_STRIDE_LIMIT = 1LL << 40;

// A stride of `bytes` that TMA takes, and one it takes for a dimension of `extent` elements (one
// element: any stride reads the same bytes; tensor_map_4d replaces one TMA does not take).
static inline bool tma_stride_valid(long long bytes) {
    return bytes > 0 && bytes % TMA_STRIDE_ALIGN == 0 && bytes < TMA_STRIDE_LIMIT;
}
static inline bool tma_stride_ok(long long bytes, long long extent) {
    return extent == 1 || tma_stride_valid(bytes);
}

// Whether TMA can read or write a [B, heads, rows, D] tensor of elem_bytes-byte elements whose
// strides (elements) are l.
static inline bool tensor_map_takes(const attn_layout *l, int B, int heads, int rows,
                                    int elem_bytes) {
    return tma_stride_ok(l->batch * elem_bytes, B) && tma_stride_ok(l->head * elem_bytes, heads) &&
           tma_stride_ok(l->row * elem_bytes, rows);
}

// A [B, heads, rows, D] tensor with strides l (elements; attention.h's attn_layout, D contiguous)
// as a 4-D tensor map, innermost first: (D, rows, heads, B), seen in boxes of [1, 1, box_rows,
// box_cols]; rows past `rows` read as zeros and are not written. A layout tensor_map_takes()
// refuses makes cudaErrorInvalidValue.
static inline cudaError_t tensor_map_4d(CUtensorMap *map, CUtensorMapDataType type, int elem_bytes,
                                        const void *base, int B, int heads, int rows, int D,
                                        const attn_layout *l, int box_cols, int box_rows,
                                        CUtensorMapSwizzle swizzle) {
    PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
    if (!encode) return cudaErrorSymbolNotFound;
    if (!tensor_map_takes(l, B, heads, rows, elem_bytes)) return cudaErrorInvalidValue;
    const long long row_bytes = (long long)D * elem_bytes;  // a stride TMA takes (D: 64, 128)
    const long long given[3] = {l->row * elem_bytes, l->head * elem_bytes, l->batch * elem_bytes};
    const long long extent[3] = {rows, heads, B};
    cuuint64_t strides[3];
    for (int i = 0; i < 3; ++i)
        strides[i] = (cuuint64_t)(tma_stride_valid(given[i]) ? given[i] : row_bytes);
    const cuuint64_t dims[4] = {(cuuint64_t)D, (cuuint64_t)extent[0], (cuuint64_t)extent[1],
                                (cuuint64_t)extent[2]};
    const cuuint32_t box[4] = {(cuuint32_t)box_cols, (cuuint32_t)box_rows, 1, 1};
    const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
    const CUresult r = encode(
        map, type, 4, (void *)base, dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
        swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

// Q, K, V, O, dO of a stage on wgmma (stages 6 and 8): a 16-bit [B, heads, rows, D] tensor (bf16
// where s->bf16) seen in boxes of [1, 1, box_rows, SLAB_COLS], one 128-byte-swizzled slab of
// sm90.cuh; rows past `rows` read as zeros and are not written.
static inline cudaError_t tensor_map_slabs(CUtensorMap *map, const void *base, const attn_shape *s,
                                           int heads, int rows, const attn_layout *l,
                                           int box_rows) {
    const CUtensorMapDataType type =
        s->bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
    return tensor_map_4d(map, type, HALF_BYTES, base, s->B, heads, rows, s->D, l, SLAB_COLS,
                         box_rows, CU_TENSOR_MAP_SWIZZLE_128B);
}
