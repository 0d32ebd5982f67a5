/*
 * common/device/warp.cuh: the vocabulary of the tensor-core stages (5, 6 and 7), every GPU: the
 * warp, the 16-byte chunk that shared-memory traffic moves, the accumulator fragment that mma.sync
 * and wgmma leave in registers, and the one-instruction helpers around them.
 *
 * Device code for one translation unit: a stage's attention.cu includes it (through sm80.cuh or
 * sm90.cuh). Constants are `inline constexpr`, so that a stage may leave some unused.
 */
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>
#include <string.h>

inline constexpr int WARP_SIZE = 32;
inline constexpr unsigned FULL_WARP = 0xffffffffu;  // every lane: the shuffles' and votes' mask
inline constexpr int HALF_BYTES = 2;                // fp16

// The unit of shared-memory traffic: 16 bytes, 8 halves. One cp.async, one row of an 8 x 8
// ldmatrix or stmatrix matrix, one 16-byte load or store; the swizzles permute whole chunks.
inline constexpr int CHUNK_BYTES = 16;
inline constexpr int CHUNK_HALVES = CHUNK_BYTES / HALF_BYTES;

inline constexpr float LOG2E = 1.4426950408889634f;
inline constexpr float LN2 = 0.69314718055994531f;

// The offset in elements of row `row` (>= 0) of a tensor whose rows are ld elements apart: one
// 32 x 32 -> 64-bit multiply (IMAD.WIDE.U32). Strided tensors (stages 5-8).
__host__ __device__ __forceinline__ size_t rows_offset(int row, unsigned ld) {
    return (size_t)(unsigned)row * ld;
}

// The accumulator fragment, one vocabulary for mma.sync's C/D (m16n8, stages 5 and 7) and a warp's
// 16 rows of a wgmma result (stage 6). Lane (g, t) = (lane / QUAD, lane % QUAD) holds, of each
// block of 16 rows x FRAG_COLS columns, rows g and g + FRAG_ROW_STEP (h = 0, 1) at columns 2t + c
// (c = 0, 1): FRAG_REGS registers per block, register frag_reg(h, c). The QUAD lanes of a quad
// (same g) share a row. Stages 5 and 7 keep the blocks as [..][n][FRAG_REGS] arrays; stage 6 lays
// the blocks of a row end to end in one array, register acc_index(n, h, c), as wgmma names them.
// The A operand of the next product has the same layout, two columns packed per register: blocks
// 2k and 2k + 1 of an accumulator are, register for register, the A fragment of k16 step k.
inline constexpr int QUAD = 4;            // lanes per fragment row
inline constexpr int FRAG_ROW_STEP = 8;   // a thread's second row is 8 further
inline constexpr int FRAG_COLS = 8;       // columns per block (n8)
inline constexpr int FRAG_LANE_ROWS = 2;  // rows of a block a thread holds (h)
inline constexpr int FRAG_LANE_COLS = 2;  // columns of a block a thread holds per row (c)
inline constexpr int FRAG_REGS = FRAG_LANE_ROWS * FRAG_LANE_COLS;  // a thread's registers per block
__host__ __device__ __forceinline__ constexpr int frag_reg(int h, int c) {
    return FRAG_LANE_COLS * h + c;
}
// ... and back: register e of a block holds row half frag_h(e), column frag_c(e).
__host__ __device__ __forceinline__ constexpr int frag_h(int e) {
    return e / FRAG_LANE_COLS;
}
__host__ __device__ __forceinline__ constexpr int frag_c(int e) {
    return e % FRAG_LANE_COLS;
}
__host__ __device__ __forceinline__ constexpr int acc_index(int n, int h, int c) {
    return FRAG_REGS * n + frag_reg(h, c);
}

__device__ __forceinline__ uint32_t smem_u32(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

// One 8- or 16-byte store to global memory (the address aligned to its size), as one instruction
// whatever the compiler can prove about the address: a plain uint2 or uint4 store through a
// pointer whose offset comes from runtime strides may be emitted as 4-byte stores, each a warp
// writing every fourth word of its bytes.
__device__ __forceinline__ void st_global_v2(void *p, uint2 v) {
    asm volatile("st.global.v2.b32 [%0], {%1, %2};\n" ::"l"(p), "r"(v.x), "r"(v.y) : "memory");
}
__device__ __forceinline__ void st_global_v4(void *p, uint4 v) {
    asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"l"(p), "r"(v.x), "r"(v.y),
                 "r"(v.z), "r"(v.w)
                 : "memory");
}

