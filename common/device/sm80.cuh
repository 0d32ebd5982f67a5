/*
 * common/device/sm80.cuh: Ampere's tensor-core path as inline PTX, for stage 5 (which teaches it)
 * and stage 7: mma.sync m16n8k16 (two m16n8k8 on sm_75), ldmatrix, cp.async, and the plain
 * shared-memory loads and stores by shared address. Every GPU from sm_75 on: cp.async exists from
 * sm_80, and sm_75 code gets no instruction from its wrappers (HAS_CP_ASYNC says which).
 *
 * Device code for one translation unit (a stage's attention.cu includes it).
 */
#pragma once

#include "warp.cuh"

// The mma.sync shape (m16n8k16: A is 16 x 16, B 16 x 8, C 16 x 8). An ldmatrix.x4 reads a
// 16 x 16 block (four 8 x 8 matrices), X4_BYTES wide; a matrix is 8 rows of one 16-byte chunk.
inline constexpr int MMA_M = 16;
inline constexpr int MMA_N = 8;
inline constexpr int MMA_K = 16;
inline constexpr int X4_DIM = 16;
inline constexpr int X4_BYTES = X4_DIM * HALF_BYTES;  // two chunks
inline constexpr int X4_BLOCKS = X4_DIM / MMA_N;      // n8 blocks of B per ldmatrix.x4
inline constexpr int MATRIX_ROWS = 8;                 // an ldmatrix matrix: 8 rows of one chunk
inline constexpr int N8_PER_K16 = MMA_K / MMA_N;      // n8 blocks (of C) per k16 step (of A)

// The A fragment (a[] of mma_16816 below): A_FRAG_REGS registers of two halves; register
// a_frag_reg(n, h) holds row g + 8h of the k16 step's n8 block n (columns 8n + 2t, +1). Packed
// from an accumulator, it is block n of the two that make the k16 step, register frag_reg(h, *).
inline constexpr int A_FRAG_REGS = 4;
__host__ __device__ __forceinline__ constexpr int a_frag_reg(int n, int h) {
    return FRAG_LANE_ROWS * n + h;
}

// Plain shared-memory stores and loads by shared address (the form ldmatrix and cp.async take).
__device__ __forceinline__ void st_shared_b32(uint32_t addr, uint32_t v) {
    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}

__device__ __forceinline__ void st_shared_v4(uint32_t addr, uint4 v) {
    asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(v.x), "r"(v.y),
                 "r"(v.z), "r"(v.w)
                 : "memory");
}

__device__ __forceinline__ uint4 ld_shared_v4(uint32_t addr) {
    uint4 v;
    asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "r"(addr)
                 : "memory");
    return v;
}

__device__ __forceinline__ void st_shared_f2(uint32_t addr, float x, float y) {
    asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(addr), "f"(x), "f"(y) : "memory");
}

__device__ __forceinline__ float2 ld_shared_f2(uint32_t addr) {
    float2 v;
    asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n"
                 : "=f"(v.x), "=f"(v.y)
                 : "r"(addr)
                 : "memory");
    return v;
}

// Whether this code has cp.async (sm_80+); sm_75 code moves tiles through registers instead.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
inline constexpr bool HAS_CP_ASYNC = false;
#else
inline constexpr bool HAS_CP_ASYNC = true;
#endif

// 16-byte asynchronous copy global -> shared (sm_80+). With valid == false the source size is
// 0 and the 16 bytes in shared memory are zero-filled (the source is not read). Like the commit
// and the wait, it clobbers "memory": no shared-memory access may move across it.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void *src, bool valid) {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(valid ? CHUNK_BYTES : 0)
                 : "memory");
#else
    (void)dst, (void)src, (void)valid;
#endif
}

