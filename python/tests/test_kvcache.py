#!/usr/bin/env python3
"""flashcourse.flash_attn_with_kvcache (decode over a KV cache, stage9_decode) and the library's
decode entry (common/attn_lib.c: attn_lib_plan's ATTN_LIB_DECODE, attn_lib_decode).

    PYTHONPATH=python python3 python/tests/test_kvcache.py

Anywhere (no GPU, no PyTorch needed): the signature is flash-attn 2's parameter list; the keywords
the stage does not compute raise NotImplementedError naming them; the ctypes mirror of
attn_lib_request and attn_stage matches the C layout (compiled with the C compiler); the decode
entry's checks in C (a stage without decode, the cache rules of attention.h's attn_cache_refused,
the strides of the new keys, what decode_workspace_bytes is told), through libraries linked here
from common/attn_lib.c and two small fake stages. On a GPU with stage9_decode built: against a
float64 reference over the gathered cache, contiguous and paged (pages of 16 and 256), ragged
lengths with 0, new keys appended (the cache compared exactly), GQA 4:1 and MQA, fp16 and bf16,
N_q 1 and 4, causal both, the LSE (+inf for a row without keys, as flash-attn's); a CUDA
graph; no synchronisation; plans cached; errors with tensors. Ends with "N passed, M failed, K
skipped".
"""

import ctypes
import inspect
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from harness import (REPO, Skip, c_compiler, cuda_home, fake_stage_library, need_gpu, raiser,
                     run, setup, summary)

torch, HAVE_GPU = setup()
import flashcourse  # noqa: E402
from flashcourse import _library, _plans, _run  # noqa: E402

WHO = "flashcourse.flash_attn_with_kvcache"
kvcache = flashcourse.flash_attn_with_kvcache

# flash-attn 2's flash_attn_with_kvcache (flash_attn/flash_attn_interface.py): name, default
EMPTY = inspect.Parameter.empty
FLASH_ATTN_PARAMS = [
    ("q", EMPTY), ("k_cache", EMPTY), ("v_cache", EMPTY), ("k", None), ("v", None),
    ("rotary_cos", None), ("rotary_sin", None), ("cache_seqlens", None),
    ("cache_batch_idx", None), ("cache_leftpad", None), ("block_table", None),
    ("softmax_scale", None), ("causal", False), ("window_size", (-1, -1)), ("softcap", 0.0),
    ("rotary_interleaved", True), ("alibi_slopes", None), ("num_splits", 0),
    ("return_softmax_lse", False)]

raises = raiser("_kvcache_checked")


# ---- anywhere ----

def t_signature():
    params = list(inspect.signature(kvcache).parameters.values())
    ours = [(p.name, p.default) for p in params if p.kind == p.POSITIONAL_OR_KEYWORD]
    assert ours == FLASH_ATTN_PARAMS, f"{ours}\n!= flash-attn's\n{FLASH_ATTN_PARAMS}"
    extra = [p.name for p in params if p.kind != p.POSITIONAL_OR_KEYWORD]
    assert extra == ["stage", "variant"], extra
    assert all(p.kind == p.KEYWORD_ONLY for p in params if p.name in extra)
    assert "flash_attn_with_kvcache" in flashcourse.__all__
    doc = kvcache.__doc__
    for word in ("stage9_decode", "NotImplementedError", "rotary_cos", "cache_batch_idx",
                 "cache_leftpad", "window_size", "softcap", "alibi_slopes", "num_splits"):
        assert word in doc, f"the docstring does not name {word}"


def t_refused_keywords():
    # refused before any tensor or library is looked at: the same without PyTorch or a GPU
    for kw, value in (("rotary_cos", object()), ("rotary_sin", object()),
                      ("cache_batch_idx", object()), ("cache_leftpad", object()),
                      ("alibi_slopes", object()), ("window_size", (128, 0)),
                      ("window_size", [-1, 0]), ("softcap", 30.0)):
        raises(NotImplementedError, kvcache, None, None, None, **{kw: value},
               match=[WHO, kw])
    raises(ValueError, kvcache, None, None, None, num_splits=-1, match=[WHO, "num_splits"])
    raises(ValueError, kvcache, None, None, None, num_splits=1.5, match=[WHO, "num_splits"])
    raises(TypeError, kvcache, None, None, None, causal="yes", match=[WHO, "causal"])
    raises(TypeError, kvcache, None, None, None, stage=9, match=[WHO, "stage"])


