#!/usr/bin/env python3
"""flashcourse.flash_attn_varlen_func (packed batches of sequences of different lengths) and the
library's packed entry (common/attn_lib.h at ABI 9: the request's varlen, total_q, total_k; the
runs' cu_seqlens_q, cu_seqlens_k).

    PYTHONPATH=python python3 python/tests/test_varlen.py

Anywhere (no GPU, no PyTorch needed): flash-attn 2's parameter list; what the stages do not
compute (dropout, ALiBi, a block table) refused naming the function and the argument; the
scalar arguments' checks (max_seqlen an int, window_size, softcap, deterministic); the ctypes
prototypes of the entry points as attn_lib.h declares them; the packed request through a library
linked here from common/attn_lib.c and a fake stage (refused by a stage that does not take it;
on a GPU: what the stage is told at plan time and at run time). With PyTorch and no GPU: the
tensors' checks. On a GPU, against a float64 reference computed sequence by sequence: random
lengths with 0, 1 and over 4,096 (fixed seeds), N_q != N_k per sequence, sequences without keys,
causal and not, windows, softcap, GQA, bf16, D 64, 96, 128, 256, a fused projection's strided
views, forward, lse (+inf for a row without keys, as flash-attn's) and gradients;
deterministic gradients; return_attn_probs; empty batches; B x H over the grid's limit; 1,000
short documents beside a long one (the workspace scales with the tokens); the call cache, no
synchronisation, a CUDA graph replayed with new lengths, torch.compile, the C++ eager operator
against the Python path; bad tensors. Ends with "N passed, M failed, K skipped".
"""

import ctypes
import inspect
import random
import re
import sys
from types import SimpleNamespace

from harness import (REPO, Skip, assert_within, check_flash_lse, fake_stage_library, key_mask,
                     miss, need_gpu, raiser, run, setup, softmax_ref, summary)

torch, HAVE_GPU = setup()
import flashcourse  # noqa: E402
from flashcourse import _library, _plans, _run, varlen  # noqa: E402

WHO = "flashcourse.flash_attn_varlen_func"
fa_varlen = flashcourse.flash_attn_varlen_func

# flash-attn 2's flash_attn_varlen_func (flash_attn/flash_attn_interface.py): name, default
EMPTY = inspect.Parameter.empty
FLASH_ATTN_PARAMS = [
    ("q", EMPTY), ("k", EMPTY), ("v", EMPTY), ("cu_seqlens_q", EMPTY), ("cu_seqlens_k", EMPTY),
    ("max_seqlen_q", EMPTY), ("max_seqlen_k", EMPTY), ("dropout_p", 0.0),
    ("softmax_scale", None), ("causal", False), ("window_size", (-1, -1)), ("softcap", 0.0),
    ("alibi_slopes", None), ("deterministic", False), ("return_attn_probs", False),
    ("block_table", None)]

raises = raiser("'auto'", "_checked", "_attend")


# ---- anywhere ----

def t_signature():
    got = [(p.name, p.default) for p in inspect.signature(fa_varlen).parameters.values()
           if p.kind == p.POSITIONAL_OR_KEYWORD]
    assert got == FLASH_ATTN_PARAMS, got
    kw = [p.name for p in inspect.signature(fa_varlen).parameters.values()
          if p.kind == p.KEYWORD_ONLY]
    assert kw == ["stage", "backward_stage", "backward_variant"], kw
    assert "flash_attn_varlen_func" in flashcourse.__all__


def _no_torch_after(fn):
    """fn() passes every scalar check: it then needs PyTorch (ImportError without it) or raises
    on its tensors (None here: TypeError)."""
    if torch is None:
        raises(ImportError, fn, match="install torch")
    else:
        raises(TypeError, fn, match=[WHO, "torch tensors"])


def t_refused():
    # before any tensor is looked at: None stands for each
    args = (None,) * 5 + (8, 8)
    for kw, words in ((dict(dropout_p=0.1), "dropout_p"),
                      (dict(alibi_slopes=[1.0]), "alibi_slopes"),
                      (dict(block_table=[[0]]), "block_table")):
        raises(NotImplementedError, fa_varlen, *args, match=[WHO, words], **kw)
    # flash-attn's defaults are taken (they do nothing); return_attn_probs is no refusal
    _no_torch_after(lambda: fa_varlen(*args, dropout_p=0.0, alibi_slopes=None, block_table=None,
                                      window_size=[-1, -1], softcap=0, return_attn_probs=True))


def t_scalar_checks():
    args = (None,) * 5
    for max_q, max_k, exc, words in (("8", 8, TypeError, ["max_seqlen_q", "int"]),
                                     (8, 8.0, TypeError, ["max_seqlen_k", "int"]),
                                     (True, 8, TypeError, ["max_seqlen_q", "int"]),
                                     (None, 8, TypeError, ["max_seqlen_q"]),
                                     (-1, 8, ValueError, ["max_seqlen_q", "-1"]),
                                     (8, 2**31, ValueError, ["max_seqlen_k"])):
        raises(exc, fa_varlen, *args, max_q, max_k, match=[WHO] + words)
    for kw, exc in ((dict(window_size=(4,)), TypeError), (dict(window_size=(-2, 0)), ValueError),
                    (dict(softcap=-1.0), ValueError), (dict(softcap="3"), TypeError),
                    (dict(causal="yes"), TypeError), (dict(stage=5), TypeError)):
        raises(exc, fa_varlen, *args, 8, 8, match=WHO, **kw)
    raises(ValueError, fa_varlen, *args, 8, 8, deterministic=True, backward_variant="registers",
           match=[WHO, "deterministic"])
    _no_torch_after(lambda: fa_varlen(*args, 0, 0))  # max_seqlen 0: a degenerate batch, an int
    try:
        import numpy
    except ImportError:
        return
    _no_torch_after(lambda: fa_varlen(*args, numpy.int64(8), numpy.int32(3)))  # integers
    raises(TypeError, fa_varlen, *args, numpy.float64(8), 8, match=[WHO, "max_seqlen_q"])


