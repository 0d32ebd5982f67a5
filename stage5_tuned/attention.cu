/*
 * stage5_tuned: FlashAttention-2, written the way FlashAttention-2 writes it.
 *
 * What this stage adds over stage 4 (WMMA), one idea per bullet (README.md has the log):
 *  - Tensor cores through inline-PTX mma.sync m16n8k16 (two m16n8k8 on sm_75), fed by ldmatrix.
 *    Unlike WMMA, the fragment layouts are documented, so we can compute on them directly, and
 *    ldmatrix can hand each operand over in exactly the registers the mma reads (no moves).
 *  - S and P never leave registers: the accumulator layout of S = Q K^T is the A-operand layout
 *    of O += P V, so P is packed to half2 in place. Row max and row sum: 2 shuffles per row.
 *  - Shared memory is XOR-swizzled (16-byte chunk c of row r lives at chunk c ^ (r % 8)):
 *    ldmatrix and the 16-byte tile stores are free of bank conflicts with no padding.
 *  - Loads overlap compute: V_j arrives while S = Q K_j^T runs, K_{j+1} while O += P V_j runs
 *    (and the softmax, at D = 64); cp.async on sm_80+, staged through registers on sm_75. Two
 *    barriers per key tile.
 *  - exp2 with log2(e) folded into the scale (one FFMA + one MUFU.EX2 per score); causal key
 *    tiles past the diagonal are skipped and only the diagonal and tail tiles pay for a mask.
 *  - From N = 32,768 keys on, O is rescaled only when some row's max grows (one warp vote per
 *    key tile): on long rows nearly every tile skips it, with bit-identical results.
 *  - Tile sizes per head dim, per arch and per shared memory (FA2's on sm_80+: BR x BC =
 *    128 x 64 at D = 128, 128 x 128 at D = 64, 4 warps of 32 query rows). D = 96 and 256 are
 *    compiled too (MODEL kernels); any other D runs in the next, its columns past D masked.
 *  - Split-KV: when B * H * ceil(N / BR) blocks leave SMs idle (B = H = 1, N = 4096: 32 blocks
 *    for 132 SMs x 2) or a short last wave (N = 49,152: 1.45 waves), each query tile's keys are
 *    cut into ranges, each block writes an fp32 partial O and its LSE, and combine_kernel
 *    merges them. The split count comes from a simulated wave efficiency (SM count and blocks
 *    per SM of the device; causal shapes cut by work).
 * Expected gain: roughly 2x over stage 4, to within about 10% of PyTorch's FLASH_ATTENTION
 * backend (a prediction; README.md gets the measured numbers).
 *
 * Run:  make build && build/stage5_tuned --seq 16384 --heads 16 --dim 128 --causal --bench
 *       python3 -m tools.compare_fa2               (side by side with FA2, same process run)
 * Variants (--variant): default, noswizzle, single_stage, noskip, eager_rescale, lazy_rescale,
 * nosplit: each switches one lesson off (lazy_rescale: on for every N).
 *
 * NOTE: what is left is the instruction set. mma.sync is Ampere's tensor-core path; on Hopper
 * it reaches only part of the chip's matrix rate. Going further needs wgmma (asynchronous
 * warpgroup MMA, operands straight from shared memory), TMA bulk copies and warp
 * specialisation: FlashAttention-3, stage 6 (Hopper only).
 */

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "attention.h"
#include "device/sm80.cuh"      // mma.sync, ldmatrix, cp.async, the fragment vocabulary
#include "device/split_kv.cuh"  // split-KV: key ranges, their merge, how many

/* ---- tunables -------------------------------------------------------------------------------- */

// A tile configuration: BR query rows per block, BC keys per K/V tile, WARPS warps per block.
// Each warp owns BR / WARPS query rows (a multiple of 16: one m16 slice per MMA row block) and
// works on them alone, so the only block-wide barriers are the two per key tile that hand
// K_smem and V_smem over. Shared memory: (BR + 2 BC) * D halves.
typedef struct {
    int BR, BC, WARPS;
} tile_config;

// sm_80+ (A100, H100): FA2's tiles. 4 warps x 32 rows (two m16 slices per warp, so each K/V
// fragment read from shared memory feeds two MMAs); 64 keys per tile. D = 128: Q 32 KB +
// K 16 KB + V 16 KB = 64 KB, two blocks per SM (about 250 registers per thread allow no more).
constexpr tile_config SM80_D128 = {128, 64, 4};
// D = 64: O_acc is half as big, so twice the keys per tile (fewer barriers and softmax
// rounds per key): 48 KB. Here S holds 128 registers, so Q is re-read from shared memory.
constexpr tile_config SM80_D64 = {128, 128, 4};
// D = 128 when two 64 KB blocks do not fit on one SM (L4, RTX 40xx: about 100 KB per SM):
// 32-key tiles, 48 KB per block, two blocks per SM (FA2 makes the same choice on sm_8x).
constexpr tile_config SMALL_SMEM_D128 = {128, 32, 4};
// sm_75 (T4): no cp.async, so the prefetched tile waits in registers; 16 rows per warp leave
// room for it (and for Q in registers). 48 KB at D = 128 fits the T4's 64 KB.
constexpr tile_config SM75 = {64, 64, 4};
// Local windows and softcap (the MODEL kernels that hold the mask's bounds and the cap's factor
// through the key loop), sm_80+: 32-key tiles at D = 64, 96, 128. At FA2's tiles they spill
// (LOG.md).
constexpr tile_config WINDOW_SOFTCAP_TILES = SMALL_SMEM_D128;
// D = 256 (MODEL kernels only): O_acc alone is 128 registers per thread at 16 rows per warp, so 4
// warps of 16 rows, FA2's tiles: 64 keys where 96 KB fit (every sm_80+ GPU: two blocks per SM on
// an H100 or H200, one elsewhere), else 32 keys in 64 KB (the local windows and softcap on sm_80+;
// a T4's 64 KB imitated on them). sm_75: 16 keys, 48 KB; at 32 keys the K/V tile staged in
// registers (32 of them) spills beside O_acc there (100 bytes).
constexpr tile_config SM80_D256 = {64, 64, 4};
constexpr tile_config SMALL_D256 = {64, 32, 4};
constexpr tile_config SM75_D256 = {64, 16, 4};
// The window and softcap kernels' tiles on sm_80+ at head dim D. They run every shape (no window:
// the causal rule or none; no cap): at D = 96 and 256 also what their one tile config does not fit.
static __host__ __device__ constexpr tile_config window_tiles(int d) {
    return d == 256 ? tile_config{SMALL_D256.BR, SMALL_D256.BC, SMALL_D256.WARPS}
                    : tile_config{WINDOW_SOFTCAP_TILES.BR, WINDOW_SOFTCAP_TILES.BC,
                                  WINDOW_SOFTCAP_TILES.WARPS};
}
// The tiles sm_75 code runs at head dim D (kernel_arch: the PTX arch); at D = 96 and 256, and for
// windows and softcap, no other code does (choose_tiles).
static __host__ __device__ constexpr tile_config sm75_tiles(int d) {
    return d == 256 ? tile_config{SM75_D256.BR, SM75_D256.BC, SM75_D256.WARPS}
                    : tile_config{SM75.BR, SM75.BC, SM75.WARPS};
}

// The head dims compiled: 64 and 128 (every variant), 96 and 256 (the MODEL kernels). Every other
// D of the contract (a multiple of 8 from 32 to 256) runs in the next compiled one, its columns
// at or past D masked in the kernel: loads zero-fill them, O's stores skip them.
static __host__ __device__ constexpr int compiled_d(int d) {
    return d <= 64 ? 64 : d <= 96 ? 96 : d <= 128 ? 128 : 256;
}
// A shared-memory tile's row, in halves: D rounded up to a power of two (D = 96: 128). The
// swizzle's XOR arithmetic (smem_offset, the ldmatrix lane addresses) holds for rows of a power of
// two bytes only; a 96-wide row's 4 pad chunks are zero-filled and never read.
static __host__ __device__ constexpr int row_halves(int d) {
    return d <= 64 ? 64 : d <= 128 ? 128 : 256;
}

// Q fragments stay in registers for the whole key loop when Q + S + O_acc need at most this
// many 32-bit registers per thread (255 is the hardware limit; the rest holds addresses, K/V
// fragments and, on sm_75, the staged tile). Otherwise they are re-read from Q_smem with
// ldmatrix for every key tile, as FA2 does.
constexpr int Q_REGS_BUDGET = 192;

// What models feed (bf16, GQA, strides, N_k != N, packed batches) runs in instantiations of its
// own (MODEL), of the default tiles with eager rescaling only: the plain case keeps kernels whose
// addresses are compile-time multiples of D, and the ablation variants take the plain case only. A
// MODEL tile's rows lie within 2^31 elements of its first (tile_issue's 32-bit row offsets): row
// strides up to INT_MAX / MAX_TILE_ROWS, MAX_TILE_ROWS at least every tile's BR and BC.
constexpr int MAX_TILE_ROWS = 128;

// Rescale only when a row's max grows (LAZY, see the softmax) from this many keys on. Skipping
// needs a branch, and the rescale before it can no longer hide among the exponentials and the
// P V mma: a cost while most tiles still raise some max (a warp's 32 rows at tile j: about
// 1 - (1 - 1/j)^32 of the time), a gain once almost none do. Measured slower than eager at
// N <= 8192, faster at 262,144 (LOG.md, step 8; README.md).
constexpr int LAZY_MIN_N = 32768;

// Where K_{j+1} is issued (sm_80+): right after the barrier that frees K_smem, before the
// softmax, as FA2 does (the copy then has the softmax and P V to land), or after the softmax
// (P V only). Early keeps the copy's addresses live through the softmax, the register peak. At
// D = 64 that costs nothing and measured faster; at D = 128, where O_acc is twice as big, the
// registers it takes cost more than the copy's head start (LOG.md, step 10). sm_75 stages the
// copy in registers, so it issues late there. sm_100 (B200, B300) and sm_120 (RTX 50) code issues
// K_{j+1} late at every D and reads the A/V lane offset afresh for P V (LANE_OFFSET_PER_TILE):
// there ptxas spills with either held through the key loop (LOG.md, step 17); not measured on
// those GPUs.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1000
constexpr int EARLY_K_MAX_D = 0;
constexpr bool LANE_OFFSET_PER_TILE = true;
#else
constexpr int EARLY_K_MAX_D = 64;
constexpr bool LANE_OFFSET_PER_TILE = false;
#endif

/* ---- device helpers -------------------------------------------------------------------------- */

// The instructions (mma.sync m16n8k16, ldmatrix, cp.async) and their shapes are wrapped in
// common/device/sm80.cuh (mma_16816, ldmatrix_x4, cp_async_16, ...), the accumulator fragment's
// layout is described in common/device/warp.cuh; stage 7 uses the same wrappers.

