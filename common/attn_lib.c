/*
 * attn_lib.c: the C entry point of build/lib/lib<stage>.so (`make lib`), linked beside one
 * stage's object. A caller that holds device pointers (python/flashcourse, through ctypes) gets
 * the stage descriptor `attn_this_stage` and these calls:
 *
 *   attn_lib_check           the program's shape rules, then the stage's own unsupported(); on
 *                            success the workspace the forward pass needs
 *   attn_lib_forward         the same checks, then the stage's forward() on the caller's stream
 *   attn_lib_backward_check  the same checks, and that the stage has a backward pass; on success
 *                            the workspace the backward pass needs
 *   attn_lib_backward        those checks, then the stage's backward() on the caller's stream
 *   attn_lib_exit_codes      "pass=<n>,wrong=<n>,usage=<n>,unsupported=<n>,oom=<n>": the codes
 *                            below by name, from the attn_exit enum of attention.h
 *
 * Each call takes the device ordinal the tensors live on; its properties are read once and
 * cached. smem_limit > 0 lowers the shared memory per block the stage may use, as the program's
 * --smem-limit does (65536 = T4, 101376 = L4): a T4 or L4 path can run on a bigger GPU.
 * Every failure is a return code, the program's exit codes (attn_exit: wrong for a CUDA error,
 * usage for a bad argument, unsupported here or no GPU, oom), and one line in err. Nothing
 * is printed, except what a stage's launcher itself writes to stderr (ATTN_TRY names the
 * failing call there).
 */
#define _POSIX_C_SOURCE 200809L
#include <dlfcn.h>
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>

#include "attention.h"

/* 3: the backward entry points and attn_lib_exit_codes */
#define ATTN_LIB_ABI 3
#define ATTN_LIB_MAX_DEVICES 64

/* The binding refuses a library whose entry points it does not know. */
int attn_lib_abi(void) {
    return ATTN_LIB_ABI;
}

static char exit_codes[128];
static pthread_once_t exit_codes_once = PTHREAD_ONCE_INIT;

static void make_exit_codes(void) {
    snprintf(exit_codes, sizeof exit_codes, "pass=%d,wrong=%d,usage=%d,unsupported=%d,oom=%d",
             ATTN_EXIT_PASS, ATTN_EXIT_WRONG, ATTN_EXIT_USAGE, ATTN_EXIT_UNSUPPORTED,
             ATTN_EXIT_OOM);
}

/* The return codes of every call here, by name: the one home is attn_exit (attention.h). */
const char *attn_lib_exit_codes(void) {
    pthread_once(&exit_codes_once, make_exit_codes);
    return exit_codes;
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
    return fail(e == cudaErrorMemoryAllocation ? ATTN_EXIT_OOM : ATTN_EXIT_WRONG, err, errlen,
                "%s: %s failed: %s (%s)", attn_this_stage.name, call, cudaGetErrorString(e),
                cudaGetErrorName(e));
}

/* No device: the program's words (common/main.c), not the runtime's "CUDA driver version is
 * insufficient", which sends a learner to upgrade a driver they do not have. */
static int no_gpu(cudaError_t e, char *err, size_t errlen) {
    const char *name = attn_this_stage.name;
    void *libcuda = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
    if (!libcuda)
        return fail(ATTN_EXIT_UNSUPPORTED, err, errlen,
                    "%s: no NVIDIA GPU here (no NVIDIA driver: libcuda.so.1 not found)", name);
    dlclose(libcuda);
    if (e == cudaErrorNoDevice || e == cudaSuccess)
        return fail(ATTN_EXIT_UNSUPPORTED, err, errlen,
                    "%s: no NVIDIA GPU here (the driver finds no device)", name);
    int drv = 0, rt = 0;
    (void)cudaDriverGetVersion(&drv), (void)cudaRuntimeGetVersion(&rt);
    return fail(ATTN_EXIT_UNSUPPORTED, err, errlen,
                "%s: the NVIDIA driver cannot run this library: %s (driver supports CUDA %d.%d, "
                "library built with %d.%d)",
                name, cudaGetErrorString(e), drv / 1000, drv % 1000 / 10, rt / 1000,
                rt % 1000 / 10);
}

/* ---- device properties, read once per device ---- */

static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;
static attn_device cache[ATTN_LIB_MAX_DEVICES];
static int cached[ATTN_LIB_MAX_DEVICES];