def t_missing_library():
    old = os.environ.get("FLASHCOURSE_LIB_DIR")
    with tempfile.TemporaryDirectory() as d:
        os.environ["FLASHCOURSE_LIB_DIR"] = d
        try:
            raises(flashcourse.LibraryNotBuiltError, kvcache, None, None, None,
                   match=["make lib", "libstage9_decode.so"])
        finally:
            if old is None:
                del os.environ["FLASHCOURSE_LIB_DIR"]
            else:
                os.environ["FLASHCOURSE_LIB_DIR"] = old


LAYOUT_C = r"""
#include <stddef.h>
#include <stdio.h>
#include "attention.h"
#include "attn_lib.h"
#define F(s, f) printf(#f " %zu\n", offsetof(s, f))
int main(void) {
    printf("abi %d\ndecode_pass %d\nrequest %zu\nstage %zu\n", ATTN_LIB_ABI, ATTN_LIB_DECODE,
           sizeof(attn_lib_request), sizeof(attn_stage));
    F(attn_lib_request, pass); F(attn_lib_request, device); F(attn_lib_request, smem_limit);
    F(attn_lib_request, B); F(attn_lib_request, H); F(attn_lib_request, N);
    F(attn_lib_request, D); F(attn_lib_request, causal); F(attn_lib_request, scale);
    F(attn_lib_request, variant); F(attn_lib_request, H_kv); F(attn_lib_request, N_k);
    F(attn_lib_request, bf16); F(attn_lib_request, strides); F(attn_lib_request, paged);
    F(attn_lib_request, page_size); F(attn_lib_request, num_pages);
    F(attn_lib_request, max_pages); F(attn_lib_request, N_new);
    F(attn_lib_request, new_strides); F(attn_lib_request, local);
    F(attn_lib_request, window_left); F(attn_lib_request, window_right);
    F(attn_lib_request, softcap); F(attn_lib_request, varlen); F(attn_lib_request, total_q);
    F(attn_lib_request, total_k);
    printf("stage.takes %zu\nstage.decode_workspace_bytes %zu\nstage.decode %zu\n",
           offsetof(attn_stage, takes), offsetof(attn_stage, decode_workspace_bytes),
           offsetof(attn_stage, decode));
    return 0;
}
"""


def t_abi_mirror():
    # the one mirror of attn_lib_request (and of attn_stage's fields the binding reads), laid out
    # as the C compiler lays them out
    cc, cuda = c_compiler(), cuda_home()
    with tempfile.TemporaryDirectory() as d:
        src, exe = Path(d) / "layout.c", Path(d) / "layout"
        src.write_text(LAYOUT_C)
        subprocess.run([cc, "-std=c11", f"-I{cuda}/include", f"-I{REPO}/common", str(src), "-o",
                        str(exe)], check=True, capture_output=True)
        out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    got = {k: int(v) for k, v in (line.split() for line in out.splitlines())}
    assert got.pop("abi") == _library.ABI, "ATTN_LIB_ABI != _library.ABI"
    assert got.pop("decode_pass") == _library.PASS_DEC
    R, S = _library.Request, _library._Descriptor
    assert got.pop("request") == ctypes.sizeof(R), (ctypes.sizeof(R), out)
    assert got.pop("stage") == ctypes.sizeof(S), (ctypes.sizeof(S), out)
    names = {"pass": "pass_"}
    for field, off in got.items():
        if field.startswith("stage."):
            want = getattr(S, field[6:]).offset
        else:
            want = getattr(R, names.get(field, field)).offset
        assert off == want, f"{field}: C offset {off}, ctypes {want}"
    assert [f[0] for f in R._fields_][-13:] == ["paged", "page_size", "num_pages", "max_pages",
                                                "N_new", "new_strides", "local", "window_left",
                                                "window_right", "softcap", "varlen", "total_q",
                                                "total_k"]


