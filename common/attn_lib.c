/*
 * attn_lib.c: the C entry point of build/lib/lib<stage>.so (`make lib`), linked beside one
 * stage's object: the calls attn_lib.h declares (python/flashcourse reaches them through ctypes),
 * beside the stage descriptor `attn_this_stage`.
 *
 * attn_lib_plan makes every check the program makes before a pass (its shape rules, the device,
 * what the stage takes, its own unsupported()) for one attn_lib_request: one pass (forward,
 * backward or decode), shape (with H_kv, N_k, bf16 and the tensors' strides), device, variant and
 * shared-memory limit; a decode's cache too (attn_cache_refused: pages, new keys, N_k), and what
 * the stage's decode needs (decode_workspace_bytes). A stage without a decode refuses one.
 *
 * The split is the per-call cost: a caller plans a shape once and runs it many times, and a
 * run does no more than a launch needs (the NULL and workspace checks, the device made current
 * if it is not, the stage's launcher): no property query, no shape rule, no unsupported().
 * Device properties are read once per device. smem_limit > 0 lowers the shared memory per block
 * the stage may use, as the program's --smem-limit does (65536 = T4, 101376 = L4): a T4 or L4
 * path can run on a bigger GPU. Every failure is a return code, the program's exit codes
 * (attn_exit: wrong for a CUDA error, usage for a bad argument, unsupported here or no GPU,
 * oom), and one line for attn_lib_last_error. Nothing is printed, except what a stage's
 * launcher itself writes to stderr (ATTN_TRY names the failing call there).
 *
 * A packed batch (the request's varlen: attention.h's attn_varlen) is planned from B, the longest
 * sequences (N, N_k) and the tokens (total_q, total_k), never from the sequences' boundaries: those
 * are pointers of the run (cu_seqlens_q, cu_seqlens_k), which a packed plan's run must pass and
 * an unpacked plan's must not. A packed batch with nothing to compute (attn_packed_empty: no
 * token of a side, or N = 0) calls no stage: the run writes O = 0 and lse = -inf on every query
 * row (the forward), dQ = dK = dV = 0 (the backward), on the stream, as flash-attn returns them.
 */
#define _POSIX_C_SOURCE 200809L
#include "attn_lib.h"

#include <cuda.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>

#include "attention.h"
#include "device_info.h"

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

static char limits[128];
static pthread_once_t limits_once = PTHREAD_ONCE_INIT;

static void make_limits(void) {
    snprintf(limits, sizeof limits, "max_bh=%d,max_n=%d", ATTN_MAX_BH, ATTN_MAX_N);
}

/* The shape limits by name: the one home is attention.h (ATTN_MAX_BH, ATTN_MAX_N). */
const char *attn_lib_limits(void) {
    pthread_once(&limits_once, make_limits);
    return limits;
}

/* The calling thread's last failure: the caller reads it after a non-zero return code (ctypes
 * releases the GIL during a call, so two Python threads may fail at once). */
static _Thread_local char last_error[1024];

const char *attn_lib_last_error(void) {
    return last_error;
}

static int fail(int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return code;
}

static int cuda_fail(cudaError_t e, const char *call) {
    return fail(e == cudaErrorMemoryAllocation ? ATTN_EXIT_OOM : ATTN_EXIT_WRONG,
                "%s: %s failed: %s (%s)", attn_this_stage.name, call, cudaGetErrorString(e),
                cudaGetErrorName(e));
}

/* ---- device properties, read once per device (common/device_info.c: the program's too) ---- */

static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;
static attn_device cache[ATTN_LIB_MAX_DEVICES];
static int cached[ATTN_LIB_MAX_DEVICES];

