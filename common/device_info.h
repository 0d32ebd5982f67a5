/*
 * device_info.h: the one home of the device facts and the shape rules that the program
 * (common/main.c) and the library (common/attn_lib.c) both need, host C11:
 *   the driver probe (is there a GPU to run on, and if not, why, in the learner's words),
 *   the device properties a stage sees (attn_device, lowered by --smem-limit), and
 *   the shapes every stage accepts before it is asked (attention.h's limits).
 */
#ifndef DEVICE_INFO_H
#define DEVICE_INFO_H

#include <stddef.h>

#include "attention.h"

/* 0 when the driver finds a device (*count of them); else -1 and a one-line reason in why[len]
 * ("no NVIDIA GPU here (...)", or the driver's words with its and the build's CUDA versions).
 * `what` names the caller in that line: "program" or "library". Without the driver library the
 * runtime says "CUDA driver version is insufficient", which sends a learner to upgrade a driver
 * they do not have: this says what is missing instead. */
int attn_gpu_probe(const char *what, int *count, char *why, size_t len);

/* The facts a stage sees of device `ordinal` (smem_per_block lowered to smem_limit when that is
 * > 0 and smaller), its name with commas made spaces (a CSV field) into name[name_len] (may be
 * NULL), and its L2 size in bytes (may be NULL). */
cudaError_t attn_device_query(int ordinal, long long smem_limit, attn_device *dev, char *name,
                              size_t name_len, size_t *l2_bytes);

/* smem_per_block lowered to smem_limit (--smem-limit; <= 0: no limit). */
void attn_device_limit_smem(attn_device *dev, long long smem_limit);

/* The shape rules every stage is tested within (attention.h), in checking order. */
typedef enum {
    ATTN_SHAPE_OK = 0,
    ATTN_SHAPE_NOT_POSITIVE, /* B, H, N or D below 1 */
    ATTN_SHAPE_BH,           /* B x H over ATTN_MAX_BH */
    ATTN_SHAPE_N,            /* N over ATTN_MAX_N */
    ATTN_SHAPE_D,            /* D not a head dim of the contract (attn_head_dim_ok) */
    ATTN_SHAPE_KV_HEADS,     /* H_kv negative or not dividing H (0: H) */
    ATTN_SHAPE_N_K,          /* N_k negative or over ATTN_MAX_N (0: N) */
    ATTN_SHAPE_SCALE         /* scale not a positive normal float */
} attn_shape_rule;

/* The first rule the shape breaks (ATTN_SHAPE_OK: none). */
attn_shape_rule attn_shape_check(const attn_shape *s);

/* Whether head dim D is the contract's (attention.h): a multiple of ATTN_D_STEP from ATTN_MIN_D to
 * ATTN_MAX_D; ATTN_HEAD_DIMS says so in words. A stage runs those it compiled and refuses the rest
 * through its unsupported() (exit code 3), as it refuses any shape it cannot run. */
static inline int attn_head_dim_ok(long long D) {
    return D >= ATTN_MIN_D && D <= ATTN_MAX_D && D % ATTN_D_STEP == 0;
}
#define ATTN_STR_(x) #x
#define ATTN_STR(x) ATTN_STR_(x)
#define ATTN_HEAD_DIMS \
    "a multiple of " ATTN_STR(ATTN_D_STEP) " from " ATTN_STR(ATTN_MIN_D) " to " ATTN_STR(ATTN_MAX_D)

#endif /* DEVICE_INFO_H */
