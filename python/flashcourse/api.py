"""The public calls on tensors: attention(), attention_backward() and the auto rules' answers.

attention() looks its call up first (one dict lookup: _run.calls), and only a call it has not
seen, one under torch.compile, or one that fails a check runs _attention_checked, which checks
everything, plans, and keeps what the call runs. What the kernels do not launch is answered here
as torch answers it: an empty problem (B, H or N_q zero, or no keys) returns empty outputs (o = 0
where rows have no key), differentiable; B x H over the grid's limit runs in parts along the
batch (and the heads, by whole key/value-head groups, where one batch alone is over).
"""

from typing import TYPE_CHECKING, Optional, Tuple

from . import _library, _run
from ._library import (BACKWARD_STAGE, FORWARD_STAGE, HOPPER_BACKWARD_STAGE, _torch,
                       stage_library)
from ._plans import (NO_LOCAL, asks, backward_geometry, causal_checked, check_aligned,
                     check_tensors, device_index, device_of, forward_geometry, plan, resolve,
                     scale_checked, smem_limit_checked, takes_strides)

if TYPE_CHECKING:
    from torch import Tensor

_OWN_ERRORS = (TypeError, ValueError, NotImplementedError)


def attention(q, k, v, *, causal: bool = False, scale: Optional[float] = None,
              stage: str = "auto", variant: str = "default", smem_limit: Optional[int] = None,
              backward_stage: str = "auto",
              backward_variant: str = "default") -> Tuple["Tensor", "Tensor"]:
    """softmax(scale * q k^T) v through one of the course's stages; differentiable.

    q: a torch CUDA tensor [B, H, N, D]; k, v [B, H_kv, N_k, D], on q's device, in the stage's
    storage dtype (stages()[i].dtype: float32 for stages 0-1, float16 after; bfloat16 too where
    the stage takes it). Stages 0-4 take H_kv = H, N_k = N and contiguous tensors (others are
    copied for them); stages 5 and 6 and the backward passes of stages 7 and 8 (the stages whose
    Stage.takes say so) also grouped-query heads (H_kv dividing H: query head h reads key/value
    head h // (H // H_kv)), N_k != N, bf16, and any strides with a contiguous last dimension
    ([B, N, H, D] views, a fused projection's slices: read in place, no copy). causal: query i
    attends to keys 0 .. i + N_k - N (aligned to the bottom right, as flash-attn 2.1 and later;
    a row that attends to no key gets o = 0 and lse = -inf; scaled_dot_product_attention aligns
    to the top left, as SDPA). D: a multiple of 8 from 32 to 256 (flash-attn's head dims), read
    as it is (no padded copy); a stage runs the head dims it compiled (stages 5-8: every one,
    stages 0-4: 64 and 128) and refuses another with ValueError giving its reason; "auto" picks,
    of stages 6 and 5 (8 and 7), one that runs D; a D outside the range raises ValueError
    (usage). scale: default 1/sqrt(D). stage: a stage name, or "auto" (the
    default): stage 6 (the Hopper forward) where it runs and takes the inputs, else stage 5
    (flashcourse.auto_stage() says which). Runs on torch.cuda.current_stream(); o, lse and the
    workspace are allocated through PyTorch's caching allocator; nothing waits for the GPU, so
    CUDA graphs capture it. smem_limit: lower the shared memory per block the stage may use, as
    the program's --smem-limit (65536: a T4's path, 101376: an L4's).

    Returns (o, lse): o like q (torch.empty_like(q)'s layout), lse [B, H, N] float32 (natural
    log of each row's softmax sum, including its max). Where q, k or v require grad (and grad
    mode is on), o is differentiable with respect to them: the forward pass by `stage`, the
    backward pass by `backward_stage` with `backward_variant` ("deterministic": bit-identical
    gradients from run to run, stage 7's and stage 8's); backward_stage: a stage name, or "auto" (the
    default): stage 8 (the Hopper backward) where it runs and takes the inputs, else stage 7 (a
    variant stage 8 lacks, an smem_limit it does not fit: stage 7; auto_backward_stage() says
    which). Under torch.compile both passes are custom operators in its graph. lse is returned
    as a constant (it does not require grad: a loss through it contributes no gradient, as
    flash-attn's); double backward raises RuntimeError. B, H or N zero, or N_k zero: empty
    outputs (o zero), as torch returns them; B x H over the kernels' grid limit (eagerly): the
    call in parts, concatenated.

    The first call of a combination of stage, variant, shapes, strides, dtypes, devices, causal
    and scale checks everything and keeps the plan; later calls cost a dict lookup and the
    launches.

    Bad input raises TypeError (wrong type, device or dtype, or requires_grad on a float32
    stage) or ValueError (shape, layout, variant, or a shape the stage does not support, with
    the stage's reason), naming the stage given (or flashcourse.attention for "auto"); a CUDA
    error raises RuntimeError naming the call.
    """
    torch = _library.torch_mod
    if torch is not None and not torch.compiler.is_compiling():
        try:
            grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or
                                                v.requires_grad)
            call = _run.calls.get(_run.call_key(q, k, v, causal, scale, stage, variant,
                                                smem_limit, backward_stage, backward_variant,
                                                grad, NO_LOCAL))
        except (AttributeError, TypeError):  # not tensors, an unhashable argument: checked below
            call = None
        if call is not None and _run.ready(q, k, v):
            return call(q, k, v)
    return _attention_checked(q, k, v, causal, scale, stage, variant, smem_limit,
                              backward_stage, backward_variant)