static int device_props(int device, long long smem_limit, attn_device *out) {
    int count = 0;
    char why[256];
    if (attn_gpu_probe("library", &count, why, sizeof why) != 0)
        return fail(ATTN_EXIT_UNSUPPORTED, "%s: %s", attn_this_stage.name, why);
    if (device < 0 || device >= count || device >= ATTN_LIB_MAX_DEVICES)
        return fail(ATTN_EXIT_USAGE, "%s: CUDA device %d does not exist (%d here)",
                    attn_this_stage.name, device, count);
    int rc = ATTN_EXIT_PASS;
    pthread_mutex_lock(&cache_lock);
    if (!cached[device]) {
        cudaError_t e = attn_device_query(device, 0, &cache[device], NULL, 0, NULL);
        if (e != cudaSuccess)
            rc = cuda_fail(e, "cudaGetDeviceProperties");
        else
            cached[device] = 1;
    }
    if (rc == ATTN_EXIT_PASS) *out = cache[device];
    pthread_mutex_unlock(&cache_lock);
    if (rc == ATTN_EXIT_PASS) attn_device_limit_smem(out, smem_limit);
    return rc;
}

/* ---- plans: every check once, then runs ---- */

enum { PASS_FWD = ATTN_LIB_FORWARD, PASS_BWD = ATTN_LIB_BACKWARD, PASS_DEC = ATTN_LIB_DECODE };

static const char *pass_name(int pass) {
    return pass == PASS_BWD ? "backward" : pass == PASS_DEC ? "decode" : "forward";
}

/* What attn_lib_plan checked, kept by the caller (attn_lib_plan_bytes of room) and handed back
 * to every run. `stage` ties it to this library: a plan of another stage's library is refused. */
typedef struct {
    const attn_stage *stage;
    int pass, device, variant;
    attn_shape shape;
    attn_device dev; /* the device's properties, smem_per_block lowered by smem_limit */
    size_t workspace;
    attn_cache cache; /* decode: the cache's sizes and the new keys' strides (pointers NULL) */
    int paged;        /* decode: the run passes a block table */
    int packed;       /* a packed batch: the run passes cu_seqlens_q, cu_seqlens_k (the shape's
                         varlen pointers NULL here) */
    int empty;        /* a packed batch with nothing to compute (attn_packed_empty): no stage */
} attn_lib_plan_t;

size_t attn_lib_plan_bytes(void) {
    return sizeof(attn_lib_plan_t);
}

/* The checks that need no device, so they answer alike on a machine without a GPU. */
static int check_arguments(const attn_shape *s, int variant, int pass) {
    const char *name = attn_this_stage.name;
    if (pass != PASS_FWD && pass != PASS_BWD && pass != PASS_DEC)
        return fail(ATTN_EXIT_USAGE, "%s: pass %d is not forward (0), backward (1) or decode (2)",
                    name, pass);
    if (pass == PASS_DEC && (!attn_this_stage.decode || !attn_this_stage.decode_workspace_bytes))
        return fail(ATTN_EXIT_UNSUPPORTED,
                    "stage %s has no decode pass (a KV cache: the decode stage's library has one)",
                    name);
    if (variant < 0 || variant >= attn_variant_count(attn_this_stage.variants))
        return fail(ATTN_EXIT_USAGE, "%s: variant index %d is not one of %s", name, variant,
                    attn_this_stage.variants);
    attn_shape rules = *s; /* a packed batch's N may be 0 (no query: nothing to compute) */
    if (s->varlen.cu_seqlens_q && rules.N == 0) rules.N = 1;
    switch (attn_shape_check(&rules)) { /* the program's rules (device_info.c) */
        case ATTN_SHAPE_OK:
            break;
        case ATTN_SHAPE_NOT_POSITIVE:
            return fail(ATTN_EXIT_USAGE, "%s: B, H, N and D must be >= 1 (got %d, %d, %d, %d)",
                        name, s->B, s->H, s->N, s->D);
        case ATTN_SHAPE_BH:
            return fail(ATTN_EXIT_USAGE, "%s: B * H must be at most %d (got %lld)", name,
                        ATTN_MAX_BH, (long long)s->B * s->H);
        case ATTN_SHAPE_N:
            return fail(ATTN_EXIT_USAGE, "%s: N must be at most %d (got %d)", name, ATTN_MAX_N,
                        s->N);
        case ATTN_SHAPE_D:
            return fail(ATTN_EXIT_USAGE, "%s: head dim must be " ATTN_HEAD_DIMS " (got %d)", name,
                        s->D);
        case ATTN_SHAPE_KV_HEADS:
            return fail(ATTN_EXIT_USAGE, "%s: H_kv must divide H (got H = %d, H_kv = %d)", name,
                        s->H, s->H_kv);
        case ATTN_SHAPE_N_K:
            return fail(ATTN_EXIT_USAGE, "%s: N_k must be in [1, %d] (got %d)", name, ATTN_MAX_N,
                        s->N_k);
        case ATTN_SHAPE_SCALE:
            return fail(ATTN_EXIT_USAGE, "%s: scale must be a positive normal float (got %g)", name,
                        (double)s->scale);
    }
    if (pass == PASS_BWD &&
        (!attn_this_stage.backward || !attn_this_stage.backward_workspace_bytes))
        return fail(ATTN_EXIT_UNSUPPORTED, "stage %s has no backward pass", name);
    return ATTN_EXIT_PASS;
}

