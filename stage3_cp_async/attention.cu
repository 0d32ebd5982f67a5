/*
 * Stage 3: K/V tiles double-buffered, so loading the next tile overlaps computing this one.
 *
 * Adds over stage 2, and nothing else: two K_smem/V_smem buffers. While the block computes on
 * tile j in one buffer, tile j + 1 is already on its way into the other:
 *   - sm_80 and newer: cp.async (16-byte cp.async.cg.shared.global) copies global memory to
 *     shared memory without passing through registers; the thread issues the copies, commits
 *     them as a group, computes, and waits for the group (cp.async.wait_group) only when it
 *     needs the tile. Rows >= N are zero-filled by the copy itself (source size 0).
 *   - sm_75 (T4, no cp.async): register-staged prefetch. Before computing S for tile j, each
 *     thread loads its 16-byte chunks of K for tile j + 1 into registers and stores them to the
 *     other buffer once S is done; the same for V around P V. The loads' latency hides behind
 *     the math.
 * One __syncthreads per tile instead of two: the barrier that makes tile j visible also says
 * that every thread is done with tile j - 1, whose buffer tile j + 1 then overwrites.
 * Variant `sync` loads as stage 2 does (one buffer: load, wait, compute, wait).
 *
 * Expected gain over stage 2: the HBM/L2 latency of each K/V tile no longer stalls the block, so
 * the time per tile approaches the math alone. This matters most where few blocks fit on an SM
 * (here 2, limited by registers), as there is little other work to hide the loads behind.
 *
 * Run: make build && build/stage3_cp_async --seq 4096 --dim 128 --bench
 *      build/stage3_cp_async --seq 4096 --dim 128 --bench --variant sync
 *
 * NOTE: every score and every P V product is a scalar fp32 FMA, one query row per thread, and
 * each thread converts every K and V element it reads from fp16 again. Stage 4 moves Q K^T and
 * P V onto the tensor cores (WMMA, 16x16x16 fp16 tiles with fp32 accumulation).
 */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>

#include "attention.h"

/* ---- tunables ---------------------------------------------------------------------------- */

// cp.async exists from sm_80 on; sm_75 prefetches through registers instead.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#define HAS_CP_ASYNC 0
#else
#define HAS_CP_ASYNC 1
#endif

// Q rows per block = threads per block (one query row per thread): 4 warps.
constexpr int BR = 128;
constexpr int THREADS = BR;
// K/V rows per tile at D = 64: S[64] and O_acc[64] stay in registers; smem 51,200 B.
constexpr int BC_D64 = 64;
// K/V rows per tile at D = 128: S[32] and O_acc[128] stay in registers (no spills). Double
// buffered, the shared memory is 128 * (128 + 8) * 2 + 2 * 2 * 32 * 128 * 2 = 67,584 B: more
// than a T4's 64 KB per block, where the launcher takes BC_D128_SMALL instead.
constexpr int BC_D128 = 32;
// K/V rows per tile at D = 128 when BC_D128 does not fit dev->smem_per_block: 51,200 B.
constexpr int BC_D128_SMALL = 16;
// Halves of padding after each Q_smem row: 16 bytes, one chunk, so the row stride is an odd
// number of 16-byte chunks (D / 8 + 1) and the 8 threads of each quarter-warp read 8 different
// bank groups. K_smem and V_smem need none: all threads read the same chunk (a broadcast).
constexpr int Q_PAD = 8;
// Keys per pass over q_i in S = q_i K^T (BC / KEYS_PER_PASS passes per tile): each chunk of q_i
// read from Q_smem serves this many keys, a 4-key register tile that cuts the Q_smem reads 4x.
// More keys per pass let the compiler hoist more K_smem loads than there are registers (spills).
constexpr int KEYS_PER_PASS = 4;

/* ---- device helpers ---------------------------------------------------------------------- */

// Elements per 16-byte chunk: the unit of every global and shared-memory access below.
constexpr int CHUNK = 16 / sizeof(__half);

