/*
 * stage6_hopper: FlashAttention-3's machinery on Hopper (sm_90a), written out instruction by
 * instruction. README.md is the lesson; LOG.md is the optimization log (each step with its
 * prediction and measurement, and what did not work).
 *
 * New over stage 5: the tensor memory accelerator (TMA) copies Q, K and V tiles into shared
 * memory, already swizzled, and counts their bytes on mbarriers; wgmma multiplies 64 rows per
 * warpgroup with its operands read from shared memory through descriptors (P from registers);
 * one producer warpgroup issues every copy and hands its registers (setmaxnreg) to two or three
 * consumer warpgroups that only compute; the softmax of one key tile starts under the P V of the
 * key tile before; the consumers take turns at issuing their GEMMs (ping-pong); one persistent
 * block per SM takes work tiles from a global counter; where those leave SMs idle, a work tile
 * is a range of a query tile's keys (split-KV, stage 5's rule and merge), on the smallest grids
 * of 64 rows (one consumer warpgroup), and the merge starts the moment the attention kernel ends
 * (programmatic dependent launch).
 * Expected gain: about 1.4x over stage 5 where the grid fills the GPU (the fa2 shapes; README.md,
 * Measured, has the reference run's figures).
 *
 * The kernel, one block per SM (attention_kernel); Q_FULL, K_EMPTY, ... are mbarriers:
 *
 *   producer warpgroup, one thread (producer):
 *     take_next_work:     w = blockIdx.x (or the next one with key tiles)
 *     for each of the block's work tiles t (w: BR query rows of one batch*head, and a range of
 *     their key tiles: all of them unless split):
 *       publish_work:     wait Q_EMPTY[t % QB]; write w; TMA Q -> Q buffer t % QB      (Q_FULL)
 *       next_work_index:  w' = the next work tile from the global counter
 *       for each key tile j of its range, the block's it-th:         (ring slot it % STAGES)
 *         load_key_tile:  wait K_EMPTY; TMA K_j -> K ring slot                        (K_FULL)
 *         load_key_tile:  wait V_EMPTY; TMA V_j -> V ring slot                        (V_FULL)
 *       take_next_work:   w = w', or the next one after it with key tiles
 *     publish_work "stop"
 *
 *   each consumer warpgroup, 64 query rows (consumer_overlapped): one pipeline over every key
 *   tile of every work tile the block takes
 *     take_work (wait Q_FULL); start_rows: O = 0, m = -inf, l = 0
 *     first_scores:    [wait my turn] S = Q K_0^T [pass the turn]; wait S; scores_done
 *     loop:
 *       retire_pv:     wait for the last P V; release its V; if it ended a work tile, write
 *                      that tile's O / l and LSE (epilogue); O *= alpha; exp_pack: P =
 *                      fp16(2^(S - m)), l (the exponentials beside the rescale and packing)
 *       next_key_tile: j + 1; after the work tile's last, end_rows (keep its m, l for its
 *                      epilogue; start new rows) and key tile 0 of the next one (take_work), or
 *                      leave the loop
 *       issue_turn:    [wait my turn] issue S = Q K_next^T; issue O += P V_j [pass the turn]
 *       wait for S (P V may still run)
 *       scores_done:   release K (and Q after its last key tile); mask; row max -> m, alpha
 *                      (and, with two consumers, the first two chunks' exponentials)
 *     last_pv:         [wait my turn] O += P V [pass the turn]; wait; release V; epilogue
 *   (epilogue, split: the range's O / l in fp32 and its LSE to the workspace; after the kernel,
 *   combine_kernel_pdl merges the ranges into O and LSE)
 *
 *   (variant nooverlap: consumer_serial, every wgmma waited for before the next step)
 *
 * Run:  make build && build/stage6_hopper --seq 16384 --heads 16 --dim 128 --causal --bench
 * Variants (--variant): default, nopersistent, nopingpong, nooverlap, nosplit (no split-KV and
 * no one-consumer tiles), nopdl: each switches one step off.
 * Only on an H100/H200 with a build that has sm_90a code (make picks it on a Hopper GPU; the fat
 * build has it); everywhere else the stage reports itself unsupported (exit 3).
 *
 * NOTE: what is left (LOG.md, "Where this leaves stage 6"): at D = 64, the instructions a pass
 * runs besides the softmax and the GEMMs (the ring's slot and phase arithmetic, descriptors
 * rebuilt from addresses); on one head at N <= 2048 stage 6 is only a few percent ahead of
 * stage 5.
 */

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "attention.h"
#include "device/sm90.cuh"        // mbarriers, TMA, wgmma, setmaxnreg, PDL, the fragment vocabulary
#include "device/split_kv.cuh"    // split-KV: key ranges, their merge, how many
#include "device/tensor_map.cuh"  // tensor_map_encoder

// The kernels exist only in sm_90a code (wgmma, setmaxnreg); other targets compile an empty
// kernel, which the launcher never starts (attention_unsupported), and leave the Hopper-only
// constants below unused.
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define HOPPER_KERNELS 1
#else
#define HOPPER_KERNELS 0
#endif
#if defined(__CUDA_ARCH__) && !HOPPER_KERNELS
#pragma nv_diag_suppress 177  // "declared but never referenced"
#endif

/* ---- shapes and tunables --------------------------------------------------------------------- */

// wgmma's fixed shape for fp16 (common/device/sm90.cuh): a warpgroup computes WGMMA_M = 64 rows,
// WGMMA_K = 16 deep, and any N from 8 to 256 in steps of 8 (here BC keys for S, D columns for O).
constexpr int PRODUCER_WARPGROUPS = 1;  // warpgroup 0; the consumers are 1 .. C

// C consumer warpgroups of 64 query rows each, one producer warpgroup in front of them, one
// block per SM. Two consumers: 128 rows per work tile, 384 threads. Three (D = 64, FlashAttention-
// 3's choice there): 192 rows, 512 threads; at D = 64 the softmax costs as much per key as at
// D = 128 but the GEMMs half as much, and a third warpgroup's softmax helps to fill the tensor
// pipe. Causal rows below this N keep two (192-row tiles balance short causal rows worse;
// LOG.md, steps 5 and 10).
constexpr int THREE_CONSUMERS_MIN_N_CAUSAL = 2048;
template <int C>
__host__ __device__ constexpr int block_rows() {  // BR
    return C * WGMMA_M;
}
template <int C>
__host__ __device__ constexpr int block_threads() {
    return (C + PRODUCER_WARPGROUPS) * WARPGROUP;
}

// Keys per K/V tile, BC (a template parameter of the kernel): 176 with two consumers at D = 128
// without a causal mask from N = 4096 (FlashAttention-3's choice), 128 otherwise (one consumer
// runs only on grids far smaller). S is BC / 2 fp32 registers per
// consumer thread and P another BC / 4; with O_acc (D / 2) that is 196 of the 240 registers at
// D = 128, BC = 176. Longer key tiles spread the fixed costs of a tile (the waits, the turn, O's
// rescale, the row maxima's shuffles) over more keys; but with 176 keys shared memory has room
// for neither a second Q buffer nor the O staging tiles (o_staged()), which short rows need
// more; causal rows waste more of a long tile on the diagonal; and the three-consumer D = 64
// kernels (160 registers) would spill (LOG.md, steps 9 and 14).
constexpr int KEY_TILE_SHORT = 128;
constexpr int KEY_TILE_LONG = 176;
constexpr int KEY_TILE_LONG_MIN_N = 4096;
static int key_tile_for(const attn_shape *s, int consumers) {
    return consumers == 2 && s->D == 128 && !s->causal && s->N >= KEY_TILE_LONG_MIN_N
               ? KEY_TILE_LONG
               : KEY_TILE_SHORT;
}

// K/V ring depth: the producer runs up to STAGES tiles ahead of the consumers.
constexpr int STAGES = 2;

// Q buffers: with two, the next work tile's Q lands while this one's last key tiles run, and the
// consumers go from one work tile to the next without waiting for it. Two where shared memory
// has room (a block may have 227 KB), else one: at D = 128, BC = 176 the K/V ring alone takes
// 2 x (K 44 KB + V 44 KB) = 176 KB, and Q 32 KB.
constexpr int Q_BUFFERS_MAX = 2;
constexpr int SMEM_PER_BLOCK_MAX = 227 * 1024;

// setmaxnreg: the block's threads start with an even share of the 65,536 registers (168 each
// for 384 threads, 128 for 512); the producer gives most of its share to the consumers. Two
// consumers: 128 x 24 + 256 x 240 = 64,512. Three: 128 x 32 + 384 x 160 = 65,536 (O_acc is 32
// floats at D = 64, S 64, P 32). One (small grids): 256 threads, 128 x 32 + 128 x 240.
template <int C>
__host__ __device__ constexpr int producer_regs() {
    return C == 2 ? 24 : 32;
}
template <int C>
__host__ __device__ constexpr int consumer_regs() {
    return C == 3 ? 160 : 240;
}

// The 128-byte swizzle works on rows of 128 bytes: 64 halves. A tile of D columns is stored as
// D / 64 slabs of [rows, 64] halves, one TMA copy each. In a slab, the 16-byte chunk c of row r
// sits at chunk position c ^ (r % 8): the pattern repeats every 8 rows, and those 8-row groups
// (1024 bytes, the swizzle atom) are the stride the wgmma descriptors give.
constexpr int SLAB_COLS = 64;
constexpr int SLAB_ROW_BYTES = SLAB_COLS * HALF_BYTES;
constexpr int CHUNKS_PER_SLAB_ROW = SLAB_ROW_BYTES / CHUNK_BYTES;
constexpr int SWIZZLE_ROWS = 8;
constexpr int SWIZZLE_ATOM_BYTES = SWIZZLE_ROWS * SLAB_ROW_BYTES;

// Where column slab `slab` of a [D / 64][ROWS][64] tile starts, and where 16-byte chunk `chunk`
// (columns 8 chunk .. 8 chunk + 7) of its row `row` sits, in bytes from the tile's start.
template <int ROWS>
__device__ __forceinline__ int slab_offset(int slab) {
    return slab * ROWS * SLAB_ROW_BYTES;
}
template <int ROWS>
__device__ __forceinline__ int swizzled_chunk_offset(int row, int chunk) {
    return (chunk / CHUNKS_PER_SLAB_ROW) * (ROWS * SLAB_ROW_BYTES) + row * SLAB_ROW_BYTES +
           ((chunk % CHUNKS_PER_SLAB_ROW) ^ (row % SWIZZLE_ROWS)) * CHUNK_BYTES;
}

