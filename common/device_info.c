/*
 * device_info.c: the driver probe, the device facts and the shape rules (device_info.h).
 */
#include "device_info.h"

#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <float.h>
#include <math.h>
#include <stdio.h>

int attn_gpu_probe(const char *what, int *count, char *why, size_t len) {
    *count = 0;
    void *libcuda = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
    if (!libcuda) {
        snprintf(why, len, "no NVIDIA GPU here (no NVIDIA driver: libcuda.so.1 not found)");
        return -1;
    }
    dlclose(libcuda);
    cudaError_t e = cudaGetDeviceCount(count);
    if (e == cudaErrorNoDevice || (e == cudaSuccess && *count == 0)) {
        (void)cudaGetLastError();
        snprintf(why, len, "no NVIDIA GPU here (the driver finds no device)");
        return -1;
    }
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        int drv = 0, rt = 0;
        (void)cudaDriverGetVersion(&drv), (void)cudaRuntimeGetVersion(&rt);
        snprintf(why, len,
                 "the NVIDIA driver cannot run this %s: %s (driver supports CUDA %d.%d, %s built "
                 "with %d.%d)",
                 what, cudaGetErrorString(e), drv / 1000, drv % 1000 / 10, what, rt / 1000,
                 rt % 1000 / 10);
        return -1;
    }
    return 0;
}

void attn_device_limit_smem(attn_device *dev, long long smem_limit) {
    if (smem_limit > 0 && (size_t)smem_limit < dev->smem_per_block)
        dev->smem_per_block = (size_t)smem_limit;
}

cudaError_t attn_device_query(int ordinal, long long smem_limit, attn_device *dev, char *name,
                              size_t name_len, size_t *l2_bytes) {
    struct cudaDeviceProp p;
    cudaError_t e = cudaGetDeviceProperties(&p, ordinal);
    if (e != cudaSuccess) return e;
    dev->cc = p.major * 10 + p.minor;
    dev->smem_per_block = p.sharedMemPerBlockOptin;
    dev->sm_count = p.multiProcessorCount;
    attn_device_limit_smem(dev, smem_limit);
    if (name) {
        snprintf(name, name_len, "%s", p.name);
        for (char *c = name; *c; c++)
            if (*c == ',') *c = ' ';
    }
    if (l2_bytes) *l2_bytes = (size_t)p.l2CacheSize;
    return cudaSuccess;
}

attn_shape_rule attn_shape_check(const attn_shape *s) {
    if (s->B < 1 || s->H < 1 || s->N < 1 || s->D < 1) return ATTN_SHAPE_NOT_POSITIVE;
    if ((long long)s->B * s->H > ATTN_MAX_BH) return ATTN_SHAPE_BH;
    if (s->N > ATTN_MAX_N) return ATTN_SHAPE_N;
    if (!attn_head_dim_ok(s->D)) return ATTN_SHAPE_D;
    if (s->H_kv < 0 || (s->H_kv && s->H % s->H_kv)) return ATTN_SHAPE_KV_HEADS;
    if (s->N_k < 0 || s->N_k > ATTN_MAX_N) return ATTN_SHAPE_N_K;
    if (!(s->scale >= FLT_MIN) || !isfinite(s->scale)) return ATTN_SHAPE_SCALE;
    return ATTN_SHAPE_OK;
}