// One 16-byte chunk of shared memory -> CHUNK floats in registers (fp16 -> fp32 on use).
__device__ __forceinline__ void load_chunk(const __half *p, float f[CHUNK]) {
    const uint4 v = *(const uint4 *)p;
    const unsigned w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int c = 0; c < 4; ++c) {
        const float2 t = __half22float2(*(const __half2 *)&w[c]);
        f[2 * c] = t.x, f[2 * c + 1] = t.y;
    }
}

// CHUNK floats -> one 16-byte chunk of global memory (fp32 -> fp16, round to nearest).
__device__ __forceinline__ void store_chunk(__half *p, const float f[CHUNK]) {
    unsigned w[4];
#pragma unroll
    for (int c = 0; c < 4; ++c) {
        const __half2 t = __floats2half2_rn(f[2 * c], f[2 * c + 1]);
        w[c] = *(const unsigned *)&t;
    }
    *(uint4 *)p = make_uint4(w[0], w[1], w[2], w[3]);
}

// Rows row0 .. row0 + ROWS - 1 of one head's [N, D] matrix -> tile[ROWS][LD] in shared memory
// (LD >= D elements per row), in 16-byte chunks: consecutive threads take consecutive chunks, so
// the global reads coalesce. Rows >= N are zero-filled: a tail tile reads nothing out of bounds,
// and its zero K/V rows never put a NaN into S or O.
template <int ROWS, int D, int LD, int THREADS>
__device__ __forceinline__ void load_tile(__half *tile, const __half *__restrict__ src, int row0,
                                          int N, int tid) {
    constexpr int CHUNKS_PER_ROW = D / CHUNK;
#pragma unroll
    for (int c = tid; c < ROWS * CHUNKS_PER_ROW; c += THREADS) {
        const int r = c / CHUNKS_PER_ROW;
        const int col = (c % CHUNKS_PER_ROW) * CHUNK;
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
    // LAB HOLE 1 BEGIN [sm80]: the cp.async wrappers: issue one 16-byte copy
    // LAB TODO: one asynchronous 16-byte copy, global memory at gmem -> shared memory at smem,
    // LAB TODO: cached in L2 only (.cg): src_bytes of it read from gmem, the rest zero-filled.
    // LAB TODO: Inline PTX (PTX ISA: cp.async); no memory access may move across it.
    const unsigned dst = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem),
                 "r"(src_bytes)
                 : "memory");
    // LAB HOLE 1 END
}

// Close the group of this thread's cp.asyncs issued so far.
__device__ __forceinline__ void cp_async_commit() {
    // LAB HOLE 1 BEGIN [sm80]: the cp.async wrappers: close the group
    // LAB TODO: this thread's cp.asyncs issued so far become one group (inline PTX, as above).
    asm volatile("cp.async.commit_group;\n" ::: "memory");
    // LAB HOLE 1 END
}

// Wait until all of this thread's committed cp.async groups have landed in shared memory.
__device__ __forceinline__ void cp_async_wait_all() {
    // LAB HOLE 1 BEGIN [sm80]: the cp.async wrappers: wait for every group
    // LAB TODO: wait until none of this thread's committed groups is pending (inline PTX); no
    // LAB TODO: shared-memory read may move above it.
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
    // LAB HOLE 1 END
}

// load_tile without waiting: the same rows and chunks, issued as cp.asyncs (not yet committed).
template <int ROWS, int D, int LD, int THREADS>
__device__ __forceinline__ void load_tile_async(__half *tile, const __half *__restrict__ src,
                                                int row0, int N, int tid) {
    constexpr int CHUNKS_PER_ROW = D / CHUNK;
#pragma unroll
    for (int c = tid; c < ROWS * CHUNKS_PER_ROW; c += THREADS) {
        const int r = c / CHUNKS_PER_ROW;
        const int col = (c % CHUNKS_PER_ROW) * CHUNK;
        const bool in = row0 + r < N;  // rows >= N: source size 0, i.e. zero-fill
        cp_async_16(tile + r * LD + col, in ? src + (size_t)(row0 + r) * D + col : src,
                    in ? 16 : 0);
    }
}
#else
// sm_75 has no cp.async: the next tile is staged through registers instead, in two halves.
// fetch_tile: this thread's chunks of rows row0 .. row0 + ROWS - 1 -> regs (rows >= N: zeros).
// They are load_tile's chunks of this thread: one column, every ROWS_PER_PASS-th row.
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