/* Makes `device` current (the stage's launchers and its unsupported() ask the runtime about
 * the current device); *prev is the device to restore afterwards. */
static int enter_device(int device, int *prev) {
    cudaError_t e = cudaGetDevice(prev);
    if (e != cudaSuccess) return cuda_fail(e, "cudaGetDevice");
    if (*prev != device && (e = cudaSetDevice(device)) != cudaSuccess)
        return cuda_fail(e, "cudaSetDevice");
    return ATTN_EXIT_PASS;
}

static void leave_device(int prev, int device) {
    if (prev != device) (void)cudaSetDevice(prev);
}

/* A decode's contiguous layouts ([B, N, H, D] of q and o; the cache's [B, N_max, H_kv, D] or
 * [num_pages, page_size, H_kv, D]) where the request's strides are zero, and a paged cache's N_k
 * of 0: its block table's reach. */
static void decode_defaults(const attn_lib_request *r, attn_shape *s) {
    const int H_kv = s->H_kv ? s->H_kv : s->H;
    if (r->paged && s->N_k == 0 && r->page_size > 0 && r->max_pages > 0) {
        long long reach = (long long)r->page_size * r->max_pages;
        s->N_k = reach > ATTN_MAX_N ? ATTN_MAX_N + 1 : (int)reach; /* over: the shape rule's */
    }
    const long long rows = r->paged ? r->page_size : s->N_k;
    const attn_layout qo = {(long long)s->N * s->H * s->D, s->D, (long long)s->H * s->D},
                      kv = {rows * H_kv * s->D, s->D, (long long)H_kv * s->D};
    if (attn_layout_unset(&s->q)) s->q = qo;
    if (attn_layout_unset(&s->o)) s->o = qo;
    if (attn_layout_unset(&s->k)) s->k = kv;
    if (attn_layout_unset(&s->v)) s->v = kv;
}

/* Where a plan's cache and packed batch stand in for the run's pointers: attn_cache_refused, the
 * stage's unsupported() and its workspace sizes see which pointers the run passes (non-NULL),
 * never where they point. */
static const int placeholder;

/* The shape of a request: H_kv and N_k 0 (H and N) and a tensor's strides all zero (contiguous;
 * packed: [total, heads, D]) filled in by attn_shape_complete (a decode's first by
 * decode_defaults); a packed batch's sequences the placeholder's. */
static attn_shape shape_of(const attn_lib_request *r) {
    attn_shape s = {.B = r->B,
                    .H = r->H,
                    .N = r->N,
                    .D = r->D,
                    .causal = r->causal != 0,
                    .scale = r->scale,
                    .H_kv = r->H_kv,
                    .N_k = r->N_k,
                    .bf16 = r->bf16 != 0,
                    .local = r->local != 0,
                    .window_left = r->window_left,
                    .window_right = r->window_right,
                    .softcap = r->softcap};
    if (r->varlen) s.varlen = (attn_varlen){&placeholder, &placeholder, r->total_q, r->total_k};
    attn_layout *l[] = {&s.q, &s.k, &s.v, &s.o, &s.dO, &s.dQ, &s.dK, &s.dV};
    for (int t = 0; t < 8; t++)
        *l[t] = (attn_layout){r->strides[3 * t], r->strides[3 * t + 1], r->strides[3 * t + 2]};
    if (r->pass == PASS_DEC) decode_defaults(r, &s);
    attn_shape_complete(&s); /* zeros filled in; a negative H_kv or N_k the shape rules refuse */
    return s;
}

