/*
 * Stage 4: tensor cores through nvcuda::wmma, softmax by warps (fp16 storage, fp32 math).
 *
 * Adds over stage 3, and nothing else:
 *   (a) tensor cores: S = Q K^T and O += P V run as 16x16x16 WMMA products (fp16 operands,
 *       fp32 accumulation) instead of one scalar FMA per multiply-add;
 *   (b) softmax by warps: a block is 4 warps, each warp owns 16 query rows (one WMMA row tile)
 *       and a private slice of shared memory. It stores its S tile (float) there; two lanes per
 *       row do the online softmax on it (row max and row sum: one shuffle each) and write P
 *       (half) over S; the warp loads P back as the A operand of P V. O_acc stays in registers
 *       as WMMA accumulators (the note before the kernel says how a row of them is rescaled
 *       without knowing WMMA's register layout). At D = 128, Q_i sits in registers too.
 * Tiling, fp16 storage, the double-buffered K/V pipeline (cp.async on sm_80+, register-staged
 * on sm_75) and the online softmax (m_i, l_i, O_acc) are stage 3's. The warps share nothing
 * but the K/V tiles, so stage 3's one __syncthreads per key tile stays the only barrier in the
 * key loop.
 *
 * Expected gain over stage 3: for 16 query rows and 64 keys at D = 128, stage 3 issues 8,192
 * warp-wide FMA instructions (16 * 64 * 2 * 128 FMAs / 32 lanes); here the same work is 64 WMMA
 * products, 128 tensor-core instructions (HMMA.16816). The tensor cores do 8-16x the
 * multiply-adds per clock of the fp32 cores; the S/P round trips through shared memory and the
 * scalar softmax take back part of it: expect 5-10x over stage 3 at D = 128, half to two
 * thirds of FA2.
 *
 * Run: make build && build/stage4_wmma --seq 4096 --dim 128 --heads 16 --batch 4 --bench
 *
 * NOTE: S and P still make a round trip through shared memory on every tile (store S, read it
 * for the softmax, write P, load P as fragments), because WMMA hides which lane holds which
 * element. Stage 5 uses mma.sync, whose fragment layout is documented, keeps S and P in
 * registers, and feeds the tensor cores with ldmatrix from swizzled shared memory.
 */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <limits.h>
#include <math.h>
#include <mma.h>
#include <stdint.h>

#include "attention.h"

using namespace nvcuda;

/* ---- tunables ---------------------------------------------------------------------------- */

// cp.async exists from sm_80 on; sm_75 prefetches through registers instead. (A macro, not
// #if __CUDA_ARCH__, because constant expressions below depend on it.)
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#define HAS_CP_ASYNC 0
#else
#define HAS_CP_ASYNC 1
#endif

// Warps per block. Each warp owns 16 query rows (one WMMA row tile) and its own S/P slice.
constexpr int WARPS = 4;
// Q rows per block: 4 warps x 16 rows.
constexpr int BR = 16 * WARPS;
constexpr int THREADS = 32 * WARPS;
// K/V rows per tile: 64 (4 WMMA column tiles of S per warp, half the barriers per key of 32)
// where two blocks fit on an SM (tile_bc); at D = 128 a block then takes 103 KB.
constexpr int BC_LARGE = 64;
// K/V rows per tile otherwise: D = 128 on an A100 (two blocks of 61 KB), an L4 or a T4.
constexpr int BC_SMALL = 32;
// Halves of padding after each Q/K/V smem row: 16 bytes keeps WMMA's ldm a multiple of 8
// halves and starts each row 4 banks after the previous one, so the 8 rows a fragment load
// reads at once fall into 8 different bank groups.
constexpr int PAD = 8;
// Floats of padding after each S row: rows 8 banks apart, so the 64-bit stores of an
// accumulator (per half-warp: 4 rows x 8 floats) hit 32 different banks.
constexpr int S_PAD = 8;
// The half-precision WMMA shape (sm_70+): 16 x 16 x 16.
constexpr int WM = 16, WN = 16, WK = 16;
// Blocks per SM the tiles are chosen for (tile_bc): 2, i.e. 8 warps.
constexpr int MIN_BLOCKS = 2;
// Launch bound: the blocks per SM whose registers ptxas must leave room for. MIN_BLOCKS lets it
// use up to 255. D = 64 with 64-key tiles on sm_80+ asks for 3: three 63 KB blocks share an
// H100 SM, and the kernel fits 168 registers once Q_i is read from smem (Q_IN_REGS). Left
// alone, ptxas takes fewer registers, and D = 64 measured slower (README.md).
template <int D, int BC>
constexpr int launch_min_blocks() {
    return D == 64 && BC == BC_LARGE && HAS_CP_ASYNC ? 3 : MIN_BLOCKS;
}

// The warp's 16 rows of Q_i are the A operand of every S = Q_i K_j^T: at D = 128, load their 8
// fragments once and keep them in registers for the whole key loop. At D = 64 the registers buy a
// third block per SM instead, and on sm_75 with 64-key tiles they hold the staged tile: there the
// fragments are re-read from Q_smem for every key tile.
template <int D, int BC>
__host__ __device__ constexpr bool q_in_regs() {
    return D == 128 && (HAS_CP_ASYNC || BC == BC_SMALL);
}

/* ---- device helpers ---------------------------------------------------------------------- */

// Elements per 16-byte chunk: the unit of every global and shared-memory copy below.
constexpr int CHUNK = 16 / sizeof(__half);

