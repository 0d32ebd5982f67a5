/*
 * stage7_backward/preprocess.cuh: the passes before and after the main kernel: D_i = rowsum(dO_i *
 * O_i) and LSE_i in log2 units, padded, with dQ_acc zeroed (preprocess_kernel), and dQ = scale
 * dQ_acc in fp16 (dq_convert_kernel).
 */
#pragma once

#include "config.cuh"

// D_i = rowsum(dO_i * O_i) in fp32 (O and dO read in their layouts, fp16 or BF16 bf16), and LSE_i
// in log2 units, for the padded rows of every head: rows past N get D = 0 and LSE = +inf, so that
// their P = 2^(s - inf) = 0 without a mask; so do rows that see no key (causal, N > N_k: the
// forward wrote O = 0, so D = 0, and LSE = -inf, whose 2^(s + inf) no kernel may compute). With dQ
// by atomics or bulk reductions, the row of dQ_acc they add into is zeroed here too (as
// FlashAttention-2's preprocess does: no separate pass over dQ_acc). PREPROCESS_LANES lanes per
// row, D / 8 halves each; the grid covers B * H * N_pad rows exactly (N_pad is a multiple of
// ROW_PAD).
constexpr int PREPROCESS_THREADS = 128;
constexpr int PREPROCESS_LANES = 8;

// Two 16-bit values (bf16 with BF16, else fp16) packed in a register, as floats.
template <bool BF16>
__device__ __forceinline__ float2 unpack2_of(uint32_t u) {
    if constexpr (BF16) {
        __nv_bfloat162 h;
        memcpy(&h, &u, sizeof h);
        return __bfloat1622float2(h);
    } else {
        __half2 h;
        memcpy(&h, &u, sizeof h);
        return __half22float2(h);
    }
}

template <int D, bool BF16>
__global__ void __launch_bounds__(PREPROCESS_THREADS) preprocess_kernel(const bwd_params p) {
    constexpr int PER_LANE = D / PREPROCESS_LANES;  // halves
    constexpr int PAIRS_PER_CHUNK = CHUNK_BYTES / sizeof(uint32_t);
    const size_t row =  // in [B * H, N_pad]
        ((size_t)blockIdx.x * PREPROCESS_THREADS + threadIdx.x) / PREPROCESS_LANES;
    const int sub = (int)threadIdx.x % PREPROCESS_LANES;
    const size_t bh = row / (size_t)p.N_pad;
    const int i = (int)(row - bh * p.N_pad);
    const bool inside = i < p.N;
    float sum = 0.f;
    if (inside) {
        const int b = (int)bh / p.H, h = (int)bh % p.H;  // (B * H fits a grid's y: 32 bits)
        if (p.dQ_acc) {  // (the dQ by atomics or bulk reductions adds into it; contiguous)
            constexpr int FLOAT4_FLOATS = 4;
            float4 *const acc =
                reinterpret_cast<float4 *>(p.dQ_acc + ((size_t)bh * p.N + i) * D + sub * PER_LANE);
#pragma unroll
            for (int c = 0; c < PER_LANE / FLOAT4_FLOATS; ++c)
                acc[c] = make_float4(0.f, 0.f, 0.f, 0.f);
        }
        const __half *const O_row =
            p.O + head_offset(p.layout.o, b, h) + rows_offset(i, p.layout.o.row) + sub * PER_LANE;
        const __half *const dO_row = p.dO + head_offset(p.layout.dO, b, h) +
                                     rows_offset(i, p.layout.dO.row) + sub * PER_LANE;
#pragma unroll
        for (int c = 0; c < PER_LANE; c += CHUNK_HALVES) {
            const uint4 o = *reinterpret_cast<const uint4 *>(O_row + c);
            const uint4 d = *reinterpret_cast<const uint4 *>(dO_row + c);
            const uint32_t *ow = reinterpret_cast<const uint32_t *>(&o);
            const uint32_t *dw = reinterpret_cast<const uint32_t *>(&d);
#pragma unroll
            for (int x = 0; x < PAIRS_PER_CHUNK; ++x) {
                const float2 of = unpack2_of<BF16>(ow[x]), df = unpack2_of<BF16>(dw[x]);
                sum = fmaf(of.x, df.x, fmaf(of.y, df.y, sum));
            }
        }
    }
#pragma unroll
    for (int s = PREPROCESS_LANES / 2; s > 0; s /= 2) sum += __shfl_xor_sync(FULL_WARP, sum, s);
    if (sub == 0) {
        p.Dsum[row] = inside ? sum : 0.f;
        const float lse = inside ? p.lse[bh * p.N + i] : INFINITY;
        p.lse2[row] = lse == -INFINITY ? INFINITY : lse * LOG2E;  // (a row with no key: +inf)
    }
}

// dQ = scale * dQ_acc, as fp16 (bf16 with BF16), written in dQ's layout: four elements a thread,
// blockIdx.y the (batch, head), blockIdx.x the threads' float4s of it (dQ_acc is contiguous).
constexpr int CONVERT_THREADS = 256;
constexpr int CONVERT_FLOATS = 4;  // a thread's elements: one float4 of dQ_acc
template <int D, bool BF16>
__global__ void __launch_bounds__(CONVERT_THREADS) dq_convert_kernel(const bwd_params p) {
    constexpr int ROW_FLOAT4S = D / CONVERT_FLOATS;
    const size_t i = (size_t)blockIdx.x * CONVERT_THREADS + threadIdx.x;  // float4 of the head
    if (i >= (size_t)p.N * ROW_FLOAT4S) return;
    const int bh = (int)blockIdx.y, b = bh / p.H, h = bh % p.H;
    const int row = (int)(i / ROW_FLOAT4S), col = (int)(i % ROW_FLOAT4S) * CONVERT_FLOATS;
    const float4 a = reinterpret_cast<const float4 *>(p.dQ_acc + (size_t)bh * p.N * D)[i];
    uint2 out;
    out.x = pack2_of<BF16>(a.x * p.scale, a.y * p.scale);
    out.y = pack2_of<BF16>(a.z * p.scale, a.w * p.scale);
    *reinterpret_cast<uint2 *>(p.dQ + head_offset(p.layout.dQ, b, h) +
                               rows_offset(row, p.layout.dQ.row) + col) = out;
}
