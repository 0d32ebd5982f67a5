"""The PyTorch side of flashcourse.attention's gradients (imported on the first call that
needs them, and by torch.compile's path).

Eagerly, a call that needs gradients runs AttentionFunction where the eager operator is not
loaded (_run.make_call): a torch.autograd.Function over the plans _plans.py keeps, its forward
and backward one ctypes call each, so a training step pays for the launches and little more.

Under torch.compile, the same passes are custom operators, which the compiled graph keeps whole:

    flashcourse::forward   (q, k, v, ...) -> (o, lse)        any stage's forward pass
    flashcourse::backward  (q, k, v, o, lse, do, ...) -> (dq, dk, dv)   a backward stage's
    flashcourse::varlen_forward, flashcourse::varlen_backward   the same of a packed batch
                           (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k after v)

Their bodies run the stage library (_run.run_forward, _run.run_backward) on the current stream
with outputs and workspace from PyTorch's allocator, their fake implementations give
torch.compile the output shapes (and make the library's checks while it traces), and
register_autograd makes forward's derivative the backward operator. A stage given as "auto"
reaches them as it is (torch.compile traces no library call) and _plans.resolve turns it into a
name where they plan; the backward operator the graph records is given the resolved name (stage 8
on Hopper where it takes the call, else stage 7). Nothing here waits for the GPU, so CUDA graphs
(torch.compile's mode="reduce-overhead") capture both. lse is a constant in both paths (no
gradient flows into it), and the backward pass has no derivative of its own: double backward
raises.

Imports: _plans and _run at import time; nothing imports this module at its own import time (the
package's order: _library, _plans, _run, _ops, api, dropins).
"""

from typing import Tuple

import torch

from . import _plans, _run
from ._library import TAKES_STRIDES, stage_library

if not hasattr(torch, "library") or not hasattr(torch.library, "custom_op"):
    raise ImportError(f"flashcourse.attention needs torch >= 2.4 (torch.library.custom_op); "
                      f"this is torch {torch.__version__}")

Tensor = torch.Tensor


def _no_double_backward(stage: str):
    raise RuntimeError(f"flashcourse.attention: double backward (a gradient of the gradients) "
                       f"is not supported: the backward pass ({stage}) has no derivative")


# ---- eager ----

class AttentionFunction(torch.autograd.Function):
    """attention() with gradients, eagerly: forward by plan fp, backward by plan bp (both made and
    checked by api._attention_checked for these shapes, dtypes and devices); a packed batch's
    (flash_attn_varlen_func) with its cu_seqlens_q, cu_seqlens_k (else None)."""

    @staticmethod
    def forward(ctx, q, k, v, fp, bp, cu_q, cu_k):
        cu = None if cu_q is None else (cu_q, cu_k)
        o, lse = _run.forward_with(fp, q, k, v, cu)
        ctx.save_for_backward(q, k, v, o, lse, cu_q, cu_k)
        ctx.bp = bp
        ctx.mark_non_differentiable(lse)
        ctx.set_materialize_grads(False)  # no zeros made for lse's (absent) gradient
        return o, lse

    @staticmethod
    def backward(ctx, do, _dlse):
        if do is None:
            return (None,) * 7
        q, k, v, o, lse, cu_q, cu_k = ctx.saved_tensors
        bp, do = _plans.grad_plan(ctx.bp, o, do)  # do as it came, where the stage takes that
        cu = None if cu_q is None else (cu_q, cu_k)
        dq, dk, dv = _run.backward_with(bp, q, k, v, o, lse, do, cu)
        if torch.is_grad_enabled():  # create_graph=True: a derivative of these would be wrong
            dq, dk, dv = _NoDerivative.apply(ctx.bp.stage, q, k, v, dq, dk, dv)
        return dq, dk, dv, None, None, None, None


class _NoDerivative(torch.autograd.Function):
    """dq, dk, dv as they are, tied to q, k, v by a derivative that raises (double backward)."""

    @staticmethod
    def forward(ctx, stage, q, k, v, dq, dk, dv):
        ctx.stage = stage
        return dq, dk, dv

    @staticmethod
    def backward(ctx, *grads):
        _no_double_backward(ctx.stage)


# ---- torch.compile ----

def _resolve_backward(stage: str, q, k, variant: str, smem_limit: int,
                      local: tuple = _plans.NO_LOCAL, seqs=None) -> str:
    """A backward stage name as given, or what "auto" is for q and k (_plans.resolve); seqs: a
    packed batch's (B, max_seqlen_q, max_seqlen_k)."""
    return _plans.resolve(stage, True, _plans.device_of(q), _plans.asks(q, k, local, seqs),
                          variant, smem_limit, int(q.shape[-1]))