def _params(header: str, name: str) -> int:
    """How many parameters the function `name` takes in the C header's text."""
    m = re.search(rf"\b{name}\(([^)]*)\)\s*;", header)
    assert m, f"no {name} in attn_lib.h"
    return len(m.group(1).split(","))


def t_prototypes():
    # the entry points as ctypes declares them (_library._declare) and as attn_lib.h declares
    # them: as many parameters, cu_seqlens_q and cu_seqlens_k before the workspace; the ABI
    # numbers of the header, the binding and the eager operator agree
    header = (REPO / "common" / "attn_lib.h").read_text()
    abi = int(re.search(r"#define ATTN_LIB_ABI (\d+)", header).group(1))
    assert abi == _library.ABI == 9, (abi, _library.ABI)
    fake = SimpleNamespace(**{n: SimpleNamespace() for n in (
        "attn_lib_plan", "attn_lib_forward", "attn_lib_backward", "attn_lib_decode",
        "attn_lib_plan_bytes", "attn_lib_last_error", "attn_lib_exit_codes", "attn_lib_limits")})
    _library._declare(fake)
    for name in ("attn_lib_plan", "attn_lib_forward", "attn_lib_backward", "attn_lib_decode"):
        got = len(getattr(fake, name).argtypes)
        assert got == _params(header, name), f"{name}: ctypes {got}, attn_lib.h " \
                                             f"{_params(header, name)}"
    for name, before in (("attn_lib_forward", "void \\*workspace"),
                         ("attn_lib_backward", "void \\*workspace")):
        m = re.search(rf"\b{name}\(([^)]*)\)", header)
        assert re.search(r"const int \*cu_seqlens_q,\s*const int \*cu_seqlens_k,\s*" + before,
                         m.group(1)), f"{name}: cu_seqlens_q, cu_seqlens_k before the workspace"
    eager = (REPO / "python" / "flashcourse" / "_eager.cpp").read_text()
    got = int(re.search(r"constexpr int64_t EAGER_ABI = (\d+);", eager).group(1))
    assert got == _run._EAGER_ABI, f"_eager.cpp's EAGER_ABI {got}, _run's {_run._EAGER_ABI}"
    assert "attention_varlen(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q" in eager


def t_request():
    # _plans.request: a packed batch's request (varlen 1, its totals) and a plain one (all zero)
    g = (3, 4, 50, 64, 2, 70, None)
    r = _plans.request(False, 0, g, True, 0.125, 0, 0, False, varlen=(120, 150))
    assert (r.varlen, r.total_q, r.total_k, r.B, r.N, r.N_k) == (1, 120, 150, 3, 50, 70)
    r = _plans.request(True, 0, g, True, 0.125, 0, 0, False)
    assert (r.varlen, r.total_q, r.total_k) == (0, 0, 0)


def t_remember():
    # _run.remember: how attention(), flash_attn_varlen_func and flash_attn_with_kvcache keep a
    # checked call; not where the scale is neither None, an int nor a float (a 0-d tensor hashes
    # by identity), nor where the key cannot be made or hashed (checked every call, no error);
    # the default cache is _run.calls (a PythonPath block's own inside one); full, it starts over
    cache = {}
    for key, scale in ((("a", 1), None), (("b",), 0.5), (("c",), 2)):
        _run.remember(lambda: key, f"call {key[0]}", scale, cache)
    assert cache == {("a", 1): "call a", ("b",): "call b", ("c",): "call c"}, cache

    def unmade():
        raise TypeError("an unhashable argument")

    for key_of, scale in ((lambda: ("d",), object()), (lambda: ("e",), True),
                          (lambda: ("f", [1]), None), (unmade, None)):
        _run.remember(key_of, "not kept", scale, cache)
    assert len(cache) == 3, cache
    before = dict(_run.calls)
    with _run.PythonPath() as block:
        _run.remember(lambda: ("x",), "call x", None)
        assert block.calls == {("x",): "call x"}, block.calls
    assert _run.calls == before
    full = {(i,): i for i in range(_plans.PLANS_MAX)}
    _run.remember(lambda: ("new",), "call new", None, full)
    assert full == {("new",): "call new"}