/* The layouts' rule that needs no device (strides that reach no element twice in a row; H_kv and
 * N_k are the shape rules' of device_info.c), then what the stage takes (a decode: its decode's
 * unsupported() says, as q and the cache are laid out otherwise than a forward's tensors). */
static int check_model_inputs(const attn_shape *s, const attn_cache *c, int pass) {
    const char *name = attn_this_stage.name;
    const attn_layout *l[] = {&s->q,  &s->k,  &s->v,  &s->o,     &s->dO,
                              &s->dQ, &s->dK, &s->dV, &c->k_new, &c->v_new};
    for (int t = 0; t < (pass == PASS_DEC && c->N_new > 0 ? 10 : 8); t++)
        if (l[t]->row < s->D || l[t]->head < 0 || l[t]->batch < 0)
            return fail(ATTN_EXIT_USAGE,
                        "%s: strides must be >= 0, rows at least D = %d elements apart", name,
                        s->D);
    if (pass == PASS_DEC && (s->local || s->softcap > 0.f))
        return fail(ATTN_EXIT_UNSUPPORTED, "%s: a decode takes no local window or softcap", name);
    if (pass == PASS_DEC) return ATTN_EXIT_PASS;
    const char *why = attn_shape_refused(
        s, pass == PASS_BWD ? attn_this_stage.backward_takes : attn_this_stage.takes,
        pass == PASS_BWD);
    if (why)
        return fail(ATTN_EXIT_UNSUPPORTED, "%s%s does not take %s", name,
                    pass == PASS_BWD ? "'s backward pass" : "", why);
    return ATTN_EXIT_PASS;
}

/* A decode request's cache (attention.h's attn_cache): the sizes and the new keys' strides, the
 * pointers the run will pass as placeholders. */
static attn_cache cache_of(const attn_lib_request *r, const attn_shape *s) {
    attn_cache c = {.seqlens = &placeholder,
                    .block_table = r->paged ? &placeholder : NULL,
                    .page_size = r->paged ? r->page_size : 0,
                    .num_pages = r->paged ? r->num_pages : 0,
                    .max_pages = r->paged ? r->max_pages : 0,
                    .N_new = r->N_new,
                    .K_new = r->N_new > 0 ? &placeholder : NULL,
                    .V_new = r->N_new > 0 ? &placeholder : NULL};
    const long long *n = r->new_strides;
    c.k_new = (attn_layout){n[0], n[1], n[2]};
    c.v_new = (attn_layout){n[3], n[4], n[5]};
    const attn_layout new_rows = {(long long)r->N_new * s->H_kv * s->D, s->D,
                                  (long long)s->H_kv * s->D}; /* [B, N_new, H_kv, D] */
    if (attn_layout_unset(&c.k_new)) c.k_new = new_rows;
    if (attn_layout_unset(&c.v_new)) c.v_new = new_rows;
    return c;
}

/* A packed batch's rules that need no device (the request's varlen, total_q, total_k; its N and
 * N_k the longest sequence's, N = 0 allowed), and an unpacked request's: none of them. */
static int check_varlen(const attn_lib_request *r) {
    const char *name = attn_this_stage.name;
    if (!r->varlen) {
        if (r->total_q || r->total_k)
            return fail(ATTN_EXIT_USAGE,
                        "%s: total_q and total_k are a packed batch's (varlen 1; got varlen 0, "
                        "total_q %d, total_k %d)",
                        name, r->total_q, r->total_k);
        return ATTN_EXIT_PASS;
    }
    if (r->pass == PASS_DEC)
        return fail(ATTN_EXIT_USAGE, "%s: a decode takes no packed batch (varlen)", name);
    if (r->total_q < 0 || r->total_q > ATTN_MAX_N || r->total_k < 0 || r->total_k > ATTN_MAX_N)
        return fail(ATTN_EXIT_USAGE,
                    "%s: a packed batch's total_q and total_k must be in [0, %d] (got %d, %d)",
                    name, ATTN_MAX_N, r->total_q, r->total_k);
    if (r->N < 0)
        return fail(ATTN_EXIT_USAGE,
                    "%s: a packed batch's N (the longest sequence's queries) must be >= 0 (got %d)",
                    name, r->N);
    return ATTN_EXIT_PASS;
}