# window_left, window_right, softcap: a call's local window and softcap (_plans.local_checked)
@torch.library.custom_op("flashcourse::forward", mutates_args=())
def forward(q: Tensor, k: Tensor, v: Tensor, causal: bool, window_left: int, window_right: int,
            softcap: float, scale: float, stage: str, variant: str, smem_limit: int,
            backward_stage: str, backward_variant: str) -> Tuple[Tensor, Tensor]:
    return _run.run_forward(q, k, v, causal, scale, stage, variant, smem_limit,
                            (window_left, window_right, softcap))


@forward.register_fake
def _forward_fake(q, k, v, causal, window_left, window_right, softcap, scale, stage, variant,
                  smem_limit, backward_stage, backward_variant):
    # the library's checks while torch.compile traces: an unsupported shape fails at compile time
    _plans.plan(stage, False, _plans.forward_geometry(q, k), q.device.index, q.dtype, causal,
                scale, variant, smem_limit, local=(window_left, window_right, softcap))
    B, H, N, _ = q.shape
    return torch.empty_like(q), q.new_empty((B, H, N), dtype=torch.float32)


@torch.library.custom_op("flashcourse::backward", mutates_args=())
def backward(q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, do: Tensor, causal: bool,
             window_left: int, window_right: int, softcap: float, scale: float, stage: str,
             variant: str, smem_limit: int) -> Tuple[Tensor, Tensor, Tensor]:
    local = (window_left, window_right, softcap)
    stage = _resolve_backward(stage, q, k, variant, smem_limit, local)  # "auto": stage 8 or 7
    return _run.run_backward(q, k, v, o, lse, _plans.grad_input(stage, o, do), causal, scale,
                             stage, variant, smem_limit, local)


@backward.register_fake
def _backward_fake(q, k, v, o, lse, do, causal, window_left, window_right, softcap, scale, stage,
                   variant, smem_limit):
    local = (window_left, window_right, softcap)
    stage = _resolve_backward(stage, q, k, variant, smem_limit, local)  # as the body does
    # do as the body lays it out (_plans.grad_input: its own layout, or o's)
    own = stage_library(stage).stage.backward_takes & TAKES_STRIDES and do.stride(3) == 1
    _plans.plan(stage, True, _plans.backward_geometry(q, k, v, o, do if own else o),
                q.device.index, q.dtype, causal, scale, variant, smem_limit, local=local)
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _forward_setup(ctx, inputs, output):
    q, k, v, causal, wl, wr, cap, scale, stage, variant, smem_limit, bstage, bvariant = inputs
    local = (wl, wr, cap)
    o, lse = output
    # "auto" resolved once here, so the backward operator in the graph is given the stage's name
    device = _plans.device_of(q)
    # (for the messages: the forward operator resolves its own)
    stage = _plans.resolve(stage, False, device, _plans.asks(q, k, local), "default", smem_limit,
                           int(q.shape[-1]))
    bstage = _resolve_backward(bstage, q, k, bvariant, smem_limit, local)
    # the backward stage takes this shape and dtype (in eager mode attention() checked already)
    _plans.plan(bstage, True, _plans.backward_geometry(q, k, v), device, q.dtype, causal, scale,
                bvariant, smem_limit, who=stage, local=local)
    ctx.save_for_backward(q, k, v, o, lse)
    ctx.args = (causal, wl, wr, cap, scale, bstage, bvariant, smem_limit)
    ctx.mark_non_differentiable(lse)
    ctx.set_materialize_grads(False)


def _forward_backward(ctx, do, _dlse):
    if do is None:
        return (None,) * 13
    q, k, v, o, lse = ctx.saved_tensors
    dq, dk, dv = backward(q, k, v, o, lse, do, *ctx.args)
    return (dq, dk, dv) + (None,) * 10


forward.register_autograd(_forward_backward, setup_context=_forward_setup)


def _backward_setup(ctx, inputs, output):
    q, k, stage, variant, smem_limit = inputs[0], inputs[1], inputs[11], inputs[12], inputs[13]
    ctx.stage = _resolve_backward(stage, q, k, variant, smem_limit, tuple(inputs[7:10]))


def _backward_backward(ctx, *grads):
    _no_double_backward(ctx.stage)


backward.register_autograd(_backward_backward, setup_context=_backward_setup)


# ---- torch.compile: packed batches (flash_attn_varlen_func) ----

def _seqs(cu_q, max_q: int, max_k: int) -> tuple:
    return (int(cu_q.shape[0]) - 1, max_q, max_k)


