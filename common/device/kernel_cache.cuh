/*
 * common/device/kernel_cache.cuh: what a launcher asks the driver once per (kernel, device), not
 * once per call; host code. Python calls a stage for every attention call, and a launch of FA2
 * pays for none of this: cudaFuncGetAttributes (which code a kernel has on this device) and
 * cudaFuncSetAttribute (its dynamic shared-memory limit) are asked once per kernel and device and
 * remembered, under one mutex (callers may be on several threads).
 *
 * Part of a stage's one translation unit (each stage has its own records). [[maybe_unused]]: a
 * stage may use some of it only.
 */
#pragma once

#include <cuda_runtime.h>
#include <pthread.h>
#include <stdio.h>

#include "attention.h"  // ATTN_TRY

inline constexpr int MAX_DEVICES = 64;
[[maybe_unused]] static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;

// The current device, checked against MAX_DEVICES (the caches' size).
[[maybe_unused]] static cudaError_t current_device(int *device) {
    ATTN_TRY(cudaGetDevice(device));
    if (*device < 0 || *device >= MAX_DEVICES) {
        fprintf(stderr, "device %d: at most %d devices\n", *device, MAX_DEVICES);
        return cudaErrorInvalidDevice;
    }
    return cudaSuccess;
}

// What is remembered of one kernel on one device (0: not asked yet).
typedef struct {
    const void *fn;
    int device;
    int ptx_version, binary_version;          // cudaFuncGetAttributes: the code the kernel has here
    int smem_limit;                           // the dynamic shared-memory limit set for it
    int blocks, blocks_threads, blocks_smem;  // kernel_blocks_per_sm: blocks of this size a
                                              // multiprocessor holds
} kernel_record;

// A stage has a few dozen kernels; past KERNEL_RECORDS (kernel, device) pairs nothing more is
// remembered, and the driver is asked every time.
inline constexpr int KERNEL_RECORDS = 256;
[[maybe_unused]] static kernel_record kernel_records[KERNEL_RECORDS];
[[maybe_unused]] static int kernel_record_count;

// The record of (fn, device), made if new, or NULL when the table is full. Under cache_lock.
[[maybe_unused]] static kernel_record *kernel_record_of(const void *fn, int device) {
    for (int i = 0; i < kernel_record_count; ++i) {
        if (kernel_records[i].fn == fn && kernel_records[i].device == device)
            return &kernel_records[i];
    }
    if (kernel_record_count == KERNEL_RECORDS) return NULL;
    kernel_record *r = &kernel_records[kernel_record_count++];
    r->fn = fn, r->device = device;
    return r;
}

// The PTX and machine-code versions (major * 10 + minor) of kernel fn on the current device (a
// compute_75 PTX build JIT-compiled on an H100: 75 and 90): which code runs there, not which
// device it is. Asked once per kernel and device; an error is returned (silently: the caller
// decides whether it is one) and not remembered.
[[maybe_unused]] static cudaError_t kernel_versions(const void *fn, int *ptx_version,
                                                    int *binary_version) {
    int device = 0;
    ATTN_TRY(current_device(&device));
    pthread_mutex_lock(&cache_lock);
    kernel_record *r = kernel_record_of(fn, device);
    const bool known = r && r->ptx_version > 0;
    if (known) *ptx_version = r->ptx_version, *binary_version = r->binary_version;
    pthread_mutex_unlock(&cache_lock);
    if (known) return cudaSuccess;
    cudaFuncAttributes fa;
    const cudaError_t err = cudaFuncGetAttributes(&fa, fn);
    if (err != cudaSuccess) return err;
    *ptx_version = fa.ptxVersion, *binary_version = fa.binaryVersion;
    pthread_mutex_lock(&cache_lock);
    if (r) r->ptx_version = fa.ptxVersion, r->binary_version = fa.binaryVersion;
    pthread_mutex_unlock(&cache_lock);
    return cudaSuccess;
}

// Kernel fn may use `smem` bytes of dynamic shared memory on the current device
// (cudaFuncAttributeMaxDynamicSharedMemorySize): set once per kernel and device (again for more).
[[maybe_unused]] static cudaError_t kernel_smem_limit(const void *fn, int smem) {
    int device = 0;
    ATTN_TRY(current_device(&device));
    pthread_mutex_lock(&cache_lock);
    kernel_record *r = kernel_record_of(fn, device);
    const bool set = r && r->smem_limit >= smem && r->smem_limit > 0;
    pthread_mutex_unlock(&cache_lock);
    if (set) return cudaSuccess;
    ATTN_TRY(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    pthread_mutex_lock(&cache_lock);
    if (r && smem > r->smem_limit) r->smem_limit = smem;
    pthread_mutex_unlock(&cache_lock);
    return cudaSuccess;
}

// How many blocks of kernel fn, of `threads` threads and `smem` bytes of dynamic shared memory, a
// multiprocessor of the current device holds at once (its registers, shared memory and threads:
// cudaOccupancyMaxActiveBlocksPerMultiprocessor, after kernel_smem_limit), at least 1. Asked once
// per kernel, device and block size.
[[maybe_unused]] static cudaError_t kernel_blocks_per_sm(const void *fn, int threads, int smem,
                                                         int *blocks) {
    int device = 0;
    ATTN_TRY(current_device(&device));
    pthread_mutex_lock(&cache_lock);
    kernel_record *r = kernel_record_of(fn, device);
    const bool known = r && r->blocks > 0 && r->blocks_threads == threads && r->blocks_smem == smem;
    if (known) *blocks = r->blocks;
    pthread_mutex_unlock(&cache_lock);
    if (known) return cudaSuccess;
    ATTN_TRY(kernel_smem_limit(fn, smem));
    int n = 0;
    ATTN_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, fn, threads, (size_t)smem));
    *blocks = n > 0 ? n : 1;
    pthread_mutex_lock(&cache_lock);
    if (r) r->blocks = *blocks, r->blocks_threads = threads, r->blocks_smem = smem;
    pthread_mutex_unlock(&cache_lock);
    return cudaSuccess;
}
