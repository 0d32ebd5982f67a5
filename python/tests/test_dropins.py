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
    for kw, word in ((dict(window_size=(4, 4)), "window"), (dict(softcap=1.0), "softcap"),
                     (dict(alibi_slopes=torch.ones(4, device="cuda")), "ALiBi"),
                     (dict(dropout_p=0.1), "dropout")):
        raises(NotImplementedError, fa, q, k, v, match=[FLASH_NAME, word], **kw)
    raises(ValueError, fa, q, k, v, deterministic=True, backward_variant="registers",
           match=FLASH_NAME)


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
    q96, k96, v96 = leaves((1, 2, 64, 96), (1, 2, 64, 96))
    raises(ValueError, sdpa, q96, k96, v96, match=SDPA_NAME)
    raises(ValueError, sdpa, q, k[:, :, :32], v, match=SDPA_NAME)
    raises(TypeError, sdpa, q, k, v, scale="big", match=[SDPA_NAME, "scale"])
    raises(TypeError, sdpa, q, k, v, is_causal="yes", match=[SDPA_NAME, "causal"])
    qf = q.transpose(1, 2)
    raises(TypeError, fa, qf.cpu(), qf, qf, match=[FLASH_NAME, "CUDA"])
    raises(ValueError, fa, qf[0], qf, qf, match=[FLASH_NAME, "[B, N, H, D]"])
    raises(ValueError, fa, qf.detach()[..., :32].contiguous(), qf.detach()[..., :32].contiguous(),
           qf.detach()[..., :32].contiguous(), match=FLASH_NAME)
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
    run("errors name the function called", t_errors_name_the_function)
    run("empty batches, heads, queries or keys: zeros as torch, zero-size gradients", t_empty)
    run("B x H over the kernels' limit: in parts, equal to SDPA", t_over_the_grid_limit)
    return summary()


if __name__ == "__main__":
    sys.exit(main())
