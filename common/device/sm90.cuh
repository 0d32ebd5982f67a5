/*
 * common/device/sm90.cuh: Hopper's instructions as inline PTX, for stage 6 (which teaches them),
 * stage 7 (the TMA unit's bulk reductions and stmatrix, from sm_90 on) and stage 8 (the backward
 * on wgmma): mbarriers, TMA bulk tensor copies and reductions with their bulk groups and the
 * async-proxy fence, programmatic dependent launch, stmatrix, named barriers, setmaxnreg, and
 * wgmma with its shared-memory descriptors and the 128-byte swizzled tiles they describe.
 *
 * The vocabulary stages 6 and 8 share beyond the instructions is here too: the ring of buffers on
 * mbarriers (pipeline_state), a consumer thread's place in its warpgroups (consumer_place), and
 * whether this build has the sm_90a kernels (hopper_code_here, host code).
 *
 * The wrappers a kernel of every target compiles (stage 7's) give no instruction, or a trap where
 * the launcher never goes, in code for targets before sm_90. wgmma and setmaxnreg exist only in
 * sm_90a code: their callers compile them only there (HOPPER_KERNELS, below).
 * Device code for one translation unit (a stage's attention.cu includes it).
 */
#pragma once

#include <cuda.h>

#include "kernel_cache.cuh"  // kernel_versions (hopper_code_here)
#include "warp.cuh"

// 1 in sm_90a code, the only code with wgmma and setmaxnreg: stages 6 and 8 compile their kernels'
// bodies only there (elsewhere an empty kernel, which their launchers never start).
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define HOPPER_KERNELS 1
#else
#define HOPPER_KERNELS 0
#endif

// Whether `kernel`, one of a stage's sm_90a kernels, has its sm_90a code on this device (a
// compute_75 PTX build JIT-compiled on an H100 has only the empty kernel). Host code.
static inline int hopper_code_here(const void *kernel) {
    int ptx = 0, binary = 0;
    if (kernel_versions(kernel, &ptx, &binary) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return ptx >= 90 && binary >= 90;
}

/* ---- warpgroups ------------------------------------------------------------------------------ */

// wgmma's unit: a warpgroup, 4 consecutive warps (the first a multiple of 4), computes 64 rows,
// 16 deep (fp16), any N from 8 to 256 in steps of 8.
inline constexpr int WGMMA_M = 64;
inline constexpr int WGMMA_K = 16;
inline constexpr int WARPS_PER_WARPGROUP = 4;
inline constexpr int WARPGROUP = WARPS_PER_WARPGROUP * WARP_SIZE;  // 128 threads

// The shared memory a block may have on an H100 or H200 (opting in past the default 48 KB): the
// budget the Hopper stages' tile choices are made against at compile time.
inline constexpr int SMEM_PER_BLOCK_MAX = 227 * 1024;

// Work in sections of 2^shift heads (stages 6 and 8, under a causal mask: each section's longest
// work first), as a shift: the most heads, a power of two dividing `heads`, whose bytes the L2
// keeps (head_bytes each) fit `budget`; below SECTION_SHIFT_MAX, so that 2 << shift stays an int.
inline constexpr int SECTION_SHIFT_MAX = 30;
static inline int section_shift_for(int heads, size_t head_bytes, size_t budget) {
    int shift = 0;
    while (shift < SECTION_SHIFT_MAX && heads % (2 << shift) == 0 &&
           (size_t)(2 << shift) * head_bytes <= budget)
        ++shift;
    return shift;
}

// Warp specialization (stages 6 and 8): warpgroup 0 of a block is the producer (copies; stage 8's
// dQ reductions and stores too), with few registers; the consumers, warpgroups 1 .. C, compute.
inline constexpr int PRODUCER_WARPGROUPS = 1;

// A consumer thread's place: its warpgroup among the consumers (wg, from 0: 64 rows of the block,
// query rows in stage 6, keys in stage 8), its warp in the warpgroup (16 of those rows), its lane,
// and the lane's fragment row g and column pair t (warp.cuh: rows g and g + 8 of the warp's 16).
typedef struct {
    int wg, warp, lane, g, t;
} consumer_place;

// Where this consumer thread sits. The warpgroup index is read from lane 0, so that the compiler
// knows it is one value per warp and keeps the addresses and descriptors built from it in uniform
// registers, where wgmma takes them (stage 6's LOG.md, step 8).
__device__ __forceinline__ consumer_place consumer_place_of_thread() {
    consumer_place p;
    p.wg = __shfl_sync(FULL_WARP, (int)threadIdx.x / WARPGROUP, 0) - PRODUCER_WARPGROUPS;
    p.warp = (threadIdx.x / WARP_SIZE) % WARPS_PER_WARPGROUP;
    p.lane = threadIdx.x % WARP_SIZE;
    p.g = p.lane / QUAD;
    p.t = p.lane % QUAD;
    return p;
}

/* ---- mbarriers ------------------------------------------------------------------------------- */

// An mbarrier (8 bytes of shared memory) completes a phase when `count` arrivals have happened
// and every byte announced with expect_tx has landed. Waiting names the phase by its parity.
inline constexpr int MBARRIER_BYTES = 8;
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

// After a block's mbar_init: the initialised barriers become visible to the copy engine (the
// async proxy) before a copy completes on them.
__device__ __forceinline__ void fence_barrier_init() {
    asm volatile("fence.mbarrier_init.release.cluster;\nfence.proxy.async.shared::cta;\n" ::
                     : "memory");
}

// One arrival that also announces `bytes` of TMA traffic to wait for (the producer's).
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
                 : "memory");
}

