/*
 * stage6_hopper: FlashAttention-3's machinery on Hopper (sm_90a), written out instruction by
 * instruction.
 *
 * What this stage adds over stage 5 (README.md has the log, step by step, with measurements):
 *  - The tensor memory accelerator (TMA) moves Q, K and V: one thread issues a bulk tensor copy
 *    per 64-column slab of a tile (cp.async.bulk.tensor, a tensor map encoded on the host and
 *    passed as a __grid_constant__ parameter), and the copy engine writes it into shared memory
 *    already in the 128-byte swizzle the tensor cores read. Completion is counted in bytes on an
 *    mbarrier. K and V each have a ring of STAGES buffers with a "full" and an "empty" barrier.
 *  - wgmma.mma_async: a warpgroup (4 warps, 128 threads) multiplies a 64-row slab at a time.
 *    S = Q K^T reads both operands straight from shared memory through 64-bit descriptors; O += P V
 *    takes P from registers (the S accumulator, packed to fp16 in place) and V from shared memory.
 *    No ldmatrix, no per-warp operand traffic: the SASS shows HGMMA where stage 5 had HMMA.
 *  - Warp specialisation: warpgroup 0 is the producer (one thread issues every TMA copy, the
 *    other warps leave at once); the other warpgroups are consumers, 64 query rows each (two, or
 *    three at D = 64, causal from N = 2048 on). setmaxnreg hands the producer's registers to them.
 *  - Overlap: S_j = Q K_j^T and O += P_{j-1} V_{j-1} are issued together and the softmax of tile
 *    j runs under the P V wgmma; the consumer warpgroups take turns at issuing (ping-pong), so
 *    one's softmax runs under the others' GEMMs.
 *  - Persistent blocks, one per SM, taking work tiles (128 or 192 query rows of one head) from a
 *    global counter; each consumer runs one pipeline over the key tiles of all its work tiles
 *    (two Q buffers), so a work tile's first S is issued beside the last one's final P V.
 *  - exp2 with log2(e) folded into the scale, causal key tiles past the diagonal never loaded.
 *  - 176-key tiles at D = 128 without a causal mask from N = 4096 (fewer fixed costs per key),
 *    128 elsewhere.
 *  - The epilogue: with two consumers and room in shared memory, each warp writes its 16 rows of
 *    O with stmatrix into a swizzled staging tile and one lane stores them with a TMA copy
 *    (cp.async.bulk.tensor, shared to global); elsewhere the lanes of a quad exchange their
 *    pieces (shuffles) and store 16 bytes each.
 * Expected gain: about 1.6x over stage 5 (measured: 1.62x FlashAttention-2 and 1.00x cuDNN over
 * the fa2 shapes with N >= 1024 on an H200, README.md).
 *
 * Run:  make build && build/stage6_hopper --seq 16384 --heads 16 --dim 128 --causal --bench
 * Variants (--variant): default, nopersistent, nopingpong, nooverlap: each switches one step off.
 * Only on an H100/H200 with a build that has sm_90a code (make picks it on a Hopper GPU; the fat
 * build has it); everywhere else the stage reports itself unsupported (exit 3).
 *
 * NOTE: what is left is short rows. From N = 8192 this stage is ahead of cuDNN at both head
 * dims, causal or not; at N = 1024 it is at 0.92-0.98. The end of a work tile is most of it: an
 * experiment that writes no O at all is 5-10% faster at N = 1024; its instructions cost about
 * twice what its stores do (README.md, steps 11-14). B = H = 1 with short rows would need
 * split-KV.
 */

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

#include "attention.h"

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

/* ---- tunables ---------------------------------------------------------------------------- */

// wgmma's fixed shape for fp16: a warpgroup computes MMA_M = 64 rows, MMA_K = 16 deep, and
// any N from 8 to 256 in steps of 8 (here BC keys for S, D columns for O).
constexpr int MMA_M = 64;
constexpr int MMA_K = 16;
constexpr int WARPGROUP = 128;  // threads: 4 consecutive warps, the first a multiple of 4

// C consumer warpgroups of 64 query rows each, one producer warpgroup in front of them, one
// block per SM. Two consumers: 128 rows per work tile, 384 threads. Three (D = 64, FlashAttention-
// 3's choice there): 192 rows, 512 threads. At D = 64 the softmax costs as much per key as at
// D = 128 but the GEMMs half as much, and a third warpgroup's softmax helps to fill the tensor
// pipe: +6-12% at N = 16384, and, non-causal, +3.5%, +5.5% and +15% at N = 512, 1024 and 2048
// (H200, README.md). Causal, the 192-row tiles balance short rows worse: -8% and -9% at N = 512
// and 1024, +5% at 2048, hence the threshold for causal rows.
constexpr int THREE_CONSUMERS_MIN_N_CAUSAL = 2048;
template <int C>
__host__ __device__ constexpr int block_rows() {  // BR
    return C * MMA_M;
}
template <int C>
__host__ __device__ constexpr int block_threads() {
    return (C + 1) * WARPGROUP;
}

// Keys per K/V tile, BC (a template parameter of the kernel): 176 at D = 128 without a causal
// mask from N = 4096 (FlashAttention-3's choice), 128 otherwise. S is BC / 2 fp32 registers per
// consumer thread and P another BC / 4; with O_acc (D / 2) that is 196 of the 240 registers at
// D = 128, BC = 176. Longer key tiles spread the fixed costs of a tile (the waits, the turn, O's
// rescale, the row maxima's shuffles) over more keys: +1.6% to +2.9% at D = 128, N = 1024-16384
// (H200, README.md, step 9). But with 176 keys shared memory has room for neither a second Q
// buffer nor the O staging tiles (o_staged()), and on short rows the end of a work tile weighs
// more: with 128 keys N = 1024 is 2.0% faster and N = 2048 0.5%, N = 4096 0.2% slower (step 14).
// Causal, 176 lost 1-7% up to N = 4096 (the diagonal tiles waste more of their keys, and a
// 128-row work tile's last key tile is mostly past its rows); the three-consumer D = 64 kernels
// (160 registers) would spill with it.
constexpr int KEY_TILE_176_MIN_N = 4096;
static int key_tile_for(const attn_shape *s) {
    return s->D == 128 && !s->causal && s->N >= KEY_TILE_176_MIN_N ? 176 : 128;
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
// floats at D = 64, S 64, P 32).
template <int C>
__host__ __device__ constexpr int producer_regs() {
    return C == 2 ? 24 : 32;
}
template <int C>
__host__ __device__ constexpr int consumer_regs() {
    return C == 2 ? 240 : 160;
}

// The 128-byte swizzle works on rows of 128 bytes: 64 halves. A tile of D columns is stored as
// D / 64 slabs of [rows, 64] halves, one TMA copy each; a slab's 8-row groups are 1024 bytes
// (the swizzle repeats every 8 rows), which is the stride the wgmma descriptors give.
constexpr int SLAB_COLS = 64;
constexpr int SLAB_ROW_BYTES = SLAB_COLS * 2;
constexpr int SWIZZLE_ATOM_BYTES = 8 * SLAB_ROW_BYTES;

/* ---- device helpers: shared memory, mbarriers, TMA --------------------------------------- */

__device__ __forceinline__ uint32_t smem_u32(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

// An mbarrier completes a phase when `count` arrivals have happened and every byte announced with
// expect_tx has landed. Waiting names the phase by its parity (0, 1, 0, ...).
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

// One arrival that also announces `bytes` of TMA traffic to wait for (the producer's).
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
                 : "memory");
}