// Rows row0 .. row0 + ROWS - 1 of one head's [N, D] matrix -> tile[ROWS][LD] in shared memory
// (LD >= D elements per row), in 16-byte chunks: consecutive threads take consecutive chunks, so
// the global reads coalesce. Rows >= N are zero-filled: a tail tile reads nothing out of bounds,
// and its zero K/V rows never put a NaN into S or O. A thread keeps one column and steps down
// the rows, so its addresses are one base plus constants.
template <int ROWS, int D, int LD, int THREADS>
__device__ __forceinline__ void load_tile(__half *tile, const __half *__restrict__ src, int row0,
                                          int N, int tid) {
    constexpr int CHUNKS_PER_ROW = D / CHUNK;
    constexpr int ROWS_PER_PASS = THREADS / CHUNKS_PER_ROW;
    static_assert(ROWS % ROWS_PER_PASS == 0, "every thread takes as many chunks");
    const int col = (tid % CHUNKS_PER_ROW) * CHUNK;
#pragma unroll
    for (int r = tid / CHUNKS_PER_ROW; r < ROWS; r += ROWS_PER_PASS) {
        uint4 v = make_uint4(0, 0, 0, 0);
        if (row0 + r < N) v = *(const uint4 *)(src + (size_t)(row0 + r) * D + col);
        *(uint4 *)(tile + r * LD + col) = v;
    }
}

#if HAS_CP_ASYNC
// One 16-byte cp.async: global -> shared memory, bypassing registers and L1 (.cg). The copy
// writes src_bytes bytes from gmem and zero-fills the rest, so src_bytes = 0 writes 16 zeros
// and reads nothing.
__device__ __forceinline__ void cp_async_16(void *smem, const void *gmem, int src_bytes) {
    const unsigned dst = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem),
                 "r"(src_bytes)
                 : "memory");
}

// Close the group of this thread's cp.asyncs issued so far.
__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Wait until all of this thread's committed cp.async groups have landed in shared memory.
__device__ __forceinline__ void cp_async_wait_all() {
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}

// load_tile without waiting: the same rows and chunks, issued as cp.asyncs (not yet committed).
template <int ROWS, int D, int LD, int THREADS>
__device__ __forceinline__ void load_tile_async(__half *tile, const __half *__restrict__ src,
                                                int row0, int N, int tid) {
    constexpr int CHUNKS_PER_ROW = D / CHUNK;
    constexpr int ROWS_PER_PASS = THREADS / CHUNKS_PER_ROW;
    static_assert(ROWS % ROWS_PER_PASS == 0, "every thread takes as many chunks");
    const int col = (tid % CHUNKS_PER_ROW) * CHUNK;
#pragma unroll
    for (int r = tid / CHUNKS_PER_ROW; r < ROWS; r += ROWS_PER_PASS) {
        const bool in = row0 + r < N;  // rows >= N: source size 0, i.e. zero-fill
        cp_async_16(tile + r * LD + col, in ? src + (size_t)(row0 + r) * D + col : src,
                    in ? 16 : 0);
    }
}
#else
// sm_75 has no cp.async: the next tile is staged through registers instead, in two halves.
// fetch_tile: this thread's chunks of rows row0 .. row0 + ROWS - 1 -> regs (rows >= N: zeros).
template <int ROWS, int D, int THREADS>
__device__ __forceinline__ void fetch_tile(uint4 regs[ROWS * D / CHUNK / THREADS],
                                           const __half *__restrict__ src, int row0, int N,
                                           int tid) {
    constexpr int CHUNKS_PER_ROW = D / CHUNK;
    constexpr int ROWS_PER_PASS = THREADS / CHUNKS_PER_ROW;
    static_assert(ROWS % ROWS_PER_PASS == 0, "every thread takes as many chunks");
    const int r0 = tid / CHUNKS_PER_ROW, col = (tid % CHUNKS_PER_ROW) * CHUNK;
#pragma unroll
    for (int n = 0; n < ROWS / ROWS_PER_PASS; ++n) {
        const int r = r0 + n * ROWS_PER_PASS;
        regs[n] = make_uint4(0, 0, 0, 0);
        if (row0 + r < N) regs[n] = *(const uint4 *)(src + (size_t)(row0 + r) * D + col);
    }
}

// stash_tile: regs from fetch_tile -> tile[ROWS][LD] in shared memory, the same chunks.
template <int ROWS, int D, int LD, int THREADS>
__device__ __forceinline__ void stash_tile(__half *tile,
                                           const uint4 regs[ROWS * D / CHUNK / THREADS], int tid) {
    constexpr int CHUNKS_PER_ROW = D / CHUNK;
    constexpr int ROWS_PER_PASS = THREADS / CHUNKS_PER_ROW;
    const int r0 = tid / CHUNKS_PER_ROW, col = (tid % CHUNKS_PER_ROW) * CHUNK;
#pragma unroll
    for (int n = 0; n < ROWS / ROWS_PER_PASS; ++n)
        *(uint4 *)(tile + (r0 + n * ROWS_PER_PASS) * LD + col) = regs[n];
}
#endif

/* ---- kernel phases ----------------------------------------------------------------------- */

typedef wmma::fragment<wmma::matrix_a, WM, WN, WK, __half, wmma::row_major> frag_a;   // Q, P
typedef wmma::fragment<wmma::matrix_b, WM, WN, WK, __half, wmma::col_major> frag_bt;  // K^T
typedef wmma::fragment<wmma::matrix_b, WM, WN, WK, __half, wmma::row_major> frag_b;   // V
typedef wmma::fragment<wmma::accumulator, WM, WN, WK, float> frag_acc;                // S, O

// The steps of the kernel's schedule below, each a named piece (__forceinline__, so the names cost
// no instruction): the kernel's loop body reads as the schedule.