// The accumulator fragment of wgmma (common/device/warp.cuh): in a warpgroup's 64 x N result, warp
// w holds rows 16 w .. 16 w + 15, and lane (g, t) = (lane / 4, lane % 4) the rows g and g + 8 of
// those (h = 0, 1), columns 8 i + 2 t + c (c = 0, 1) of each 8-column chunk i: register
// acc_index(i, h, c), FRAG_REGS per chunk. A row is shared by the 4 lanes of a quad.
constexpr int WARP_ROWS = WGMMA_M / WARPS_PER_WARPGROUP;  // 16
// wgmma's A operand from registers (P of O += P V) has the same layout, two halves a register:
// a 64 x 16 k-step is 4 registers a thread.
constexpr int A_REGS_PER_KSTEP = WGMMA_M * WGMMA_K / 2 / WARPGROUP;

// A ring of SLOTS buffers, each with a "full" and an "empty" mbarrier, used in turn: the
// count-th use (counted over the whole block, across work tiles, so the ring never resets) is
// slot count % SLOTS, in that slot's phase count / SLOTS, of which a wait names the parity. The
// consumers wait on "full" for that phase; the producer waits on "empty" for the phase before
// (the consumers' release of the slot's last use), which a fresh barrier counts as complete.
template <int SLOTS>
struct pipeline_state {
    int count;  // >= 0: taken as unsigned, % and / by SLOTS are a mask and a shift
    __device__ __forceinline__ int slot() const { return (int)((uint32_t)count % SLOTS); }
    __device__ __forceinline__ uint32_t phase() const { return ((uint32_t)count / SLOTS) & 1; }
    __device__ __forceinline__ uint32_t empty_phase() const { return phase() ^ 1; }
    __device__ __forceinline__ pipeline_state next() const { return {count + 1}; }
    __device__ __forceinline__ pipeline_state previous() const { return {count - 1}; }
};

// Named barriers (bar.sync / bar.arrive; barrier 0 is __syncthreads'): NAMED_BARRIER_TURN_WG0 + wg
// says "consumer warpgroup wg may issue its GEMMs" (ping-pong), for each of the C <= 3 consumers.
enum named_barrier {
    NAMED_BARRIER_SYNCTHREADS = 0,
    NAMED_BARRIER_TURN_WG0,
    NAMED_BARRIER_TURN_WG1,
    NAMED_BARRIER_TURN_WG2,
};
constexpr int TURN_THREADS = 2 * WARPGROUP;  // the warpgroup that waits, the one that hands over

// Operand A or B stored "K-major" (the K dimension contiguous: Q and K rows, D halves each).
// Within a 64-column slab, k-step kk starts kk * 32 bytes into each 128-byte row (the hardware
// applies the swizzle to the address); the 8-row groups are 1024 bytes apart (stride offset);
// the leading offset is unused in this mode.
constexpr int DESC_UNUSED_LEAD_BYTES = 16;
__device__ __forceinline__ uint64_t desc_k_major(uint32_t tile) {
    return smem_desc(tile, DESC_UNUSED_LEAD_BYTES, SWIZZLE_ATOM_BYTES);
}
template <int ROWS>
__device__ __forceinline__ uint64_t desc_k_major_step(uint64_t tile_desc, int kk) {
    constexpr int STEPS_PER_SLAB = SLAB_COLS / WGMMA_K;
    return desc_advance(tile_desc, slab_offset<ROWS>(kk / STEPS_PER_SLAB) +
                                       (kk % STEPS_PER_SLAB) * (WGMMA_K * HALF_BYTES));
}

// Operand B stored "MN-major" (N contiguous: V's rows are keys = the K dimension of P V, with
// the D output columns contiguous). Along N the 64-column slabs are ROWS * 128 bytes apart
// (leading offset); along K the 8-row groups 1024 bytes (stride offset). k-step kk is WGMMA_K key
// rows further down: 2 swizzle atoms.
template <int ROWS>
__device__ __forceinline__ uint64_t desc_mn_major(uint32_t tile) {
    return smem_desc(tile, ROWS * SLAB_ROW_BYTES, SWIZZLE_ATOM_BYTES);
}
__device__ __forceinline__ uint64_t desc_mn_major_step(uint64_t tile_desc, int kk) {
    return desc_advance(tile_desc, kk * WGMMA_K * SLAB_ROW_BYTES);
}

/* ---- the kernel's shared memory -------------------------------------------------------------- */

// Q_smem q_buffers() x [D/64 slabs][BR rows][64], then the K and V rings, each STAGES x
// [D/64][BC][64], then (where it fits, o_staged()) one O staging tile [D/64][64][64] per consumer
// warpgroup, then the mbarriers and the work tile indices. Every tile starts 1024-byte aligned
// (the swizzle atom).
template <int D, int C>
__host__ __device__ constexpr int q_bytes() {
    return block_rows<C>() * D * HALF_BYTES;
}
template <int D, int BC>
__host__ __device__ constexpr int kv_bytes() {
    return BC * D * HALF_BYTES;
}
enum {
    BAR_Q_FULL,
    BAR_Q_EMPTY = BAR_Q_FULL + Q_BUFFERS_MAX,
    BAR_K_FULL = BAR_Q_EMPTY + Q_BUFFERS_MAX,
    BAR_K_EMPTY = BAR_K_FULL + STAGES,
    BAR_V_FULL = BAR_K_EMPTY + STAGES,
    BAR_V_EMPTY = BAR_V_FULL + STAGES,
    BARRIERS = BAR_V_EMPTY + STAGES
};
template <int D>
__host__ __device__ constexpr int o_stage_bytes() {  // one consumer warpgroup's 64 rows of O
    return WGMMA_M * D * HALF_BYTES;
}
template <int D, int C, int BC, int QB, bool STAGED>
__host__ __device__ constexpr int smem_bytes_with() {
    return SWIZZLE_ATOM_BYTES /* alignment slack */ + QB * q_bytes<D, C>() +
           2 * STAGES * kv_bytes<D, BC>() + (STAGED ? C * o_stage_bytes<D>() : 0) +
           BARRIERS * MBARRIER_BYTES +
           Q_BUFFERS_MAX * (int)sizeof(int) /* the work tile indices the producer hands over */;
}
// Two Q buffers come first. O is staged in shared memory and stored by TMA (store_o_staged) with
// two consumers where there is room: not at D = 128 with BC = 176 (K, V and Q take 208 KB). With
// three consumers (D = 64) the direct stores measured faster (LOG.md, step 13).
// These are compile-time choices, made against SMEM_PER_BLOCK_MAX, not against the device's
// limit: --smem-limit can only make a configuration unsupported, never pick another.
template <int D, int C, int BC>
__host__ __device__ constexpr int q_buffers() {
    return smem_bytes_with<D, C, BC, Q_BUFFERS_MAX, false>() <= SMEM_PER_BLOCK_MAX ? Q_BUFFERS_MAX
                                                                                   : 1;
}
template <int D, int C, int BC>
__host__ __device__ constexpr bool o_staged() {
    return C < 3 && smem_bytes_with<D, C, BC, q_buffers<D, C, BC>(), true>() <= SMEM_PER_BLOCK_MAX;
}
template <int D, int C, int BC>
__host__ __device__ constexpr int smem_bytes() {
    return smem_bytes_with<D, C, BC, q_buffers<D, C, BC>(), o_staged<D, C, BC>()>();
}

typedef struct {
    uint32_t Q, K, V, O, bar;  // shared addresses: Q_smem, K ring, V ring, O staging, barriers
    int *work;  // [Q_BUFFERS_MAX] the work tile whose Q is in Q buffer i (the producer's)
} smem_tiles;

template <int D, int C, int BC>
__device__ __forceinline__ smem_tiles carve_smem(unsigned char *raw) {
    smem_tiles s;
    constexpr uint32_t ALIGN = SWIZZLE_ATOM_BYTES;
    const uint32_t pad = ((smem_u32(raw) + ALIGN - 1) & ~(ALIGN - 1)) - smem_u32(raw);
    s.Q = smem_u32(raw) + pad;
    s.K = s.Q + q_buffers<D, C, BC>() * q_bytes<D, C>();
    s.V = s.K + STAGES * kv_bytes<D, BC>();
    s.O = s.V + STAGES * kv_bytes<D, BC>();
    s.bar = s.O + (o_staged<D, C, BC>() ? C * o_stage_bytes<D>() : 0);
    s.work = (int *)(raw + pad + (s.bar - s.Q) + BARRIERS * MBARRIER_BYTES);
    return s;
}
__device__ __forceinline__ uint32_t bar_at(const smem_tiles &s, int i) {
    return s.bar + MBARRIER_BYTES * i;
}

// The K/V ring's pipeline_state: its count is the number of key tiles the block has gone
// through, over all its work tiles. The Q buffers' count is the number of work tiles (t below).
typedef pipeline_state<STAGES> kv_pipeline;

// Wait until this use's buffer is full (the consumers), or empty again (the producer); `full` and
// `empty` name the first barrier of the kind (BAR_K_FULL, ...), one per slot.
template <int SLOTS>
__device__ __forceinline__ void wait_full(const smem_tiles &sm, int full,
                                          pipeline_state<SLOTS> ps) {
    mbar_wait(bar_at(sm, full + ps.slot()), ps.phase());
}
template <int SLOTS>
__device__ __forceinline__ void wait_empty(const smem_tiles &sm, int empty,
                                           pipeline_state<SLOTS> ps) {
    mbar_wait(bar_at(sm, empty + ps.slot()), ps.empty_phase());
}

// K and V ring slot st, and the Q buffer of the block's t-th work tile.
template <int D, int BC>
__device__ __forceinline__ uint32_t k_stage(const smem_tiles &s, int st) {
    return s.K + st * kv_bytes<D, BC>();
}
template <int D, int BC>
__device__ __forceinline__ uint32_t v_stage(const smem_tiles &s, int st) {
    return s.V + st * kv_bytes<D, BC>();
}
template <int D, int C, int BC>
__device__ __forceinline__ uint32_t q_stage(const smem_tiles &s, int t) {
    return s.Q + pipeline_state<q_buffers<D, C, BC>()>{t}.slot() * q_bytes<D, C>();
}