// Announce `bytes` of TMA traffic without arriving: the caller's arrival comes later (stage 8's
// load warp announces the tiles, then every lane arrives after its own stores).
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.expect_tx.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(bytes)
                 : "memory");
}

__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

// An arrival that happens once every cp.async this thread has issued so far is complete (their
// writes visible to whoever waits for the phase); .noinc: it is one of the `count` arrivals the
// barrier was initialised with, as mbar_arrive's.
__device__ __forceinline__ void mbar_arrive_after_cp_async(uint32_t bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}

// Spin until the phase of the given parity has completed. A fresh barrier is in phase 0, so
// waiting for parity 1 returns at once: that is how a producer finds every buffer empty.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
    uint32_t done;
    do {
        asm volatile(
            "{\n"
            ".reg .pred p;\n"
            "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
            "selp.u32 %0, 1, 0, p;\n"
            "}\n"
            : "=r"(done)
            : "r"(bar), "r"(parity)
            : "memory");
    } while (!done);
}

/* ---- rings of buffers on mbarriers ----------------------------------------------------------- */

// A ring of SLOTS buffers, each with a "full" mbarrier (and most with an "empty" one), used in
// turn: the count-th use (counted over the whole block, across its work, so the ring never
// resets) is slot count % SLOTS, in that slot's phase count / SLOTS, of which a wait names the
// parity. The side that reads a buffer waits on "full" for that phase; the side that fills it
// waits on "empty" for the phase before (the readers' release of the slot's last use), which a
// fresh barrier counts as complete. Stage 6: the K/V ring and the Q buffers; stage 8: the Q/dO
// ring, the dS^T buffers and the dQ staging tiles.
template <int SLOTS>
struct pipeline_state {
    int count;  // >= 0: taken as unsigned, % and / by SLOTS are a mask and a shift
    __device__ __forceinline__ int slot() const { return (int)((uint32_t)count % SLOTS); }
    __device__ __forceinline__ uint32_t phase() const { return ((uint32_t)count / SLOTS) & 1; }
    __device__ __forceinline__ uint32_t empty_phase() const { return phase() ^ 1; }
    __device__ __forceinline__ pipeline_state next() const { return {count + 1}; }
    __device__ __forceinline__ pipeline_state previous() const { return {count - 1}; }
};

// A persistent grid (stages 6 and 8): the blocks start with work tiles 0 .. gridDim.x - 1 and each
// takes its next from a global counter, zeroed before the kernel (a memset in the launcher, which
// a CUDA graph replays), that hands out work tiles gridDim.x, gridDim.x + 1, ... as asked.
__device__ __forceinline__ int take_from_counter(int *counter) {
    return (int)gridDim.x + atomicAdd(counter, 1);
}
// A work slot in shared memory: one thread writes a work tile's index, one thread of each warp
// that needs it reads it, in the order a ring's mbarriers give them. Both are atomics:
// compute-sanitizer's racecheck does not model mbarriers for ordinary shared memory accesses.
__device__ __forceinline__ void write_work_slot(int *slot, int w) {
    atomicExch(slot, w);
}
__device__ __forceinline__ int read_work_slot(int *slot) {
    return atomicAdd(slot, 0);
}
// The slot read once per warp (by `lane` 0) and broadcast: the value is one per warp, which the
// compiler then knows.
__device__ __forceinline__ int read_work_slot_by_warp(int *slot, int lane) {
    int w = 0;
    if (lane == 0) w = read_work_slot(slot);
    return __shfl_sync(FULL_WARP, w, 0);
}