// Prologue: key tile 0 -> buffer 0 (cp.async: in flight).
template <int D, int BC, int LD>
__device__ __forceinline__ void load_first_tile(__half *K_buf, __half *V_buf, const __half *K,
                                                const __half *V, int N, int tid) {
#if HAS_CP_ASYNC
    load_tile_async<BC, D, LD, THREADS>(K_buf, K, 0, N, tid);
    load_tile_async<BC, D, LD, THREADS>(V_buf, V, 0, N, tid);
    cp_async_commit();
#else
    load_tile<BC, D, LD, THREADS>(K_buf, K, 0, N, tid);
    load_tile<BC, D, LD, THREADS>(V_buf, V, 0, N, tid);
#endif
}

#if HAS_CP_ASYNC
// Prefetch: K/V tile kt + 1 (keys k0 + BC ..) -> the other buffer, K_next and V_next, by cp.async:
// in flight while the block computes on tile kt; nothing after the last tile (prefetch false).
template <int D, int BC, int LD>
__device__ __forceinline__ void prefetch_tile_async(__half *K_next, __half *V_next, const __half *K,
                                                    const __half *V, int k0, int N, int tid,
                                                    bool prefetch) {
    if (prefetch) {  // tile kt + 1 -> the other buffer, in flight while we compute
        load_tile_async<BC, D, LD, THREADS>(K_next, K, k0 + BC, N, tid);
        load_tile_async<BC, D, LD, THREADS>(V_next, V, k0 + BC, N, tid);
        cp_async_commit();
    }
}
#else
// sm_75's register-staged prefetch, its middle: K of tile kt + 1 (keys k1 ..), fetched into this
// thread's registers next, -> the other buffer K_next; then its V into the same registers.
template <int D, int BC, int LD>
__device__ __forceinline__ void stash_k_fetch_v(__half *K_next,
                                                uint4 next[BC * D / CHUNK / THREADS],
                                                const __half *V, int k1, int N, int tid) {
    stash_tile<BC, D, LD, THREADS>(K_next, next, tid);
    fetch_tile<BC, D, THREADS>(next, V, k1, N, tid);
}
#endif

// The row-number fragment (see the note before the kernel): a matrix whose entries are their own
// row numbers, written into the warp's slice S_w and loaded as an accumulator fragment.
template <int S_LD>
__device__ __forceinline__ frag_acc row_number_fragment(float *S_w, int lane) {
    for (int e = lane; e < WM * WN; e += 32) S_w[(e / WN) * S_LD + e % WN] = (float)(e / WN);
    __syncwarp();  // the row-number matrix is complete before the warp loads it
    frag_acc rows;
    wmma::load_matrix_sync(rows, S_w, S_LD, wmma::mem_row_major);
    return rows;
}

// Step 1's product for one k slice: S[:, n] += Q_k K_k^T for the BC/16 accumulators side by
// side; Q_k is the warp's 16 x 16 slice k of Q_i, K_k the key tile from column k * 16 on.
template <int BC, int LD>
__device__ __forceinline__ void scores_k(frag_acc S_frag[BC / WN], const frag_a &Q_k,
                                         const __half *K_k) {
    // LAB HOLE 1 BEGIN [design]: step 1, S = Q_i K_j^T: one k slice's products
    // LAB TODO: (your split of step 1, with scores() below; this part may stay empty) S_frag[n] +=
    // LAB TODO: Q_k (K_j's keys 16n .. 16n + 15, head-dim columns of this slice)^T for the BC/16
    // LAB TODO: key blocks n. K_k points at column 16k of K_smem [BC][LD] (halves, keys along
    // LAB TODO: rows): the B operand is K^T, which K_smem holds only transposed.
    // LAB STUB: (void)S_frag, (void)Q_k, (void)K_k;  // unused until filled
#pragma unroll
    for (int n = 0; n < BC / WN; ++n) {
        frag_bt K_frag;  // K^T read column-major: its column n is key row n of K_j
        wmma::load_matrix_sync(K_frag, K_k + n * WN * LD, LD);
        wmma::mma_sync(S_frag[n], Q_k, K_frag, S_frag[n]);
    }
    // LAB HOLE 1 END
}

// One factor per element of an accumulator fragment: the value `per_row` of the element's row,
// taken from the lane that holds it (row_lane[e], see the note before the kernel).
typedef struct {
    float x[frag_acc::num_elements];
} row_factors;

__device__ __forceinline__ row_factors factors_by_row(float per_row,
                                                      const int row_lane[frag_acc::num_elements]) {
    row_factors f;
#pragma unroll
    for (int e = 0; e < frag_acc::num_elements; ++e)
        f.x[e] = __shfl_sync(0xffffffffu, per_row, row_lane[e]);
    return f;
}

// Step 2's mask on one float4 piece of a row of S (keys kj0 .. kj0 + 3): keys past N and, when
// causal, keys after query row i get -inf.
__device__ __forceinline__ void mask_piece(float S4[4], int kj0, int N, int causal, int i) {
#pragma unroll
    for (int u = 0; u < 4; ++u) {
        const int kj = kj0 + u;
        if (kj >= N || (causal && kj > i)) S4[u] = -INFINITY;
    }
}

// Step 2's exponentials: S[t] = exp(S[t] - m_ref), now P in fp32; returns their sum.
template <int BC>
__device__ __forceinline__ float exp_and_sum(float S[BC / 2], float m_ref) {
    float l_new = 0.f;
#pragma unroll
    for (int t = 0; t < BC / 2; ++t) {
        S[t] = __expf(S[t] - m_ref);  // now P, in fp32
        l_new += S[t];
    }
    return l_new;
}

