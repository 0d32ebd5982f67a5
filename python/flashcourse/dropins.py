"""Drop-ins with the signatures users know, each behaving as its original or refusing clearly:
scaled_dot_product_attention (torch's SDPA) and flash_attn_func (flash-attn 2's).

Every error names the function the user called. The kernels align causal masks to the bottom
right (query i sees keys j <= i + N_k - N_q); SDPA's is_causal aligns them to the top left (j <=
i), which is the bottom-right mask of the first N_q keys where N_q <= N_k (a strided view of them,
no copy), and where N_q > N_k the bottom-right mask of the first N_k rows over all keys and full
attention for the rest (two calls, concatenated along the rows).
"""

from typing import TYPE_CHECKING, Optional, Tuple, Union

from ._library import _torch, stage_library
from ._plans import causal_checked
from .api import attention_as

if TYPE_CHECKING:
    from torch import Tensor

SDPA = "flashcourse.scaled_dot_product_attention"
FLASH = "flashcourse.flash_attn_func"


def _four_dims(*ts) -> bool:
    torch = _torch()
    return all(isinstance(t, torch.Tensor) and t.dim() == 4 for t in ts)


def _attend(who: str, q, k, v, mask: Optional[str], scale, stage, backward_stage,
            backward_variant):
    """(o, lse) of q, k, v [B, H, N, D] with mask None, "bottom_right" (the kernels' causal) or
    "top_left" (SDPA's is_causal)."""
    def run(q, k, v, causal):
        return attention_as(who, q, k, v, causal, scale, stage, "default", None, backward_stage,
                            backward_variant)

    if mask != "top_left" or not _four_dims(q, k, v) or q.shape[2] == k.shape[2]:
        return run(q, k, v, mask is not None)
    N, N_k = q.shape[2], k.shape[2]
    if N < N_k or N_k == 0:  # (no keys: what torch returns, attention's empty answer)
        return run(q, k[:, :, :N], v[:, :, :N], True)
    torch = _torch()
    o1, lse1 = run(q[:, :, :N_k], k, v, True)  # rows 0 .. N_k - 1: causal over the N_k keys
    o2, lse2 = run(q[:, :, N_k:], k, v, False)  # rows N_k ..: every key
    return torch.cat((o1, o2), 2), torch.cat((lse1, lse2), 2)


def _causal_bias(who: str, attn_mask, query, key) -> str:
    """The mask torch's causal bias (torch.nn.attention.bias.CausalBias) stands for, or
    NotImplementedError for any other attn_mask."""
    try:
        from torch.nn.attention.bias import CausalBias, CausalVariant
    except ImportError:
        CausalBias = CausalVariant = None
    if CausalBias is None or not isinstance(attn_mask, CausalBias):
        raise NotImplementedError(
            f"{who} takes no attn_mask (a {type(attn_mask).__name__}) but torch's causal biases "
            "(torch.nn.attention.bias.causal_upper_left / causal_lower_right): the stages "
            "compute full or causal attention")
    if _four_dims(query, key) and (attn_mask.seq_len_q, attn_mask.seq_len_kv) != \
            (query.shape[2], key.shape[2]):
        raise ValueError(f"{who}: the causal bias is for {attn_mask.seq_len_q} queries and "
                         f"{attn_mask.seq_len_kv} keys; query has {query.shape[2]}, key "
                         f"{key.shape[2]}")
    return "bottom_right" if attn_mask.variant == CausalVariant.LOWER_RIGHT else "top_left"


def _autocast_dtype():
    """The dtype torch.autocast("cuda") casts to where it is on, else None."""
    torch = _torch()
    try:
        on = torch.is_autocast_enabled("cuda")
    except TypeError:  # torch before 2.4: the no-argument form is CUDA's
        on = torch.is_autocast_enabled()
    if not on:
        return None
    get = getattr(torch, "get_autocast_dtype", None)
    return get("cuda") if get is not None else torch.get_autocast_gpu_dtype()


