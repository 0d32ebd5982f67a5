/*
 * Stage 10: context parallelism. Ring attention over NCCL, forward and backward, any number of
 * GPUs.
 *
 * Adds over stages 6 and 8 (5 and 7 off Hopper): nothing inside a GPU. The sequence is split along
 * its tokens over P GPUs (common/ring.h: ring_split, zigzag or contiguous); each GPU keeps its
 * queries and the keys and values go around a ring, GPU r sending to r + 1 and receiving from
 * r - 1, one slice a step, P steps. At step t GPU r holds the keys of GPU s = r - t (mod P) and
 * runs the inner stage's forward on the block ring_step names (its own queries against those keys,
 * with the causal mask on the diagonal only), while NCCL brings the next slice on a stream of its
 * own. The steps' partial outputs are merged by their log-sum-exp (merge_kernel): with two
 * partials (o_a, lse_a) and (o_b, lse_b) of one row, lse = log(e^lse_a + e^lse_b) and
 * o = o_a e^(lse_a - lse) + o_b e^(lse_b - lse). The backward pass runs the inner backward on the
 * same blocks with the final o and lse (each block's P = exp(s - lse) is then already the whole
 * row's softmax): dQ adds up on its GPU, dK and dV add up in an fp32 accumulator that travels with
 * the keys' slice and comes home after P steps.
 *
 * Expected: two GPUs within 10% of twice one GPU's speed at long N (the work of a step is O(n^2),
 * the bytes it waits for O(n)); the zigzag split balances the causal mask, the contiguous one
 * leaves GPU 0 idle for half the steps.
 *
 *   make cp                          the context-parallel program on every GPU here
 *   build/stage10_context_parallel --seq 131072 --heads 32 --kv-heads 8 --causal --backward --bench
 *
 * NOTE: past the ring, the next limit is the ring itself: a step's keys must arrive before its
 * compute ends (at short N they do not: the lesson measures where one GPU wins), and P GPUs each
 * hold 1/P of the sequence, so P grows with N only.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <nccl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "attention.h"
#include "ring.h"

// Threads per block of the elementwise kernels (merge, accumulate, fill): a multiple of the warp.
#define RING_THREADS 256
#define WARP 32

// ---- the elementwise kernels: one value in float, whatever it is stored as ----

__device__ __forceinline__ float load_value(const float *p) {
    return *p;
}
__device__ __forceinline__ float load_value(const __half *p) {
    return __half2float(*p);
}
__device__ __forceinline__ float load_value(const __nv_bfloat16 *p) {
    return __bfloat162float(*p);
}
__device__ __forceinline__ void store_value(float *p, float x) {
    *p = x;
}
__device__ __forceinline__ void store_value(__half *p, float x) {
    *p = __float2half_rn(x);
}
__device__ __forceinline__ void store_value(__nv_bfloat16 *p, float x) {
    *p = __float2bfloat16_rn(x);
}

// The merge of one step's partial output into the accumulated one, a warp per row of
// [B * H, n] (rows row0 .. row0 + rows - 1 have a partial, part_o [B * H, rows, D] and part_lse
// [B * H, rows]; the others keep theirs). acc_o and out_o may be one buffer (in place), as acc_lse
// and out_lse are: a row's lse is read by every lane before lane 0 writes it.
template <typename A, typename P, typename O>
__global__ void merge_kernel(O *out_o, float *lse, const A *acc_o, const P *part_o,
                             const float *part_lse, long long bh_rows, long long n, long long row0,
                             long long rows, int D) {
    const int lane = threadIdx.x % WARP;
    const long long warps = (long long)gridDim.x * (blockDim.x / WARP);
    for (long long w = blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP; w < bh_rows;
         w += warps) {
        const long long bh = w / n, row = w % n, pr = row - row0;
        const bool has_part = pr >= 0 && pr < rows;
        const float lse_a = lse[w];
        const float lse_b = has_part ? part_lse[bh * rows + pr] : -INFINITY;
        // LAB HOLE 1 BEGIN [gpus>=2]: the merge by log-sum-exp: the merged lse and the two weights
        // LAB TODO: merged = log(e^lse_a + e^lse_b), computed as top + logf(expf(lse_a - top) +
        // LAB TODO: expf(lse_b - top)) with top = fmaxf(lse_a, lse_b), so that no exponential
        // LAB TODO: overflows; then the weights wa = expf(lse_a - merged) and wb = expf(lse_b -
        // LAB TODO: merged), which sum to 1. A row no key has reached yet has lse_a = lse_b = -inf:
        // LAB TODO: merged must stay -inf and both weights be 0 (-inf minus -inf is a NaN: test
        // LAB TODO: for that row first). A row without a partial here has lse_b = -inf: wb = 0.
        // LAB STUB: const float merged = lse_a, wa = 1.f, wb = 0.f;  // until filled: no partial
        // LAB STUB: (void)lse_b;
        const float top = fmaxf(lse_a, lse_b);
        // both -inf: a row that sees no key yet (O = 0 and lse = -inf stay)
        const float merged =
            top == -INFINITY ? -INFINITY : top + logf(expf(lse_a - top) + expf(lse_b - top));
        const float wa = merged == -INFINITY ? 0.f : expf(lse_a - merged);
        const float wb = merged == -INFINITY ? 0.f : expf(lse_b - merged);
        // LAB HOLE 1 END
        const A *a = acc_o + w * D;
        const P *b = part_o + (bh * rows + (has_part ? pr : 0)) * D;
        O *o = out_o + w * D;
        for (int d = lane; d < D; d += WARP) {
            const float x = load_value(a + d) * wa + (has_part ? load_value(b + d) * wb : 0.f);
            store_value(o + d, x);
        }
        __syncwarp();  // every lane has read lse[w] (lse_a) before lane 0 overwrites it
        if (lane == 0) lse[w] = merged;
    }
}

// out = acc + block, elementwise over [B * heads, n, D], the block covering rows row0 ..
// row0 + rows - 1 ([B * heads, rows, D]); acc NULL: zero, block NULL: none (a cast). out and acc
// may be one buffer.
template <typename A, typename K, typename O>
__global__ void accumulate_kernel(O *out, const A *acc, const K *block, long long bh_count,
                                  long long n, long long row0, long long rows, int D) {
    const long long total = bh_count * n * D, stride = (long long)gridDim.x * blockDim.x;
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += stride) {
        const long long d = e % D, row = (e / D) % n, bh = e / D / n, br = row - row0;
        float x = acc ? load_value(acc + e) : 0.f;
        if (block && br >= 0 && br < rows) x += load_value(block + (bh * rows + br) * D + d);
        store_value(out + e, x);
    }
}

// out += part on rows row0 .. row0 + rows - 1 of [B * heads, n, D], both buffers laid out alike: a
// piece's partial gradient added to its block's (block_backward).
template <typename T>
__global__ void add_rows_kernel(T *out, const T *part, long long bh_count, long long n,
                                long long row0, long long rows, int D) {
    const long long total = bh_count * rows * D, stride = (long long)gridDim.x * blockDim.x;
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += stride) {
        const long long d = e % D, row = row0 + (e / D) % rows, bh = e / D / rows;
        const long long at = (bh * n + row) * D + d;
        store_value(out + at, load_value(out + at) + load_value(part + at));
    }
}

// The program's inputs: a counter-based normal sample per element of the whole [B, heads, N, D]
// tensor (splitmix64's finalizer, Box-Muller on the pair an element belongs to).
__host__ __device__ __forceinline__ unsigned long long mix64(unsigned long long z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

#define TENSOR_SHIFT 56  // the tensor's number in the key's top byte: q, k, v, dO draw apart

template <typename T>
__global__ void fill_kernel(T *x, ring_slice slice, long long bh_count, long long N, int D,
                            unsigned long long key, float mul) {
    const long long total = bh_count * slice.n * D, stride = (long long)gridDim.x * blockDim.x;
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += stride) {
        const long long d = e % D, row = (e / D) % slice.n, bh = e / D / slice.n;
        const long long token =
            row < slice.rows[0] ? slice.start[0] + row : slice.start[1] + (row - slice.rows[0]);
        // the element's index in the whole tensor; its pair (d even, d + 1) shares one draw
        const unsigned long long pair = (unsigned long long)(((bh * N + token) * D + d) / 2);
        const unsigned long long a = mix64(key ^ mix64(pair));
        const float u1 = (float)((a >> 40) + 1) * 0x1p-24f;  // (0, 1]
        const float u2 = (float)(a & 0xffffffu) * 0x1p-24f;  // [0, 1)
        const float r = sqrtf(-2.f * logf(u1)) * mul, angle = 6.283185307f * u2;
        store_value(x + e, d % 2 ? r * sinf(angle) : r * cosf(angle));
    }
}

static int grid_for(long long work) {
    const long long blocks = (work + RING_THREADS - 1) / RING_THREADS;
    return (int)(blocks < 4096 ? (blocks > 0 ? blocks : 1) : 4096);
}

// ---- the ring's state ----

#define STEP_BUFFERS 2  // a slice of keys in use by a step, the next one arriving
#define RING_MARKS 4    // a step's compute begins, ends; its transfer (the next slice) begins, ends

typedef struct {
    int device;
    ncclComm_t comm;
    cudaStream_t comm_stream;  // NCCL's sends and receives, beside the caller's compute stream
    cudaEvent_t start;         // the caller's stream at the call: the inputs are ready
    cudaEvent_t kv_ready[STEP_BUFFERS], kv_free[STEP_BUFFERS];
    cudaEvent_t dkv_ready, dkv_arrived[STEP_BUFFERS];
    void *k_buf[STEP_BUFFERS], *v_buf[STEP_BUFFERS];     // [B, H_kv, n_s, D] of the slice visiting
    float *dk_buf[STEP_BUFFERS], *dv_buf[STEP_BUFFERS];  // its travelling fp32 dK, dV
    void *o_part;  // [B, H, q_rows, D]: a step's partial output (forward); dQ of a block (backward)
    float *lse_part;  // [B, H, q_rows]: its lse; the backward: the lse of the block's rows
    float *o_acc;     // [B, H, n, D] fp32: the accumulator between the first and last steps (P > 2)
    void *dk_part, *dv_part;    // [B, H_kv, k_rows, D]: a block's dK, dV
    void *dq_piece;             // [B, H, q_rows, D]: dQ of a block's later key pieces (ring_pieces)
    void *dk_piece, *dv_piece;  // [B, H_kv, k_rows, D]: dK, dV of its later query pieces
    void *workspace;
    size_t workspace_bytes, bytes;
    unsigned char *plans;  // forward and backward plan of every step, then its pieces' (four)
    // the timeline (ring_timeline): the pass's start, and each step's compute and transfers
    cudaEvent_t t0, marks[RING_MAX_GPUS][RING_MARKS];
} ring_gpu;

struct ring {
    ring_shape s;
    ring_inner inner;
    int timeline; /* 1: the events of ring_timeline are recorded */
    ring_gpu gpu[RING_MAX_GPUS];
};