__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

// Spin until the phase of the given parity has completed. A fresh barrier is in phase 0, so
// waiting for parity 1 returns at once: that is how the producer finds every buffer empty.
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

// TMA: copy the box at coordinates (c0 = column, c1 = row, c2 = batch*head) of the tensor that
// `map` describes into shared memory at dst; completion adds the box's bytes to `bar`.
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const CUtensorMap *map, uint32_t bar,
                                            int c0, int c1, int c2) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(dst),
        "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
        : "memory");
}

// TMA store: the box at (c0, c1, c2) of the tensor `map` describes, from shared memory at src.
// Rows past the tensor's end are not written. Stores are tracked per thread in bulk groups.
__device__ __forceinline__ void tma_store_3d(const CUtensorMap *map, uint32_t src, int c0, int c1,
                                             int c2) {
    asm volatile(
        "cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%2, %3, %4}], [%1];\n" ::"l"(
            (uint64_t)map),
        "r"(src), "r"(c0), "r"(c1), "r"(c2)
        : "memory");
}
__device__ __forceinline__ void bulk_commit() {
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
// Wait until the thread's stores have read their shared memory (READ_ONLY) or are complete.
template <bool READ_ONLY>
__device__ __forceinline__ void bulk_wait_all() {
    if (READ_ONLY)
        asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
    else
        asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}
// Ordinary shared-memory writes become visible to the copy engine (the async proxy).
__device__ __forceinline__ void fence_proxy_async() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// stmatrix: four 8 x 8 fp16 matrices from registers in the mma accumulator layout (lane 4g + t
// holds columns 2t, 2t + 1 of row g, one register per matrix) to shared memory; lane L gives the
// address of row L % 8 of matrix L / 8.
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, uint32_t m0, uint32_t m1, uint32_t m2,
                                            uint32_t m3) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr),
                 "r"(m0), "r"(m1), "r"(m2), "r"(m3)
                 : "memory");
}

/* ---- device helpers: wgmma ---------------------------------------------------------------- */

// A shared-memory matrix descriptor (PTX ISA, "matrix descriptor format"): start address, the
// leading- and stride-dimension byte offsets (all in 16-byte units), and the swizzle mode
// (1 = 128-byte swizzle, bits 62-63). Tiles start 1024-byte aligned, so the base offset is 0.
__device__ __forceinline__ uint64_t smem_desc(uint32_t addr, uint32_t lead_bytes,
                                              uint32_t stride_bytes) {
    return (uint64_t)((addr & 0x3FFFF) >> 4) | (uint64_t)(lead_bytes >> 4) << 16 |
           (uint64_t)(stride_bytes >> 4) << 32 | 1ull << 62;
}

// The descriptor of the same matrix `bytes` further on. Only the start address field (the low
// 14 bits, in 16-byte units) changes, and inside shared memory it never carries out of them, so
// a 32-bit add does it: each wgmma's descriptor is one add from its tile's, not a fresh
// encoding (which took about ten instructions per wgmma, on the path that holds the turn).
__device__ __forceinline__ uint64_t desc_advance(uint64_t desc, uint32_t bytes) {
    return (desc & 0xFFFFFFFF00000000ull) | (uint32_t)((uint32_t)desc + (bytes >> 4));
}

// Operand A or B stored "K-major" (the K dimension contiguous: Q and K rows, D halves each).
// Within a 64-column slab, k-step kk starts kk * 32 bytes into each 128-byte row (the hardware
// applies the swizzle to the address); the 8-row groups are 1024 bytes apart (stride offset);
// the leading offset is unused in this mode.
__device__ __forceinline__ uint64_t desc_k_major(uint32_t tile) {
    return smem_desc(tile, 16, SWIZZLE_ATOM_BYTES);
}
template <int ROWS>
__device__ __forceinline__ uint64_t desc_k_major_step(uint64_t tile_desc, int kk) {
    constexpr int STEPS_PER_SLAB = SLAB_COLS / MMA_K;
    return desc_advance(tile_desc, (kk / STEPS_PER_SLAB) * (ROWS * SLAB_ROW_BYTES) +
                                       (kk % STEPS_PER_SLAB) * (MMA_K * 2));
}

// Operand B stored "MN-major" (N contiguous: V's rows are keys = the K dimension of P V, with
// the D output columns contiguous). Along N the 64-column slabs are ROWS * 128 bytes apart
// (leading offset); along K the 8-row groups 1024 bytes (stride offset). k-step kk is MMA_K key
// rows further down: 2 swizzle atoms.
template <int ROWS>
__device__ __forceinline__ uint64_t desc_mn_major(uint32_t tile) {
    return smem_desc(tile, ROWS * SLAB_ROW_BYTES, SWIZZLE_ATOM_BYTES);
}
__device__ __forceinline__ uint64_t desc_mn_major_step(uint64_t tile_desc, int kk) {
    return desc_advance(tile_desc, kk * MMA_K * SLAB_ROW_BYTES);
}

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
// The same for an A operand in registers (P of O += P V), which the wgmma reads until it is done:
// pinned after the wait, P counts as live until then. Otherwise, to the compiler P is dead once
// the wgmma is issued, and ptxas may give its registers to the softmax's temporaries, which
// then have to wait for the wgmma: the wait moves up in front of the softmax, and the overlap is
// gone (seen in the SASS and in ncu's stall samples).
template <int R>
__device__ __forceinline__ void pin_registers(uint32_t (&a)[R]) {
#pragma unroll
    for (int i = 0; i < R; ++i) asm volatile("" : "+r"(a[i])::"memory");
}

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

// d (64 x 128, fp32) {=, +=} A (64 x 16, K-major in shared memory) * B (16 x 128, K-major in
// shared memory). accumulate = 0 overwrites d. Lane l of warp w in the warpgroup, g = l / 4,
// t = l % 4, holds d[4i + 2h + c] = (row 16w + g + 8h, column 8i + 2t + c).
__device__ __forceinline__ void wgmma_m64n128_ss(float (&d)[64], uint64_t a, uint64_t b,
                                                 int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {" REGS64
        "}, %64, %65, p, 1, 1, 0, 0;\n}\n"
        : ACC64(d)
        : "l"(a), "l"(b), "r"(accumulate));
}

// The same with 176 columns (BC = 176): 88 accumulator registers.
__device__ __forceinline__ void wgmma_m64n176_ss(float (&d)[88], uint64_t a, uint64_t b,
                                                 int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %90, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n176k16.f32.f16.f16 {" REGS88
        "}, %88, %89, p, 1, 1, 0, 0;\n}\n"
        : ACC88(d)
        : "l"(a), "l"(b), "r"(accumulate));
}

