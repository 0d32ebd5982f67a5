/*
 * common/device/backward_prepost.cuh: what the backward stages (7, on mma.sync, and 8, on wgmma)
 * share around their main kernels: the parameters those passes read (bwd_params), the pass before
 * (preprocess_kernel: D_i = rowsum(dO_i * O_i) and LSE_i in log2 units, padded, with dQ_acc
 * zeroed), the pass after (dq_convert_kernel: dQ = scale dQ_acc in the storage type), and dQ_acc's
 * description for the TMA unit's bulk reductions (dq_tensor_map, host code; its staging tile's
 * layout, DQ_SLAB_COLS). Both passes may be launched with programmatic dependent launch (warp.cuh:
 * let_next_kernel_start, wait_for_previous_kernel): each touches global memory only once the
 * kernel ahead of it has finished; the preprocess lets the main kernel be placed early.
 *
 * Device and host code for one translation unit (a stage's attention.cu includes it).
 */
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stddef.h>
#include <string.h>

#include "tensor_map.cuh"  // tensor_map_encoder (dq_tensor_map)
#include "warp.cuh"        // CHUNK_BYTES, pack2_of, LOG2E, ...

/* ---- the kernels' parameters ----------------------------------------------------------------- */

// Rows of lse2 and Dsum per head: N rounded up to ROW_PAD, a multiple of every tile's rows.
constexpr int ROW_PAD = 128;  // N_pad: N rounded up to this, a multiple of every tile's rows

// One tensor's strides in elements (attn_layout; the last dimension contiguous): element (b, h,
// row, c) lies at b batch + h head + row row_stride + c. The row stride in 32 bits
// (stage_unsupported bounds it), so that a tile's copy walks its rows with one address.
typedef struct {
    long long batch, head;
    unsigned row;
} tensor_strides;

typedef struct {
    tensor_strides q, k, v, o, dO, dQ, dK, dV;
} bwd_layouts;

// The 16-bit tensors are __half pointers whatever their type: fp16, or bf16 where the kernels'
// BF16 says so (only the products, the packing and the preprocess's reads tell them apart).
typedef struct bwd_params {
    // (packed: Q, O, dO, dQ [total_q, H, D], K, V, dK, dV [total_k, H_kv, D], lse [H, total_q],
    // dQ_acc [H, acc_rows, D], lse2 and Dsum [H, acc_rows]: bwd_sequence_of)
    const __half *Q, *K, *V, *O, *dO;  // Q, O, dO [B, H, N, D]; K, V [B, H_kv, N_k, D]; strided
    const float *lse;                  // [B, H, N] natural log (the forward's), contiguous
    __half *dQ, *dK, *dV;              // dQ [B, H, N, D]; dK, dV [B, H_kv, N_k, D]; strided
    float *dQ_acc;                     // [B, H, N, D] fp32, contiguous, zeroed by preprocess_kernel
    float *lse2;                       // [B * H, N_pad]: LSE * log2(e), +inf past N
    float *Dsum;                       // [B * H, N_pad]: D_i = rowsum(dO_i * O_i), 0 past N
    // A packed batch (attention.h's attn_varlen; all zero unpacked): the tensors' rows and lse as
    // attn_sequence_of reads them, and the workspace's rows by head, [H, acc_rows] (lse2, Dsum)
    // and [H, acc_rows, D] (dQ_acc), sequence b's from bwd_sequence_of's row_pad / row_acc.
    attn_varlen varlen;
    int acc_rows;  // packed: total_q + B * ROW_PAD rounded up to ROW_PAD
    // dQ_acc's layout: 0, rows of D floats as above; else tiles of TILE_ROWS rows, each in
    // slabs of DQ_SLAB_COLS columns, [tiles][dq_tiled / DQ_SLAB_COLS][TILE_ROWS][DQ_SLAB_COLS]
    // floats, the rows of head h of sequence b from row_pad + h * head_pad (lse2's rows;
    // dq_tiled_offset): stage 8's staging tile as it lies, so that one bulk copy adds a whole
    // tile or a warpgroup's slabs of it. dq_tiled: the columns a row holds there (the kernel's
    // head dim, or the tensors' D where it adds from registers: stage 8's launch.cuh,
    // dq_tiled_cols; the tensors' D may be less). The tile's rows, its kernel's query tile (a
    // divisor of ROW_PAD, so that no tile straddles two heads or sequences), are the passes'
    // TILE_ROWS.
    int dq_tiled;

    bwd_layouts layout;         // the eight tensors' strides
    int H, H_kv, group;         // query heads, key/value heads, H / H_kv (GQA)
    int N, N_k, N_pad, causal;  // queries, keys, N rounded up to ROW_PAD
    int key_shift;              // N_k - N: causal query i sees keys j <= i + key_shift
    float scale, scale_log2;    // scale, scale * log2(e)
    int D;  // the tensors' head dim (a pass with TAIL, compiled for a larger one, reads it here)
} bwd_params;

// The offset in elements of head h of batch b of a tensor (and rows_offset, warp.cuh, of a row).
__host__ __device__ __forceinline__ size_t head_offset(const tensor_strides &t, int b, int h) {
    return (size_t)b * t.batch + (size_t)h * t.head;
}