/* ---- TMA: bulk tensor copies and reductions -------------------------------------------------- */

// Copy the box at coordinates (c0 = column, c1 = row, c2 = head, c3 = batch) of the tensor that
// `map` describes into shared memory at dst; completion adds the box's bytes to `bar`.
__device__ __forceinline__ void tma_load_4d(uint32_t dst, const CUtensorMap *map, uint32_t bar,
                                            int c0, int c1, int c2, int c3) {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(dst),
        "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
        : "memory");
}

// Bring the box at (c0, c1, c2, c3) of the tensor `map` describes into the L2 cache, ahead of a
// tma_load_4d of it that has to wait for its shared memory: that copy then reads the L2, not HBM.
__device__ __forceinline__ void tma_prefetch_4d(const CUtensorMap *map, int c0, int c1, int c2,
                                                int c3) {
    asm volatile("cp.async.bulk.prefetch.tensor.4d.L2.global.tile [%0, {%1, %2, %3, %4}];\n" ::"l"(
                     (uint64_t)map),
                 "r"(c0), "r"(c1), "r"(c2), "r"(c3)
                 : "memory");
}

// The box at (c0, c1, c2, c3) of the tensor `map` describes, from shared memory at src. Rows past
// the tensor's end are not written. Stores are tracked per thread in bulk groups.
__device__ __forceinline__ void tma_store_4d(const CUtensorMap *map, uint32_t src, int c0, int c1,
                                             int c2, int c3) {
    asm volatile(
        "cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n" ::
            "l"((uint64_t)map),
        "r"(src), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
        : "memory");
}

// The box of *map at coordinates (c0, c1, c2, c3) += the shared-memory box at src, by the TMA
// unit (coordinates past the tensor's ends are skipped), tracked in this thread's bulk groups.
// The shared-memory writes it reads must be visible to the async proxy (fence_proxy_async, then a
// barrier for the other threads' writes). Before sm_90: a trap (no caller goes there).
__device__ __forceinline__ void tma_reduce_add_4d(const CUtensorMap *map, uint32_t src, int c0,
                                                  int c1, int c2, int c3) {
#if __CUDA_ARCH__ >= 900
    asm volatile(
        "cp.reduce.async.bulk.tensor.4d.global.shared::cta.add.tile.bulk_group"
        " [%0, {%2, %3, %4, %5}], [%1];\n" ::"l"((uint64_t)map),
        "r"(src), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
        : "memory");
#else
    (void)map, (void)src, (void)c0, (void)c1, (void)c2, (void)c3;
    __trap();
#endif
}

// The floats of `bytes` bytes of global memory at dst += those of shared memory at src, by the TMA
// unit as one bulk copy (no tensor map: both ranges contiguous, 16-byte aligned, bytes a multiple
// of 16), tracked in this thread's bulk groups; the shared-memory writes it reads made visible to
// the async proxy first, as for tma_reduce_add_4d. Before sm_90: a trap (no caller goes there).
__device__ __forceinline__ void bulk_reduce_add_f32(float *dst, uint32_t src, uint32_t bytes) {
#if __CUDA_ARCH__ >= 900
    asm volatile(
        "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst),
        "r"(src), "r"(bytes)
        : "memory");
#else
    (void)dst, (void)src, (void)bytes;
    __trap();
#endif
}

// to[0] += x, to[1] += y in global memory, one fp32 reduction of two floats (red.global.add.v2.f32,
// sm_90 on; relaxed, no value returned): stage 8's atomics variant adds dQ_i's part with it.
// Before sm_90: a trap (no caller goes there).
__device__ __forceinline__ void red_add_f32x2(float *to, float x, float y) {
#if __CUDA_ARCH__ >= 900
    asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(to), "f"(x), "f"(y) : "memory");
#else
    (void)to, (void)x, (void)y;
    __trap();
#endif
}

// to[0..3] += x, y, z, w in one reduction (to 16-byte aligned).
__device__ __forceinline__ void red_add_f32x4(float *to, float x, float y, float z, float w) {
#if __CUDA_ARCH__ >= 900
    asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(to), "f"(x), "f"(y),
                 "f"(z), "f"(w)
                 : "memory");
#else
    (void)to, (void)x, (void)y, (void)z, (void)w;
    __trap();