// Shared-memory tiles are [rows, D] halves, D * 2 bytes per row, split into 16-byte chunks.
// With SWIZZLE, logical chunk c of row r is stored at chunk c ^ (r % 8). Eight consecutive
// rows read at the same logical chunk (one 8x8 ldmatrix matrix) then fall into 8 different
// chunks, i.e. 8 disjoint groups of 4 banks: conflict-free. Without it, rows 128 or 256 bytes
// apart hit the same 4 banks: an 8-way conflict.
template <int D, bool SWIZZLE>
__device__ __forceinline__ uint32_t smem_offset(int row, int chunk) {
    // LAB HOLE 3 BEGIN: the swizzle: where chunk c of row r is stored
    // LAB TODO: the byte offset in a [rows, D] half tile (D * HALF_BYTES bytes a row, 16-byte
    // LAB TODO: chunks) of logical chunk `chunk` of row `row`: with SWIZZLE, stored at chunk chunk
    // LAB TODO: ^ (row % 8), without, at chunk itself. Every store to a tile and (below) every
    // LAB TODO: ldmatrix address must agree on it.
    // LAB STUB: return 0u;  // until filled: every chunk lands on the tile's first
    return (uint32_t)(row * (D * HALF_BYTES) +
                      (SWIZZLE ? (chunk ^ (row & 7)) : chunk) * CHUNK_BYTES);
    // LAB HOLE 3 END
}

// threadIdx.x. Every kernel here reads it through this function, in one of two ways:
//  - FRESH (the default): afresh where it is used, through asm volatile, which the compiler may
//    neither hoist out of the key loop nor merge with another read. Offsets derived from it that
//    are needed once per key tile (where this thread's load chunks, ldmatrix rows and mask
//    elements lie) are then recomputed in a few integer instructions instead of occupying
//    registers across the key loop, where registers are scarcest.
//  - !FRESH: the plain read, which the compiler may keep in a register, move or repeat, for what
//    is needed once per block (the warp's rows, the combine kernel's row); there a fresh read
//    only moves instructions around (other machine code in 27 kernels, for nothing measured).
template <bool FRESH = true>
__device__ __forceinline__ int thread_index() {
    if constexpr (FRESH) {
        int t;
        asm volatile("mov.u32 %0, %%tid.x;\n" : "=r"(t));
        return t;
    } else {
        return (int)threadIdx.x;
    }
}

// blockIdx.x, read afresh for the same reason where the epilogue needs the block's key range
// (recomputed after the key loop instead of held in a register through it).
__device__ __forceinline__ int block_index_x() {
    int b;
    asm volatile("mov.u32 %0, %%ctaid.x;\n" : "=r"(b));
    return b;
}

// ldmatrix lane addresses. Every x4 load of the kernel reads a 16 x 16 block of a tile as four 8 x
// 8 matrices. For Q (A operand) and V (B operand, transposed) the order is (rows 0-7, cols 0-7),
// (rows 8-15, cols 0-7), (rows 0-7, cols 8-15), (rows 8-15, cols 8-15): lane l addresses block row
// l % 16, chunk bit l / 16. The block at chunk pair c (columns 16c.. 16c+15) has logical chunk 2c +
// l / 16, stored at (2c + l / 16) ^ (row % 8) = 2c ^ ((l / 16) ^ (l % 8)): one per-lane offset, XOR
// (c * X4_BYTES). That XOR only touches bits below ROW_BYTES, so it commutes with adding whole
// rows. K (B operand, untransposed) is read in the order (rows 0-7, cols 0-7), (rows 0-7, cols
// 8-15), (rows 8-15, cols 0-7), (rows 8-15, cols 8-15): lane l addresses row
// l % 8 + 8 (l / 16), chunk bit (l / 8) % 2. Then each key block's b0 and b1 come back in
// adjacent registers, as the mma instruction takes them; in the other order the compiler
// must first copy every pair into place (about 230 moves per key tile at D = 128).
// Both come from a fresh read of threadIdx.x where the key loop uses them: a few integer
// instructions per tile, instead of the compiler holding them and their XOR variants in
// registers through the softmax (at D = 128 that spills).
template <int ROW_BYTES, bool SWIZZLE>
__device__ __forceinline__ uint32_t a_lane_offset() {
    // LAB HOLE 3 BEGIN: the swizzle: the A-order ldmatrix lane address
    // LAB TODO: this lane's byte offset for an A-order x4 load (Q, and V read .trans) of the 16 x
    // LAB TODO: 16 block at chunk pair 0: lane l addresses block row l % 16 (X4_DIM), logical chunk
    // LAB TODO: l / 16, stored at chunk (l / 16) ^ (row % 8) when SWIZZLE (row % 8 = l % 8).
    // LAB TODO: Callers XOR in c * X4_BYTES for chunk pair c, and add whole rows: why does that XOR
    // LAB TODO: commute with both?
    // LAB STUB: return 0u;  // until filled
    const uint32_t lane = (uint32_t)thread_index() % WARP_SIZE;  // unsigned: shifts and masks
    const uint32_t sw = SWIZZLE ? lane % MATRIX_ROWS : 0;
    return lane % X4_DIM * ROW_BYTES + (lane / X4_DIM ^ sw) * CHUNK_BYTES;
    // LAB HOLE 3 END
}

template <int ROW_BYTES, bool SWIZZLE>
__device__ __forceinline__ uint32_t k_lane_offset() {
    // LAB HOLE 3 BEGIN: the swizzle: the K-order ldmatrix lane address
    // LAB TODO: the same for K (B operand, untransposed) in the order (rows 0-7, chunk 0), (rows
    // LAB TODO: 0-7, chunk 1), (rows 8-15, chunk 0), (rows 8-15, chunk 1): lane l addresses row l %
    // LAB TODO: 8 + 8 (l / 16), logical chunk (l / 8) % 2, swizzled by the row's l % 8 as above.
    // LAB TODO: (In this order each key block's b0 and b1 come back in adjacent registers, as
    // LAB TODO: mma_16816 takes them.)
    // LAB STUB: return 0u;  // until filled
    const uint32_t lane = (uint32_t)thread_index() % WARP_SIZE;
    const uint32_t sw = SWIZZLE ? lane % MATRIX_ROWS : 0;
    return (lane % MATRIX_ROWS + lane / X4_DIM * MATRIX_ROWS) * ROW_BYTES +
           (lane / MATRIX_ROWS % 2 ^ sw) * CHUNK_BYTES;
    // LAB HOLE 3 END
}

// Number of 16-byte chunks each thread moves for a [ROWS, D] tile.
__host__ __device__ constexpr int chunks_per_thread(int rows, int d, int threads) {
    return rows * (d / CHUNK_HALVES) / threads;
}

// One 16-byte chunk global -> shared: sm_80+ copies asynchronously (zero-fill if !valid);
// sm_75 loads into a register (zero if !valid) that tile_finish stores later.
__device__ __forceinline__ void copy_chunk(uint4 &stage, uint32_t dst, const __half *src,
                                           bool valid) {
#if __CUDA_ARCH__ >= 800
    cp_async_16(dst, src, valid);
    (void)stage;
#else
    // LAB HOLE 4 BEGIN [t4]: the sm_75 register-staged tile load: one chunk into a register
    // LAB TODO: sm_75 has no cp.async: load the 16 bytes at src into the register `stage` (one
    // LAB TODO: uint4 load), or zeros where !valid (a row past N; src then points at row 0, inside
    // LAB TODO: N). dst is unused here: tile_finish stores the register later.
    // LAB STUB: (void)stage, (void)dst;  // unused until filled
    stage = valid ? *reinterpret_cast<const uint4 *>(src) : make_uint4(0, 0, 0, 0);
    (void)dst;
    // LAB HOLE 4 END
#endif
}

// Where chunk i of this thread's (tile_issue) lies in the shared tile: `to` (its first) plus i *
// STEP rows when STEP is a multiple of the swizzle's 8 rows (D = 64, 128: every chunk of a thread
// has the same swizzle); at D = 256 (STEP = 4 rows) each its own.
template <int D, int STEP, bool SWIZZLE>
__device__ __forceinline__ uint32_t chunk_place(uint32_t tile, uint32_t to, int row0, int chunk0,
                                                int i) {
    if constexpr (STEP % MATRIX_ROWS == 0) {
        (void)tile, (void)row0, (void)chunk0;
        return to + i * STEP * D * HALF_BYTES;
    } else {
        (void)to;
        return tile + smem_offset<D, SWIZZLE>(row0 + i * STEP, chunk0);
    }
}

// Start loading rows [0, ROWS) of the tile at `src` (row stride D; MODEL: ld) into the shared tile
// at `tile`; rows >= rows_left lie beyond N and become zeros. D here is the tile's row in halves
// (row_halves); MODEL: columns at or past `cols` (the shape's head dim) become zeros too, their
// source never read (cp.async's src-size 0, the sm_75 path's zero). Thread tid moves the 16-byte
// chunks (row0 + i * STEP, chunk0), i = 0, 1, ...: consecutive threads read consecutive 16 bytes
// of global memory. STEP = THREADS / (D / 8) is 8 or 16 rows at D = 64, 128, a multiple of 8, so
// every chunk of a thread has the same swizzle and sits a constant i * STEP rows after the first
// (D = 256: 4 rows, chunk_place). sm_80+: cp.async, one commit group per tile. sm_75: 16-byte
// loads into `stage` (registers), stored to shared memory later by tile_finish. MODEL: each
// chunk's source is the one before it plus the stride of STEP rows, one 64-bit address advanced
// down this thread's rows, so that no chunk holds an address of its own across the others.
template <int ROWS, int D, int THREADS, bool SWIZZLE, bool MODEL = false>
__device__ __forceinline__ void tile_issue(uint4 (&stage)[chunks_per_thread(ROWS, D, THREADS)],
                                           uint32_t tile, const __half *src, int rows_left,
                                           unsigned ld = D, int cols = D) {
    constexpr int CHUNKS_PER_ROW = D / CHUNK_HALVES;
    constexpr int STEP = THREADS / CHUNKS_PER_ROW;
    const int tid = thread_index();
    const int row0 = tid / CHUNKS_PER_ROW, chunk0 = tid % CHUNKS_PER_ROW;
    const uint32_t to = tile + smem_offset<D, SWIZZLE>(row0, chunk0);
    if constexpr (!MODEL) {
        (void)ld, (void)cols;
        const __half *from = src + row0 * D + chunk0 * CHUNK_HALVES;
        if (rows_left >= ROWS) {  // every tile but the last: nothing to check
#pragma unroll
            for (int i = 0; i < chunks_per_thread(ROWS, D, THREADS); ++i) {
                copy_chunk(stage[i], chunk_place<D, STEP, SWIZZLE>(tile, to, row0, chunk0, i),
                           from + i * STEP * D, true);
            }
        } else {  // rows past N: zero-filled, their source address replaced by row 0 (inside N)
#pragma unroll
            for (int i = 0; i < chunks_per_thread(ROWS, D, THREADS); ++i) {
                const bool valid = row0 + i * STEP < rows_left;
                copy_chunk(stage[i], chunk_place<D, STEP, SWIZZLE>(tile, to, row0, chunk0, i),
                           valid ? from + i * STEP * D : src, valid);
            }
        }
    } else {
        const __half *from = src + rows_offset(row0, ld) + chunk0 * CHUNK_HALVES;
        // elements from one of this thread's rows to the next
        const size_t step = (size_t)STEP * ld;
        // this thread's column lies inside the head dim (every chunk of it: the same column)
        const bool in_d = chunk0 * CHUNK_HALVES < cols;
        if (rows_left >= ROWS) {
#pragma unroll
            for (int i = 0; i < chunks_per_thread(ROWS, D, THREADS); ++i, from += step)
                copy_chunk(stage[i], chunk_place<D, STEP, SWIZZLE>(tile, to, row0, chunk0, i),
                           in_d ? from : src, in_d);
        } else {
#pragma unroll
            for (int i = 0; i < chunks_per_thread(ROWS, D, THREADS); ++i, from += step) {
                const bool valid = in_d && row0 + i * STEP < rows_left;
                copy_chunk(stage[i], chunk_place<D, STEP, SWIZZLE>(tile, to, row0, chunk0, i),
                           valid ? from : src, valid);
            }
        }
    }
    cp_async_commit();
}