// Sequence b of a call as the backward reads it: its rows in the tensors and in lse (seq:
// attention.h's attn_sequence; unpacked, q_row = k_row = 0) and its rows in the workspace: lse2
// and Dsum of head h, row i at [row_pad + h * head_pad + i], dQ_acc's at [(row_acc + h * head_acc
// + i) * D]. Unpacked those are [B * H, N_pad] and [B * H, N, D]; packed, sequence b's rows start
// at its first row plus b ROW_PADs, rounded down to ROW_PAD (FlashAttention-3's varlen dQ_acc):
// a tile of up to ROW_PAD rows at a multiple of ROW_PAD in the sequence stays clear of the next
// sequence's rows (and of the arrays' end: acc_rows holds total_q + B ROW_PADs), so a kernel may
// write a whole tile's rows, padding included.
typedef struct {
    attn_sequence seq;
    long long row_pad, head_pad;  // lse2, Dsum
    long long row_acc, head_acc;  // dQ_acc
} bwd_sequence;

__host__ __device__ __forceinline__ bwd_sequence bwd_sequence_of(const bwd_params &p, int b) {
    bwd_sequence s;
    s.seq = attn_sequence_of(&p.varlen, b, p.H, p.N, p.N_k);
    if (p.varlen.cu_seqlens_q) {
        s.row_pad = s.row_acc = (s.seq.q_row + (long long)b * ROW_PAD) / ROW_PAD * ROW_PAD;
        s.head_pad = s.head_acc = p.acc_rows;
    } else {
        s.row_pad = (long long)b * p.H * p.N_pad, s.head_pad = p.N_pad;
        s.row_acc = (long long)b * p.H * p.N, s.head_acc = p.N;
    }
    return s;
}

/* ---- the parameters of a call ---------------------------------------------------------------- */

// The workspace: lse2 and Dsum [B * H, N_pad] floats, then (where the stage accumulates dQ in
// fp32) dQ_acc [B, H, N, D] floats (packed: [H, acc_rows] and [H, acc_rows, D]: bwd_pad_rows,
// bwd_acc_rows), each part starting at a multiple of WORKSPACE_ALIGN bytes (a stage may put more
// after them).
constexpr size_t WORKSPACE_ALIGN = 256;
static inline size_t aligned(size_t bytes) {
    return (bytes + WORKSPACE_ALIGN - 1) / WORKSPACE_ALIGN * WORKSPACE_ALIGN;
}
__host__ __device__ inline int padded_rows(int N) {
    return (N + ROW_PAD - 1) / ROW_PAD * ROW_PAD;
}
// Packed: rows per head of lse2, Dsum and dQ_acc (bwd_sequence_of).
static inline int packed_acc_rows(const attn_shape *s) {
    return padded_rows(s->varlen.total_q + s->B * ROW_PAD);
}
// Rows of lse2 and of Dsum (each), and of dQ_acc: [B * H, N_pad] and [B * H, N]; packed [H,
// acc_rows] both. A stage's workspace_bytes reads them.
static inline size_t bwd_pad_rows(const attn_shape *s) {
    return s->varlen.cu_seqlens_q ? (size_t)s->H * packed_acc_rows(s)
                                  : (size_t)s->B * s->H * padded_rows(s->N);
}
static inline size_t bwd_acc_rows(const attn_shape *s) {
    return s->varlen.cu_seqlens_q ? (size_t)s->H * packed_acc_rows(s) : (size_t)s->B * s->H * s->N;
}

// The parameters of the contract's backward() call for the passes before and after and the main
// kernel: its tensors with their strides, the shape, and the workspace's parts (dQ_acc NULL
// without with_dq_acc).
static bwd_params bwd_params_of(const attn_shape *s, const void *Q, const void *K, const void *V,
                                const void *O, const float *lse, const void *dO, void *dQ, void *dK,
                                void *dV, void *workspace, bool with_dq_acc) {
    const int N_pad = padded_rows(s->N);
    const size_t rows = bwd_pad_rows(s);
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
    p.dQ_acc =
        with_dq_acc ? (float *)((char *)workspace + 2 * aligned(rows * sizeof(float))) : NULL;
    p.H = s->H, p.H_kv = s->H_kv, p.group = s->H / s->H_kv;
    p.N = s->N, p.N_k = s->N_k, p.N_pad = N_pad, p.causal = s->causal;
    p.key_shift = s->N_k - s->N;
    p.scale = s->scale, p.scale_log2 = s->scale * LOG2E;
    p.D = s->D;
    p.varlen = s->varlen;
    p.acc_rows = s->varlen.cu_seqlens_q ? packed_acc_rows(s) : 0;
    return p;
}

/* ---- dQ_acc through the TMA unit ------------------------------------------------------------ */