// d (64 x N, fp32) {=, +=} A (64 x 16 fp16, in registers) * B (16 x N, MN-major in shared
// memory). A's layout is the accumulator's, two columns packed per register: a[0] = (row g,
// columns 2t, 2t+1), a[1] = (row g+8, same), a[2] = (row g, 2t+8, 2t+9), a[3] = (row g+8, same).
__device__ __forceinline__ void wgmma_m64n128_rs(float (&d)[64], const uint32_t *a, uint64_t b,
                                                 int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {" REGS64
        "}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
        : ACC64(d)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate));
}
__device__ __forceinline__ void wgmma_m64n64_rs(float (&d)[32], const uint32_t *a, uint64_t b,
                                                int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {" REGS32
        "}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
        : ACC32(d)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate));
}

// Registers per warpgroup role (sm_90a): the block starts with an even share, then the
// producer gives its surplus back and the consumers take it.
template <int REGS>
__device__ __forceinline__ void registers_decrease() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(REGS));
}
template <int REGS>
__device__ __forceinline__ void registers_increase() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(REGS));
}

/* ---- device helpers: softmax ------------------------------------------------------------- */

// 2^x in one MUFU.EX2 instruction; 2^-inf = +0.
__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// Two floats -> one register of two halves, lo in the low 16 bits (the lower column).
__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
    const __half2 h = __floats2half2_rn(lo, hi);
    uint32_t u;
    memcpy(&u, &h, sizeof(u));
    return u;
}

/* ---- the kernel's shared memory ---------------------------------------------------------- */

// Q_smem q_buffers() x [D/64 slabs][BR rows][64], then the K and V rings, each STAGES x
// [D/64][BC][64], then (where it fits, o_staged()) one O staging tile [D/64][64][64] per consumer
// warpgroup, then the mbarriers and the work tile indices. Every tile starts 1024-byte aligned
// (the swizzle atom).
template <int D, int C>
__host__ __device__ constexpr int q_bytes() {
    return block_rows<C>() * D * 2;
}
template <int D, int BC>
__host__ __device__ constexpr int kv_bytes() {
    return BC * D * 2;
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
    return MMA_M * D * 2;
}
template <int D, int C, int BC, int QB, bool STAGED>
__host__ __device__ constexpr int smem_bytes_with() {
    return 1024 /* alignment slack */ + QB * q_bytes<D, C>() + 2 * STAGES * kv_bytes<D, BC>() +
           (STAGED ? C * o_stage_bytes<D>() : 0) + BARRIERS * 8 +
           Q_BUFFERS_MAX * 4 /* the work tile indices the producer hands over */;
}
// Two Q buffers come first. O is staged in shared memory and stored by TMA (store_o_staged) with
// two consumers where there is room: not at D = 128 with BC = 176 (K, V and Q take 208 KB). With
// two consumers the staged epilogue gained 1.5-1.9% on causal rows at N = 1024 and 0.9% at 2048
// over store_o_direct; with three (D = 64) it lost 0.7-1.6% (H200, README.md, step 13).
template <int D, int C, int BC>
__host__ __device__ constexpr int q_buffers() {
    return smem_bytes_with<D, C, BC, 2, false>() <= SMEM_PER_BLOCK_MAX ? 2 : 1;
}
template <int D, int C, int BC>
__host__ __device__ constexpr bool o_staged() {
    return C == 2 && smem_bytes_with<D, C, BC, q_buffers<D, C, BC>(), true>() <= SMEM_PER_BLOCK_MAX;
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
    const uint32_t pad = ((smem_u32(raw) + 1023u) & ~1023u) - smem_u32(raw);
    s.Q = smem_u32(raw) + pad;
    s.K = s.Q + q_buffers<D, C, BC>() * q_bytes<D, C>();
    s.V = s.K + STAGES * kv_bytes<D, BC>();
    s.O = s.V + STAGES * kv_bytes<D, BC>();
    s.bar = s.O + (o_staged<D, C, BC>() ? C * o_stage_bytes<D>() : 0);
    s.work = (int *)(raw + pad + (s.bar - s.Q) + BARRIERS * 8);
    return s;
}
__device__ __forceinline__ uint32_t bar_at(const smem_tiles &s, int i) {
    return s.bar + 8 * i;
}
template <int D, int BC>
__device__ __forceinline__ uint32_t k_stage(const smem_tiles &s, int st) {
    return s.K + st * kv_bytes<D, BC>();
}
template <int D, int BC>
__device__ __forceinline__ uint32_t v_stage(const smem_tiles &s, int st) {
    return s.V + st * kv_bytes<D, BC>();
}

// A work tile: one batch*head and BR query rows, numbered head by head and, inside a head,
// those with the most key tiles (causal) first. A persistent block (one per SM) starts with work
// tile blockIdx.x and then takes the next one not yet taken from a global counter, so causal
// tiles of different lengths even out over the SMs as they would with one block per tile (the
// variant nopersistent, which launches exactly that). t numbers the block's work tiles (Q
// buffer t % q_buffers()).
typedef struct {
    int bh, q0, n_tiles, t;
} work_tile;

template <int C, int BC>
__device__ __forceinline__ work_tile work_at(int w, int N, int causal) {
    constexpr int BR = block_rows<C>();
    const int q_tiles = (N + BR - 1) / BR;
    work_tile t;
    t.bh = w / q_tiles;
    t.q0 = (q_tiles - 1 - w % q_tiles) * BR;
    const int all = (N + BC - 1) / BC;  // key tiles: all, or (causal) up to the last query row
    t.n_tiles = causal ? min(all, (t.q0 + BR + BC - 1) / BC) : all;
    t.t = 0;
    return t;
}

// The ring slot and the phase parity of the it-th key tile a block consumes.
__device__ __forceinline__ int ring_slot(int it) {
    return it % STAGES;
}
__device__ __forceinline__ uint32_t ring_parity(int it) {
    return (it / STAGES) & 1;
}

// The Q buffer of the block's t-th work tile (of QB), and the phase parity of its barriers.
template <int QB>
__device__ __forceinline__ int q_slot(int t) {
    return t % QB;
}
template <int QB>
__device__ __forceinline__ uint32_t q_parity(int t) {
    return (t / QB) & 1;
}
template <int D, int C, int BC>
__device__ __forceinline__ uint32_t q_stage(const smem_tiles &s, int t) {
    return s.Q + q_slot<q_buffers<D, C, BC>()>(t) * q_bytes<D, C>();
}

/* ---- the producer ------------------------------------------------------------------------ */

// Announce a tile's bytes on its "full" barrier and copy it, one TMA copy per 64-column slab.
template <int D, int ROWS>
__device__ __forceinline__ void copy_tile(uint32_t dst, const CUtensorMap *map, uint32_t full,
                                          int row0, int bh) {
    mbar_arrive_expect_tx(full, ROWS * D * 2);
#pragma unroll
    for (int c = 0; c < D / SLAB_COLS; ++c)
        tma_load_3d(dst + c * ROWS * SLAB_ROW_BYTES, map, full, c * SLAB_COLS, row0, bh);
}