// Complete the load started by tile_issue: sm_80+ waits for this thread's copies; sm_75 stores
// the staged registers. Either way a __syncthreads() must follow before other warps read it.
template <int ROWS, int D, int THREADS, bool SWIZZLE>
__device__ __forceinline__ void tile_finish(
    const uint4 (&stage)[chunks_per_thread(ROWS, D, THREADS)], uint32_t tile) {
#if __CUDA_ARCH__ >= 800
    cp_async_wait<0>();
    (void)stage, (void)tile;
#else
    if constexpr (THREADS / (D / CHUNK_HALVES) % MATRIX_ROWS != 0) {
        // D = 256: this thread's rows are 4 apart, each chunk in its own swizzle (chunk_place)
        constexpr int CHUNKS_PER_ROW = D / CHUNK_HALVES;
        constexpr int STEP = THREADS / CHUNKS_PER_ROW;
        const int tid = thread_index();
#pragma unroll
        for (int i = 0; i < chunks_per_thread(ROWS, D, THREADS); ++i) {
            st_shared_v4(tile + smem_offset<D, SWIZZLE>(tid / CHUNKS_PER_ROW + i * STEP,
                                                        tid % CHUNKS_PER_ROW),
                         stage[i]);
        }
        return;
    }
    // LAB HOLE 4 BEGIN [t4]: the sm_75 register-staged tile load: the registers to shared memory
    // LAB TODO: store this thread's staged chunks where tile_issue read them from: thread tid moves
    // LAB TODO: chunk tid % (D / 8) of rows tid / (D / 8) + i * STEP, i < chunks_per_thread(ROWS,
    // LAB TODO: D, THREADS), with STEP = THREADS / (D / 8) rows (a multiple of 8: every chunk of a
    // LAB TODO: thread has the same swizzle). Address: tile + smem_offset<D, SWIZZLE>(row, chunk),
    // LAB TODO: st_shared_v4 of stage[i].
    // LAB STUB: (void)stage, (void)tile;  // unused until filled
    constexpr int CHUNKS_PER_ROW = D / CHUNK_HALVES;
    constexpr int STEP = THREADS / CHUNKS_PER_ROW;
    const int tid = thread_index();
    const uint32_t to = tile + smem_offset<D, SWIZZLE>(tid / CHUNKS_PER_ROW, tid % CHUNKS_PER_ROW);
#pragma unroll
    for (int i = 0; i < chunks_per_thread(ROWS, D, THREADS); ++i) {
        st_shared_v4(to + i * STEP * D * HALF_BYTES, stage[i]);
    }
    // LAB HOLE 4 END
#endif
}

// A K/V tile load inside the key loop: started here, completed by tile_finish after the compute
// it overlaps; the single_stage variant (!PIPELINED) completes it at once instead.
template <int ROWS, int D, int THREADS, bool SWIZZLE, bool PIPELINED, bool MODEL = false>
__device__ __forceinline__ void tile_start(uint4 (&stage)[chunks_per_thread(ROWS, D, THREADS)],
                                           uint32_t tile, const __half *src, int rows_left,
                                           unsigned ld = D, int cols = D) {
    tile_issue<ROWS, D, THREADS, SWIZZLE, MODEL>(stage, tile, src, rows_left, ld, cols);
    if (!PIPELINED) tile_finish<ROWS, D, THREADS, SWIZZLE>(stage, tile);
}

// Max of row g (h = 0) or g + 8 (h = 1) of slice m of S over the tile's keys: this lane's 2 NB
// elements, then across the row's 4 lanes (same g) with 2 shuffles.
template <int MT, int NB>
__device__ __forceinline__ float row_max(const float (&S)[MT][NB][4], int m, int h) {
    // LAB HOLE 5 BEGIN [design]: the online softmax on mma fragments: a row's max (row_max)
    // LAB TODO: the max over the tile's keys of row g + 8h of slice m (g = lane / 4). This lane
    // LAB TODO: holds two of the row's elements in each of the NB key blocks (elements
    // LAB TODO: frag_reg(h, 0) and frag_reg(h, 1): keys 8n + 2t and 8n + 2t + 1, t = lane % 4); the
    // LAB TODO: row's six others of each block are in the three other lanes of its quad (same g).
    // LAB TODO: All four lanes must return the same value. A masked score is -inf: a row with no
    // LAB TODO: key seen in this tile gets -inf.
    // LAB STUB: (void)S, (void)m, (void)h;
    // LAB STUB: return 0.f;  // until filled
    float mx = -INFINITY;
#pragma unroll
    for (int n = 0; n < NB; ++n)
        mx = fmaxf(mx, fmaxf(S[m][n][frag_reg(h, 0)], S[m][n][frag_reg(h, 1)]));
    mx = fmaxf(mx, __shfl_xor_sync(FULL_WARP, mx, 1));
    return fmaxf(mx, __shfl_xor_sync(FULL_WARP, mx, 2));
    // LAB HOLE 5 END
}

// Online-softmax update of one row for a tile whose (scaled) max is m_tile: raise m_i to the new
// max and rescale this lane's part of the row's sum l_i and of its O_acc by alpha = 2^(old - new).
template <int MT, int DB>
__device__ __forceinline__ void rescale_row(float (&m_i)[MT][2], float (&l_i)[MT][2],
                                            float (&O_acc)[MT][DB][4], int m, int h, float m_tile) {
    // LAB HOLE 5 BEGIN [design]: the online softmax on mma fragments: a row's rescale (rescale_row)
    // LAB TODO: row g + 8h of slice m moves from its running max m_i[m][h] to the larger of it and
    // LAB TODO: m_tile (both in log2 units: scale * log2(e) * q.k). This lane's part of its sum,
    // LAB TODO: l_i[m][h], and of its O_acc (elements frag_reg(h, 0) and frag_reg(h, 1) of each of
    // LAB TODO: the DB head-dim blocks) are multiplied by alpha = 2^(old max - new max). A row that
    // LAB TODO: has seen only masked keys has max -inf: its alpha must come out 0, never NaN (no
    // LAB TODO: -inf - (-inf) anywhere), and its max stays -inf.
    // LAB STUB: (void)m_i, (void)l_i, (void)O_acc, (void)m, (void)h, (void)m_tile;  // until filled
    const float m_new = fmaxf(m_i[m][h], m_tile);
    // A row with every key masked so far keeps m = -inf; subtract 0 instead so that
    // 2^(-inf - (-inf)) = NaN never happens (its alpha is then 0).
    const float alpha = fast_exp2(m_i[m][h] - (m_new == -INFINITY ? 0.f : m_new));
    m_i[m][h] = m_new;
    l_i[m][h] *= alpha;
#pragma unroll
    for (int n = 0; n < DB; ++n)
        O_acc[m][n][frag_reg(h, 0)] *= alpha, O_acc[m][n][frag_reg(h, 1)] *= alpha;
    // LAB HOLE 5 END
}

/* ---- kernel phases --------------------------------------------------------------------------- */

// Each phase works on one warp's fragments. Array shapes (deduced): MT m16 slices of query rows
// per warp, NB n8 key blocks of S per slice, DB n8 head-dim blocks of O_acc, KD k16 steps of
// S = Q K^T, KC k16 steps of O += P V. Fragment coordinates g = lane / 4, t = lane % 4, element
// frag_reg(h, c) of a block at row g + 8h, column 2t + c (the accumulator fragment of warp.cuh).

// Q fragments for the whole key loop (when they fit in registers): q_frag[m][k] = A operand of
// slice m, k16 step k.
template <int ROW_BYTES, int MT, int KD>
__device__ __forceinline__ void load_q_fragments(uint32_t (&q_frag)[MT][KD][4], uint32_t Q_warp,
                                                 uint32_t lane_off) {
#pragma unroll
    for (int m = 0; m < MT; ++m) {
#pragma unroll
        for (int k = 0; k < KD; ++k) {
            ldmatrix_x4(q_frag[m][k], Q_warp + (lane_off ^ (k * X4_BYTES)) + m * MMA_M * ROW_BYTES);
        }
    }
}

// S = Q K_j^T: S[m][n] = C fragment of slice m, key block n (keys k0 + 8n .. + 7). Q comes from
// q_frag (Q_IN_REGS) or from Q_smem (this warp's rows at Q_warp), K_j from K_smem.
template <int ROW_BYTES, bool Q_IN_REGS, int KD, bool BF16 = false, int MT, int NB, int QM, int QK>
__device__ __forceinline__ void compute_scores(float (&S)[MT][NB][4],
                                               const uint32_t (&q_frag)[QM][QK][4], uint32_t Q_warp,
                                               uint32_t K_tile, uint32_t lane_off,
                                               uint32_t k_lane_off) {
#pragma unroll
    for (int m = 0; m < MT; ++m) {
#pragma unroll
        for (int n = 0; n < NB; ++n) {
#pragma unroll
            for (int e = 0; e < 4; ++e) S[m][n][e] = 0.f;
        }
    }
#pragma unroll
    for (int k = 0; k < KD; ++k) {
        uint32_t a[MT][4];
#pragma unroll
        for (int m = 0; m < MT; ++m) {
            if constexpr (Q_IN_REGS) {
#pragma unroll
                for (int e = 0; e < 4; ++e) a[m][e] = q_frag[m][k][e];
            } else {
                ldmatrix_x4(a[m], Q_warp + (lane_off ^ (k * X4_BYTES)) + m * MMA_M * ROW_BYTES);
            }
        }
        // LAB HOLE 1 BEGIN: S = Q K_j^T: K by ldmatrix, then mma.sync
        // LAB TODO: k16 step k: a[m] holds Q's A fragment of slice m. For the key blocks two at a
        // LAB TODO: time (n = 0, 2, .. NB - 2; keys 8n .. 8n + 15 of the tile): one ldmatrix_x4 of
        // LAB TODO: K_j into uint32_t b[4], at K_tile + (k_lane_off ^ (k * X4_BYTES)) + n * MMA_N *
        // LAB TODO: ROW_BYTES (the lane's address for column chunk pair k of key rows 8n..: see the
        // LAB TODO: comment above a_lane_offset), untransposed: K's rows are B's columns. b[0],
        // LAB TODO: b[1] are the B fragment of key block n, b[2], b[3] that of block n + 1. Then
        // LAB TODO: for every slice m: S[m][n] += a[m] B_n and S[m][n + 1] += a[m] B_n+1 with
        // LAB TODO: mma_16816_of<BF16> (mma_16816 in the storage type).
#pragma unroll
        for (int n = 0; n < NB; n += X4_BLOCKS) {  // two key blocks per ldmatrix.x4
            // B[k][n] = K[key n][d k]: K rows are the columns of B, read untransposed.
            // b[0], b[1] = b0, b1 of keys n*8..; b[2], b[3] = b0, b1 of keys n*8+8...
            uint32_t b[4];
            ldmatrix_x4(b, K_tile + (k_lane_off ^ (k * X4_BYTES)) + n * MMA_N * ROW_BYTES);
#pragma unroll
            for (int m = 0; m < MT; ++m) {
                mma_16816_of<BF16>(S[m][n], a[m], b[0], b[1]);
                mma_16816_of<BF16>(S[m][n + 1], a[m], b[2], b[3]);
            }
        }
        // LAB HOLE 1 END
    }
}

