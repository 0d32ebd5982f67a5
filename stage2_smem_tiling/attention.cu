/*
 * Stage 2: shared-memory tiling done right (fp16 storage, fp32 math).
 *
 * Adds over stage 1, and nothing else:
 *   (a) padding: each Q_smem row is Q_PAD = 8 halves (16 bytes) longer than D, so row t starts
 *       in a different group of four banks than row t - 1 and the warp's 16-byte reads of its
 *       own rows are conflict-free (variant `nopad` keeps stage 1's unpadded rows);
 *   (b) fp16 storage: Q, K, V and O are IEEE halves in HBM and in shared memory, converted to
 *       float on use; the math (scores, softmax, O_acc) stays fp32. Half the bytes per tile;
 *   (c) bigger tiles: BR = 128 query rows (4 warps) per block, so each K/V tile brought into
 *       shared memory serves twice as many rows, still within a T4's 64 KB per block; and in
 *       registers, each chunk of q_i read from Q_smem serves 4 keys (KEYS_PER_PASS) instead of 1.
 *
 * Expected gain over stage 1: every Q_smem read takes 4 shared-memory wavefronts instead of 32
 * and there are 4x fewer of them; each K/V byte fetched feeds twice the rows, and the tensors
 * move half the bytes. Stage 1 is bound by its Q_smem reads, so this should be well over 2x.
 *
 * Run: make build && build/stage2_smem_tiling --seq 4096 --dim 128 --bench
 *      build/stage2_smem_tiling --seq 4096 --dim 128 --bench --variant nopad
 *
 * NOTE: each K/V tile is loaded, then waited for (__syncthreads), then computed on: while the
 * loads are in flight no thread computes, and while it computes nothing loads. Stage 3
 * double-buffers the K/V tiles so the next tile's loads overlap this tile's math.
 */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>

#include "attention.h"

/* ---- tunables ---------------------------------------------------------------------------- */

// Q rows per block = threads per block (one query row per thread): 4 warps.
constexpr int BR = 128;
// K/V rows per tile at D = 64: S[64] and O_acc[64] stay in registers; smem 34,816 B.
constexpr int BC_D64 = 64;
// K/V rows per tile at D = 128: S[32] and O_acc[128] stay in registers (no spills), and the
// shared memory, 128 * (128 + 8) * 2 + 2 * 32 * 128 * 2 = 51,200 B, fits a T4's 64 KB.
constexpr int BC_D128 = 32;
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
    // LAB HOLE 2 BEGIN: fp16 loads: 8 halves to 8 floats
    // LAB TODO: the 8 halves at p (16 bytes, 16-byte aligned) as floats f[0..7], in order, read
    // LAB TODO: in one 16-byte load: every shared-memory read of the kernel comes through here.
    // LAB STUB: for (int c = 0; c < CHUNK; ++c) f[c] = 0.f;  // zeros until the hole is filled
    const uint4 v = *(const uint4 *)p;
    const unsigned w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int c = 0; c < 4; ++c) {
        const float2 t = __half22float2(*(const __half2 *)&w[c]);
        f[2 * c] = t.x, f[2 * c + 1] = t.y;
    }
    // LAB HOLE 2 END
}

// CHUNK floats -> one 16-byte chunk of global memory (fp32 -> fp16, round to nearest).
__device__ __forceinline__ void store_chunk(__half *p, const float f[CHUNK]) {
    // LAB HOLE 3 BEGIN: fp16 stores: 8 floats to 8 halves
    // LAB TODO: f[0..7] rounded to halves (to nearest) at p, in order, in one 16-byte store (p is
    // LAB TODO: 16-byte aligned).
    unsigned w[4];
#pragma unroll
    for (int c = 0; c < 4; ++c) {
        const __half2 t = __floats2half2_rn(f[2 * c], f[2 * c + 1]);
        w[c] = *(const unsigned *)&t;
    }
    *(uint4 *)p = make_uint4(w[0], w[1], w[2], w[3]);
    // LAB HOLE 3 END
}