# A fake stage: it runs nothing. Its unsupported() describes the shape the plan completed (for
# B = 7: refused with the facts); its passes return cudaSuccess only for the sequences' pointers
# the test passes (SEQ_Q, SEQ_K), or none for a plain plan.
FAKE_STAGE_C = r"""
#include <stdio.h>
#include "attention.h"
#define SEQ_Q ((const int *)0x1000)
#define SEQ_K ((const int *)0x2000)
static char facts[256];
static const char *unsupported(const attn_shape *s, const attn_device *d, int v) {
    (void)d; (void)v;
    if (s->B != 7) return NULL;
    snprintf(facts, sizeof facts,
             "saw packed=%d B=%d N=%d N_k=%d total_q=%d total_k=%d q=%lld,%lld,%lld "
             "k=%lld,%lld,%lld", s->varlen.cu_seqlens_q != NULL && s->varlen.cu_seqlens_k != NULL,
             s->B, s->N, s->N_k, s->varlen.total_q, s->varlen.total_k, s->q.batch, s->q.head,
             s->q.row, s->k.batch, s->k.head, s->k.row);
    return facts;
}
static size_t ws(const attn_shape *s, const attn_device *d, int v) {
    (void)d; (void)v;
    return 16 + (s->varlen.cu_seqlens_q != NULL);
}
static cudaError_t seen(const attn_shape *s) {
    const int packed = s->varlen.cu_seqlens_q == SEQ_Q && s->varlen.cu_seqlens_k == SEQ_K;
    const int plain = s->varlen.cu_seqlens_q == NULL && s->varlen.cu_seqlens_k == NULL;
    return packed || plain ? cudaSuccess : cudaErrorInvalidValue;
}
static cudaError_t fwd(const attn_shape *s, const attn_device *d, const void *Q, const void *K,
                       const void *V, void *O, float *lse, void *w, int v, cudaStream_t st) {
    (void)d; (void)Q; (void)K; (void)V; (void)O; (void)lse; (void)w; (void)v; (void)st;
    return seen(s);
}
static cudaError_t bwd(const attn_shape *s, const attn_device *d, const void *Q, const void *K,
                       const void *V, const void *O, const float *lse, const void *dO, void *dQ,
                       void *dK, void *dV, void *w, int v, cudaStream_t st) {
    (void)d; (void)Q; (void)K; (void)V; (void)O; (void)lse; (void)dO; (void)dQ; (void)dK;
    (void)dV; (void)w; (void)v; (void)st;
    return seen(s);
}
const attn_stage attn_this_stage = {NAME, "a fake stage for the library's tests", ATTN_F16,
                                    "default", unsupported, ws, fwd, ws, bwd, TAKES, TAKES, 0, 0};
"""

_fakes = {}


def fake_library(packed: bool):
    """A library linked here from common/attn_lib.c, common/device_info.c and the fake stage,
    taking packed batches or not, as make lib links a stage's: its _library.Library."""
    if packed not in _fakes:
        takes = "ATTN_TAKES_GQA | ATTN_TAKES_N_K | ATTN_TAKES_STRIDES" + \
            (" | ATTN_TAKES_VARLEN" if packed else "")
        _fakes[packed] = fake_stage_library(
            "stage95_fake_packed" if packed else "stage96_fake_plain", FAKE_STAGE_C,
            [f"TAKES=({takes})"])
    return _fakes[packed]


def packed_request(lib, B=3, backward=False, packed=True):
    """A packed request (GQA 4:2, D 64, at most 50 queries and 70 keys a sequence, 120 and 150
    rows in all, contiguous [total, heads, D]) or the plain one of the same sizes."""
    g = (B, 4, 50, 64, 2, 70, None)
    return _plans.request(backward, 0, g, True, 0.125, 0, 0, False,
                          varlen=(120, 150) if packed else None)


def plan_raw(lib, r):
    ws = ctypes.c_size_t(0)
    buf = ctypes.create_string_buffer(lib.plan_bytes)
    lib.check(lib.plan(ctypes.byref(r), buf, lib.plan_bytes, ctypes.byref(ws)), "attn_lib_plan")
    return ws.value, buf


def t_c_packed_entry():
    plain, packed = fake_library(False), fake_library(True)
    for backward in (False, True):  # refused by a stage that does not take it, before the device
        raises(ValueError, plan_raw, plain, packed_request(plain, backward=backward),
               match=["stage96_fake_plain", "packed batch"])
    if not HAVE_GPU:
        raises(RuntimeError, plan_raw, packed, packed_request(packed), match="no NVIDIA GPU here")
        raise Skip("the plans' and the runs' facts need a GPU (the library asks the device)")
    # what the stage is told at plan time: packed (the sequences' pointers set), the longest
    # lengths as N and N_k, the totals, the packed layouts [total, heads, D] without batch stride
    msg = raises(ValueError, plan_raw, packed, packed_request(packed, B=7), match="saw")
    assert "packed=1 B=7 N=50 N_k=70 total_q=120 total_k=150 q=0,64,256 k=0,64,128" in msg, msg
    msg = raises(ValueError, plan_raw, packed, packed_request(packed, B=7, packed=False))
    assert "packed=0" in msg, msg
    assert plan_raw(packed, packed_request(packed))[0] == 17
    assert plan_raw(packed, packed_request(packed, backward=True))[0] == 17
    # what a run passes on: the sequences' pointers (0x1000, 0x2000), the plain plan none
    work = torch.empty(64, dtype=torch.uint8, device="cuda")
    ptrs = [work.data_ptr()] * 5 + [work.data_ptr()]
    for backward in (False, True):
        plan = _plans._Plan(packed, backward, 0, (3, 4, 50, 64, 2, 70, None), True, 0.125, 0, 0,
                            varlen=(120, 150))
        raw = _run.backward_raw if backward else _run.forward_raw
        p = [work.data_ptr()] * (9 if backward else 5) + [work.data_ptr()]
        raw(plan, p, 64, 0, (0x1000, 0x2000))
        raises(RuntimeError, raw, plan, p, 64, 0, (0x2000, 0x1000), match="forward failed"
               if not backward else "backward failed")
        raises(ValueError, raw, plan, p, 64, 0, (None, None), match="cu_seqlens_q")
    plain_plan = _plans._Plan(packed, False, 0, (3, 4, 50, 64, 2, 70, None), True, 0.125, 0, 0)
    _run.forward_raw(plain_plan, ptrs, 64)
    torch.cuda.synchronize()