// Mask (diagonal and tail tiles only): key > query (causal) or key >= N -> -inf. WINDOW (MODEL
// kernels, where q0 is the first row's last key, block_place): key > that row's last key, or
// key < its last key - width (model_layout's mask_width, a local window's keys but one).
// Element e of S[m][n] is query q0 + warp*RPW + 16m + g + 8(e/2), key k0 + 8n + 2t + e%2;
// moving the lane's part to one side leaves one compile-time constant per element.
template <int RPW, bool WINDOW = false, int MT, int NB>
__device__ __forceinline__ void mask_scores(float (&S)[MT][NB][4], int k0, int q0, int N,
                                            int causal, int width = 0) {
    const int me = thread_index() % WARP_SIZE, my_warp = thread_index() / WARP_SIZE;
    const int diag = k0 - q0 - my_warp * RPW - me / QUAD + 2 * (me % QUAD);  // key - query - consts
    const int tail = N - k0 - 2 * (me % QUAD);  // key >= N  <=>  8n + e%2 >= tail
#pragma unroll
    for (int m = 0; m < MT; ++m) {
#pragma unroll
        for (int n = 0; n < NB; ++n) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                // key - query = diag + (8n + e%2) - (16m + 8(e/2))
                const int key_minus_query =
                    diag + MMA_N * n + (e & 1) - MMA_M * m - FRAG_ROW_STEP * (e >> 1);
                const bool outside = WINDOW ? key_minus_query > 0 || key_minus_query < -width
                                            : causal && key_minus_query > 0;
                if (MMA_N * n + (e & 1) >= tail || outside) S[m][n][e] = -INFINITY;
            }
        }
    }
}

// Softcap (MODEL kernels): raw scores q.k become tanh(q.k * scale / cap) (the capped score over
// cap: the softmax then takes cap * log2(e) as its scale, model_layout's softcap_log2). Before the
// mask: a masked score stays -inf.
template <int MT, int NB>
__device__ __forceinline__ void cap_scores(float (&S)[MT][NB][4], float softcap_in) {
#pragma unroll
    for (int m = 0; m < MT; ++m) {
#pragma unroll
        for (int n = 0; n < NB; ++n) {
#pragma unroll
            for (int e = 0; e < 4; ++e) S[m][n][e] = tanh_approx(S[m][n][e] * softcap_in);
        }
    }
}

// Online softmax on registers, in the log2 domain: with c = scale * log2(e),
// m_i = max_j c * q.k_j and p_j = 2^(c * q.k_j - m_i) = e^(scale * q.k_j - m_i * ln 2):
// one FFMA and one MUFU.EX2 per score. S holds raw q.k; since c > 0, the max of c * q.k is
// c times the max of q.k. A row's 4 lanes (same g, t = 0..3) share its max by 2 shuffles.
// Every row's max of the tile first (with the max taken inside the row loop below, nvcc 12.4
// leaves that loop rolled in the eager kernels and their fragments in a stack frame). LAZY:
// then one vote: if no row of the warp has a new max, every alpha would be exactly 1 and the
// rescale is skipped (4 MUFU and 4 + 4 DB FMUL per row pair; the results are the same bit for
// bit). Otherwise (!LAZY) each row is rescaled right before its exponentials, with no branch:
// see LAZY_MIN_N for when each wins.
// P[m][k] = A operand of slice m, k16 step k of O += P V_j, packed where the scores lie.
template <bool LAZY, bool BF16 = false, int MT, int NB, int DB, int KC>
__device__ __forceinline__ void online_softmax(float (&S)[MT][NB][4], float (&m_i)[MT][2],
                                               float (&l_i)[MT][2], float (&O_acc)[MT][DB][4],
                                               uint32_t (&P)[MT][KC][4], float scale_log2) {
    // LAB HOLE 5 BEGIN [design]: the online softmax on mma fragments: the update (online_softmax)
    // LAB TODO: S[m][n] holds raw scores q.k (-inf where masked) in the accumulator layout: element
    // LAB TODO: frag_reg(h, c) of block n is row g + 8h of slice m, key 8n + 2t + c of the tile
    // LAB TODO: (g = lane / 4, t = lane % 4); a row lives in the four lanes of a quad. In the log2
    // LAB TODO: domain, with c = scale_log2 (scale * log2(e), > 0), for each of the warp's rows:
    // LAB TODO: the tile's max of c q.k over the whole row; the running max m_i raised to it, and
    // LAB TODO: the row's l_i and O_acc multiplied by alpha = 2^(old max - new max) before this
    // LAB TODO: tile's terms are added; then p = 2^(c q.k - m_i) of each of its scores, one
    // LAB TODO: multiply-add and one exp2 a score (a -inf score gives 0; a row whose max is still
    // LAB TODO: -inf subtracts 0, not -inf), each p added to this lane's l_i (the epilogue adds the
    // LAB TODO: quad's four partial sums; the LSE is (m_i + log2 l) ln 2). LAZY: where no row of
    // LAB TODO: the warp has a new max, every alpha would be exactly 1: the whole warp then skips
    // LAB TODO: the tile's rescale, a decision the same in its 32 lanes (!LAZY: every row rescaled,
    // LAB TODO: no branch). Last, P[m][k], the A fragment of slice m for k16 step k (keys
    // LAB TODO: 16k .. 16k + 15) of O += P V_j: two values of the storage type (bf16 where BF16,
    // LAB TODO: else fp16) a register, the lower key in the low half; its registers 0-3 hold
    // LAB TODO: (row g, keys 16k + 2t and + 1), (row g + 8, the same keys), (row g, keys
    // LAB TODO: 16k + 8 + 2t and + 1), (row g + 8, the same): which elements of which blocks of S
    // LAB TODO: are those? row_max() and rescale_row() above are parts of this hole: write and use
    // LAB TODO: them, or do without them.
    // LAB STUB: (void)S, (void)m_i, (void)l_i, (void)O_acc, (void)scale_log2;
    // LAB STUB: memset(P, 0, sizeof P);  // until filled: P = 0, so O stays 0
    float m_tile[MT][2];  // this tile's row maxima, times c
    bool grows = false;   // some row's max grew
#pragma unroll
    for (int m = 0; m < MT; ++m) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            m_tile[m][h] = row_max(S, m, h) * scale_log2;  // scale > 0
            grows |= m_tile[m][h] > m_i[m][h];
        }
    }
    // The vote is warp-uniform. (LAZY && vote, not if constexpr (LAZY) around it: nvcc 12.4
    // rolls the loop again in four eager kernels with that.)
    if (LAZY && __any_sync(FULL_WARP, grows)) {
#pragma unroll
        for (int m = 0; m < MT; ++m) {
#pragma unroll
            for (int h = 0; h < 2; ++h) rescale_row(m_i, l_i, O_acc, m, h, m_tile[m][h]);
        }
    }
#pragma unroll
    for (int m = 0; m < MT; ++m) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            if constexpr (!LAZY) rescale_row(m_i, l_i, O_acc, m, h, m_tile[m][h]);
            // A row with every key masked so far has m = -inf; subtract 0 instead (p = 0).
            const float m_base = m_i[m][h] == -INFINITY ? 0.f : m_i[m][h];
#pragma unroll
            for (int n = 0; n < NB; ++n) {
                const float p0 = fast_exp2(fmaf(S[m][n][frag_reg(h, 0)], scale_log2, -m_base));
                const float p1 = fast_exp2(fmaf(S[m][n][frag_reg(h, 1)], scale_log2, -m_base));
                l_i[m][h] += p0 + p1;
                S[m][n][frag_reg(h, 0)] = p0, S[m][n][frag_reg(h, 1)] = p1;
            }
        }
        // The C fragments of key blocks 2k and 2k+1 are, register for register, the A
        // fragment of k16 step k: (row g, keys 2t..) (row g+8, keys 2t..) (row g, keys 8+2t..)
        // (row g+8, keys 8+2t..).
#pragma unroll
        for (int k = 0; k < KC; ++k) {
            P[m][k][0] = pack2_of<BF16>(S[m][2 * k][0], S[m][2 * k][1]);
            P[m][k][1] = pack2_of<BF16>(S[m][2 * k][2], S[m][2 * k][3]);
            P[m][k][2] = pack2_of<BF16>(S[m][2 * k + 1][0], S[m][2 * k + 1][1]);
            P[m][k][3] = pack2_of<BF16>(S[m][2 * k + 1][2], S[m][2 * k + 1][3]);
        }
    }
    // LAB HOLE 5 END
}