// K or V of key tile j of work tile wt, the block's it-th key tile, into its ring slot once the
// consumers have released it (ring = sm.K or sm.V, bars = BAR_K_FULL or BAR_V_FULL).
template <int D, int BC, int FULL, int EMPTY>
__device__ __forceinline__ void load_key_tile(const smem_tiles &sm, uint32_t ring,
                                              const CUtensorMap *map, int it, const work_tile &wt,
                                              int j) {
    const int st = ring_slot(it);
    mbar_wait(bar_at(sm, EMPTY + st), ring_parity(it) ^ 1);
    copy_tile<D, BC>(ring + st * kv_bytes<D, BC>(), map, bar_at(sm, FULL + st), j * BC, wt.bh);
}

// Hand the block's t-th work tile, index w, to the consumers: wait until Q buffer t % QB and its
// index slot are free, write the index, start Q's copy. w >= works hands over "stop" (no copy).
template <int D, int C, int BC>
__device__ __forceinline__ void publish_work(const smem_tiles &sm, const CUtensorMap *tmQ, int t,
                                             int w, int N, int causal, int works) {
    constexpr int QB = q_buffers<D, C, BC>();
    const int qs = q_slot<QB>(t);
    const uint32_t full = bar_at(sm, BAR_Q_FULL + qs);
    mbar_wait(bar_at(sm, BAR_Q_EMPTY + qs), q_parity<QB>(t) ^ 1);
    atomicExch(&sm.work[qs], w);  // (an atomic, like the consumers' read: see take_work())
    if (w >= works) {
        mbar_arrive(full);  // no copy: the consumers read "stop"
        return;
    }
    const work_tile wt = work_at<C, BC>(w, N, causal);
    copy_tile<D, block_rows<C>()>(q_stage<D, C, BC>(sm, t), tmQ, full, wt.q0, wt.bh);
}

// The work tile a block takes after its current one: the next one not yet taken (a global
// counter), or none (works) when every block has one work tile at most.
__device__ __forceinline__ int next_work_index(int works, int *next_work) {
    return (int)gridDim.x >= works ? works : gridDim.x + atomicAdd(next_work, 1);
}

// One thread issues every copy: for each work tile, hand it over (Q into its buffer as soon as
// the consumers are done with the work tile QB before it), then K_j and V_j into ring slot
// it % STAGES as soon as the consumers have released it. Separate barriers let S = Q K_j^T start
// before V_j lands. The counter's atomic for the next work tile is taken right after a hand-over:
// its latency hides under the copies.
template <int D, int C, int BC>
__device__ __forceinline__ void producer(const smem_tiles &sm, const CUtensorMap *tmQ,
                                         const CUtensorMap *tmK, const CUtensorMap *tmV, int N,
                                         int causal, int works, int *next_work) {
    int it = 0;  // key tiles issued so far
    int w = blockIdx.x;
    for (int t = 0;; ++t) {
        publish_work<D, C, BC>(sm, tmQ, t, w, N, causal, works);
        if (w >= works) return;  // that was "stop"
        const work_tile wt = work_at<C, BC>(w, N, causal);
        w = next_work_index(works, next_work);
        for (int j = 0; j < wt.n_tiles; ++j, ++it) {
            load_key_tile<D, BC, BAR_K_FULL, BAR_K_EMPTY>(sm, sm.K, tmK, it, wt, j);
            load_key_tile<D, BC, BAR_V_FULL, BAR_V_EMPTY>(sm, sm.V, tmV, it, wt, j);
        }
    }
}

/* ---- the consumers' phases --------------------------------------------------------------- */

// The consumer thread's place: warpgroup wg (0 or 1) owns block rows 64 wg .. 64 wg + 63; in
// it, warp w owns 16 rows, and lane (g, t) rows g and g + 8 of those, columns 8i + 2t, +1.
typedef struct {
    int wg, warp, lane, g, t;
} consumer_place;

// The problem as the consumers see it: N, causal, the softmax scale times log2(e), and where the
// results go.
typedef struct {
    int N, causal;
    float scale_log2;
    __half *O;               // [B, H, N, D]
    float *lse;              // [B, H, N]
    const CUtensorMap *tmO;  // O as [B*H, N, D] in boxes of [1, 16, 64], for the staged stores
} problem;

// The first of the thread's two rows (the other is 8 further) in work tile wt.
__device__ __forceinline__ int row_of(const work_tile &wt, const consumer_place &p) {
    return wt.q0 + p.wg * MMA_M + 16 * p.warp + p.g;
}

// Start S = Q K_j^T for this warpgroup's 64 rows of work tile wt: D / 16 wgmma from shared
// memory, one group.
template <int D, int C, int BC>
__device__ __forceinline__ void issue_scores(float (&S)[BC / 2], const smem_tiles &sm,
                                             const consumer_place &p, const work_tile &wt,
                                             uint32_t K_tile) {
    const uint64_t Q_desc =
        desc_k_major(q_stage<D, C, BC>(sm, wt.t) + p.wg * MMA_M * SLAB_ROW_BYTES);
    const uint64_t K_desc = desc_k_major(K_tile);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < D / MMA_K; ++kk)
        if constexpr (BC == 128)
            wgmma_m64n128_ss(S, desc_k_major_step<block_rows<C>()>(Q_desc, kk),
                             desc_k_major_step<BC>(K_desc, kk), kk > 0);
        else
            wgmma_m64n176_ss(S, desc_k_major_step<block_rows<C>()>(Q_desc, kk),
                             desc_k_major_step<BC>(K_desc, kk), kk > 0);
    wgmma_commit();
}

// Start O += P V_j: BC / 16 wgmma, P from registers (four per k-step), V from shared memory.
// For the first key tile of a work tile (accumulate = 0) the first k-step overwrites O_acc: O
// starts from zero, whatever the last work tile left in the registers.
template <int D, int BC>
__device__ __forceinline__ void issue_pv(float (&O_acc)[D / 2], const uint32_t (&P)[BC / 4],
                                         uint32_t V_tile, int accumulate) {
    const uint64_t V_desc = desc_mn_major<BC>(V_tile);
    pin_registers(O_acc);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < BC / MMA_K; ++kk) {
        if constexpr (D == 128)
            wgmma_m64n128_rs(O_acc, &P[4 * kk], desc_mn_major_step(V_desc, kk),
                             kk > 0 || accumulate);
        else
            wgmma_m64n64_rs(O_acc, &P[4 * kk], desc_mn_major_step(V_desc, kk),
                            kk > 0 || accumulate);
    }
    wgmma_commit();
}

// Release a K or V buffer: one arrival per warp, once the warp's wgmma reading it are done.
__device__ __forceinline__ void release(uint32_t bar, const consumer_place &p) {
    __syncwarp();
    if (p.lane == 0) mbar_arrive(bar);
}