// The steps of the kernel's schedule below, each a named piece (__forceinline__, so the names cost
// no instruction): the kernel's loop body reads as the schedule.

// Prologue: key tile 0 -> buffer 0 (cp.async: in flight).
template <int D, int BC, int LD>
__device__ __forceinline__ void load_first_tile(__half *K_buf, __half *V_buf, const __half *K,
                                                const __half *V, int N, int tid) {
#if HAS_CP_ASYNC
    // LAB HOLE 2 BEGIN [sm80] [design]: the cp.async pipeline: tile 0 on its way
    // LAB TODO: the pipeline's prologue. Tile kt (keys kt * BC .. + BC - 1 of K and V) goes to
    // LAB TODO: buffer kt % 2 of K_buf and V_buf ([2][BC][LD] halves each) by cp.async, every
    // LAB TODO: thread copying its share of the chunks (rows past N zero-filled), one commit
    // LAB TODO: group per tile: when iteration kt waits, tile kt's is the only group in
    // LAB TODO: flight. Here: tile 0 on its way into buffer 0; nothing waits for it yet.
    load_tile_async<BC, D, LD, THREADS>(K_buf, K, 0, N, tid);
    load_tile_async<BC, D, LD, THREADS>(V_buf, V, 0, N, tid);
    cp_async_commit();
    // LAB HOLE 2 END
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
    // LAB HOLE 2 BEGIN [sm80] [design]: the cp.async pipeline: tile kt + 1 on its way
    // LAB TODO: the pipeline, after the kernel's barrier: tile kt + 1 (keys k0 + BC ..) on its
    // LAB TODO: way into the other buffer, K_next and V_next, landing while tile kt is computed
    // LAB TODO: on; the drain: after the last tile (prefetch false) nothing is left to start.
    // LAB TODO: Why may that buffer be overwritten now, and not before the barrier?
    // LAB STUB: (void)K_next, (void)V_next, (void)prefetch;  // unused until filled
    if (prefetch) {  // tile kt + 1 -> the other buffer, in flight while we compute
        load_tile_async<BC, D, LD, THREADS>(K_next, K, k0 + BC, N, tid);
        load_tile_async<BC, D, LD, THREADS>(V_next, V, k0 + BC, N, tid);
        cp_async_commit();
    }
    // LAB HOLE 2 END
}
#else
// sm_75's register-staged prefetch, its middle: K of tile kt + 1 (keys k1 ..), fetched into this
// thread's registers next, -> the other buffer K_next; then its V into the same registers.
template <int D, int BC, int LD>
__device__ __forceinline__ void stash_k_fetch_v(__half *K_next,
                                                uint4 next[BC * D / CHUNK / THREADS],
                                                const __half *V, int k1, int N, int tid) {
    // LAB HOLE 3 BEGIN [t4] [design]: the sm_75 register-staged prefetch: its middle step
    // LAB TODO: (your split of the step after S, with the kernel's part there; this part may stay
    // LAB TODO: empty) the K rows of tile kt + 1 in this thread's registers (next) into K_next
    // LAB TODO: ([BC][LD] halves), at the chunks they were fetched from; then the same registers
    // LAB TODO: start loading the tile's V rows (keys k1 ..).
    // LAB STUB: (void)K_next, (void)next, (void)V, (void)k1, (void)N, (void)tid;
    stash_tile<BC, D, LD, THREADS>(K_next, next, tid);
    fetch_tile<BC, D, THREADS>(next, V, k1, N, tid);
    // LAB HOLE 3 END
}
#endif