// Rows row0 .. row0 + ROWS - 1 of one head's [N, D] matrix -> tile[ROWS][LD] in shared memory
// (LD >= D elements per row), in 16-byte chunks: consecutive threads take consecutive chunks, so
// the global reads coalesce. Rows >= N are zero-filled: a tail tile reads nothing out of bounds.
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

/* ---- kernel phases ----------------------------------------------------------------------- */

// The phases of the kernel's key loop below, each a named piece (__forceinline__, so the names
// cost no instruction): the kernel reads as the algorithm.

// S = q_i . k_j for the BC keys of the tile, in registers (unscaled). d outer, j inner: each chunk
// of q_i read from Q_smem serves KEYS_PER_PASS keys. Every thread of a warp reads the same
// K_smem chunk (a broadcast), and its own Q_smem row: the rows are D + PAD halves
// apart, an odd number of 16-byte chunks, so the warp's Q_smem reads spread over all
// banks (with PAD = 0 they pile onto the same four, as in stage 1).
// The d loop stays rolled: O_acc and S hold most registers, and a longer unrolled
// stretch lets the compiler hoist more K_smem loads than there are registers (spills).
template <int D, int BC, int PAD>
__device__ __forceinline__ void scores(float S[BC], const __half *Q_smem, const __half *K_smem,
                                       int tid) {
#pragma unroll
    for (int j = 0; j < BC; ++j) S[j] = 0.f;
    // LAB HOLE 1 BEGIN [design]: the padded Q tile and its scores: 4 keys per read of q_i
    // LAB TODO: add q_i . k_j to S[j] (zeroed above) for the tile's BC keys j, unscaled, in fp32.
    // LAB TODO: q_i is row tid of Q_smem [BR][D + PAD] (halves, rows padded as the kernel wrote
    // LAB TODO: them: PAD = Q_PAD, or 0 for the variant nopad); k_j is row j of K_smem [BC][D],
    // LAB TODO: unpadded. Shared memory is read in 16-byte chunks (8 halves, as floats), and each
    // LAB TODO: chunk of q_i read must serve KEYS_PER_PASS keys: a register tile of 4 keys, which
    // LAB TODO: cuts the Q_smem reads 4x. Registers are tight (S and O_acc hold most of them): the
    // LAB TODO: tunables' comments say what spills.
    // LAB STUB: (void)Q_smem, (void)K_smem, (void)tid;  // unused until the hole is filled
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
    // LAB HOLE 1 END
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
// PAD: halves of padding per Q_smem row (Q_PAD, or 0 for the variant nopad).
template <int D, int BC, int PAD>
__global__ void __launch_bounds__(BR)
    attention_kernel(const __half *__restrict__ Q,  // [B, H, N, D]
                     const __half *__restrict__ K,  // [B, H, N, D]
                     const __half *__restrict__ V,  // [B, H, N, D]
                     __half *__restrict__ O,        // [B, H, N, D]
                     float *__restrict__ lse,       // [B, H, N]
                     int N, int n_q_tiles, int causal, float scale) {
    static_assert(BC % KEYS_PER_PASS == 0, "a tile is a whole number of passes");
    extern __shared__ uint4 smem_raw[];        // uint4: 16-byte aligned for the chunked accesses
    __half *Q_smem = (__half *)smem_raw;       // [BR][D + PAD]
    __half *K_smem = Q_smem + BR * (D + PAD);  // [BC][D]
    __half *V_smem = K_smem + BC * D;          // [BC][D]

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

    // LAB HOLE 1 BEGIN [design]: the padded Q tile and its scores: Q_i into the padded rows
    // LAB TODO: the block's query rows q0 .. q0 + BR - 1 of this head's Q [N][D] into Q_smem, row t
    // LAB TODO: of the tile at Q_smem + t * (D + PAD) (the padding, against the bank conflict),
    // LAB TODO: rows past N as zeros; the key loop's first barrier publishes them.
    // Q_i -> Q_smem (rows >= N zero-filled)
    load_tile<BR, D, D + PAD, BR>(Q_smem, Q, q0, N, tid);
    // LAB HOLE 1 END

    // Online softmax state of row i, in registers.
    float m_i = -INFINITY;  // running max of the scaled scores
    float l_i = 0.f;        // running sum of exp(score - m_i)
    float O_acc[D];         // running sum of exp(score - m_i) * v_j
#pragma unroll
    for (int d = 0; d < D; ++d) O_acc[d] = 0.f;

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
        scores<D, BC, PAD>(S, Q_smem, K_smem, tid);
        online_softmax_update<D, BC>(S, m_i, l_i, O_acc, V_smem, k0, N, causal, i, scale);
        __syncthreads();  // every thread is done with K_smem/V_smem before the next tile lands
    }

    store_row<D>(O, lse, O_acc, m_i, l_i, i, N);
}

