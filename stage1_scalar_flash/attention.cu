/*
 * Stage 1: scalar flash attention (fp32).
 *
 * Adds over stage 0: the three kernels fuse into one, and the N x N score matrix never exists.
 * Each block owns BR query rows (one thread per row) and streams the keys and values through
 * shared memory in tiles of BC rows: FlashAttention-2's loop order, Q tile outer, K/V tiles
 * inner. Each thread keeps its row's running maximum m_i, running sum l_i and output O_acc[D]
 * in registers and rescales them when a new tile raises the maximum (the online softmax).
 * Memory is O(N) instead of O(N^2), and each K/V tile read from HBM serves BR query rows.
 *
 * Expected gain: no N^2 round trips through HBM and no N^2 workspace, so it runs to 262,144
 * tokens where stage 0 runs out of memory, and it beats stage 0 from a few thousand tokens on.
 *
 * Run: make build && build/stage1_scalar_flash --seq 4096 --dim 128 --bench
 *
 * NOTE: Q_smem rows are D floats apart (a multiple of 128 bytes), so when the threads of a warp
 * each read a 16-byte chunk of their own row at the same column, they all hit the same four
 * banks: every Q_smem read takes 32 shared-memory wavefronts where 4 would do (an 8-way bank
 * conflict), and one such read feeds only 4 FMAs. Stage 2 pads the rows, stores fp16, takes
 * bigger tiles and reads each Q chunk once per 4 keys.
 */
#include <cuda_runtime.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>

#include "attention.h"

/* ---- tunables ---------------------------------------------------------------------------- */

// Q rows per block = threads per block (one query row per thread): 2 warps.
constexpr int BR = 64;
// K/V rows per tile at D = 64: S[64] and O_acc[64] stay in registers; smem 49,152 B.
constexpr int BC_D64 = 64;
// K/V rows per tile at D = 128: S[16] and O_acc[128] stay in registers (no spills), and the
// shared memory, (64 + 2*16) * 128 * 4 = 49,152 B, fits a T4's 64 KB per block.
constexpr int BC_D128 = 16;
// Keys per pass over q_i in S = q_i K^T: 1, the plain dot product. Every chunk of q_i read from
// Q_smem serves one key, so each FMA pays for a Q_smem read and the bank conflict below is on
// the hot path (stage 2 reads each chunk once per 4 keys).
constexpr int KEYS_PER_PASS = 1;

/* ---- device helpers ---------------------------------------------------------------------- */

// Elements per 16-byte chunk: the unit of every global and shared-memory access below.
constexpr int CHUNK = 16 / sizeof(float);

// One 16-byte chunk of shared memory -> CHUNK floats in registers.
__device__ __forceinline__ void load_chunk(const float *p, float f[CHUNK]) {
    const float4 v = *(const float4 *)p;
    f[0] = v.x, f[1] = v.y, f[2] = v.z, f[3] = v.w;
}

// CHUNK floats -> one 16-byte chunk of global memory.
__device__ __forceinline__ void store_chunk(float *p, const float f[CHUNK]) {
    *(float4 *)p = make_float4(f[0], f[1], f[2], f[3]);
}

// Rows row0 .. row0 + ROWS - 1 of one head's [N, D] matrix -> tile[ROWS][LD] in shared memory
// (LD >= D elements per row), in 16-byte chunks: consecutive threads take consecutive chunks, so
// the global reads coalesce. Rows >= N are zero-filled: a tail tile reads nothing out of bounds.
template <int ROWS, int D, int LD, int THREADS>
__device__ __forceinline__ void load_tile(float *tile, const float *__restrict__ src, int row0,
                                          int N, int tid) {
    constexpr int CHUNKS_PER_ROW = D / CHUNK;
#pragma unroll
    for (int c = tid; c < ROWS * CHUNKS_PER_ROW; c += THREADS) {
        const int r = c / CHUNKS_PER_ROW;
        const int col = (c % CHUNKS_PER_ROW) * CHUNK;
        float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
        if (row0 + r < N) v = *(const float4 *)(src + (size_t)(row0 + r) * D + col);
        *(float4 *)(tile + r * LD + col) = v;
    }
}