// Scores of keys past N (tail tile) or past the row (causal) become -inf. Only the diagonal
// and the tail tile need it. Element (i, e) of the thread is key key0 + 2t + 8i + e % 2 of row
// row0 + 8 (e / 2): it is kept while its offset 8i + e % 2 (a constant) is below a bound the
// thread works out once per row, so each element costs one compare and one select.
template <int BC>
__device__ __forceinline__ void mask_scores(float (&S)[BC / 2], const consumer_place &p, int row0,
                                            int key0, int N, int causal) {
    const int first = key0 + 2 * p.t;  // the key of offset 0
    int bound[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) bound[h] = (causal ? min(N, row0 + 8 * h + 1) : N) - first;
#pragma unroll
    for (int i = 0; i < BC / 8; ++i) {
#pragma unroll
        for (int e = 0; e < 4; ++e)
            if (8 * i + e % 2 >= bound[e / 2]) S[4 * i + e] = -INFINITY;
    }
}

// Online softmax over this tile for the thread's two rows (h = 0, 1): the new row max (4 lanes
// share a row: two shuffles), S overwritten in place by P = 2^(S - m_new) (fp32), l_i updated.
// Returns in alpha the factor 2^(m_old - m_new) that O_acc still has to be scaled by: O_acc
// may be in flight in a wgmma right now, so it is not touched here. The two rows go through
// each step together, so that one row's dependent chain (max, shuffle, shuffle) runs beside the
// other's.
template <int BC>
__device__ __forceinline__ void softmax_tile(float (&S)[BC / 2], float (&m_i)[2], float (&l_i)[2],
                                             float (&alpha)[2], float scale_log2) {
    float mx[2] = {m_i[0], m_i[1]}, shift[2], sum[2] = {0.f, 0.f};
#pragma unroll
    for (int i = 0; i < BC / 8; ++i) {
#pragma unroll
        for (int h = 0; h < 2; ++h)
            mx[h] = fmaxf(mx[h], fmaxf(S[4 * i + 2 * h], S[4 * i + 2 * h + 1]));
    }
#pragma unroll
    for (int lanes = 1; lanes <= 2; lanes *= 2) {
#pragma unroll
        for (int h = 0; h < 2; ++h)
            mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], lanes));
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        // A row that has seen only masked keys keeps m = -inf; use 0 so that no inf - inf appears.
        const float m_use = mx[h] == -INFINITY ? 0.f : mx[h];
        alpha[h] = fast_exp2((m_i[h] - m_use) * scale_log2);
        m_i[h] = mx[h];
        shift[h] = m_use * scale_log2;
    }
#pragma unroll
    for (int i = 0; i < BC / 8; ++i) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            float &x = S[4 * i + e];
            x = fast_exp2(fmaf(x, scale_log2, -shift[e / 2]));
            sum[e / 2] += x;
        }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) l_i[h] = l_i[h] * alpha[h] + sum[h];
}

template <int D>
__device__ __forceinline__ void rescale_o(float (&O_acc)[D / 2], const float (&alpha)[2]) {
#pragma unroll
    for (int i = 0; i < D / 8; ++i) {
#pragma unroll
        for (int e = 0; e < 4; ++e) O_acc[4 * i + e] *= alpha[e / 2];
    }
}

// P to fp16 in the A-operand layout of the P V wgmma, which is the S layout: register k of P
// packs S[2k] and S[2k + 1].
template <int BC>
__device__ __forceinline__ void pack_p(const float (&S)[BC / 2], uint32_t (&P)[BC / 4]) {
#pragma unroll
    for (int k = 0; k < BC / 4; ++k) P[k] = pack_half2(S[2 * k], S[2 * k + 1]);
}

// The four lanes of a quad hold one row: lane t has columns 8i + 2t, +1 of every 8-column chunk
// i. A 4 x 4 exchange inside the quad (two butterfly steps of two shuffles) turns that around
// for chunks 4k .. 4k + 3: afterwards lane t holds all 8 columns of chunk 4k + t, v[r] being
// the pair that lane r had.
__device__ __forceinline__ void quad_transpose(uint32_t (&v)[4], int t) {
#pragma unroll
    for (int b = 1; b <= 2; b <<= 1) {
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            if (r & b) continue;
            const bool upper = t & b;
            const uint32_t got = __shfl_xor_sync(0xffffffffu, upper ? v[r] : v[r | b], b);
            if (upper)
                v[r] = got;
            else
                v[r | b] = got;
        }
    }
}

// O straight from the registers to global memory (where shared memory has no room to stage it).
// After quad_transpose each lane writes 16 contiguous bytes, and a warp's store covers 8 rows x
// 64 bytes: D / 32 stores per row and thread. Written in the accumulator layout (4 bytes per
// lane, 8 rows x 16 bytes per warp store), the same O took D / 8 stores, each touching 8 cache
// lines, and the epilogue held 12-18% of a consumer's time at N = 1024 (README.md, step 11).
template <int D>
__device__ __forceinline__ void store_o_direct(const float (&O_acc)[D / 2], const float (&inv_l)[2],
                                               const consumer_place &p, const work_tile &wt,
                                               const problem &pb) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int row = row_of(wt, p) + 8 * h;
        __half *o_row = pb.O + ((size_t)wt.bh * pb.N + row) * D;
#pragma unroll
        for (int k = 0; k < D / 32; ++k) {
            uint32_t v[4];
#pragma unroll
            for (int r = 0; r < 4; ++r)
                v[r] = pack_half2(O_acc[4 * (4 * k + r) + 2 * h] * inv_l[h],
                                  O_acc[4 * (4 * k + r) + 2 * h + 1] * inv_l[h]);
            quad_transpose(v, p.t);  // (every lane takes part, rows past N too)
            if (row < pb.N)
                *reinterpret_cast<uint4 *>(o_row + 8 * (4 * k + p.t)) =
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
    if (p.lane == 0) bulk_wait_all<true>();
    __syncwarp();  // the warp's last store has read its rows of the staging tile
    // stmatrix k covers chunks (8 columns) 2k and 2k + 1 of the warp's 16 rows: matrix 0 is rows
    // 0-7 of chunk 2k, 1 rows 8-15 of it, 2 and 3 the same of chunk 2k + 1. Lane L addresses row
    // L % 8 of matrix L / 8; in the swizzle the 16-byte chunk c of a row r sits at c ^ (r % 8).
    const int row = 16 * p.warp + 8 * (p.lane / 8 % 2) + p.lane % 8;
    const int second = p.lane / 16;  // this lane's matrix is of chunk 2k + 1
#pragma unroll
    for (int k = 0; k < D / 16; ++k) {
        const int chunk = 2 * k + second;
        const uint32_t addr = stage + (chunk / 8) * (MMA_M * SLAB_ROW_BYTES) +
                              row * SLAB_ROW_BYTES + ((chunk % 8) ^ (row % 8)) * 16;
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
            tma_store_3d(pb.tmO, stage + c * MMA_M * SLAB_ROW_BYTES + 16 * p.warp * SLAB_ROW_BYTES,
                         c * SLAB_COLS, wt.q0 + p.wg * MMA_M + 16 * p.warp, wt.bh);
        bulk_commit();
    }
}