/* ---- launcher ---------------------------------------------------------------------------- */

static size_t smem_bytes(int D, int BC, int pad) {
    return ((size_t)BR * (D + pad) + 2 * BC * D) * sizeof(__half);  // Q_smem + K_smem + V_smem
}

static int tile_bc(int D) {
    return D == 64 ? BC_D64 : BC_D128;
}

static const char *attention_unsupported(const attn_shape *s, const attn_device *dev, int variant) {
    if (variant != 0 && variant != 1) return "stage 2 has the variants default and nopad";
    if (s->D != 64 && s->D != 128) return "head dim must be 64 or 128";
    if (s->B < 1 || s->H < 1 || s->N < 1) return "B, H and N must be >= 1";
    if (smem_bytes(s->D, tile_bc(s->D), variant == 1 ? 0 : Q_PAD) > dev->smem_per_block)
        return "needs 50 KB of shared memory per block (34 KB at D = 64)";
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

template <int D, int BC, int PAD>
static cudaError_t launch(const attn_shape *s, const __half *Q, const __half *K, const __half *V,
                          __half *O, float *lse, cudaStream_t stream) {
    const size_t smem = smem_bytes(D, BC, PAD);
    if (smem > 48 * 1024)
        ATTN_TRY(cudaFuncSetAttribute(attention_kernel<D, BC, PAD>,
                                      cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    const int n_q_tiles = (s->N + BR - 1) / BR;
    const unsigned blocks = (unsigned)((long long)n_q_tiles * s->B * s->H);
    attention_kernel<D, BC, PAD>
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
        fprintf(stderr, "stage2_smem_tiling: %s\n", why);
        return cudaErrorInvalidValue;
    }
    // The 16-byte loads and stores need 16-byte aligned tensors (cudaMalloc gives 256).
    if (((uintptr_t)Q | (uintptr_t)K | (uintptr_t)V | (uintptr_t)O) % 16) {
        fprintf(stderr, "stage2_smem_tiling: Q, K, V and O must be 16-byte aligned\n");
        return cudaErrorMisalignedAddress;
    }
    const __half *q = (const __half *)Q, *k = (const __half *)K, *v = (const __half *)V;
    __half *o = (__half *)O;
    if (variant == 1) {  // nopad: stage 1's unpadded Q_smem rows, all else the same
        if (s->D == 64) return launch<64, BC_D64, 0>(s, q, k, v, o, lse, stream);
        return launch<128, BC_D128, 0>(s, q, k, v, o, lse, stream);
    }
    if (s->D == 64) return launch<64, BC_D64, Q_PAD>(s, q, k, v, o, lse, stream);
    return launch<128, BC_D128, Q_PAD>(s, q, k, v, o, lse, stream);
}

extern "C" const attn_stage attn_this_stage = {
    "stage2_smem_tiling",
    "padded shared-memory rows (no bank conflicts), fp16 storage, bigger tiles",
    ATTN_F16,
    "default,nopad",
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