// A timeline mark (one of RING_MARKS) of step t on stream st, when the timeline is on.
static cudaError_t mark(const ring *g, int r, int t, int which, cudaStream_t st) {
    return g->timeline ? cudaEventRecord(g->gpu[r].marks[t][which], st) : cudaSuccess;
}
enum { MARK_COMPUTE, MARK_COMPUTED, MARK_SEND, MARK_SENT };

static int fail(char *err, size_t len, int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, len, fmt, ap);
    va_end(ap);
    return code;
}

#define RING_CUDA(call)                                                                      \
    do {                                                                                     \
        cudaError_t e_ = (call);                                                             \
        if (e_ != cudaSuccess)                                                               \
            return fail(err, errlen,                                                         \
                        e_ == cudaErrorMemoryAllocation ? ATTN_EXIT_OOM : ATTN_EXIT_WRONG,   \
                        "%s:%d: %s: %s", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
    } while (0)
#define RING_NCCL(call)                                                                           \
    do {                                                                                          \
        ncclResult_t e_ = (call);                                                                 \
        if (e_ != ncclSuccess)                                                                    \
            return fail(err, errlen, ATTN_EXIT_WRONG, "%s:%d: %s: %s", __FILE__, __LINE__, #call, \
                        ncclGetErrorString(e_));                                                  \
    } while (0)

static size_t elem_bytes(void) {
    return 2;
} /* fp16 and bf16 */
static int source_of(int P, int r, int t) {
    return ((r - t) % P + P) % P;
}
static long long slice_rows(const ring_shape *s, int r) {
    return ring_split(s->N, s->P, s->layout, r).n;
}
static unsigned char *plan_at(const ring *g, int r, int pass, int t) {
    return g->gpu[r].plans + ((size_t)pass * g->s.P + t) * g->inner.plan_bytes;
}
// The backward plan of step t's pieces: a piece is whole or the last, shorter, along each side.
enum { PIECE_WHOLE, PIECE_LAST, PIECE_SIZES };
#define PIECE_KINDS (PIECE_SIZES * PIECE_SIZES)
static unsigned char *piece_plan_at(const ring *g, int r, int t, int q_size, int k_size) {
    const int kind = q_size * PIECE_SIZES + k_size;
    return g->gpu[r].plans + ((size_t)(2 + kind) * g->s.P + t) * g->inner.plan_bytes;
}

// The request of step t's block on GPU r, for `rows` of its queries and `key_rows` of its keys (the
// block's, or a piece's): its queries a view of the slice's rows (the slice's strides), its keys a
// view of the visiting slice's, its outputs the block's own buffers (a piece's rows within them).
static attn_lib_request block_request(const ring *g, int r, int t, int pass, const ring_block *b,
                                      long long rows, long long key_rows) {
    const ring_shape *s = &g->s;
    const long long n = slice_rows(s, r), n_s = slice_rows(s, source_of(s->P, r, t));
    attn_lib_request q = {};
    q.pass = pass;
    q.device = s->devices[r];
    q.smem_limit = s->smem_limit;
    q.B = s->B, q.H = s->H, q.N = (int)rows, q.D = s->D, q.causal = b->causal;
    q.scale = s->scale, q.H_kv = s->H_kv, q.N_k = (int)key_rows, q.bf16 = s->bf16;
    const attn_layout slice = attn_contiguous(s->H, (int)n, s->D);
    const attn_layout keys = attn_contiguous(s->H_kv, (int)n_s, s->D);
    const attn_layout block_q = attn_contiguous(s->H, (int)b->q_rows, s->D);
    const attn_layout block_k = attn_contiguous(s->H_kv, (int)b->k_rows, s->D);
    // q, k, v, o, dO, dQ, dK, dV; the backward's o and dO are the slice's (the final output)
    const attn_layout *l[8] = {
        &slice, &keys,    &keys,    pass == ATTN_LIB_FORWARD ? &block_q : &slice,
        &slice, &block_q, &block_k, &block_k};
    for (int i = 0; i < 8; i++) {
        q.strides[3 * i] = l[i]->batch, q.strides[3 * i + 1] = l[i]->head;
        q.strides[3 * i + 2] = l[i]->row;
    }
    return q;
}

// Plans step t's block (or a piece of it: rows queries, key_rows keys) on GPU r for one pass into
// plan, and grows the GPU's workspace to what the plan asks for.
static int plan_block(ring *g, int r, int t, int pass, const ring_block *b, long long rows,
                      long long key_rows, unsigned char *plan, char *err, size_t errlen) {
    const attn_lib_request q = block_request(g, r, t, pass, b, rows, key_rows);
    size_t ws = 0;
    const int rc = g->inner.plan(&q, plan, g->inner.plan_bytes, &ws);
    if (rc) return fail(err, errlen, rc, "%s", g->inner.last_error());
    ring_gpu *G = &g->gpu[r];
    G->workspace_bytes = ws > G->workspace_bytes ? ws : G->workspace_bytes;
    return ATTN_EXIT_PASS;
}

int ring_create(const ring_shape *s, const ring_inner *inner, ring **out, char *err,
                size_t errlen) {
    *out = NULL;
    if (s->P < 1 || s->P > RING_MAX_GPUS)
        return fail(err, errlen, ATTN_EXIT_USAGE, "ring: 1 to %d GPUs, not %d", RING_MAX_GPUS,
                    s->P);
    ring *g = (ring *)calloc(1, sizeof(ring));
    if (!g) return fail(err, errlen, ATTN_EXIT_OOM, "ring: no host memory");
    g->s = *s, g->inner = *inner;
    *out = g;
    const int P = s->P;
    int devs[RING_MAX_GPUS];
    for (int r = 0; r < P; r++) devs[r] = s->devices[r], g->gpu[r].device = s->devices[r];
    if (P > 1) {
        ncclComm_t comms[RING_MAX_GPUS];
        RING_NCCL(ncclCommInitAll(comms, P, devs));
        for (int r = 0; r < P; r++) g->gpu[r].comm = comms[r];
    }
    for (int r = 0; r < P; r++) {
        ring_gpu *G = &g->gpu[r];
        const long long n = slice_rows(s, r);
        G->plans = (unsigned char *)calloc((size_t)(2 + PIECE_KINDS) * P, inner->plan_bytes);
        if (!G->plans) return fail(err, errlen, ATTN_EXIT_OOM, "ring: no host memory");
        long long q_rows = 0, k_rows = 0, n_max = 0, q_rows_pieced = 0, k_rows_pieced = 0;
        for (int t = 0; t < P; t++) {
            const ring_block b = ring_step(s->N, P, s->layout, s->causal, r, t);
            const long long n_s = slice_rows(s, source_of(P, r, t));
            n_max = n_s > n_max ? n_s : n_max;
            if (b.q_rows == 0 || b.k_rows == 0) continue;
            q_rows = b.q_rows > q_rows ? b.q_rows : q_rows;
            k_rows = b.k_rows > k_rows ? b.k_rows : k_rows;
            for (int pass = 0; pass <= s->backward; pass++) {
                const int rc = plan_block(g, r, t, pass, &b, b.q_rows, b.k_rows,
                                          plan_at(g, r, pass, t), err, errlen);
                if (rc) return rc;
            }
            const ring_cut qc = ring_cut_of(s, &b, RING_QUERIES),
                           kc = ring_cut_of(s, &b, RING_KEYS);
            if (!s->backward || qc.count * kc.count == 1) continue;
            if (qc.count > 1) k_rows_pieced = b.k_rows > k_rows_pieced ? b.k_rows : k_rows_pieced;
            if (kc.count > 1) q_rows_pieced = b.q_rows > q_rows_pieced ? b.q_rows : q_rows_pieced;
            for (int qs = 0; qs < PIECE_SIZES; qs++)
                for (int ks = 0; ks < PIECE_SIZES; ks++) {
                    const int rc = plan_block(g, r, t, ATTN_LIB_BACKWARD, &b,
                                              qs == PIECE_WHOLE ? qc.rows : qc.last,
                                              ks == PIECE_WHOLE ? kc.rows : kc.last,
                                              piece_plan_at(g, r, t, qs, ks), err, errlen);
                    if (rc) return rc;
                }
        }
        RING_CUDA(cudaSetDevice(G->device));
        const size_t e = elem_bytes(), q_elems = (size_t)s->B * s->H * s->D,
                     k_elems = (size_t)s->B * s->H_kv * s->D;
#define RING_ALLOC(ptr, size)                               \
    do {                                                    \
        if ((size) > 0) {                                   \
            RING_CUDA(cudaMalloc((void **)&(ptr), (size))); \
            G->bytes += (size);                             \
        }                                                   \
    } while (0)
        if (P > 1)
            for (int i = 0; i < STEP_BUFFERS; i++) {
                RING_ALLOC(G->k_buf[i], k_elems * n_max * e);
                RING_ALLOC(G->v_buf[i], k_elems * n_max * e);
                if (s->backward) {
                    RING_ALLOC(G->dk_buf[i], k_elems * n_max * sizeof(float));
                    RING_ALLOC(G->dv_buf[i], k_elems * n_max * sizeof(float));
                }
            }
        if (P > 1) {
            RING_ALLOC(G->o_part, q_elems * q_rows * e);
            RING_ALLOC(G->lse_part, (size_t)s->B * s->H * q_rows * sizeof(float));
            if (s->backward) {
                RING_ALLOC(G->dk_part, k_elems * k_rows * e);
                RING_ALLOC(G->dv_part, k_elems * k_rows * e);
                RING_ALLOC(G->dq_piece, q_elems * q_rows_pieced * e);
                RING_ALLOC(G->dk_piece, k_elems * k_rows_pieced * e);
                RING_ALLOC(G->dv_piece, k_elems * k_rows_pieced * e);
            }
        }
        if (P > 2) RING_ALLOC(G->o_acc, q_elems * n * sizeof(float));
        RING_ALLOC(G->workspace, G->workspace_bytes);
#undef RING_ALLOC
        RING_CUDA(cudaStreamCreateWithFlags(&G->comm_stream, cudaStreamNonBlocking));
        cudaEvent_t *ev[] = {&G->start,          &G->kv_ready[0],   &G->kv_ready[1],
                             &G->kv_free[0],     &G->kv_free[1],    &G->dkv_ready,
                             &G->dkv_arrived[0], &G->dkv_arrived[1]};
        for (size_t i = 0; i < sizeof(ev) / sizeof(ev[0]); i++)
            RING_CUDA(cudaEventCreateWithFlags(ev[i], cudaEventDisableTiming));
    }
    return ATTN_EXIT_PASS;
}

int ring_timeline_on(ring *g, char *err, size_t errlen) {
    for (int r = 0; r < g->s.P && !g->timeline; r++) {
        ring_gpu *G = &g->gpu[r];
        RING_CUDA(cudaSetDevice(G->device));
        RING_CUDA(cudaEventCreate(&G->t0));
        for (int t = 0; t < g->s.P; t++)
            for (int m = 0; m < RING_MARKS; m++) RING_CUDA(cudaEventCreate(&G->marks[t][m]));
    }
    g->timeline = 1;
    return ATTN_EXIT_PASS;
}

int ring_timeline(const ring *g, int r, int t, float ms[4]) {
    const ring_gpu *G = &g->gpu[r];
    for (int m = 0; m < RING_MARKS; m++) {
        ms[m] = -1.f;
        // the last step has no transfer of keys in the forward pass
        if (cudaEventElapsedTime(&ms[m], G->t0, G->marks[t][m]) != cudaSuccess) ms[m] = -1.f;
    }
    (void)cudaGetLastError();
    return ATTN_EXIT_PASS;
}

void ring_destroy(ring *g) {
    if (!g) return;
    for (int r = 0; r < g->s.P; r++) {
        ring_gpu *G = &g->gpu[r];
        if (cudaSetDevice(G->device) != cudaSuccess) continue;
        void *bufs[] = {G->k_buf[0],  G->k_buf[1],  G->v_buf[0],  G->v_buf[1], G->dk_buf[0],
                        G->dk_buf[1], G->dv_buf[0], G->dv_buf[1], G->o_part,   G->lse_part,
                        G->o_acc,     G->dk_part,   G->dv_part,   G->dq_piece, G->dk_piece,
                        G->dv_piece,  G->workspace};
        for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) cudaFree(bufs[i]);
        cudaEvent_t ev[] = {G->start,      G->kv_ready[0], G->kv_ready[1],    G->kv_free[0],
                            G->kv_free[1], G->dkv_ready,   G->dkv_arrived[0], G->dkv_arrived[1]};
        for (size_t i = 0; i < sizeof(ev) / sizeof(ev[0]); i++)
            if (ev[i]) cudaEventDestroy(ev[i]);
        if (g->timeline) {
            cudaEventDestroy(G->t0);
            for (int t = 0; t < g->s.P; t++)
                for (int m = 0; m < RING_MARKS; m++) cudaEventDestroy(G->marks[t][m]);
        }
        if (G->comm_stream) cudaStreamDestroy(G->comm_stream);
        if (G->comm) ncclCommDestroy(G->comm);
        free(G->plans);
    }
    free(g);
}

