"""flash_attn_varlen_func: flash-attn 2's call on a packed batch of sequences of different lengths.

The sequences lie one after another along the rows of q [total_q, H, D] and k, v [total_k, H_kv,
D]; cu_seqlens_q and cu_seqlens_k (int32 [B + 1] on the device) say where each starts. The stages
read them on the device (attention.h's attn_varlen): the host never does, so a call waits for
nothing and CUDA graphs capture it, and the grid is planned from the longest sequence's lengths,
max_seqlen_q and max_seqlen_k, which the caller gives, as flash-attn asks. A call is checked once
per combination of shapes, strides, dtypes, devices, lengths' metadata and flags, as attention()'s
calls are, and runs from the same call cache (_run.calls) afterwards.
"""

import operator
import sys
from typing import TYPE_CHECKING, Optional, Tuple, Union

from . import _library, _run
from ._library import _torch, stage_library
from ._plans import (_INT_MAX, asks, backward_geometry, causal_checked, check_aligned,
                     device_of, forward_geometry, local_checked, plan, resolve, scale_checked,
                     takes_strides)
from .api import _OWN_ERRORS, _compiling, given_key, named_by
from .dropins import flash_attn_lse

if TYPE_CHECKING:
    from torch import Tensor

VARLEN = "flashcourse.flash_attn_varlen_func"


def flash_attn_varlen_func(q: "Tensor", k: "Tensor", v: "Tensor", cu_seqlens_q: "Tensor",
                           cu_seqlens_k: "Tensor", max_seqlen_q: int, max_seqlen_k: int,
                           dropout_p: float = 0.0, softmax_scale: Optional[float] = None,
                           causal: bool = False, window_size: Tuple[int, int] = (-1, -1),
                           softcap: float = 0.0, alibi_slopes=None, deterministic: bool = False,
                           return_attn_probs: bool = False, block_table=None, *,
                           stage: str = "auto", backward_stage: str = "auto",
                           backward_variant: str = "default"
                           ) -> Union["Tensor", Tuple["Tensor", "Tensor", "Tensor"]]:
    """flash-attn 2's flash_attn_varlen_func signature, layout and results over the course's
    stages: a packed batch of B sequences of different lengths, no padding.

        from flash_attn import flash_attn_varlen_func          # or:
        from flashcourse import flash_attn_varlen_func
        o = flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                   max_seqlen_k, causal=True)

    q [total_q, H, D], k and v [total_k, H_kv, D] (H_kv dividing H: grouped-query heads), CUDA
    tensors of one dtype a stage stores (float16; bfloat16 where it takes it), any strides with a
    contiguous last dimension (q, k, v of one fused [total, 3, H, D] projection are read in
    place). cu_seqlens_q, cu_seqlens_k: int32 [B + 1], contiguous, on q's device: sequence b is
    rows cu_seqlens_q[b] .. cu_seqlens_q[b + 1] - 1 of q (and of o) and rows cu_seqlens_k[b] ..
    cu_seqlens_k[b + 1] - 1 of k and v, and is its own attention (an empty sequence is fine);
    they stay on the device (nothing waits for the GPU; a value past the tensors reads nothing
    outside them). max_seqlen_q, max_seqlen_k: ints, at least the longest sequence's lengths (as
    flash-attn, what the grid is planned with: rows past them are not computed). causal and
    window_size (left, right) align to each sequence's own bottom right: query i of a sequence
    of N_b queries and N_k_b keys sees keys up to i + N_k_b - N_b (causal), or i + N_k_b - N_b -
    left .. i + N_k_b - N_b + right (-1 unbounded), flash-attn's rules with its max_seqlen_k
    where it reads the batch's; softcap > 0: each score s becomes softcap * tanh(s / softcap).
    softmax_scale: default 1/sqrt(D). D a multiple of 8 from 32 to 256, as flash_attn_func.

    Returns o [total_q, H, D] (laid out like q); with return_attn_probs=True, (o, softmax_lse,
    S_dmask) as flash-attn returns them without dropout: softmax_lse [H, total_q] float32
    (natural log), S_dmask an empty tensor. A row that sees no key (a sequence without keys, a
    window past its keys) gets o = 0 and, as from flash-attn, lse +inf (the course's kernels
    write -inf, which attention() returns: the LSE returned here is a copy with +inf there);
    rows that no sequence covers are left as allocated. Differentiable with respect to q, k and
    v (the backward by backward_stage: stage 8 on Hopper where it takes packed batches, else
    stage 7); deterministic=True selects the backward's deterministic variant, as
    flash_attn_func. An empty batch (max_seqlen_q or max_seqlen_k 0, no rows, no heads) returns
    o = 0 and lse +inf, zero gradients. B x H over the kernels' grid limit runs in parts along
    the heads. stage, backward_stage, backward_variant: as flash_attn_func's (a stage that does
    not take packed batches says so: stages 5-8 do).

    Refused, naming this function and the argument: dropout_p > 0, alibi_slopes and block_table
    (a paged KV cache: flash_attn_with_kvcache takes one) raise NotImplementedError (so no
    attention probabilities are returned: flash-attn returns them only with dropout); bad
    arguments raise TypeError or ValueError.
    """
    who = VARLEN
    _refused(who, dropout_p, alibi_slopes, block_table)
    given = (causal, softmax_scale, window_size, softcap, deterministic, stage, backward_stage,
             backward_variant, max_seqlen_q, max_seqlen_k)
    o, lse = _attend(who, q, k, v, cu_seqlens_q, cu_seqlens_k, given)
    return (o, flash_attn_lse(lse), _no_probs(q)) if return_attn_probs else o