#endif
}

// A counter in global memory that blocks take turns by (stage 8's deterministic dQ): read it with
// acquire semantics at GPU scope (what the block that raised it wrote before is visible after),
// and raise it with release semantics (what this thread wrote before is visible to whoever reads
// the new value with acquire).
__device__ __forceinline__ int ld_acquire_gpu(const int *at) {
    int v;
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(at) : "memory");
    return v;
}
__device__ __forceinline__ void red_release_gpu_add(int *at, int v) {
    asm volatile("red.release.gpu.global.add.s32 [%0], %1;\n" ::"l"(at), "r"(v) : "memory");
}

// The thread's bulk stores and reductions issued since the last commit form one bulk group.
__device__ __forceinline__ void bulk_commit() {
#if __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
#endif
}

// Wait until the thread's bulk groups have read their shared memory (READ_ONLY) or are complete.
template <bool READ_ONLY>
__device__ __forceinline__ void bulk_wait() {
#if __CUDA_ARCH__ >= 900
    if (READ_ONLY)
        asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
    else
        asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
#endif
}

// Ordinary shared-memory writes become visible to the copy engine (the async proxy).
__device__ __forceinline__ void fence_proxy_async() {
#if __CUDA_ARCH__ >= 900
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

// The same for global memory, both ways: the copy engine's completed writes (a finished bulk
// reduction) are ordered with this thread's ordinary accesses that follow, and its ordinary
// accesses (an acquire) with the bulk operations it issues next.
__device__ __forceinline__ void fence_proxy_async_global() {
#if __CUDA_ARCH__ >= 900
    asm volatile("fence.proxy.async.global;\n" ::: "memory");
#endif
}

// Bring a tensor map (a kernel parameter) into the copy engine's cache ahead of its first copy.
__device__ __forceinline__ void prefetch_tensor_map(const CUtensorMap *map) {
    asm volatile("prefetch.tensormap [%0];\n" ::"l"((uint64_t)map) : "memory");
}

/* ---- stmatrix -------------------------------------------------------------------------------- */

// Four 8 x 8 fp16 matrices from registers to shared memory, the inverse of ldmatrix.x4: register i
// holds matrix i in the accumulator layout (lane 4g + t: columns 2t, 2t + 1 of row g), and lane L
// gives the address of row L % 8 of matrix L / 8. Before sm_90: a trap (no caller goes there).
inline constexpr int STMATRIX_ROWS = 8;
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, uint32_t m0, uint32_t m1, uint32_t m2,
                                            uint32_t m3) {
#if __CUDA_ARCH__ >= 900
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr),
                 "r"(m0), "r"(m1), "r"(m2), "r"(m3)
                 : "memory");
#else
    (void)addr, (void)m0, (void)m1, (void)m2, (void)m3;
    __trap();
#endif
}

/* ---- named barriers and setmaxnreg ----------------------------------------------------------- */

// Named barriers (barrier 0 is __syncthreads'): bar.sync waits until THREADS threads (a multiple
// of the warp size, the caller's included) have arrived on barrier `id`; bar.arrive counts the
// caller's warp there and goes on.
template <int THREADS>
__device__ __forceinline__ void named_barrier_sync(int id) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "n"(THREADS) : "memory");
}
template <int THREADS>
__device__ __forceinline__ void named_barrier_arrive(int id) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "n"(THREADS) : "memory");
}

// setmaxnreg (sm_90a): the registers of each thread of the calling warpgroup become REGS, given
// back to the block's pool (dec) or taken from it (inc).
template <int REGS>
__device__ __forceinline__ void registers_decrease() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(REGS));
}
template <int REGS>
__device__ __forceinline__ void registers_increase() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(REGS));
}

/* ---- wgmma: shared-memory descriptors -------------------------------------------------------- */