// Division by a number fixed for the launch, in two instructions instead of a division's
// dozen: n / d = (umulhi(n, mul) + n) >> shift for 0 <= n < 2^31, with shift = ceil(log2 d) and
// mul = floor(2^32 (2^shift - d) / d) + 1 worked out by the host (Granlund and Montgomery's
// method, as CUTLASS's FastDivmod). The work tiles' decoding uses it: the producer thread has 24
// registers, too few for two divisions' temporaries.
typedef struct {
    uint32_t mul, shift;
} fast_divisor;

static fast_divisor make_fast_divisor(uint32_t d) {
    fast_divisor f;
    f.shift = 0;
    while ((1ull << f.shift) < d) ++f.shift;
    f.mul = (uint32_t)(((1ull << 32) * ((1ull << f.shift) - d)) / d + 1);
    return f;
}

__device__ __forceinline__ int fast_divide(int n, fast_divisor f) {
    return (int)((__umulhi((uint32_t)n, f.mul) + (uint32_t)n) >> f.shift);
}

// The problem as the producer and the consumers see it: N, causal, how a query tile's key tiles
// are cut (split-KV: into ranges of split_tiles key tiles, at most `splits` of them; splits = 1:
// one range, all of them), the softmax scale times log2(e), and where the results go.
typedef struct {
    int N, causal, splits, split_tiles;
    fast_divisor per_head, per_query_tile;  // work tiles: of a head, of a query tile (splits)
    float scale_log2;
    __half *O;               // [B, H, N, D]                  (splits = 1)
    float *lse;              // [B, H, N]                     (splits = 1)
    float *O_part;           // [splits, B * H, N, D], fp32   (splits > 1: combine_kernel merges)
    float *lse_part;         // [splits, B * H, N]            (splits > 1)
    long long rows;          // B * H * N
    const CUtensorMap *tmO;  // O as [B*H, N, D] in boxes of [1, 16, 64], for the staged stores
} problem;

// A work tile: one batch*head, BR query rows and a range of their key tiles, [j0, j0 + n_tiles)
// (all of them unless split). Numbered head by head; inside a head, the query tiles with the most
// key tiles (causal) first, then their ranges. A causal query tile has fewer key tiles, so fewer
// ranges, than the longest: its last ranges are empty (n_tiles = 0) and nobody takes them
// (take_next_work). A persistent block (one per SM) starts with work tile blockIdx.x and then
// takes the next one not yet taken from a global counter, so work tiles of different lengths even
// out over the SMs as they would with one block per tile (the variant nopersistent, which
// launches exactly that). t numbers the block's work tiles: it is the count of the Q buffers'
// pipeline_state.
typedef struct {
    int bh, q0, j0, n_tiles, split, t;
} work_tile;

template <int C, int BC>
__device__ __forceinline__ work_tile work_at(int w, const problem &pb) {
    constexpr int BR = block_rows<C>();
    const int q_tiles = (pb.N + BR - 1) / BR;
    work_tile t;
    t.bh = fast_divide(w, pb.per_head);
    const int in_head = w - t.bh * q_tiles * pb.splits;
    const int q_index = fast_divide(in_head, pb.per_query_tile);
    t.split = in_head - q_index * pb.splits;
    t.q0 = (q_tiles - 1 - q_index) * BR;
    const int tiles = query_tile_key_tiles(t.q0, BR, BC, pb.N, pb.causal);
    t.j0 = t.split * pb.split_tiles;
    t.n_tiles = max(0, min(tiles - t.j0, pb.split_tiles));
    t.t = 0;
    return t;
}

// The first key of key tile j of work tile wt (j counts from the start of its range).
template <int BC>
__device__ __forceinline__ int key_tile_start(const work_tile &wt, int j) {
    return (wt.j0 + j) * BC;
}

/* ---- the producer ---------------------------------------------------------------------------- */

// Announce a tile's bytes on its "full" barrier and copy it, one TMA copy per 64-column slab.
template <int D, int ROWS>
__device__ __forceinline__ void copy_tile(uint32_t dst, const CUtensorMap *map, uint32_t full,
                                          int row0, int bh) {
    mbar_arrive_expect_tx(full, ROWS * D * HALF_BYTES);
#pragma unroll
    for (int c = 0; c < D / SLAB_COLS; ++c)
        tma_load_3d(dst + slab_offset<ROWS>(c), map, full, c * SLAB_COLS, row0, bh);
}

// K or V of key tile j of work tile wt (the j-th of its range) into ring slot kv.slot() once the
// consumers have released it (ring = sm.K or sm.V; FULL and EMPTY = BAR_K_FULL and BAR_K_EMPTY,
// or V's).
template <int D, int BC, int FULL, int EMPTY>
__device__ __forceinline__ void load_key_tile(const smem_tiles &sm, uint32_t ring,
                                              const CUtensorMap *map, kv_pipeline kv,
                                              const work_tile &wt, int j) {
    wait_empty(sm, EMPTY, kv);
    copy_tile<D, BC>(ring + kv.slot() * kv_bytes<D, BC>(), map, bar_at(sm, FULL + kv.slot()),
                     key_tile_start<BC>(wt, j), wt.bh);
}

// Hand the block's t-th work tile, index w, to the consumers: wait until Q buffer t % QB and its
// index slot are free, write the index, start Q's copy. w >= works hands over "stop" (no copy).
template <int D, int C, int BC>
__device__ __forceinline__ void publish_work(const smem_tiles &sm, const CUtensorMap *tmQ, int t,
                                             int w, const work_tile &wt, int works) {
    const pipeline_state<q_buffers<D, C, BC>()> q = {t};
    const uint32_t full = bar_at(sm, BAR_Q_FULL + q.slot());
    wait_empty(sm, BAR_Q_EMPTY, q);
    atomicExch(&sm.work[q.slot()], w);  // (an atomic, like the consumers' read: see take_work())
    if (w >= works) {
        mbar_arrive(full);  // no copy: the consumers read "stop"
        return;
    }
    copy_tile<D, block_rows<C>()>(q_stage<D, C, BC>(sm, t), tmQ, full, wt.q0, wt.bh);
}

// The work tile a block takes after its current one: the next one not yet taken (a global
// counter), or none (works) when every block has one work tile at most.
__device__ __forceinline__ int next_work_index(int works, int *next_work) {
    return (int)gridDim.x >= works ? works : gridDim.x + atomicAdd(next_work, 1);
}

// Work tile w (wt), or past it the first one with key tiles (a causal split leaves empty ones),
// or none (works).
template <int C, int BC>
__device__ __forceinline__ int take_next_work(int w, const problem &pb, int works, int *next_work,
                                              work_tile &wt) {
    for (;; w = next_work_index(works, next_work)) {
        if (w >= works) return works;
        wt = work_at<C, BC>(w, pb);
        if (wt.n_tiles > 0 || pb.splits == 1) return w;  // (unsplit, every one has key tiles)
    }
}

// One thread issues every copy: for each work tile, hand it over (Q into its buffer as soon as
// the consumers are done with the work tile QB before it), then K_j and V_j into the next ring
// slot as soon as the consumers have released it. Separate barriers let S = Q K_j^T start
// before V_j lands. The counter's atomic for the next work tile is taken right after a
// hand-over, so that its latency hides under the copies.
template <int D, int C, int BC>
__device__ __forceinline__ void producer(const smem_tiles &sm, const CUtensorMap *tmQ,
                                         const CUtensorMap *tmK, const CUtensorMap *tmV,
                                         const problem &pb, int works, int *next_work) {
    kv_pipeline kv = {0};  // counts the key tiles issued so far
    work_tile wt;
    int w = take_next_work<C, BC>(blockIdx.x, pb, works, next_work, wt);
    for (int t = 0;; ++t) {
        publish_work<D, C, BC>(sm, tmQ, t, w, wt, works);
        if (w >= works) return;  // that was "stop"
        for (int j = 0; j < wt.n_tiles; ++j, kv = kv.next()) {
            load_key_tile<D, BC, BAR_K_FULL, BAR_K_EMPTY>(sm, sm.K, tmK, kv, wt, j);
            load_key_tile<D, BC, BAR_V_FULL, BAR_V_EMPTY>(sm, sm.V, tmV, kv, wt, j);
        }
        w = take_next_work<C, BC>(next_work_index(works, next_work), pb, works, next_work, wt);
    }
}

/* ---- the consumers' pieces ------------------------------------------------------------------- */

// The consumer thread's place: warpgroup wg (0 .. C - 1) owns block rows 64 wg .. 64 wg + 63;
// in it, warp w owns 16 rows, and lane (g, t) rows g and g + 8 of those (the fragment above).
typedef struct {
    int wg, warp, lane, g, t;
} consumer_place;

// The first row of the thread's warpgroup (a row of the head), of its warp (a row of the
// warpgroup's 64), and of the thread's own two rows (a row of the head; the other is 8 further).
__device__ __forceinline__ int warpgroup_row0(const work_tile &wt, const consumer_place &p) {
    return wt.q0 + p.wg * WGMMA_M;
}
__device__ __forceinline__ int warp_row0(const consumer_place &p) {
    return WARP_ROWS * p.warp;
}
__device__ __forceinline__ int row_of(const work_tile &wt, const consumer_place &p) {
    return warpgroup_row0(wt, p) + warp_row0(p) + p.g;
}

// The operands of S = Q K_j^T as wgmma descriptors: this warpgroup's 64 rows of work tile wt's
// Q, and K_j (ring slot K_tile). Worked out before a warpgroup waits for its turn, so that the
// turn goes to issuing (LOG.md, step 18).
typedef struct {
    uint64_t Q, K;
} scores_operands;
template <int D, int C, int BC>
__device__ __forceinline__ scores_operands scores_operands_of(const smem_tiles &sm,
                                                              const consumer_place &p,
                                                              const work_tile &wt,
                                                              uint32_t K_tile) {
    return {desc_k_major(q_stage<D, C, BC>(sm, wt.t) + p.wg * WGMMA_M * SLAB_ROW_BYTES),
            desc_k_major(K_tile)};
}

// The operand of O += P V_j from shared memory: V_j (ring slot st) as a wgmma descriptor.
template <int D, int BC>
__device__ __forceinline__ uint64_t pv_operand_of(const smem_tiles &sm, int st) {
    return desc_mn_major<BC>(v_stage<D, BC>(sm, st));
}