static int device_props(int device, long long smem_limit, attn_device *out, char *err,
                        size_t errlen) {
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
        (void)cudaGetLastError();
        return no_gpu(e, err, errlen);
    }
    if (device < 0 || device >= count || device >= ATTN_LIB_MAX_DEVICES)
        return fail(ATTN_EXIT_USAGE, err, errlen, "%s: CUDA device %d does not exist (%d here)",
                    attn_this_stage.name, device, count);
    int rc = ATTN_EXIT_PASS;
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
    if (rc == ATTN_EXIT_PASS) *out = cache[device];
    pthread_mutex_unlock(&cache_lock);
    if (rc == ATTN_EXIT_PASS && smem_limit > 0 && (size_t)smem_limit < out->smem_per_block)
        out->smem_per_block = (size_t)smem_limit;
    return rc;
}

/* ---- the checks the program makes before it runs a stage ---- */

enum { PASS_FWD = 0, PASS_BWD = 1 };

/* Makes `device` current (the stage's launchers and its unsupported() ask the runtime about
 * the current device) and runs every check; *prev is the device to restore afterwards. The
 * checks that need no device come first, so they answer alike on a machine without a GPU. */
static int prepare(int device, long long smem_limit, const attn_shape *s, int variant, int pass,
                   attn_device *dev, int *prev, char *err, size_t errlen) {
    const char *name = attn_this_stage.name;
    if (variant < 0 || variant >= attn_variant_count(attn_this_stage.variants))
        return fail(ATTN_EXIT_USAGE, err, errlen, "%s: variant index %d is not one of %s", name,
                    variant, attn_this_stage.variants);
    if (s->B < 1 || s->H < 1 || s->N < 1 || s->D < 1)
        return fail(ATTN_EXIT_USAGE, err, errlen,
                    "%s: B, H, N and D must be >= 1 (got %d, %d, %d, %d)", name, s->B, s->H, s->N,
                    s->D);
    /* The program's limits (attention.h): every stage is tested within them. */
    if ((long long)s->B * s->H > ATTN_MAX_BH)
        return fail(ATTN_EXIT_USAGE, err, errlen, "%s: B * H must be at most %d (got %lld)", name,
                    ATTN_MAX_BH, (long long)s->B * s->H);
    if (s->N > ATTN_MAX_N)
        return fail(ATTN_EXIT_USAGE, err, errlen, "%s: N must be at most %d (got %d)", name,
                    ATTN_MAX_N, s->N);
    if (!(s->scale >= FLT_MIN) || !isfinite(s->scale)) /* as the program: no 0, subnormal, inf */
        return fail(ATTN_EXIT_USAGE, err, errlen,
                    "%s: scale must be a positive normal float (got %g)", name, (double)s->scale);
    if (pass == PASS_BWD &&
        (!attn_this_stage.backward || !attn_this_stage.backward_workspace_bytes))
        return fail(ATTN_EXIT_UNSUPPORTED, err, errlen, "stage %s has no backward pass", name);
    int rc = device_props(device, smem_limit, dev, err, errlen);
    if (rc != ATTN_EXIT_PASS) return rc;
    cudaError_t e = cudaGetDevice(prev);
    if (e != cudaSuccess) return cuda_fail(e, "cudaGetDevice", err, errlen);
    if (*prev != device && (e = cudaSetDevice(device)) != cudaSuccess)
        return cuda_fail(e, "cudaSetDevice", err, errlen);
    const char *why = attn_this_stage.unsupported(s, dev, variant);
    if (why) return fail(ATTN_EXIT_UNSUPPORTED, err, errlen, "%s: %s", name, why);
    return ATTN_EXIT_PASS;
}

static void restore(int prev, int device) {
    if (prev != device) (void)cudaSetDevice(prev);
}

static size_t workspace_for(int pass, const attn_shape *s, const attn_device *dev, int variant) {
    return pass == PASS_BWD ? attn_this_stage.backward_workspace_bytes(s, dev, variant)
                            : attn_this_stage.workspace_bytes(s, dev, variant);
}