def _attend(who: str, q, k, v, cu_q, cu_k, given: tuple):
    """(o, lse) of a packed call: the call cache first (one dict lookup), else every check
    (_checked), its errors named by `who`. given: (causal, softmax_scale, window_size, softcap,
    deterministic, stage, backward_stage, backward_variant, max_seqlen_q, max_seqlen_k) as the
    caller gave them."""
    torch = _library.torch_mod
    if torch is not None and not torch.compiler.is_compiling():
        try:
            grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or
                                                v.requires_grad)
            call = _run.calls.get(_key(q, k, v, cu_q, cu_k, given, grad))
        except Exception:  # not tensors, an unhashable argument, no pair: checked below
            call = None
        if call is not None and _run.ready(q, k, v):
            return call(q, k, v, cu_q, cu_k)
    try:
        return _checked(who, q, k, v, cu_q, cu_k, given)
    except _OWN_ERRORS as e:
        renamed = named_by(who, e)
        if renamed is e:
            raise
        raise renamed from None


def _no_probs(q):
    """flash-attn's S_dmask without dropout: an empty tensor."""
    return _library.torch_mod.empty((0,), dtype=q.dtype, device=q.device)


def _refused(who: str, dropout_p, alibi_slopes, block_table):
    """What flash-attn takes and the stages do not compute: NotImplementedError naming it."""
    if dropout_p:
        raise NotImplementedError(f"{who} has no dropout (dropout_p={dropout_p!r}): pass "
                                  "dropout_p=0.0")
    if alibi_slopes is not None:
        raise NotImplementedError(f"{who} has no ALiBi (alibi_slopes): pass None")
    if block_table is not None:
        raise NotImplementedError(f"{who} takes no block_table (a paged KV cache: "
                                  "flash_attn_with_kvcache takes one): pass None")


def _key(q, k, v, cu_q, cu_k, given: tuple, grad: bool) -> tuple:
    """The call cache's key (api.given_key): everything the checks look at but alignment
    (checked every call), the boundaries' metadata and max_seqlen_q and _k's types too."""
    return given_key(VARLEN, q, k, v, *given, type(given[-2]), type(given[-1]), _run._meta(cu_q),
                     _run._meta(cu_k), grad)


def seqlen_checked(x, name: str, who: str) -> int:
    """max_seqlen_q or max_seqlen_k as an int (a Python or numpy integer, not a tensor: its
    value would be read from the device), or TypeError / ValueError."""
    torch = sys.modules.get("torch")  # (where it was never imported, x is no tensor)
    if isinstance(x, bool) or (torch is not None and isinstance(x, torch.Tensor)) or \
            not hasattr(x, "__index__"):
        raise TypeError(f"{who}: {name} must be an int (the longest sequence's length, known on "
                        f"the host), not {type(x).__name__}")
    n = operator.index(x)
    if not 0 <= n <= _INT_MAX:
        raise ValueError(f"{who}: {name} must be in [0, {_INT_MAX}], got {n}")
    return n