// Step 3's store of one piece: four floats as four halves (8 bytes) at dst.
__device__ __forceinline__ void store_half4(__half *dst, const float S4[4]) {
    const __half2 lo = __floats2half2_rn(S4[0], S4[1]);
    const __half2 hi = __floats2half2_rn(S4[2], S4[3]);
    *(uint2 *)dst = make_uint2(*(const unsigned *)&lo, *(const unsigned *)&hi);
}

// The end's store of one 16-byte chunk of O: eight floats of S_w as eight halves at dst.
__device__ __forceinline__ void store_half8(__half *dst, const float *src) {
    const float4 a = *(const float4 *)src;
    const float4 b = *(const float4 *)(src + 4);
    const __half2 o0 = __floats2half2_rn(a.x, a.y), o1 = __floats2half2_rn(a.z, a.w);
    const __half2 o2 = __floats2half2_rn(b.x, b.y), o3 = __floats2half2_rn(b.z, b.w);
    *(uint4 *)dst = make_uint4(*(const unsigned *)&o0, *(const unsigned *)&o1,
                               *(const unsigned *)&o2, *(const unsigned *)&o3);
}

// Step 4's product for one k slice: O_acc[n] += P_k V_k for the D/16 accumulators; P_k is the
// warp's 16 x 16 slice k of P, V_k the value tile from row k * 16 on.
template <int D, int LD>
__device__ __forceinline__ void accumulate_pv_k(frag_acc O_acc[D / WN], const frag_a &P_k,
                                                const __half *V_k) {
    // LAB HOLE 2 BEGIN [design]: step 4, O_acc = alpha O_acc + P V_j: one k slice
    // LAB TODO: (your split of step 4, with accumulate_pv() below; this part may stay empty)
    // LAB TODO: O_acc[n] += P_k (V_j's 16 keys of this slice, head-dim columns 16n .. 16n + 15) for
    // LAB TODO: the D/16 blocks n. V_k points at row 16k of V_smem [BC][LD] (halves, keys along
    // LAB TODO: rows, head dim along columns).
    // LAB STUB: (void)O_acc, (void)P_k, (void)V_k;  // unused until filled
#pragma unroll
    for (int n = 0; n < D / WN; ++n) {
        frag_b V_frag;
        wmma::load_matrix_sync(V_frag, V_k + n * WN, LD);
        wmma::mma_sync(O_acc[n], P_k, V_frag, O_acc[n]);
    }
    // LAB HOLE 2 END
}

// Row numbers: row_lane[e] = the lane holding the alpha and l_i of the row of element e of an
// accumulator fragment (2 * row, see the note before the kernel).
template <int S_LD>
__device__ __forceinline__ void row_lanes(int row_lane[frag_acc::num_elements], float *S_w,
                                          int lane) {
    const frag_acc rows = row_number_fragment<S_LD>(S_w, lane);
#pragma unroll
    for (int e = 0; e < frag_acc::num_elements; ++e) row_lane[e] = 2 * (int)rows.x[e];
}

// The warp's 16 rows of Q_i (Q_w) as the A fragments of S = Q_i K_j^T, kept in registers for the
// whole key loop when Q_IN_REGS (see the kernel).
template <int D, int LD, bool Q_IN_REGS>
__device__ __forceinline__ void load_q_fragments(frag_a Q_frag[D / WK], const __half *Q_w) {
    // LAB HOLE 1 BEGIN [design]: step 1, S = Q_i K_j^T: Q_i's A fragments in registers
    // LAB TODO: when Q_IN_REGS, Q_frag[k] (k < D/16) holds the warp's 16 rows of Q_i, head-dim
    // LAB TODO: columns 16k .. 16k + 15, as the A operand of step 1 for the whole key loop; Q_w is
    // LAB TODO: those rows in Q_smem ([16][LD] halves). Otherwise nothing: scores() reads Q_w.
    // LAB STUB: (void)Q_frag, (void)Q_w;  // unused until filled
#pragma unroll
    for (int k = 0; k < D / WK; ++k)
        if (Q_IN_REGS) wmma::load_matrix_sync(Q_frag[k], Q_w + k * WK, LD);
    // LAB HOLE 1 END
}

// Step 1: S = Q_i K_j^T on the tensor cores: k outer, the BC/16 accumulators side by side; the
// 16 x BC floats go to the warp's slice S_w. Q_k from registers (Q_IN_REGS) or from Q_w.
template <int D, int BC, int LD, int S_LD, bool Q_IN_REGS>
__device__ __forceinline__ void scores(float *S_w, const frag_a Q_frag[D / WK], const __half *Q_w,
                                       const __half *K_smem) {
    // LAB HOLE 1 BEGIN [design]: step 1, S = Q_i K_j^T: the products into the slice
    // LAB TODO: S = Q_i K_j^T for the warp's 16 query rows and the tile's BC keys, on the tensor
    // LAB TODO: cores (16 x 16 x 16 fp16 products, fp32 accumulation), unscaled, written to the
    // LAB TODO: warp's slice S_w: [16][S_LD] floats, row-major, S_w[r][c] = q_r . k_c, where step
    // LAB TODO: 2 reads its rows. Q_i: Q_frag (when Q_IN_REGS) or the warp's rows Q_w in Q_smem
    // LAB TODO: ([16][LD] halves); K_j: K_smem [BC][LD] halves, keys along rows. Only this warp
    // LAB TODO: touches S_w; the kernel orders its reads after your stores (__syncwarp).
    // LAB STUB: (void)S_w, (void)Q_frag, (void)Q_w, (void)K_smem;  // S_w keeps stale values
    frag_acc S_frag[BC / WN];
#pragma unroll
    for (int n = 0; n < BC / WN; ++n) wmma::fill_fragment(S_frag[n], 0.f);
#pragma unroll
    for (int k = 0; k < D / WK; ++k) {
        frag_a Q_k;
        if (Q_IN_REGS)
            Q_k = Q_frag[k];
        else
            wmma::load_matrix_sync(Q_k, Q_w + k * WK, LD);
        scores_k<BC, LD>(S_frag, Q_k, K_smem + k * WK);
    }
#pragma unroll
    for (int n = 0; n < BC / WN; ++n)
        wmma::store_matrix_sync(S_w + n * WN, S_frag[n], S_LD, wmma::mem_row_major);
    // LAB HOLE 1 END
}