// O_acc += P V_j, V_j from V_smem.
template <int ROW_BYTES, bool BF16 = false, int MT, int DB, int KC>
__device__ __forceinline__ void accumulate_pv(float (&O_acc)[MT][DB][4],
                                              const uint32_t (&P)[MT][KC][4], uint32_t V_tile,
                                              uint32_t lane_off) {
    // LAB HOLE 2 BEGIN: O += P V_j: V by ldmatrix.trans, then mma.sync
    // LAB TODO: for each k16 step k (keys 16k .. 16k + 15 of the tile) and the head-dim blocks two
    // LAB TODO: at a time (n = 0, 2, .. DB - 2; columns 8n .. 8n + 15): one ldmatrix_x4_trans of
    // LAB TODO: V_j into uint32_t b[4] at V_tile + (lane_off ^ (n / X4_BLOCKS * X4_BYTES)) + k *
    // LAB TODO: MMA_K * ROW_BYTES. V is [key][d], row-major, but B must be k (key) by n (d) in the
    // LAB TODO: column layout: .trans hands each lane its column. b[0], b[1] = B fragment of d
    // LAB TODO: block n, b[2], b[3] of block n + 1. Then for every slice m: O_acc[m][n] += P[m][k]
    // LAB TODO: B_n and O_acc[m][n + 1] += P[m][k] B_n+1 (mma_16816_of<BF16>; P[m][k] is an A
    // LAB TODO: fragment: the softmax packed it from S's accumulators, register for register).
#pragma unroll
    for (int k = 0; k < KC; ++k) {
#pragma unroll
        for (int n = 0; n < DB; n += X4_BLOCKS) {  // two head-dim blocks per ldmatrix.x4
            // B[k][n] = V[key k][d n], V row-major: .trans hands each lane its column.
            // b[0], b[1] = b0, b1 of d block n; b[2], b[3] = b0, b1 of d block n + 1.
            uint32_t b[4];
            ldmatrix_x4_trans(
                b, V_tile + (lane_off ^ (n / X4_BLOCKS * X4_BYTES)) + k * MMA_K * ROW_BYTES);
#pragma unroll
            for (int m = 0; m < MT; ++m) {
                mma_16816_of<BF16>(O_acc[m][n], P[m][k], b[0], b[1]);
                mma_16816_of<BF16>(O_acc[m][n + 1], P[m][k], b[2], b[3]);
            }
        }
    }
    // LAB HOLE 2 END
}

// A row's l is spread over the 4 lanes of its quad: sum it there (l becomes the row's total) and
// return 1 / l, or 0 for a row that saw no key.
__device__ __forceinline__ float row_total_and_inverse(float &l) {
    l += __shfl_xor_sync(FULL_WARP, l, 1);
    l += __shfl_xor_sync(FULL_WARP, l, 2);
    return l > 0.f ? 1.f / l : 0.f;
}

// Epilogue. Each warp normalises its own rows and stages them, as fp16, in its own rows of
// Q_smem (this warp's ldmatrix reads of Q were its last use of them), then writes them out
// with 16-byte stores (O's rows D apart; MODEL: o_ld, and only the chunks of columns below `cols`,
// the shape's head dim); the LSE goes straight from registers. rows_left = N - the warp's first
// row: rows at or past it lie beyond N and are not written.
template <int D, bool SWIZZLE, bool MODEL = false, bool BF16 = false, int MT, int DB>
__device__ __forceinline__ void store_output(const float (&O_acc)[MT][DB][4],
                                             const float (&m_i)[MT][2], const float (&l_i)[MT][2],
                                             uint32_t Q_warp, __half *O, float *lse, int rows_left,
                                             unsigned o_ld = D, int cols = D) {
    constexpr int RPW = MT * MMA_M;    // rows of this warp
    constexpr int RD = row_halves(D);  // the tile's row (halves)
    const int lane = thread_index() % WARP_SIZE, g = lane / QUAD, t = lane % QUAD;
    __syncwarp();  // this warp's reads of its Q_smem rows are done before they are overwritten
#pragma unroll
    for (int m = 0; m < MT; ++m) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            float l = l_i[m][h];
            const float inv_l = row_total_and_inverse(l);
            const int r = MMA_M * m + g + FRAG_ROW_STEP * h;  // row inside the warp's rows
#pragma unroll
            for (int n = 0; n < DB; ++n) {
                st_shared_b32(Q_warp + smem_offset<RD, SWIZZLE>(r, n) + t * sizeof(uint32_t),
                              pack2_of<BF16>(O_acc[m][n][frag_reg(h, 0)] * inv_l,
                                             O_acc[m][n][frag_reg(h, 1)] * inv_l));
            }
            // LSE in natural log: (m + log2 l) is in log2 units of the scaled score.
            if (t == 0 && r < rows_left) lse[r] = (m_i[m][h] + log2f(l)) * LN2;
        }
    }
    __syncwarp();  // this warp's O rows are complete in Q_smem
    constexpr int CHUNKS_PER_ROW = D / CHUNK_HALVES;
#pragma unroll
    for (int i = 0; i < RPW * CHUNKS_PER_ROW / WARP_SIZE; ++i) {
        const int c = lane + WARP_SIZE * i;
        const int r = c / CHUNKS_PER_ROW, chunk = c % CHUNKS_PER_ROW;
        if constexpr (MODEL) {
            if (r < rows_left && chunk * CHUNK_HALVES < cols) {
                st_global_v4(O + rows_offset(r, o_ld) + chunk * CHUNK_HALVES,
                             ld_shared_v4(Q_warp + smem_offset<RD, SWIZZLE>(r, chunk)));
            }
        } else if (r < rows_left) {
            (void)o_ld, (void)cols;
            st_global_v4(O + (size_t)r * D + chunk * CHUNK_HALVES,
                         ld_shared_v4(Q_warp + smem_offset<RD, SWIZZLE>(r, chunk)));
        }
    }
}

// Split-KV epilogue: this block saw only one range of the keys, so it writes its rows' O for
// that range (normalised by the range's own sum) and the range's LSE, in fp32, for
// combine_kernel to merge. Straight from registers: the 4 lanes of a row write 8 consecutive
// floats per head-dim block, whole 32-byte sectors. A row whose keys in this range are all
// masked (causal) has l = 0: it writes O = 0 and LSE = -inf, which the merge weighs as 0.
template <int D, int MT, int DB>
__device__ __forceinline__ void store_partial(const float (&O_acc)[MT][DB][4],
                                              const float (&m_i)[MT][2], const float (&l_i)[MT][2],
                                              float *O_part, float *lse_part, int rows_left) {
    const int lane = thread_index() % WARP_SIZE, g = lane / QUAD, t = lane % QUAD;
#pragma unroll
    for (int m = 0; m < MT; ++m) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            float l = l_i[m][h];
            const float inv_l = row_total_and_inverse(l);
            const int r = MMA_M * m + g + FRAG_ROW_STEP * h;  // row inside the warp's rows
            if (r < rows_left) {
#pragma unroll
                for (int n = 0; n < DB; ++n) {
                    *reinterpret_cast<float2 *>(O_part + (size_t)r * D + MMA_N * n + 2 * t) =
                        make_float2(O_acc[m][n][frag_reg(h, 0)] * inv_l,
                                    O_acc[m][n][frag_reg(h, 1)] * inv_l);
                }
                if (t == 0) lse_part[r] = (m_i[m][h] + log2f(l)) * LN2;
            }
        }
    }
}

/* ---- kernels --------------------------------------------------------------------------------- */

// Everything a launch needs, passed by value (kernel parameters live in constant memory).
typedef struct fwd_params {
    const __half *Q, *K, *V;  // [B, H, N, D] (bf16 bits in a bf16 call's MODEL kernel)
    __half *O;                // [B, H, N, D]  (splits == 1)
    float *lse;               // [B, H, N]     (splits == 1)
    float *O_part;            // [splits, B * H, N, D]: O of each key range (splits > 1)
    float *lse_part;          // [splits, B * H, N]: LSE of each key range (splits > 1)
    int N, causal;
    int splits;        // key ranges per query tile; blockIdx.x = query tile * splits + range
    int split_tiles;   // key tiles per range
    float scale_log2;  // scale * log2(e)
} fwd_params;

// A MODEL kernel's second parameter: where its inputs lie. Q, K, V and O strided (attn_layout; K
// and V one layout), K and V [B, H_kv, N_k, D]. The plain kernels have no such parameter (a larger
// parameter block alone changes their machine code): their tensors are contiguous, N_k = N.
typedef struct model_layout {
    long long q_batch, q_head, kv_batch, kv_head, o_batch, o_head;  // strides in elements
    unsigned q_row, kv_row, o_row;  // row strides (elements; K and V share one layout)
    int H, group;                   // query heads; query heads per key/value head (GQA)
    int N_k;                        // keys (N: queries); causal: query i sees keys <= i + N_k - N
    // The keys a row sees (attention.h, split_kv.cuh's key_rule): keys_before and keys_after its
    // diagonal key (i + N_k - N), -1 unbounded. The mask's form of them: a row's last key is its
    // diagonal + mask_after, its first that - mask_width (unbounded: as many as there are keys).
    int keys_before, keys_after;
    int mask_after, mask_width;
    float softcap_in, softcap_log2;  // softcap: scale / cap and cap * log2(e); 0: none
    int cols;  // the shape's head dim (at most the kernel's D): columns at or past it masked
    // A packed batch (attention.h's attn_varlen; cu_seqlens_q NULL: not packed): blockIdx.y's batch
    // is sequence b, its rows and its N and N_k those attn_sequence_of reads from cu_seqlens (N and
    // N_k above: the longest's, what the grid is planned with).
    attn_varlen varlen;
} model_layout;

// blockIdx.y = batch * H + query head, read afresh (as block_index_x) for the epilogue.
__device__ __forceinline__ int block_index_y() {
    int b;
    asm volatile("mov.u32 %0, %%ctaid.y;\n" : "=r"(b));
    return b;
}

// The sequence of (batch, head) y = blockIdx.y (MODEL): a packed batch's (PACKED) sequence
// b = y / H, its first rows in Q, O and K, V, its lse rows and its N and N_k (attention.h's
// attn_sequence_of, which clamps them to the tensors and to N, the shape's); unpacked, row 0 where
// the batch stride places it, the shape's N and N_k. Unpacked is a compile-time case, not a test
// of cu_seqlens_q: values loaded from cu_seqlens are a thread's own, and every index computed from
// them would leave the uniform datapath (LOG.md step 18), so an unpacked kernel sees the NULL
// array at compile time and keeps the shape's N and N_k from the constant bank.
template <bool PACKED>
__device__ __forceinline__ attn_sequence sequence_of_block(const model_layout &l, int y, int N) {
    if constexpr (PACKED) {
        return attn_sequence_of(&l.varlen, y / l.H, l.H, N, l.N_k);
    } else {
        const attn_varlen unpacked = {};
        return attn_sequence_of(&unpacked, y / l.H, l.H, N, l.N_k);
    }
}

// v in a register of its own (a mov the compiler keeps). A packed epilogue takes the shape's N
// so: where the compiler merges the sequence's N with the shape's into the register of N, N is no
// longer read from the constant bank where it is used but held through the key loop (4 bytes
// spilled at D = 256 on sm_90).
__device__ __forceinline__ int copy_afresh(int v) {
    int r;
    asm volatile("mov.b32 %0, %1;\n" : "=r"(r) : "r"(v));
    return r;
}

// Which rows and keys one block works on.
typedef struct {
    int q0;        // first query row
    int kv_begin;  // keys [kv_begin, kv_end), in tiles of BC
    int kv_end;
} block_work;

// gridDim.x, read afresh (as block_index_x).
__device__ __forceinline__ int grid_dim_x() {
    int n;
    asm volatile("mov.u32 %0, %%nctaid.x;\n" : "=r"(n));
    return n;
}