# ---- with PyTorch: the tensors' checks (CPU tensors where there is no GPU) ----

def t_tensor_checks():
    if torch is None:
        raise Skip("no PyTorch here")
    dev = "cuda" if HAVE_GPU else "cpu"
    q = torch.zeros(10, 4, 64, dtype=torch.float16, device=dev)
    kv = torch.zeros(12, 2, 64, dtype=torch.float16, device=dev)
    cu_q = torch.tensor([0, 4, 10], dtype=torch.int32, device=dev)
    cu_k = torch.tensor([0, 5, 12], dtype=torch.int32, device=dev)
    good = (q, kv, kv, cu_q, cu_k, 6, 7)

    def bad(i, value, exc, *words, **kw):
        args = list(good)
        args[i] = value
        raises(exc, fa_varlen, *args, match=[WHO, *words], **kw)

    bad(0, q[None], ValueError, "[total_q, H, D]")
    bad(1, kv[:, :, :32], ValueError, "one shape")
    bad(2, kv[:-1], ValueError, "one shape")
    kv3 = torch.zeros(12, 3, 64, dtype=torch.float16, device=dev)
    raises(ValueError, fa_varlen, q, kv3, kv3, cu_q, cu_k, 6, 7, match=[WHO, "divide"])
    bad(0, q.transpose(1, 2).contiguous().transpose(1, 2), ValueError, "contiguous")
    bad(1, kv.float(), TypeError, "one dtype")
    bad(3, cu_q.long(), TypeError, "int32", "cu_seqlens_q")
    bad(4, cu_k.float(), TypeError, "int32", "cu_seqlens_k")
    bad(3, cu_q[None], ValueError, "[B + 1]")
    bad(3, cu_q[:1], ValueError, "[B + 1]")
    bad(4, cu_k[:2], ValueError, "one shape")
    bad(3, torch.zeros(6, dtype=torch.int32, device=dev)[::2], ValueError, "contiguous")
    bad(0, q.tolist(), TypeError, "torch tensors")
    bad(3, [0, 4, 10], TypeError, "torch tensors", "cu_seqlens_q")
    bad(5, torch.tensor(6), TypeError, "max_seqlen_q", "int")
    if HAVE_GPU:
        bad(0, q.cpu(), TypeError, "CUDA")
        bad(3, cu_q.cpu(), TypeError, "q's device")
        raises(TypeError, fa_varlen, q.float(), kv.float(), kv.float(), cu_q, cu_k, 6, 7,
               match=[WHO, "float32"])
        q100 = torch.zeros(10, 4, 100, dtype=torch.float16, device=dev)
        kv100 = torch.zeros(12, 2, 100, dtype=torch.float16, device=dev)
        raises(ValueError, fa_varlen, q100, kv100, kv100, cu_q, cu_k, 6, 7,
               match=[WHO, "head dim"])
        flat = torch.zeros(q.numel() + 8, dtype=q.dtype, device=dev)
        raises(ValueError, fa_varlen, flat[1:q.numel() + 1].view(q.shape), kv, kv, cu_q, cu_k,
               6, 7, match=[WHO, "aligned"])
        plain = [s.name for s in flashcourse.stages() if s.dtype == "float16" and
                 not s.takes & _library.TAKES_VARLEN]
        if plain:  # (as many key/value heads, as long: a packed batch is all the stage lacks)
            kv4 = torch.zeros(12, 4, 64, dtype=torch.float16, device=dev)
            raises(ValueError, fa_varlen, q, kv4, kv4, cu_q, cu_k, 6, 6, stage=plain[0],
                   match=[WHO, plain[0], "packed batch"])
    else:
        bad(0, q, TypeError, "CUDA")  # every check above passed but the device's


# ---- GPU: against a float64 reference, sequence by sequence ----