// Step 2: the online softmax on row r of the warp's S_w: scale, mask (keys past N; causal: keys
// after row i), new running max m_i, S = P = exp(S - m_new) in fp32, l_i. Returns alpha =
// exp(m_old - m_new), which rescales O_acc.
// Softmax layout: lanes 2r and 2r+1 own row r of the warp's 16 (query row i); half h of the pair
// holds columns [h * BC/2, (h + 1) * BC/2) as SEGS float4 pieces. Lane h = 1 visits its pieces
// rotated by one, so the 8 lanes of a 128-bit S read, and the 16 of a 64-bit P write, fall on
// different banks.
template <int BC, int S_LD>
__device__ __forceinline__ float online_softmax_update(float S[BC / 2], float &m_i, float &l_i,
                                                       const float *S_w, int r, int h, int k0,
                                                       int qw, int i, int N, int causal,
                                                       float scale) {
    constexpr int SEGS = BC / 8;  // float4 pieces in half an S row: one lane's share
    // Only a tail tile, or a causal tile reaching past the warp's first row, needs the mask.
    const bool mask = k0 + BC > N || (causal && k0 + BC - 1 > qw);
    const float *S_row = S_w + r * S_LD;
    float m_new = m_i;
#pragma unroll
    for (int t = 0; t < SEGS; ++t) {
        const int seg = h * SEGS + (t + h) % SEGS;  // float4 piece of row r
        const float4 v = *(const float4 *)(S_row + 4 * seg);
        S[4 * t + 0] = v.x * scale;
        S[4 * t + 1] = v.y * scale;
        S[4 * t + 2] = v.z * scale;
        S[4 * t + 3] = v.w * scale;
        if (mask) mask_piece(S + 4 * t, k0 + 4 * seg, N, causal, i);
#pragma unroll
        for (int u = 0; u < 4; ++u) m_new = fmaxf(m_new, S[4 * t + u]);
    }
    m_new = fmaxf(m_new, __shfl_xor_sync(0xffffffffu, m_new, 1));  // the pair's max
    // While every key so far is masked, m_new is -inf: subtract 0 instead, so that
    // exp(-inf - -inf) = NaN never happens (the exps are then all 0).
    const float m_ref = (m_new == -INFINITY) ? 0.f : m_new;
    const float alpha = __expf(m_i - m_ref);  // rescales the old l_i, O_acc (0 at start)
    float l_new = exp_and_sum<BC>(S, m_ref);
    l_new += __shfl_xor_sync(0xffffffffu, l_new, 1);  // the pair's sum
    l_i = l_i * alpha + l_new;
    m_i = m_new;
    return alpha;
}

// Step 3: P -> half, over the S tile: row r of the warp's P_w, this lane's half h.
template <int BC, int P_LD>
__device__ __forceinline__ void store_p(__half *P_w, const float S[BC / 2], int r, int h) {
    static_assert(P_LD * sizeof(__half) <= (BC + S_PAD) * sizeof(float),
                  "a P row fits in an S row");
    constexpr int SEGS = BC / 8;  // float4 pieces in half an S row: one lane's share
    __syncwarp();                 // every lane has read its S before P overwrites it
    __half *P_row = P_w + r * P_LD;
#pragma unroll
    for (int t = 0; t < SEGS; ++t) {
        const int seg = h * SEGS + (t + h) % SEGS;
        store_half4(P_row + 4 * seg, S + 4 * t);
    }
}

// Step 4: O_acc = alpha O_acc + P V_j: each element by its row's alpha, then the product on the
// tensor cores (P from the warp's P_w, V_j in V_smem).
template <int D, int BC, int LD, int P_LD>
__device__ __forceinline__ void accumulate_pv(frag_acc O_acc[D / WN], float alpha,
                                              const int row_lane[frag_acc::num_elements],
                                              const __half *P_w, const __half *V_smem) {
    // LAB HOLE 2 BEGIN [design]: step 4, O_acc = alpha O_acc + P V_j: the rescale, then P V
    // LAB TODO: the warp's 16 x D output accumulators O_acc (O_acc[n]: head-dim columns 16n ..
    // LAB TODO: 16n + 15) become alpha O_acc + P V_j: every element times the alpha of its own
    // LAB TODO: row, whose lanes 2r, 2r + 1 hold it after step 2 (row_lane[e], the note before
    // LAB TODO: the kernel: WMMA does not say which row an element is in), then += P V_j on the
    // LAB TODO: tensor cores. P: the warp's P_w, [16][P_LD] halves over S_w, written by its lanes
    // LAB TODO: in step 3 (each lane its part: the warp must see all of it first); V_j: V_smem
    // LAB TODO: [BC][LD] halves, keys along rows.
    // LAB STUB: (void)O_acc, (void)alpha, (void)row_lane, (void)P_w, (void)V_smem;  // O stays 0
    const row_factors alpha_e = factors_by_row(alpha, row_lane);
#pragma unroll
    for (int n = 0; n < D / WN; ++n)
#pragma unroll
        for (int e = 0; e < frag_acc::num_elements; ++e) O_acc[n].x[e] *= alpha_e.x[e];

    __syncwarp();  // the warp's P tile is complete before it is loaded as fragments
#pragma unroll
    for (int k = 0; k < BC / WK; ++k) {
        frag_a P_frag;
        wmma::load_matrix_sync(P_frag, P_w + k * WK, P_LD);
        accumulate_pv_k<D, LD>(O_acc, P_frag, V_smem + k * WK * LD);
    }
    // LAB HOLE 2 END
}