FAKE_STAGE_C = r"""
#include "attention.h"
static const char *unsupported(const attn_shape *s, const attn_device *d, int v) {
    (void)d; (void)v;
    return s->B == 5 ? "the fake stage refuses B = 5" : NULL;
}
static size_t ws(const attn_shape *s, const attn_device *d, int v) { (void)s; (void)d; (void)v; return 0; }
static cudaError_t fwd(const attn_shape *s, const attn_device *d, const void *Q, const void *K,
                       const void *V, void *O, float *lse, void *w, int v, cudaStream_t st) {
    (void)s; (void)d; (void)Q; (void)K; (void)V; (void)O; (void)lse; (void)w; (void)v; (void)st;
    return cudaSuccess;
}
#ifdef WITH_DECODE
/* the workspace tells what the plan saw: the cache and the shape, in decimal digits */
static size_t dws(const attn_shape *s, const attn_cache *c, const attn_device *d, int v) {
    (void)d; (void)v;
    return (size_t)c->page_size * 1000000 + (size_t)c->N_new * 10000 + (size_t)s->N_k * 10 +
           (c->block_table != 0) * 2 + (c->seqlens != 0);
}
static cudaError_t dec(const attn_shape *s, const attn_cache *c, const attn_device *d,
                       const void *Q, void *K, void *V, void *O, float *lse, void *w, int v,
                       cudaStream_t st) {
    (void)s; (void)c; (void)d; (void)Q; (void)K; (void)V; (void)O; (void)lse; (void)w; (void)v;
    (void)st;
    return cudaSuccess;
}
#define DECODE , dws, dec
#else
#define DECODE , 0, 0
#endif
const attn_stage attn_this_stage = {NAME, "a fake stage for the library's tests", ATTN_F16,
                                    "default", unsupported, ws, fwd, 0, 0, 0, 0 DECODE};
"""

_fakes = {}


def fake_library(decode: bool):
    """A library linked here from common/attn_lib.c, common/device_info.c and a fake stage (with
    a decode pass or without), as make lib links a stage's: its _library.Library."""
    if decode not in _fakes:
        _fakes[decode] = fake_stage_library(
            "stage97_fake_decode" if decode else "stage98_fake_forward", FAKE_STAGE_C,
            ["WITH_DECODE"] if decode else [])
    return _fakes[decode]


def decode_request(**kw):
    """A decode request: GQA 8/2, 4 queries, D 64, a paged cache of 64 pages of 16 keys, 8 a
    sequence, 2 new keys; kw overrides (geometry fields, or paged, page_size, ...)."""
    g = dict(B=2, H=8, N=4, D=64, H_kv=2, N_k=0, causal=1, scale=0.125)
    c = dict(paged=1, page_size=16, num_pages=64, max_pages=8, N_new=2, new_strides=(0,) * 6)
    g.update({k: v for k, v in kw.items() if k in g})
    c.update({k: v for k, v in kw.items() if k in c})
    geometry = (g["B"], g["H"], g["N"], g["D"], g["H_kv"], g["N_k"], None)
    r = _plans.request(False, 0, geometry, bool(g["causal"]), g["scale"], 0, 0, False,
                       (c["paged"], c["page_size"], c["num_pages"], c["max_pages"], c["N_new"],
                        c["new_strides"]))
    return r


def plan_raw(lib, r):
    ws = ctypes.c_size_t(0)
    buf = ctypes.create_string_buffer(lib.plan_bytes)
    lib.check(lib.plan(ctypes.byref(r), buf, lib.plan_bytes, ctypes.byref(ws)), "attn_lib_plan")
    return ws.value


def t_c_decode_checks():
    plain, dec = fake_library(False), fake_library(True)
    assert dec.stage.decode and not plain.stage.decode, (dec.stage, plain.stage)
    raises(ValueError, plan_raw, plain, decode_request(),
           match=["stage98_fake_forward has no decode pass"])
    for kw, words in (
            (dict(N=17), "1 to 16 queries"),
            (dict(page_size=24), "power of two"),
            (dict(page_size=2048), "power of two"),
            (dict(num_pages=0), "pages and a block table"),
            (dict(N_k=1000), "fewer keys than the plan's N_k"),
            (dict(paged=0, N_k=8, N_new=9), "more new keys"),
            (dict(N_new=-1), "new keys need both"),
            (dict(new_strides=(0, 0, 32) + (0,) * 3), "rows at least D"),
            (dict(D=100), "head dim must be a multiple of 8 from 32 to 256"),
            (dict(D=264), "head dim must be a multiple of 8 from 32 to 256"),
            (dict(H_kv=3), "H_kv must divide H"),
            (dict(N=0), ">= 1")):
        raises(ValueError, plan_raw, dec, decode_request(**kw), match=["stage97_fake_decode",
                                                                        words])
    r = decode_request()
    r.pass_ = 3
    raises(ValueError, plan_raw, dec, r, match="pass 3")
    # the run's own checks: not a plan of this library's decode
    rc = dec.decode(None, *([None] * 10), 0, None)
    assert rc == dec.codes["usage"] and b"decode pass" in dec.last_error(), dec.last_error()
    if HAVE_GPU:
        # what decode_workspace_bytes saw: page size 16, 2 new keys, N_k = 8 pages x 16, a block
        # table and the lengths (placeholders at plan time)
        assert plan_raw(dec, decode_request()) == 16 * 1000000 + 2 * 10000 + 128 * 10 + 3
        assert plan_raw(dec, decode_request(paged=0, N_k=300, N_new=0)) == 300 * 10 + 1
        raises(ValueError, plan_raw, dec, decode_request(B=5), match="refuses B = 5")
    else:
        raises(RuntimeError, plan_raw, dec, decode_request(), match="no NVIDIA GPU here")