// Start S = Q K_j^T: D / 16 wgmma from shared memory, one group.
template <int D, int C, int BC>
__device__ __forceinline__ void issue_scores(float (&S)[BC / 2], scores_operands op) {
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < D / WGMMA_K; ++kk)
        if constexpr (BC == 128)
            wgmma_m64n128_ss(S, desc_k_major_step<block_rows<C>()>(op.Q, kk),
                             desc_k_major_step<BC>(op.K, kk), kk > 0);
        else
            wgmma_m64n176_ss(S, desc_k_major_step<block_rows<C>()>(op.Q, kk),
                             desc_k_major_step<BC>(op.K, kk), kk > 0);
    wgmma_commit();
}

// Start O += P V_j: BC / 16 wgmma, P from registers (four per k-step), V_j from shared memory
// (V_desc: pv_operand_of its ring slot).
// For the first key tile of a work tile (accumulate = 0) the first k-step overwrites O_acc: O
// starts from zero, whatever the last work tile left in the registers.
template <int D, int BC>
__device__ __forceinline__ void issue_pv(float (&O_acc)[D / 2], const uint32_t (&P)[BC / 4],
                                         uint64_t V_desc, int accumulate) {
    pin_registers(O_acc);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < BC / WGMMA_K; ++kk) {
        if constexpr (D == 128)
            wgmma_m64n128_rs(O_acc, &P[A_REGS_PER_KSTEP * kk], desc_mn_major_step(V_desc, kk),
                             kk > 0 || accumulate);
        else
            wgmma_m64n64_rs(O_acc, &P[A_REGS_PER_KSTEP * kk], desc_mn_major_step(V_desc, kk),
                            kk > 0 || accumulate);
    }
    wgmma_commit();
}

// Release a K, V or Q buffer: one arrival per warp, once the warp's wgmma reading it are done.
__device__ __forceinline__ void release(uint32_t bar, const consumer_place &p) {
    __syncwarp();
    if (p.lane == 0) mbar_arrive(bar);
}

// Scores of keys past N (tail tile) or past the row (causal) become -inf. Only the diagonal
// and the tail tile need it. Element (i, h, c) of the thread is key key0 + 2t + 8i + c of row
// row0 + 8h: it is kept while its offset 8i + c (a constant) is below a bound the thread works
// out once per row, so each element costs one compare and one select.
template <int BC>
__device__ __forceinline__ void mask_scores(float (&S)[BC / 2], const consumer_place &p, int row0,
                                            int key0, int N, int causal) {
    const int first = key0 + 2 * p.t;  // the key of offset 0
    int bound[2];
#pragma unroll
    for (int h = 0; h < 2; ++h)
        bound[h] = (causal ? min(N, row0 + FRAG_ROW_STEP * h + 1) : N) - first;
#pragma unroll
    for (int i = 0; i < BC / FRAG_COLS; ++i) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
#pragma unroll
            for (int c = 0; c < 2; ++c)
                if (FRAG_COLS * i + c >= bound[h]) S[acc_index(i, h, c)] = -INFINITY;
        }
    }
}

// The online softmax of one key tile for the thread's two rows (h = 0, 1), in two steps, the two
// rows side by side in each. row_max: the rows' new max (4 lanes share a row: two shuffles),
// alpha = 2^(m_old - m_new), which O_acc and l_i are to be scaled by, the exponent's shift
// m_new * scale_log2, and the exponentials of the first EARLY 8-column chunks (their sums too).
// It only reads S, so it can run while the P V before is still in flight; the early
// exponentials keep the multi-function unit busy while the P V finishes (LOG.md, step 19).
// row_step is what it hands to exp_pack() and rescale_o(), across that P V's wait.
template <int EARLY>
__host__ __device__ constexpr int early_regs() {  // (an array needs at least one element)
    return EARLY > 0 ? EARLY * FRAG_REGS : 1;
}
template <int EARLY>
struct row_step {
    float alpha[2], shift[2];
    float p[early_regs<EARLY>()];  // the early chunks, in acc_index order
    float sum[2];                  // their sums, per row
};
// Two chunks with two consumers; with three (D = 64) the 160 registers do not hold them.
constexpr int EARLY_CHUNKS_TWO_CONSUMERS = 2;
template <int C>
__host__ __device__ constexpr int early_chunks() {
    return C == 3 ? 0 : EARLY_CHUNKS_TWO_CONSUMERS;
}
template <int BC, int EARLY>
__device__ __forceinline__ void row_max(const float (&S)[BC / 2], float (&m_i)[2], float scale_log2,
                                        row_step<EARLY> &r) {
    float mx[2] = {m_i[0], m_i[1]};
#pragma unroll
    for (int i = 0; i < BC / FRAG_COLS; ++i) {
#pragma unroll
        for (int h = 0; h < 2; ++h)
            mx[h] = fmaxf(mx[h], fmaxf(S[acc_index(i, h, 0)], S[acc_index(i, h, 1)]));
    }
#pragma unroll
    for (int lanes = 1; lanes < QUAD; lanes *= 2) {  // the row's max over its quad
#pragma unroll
        for (int h = 0; h < 2; ++h) mx[h] = fmaxf(mx[h], __shfl_xor_sync(FULL_WARP, mx[h], lanes));
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        // A row that has seen only masked keys keeps m = -inf; use 0 so that no inf - inf appears.
        const float m_use = mx[h] == -INFINITY ? 0.f : mx[h];
        r.alpha[h] = fast_exp2((m_i[h] - m_use) * scale_log2);
        m_i[h] = mx[h];
        r.shift[h] = m_use * scale_log2;
    }
    r.sum[0] = r.sum[1] = 0.f;
#pragma unroll
    for (int i = 0; i < EARLY; ++i) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
#pragma unroll
            for (int c = 0; c < 2; ++c) {
                const float x = fast_exp2(fmaf(S[acc_index(i, h, c)], scale_log2, -r.shift[h]));
                r.p[acc_index(i, h, c)] = x;
                r.sum[h] += x;
            }
        }
    }
}

// exp_pack: P = 2^(S scale_log2 - shift) (the early chunks' from row_max), to fp16 straight into
// the A-operand layout of the P V wgmma, which is the S layout (register k of P packs elements 2k
// and 2k + 1: columns 2t and 2t + 1 of one row); l_i = l_i alpha + the rows' sums. P's registers
// are the A operand of the P V before, so this comes after that wgmma's wait.
template <int BC, int EARLY>
__device__ __forceinline__ void exp_pack(const float (&S)[BC / 2], uint32_t (&P)[BC / 4],
                                         float (&l_i)[2], float scale_log2,
                                         const row_step<EARLY> &r) {
    float sum[2] = {r.sum[0], r.sum[1]};
#pragma unroll
    for (int i = 0; i < BC / FRAG_COLS; ++i) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            float x[2];
#pragma unroll
            for (int c = 0; c < 2; ++c) {
                if (i < EARLY) {
                    x[c] = r.p[acc_index(i, h, c)];
                } else {
                    x[c] = fast_exp2(fmaf(S[acc_index(i, h, c)], scale_log2, -r.shift[h]));
                    sum[h] += x[c];
                }
            }
            P[acc_index(i, h, 0) / 2] = pack_half2(x[0], x[1]);
        }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) l_i[h] = l_i[h] * r.alpha[h] + sum[h];
}

template <int D>
__device__ __forceinline__ void rescale_o(float (&O_acc)[D / 2], const float (&alpha)[2]) {
#pragma unroll
    for (int i = 0; i < D / FRAG_COLS; ++i) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
#pragma unroll
            for (int c = 0; c < 2; ++c) O_acc[acc_index(i, h, c)] *= alpha[h];
        }
    }
}

// The sum of a row's l over the 4 lanes of its quad.
__device__ __forceinline__ float quad_sum(float x) {
#pragma unroll
    for (int lanes = 1; lanes < QUAD; lanes *= 2) x += __shfl_xor_sync(FULL_WARP, x, lanes);
    return x;
}

// The four lanes of a quad hold one row: lane t has columns 8i + 2t, +1 of every 8-column chunk
// i. A 4 x 4 exchange inside the quad (two butterfly steps of two shuffles) turns that around
// for chunks 4k .. 4k + 3: afterwards lane t holds all 8 columns of chunk 4k + t, v[r] being
// the pair that lane r had.
__device__ __forceinline__ void quad_transpose(uint32_t (&v)[QUAD], int t) {
#pragma unroll
    for (int b = 1; b < QUAD; b <<= 1) {
#pragma unroll
        for (int r = 0; r < QUAD; ++r) {
            if (r & b) continue;
            const bool upper = t & b;
            const uint32_t got = __shfl_xor_sync(FULL_WARP, upper ? v[r] : v[r | b], b);
            if (upper)
                v[r] = got;
            else
                v[r | b] = got;
        }
    }
}

// O straight from the registers to global memory (where shared memory has no room to stage it).
// After quad_transpose each lane writes 16 contiguous bytes (one chunk), and a warp's store
// covers 8 rows x 64 bytes: D / 32 stores per row and thread.
template <int D>
__device__ __forceinline__ void store_o_direct(const float (&O_acc)[D / 2], const float (&inv_l)[2],
                                               const consumer_place &p, const work_tile &wt,
                                               const problem &pb) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int row = row_of(wt, p) + FRAG_ROW_STEP * h;
        __half *o_row = pb.O + ((size_t)wt.bh * pb.N + row) * D;
#pragma unroll
        for (int k = 0; k < D / (QUAD * FRAG_COLS); ++k) {
            uint32_t v[QUAD];  // chunks QUAD k .. QUAD k + 3 of the row
#pragma unroll
            for (int r = 0; r < QUAD; ++r)
                v[r] = pack_half2(O_acc[acc_index(QUAD * k + r, h, 0)] * inv_l[h],
                                  O_acc[acc_index(QUAD * k + r, h, 1)] * inv_l[h]);
            quad_transpose(v, p.t);  // (every lane takes part, rows past N too)
            if (row < pb.N)
                *reinterpret_cast<uint4 *>(o_row + FRAG_COLS * (QUAD * k + p.t)) =
                    make_uint4(v[0], v[1], v[2], v[3]);
        }
    }
}