// Scores: S[j] = q_i . k_j for the BC keys of the tile, in registers (unscaled). d outer, j inner:
// each chunk of q_i read from Q_smem serves KEYS_PER_PASS keys. Every thread of a warp reads the
// same K_smem chunk (a broadcast), and its own Q_smem row: the rows are D + PAD halves apart, an
// odd number of 16-byte chunks, so the warp's Q_smem reads spread over all banks (with PAD = 0 they
// pile onto the same four, as in stage 1). The d loop stays rolled: O_acc and S hold most
// registers, and a longer unrolled stretch lets the compiler hoist more K_smem loads than there are
// registers (spills).
template <int D, int BC, int PAD>
__device__ __forceinline__ void scores(float S[BC], const __half *Q_smem, const __half *K_smem,
                                       int tid) {
#pragma unroll
    for (int j = 0; j < BC; ++j) S[j] = 0.f;
#pragma unroll
    for (int j0 = 0; j0 < BC; j0 += KEYS_PER_PASS) {
#pragma unroll 1
        for (int d = 0; d < D; d += CHUNK) {
            float q[CHUNK];
            load_chunk(&Q_smem[tid * (D + PAD) + d], q);
#pragma unroll
            for (int j = j0; j < j0 + KEYS_PER_PASS; ++j) {
                float k[CHUNK];
                load_chunk(&K_smem[j * D + d], k);
#pragma unroll
                for (int c = 0; c < CHUNK; ++c) S[j] = fmaf(q[c], k[c], S[j]);
            }
        }
    }
}

// Online-softmax update: folds the tile's scores S (keys k0 .. k0 + BC - 1) into row i's running
// max m_i, sum l_i and output O_acc; V_smem [BC][D] is the tile's values.
template <int D, int BC>
__device__ __forceinline__ void online_softmax_update(float S[BC], float &m_i, float &l_i,
                                                      float O_acc[D], const __half *V_smem, int k0,
                                                      int N, int causal, int i, float scale) {
    // Scale, mask (keys past N; causal: keys after row i), new running max.
    float m_new = m_i;
#pragma unroll
    for (int j = 0; j < BC; ++j) {
        const int kj = k0 + j;
        S[j] = (kj >= N || (causal && kj > i)) ? -INFINITY : S[j] * scale;
        m_new = fmaxf(m_new, S[j]);
    }
    // While every key so far is masked, m_new is -inf: subtract 0 instead, so that
    // exp(-inf - -inf) = NaN never happens (the exps are then all 0).
    const float m_ref = (m_new == -INFINITY) ? 0.f : m_new;
    const float alpha = expf(m_i - m_ref);  // rescales the old l_i, O_acc (0 at the start)

    l_i *= alpha;
#pragma unroll
    for (int d = 0; d < D; ++d) O_acc[d] *= alpha;

    // P = exp(S - m), then O_acc += P V. V_smem[j][d] is a broadcast too.
#pragma unroll
    for (int j = 0; j < BC; ++j) {
        const float P = expf(S[j] - m_ref);
        l_i += P;
#pragma unroll
        for (int d = 0; d < D; d += CHUNK) {
            float v[CHUNK];
            load_chunk(&V_smem[j * D + d], v);
#pragma unroll
            for (int c = 0; c < CHUNK; ++c) O_acc[d + c] = fmaf(P, v[c], O_acc[d + c]);
        }
    }
    m_i = m_new;
}