def _check(who: str, q, k, v, cu_q, cu_k):
    """Types, dtypes, shapes, then devices (tensor metadata only: torch.compile traces it)."""
    torch = _torch()
    for n, t in (("q", q), ("k", k), ("v", v), ("cu_seqlens_q", cu_q), ("cu_seqlens_k", cu_k)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{who} takes torch tensors; {n} is a {type(t).__name__}")
    for n, t in (("q", q), ("k", k), ("v", v)):
        if t.dtype != q.dtype:
            raise TypeError(f"{who} takes q, k, v of one dtype; q is {q.dtype}, {n} {t.dtype}")
        if t.dim() != 3:
            raise ValueError(f"{who} takes q [total_q, H, D], k and v [total_k, H_kv, D]; {n} "
                             f"has shape {tuple(t.shape)}")
        if t.stride(2) != 1 and t.numel():
            raise ValueError(f"{who} takes tensors whose last dimension is contiguous; {n} is not "
                             f"(strides {tuple(t.stride())}): pass {n}.contiguous()")
    if k.shape != v.shape or k.shape[2] != q.shape[2]:
        raise ValueError(f"{who} takes k and v of one shape [total_k, H_kv, D] with q's D; q is "
                         f"{tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    H, H_kv = q.shape[1], k.shape[1]
    if H_kv == 0 and H or H_kv and H % H_kv:
        raise ValueError(f"{who}: k and v's heads ({H_kv}) must divide q's ({H}): each key/value "
                         f"head serves H / H_kv query heads")
    for n, t in (("cu_seqlens_q", cu_q), ("cu_seqlens_k", cu_k)):
        if t.dtype != torch.int32:
            raise TypeError(f"{who} takes {n} as int32 (flash-attn's); it is {t.dtype}")
        if t.dim() != 1 or t.shape[0] < 2 or t.shape != cu_q.shape or \
                (t.stride(0) != 1 and t.shape[0] > 1):
            raise ValueError(f"{who} takes cu_seqlens_q and cu_seqlens_k of one shape [B + 1] "
                             f"(B >= 1 sequences), contiguous; {n} has shape {tuple(t.shape)}, "
                             f"strides {tuple(t.stride())}")
    if any(x > _INT_MAX for x in tuple(q.shape) + tuple(k.shape) + tuple(cu_q.shape)):
        raise ValueError(f"{who}: every dimension must fit in an int; got q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)}, cu_seqlens_q {tuple(cu_q.shape)}")
    if q.device.type != "cuda":
        raise TypeError(f"{who} takes CUDA tensors; q is on {q.device}")
    for n, t in (("k", k), ("v", v), ("cu_seqlens_q", cu_q), ("cu_seqlens_k", cu_k)):
        if t.device != q.device:
            raise TypeError(f"{who} takes {n} on q's device ({q.device}); it is on {t.device}")


def _checked(who, q, k, v, cu_q, cu_k, given: tuple):
    """flash_attn_varlen_func with every check made: the first call of a combination, every
    call under torch.compile and every call that fails a check; keeps what the call runs."""
    causal, scale, window_size, softcap, deterministic, stage, backward_stage, backward_variant, \
        max_q, max_k = given
    local = local_checked(window_size, softcap, who)
    if deterministic:
        if backward_variant not in ("default", "deterministic"):
            raise ValueError(f"{who}: deterministic=True is the backward variant "
                             f"'deterministic', not {backward_variant!r}")
        backward_variant = "deterministic"
    max_q = seqlen_checked(max_q, "max_seqlen_q", who)
    max_k = seqlen_checked(max_k, "max_seqlen_k", who)
    causal = causal_checked(causal, who)
    for n, x in (("stage", stage), ("backward_stage", backward_stage),
                 ("backward_variant", backward_variant)):
        if not isinstance(x, str):
            raise TypeError(f"{who}: {n} must be a name (str), not {type(x).__name__}")
    eager = not _compiling()  # (_torch() raises ImportError without PyTorch)
    if eager and stage != "auto":
        stage_library(stage, who)  # an unknown stage or a missing library first
    torch = _torch()
    _check(who, q, k, v, cu_q, cu_k)
    total_q, H, D = (int(x) for x in q.shape)
    B = int(cu_q.shape[0]) - 1
    seqs = (B, max_q, max_k)
    scale = scale_checked(scale, D, who)
    dev = device_of(q)
    asked = asks(q, k, local, seqs)
    grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    if eager:
        stage = resolve(stage, False, dev, asked, "default", 0, D)
        if grad:
            backward_stage = resolve(backward_stage, True, dev, asked, backward_variant, 0, D)
        st = stage_library(stage).stage
        if q.dtype not in st.torch_dtypes():
            names = " or ".join(str(t) for t in st.torch_dtypes())
            raise TypeError(f"{who}: {stage} takes {names} tensors (its storage type); these "
                            f"are {q.dtype}")
    if total_q * H * max_q * max_k == 0 or k.shape[0] == 0:  # nothing to launch
        return _empty(q, k, v)
    if eager and B * H > stage_library(stage).limits["max_bh"]:
        call = _in_parts(who, stage_library(stage).limits["max_bh"], B, H, int(k.shape[1]),
                         given)
    else:
        call = _planned(who, q, k, v, cu_q, cu_k, seqs, causal, scale, local, stage,
                        backward_stage, backward_variant, grad, eager)
        if not eager:
            return call
    _run.remember(lambda: _key(q, k, v, cu_q, cu_k, given, grad), call, given[1])
    return call(q, k, v, cu_q, cu_k)


def _planned(who, q, k, v, cu_q, cu_k, seqs, causal, scale, local, stage, backward_stage,
             backward_variant, grad, eager):
    """The call's plans and the function that runs them on (q, k, v, cu_seqlens_q,
    cu_seqlens_k); under torch.compile, the custom operator's result itself."""
    # a stage without strides (with gradients: or a backward pass without them) gets copies;
    # under torch.compile, which traces no library call, any strided input is copied
    strided = not (q.is_contiguous() and k.is_contiguous() and v.is_contiguous())
    copy = strided and (not eager or not takes_strides(stage, backward_stage if grad else None))
    if copy:
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    if not eager:
        from . import _ops
        return _ops.varlen_forward(q, k, v, cu_q, cu_k, seqs[1], seqs[2], causal, *local, scale,
                                   stage, "default", 0, backward_stage, backward_variant)
    check_aligned(who, (("q", q), ("k", k), ("v", v)))
    _run.init_stream_accessor()
    dev, varlen = device_of(q), (int(q.shape[0]), int(k.shape[0]))
    fp = plan(stage, False, forward_geometry(q, k, seqs), dev, q.dtype, causal, scale, "default",
              0, who, local, varlen)
    bp = plan(backward_stage, True, backward_geometry(q, k, v, seqs=seqs), dev, q.dtype, causal,
              scale, backward_variant, 0, who, local, varlen) if grad else None
    call = _run.make_call(fp, bp)
    if copy:
        run = call
        call = lambda q, k, v, cq, ck: run(q.contiguous(), k.contiguous(),  # noqa: E731
                                           v.contiguous(), cq, ck)
    return call


def _empty(q, k, v):
    """(o, lse) of a packed batch with nothing to launch: o zero like q, lse [H, total_q] -inf
    (the kernels' value for a row without keys; flash_attn_varlen_func returns +inf);
    o differentiable with zero gradients (a sum over no element of each of q, k, v)."""
    torch = _torch()
    o = torch.zeros_like(q)
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        o = o + (q[:0].sum() + k[:0].sum() + v[:0].sum())
    lse = torch.full((q.shape[1], q.shape[0]), float("-inf"), dtype=torch.float32,
                     device=q.device)
    return o, lse


def _in_parts(who: str, limit: int, B: int, H: int, H_kv: int, given: tuple):
    """A packed call over B x H > limit as calls over head ranges of whole key/value-head groups
    (the same rows and cu_seqlens: a head range is a strided view), each under the limit; the
    parts' o concatenated along the heads, their lse along its rows [H, total_q]."""
    torch = _torch()
    group = H // H_kv
    heads = limit // B // group * group
    if heads == 0:
        raise ValueError(f"{who}: {B} sequences of {group} query heads a key/value head are more "
                         f"than a launch takes ({limit} sequences x heads): split the batch")

    def call(q, k, v, cu_q, cu_k):
        parts = [_attend(who, q[:, h:h + heads], k[:, h // group:(h + heads) // group],
                         v[:, h // group:(h + heads) // group], cu_q, cu_k, given)
                 for h in range(0, H, heads)]
        return torch.cat([p[0] for p in parts], 1), torch.cat([p[1] for p in parts], 0)
    return call
