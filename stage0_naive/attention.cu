/*
 * Stage 0: naive attention (fp32), the way the formula reads.
 *
 * Three kernels, each a full pass over HBM:
 *   scores_kernel   S = scale * Q K^T        one thread per score, S is [B, H, N, N] in HBM
 *   softmax_kernel  P = softmax(S), in place  one block per row; also LSE = m + log(l)
 *   pv_kernel       O = P V                   one thread per output element
 * The causal mask is applied by softmax_kernel (keys j > i get P = 0), so that the variant
 * `cublas`, which computes both products with cublasSgemmStridedBatched, shares it.
 *
 * Cost: the workspace S holds B * H * N^2 floats (64 GiB at N = 131,072): the program reports
 * out-of-memory from there on. S is written once and read three times by the softmax and once
 * by P V, and the products read Q, K and V straight from global memory with no reuse beyond the
 * caches. This is the baseline every later stage is measured against.
 *
 * Run: make build && build/stage0_naive --seq 4096 --dim 128 --bench
 *      build/stage0_naive --seq 4096 --dim 128 --bench --variant cublas
 *
 * NOTE: the N x N matrix S makes a round trip through HBM and caps N by memory. Stage 1 fuses
 * the three kernels so that S and P only ever exist one tile at a time, on chip.
 */
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <limits.h>
#include <math.h>

#include "attention.h"

/* ---- tunables ---------------------------------------------------------------------------- */

// Threads per block of scores_kernel and pv_kernel: enough to cover latency, one warp-multiple.
constexpr int THREADS = 256;
// Threads per block of softmax_kernel (one block per row of S): 8 warps share a row.
constexpr int SOFTMAX_THREADS = 256;
// Grid size cap for the grid-stride loops (gridDim.y's limit, from attention.h; x could be larger,
// but a grid of this many blocks already fills any GPU many times over).
constexpr unsigned MAX_BLOCKS = ATTN_MAX_GRID_Y;

/* ---- device helpers ---------------------------------------------------------------------- */

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Max over the block; every thread gets the result. red: 32 floats of shared memory.
__device__ float block_max(float v, float *red) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    v = warp_max(v);
    __syncthreads();  // red[] is no longer being read by a previous reduction
    if (lane == 0) red[warp] = v;
    __syncthreads();  // every warp's partial is in red[]
    v = lane < (int)blockDim.x / 32 ? red[lane] : -INFINITY;
    return warp_max(v);
}

// Sum over the block; every thread gets the result. red: 32 floats of shared memory.
__device__ float block_sum(float v, float *red) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    v = warp_sum(v);
    __syncthreads();  // red[] is no longer being read by a previous reduction
    if (lane == 0) red[warp] = v;
    __syncthreads();  // every warp's partial is in red[]
    v = lane < (int)blockDim.x / 32 ? red[lane] : 0.f;
    return warp_sum(v);
}

/* ---- kernels ----------------------------------------------------------------------------- */

// S[bh][i][j] = scale * q_i . k_j for every i, j (the mask is softmax_kernel's job).
// Grid: x covers the keys j of a row (one thread each), y strides over the B*H*N rows.
// Threads of a block share q_i (the same addresses: a broadcast); each reads its own k_j.
__global__ void __launch_bounds__(THREADS)
    scores_kernel(const float *__restrict__ Q,  // [B, H, N, D]
                  const float *__restrict__ K,  // [B, H, N, D]
                  float *__restrict__ S,        // [B, H, N, N]
                  int N, int D, long long rows, float scale) {
    const int j = blockIdx.x * THREADS + threadIdx.x;
    if (j >= N) return;
    for (long long row = blockIdx.y; row < rows; row += gridDim.y) {  // row = bh * N + i
        const long long bh = row / N;
        const float *q = Q + (size_t)row * D;           // q_i of head bh
        const float *k = K + ((size_t)bh * N + j) * D;  // k_j of head bh
        float s = 0.f;
        for (int d = 0; d < D; ++d) s = fmaf(q[d], k[d], s);
        S[(size_t)row * N + j] = s * scale;
    }
}

