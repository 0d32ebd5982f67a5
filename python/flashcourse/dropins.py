"""Drop-ins with the signatures users know, each behaving as its original or refusing clearly:
scaled_dot_product_attention (torch's SDPA), flash_attn_func and flash_attn_with_kvcache
(flash-attn 2's).

Every error names the function the user called. The kernels align causal masks to the bottom
right (query i sees keys j <= i + N_k - N_q); SDPA's is_causal aligns them to the top left (j <=
i), which is the bottom-right mask of the first N_q keys where N_q <= N_k (a strided view of them,
no copy), and where N_q > N_k the bottom-right mask of the first N_k rows over all keys and full
attention for the rest (two calls, concatenated along the rows).
"""

from typing import TYPE_CHECKING, Optional, Tuple, Union

from . import _library, _run
from ._library import DECODE_STAGE, _torch, stage_library
from ._plans import (_INT_MAX, ALIGN, NO_LOCAL, causal_checked, device_of, local_checked,
                     scale_checked)
from .api import _OWN_ERRORS, attention_as, given_key, named_by

if TYPE_CHECKING:
    from torch import Tensor

SDPA = "flashcourse.scaled_dot_product_attention"
FLASH = "flashcourse.flash_attn_func"
KVCACHE = "flashcourse.flash_attn_with_kvcache"


def flash_attn_lse(lse):
    """The LSE as flash-attn 2 returns it: +inf for a row that sees no key (its kernels' `(sum ==
    0.f || sum != sum) ? INFINITY`, and its fill where there are no keys at all), which the
    course's contract and kernels write as -inf (attention.h). A new tensor, made on the device
    (nothing waits): the backward pass keeps the kernels' own. For what a flash-attn drop-in
    returns, and only where the caller asked for the LSE."""
    return lse.masked_fill(lse == float("-inf"), float("inf"))


def _four_dims(*ts) -> bool:
    torch = _torch()
    return all(isinstance(t, torch.Tensor) and t.dim() == 4 for t in ts)


