"""The PyTorch custom operators behind flashcourse.attention (imported on its first call).

    flashcourse::forward   (q, k, v, ...) -> (o, lse)        any stage's forward pass
    flashcourse::backward  (q, k, v, o, lse, do, ...) -> (dq, dk, dv)   a backward stage's

Both are torch.library.custom_op operators: their bodies run the stage library (_binding.py) on
the current stream with workspace from PyTorch's allocator, their fake implementations give
torch.compile the output shapes, and register_autograd makes forward's derivative the backward
operator, so a compiled training step keeps both in one graph. The backward operator has no
derivative of its own: double backward raises.
"""

from typing import Optional, Tuple

import torch

from . import _binding

if not hasattr(torch, "library") or not hasattr(torch.library, "custom_op"):
    raise ImportError(f"flashcourse.attention needs torch >= 2.4 (torch.library.custom_op); "
                      f"this is torch {torch.__version__}")

Tensor = torch.Tensor


@torch.library.custom_op("flashcourse::forward", mutates_args=())
def forward(q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float, stage: str,
            variant: str, smem_limit: int, backward_stage: str,
            backward_variant: str) -> Tuple[Tensor, Tensor]:
    return _binding._run_forward(q, k, v, causal, scale, stage, variant, smem_limit)


@forward.register_fake
def _forward_fake(q, k, v, causal, scale, stage, variant, smem_limit, backward_stage,
                  backward_variant):
    # the library's checks while torch.compile traces: an unsupported shape fails at compile time
    _binding._plan(stage, False, q.shape, q.device.index, q.dtype, causal, scale, variant,
                   smem_limit)
    B, H, N, _ = q.shape
    return torch.empty_like(q), q.new_empty((B, H, N), dtype=torch.float32)


@torch.library.custom_op("flashcourse::backward", mutates_args=())
def backward(q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, do: Tensor,
             dlse: Optional[Tensor], causal: bool, scale: float, stage: str, variant: str,
             smem_limit: int) -> Tuple[Tensor, Tensor, Tensor]:
    if dlse is not None and bool((dlse != 0).any()):
        raise RuntimeError(
            "flashcourse.attention: a gradient flows into the lse output, and the backward "
            f"pass ({stage}) differentiates o only: use lse.detach() where it enters the loss")
    if do.data_ptr() % _binding._ALIGN:  # a gradient can be a view into a larger buffer
        do = do.clone()
    return _binding._run_backward(q, k, v, o, lse, do, causal, scale, stage, variant,
                                  smem_limit)


@backward.register_fake
def _backward_fake(q, k, v, o, lse, do, dlse, causal, scale, stage, variant, smem_limit):
    _binding._plan(stage, True, q.shape, q.device.index, q.dtype, causal, scale, variant,
                   smem_limit)
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _forward_setup(ctx, inputs, output):
    q, k, v, causal, scale, stage, variant, smem_limit, bstage, bvariant = inputs
    o, lse = output
    # the backward stage takes this shape and dtype (in eager mode attention() checked already)
    _binding._plan(bstage, True, q.shape, q.device.index, q.dtype, causal, scale, bvariant,
                   smem_limit, who=stage)
    ctx.save_for_backward(q, k, v, o, lse)
    ctx.args = (causal, scale, bstage, bvariant, smem_limit)
    # an lse nobody differentiates arrives as None, not as zeros: a gradient into it is seen
    ctx.set_materialize_grads(False)


def _forward_backward(ctx, do, dlse):
    q, k, v, o, lse = ctx.saved_tensors
    if do is None and dlse is None:
        return (None,) * 10
    if do is None:
        do = torch.zeros_like(o)
    causal, scale, bstage, bvariant, smem_limit = ctx.args
    dq, dk, dv = backward(q, k, v, o, lse, do.contiguous(), dlse, causal, scale, bstage,
                          bvariant, smem_limit)
    return (dq, dk, dv) + (None,) * 7


forward.register_autograd(_forward_backward, setup_context=_forward_setup)


def _backward_setup(ctx, inputs, output):
    ctx.stage = inputs[9]


def _backward_backward(ctx, *grads):
    raise RuntimeError(f"flashcourse.attention: double backward (a gradient of the gradients) "
                       f"is not supported: the backward pass ({ctx.stage}) has no derivative")


backward.register_autograd(_backward_backward, setup_context=_backward_setup)