// The staging tile holds the QROWS x D floats in slabs of DQ_SLAB_COLS columns, [D / DQ_SLAB_COLS]
// [QROWS][DQ_SLAB_COLS]: a slab row is 32 bytes, so the 4 rows a half-warp's fragment store
// writes are 128 contiguous bytes, every bank once. Stage 7's tensor map (dq_tensor_map) walks
// dQ_acc's rows of D floats in the same order: column within the slab, row, slab, (batch, head);
// stage 8's dQ_acc lies tiled as the staging tile does (dq_tiled_offset) and takes it by one bulk
// copy.
constexpr int DQ_SLAB_COLS = 8;
constexpr int DQ_SLAB_ROW_BYTES = DQ_SLAB_COLS * (int)sizeof(float);

// The float of dQ_acc at row `row` (counted as lse2's: row_pad + h * head_pad + i) and column
// `col` in the tiled layout (bwd_params' dq_tiled: `cols` columns a row, tiles of `tile_rows`).
__host__ __device__ __forceinline__ size_t dq_tiled_offset(long long row, int col, int cols,
                                                           int tile_rows) {
    const long long tile = row / tile_rows, in_tile = row - tile * tile_rows;
    return (size_t)(tile * tile_rows * cols +
                    (long long)(col / DQ_SLAB_COLS) * tile_rows * DQ_SLAB_COLS +
                    in_tile * DQ_SLAB_COLS + col % DQ_SLAB_COLS);
}
constexpr int DQ_MAP_RANK = 4;

// dQ_acc's rows a head and its heads: [B * H, N, D] floats, packed [H, acc_rows, D].
static inline void dq_acc_extent(const attn_shape *s, cuuint64_t *rows, cuuint64_t *heads) {
    const bool packed = s->varlen.cu_seqlens_q != NULL;
    *rows = packed ? (cuuint64_t)packed_acc_rows(s) : (cuuint64_t)s->N;
    *heads = packed ? (cuuint64_t)s->H : (cuuint64_t)s->B * s->H;
}