/* The cache rules that need no device (attention.h's attn_cache_refused). */
static int check_cache(const attn_shape *s, const attn_cache *c) {
    const char *why = attn_cache_refused(s, c);
    return why ? fail(ATTN_EXIT_USAGE, "%s: %s", attn_this_stage.name, why) : ATTN_EXIT_PASS;
}

int attn_lib_plan(const attn_lib_request *r, void *plan, size_t plan_bytes,
                  size_t *workspace_bytes) {
    if (!r) return fail(ATTN_EXIT_USAGE, "%s: attn_lib_plan of no request", attn_this_stage.name);
    int pass = r->pass, device = r->device, variant = r->variant;
    long long smem_limit = r->smem_limit;
    attn_lib_plan_t p = {.stage = &attn_this_stage,
                         .pass = pass,
                         .device = device,
                         .variant = variant,
                         .shape = shape_of(r)};
    if (plan && plan_bytes < sizeof p)
        return fail(ATTN_EXIT_USAGE, "%s: a plan takes %zu bytes, got room for %zu",
                    attn_this_stage.name, sizeof p, plan_bytes);
    if (pass == PASS_DEC) {
        p.cache = cache_of(r, &p.shape);
        p.paged = r->paged != 0;
    }
    p.packed = r->varlen != 0;
    p.empty = attn_packed_empty(&p.shape);
    int rc = check_varlen(r);
    if (rc == ATTN_EXIT_PASS) rc = check_arguments(&p.shape, variant, pass);
    if (rc == ATTN_EXIT_PASS && pass == PASS_DEC) rc = check_cache(&p.shape, &p.cache);
    if (rc == ATTN_EXIT_PASS) rc = check_model_inputs(&p.shape, &p.cache, pass);
    if (rc == ATTN_EXIT_PASS) rc = device_props(device, smem_limit, &p.dev);
    if (rc != ATTN_EXIT_PASS) return rc;
    int prev = device;
    rc = enter_device(device, &prev);
    if (rc != ATTN_EXIT_PASS) return rc;
    /* a packed batch with nothing to compute, which the stage never sees, is refused where any
     * packed batch of its kind is: unsupported() asked of it with a token on each side */
    attn_shape asked = p.shape;
    if (p.empty) asked.N = asked.N_k = asked.varlen.total_q = asked.varlen.total_k = 1;
    const char *why = attn_this_stage.unsupported(&asked, &p.dev, variant);
    if (why) {
        rc = fail(ATTN_EXIT_UNSUPPORTED, "%s: %s", attn_this_stage.name, why);
    } else {
        p.workspace =
            p.empty            ? 0
            : pass == PASS_BWD ? attn_this_stage.backward_workspace_bytes(&p.shape, &p.dev, variant)
            : pass == PASS_DEC
                ? attn_this_stage.decode_workspace_bytes(&p.shape, &p.cache, &p.dev, variant)
                : attn_this_stage.workspace_bytes(&p.shape, &p.dev, variant);
        p.cache.seqlens = p.cache.block_table = NULL; /* the run's pointers, never the plan's */
        p.cache.K_new = p.cache.V_new = NULL;
        p.shape.varlen.cu_seqlens_q = p.shape.varlen.cu_seqlens_k = NULL;
        if (workspace_bytes) *workspace_bytes = p.workspace;
        if (plan) memcpy(plan, &p, sizeof p);
    }
    leave_device(prev, device);
    return rc;
}