// One block per row of S: P = softmax of the row, in place, with the causal mask (keys j > i
// get P = 0), and lse[row] = m + log(l). Three passes over the row: max, sum, write.
__global__ void __launch_bounds__(SOFTMAX_THREADS)
    softmax_kernel(float *__restrict__ S,    // [B, H, N, N], P on return
                   float *__restrict__ lse,  // [B, H, N]
                   int N, long long rows, int causal) {
    __shared__ float red[32];
    for (long long row = blockIdx.x; row < rows; row += gridDim.x) {  // row = bh * N + i
        const int i = (int)(row % N);
        const int n_keys = causal ? i + 1 : N;  // keys this row attends to: 0 .. n_keys - 1
        float *s = S + (size_t)row * N;

        float m = -INFINITY;  // row max of the scaled scores
        for (int j = threadIdx.x; j < n_keys; j += SOFTMAX_THREADS) m = fmaxf(m, s[j]);
        m = block_max(m, red);

        float l = 0.f;  // sum of exp(s_j - m)
        for (int j = threadIdx.x; j < n_keys; j += SOFTMAX_THREADS) l += expf(s[j] - m);
        l = block_sum(l, red);

        const float inv_l = 1.f / l;  // l >= 1: the max element contributes exp(0)
        for (int j = threadIdx.x; j < N; j += SOFTMAX_THREADS)
            s[j] = j < n_keys ? expf(s[j] - m) * inv_l : 0.f;
        if (threadIdx.x == 0) lse[row] = m + logf(l);
    }
}

// O[bh][i][d] = sum_j P[bh][i][j] * V[bh][j][d], one thread per output element, the threads
// of a warp on consecutive d (coalesced V reads, P[i][j] a broadcast). Causal rows stop at j = i.
__global__ void __launch_bounds__(THREADS) pv_kernel(const float *__restrict__ P,  // [B, H, N, N]
                                                     const float *__restrict__ V,  // [B, H, N, D]
                                                     float *__restrict__ O,        // [B, H, N, D]
                                                     int N, int D, long long elements, int causal) {
    for (long long e = (long long)blockIdx.x * THREADS + threadIdx.x; e < elements;
         e += (long long)gridDim.x * THREADS) {
        const long long row = e / D;  // bh * N + i
        const int d = (int)(e % D);
        const long long bh = row / N;
        const int i = (int)(row % N);
        const int n_keys = causal ? i + 1 : N;
        const float *p = P + (size_t)row * N;
        const float *v = V + (size_t)bh * N * D + d;
        float o = 0.f;
        for (int j = 0; j < n_keys; ++j) o = fmaf(p[j], v[(size_t)j * D], o);
        O[e] = o;
    }
}

/* ---- launcher ---------------------------------------------------------------------------- */

static const char *attention_unsupported(const attn_shape *s, const attn_device *dev, int variant) {
    (void)dev;
    if (variant != 0 && variant != 1) return "stage 0 has the variants default and cublas";
    if (s->D != 64 && s->D != 128) return "head dim must be 64 or 128";
    if (s->B < 1 || s->H < 1 || s->N < 1) return "B, H and N must be >= 1";
    if (variant == 1 && (long long)s->B * s->H > INT_MAX)
        return "cuBLAS batch count B * H exceeds its int argument";
    return NULL;
}

static size_t attention_workspace_bytes(const attn_shape *s, const attn_device *dev, int variant) {
    (void)dev;
    (void)variant;
    return (size_t)s->B * s->H * s->N * s->N * sizeof(float);  // S, then P: [B, H, N, N]
}

// A cuBLAS status as a cudaError_t, with a message naming the call.
static cudaError_t cublas_error(cublasStatus_t st, const char *call, int line) {
    fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, line, call, cublasGetStatusString(st));
    return st == CUBLAS_STATUS_ALLOC_FAILED ? cudaErrorMemoryAllocation : cudaErrorUnknown;
}