size_t ring_bytes(const ring *g, int r) {
    return g->gpu[r].bytes;
}

// ---- the ring's schedule ----

// The keys and values GPU r reads at step t: its own (t = 0) or the visiting slice's buffers.
static const void *keys_at(const ring *g, int r, int t, const void *const *own) {
    return t == 0 ? own[r] : g->gpu[r].k_buf[t % STEP_BUFFERS];
}
static const void *values_at(const ring *g, int r, int t, const void *const *own) {
    return t == 0 ? own[r] : g->gpu[r].v_buf[t % STEP_BUFFERS];
}

// The slices of keys and values move one GPU on: every GPU sends the slice of step t to r + 1
// and receives the slice of step t + 1 from r - 1, on its comm stream, into the buffer step t - 1
// read (its kv_free). One NCCL group for every GPU: this one thread drives them all.
static int pass_keys(ring *g, int t, const void *const *k, const void *const *v, char *err,
                     size_t errlen) {
    // LAB HOLE 2 BEGIN [design] [gpus>=2]: the ring's transfers: keys and values, one step
    // LAB TODO: Every GPU r sends the keys and the values it computes with at step t (its own
    // LAB TODO: slice at t = 0, then the visiting slice's buffer of the pair: keys_at, values_at)
    // LAB TODO: to GPU r + 1, and receives those of step t + 1 from GPU r - 1 into the pair's other
    // LAB TODO: buffer (k_buf, v_buf), on its comm stream: K and V a transfer each. A slice is
    // LAB TODO: [B, H_kv, n_s, D] contiguous, 2 bytes an element, n_s the rows of the GPU whose
    // LAB TODO: slice it is (source_of, slice_rows): what r sends and what it receives differ in
    // LAB TODO: size when N is not a multiple of 2P; a transfer of no bytes is left out on both of
    // LAB TODO: its sides (sender and receiver agree on it). Before its transfers, GPU r's comm
    // LAB TODO: stream waits for what they read and write: at t = 0 the inputs (start); later the
    // LAB TODO: arrival of the keys it passes on (kv_ready of step t's buffer) and the end of step
    // LAB TODO: t - 1's compute, which read the buffer now received into (kv_free). One thread
    // LAB TODO: drives every GPU: a GPU's calls run with that GPU current, and all the sends and
    // LAB TODO: receives of the step, every GPU's, go in one NCCL group (apart, the first send
    // LAB TODO: would wait forever for a receive not yet issued). After the group each comm stream
    // LAB TODO: records kv_ready of the buffer it received into: step t + 1's compute waits for it.
    // LAB TODO: The timeline: MARK_SEND on the comm stream once its waits are in, MARK_SENT after
    // LAB TODO: kv_ready (mark()). Every CUDA and NCCL error is returned with its call (RING_CUDA,
    // LAB TODO: RING_NCCL); ATTN_EXIT_PASS when all is enqueued.
    // LAB STUB: (void)g, (void)t, (void)k, (void)v;
    // LAB STUB: return fail(err, errlen, ATTN_EXIT_WRONG, "lab hole 2 unfilled: no keys travel");
    const ring_shape *s = &g->s;
    const int P = s->P, next = (t + 1) % STEP_BUFFERS;
    const size_t row_bytes = (size_t)s->B * s->H_kv * s->D * elem_bytes();
    for (int r = 0; r < P; r++) {
        ring_gpu *G = &g->gpu[r];
        RING_CUDA(cudaSetDevice(G->device));
        RING_CUDA(cudaStreamWaitEvent(G->comm_stream,
                                      t == 0 ? G->start : G->kv_ready[t % STEP_BUFFERS], 0));
        if (t >= 1) RING_CUDA(cudaStreamWaitEvent(G->comm_stream, G->kv_free[next], 0));
        RING_CUDA(mark(g, r, t, MARK_SEND, G->comm_stream));
    }
    RING_NCCL(ncclGroupStart());
    for (int r = 0; r < P; r++) {
        ring_gpu *G = &g->gpu[r];
        const size_t out = row_bytes * slice_rows(s, source_of(P, r, t));
        const size_t in = row_bytes * slice_rows(s, source_of(P, r, t + 1));
        if (out) {
            RING_NCCL(ncclSend(keys_at(g, r, t, k), out, ncclUint8, (r + 1) % P, G->comm,
                               G->comm_stream));
            RING_NCCL(ncclSend(values_at(g, r, t, v), out, ncclUint8, (r + 1) % P, G->comm,
                               G->comm_stream));
        }
        if (in) {
            RING_NCCL(
                ncclRecv(G->k_buf[next], in, ncclUint8, (r + P - 1) % P, G->comm, G->comm_stream));
            RING_NCCL(
                ncclRecv(G->v_buf[next], in, ncclUint8, (r + P - 1) % P, G->comm, G->comm_stream));
        }
    }
    RING_NCCL(ncclGroupEnd());
    for (int r = 0; r < P; r++) {
        RING_CUDA(cudaSetDevice(g->gpu[r].device));
        RING_CUDA(cudaEventRecord(g->gpu[r].kv_ready[next], g->gpu[r].comm_stream));
        RING_CUDA(mark(g, r, t, MARK_SENT, g->gpu[r].comm_stream));
    }
    return ATTN_EXIT_PASS;
    // LAB HOLE 2 END
}