// Epilogue: O_i = O_acc / l_i and LSE_i = m_i + log(l_i) for row i of this head's O [N, D] and
// lse [N]. Query rows past N are never written. Every row i < N has seen key 0, so l_i >= 1 here.
// The warp writes its rows qw .. qw + 15: LSE from one lane of each pair, O through S_w.
template <int D, int BC, int S_LD>
__device__ __forceinline__ void store_o(__half *O, float *lse, frag_acc O_acc[D / WN], float m_i,
                                        float l_i, const int row_lane[frag_acc::num_elements],
                                        float *S_w, int qw, int i, int h, int lane, int N) {
    if (qw >= N) return;  // a warp of padding rows only; no barrier follows
    if (h == 0 && i < N) lse[i] = m_i + logf(l_i);
    const float inv_l = l_i > 0.f ? 1.f / l_i : 0.f;
    const row_factors inv_l_e = factors_by_row(inv_l, row_lane);

#pragma unroll
    for (int c0 = 0; c0 < D; c0 += BC) {
        // Out through S_w, BC columns at a time: accumulators -> floats -> 16-byte half stores.
        // LAB HOLE 3 BEGIN: O_i = O_acc / l_i through the warp's slice
        // LAB TODO: output columns c0 .. c0 + BC - 1 (the accumulators O_acc[c0 / 16 ..]), each
        // LAB TODO: element divided by its own row's l_i (inv_l_e: one factor per element, as
        // LAB TODO: alpha in step 4), into the warp's slice S_w as floats, [16][S_LD] row-major,
        // LAB TODO: column c0 + c at S_w column c: the loop below turns them into halves. The
        // LAB TODO: lanes may still be reading S_w (the last P, or the previous columns).
        // LAB STUB: (void)inv_l_e;  // unused until filled: O is what S_w held (the last P)
        __syncwarp();  // the warp is done reading S_w (its last P, or the previous columns)
#pragma unroll
        for (int n = 0; n < BC / WN; ++n) {
            frag_acc o = O_acc[c0 / WN + n];
#pragma unroll
            for (int e = 0; e < frag_acc::num_elements; ++e) o.x[e] *= inv_l_e.x[e];
            wmma::store_matrix_sync(S_w + n * WN, o, S_LD, wmma::mem_row_major);
        }
        // LAB HOLE 3 END
        __syncwarp();  // the columns are in S_w before lanes read its rows
#pragma unroll
        for (int t = 0; t < WM * BC / CHUNK / 32; ++t) {
            const int c = lane + 32 * t;  // 16-byte chunk of the 16 x BC block, row-major
            const int row = c / (BC / CHUNK), col = (c % (BC / CHUNK)) * CHUNK;
            if (qw + row < N)
                store_half8(O + (size_t)(qw + row) * D + c0 + col, S_w + row * S_LD + col);
        }
    }
}

/* ---- kernel ------------------------------------------------------------------------------ */

