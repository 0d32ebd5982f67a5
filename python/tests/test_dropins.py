#!/usr/bin/env python3
"""The drop-ins against their originals: flashcourse.scaled_dot_product_attention against
torch.nn.functional.scaled_dot_product_attention, flash_attn_func's keywords as flash-attn 2 takes
them and its LSE as flash-attn 2 returns it (+inf for a row that sees no key), errors naming the
function called, empty problems and B x H over the kernels' limit.

    PYTHONPATH=python python3 python/tests/test_dropins.py

Each comparison is against torch's SDPA in float32 on the same (rounded) inputs, forward and
gradients, with a bound a wrong mask cannot meet (each test also checks that the other mask's
answer is outside it). Without a GPU or PyTorch every test prints SKIP. Ends with "N passed, M
failed, K skipped".
"""

import os
import sys

from harness import (Skip, assert_within, check_flash_lse, key_mask, miss, need_gpu, raiser, run,
                     setup, softmax_ref, summary)

torch, HAVE_GPU = setup()
import flashcourse  # noqa: E402

F = torch.nn.functional if torch is not None else None

SDPA_NAME, FLASH_NAME = "flashcourse.scaled_dot_product_attention", "flashcourse.flash_attn_func"

raises = raiser("'auto'", " auto ", "_attention_checked")


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


def compare(ours_fn, ref_kw, q, k, v, label, other_kw=None):
    """ours_fn(q, k, v) against SDPA(**ref_kw) forward and gradients; other_kw: a mask whose
    answer must differ (so that a wrong alignment fails)."""
    o = ours_fn(q, k, v)
    do = torch.randn_like(o)
    o.backward(do)
    ours = [o] + [t.grad for t in (q, k, v)]
    ro, ref = sdpa_ref(q, k, v, **ref_kw)
    ro.backward(do.float())
    assert_within(ours, [ro] + [t.grad for t in ref], label)
    if other_kw is not None:
        other, _ = sdpa_ref(q, k, v, **other_kw)
        assert miss(o, other, "the other mask") is not None, \
            f"{label}: the other mask's answer is within the bound: the test could not fail"


def t_returned_lse():
    # with PyTorch, no GPU needed (the stages' answer stood in for): the LSE the flash-attn
    # drop-ins return is +inf where the stages' is -inf (a row that sees no key), as flash-attn
    # returns it, only where the caller asked for it, and a new tensor: the stages' own (which
    # the backward pass reads) keeps -inf; check_flash_lse holds it to that
    if torch is None:
        raise Skip("no PyTorch here")
    from flashcourse import dropins, varlen
    inf = float("inf")
    lse = torch.tensor([[[-inf, 0.5, 2.0, -inf]]])  # [B, H, N] = [1, 1, 4]: rows 0 and 3 see none
    want = torch.tensor([[[inf, 0.5, 2.0, inf]]])
    q = torch.zeros(1, 4, 1, 8)  # [B, N, H, D]
    o = torch.zeros(1, 1, 4, 8)  # [B, H, N, D], as the stages return it
    saved = dropins._attend, varlen._attend, dropins._kvcache_checked
    dropins._attend = lambda who, q, k, v, *rest: (o, lse)
    varlen._attend = lambda who, q, k, v, cu_q, cu_k, given: (o[0].transpose(0, 1), lse[0])
    dropins._kvcache_checked = lambda *args: (q, lse)
    cu = torch.tensor([0, 4], dtype=torch.int32)
    try:
        for name, call, got_lse in (
                ("flash_attn_func", lambda probs: flashcourse.flash_attn_func(
                    q, q, q, return_attn_probs=probs), lambda r: r[1]),
                ("flash_attn_varlen_func", lambda probs: flashcourse.flash_attn_varlen_func(
                    q[0], q[0], q[0], cu, cu, 4, 4, return_attn_probs=probs),
                 lambda r: r[1][None]),
                ("flash_attn_with_kvcache", lambda probs: flashcourse.flash_attn_with_kvcache(
                    q, q, q, return_softmax_lse=probs), lambda r: r[1])):
            assert isinstance(call(False), torch.Tensor), f"{name}: o alone unless asked"
            got = got_lse(call(True))
            assert torch.equal(got, want), f"{name}: {got} != {want}"
            assert torch.equal(lse, torch.tensor([[[-inf, 0.5, 2.0, -inf]]])), \
                f"{name} changed the stages' own LSE"
            check_flash_lse(got, lse.double(), name)
    finally:
        dropins._attend, varlen._attend, dropins._kvcache_checked = saved
    for bad, why in ((lse, "-inf"), (torch.tensor([[[inf, 0.5, inf, inf]]]), "+inf at other"),
                     (torch.tensor([[[inf, 0.5, 9.0, inf]]]), "max error")):
        try:
            check_flash_lse(bad, lse.double(), "bad")
        except AssertionError as e:
            assert why in str(e), (why, e)
        else:
            raise AssertionError(f"check_flash_lse passed {bad}")