// The last step that computes anything on GPU r (a contiguous split's later blocks do not).
static int last_block(const ring_shape *s, int r) {
    int last = 0;
    for (int t = 0; t < s->P; t++) {
        const ring_block b = ring_step(s->N, s->P, s->layout, s->causal, r, t);
        if (b.q_rows && b.k_rows) last = t;
    }
    return last;
}

// acc (where the running result lives: the output itself after step 0, the fp32 accumulator
// between) merged with a block into dst: the output at the last block, else the accumulator.
template <typename T>
static cudaError_t merge_into(const ring *g, int r, bool acc_in_out, bool last, T *o, float *lse,
                              const ring_block *b, cudaStream_t st) {
    const ring_shape *s = &g->s;
    const ring_gpu *G = &g->gpu[r];
    const long long n = slice_rows(s, r), bh_rows = (long long)s->B * s->H * n;
    const int grid = grid_for(bh_rows * WARP);
    const T *part = (const T *)G->o_part;
    if (acc_in_out && last)
        merge_kernel<T, T, T><<<grid, RING_THREADS, 0, st>>>(o, lse, o, part, G->lse_part, bh_rows,
                                                             n, b->q_row, b->q_rows, s->D);
    else if (acc_in_out)
        merge_kernel<T, T, float><<<grid, RING_THREADS, 0, st>>>(
            G->o_acc, lse, o, part, G->lse_part, bh_rows, n, b->q_row, b->q_rows, s->D);
    else if (last)
        merge_kernel<float, T, T><<<grid, RING_THREADS, 0, st>>>(
            o, lse, G->o_acc, part, G->lse_part, bh_rows, n, b->q_row, b->q_rows, s->D);
    else
        merge_kernel<float, T, float><<<grid, RING_THREADS, 0, st>>>(
            G->o_acc, lse, G->o_acc, part, G->lse_part, bh_rows, n, b->q_row, b->q_rows, s->D);
    return cudaGetLastError();
}