// One block: query rows q0 .. q0 + BR - 1 of head bh; warp w owns rows q0 + 16w .. q0 + 16w + 15.
// Grid: 1D, n_q_tiles * B * H blocks, the Q tile index running fastest (the blocks of one head
// run together and share its K/V in L2).
// Per key tile, per warp (between its own steps a __syncwarp orders its smem traffic):
//   1. S = Q_i K_j^T          WMMA; the 16 x BC floats go to the warp's slice S_w
//   2. online softmax on S_w  lanes 2r, 2r+1 own row r, BC/2 columns each: scale, mask, row
//                             max, alpha = exp(m_old - m_new), P = exp(S - m_new), l_i
//   3. P (half) over S_w      the A operand of the next product
//   4. O_acc = alpha O_acc + P V_j    WMMA, O_acc in registers
//
// Rescaling O_acc by rows. WMMA leaves unspecified which (row, col) of the 16x16 tile a lane's
// element x[e] holds, so "multiply row r by alpha_r" cannot be written from a known layout.
// But load_matrix_sync has to put M[r][c] where (r, c) lives, and every fragment of one type
// shares that placement: loading once a matrix whose entries are their own row numbers tells
// each lane the row of each of its elements. alpha_r sits in lanes 2r and 2r+1 after step 2, so
// element e takes its factor with one shuffle from lane 2 * row. No O tile in shared memory,
// no extra round trip, no extra barrier; the same shuffle divides by l_i at the end.
template <int D, int BC>
__global__ void __launch_bounds__(THREADS, launch_min_blocks<D, BC>())
    attention_kernel(const __half *__restrict__ Q,  // [B, H, N, D]
                     const __half *__restrict__ K,  // [B, H, N, D]
                     const __half *__restrict__ V,  // [B, H, N, D]
                     __half *__restrict__ O,        // [B, H, N, D]
                     float *__restrict__ lse,       // [B, H, N]
                     int N, int n_q_tiles, int causal, float scale) {
    constexpr int LD = D + PAD;       // row stride of Q_smem, K_buf, V_buf (halves)
    constexpr int S_LD = BC + S_PAD;  // row stride of S (floats)
    constexpr int P_LD = BC + PAD;    // row stride of P (halves), lying over S
    static_assert(D % WK == 0 && BC % WN == 0 && D % BC == 0, "tile shapes");

    // WMMA wants its tiles 32-byte aligned: every region and row offset below keeps that.
    extern __shared__ __align__(128) uint4 smem_raw[];
    __half *Q_smem = (__half *)smem_raw;             // [BR][LD]
    __half *K_buf = Q_smem + BR * LD;                // [2][BC][LD]
    __half *V_buf = K_buf + 2 * BC * LD;             // [2][BC][LD]
    float *S_smem = (float *)(V_buf + 2 * BC * LD);  // [WARPS][16][S_LD]: a slice per warp

    const int tid = threadIdx.x;
    const int warp = tid / 32, lane = tid % 32;
    const int q_tile = blockIdx.x % n_q_tiles;
    const int bh = blockIdx.x / n_q_tiles;
    const int q0 = q_tile * BR;
    const int qw = q0 + warp * WM;  // first query row of this warp

    const size_t head = (size_t)bh * N * D;  // 64-bit: B*H*N*D can pass 2^31
    Q += head;
    K += head;
    V += head;
    O += head;
    lse += (size_t)bh * N;

    float *S_w = S_smem + warp * WM * S_LD;  // [16][S_LD] this warp's S
    __half *P_w = (__half *)S_w;             // [16][P_LD] this warp's P, over its S
    // Softmax layout (see online_softmax_update): lanes 2r, 2r+1 own row r, half h of it each.
    const int r = lane / 2, h = lane % 2;
    const int i = qw + r;  // this lane's query row (>= N in a tail tile: computed, not written)

    int row_lane[frag_acc::num_elements];  // the lane holding the row's alpha, l_i (note above)
    row_lanes<S_LD>(row_lane, S_w, lane);  // S_w is next written after the __syncthreads below

    // Q_i -> Q_smem (rows >= N zero-filled)
    load_tile<BR, D, LD, THREADS>(Q_smem, Q, q0, N, tid);
    load_first_tile<D, BC, LD>(K_buf, V_buf, K, V, N, tid);
    __syncthreads();  // Q_smem is filled by all threads (tile 0 may still be in flight)

    constexpr bool Q_IN_REGS = q_in_regs<D, BC>();
    const __half *Q_w = Q_smem + warp * WM * LD;  // [16][LD] this warp's rows of Q_i
    frag_a Q_frag[D / WK];                        // the A operand of S = Q_i K_j^T (Q_IN_REGS)
    load_q_fragments<D, LD, Q_IN_REGS>(Q_frag, Q_w);

    // Online softmax state of row i, in registers.
    float m_i = -INFINITY;  // running max of the scaled scores
    float l_i = 0.f;        // running sum of exp(score - m_i)
    frag_acc O_acc[D / WN];
#pragma unroll
    for (int n = 0; n < D / WN; ++n) wmma::fill_fragment(O_acc[n], 0.f);

    // Causal: key tiles after the one holding the block's last query row are all masked.
    const int last_row = min(q0 + BR, N) - 1;
    const int n_kv_tiles = causal ? last_row / BC + 1 : (N + BC - 1) / BC;

    for (int kt = 0; kt < n_kv_tiles; ++kt) {
        const int k0 = kt * BC;
        // Tile kt lives in buffer kt % 2; tile kt + 1 goes to the other one.
        const __half *K_smem = K_buf + kt % 2 * BC * LD;  // [BC][LD]
        const __half *V_smem = V_buf + kt % 2 * BC * LD;  // [BC][LD]
        __half *K_next = K_buf + (kt + 1) % 2 * BC * LD;  // [BC][LD]
        __half *V_next = V_buf + (kt + 1) % 2 * BC * LD;  // [BC][LD]
        const bool prefetch = kt + 1 < n_kv_tiles;
#if HAS_CP_ASYNC
        cp_async_wait_all();  // this thread's copies of tile kt have landed
#endif
        // K_smem/V_smem are filled by all threads. Also, every warp is done with tile kt - 1, so
        // its buffer is free for tile kt + 1 (and has loaded its P of kt - 1 before its S
        // overwrites it).
        __syncthreads();

#if HAS_CP_ASYNC
        prefetch_tile_async<D, BC, LD>(K_next, V_next, K, V, k0, N, tid, prefetch);
#else
        uint4 next[BC * D / CHUNK / THREADS];  // this thread's chunks of K, then V, of tile kt + 1
        if (prefetch) fetch_tile<BC, D, THREADS>(next, K, k0 + BC, N, tid);
#endif
        // A warp whose rows are all >= N, or (causal) all before this tile's first key, skips the
        // math (not the loads and the barrier): nothing to add from this tile.
        const bool warp_works = qw < N && (!causal || k0 <= qw + WM - 1);
        // 1. S = Q_i K_j^T on the tensor cores, into the warp's S_w.
        if (warp_works) scores<D, BC, LD, S_LD, Q_IN_REGS>(S_w, Q_frag, Q_w, K_smem);
#if !HAS_CP_ASYNC
        if (prefetch) stash_k_fetch_v<D, BC, LD>(K_next, next, V, k0 + BC, N, tid);
#endif

        if (warp_works) {
            __syncwarp();  // the warp's S tile is complete before lanes read its rows
            // 2. online softmax on S_w; 3. P (half) over S_w; 4. O_acc = alpha O_acc + P V_j.
            float S[BC / 2];
            const float alpha = online_softmax_update<BC, S_LD>(S, m_i, l_i, S_w, r, h, k0, qw, i,
                                                                N, causal, scale);
            store_p<BC, P_LD>(P_w, S, r, h);
            accumulate_pv<D, BC, LD, P_LD>(O_acc, alpha, row_lane, P_w, V_smem);
        }
#if !HAS_CP_ASYNC
        if (prefetch)  // V of tile kt + 1 -> the other buffer
            stash_tile<BC, D, LD, THREADS>(V_next, next, tid);
#endif
    }

    store_o<D, BC, S_LD>(O, lse, O_acc, m_i, l_i, row_lane, S_w, qw, i, h, lane, N);
}