#define CUBLAS_TRY(call)                                                             \
    do {                                                                             \
        cublasStatus_t st_ = (call);                                                 \
        if (st_ != CUBLAS_STATUS_SUCCESS) return cublas_error(st_, #call, __LINE__); \
    } while (0)

// The cuBLAS handle: created once, on first use, and kept for the life of the process.
static cudaError_t cublas_handle(cublasHandle_t *out, cudaStream_t stream) {
    static cublasHandle_t handle = NULL;
    if (!handle) {
        CUBLAS_TRY(cublasCreate(&handle));
        CUBLAS_TRY(cublasSetMathMode(handle, CUBLAS_DEFAULT_MATH));  // plain fp32 (no TF32)
    }
    CUBLAS_TRY(cublasSetStream(handle, stream));
    *out = handle;
    return cudaSuccess;
}

// Variant cublas: both products by cublasSgemmStridedBatched, which is column-major. A row-major
// [rows, cols] matrix is the column-major [cols, rows] matrix, its transpose. So S = Q K^T
// (row-major) is S^T = K Q^T (column-major):
//   S^T [N x N, ld N] = (K^T [D x N, ld D])^T * Q^T [D x N, ld D]   gemm(T, N, m=N, n=N, k=D)
// and O = P V is O^T = V^T P^T:
//   O^T [D x N, ld D] = V^T [D x N, ld D] * P^T [N x N, ld N]        gemm(N, N, m=D, n=N, k=N)
// The (b, h) heads are contiguous, so one strided batch of B * H covers them.
static cudaError_t attention_forward(const attn_shape *s, const attn_device *dev, const void *Q,
                                     const void *K, const void *V, void *O, float *lse,
                                     void *workspace, int variant, cudaStream_t stream) {
    const char *why = attention_unsupported(s, dev, variant);
    if (why) {
        fprintf(stderr, "stage0_naive: %s\n", why);
        return cudaErrorInvalidValue;
    }
    const float *q = (const float *)Q, *k = (const float *)K, *v = (const float *)V;
    float *o = (float *)O;
    float *S = (float *)workspace;  // [B, H, N, N]
    const int N = s->N, D = s->D, batch = s->B * s->H;
    const long long rows = (long long)batch * N;  // rows of S (and of O) over all heads
    const long long nd = (long long)N * D, nn = (long long)N * N;
    const float one = 1.f, zero = 0.f;
    cublasHandle_t handle = NULL;
    if (variant == 1) ATTN_TRY(cublas_handle(&handle, stream));

    // S = scale * Q K^T
    if (variant == 1) {
        CUBLAS_TRY(cublasSgemmStridedBatched(handle, CUBLAS_OP_T, CUBLAS_OP_N, N, N, D, &s->scale,
                                             k, D, nd, q, D, nd, &zero, S, N, nn, batch));
    } else {
        const dim3 grid((N + THREADS - 1) / THREADS,
                        (unsigned)(rows < MAX_BLOCKS ? rows : MAX_BLOCKS));
        scores_kernel<<<grid, THREADS, 0, stream>>>(q, k, S, N, D, rows, s->scale);
        ATTN_TRY(cudaGetLastError());
    }

    // P = softmax(S) in place (causal mask here), LSE
    softmax_kernel<<<(unsigned)(rows < MAX_BLOCKS ? rows : MAX_BLOCKS), SOFTMAX_THREADS, 0,
                     stream>>>(S, lse, N, rows, s->causal);
    ATTN_TRY(cudaGetLastError());

    // O = P V
    if (variant == 1) {
        CUBLAS_TRY(cublasSgemmStridedBatched(handle, CUBLAS_OP_N, CUBLAS_OP_N, D, N, N, &one, v, D,
                                             nd, S, N, nn, &zero, o, D, nd, batch));
    } else {
        const long long elements = rows * D;
        const long long blocks = (elements + THREADS - 1) / THREADS;
        pv_kernel<<<(unsigned)(blocks < MAX_BLOCKS ? blocks : MAX_BLOCKS), THREADS, 0, stream>>>(
            S, v, o, N, D, elements, s->causal);
        ATTN_TRY(cudaGetLastError());
    }
    return cudaSuccess;
}

extern "C" const attn_stage attn_this_stage = {
    "stage0_naive",
    "three kernels: S = Q K^T, row softmax, O = P V; S lives in HBM",
    ATTN_F32,
    "default,cublas",
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