/* What every run checks first: a plan of this library's pass. */
static int check_plan(int pass, const attn_lib_plan_t *p) {
    if (!p || p->stage != &attn_this_stage || p->pass != pass)
        return fail(ATTN_EXIT_USAGE, "%s: not a plan of this library's %s pass (attn_lib_plan)",
                    attn_this_stage.name, pass_name(pass));
    return ATTN_EXIT_PASS;
}

/* What every run checks before its launch: a plan of this library's pass, no NULL among the
 * pointers it needs (n of them) and the workspace it asked for. */
static int check_run(int pass, const attn_lib_plan_t *p, const void *const *ptrs, int n,
                     const char *names, const void *workspace, size_t workspace_bytes) {
    const char *name = attn_this_stage.name;
    int rc = check_plan(pass, p);
    if (rc != ATTN_EXIT_PASS) return rc;
    int null = p->workspace && !workspace;
    for (int i = 0; i < n; i++) null |= !ptrs[i];
    if (null)
        return fail(ATTN_EXIT_USAGE, "%s: a NULL pointer among %s%s", name, names,
                    p->workspace ? ", workspace" : "");
    if (workspace_bytes < p->workspace)
        return fail(ATTN_EXIT_USAGE, "%s: workspace of %zu bytes, the stage needs %zu", name,
                    workspace_bytes, p->workspace);
    return ATTN_EXIT_PASS;
}

/* After a launcher: its error, or the launch's (cleared), as a return code. */
static int launched(cudaError_t e, int pass) {
    if (e == cudaSuccess) e = cudaGetLastError();
    if (e == cudaSuccess) return ATTN_EXIT_PASS;
    (void)cudaGetLastError();
    return cuda_fail(e, pass_name(pass));
}

/* ---- a packed batch with nothing to compute: its outputs, without a stage ---- */

/* The driver's cuMemsetD32Async (32-bit words: lse's -inf, which no byte pattern makes), fetched
 * once through the runtime, as common/device/tensor_map.cuh fetches its encoder: no -lcuda. */
typedef CUresult (*memset_d32_fn)(CUdeviceptr, unsigned int, size_t, CUstream);
static memset_d32_fn memset_d32;
static pthread_once_t memset_d32_once = PTHREAD_ONCE_INIT;
#define MEMSET_D32_VERSION 12000 /* the driver API version asked for (the call dates from 3.2) */

static void find_memset_d32(void) {
    void *fn = NULL;
    enum cudaDriverEntryPointQueryResult found; /* (C: the enum keyword) */
#if CUDART_VERSION >= 12050
    if (cudaGetDriverEntryPointByVersion("cuMemsetD32Async", &fn, MEMSET_D32_VERSION,
                                         cudaEnableDefault, &found) == cudaSuccess &&
        found == cudaDriverEntryPointSuccess)
#else
    if (cudaGetDriverEntryPoint("cuMemsetD32Async", &fn, cudaEnableDefault, &found) ==
            cudaSuccess &&
        found == cudaDriverEntryPointSuccess)
#endif
        memset_d32 = (memset_d32_fn)fn;
    (void)cudaGetLastError();
}

#define NEG_INF_BITS 0xff800000u /* -inf, IEEE binary32 */

/* Zero every row of a tensor of `rows` rows (t: its first element), head by head in its layout. */
static cudaError_t zero_rows(void *t, const attn_layout *l, int heads, int rows, int D,
                             cudaStream_t stream) {
    const size_t esz = attn_this_stage.dtype == ATTN_F16 ? 2 : 4;
    cudaError_t e = cudaSuccess;
    for (int h = 0; rows > 0 && h < heads && e == cudaSuccess; h++)
        e = cudaMemset2DAsync((char *)t + (size_t)h * l->head * esz, (size_t)l->row * esz, 0,
                              (size_t)D * esz, (size_t)rows, stream);
    return e;
}

/* The run of a plan with nothing to compute (attn_packed_empty): no stage; the forward writes O =
 * 0 and lse = -inf on every query row, the backward dQ = dK = dV = 0 on every row; memsets on the
 * stream (a CUDA graph captures them). out: O, lse or dQ, dK, dV; those of a side without a
 * token may be NULL. */