// A shared-memory matrix descriptor (PTX ISA, "matrix descriptor format"): the start address
// (bits 0-13), the leading- (16-29) and stride-dimension (32-45) byte offsets, all three in
// 16-byte units, and the swizzle mode (bits 62-63, 1 = 128-byte swizzle). Tiles start
// 1024-byte aligned, so the base offset is 0.
inline constexpr int DESC_UNIT_SHIFT = 4;            // 16-byte units
inline constexpr uint32_t DESC_ADDR_MASK = 0x3FFFF;  // the 18 address bits the 14-bit field holds
inline constexpr int DESC_LEAD_SHIFT = 16;
inline constexpr int DESC_STRIDE_SHIFT = 32;
inline constexpr uint64_t DESC_SWIZZLE_128B = 1ull << 62;
__device__ __forceinline__ uint64_t smem_desc(uint32_t addr, uint32_t lead_bytes,
                                              uint32_t stride_bytes) {
    return (uint64_t)((addr & DESC_ADDR_MASK) >> DESC_UNIT_SHIFT) |
           (uint64_t)(lead_bytes >> DESC_UNIT_SHIFT) << DESC_LEAD_SHIFT |
           (uint64_t)(stride_bytes >> DESC_UNIT_SHIFT) << DESC_STRIDE_SHIFT | DESC_SWIZZLE_128B;
}

// The descriptor of the same matrix `bytes` further on. Only the start address field changes,
// and inside shared memory it never carries out of its 14 bits, so an add to the whole
// descriptor does it: one add from a tile's descriptor, not a fresh encoding.
__device__ __forceinline__ uint64_t desc_advance(uint64_t desc, uint32_t bytes) {
    return desc + (bytes >> DESC_UNIT_SHIFT);
}

/* ---- wgmma: 128-byte swizzled tiles and their descriptors ------------------------------------ */

// The 128-byte swizzle works on rows of 128 bytes: 64 halves. A tile of D columns is stored as
// D / 64 slabs of [rows, 64] halves, one TMA copy each. In a slab, the 16-byte chunk c of row r
// sits at chunk position c ^ (r % 8): the pattern repeats every 8 rows, and those 8-row groups
// (1024 bytes, the swizzle atom) are the stride the wgmma descriptors give.
inline constexpr int SLAB_COLS = 64;
inline constexpr int SLAB_ROW_BYTES = SLAB_COLS * HALF_BYTES;
inline constexpr int CHUNKS_PER_SLAB_ROW = SLAB_ROW_BYTES / CHUNK_BYTES;
inline constexpr int SWIZZLE_ROWS = 8;
inline constexpr int SWIZZLE_ATOM_BYTES = SWIZZLE_ROWS * SLAB_ROW_BYTES;

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
// The same address in two parts, for a thread that writes many chunks of one row: the row's
// base in a 1024-byte aligned tile (swizzle_row_base: its bits 4-6 hold row % 8, as the chunk's
// position will), then each chunk by one XOR with a constant and one add (swizzled_chunk_at), so
// that the addresses need not be kept as registers.
__device__ __forceinline__ uint32_t swizzle_row_base(uint32_t tile, int row) {
    return tile + row * SLAB_ROW_BYTES + (row % SWIZZLE_ROWS) * CHUNK_BYTES;
}
template <int ROWS>
__device__ __forceinline__ uint32_t swizzled_chunk_at(uint32_t row_base, int chunk) {
    return (row_base ^ (uint32_t)((chunk % CHUNKS_PER_SLAB_ROW) * CHUNK_BYTES)) +
           (chunk / CHUNKS_PER_SLAB_ROW) * (ROWS * SLAB_ROW_BYTES);
}

// Operand A or B stored "K-major" (the K dimension contiguous: Q and K rows, D halves each).
// Within a 64-column slab, k-step kk starts kk * 32 bytes into each 128-byte row (the hardware
// applies the swizzle to the address); the 8-row groups are 1024 bytes apart (stride offset);
// the leading offset is unused in this mode.
inline constexpr int DESC_UNUSED_LEAD_BYTES = 16;
__device__ __forceinline__ uint64_t desc_k_major(uint32_t tile) {
    return smem_desc(tile, DESC_UNUSED_LEAD_BYTES, SWIZZLE_ATOM_BYTES);
}
template <int ROWS>
__device__ __forceinline__ uint64_t desc_k_major_step(uint64_t tile_desc, int kk) {
    constexpr int STEPS_PER_SLAB = SLAB_COLS / WGMMA_K;
    return desc_advance(tile_desc, slab_offset<ROWS>(kk / STEPS_PER_SLAB) +
                                       (kk % STEPS_PER_SLAB) * (WGMMA_K * HALF_BYTES));
}