# ---- GPU: stage9_decode against a float64 reference ----

def need_stage():
    need_gpu()
    try:
        st = _library.stage_library(_library.DECODE_STAGE).stage
    except (flashcourse.LibraryNotBuiltError, ValueError) as e:
        raise Skip(f"{_library.DECODE_STAGE} not built: {str(e).splitlines()[0]}")
    if not st.decode:
        raise Skip(f"{st.name} has no decode pass yet")
    return st


def make_cache(B, H_kv, D, dtype, lens, page_size, g, capacity):
    """(k_cache, v_cache, block_table or None): a contiguous cache [B, capacity, H_kv, D], or a
    paged one whose pages are shuffled over a pool with spares; keys past each length and unused
    pages hold large values, so a kernel that reads them is caught."""
    def fill(shape):
        t = torch.randn(shape, generator=g, device="cuda") * 64  # garbage: large scores
        return t.to(dtype)
    if page_size is None:
        return fill((B, capacity, H_kv, D)), fill((B, capacity, H_kv, D)), None
    max_pages = capacity // page_size
    num_pages = B * max_pages + 3
    perm = torch.randperm(num_pages, generator=g, device="cuda")[:B * max_pages]
    table = perm.view(B, max_pages).to(torch.int32).contiguous()
    return fill((num_pages, page_size, H_kv, D)), fill((num_pages, page_size, H_kv, D)), table