template <typename T>
static int forward_steps(ring *g, const void *const *q, const void *const *k, const void *const *v,
                         void *const *o, float *const *lse, void *const *streams, char *err,
                         size_t errlen) {
    const ring_shape *s = &g->s;
    const int P = s->P;
    bool acc_in_out[RING_MAX_GPUS];
    for (int r = 0; r < P; r++) {
        acc_in_out[r] = true;
        RING_CUDA(cudaSetDevice(g->gpu[r].device));
        RING_CUDA(cudaEventRecord(g->gpu[r].start, (cudaStream_t)streams[r]));
        if (g->timeline) RING_CUDA(cudaEventRecord(g->gpu[r].t0, (cudaStream_t)streams[r]));
    }
    for (int t = 0; t < P; t++) {
        if (t + 1 < P) {  // the next slice arrives while this one computes
            const int rc = pass_keys(g, t, k, v, err, errlen);
            if (rc) return rc;
        }
        for (int r = 0; r < P; r++) {
            ring_gpu *G = &g->gpu[r];
            cudaStream_t st = (cudaStream_t)streams[r];
            const ring_block b = ring_step(s->N, P, s->layout, s->causal, r, t);
            RING_CUDA(cudaSetDevice(G->device));
            if (t > 0) RING_CUDA(cudaStreamWaitEvent(st, G->kv_ready[t % STEP_BUFFERS], 0));
            RING_CUDA(mark(g, r, t, MARK_COMPUTE, st));
            if (b.q_rows && b.k_rows) {
                const T *qb = (const T *)q[r] + b.q_row * s->D;
                const T *kb = (const T *)keys_at(g, r, t, k) + b.k_row * s->D;
                const T *vb = (const T *)values_at(g, r, t, v) + b.k_row * s->D;
                // step 0 (every row, every GPU) writes the output itself; the others a partial
                void *ob = t == 0 ? o[r] : G->o_part;
                float *lb = t == 0 ? lse[r] : G->lse_part;
                const int rc =
                    g->inner.forward(plan_at(g, r, ATTN_LIB_FORWARD, t), qb, kb, vb, ob, lb, NULL,
                                     NULL, G->workspace, G->workspace_bytes, st);
                if (rc) return fail(err, errlen, rc, "%s", g->inner.last_error());
            }
            if (t > 0) RING_CUDA(cudaEventRecord(G->kv_free[t % STEP_BUFFERS], st));
            if (t > 0 && b.q_rows && b.k_rows) {
                const bool last = t == last_block(s, r);
                RING_CUDA(merge_into<T>(g, r, acc_in_out[r], last, (T *)o[r], lse[r], &b, st));
                acc_in_out[r] = last;
            }
            RING_CUDA(mark(g, r, t, MARK_COMPUTED, st));
        }
    }
    return ATTN_EXIT_PASS;
}