/* ---- launcher ---------------------------------------------------------------------------- */

static size_t smem_bytes(int D, int BC) {
    // Q_smem + 2 x (K_smem + V_smem) + the warps' S slices
    return (size_t)(BR + 4 * BC) * (D + PAD) * sizeof(__half) +
           (size_t)WARPS * WM * (BC + S_PAD) * sizeof(float);
}

// The key tile for this D and device: the larger one of which MIN_BLOCKS blocks fit on one SM,
// else the larger one that fits at all, else 0. An SM has 1 KB more than the per-block limit,
// and each block reserves 1 KB (sm_80+). H100: 64 (two or three blocks); A100: 64 at D = 64,
// 32 at D = 128 (two blocks of 61 KB rather than one of 103 KB); L4: 32; T4: 64 at D = 64 and
// 32 at D = 128 (one block).
static int tile_bc(int D, const attn_device *dev) {
    const int bcs[2] = {BC_LARGE, BC_SMALL};
    for (int t = 0; t < 2; ++t)
        if (MIN_BLOCKS * smem_bytes(D, bcs[t]) + 1024 <= dev->smem_per_block) return bcs[t];
    for (int t = 0; t < 2; ++t)
        if (smem_bytes(D, bcs[t]) <= dev->smem_per_block) return bcs[t];
    return 0;
}

static const char *attention_unsupported(const attn_shape *s, const attn_device *dev, int variant) {
    if (variant != 0) return "stage 4 has only the variant default";
    if (s->D != 64 && s->D != 128) return "head dim must be 64 or 128";
    if (s->B < 1 || s->H < 1 || s->N < 1) return "B, H and N must be >= 1";
    if (dev->cc < 75) return "needs the tensor cores of sm_75 or newer";
    if (tile_bc(s->D, dev) == 0) return "needs 61 KB of shared memory per block (37 KB at D = 64)";
    const long long n_q_tiles = ((long long)s->N + BR - 1) / BR;
    if (n_q_tiles * s->B * s->H > INT_MAX) return "more than 2^31 - 1 blocks (B * H * N / BR)";
    return NULL;
}

static size_t attention_workspace_bytes(const attn_shape *s, const attn_device *dev, int variant) {
    (void)s;
    (void)dev;
    (void)variant;
    return 0;  // fused: no workspace
}

template <int D, int BC>
static cudaError_t launch(const attn_shape *s, const __half *Q, const __half *K, const __half *V,
                          __half *O, float *lse, cudaStream_t stream) {
    const size_t smem = smem_bytes(D, BC);
    if (smem > 48 * 1024)
        ATTN_TRY(cudaFuncSetAttribute(attention_kernel<D, BC>,
                                      cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    const int n_q_tiles = (s->N + BR - 1) / BR;
    const unsigned blocks = (unsigned)((long long)n_q_tiles * s->B * s->H);
    attention_kernel<D, BC>
        <<<blocks, THREADS, smem, stream>>>(Q, K, V, O, lse, s->N, n_q_tiles, s->causal, s->scale);
    ATTN_TRY(cudaGetLastError());
    return cudaSuccess;
}

static cudaError_t attention_forward(const attn_shape *s, const attn_device *dev, const void *Q,
                                     const void *K, const void *V, void *O, float *lse,
                                     void *workspace, int variant, cudaStream_t stream) {
    (void)workspace;
    const char *why = attention_unsupported(s, dev, variant);
    if (why) {
        fprintf(stderr, "stage4_wmma: %s\n", why);
        return cudaErrorInvalidValue;
    }
    // The 16-byte loads and stores need 16-byte aligned tensors (cudaMalloc gives 256).
    if (((uintptr_t)Q | (uintptr_t)K | (uintptr_t)V | (uintptr_t)O) % 16) {
        fprintf(stderr, "stage4_wmma: Q, K, V and O must be 16-byte aligned\n");
        return cudaErrorMisalignedAddress;
    }
    const __half *q = (const __half *)Q, *k = (const __half *)K, *v = (const __half *)V;
    __half *o = (__half *)O;
    // The tiles are chosen at run time from the shared memory the device (or --smem-limit) allows.
    const bool small = tile_bc(s->D, dev) == BC_SMALL;
    if (s->D == 64) {
        if (small) return launch<64, BC_SMALL>(s, q, k, v, o, lse, stream);
        return launch<64, BC_LARGE>(s, q, k, v, o, lse, stream);
    }
    if (small) return launch<128, BC_SMALL>(s, q, k, v, o, lse, stream);
    return launch<128, BC_LARGE>(s, q, k, v, o, lse, stream);
}

extern "C" const attn_stage attn_this_stage = {
    "stage4_wmma",
    "tensor cores (WMMA 16x16x16, fp32 accumulate) for QK^T and PV; softmax by warps",
    ATTN_F16,
    "default",
    attention_unsupported,
    attention_workspace_bytes,
    attention_forward,
    NULL,  // a forward-only stage: no backward pass
    NULL,
    0,  // takes the plain case only (attention.h: no bf16, GQA, strides or N_k != N)
    0,
    NULL,  // no decode pass: attention against a KV cache is stage 9's
    NULL,
};