// Operand B (or A) stored "MN-major" (N, or M, contiguous; the wgmma's transpose bit for that
// operand is set): V's rows are keys = the K dimension of P V, with the D output columns
// contiguous. Along N the 64-column slabs are ROWS * 128 bytes apart (leading offset); along K the
// 8-row groups 1024 bytes (stride offset). k-step kk is WGMMA_K rows further down: 2 swizzle atoms.
template <int ROWS>
__device__ __forceinline__ uint64_t desc_mn_major(uint32_t tile) {
    return smem_desc(tile, ROWS * SLAB_ROW_BYTES, SWIZZLE_ATOM_BYTES);
}
__device__ __forceinline__ uint64_t desc_mn_major_step(uint64_t tile_desc, int kk) {
    return desc_advance(tile_desc, kk * WGMMA_K * SLAB_ROW_BYTES);
}

/* ---- wgmma: the asynchronous warpgroup products ---------------------------------------------- */

// wgmma runs asynchronously: fence before the first of a batch (the registers it reads or
// accumulates into were written by ordinary instructions), commit the batch as a group, wait
// until at most N groups are still running.
__device__ __forceinline__ void wgmma_fence() {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// The compiler does not know that an accumulator changes between the wgmma that names it and
// the wait: pinning each register here (after the wait, and before the fence) keeps it from
// moving ordinary reads or writes of the accumulator into that window.
template <int R>
__device__ __forceinline__ void pin_registers(float (&d)[R]) {
#pragma unroll
    for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
// The same for an A operand in registers, which the wgmma reads until it is done: pinned after
// the wait, it counts as live until then, and its registers are not given to other values while
// the wgmma may still read them.
template <int R>
__device__ __forceinline__ void pin_registers(uint32_t (&a)[R]) {
#pragma unroll
    for (int i = 0; i < R; ++i) asm volatile("" : "+r"(a[i])::"memory");
}

// The accumulator operands of one wgmma: ACC<n>(d) lists n registers of d as "+f" operands,
// REGS<n> their %0 .. %(n-1) in the instruction.
#define ACC8(d, i)                                                                  \
    "+f"(d[i + 0]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), \
        "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define ACC32(d) ACC8(d, 0), ACC8(d, 8), ACC8(d, 16), ACC8(d, 24)
#define ACC64(d) ACC32(d), ACC8(d, 32), ACC8(d, 40), ACC8(d, 48), ACC8(d, 56)
#define ACC88(d) ACC64(d), ACC8(d, 64), ACC8(d, 72), ACC8(d, 80)
#define REGS32                                                                                   \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
    "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define REGS64                                                                           \
    REGS32                                                                               \
    ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define REGS88                                                                           \
    REGS64                                                                               \
    ", %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
    "%80, %81, %82, %83, %84, %85, %86, %87"

// The products below, each one wgmma.mma_async m64nNk16 with fp32 accumulators, in fp16
// (BF16 = false) or bf16 (true). WGMMA_SS and WGMMA_RS write the asm statement of both types (a
// function's BF16 picks one): N the columns, ACC and REGS its N / 2 accumulator operands, then the
// numbers of the operands after them in the instruction (string literals, "%" before each).
#define WGMMA_BOTH_TYPES(ASM, N, ...)    \
    do {                                 \
        if constexpr (BF16)              \
            ASM(N, "bf16", __VA_ARGS__); \
        else                             \
            ASM(N, "f16", __VA_ARGS__);  \
    } while (0)
// SS: both operands from shared memory by descriptor (A, B), the accumulate flag (P: 0 overwrites
// d), A's and B's transpose bits (TA, TB: the immediates TRANS_A, TRANS_B; 0 = K-major).
// clang-format off: the instruction's text as it reads
#define WGMMA_SS_ASM(N, T, ACC, REGS, A, B, P, TA, TB)                                 \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" P ", 0;\n"                       \
                 "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." T "." T " {" REGS \
                 "}, %" A ", %" B ", p, 1, 1, %" TA ", %" TB ";\n}\n"                  \
                 : ACC(d)                                                            \
                 : "l"(a), "l"(b), "r"(accumulate), "n"(TRANS_A), "n"(TRANS_B))
// clang-format on
#define WGMMA_SS(N, ...) WGMMA_BOTH_TYPES(WGMMA_SS_ASM, N, __VA_ARGS__)
// RS: A from four registers (A0 .. A3; its layout below), B by descriptor, MN-major (B), the
// accumulate flag (P).
// clang-format off
#define WGMMA_RS_ASM(N, T, ACC, REGS, A0, A1, A2, A3, B, P)                            \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" P ", 0;\n"                       \
                 "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." T "." T " {" REGS \
                 "}, {%" A0 ", %" A1 ", %" A2 ", %" A3 "}, %" B ", p, 1, 1, 1;\n}\n"    \
                 : ACC(d)                                                            \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate))