@torch.library.custom_op("flashcourse::varlen_forward", mutates_args=())
def varlen_forward(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
                   max_seqlen_q: int, max_seqlen_k: int, causal: bool, window_left: int,
                   window_right: int, softcap: float, scale: float, stage: str, variant: str,
                   smem_limit: int, backward_stage: str,
                   backward_variant: str) -> Tuple[Tensor, Tensor]:
    return _run.run_forward(q, k, v, causal, scale, stage, variant, smem_limit,
                            (window_left, window_right, softcap),
                            (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k))


@varlen_forward.register_fake
def _varlen_forward_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
                         window_left, window_right, softcap, scale, stage, variant, smem_limit,
                         backward_stage, backward_variant):
    seqs = _seqs(cu_seqlens_q, max_seqlen_q, max_seqlen_k)
    _plans.plan(stage, False, _plans.forward_geometry(q, k, seqs), q.device.index, q.dtype,
                causal, scale, variant, smem_limit, local=(window_left, window_right, softcap),
                varlen=(int(q.shape[0]), int(k.shape[0])))
    return torch.empty_like(q), q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)


@torch.library.custom_op("flashcourse::varlen_backward", mutates_args=())
def varlen_backward(q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, do: Tensor,
                    cu_seqlens_q: Tensor, cu_seqlens_k: Tensor, max_seqlen_q: int,
                    max_seqlen_k: int, causal: bool, window_left: int, window_right: int,
                    softcap: float, scale: float, stage: str, variant: str,
                    smem_limit: int) -> Tuple[Tensor, Tensor, Tensor]:
    local = (window_left, window_right, softcap)
    seqs = _seqs(cu_seqlens_q, max_seqlen_q, max_seqlen_k)
    stage = _resolve_backward(stage, q, k, variant, smem_limit, local, seqs)
    return _run.run_backward(q, k, v, o, lse, _plans.grad_input(stage, o, do), causal, scale,
                             stage, variant, smem_limit, local,
                             (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k))


@varlen_backward.register_fake
def _varlen_backward_fake(q, k, v, o, lse, do, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                          max_seqlen_k, causal, window_left, window_right, softcap, scale, stage,
                          variant, smem_limit):
    local = (window_left, window_right, softcap)
    seqs = _seqs(cu_seqlens_q, max_seqlen_q, max_seqlen_k)
    stage = _resolve_backward(stage, q, k, variant, smem_limit, local, seqs)
    own = stage_library(stage).stage.backward_takes & TAKES_STRIDES and do.stride(-1) == 1
    _plans.plan(stage, True, _plans.backward_geometry(q, k, v, o, do if own else o, seqs),
                q.device.index, q.dtype, causal, scale, variant, smem_limit, local=local,
                varlen=(int(q.shape[0]), int(k.shape[0])))
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _varlen_forward_setup(ctx, inputs, output):
    q, k, v, cu_q, cu_k, max_q, max_k, causal, wl, wr, cap, scale, stage, variant, smem_limit, \
        bstage, bvariant = inputs
    local, seqs = (wl, wr, cap), _seqs(cu_q, max_q, max_k)
    o, lse = output
    bstage = _resolve_backward(bstage, q, k, bvariant, smem_limit, local, seqs)
    # the backward stage takes this packed batch (eagerly flash_attn_varlen_func checked already)
    _plans.plan(bstage, True, _plans.backward_geometry(q, k, v, seqs=seqs), _plans.device_of(q),
                q.dtype, causal, scale, bvariant, smem_limit, local=local,
                varlen=(int(q.shape[0]), int(k.shape[0])))
    ctx.save_for_backward(q, k, v, o, lse, cu_q, cu_k)
    ctx.args = (max_q, max_k, causal, wl, wr, cap, scale, bstage, bvariant, smem_limit)
    ctx.mark_non_differentiable(lse)
    ctx.set_materialize_grads(False)


def _varlen_forward_backward(ctx, do, _dlse):
    if do is None:
        return (None,) * 17
    q, k, v, o, lse, cu_q, cu_k = ctx.saved_tensors
    dq, dk, dv = varlen_backward(q, k, v, o, lse, do, cu_q, cu_k, *ctx.args)
    return (dq, dk, dv) + (None,) * 14


varlen_forward.register_autograd(_varlen_forward_backward, setup_context=_varlen_forward_setup)


def _varlen_backward_setup(ctx, inputs, output):
    q, k, cu_q, max_q, max_k = inputs[0], inputs[1], inputs[6], inputs[8], inputs[9]
    ctx.stage = _resolve_backward(inputs[15], q, k, inputs[16], inputs[17],
                                  tuple(inputs[11:14]), _seqs(cu_q, max_q, max_k))


varlen_backward.register_autograd(_backward_backward, setup_context=_varlen_backward_setup)