// O through shared memory (o_staged()), one warp at a time: stmatrix writes the warp's 16 x D
// block of O into its part of the warpgroup's staging tile, in the 128-byte swizzle the TMA
// reads, four 8 x 8 matrices per instruction straight from the accumulator layout (D / 16 a
// thread: no shuffles, no global stores); then lane 0 stores the block with D / 64 TMA copies,
// which leave out the rows past N. The warp does not wait for them: its next epilogue, a work
// tile later, first makes sure they have read the block. No barrier across warps.
template <int D>
__device__ __forceinline__ void store_o_staged(const float (&O_acc)[D / 2], const float (&inv_l)[2],
                                               const consumer_place &p, const work_tile &wt,
                                               const problem &pb, uint32_t stage) {
    if (p.lane == 0) bulk_wait<true>();
    __syncwarp();  // the warp's last store has read its rows of the staging tile
    // stmatrix k covers chunks (8 columns) 2k and 2k + 1 of the warp's 16 rows: matrix 0 is rows
    // 0-7 of chunk 2k, 1 rows 8-15 of it, 2 and 3 the same of chunk 2k + 1. Lane L addresses row
    // L % 8 of matrix L / 8; in the swizzle the 16-byte chunk c of a row r sits at c ^ (r % 8).
    const int row =
        warp_row0(p) + STMATRIX_ROWS * (p.lane / STMATRIX_ROWS % 2) + p.lane % STMATRIX_ROWS;
    const int second = p.lane / (2 * STMATRIX_ROWS);  // this lane's matrix is of chunk 2k + 1
#pragma unroll
    for (int k = 0; k < D / (2 * FRAG_COLS); ++k) {
        const int chunk = 2 * k + second;
        const uint32_t addr = stage + swizzled_chunk_offset<WGMMA_M>(row, chunk);
        const float *o = &O_acc[8 * k];  // chunk 2k: o[0..3], chunk 2k + 1: o[4..7]
        stmatrix_x4(addr, pack_half2(o[0] * inv_l[0], o[1] * inv_l[0]),
                    pack_half2(o[2] * inv_l[1], o[3] * inv_l[1]),
                    pack_half2(o[4] * inv_l[0], o[5] * inv_l[0]),
                    pack_half2(o[6] * inv_l[1], o[7] * inv_l[1]));
    }
    fence_proxy_async();  // each lane's stmatrix writes are visible to the copy engine
    __syncwarp();         // the warp's block is written
    if (p.lane == 0) {
#pragma unroll
        for (int c = 0; c < D / SLAB_COLS; ++c)
            tma_store_3d(pb.tmO, stage + slab_offset<WGMMA_M>(c) + warp_row0(p) * SLAB_ROW_BYTES,
                         c * SLAB_COLS, warpgroup_row0(wt, p) + warp_row0(p), wt.bh);
        bulk_commit();
    }
}

// Split-KV: O of one key range, normalised by the range's own l, in fp32 to its slice of O_part
// for combine_kernel; each lane's two columns of a chunk as one 8-byte store.
template <int D>
__device__ __forceinline__ void store_o_partial(const float (&O_acc)[D / 2],
                                                const float (&inv_l)[2], const consumer_place &p,
                                                const work_tile &wt, const problem &pb) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int row = row_of(wt, p) + FRAG_ROW_STEP * h;
        if (row >= pb.N) continue;
        float *o_row =
            pb.O_part + ((size_t)wt.split * pb.rows + (size_t)wt.bh * pb.N + row) * D + 2 * p.t;
#pragma unroll
        for (int i = 0; i < D / FRAG_COLS; ++i)
            *reinterpret_cast<float2 *>(o_row + FRAG_COLS * i) = make_float2(
                O_acc[acc_index(i, h, 0)] * inv_l[h], O_acc[acc_index(i, h, 1)] * inv_l[h]);
    }
}

// The end of a work tile: O = O_acc / l (fp16) and LSE = (m + log2 l) ln 2 for the thread's two
// rows (those inside N); with split-KV, the key range's O (fp32) and LSE into the workspace. l >=
// 1 for a row with any key (its max contributes 2^0), so the fast reciprocal and logarithm
// (MUFU.RCP, MUFU.LG2) are accurate here; a row with no key in its range (causal, split) has l =
// 0 and m = -inf: O = 0 and LSE = -inf, which the merge weighs 0.
template <int D, int C, int BC>
__device__ __forceinline__ void epilogue(const float (&O_acc)[D / 2], const float (&m_i)[2],
                                         const float (&l_i)[2], const consumer_place &p,
                                         const smem_tiles &sm, const work_tile &wt,
                                         const problem &pb) {
    const bool split = pb.splits > 1;
    float *const lse = split ? pb.lse_part + (size_t)wt.split * pb.rows : pb.lse;
    float inv_l[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const float l = quad_sum(l_i[h]);
        inv_l[h] = l > 0.f ? __fdividef(1.f, l) : 0.f;
        const int row = row_of(wt, p) + FRAG_ROW_STEP * h;
        // m_i is in raw-score units: scale, then natural log.
        if (p.t == 0 && row < pb.N)
            lse[(size_t)wt.bh * pb.N + row] = (m_i[h] * pb.scale_log2 + __log2f(l)) * LN2;
    }
    if (split)
        store_o_partial<D>(O_acc, inv_l, p, wt, pb);
    else if constexpr (o_staged<D, C, BC>())
        store_o_staged<D>(O_acc, inv_l, p, wt, pb, sm.O + p.wg * o_stage_bytes<D>());
    else
        store_o_direct<D>(O_acc, inv_l, p, wt, pb);
}

// Ping-pong: the consumer warpgroups take turns at issuing their GEMMs, in a ring 0, 1, (2,)
// 0, ... A warpgroup waits for its turn (bar.sync on its turn barrier, its 128 threads), issues
// S_j and P_{j-1} V_{j-1}, then hands the turn on (bar.arrive on the next one's barrier: the
// other 128 of the 256). So one warpgroup's wgmma run while the others do their softmax, and
// the tensor pipe never waits for all softmaxes at once.
__device__ __forceinline__ void pingpong_wait_turn(int wg) {
    named_barrier_sync<TURN_THREADS>(NAMED_BARRIER_TURN_WG0 + wg);
}
template <int CONSUMERS>
__device__ __forceinline__ void pingpong_pass_turn(int wg) {
    named_barrier_arrive<TURN_THREADS>(NAMED_BARRIER_TURN_WG0 + (wg + 1) % CONSUMERS);
}

// Key tile j of work tile wt needs a mask when it is the tail tile, or causal with a key past
// the warpgroup's first row.
template <int BC>
__device__ __forceinline__ bool needs_mask(const problem &pb, const work_tile &wt,
                                           const consumer_place &p, int j) {
    const int key0 = key_tile_start<BC>(wt, j);
    return key0 + BC > pb.N || (pb.causal && key0 + BC - 1 > warpgroup_row0(wt, p));
}

// S_j has landed (its wgmma waited for): release K_j (ring slot st), and Q after its last use,
// mask where needed, and take the rows' new max (row_max). Neither O_acc nor P is touched: the
// P V before may still be in flight; r says what exp_pack and rescale_o do later.
template <int BC, int QB, int EARLY>
__device__ __forceinline__ void scores_done(float (&S)[BC / 2], float (&m_i)[2], row_step<EARLY> &r,
                                            const smem_tiles &sm, const consumer_place &p,
                                            const problem &pb, const work_tile &wt, int j, int st) {
    pin_registers(S);
    release(bar_at(sm, BAR_K_EMPTY + st), p);
    if (j == wt.n_tiles - 1)
        release(bar_at(sm, BAR_Q_EMPTY + pipeline_state<QB>{wt.t}.slot()), p);  // Q's last use
    if (needs_mask<BC>(pb, wt, p, j))
        mask_scores<BC>(S, p, row_of(wt, p), key_tile_start<BC>(wt, j), pb.N, pb.causal);
    row_max<BC, EARLY>(S, m_i, pb.scale_log2, r);
}

// The block's t-th work tile: wait until its Q has landed and its index is published. False
// means "stop": no work tiles are left.
template <int C, int BC, int QB>
__device__ __forceinline__ bool take_work(const smem_tiles &sm, const consumer_place &p,
                                          const problem &pb, int works, int t, work_tile &wt) {
    const pipeline_state<QB> q = {t};
    wait_full(sm, BAR_Q_FULL, q);
    // The mbarrier orders this read after the producer's write (and Q_EMPTY the next write after
    // it), but compute-sanitizer's racecheck does not model mbarriers for ordinary shared memory
    // accesses: one atomic read per warp, broadcast, keeps it clean.
    int w = 0;
    if (p.lane == 0) w = atomicAdd(&sm.work[q.slot()], 0);
    w = __shfl_sync(FULL_WARP, w, 0);
    if (w >= works) return false;
    wt = work_at<C, BC>(w, pb);
    wt.t = t;
    return true;
}

// A work tile's rows start from nothing: O = 0, m = -inf, l = 0.
template <int D>
__device__ __forceinline__ void start_rows(float (&O_acc)[D / 2], float (&m_i)[2],
                                           float (&l_i)[2]) {
#pragma unroll
    for (int i = 0; i < D / 2; ++i) O_acc[i] = 0.f;
    m_i[0] = m_i[1] = -INFINITY;
    l_i[0] = l_i[1] = 0.f;
}

/* ---- the consumers' schedules ---------------------------------------------------------------- */

enum { SCHEDULE_SERIAL, SCHEDULE_OVERLAPPED, SCHEDULE_PINGPONG };

// Serial (variant nooverlap): each work tile, each key tile in turn: S = Q K^T, softmax,
// O += P V, every wgmma waited for at once. The tensor pipe idles during this warpgroup's softmax
// unless the other warpgroup happens to fill it.
template <int D, int C, int BC>
__device__ __forceinline__ void consumer_serial(const smem_tiles &sm, const consumer_place &p,
                                                const problem &pb, int works) {
    constexpr int QB = q_buffers<D, C, BC>();
    work_tile wt;
    for (int t = 0, it = 0; take_work<C, BC, QB>(sm, p, pb, works, t, wt); ++t) {
        float O_acc[D / 2], m_i[2], l_i[2];
        start_rows<D>(O_acc, m_i, l_i);
        for (int j = 0; j < wt.n_tiles; ++j, ++it) {
            const kv_pipeline kv = {it};
            const int st = kv.slot();
            float S[BC / 2];
            uint32_t P[BC / 4];
            row_step<early_chunks<C>()> r;

            wait_full(sm, BAR_K_FULL, kv);
            issue_scores<D, C, BC>(S,
                                   scores_operands_of<D, C, BC>(sm, p, wt, k_stage<D, BC>(sm, st)));
            wgmma_wait<0>();
            scores_done<BC, QB>(S, m_i, r, sm, p, pb, wt, j, st);
            rescale_o<D>(O_acc, r.alpha);
            exp_pack<BC>(S, P, l_i, pb.scale_log2, r);

            wait_full(sm, BAR_V_FULL, kv);
            issue_pv<D, BC>(O_acc, P, pv_operand_of<D, BC>(sm, st), 1);
            wgmma_wait<0>();
            pin_registers(O_acc);
            release(bar_at(sm, BAR_V_EMPTY + st), p);
        }
        epilogue<D, C, BC>(O_acc, m_i, l_i, p, sm, wt, pb);
    }
}