// clang-format on
#define WGMMA_RS(N, ...) WGMMA_BOTH_TYPES(WGMMA_RS_ASM, N, __VA_ARGS__)

// d (64 x 128, fp32) {=, +=} A (64 x 16) * B (16 x 128), both from shared memory, K-major by
// default (TRANS_A, TRANS_B: as wgmma_m64n64_ss's below). Lane l of warp w in the warpgroup,
// g = l / 4, t = l % 4, holds d[acc_index(i, h, c)] = (row 16w + g + 8h, column 8i + 2t + c).
template <bool BF16 = false, int TRANS_A = 0, int TRANS_B = 0>
__device__ __forceinline__ void wgmma_m64n128_ss(float (&d)[64], uint64_t a, uint64_t b,
                                                 int accumulate) {
    WGMMA_SS(128, ACC64, REGS64, "64", "65", "66", "67", "68");
}

// The same with 176 columns: 88 accumulator registers.
template <bool BF16 = false, int TRANS_A = 0, int TRANS_B = 0>
__device__ __forceinline__ void wgmma_m64n176_ss(float (&d)[88], uint64_t a, uint64_t b,
                                                 int accumulate) {
    WGMMA_SS(176, ACC88, REGS88, "88", "89", "90", "91", "92");
}

// d (64 x 64, fp32) {=, +=} A (64 x 16) * B (16 x 64), both from shared memory, each K-major (its
// TRANS bit 0) or MN-major (1: M, or N, contiguous; the 16-bit types' transpose bits). Stage 8's
// S^T = K Q^T and dP^T = V dO^T (K-major both) and dQ = dS K (MN-major both: dS^T and K as stored).
template <bool BF16, int TRANS_A, int TRANS_B>
__device__ __forceinline__ void wgmma_m64n64_ss(float (&d)[32], uint64_t a, uint64_t b,
                                                int accumulate) {
    WGMMA_SS(64, ACC32, REGS32, "32", "33", "34", "35", "36");
}

// d (64 x N, fp32) {=, +=} A (64 x 16 fp16 or bf16, in registers) * B (16 x N, MN-major in shared
// memory). A's layout is the accumulator's, two columns packed per register: a[0] = (row g,
// columns 2t, 2t+1), a[1] = (row g+8, same), a[2] = (row g, 2t+8, 2t+9), a[3] = (row g+8, same).
template <bool BF16 = false>
__device__ __forceinline__ void wgmma_m64n128_rs(float (&d)[64], const uint32_t *a, uint64_t b,
                                                 int accumulate) {
    WGMMA_RS(128, ACC64, REGS64, "64", "65", "66", "67", "68", "69");
}
template <bool BF16 = false>
__device__ __forceinline__ void wgmma_m64n64_rs(float (&d)[32], const uint32_t *a, uint64_t b,
                                                int accumulate) {
    WGMMA_RS(64, ACC32, REGS32, "32", "33", "34", "35", "36", "37");
}

// The head dims 96 and 256 (stages 6 and 8): S = Q K^T over 80 keys (stage 6, D = 256; stage 8's
// S^T over 32 queries at D = 256: wgmma_m64n32_ss below), and d += A B over N = 96 and 256 columns
// with A from registers (stage 6's O += P V; stage 8's dK, dV at D = 96). wgmma's N goes to 256 in
// steps of 8; a 64 x N fp32 accumulator is N / 2 registers a thread. B is read MN-major from
// 64-column slabs, the next slab a leading offset further on: N = 96 covers one slab and half of
// the next, N = 256 four.
#define ACC40(d) ACC32(d), ACC8(d, 32)
#define ACC48(d) ACC40(d), ACC8(d, 40)
#define ACC128(d)                                                                            \
    ACC64(d), ACC8(d, 64), ACC8(d, 72), ACC8(d, 80), ACC8(d, 88), ACC8(d, 96), ACC8(d, 104), \
        ACC8(d, 112), ACC8(d, 120)
#define REGS40 \
    REGS32     \
    ", %32, %33, %34, %35, %36, %37, %38, %39"
#define REGS48 \
    REGS32     \
    ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47"
#define ACC56(d) ACC48(d), ACC8(d, 48)
#define REGS56 \
    REGS48     \
    ", %48, %49, %50, %51, %52, %53, %54, %55"
#define REGS128                                                                                    \
    REGS64                                                                                         \
    ", %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79"             \
    ", %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95"             \
    ", %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111" \
    ", %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, " \
    "%127"