def _attend(who: str, q, k, v, mask: Optional[str], scale, stage, backward_stage,
            backward_variant, local: tuple = NO_LOCAL, bnhd_key=None):
    """(o, lse) of q, k, v [B, H, N, D] with mask None, "bottom_right" (the kernels' causal) or
    "top_left" (SDPA's is_causal); local: a local window and softcap (bottom-right aligned, with
    mask None or "bottom_right"); bnhd_key: flash_attn_func's (api.attention_as)."""
    def run(q, k, v, causal):
        return attention_as(who, q, k, v, causal, scale, stage, "default", None, backward_stage,
                            backward_variant, local, bnhd_key)

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
    flowing back to the float32 tensors), head dim D a multiple of 8 from 32 to 256 (as
    flash-attn's; each run by the stage as it is, no padded copy: stages 5-8 run every one, stages
    0-4 64 and 128, "auto" one that runs D; another D, or one the stage given did not compile,
    raises ValueError naming this function), any strides with a contiguous last dimension. is_causal: SDPA's mask for any L and S, aligned to the top left (query i sees keys
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
    place). D: a multiple of 8 from 32 to 256, flash-attn's head dims, run by the stage as they
    are (no padded copy): stages 5-8 run every one, stages 0-4 64 and 128 ("auto" picks one that
    runs D); another D, or one the stage given did not compile, raises ValueError naming this
    function. causal with N != N_k: aligned to the bottom right, as flash-attn 2.1 and later.
    window_size (left, right): a local window, as flash-attn's: query i attends to keys
    i + N_k - N - left .. i + N_k - N + right, -1 unbounded on that side (causal makes right 0);
    softcap > 0: each score s becomes softcap * tanh(s / softcap) before the softmax (lse of the
    capped scores). Both are taken by the stages whose Stage.takes say so (stages 5-8; "auto"
    picks one that takes them), and flow into the backward pass; another stage raises
    ValueError naming this function.
    Returns o [B, N, H, D]; with return_attn_probs=True, (o, softmax_lse, S_dmask) as flash-attn
    returns them without dropout: lse [B, H, N] float32 (natural log; +inf for a row that sees no
    key, a window past its keys or N_k = 0, as flash-attn's, where attention() returns the
    course's -inf), S_dmask an empty tensor.
    deterministic=True: the backward pass's deterministic variant (bit-identical gradients from
    run to run; stage 8's on Hopper, else stage 7's). Differentiable as attention(). stage: "auto" (stage 6 on Hopper, else
    stage 5) or a stage name; backward_stage: "auto" (stage 8 where it runs and takes the inputs,
    else stage 7) or a stage name. The first call of a combination of shapes, strides, dtypes and
    arguments checks and plans; later ones cost a dict lookup and the launches, on q, k, v as they
    are (no transposed views).

    The keywords flash-attn has and the stages do not compute are taken at their defaults only:
    dropout_p 0, alibi_slopes None; others raise NotImplementedError. Every error names this
    function.
    """
    who = FLASH
    given = (causal, softmax_scale, window_size, softcap, deterministic, stage, backward_stage,
             backward_variant)
    torch = _library.torch_mod
    if not dropout_p and alibi_slopes is None and torch is not None and \
            not torch.compiler.is_compiling():
        try:  # the call cache first: one dict lookup, on the tensors as they are
            grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or
                                                v.requires_grad)
            call = _run.calls.get(given_key(who, q, k, v, *given, grad))
        except Exception:  # not tensors, an unhashable argument, no pair: checked below
            call = None
        if call is not None and _run.ready(q, k, v):
            return _flash_out(call(q, k, v), q, return_attn_probs)
    if dropout_p:
        raise NotImplementedError(f"{who} has no dropout (dropout_p={dropout_p!r}): pass "
                                  "dropout_p=0.0")
    local = local_checked(window_size, softcap, who)
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
    # [B, H, N, D] views, read through strides; the call kept is on q, k, v as they are (bnhd)
    o, lse = _attend(who, q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                     "bottom_right" if causal else None, softmax_scale, stage, backward_stage,
                     backward_variant, local, lambda grad: given_key(who, q, k, v, *given, grad))
    return _flash_out((o.transpose(1, 2), lse), q, return_attn_probs)


def _flash_out(out: tuple, q, probs):
    """flash_attn_func's result of (o [B, N, H, D], lse): o contiguous (a copy where it is not),
    with probs (o, lse as flash-attn's, an empty S_dmask)."""
    o, lse = out
    o = o if o.is_contiguous() else o.contiguous()
    if probs:
        return o, flash_attn_lse(lse), _torch().empty((0,), dtype=q.dtype, device=q.device)
    return o


def flash_attn_with_kvcache(q: "Tensor", k_cache: "Tensor", v_cache: "Tensor",
                            k: Optional["Tensor"] = None, v: Optional["Tensor"] = None,
                            rotary_cos=None, rotary_sin=None,
                            cache_seqlens: Optional[Union[int, "Tensor"]] = None,
                            cache_batch_idx=None, cache_leftpad=None,
                            block_table: Optional["Tensor"] = None,
                            softmax_scale: Optional[float] = None, causal: bool = False,
                            window_size: Tuple[int, int] = (-1, -1), softcap: float = 0.0,
                            rotary_interleaved: bool = True, alibi_slopes=None,
                            num_splits: int = 0, return_softmax_lse: bool = False, *,
                            stage: str = DECODE_STAGE, variant: str = "default"
                            ) -> Union["Tensor", Tuple["Tensor", "Tensor"]]:
    """flash-attn 2's flash_attn_with_kvcache signature, layout and results, by the course's
    decode stage (stage9_decode: the key range split across blocks, merged by LSE):

        from flash_attn import flash_attn_with_kvcache          # or:
        from flashcourse import flash_attn_with_kvcache
        o = flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=lens,
                                    block_table=table, causal=True)

    q [B, N_q, H, D] (1 to 16 new tokens a sequence); a KV cache k_cache, v_cache either
    contiguous [B_cache >= B, N_max, H_kv, D] (sequence b is row b) or, with block_table int32
    [B, max_pages], paged [num_pages, page_size, H_kv, D] (page_size a power of two up to 1024;
    key t of sequence b is row t % page_size of page block_table[b, t // page_size]); H_kv
    dividing H (grouped-query heads, MQA); float16 or bfloat16; D 64 or 128; any strides with a
    contiguous last dimension (q, k, v whose strides are not whole 16-byte chunks are copied; a
    paged cache's page and row strides under 2^31 elements).
    cache_seqlens: the keys each sequence holds, an int or an int32 tensor [B] on q's device
    (None: the whole cache); it stays on the device (nothing waits for the GPU; a length past the
    cache reads nothing outside it). k, v [B, N_new, H_kv, D]: new keys written into the cache in
    place at cache_seqlens[b] .. + N_new - 1, then attended over with the rest (cache_seqlens is
    not advanced: the caller adds N_new, as with flash-attn). causal: query i sees keys j <=
    i + L_b - N_q (L_b = cache_seqlens[b] + N_new: aligned to the bottom right); a row with no
    key gets o = 0 (lse +inf, as flash-attn's). softmax_scale: default 1/sqrt(D). Returns out
    [B, N_q, H, D] (and softmax_lse [B, H, N_q] float32, natural log, with
    return_softmax_lse=True). Not differentiable (as flash-attn's). Runs on the current stream
    with outputs from PyTorch's caching allocator, planned once per combination of shapes,
    strides, dtypes and flags; CUDA graphs capture it (an int cache_seqlens is captured as its
    value; pass a tensor to change it between replays). num_splits: flash-attn's benchmarking
    knob, taken as a hint (any int >= 0): the stage plans its own split of the keys from the GPU
    and the shape.

    Refused: rotary_cos / rotary_sin (rotary embedding), cache_batch_idx, cache_leftpad,
    window_size other than (-1, -1), softcap other than 0, alibi_slopes raise
    NotImplementedError naming the keyword; more than 16 query tokens, a head dim or a page size
    the stage does not take raise ValueError, other bad arguments TypeError or ValueError, each
    naming this function. stage: a stage with a decode pass (Stage.decode); variant: its variants.
    """
    who = KVCACHE
    if type(causal) is bool and type(return_softmax_lse) is bool and rotary_cos is None and \
            rotary_sin is None and cache_batch_idx is None and cache_leftpad is None and \
            alibi_slopes is None and not softcap and type(num_splits) is int and num_splits >= 0:
        try:  # the call cache first: one dict lookup
            call = _run.kv_calls.get(_run.kv_key(
                q, k_cache, v_cache, k, v, cache_seqlens, block_table, softmax_scale, causal,
                tuple(window_size), stage, variant))
        except (AttributeError, TypeError):  # not tensors, an unhashable argument: checked below
            call = None
        if call is not None and _run.kv_ready(q, k_cache, v_cache, k, v):
            o, lse = call(q, k_cache, v_cache, k, v, cache_seqlens, block_table)
            return (o, flash_attn_lse(lse)) if return_softmax_lse else o
    try:
        o, lse = _kvcache_checked(who, q, k_cache, v_cache, k, v, rotary_cos, rotary_sin,
                                  cache_seqlens, cache_batch_idx, cache_leftpad, block_table,
                                  softmax_scale, causal, window_size, softcap, alibi_slopes,
                                  num_splits, stage, variant)
    except _OWN_ERRORS as e:
        renamed = named_by(who, e)
        if renamed is e:
            raise
        raise renamed from None
    return (o, flash_attn_lse(lse)) if return_softmax_lse else o


def _check_kvcache(who: str, q, k_cache, v_cache, k, v, cache_seqlens, block_table, dtypes):
    """Types, devices, dtypes and shapes of a decode call (flash_attn_with_kvcache's arguments;
    metadata only, no device value read): TypeError / ValueError naming `who`. Returns (B, N_q,
    H, D, H_kv, capacity: the keys a sequence can hold, N_new, paged)."""
    torch = _torch()
    if (k is None) != (v is None):
        raise ValueError(f"{who}: pass k and v together (new keys and their values), or neither")
    named = [("q", q), ("k_cache", k_cache), ("v_cache", v_cache)] + \
        ([] if k is None else [("k", k), ("v", v)])
    for n, t in named:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{who} takes torch tensors; {n} is a {type(t).__name__}")
        if t.device.type != "cuda" or t.dtype != q.dtype or t.device != q.device:
            raise TypeError(f"{who} takes q, k_cache, v_cache (and k, v) of one dtype on one "
                            f"CUDA device; q is {q.dtype} on {q.device}, {n} {t.dtype} on "
                            f"{t.device}")
        if t.dim() != 4 or (t.stride(3) != 1 and t.numel()):
            raise ValueError(f"{who} takes q [B, N_q, H, D], k_cache and v_cache [B, N_max, H_kv, "
                             f"D] (paged: [num_pages, page_size, H_kv, D]), k and v [B, N_new, "
                             f"H_kv, D], each with a contiguous last dimension; {n} has shape "
                             f"{tuple(t.shape)}, strides {tuple(t.stride())}")
    if q.dtype not in dtypes:
        raise TypeError(f"{who} takes {' or '.join(map(str, dtypes))} tensors; q is {q.dtype}")
    B, N_q, H, D = (int(x) for x in q.shape)
    H_kv = int(k_cache.shape[2])
    if k_cache.shape != v_cache.shape or k_cache.shape[3] != D or H_kv == 0 or H % H_kv:
        raise ValueError(f"{who} takes k_cache and v_cache of one shape, q's head dim ({D}) and "
                         f"heads dividing q's ({H}); k_cache is {tuple(k_cache.shape)}, v_cache "
                         f"{tuple(v_cache.shape)}")
    paged = block_table is not None
    if paged:
        if not isinstance(block_table, torch.Tensor) or block_table.dtype != torch.int32 or \
                block_table.device != q.device or tuple(block_table.shape[:1]) != (B,) or \
                block_table.dim() != 2:
            raise TypeError(f"{who} takes block_table as an int32 tensor [B, max_pages] = [{B}, "
                            f"max_pages] on q's device; it is {_describe(block_table)}")
        capacity = int(block_table.shape[1]) * int(k_cache.shape[1])
    elif k_cache.shape[0] < B:
        raise ValueError(f"{who}: k_cache and v_cache hold {k_cache.shape[0]} sequences, q {B} "
                         "(without a block_table sequence b is row b of the cache)")
    else:
        capacity = int(k_cache.shape[1])
    N_new = 0 if k is None else int(k.shape[1])
    if k is not None:
        if k.shape != v.shape or (k.shape[0], k.shape[2], k.shape[3]) != (B, H_kv, D):
            raise ValueError(f"{who} takes k and v of one shape [B, N_new, H_kv, D] = [{B}, "
                             f"N_new, {H_kv}, {D}]; k is {tuple(k.shape)}, v {tuple(v.shape)}")
        if cache_seqlens is None:
            raise ValueError(f"{who}: new keys (k, v) need cache_seqlens, where in the cache they "
                             "go (as flash-attn asks)")
        if N_new > capacity:
            raise ValueError(f"{who}: {N_new} new keys, more than the cache holds ({capacity})")
    if isinstance(cache_seqlens, torch.Tensor):
        if cache_seqlens.dtype != torch.int32 or cache_seqlens.device != q.device or \
                tuple(cache_seqlens.shape) != (B,):
            raise TypeError(f"{who} takes cache_seqlens as an int or an int32 tensor [B] = [{B}] "
                            f"on q's device; it is {_describe(cache_seqlens)}")
    elif cache_seqlens is not None and (isinstance(cache_seqlens, bool) or
                                        not isinstance(cache_seqlens, int)):
        raise TypeError(f"{who} takes cache_seqlens as an int or an int32 tensor [B], not "
                        f"{type(cache_seqlens).__name__}")
    if any(x > _INT_MAX for x in tuple(q.shape) + tuple(k_cache.shape)) or capacity > _INT_MAX:
        raise ValueError(f"{who}: every dimension must fit in an int")
    return B, N_q, H, D, H_kv, capacity, N_new, paged


def _describe(t) -> str:
    torch = _torch()
    if not isinstance(t, torch.Tensor):
        return f"a {type(t).__name__}"
    return f"{t.dtype} {list(t.shape)} on {t.device}"


def _kvcache_checked(who, q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
                     cache_batch_idx, cache_leftpad, block_table, softmax_scale, causal,
                     window_size, softcap, alibi_slopes, num_splits, stage, variant):
    """flash_attn_with_kvcache with every check made: the first call of a combination, and every
    call that fails one; keeps what the call runs (_run.kv_calls)."""
    for name, value in (("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin),
                        ("cache_batch_idx", cache_batch_idx), ("cache_leftpad", cache_leftpad),
                        ("alibi_slopes", alibi_slopes)):
        if value is not None:
            raise NotImplementedError(f"{who} takes no {name} (the decode stage does not compute "
                                      f"it): pass None")
    window = tuple(window_size) if isinstance(window_size, (tuple, list)) else window_size
    if window != (-1, -1):
        raise NotImplementedError(f"{who} has no local (sliding-window) attention "
                                  f"(window_size={window!r}): pass (-1, -1)")
    if softcap:
        raise NotImplementedError(f"{who} has no softcap (softcap={softcap!r}): pass 0.0")
    if isinstance(num_splits, bool) or not isinstance(num_splits, int) or num_splits < 0:
        raise ValueError(f"{who}: num_splits must be an int >= 0 (0: the stage's own split), "
                         f"not {num_splits!r}")
    causal = causal_checked(causal, who)
    if not isinstance(stage, str) or not isinstance(variant, str):
        raise TypeError(f"{who}: stage and variant are names (str), such as '{DECODE_STAGE}'")
    st = stage_library(stage, who).stage
    if not st.decode:
        raise ValueError(f"{who}: {st.name} has no decode pass over a KV cache ({DECODE_STAGE} "
                         "has)")
    torch = _torch()  # (whether the stage takes bf16 is its decode's unsupported()'s to say)
    B, N_q, H, D, H_kv, capacity, N_new, paged = _check_kvcache(
        who, q, k_cache, v_cache, k, v, cache_seqlens, block_table,
        (torch.float16, torch.bfloat16))
    scale = scale_checked(softmax_scale, D, who)
    for n, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if t.data_ptr() % ALIGN:
            raise ValueError(f"{who} takes a cache whose data is {ALIGN}-byte aligned (written "
                             f"in place, never copied); {n} starts at an offset into its storage")
    if B == 0 or capacity == 0:  # nothing to attend to: what an empty softmax gives
        o = torch.zeros((B, N_q, H, D), dtype=q.dtype, device=q.device)
        return o, torch.full((B, H, N_q), float("-inf"), dtype=torch.float32, device=q.device)
    q0, k0, v0 = q, k, v
    small = [q] + ([] if k is None else [k, v])
    unaligned = any(t.data_ptr() % ALIGN for t in small)
    copy_new = unaligned or not all(all(x % 8 == 0 for x in t.stride()[:3]) for t in small)
    if copy_new:  # (the few new tokens: a small copy, contiguous and aligned)
        q, k, v = (None if t is None else t.clone(memory_format=torch.contiguous_format)
                   for t in (q, k, v))
    _run.init_stream_accessor()
    geometry, cache = _run.decode_geometry(q, k_cache, v_cache, k, v,
                                           int(block_table.shape[1]) if paged else None)
    p = _run.decode_plan(stage, device_of(q), q.dtype, geometry, cache, causal, scale, variant)
    call = _run.make_decode_call(who, p, capacity, copy_new)
    if not unaligned:
        _run.remember(lambda: _run.kv_key(q0, k_cache, v_cache, k0, v0, cache_seqlens,
                                          block_table, softmax_scale, causal, tuple(window_size),
                                          stage, variant), call, softmax_scale, _run.kv_calls)
    return call(q, k_cache, v_cache, k, v, cache_seqlens, block_table)