int ring_forward(ring *g, const void *const *q, const void *const *k, const void *const *v,
                 void *const *o, float *const *lse, void *const *streams, char *err,
                 size_t errlen) {
    return g->s.bf16 ? forward_steps<__nv_bfloat16>(g, q, k, v, o, lse, streams, err, errlen)
                     : forward_steps<__half>(g, q, k, v, o, lse, streams, err, errlen);
}

// dK and dV of the slice visiting GPU r at step t move on to r + 1, and the accumulator of the
// next step's slice arrives from r - 1, on the comm stream, once this step has added its block
// (dkv_ready). Step P - 1's send takes every accumulator home.
static int pass_gradients(ring *g, int t, char *err, size_t errlen) {
    // LAB HOLE 2 BEGIN [design] [gpus>=2]: the ring's transfers: the gradients' accumulators
    // LAB TODO: The keys' transfer again, for the fp32 accumulators of dK and dV that travel with
    // LAB TODO: the keys' slices (dk_buf, dv_buf): every GPU r sends the accumulator of the slice
    // LAB TODO: it visited at step t (this step's buffer of the pair) to GPU r + 1, and receives
    // LAB TODO: the accumulator of step t + 1's slice from GPU r - 1 into the other buffer, on its
    // LAB TODO: comm stream, dK and dV a transfer each: [B, H_kv, n_s, D] float32, n_s the rows of
    // LAB TODO: the slice's owner; no transfer of no bytes, on either side. A comm stream starts
    // LAB TODO: once its GPU's compute stream has added this step's block (dkv_ready); the buffer
    // LAB TODO: it receives into was sent on at step t - 1, earlier on the same stream. One NCCL
    // LAB TODO: group for the whole step, every GPU's calls with that GPU current; after it each
    // LAB TODO: comm stream records dkv_arrived of the buffer it received into (the next step's
    // LAB TODO: compute waits for it). Called at every step, the last too: at t = P - 1 what
    // LAB TODO: arrives is the GPU's own slice's accumulator, home. Errors returned as the keys'.
    // LAB STUB: (void)g, (void)t;
    // LAB STUB: return fail(err, errlen, ATTN_EXIT_WRONG, "lab hole 2 unfilled: no dK, dV travel");
    const ring_shape *s = &g->s;
    const int P = s->P, here = t % STEP_BUFFERS, next = (t + 1) % STEP_BUFFERS;
    const size_t row_bytes = (size_t)s->B * s->H_kv * s->D * sizeof(float);
    for (int r = 0; r < P; r++) {
        RING_CUDA(cudaSetDevice(g->gpu[r].device));
        RING_CUDA(cudaStreamWaitEvent(g->gpu[r].comm_stream, g->gpu[r].dkv_ready, 0));
    }
    RING_NCCL(ncclGroupStart());
    for (int r = 0; r < P; r++) {
        ring_gpu *G = &g->gpu[r];
        const size_t out = row_bytes * slice_rows(s, source_of(P, r, t));
        const size_t in = row_bytes * slice_rows(s, source_of(P, r, t + 1));
        if (out) {
            RING_NCCL(
                ncclSend(G->dk_buf[here], out, ncclUint8, (r + 1) % P, G->comm, G->comm_stream));
            RING_NCCL(
                ncclSend(G->dv_buf[here], out, ncclUint8, (r + 1) % P, G->comm, G->comm_stream));
        }
        if (in) {
            RING_NCCL(
                ncclRecv(G->dk_buf[next], in, ncclUint8, (r + P - 1) % P, G->comm, G->comm_stream));
            RING_NCCL(
                ncclRecv(G->dv_buf[next], in, ncclUint8, (r + P - 1) % P, G->comm, G->comm_stream));
        }
    }
    RING_NCCL(ncclGroupEnd());
    for (int r = 0; r < P; r++) {
        RING_CUDA(cudaSetDevice(g->gpu[r].device));
        RING_CUDA(cudaEventRecord(g->gpu[r].dkv_arrived[next], g->gpu[r].comm_stream));
    }
    return ATTN_EXIT_PASS;
    // LAB HOLE 2 END
}