// The end of a work tile: O = O_acc / l (fp16) and LSE = (m + log2 l) ln 2 for the thread's two
// rows (those inside N). l >= 1 for a row with any key (its max contributes 2^0), so the fast
// reciprocal and logarithm (MUFU.RCP, MUFU.LG2) are accurate here.
template <int D, int C, int BC>
__device__ __forceinline__ void epilogue(const float (&O_acc)[D / 2], const float (&m_i)[2],
                                         const float (&l_i)[2], const consumer_place &p,
                                         const smem_tiles &sm, const work_tile &wt,
                                         const problem &pb) {
    float inv_l[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        float l = l_i[h];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        inv_l[h] = l > 0.f ? __fdividef(1.f, l) : 0.f;
        const int row = row_of(wt, p) + 8 * h;
        // m_i is in raw-score units: scale, then natural log.
        if (p.t == 0 && row < pb.N)
            pb.lse[(size_t)wt.bh * pb.N + row] =
                (m_i[h] * pb.scale_log2 + __log2f(l)) * 0.69314718055994531f;
    }
    if constexpr (o_staged<D, C, BC>())
        store_o_staged<D>(O_acc, inv_l, p, wt, pb, sm.O + p.wg * o_stage_bytes<D>());
    else
        store_o_direct<D>(O_acc, inv_l, p, wt, pb);
}

// Ping-pong: the consumer warpgroups take turns at issuing their GEMMs, in a ring 0, 1, (2,)
// 0, ... Named barrier 1 + wg is "warpgroup wg may issue". A warpgroup waits for its turn
// (bar.sync, its 128 threads), issues S_j and P_{j-1} V_{j-1}, then hands the turn on (bar.arrive
// on the next one's barrier: the other 128 of the 256). So one warpgroup's wgmma run while the
// others do their softmax, and the tensor pipe never waits for all softmaxes at once.
__device__ __forceinline__ void pingpong_wait_turn(int wg) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(1 + wg), "n"(2 * WARPGROUP) : "memory");
}
template <int CONSUMERS>
__device__ __forceinline__ void pingpong_pass_turn(int wg) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(1 + (wg + 1) % CONSUMERS), "n"(2 * WARPGROUP)
                 : "memory");
}

/* ---- the consumers' schedules ------------------------------------------------------------ */

enum { SCHEDULE_SERIAL, SCHEDULE_OVERLAPPED, SCHEDULE_PINGPONG };

// Key tile j of work tile wt needs a mask when it is the tail tile, or causal with a key past
// the warpgroup's first row.
template <int BC>
__device__ __forceinline__ bool needs_mask(const problem &pb, const work_tile &wt,
                                           const consumer_place &p, int j) {
    const int key0 = j * BC;
    return key0 + BC > pb.N || (pb.causal && key0 + BC - 1 > wt.q0 + p.wg * MMA_M);
}

// S_j has landed (its wgmma waited for): release K_j (ring slot st), and Q after its last use, mask
// where needed, and run the softmax. O_acc is not touched: alpha says how to rescale it.
template <int BC, int QB>
__device__ __forceinline__ void scores_done(float (&S)[BC / 2], float (&m_i)[2], float (&l_i)[2],
                                            float (&alpha)[2], const smem_tiles &sm,
                                            const consumer_place &p, const problem &pb,
                                            const work_tile &wt, int j, int st) {
    pin_registers(S);
    release(bar_at(sm, BAR_K_EMPTY + st), p);
    if (j == wt.n_tiles - 1)
        release(bar_at(sm, BAR_Q_EMPTY + q_slot<QB>(wt.t)), p);  // Q's last use
    if (needs_mask<BC>(pb, wt, p, j)) mask_scores<BC>(S, p, row_of(wt, p), j * BC, pb.N, pb.causal);
    softmax_tile<BC>(S, m_i, l_i, alpha, pb.scale_log2);
}

// The block's t-th work tile: wait until its Q has landed and its index is published. False
// means "stop": no work tiles are left.
template <int C, int BC, int QB>
__device__ __forceinline__ bool take_work(const smem_tiles &sm, const consumer_place &p,
                                          const problem &pb, int works, int t, work_tile &wt) {
    mbar_wait(bar_at(sm, BAR_Q_FULL + q_slot<QB>(t)), q_parity<QB>(t));
    // The mbarrier orders this read after the producer's write (and Q_EMPTY the next write after
    // it), but compute-sanitizer's racecheck does not model mbarriers for ordinary shared memory
    // accesses: one atomic read per warp, broadcast, keeps it clean.
    int w = 0;
    if (p.lane == 0) w = atomicAdd(&sm.work[q_slot<QB>(t)], 0);
    w = __shfl_sync(0xffffffffu, w, 0);
    if (w >= works) return false;
    wt = work_at<C, BC>(w, pb.N, pb.causal);
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
            const int st = ring_slot(it);
            float S[BC / 2], alpha[2];
            uint32_t P[BC / 4];

            mbar_wait(bar_at(sm, BAR_K_FULL + st), ring_parity(it));
            issue_scores<D, C, BC>(S, sm, p, wt, k_stage<D, BC>(sm, st));
            wgmma_wait<0>();
            scores_done<BC, QB>(S, m_i, l_i, alpha, sm, p, pb, wt, j, st);
            rescale_o<D>(O_acc, alpha);
            pack_p<BC>(S, P);

            mbar_wait(bar_at(sm, BAR_V_FULL + st), ring_parity(it));
            issue_pv<D, BC>(O_acc, P, v_stage<D, BC>(sm, st), 1);
            wgmma_wait<0>();
            pin_registers(O_acc);
            release(bar_at(sm, BAR_V_EMPTY + st), p);
        }
        epilogue<D, C, BC>(O_acc, m_i, l_i, p, sm, wt, pb);
    }
}