// The first query row of the block of query tile q_index (blockIdx.x / splits) of q_tiles
// (gridDim.x / splits): causal, the last query tiles are launched first.
template <int BR>
__device__ __forceinline__ int query_tile_row(const fwd_params &p, int q_index, int q_tiles) {
    return (p.causal ? q_tiles - 1 - q_index : q_index) * BR;
}

// Causal: the last query tiles have the most key tiles; launch them first so the short ones
// fill the tail of the grid. A query tile's keys: [0, N), or causal up to its last real row
// (later tiles are skipped); with splits, range `split` of split_tiles tiles of them (a
// causal query tile may have fewer ranges than splits: its remaining blocks get none). MODEL:
// the rules of the block's sequence q (its N and N_k; a packed batch's own, the grid's tiles
// planned for the longest).
template <int BR, int BC, bool SKIP, bool MODEL, bool WINDOW_SOFTCAP>
__device__ __forceinline__ block_work block_keys(const fwd_params &p, const model_layout &l,
                                                 const attn_sequence &q) {
    block_work w;
    const int q_index = (int)blockIdx.x / p.splits, q_tiles = (int)gridDim.x / p.splits;
    const int split = (int)blockIdx.x - q_index * p.splits;  // which key range
    w.q0 = query_tile_row<BR>(p, q_index, q_tiles);
    int kv_all, first_tile = 0;
    if constexpr (WINDOW_SOFTCAP) {  // every tile no row sees is skipped (key_rule)
        const key_rule r = {q.N, q.N_k, l.keys_before, l.keys_after};
        first_tile = query_tile_first_key_tile(r, w.q0, BC);
        kv_all = query_tile_key_end(r, w.q0, BR);
    } else if constexpr (MODEL) {
        kv_all = query_tile_key_end_nk(w.q0, BR, q.N, q.N_k, p.causal && SKIP);
    } else {
        (void)q;
        kv_all = query_tile_key_end(w.q0, BR, p.N, p.causal && SKIP);
    }
    w.kv_begin = (first_tile + split * p.split_tiles) * BC;
    w.kv_end = min(kv_all, w.kv_begin + p.split_tiles * BC);
    return w;
}

// Whether key tile k0 needs a mask: it holds keys >= N (the tail tile) or, causal, keys > the
// block's first query row q0 (the diagonal tiles; noskip masks every tile). All earlier tiles
// take the fast path. Tile k0 is unmasked iff k0 + BC - 1 <= q0.
template <int BC, bool SKIP>
__device__ __forceinline__ bool needs_mask(int k0, int q0, int N, int causal) {
    return k0 + BC > N || (causal && (!SKIP || k0 + BC - 1 > q0));
}
// MODEL (q0: the block's first row's last key, block_place): also where some row of the block's
// BR sees fewer keys than the tile has: past the first row's last key, or before the last row's
// first key (its last key, q0 + BR - 1, minus mask_width).
template <int BR, int BC>
__device__ __forceinline__ bool needs_window_mask(int k0, int q0, int N, int mask_width) {
    return k0 + BC > N || k0 + BC - 1 > q0 || k0 + mask_width < q0 + (BR - 1);
}

// Where one block's tensors lie and which keys it loops over. The key loop counts from the
// range's first key (K and V point there, and the query row and N are taken relative to it), so
// that its bounds are the same few registers as for a single pass: at D = 128 the softmax needs
// every register.
typedef struct {
    size_t head;     // offset of the (batch, head)'s Q
    size_t range;    // offset of the range's first key (K and V)
    unsigned kv_ld;  // K and V: elements from one row to the next
    int N;           // keys from the range's first to the row's end
    int q0;          // the block's first query row, as a key index (MODEL: its last key)
    int kv_end;      // the range's end
} block_place;

// Phase 1, the place: the block's offsets and key bounds. MODEL: K and V share one layout
// (attention_unsupported), one offset for both, of the range's first key in this block's
// key/value head (query head h reads head h / group: GQA); the keys are the sequence's N_k and
// query row i sits at key index i + key_shift (the causal diagonal). A packed sequence starts q_row
// rows into Q and k_row into K and V (the batch strides are 0 there).
template <int D, bool MODEL, bool WINDOW_SOFTCAP>
__device__ __forceinline__ block_place place_block(const fwd_params &p, const model_layout &l,
                                                   const block_work &w, const attn_sequence &q) {
    block_place s;
    if constexpr (!MODEL) {
        (void)q;
        s.head = (size_t)blockIdx.y * (size_t)p.N * D;
        s.range = s.head + (size_t)w.kv_begin * D;
        s.kv_ld = D;
        s.N = p.N - w.kv_begin;
        s.q0 = w.q0 - w.kv_begin;
        s.kv_end = w.kv_end - w.kv_begin;
    } else {
        const int b = (int)blockIdx.y / l.H, h = (int)blockIdx.y % l.H;
        const int key_shift = q.N_k - q.N;  // N_k - N: query row i as a key index, i + key_shift
        s.head = b * l.q_batch + h * l.q_head + (size_t)q.q_row * l.q_row;
        s.range = b * l.kv_batch + h / l.group * l.kv_head + (size_t)q.k_row * l.kv_row +
                  rows_offset(w.kv_begin, l.kv_row);
        s.kv_ld = l.kv_row;
        s.N = q.N_k - w.kv_begin;
        s.q0 = w.q0 + key_shift - w.kv_begin;
        if constexpr (WINDOW_SOFTCAP) s.q0 += l.mask_after;  // the first row's last key
        s.kv_end = max(w.kv_end - w.kv_begin, 0);
    }
    return s;
}

// Phase 3, the online softmax's start. Its state is in the log2 domain: m_i = running max of
// scale*log2(e) * q.k, l_i = this lane's part of the running sum of 2^(s - m_i) (the 4 lanes of a
// row are summed once at the end); index [m][h]: slice m, row g (h = 0) or g + 8 (h = 1). No key
// seen yet: m_i = -inf, l_i = 0, O_acc = 0.
template <int MT, int DB>
__device__ __forceinline__ void start_softmax(float (&m_i)[MT][2], float (&l_i)[MT][2],
                                              float (&O_acc)[MT][DB][4]) {
#pragma unroll
    for (int m = 0; m < MT; ++m) {
#pragma unroll
        for (int h = 0; h < 2; ++h) m_i[m][h] = -INFINITY, l_i[m][h] = 0.f;
#pragma unroll
        for (int n = 0; n < DB; ++n) {
#pragma unroll
            for (int e = 0; e < 4; ++e) O_acc[m][n][e] = 0.f;
        }
    }
}

// Phase 4's prefetch: K_{j+1}, the key tile after the one at k0 (kv: its offset; next:
// MODEL's offset of K_{j+1}), on its way into K_smem.
template <int D, int BC, int THREADS, bool SWIZZLE, bool PIPELINED, bool MODEL>
__device__ __forceinline__ void start_next_k(uint4 (&stage_k)[chunks_per_thread(BC, D, THREADS)],
                                             uint32_t K_smem, const fwd_params &p,
                                             const model_layout &l, const block_place &s, size_t kv,
                                             size_t next, int k0) {
    tile_start<BC, D, THREADS, SWIZZLE, PIPELINED, MODEL>(stage_k, K_smem,
                                                          (MODEL ? p.K + next : p.K + kv + BC * D),
                                                          s.N - (k0 + BC), s.kv_ld, l.cols);
}

// Phase 5, the epilogue: the warp's rows of O and LSE (one pass), or of this key range's partial
// O and LSE for the merge (split-KV). Q_warp: the warp's Q rows, free now, stage O. q0: the
// block's first query row. MODEL: blockIdx.y read again here (block_index_y afresh), and PACKED
// q0 and the sequence too (block_index_x, grid_dim_x: none of them held through the key loop);
// only rows below the sequence's N are written (a packed batch's next rows are another
// sequence's).
template <int D, int BR, int RPW, bool SWIZZLE, bool MODEL, bool BF16, bool PACKED, int MT, int DB>
__device__ __forceinline__ void store_block(const fwd_params &p, const model_layout &l, int q0,
                                            int warp, uint32_t Q_warp,
                                            const float (&O_acc)[MT][DB][4],
                                            const float (&m_i)[MT][2], const float (&l_i)[MT][2]) {
    if constexpr (MODEL && PACKED)
        q0 = query_tile_row<BR>(p, block_index_x() / p.splits, grid_dim_x() / p.splits);
    const unsigned y = MODEL && PACKED ? (unsigned)block_index_y() : blockIdx.y;
    const int first = q0 + warp * RPW;            // this warp's first row
    const size_t row0 = (size_t)y * p.N + first;  // in [B * H, N]
    const int rows_left = p.N - first;            // rows of it inside N
    if (p.splits == 1) {
        if constexpr (MODEL) {
            const int ob = block_index_y() / l.H, oh = block_index_y() % l.H;  // b, h afresh
            const attn_sequence q =
                sequence_of_block<PACKED>(l, (int)y, PACKED ? copy_afresh(p.N) : p.N);
            __half *O_rows = p.O + ob * l.o_batch + oh * l.o_head + (size_t)q.q_row * l.o_row +
                             rows_offset(first, l.o_row);
            // (unpacked, the LSE rows [B * H, N] of row0: q.lse_row + oh * q.lse_head is y * N)
            float *const lse_rows =
                PACKED ? p.lse + q.lse_row + oh * q.lse_head + first : p.lse + row0;
            store_output<D, SWIZZLE, true, BF16>(O_acc, m_i, l_i, Q_warp, O_rows, lse_rows,
                                                 q.N - first, l.o_row, l.cols);
        } else {
            store_output<D, SWIZZLE>(O_acc, m_i, l_i, Q_warp, p.O + row0 * D, p.lse + row0,
                                     rows_left);
        }
    } else {
        const int split = block_index_x() % p.splits;                // which key range (block_keys)
        const size_t part = (size_t)split * gridDim.y * p.N + row0;  // [split, B * H, N]
        store_partial<D>(O_acc, m_i, l_i, p.O_part + part * D, p.lse_part + part, rows_left);
    }
}

// One block = one tile of BR query rows of one (batch, head) and one range of its keys (all
// of them unless split); it loops over the key tiles. Template switches: SWIZZLE (variant
// noswizzle turns it off), PIPELINED (single_stage: load, wait, compute), SKIP (noskip: causal
// processes and masks every key tile), LAZY (rescale only when a row's max grows; chosen by
// the launcher from the keys per block, see LAZY_MIN_N), MODEL (what models feed: strides, GQA,
// N_k != N), BF16 (bf16 storage; MODEL kernels only), WINDOW_SOFTCAP (local windows and softcap;
// MODEL), PACKED (a packed batch's sequences; MODEL). Its phases, numbered below: the place (which
// rows and keys), the prologue (Q and the first key tile), Q's fragments and the softmax's start,
// the key loop (the pipeline schedule), the epilogue.
template <int D, int BR, int BC, int WARPS, bool SWIZZLE, bool PIPELINED, bool SKIP, bool LAZY,
          bool MODEL, bool BF16, bool WINDOW_SOFTCAP = false, bool PACKED = false>