def attention_as(who: str, q, k, v, causal, scale, stage, variant, smem_limit, backward_stage,
                 backward_variant, local: tuple = NO_LOCAL, bnhd_key=None):
    """attention() for a drop-in: the same cache first, and every error named by `who` (the
    function the user called). local: (window_left, window_right, softcap), a checked local
    window and softcap (_plans.local_checked; flash_attn_func's). bnhd_key: flash_attn_func's,
    which looked its call up already (q, k, v: [B, H, N, D] views of its [B, N, H, D] tensors):
    the call is kept as one on those tensors (_run.make_call's bnhd), under bnhd_key(grad)."""
    torch = _library.torch_mod
    if bnhd_key is None and torch is not None and not torch.compiler.is_compiling():
        try:
            grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or
                                                v.requires_grad)
            call = _run.calls.get(_run.call_key(q, k, v, causal, scale, stage, variant,
                                                smem_limit, backward_stage, backward_variant,
                                                grad, local))
        except (AttributeError, TypeError):
            call = None
        if call is not None and _run.ready(q, k, v):
            return call(q, k, v)
    return _attention_checked(q, k, v, causal, scale, stage, variant, smem_limit,
                              backward_stage, backward_variant, who, local, bnhd_key)


def given_key(who: str, q, k, v, causal, scale, window_size, softcap, *rest) -> tuple:
    """A flash-attn drop-in's call's key (_run.call_key): its arguments as given (rest: the
    others, grad last), with the types of those whose checks see more than their value (True ==
    1 and 4.0 == 4 as keys, not as arguments), window_size's sides spread (a list's too)."""
    left, right = window_size  # (anything else: no key, and the checks say why)
    return _run.call_key(q, k, v, who, type(window_size), causal, scale, left, right, softcap,
                         type(causal), type(scale), type(left), type(right), type(softcap), *rest)


def named_by(who: str, e: Exception) -> Exception:
    """e with its message led by `who` where it does not name it already (one of the package's
    own error types; others as they are)."""
    if type(e) in _OWN_ERRORS and not str(e).startswith(who):
        return type(e)(f"{who}: {e}")
    return e


def _compiling() -> bool:
    """Whether torch.compile is tracing this call (False where PyTorch is absent)."""
    try:
        torch = _torch()
    except ImportError:
        return False
    return torch.compiler.is_compiling()