// The overlapped schedule's steps, in the order consumer_overlapped() takes them. `it` counts the
// key tiles the block has gone through (the K/V ring's kv_pipeline), j is the key tile's index in
// its work tile. With PINGPONG, the warpgroups take turns at issuing their GEMMs.

// The block's first key tile: S = Q K_0^T only, nothing to overlap with yet; then its row max.
template <int D, int C, int BC, bool PINGPONG>
__device__ __forceinline__ void first_scores(float (&S)[BC / 2], float (&m_i)[2],
                                             row_step<early_chunks<C>()> &r, const smem_tiles &sm,
                                             const consumer_place &p, const problem &pb,
                                             const work_tile &wt) {
    const kv_pipeline first = {0};
    wait_full(sm, BAR_K_FULL, first);
    if (PINGPONG) pingpong_wait_turn(p.wg);
    issue_scores<D, C, BC>(
        S, scores_operands_of<D, C, BC>(sm, p, wt, k_stage<D, BC>(sm, first.slot())));
    if (PINGPONG) pingpong_pass_turn<C>(p.wg);
    wgmma_wait<0>();
    scores_done<BC, q_buffers<D, C, BC>()>(S, m_i, r, sm, p, pb, wt, 0, first.slot());
}

// A work tile whose last P V was issued while the next work tile's rows went on (end_rows): what
// its epilogue needs once that P V is done (retire_pv).
typedef struct {
    bool due;          // the P V in flight is this work tile's last: its epilogue comes next
    work_tile wt;      // the work tile
    float m[2], l[2];  // its rows' max and sum
} finished_tile;

// The P V of key tile it - 1 is done: P and O_acc are free. Release that tile's V; if that P V
// ended a work tile (done.due), write that work tile's O and LSE; then the softmax of key tile it
// goes on: O *= alpha, and P = fp16(2^(S - m)) with l (exp_pack). In one basic block, the
// compiler interleaves the exponentials (MUFU) with the rescale and the packing (LOG.md, step 18).
template <int D, int C, int BC>
__device__ __forceinline__ void retire_pv(float (&O_acc)[D / 2], uint32_t (&P)[BC / 4],
                                          const float (&S)[BC / 2], float (&l_i)[2],
                                          const row_step<early_chunks<C>()> &r,
                                          const finished_tile &done, const smem_tiles &sm,
                                          const consumer_place &p, const problem &pb, int it) {
    wgmma_wait<0>();
    pin_registers(O_acc);
    pin_registers(P);
    const kv_pipeline kv = {it};
    if (kv.count > 0) release(bar_at(sm, BAR_V_EMPTY + kv.previous().slot()), p);
    if (done.due) epilogue<D, C, BC>(O_acc, done.m, done.l, p, sm, done.wt, pb);
    rescale_o<D>(O_acc, r.alpha);  // (alpha is 0 on a work tile's first key tile: see issue_pv)
    exp_pack<BC>(S, P, l_i, pb.scale_log2, r);
}

// Work tile wt's rows end with the P V of its last key tile, about to be issued: keep their m
// and l for its epilogue (retire_pv, once that P V is done), and start the next work tile's rows
// (O_acc restarts in issue_pv).
__device__ __forceinline__ void end_rows(finished_tile &done, float (&m_i)[2], float (&l_i)[2],
                                         const work_tile &wt) {
    done.due = true;
    done.wt = wt;
    done.m[0] = m_i[0], done.m[1] = m_i[1], done.l[0] = l_i[0], done.l[1] = l_i[1];
    m_i[0] = m_i[1] = -INFINITY, l_i[0] = l_i[1] = 0.f;
}

// The key tile after key tile j of work tile wt: j + 1 of wt, or, after wt's last (its rows end:
// end_rows), key tile 0 of the block's next work tile (take_work). False when there is none: the
// block is done. The work tile's end is this branch, taken once per work tile; in the pass that
// the loop runs most it costs a compare.
template <int C, int BC, int QB>
__device__ __forceinline__ bool next_key_tile(const smem_tiles &sm, const consumer_place &p,
                                              const problem &pb, int works, const work_tile &wt,
                                              int j, work_tile &next, int &next_j,
                                              finished_tile &done, float (&m_i)[2],
                                              float (&l_i)[2]) {
    next = wt;
    next_j = j + 1;
    if (next_j == wt.n_tiles) {
        end_rows(done, m_i, l_i, wt);
        next_j = 0;
        if (!take_work<C, BC, QB>(sm, p, pb, works, wt.t + 1, next)) return false;
    }
    return true;
}

// One turn: issue S = Q K^T of the next key tile (work tile `next`, the block's (it + 1)-th) and
// O += P V of key tile it (index j in its work tile), two wgmma groups back to back. Returns the
// ring slot of the K it reads.
template <int D, int C, int BC, bool PINGPONG>
__device__ __forceinline__ int issue_turn(float (&S)[BC / 2], float (&O_acc)[D / 2],
                                          const uint32_t (&P)[BC / 4], const smem_tiles &sm,
                                          const consumer_place &p, const work_tile &next, int it,
                                          int j) {
    const kv_pipeline kv = {it}, kv_next = {it + 1};
    const int st = kv.slot(), next_st = kv_next.slot();

    const scores_operands next_scores =
        scores_operands_of<D, C, BC>(sm, p, next, k_stage<D, BC>(sm, next_st));
    const uint64_t V_desc = pv_operand_of<D, BC>(sm, st);
    wait_full(sm, BAR_K_FULL, kv_next);
    if (PINGPONG) pingpong_wait_turn(p.wg);
    issue_scores<D, C, BC>(S, next_scores);
    wait_full(sm, BAR_V_FULL, kv);
    issue_pv<D, BC>(O_acc, P, V_desc, j > 0);
    if (PINGPONG) pingpong_pass_turn<C>(p.wg);
    return next_st;
}

// The block's last key tile (the it-th): O += P V only, then the last work tile's epilogue.
template <int D, int C, int BC, bool PINGPONG>
__device__ __forceinline__ void last_pv(float (&O_acc)[D / 2], const uint32_t (&P)[BC / 4],
                                        const float (&m_i)[2], const float (&l_i)[2],
                                        const smem_tiles &sm, const consumer_place &p,
                                        const problem &pb, const work_tile &wt, int it, int j) {
    const kv_pipeline kv = {it};
    const int st = kv.slot();
    wait_full(sm, BAR_V_FULL, kv);
    if (PINGPONG) pingpong_wait_turn(p.wg);
    issue_pv<D, BC>(O_acc, P, pv_operand_of<D, BC>(sm, st), j > 0);
    if (PINGPONG) pingpong_pass_turn<C>(p.wg);
    wgmma_wait<0>();
    pin_registers(O_acc);
    release(bar_at(sm, BAR_V_EMPTY + st), p);
    epilogue<D, C, BC>(O_acc, m_i, l_i, p, sm, wt, pb);
}

// Overlapped (default; nopingpong without the turn-taking): one pipeline over every key tile the
// block consumes, across its work tiles. Each turn issues S = Q K^T of the next key tile with
// O += P V of this one, and the softmax of the next key tile starts while that P V is still in
// flight (FlashAttention-3's intra-warpgroup overlap): its row max reads S alone and leaves O_acc
// and P to the wgmma. The P V's wait opens the next pass (retire_pv; LOG.md, step 7), and there
// the exponentials, O's rescale and P's packing run side by side (step 18). When a P V ends a
// work tile, the S issued beside it is already the next work tile's first (its Q is in the other
// Q buffer), and the finished work tile's O is written while the other warpgroups' GEMMs run.
template <int D, int C, int BC, bool PINGPONG>
__device__ __forceinline__ void consumer_overlapped(const smem_tiles &sm, const consumer_place &p,
                                                    const problem &pb, int works) {
    constexpr int QB = q_buffers<D, C, BC>();
    work_tile wt;
    if (!take_work<C, BC, QB>(sm, p, pb, works, 0, wt)) return;
    // Warpgroup 0 takes the first turn: the last warpgroup hands it over before its own first wait.
    if (PINGPONG && p.wg == C - 1) pingpong_pass_turn<C>(p.wg);

    float O_acc[D / 2], S[BC / 2], m_i[2], l_i[2];
    uint32_t P[BC / 4];
    row_step<early_chunks<C>()> r;
    start_rows<D>(O_acc, m_i, l_i);
    first_scores<D, C, BC, PINGPONG>(S, m_i, r, sm, p, pb, wt);

    // A pass starts with S holding the scores of key tile j of work tile wt, the block's it-th,
    // m_i their row max and r the rest of row_max's results, while the P V of the key tile before
    // it may still run. If that P V ends a work tile (done.due), `done` is that work tile.
    finished_tile done = {false, wt, {0.f, 0.f}, {0.f, 0.f}};
    int it = 0, j = 0;
    for (;; ++it) {
        retire_pv<D, C, BC>(O_acc, P, S, l_i, r, done, sm, p, pb, it);
        done.due = false;

        work_tile next;  // the work tile of the next key tile
        int next_j;
        if (!next_key_tile<C, BC, QB>(sm, p, pb, works, wt, j, next, next_j, done, m_i, l_i)) break;
        const int next_st = issue_turn<D, C, BC, PINGPONG>(S, O_acc, P, sm, p, next, it, j);
        wgmma_wait<1>();  // S of the next key tile is done; P V may still run
        scores_done<BC, QB>(S, m_i, r, sm, p, pb, next, next_j, next_st);
        wt = next;
        j = next_j;
    }
    // (next_key_tile ended wt's rows: their m and l are done's)
    last_pv<D, C, BC, PINGPONG>(O_acc, P, done.m, done.l, sm, p, pb, done.wt, it, j);

    // Every turn was handed on; warpgroup 0 takes the last warpgroup's final hand-over, so that no
    // arrival is left pending on its barrier.
    if (PINGPONG && p.wg == 0) pingpong_wait_turn(p.wg);
}