static int fill_empty(int pass, const attn_lib_plan_t *p, void *const *out, cudaStream_t stream) {
    const attn_shape *s = &p->shape;
    const int tq = s->varlen.total_q, tk = s->varlen.total_k;
    const int null = pass == PASS_FWD ? tq > 0 && (!out[0] || !out[1])
                                      : (tq > 0 && !out[0]) || (tk > 0 && (!out[1] || !out[2]));
    if (null)
        return fail(ATTN_EXIT_USAGE, "%s: a NULL pointer among %s", attn_this_stage.name,
                    pass == PASS_FWD ? "O, lse" : "dQ, dK, dV");
    pthread_once(&memset_d32_once, find_memset_d32);
    if (pass == PASS_FWD && tq > 0 && !memset_d32)
        return fail(ATTN_EXIT_UNSUPPORTED,
                    "%s: the driver has no cuMemsetD32Async (the lse of a batch without keys)",
                    attn_this_stage.name);
    int prev = p->device;
    int rc = enter_device(p->device, &prev);
    if (rc != ATTN_EXIT_PASS) return rc;
    cudaError_t e;
    if (pass == PASS_FWD) {
        e = zero_rows(out[0], &s->o, s->H, tq, s->D, stream);
        if (e == cudaSuccess && tq > 0 &&
            memset_d32((CUdeviceptr)(uintptr_t)out[1], NEG_INF_BITS, (size_t)s->H * tq,
                       (CUstream)stream) != CUDA_SUCCESS)
            e = cudaErrorUnknown;
    } else {
        e = zero_rows(out[0], &s->dQ, s->H, tq, s->D, stream);
        if (e == cudaSuccess) e = zero_rows(out[1], &s->dK, s->H_kv, tk, s->D, stream);
        if (e == cudaSuccess) e = zero_rows(out[2], &s->dV, s->H_kv, tk, s->D, stream);
    }
    rc = launched(e, pass);
    leave_device(prev, p->device);
    return rc;
}

/* One pass of a plan on the caller's stream: the sequences' boundaries where the plan is of a
 * packed batch (and only there), the pointers and the workspace, then the launch. */
static int run(int pass, const void *plan, const void *const *in, int n_in, void *const *out,
               int n_out, const char *names, const int *cu_seqlens_q, const int *cu_seqlens_k,
               void *workspace, size_t workspace_bytes, cudaStream_t stream) {
    const attn_lib_plan_t *p = (const attn_lib_plan_t *)plan;
    const char *name = attn_this_stage.name;
    int rc = check_plan(pass, p);
    if (rc != ATTN_EXIT_PASS) return rc;
    if (p->packed && (!cu_seqlens_q || !cu_seqlens_k))
        return fail(ATTN_EXIT_USAGE,
                    "%s: the run of a packed plan needs cu_seqlens_q and cu_seqlens_k (the "
                    "sequences' boundaries, [B + 1] int32 on the device)",
                    name);
    if (!p->packed && (cu_seqlens_q || cu_seqlens_k))
        return fail(ATTN_EXIT_USAGE,
                    "%s: cu_seqlens given to the run of an unpacked plan (a packed batch is "
                    "planned with varlen 1)",
                    name);
    if (p->empty) return fill_empty(pass, p, out, stream);
    const void *ptrs[9];
    for (int i = 0; i < n_in; i++) ptrs[i] = in[i];
    for (int i = 0; i < n_out; i++) ptrs[n_in + i] = out[i];
    rc = check_run(pass, p, ptrs, n_in + n_out, names, workspace, workspace_bytes);
    if (rc != ATTN_EXIT_PASS) return rc;
    attn_shape packed; /* the plan's shape with the run's sequences */
    const attn_shape *s = &p->shape;
    if (p->packed) {
        packed = p->shape;
        packed.varlen.cu_seqlens_q = cu_seqlens_q, packed.varlen.cu_seqlens_k = cu_seqlens_k;
        s = &packed;
    }
    int prev = p->device;
    rc = enter_device(p->device, &prev);
    if (rc != ATTN_EXIT_PASS) return rc;
    cudaError_t e =
        pass == PASS_BWD
            ? attn_this_stage.backward(s, &p->dev, in[0], in[1], in[2], in[3], (const float *)in[4],
                                       in[5], out[0], out[1], out[2], workspace, p->variant, stream)
            : attn_this_stage.forward(s, &p->dev, in[0], in[1], in[2], out[0], (float *)out[1],
                                      workspace, p->variant, stream);
    rc = launched(e, pass);
    leave_device(prev, p->device);
    return rc;
}