/* ---- kernel phases ----------------------------------------------------------------------- */

// The phases of the kernel's key loop below, each a named piece (__forceinline__, so the names
// cost no instruction): the kernel reads as the algorithm.

// Scores: S[j] = q_i . k_j for the BC keys of the tile, in registers, KEYS_PER_PASS keys per pass
// over q_i (unscaled). Every thread of a warp reads the same K_smem chunk (a broadcast), but its
// own Q_smem row: the rows are D floats apart, so the warp's Q_smem reads pile onto the same banks
// (the conflict stage 2 removes). The d loop stays rolled: O_acc and S hold most registers, and a
// longer unrolled stretch lets the compiler hoist more K_smem loads than there are registers left
// (spills).
template <int D, int BC>
__device__ __forceinline__ void scores(float S[BC], const float *Q_smem, const float *K_smem,
                                       int tid) {
#pragma unroll
    for (int j = 0; j < BC; ++j) S[j] = 0.f;
    // LAB HOLE 1 BEGIN: the scores S[j] = q_i . k_j of the tile
    // LAB TODO: add q_i . k_j to S[j] (zeroed above) for the tile's BC keys j, unscaled: q_i is
    // LAB TODO: row tid of Q_smem [BR][D] and k_j row j of K_smem [BC][D] (floats). Read shared
    // LAB TODO: memory in 16-byte chunks, each chunk of q_i serving KEYS_PER_PASS keys.
    // LAB STUB: (void)Q_smem, (void)K_smem, (void)tid;  // unused until the hole is filled
#pragma unroll
    for (int j0 = 0; j0 < BC; j0 += KEYS_PER_PASS) {
#pragma unroll 1
        for (int d = 0; d < D; d += CHUNK) {
            float q[CHUNK];
            load_chunk(&Q_smem[tid * D + d], q);
#pragma unroll
            for (int j = j0; j < j0 + KEYS_PER_PASS; ++j) {
                float k[CHUNK];
                load_chunk(&K_smem[j * D + d], k);
#pragma unroll
                for (int c = 0; c < CHUNK; ++c) S[j] = fmaf(q[c], k[c], S[j]);
            }
        }
    }
    // LAB HOLE 1 END
}

// Online-softmax update: folds the tile's scores S (keys k0 .. k0 + BC - 1) into row i's running
// max m_i, sum l_i and output O_acc; V_smem [BC][D] is the tile's values.
template <int D, int BC>
__device__ __forceinline__ void online_softmax_update(float S[BC], float &m_i, float &l_i,
                                                      float O_acc[D], const float *V_smem, int k0,
                                                      int N, int causal, int i, float scale) {
    // LAB HOLE 2 BEGIN [design]: the online-softmax update
    // LAB TODO: fold the tile's raw scores S[j] (key k0 + j) into row i's running state, so that
    // LAB TODO: afterwards, over every key seen so far: m_i is the largest score, l_i the sum of
    // LAB TODO: exp(score - m_i), and O_acc[d] the sum of exp(score - m_i) * v[d], v the key's row
    // LAB TODO: of V_smem [BC][D] (floats, rows 16-byte aligned). A key's score is scale * S[j];
    // LAB TODO: keys at or past N, and (causal) keys after row i, are masked: they add nothing.
    // LAB TODO: What l_i and O_acc hold on entry is relative to the old m_i. While every key so
    // LAB TODO: far is masked, m_i stays -inf: no NaN may come of it.
    // LAB STUB: (void)S, (void)m_i, (void)l_i, (void)O_acc, (void)V_smem, (void)k0, (void)N;
    // LAB STUB: (void)causal, (void)i, (void)scale;  // unused until the hole is filled
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
    // LAB HOLE 2 END
}

