/*
 * common/device/linked_forward.cuh: a backward stage's forward pass, its forward stage's (stage 7:
 * stage 5's; stage 8: stage 6's). The build compiles the forward stage's attention.cu a second
 * time with its descriptor renamed attn_forward_stage (the Makefile, from the backward stage's
 * stage.mk: <stage>_FORWARD) and links it beside the backward stage's: the one place where a stage
 * reaches another's code. Its forward runs in its default variant, whatever the backward stage's
 * variant. Host code, for one translation unit (a backward stage's attention.cu includes it).
 */
#pragma once

#include "attention.h"

extern "C" const attn_stage attn_forward_stage;

// The forward stage's variant every forward pass of a backward stage runs: its default.
inline constexpr int LINKED_FORWARD_VARIANT = 0;

// The descriptor's workspace_bytes and forward: the forward stage's, in its default variant.
static size_t linked_forward_workspace_bytes(const attn_shape *s, const attn_device *dev,
                                             int variant) {
    (void)variant;
    return attn_forward_stage.workspace_bytes(s, dev, LINKED_FORWARD_VARIANT);
}

static cudaError_t linked_forward(const attn_shape *s, const attn_device *dev, const void *Q,
                                  const void *K, const void *V, void *O, float *lse,
                                  void *workspace, int variant, cudaStream_t stream) {
    (void)variant;
    return attn_forward_stage.forward(s, dev, Q, K, V, O, lse, workspace, LINKED_FORWARD_VARIANT,
                                      stream);
}