static int check(int pass, int device, long long smem_limit, const attn_shape *s, int variant,
                 size_t *workspace_bytes, char *err, size_t errlen) {
    attn_device dev;
    int prev = device;
    int rc = prepare(device, smem_limit, s, variant, pass, &dev, &prev, err, errlen);
    if (rc == ATTN_EXIT_PASS && workspace_bytes)
        *workspace_bytes = workspace_for(pass, s, &dev, variant);
    restore(prev, device);
    return rc;
}

/* After the checks: the pointers and the workspace, then one pass on the caller's stream. */
static int run(int pass, int device, long long smem_limit, const attn_shape *s, int variant,
               const void *const *in, int n_in, void *const *out, int n_out, const char *names,
               void *workspace, size_t workspace_bytes, cudaStream_t stream, char *err,
               size_t errlen) {
    attn_device dev;
    int prev = device;
    int rc = prepare(device, smem_limit, s, variant, pass, &dev, &prev, err, errlen);
    if (rc != ATTN_EXIT_PASS) {
        restore(prev, device);
        return rc;
    }
    const size_t need = workspace_for(pass, s, &dev, variant);
    int null = need && !workspace;
    for (int i = 0; i < n_in; i++) null |= !in[i];
    for (int i = 0; i < n_out; i++) null |= !out[i];
    if (null) {
        rc = fail(ATTN_EXIT_USAGE, err, errlen, "%s: a NULL pointer among %s%s",
                  attn_this_stage.name, names, need ? ", workspace" : "");
    } else if (workspace_bytes < need) {
        rc = fail(ATTN_EXIT_USAGE, err, errlen, "%s: workspace of %zu bytes, the stage needs %zu",
                  attn_this_stage.name, workspace_bytes, need);
    } else {
        cudaError_t e = pass == PASS_BWD
                            ? attn_this_stage.backward(s, &dev, in[0], in[1], in[2], in[3],
                                                       (const float *)in[4], in[5], out[0], out[1],
                                                       out[2], workspace, variant, stream)
                            : attn_this_stage.forward(s, &dev, in[0], in[1], in[2], out[0],
                                                      (float *)out[1], workspace, variant, stream);
        if (e == cudaSuccess) e = cudaGetLastError();
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            rc = cuda_fail(e, pass == PASS_BWD ? "backward" : "forward", err, errlen);
        }
    }
    restore(prev, device);
    return rc;
}

int attn_lib_check(int device, long long smem_limit, int B, int H, int N, int D, int causal,
                   float scale, int variant, size_t *workspace_bytes, char *err, size_t errlen) {
    const attn_shape s = {B, H, N, D, causal != 0, scale};
    return check(PASS_FWD, device, smem_limit, &s, variant, workspace_bytes, err, errlen);
}

int attn_lib_forward(int device, long long smem_limit, int B, int H, int N, int D, int causal,
                     float scale, int variant, const void *Q, const void *K, const void *V, void *O,
                     float *lse, void *workspace, size_t workspace_bytes, void *stream, char *err,
                     size_t errlen) {
    const attn_shape s = {B, H, N, D, causal != 0, scale};
    const void *in[] = {Q, K, V};
    void *out[] = {O, lse};
    return run(PASS_FWD, device, smem_limit, &s, variant, in, 3, out, 2, "Q, K, V, O, lse",
               workspace, workspace_bytes, (cudaStream_t)stream, err, errlen);
}

int attn_lib_backward_check(int device, long long smem_limit, int B, int H, int N, int D,
                            int causal, float scale, int variant, size_t *workspace_bytes,
                            char *err, size_t errlen) {
    const attn_shape s = {B, H, N, D, causal != 0, scale};
    return check(PASS_BWD, device, smem_limit, &s, variant, workspace_bytes, err, errlen);
}

int attn_lib_backward(int device, long long smem_limit, int B, int H, int N, int D, int causal,
                      float scale, int variant, const void *Q, const void *K, const void *V,
                      const void *O, const float *lse, const void *dO, void *dQ, void *dK, void *dV,
                      void *workspace, size_t workspace_bytes, void *stream, char *err,
                      size_t errlen) {
    const attn_shape s = {B, H, N, D, causal != 0, scale};
    const void *in[] = {Q, K, V, O, lse, dO};
    void *out[] = {dQ, dK, dV};
    return run(PASS_BWD, device, smem_limit, &s, variant, in, 6, out, 3,
               "Q, K, V, O, lse, dO, dQ, dK, dV", workspace, workspace_bytes, (cudaStream_t)stream,
               err, errlen);
}