// Overlapped (default; nopingpong without the turn-taking): one pipeline over every key tile the
// block consumes, across its work tiles. Each turn issues S_next = Q K_next^T together with
// O += P V of the key tile before, and the softmax of S_next runs while that P V wgmma is still
// in flight (FlashAttention-3's intra-warpgroup pipelining). P stays in its registers until its
// wgmma is done; the softmax works on S in fp32 and packs it to P afterwards. When the P V
// finishes a work tile, S_next is already the first key tile of the next one: the epilogue
// writes O in the time the other warpgroups' GEMMs take, and no turn is ever half empty.
//
// The loop is rotated so that the wait for P V opens a pass and the softmax closes it: ptxas
// moves a wgmma wait, and everything after it, as early as it can inside a basic block, which
// put the wait in front of the softmax (the SASS showed WARPGROUP.DEPBAR.LE gsb0, 0x0 before
// the first MUFU.EX2: no overlap at all). The loop's back edge is a boundary it does not cross.
template <int D, int C, int BC, bool PINGPONG>
__device__ __forceinline__ void consumer_overlapped(const smem_tiles &sm, const consumer_place &p,
                                                    const problem &pb, int works) {
    constexpr int QB = q_buffers<D, C, BC>();
    work_tile wt;
    if (!take_work<C, BC, QB>(sm, p, pb, works, 0, wt)) return;
    // Warpgroup 0 takes the first turn: the last warpgroup hands it over before its own first wait.
    if (PINGPONG && p.wg == C - 1) pingpong_pass_turn<C>(p.wg);

    float O_acc[D / 2], S[BC / 2], m_i[2], l_i[2], alpha[2];
    uint32_t P[BC / 4];

    // The block's first key tile: S only, nothing to overlap with yet.
    start_rows<D>(O_acc, m_i, l_i);
    mbar_wait(bar_at(sm, BAR_K_FULL + ring_slot(0)), ring_parity(0));
    if (PINGPONG) pingpong_wait_turn(p.wg);
    issue_scores<D, C, BC>(S, sm, p, wt, k_stage<D, BC>(sm, ring_slot(0)));
    if (PINGPONG) pingpong_pass_turn<C>(p.wg);
    wgmma_wait<0>();
    scores_done<BC, QB>(S, m_i, l_i, alpha, sm, p, pb, wt, 0, ring_slot(0));

    // A pass starts with S holding the softmax of key tile j of work tile wt, the block's it-th,
    // while the P V of the key tile before it may still run. If that P V ends a work tile
    // (finished), `done`, m_done and l_done are that work tile's.
    work_tile done = wt;
    float m_done[2] = {0.f, 0.f}, l_done[2] = {0.f, 0.f};
    bool finished = false;
    int it = 0, j = 0;
    for (;; ++it) {
        wgmma_wait<0>();  // the last P V is done: P and O_acc are free
        pin_registers(O_acc);
        pin_registers(P);
        if (it > 0) release(bar_at(sm, BAR_V_EMPTY + ring_slot(it - 1)), p);
        if (finished) epilogue<D, C, BC>(O_acc, m_done, l_done, p, sm, done, pb);
        rescale_o<D>(O_acc, alpha);  // (alpha is 0 on a work tile's first key tile: see issue_pv)
        pack_p<BC>(S, P);

        work_tile next = wt;  // the work tile of the next key tile
        int next_j = j + 1;
        if (next_j == wt.n_tiles) {
            next_j = 0;
            if (!take_work<C, BC, QB>(sm, p, pb, works, wt.t + 1, next)) break;
        }
        const int st = ring_slot(it), next_st = ring_slot(it + 1);

        mbar_wait(bar_at(sm, BAR_K_FULL + next_st), ring_parity(it + 1));
        if (PINGPONG) pingpong_wait_turn(p.wg);
        issue_scores<D, C, BC>(S, sm, p, next, k_stage<D, BC>(sm, next_st));
        mbar_wait(bar_at(sm, BAR_V_FULL + st), ring_parity(it));
        issue_pv<D, BC>(O_acc, P, v_stage<D, BC>(sm, st), j > 0);
        if (PINGPONG) pingpong_pass_turn<C>(p.wg);

        finished = next_j == 0;
        if (finished) {  // that P V is work tile wt's last; S_next starts the next one
            done = wt;
            m_done[0] = m_i[0], m_done[1] = m_i[1], l_done[0] = l_i[0], l_done[1] = l_i[1];
            m_i[0] = m_i[1] = -INFINITY, l_i[0] = l_i[1] = 0.f;
        }
        wgmma_wait<1>();  // S_next is done; P V may still run
        scores_done<BC, QB>(S, m_i, l_i, alpha, sm, p, pb, next, next_j, next_st);
        wt = next;
        j = next_j;
    }

    // The block's last key tile: P V only.
    const int st = ring_slot(it);
    mbar_wait(bar_at(sm, BAR_V_FULL + st), ring_parity(it));
    if (PINGPONG) pingpong_wait_turn(p.wg);
    issue_pv<D, BC>(O_acc, P, v_stage<D, BC>(sm, st), j > 0);
    if (PINGPONG) pingpong_pass_turn<C>(p.wg);
    wgmma_wait<0>();
    pin_registers(O_acc);
    release(bar_at(sm, BAR_V_EMPTY + st), p);
    epilogue<D, C, BC>(O_acc, m_i, l_i, p, sm, wt, pb);

    // Every turn was handed on; warpgroup 0 takes the last warpgroup's final hand-over, so that no
    // arrival is left pending on its barrier.
    if (PINGPONG && p.wg == 0) pingpong_wait_turn(p.wg);
}

// One consumer thread: its place in the block, then its schedule over the block's work tiles.
template <int D, int C, int BC, int SCHEDULE>
__device__ __forceinline__ void consumer(const smem_tiles &sm, const problem &pb, int works) {
    consumer_place p;
    // Read from lane 0, the warpgroup index is one value per warp to the compiler too, so the
    // addresses and descriptors built from it stay in uniform registers, where wgmma takes them.
    p.wg = __shfl_sync(0xffffffffu, (int)threadIdx.x / WARPGROUP, 0) - 1;
    p.warp = (threadIdx.x / 32) % 4;
    p.lane = threadIdx.x % 32;
    p.g = p.lane / 4;
    p.t = p.lane % 4;
    if (SCHEDULE == SCHEDULE_SERIAL)
        consumer_serial<D, C, BC>(sm, p, pb, works);
    else
        consumer_overlapped<D, C, BC, SCHEDULE == SCHEDULE_PINGPONG>(sm, p, pb, works);
    // The O stores still in flight read the shared memory the block is about to give up.
    if (o_staged<D, C, BC>() && p.lane == 0) bulk_wait_all<false>();
}

/* ---- the kernel -------------------------------------------------------------------------- */