class SpyCalls(dict):
    """A call cache that records the keys looked up and answers each with `call` (None: a
    miss)."""

    def __init__(self, call=None):
        super().__init__()
        self.keys, self.call = [], call

    def get(self, key, default=None):
        self.keys.append(key)
        return self.call


def t_lookup_first():
    # with PyTorch, no GPU needed: flash_attn_func and flash_attn_varlen_func look their call up
    # first, keyed on what the caller passed, and a cached call runs on q, k, v as they are (the
    # very tensors: no transposes, no checks; o made contiguous); arguments equal as keys but not
    # as arguments (4.0 and 4, 1.0 and True) make other keys, so the checks still refuse them;
    # dropout and ALiBi never reach the cache
    if torch is None:
        raise Skip("no PyTorch here")
    from flashcourse import _run
    inf = float("inf")
    q = torch.zeros(1, 4, 2, 8)  # [B, N, H, D]
    lse = torch.tensor([[[-inf, 0.5, 2.0, -inf]] * 2])  # [B, H, N]
    ran = []

    def call(*args):
        ran.append(args)
        return torch.zeros(1, 2, 4, 8).transpose(1, 2), lse  # o [B, N, H, D], not contiguous

    fa, varlen = flashcourse.flash_attn_func, flashcourse.flash_attn_varlen_func
    cu = torch.tensor([0, 4], dtype=torch.int32)
    saved = _run.calls
    try:
        _run.calls = spy = SpyCalls(call)
        o = fa(q, q, q, causal=True, window_size=(4, 4))
        assert len(ran) == 1 and all(a is q for a in ran[0]), "not the tensors as given"
        assert o.shape == (1, 4, 2, 8) and o.is_contiguous()
        o, got, s_dmask = fa(q, q, q, causal=True, window_size=(4, 4), return_attn_probs=True)
        assert torch.equal(got, lse.masked_fill(lse == -inf, inf)) and s_dmask.numel() == 0
        packed = q[0]  # [total, H, D]
        varlen(packed, packed, packed, cu, cu, 4, 4, causal=True)
        assert len(ran) == 3 and all(a is b for a, b in zip(ran[2], (packed,) * 3 + (cu, cu)))
        # one key per combination of what was passed (a list window's too: kept as well)
        for fn, args in ((fa, (q, q, q)), (varlen, (packed, packed, packed, cu, cu, 4, 4))):
            spy.keys = []
            for kw in (dict(window_size=(4, 4)), dict(window_size=[4, 4]),
                       dict(window_size=(4.0, 4)), dict(causal=1.0), dict(causal=True),
                       dict(softcap=1), dict(softcap=True)):
                fn(*args, **kw)
            k = spy.keys
            hash(k[1])  # a list window: a key all the same
            assert k[2] != k[0] and k[3] != k[4] and k[5] != k[6], f"{fn.__name__}: equal keys"
        # $FLASHCOURSE_LIB_DIR set, changed, unset: three keys (another folder, other libraries)
        spy.keys = []
        old = os.environ.get("FLASHCOURSE_LIB_DIR")
        try:
            for d in ("/libs/a", "/libs/b", None):
                os.environ.pop("FLASHCOURSE_LIB_DIR", None)
                if d is not None:
                    os.environ["FLASHCOURSE_LIB_DIR"] = d
                fa(q, q, q)
        finally:
            os.environ.pop("FLASHCOURSE_LIB_DIR", None)
            if old is not None:
                os.environ["FLASHCOURSE_LIB_DIR"] = old
        assert len(set(spy.keys)) == 3, "the key does not follow FLASHCOURSE_LIB_DIR"
        # a window of three sides makes no key: the checks refuse it, the cached call never runs
        ran.clear()
        raises(TypeError, fa, q, q, q, window_size=(1, 2, 3), match=[FLASH_NAME, "window_size"])
        assert not ran, "a window of three sides ran a cached call"
        # a miss: every check as before, errors naming the function
        _run.calls = SpyCalls()
        for kw, exc in ((dict(window_size=(4.0, 4)), TypeError), (dict(causal=1.0), TypeError),
                        (dict(softcap=True), TypeError)):
            raises(exc, fa, q, q, q, match=FLASH_NAME, **kw)
            raises(exc, varlen, packed, packed, packed, cu, cu, 4, 4,
                   match="flashcourse.flash_attn_varlen_func", **kw)
        _run.calls = spy = SpyCalls(call)
        raises(NotImplementedError, fa, q, q, q, dropout_p=0.1, match=[FLASH_NAME, "dropout"])
        raises(NotImplementedError, fa, q, q, q, alibi_slopes=q, match=[FLASH_NAME, "ALiBi"])
        raises(NotImplementedError, varlen, packed, packed, packed, cu, cu, 4, 4, dropout_p=0.1,
               match="dropout")
        assert not spy.keys, "dropout or ALiBi looked up"
    finally:
        _run.calls = saved


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
    # causal with N > N_k: the first N - N_k rows see no key; flash-attn returns their lse as
    # +inf, attention() as the course's -inf, and the backward pass is the same either way
    N, N_k, none = 96, 40, 56
    q3, k3, v3 = leaves((2, N, 4, 64), (2, N_k, 2, 64), seed=4)
    do3 = torch.randn_like(q3)
    grads = []
    for probs in (True, False):
        for t in (q3, k3, v3):
            t.grad = None
        out = fa(q3, k3, v3, causal=True, deterministic=True, return_attn_probs=probs)
        (out[0] if probs else out).backward(do3)
        grads.append([t.grad.clone() for t in (q3, k3, v3)])
        if probs:
            lse3 = out[1]
    assert all(torch.equal(a, b) for a, b in zip(*grads)), "return_attn_probs: other gradients"
    with torch.no_grad():
        _, course = flashcourse.attention(*(t.transpose(1, 2) for t in (q3, k3, v3)), causal=True)
    assert bool((course[:, :, :none] == float("-inf")).all()), "attention(): -inf (attention.h)"
    assert bool((lse3[:, :, :none] == float("inf")).all()), lse3[:, :, :none]
    assert torch.equal(lse3[:, :, none:], course[:, :, none:]) and \
        bool(lse3[:, :, none:].isfinite().all())
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