def gathered(cache, table, b, L):
    """Keys 0 .. L - 1 of sequence b: [L, H_kv, D]."""
    if table is None:
        return cache[b, :L]
    ps = cache.shape[1]
    pages = table[b, :(L + ps - 1) // ps].long()
    return cache[pages].reshape(-1, *cache.shape[2:])[:L]


def reference(q, k_cache, v_cache, table, lens, causal, scale):
    """float64 (o, lse) and o of a correct 16-bit computation (P and O rounded to q's dtype),
    sequence by sequence over the gathered cache (lens: the keys each attends over, host ints);
    bottom-right causal; a row with no key: o = 0, lse = -inf."""
    B, N_q, H, D = q.shape
    H_kv = k_cache.shape[2]
    o = torch.zeros(B, N_q, H, D, dtype=torch.float64, device="cuda")
    o16 = torch.zeros_like(o)
    lse = torch.full((B, H, N_q), -math.inf, dtype=torch.float64, device="cuda")
    for b, L in enumerate(lens):
        if L == 0:
            continue
        kb = gathered(k_cache, table, b, L).double().repeat_interleave(H // H_kv, dim=1)
        vb = gathered(v_cache, table, b, L).double().repeat_interleave(H // H_kv, dim=1)
        s = torch.einsum("qhd,khd->hqk", q[b].double(), kb) * scale
        if causal:
            i = torch.arange(N_q, device="cuda")[:, None]
            j = torch.arange(L, device="cuda")[None, :]
            s = s.masked_fill(j > i + L - N_q, -math.inf)
        m = s.amax(-1, keepdim=True)
        seen = torch.isfinite(m)
        p = torch.exp(s - torch.where(seen, m, torch.zeros_like(m)))
        l = p.sum(-1, keepdim=True)
        safe = torch.where(seen, l, torch.ones_like(l))
        o[b] = torch.einsum("hqk,khd->qhd", p, vb) / safe.permute(1, 0, 2)
        p16 = p.to(q.dtype).double()
        o16[b] = (torch.einsum("hqk,khd->qhd", p16, vb) / safe.permute(1, 0, 2)).to(
            q.dtype).double()
        lse[b] = torch.where(seen, m + torch.log(safe), m).squeeze(-1)
    return o, lse, o16


def check_against(out, lse, q, k_cache, v_cache, table, lens, causal, scale, label):
    o64, l64, o16 = reference(q, k_cache, v_cache, table, lens, causal, scale)
    assert out.shape == q.shape and out.dtype == q.dtype, (out.shape, out.dtype)
    assert lse.shape == (q.shape[0], q.shape[2], q.shape[1]) and lse.dtype == torch.float32
    assert torch.isfinite(out).all(), f"{label}: NaN/Inf in out"
    err = float((out.double() - o64).abs().max())
    bound = 2 * float((o16 - o64).abs().max()) + 1e-3
    assert err <= bound, f"{label}: max_abs_err {err:.3g} > {bound:.3g}"
    empty = torch.isinf(l64)  # rows with no key: +inf, as flash-attn returns them
    assert torch.equal(lse == math.inf, empty), f"{label}: the +inf LSE rows differ"
    lerr = float(((lse.double() - l64).abs() / (1 + l64.abs()))[~empty].max()) \
        if (~empty).any() else 0.0
    assert lerr <= 1e-3, f"{label}: lse_err {lerr:.3g}"


CASES = [  # (B, H, H_kv, N_q, D, page_size or None, N_new, causal, dtype name)
    (4, 8, 2, 1, 128, None, 0, False, "float16"),
    (4, 8, 2, 4, 128, None, 1, True, "float16"),
    (3, 4, 1, 4, 64, 16, 0, True, "bfloat16"),
    (3, 4, 1, 1, 64, 16, 2, False, "float16"),
    (4, 8, 2, 4, 128, 256, 3, True, "bfloat16"),
    (2, 16, 4, 1, 64, 256, 1, True, "float16"),
    (2, 8, 8, 4, 128, 16, 4, False, "bfloat16"),
]


def run_case(B, H, H_kv, N_q, D, page_size, N_new, causal, dtype_name, seed=0):
    dtype = getattr(torch, dtype_name)
    g = torch.Generator(device="cuda").manual_seed(seed)
    capacity = 768 if page_size != 16 else 320
    lens0 = [0, 1, 257, 700][:B] if capacity == 768 else [0, 17, 300][:B] + [63] * (B - 3)
    lens0 = [min(n, capacity - N_new) for n in lens0]
    k_cache, v_cache, table = make_cache(B, H_kv, D, dtype, lens0, page_size, g, capacity)
    q = torch.randn(B, N_q, H, D, generator=g, device="cuda").to(dtype)
    k = v = None
    want_k, want_v = k_cache.clone(), v_cache.clone()
    if N_new:
        k, v = (torch.randn(B, N_new, H_kv, D, generator=g, device="cuda").to(dtype)
                for _ in range(2))
        for b, n in enumerate(lens0):  # what the call must write, and nothing else
            for t in range(N_new):
                pos = n + t
                if table is None:
                    want_k[b, pos], want_v[b, pos] = k[b, t], v[b, t]
                else:
                    page = int(table[b, pos // page_size])
                    want_k[page, pos % page_size] = k[b, t]
                    want_v[page, pos % page_size] = v[b, t]
    seqlens = torch.tensor(lens0, dtype=torch.int32, device="cuda")
    out, lse = kvcache(q, k_cache, v_cache, k, v, cache_seqlens=seqlens, block_table=table,
                       causal=causal, return_softmax_lse=True)
    label = (f"B={B} H={H}/{H_kv} N_q={N_q} D={D} page={page_size} N_new={N_new} "
             f"causal={causal} {dtype_name}")
    assert torch.equal(k_cache, want_k) and torch.equal(v_cache, want_v), \
        f"{label}: the cache is not the old one with k, v written at cache_seqlens"
    lens = [n + N_new for n in lens0]
    check_against(out, lse, q, k_cache, v_cache, table, lens, causal, 1 / math.sqrt(D), label)
    assert torch.equal(seqlens.cpu(), torch.tensor(lens0, dtype=torch.int32)), \
        "cache_seqlens changed (flash-attn leaves it to the caller)"
    return q, k_cache, v_cache, table, lens


def t_cases():
    need_stage()
    for i, case in enumerate(CASES):
        run_case(*case, seed=i)


def t_seqlens_forms():
    # an int and None (the whole cache) as flash-attn takes them, against a tensor's answer
    need_stage()
    g = torch.Generator(device="cuda").manual_seed(5)
    q = torch.randn(2, 1, 8, 64, generator=g, device="cuda").half()
    kc, vc = (torch.randn(2, 100, 2, 64, generator=g, device="cuda").half() for _ in range(2))
    for given, n in ((37, 37), (None, 100)):
        out = kvcache(q, kc, vc, cache_seqlens=given)
        want = kvcache(q, kc, vc, cache_seqlens=torch.full((2,), n, dtype=torch.int32,
                                                           device="cuda"))
        assert torch.equal(out, want), f"cache_seqlens={given!r}"
        check_against(out, kvcache(q, kc, vc, cache_seqlens=given, return_softmax_lse=True)[1],
                      q, kc, vc, None, [n, n], False, 0.125, f"cache_seqlens={given!r}")
    # [B, N, H, D] views of a fused projection: read in place (or copied), the same answer
    qkv = torch.randn(2, 1, 3, 8, 64, generator=g, device="cuda").half()
    out = kvcache(qkv[:, :, 0], kc, vc, cache_seqlens=37, softmax_scale=0.3)
    want = kvcache(qkv[:, :, 0].contiguous(), kc, vc, cache_seqlens=37, softmax_scale=0.3)
    assert torch.equal(out, want)


def t_errors():
    need_stage()
    q = torch.randn(2, 1, 8, 64, device="cuda").half()
    kc = torch.zeros(2, 64, 2, 64, device="cuda").half()
    lens = torch.zeros(2, dtype=torch.int32, device="cuda")
    raises(ValueError, kvcache, torch.randn(2, 17, 8, 64, device="cuda").half(), kc, kc,
           cache_seqlens=lens, match=[WHO, "1 to 16"])
    raises(TypeError, kvcache, q, kc, kc, cache_seqlens=lens.long(), match=[WHO, "int32"])
    raises(TypeError, kvcache, q, kc, kc, cache_seqlens=lens[:1], match=[WHO, "[B] = [2]"])
    raises(TypeError, kvcache, q.float(), kc.float(), kc.float(), match=[WHO, "float32"])
    raises(TypeError, kvcache, q.cpu(), kc, kc, match=[WHO, "CUDA"])
    raises(ValueError, kvcache, q, kc, kc, q[:, :, :2], q[:, :, :2], match=[WHO, "cache_seqlens"])
    raises(ValueError, kvcache, q, kc, kc, q[:, :, :2], None, cache_seqlens=lens,
           match=[WHO, "k and v together"])
    raises(ValueError, kvcache, q, kc, kc, cache_seqlens=65, match=[WHO, "past the cache"])
    kc3 = torch.zeros(2, 64, 3, 64, device="cuda").half()
    raises(ValueError, kvcache, q, kc3, kc3, match=[WHO, "heads"])
    raises(ValueError, kvcache, q, kc[:1], kc[:1], match=[WHO, "sequences"])
    table = torch.zeros(2, 4, dtype=torch.int32, device="cuda")
    pages = torch.zeros(8, 24, 2, 64, device="cuda").half()
    raises(ValueError, kvcache, q, pages, pages, cache_seqlens=lens, block_table=table,
           match=[WHO, "power of two"])
    raises(TypeError, kvcache, q, kc, kc, cache_seqlens=lens, block_table=table.long(),
           match=[WHO, "block_table"])
    flat = torch.zeros(2 * 64 * 2 * 64 + 8, device="cuda").half()
    off = flat[8:].view(2, 64, 2, 64)  # 16 bytes in: aligned; 2 elements in: not
    raises(ValueError, kvcache, q, flat[2:2 + off.numel()].view(2, 64, 2, 64), off,
           cache_seqlens=lens, match=[WHO, "aligned"])
    try:  # a stage without a decode pass, where one is built
        _library.stage_library("stage5_tuned")
        raises(ValueError, kvcache, q, kc, kc, cache_seqlens=lens, stage="stage5_tuned",
               match=[WHO, "no decode pass"])
    except flashcourse.LibraryNotBuiltError:
        pass
    # nothing to attend to: empty outputs as an empty softmax gives them, the LSE +inf as
    # flash-attn's
    out, lse = kvcache(q, kc[:, :0], kc[:, :0], return_softmax_lse=True)
    assert not out.any() and bool((lse == math.inf).all()), lse


def t_cached_no_sync():
    # a repeated call runs from the call cache (no new plan) and never waits for the GPU
    need_stage()
    q, kc, vc, table, lens = run_case(2, 8, 2, 4, 128, 16, 1, True, "float16", seed=11)
    k = torch.randn(2, 1, 2, 128, device="cuda").half()
    seqlens = torch.tensor([5, 40], dtype=torch.int32, device="cuda")
    kvcache(q, kc, vc, k, k, cache_seqlens=seqlens, block_table=table, causal=True)
    calls, plans = len(_run.kv_calls), len(_plans._plans)
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            kvcache(q, kc, vc, k, k, cache_seqlens=seqlens, block_table=table, causal=True)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert (len(_run.kv_calls), len(_plans._plans)) == (calls, plans)


def t_cuda_graph():
    # captured once, replayed with new lengths, queries and keys in the same tensors: the same
    # answers and cache as eager calls
    need_stage()
    g = torch.Generator(device="cuda").manual_seed(3)
    B, H, H_kv, D, ps = 3, 8, 2, 128, 16
    kc, vc, table = make_cache(B, H_kv, D, torch.float16, None, ps, g, 320)
    q = torch.randn(B, 4, H, D, generator=g, device="cuda").half()
    k, v = (torch.randn(B, 1, H_kv, D, generator=g, device="cuda").half() for _ in range(2))
    seqlens = torch.tensor([0, 20, 100], dtype=torch.int32, device="cuda")
    eager_kc, eager_vc = kc.clone(), vc.clone()
    kvcache(q, eager_kc, eager_vc, k, v, cache_seqlens=seqlens, block_table=table, causal=True)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm up (plans) off the capture
        kvcache(q, kc.clone(), vc.clone(), k, v, cache_seqlens=seqlens, block_table=table,
                causal=True)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = kvcache(q, kc, vc, k, v, cache_seqlens=seqlens, block_table=table,
                           causal=True, return_softmax_lse=True)
    for step, lens0 in enumerate(([0, 20, 100], [7, 64, 250], [1, 0, 300])):
        seqlens.copy_(torch.tensor(lens0, dtype=torch.int32))
        q.copy_(torch.randn(q.shape, generator=g, device="cuda").half())
        k.copy_(torch.randn(k.shape, generator=g, device="cuda").half())
        before_kc, before_vc = kc.clone(), vc.clone()
        graph.replay()
        want_kc, want_vc = before_kc.clone(), before_vc.clone()
        want, want_lse = kvcache(q, want_kc, want_vc, k, v, cache_seqlens=seqlens,
                                 block_table=table, causal=True, return_softmax_lse=True)
        assert torch.equal(out, want) and torch.equal(lse, want_lse), f"replay {step}"
        assert torch.equal(kc, want_kc) and torch.equal(vc, want_vc), f"replay {step}: cache"
        check_against(out, lse, q, kc, vc, table, [n + 1 for n in lens0], True,
                      1 / math.sqrt(D), f"replay {step}")


def main():
    print(f"flash_attn_with_kvcache tests: libraries in {flashcourse.library_dir()}, "
          f"torch {torch.__version__ if torch is not None else 'absent'}, "
          f"GPU {torch.cuda.get_device_name() if HAVE_GPU else 'none'}")
    run("flash_attn_with_kvcache: flash-attn 2's parameter list", t_signature)
    run("keywords the stage does not compute: NotImplementedError naming them", t_refused_keywords)
    run("missing library says make lib", t_missing_library)
    run("attn_lib_request and attn_stage: the ctypes mirror is the C layout", t_abi_mirror)
    run("the library's decode entry: checks in C (fake stages)", t_c_decode_checks)
    run("contiguous and paged (16, 256), ragged with 0, new keys, GQA 4:1, MQA, fp16, bf16, "
        "N_q 1 and 4 vs float64", t_cases)
    run("cache_seqlens as an int, None, a tensor; a fused projection's q", t_seqlens_forms)
    run("bad arguments: one line naming flash_attn_with_kvcache", t_errors)
    run("plans cached, no synchronisation", t_cached_no_sync)
    run("a CUDA graph captures a decode step and replays it with new lengths", t_cuda_graph)
    return summary()


if __name__ == "__main__":
    sys.exit(main())