int attn_lib_forward(const void *plan, const void *Q, const void *K, const void *V, void *O,
                     float *lse, const int *cu_seqlens_q, const int *cu_seqlens_k, void *workspace,
                     size_t workspace_bytes, void *stream) {
    const void *in[] = {Q, K, V};
    void *out[] = {O, lse};
    return run(PASS_FWD, plan, in, 3, out, 2, "Q, K, V, O, lse", cu_seqlens_q, cu_seqlens_k,
               workspace, workspace_bytes, (cudaStream_t)stream);
}

int attn_lib_backward(const void *plan, const void *Q, const void *K, const void *V, const void *O,
                      const float *lse, const void *dO, void *dQ, void *dK, void *dV,
                      const int *cu_seqlens_q, const int *cu_seqlens_k, void *workspace,
                      size_t workspace_bytes, void *stream) {
    const void *in[] = {Q, K, V, O, lse, dO};
    void *out[] = {dQ, dK, dV};
    return run(PASS_BWD, plan, in, 6, out, 3, "Q, K, V, O, lse, dO, dQ, dK, dV", cu_seqlens_q,
               cu_seqlens_k, workspace, workspace_bytes, (cudaStream_t)stream);
}

int attn_lib_decode(const void *plan, const void *Q, void *K_cache, void *V_cache,
                    const int *seqlens, const int *block_table, const void *K_new,
                    const void *V_new, void *O, float *lse, void *workspace, size_t workspace_bytes,
                    void *stream) {
    const attn_lib_plan_t *p = (const attn_lib_plan_t *)plan;
    const void *ptrs[] = {Q, K_cache, V_cache, seqlens, O, lse, block_table, K_new, V_new};
    const int paged = p && p->pass == PASS_DEC && p->paged,
              news = p && p->pass == PASS_DEC && p->cache.N_new > 0;
    /* the block table where the plan is of a paged cache, the new keys where it has them */
    const char *names = paged && news
                            ? "Q, K_cache, V_cache, seqlens, O, lse, block_table, K_new, V_new"
                        : paged ? "Q, K_cache, V_cache, seqlens, O, lse, block_table"
                        : news  ? "Q, K_cache, V_cache, seqlens, O, lse, K_new, V_new"
                                : "Q, K_cache, V_cache, seqlens, O, lse";
    const void *need[9];
    int n = 0;
    for (int i = 0; i < 9; i++)
        if (i < 6 || (i == 6 && paged) || (i > 6 && news)) need[n++] = ptrs[i];
    int rc = check_run(PASS_DEC, p, need, n, names, workspace, workspace_bytes);
    if (rc != ATTN_EXIT_PASS) return rc;
    if (!paged && block_table)
        return fail(ATTN_EXIT_USAGE, "%s: a block table for a plan of a contiguous cache",
                    attn_this_stage.name);
    attn_cache c = p->cache;
    c.seqlens = seqlens;
    c.block_table = paged ? block_table : NULL;
    c.K_new = news ? K_new : NULL;
    c.V_new = news ? V_new : NULL;
    int prev = p->device;
    rc = enter_device(p->device, &prev);
    if (rc != ATTN_EXIT_PASS) return rc;
    rc = launched(attn_this_stage.decode(&p->shape, &c, &p->dev, Q, K_cache, V_cache, O, lse,
                                         workspace, p->variant, (cudaStream_t)stream),
                  PASS_DEC);
    leave_device(prev, p->device);
    return rc;
}