// Epilogue: O_i = O_acc / l_i and LSE_i = m_i + log(l_i) for row i of this head's O [N, D] and
// lse [N]. Query rows past N are never written. Every row i < N has seen key 0, so l_i >= 1 here.
template <int D>
__device__ __forceinline__ void store_row(__half *O, float *lse, const float O_acc[D], float m_i,
                                          float l_i, int i, int N) {
    if (i < N) {
        const float inv_l = 1.f / l_i;
        __half *O_row = O + (size_t)i * D;
#pragma unroll
        for (int d = 0; d < D; d += CHUNK) {
            float o[CHUNK];
#pragma unroll
            for (int c = 0; c < CHUNK; ++c) o[c] = O_acc[d + c] * inv_l;
            store_chunk(O_row + d, o);
        }
        lse[i] = m_i + logf(l_i);
    }
}

/* ---- kernel ------------------------------------------------------------------------------ */

// One block: query rows q0 .. q0 + BR - 1 of head bh; thread tid owns query row i = q0 + tid.
// Grid: 1D, n_q_tiles * B * H blocks, the Q tile index running fastest (the blocks of one head
// run together and share its K/V in L2).
// PAD: halves of padding per Q_smem row (Q_PAD). PIPELINE: double-buffered K/V (default), or
// stage 2's single buffer (variant sync).
template <int D, int BC, int PAD, bool PIPELINE>
__global__ void __launch_bounds__(THREADS)
    attention_kernel(const __half *__restrict__ Q,  // [B, H, N, D]
                     const __half *__restrict__ K,  // [B, H, N, D]
                     const __half *__restrict__ V,  // [B, H, N, D]
                     __half *__restrict__ O,        // [B, H, N, D]
                     float *__restrict__ lse,       // [B, H, N]
                     int N, int n_q_tiles, int causal, float scale) {
    constexpr int LD = D;  // row stride of K_buf, V_buf (halves): unpadded, read as broadcasts
    static_assert(BC % KEYS_PER_PASS == 0, "a tile is a whole number of passes");
    extern __shared__ uint4 smem_raw[];       // uint4: 16-byte aligned for the chunked accesses
    __half *Q_smem = (__half *)smem_raw;      // [BR][D + PAD]
    __half *K_buf = Q_smem + BR * (D + PAD);  // [2][BC][LD] (PIPELINE) or [BC][LD]
    __half *V_buf = K_buf + (PIPELINE ? 2 : 1) * BC * LD;  // [2][BC][LD] (PIPELINE) or [BC][LD]

    const int tid = threadIdx.x;
    const int q_tile = blockIdx.x % n_q_tiles;
    const int bh = blockIdx.x / n_q_tiles;
    const int q0 = q_tile * BR;
    const int i = q0 + tid;  // this thread's query row (>= N in a tail tile: computed, not written)

    const size_t head = (size_t)bh * N * D;  // 64-bit: B*H*N*D can pass 2^31
    Q += head;
    K += head;
    V += head;
    O += head;
    lse += (size_t)bh * N;

    // Q_i -> Q_smem (rows >= N zero-filled)
    load_tile<BR, D, D + PAD, THREADS>(Q_smem, Q, q0, N, tid);

    // Online softmax state of row i, in registers.
    float m_i = -INFINITY;  // running max of the scaled scores
    float l_i = 0.f;        // running sum of exp(score - m_i)
    float O_acc[D];         // running sum of exp(score - m_i) * v_j
#pragma unroll
    for (int d = 0; d < D; ++d) O_acc[d] = 0.f;

    // Causal: key tiles after the one holding the block's last query row are all masked.
    const int last_row = min(q0 + BR, N) - 1;
    const int n_kv_tiles = causal ? last_row / BC + 1 : (N + BC - 1) / BC;

    // The variant sync has no prologue: its key loop loads every tile.
    if (PIPELINE) load_first_tile<D, BC, LD>(K_buf, V_buf, K, V, N, tid);

    for (int kt = 0; kt < n_kv_tiles; ++kt) {
        const int k0 = kt * BC;
        // Tile kt lives in buffer kt % 2; tile kt + 1 goes to the other one.
        const __half *K_smem = K_buf + (PIPELINE ? kt % 2 : 0) * BC * LD;  // [BC][LD]
        const __half *V_smem = V_buf + (PIPELINE ? kt % 2 : 0) * BC * LD;  // [BC][LD]
        __half *K_next = K_buf + (kt + 1) % 2 * BC * LD;                   // [BC][LD]
        __half *V_next = V_buf + (kt + 1) % 2 * BC * LD;                   // [BC][LD]
        const bool prefetch = PIPELINE && kt + 1 < n_kv_tiles;
        if (!PIPELINE) {  // variant sync: stage 2's loads, K_j, V_j -> the one buffer
            load_tile<BC, D, LD, THREADS>(K_buf, K, k0, N, tid);
            load_tile<BC, D, LD, THREADS>(V_buf, V, k0, N, tid);
        }
#if HAS_CP_ASYNC
        // LAB HOLE 2 BEGIN [sm80] [design]: the cp.async pipeline: wait for tile kt
        // LAB TODO: the pipeline's steady state, before the kernel's barrier (PIPELINE only: the
        // LAB TODO: variant sync has no copies in flight): this thread's copies of tile kt have
        // LAB TODO: landed (a thread waits for its own copies only: the barrier then makes every
        // LAB TODO: thread's visible to all).
        // this thread's copies of tile kt have landed
        if (PIPELINE) cp_async_wait_all();
        // LAB HOLE 2 END
#endif
        // K_smem/V_smem (and, at kt == 0, Q_smem) are filled by all threads. PIPELINE: also,
        // every thread is done with tile kt - 1, so its buffer is free for tile kt + 1.
        __syncthreads();

#if HAS_CP_ASYNC
        prefetch_tile_async<D, BC, LD>(K_next, V_next, K, V, k0, N, tid, prefetch);
#else
        // LAB HOLE 3 BEGIN [t4] [design]: the sm_75 register-staged prefetch: fetch the next K
        // LAB TODO: sm_75 has no cp.async: tile kt + 1 (keys k0 + BC ..; none after the last
        // LAB TODO: tile: prefetch) goes to the other buffer, K_next and V_next, through this
        // LAB TODO: thread's registers, its share of the chunks, in the shadow of the math: the
        // LAB TODO: global loads start before a phase and land in shared memory after it, so
        // LAB TODO: their latency hides behind the phase. Registers are scarce: one tile's worth
        // LAB TODO: (K, then V). Here, before S: start the loads of K's rows.
        // LAB STUB: (void)K_next, (void)V_next, (void)prefetch;  // unused until filled
        uint4 next[BC * D / CHUNK / THREADS];  // this thread's chunks of K, then V, of tile kt + 1
        if (prefetch) fetch_tile<BC, D, THREADS>(next, K, k0 + BC, N, tid);
        // LAB HOLE 3 END
#endif

        float S[BC];
        scores<D, BC, PAD>(S, Q_smem, K_smem, tid);
#if !HAS_CP_ASYNC
        // LAB HOLE 3 BEGIN [t4] [design]: the sm_75 register-staged prefetch: stash K, fetch V
        // LAB TODO: S is done: K of tile kt + 1 from the registers into K_next; then start the
        // LAB TODO: loads of its V rows, in flight during the softmax and P V.
        if (prefetch) stash_k_fetch_v<D, BC, LD>(K_next, next, V, k0 + BC, N, tid);
        // LAB HOLE 3 END
#endif

        online_softmax_update<D, BC>(S, m_i, l_i, O_acc, V_smem, k0, N, causal, i, scale);
#if !HAS_CP_ASYNC
        // LAB HOLE 3 BEGIN [t4] [design]: the sm_75 register-staged prefetch: stash V
        // LAB TODO: P V is done: V of tile kt + 1 from the registers into V_next. The next
        // LAB TODO: iteration's barrier makes both halves of the tile visible to every thread.
        if (prefetch)  // V of tile kt + 1 -> the other buffer
            stash_tile<BC, D, LD, THREADS>(V_next, next, tid);
        // LAB HOLE 3 END
#endif
        if (!PIPELINE)
            __syncthreads();  // every thread is done with K_smem/V_smem before the next tile lands
    }

    store_row<D>(O, lse, O_acc, m_i, l_i, i, N);
}