// A map of dQ_acc's floats for the TMA unit's reductions: `rank` dims, strides and box, every
// element stride 1, nothing filled past the ends (a reduction does not add there).
static inline cudaError_t dq_acc_map(CUtensorMap *map, float *dQ_acc, cuuint32_t rank,
                                     const cuuint64_t *dims, const cuuint64_t *strides,
                                     const cuuint32_t *box, CUtensorMapSwizzle swizzle) {
    PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
    if (!encode) return cudaErrorSymbolNotFound;
    const cuuint32_t elem_strides[DQ_MAP_RANK] = {1, 1, 1, 1};
    const CUresult r = encode(map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, rank, dQ_acc, dims, strides,
                              box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
                              CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

// dQ_acc [B * H, N, D] floats seen as [B * H][D / DQ_SLAB_COLS slabs][N rows]
// [DQ_SLAB_COLS] (innermost last: the layout of stage 7's staging tile), in boxes of qrows rows
// (a whole query tile), rows past N out of bounds. box_cols: the box's columns (a kernel compiled
// for a larger head dim than s->D stages them), those past D out of bounds: not added.
// Packed ([H, acc_rows, D]): [H][slabs][acc_rows][DQ_SLAB_COLS], a sequence's rows at row_acc
// (dq_map_coords).
static inline cudaError_t dq_tensor_map(CUtensorMap *map, float *dQ_acc, const attn_shape *s,
                                        int qrows, int box_cols = 0) {
    cuuint64_t rows, heads;
    dq_acc_extent(s, &rows, &heads);
    const cuuint64_t row = (cuuint64_t)s->D * sizeof(float);
    const cuuint64_t dims[DQ_MAP_RANK] = {DQ_SLAB_COLS, rows, (cuuint64_t)(s->D / DQ_SLAB_COLS),
                                          heads};
    const cuuint64_t strides[DQ_MAP_RANK - 1] = {row, DQ_SLAB_ROW_BYTES, row * rows};  // bytes
    const cuuint32_t box[DQ_MAP_RANK] = {DQ_SLAB_COLS, (cuuint32_t)qrows,
                                         (cuuint32_t)((box_cols ? box_cols : s->D) / DQ_SLAB_COLS),
                                         1};
    return dq_acc_map(map, dQ_acc, DQ_MAP_RANK, dims, strides, box, CU_TENSOR_MAP_SWIZZLE_NONE);
}

// The tensor-map coordinates {row, head} of row i of head h of sequence b in dQ_acc.
__device__ __forceinline__ int2 dq_map_coords(const bwd_params &p, const bwd_sequence &s, int b,
                                              int h, int i) {
    return p.varlen.cu_seqlens_q ? make_int2((int)s.row_acc + i, h) : make_int2(i, b * p.H + h);
}

/* ---- the passes before and after ----------------------------------------------------------- */

// D_i = rowsum(dO_i * O_i) in fp32 (O and dO read in their layouts, fp16 or BF16 bf16), and LSE_i
// in log2 units, for the padded rows of every head: rows past N get D = 0 and LSE = +inf, so that
// their P = 2^(s - inf) = 0 without a mask; so do rows that see no key (causal, N > N_k: the
// forward wrote O = 0, so D = 0, and LSE = -inf, whose 2^(s + inf) no kernel may compute). With dQ
// by atomics or bulk reductions, the row of dQ_acc they add into is zeroed here too (as
// FlashAttention-2's preprocess does: no separate pass over dQ_acc). A lane per 16-byte chunk of
// a row (D / 8 lanes: one load of O and one of dO each, and the chunk's floats of dQ_acc zeroed),
// so that D = 128 keeps as many loads in flight per byte as D = 64; the grid covers B * H * N_pad
// rows exactly (N_pad is a multiple of ROW_PAD). Packed, sequence b's rows are its own N_b, padded
// to ROW_PAD in its workspace rows (bwd_sequence_of); the rows of the grid past them write nothing
// (the workspace rows after them are the next sequence's). TAIL: the tensors' head dim is p.D <= D
// (a stage that runs it in a kernel compiled for D): the lanes past it read and zero nothing.
// TILE_ROWS: dQ_acc lies tiled in tiles of TILE_ROWS rows (p.dq_tiled columns a row,
// dq_tiled_offset), 0: in rows of D floats. A template parameter, so that a stage that never tiles
// compiles none of it, and a tile's place is a shift, not a 64-bit division. Launched with PDL
// (stage 8's small grids), this pass waits for the kernel ahead of it (the forward, or whatever
// wrote dO) before it reads anything, then lets the main kernel be placed while it ends: the main
// kernel may read the call's inputs (cu_seqlens) before its own wait.
constexpr int PREPROCESS_THREADS = 128;
__host__ __device__ constexpr int preprocess_lanes(int D) {
    return D / CHUNK_HALVES;
}
// The grid of preprocess_kernel for `rows` padded rows (B * H * N_pad) at head dim D.
static inline dim3 preprocess_grid(size_t rows, int D) {
    return dim3((unsigned)(rows * preprocess_lanes(D) / PREPROCESS_THREADS));
}

// Two 16-bit values (bf16 with BF16, else fp16) packed in a register, as floats.
template <bool BF16>
__device__ __forceinline__ float2 unpack2_of(uint32_t u) {
    if constexpr (BF16) {
        __nv_bfloat162 h;
        memcpy(&h, &u, sizeof h);
        return __bfloat1622float2(h);
    } else {
        __half2 h;
        memcpy(&h, &u, sizeof h);
        return __half22float2(h);
    }
}

template <int D, bool BF16, bool TAIL = false, int TILE_ROWS = 0>
__global__ void __launch_bounds__(PREPROCESS_THREADS) preprocess_kernel(const bwd_params p) {
    constexpr int LANES = preprocess_lanes(D);
    const int cols = TAIL ? p.D : D;  // dQ_acc's, O's and dO's columns
    constexpr int PAIRS_PER_CHUNK = CHUNK_BYTES / sizeof(uint32_t);
    static_assert(WARP_SIZE % LANES == 0, "a row's lanes lie in one warp");
    wait_for_previous_kernel();  // (PDL) O, dO, LSE written; dQ_acc read by the last call's passes
    let_next_kernel_start();     // once the kernels before have ended (the next may read inputs)
    const size_t row =
        ((size_t)blockIdx.x * PREPROCESS_THREADS + threadIdx.x) / LANES;  // [B * H, N_pad]
    const int sub = (int)threadIdx.x % LANES;                             // the row's chunk
    const size_t bh = row / (size_t)p.N_pad;
    const int i = (int)(row - bh * p.N_pad);
    const int b = (int)bh / p.H, h = (int)bh % p.H;  // (B * H fits a grid's y: 32 bits)
    const bwd_sequence s = bwd_sequence_of(p, b);
    const bool inside = i < s.seq.N;
    const int q_row = (int)s.seq.q_row + i;  // in Q, O, dO's layouts (packed: of the whole batch)
    float sum = 0.f;
    constexpr int FLOAT4_FLOATS = 4;
    static_assert(CHUNK_HALVES == DQ_SLAB_COLS, "a lane's chunk is a tiled slab's row");
    if constexpr (TILE_ROWS > 0) {
        // Tiled, the sequence's padded rows' tiles are one run of floats, which the threads of
        // those rows zero as rows of p.dq_tiled floats (a tile is whole padded rows): each store
        // a warp's consecutive chunks, not one a slab (LOG.md of stage 8, step 64).
        if (p.dQ_acc && i < padded_rows(s.seq.N) && sub * CHUNK_HALVES < p.dq_tiled) {
            float4 *const acc = reinterpret_cast<float4 *>(
                p.dQ_acc + (size_t)(s.row_pad + h * s.head_pad + i) * p.dq_tiled +
                sub * CHUNK_HALVES);
#pragma unroll
            for (int c = 0; c < CHUNK_HALVES / FLOAT4_FLOATS; ++c)
                acc[c] = make_float4(0.f, 0.f, 0.f, 0.f);
        }
    }
    if (inside && (!TAIL || sub * CHUNK_HALVES < cols)) {
        if (!TILE_ROWS && p.dQ_acc) {  // (the dQ by atomics or bulk reductions adds into it)
            float4 *const acc = reinterpret_cast<float4 *>(
                p.dQ_acc + (size_t)(s.row_acc + h * s.head_acc + i) * cols + sub * CHUNK_HALVES);
#pragma unroll
            for (int c = 0; c < CHUNK_HALVES / FLOAT4_FLOATS; ++c)
                acc[c] = make_float4(0.f, 0.f, 0.f, 0.f);
        }
        const uint4 o = *reinterpret_cast<const uint4 *>(p.O + head_offset(p.layout.o, b, h) +
                                                         rows_offset(q_row, p.layout.o.row) +
                                                         sub * CHUNK_HALVES);
        const uint4 d = *reinterpret_cast<const uint4 *>(p.dO + head_offset(p.layout.dO, b, h) +
                                                         rows_offset(q_row, p.layout.dO.row) +
                                                         sub * CHUNK_HALVES);
        const uint32_t *ow = reinterpret_cast<const uint32_t *>(&o);
        const uint32_t *dw = reinterpret_cast<const uint32_t *>(&d);
#pragma unroll
        for (int x = 0; x < PAIRS_PER_CHUNK; ++x) {
            const float2 of = unpack2_of<BF16>(ow[x]), df = unpack2_of<BF16>(dw[x]);
            sum = fmaf(of.x, df.x, fmaf(of.y, df.y, sum));
        }
    }
#pragma unroll
    for (int lanes = LANES / 2; lanes > 0; lanes /= 2)
        sum += __shfl_xor_sync(FULL_WARP, sum, lanes);
    // the sequence's rows and its padding to ROW_PAD (packed: past it lie the next sequence's)
    if (sub == 0 && i < padded_rows(s.seq.N)) {
        const size_t at = (size_t)(s.row_pad + h * s.head_pad + i);  // unpacked: row
        p.Dsum[at] = inside ? sum : 0.f;
        const float lse = inside ? p.lse[s.seq.lse_row + h * s.seq.lse_head + i] : INFINITY;
        p.lse2[at] = lse == -INFINITY ? INFINITY : lse * LOG2E;  // (a row with no key: +inf)
    }
}

// dQ = scale * dQ_acc, as fp16 (bf16 with BF16), written in dQ's layout: blockIdx.y the (batch,
// head), blockIdx.x CONVERT_THREADS x CONVERT_VECTORS float4s of it, a thread's CONVERT_VECTORS a
// block's width apart, all loaded before any is converted: the pass reads 16 bytes and writes 8
// per float4, so the bytes a thread keeps in flight set its speed. The float4s in dQ_acc's order,
// so that each load is a warp's 512 contiguous bytes: in rows of D floats, row by row; tiled (a
// row's slabs a tile's slab apart), by groups of CONVERT_LINE_ROWS rows, a slab at a time, each
// slab's four 32-byte rows one 128-byte line (a warp's load four lines, its stores 64 bytes of
// each of four rows of dQ). TAIL and TILE_ROWS as preprocess_kernel's. Launched with PDL (stage
// 8), its blocks take the SMs the main kernel's last blocks leave idle and wait for its end; it
// lets the kernel after it start only at its own end (a next call's kernels placed under it,
// waiting, measured slower: stage 8's LOG, step 82).
constexpr int CONVERT_THREADS = 256;
constexpr int CONVERT_FLOATS = 4;   // one float4 of dQ_acc
constexpr int CONVERT_VECTORS = 4;  // a thread's float4s
constexpr int CONVERT_BLOCK_FLOAT4S = CONVERT_THREADS * CONVERT_VECTORS;
constexpr int CACHE_LINE_BYTES = 128;                                    // an L1 / L2 cache line
constexpr int CONVERT_LINE_ROWS = CACHE_LINE_BYTES / DQ_SLAB_ROW_BYTES;  // a slab's rows a line
constexpr int CONVERT_SLAB_FLOAT4S = DQ_SLAB_COLS / CONVERT_FLOATS;      // a slab row's float4s
constexpr int CONVERT_LINE_FLOAT4S = CONVERT_LINE_ROWS * CONVERT_SLAB_FLOAT4S;
// The grid of dq_convert_kernel: a (batch, head) of N rows of s->D floats a blockIdx.y, N rounded
// up to whole groups of CONVERT_LINE_ROWS rows (packed: N the longest sequence's; a sequence's
// threads past its rows do nothing).
static inline dim3 convert_grid(const attn_shape *s) {
    const size_t rows =
        ((size_t)s->N + CONVERT_LINE_ROWS - 1) / CONVERT_LINE_ROWS * CONVERT_LINE_ROWS;
    const size_t head_float4s = rows * s->D / CONVERT_FLOATS;
    return dim3((unsigned)((head_float4s + CONVERT_BLOCK_FLOAT4S - 1) / CONVERT_BLOCK_FLOAT4S),
                (unsigned)(s->B * s->H));
}
template <int D, bool BF16, bool TAIL = false, int TILE_ROWS = 0>
__global__ void __launch_bounds__(CONVERT_THREADS) dq_convert_kernel(const bwd_params p) {
    wait_for_previous_kernel();  // (PDL) every add into dQ_acc done
    const int cols = TAIL ? p.D : D, row_float4s = cols / CONVERT_FLOATS;
    const int bh = (int)blockIdx.y, b = bh / p.H, h = bh % p.H;
    const bwd_sequence s = bwd_sequence_of(p, b);
    const size_t first = (size_t)blockIdx.x * CONVERT_BLOCK_FLOAT4S + threadIdx.x;
    const float4 *const acc =
        reinterpret_cast<const float4 *>(p.dQ_acc + (size_t)(s.row_acc + h * s.head_acc) * cols);
    const long long tiled_row = s.row_pad + h * s.head_pad;  // (dq_tiled: the head's first row)
    __half *const dQ = p.dQ + head_offset(p.layout.dQ, b, h);
    // Float4 i = first + v CONVERT_THREADS of the head is float4 i % unit of unit i / unit: a row
    // (unit = row_float4s), or tiled a group of CONVERT_LINE_ROWS rows, whose float4 j is in slab
    // j / CONVERT_LINE_FLOAT4S, row (j / CONVERT_SLAB_FLOAT4S) % CONVERT_LINE_ROWS of the group.
    // One division for the first, then steps of whole units and float4s (in the TAIL instances
    // row_float4s is the tensors', known only at run time: a 64-bit division).
    static_assert(TILE_ROWS % CONVERT_LINE_ROWS == 0, "a group of rows lies in one tile");
    const int unit = TILE_ROWS > 0 ? CONVERT_LINE_ROWS * row_float4s : row_float4s;
    int unit_at[CONVERT_VECTORS], in_unit[CONVERT_VECTORS];
    unit_at[0] = (int)(first / unit), in_unit[0] = (int)(first % unit);
    const int unit_step = CONVERT_THREADS / unit, in_step = CONVERT_THREADS % unit;
#pragma unroll
    for (int v = 1; v < CONVERT_VECTORS; ++v) {
        unit_at[v] = unit_at[v - 1] + unit_step, in_unit[v] = in_unit[v - 1] + in_step;
        if (in_unit[v] >= unit) in_unit[v] -= unit, ++unit_at[v];
    }
    int row[CONVERT_VECTORS], col[CONVERT_VECTORS];  // (col: in floats)
#pragma unroll
    for (int v = 0; v < CONVERT_VECTORS; ++v) {
        const int j = in_unit[v];
        if constexpr (TILE_ROWS > 0) {
            row[v] = unit_at[v] * CONVERT_LINE_ROWS + j / CONVERT_SLAB_FLOAT4S % CONVERT_LINE_ROWS;
            col[v] =
                j / CONVERT_LINE_FLOAT4S * DQ_SLAB_COLS + j % CONVERT_SLAB_FLOAT4S * CONVERT_FLOATS;
        } else {
            row[v] = unit_at[v], col[v] = j * CONVERT_FLOATS;
        }
    }
    float4 a[CONVERT_VECTORS];
#pragma unroll
    for (int v = 0; v < CONVERT_VECTORS; ++v) {  // the loads, all in flight at once
        if (row[v] >= s.seq.N) continue;
        if constexpr (TILE_ROWS > 0) {
            a[v] = *reinterpret_cast<const float4 *>(
                p.dQ_acc + dq_tiled_offset(tiled_row + row[v], col[v], p.dq_tiled, TILE_ROWS));
        } else {
            a[v] = acc[first + (size_t)v * CONVERT_THREADS];
        }
    }
#pragma unroll
    for (int v = 0; v < CONVERT_VECTORS; ++v) {  // then each converted and stored
        if (row[v] >= s.seq.N) continue;
        uint2 out;
        out.x = pack2_of<BF16>(a[v].x * p.scale, a[v].y * p.scale);
        out.y = pack2_of<BF16>(a[v].z * p.scale, a[v].w * p.scale);
        st_global_v2(dQ + rows_offset((int)s.seq.q_row + row[v], p.layout.dQ.row) + col[v], out);
    }
}

/* ---- split walks: a key tile's walk in shares, and the pass that adds them ------------------ */

// Where the grid's blocks (key tiles times B H_kv) fill at most half of the GPU's multiprocessors,
// one block per multiprocessor leaves the rest idle while each walks all of its key tile's query
// tiles: a short batch of few heads, one long head (the long sweep's B = H = 1). Each key tile's
// query tiles are then cut into shares, a block each (the grid's z), each walked for every head of
// the group as a whole walk is: as many shares as fill the multiprocessors once, at most
// WALK_SHARES_MAX (each share's dK_j and dV_j are another 2 D floats a key of workspace that the
// sum pass reads), none shorter than SHARE_MIN_STEPS steps of the longest walk (a share pays a
// block's two ends). Grids past a whole wave stay whole (stage 8's LOG.md, steps 73 and 81). A
// share's dK_j and dV_j leave the block in fp32, unscaled, [B H_kv][key tiles' keys][shares][2][D]
// floats (D the kernel's; dK's D, then dV's), and dkv_sum_kernel adds the shares in their order:
// dK and dV stay bit-identical from run to run.
constexpr int WALK_SHARES_MAX = 8;
constexpr int SHARE_MIN_STEPS = 2;

// The shares of shape s's walks for key tiles of `block_keys` keys and query tiles of `qrows` rows
// on `sm_count` multiprocessors: 1 (whole walks) where the blocks (key tiles x B H_kv) fill more
// than half of them. The longest walk is every query tile for each of the group's heads.
static inline int walk_shares_for(const attn_shape *s, int block_keys, int qrows, int sm_count) {
    const long long blocks = (long long)((s->N_k + block_keys - 1) / block_keys) * s->B * s->H_kv;
    const long long tiles = (s->N + qrows - 1) / qrows;
    const long long longest = (long long)(s->H / s->H_kv) * tiles;  // steps
    long long shares = blocks > 0 ? sm_count / blocks : 1;
    if (shares > WALK_SHARES_MAX) shares = WALK_SHARES_MAX;
    if (shares > tiles) shares = tiles;
    if (shares > longest / SHARE_MIN_STEPS) shares = longest / SHARE_MIN_STEPS;
    return shares < 2 ? 1 : (int)shares;
}

// Where a grid of whole walks of one length (no mask) is more than a wave and ends on a part of
// one, the multiprocessors its last blocks leave idle wait for them: up to a walk's time (a wave
// quantization's loss, as a GEMM's last wave of tiles). The walks of the grid's last work tiles,
// from `first` on, are then split in `shares` (a tail split, as stream-K's hybrid splits a GEMM's
// last tiles' k-loops): their blocks start after every whole walk's, in the multiprocessors those
// free. The first tile and the shares are those a model of the GPU's block scheduling predicts
// fastest (tail_end_steps: blocks start in the grid's order on the first free multiprocessor, a
// whole walk lasts its steps and BLOCK_END_STEPS more, a share its part of them and as many more),
// from the work tile that starts the last wave back by TAIL_WAVES_BACK waves at most, no more than
// TAIL_BLOCKS_MAX_WAVES waves of shares (each its dK_j and dV_j in fp32 through the workspace),
// none shorter than TAIL_SHARE_MIN_STEPS steps (shorter ones lost: their ends cost more than the
// model's two steps); kept where the model predicts TAIL_MIN_GAIN_PERCENT or more (the GPU's
// blocks never run in lockstep: the loss the model counts is larger than the one measured; stage
// 8's LOG.md, step 87).
constexpr int BLOCK_END_STEPS = 2;
constexpr int TAIL_WAVES_BACK = 2;
constexpr int TAIL_BLOCKS_MAX_WAVES = 4;
constexpr int TAIL_SHARE_MIN_STEPS = 16;
constexpr int TAIL_MIN_GAIN_PERCENT = 2;
typedef struct {
    long long first;  // the first work tile whose walk is split (the grid's order)
    int shares;       // 1: none split
} tail_split;

// The model's end, in steps: `whole` blocks of `a` steps, then `parts` blocks of `b` steps (b <=
// a), on `sms` multiprocessors, each block started in order on the first one free. The last wave of
// whole blocks (`left` of them) starts at t0, all of them together, and ends at t1 = t0 + a; the
// other f multiprocessors start parts at t0, t0 + b, ..., `before` of those rounds before t1; from
// then on every period b starts `left` parts at t1 + m b and f at t0 + (before + m) b.
static inline long long tail_end_steps(long long whole, long long a, long long parts, long long b,
                                       long long sms) {
    const long long t0 = whole / sms * a, left = whole % sms, f = sms - left;
    if (left == 0) return t0 + (parts + sms - 1) / sms * b;
    const long long t1 = t0 + a, before = (a + b - 1) / b;
    if (parts <= before * f) {
        const long long end = t0 + (parts + f - 1) / f * b;
        return end > t1 ? end : t1;
    }
    const long long rest = parts - before * f, m = rest / sms, r = rest % sms;
    const long long tf = t0 + before * b;  // (t1 <= tf < t1 + b)
    return r == 0 ? tf + m * b : r <= left ? t1 + (m + 1) * b : tf + (m + 1) * b;
}

// The tail split of a grid of `tiles` work tiles, each a walk of `steps` steps over `query_tiles`
// query tiles (times the group's heads), on `sm_count` multiprocessors: none ({tiles, 1}) where
// the grid is one wave or less, fills its last one, or the model gains too little.
static inline tail_split tail_split_for(long long tiles, long long steps, long long query_tiles,
                                        int sm_count) {
    const long long sms = sm_count, a = steps + BLOCK_END_STEPS;
    tail_split best = {tiles, 1};
    if (tiles <= sms || tiles % sms == 0) return best;
    const long long plain = tail_end_steps(tiles, a, 0, a, sms);
    long long best_end = plain;
    const long long last_wave = tiles / sms * sms;
    for (long long first = last_wave; first >= 0 && first >= last_wave - TAIL_WAVES_BACK * sms;
         first -= sms)
        for (int shares = 2; shares <= WALK_SHARES_MAX && shares <= query_tiles &&
                             steps / shares >= TAIL_SHARE_MIN_STEPS;
             ++shares) {
            const long long parts = (tiles - first) * shares;
            if (parts > TAIL_BLOCKS_MAX_WAVES * sms) break;
            const long long end = tail_end_steps(
                first, a, parts, (steps + shares - 1) / shares + BLOCK_END_STEPS, sms);
            if (end < best_end) best_end = end, best = {first, shares};
        }
    if (best_end * 100 > plain * (100 - TAIL_MIN_GAIN_PERCENT)) best = {tiles, 1};
    return best;
}

// The shares' workspace (dkv_part) for key tiles of `block_keys` keys, in floats of the kernel's
// head dim D: 0 with one share. first_key: the first key whose walk is split, counted over every
// (batch, key/value head)'s key tiles' keys one after another (0: all of them; a tail split's,
// below, its first work tile's).
static inline size_t dkv_part_bytes_for(const attn_shape *s, int shares, int block_keys, int D,
                                        size_t first_key = 0) {
    if (shares < 2) return 0;
    const size_t keys = (size_t)(s->N_k + block_keys - 1) / block_keys * block_keys;
    return ((size_t)s->B * s->H_kv * keys - first_key) * shares * 2 * D * sizeof(float);
}
// Where share z's dK row of a key lies in dkv_part, in floats: [B H_kv][head_keys][shares][2][D]
// (bh the (batch, key/value head), head_keys its key tiles' keys) from the key first_key on (as
// dkv_part_bytes_for counts it), a key's shares side by side for the sum pass to read together;
// the row's dV is D floats further, the next key's 2 D shares.
__host__ __device__ __forceinline__ size_t dkv_part_at(size_t bh, size_t head_keys, int key,
                                                       int shares, int z, int D,
                                                       size_t first_key = 0) {
    return ((bh * head_keys + key - first_key) * shares + z) * 2 * D;
}

// Share z of `shares` of a walk of *count query tiles from tile *first: the share's count and
// first tile, in place. The shares differ by a tile at most, the first count % shares one longer;
// a share may have none (a window's or the diagonal's short walks).
__host__ __device__ __forceinline__ void share_of_tiles(int *count, int *first, int shares, int z) {
    const int base = *count / shares, longer = *count % shares;
    *count = base + (z < longer ? 1 : 0);
    *first = *first + z * base + min(z, longer);
}

// The pass after a split walk's main kernel (stages 7 and 8): dK = scale times the sum of the
// shares' dK sums, dV = the sum of theirs, added in share order (bit-identical from run to run), in
// the storage type (bf16 with BF16) and in dK's and dV's layouts. blockIdx.y the (batch, key/value
// head) from the first whose keys are split (first_key / head_keys) on, a thread one float4 of a
// key's dK and dV: N_k rows of 2 cols / 4 float4s (cols the tensors' D, a multiple of 8; D the
// kernel's, the rows' pitch in dkv_part), those from first_key on (dkv_part_at), unpacked batches
// only (the stages split no packed batch's walks). A thread's loads of every share are in flight at
// once (a loop that added each as it came waited for them one after the other).
constexpr int DKV_SUM_THREADS = 256;
static inline dim3 dkv_sum_grid(const attn_shape *s, int first_bh = 0) {  // a thread a float4
    const long long float4s = (long long)s->N_k * 2 * s->D / CONVERT_FLOATS;
    return dim3((unsigned)((float4s + DKV_SUM_THREADS - 1) / DKV_SUM_THREADS),
                (unsigned)(s->B * s->H_kv - first_bh));
}
template <bool BF16>
__global__ void __launch_bounds__(DKV_SUM_THREADS)
    dkv_sum_kernel(const bwd_params p, const float *part, int D, int head_keys, int shares,
                   long long first_key) {
    let_next_kernel_start();
    wait_for_previous_kernel();  // (PDL) the main kernel's shares written
    const int cols = p.D, row_float4s = 2 * cols / CONVERT_FLOATS;
    const long long i = (long long)blockIdx.x * DKV_SUM_THREADS + threadIdx.x;
    if (i >= (long long)p.N_k * row_float4s) return;
    const int row = (int)(i / row_float4s), in_row = (int)(i % row_float4s);
    const int dv = in_row >= row_float4s / 2,
              col = (in_row - dv * row_float4s / 2) * CONVERT_FLOATS;
    const int bh = (int)(first_key / head_keys) + (int)blockIdx.y, b = bh / p.H_kv, h = bh % p.H_kv;
    if ((long long)bh * head_keys + row < first_key) return;  // a whole walk's key: written
    const float4 *at = reinterpret_cast<const float4 *>(
        part + dkv_part_at(bh, head_keys, row, shares, 0, D, (size_t)first_key) + dv * D + col);
    float4 a[WALK_SHARES_MAX];
#pragma unroll
    for (int z = 0; z < WALK_SHARES_MAX; ++z)
        if (z < shares) a[z] = at[(size_t)z * 2 * D / CONVERT_FLOATS];
    float4 sum = a[0];
#pragma unroll
    for (int z = 1; z < WALK_SHARES_MAX; ++z)
        if (z < shares) sum.x += a[z].x, sum.y += a[z].y, sum.z += a[z].z, sum.w += a[z].w;
    const float scale = dv ? 1.f : p.scale;
    uint2 out;
    out.x = pack2_of<BF16>(sum.x * scale, sum.y * scale);
    out.y = pack2_of<BF16>(sum.z * scale, sum.w * scale);
    const tensor_strides &l = dv ? p.layout.dV : p.layout.dK;
    __half *const to = (dv ? p.dV : p.dK) + head_offset(l, b, h);
    st_global_v2(to + rows_offset(row, l.row) + col, out);
}