// Where this consumer thread sits (consumer_place). The warpgroup index is read from lane 0, so
// that the compiler knows it is one value per warp and keeps the addresses and descriptors built
// from it in uniform registers, where wgmma takes them (LOG.md, step 8).
__device__ __forceinline__ consumer_place consumer_place_of_thread() {
    consumer_place p;
    p.wg = __shfl_sync(FULL_WARP, (int)threadIdx.x / WARPGROUP, 0) - PRODUCER_WARPGROUPS;
    p.warp = (threadIdx.x / WARP_SIZE) % WARPS_PER_WARPGROUP;
    p.lane = threadIdx.x % WARP_SIZE;
    p.g = p.lane / QUAD;
    p.t = p.lane % QUAD;
    return p;
}

// One consumer thread: its place in the block, then its schedule over the block's work tiles.
template <int D, int C, int BC, int SCHEDULE>
__device__ __forceinline__ void consumer(const smem_tiles &sm, const problem &pb, int works) {
    const consumer_place p = consumer_place_of_thread();
    if (SCHEDULE == SCHEDULE_SERIAL)
        consumer_serial<D, C, BC>(sm, p, pb, works);
    else
        consumer_overlapped<D, C, BC, (SCHEDULE == SCHEDULE_PINGPONG && C > 1)>(sm, p, pb, works);
    // The O stores still in flight read the shared memory the block is about to give up.
    if (o_staged<D, C, BC>() && p.lane == 0) bulk_wait<false>();
}

/* ---- the kernel ------------------------------------------------------------------------------ */

// Every buffer's "full" barrier waits for the producer's one expect_tx arrival (and the bytes);
// every "empty" one for one arrival per consumer warp. Thread 0 initialises them.
template <int D, int C, int BC>
__device__ __forceinline__ void init_barriers(const smem_tiles &sm) {
    constexpr int CONSUMER_WARPS = C * WARPS_PER_WARPGROUP;
    for (int qs = 0; qs < q_buffers<D, C, BC>(); ++qs) {
        mbar_init(bar_at(sm, BAR_Q_FULL + qs), 1);
        mbar_init(bar_at(sm, BAR_Q_EMPTY + qs), CONSUMER_WARPS);
    }
    for (int st = 0; st < STAGES; ++st) {
        mbar_init(bar_at(sm, BAR_K_FULL + st), 1);
        mbar_init(bar_at(sm, BAR_V_FULL + st), 1);
        mbar_init(bar_at(sm, BAR_K_EMPTY + st), CONSUMER_WARPS);
        mbar_init(bar_at(sm, BAR_V_EMPTY + st), CONSUMER_WARPS);
    }
    fence_barrier_init();  // visible to the copy engine (the async proxy)
}

// Q, K, V, O: [B, H, N, D] fp16 (the tensor maps describe them as [B*H, N, D]; O is written
// through tmO where o_staged(), else directly); the rest of the problem in prob (its tmO is set
// here). works = B * H * ceil(N / BR) * splits work tiles. SPLIT: compiled for split-KV; without
// it splits is the constant 1, and the work tiles' decoding, the producer's skipping of empty
// ones and the epilogue's fp32 path fold away.
template <int D, int C, int BC, int SCHEDULE, bool SPLIT>
__global__ void __launch_bounds__(block_threads<C>(), 1)
    attention_kernel(const __grid_constant__ CUtensorMap tmQ,
                     const __grid_constant__ CUtensorMap tmK,
                     const __grid_constant__ CUtensorMap tmV,
                     const __grid_constant__ CUtensorMap tmO, const problem prob, int works,
                     int *next_work) {
#if HOPPER_KERNELS
    extern __shared__ unsigned char smem_raw[];
    const smem_tiles sm = carve_smem<D, C, BC>(smem_raw);
    if (threadIdx.x == 0) {
        init_barriers<D, C, BC>(sm);
        prefetch_tensor_map(&tmQ), prefetch_tensor_map(&tmK), prefetch_tensor_map(&tmV);
    }
    __syncthreads();  // the barriers are initialised before anyone waits on or signals them
    // PDL: the merge (split-KV) or the next call's kernel may take the SMs this grid leaves
    // idle, and it waits for this one; this one reads Q, K, V and writes O only after the kernel
    // ahead of it is done.
    let_next_kernel_start();
    wait_for_previous_kernel();

    problem pb = prob;
    if (!SPLIT) {  // one range: all of a query tile's keys
        pb.splits = 1, pb.split_tiles = INT_MAX;
        pb.per_query_tile.mul = 1, pb.per_query_tile.shift = 0;  // n / 1
    }
    pb.tmO = &tmO;
    if (threadIdx.x < PRODUCER_WARPGROUPS * WARPGROUP) {
        registers_decrease<producer_regs<C>()>();
        if (threadIdx.x == 0) producer<D, C, BC>(sm, &tmQ, &tmK, &tmV, pb, works, next_work);
    } else {
        registers_increase<consumer_regs<C>()>();
        consumer<D, C, BC, SCHEDULE>(sm, pb, works);
    }
#else
    (void)tmQ, (void)tmK, (void)tmV, (void)tmO, (void)prob, (void)works, (void)next_work;
#endif
}

// Split-KV's merge (stage 5's combine_row), launched with PDL right behind the attention kernel:
// its blocks are placed on idle SMs (or as attention blocks leave) while that kernel runs, and
// start merging the moment it ends.
template <int D>
__global__ void __launch_bounds__(COMBINE_THREADS) combine_kernel_pdl(const combine_params p) {
#if HOPPER_KERNELS
    let_next_kernel_start();
    wait_for_previous_kernel();  // the key ranges' O and LSE are written
    int lane;
    const long long row = combine_thread_row<D>(&lane);
    if (row < p.rows) combine_row<D>(p, row, lane);
#else
    (void)p;
#endif
}

/* ---- launcher -------------------------------------------------------------------------------- */

enum {
    VARIANT_DEFAULT = 0,
    VARIANT_NOPERSISTENT,
    VARIANT_NOPINGPONG,
    VARIANT_NOOVERLAP,
    VARIANT_NOSPLIT,
    VARIANT_NOPDL,
    VARIANTS
};