__device__ __forceinline__ void attention_block(const fwd_params &p, const model_layout &l) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
    // sm_75 code runs only the SM75 tiles (SM75_D256 at D = 256; the launcher asks kernel_arch
    // which code it has): with the prefetched tile waiting in registers, larger tiles would spill
    // there. It has no bf16 mma either.
    constexpr tile_config T = sm75_tiles(D);
    if constexpr (BR != T.BR || BC != T.BC || WARPS != T.WARPS || BF16) {
        __trap();
        return;
    }
#elif defined(__CUDA_ARCH__)
    // sm_80+ code never runs sm_75's tiles at D = 96 and 256, nor in the window and softcap
    // kernels (choose_tiles): not compiled there.
    constexpr tile_config T = sm75_tiles(D);
    if constexpr (BR == T.BR && BC == T.BC && WARPS == T.WARPS &&
                  (WINDOW_SOFTCAP || (D != 64 && D != 128))) {
        __trap();
        return;
    }
#endif
    constexpr int THREADS = WARPS * WARP_SIZE;
    constexpr int RD = row_halves(D);           // a tile's row in shared memory, in halves
    constexpr int ROW_BYTES = RD * HALF_BYTES;  // one row of a tile in shared memory
    constexpr int RPW = BR / WARPS;             // query rows per warp
    constexpr int MT = RPW / MMA_M;             // m16 slices per warp
    constexpr int NB = BC / MMA_N;              // n8 blocks of S per slice (keys)
    constexpr int DB = D / MMA_N;               // n8 blocks of O_acc per slice (head dim)
    constexpr int KD = D / MMA_K;               // k16 steps of S = Q K^T
    constexpr int KC = BC / MMA_K;              // k16 steps of O += P V
    constexpr bool Q_IN_REGS = MT * KD * 4 + MT * NB * 4 + MT * DB * 4 <= Q_REGS_BUDGET;
    // WINDOW_SOFTCAP kernels hold the mask's bounds and the softcap's factor through the key
    // loop: the registers that frees is what they need (late K_{j+1}, the lane offset afresh).
    // So does D = 256 on sm_75, beside its staged tile (20 bytes of spill without it; on sm_90,
    // 8 with it at SM80_D256).
    constexpr bool EARLY_K = D <= EARLY_K_MAX_D && HAS_CP_ASYNC && !WINDOW_SOFTCAP;
    constexpr bool LANE_OFFSET_AFRESH =
        LANE_OFFSET_PER_TILE || WINDOW_SOFTCAP || (D > 128 && !HAS_CP_ASYNC);
    static_assert(RPW % MMA_M == 0 && BC % X4_DIM == 0 && D % X4_DIM == 0, "tile shapes");
    static_assert(chunks_per_thread(BR, RD, THREADS) * THREADS == BR * RD / CHUNK_HALVES,
                  "Q tile split");
    static_assert(chunks_per_thread(BC, RD, THREADS) * THREADS == BC * RD / CHUNK_HALVES,
                  "K/V tile split");
    static_assert(MODEL || RD == D, "the plain kernels' tiles are D wide (no masked columns)");

    // 1. The place: which sequence (MODEL: a packed batch's, else the shape's), rows and keys
    // (block_keys), and where they lie.
    attn_sequence q = {};
    if constexpr (MODEL) q = sequence_of_block<PACKED>(l, (int)blockIdx.y, p.N);
    const block_work w = block_keys<BR, BC, SKIP, MODEL, WINDOW_SOFTCAP>(p, l, q);
    // A packed batch's grid has the longest sequence's query tiles: a shorter one's tiles at or
    // past its N hold no row of it (their rows are the next sequence's) and do nothing.
    if (PACKED && w.q0 >= q.N) return;
    // A causal query tile has fewer key ranges than splits: its remaining blocks have none. (MODEL:
    // a query tile that sees no key, causal with N > N_k or a sequence with no key, still writes
    // O = 0 and LSE = -inf unless split: then the merge writes those rows.)
    if (w.kv_begin >= w.kv_end && (!MODEL || p.splits > 1)) return;
    const block_place s = place_block<D, MODEL, WINDOW_SOFTCAP>(p, l, w, q);

    // Shared memory, each tile named by its shared-space address (what ldmatrix, cp.async and
    // st.shared take): Q_smem [BR, D] (O staging at the end), K_smem and V_smem [BC, D], swizzled.
    extern __shared__ __align__(128) unsigned char smem[];
    const uint32_t Q_smem = smem_u32(smem), K_smem = Q_smem + BR * ROW_BYTES,
                   V_smem = K_smem + BC * ROW_BYTES;

    const int warp = thread_index<false>() / WARP_SIZE;
    const uint32_t Q_warp = Q_smem + warp * RPW * ROW_BYTES;  // this warp's Q rows

    // 2. The prologue: Q tile and the range's first key tile.
    {
        uint4 stage_q[chunks_per_thread(BR, RD, THREADS)];
        uint4 stage_k[chunks_per_thread(BC, RD, THREADS)];
        if constexpr (MODEL) {
            tile_issue<BR, RD, THREADS, SWIZZLE, true>(stage_q, Q_smem,
                                                       p.Q + s.head + rows_offset(w.q0, l.q_row),
                                                       q.N - w.q0, l.q_row, l.cols);
        } else {
            tile_issue<BR, D, THREADS, SWIZZLE>(stage_q, Q_smem, p.Q + s.head + (size_t)w.q0 * D,
                                                p.N - w.q0);
        }
        tile_issue<BC, RD, THREADS, SWIZZLE, MODEL>(stage_k, K_smem, p.K + s.range, s.N, s.kv_ld,
                                                    l.cols);
        tile_finish<BR, RD, THREADS, SWIZZLE>(stage_q, Q_smem);
        tile_finish<BC, RD, THREADS, SWIZZLE>(stage_k, K_smem);
    }
    __syncthreads();  // Q_smem and K_smem (first tile) written by all threads, visible to all warps

    // 3. Q's fragments (when they stay in registers) and the softmax's start.
    const uint32_t lane_off = a_lane_offset<ROW_BYTES, SWIZZLE>();
    uint32_t q_frag[Q_IN_REGS ? MT : 1][Q_IN_REGS ? KD : 1][4];
    if constexpr (Q_IN_REGS)
        load_q_fragments<ROW_BYTES>(q_frag, Q_warp, a_lane_offset<ROW_BYTES, SWIZZLE>());

    float m_i[MT][2], l_i[MT][2];  // the online softmax's state (start_softmax)
    float O_acc[MT][DB][4];        // O_acc[m][n]: C fragment of rows of slice m, head-dim block n
    start_softmax(m_i, l_i, O_acc);

    // 4. The key loop is the pipeline schedule (README.md, "Pipeline"): two barriers per tile,
    // V_j in flight during S, K_{j+1} during the softmax (EARLY_K) or P V.
    for (int k0 = 0; k0 < s.kv_end; k0 += BC) {  // key tile j = k0 / BC of the range
        size_t kv, next = 0;                     // offsets of K_j and V_j, and (MODEL) of K_{j+1}
        if constexpr (MODEL)
            kv = s.range + rows_offset(k0, s.kv_ld), next = s.range + rows_offset(k0 + BC, s.kv_ld);
        else
            kv = s.range + (size_t)k0 * D;
        const bool has_next = k0 + BC < s.kv_end;
        uint4 stage_v[chunks_per_thread(BC, RD, THREADS)];
        uint4 stage_k[chunks_per_thread(BC, RD, THREADS)];
        float S[MT][NB][4];
        uint32_t P[MT][KC][4];

        __syncthreads();  // K_j complete and visible; every warp is done reading V_smem (PV j-1)
        tile_start<BC, RD, THREADS, SWIZZLE, PIPELINED, MODEL>(stage_v, V_smem, p.V + kv, s.N - k0,
                                                               s.kv_ld, l.cols);
        compute_scores<ROW_BYTES, Q_IN_REGS, KD, BF16>(S, q_frag, Q_warp, K_smem, lane_off,
                                                       k_lane_offset<ROW_BYTES, SWIZZLE>());
        if (PIPELINED) tile_finish<BC, RD, THREADS, SWIZZLE>(stage_v, V_smem);
        __syncthreads();  // V_j complete and visible; every warp is done reading K_smem (S above)
        if (EARLY_K && has_next)
            start_next_k<RD, BC, THREADS, SWIZZLE, PIPELINED, MODEL>(stage_k, K_smem, p, l, s, kv,
                                                                     next, k0);
        if constexpr (WINDOW_SOFTCAP) {
            if (l.softcap_in != 0.f) cap_scores(S, l.softcap_in);
            if (needs_window_mask<BR, BC>(k0, s.q0, s.N, l.mask_width))
                mask_scores<RPW, true>(S, k0, s.q0, s.N, 0, l.mask_width);
            online_softmax<LAZY, BF16>(S, m_i, l_i, O_acc, P,
                                       l.softcap_in != 0.f ? l.softcap_log2 : p.scale_log2);
        } else {
            if (needs_mask<BC, SKIP>(k0, s.q0, s.N, p.causal))
                mask_scores<RPW>(S, k0, s.q0, s.N, p.causal);
            online_softmax<LAZY, BF16>(S, m_i, l_i, O_acc, P, p.scale_log2);
        }
        if (!EARLY_K && has_next)
            start_next_k<RD, BC, THREADS, SWIZZLE, PIPELINED, MODEL>(stage_k, K_smem, p, l, s, kv,
                                                                     next, k0);
        if constexpr (LANE_OFFSET_AFRESH) {
            accumulate_pv<ROW_BYTES, BF16>(O_acc, P, V_smem, a_lane_offset<ROW_BYTES, SWIZZLE>());
        } else {
            accumulate_pv<ROW_BYTES, BF16>(O_acc, P, V_smem, lane_off);
        }
        if (PIPELINED && has_next) tile_finish<BC, RD, THREADS, SWIZZLE>(stage_k, K_smem);
    }

    // 5. The epilogue.
    store_block<D, BR, RPW, SWIZZLE, MODEL, BF16, PACKED>(p, l, w.q0, warp, Q_warp, O_acc, m_i,
                                                          l_i);
}

// The kernels: the plain case, every variant (attention_block's MODEL off: no layout parameter);
// what models feed, the default tiles and eager rescaling only (a lazy MODEL kernel at D = 64
// spills on sm_100).
template <int D, int BR, int BC, int WARPS, bool SWIZZLE, bool PIPELINED, bool SKIP, bool LAZY>
__global__ void __launch_bounds__(WARP_SIZE *WARPS, 1) attention_kernel(const fwd_params p) {
    attention_block<D, BR, BC, WARPS, SWIZZLE, PIPELINED, SKIP, LAZY, false, false>(p,
                                                                                    model_layout{});
}
template <int D, int BR, int BC, int WARPS, bool BF16, bool WINDOW_SOFTCAP, bool PACKED>
__global__ void __launch_bounds__(WARP_SIZE *WARPS, 1)
    attention_kernel_model(const fwd_params p, const model_layout l) {
    attention_block<D, BR, BC, WARPS, true, true, true, false, true, BF16, WINDOW_SOFTCAP, PACKED>(
        p, l);
}