// Q, K, V, O: [B, H, N, D] fp16 (the tensor maps describe them as [B*H, N, D]; O is written
// through tmO where o_staged(), else directly); lse: [B, H, N] float. works = B * H * ceil(N / BR)
// work tiles.
template <int D, int C, int BC, int SCHEDULE>
__global__ void __launch_bounds__(block_threads<C>(), 1)
    attention_kernel(const __grid_constant__ CUtensorMap tmQ,
                     const __grid_constant__ CUtensorMap tmK,
                     const __grid_constant__ CUtensorMap tmV,
                     const __grid_constant__ CUtensorMap tmO, __half *O, float *lse, int N,
                     int causal, float scale_log2, int works, int *next_work) {
#if HOPPER_KERNELS
    extern __shared__ unsigned char smem_raw[];
    const smem_tiles sm = carve_smem<D, C, BC>(smem_raw);
    if (threadIdx.x == 0) {
        for (int qs = 0; qs < q_buffers<D, C, BC>(); ++qs) {
            mbar_init(bar_at(sm, BAR_Q_FULL + qs), 1);       // the producer's expect_tx arrival
            mbar_init(bar_at(sm, BAR_Q_EMPTY + qs), C * 4);  // one arrival per consumer warp
        }
        for (int st = 0; st < STAGES; ++st) {
            mbar_init(bar_at(sm, BAR_K_FULL + st), 1);
            mbar_init(bar_at(sm, BAR_V_FULL + st), 1);
            mbar_init(bar_at(sm, BAR_K_EMPTY + st), C * 4);
            mbar_init(bar_at(sm, BAR_V_EMPTY + st), C * 4);
        }
        // Make the initialised barriers visible to the copy engine (the async proxy).
        asm volatile("fence.mbarrier_init.release.cluster;\nfence.proxy.async.shared::cta;\n" ::
                         : "memory");
    }
    __syncthreads();  // the barriers are initialised before anyone waits on or signals them

    if (threadIdx.x < WARPGROUP) {  // producer warpgroup
        registers_decrease<producer_regs<C>()>();
        if (threadIdx.x == 0) producer<D, C, BC>(sm, &tmQ, &tmK, &tmV, N, causal, works, next_work);
    } else {
        registers_increase<consumer_regs<C>()>();
        problem pb;
        pb.N = N;
        pb.causal = causal;
        pb.scale_log2 = scale_log2;
        pb.O = O;
        pb.lse = lse;
        pb.tmO = &tmO;
        consumer<D, C, BC, SCHEDULE>(sm, pb, works);
    }
#else
    (void)tmQ, (void)tmK, (void)tmV, (void)tmO, (void)O, (void)lse, (void)N, (void)causal,
        (void)scale_log2, (void)works, (void)next_work;
#endif
}

/* ---- launcher ---------------------------------------------------------------------------- */

enum { VARIANT_DEFAULT = 0, VARIANT_NOPERSISTENT, VARIANT_NOPINGPONG, VARIANT_NOOVERLAP, VARIANTS };

// The driver's tensor-map encoder, fetched once through the runtime (no -lcuda needed).
static PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder(void) {
    static PFN_cuTensorMapEncodeTiled_v12000 fn = NULL;
    if (!fn) {
        void *p = NULL;
        cudaDriverEntryPointQueryResult found;
#if CUDART_VERSION >= 12050
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault,
                                             &found) == cudaSuccess &&
            found == cudaDriverEntryPointSuccess)
#else
        if (cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &p, cudaEnableDefault, &found) ==
                cudaSuccess &&
            found == cudaDriverEntryPointSuccess)
#endif
            fn = (PFN_cuTensorMapEncodeTiled_v12000)p;
    }
    return fn;
}

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

// Whether the kernels on this device are the sm_90a ones (a compute_75 PTX build JIT-compiled
// on an H100 has only the empty kernel).
// Consumer warpgroups for this shape (see THREE_CONSUMERS_MIN_N_CAUSAL).
static int consumers_for(const attn_shape *s) {
    return s->D == 64 && (!s->causal || s->N >= THREE_CONSUMERS_MIN_N_CAUSAL) ? 3 : 2;
}

static int hopper_code_here(void) {
    cudaFuncAttributes fa;
    if (cudaFuncGetAttributes(&fa, (const void *)attention_kernel<64, 2, 128, SCHEDULE_PINGPONG>) !=
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
    const int three = consumers_for(s) == 3;
    const size_t smem = s->D == 128 ? (key_tile_for(s) == 176 ? smem_bytes<128, 2, 176>()
                                                              : smem_bytes<128, 2, 128>())
                        : three     ? smem_bytes<64, 3, 128>()
                                    : smem_bytes<64, 2, 128>();
    if (smem > dev->smem_per_block) {
        static char why_smem[96];
        snprintf(why_smem, sizeof why_smem, "needs %zu bytes of shared memory per block at D = %d",
                 smem, s->D);
        return why_smem;
    }
    const int BR = three ? block_rows<3>() : block_rows<2>();
    if ((long long)s->B * s->H * ((s->N + BR - 1) / BR) > 0x7fffffffLL)
        return "too many work tiles (B * H * ceil(N / rows per tile) must be below 2^31)";
    return NULL;
}

// The workspace is the work tile counter of the persistent blocks, zeroed before each launch.
static size_t attention_workspace_bytes(const attn_shape *s, const attn_device *dev, int variant) {
    (void)s, (void)dev, (void)variant;
    return sizeof(int);
}

typedef struct {
    const void *Q, *K, *V;  // [B, H, N, D] fp16
    __half *O;              // [B, H, N, D] fp16
    float *lse;             // [B, H, N]
    int *next_work;         // the persistent blocks' work tile counter (the workspace)
    int persistent_blocks;  // one per SM, or 0: one block per work tile (variant nopersistent)
    cudaStream_t stream;
} launch_args;

template <int D, int C, int BC, int SCHEDULE>
static cudaError_t launch(const attn_shape *s, const launch_args *a) {
    constexpr int BR = block_rows<C>();
    CUtensorMap tmQ, tmK, tmV, tmO;
    ATTN_TRY(tensor_map(&tmQ, a->Q, s, BR));
    ATTN_TRY(tensor_map(&tmK, a->K, s, BC));
    ATTN_TRY(tensor_map(&tmV, a->V, s, BC));
    ATTN_TRY(tensor_map(&tmO, a->O, s, 16));  // a warp's 16 rows (unused where O is not staged)
    const int smem = smem_bytes<D, C, BC>();
    ATTN_TRY(cudaFuncSetAttribute(attention_kernel<D, C, BC, SCHEDULE>,
                                  cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    const int works = s->B * s->H * ((s->N + BR - 1) / BR);
    const int blocks = a->persistent_blocks > 0 && a->persistent_blocks < works
                           ? a->persistent_blocks
                           : works;  // (with one block per work tile the counter is never read)
    if (blocks < works) ATTN_TRY(cudaMemsetAsync(a->next_work, 0, sizeof(int), a->stream));
    const float scale_log2 = s->scale * 1.4426950408889634f;  // log2(e) folded into the scale
    attention_kernel<D, C, BC, SCHEDULE><<<blocks, block_threads<C>(), smem, a->stream>>>(
        tmQ, tmK, tmV, tmO, a->O, a->lse, s->N, s->causal, scale_log2, works, a->next_work);
    ATTN_TRY(cudaGetLastError());
    return cudaSuccess;
}

template <int SCHEDULE>
static cudaError_t launch_schedule(const attn_shape *s, const launch_args *a) {
    if (s->D == 128)
        return key_tile_for(s) == 176 ? launch<128, 2, 176, SCHEDULE>(s, a)
                                      : launch<128, 2, 128, SCHEDULE>(s, a);
    if (consumers_for(s) == 3) return launch<64, 3, 128, SCHEDULE>(s, a);
    return launch<64, 2, 128, SCHEDULE>(s, a);
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
    const launch_args a = {Q,
                           K,
                           V,
                           (__half *)O,
                           lse,
                           (int *)workspace,
                           variant == VARIANT_NOPERSISTENT ? 0 : dev->sm_count,
                           stream};
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
    "default,nopersistent,nopingpong,nooverlap",
    attention_unsupported,
    attention_workspace_bytes,
    attention_forward,
    NULL,  // a forward-only stage: no backward pass
    NULL,
};