// d (64 x 32) {=, +=} A (64 x 16) * B (16 x 32), both from shared memory (K-major by default):
// 16 accumulator registers (stage 8's S^T and dP^T at D = 256, a warpgroup's 32 queries).
#define ACC16(d) ACC8(d, 0), ACC8(d, 8)
#define REGS16 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
template <bool BF16, int TRANS_A = 0, int TRANS_B = 0>
__device__ __forceinline__ void wgmma_m64n32_ss(float (&d)[16], uint64_t a, uint64_t b,
                                                int accumulate) {
    WGMMA_SS(32, ACC16, REGS16, "16", "17", "18", "19", "20");
}

// d (64 x 80) {=, +=} A (64 x 16) * B (16 x 80), both from shared memory (K-major by default).
template <bool BF16, int TRANS_A = 0, int TRANS_B = 0>
__device__ __forceinline__ void wgmma_m64n80_ss(float (&d)[40], uint64_t a, uint64_t b,
                                                int accumulate) {
    WGMMA_SS(80, ACC40, REGS40, "40", "41", "42", "43", "44");
}

// d (64 x 112) {=, +=} A (64 x 16, K-major) * B (16 x 112, K-major), both from shared memory.
template <bool BF16, int TRANS_A = 0, int TRANS_B = 0>
__device__ __forceinline__ void wgmma_m64n112_ss(float (&d)[56], uint64_t a, uint64_t b,
                                                 int accumulate) {
    WGMMA_SS(112, ACC56, REGS56, "56", "57", "58", "59", "60");
}

// d (64 x N) {=, +=} A (64 x 16, registers) * B (16 x N, MN-major in shared memory), N = 96 and
// 256; A's registers as wgmma_m64n128_rs's.
template <bool BF16>
__device__ __forceinline__ void wgmma_m64n96_rs(float (&d)[48], const uint32_t *a, uint64_t b,
                                                int accumulate) {
    WGMMA_RS(96, ACC48, REGS48, "48", "49", "50", "51", "52", "53");
}
template <bool BF16>
__device__ __forceinline__ void wgmma_m64n256_rs(float (&d)[128], const uint32_t *a, uint64_t b,
                                                 int accumulate) {
    WGMMA_RS(256, ACC128, REGS128, "128", "129", "130", "131", "132", "133");
}

// The wrappers above by their N, where a kernel's tile sizes give it at compile time (keys per
// tile, a head dim, a warpgroup's columns): one call where each caller would choose among them.
template <int N, bool BF16, int TRANS_A = 0, int TRANS_B = 0>
__device__ __forceinline__ void wgmma_ss(float (&d)[N / 2], uint64_t a, uint64_t b,
                                         int accumulate) {
    static_assert(N == 32 || N == 64 || N == 80 || N == 112 || N == 128 || N == 176,
                  "an N with a wrapper from shared memory above");
    if constexpr (N == 32)
        wgmma_m64n32_ss<BF16, TRANS_A, TRANS_B>(d, a, b, accumulate);
    else if constexpr (N == 64)
        wgmma_m64n64_ss<BF16, TRANS_A, TRANS_B>(d, a, b, accumulate);
    else if constexpr (N == 80)
        wgmma_m64n80_ss<BF16, TRANS_A, TRANS_B>(d, a, b, accumulate);
    else if constexpr (N == 112)
        wgmma_m64n112_ss<BF16, TRANS_A, TRANS_B>(d, a, b, accumulate);
    else if constexpr (N == 128)
        wgmma_m64n128_ss<BF16, TRANS_A, TRANS_B>(d, a, b, accumulate);
    else
        wgmma_m64n176_ss<BF16, TRANS_A, TRANS_B>(d, a, b, accumulate);
}
template <int N, bool BF16>
__device__ __forceinline__ void wgmma_rs(float (&d)[N / 2], const uint32_t *a, uint64_t b,
                                         int accumulate) {
    static_assert(N == 64 || N == 96 || N == 128 || N == 256,
                  "an N with a wrapper from registers above");
    if constexpr (N == 64)
        wgmma_m64n64_rs<BF16>(d, a, b, accumulate);
    else if constexpr (N == 96)
        wgmma_m64n96_rs<BF16>(d, a, b, accumulate);
    else if constexpr (N == 128)
        wgmma_m64n128_rs<BF16>(d, a, b, accumulate);
    else
        wgmma_m64n256_rs<BF16>(d, a, b, accumulate);
}