def varlen_ref(q, k, v, lens_q, lens_k, causal, window, softcap, scale, max_k):
    """The answer in float64 on q, k, v's values, sequence by sequence: (o [total_q, H, D], lse
    [H, total_q], the float64 leaves) for autograd; o = 0 and lse -inf where a row sees no key."""
    ref = [t.detach().double().requires_grad_(True) for t in (q, k, v)]
    H, H_kv, D = q.shape[1], k.shape[1], q.shape[2]
    group = H // H_kv
    outs, lses = [], []
    q0 = k0 = 0
    for nq, nk in zip(lens_q, lens_k):
        qs = ref[0][q0:q0 + nq].transpose(0, 1)  # [H, nq, D]
        ks = ref[1][k0:k0 + nk].transpose(0, 1).repeat_interleave(group, 0)
        vs = ref[2][k0:k0 + nk].transpose(0, 1).repeat_interleave(group, 0)
        q0, k0 = q0 + nq, k0 + nk
        if nq == 0:
            continue
        if nk == 0:
            outs.append(qs.new_zeros(nq, H, D))
            lses.append(qs.new_full((H, nq), float("-inf")))
            continue
        s = scale * qs @ ks.transpose(-1, -2)
        if softcap > 0:
            s = softcap * torch.tanh(s / softcap)
        o, lse = softmax_ref(s, key_mask(nq, nk, causal, *window, max_k, q.device), vs)
        outs.append(o.transpose(0, 1))
        lses.append(lse)
    o = torch.cat(outs, 0) if outs else ref[0].new_zeros(0, H, D)
    lse = torch.cat(lses, 1) if lses else ref[0].new_zeros(H, 0)
    return o, lse, ref


def cu_of(lens):
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    return torch.tensor(cu, dtype=torch.int32, device="cuda")