// Epilogue: O_i = O_acc / l_i and LSE_i = m_i + log(l_i) for row i of this head's O [N, D] and
// lse [N]. Query rows past N are never written. Every row i < N has seen key 0, so l_i >= 1 here.
template <int D>
__device__ __forceinline__ void store_row(float *O, float *lse, const float O_acc[D], float m_i,
                                          float l_i, int i, int N) {
    // LAB HOLE 3 BEGIN: O and LSE of row i
    // LAB TODO: for a row i < N only (rows past N are never written): row i of this head's O
    // LAB TODO: ([N][D] floats) = O_acc / l_i, stored 16 bytes at a time; lse[i] = m_i + ln(l_i).
    // LAB STUB: (void)O, (void)lse, (void)O_acc, (void)i, (void)m_i, (void)l_i, (void)N;
    if (i < N) {
        const float inv_l = 1.f / l_i;
        float *O_row = O + (size_t)i * D;
#pragma unroll
        for (int d = 0; d < D; d += CHUNK) {
            float o[CHUNK];
#pragma unroll
            for (int c = 0; c < CHUNK; ++c) o[c] = O_acc[d + c] * inv_l;
            store_chunk(O_row + d, o);
        }
        lse[i] = m_i + logf(l_i);
    }
    // LAB HOLE 3 END
}

/* ---- kernel ------------------------------------------------------------------------------ */

// One block: query rows q0 .. q0 + BR - 1 of head bh; thread tid owns query row i = q0 + tid.
// Grid: 1D, n_q_tiles * B * H blocks, the Q tile index running fastest (the blocks of one head
// run together and share its K/V in L2).
template <int D, int BC>
__global__ void __launch_bounds__(BR)
    attention_kernel(const float *__restrict__ Q,  // [B, H, N, D]
                     const float *__restrict__ K,  // [B, H, N, D]
                     const float *__restrict__ V,  // [B, H, N, D]
                     float *__restrict__ O,        // [B, H, N, D]
                     float *__restrict__ lse,      // [B, H, N]
                     int N, int n_q_tiles, int causal, float scale) {
    static_assert(BC % KEYS_PER_PASS == 0, "a tile is a whole number of passes");
    extern __shared__ uint4 smem_raw[];  // uint4: 16-byte aligned for the chunked accesses
    float *Q_smem = (float *)smem_raw;   // [BR][D]
    float *K_smem = Q_smem + BR * D;     // [BC][D]
    float *V_smem = K_smem + BC * D;     // [BC][D]

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
    load_tile<BR, D, D, BR>(Q_smem, Q, q0, N, tid);

    // Online softmax state of row i, in registers.
    float m_i = -INFINITY;  // running max of the scaled scores
    float l_i = 0.f;        // running sum of exp(score - m_i)
    float O_acc[D];         // running sum of exp(score - m_i) * v_j
#pragma unroll
    for (int d = 0; d < D; ++d) O_acc[d] = 0.f;

    // LAB HOLE 4 BEGIN [design]: the key loop: K/V tiles through shared memory, and its barriers
    // LAB TODO: stream this head's keys and values past the block's Q tile, one tile of BC rows
    // LAB TODO: at a time (FlashAttention-2's loop order: the Q tile stays, the K/V tiles move).
    // LAB TODO: Tile kt is keys kt * BC .. kt * BC + BC - 1: bring it into K_smem and V_smem
    // LAB TODO: ([BC][D] floats each, rows past N as zeros), then every thread scores its row
    // LAB TODO: against the tile and folds the scores into its m_i, l_i and O_acc (holes 1, 2).
    // LAB TODO: Which tiles: each that holds a key below N; when causal, none after the tile that
    // LAB TODO: holds the block's last query row below N (their keys are masked for all its rows).
    // LAB TODO: Barriers: the threads fill a tile together and each reads all of it, so no thread
    // LAB TODO: may read a tile before every part of it (and, the first time, of Q_smem) is
    // LAB TODO: written, and none may overwrite it while another still reads it.
    // LAB STUB: (void)K_smem, (void)V_smem, (void)causal, (void)scale;  // no tile read: O is NaN
    // Causal: key tiles after the one holding the block's last query row are all masked.
    const int last_row = min(q0 + BR, N) - 1;
    const int n_kv_tiles = causal ? last_row / BC + 1 : (N + BC - 1) / BC;

    for (int kt = 0; kt < n_kv_tiles; ++kt) {
        const int k0 = kt * BC;
        // K_j, V_j -> K_smem, V_smem
        load_tile<BC, D, D, BR>(K_smem, K, k0, N, tid);
        load_tile<BC, D, D, BR>(V_smem, V, k0, N, tid);
        __syncthreads();  // K_smem/V_smem (and, at kt == 0, Q_smem) are filled

        float S[BC];
        scores<D, BC>(S, Q_smem, K_smem, tid);
        online_softmax_update<D, BC>(S, m_i, l_i, O_acc, V_smem, k0, N, causal, i, scale);
        __syncthreads();  // every thread is done with K_smem/V_smem before the next tile lands
    }
    // LAB HOLE 4 END

    store_row<D>(O, lse, O_acc, m_i, l_i, i, N);
}