// The lane, read afresh where it is used (volatile: the compiler may not hoist it out of a loop,
// so the offsets derived from it are recomputed instead of held in registers).
__device__ __forceinline__ int lane_index() {
    int l;
    asm volatile("mov.u32 %0, %%laneid;\n" : "=r"(l));
    return l;
}

// Four consecutive floats a lane from an accumulator's pairs: lanes t and t ^ 1 of a quad (odd:
// t & 1) each hold a pair a0, a1 (row g, or n8 block n) and a pair b0, b1 (row g + 8, or block n +
// 1) at columns 2t, 2t + 1 of theirs; after two shuffles the even lane holds a's four columns 2t ..
// 2t + 3 (its own pair, then its partner's), the odd lane b's 2t - 2 .. 2t + 1: one 16-byte store
// or reduction a lane where the layout gave two of 8 bytes.
__device__ __forceinline__ float4 quad_pairs_to_float4(float a0, float a1, float b0, float b1,
                                                       bool odd) {
    const float r0 = __shfl_xor_sync(FULL_WARP, odd ? a0 : b0, 1);  // the pair the partner keeps
    const float r1 = __shfl_xor_sync(FULL_WARP, odd ? a1 : b1, 1);
    return odd ? make_float4(r0, r1, b0, b1) : make_float4(a0, a1, r0, r1);
}

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

// The same in the run's 16-bit storage type (BF16: bfloat16, rounded to nearest even; else fp16).
template <bool BF16>
__device__ __forceinline__ uint32_t pack2_of(float lo, float hi) {
    if constexpr (BF16) {
        const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
        uint32_t u;
        memcpy(&u, &h, sizeof(u));
        return u;
    } else {
        return pack_half2(lo, hi);
    }
}

/* ---- softcap -----------------------------------------------------------------------------------
 */

// tanh(x) by the special-function unit (MUFU.TANH, sm_75 on): one instruction, an absolute error
// about 2^-11 (an fp16 result's precision; the checker's 16-bit reference rounds the cap's tanh
// to fp16 to match). A softcap c turns a scaled score s into c * tanh(s / c) (attention.h).
__device__ __forceinline__ float tanh_approx(float x) {
    float y;
    asm("tanh.approx.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// a b + c clamped to [0, 1] by the fma itself (its .sat: one instruction, where fmaf and fmaxf
// take two); a NaN result gives +0.
__device__ __forceinline__ float fma_saturate(float a, float b, float c) {
    float d;
    asm("fma.rn.sat.f32 %0, %1, %2, %3;\n" : "=f"(d) : "f"(a), "f"(b), "f"(c));
    return d;
}

/* ---- programmatic dependent launch (PDL) ----------------------------------------------------- */

// A kernel launched with programmatic stream serialization (cudaLaunchKernelEx with
// cudaLaunchAttributeProgrammaticStreamSerialization) may start before the kernel ahead of it in
// the stream has finished, once every block of that one has said launch_dependents or exited. Its
// blocks then do what touches no global memory (barrier init, setmaxnreg) and wait until the
// kernel ahead has finished and its writes are visible. Without the attribute the wait returns at
// once. The instructions exist from sm_90 on; in older code both are nothing (there a launch
// with the attribute is an ordinary one).
__device__ __forceinline__ void let_next_kernel_start() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wait_for_previous_kernel() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
// The host's side: a launch's configuration, with programmatic stream serialization where `pdl`
// (cudaLaunchKernelEx launches it); `attr` is where the configuration points for it.
static inline cudaLaunchConfig_t pdl_launch_config(dim3 grid, int threads, size_t smem,
                                                   cudaStream_t stream, bool pdl,
                                                   cudaLaunchAttribute *attr) {
    cudaLaunchConfig_t config = {};
    config.gridDim = grid, config.blockDim = dim3((unsigned)threads);
    config.dynamicSmemBytes = smem, config.stream = stream;
    attr->id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr->val.programmaticStreamSerializationAllowed = 1;
    config.attrs = attr, config.numAttrs = pdl ? 1 : 0;
    return config;
}