def make_batch(lens_q, lens_k, H, H_kv, D, dtype, seed, fused=False, peaky=8.0):
    """Leaves q [total_q, H, D], k, v [total_k, H_kv, D] (fused: the three slices of one
    [total, 3, H, D] projection, read in place) and cu_seqlens_q, cu_seqlens_k; q scaled so the
    scores are peaky (a skipped or misplaced key tile shows, the cap bites)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    tq, tk = sum(lens_q), sum(lens_k)
    if fused:
        assert tq == tk and H == H_kv
        qkv = torch.randn((tq, 3, H, D), generator=g, device="cuda")
        qkv[:, 0] *= peaky
        qkv = qkv.to(dtype).requires_grad_(True)
        q, k, v = qkv.unbind(1)
        return (q, k, v), qkv, cu_of(lens_q), cu_of(lens_k)
    q = (torch.randn((tq, H, D), generator=g, device="cuda") * peaky).to(dtype)
    k, v = (torch.randn((tk, H_kv, D), generator=g, device="cuda").to(dtype) for _ in range(2))
    leaves = [t.requires_grad_(True) for t in (q, k, v)]
    return leaves, None, cu_of(lens_q), cu_of(lens_k)


def check_case(lens_q, lens_k, H, H_kv, D, causal, window, softcap, dtype, seed, fused=False,
               label=""):
    """One packed call, forward and gradients, against varlen_ref."""
    (q, k, v), qkv, cu_q, cu_k = make_batch(lens_q, lens_k, H, H_kv, D, dtype, seed, fused)
    max_q, max_k = max(lens_q), max(lens_k)
    label = (f"{label} lens_q={lens_q[:8]}{'...' if len(lens_q) > 8 else ''} H={H}:{H_kv} D={D} "
             f"causal={causal} window={window} softcap={softcap} {dtype}"
             f"{' fused' if fused else ''}")
    o, lse, s_dmask = fa_varlen(q, k, v, cu_q, cu_k, max_q, max_k, causal=causal,
                                window_size=window, softcap=softcap, return_attn_probs=True)
    assert o.shape == q.shape and o.dtype == q.dtype, (label, o.shape)
    assert lse.shape == (H, q.shape[0]) and lse.dtype == torch.float32, (label, lse.shape)
    assert s_dmask.numel() == 0, label
    do = torch.randn_like(o)
    o.backward(do)
    leaves = [qkv] if fused else [q, k, v]
    got = [o] + ([qkv.grad[:, i] for i in range(3)] if fused else [t.grad for t in leaves])
    ro, rlse, ref = varlen_ref(q, k, v, lens_q, lens_k, causal, window, softcap, D ** -0.5,
                               max_k)
    ro.backward(do.double())
    assert_within(got, [ro] + [t.grad for t in ref], label)
    check_flash_lse(lse, rlse, label)  # +inf where a row sees no key, as flash-attn's
    empty = ~torch.isfinite(rlse).any(0)  # rows that see no key: exactly zero, so their gradients
    assert not o[empty].any() and not got[1][empty].any(), f"{label}: rows without keys"
    for t in leaves:
        t.grad = None
    return o, lse


# (lens_q, lens_k (None: lens_q), H, H_kv, D, causal, window, softcap, dtype name, fused)
CASES = (
    ([1, 0, 17, 300, 64, 129, 1000], None, 4, 4, 64, False, (-1, -1), 0.0, "float16", False),
    ([4500, 1, 0, 77], None, 2, 1, 128, True, (-1, -1), 0.0, "float16", False),
    ([5, 130, 0, 64, 1], [20, 100, 7, 0, 1], 4, 2, 96, True, (-1, -1), 0.0, "bfloat16", False),
    ([5000, 300, 1], None, 2, 2, 64, False, (127, 0), 0.0, "float16", False),
    ([700, 0, 1, 333], [650, 3, 0, 400], 2, 2, 256, False, (-1, 64), 30.0, "float16", False),
    ([4097, 2048, 5], None, 2, 1, 128, False, (1000, 1000), 0.0, "bfloat16", False),
    ([100, 257, 1, 0, 63], None, 3, 3, 96, True, (-1, -1), 50.0, "float16", True),
    ([64, 65, 127, 128, 129], None, 4, 1, 64, False, (0, 0), 0.0, "float16", False),
    ([300, 20, 1], [40, 300, 2], 2, 2, 256, True, (33, 3), 0.0, "bfloat16", False),
)


def t_cases():
    need_gpu()
    for n, (lq, lk, H, H_kv, D, causal, window, cap, dt, fused) in enumerate(CASES):
        dtype = getattr(torch, dt)
        if dtype == torch.bfloat16 and not torch.cuda.is_bf16_supported():
            continue
        check_case(lq, lk or lq, H, H_kv, D, causal, window, cap, dtype, 100 + n, fused,
                   f"case {n}")


def random_lens(rng, B, top):
    """B lengths from 0 to top: 0, 1 and one over 4,096 among them, the rest spread out."""
    lens = [0, 1, rng.randint(4097, top)] + [rng.choice((rng.randint(0, 130), rng.randint(0, top)))
                                             for _ in range(B - 3)]
    rng.shuffle(lens)
    return lens


def t_fuzz():
    need_gpu()
    rng = random.Random(52)
    for n in range(4):
        B = rng.randint(4, 9)
        lq = random_lens(rng, B, 5000)
        lk = lq if n % 2 == 0 else [max(0, x + rng.randint(-40, 40)) for x in lq]
        H_kv = rng.choice((1, 2))
        H = H_kv * rng.choice((1, 2))
        D = rng.choice((64, 96, 128, 256))
        window = rng.choice(((-1, -1), (-1, -1), (rng.randint(0, 2000), rng.randint(-1, 300))))
        cap = rng.choice((0.0, 0.0, 30.0))
        dtype = rng.choice((torch.float16, torch.bfloat16))
        check_case(lq, lk, H, H_kv, D, n >= 2, window, cap, dtype, 200 + n, label=f"fuzz {n}")


def t_check_can_fail():
    # the reference tells the sequences apart: one sequence of all the rows is outside the bound
    need_gpu()
    lens = [300, 200, 1]
    (q, k, v), _, cu_q, cu_k = make_batch(lens, lens, 2, 2, 64, torch.float16, 7)
    with torch.no_grad():
        o = fa_varlen(q, k, v, cu_q, cu_k, 300, 300, causal=True)
    ro, _, _ = varlen_ref(q, k, v, lens, lens, True, (-1, -1), 0.0, 64 ** -0.5, 300)
    assert miss(o, ro, "o") is None
    merged, _, _ = varlen_ref(q, k, v, [501], [501], True, (-1, -1), 0.0, 64 ** -0.5, 501)
    assert miss(o, merged, "merged") is not None, "the merged batch is within the bound"
    bad = o.clone()
    bad[350, 1, 5] += 0.5
    assert miss(bad, ro, "o") is not None, "a wrong row passed"


def t_equal_lengths():
    # B sequences of one length: the same answer as flash_attn_func on [B, N, H, D], lse included
    need_gpu()
    B, N, H, D = 3, 200, 4, 64
    (q, k, v), _, cu_q, cu_k = make_batch([N] * B, [N] * B, H, H, D, torch.float16, 9)
    with torch.no_grad():
        o, lse, _ = fa_varlen(q, k, v, cu_q, cu_k, N, N, causal=True, return_attn_probs=True)
        o2, lse2, _ = flashcourse.flash_attn_func(*(t.view(B, N, H, D) for t in (q, k, v)),
                                                  causal=True, return_attn_probs=True)
    assert miss(o, o2.reshape(B * N, H, D), "o") is None
    assert miss(lse, lse2.permute(1, 0, 2).reshape(H, B * N), "lse") is None


def t_deterministic():
    need_gpu()
    lens = [300, 0, 1000, 17]
    (q, k, v), _, cu_q, cu_k = make_batch(lens, lens, 4, 2, 128, torch.float16, 11)
    do = torch.randn_like(q)
    grads = []
    for _ in range(2):
        for t in (q, k, v):
            t.grad = None
        fa_varlen(q, k, v, cu_q, cu_k, 1000, 1000, causal=True, deterministic=True).backward(do)
        grads.append([t.grad.clone() for t in (q, k, v)])
    assert all(torch.equal(a, b) for a, b in zip(*grads)), "deterministic=True: grads differ"


def t_empty():
    # nothing to launch: o zero like q, lse [H, total_q] +inf (flash-attn's fill), zero gradients
    need_gpu()
    for lens_q, lens_k, max_q, max_k in (([3, 5], [4, 6], 0, 6), ([3, 5], [4, 6], 5, 0),
                                         ([0, 0], [4, 6], 0, 6), ([0, 0], [0, 0], 0, 0)):
        (q, k, v), _, cu_q, cu_k = make_batch(lens_q, lens_k, 4, 2, 64, torch.float16, 13)
        o, lse, _ = fa_varlen(q, k, v, cu_q, cu_k, max_q, max_k, causal=True,
                              return_attn_probs=True)
        assert o.shape == q.shape and not o.any(), (lens_q, max_q, max_k)
        assert lse.shape == (4, q.shape[0]) and bool((lse == float("inf")).all()), lse
        o.sum().backward()
        for t in (q, k, v):
            assert t.grad is not None and t.grad.shape == t.shape and not t.grad.any()


def t_over_the_grid_limit():
    # B x H over the kernels' limit: in parts along the heads (whole key/value groups)
    need_gpu()
    limit = _library.stage_library(flashcourse.auto_stage()).limits["max_bh"]
    H, H_kv = 32, 8
    B = limit // H + 50
    rng = random.Random(5)
    lens = [rng.randint(0, 9) for _ in range(B)]
    (q, k, v), _, cu_q, cu_k = make_batch(lens, lens, H, H_kv, 64, torch.float16, 17)
    o = fa_varlen(q, k, v, cu_q, cu_k, max(lens), max(lens), causal=True)
    do = torch.randn_like(o)
    o.backward(do)
    ro, _, ref = varlen_ref(q, k, v, lens, lens, True, (-1, -1), 0.0, 64 ** -0.5, max(lens))
    ro.backward(do.double())
    assert_within([o, q.grad, k.grad, v.grad], [ro] + [t.grad for t in ref], f"B={B} H={H}")


def t_long_document():
    # 1,000 short documents beside one long one: the workspace scales with the tokens (one of B
    # x max_seqlen x H x D floats would be ~160 GB and fail), forward and backward; the long
    # one against flash_attn_func on it alone, 50 short ones against the float64 reference
    need_gpu()
    rng = random.Random(8)
    H, H_kv, D, long_n = 16, 8, 128, 20000
    lens = [rng.randint(1, 16) for _ in range(1000)]
    at = rng.randint(0, 1000)
    lens.insert(at, long_n)
    (q, k, v), _, cu_q, cu_k = make_batch(lens, lens, H, H_kv, D, torch.float16, 19, peaky=1.0)
    do = torch.randn_like(q)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    o = fa_varlen(q, k, v, cu_q, cu_k, long_n, long_n, causal=True)
    o.backward(do)
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - base
    tensor_bytes = q.numel() * q.element_size()
    assert extra < 32 * tensor_bytes + (256 << 20), \
        f"{extra / 2**20:.0f} MiB beyond the inputs for {q.shape[0]} tokens"
    r0 = sum(lens[:at])
    rows = slice(r0, r0 + long_n)
    leaves = [t.detach()[rows][None].clone().requires_grad_(True) for t in (q, k, v)]
    ol = flashcourse.flash_attn_func(*leaves, causal=True)
    ol.backward(do[rows][None])
    assert_within([o[rows], q.grad[rows], k.grad[rows], v.grad[rows]],
                  [ol[0]] + [t.grad[0] for t in leaves], "the long document vs flash_attn_func:")
    short = [i for i in range(len(lens)) if i != at][:50]
    for i in short:
        r, n = sum(lens[:i]), lens[i]
        sl = slice(r, r + n)
        ro, _, ref = varlen_ref(q[sl], k[sl], v[sl], [n], [n], True, (-1, -1), 0.0, D ** -0.5,
                                long_n)
        ro.backward(do[sl].double())
        assert_within([o[sl], q.grad[sl], k.grad[sl], v.grad[sl]],
                      [ro] + [t.grad for t in ref], f"document {i} ({n} tokens)")


def t_cached_no_sync():
    # a repeated call runs from the call cache (the checks once), and never waits for the GPU
    need_gpu()
    lens = [100, 0, 37, 300]
    (q, k, v), _, cu_q, cu_k = make_batch(lens, lens, 4, 2, 64, torch.float16, 23)
    do = torch.randn_like(q)
    fa_varlen(q, k, v, cu_q, cu_k, 300, 300, causal=True).backward(do)  # planned here
    checked, calls = varlen._checked, []

    def counting(*args):
        calls.append(args)
        return checked(*args)

    varlen._checked = counting
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            fa_varlen(q, k, v, cu_q, cu_k, 300, 300, causal=True).backward(do)
    finally:
        torch.cuda.set_sync_debug_mode("default")
        varlen._checked = checked
    assert not calls, f"{len(calls)} calls took the checked path"
    # what the cache cannot know (alignment) is still checked
    flat = torch.empty(q.numel() + 8, dtype=q.dtype, device="cuda")
    with torch.no_grad():
        raises(ValueError, fa_varlen, flat[1:q.numel() + 1].view(q.shape), k, v, cu_q, cu_k,
               300, 300, causal=True, match="aligned")


def t_cuda_graph():
    # captured once, replayed with new lengths in the same cu_seqlens tensors (same B, totals
    # and maxima): the answers of eager calls with those lengths; the host never read them
    need_gpu()
    lens = [100, 0, 37, 300]
    (q, k, v), _, cu_q, cu_k = make_batch(lens, lens, 4, 2, 64, torch.float16, 29)
    do = torch.randn_like(q)

    def step():
        for t in (q, k, v):
            t.grad = None
        o = fa_varlen(q, k, v, cu_q, cu_k, 300, 300, causal=True)
        o.backward(do)
        return o

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    for t in (q, k, v):
        t.grad = None
    with torch.cuda.graph(graph):
        o_g = step()
    for new in ([300, 37, 0, 100], [1, 299, 137, 0]):
        cu_q.copy_(cu_of(new))
        cu_k.copy_(cu_of(new))
        graph.replay()
        torch.cuda.synchronize()
        got = [o_g.detach().clone()] + [t.grad.clone() for t in (q, k, v)]
        leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
        want_o = fa_varlen(*leaves, cu_q, cu_k, 300, 300, causal=True)
        want_o.backward(do)
        for name, a, b in zip(("o", "dq", "dk", "dv"), got,
                              [want_o] + [t.grad for t in leaves]):
            assert torch.allclose(a.float(), b.float(), atol=2e-3, rtol=0), \
                f"replay with lengths {new}: {name} differs by " \
                f"{float((a.float() - b.float()).abs().max())}"
        ro, _, _ = varlen_ref(q, k, v, new, new, True, (-1, -1), 0.0, 0.125, 300)
        assert miss(got[0], ro, f"replay with lengths {new}") is None


def t_torch_compile():
    need_gpu()
    lens = [100, 0, 37, 300]
    (q, k, v), _, cu_q, cu_k = make_batch(lens, lens, 4, 2, 64, torch.float16, 31)
    do = torch.randn_like(q)

    def step(q, k, v):
        o = fa_varlen(q, k, v, cu_q, cu_k, 300, 300, causal=True, window_size=(50, 0))
        return (o.float() * do.float()).sum()

    compiled = torch.compile(step, fullgraph=True)  # fullgraph: a graph break raises
    grads = []
    for fn in (step, compiled):
        leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
        fn(*leaves).backward()
        grads.append([t.grad for t in leaves])
    for a, b in zip(*grads):
        assert torch.allclose(a.float(), b.float(), atol=2e-3, rtol=0), \
            float((a.float() - b.float()).abs().max())


def t_eager_op():
    # the C++ eager operator (flashcourse_eager::attention_varlen) against the Python path, on
    # the same plans: o, lse and the deterministic gradients bit-identical, dO in o's layout and
    # in another (a fused buffer's slice)
    need_gpu()
    path = flashcourse.eager_path()
    if not path.startswith("C++"):
        raise Skip(f"the eager operator is not in use: {path}")
    lens = [333, 0, 1, 120]
    (q, k, v), _, cu_q, cu_k = make_batch(lens, lens, 4, 2, 64, torch.float16, 37)
    wide = torch.randn(q.shape[0], 4, 128, device="cuda").half()
    dos = [torch.randn_like(q), wide[..., 64:]]

    def run_all():
        out = []
        for do in dos:
            leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
            o, lse, _ = fa_varlen(*leaves, cu_q, cu_k, 333, 333, causal=True, deterministic=True,
                                  return_attn_probs=True)
            o.backward(do)
            out.append([o.detach(), lse] + [t.grad for t in leaves])
        return out

    cpp = run_all()
    with _run.PythonPath():
        py = run_all()
    for i, (a, b) in enumerate(zip(cpp, py)):
        for name, x, y in zip(("o", "lse", "dq", "dk", "dv"), a, b):
            assert torch.equal(x, y), f"dO layout {i}: {name} differs"


def main():
    print(f"flash_attn_varlen_func tests: libraries in {flashcourse.library_dir()}, "
          f"torch {torch.__version__ if torch is not None else 'absent'}, "
          f"GPU {torch.cuda.get_device_name() if HAVE_GPU else 'none'}")
    run("flash_attn_varlen_func: flash-attn 2's parameter list", t_signature)
    run("dropout, ALiBi, a block table: NotImplementedError naming them", t_refused)
    run("max_seqlen an int, window_size, softcap, causal, deterministic: checked", t_scalar_checks)
    run("attn_lib.h's prototypes (cu_seqlens before the workspace), ABI 9, the eager ABI",
        t_prototypes)
    run("a packed request: varlen, total_q, total_k", t_request)
    run("the call cache keeps a checked call by its key, an unhashable one not (_run.remember)",
        t_remember)
    run("the library's packed entry: a stage without it refuses it; what a stage is told at plan "
        "and run time (fake stages)", t_c_packed_entry)
    run("bad tensors: one line naming flash_attn_varlen_func", t_tensor_checks)
    run("the check can fail: a merged batch, a wrong row", t_check_can_fail)
    run("lengths 0, 1, > 4096, N_q != N_k, no keys, causal, windows, softcap, GQA, bf16, D 64, 96, "
        "128, 256, fused views: forward, lse and gradients vs float64", t_cases)
    run("random lengths 0 to 5000 (fixed seeds) vs float64", t_fuzz)
    run("sequences of one length: flash_attn_func's answer and lse", t_equal_lengths)
    run("deterministic=True: bit-identical gradients", t_deterministic)
    run("empty batches: zeros, lse +inf (flash-attn's), zero gradients", t_empty)
    run("B x H over the kernels' limit: in parts, vs float64", t_over_the_grid_limit)
    run("1,000 short documents and a long one: memory scales with the tokens", t_long_document)
    run("plans cached, no synchronisation", t_cached_no_sync)
    run("a CUDA graph replays with new lengths", t_cuda_graph)
    run("torch.compile(fullgraph=True): forward and backward", t_torch_compile)
    run("the eager operator (C++) vs the Python path: bit-identical", t_eager_op)
    return summary()


if __name__ == "__main__":
    sys.exit(main())