def _transposes(o) -> int:
    """The TransposeBackward nodes between o and the leaves."""
    seen, stack, n = set(), [o.grad_fn], 0
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        n += "Transpose" in node.name()
        stack.extend(f for f, _ in node.next_functions)
    return n


def t_flash_attn_cached():
    need_gpu()
    # flash_attn_func's cached call runs on its [B, N, H, D] tensors as they are: its first
    # (checked) call, its cached calls, attention() on the [B, H, N, D] views and the Python
    # path give bit-identical o, lse and (deterministic) gradients, in four layouts, o
    # contiguous; a cached call takes no checked path and, by the C++ operator, adds no
    # transpose to the autograd graph
    from flashcourse import _run, dropins
    fa = flashcourse.flash_attn_func
    B, N, N_k, H, H_kv, D = 2, 200, 260, 4, 2, 64
    g = torch.Generator(device="cuda").manual_seed(77)

    def r(*shape):
        return torch.randn(shape, generator=g, device="cuda").half()

    layouts = {  # name: (the leaves' values, q, k, v [B, N, H, D] of the leaves)
        "contiguous": ([r(B, N, H, D), r(B, N_k, H_kv, D), r(B, N_k, H_kv, D)], lambda b: b),
        "[B, H, N, D] memory": ([r(B, H, N, D), r(B, H_kv, N_k, D), r(B, H_kv, N_k, D)],
                                lambda b: [t.transpose(1, 2) for t in b]),
        "a fused projection": ([r(B, N, 3, H, D)], lambda b: list(b[0].unbind(2))),
        "padded rows": ([r(B, N, H, D + 16), r(B, N_k, H_kv, D + 16), r(B, N_k, H_kv, D + 16)],
                        lambda b: [t[..., :D] for t in b]),
    }
    cpp = flashcourse.eager_path().startswith("C++")
    checked, real = [], dropins._attend

    def counting(*args, **kw):
        checked.append(args)
        return real(*args, **kw)

    def flash(q, k, v):
        o, lse, _ = fa(q, k, v, causal=True, deterministic=True, return_attn_probs=True)
        assert o.is_contiguous() and lse.shape == (B, H, N), (o.stride(), lse.shape)
        return o, lse

    def course(q, k, v):
        o, lse = flashcourse.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                       causal=True, backward_variant="deterministic")
        return o.transpose(1, 2), lse

    dropins._attend = counting
    try:
        for name, (values, view) in layouts.items():
            do = r(B, N, H, D)

            def once(fn):
                leaves = [t.clone().requires_grad_(True) for t in values]
                o, lse = fn(*view(leaves))
                o.backward(do)
                return [o.detach(), lse] + [t.grad for t in leaves], o

            n = len(checked)
            first, _ = once(flash)
            assert len(checked) == n + 1, f"{name}: the first call was not checked"
            second, o = once(flash)
            assert len(checked) == n + 1, f"{name}: a repeated call took the checked path"
            if cpp and name != "[B, H, N, D] memory":  # (there the caller's views transpose)
                assert _transposes(o) == 0, f"{name}: transposes in the cached call's graph"
            runs = {"cached": second, "attention()": once(course)[0]}
            with _run.PythonPath():
                runs["Python path, checked"] = once(flash)[0]
                runs["Python path, cached"] = once(flash)[0]
            for what, got in runs.items():
                for x, y, part in zip(first, got, ("o", "lse", "grad 0", "grad 1", "grad 2")):
                    assert torch.equal(x, y), f"{name}: {what}: {part} differs"
    finally:
        dropins._attend = real


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
    o, lse = softmax_ref(s, key_mask(qh.shape[2], kh.shape[2], causal, *window,
                                     device=q.device), vh)
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
        assert_within([o, q.grad, k.grad, v.grad], [ro] + [t.grad for t in ref], label)
        check_flash_lse(lse, rlse, label)  # +inf where a row sees no key, as flash-attn's
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
                assert_within([o, q.grad, k.grad, v.grad], [ro] + [t.grad for t in ref],
                              f"flash_attn_func {label}")
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
        with torch.no_grad():  # flash-attn's: +inf (its fill where there are no keys)
            o, lse, _ = flashcourse.flash_attn_func(*(t.transpose(1, 2) for t in (q, k, v)),
                                                    return_attn_probs=True)
        assert o.shape == (B, L, H, 64) and not o.any(), o.shape
        assert lse.shape == (B, H, L) and bool((lse == float("inf")).all()), lse
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
    run("flash-attn drop-ins return the LSE as flash-attn: +inf where the stages' is -inf, a "
        "copy, only when asked (the stages stood in for)", t_returned_lse)
    run("flash_attn_func and flash_attn_varlen_func look their call up first, keyed on what was "
        "passed (types too), and run it on the tensors as given (a spy cache)", t_lookup_first)
    run("SDPA drop-in: is_causal with L != S aligned top-left as SDPA, forward and gradients",
        t_sdpa_causal_top_left)
    run("SDPA drop-in: causal_lower_right / causal_upper_left masks as SDPA", t_sdpa_causal_bias)
    run("SDPA drop-in: float32 inputs under autocast as SDPA; outside it one TypeError",
        t_sdpa_autocast)
    run("SDPA drop-in: grouped-query heads (enable_gqa=True) as SDPA", t_sdpa_gqa)
    run("flash_attn_func: deterministic, return_attn_probs (lse +inf where a row sees no key, "
        "as flash-attn's), the keywords it refuses", t_flash_attn_keywords)
    run("flash_attn_func: its cached call on [B, N, H, D] tensors as they are (no transposes): "
        "bit-identical to its first call, attention() and the Python path, in four layouts",
        t_flash_attn_cached)
    run("flash_attn_func: window_size and softcap against a float64 masked, capped softmax, "
        "forward and gradients (GQA, bf16, N_k != N)", t_flash_attn_local)
    run("head dims 40, 80, 96, 256: flash_attn_func and the SDPA drop-in, fp16 and bf16, causal "
        "and not, forward and gradients vs float64; 24, 264, 100 refused naming the function",
        t_head_dims)
    run("errors name the function called", t_errors_name_the_function)
    run("empty batches, heads, queries or keys: zeros as torch, zero-size gradients; "
        "flash_attn_func's lse +inf as flash-attn's", t_empty)
    run("B x H over the kernels' limit: in parts, equal to SDPA", t_over_the_grid_limit)
    return summary()


if __name__ == "__main__":
    sys.exit(main())