template <typename A, typename K, typename O>
static cudaError_t accumulate(O *out, const A *acc, const K *block, long long bh_count, long long n,
                              long long row0, long long rows, int D, cudaStream_t st) {
    accumulate_kernel<A, K, O><<<grid_for(bh_count * n * D), RING_THREADS, 0, st>>>(
        out, acc, block, bh_count, n, row0, rows, D);
    return cudaGetLastError();
}

// out += part on rows row0 .. row0 + rows - 1 of [bh_count, n, D] (add_rows_kernel).
template <typename T>
static cudaError_t add_rows(T *out, const T *part, long long bh_count, long long n, long long row0,
                            long long rows, int D, cudaStream_t st) {
    add_rows_kernel<T><<<grid_for(bh_count * rows * D), RING_THREADS, 0, st>>>(out, part, bh_count,
                                                                               n, row0, rows, D);
    return cudaGetLastError();
}

// The inner backward on step t's block of GPU r, piece by piece (ring_pieces: one piece, the block,
// unless it is unmasked and long), query pieces outside, key pieces inside: each query piece's rows
// of lse copied contiguous where they are not the slice's own; a piece's dQ rows written where the
// block's go (the gradients themselves at step 0 or in the ring of one, else o_part), its dK and
// dV rows into dk_part and dv_part; a later key piece's dQ into dq_piece, a later query piece's dK
// and dV into dk_piece and dv_piece, each added to the block's there.
template <typename T>
static int block_backward(ring *g, int r, int t, const ring_block *b, const void *const *q,
                          const void *const *k, const void *const *v, const void *const *o,
                          const float *const *lse, const void *const *dO, void *const *dQ,
                          void *const *dK, void *const *dV, cudaStream_t st, char *err,
                          size_t errlen) {
    const ring_shape *s = &g->s;
    ring_gpu *G = &g->gpu[r];
    const long long n = slice_rows(s, r), D = s->D;
    const long long qh = (long long)s->B * s->H, kh = (long long)s->B * s->H_kv;
    const ring_cut qc = ring_cut_of(s, b, RING_QUERIES), kc = ring_cut_of(s, b, RING_KEYS);
    const bool direct = s->P == 1;  // the ring of one writes the gradients themselves
    T *dq_block = (T *)(direct || t == 0 ? dQ[r] : G->o_part);
    T *dk_block = (T *)(direct ? dK[r] : G->dk_part),
      *dv_block = (T *)(direct ? dV[r] : G->dv_part);
    const T *keys = (const T *)keys_at(g, r, t, k) + b->k_row * D;
    const T *values = (const T *)values_at(g, r, t, v) + b->k_row * D;
    for (long long i = 0; i < qc.count; i++) {
        const long long row = i * qc.rows, m = i + 1 < qc.count ? qc.rows : qc.last;
        const long long at = (b->q_row + row) * D;  // the piece's first query row in the slice
        const float *lb = lse[r];
        if (b->q_row + row || m != n) {  // the piece's rows of lse, [B, H, m] as a stage takes them
            RING_CUDA(cudaMemcpy2DAsync(G->lse_part, m * sizeof(float), lse[r] + b->q_row + row,
                                        n * sizeof(float), m * sizeof(float), (size_t)qh,
                                        cudaMemcpyDeviceToDevice, st));
            lb = G->lse_part;
        }
        for (long long j = 0; j < kc.count; j++) {
            const long long key = j * kc.rows, mk = j + 1 < kc.count ? kc.rows : kc.last;
            const void *plan = qc.count * kc.count == 1
                                   ? plan_at(g, r, ATTN_LIB_BACKWARD, t)
                                   : piece_plan_at(g, r, t, m == qc.rows ? PIECE_WHOLE : PIECE_LAST,
                                                   mk == kc.rows ? PIECE_WHOLE : PIECE_LAST);
            T *dq = (T *)(j > 0 ? G->dq_piece : dq_block) + row * D;
            T *dk = (T *)(i > 0 ? G->dk_piece : dk_block) + key * D;
            T *dv = (T *)(i > 0 ? G->dv_piece : dv_block) + key * D;
            const int rc =
                g->inner.backward(plan, (const T *)q[r] + at, keys + key * D, values + key * D,
                                  (const T *)o[r] + at, lb, (const T *)dO[r] + at, dq, dk, dv, NULL,
                                  NULL, G->workspace, G->workspace_bytes, st);
            if (rc) return fail(err, errlen, rc, "%s", g->inner.last_error());
            if (j > 0)  // the piece's partial dQ added to the block's
                RING_CUDA(
                    add_rows(dq_block, (const T *)G->dq_piece, qh, b->q_rows, row, m, s->D, st));
            if (i > 0) {  // its partial dK, dV added to the block's
                RING_CUDA(
                    add_rows(dk_block, (const T *)G->dk_piece, kh, b->k_rows, key, mk, s->D, st));
                RING_CUDA(
                    add_rows(dv_block, (const T *)G->dv_piece, kh, b->k_rows, key, mk, s->D, st));
            }
        }
    }
    return ATTN_EXIT_PASS;
}