/* ---- launcher ---------------------------------------------------------------------------- */

static size_t smem_bytes(int D, int BC) {
    return (size_t)(BR + 2 * BC) * D * sizeof(float);  // Q_smem + K_smem + V_smem
}

static int tile_bc(int D) {
    return D == 64 ? BC_D64 : BC_D128;
}

static const char *attention_unsupported(const attn_shape *s, const attn_device *dev, int variant) {
    if (variant != 0) return "stage 1 has only the variant default";
    if (s->D != 64 && s->D != 128) return "head dim must be 64 or 128";
    if (s->B < 1 || s->H < 1 || s->N < 1) return "B, H and N must be >= 1";
    if (smem_bytes(s->D, tile_bc(s->D)) > dev->smem_per_block)
        return "needs 64 KB of shared memory per block (48 KB at D = 64)";
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
static cudaError_t launch(const attn_shape *s, const float *Q, const float *K, const float *V,
                          float *O, float *lse, cudaStream_t stream) {
    const size_t smem = smem_bytes(D, BC);
    if (smem > 48 * 1024)
        ATTN_TRY(cudaFuncSetAttribute(attention_kernel<D, BC>,
                                      cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    const int n_q_tiles = (s->N + BR - 1) / BR;
    const unsigned blocks = (unsigned)((long long)n_q_tiles * s->B * s->H);
    attention_kernel<D, BC>
        <<<blocks, BR, smem, stream>>>(Q, K, V, O, lse, s->N, n_q_tiles, s->causal, s->scale);
    ATTN_TRY(cudaGetLastError());
    return cudaSuccess;
}

static cudaError_t attention_forward(const attn_shape *s, const attn_device *dev, const void *Q,
                                     const void *K, const void *V, void *O, float *lse,
                                     void *workspace, int variant, cudaStream_t stream) {
    (void)workspace;
    const char *why = attention_unsupported(s, dev, variant);
    if (why) {
        fprintf(stderr, "stage1_scalar_flash: %s\n", why);
        return cudaErrorInvalidValue;
    }
    // The 16-byte loads and stores need 16-byte aligned tensors (cudaMalloc gives 256).
    if (((uintptr_t)Q | (uintptr_t)K | (uintptr_t)V | (uintptr_t)O) % 16) {
        fprintf(stderr, "stage1_scalar_flash: Q, K, V and O must be 16-byte aligned\n");
        return cudaErrorMisalignedAddress;
    }
    const float *q = (const float *)Q, *k = (const float *)K, *v = (const float *)V;
    float *o = (float *)O;
    if (s->D == 64) return launch<64, BC_D64>(s, q, k, v, o, lse, stream);
    return launch<128, BC_D128>(s, q, k, v, o, lse, stream);
}

extern "C" const attn_stage attn_this_stage = {
    "stage1_scalar_flash",
    "fused flash attention: online softmax in registers, K/V tiles in shared memory",
    ATTN_F32,
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
