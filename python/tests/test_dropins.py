#!/usr/bin/env python3
"""The drop-ins against their originals: flashcourse.scaled_dot_product_attention against
torch.nn.functional.scaled_dot_product_attention, flash_attn_func's keywords as flash-attn 2 takes
them, errors naming the function called, empty problems and B x H over the kernels' limit.

    PYTHONPATH=python python3 python/tests/test_dropins.py

Each comparison is against torch's SDPA in float32 on the same (rounded) inputs, forward and
gradients, with a bound a wrong mask cannot meet (each test also checks that the other mask's
answer is outside it). Without a GPU or PyTorch every test prints SKIP. Ends with "N passed, M
failed, K skipped".
"""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
import flashcourse  # noqa: E402

try:
    import torch
    import torch.nn.functional as F
    HAVE_GPU = torch.cuda.is_available()
except ImportError:
    torch = F = None
    HAVE_GPU = False

from harness import Skip, run, summary  # noqa: E402

SDPA_NAME, FLASH_NAME = "flashcourse.scaled_dot_product_attention", "flashcourse.flash_attn_func"


def need_gpu():
    if torch is None:
        raise Skip("no PyTorch here")
    if not HAVE_GPU:
        raise Skip("no CUDA GPU here")


def raises(exc, fn, *args, match=(), **kw):
    """fn(*args, **kw) raises exc with every string of match in its one-line message, and no
    internal name ("auto", a private module)."""
    try:
        fn(*args, **kw)
    except exc as e:
        msg = str(e)
        assert "\n" not in msg.strip(), f"not one line: {msg!r}"
        for m in [match] if isinstance(match, str) else match:
            assert m in msg, f"{exc.__name__} {msg!r} lacks {m!r}"
        for internal in ("'auto'", " auto ", "_plans", "_run", "_library", "_attention_checked"):
            assert internal not in msg, f"{msg!r} names {internal!r}"
        return msg
    except Exception as e:
        raise AssertionError(f"expected {exc.__name__}, got {type(e).__name__}: {e}")
    raise AssertionError(f"expected {exc.__name__}, nothing raised")


