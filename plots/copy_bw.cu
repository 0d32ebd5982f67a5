/*
 * copy_bw.cu: a memory-bound kernel's GB/s on this GPU, for scale in the main job's decode sweep
 * (plots/sweep.sh): a copy of 1 GiB by the SMs, 16-byte loads and stores, timed as the stage
 * programs time a launch (CUDA events around each, a warm-up, the median of at least 10 launches
 * and 0.5 s). A copy writes what it reads, and the HBM turns between the two: decode, which only
 * reads its cache, can pass this figure on long calls.
 *
 *   build/copy_bw [--mib M]
 *
 * stdout, one line: "ms_median ms_min repeats gbs device_mb", gbs = bytes read + written / time
 * (GB/s, 1e9 bytes); stderr: the same in words. Exit codes as the stage programs': 0, 3 (no CUDA
 * device), 4 (out of device memory), 2 (bad usage).
 */
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

enum { EXIT_PASS = 0, EXIT_USAGE = 2, EXIT_UNSUPPORTED = 3, EXIT_OOM = 4 };
static const int THREADS = 256;
static const int UNROLL = 4;  // 16-byte loads in flight per thread
static const int MIN_REPS = 10;
static const double MIN_MS = 500.0;
static const int MAX_REPS = 10000;

__global__ void copy_kernel(const int4 *__restrict__ src, int4 *__restrict__ dst, size_t n) {
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + (UNROLL - 1) * stride < n; i += UNROLL * stride) {
        int4 v[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; u++) v[u] = src[i + u * stride];
#pragma unroll
        for (int u = 0; u < UNROLL; u++) dst[i + u * stride] = v[u];
    }
    for (; i < n; i += stride) dst[i] = src[i];
}

static int fail(const char *what, cudaError_t e) {
    fprintf(stderr, "copy_bw: %s: %s\n", what, cudaGetErrorString(e));
    return e == cudaErrorMemoryAllocation ? EXIT_OOM : EXIT_UNSUPPORTED;
}

int main(int argc, char **argv) {
    long mib = 1024;
    for (int a = 1; a < argc; a++) {
        if (!strcmp(argv[a], "--mib") && a + 1 < argc) {
            mib = strtol(argv[++a], NULL, 10);
            if (mib < 1) {
                fprintf(stderr, "copy_bw: --mib takes a positive number of MiB\n");
                return EXIT_USAGE;
            }
        } else {
            fprintf(stderr, "usage: copy_bw [--mib M]  (a copy of M MiB, default 1024)\n");
            return !strcmp(argv[a], "--help") ? EXIT_PASS : EXIT_USAGE;
        }
    }
    int dev = 0, sms = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e != cudaSuccess) return fail("no CUDA device", e);
    cudaDeviceProp prop;
    if ((e = cudaGetDeviceProperties(&prop, dev)) != cudaSuccess) return fail("device", e);
    sms = prop.multiProcessorCount;
    const size_t bytes = (size_t)mib << 20, n = bytes / sizeof(int4);
    int4 *src = NULL, *dst = NULL;
    if ((e = cudaMalloc(&src, bytes)) != cudaSuccess) return fail("cudaMalloc", e);
    if ((e = cudaMalloc(&dst, bytes)) != cudaSuccess) return fail("cudaMalloc", e);
    if ((e = cudaMemset(src, 1, bytes)) != cudaSuccess) return fail("cudaMemset", e);
    int per_sm = 0;
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, copy_kernel, THREADS, 0);
    const int blocks = sms * std::max(per_sm, 1);
    cudaEvent_t t0, t1;
    cudaEventCreate(&t0);
    cudaEventCreate(&t1);
    std::vector<float> ms;
    double total = 0.0;
    for (int r = -1; r < MAX_REPS; r++) {  // r = -1: the warm-up
        cudaEventRecord(t0);
        copy_kernel<<<blocks, THREADS>>>(src, dst, n);
        cudaEventRecord(t1);
        if ((e = cudaEventSynchronize(t1)) != cudaSuccess) return fail("copy kernel", e);
        float m = 0.f;
        cudaEventElapsedTime(&m, t0, t1);
        if (r < 0) continue;
        ms.push_back(m);
        total += m;
        if ((int)ms.size() >= MIN_REPS && total >= MIN_MS) break;
    }
    std::sort(ms.begin(), ms.end());
    const size_t k = ms.size();
    const double med = k % 2 ? ms[k / 2] : 0.5 * (ms[k / 2 - 1] + ms[k / 2]);
    const double gbs = 2.0 * bytes / (med * 1e-3) / 1e9;
    fprintf(stderr, "copy_bw: %s: %zu MiB copied in %.4f ms (median of %zu): %.1f GB/s\n",
            prop.name, (size_t)mib, med, k, gbs);
    printf("%.4f %.4f %zu %.1f %.1f\n", med, (double)ms[0], k, gbs, 2.0 * mib);
    cudaFree(src);
    cudaFree(dst);
    return EXIT_PASS;
}