template <typename T>
static int backward_steps(ring *g, const void *const *q, const void *const *k, const void *const *v,
                          const void *const *o, const float *const *lse, const void *const *dO,
                          void *const *dQ, void *const *dK, void *const *dV, void *const *streams,
                          char *err, size_t errlen) {
    const ring_shape *s = &g->s;
    const int P = s->P;
    bool acc_in_out[RING_MAX_GPUS];
    for (int r = 0; r < P; r++) {
        acc_in_out[r] = true;
        RING_CUDA(cudaSetDevice(g->gpu[r].device));
        RING_CUDA(cudaEventRecord(g->gpu[r].start, (cudaStream_t)streams[r]));
        if (g->timeline) RING_CUDA(cudaEventRecord(g->gpu[r].t0, (cudaStream_t)streams[r]));
    }
    for (int t = 0; t < P; t++) {
        if (t + 1 < P) {
            const int rc = pass_keys(g, t, k, v, err, errlen);
            if (rc) return rc;
        }
        for (int r = 0; r < P; r++) {
            ring_gpu *G = &g->gpu[r];
            cudaStream_t st = (cudaStream_t)streams[r];
            const ring_block b = ring_step(s->N, P, s->layout, s->causal, r, t);
            const long long n = slice_rows(s, r), n_s = slice_rows(s, source_of(P, r, t));
            const bool runs = b.q_rows && b.k_rows;
            RING_CUDA(cudaSetDevice(G->device));
            if (t > 0) RING_CUDA(cudaStreamWaitEvent(st, G->kv_ready[t % STEP_BUFFERS], 0));
            RING_CUDA(mark(g, r, t, MARK_COMPUTE, st));
            if (runs) {
                const int rc = block_backward<T>(g, r, t, &b, q, k, v, o, lse, dO, dQ, dK, dV, st,
                                                 err, errlen);
                if (rc) return rc;
            }
            if (t > 0) RING_CUDA(cudaEventRecord(G->kv_free[t % STEP_BUFFERS], st));
            if (P == 1) continue;
            const long long qh = (long long)s->B * s->H, kh = (long long)s->B * s->H_kv;
            if (t > 0 && runs) {  // dQ: the block added to the running sum (as the forward's o)
                const bool last = t == last_block(s, r);
                T *out = (T *)dQ[r];
                const T *blk = (const T *)G->o_part;
                if (acc_in_out[r] && last)
                    RING_CUDA(accumulate(out, out, blk, qh, n, b.q_row, b.q_rows, s->D, st));
                else if (acc_in_out[r])
                    RING_CUDA(accumulate(G->o_acc, out, blk, qh, n, b.q_row, b.q_rows, s->D, st));
                else if (last)
                    RING_CUDA(accumulate(out, G->o_acc, blk, qh, n, b.q_row, b.q_rows, s->D, st));
                else
                    RING_CUDA(
                        accumulate(G->o_acc, G->o_acc, blk, qh, n, b.q_row, b.q_rows, s->D, st));
                acc_in_out[r] = last;
            }
            // dK, dV: the visiting slice's accumulator (its own, zero, at step 0) plus the block
            // LAB HOLE 3 BEGIN [gpus>=2]: dK and dV added into the travelling accumulator
            // LAB TODO: The visiting slice's fp32 dK and dV accumulators are this step's buffers of
            // LAB TODO: the pair, dk_buf[here] and dv_buf[here] with here = t % STEP_BUFFERS,
            // LAB TODO: [B, H_kv, n_s, D] (kh = B H_kv heads, n_s rows). From t = 1 on they arrive
            // LAB TODO: from GPU r - 1: the compute stream first waits for dkv_arrived[here]. At
            // LAB TODO: t = 0 the accumulator starts from zero (accumulate()'s acc NULL), later
            // LAB TODO: from itself; the block's dK and dV (dk_part, dv_part: [B, H_kv, b.k_rows,
            // LAB TODO: D]; NULL where the block did not run) are added at the slice's key rows
            // LAB TODO: b.k_row .. b.k_row + b.k_rows - 1. A step whose block did not run (t > 0)
            // LAB TODO: leaves the accumulator as it arrived. Then record dkv_ready on the compute
            // LAB TODO: stream: pass_gradients() sends the accumulator on once it is reached.
            // LAB STUB: (void)n_s, (void)kh;  // until filled: the accumulators travel unset
            const int here = t % STEP_BUFFERS;
            if (t > 0) RING_CUDA(cudaStreamWaitEvent(st, G->dkv_arrived[here], 0));
            const T *dkb = runs ? (const T *)G->dk_part : NULL,
                    *dvb = runs ? (const T *)G->dv_part : NULL;
            if (t == 0 || runs) {
                const float *ak = t == 0 ? NULL : G->dk_buf[here],
                            *av = t == 0 ? NULL : G->dv_buf[here];
                RING_CUDA(
                    accumulate(G->dk_buf[here], ak, dkb, kh, n_s, b.k_row, b.k_rows, s->D, st));
                RING_CUDA(
                    accumulate(G->dv_buf[here], av, dvb, kh, n_s, b.k_row, b.k_rows, s->D, st));
            }
            RING_CUDA(cudaEventRecord(G->dkv_ready, st));
            // LAB HOLE 3 END
            RING_CUDA(mark(g, r, t, MARK_COMPUTED, st));
        }
        if (P > 1) {
            const int rc = pass_gradients(g, t, err, errlen);
            if (rc) return rc;
        }
    }
    for (int r = 0; P > 1 && r < P; r++) {  // home: the slice's own dK, dV, in the storage type
        ring_gpu *G = &g->gpu[r];
        cudaStream_t st = (cudaStream_t)streams[r];
        const int home = P % STEP_BUFFERS;
        const long long n = slice_rows(s, r), kh = (long long)s->B * s->H_kv;
        RING_CUDA(cudaSetDevice(G->device));
        RING_CUDA(cudaStreamWaitEvent(st, G->dkv_arrived[home], 0));
        RING_CUDA(accumulate((T *)dK[r], G->dk_buf[home], (const T *)NULL, kh, n, 0, 0, s->D, st));
        RING_CUDA(accumulate((T *)dV[r], G->dv_buf[home], (const T *)NULL, kh, n, 0, 0, s->D, st));
    }
    return ATTN_EXIT_PASS;
}

int ring_backward(ring *g, const void *const *q, const void *const *k, const void *const *v,
                  const void *const *o, const float *const *lse, const void *const *dO,
                  void *const *dQ, void *const *dK, void *const *dV, void *const *streams,
                  char *err, size_t errlen) {
    if (!g->s.backward)
        return fail(err, errlen, ATTN_EXIT_USAGE, "ring: planned without the backward pass");
    return g->s.bf16
               ? backward_steps<__nv_bfloat16>(g, q, k, v, o, lse, dO, dQ, dK, dV, streams, err,
                                               errlen)
               : backward_steps<__half>(g, q, k, v, o, lse, dO, dQ, dK, dV, streams, err, errlen);
}

int ring_fill(void *x, int bf16, const ring_slice *slice, long long N, int B, int heads, int D,
              unsigned long long seed, unsigned tensor, float mul, void *stream) {
    const long long bh = (long long)B * heads;
    const unsigned long long key = mix64(seed ^ ((unsigned long long)tensor << TENSOR_SHIFT));
    const int grid = grid_for(bh * slice->n * D);
    if (bf16)
        fill_kernel<<<grid, RING_THREADS, 0, (cudaStream_t)stream>>>((__nv_bfloat16 *)x, *slice, bh,
                                                                     N, D, key, mul);
    else
        fill_kernel<<<grid, RING_THREADS, 0, (cudaStream_t)stream>>>((__half *)x, *slice, bh, N, D,
                                                                     key, mul);
    return (int)cudaGetLastError();
}