def scaled_dot_product_attention(query: "Tensor", key: "Tensor", value: "Tensor",
                                 attn_mask=None, dropout_p: float = 0.0, is_causal: bool = False,
                                 scale: Optional[float] = None, enable_gqa: bool = False, *,
                                 stage: str = "auto", backward_stage: str = "auto",
                                 backward_variant: str = "default") -> "Tensor":
    """torch.nn.functional.scaled_dot_product_attention's signature, layout and results, over
    the course's stages: a one-line swap into a model,

        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        o = flashcourse.scaled_dot_product_attention(q, k, v, is_causal=True)

    query [B, H, L, D], key and value [B, H_kv, S, D] (H_kv < H: grouped-query heads, with
    enable_gqa=True as SDPA asks), CUDA tensors of one dtype a stage stores (float16, bfloat16;
    float32 under torch.autocast("cuda", dtype=...), cast to its dtype as SDPA casts, gradients
    flowing back to the float32 tensors), head dim 64 or 128, any strides with a contiguous last
    dimension. is_causal: SDPA's mask for any L and S, aligned to the top left (query i sees keys
    j <= i). attn_mask: None, or torch's causal biases (torch.nn.attention.bias.causal_upper_left
    (L, S): as is_causal; causal_lower_right(L, S): query i sees keys j <= i + S - L); is_causal
    with an attn_mask raises, as SDPA. Returns the output [B, H, L, D]; differentiable as
    attention() (an empty batch, L = 0 or S = 0: zeros, as SDPA). stage: "auto" (stage 6 on
    Hopper, else stage 5) or a stage name; backward_stage: "auto" (stage 8 where it runs and takes
    the inputs, else stage 7) or a stage name.

    What SDPA takes and the stages do not (another attn_mask, dropout) raises
    NotImplementedError; float32 inputs outside autocast raise TypeError (SDPA would compute in
    float32; no stage past stage 1 stores it); every error names this function.
    """
    who = SDPA
    if dropout_p:
        raise NotImplementedError(f"{who} has no dropout (dropout_p={dropout_p!r}): pass "
                                  "dropout_p=0.0")
    mask = "top_left" if causal_checked(is_causal, who) else None
    if attn_mask is not None:
        if is_causal:
            raise ValueError(f"{who}: pass attn_mask or is_causal=True, not both (as SDPA)")
        mask = _causal_bias(who, attn_mask, query, key)
    torch = _torch()
    tensors = all(isinstance(t, torch.Tensor) for t in (query, key, value))
    if tensors:
        cast = _autocast_dtype()
        if cast is not None and query.is_floating_point():  # SDPA's autocast rule: all to cast
            query, key, value = (t.to(cast) if t.is_floating_point() else t
                                 for t in (query, key, value))
        if query.dtype == torch.float32 and (stage == "auto" or (
                isinstance(stage, str) and stage_library(stage, who).stage.dtype != "float32")):
            raise TypeError(f"{who} takes float16 or bfloat16 tensors (the stages' storage types; "
                            f"SDPA would compute in float32): query is {query.dtype}; cast them, "
                            "or call it under torch.autocast('cuda', dtype=torch.float16)")
        if query.dim() == key.dim() == 4 and key.shape[1] != query.shape[1] and not enable_gqa:
            raise ValueError(f"{who}: key and value have {key.shape[1]} heads, query "
                             f"{query.shape[1]}: pass enable_gqa=True for grouped-query heads "
                             "(as SDPA asks)")
    o, _ = _attend(who, query, key, value, mask, scale, stage, backward_stage, backward_variant)
    return o


def flash_attn_func(q: "Tensor", k: "Tensor", v: "Tensor", dropout_p: float = 0.0,
                    softmax_scale: Optional[float] = None, causal: bool = False,
                    window_size: Tuple[int, int] = (-1, -1), softcap: float = 0.0,
                    alibi_slopes=None, deterministic: bool = False,
                    return_attn_probs: bool = False, *, stage: str = "auto",
                    backward_stage: str = "auto", backward_variant: str = "default"
                    ) -> Union["Tensor", Tuple["Tensor", "Tensor", "Tensor"]]:
    """flash-attn 2's flash_attn_func signature, layout and results over the course's stages:

        from flash_attn import flash_attn_func          # or:
        from flashcourse import flash_attn_func
        o = flash_attn_func(q, k, v, causal=True)

    q [B, N, H, D], k and v [B, N_k, H_kv, D] (H_kv dividing H: grouped-query heads), CUDA
    tensors of one dtype a stage stores (float16; bfloat16 where it takes it), any strides with
    a contiguous last dimension (q, k, v of one fused [B, N, 3, H, D] projection are read in
    place). causal with N != N_k: aligned to the bottom right, as flash-attn 2.1 and later.
    Returns o [B, N, H, D]; with return_attn_probs=True, (o, softmax_lse, S_dmask) as flash-attn
    returns them without dropout: lse [B, H, N] float32 (natural log), S_dmask an empty tensor.
    deterministic=True: the backward pass's deterministic variant (bit-identical gradients from
    run to run; stage 8's on Hopper, else stage 7's). Differentiable as attention(). stage: "auto" (stage 6 on Hopper, else
    stage 5) or a stage name; backward_stage: "auto" (stage 8 where it runs and takes the inputs,
    else stage 7) or a stage name.

    The keywords flash-attn has and the stages do not compute are taken at their defaults only:
    dropout_p 0, window_size (-1, -1), softcap 0, alibi_slopes None; others raise
    NotImplementedError. Every error names this function.
    """
    who = FLASH
    if dropout_p:
        raise NotImplementedError(f"{who} has no dropout (dropout_p={dropout_p!r}): pass "
                                  "dropout_p=0.0")
    if tuple(window_size) != (-1, -1):
        raise NotImplementedError(f"{who} has no local (sliding-window) attention "
                                  f"(window_size={tuple(window_size)!r}): pass (-1, -1)")
    if softcap:
        raise NotImplementedError(f"{who} has no softcap (softcap={softcap!r}): pass 0.0")
    if alibi_slopes is not None:
        raise NotImplementedError(f"{who} has no ALiBi (alibi_slopes): pass None")
    if deterministic:
        if backward_variant not in ("default", "deterministic"):
            raise ValueError(f"{who}: deterministic=True is the backward variant "
                             f"'deterministic', not {backward_variant!r}")
        backward_variant = "deterministic"
    causal = causal_checked(causal, who)
    torch = _torch()
    for n, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{who} takes torch tensors; {n} is a {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{who} takes q [B, N, H, D], k and v [B, N_k, H_kv, D]; "
                             f"{n} has shape {tuple(t.shape)}")
    # [B, N, H, D] -> [B, H, N, D] views: the same memory, the stages read it through strides
    o, lse = _attend(who, q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                     "bottom_right" if causal else None, softmax_scale, stage, backward_stage,
                     backward_variant)
    o = o.transpose(1, 2)  # [B, N, H, D]: contiguous unless a stage without strides took copies
    o = o if o.is_contiguous() else o.contiguous()
    if return_attn_probs:
        return o, lse, torch.empty((0,), dtype=q.dtype, device=q.device)
    return o