def leaves(shape_q, shape_kv, dtype=torch and torch.float16, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(shape_q, generator=g, device="cuda").to(dtype)
    k, v = (torch.randn(shape_kv, generator=g, device="cuda").to(dtype) for _ in range(2))
    return [t.requires_grad_(True) for t in (q, k, v)]


def sdpa_ref(q, k, v, **kw):
    """torch's SDPA in float32 on q, k, v's values, by its math backend (the one that takes any
    B x H: the fused float32 kernel refuses a grid over the limit): (o, [dq, dk, dv]) for do."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    ref = [t.detach().float().requires_grad_(True) for t in (q, k, v)]
    with sdpa_kernel(SDPBackend.MATH):
        o = F.scaled_dot_product_attention(*ref, **kw)
    return o, ref


def miss(got, want, what):
    """None if got is within the bound of want, else what and by how much."""
    bound = 2e-2 * max(1.0, want.abs().max().item())
    err = (got.float() - want.float()).abs().max().item() if got.numel() else 0.0
    return None if err <= bound else f"{what}: max error {err:.3g} > {bound:.3g}"


def compare(ours_fn, ref_kw, q, k, v, label, other_kw=None):
    """ours_fn(q, k, v) against SDPA(**ref_kw) forward and gradients; other_kw: a mask whose
    answer must differ (so that a wrong alignment fails)."""
    o = ours_fn(q, k, v)
    do = torch.randn_like(o)
    o.backward(do)
    ours = [o] + [t.grad for t in (q, k, v)]
    ro, ref = sdpa_ref(q, k, v, **ref_kw)
    ro.backward(do.float())
    want = [ro] + [t.grad for t in ref]
    bad = [m for m in (miss(g, w, f"{label} {n}") for g, w, n in
                       zip(ours, want, ("o", "dq", "dk", "dv"))) if m]
    assert not bad, "; ".join(bad)
    if other_kw is not None:
        other, _ = sdpa_ref(q, k, v, **other_kw)
        assert miss(o, other, "the other mask") is not None, \
            f"{label}: the other mask's answer is within the bound: the test could not fail"


CAUSAL_SHAPES = ((5, 20), (20, 5), (1, 100), (100, 1))


def t_sdpa_causal_top_left():
    need_gpu()
    from torch.nn.attention.bias import causal_lower_right
    for L, S in CAUSAL_SHAPES:
        q, k, v = leaves((2, 3, L, 64), (2, 3, S, 64), seed=L * 1000 + S)
        other = dict(attn_mask=causal_lower_right(L, S)) if L < S else None  # (L > S: empty rows)
        compare(lambda q, k, v: flashcourse.scaled_dot_product_attention(q, k, v, is_causal=True),
                dict(is_causal=True), q, k, v, f"is_causal (L, S) = ({L}, {S})", other)


def t_sdpa_causal_bias():
    need_gpu()
    from torch.nn.attention.bias import causal_lower_right, causal_upper_left
    full = dict(is_causal=False)
    # (the mask, L, S, a mask whose answer differs there; None where every mask agrees)
    cases = [(causal_lower_right, 5, 20, full), (causal_lower_right, 1, 100, None),
             (causal_upper_left, 5, 20, full), (causal_upper_left, 20, 5, full),
             (causal_upper_left, 1, 100, dict(attn_mask=causal_lower_right(1, 100)))]
    for make, L, S, other in cases:
        q, k, v = leaves((1, 2, L, 64), (1, 2, S, 64), seed=L + S)
        bias = make(L, S)
        compare(lambda q, k, v: flashcourse.scaled_dot_product_attention(q, k, v,
                                                                         attn_mask=bias),
                dict(attn_mask=bias), q, k, v, f"{make.__name__}({L}, {S})", other)
    q, k, v = leaves((1, 2, 5, 64), (1, 2, 20, 64))
    raises(ValueError, flashcourse.scaled_dot_product_attention, q, k, v,
           attn_mask=causal_lower_right(5, 20), is_causal=True, match=SDPA_NAME)
    raises(ValueError, flashcourse.scaled_dot_product_attention, q, k, v,
           attn_mask=causal_lower_right(6, 20), match=[SDPA_NAME, "6 queries"])


def t_sdpa_autocast():
    need_gpu()
    for dtype in (torch.float16, torch.bfloat16):
        q, k, v = leaves((2, 4, 64, 64), (2, 4, 96, 64), dtype=torch.float32, seed=7)
        with torch.autocast("cuda", dtype=dtype):
            o = flashcourse.scaled_dot_product_attention(q, k, v, is_causal=True)
            ro = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        assert o.dtype == ro.dtype == dtype, (o.dtype, ro.dtype)
        do = torch.randn_like(o)
        o.backward(do)
        ours = [t.grad.clone() for t in (q, k, v)]
        assert all(g.dtype == torch.float32 for g in ours), "gradients reach the float32 leaves"
        for t in (q, k, v):
            t.grad = None
        ro.backward(do)
        bad = [m for m in [miss(o, ro, "o")] + [miss(g, t.grad, n) for g, t, n in
                                                 zip(ours, (q, k, v), ("dq", "dk", "dv"))] if m]
        assert not bad, f"autocast {dtype}: " + "; ".join(bad)
    q, k, v = leaves((1, 2, 64, 64), (1, 2, 64, 64), dtype=torch.float32)
    raises(TypeError, flashcourse.scaled_dot_product_attention, q, k, v,
           match=[SDPA_NAME, "float16", "autocast"])


def t_sdpa_gqa():
    need_gpu()
    for causal in (False, True):
        q, k, v = leaves((2, 8, 128, 64), (2, 2, 128, 64), seed=11)
        ref_kw = dict(is_causal=causal)
        if "enable_gqa" in F.scaled_dot_product_attention.__doc__:
            ref_kw["enable_gqa"] = True

            def ours(q, k, v):
                return flashcourse.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                                enable_gqa=True)
            compare(ours, ref_kw, q, k, v, f"GQA 8:2 causal={causal}")
        else:
            raise Skip(f"torch {torch.__version__}'s SDPA has no enable_gqa")
    raises(ValueError, flashcourse.scaled_dot_product_attention, q, k, v,
           match=[SDPA_NAME, "enable_gqa"])


def t_flash_attn_keywords():
    need_gpu()
    fa = flashcourse.flash_attn_func
    q, k, v = leaves((2, 128, 4, 64), (2, 128, 4, 64), seed=3)
    do = torch.randn_like(q)
    grads = []
    for _ in range(2):
        for t in (q, k, v):
            t.grad = None
        fa(q, k, v, causal=True, deterministic=True).backward(do)
        grads.append([t.grad.clone() for t in (q, k, v)])
    assert all(torch.equal(a, b) for a, b in zip(*grads)), "deterministic=True: grads differ"
    with torch.no_grad():
        o = fa(q, k, v, causal=True)
        got = fa(q, k, v, causal=True, return_attn_probs=True)
        _, lse = flashcourse.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                       causal=True)
    assert isinstance(got, tuple) and len(got) == 3, type(got)
    o2, lse2, s_dmask = got
    assert torch.equal(o, o2)
    assert lse2.shape == (2, 4, 128) and lse2.dtype == torch.float32 and torch.equal(lse, lse2)
    assert s_dmask.numel() == 0, s_dmask.shape  # flash-attn 2 without dropout: empty
    for kw, word in ((dict(alibi_slopes=torch.ones(4, device="cuda")), "ALiBi"),
                     (dict(dropout_p=0.1), "dropout")):
        raises(NotImplementedError, fa, q, k, v, match=[FLASH_NAME, word], **kw)
    # window_size and softcap: checked values (flash-attn's defaults are no-ops)
    for kw, err in ((dict(window_size=(4,)), TypeError), (dict(window_size=(-2, 0)), ValueError),
                    (dict(softcap=-1.0), ValueError), (dict(softcap="3"), TypeError)):
        raises(err, fa, q, k, v, match=FLASH_NAME, **kw)
    with torch.no_grad():
        assert torch.equal(fa(q, k, v, causal=True, window_size=(-1, -1), softcap=0.0), o)
        assert torch.equal(fa(q, k, v, causal=True, window_size=[-1, -1], softcap=0), o)
    raises(ValueError, fa, q, k, v, deterministic=True, backward_variant="registers",
           match=FLASH_NAME)


def key_mask(N, N_k, causal, left, right, device="cuda"):
    """[N, N_k] bool: the keys each query attends to, by attention.h's rules (attn_shape_complete
    then attn_key_range): causal makes right 0; a bound at or past N_k, or negative, is
    unbounded, except an unbounded right beside a bounded left, which is N_k (flash-attn's);
    query i sees keys i + N_k - N - left .. i + N_k - N + right."""
    if causal:
        right = 0
    left = -1 if left < 0 or left >= N_k else left
    right = -1 if right < 0 or right >= N_k else right
    if left >= 0 and right < 0:
        right = N_k
    i = torch.arange(N, device=device)[:, None]
    j = torch.arange(N_k, device=device)[None, :]
    diag = i + N_k - N
    mask = torch.ones(N, N_k, dtype=torch.bool, device=device)
    if right >= 0:
        mask &= j <= diag + right
    if left >= 0:
        mask &= j >= diag - left
    return mask


def local_ref(q, k, v, causal, window, softcap, scale):
    """flash_attn_func's answer in float64 on q, k, v's values ([B, N, H, D], k and v [B, N_k,
    H_kv, D]): softmax over the window's keys of the capped scores, o = 0 where a row has no key;
    (o [B, N, H, D], lse [B, H, N], the float64 leaves) for autograd."""
    ref = [t.detach().double().requires_grad_(True) for t in (q, k, v)]
    qh, kh, vh = (t.transpose(1, 2) for t in ref)  # [B, H, N, D]
    group = qh.shape[1] // kh.shape[1]
    kh, vh = kh.repeat_interleave(group, 1), vh.repeat_interleave(group, 1)
    s = scale * qh @ kh.transpose(-1, -2)
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    mask = key_mask(qh.shape[2], kh.shape[2], causal, *window, device=q.device)
    s = s.masked_fill(~mask, float("-inf"))
    m = s.amax(-1, keepdim=True)
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m).detach()
    p = torch.exp(s - m)  # 0 where masked
    l = p.sum(-1, keepdim=True)
    o = (p @ vh) / torch.where(l > 0, l, torch.ones_like(l))
    lse = torch.where(l > 0, m + torch.log(l), torch.full_like(l, float("-inf")))[..., 0]
    return o.transpose(1, 2), lse, ref


def t_flash_attn_local():
    need_gpu()
    fa = flashcourse.flash_attn_func
    cases = (  # (N, N_k, H, H_kv, causal, window_size, softcap, dtype)
        (128, 128, 4, 4, False, (16, 16), 0.0, torch.float16),
        (200, 128, 4, 2, False, (0, 0), 0.0, torch.float16),  # rows with no key
        (64, 300, 8, 1, True, (100, 7), 0.0, torch.bfloat16),
        (130, 130, 4, 4, False, (-1, 40), 0.0, torch.float16),
        (96, 96, 4, 4, False, (-1, -1), 30.0, torch.float16),
        (96, 160, 6, 2, True, (-1, -1), 5.0, torch.bfloat16),
        (160, 96, 4, 4, False, (33, 3), 50.0, torch.float16),
        (300, 64, 4, 4, False, (20, -1), 0.0, torch.float16),  # right N_k: rows < 235 cut
    )
    for n, (N, N_k, H, H_kv, causal, window, cap, dtype) in enumerate(cases):
        q, k, v = leaves((2, N, H, 64), (2, N_k, H_kv, 64), dtype=dtype, seed=20 + n)
        with torch.no_grad():  # peaky scores, so that the cap bites
            q.mul_(8)
        label = (f"N={N} N_k={N_k} H={H}:{H_kv} causal={causal} window={window} softcap={cap} "
                 f"{dtype}")
        o, lse, s_dmask = fa(q, k, v, causal=causal, window_size=window, softcap=cap,
                             return_attn_probs=True)
        do = torch.randn_like(o)
        o.backward(do)
        ro, rlse, ref = local_ref(q, k, v, causal, window, cap, 64 ** -0.5)
        ro.backward(do.double())
        bad = [m for m in (miss(g, w, f"{label} {what}") for g, w, what in
                           zip([o, q.grad, k.grad, v.grad], [ro] + [t.grad for t in ref],
                               ("o", "dq", "dk", "dv"))) if m]
        assert not bad, "; ".join(bad)
        finite = torch.isfinite(rlse)
        assert torch.equal(torch.isfinite(lse), finite), f"{label}: lse -inf at other rows"
        assert miss(lse[finite], rlse[finite], f"{label} lse") is None, label
        # the window and the cap are read: the plain answer is outside the bound
        plain, _, _ = local_ref(q, k, v, causal, (-1, -1), 0.0, 64 ** -0.5)
        assert miss(o, plain, "plain") is not None, f"{label}: equal to the plain answer"
        for t in (q, k, v):
            t.grad = None
    # a stage that takes no local window or softcap refuses them, naming the function
    plain = [s.name for s in flashcourse.stages() if s.dtype == "float16" and
             not s.takes & flashcourse._library.TAKES_LOCAL]
    if plain:
        q, k, v = leaves((1, 64, 2, 64), (1, 64, 2, 64))
        with torch.no_grad():
            raises(ValueError, fa, q, k, v, window_size=(8, 8), stage=plain[0],
                   match=[FLASH_NAME, "local window"])
            raises(ValueError, fa, q, k, v, softcap=30.0, stage=plain[0],
                   match=[FLASH_NAME, "softcap"])


HEAD_DIMS = (40, 80, 96, 256)  # beside 64 and 128: each a multiple of 8 from 32 to 256


def t_head_dims():
    need_gpu()
    fa, sdpa = flashcourse.flash_attn_func, flashcourse.scaled_dot_product_attention
    dtypes = (torch.float16, torch.bfloat16) if torch.cuda.is_bf16_supported() else \
        (torch.float16,)
    n = 0
    for D in HEAD_DIMS:
        for dtype in dtypes:
            for causal in (False, True):
                n += 1
                label = f"D={D} {dtype} causal={causal}"
                # flash_attn_func: [B, N, H, D], grouped-query heads, more keys than queries
                q, k, v = leaves((2, 100, 4, D), (2, 130, 2, D), dtype=dtype, seed=300 + n)
                o, lse, _ = fa(q, k, v, causal=causal, return_attn_probs=True)
                do = torch.randn_like(o)
                o.backward(do)
                ro, rlse, ref = local_ref(q, k, v, causal, (-1, -1), 0.0, D ** -0.5)
                ro.backward(do.double())
                bad = [m for m in (miss(g, w, f"flash_attn_func {label} {what}") for g, w, what in
                                   zip([o, q.grad, k.grad, v.grad], [ro] + [t.grad for t in ref],
                                       ("o", "dq", "dk", "dv"))) if m]
                assert not bad, "; ".join(bad)
                assert miss(lse, rlse, f"{label} lse") is None, label
                if causal:  # the mask is read: the full answer is outside the bound
                    full, _, _ = local_ref(q, k, v, False, (-1, -1), 0.0, D ** -0.5)
                    assert miss(o, full, "full") is not None, f"{label}: equal to the full answer"
                # the SDPA drop-in: [B, H, L, D], is_causal aligned to the top left
                q, k, v = leaves((2, 3, 70, D), (2, 3, 90, D), dtype=dtype, seed=400 + n)
                compare(lambda q, k, v: sdpa(q, k, v, is_causal=causal), dict(is_causal=causal),
                        q, k, v, f"SDPA {label}", dict(is_causal=not causal))
    # outside the range (below, above, not a multiple of 8): a usage error naming the function
    for D in (24, 264, 100):
        q, k, v = leaves((1, 64, 2, D), (1, 64, 2, D))
        with torch.no_grad():
            for fn, name, args in ((fa, FLASH_NAME, (q, k, v)),
                                   (sdpa, SDPA_NAME, tuple(t.transpose(1, 2) for t in (q, k, v))),
                                   (flashcourse.attention, "flashcourse.attention",
                                    tuple(t.transpose(1, 2) for t in (q, k, v)))):
                raises(ValueError, fn, *args,
                       match=[name, f"head dim must be a multiple of 8 from 32 to 256 (got {D})"])
    # a head dim in the range that a stage did not compile: its reason, naming the function
    plain = [s.name for s in flashcourse.stages() if s.name.startswith("stage4")]
    if plain:
        q, k, v = leaves((1, 64, 2, 96), (1, 64, 2, 96))
        with torch.no_grad():
            raises(ValueError, fa, q, k, v, stage=plain[0],
                   match=[FLASH_NAME, plain[0], "head dim must be 64 or 128"])


def t_errors_name_the_function():
    need_gpu()
    sdpa, fa = flashcourse.scaled_dot_product_attention, flashcourse.flash_attn_func
    q, k, v = leaves((1, 2, 64, 64), (1, 2, 64, 64))
    raises(TypeError, sdpa, q.cpu(), k, v, match=[SDPA_NAME, "CUDA", "cpu"])
    raises(TypeError, sdpa, q.tolist(), k, v, match=[SDPA_NAME, "torch tensors"])
    raises(NotImplementedError, sdpa, q, k, v, attn_mask=torch.ones(64, 64, device="cuda"),
           match=[SDPA_NAME, "attn_mask"])
    raises(ValueError, sdpa, q, k, v, attn_mask=torch.ones(64, 64, device="cuda"),
           is_causal=True, match=SDPA_NAME)
    q100, k100, v100 = leaves((1, 2, 64, 100), (1, 2, 64, 100))  # not a head dim
    raises(ValueError, sdpa, q100, k100, v100, match=[SDPA_NAME, "head dim"])
    raises(ValueError, sdpa, q, k[:, :, :32], v, match=SDPA_NAME)
    raises(TypeError, sdpa, q, k, v, scale="big", match=[SDPA_NAME, "scale"])
    raises(TypeError, sdpa, q, k, v, is_causal="yes", match=[SDPA_NAME, "causal"])
    qf = q.transpose(1, 2)
    raises(TypeError, fa, qf.cpu(), qf, qf, match=[FLASH_NAME, "CUDA"])
    raises(ValueError, fa, qf[0], qf, qf, match=[FLASH_NAME, "[B, N, H, D]"])
    raises(ValueError, fa, qf.detach()[..., :24].contiguous(), qf.detach()[..., :24].contiguous(),
           qf.detach()[..., :24].contiguous(), match=[FLASH_NAME, "head dim"])
    raises(TypeError, flashcourse.attention, q.cpu(), k, v, match=["flashcourse.attention", "cpu"])


def t_empty():
    need_gpu()
    sdpa = flashcourse.scaled_dot_product_attention
    for (B, H, L, S) in ((0, 2, 16, 16), (2, 0, 16, 16), (2, 2, 0, 16), (2, 2, 16, 0),
                         (2, 2, 0, 0)):
        q, k, v = leaves((B, H, L, 64), (B, H, S, 64))
        with torch.no_grad():
            o, lse = flashcourse.attention(q, k, v)
        assert lse.shape == (B, H, L) and lse.dtype == torch.float32
        assert bool((lse == float("-inf")).all()), lse  # no key: lse -inf (attention.h)
        for causal in (False, True):
            q, k, v = leaves((B, H, L, 64), (B, H, S, 64))
            o = sdpa(q, k, v, is_causal=causal)
            ro, ref = sdpa_ref(q, k, v, is_causal=causal)
            assert o.shape == ro.shape and o.dtype == q.dtype, (o.shape, ro.shape)
            assert torch.equal(o.float(), torch.zeros_like(ro)), "zeros, as torch returns"
            o.sum().backward()
            for t in (q, k, v):
                assert t.grad is not None and t.grad.shape == t.shape and \
                    not t.grad.any(), (B, H, L, S, t.grad)


def t_over_the_grid_limit():
    need_gpu()
    limit = flashcourse._library.stage_library(flashcourse.auto_stage()).limits["max_bh"]
    sdpa = flashcourse.scaled_dot_product_attention
    # B x H over the limit along the batch (with gradients), and one batch's heads over it
    for shape, grad in (((limit // 2 + 3, 2, 16, 64), True), ((1, limit + 5, 16, 64), False)):
        shape_q = shape_kv = shape
        q, k, v = leaves(shape_q, shape_kv, seed=5)
        if not grad:
            with torch.no_grad():
                o = sdpa(q, k, v, is_causal=True)
                ro, _ = sdpa_ref(q, k, v, is_causal=True)
            m = miss(o, ro, f"B, H = {shape_q[:2]}")
            assert m is None, m
            continue
        compare(lambda q, k, v: sdpa(q, k, v, is_causal=True), dict(is_causal=True), q, k, v,
                f"B, H = {shape_q[:2]}")


def main():
    print(f"flashcourse drop-in tests: torch {torch.__version__ if torch else 'absent'}, GPU "
          f"{torch.cuda.get_device_name() if HAVE_GPU else 'none'}")
    run("SDPA drop-in: is_causal with L != S aligned top-left as SDPA, forward and gradients",
        t_sdpa_causal_top_left)
    run("SDPA drop-in: causal_lower_right / causal_upper_left masks as SDPA", t_sdpa_causal_bias)
    run("SDPA drop-in: float32 inputs under autocast as SDPA; outside it one TypeError",
        t_sdpa_autocast)
    run("SDPA drop-in: grouped-query heads (enable_gqa=True) as SDPA", t_sdpa_gqa)
    run("flash_attn_func: deterministic, return_attn_probs, the keywords it refuses",
        t_flash_attn_keywords)
    run("flash_attn_func: window_size and softcap against a float64 masked, capped softmax, "
        "forward and gradients (GQA, bf16, N_k != N)", t_flash_attn_local)
    run("head dims 40, 80, 96, 256: flash_attn_func and the SDPA drop-in, fp16 and bf16, causal "
        "and not, forward and gradients vs float64; 24, 264, 100 refused naming the function",
        t_head_dims)
    run("errors name the function called", t_errors_name_the_function)
    run("empty batches, heads, queries or keys: zeros as torch, zero-size gradients", t_empty)
    run("B x H over the kernels' limit: in parts, equal to SDPA", t_over_the_grid_limit)
    return summary()


if __name__ == "__main__":
    sys.exit(main())
