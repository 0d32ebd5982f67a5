/*
 * attn_lib.c: the C entry point of build/lib/lib<stage>.so (`make lib`), linked beside one
 * stage's object. A caller that holds device pointers (python/flashcourse, through ctypes) gets
 * the stage descriptor `attn_this_stage` and two calls:
 *
 *   attn_lib_check    the program's shape rules, then the stage's own unsupported(); on success
 *                     the workspace the forward pass needs
 *   attn_lib_forward  the same checks, then the stage's forward() on the caller's stream
 *
 * Both take the device ordinal the tensors live on; its properties are read once and cached.
 * smem_limit > 0 lowers the shared memory per block the stage may use, as the program's
 * --smem-limit does (65536 = T4, 101376 = L4): a T4 or L4 path can run on a bigger GPU.
 * Every failure is a return code (the program's exit codes: 1 CUDA error, 2 bad argument,
 * 3 unsupported here, 4 out of device memory) and one line in err. Nothing is printed, except
 * what a stage's launcher itself writes to stderr (ATTN_TRY names the failing call there).
 */
#define _POSIX_C_SOURCE 200809L
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>

#include "attention.h"

#define ATTN_LIB_ABI 2
#define ATTN_LIB_MAX_DEVICES 64

enum { LIB_OK = 0, LIB_CUDA = 1, LIB_BAD_ARG = 2, LIB_UNSUPPORTED = 3, LIB_OOM = 4 };

/* The binding refuses a library whose entry points it does not know. */
int attn_lib_abi(void) {
    return ATTN_LIB_ABI;
}

static int fail(int code, char *err, size_t errlen, const char *fmt, ...) {
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return code;
}

static int cuda_fail(cudaError_t e, const char *call, char *err, size_t errlen) {
    return fail(e == cudaErrorMemoryAllocation ? LIB_OOM : LIB_CUDA, err, errlen,
                "%s: %s failed: %s (%s)", attn_this_stage.name, call, cudaGetErrorString(e),
                cudaGetErrorName(e));
}

/* ---- device properties, read once per device ---- */

static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;
static attn_device cache[ATTN_LIB_MAX_DEVICES];
static int cached[ATTN_LIB_MAX_DEVICES];

static int device_props(int device, long long smem_limit, attn_device *out, char *err,
                        size_t errlen) {
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return fail(LIB_CUDA, err, errlen, "%s: no CUDA device here (cudaGetDeviceCount: %s)",
                    attn_this_stage.name, cudaGetErrorString(e));
    }
    if (device < 0 || device >= count || device >= ATTN_LIB_MAX_DEVICES)
        return fail(LIB_BAD_ARG, err, errlen, "%s: CUDA device %d does not exist (%d here)",
                    attn_this_stage.name, device, count);
    int rc = LIB_OK;
    pthread_mutex_lock(&cache_lock);
    if (!cached[device]) {
        struct cudaDeviceProp p;
        e = cudaGetDeviceProperties(&p, device);
        if (e != cudaSuccess) {
            rc = cuda_fail(e, "cudaGetDeviceProperties", err, errlen);
        } else {
            cache[device].cc = p.major * 10 + p.minor;
            cache[device].smem_per_block = p.sharedMemPerBlockOptin;
            cache[device].sm_count = p.multiProcessorCount;
            cached[device] = 1;
        }
    }
    if (rc == LIB_OK) *out = cache[device];
    pthread_mutex_unlock(&cache_lock);
    if (rc == LIB_OK && smem_limit > 0 && (size_t)smem_limit < out->smem_per_block)
        out->smem_per_block = (size_t)smem_limit;
    return rc;
}

/* ---- the checks the program makes before it runs a stage ---- */

static int variant_count(void) {
    int n = 1;
    for (const char *p = attn_this_stage.variants; *p; p++) n += *p == ',';
    return n;
}

/* Makes `device` current (the stage's launchers and its unsupported() ask the runtime about
 * the current device) and runs every check; *prev is the device to restore afterwards. */