// [B*H, N, D] fp16 seen in boxes of [1, rows, 64] (one 128-byte-swizzled slab); rows past N
// read as zeros.
static cudaError_t tensor_map(CUtensorMap *map, const void *base, const attn_shape *s, int rows) {
    PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
    if (!encode) return cudaErrorSymbolNotFound;
    const cuuint64_t dims[3] = {(cuuint64_t)s->D, (cuuint64_t)s->N, (cuuint64_t)s->B * s->H};
    const cuuint64_t strides[2] = {(cuuint64_t)s->D * 2, (cuuint64_t)s->N * s->D * 2};
    const cuuint32_t box[3] = {SLAB_COLS, (cuuint32_t)rows, 1};
    const cuuint32_t elem_strides[3] = {1, 1, 1};
    const CUresult r =
        encode(map, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 3, (void *)base, dims, strides, box,
               elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
               CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

// Consumer warpgroups for this shape (see THREE_CONSUMERS_MIN_N_CAUSAL), and one on grids too
// small for two: where 128-row work tiles cut down to one key tile each (split-KV's finest cut)
// still leave SMs idle, 64-row work tiles make twice as many, each with half the work on its
// critical path (B = H = 1, N = 1024: 128 work tiles for 132 SMs instead of 64). The variant
// nosplit keeps two or three.
static int consumers_for(const attn_shape *s, const attn_device *dev, int variant) {
    const long long finest =
        (long long)s->B * s->H * ceil_div(s->N, block_rows<2>()) * ceil_div(s->N, KEY_TILE_SHORT);
    if (variant != VARIANT_NOSPLIT && finest < dev->sm_count) return 1;
    return s->D == 64 && (!s->causal || s->N >= THREE_CONSUMERS_MIN_N_CAUSAL) ? 3 : 2;
}

// Whether the kernels on this device are the sm_90a ones (a compute_75 PTX build JIT-compiled
// on an H100 has only the empty kernel).
static int hopper_code_here(void) {
    cudaFuncAttributes fa;
    if (cudaFuncGetAttributes(
            &fa, (const void *)attention_kernel<64, 2, KEY_TILE_SHORT, SCHEDULE_PINGPONG, false>) !=
        cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return fa.ptxVersion >= 90 && fa.binaryVersion >= 90;
}

static const char *attention_unsupported(const attn_shape *s, const attn_device *dev, int variant) {
    if (s->D != 64 && s->D != 128) return "head dim must be 64 or 128";
    if (!(s->scale > 0.f)) return "scale must be positive";
    if (s->B < 1 || s->H < 1 || s->N < 1) return "B, H and N must be >= 1";
    if (variant < 0 || variant >= VARIANTS) return "unknown variant";
    if (dev->cc != 90) return "needs a Hopper GPU (sm_90): TMA, wgmma and setmaxnreg";
    if (!hopper_code_here())
        return "this build has no sm_90a code (build on the Hopper GPU, or the fat build)";
    // The kernel's shared memory layout is fixed when it is compiled (q_buffers(), o_staged()):
    // a smaller limit (--smem-limit) makes the shape unsupported, it picks no other layout.
    const int C = consumers_for(s, dev, variant);
    const size_t smem =
        C == 1        ? (s->D == 128 ? smem_bytes<128, 1, KEY_TILE_SHORT>()
                                     : smem_bytes<64, 1, KEY_TILE_SHORT>())
        : s->D == 128 ? (key_tile_for(s, C) == KEY_TILE_LONG ? smem_bytes<128, 2, KEY_TILE_LONG>()
                                                             : smem_bytes<128, 2, KEY_TILE_SHORT>())
        : C == 3      ? smem_bytes<64, 3, KEY_TILE_SHORT>()
                      : smem_bytes<64, 2, KEY_TILE_SHORT>();
    if (smem > dev->smem_per_block) {
        static char why_smem[96];
        snprintf(why_smem, sizeof why_smem, "needs %zu bytes of shared memory per block at D = %d",
                 smem, s->D);
        return why_smem;
    }
    const int BR = C * WGMMA_M;  // block_rows<C>()
    if ((long long)s->B * s->H * ((s->N + BR - 1) / BR) > (long long)INT_MAX)
        return "too many work tiles (B * H * ceil(N / rows per tile) must be below 2^31)";
    return NULL;
}

// Split-KV, by stage 5's rule (choose_splits): key ranges per query tile where the work tiles
// leave SMs idle or make a short last wave, with one slot per SM (the persistent blocks). Decided
// once per shape and device (the last one is kept: a benchmark launches the same shape many
// times).
// What a key range costs besides its key tiles (Q's copy, the first K tile's wait, the fp32 O
// and LSE stores), in key tiles: stage 5's estimate (LOG.md, step 15).
constexpr double SPLIT_OVERHEAD_TILES = 1.0;
typedef struct {
    attn_shape shape;  // key: the shape (not its scale), SMs, variant
    int sm_count, variant;
    int consumers, splits, split_tiles;  // value: consumers_for(), key ranges
} split_plan;

static split_plan plan_splits(const attn_shape *s, const attn_device *dev, int variant) {
    static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    static split_plan last;  // last.splits == 0: none yet
    split_plan p;
    memset(&p, 0, sizeof p);
    p.shape = *s, p.shape.scale = 0.f, p.sm_count = dev->sm_count, p.variant = variant;
    pthread_mutex_lock(&lock);
    const bool hit = last.splits > 0 && last.shape.B == s->B && last.shape.H == s->H &&
                     last.shape.N == s->N && last.shape.D == s->D &&
                     last.shape.causal == s->causal && last.sm_count == p.sm_count &&
                     last.variant == variant;
    if (hit) p = last;
    pthread_mutex_unlock(&lock);
    if (hit) return p;
    p.consumers = consumers_for(s, dev, variant);
    const int BR = p.consumers * WGMMA_M;  // block_rows<C>()
    const int BC = key_tile_for(s, p.consumers);
    p.splits = 1, p.split_tiles = ceil_div(s->N, BC);
    if (variant != VARIANT_NOSPLIT && dev->sm_count > 0)
        p.splits = choose_splits(s, BR, BC, s->causal, dev->sm_count, SPLIT_OVERHEAD_TILES,
                                 &p.split_tiles);
    pthread_mutex_lock(&lock);
    last = p;
    pthread_mutex_unlock(&lock);
    return p;
}

// The workspace: the work tile counter of the persistent blocks (zeroed before each launch),
// then with split-KV the key ranges' O_part [splits, B * H, N, D] and lse_part [splits, B * H, N],
// fp32, 16-byte aligned.
constexpr size_t PART_ALIGN = 16;
static size_t attention_workspace_bytes(const attn_shape *s, const attn_device *dev, int variant) {
    if (attention_unsupported(s, dev, variant)) return sizeof(int);  // forward() reports it
    const split_plan sp = plan_splits(s, dev, variant);
    if (sp.splits == 1) return sizeof(int);
    return PART_ALIGN + (size_t)sp.splits * s->B * s->H * s->N * (s->D + 1) * sizeof(float);
}

typedef struct {
    const void *Q, *K, *V;  // [B, H, N, D] fp16
    __half *O;              // [B, H, N, D] fp16
    float *lse;             // [B, H, N]
    int *next_work;         // the persistent blocks' work tile counter (the workspace)
    float *O_part;          // split-KV's partial results (the workspace after the counter)
    split_plan split;
    int persistent_blocks;  // one per SM, or 0: one block per work tile (variant nopersistent)
    bool pdl;               // launched with PDL (all but variant nopdl)
    cudaStream_t stream;
} launch_args;

// A launch's configuration, with programmatic stream serialization when `pdl` (PDL:
// let_next_kernel_start()); `attr` is where the configuration points for it.
static cudaLaunchConfig_t launch_config(unsigned blocks, int threads, size_t smem,
                                        const launch_args *a, cudaLaunchAttribute *attr) {
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(blocks), config.blockDim = dim3((unsigned)threads);
    config.dynamicSmemBytes = smem, config.stream = a->stream;
    attr->id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr->val.programmaticStreamSerializationAllowed = 1;
    config.attrs = attr, config.numAttrs = a->pdl ? 1 : 0;
    return config;
}

typedef void (*kernel_fn)(const CUtensorMap, const CUtensorMap, const CUtensorMap,
                          const CUtensorMap, const problem, int, int *);

template <int D, int C, int BC, int SCHEDULE>
static cudaError_t launch(const attn_shape *s, const launch_args *a) {
    constexpr int BR = block_rows<C>();
    CUtensorMap tmQ, tmK, tmV, tmO;
    ATTN_TRY(tensor_map(&tmQ, a->Q, s, BR));
    ATTN_TRY(tensor_map(&tmK, a->K, s, BC));
    ATTN_TRY(tensor_map(&tmV, a->V, s, BC));
    ATTN_TRY(tensor_map(&tmO, a->O, s, WARP_ROWS));  // a warp's rows (unused unless O is staged)
    const int smem = smem_bytes<D, C, BC>();
    const kernel_fn kernel = a->split.splits > 1 ? attention_kernel<D, C, BC, SCHEDULE, true>
                                                 : attention_kernel<D, C, BC, SCHEDULE, false>;
    ATTN_TRY(cudaFuncSetAttribute((const void *)kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  smem));
    const int works = s->B * s->H * ceil_div(s->N, BR) * a->split.splits;
    const int blocks = a->persistent_blocks > 0 && a->persistent_blocks < works
                           ? a->persistent_blocks
                           : works;  // (with one block per work tile the counter is never read)
    if (blocks < works) ATTN_TRY(cudaMemsetAsync(a->next_work, 0, sizeof(int), a->stream));
    problem pb;
    memset(&pb, 0, sizeof pb);
    pb.N = s->N, pb.causal = s->causal;
    pb.splits = a->split.splits, pb.split_tiles = a->split.split_tiles;
    pb.per_head = make_fast_divisor((uint32_t)(ceil_div(s->N, BR) * pb.splits));
    pb.per_query_tile = make_fast_divisor((uint32_t)pb.splits);
    pb.scale_log2 = s->scale * LOG2E;  // log2(e) folded into the scale
    pb.O = a->O, pb.lse = a->lse;
    pb.rows = (long long)s->B * s->H * s->N;
    pb.O_part = a->O_part;
    pb.lse_part = a->O_part ? a->O_part + (size_t)pb.splits * pb.rows * D : NULL;
    cudaLaunchAttribute attr;
    const cudaLaunchConfig_t config = launch_config(blocks, block_threads<C>(), smem, a, &attr);
    ATTN_TRY(cudaLaunchKernelEx(&config, kernel, tmQ, tmK, tmV, tmO, pb, works, a->next_work));
    if (pb.splits == 1) return cudaSuccess;

    // Merge the key ranges (stage 5's merge; causal query tiles have fewer ranges).
    const combine_params cp = {pb.O_part, pb.lse_part, a->O,      a->lse,         pb.rows,  s->N,
                               BR,        BC,          pb.splits, pb.split_tiles, s->causal};
    const unsigned merge_blocks = (unsigned)ceil_div(pb.rows, combine_rows_per_block<D>());
    const cudaLaunchConfig_t merge = launch_config(merge_blocks, COMBINE_THREADS, 0, a, &attr);
    ATTN_TRY(cudaLaunchKernelEx(&merge, combine_kernel_pdl<D>, cp));
    return cudaSuccess;
}

template <int SCHEDULE>
static cudaError_t launch_schedule(const attn_shape *s, const launch_args *a) {
    if (a->split.consumers == 1)  // (short key tiles: key_tile_for())
        return s->D == 128 ? launch<128, 1, KEY_TILE_SHORT, SCHEDULE>(s, a)
                           : launch<64, 1, KEY_TILE_SHORT, SCHEDULE>(s, a);
    if (s->D == 128)
        return key_tile_for(s, a->split.consumers) == KEY_TILE_LONG
                   ? launch<128, 2, KEY_TILE_LONG, SCHEDULE>(s, a)
                   : launch<128, 2, KEY_TILE_SHORT, SCHEDULE>(s, a);
    if (a->split.consumers == 3) return launch<64, 3, KEY_TILE_SHORT, SCHEDULE>(s, a);
    return launch<64, 2, KEY_TILE_SHORT, SCHEDULE>(s, a);
}

static cudaError_t attention_forward(const attn_shape *s, const attn_device *dev, const void *Q,
                                     const void *K, const void *V, void *O, float *lse,
                                     void *workspace, int variant, cudaStream_t stream) {
    const char *why = attention_unsupported(s, dev, variant);
    if (why) {
        fprintf(stderr, "stage6_hopper: %s\n", why);
        return cudaErrorInvalidValue;
    }
    // TMA reads from 16-byte aligned addresses; the O stores are 16 bytes wide.
    if (((uintptr_t)Q | (uintptr_t)K | (uintptr_t)V | (uintptr_t)O) % 16) {
        fprintf(stderr, "stage6_hopper: Q, K, V and O must be 16-byte aligned\n");
        return cudaErrorMisalignedAddress;
    }
    launch_args a;
    memset(&a, 0, sizeof a);
    a.Q = Q, a.K = K, a.V = V, a.O = (__half *)O, a.lse = lse, a.next_work = (int *)workspace;
    a.split = plan_splits(s, dev, variant);
    if (a.split.splits > 1) a.O_part = (float *)((char *)workspace + PART_ALIGN);
    a.persistent_blocks = variant == VARIANT_NOPERSISTENT ? 0 : dev->sm_count;
    a.pdl = variant != VARIANT_NOPDL;
    a.stream = stream;
    switch (variant) {
        case VARIANT_NOOVERLAP:
            return launch_schedule<SCHEDULE_SERIAL>(s, &a);
        case VARIANT_NOPINGPONG:
            return launch_schedule<SCHEDULE_OVERLAPPED>(s, &a);
        default:
            return launch_schedule<SCHEDULE_PINGPONG>(s, &a);
    }
}

extern "C" const attn_stage attn_this_stage = {
    "stage6_hopper",
    "FA3-style on Hopper: TMA bulk copies on mbarriers, wgmma from shared-memory descriptors, "
    "producer/consumer warpgroups with setmaxnreg",
    ATTN_F16,
    "default,nopersistent,nopingpong,nooverlap,nosplit,nopdl",
    attention_unsupported,
    attention_workspace_bytes,
    attention_forward,
    NULL,  // a forward-only stage: no backward pass
    NULL,
};