/* ---- launcher -------------------------------------------------------------------------------- */

enum {
    VARIANT_DEFAULT = 0,
    VARIANT_NOSWIZZLE,
    VARIANT_SINGLE_STAGE,
    VARIANT_NOSKIP,
    VARIANT_EAGER_RESCALE,
    VARIANT_LAZY_RESCALE,
    VARIANT_NOSPLIT,
    VARIANTS
};

#include "plan.cuh"

// The merge of split-KV's ranges at a head dim other than 64 and 128: combine_kernel's rows
// (O_part's D = d, the compiled head dim) and lanes, but only the lanes of O's columns below the
// shape's D read and write (a lane's columns: D / combine_lanes<D>() of them), and at D = 96, whose
// 24 lanes a row do not divide a block's threads, only the block's whole rows.
template <int D, bool BF16>
__global__ void __launch_bounds__(COMBINE_THREADS)
    combine_kernel_cols(const combine_params p, int cols) {
    int lane;
    const long long row = combine_thread_row<D>(&lane);
    const bool whole_row = (int)threadIdx.x < combine_rows_per_block<D>() * combine_lanes<D>();
    if (row < p.rows && whole_row && lane * (D / combine_lanes<D>()) < cols)
        combine_row<D, BF16>(p, row, lane);
}

template <int D>
static cudaError_t combine_cols_at(const attn_shape *s, const combine_params &cp,
                                   cudaStream_t stream) {
    const unsigned blocks = (unsigned)ceil_div(cp.rows, combine_rows_per_block<D>());
    (s->bf16 ? combine_kernel_cols<D, true>
             : combine_kernel_cols<D, false>)<<<blocks, COMBINE_THREADS, 0, stream>>>(cp, s->D);
    ATTN_TRY(cudaGetLastError());
    return cudaSuccess;
}

static cudaError_t combine_cols(const attn_shape *s, const combine_params &cp, int d,
                                cudaStream_t stream) {
    switch (d) {
        case 64:
            return combine_cols_at<64>(s, cp, stream);
        case 96:
            return combine_cols_at<96>(s, cp, stream);
        case 128:
            return combine_cols_at<128>(s, cp, stream);
        default:
            return combine_cols_at<256>(s, cp, stream);
    }
}

static const char *attention_unsupported(const attn_shape *s, const attn_device *dev, int variant) {
    if (s->D < ATTN_MIN_D || s->D > ATTN_MAX_D || s->D % ATTN_D_STEP)
        return "head dim must be a multiple of 8 from 32 to 256";
    if (!(s->scale > 0.f)) return "scale must be positive (the row max is taken before scaling)";
    if (s->B < 1 || s->H < 1 || s->N < 1) return "B, H and N must be >= 1";
    if (dev->cc < 75) return "needs sm_75 or newer (mma.sync m16n8k8, ldmatrix)";
    if (variant < 0 || variant >= VARIANTS) return "unknown variant";
    if ((long long)s->B * s->H > ATTN_MAX_GRID_Y) return "B * H is more than a grid's y holds";
    if (s->H_kv < 1 || s->H % s->H_kv)
        return "H must be a multiple of H_kv (query heads per KV head)";
    if (s->N_k < 1) return "N_k must be >= 1";
    if ((long long)s->N + s->N_k > INT_MAX) return "N + N_k must be below 2^31 (key arithmetic)";
    if (s->k.batch != s->v.batch || s->k.head != s->v.head || s->k.row != s->v.row)
        return "K and V must have the same strides";
    const attn_layout *l[] = {&s->q, &s->k, &s->v, &s->o};  // 16-byte rows, 32-bit tile offsets
    const char *why = attn_strides_refused(l, 4, s->D, INT_MAX / MAX_TILE_ROWS);
    if (why) return why;
    if (s->varlen.cu_seqlens_q &&
        (!s->varlen.cu_seqlens_k || s->varlen.total_q < 0 || s->varlen.total_k < 0))
        return "a packed batch needs cu_seqlens_k beside cu_seqlens_q, and its totals";
    if (plan_is_model(s) && variant != VARIANT_DEFAULT && variant != VARIANT_NOSPLIT &&
        variant != VARIANT_EAGER_RESCALE)
        return "bf16, GQA, strides, N_k != N, local windows, softcap, packed batches and head dims "
               "other than 64 and 128 run in the default tiles' eager kernels only (variants "
               "default, nosplit, eager_rescale)";
    int arch = 0;
    if (kernel_arch(&arch) != cudaSuccess) {
        cudaGetLastError();
        return "no kernel image for this device";
    }
    const int d = compiled_d(s->D);
    if (choose_tiles(d, arch, dev->smem_per_block).BR == 0)
        return "needs 24 KB (D <= 64) or 48 KB (D > 64) of shared memory per block";
    if (s->bf16 &&
        (arch < 80 || same_tiles(choose_tiles(d, arch, dev->smem_per_block), sm75_tiles(d))))
        return "bf16 needs sm_80 or newer (mma.sync has no bf16 form on sm_75)";
    return NULL;
}

// Split-KV's partial results: O_part [splits, B * H, N, D] then lse_part [splits, B * H, N],
// fp32, D the compiled head dim (its rows as the kernel writes them, masked columns 0). Nothing
// when the grid fills the GPU by itself, nor for a packed batch (make_plan: no split).
static size_t attention_workspace_bytes(const attn_shape *s, const attn_device *dev, int variant) {
    fwd_plan plan;
    if (attention_unsupported(s, dev, variant) || make_plan(s, dev, variant, true, &plan)) {
        cudaGetLastError();
        return 0;  // forward() reports the error
    }
    if (plan.splits == 1) return 0;
    return (size_t)plan.splits * s->B * s->H * s->N * (plan.d + 1) * sizeof(float);
}

static cudaError_t attention_forward(const attn_shape *s, const attn_device *dev, const void *Q,
                                     const void *K, const void *V, void *O, float *lse,
                                     void *workspace, int variant, cudaStream_t stream) {
    const char *why = attention_unsupported(s, dev, variant);
    if (why) {
        fprintf(stderr, "stage5_tuned: %s\n", why);
        return cudaErrorInvalidValue;
    }
    // The 16-byte loads and stores need 16-byte aligned tensors (cudaMalloc gives 256).
    if (((uintptr_t)Q | (uintptr_t)K | (uintptr_t)V | (uintptr_t)O) % 16) {
        fprintf(stderr, "stage5_tuned: Q, K, V and O must be 16-byte aligned\n");
        return cudaErrorMisalignedAddress;
    }
    fwd_plan plan;  // without a workspace: one pass, as nosplit
    ATTN_TRY(make_plan(s, dev, variant, workspace != NULL, &plan));
    const long long rows = (long long)s->B * s->H * s->N;
    fwd_params p;
    p.Q = (const __half *)Q, p.K = (const __half *)K, p.V = (const __half *)V;
    p.O = (__half *)O, p.lse = lse;
    p.O_part = (float *)workspace;
    p.lse_part = plan.splits > 1 ? p.O_part + (size_t)plan.splits * rows * plan.d : NULL;
    p.N = s->N, p.causal = s->causal, p.splits = plan.splits, p.split_tiles = plan.split_tiles;
    p.scale_log2 = s->scale * LOG2E;  // log2(e) folded into the scale

    const dim3 grid((unsigned)(ceil_div(s->N, plan.tiles.BR) * plan.splits),
                    (unsigned)(s->B * s->H));
    const unsigned threads = plan.tiles.WARPS * WARP_SIZE;
    if (plan.model) {
        const key_rule r = key_rule_of(s, true);
        // a key - query difference is < N (packed: < its sequence's N, at most the longest's)
        const int after = r.right < 0 ? s->N : r.right;
        const model_layout l = {s->q.batch,
                                s->q.head,
                                s->k.batch,
                                s->k.head,
                                s->o.batch,
                                s->o.head,
                                (unsigned)s->q.row,
                                (unsigned)s->k.row,
                                (unsigned)s->o.row,
                                s->H,
                                s->H / s->H_kv,
                                s->N_k,
                                r.left,
                                r.right,
                                after,
                                after + (r.left < 0 ? s->N_k : r.left),
                                s->softcap > 0.f ? s->scale / s->softcap : 0.f,
                                s->softcap > 0.f ? s->softcap * LOG2E : 0.f,
                                s->D,
                                s->varlen};
        plan.kernel->model<<<grid, threads, plan.smem, stream>>>(p, l);
    } else {
        plan.kernel->fn<<<grid, threads, plan.smem, stream>>>(p);
    }
    ATTN_TRY(cudaGetLastError());
    if (plan.splits == 1) return cudaSuccess;

    const combine_params cp = {p.O_part,
                               p.lse_part,
                               p.O,
                               lse,
                               rows,
                               s->N,
                               plan.tiles.BR,
                               plan.tiles.BC,
                               plan.splits,
                               plan.split_tiles,
                               key_rule_of(s, plan.skip),
                               s->H,
                               s->o.batch,
                               s->o.head,
                               (int)s->o.row};
    if (s->D != 64 && s->D != 128) return combine_cols(s, cp, plan.d, stream);
    const unsigned rows_per_block =
        s->D == 64 ? combine_rows_per_block<64>() : combine_rows_per_block<128>();
    const unsigned blocks = (unsigned)((rows + rows_per_block - 1) / rows_per_block);
    if (s->D == 64) {
        (s->bf16 ? combine_kernel<64, true>
                 : combine_kernel<64, false>)<<<blocks, COMBINE_THREADS, 0, stream>>>(cp);
    } else {
        (s->bf16 ? combine_kernel<128, true>
                 : combine_kernel<128, false>)<<<blocks, COMBINE_THREADS, 0, stream>>>(cp);
    }
    ATTN_TRY(cudaGetLastError());
    return cudaSuccess;
}

extern "C" const attn_stage attn_this_stage = {
    "stage5_tuned",
    "FA2-style: mma.sync + ldmatrix, S/P in registers, swizzled smem, cp.async K/V overlap, "
    "exp2, causal tile skipping, tiles per arch and D, split-KV",
    ATTN_F16,
    "default,noswizzle,single_stage,noskip,eager_rescale,lazy_rescale,nosplit",
    attention_unsupported,
    attention_workspace_bytes,
    attention_forward,
    NULL,  // a forward-only stage: no backward pass
    NULL,
    ATTN_TAKES_BF16 | ATTN_TAKES_GQA | ATTN_TAKES_STRIDES | ATTN_TAKES_N_K | ATTN_TAKES_LOCAL |
        ATTN_TAKES_SOFTCAP | ATTN_TAKES_VARLEN,  // besides the plain case (MODEL kernels)
    0,
    NULL,  // no decode pass: attention against a KV cache is stage 9's
    NULL,
};