static int prepare(int device, long long smem_limit, const attn_shape *s, int variant,
                   attn_device *dev, int *prev, char *err, size_t errlen) {
    const char *name = attn_this_stage.name;
    if (variant < 0 || variant >= variant_count())
        return fail(LIB_BAD_ARG, err, errlen, "%s: variant index %d is not one of %s", name,
                    variant, attn_this_stage.variants);
    if (s->B < 1 || s->H < 1 || s->N < 1 || s->D < 1)
        return fail(LIB_BAD_ARG, err, errlen, "%s: B, H, N and D must be >= 1 (got %d, %d, %d, %d)",
                    name, s->B, s->H, s->N, s->D);
    if (!(s->scale >= FLT_MIN) || !isfinite(s->scale)) /* as the program: no 0, subnormal, inf */
        return fail(LIB_BAD_ARG, err, errlen, "%s: scale must be a positive normal float (got %g)",
                    name, (double)s->scale);
    int rc = device_props(device, smem_limit, dev, err, errlen);
    if (rc != LIB_OK) return rc;
    cudaError_t e = cudaGetDevice(prev);
    if (e != cudaSuccess) return cuda_fail(e, "cudaGetDevice", err, errlen);
    if (*prev != device && (e = cudaSetDevice(device)) != cudaSuccess)
        return cuda_fail(e, "cudaSetDevice", err, errlen);
    const char *why = attn_this_stage.unsupported(s, dev, variant);
    if (why) return fail(LIB_UNSUPPORTED, err, errlen, "%s: %s", name, why);
    /* The program's own limit (common/main.c): every stage is tested within it. */
    if ((long long)s->B * s->H > 65535)
        return fail(LIB_UNSUPPORTED, err, errlen, "%s: B * H must be at most 65535 (got %lld)",
                    name, (long long)s->B * s->H);
    return LIB_OK;
}

static void restore(int prev, int device) {
    if (prev != device) (void)cudaSetDevice(prev);
}

int attn_lib_check(int device, long long smem_limit, int B, int H, int N, int D, int causal,
                   float scale, int variant, size_t *workspace_bytes, char *err, size_t errlen) {
    const attn_shape s = {B, H, N, D, causal != 0, scale};
    attn_device dev;
    int prev = device;
    int rc = prepare(device, smem_limit, &s, variant, &dev, &prev, err, errlen);
    if (rc == LIB_OK && workspace_bytes)
        *workspace_bytes = attn_this_stage.workspace_bytes(&s, &dev, variant);
    restore(prev, device);
    return rc;
}

int attn_lib_forward(int device, long long smem_limit, int B, int H, int N, int D, int causal,
                     float scale, int variant, const void *Q, const void *K, const void *V, void *O,
                     float *lse, void *workspace, size_t workspace_bytes, void *stream, char *err,
                     size_t errlen) {
    const attn_shape s = {B, H, N, D, causal != 0, scale};
    attn_device dev;
    int prev = device;
    int rc = prepare(device, smem_limit, &s, variant, &dev, &prev, err, errlen);
    if (rc != LIB_OK) {
        restore(prev, device);
        return rc;
    }
    const size_t need = attn_this_stage.workspace_bytes(&s, &dev, variant);
    if (!Q || !K || !V || !O || !lse || (need && !workspace)) {
        rc = fail(LIB_BAD_ARG, err, errlen, "%s: a NULL pointer among Q, K, V, O, lse%s",
                  attn_this_stage.name, need ? ", workspace" : "");
    } else if (workspace_bytes < need) {
        rc = fail(LIB_BAD_ARG, err, errlen, "%s: workspace of %zu bytes, the stage needs %zu",
                  attn_this_stage.name, workspace_bytes, need);
    } else {
        cudaError_t e = attn_this_stage.forward(&s, &dev, Q, K, V, O, lse, workspace, variant,
                                                (cudaStream_t)stream);
        if (e == cudaSuccess) e = cudaGetLastError();
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            rc = cuda_fail(e, "forward", err, errlen);
        }
    }
    restore(prev, device);
    return rc;
}