def _attention_checked(q, k, v, causal, scale, stage, variant, smem_limit, backward_stage,
                       backward_variant, who: Optional[str] = None, local: tuple = NO_LOCAL,
                       bnhd_key=None):
    """attention() with every check made: the first call of a combination, every call under
    torch.compile (which traces the checks), and every call that fails one. who: the function
    the user called, where not attention(); attention()'s own errors for stage "auto" name
    flashcourse.attention (a stage's reason, such as a head dim it did not compile, included)."""
    try:
        return _checked(q, k, v, causal, scale, stage, variant, smem_limit, backward_stage,
                        backward_variant, who, local, bnhd_key)
    except _OWN_ERRORS as e:
        if who is None and stage != "auto":
            raise
        renamed = named_by(who or "flashcourse.attention", e)
        if renamed is e:
            raise
        raise renamed from None


def _checked(q, k, v, causal, scale, stage, variant, smem_limit, backward_stage,
             backward_variant, who, local=NO_LOCAL, bnhd_key=None):
    given = (causal, scale, stage, variant, smem_limit)  # the cache's key: as the caller gave them
    given_backward = backward_stage  # ("auto" stays "auto" in the key, as attention() looks it up)
    name = who or (stage if isinstance(stage, str) and stage != "auto" else
                   "flashcourse.attention")
    if not isinstance(stage, str):
        raise TypeError(f"{name}: stage must be a stage name such as '{FORWARD_STAGE}', not "
                        f"{type(stage).__name__}")
    eager = not _compiling()  # then the library's checks now, with clear errors
    if eager and stage != "auto":
        stage_library(stage, who)  # an unknown stage or a missing library first
    torch = _torch()
    check_tensors(name, (("q", q), ("k", k), ("v", v)))
    dev = device_of(q)
    asked = asks(q, k, local)
    sl = smem_limit_checked(smem_limit, name)
    if eager:  # (under torch.compile the operators resolve "auto": _plans.plan)
        stage = resolve(stage, False, dev, asked, "default", sl, int(q.shape[-1]))
    causal = causal_checked(causal, name)
    scale = scale_checked(scale, int(q.shape[-1]), name)
    if not isinstance(variant, str):
        raise ValueError(f"{name}: variant must be a name such as 'default', not {variant!r}")
    grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    if grad and not (isinstance(backward_stage, str) and isinstance(backward_variant, str)):
        raise TypeError(f"{name}: backward_stage and backward_variant are names (str)")
    if eager and grad:
        backward_stage = resolve(backward_stage, True, dev, asked, backward_variant, sl,
                                 int(q.shape[-1]))
    if eager:
        st = stage_library(stage).stage
        if q.dtype not in st.torch_dtypes():
            names = " or ".join(str(t) for t in st.torch_dtypes())
            raise TypeError(f"{_lead(name, stage)} takes {names} tensors (its storage type); "
                            f"these are {q.dtype}")
    if grad and q.dtype == torch.float32:
        bnamed = (backward_stage if backward_stage != "auto" else
                  f"{HOPPER_BACKWARD_STAGE} or {BACKWARD_STAGE}")
        raise TypeError(f"{_lead(name, stage)} stores {q.dtype}, and the backward pass "
                        f"({bnamed}) takes float16: for gradients use a float16 stage (stage 2 "
                        "on), or call it under torch.no_grad() or with detached tensors")
    B, H, N, _ = (int(x) for x in q.shape)
    if B * H * N == 0 or k.shape[2] == 0:  # nothing to launch: what torch returns
        return _empty(q, k, v)
    if eager and B * H > stage_library(stage).limits["max_bh"]:
        call = _in_parts(stage_library(stage).limits["max_bh"], H, H // int(k.shape[1]),
                         lambda q, k, v: attention_as(name, q, k, v, *given, given_backward,
                                                      backward_variant, local))
        call = _run.on_bnhd(call) if bnhd_key else call
    else:
        call = _planned(q, k, v, causal, scale, stage, variant, sl, backward_stage,
                        backward_variant, grad, eager, name, local, bool(bnhd_key))
        if not eager:
            return call
    if bnhd_key is None:
        _run.remember(lambda: _run.call_key(q, k, v, *given, given_backward, backward_variant,
                                            grad, local), call, given[1])
        return call(q, k, v)
    _run.remember(lambda: bnhd_key(grad), call, given[1])  # flash_attn_func's, on its tensors
    o, lse = call(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
    return o.transpose(1, 2), lse


def _lead(name: str, stage: str) -> str:
    """How an error about the stage starts: its name, after the call's where that is another."""
    return stage if name == stage else f"{name}: {stage}"


def _planned(q, k, v, causal, scale, stage, variant, sl, backward_stage, backward_variant,
             grad, eager, name, local=NO_LOCAL, bnhd=False):
    """The call's plans and the function that runs them on (q, k, v) (bnhd: on the [B, N, H, D]
    tensors that q, k, v are views of); under torch.compile, the custom operator's result itself
    (it plans as it traces)."""
    # A stage that does not take strided tensors (or whose backward pass does not, with
    # gradients) gets contiguous copies; under torch.compile, which traces no library call, any
    # strided input is copied.
    strided = not (q.is_contiguous() and k.is_contiguous() and v.is_contiguous())
    copy = strided and (not eager or not takes_strides(stage, backward_stage if grad else None))
    if copy:
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    if not eager:  # (under torch.compile the operators make the library's checks as they trace)
        from . import _ops
        return _ops.forward(q, k, v, causal, *local, scale, stage, variant, sl, backward_stage,
                            backward_variant)
    check_aligned(name, (("q", q), ("k", k), ("v", v)))
    _run.init_stream_accessor()
    dev = device_of(q)
    fp = plan(stage, False, forward_geometry(q, k), dev, q.dtype, causal, scale, variant, sl,
              local=local)
    bp = plan(backward_stage, True, backward_geometry(q, k, v), dev, q.dtype, causal, scale,
              backward_variant, sl, who=name, local=local) if grad else None
    call = _run.make_call(fp, bp, bnhd and not copy)
    if copy:
        run = call
        call = lambda q, k, v: run(q.contiguous(), k.contiguous(), v.contiguous())  # noqa: E731
        call = _run.on_bnhd(call) if bnhd else call
    return call


def _empty(q, k, v):
    """(o, lse) of a problem with nothing to launch, as torch returns it: o zero like q (empty,
    or zero rows where there are no keys), lse -inf; o differentiable with zero gradients of
    q's, k's and v's shapes (a sum over no element of each: exactly 0, whatever they hold)."""
    torch = _torch()
    o = torch.zeros_like(q)
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        o = o + (q[:0].sum() + k[:0].sum() + v[:0].sum())
    lse = torch.full(tuple(q.shape[:3]), float("-inf"), dtype=torch.float32, device=q.device)
    return o, lse


def _in_parts(limit: int, H: int, group: int, run):
    """A call over B x H > limit as calls of run(q, k, v) -> (o, lse) under it: whole batches
    of H heads, or, where H alone is over, one batch at a time in head ranges of whole
    key/value-head groups (group query heads each); the parts' o and lse concatenated (autograd
    flows through the slices and torch.cat)."""
    torch = _torch()
    if H <= limit:
        step = limit // H

        def call(q, k, v):
            parts = [run(q[b:b + step], k[b:b + step], v[b:b + step])
                     for b in range(0, q.shape[0], step)]
            return (torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts]))
        return call
    heads = limit // group * group
    if heads == 0:
        raise ValueError(f"one key/value head serves {group} query heads, more than a launch "
                         f"takes ({limit})")

    def call(q, k, v):
        rows = []
        for b in range(q.shape[0]):
            parts = [run(q[b:b + 1, h:h + heads], k[b:b + 1, h // group:(h + heads) // group],
                         v[b:b + 1, h // group:(h + heads) // group]) for h in range(0, H, heads)]
            rows.append((torch.cat([p[0] for p in parts], 1), torch.cat([p[1] for p in parts], 1)))
        return torch.cat([r[0] for r in rows]), torch.cat([r[1] for r in rows])
    return call


def attention_backward(q, k, v, o, lse, do, *, causal: bool = False,
                       scale: Optional[float] = None, stage: str = "auto",
                       variant: str = "default",
                       smem_limit: Optional[int] = None) -> Tuple["Tensor", "Tensor", "Tensor"]:
    """dq, dk, dv of attention(q, k, v) for the upstream gradient do = dLoss/do, by `stage`'s
    backward pass, on the current stream. stage: a stage name, or "auto" (the default): stage 8
    (the Hopper backward, FlashAttention-3's) where it runs and takes the inputs, else stage 7
    (FlashAttention-2's), as attention()'s backward_stage.

    q, o, do: [B, H, N, D] CUDA tensors of the stage's dtype (float16; bfloat16 where it takes
    it), k, v [B, H_kv, N_k, D], any strides with a contiguous last dimension where the stage
    takes them; lse [B, H, N] float32 (natural log), contiguous, as attention() returned it with
    o for the same causal and scale (any forward stage: they share the contract). variant: the
    backward stage's variants (stage 7's: "default": dq by fp32 atomics, "deterministic":
    bit-identical from run to run, "registers": the layout with P and dS kept in registers, as on
    GPUs with less shared memory; stage 8's: "default", "atomics", "deterministic"; "auto" with a
    variant stage 8 lacks is stage 7; Stage.variants lists them). Returns (dq, dk, dv) like q, k, v (zero where there is nothing to compute). Errors
    as attention()'s, naming the stage given (or flashcourse.attention_backward for "auto").
    """
    name = stage if isinstance(stage, str) and stage != "auto" else \
        "flashcourse.attention_backward"
    if not isinstance(stage, str):
        raise TypeError(f"{name}: stage must be a stage name such as '{BACKWARD_STAGE}', not "
                        f"{type(stage).__name__}")
    eager = not _compiling()
    if eager and stage != "auto":
        stage_library(stage)
    torch = _torch()
    check_tensors(name, (("q", q), ("k", k), ("v", v), ("o", o), ("do", do)))
    sl = smem_limit_checked(smem_limit, name)
    if eager:  # (under torch.compile the operator resolves it: _ops)
        stage = resolve(stage, True, device_of(q), asks(q, k), variant, sl, int(q.shape[-1]))
    if not isinstance(lse, torch.Tensor):
        raise TypeError(f"{name} takes torch tensors; lse is a {type(lse).__name__}")
    if lse.device != q.device or lse.dtype != torch.float32:
        raise TypeError(f"{name} takes lse as float32 on q's device ({q.device}); it is "
                        f"{lse.dtype} on {lse.device}")
    if tuple(lse.shape) != tuple(q.shape[:3]) or not lse.is_contiguous():
        raise ValueError(f"{name} takes lse of shape [B, H, N] = {tuple(q.shape[:3])}, "
                         f"contiguous; it is {tuple(lse.shape)} (strides {tuple(lse.stride())})")
    causal = causal_checked(causal, name)
    scale = scale_checked(scale, int(q.shape[-1]), name)
    if not isinstance(variant, str):
        raise ValueError(f"{name}: variant must be a name such as 'default', not {variant!r}")
    if q.numel() == 0 or k.numel() == 0:  # nothing to launch
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    if not eager:
        from . import _ops
        return _ops.backward(q, k, v, o, lse, do, causal, *NO_LOCAL, scale, stage, variant, sl)
    try:
        return _run.run_backward(q, k, v, o, lse, do, causal, scale, stage, variant, sl)
    except _OWN_ERRORS as e:  # the stage's reasons (a head dim it did not compile) by the call
        renamed = named_by(name, e)
        if renamed is e:
            raise
        raise renamed from None


def auto_stage(device=None) -> str:
    """The forward stage that stage="auto" runs on a CUDA device (default: the current one):
    stage 6 (the Hopper forward) where its library is built and runs there, else stage 5. For
    one call it is stage 6 where that stage also takes what the call asks and fits its
    smem_limit, else stage 5; this says it with no smem_limit."""
    return resolve("auto", False, device_index(device))


def auto_backward_stage(device=None) -> str:
    """The backward stage that backward_stage="auto" (the default) runs on a CUDA device
    (default: the current one): stage 8 (the Hopper backward) where its library is built and
    runs there, else stage 7. For one call it is stage 8 where that stage also takes what the
    call asks (its dtype, heads and key count; the backward variant, among stage 8's variants,
    at the call's head dim: deterministic up to D = 128; smem_limit), else stage 7; this says it
    for the default variant, no smem_limit."""
    return resolve("auto", True, device_index(device))