/* ---- launcher ---------------------------------------------------------------------------- */

static size_t smem_bytes(int D, int BC, int buffers) {
    // Q_smem + buffers x (K_smem + V_smem)
    return ((size_t)BR * (D + Q_PAD) + (size_t)buffers * 2 * BC * D) * sizeof(__half);
}

// The tile width for this D and device: both variants use the double-buffered choice, so the
// variant sync differs from the default in the pipelining alone.
static int tile_bc(int D, const attn_device *dev) {
    if (D == 64) return BC_D64;
    return smem_bytes(128, BC_D128, 2) <= dev->smem_per_block ? BC_D128 : BC_D128_SMALL;
}

static const char *attention_unsupported(const attn_shape *s, const attn_device *dev, int variant) {
    if (variant != 0 && variant != 1) return "stage 3 has the variants default and sync";
    if (s->D != 64 && s->D != 128) return "head dim must be 64 or 128";
    if (s->B < 1 || s->H < 1 || s->N < 1) return "B, H and N must be >= 1";
    if (smem_bytes(s->D, tile_bc(s->D, dev), variant == 1 ? 1 : 2) > dev->smem_per_block)
        return "needs 50 KB of shared memory per block";
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

template <int D, int BC, bool PIPELINE>
static cudaError_t launch(const attn_shape *s, const __half *Q, const __half *K, const __half *V,
                          __half *O, float *lse, cudaStream_t stream) {
    const size_t smem = smem_bytes(D, BC, PIPELINE ? 2 : 1);
    if (smem > 48 * 1024)
        ATTN_TRY(cudaFuncSetAttribute(attention_kernel<D, BC, Q_PAD, PIPELINE>,
                                      cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    const int n_q_tiles = (s->N + BR - 1) / BR;
    const unsigned blocks = (unsigned)((long long)n_q_tiles * s->B * s->H);
    attention_kernel<D, BC, Q_PAD, PIPELINE>
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
        fprintf(stderr, "stage3_cp_async: %s\n", why);
        return cudaErrorInvalidValue;
    }
    // The 16-byte loads and stores need 16-byte aligned tensors (cudaMalloc gives 256).
    if (((uintptr_t)Q | (uintptr_t)K | (uintptr_t)V | (uintptr_t)O) % 16) {
        fprintf(stderr, "stage3_cp_async: Q, K, V and O must be 16-byte aligned\n");
        return cudaErrorMisalignedAddress;
    }
    const __half *q = (const __half *)Q, *k = (const __half *)K, *v = (const __half *)V;
    __half *o = (__half *)O;
    // The tiles are chosen at run time from the shared memory the device (or --smem-limit) allows.
    const bool small = tile_bc(s->D, dev) != (s->D == 64 ? BC_D64 : BC_D128);
    if (variant == 1) {  // sync: stage 2's loads (one buffer), all else the same
        if (s->D == 64) return launch<64, BC_D64, false>(s, q, k, v, o, lse, stream);
        if (small) return launch<128, BC_D128_SMALL, false>(s, q, k, v, o, lse, stream);
        return launch<128, BC_D128, false>(s, q, k, v, o, lse, stream);
    }
    if (s->D == 64) return launch<64, BC_D64, true>(s, q, k, v, o, lse, stream);
    if (small) return launch<128, BC_D128_SMALL, true>(s, q, k, v, o, lse, stream);
    return launch<128, BC_D128, true>(s, q, k, v, o, lse, stream);
}

extern "C" const attn_stage attn_this_stage = {
    "stage3_cp_async",
    "K/V tiles double-buffered: cp.async (sm_80+) or register-staged prefetch (sm_75)",
    ATTN_F16,
    "default,sync",
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