// A BYTES-byte (4, 8 or 16) asynchronous copy global -> shared through L1 (.ca, the sizes under 16
// allowed; sm_80+), for small rows a warp moves lane by lane (stage 8's LSE_i and D_i).
template <int BYTES>
__device__ __forceinline__ void cp_async_ca(uint32_t dst, const void *src) {
    static_assert(BYTES == 4 || BYTES == 8 || BYTES == 16, "cp.async copies 4, 8 or 16 bytes");
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(dst), "l"(src), "n"(BYTES)
                 : "memory");
#else
    (void)dst, (void)src;
#endif
}

// Wait until every cp.async this thread has issued is complete.
__device__ __forceinline__ void cp_async_wait_all() {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_all;\n" ::: "memory");
#endif
}

// The thread's copies issued since the last commit form one group.
__device__ __forceinline__ void cp_async_commit() {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

// Wait until at most N of this thread's commit groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

// ldmatrix .x4: lanes 8i..8i+7 give the addresses of the 8 rows (16 bytes each) of matrix i;
// afterwards r[i] of lane l holds row l / 4, columns 2 * (l % 4) and +1 of matrix i.
// With .trans, r[i] of lane l holds instead rows 2 * (l % 4) and +1 of column l / 4.
// volatile: the same address returns new data after each barrier.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// d += A (16x16, row-major) * B (16x8, column-major), fp16 in, fp32 accumulate. Lane l, with
// g = l / 4 and t = l % 4, holds (each register = 2 halves, the lower column in the low half):
//   A: a[0] = (row g,   cols 2t, 2t+1)   a[1] = (row g+8, cols 2t, 2t+1)
//      a[2] = (row g,   cols 2t+8, +9)   a[3] = (row g+8, cols 2t+8, +9)
//   B: b0 = (rows 2t, 2t+1, col g)       b1 = (rows 2t+8, 2t+9, col g)
//   C/D: d[0], d[1] = (row g, cols 2t, 2t+1)   d[2], d[3] = (row g+8, cols 2t, 2t+1)
// (the accumulator fragment of warp.cuh: d[frag_reg(h, c)]). sm_75 has only m16n8k8 (A = a[0..1],
// B = b0, same C layout): two of them over k = 0..7 and k = 8..15 give the same result.
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1) {
#if __CUDA_ARCH__ >= 800
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
    asm("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 "
        "{%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(b0));
    asm("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 "
        "{%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[2]), "r"(a[3]), "r"(b1));
#endif
}

// The same product on bfloat16 operands (BF16: the 16-bit storage type is bf16, else fp16), same
// fragments. sm_80 and newer only: sm_75 has no bf16 mma (a kernel there traps; the stages say
// `unsupported` first).
template <bool BF16>
__device__ __forceinline__ void mma_16816_of(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1) {
    if constexpr (BF16) {
#if __CUDA_ARCH__ >= 800
        asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
            "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
        __trap();
#endif
    } else {
        mma_16816(d, a, b0, b1);
    }
}

// d = A B: mma_16816 on a zero accumulator (the first k step of a product), which needs no
// instructions to clear d first.
__device__ __forceinline__ void mma_16816_zero(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                               uint32_t b1) {
#if __CUDA_ARCH__ >= 800
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %10, %10, %10};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(0.f));
#else
    d[0] = d[1] = d[2] = d[3] = 0.f;
    mma_16816(d, a, b0, b1);
#endif
}

// mma_16816_zero on bfloat16 operands (BF16), else fp16: sm_80 and newer, as mma_16816_of.
template <bool BF16>
__device__ __forceinline__ void mma_16816_zero_of(float (&d)[4], const uint32_t (&a)[4],
                                                  uint32_t b0, uint32_t b1) {
    if constexpr (BF16) {
#if __CUDA_ARCH__ >= 800
        asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
            "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %10, %10, %10};\n"
            : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(0.f));
#else
        d[0] = d[1] = d[2] = d[3] = 0.f;
        __trap();
#endif
    } else {
        mma_16816_zero(d, a, b0, b1);
    }
}
