#!/usr/bin/env python3
"""Tests of python/flashcourse and the stage libraries (make lib).

    PYTHONPATH=python python3 python/tests/test_binding.py [--quick]

Without a GPU or without PyTorch, the tests that need them print `skipped`; the rest (the
descriptors, the C entry point's own argument checks, the missing-library and unknown-stage
errors) run anywhere. On a GPU: every stage and every variant through the binding against a
float64 PyTorch reference with the checker's rule (common/reference.c: fp16 stages pass at
2x the error of a correct fp16 computation + 1e-4, fp32 stages at 1e-4 (1 + max|O|); LSE to
5e-4 / 5e-5 relative), causal and not, tails, a custom scale, peaky inputs, one long row
sampled; every bad input of the binding; the current stream. Ends with "N passed, M failed".
--quick: fewer shapes per variant. --smem-limit BYTES: run the stages as on a GPU with that much
shared memory per block (65536: a T4, 101376: an L4), with a PTX-only build for that GPU.
"""

import ctypes
import dataclasses
import inspect
import math
import os
import struct
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
import flashcourse  # noqa: E402
from flashcourse import _library, _plans, _run, api  # noqa: E402

QUICK = "--quick" in sys.argv
SMEM_LIMIT = int(sys.argv[sys.argv.index("--smem-limit") + 1]) if "--smem-limit" in sys.argv else None

try:
    import torch
    HAVE_TORCH = True
except ImportError:
    torch = None
    HAVE_TORCH = False
HAVE_GPU = HAVE_TORCH and torch.cuda.is_available()

from harness import Skip, run, summary  # noqa: E402  (the runner, shared with the other test)


def need_gpu():
    if not HAVE_TORCH:
        raise Skip("no PyTorch here")
    if not HAVE_GPU:
        raise Skip("no CUDA GPU here")


def python_path():
    """Eager calls by the binding's Python path inside the block, whatever eager_path() says:
    where a test reads the plan attention() differentiates with (o.grad_fn.bp), which the C++
    operator's autograd node does not show; both paths plan alike (_attention_checked)."""
    return _run.PythonPath()


def raises(exc, fn, *args, match=None, **kw):
    """fn(*args, **kw) must raise exc (not a subclass's sibling), with `match` in its message."""
    try:
        fn(*args, **kw)
    except exc as e:
        msg = str(e)
        if "\n" in msg.strip():
            raise AssertionError(f"message is not one line: {msg!r}")
        for m in [match] if isinstance(match, str) else (match or []):
            if m not in msg:
                raise AssertionError(f"{exc.__name__} message {msg!r} lacks {m!r}")
        return msg
    except Exception as e:
        raise AssertionError(f"expected {exc.__name__}, got {type(e).__name__}: {e}")
    raise AssertionError(f"expected {exc.__name__}, nothing raised")


def check_raw(stage, device, shape, causal, scale, variant, smem_limit=0, backward=False):
    """attn_lib_plan without a plan: the workspace bytes, or the error it raises (no torch
    needed)."""
    library = _library.stage_library(stage)
    ws = ctypes.c_size_t(0)
    B, H, N, D = shape
    r = _plans.request(backward, device, (B, H, N, D, H, N, None), causal, scale, variant,
                       smem_limit, False)
    library.check(library.plan(ctypes.byref(r), None, 0, ctypes.byref(ws)), "attn_lib_plan")
    return ws.value


def raw_plan(stage, backward, device, shape, causal, scale, variant, smem_limit=0):
    """A plan of the C entry point for a contiguous [B, H, N, D] shape, unchecked by Python."""
    B, H, N, D = shape
    return _plans._Plan(_library.stage_library(stage), backward, device,
                        (B, H, N, D, H, N, None), causal, scale, variant, smem_limit)


def forward_raw(stage, device, shape, causal, scale, variant, ptrs, workspace_bytes=0):
    """attn_lib_forward on raw pointers: a plan of the C entry point, run as it is."""
    p = raw_plan(stage, False, device, shape, causal, scale, variant)
    _run.forward_raw(p, ptrs, workspace_bytes)


# ---- CPU: descriptors and the C entry point's own checks ----

def source_stages():
    return sorted(p.parent.name for p in _library.REPO.glob("stage[0-9]*/attention.cu"))


def t_descriptors():
    built = flashcourse.stages()
    names = [s.name for s in built]
    assert names == source_stages(), f"built {names}, sources {source_stages()}"
    for s in built:
        assert Path(s.path).name == f"lib{s.name}.so", s
        assert s.variants[0] == "default", s
        want = "float32" if s.name.split("_")[0] in ("stage0", "stage1") else "float16"
        assert s.dtype == want, f"{s.name}: dtype {s.dtype}, want {want}"
        assert s.adds, s


def t_module_main():
    env = dict(os.environ, PYTHONPATH=str(HERE.parent))
    out = subprocess.run([sys.executable, "-m", "flashcourse"], env=env, capture_output=True,
                         text=True, check=True).stdout
    for s in source_stages():
        assert s in out, f"{s} missing from:\n{out}"


def t_missing_library():
    old = os.environ.get("FLASHCOURSE_LIB_DIR")
    with tempfile.TemporaryDirectory() as d:
        os.environ["FLASHCOURSE_LIB_DIR"] = d
        try:
            raises(flashcourse.LibraryNotBuiltError, flashcourse.stages, match="make lib")
            raises(flashcourse.LibraryNotBuiltError, flashcourse.attention, None, None, None,
                   stage="stage5_tuned", match=["make lib", "libstage5_tuned.so"])
        finally:
            if old is None:
                del os.environ["FLASHCOURSE_LIB_DIR"]
            else:
                os.environ["FLASHCOURSE_LIB_DIR"] = old


def t_unknown_stage():
    raises(ValueError, flashcourse.attention, None, None, None, stage="stage9_magic",
           match=["unknown stage", "stage5_tuned"])
    raises(TypeError, flashcourse.attention, None, None, None, stage=5)


def t_c_argument_checks():
    # Checked in C before any device is touched: the same on a machine without a GPU.
    for s in flashcourse.stages():
        raises(ValueError, check_raw, s.name, 0, (1, 1, 64, 64), 0, 0.125, 99,
               match=[s.name, "variant index 99"])
        raises(ValueError, check_raw, s.name, 0, (1, 0, 64, 64), 0, 0.125, 0,
               match=[s.name, ">= 1"])
        raises(ValueError, check_raw, s.name, 0, (1, 1, 64, 64), 0, -1.0, 0,
               match=[s.name, "scale"])
        raises(ValueError, check_raw, s.name, 0, (1, 1, 64, 64), 0, float("nan"), 0,
               match=[s.name, "scale"])
        for D in (24, 36, 100, 264):  # not a head dim: a multiple of 8 from 32 to 256
            raises(ValueError, check_raw, s.name, 0, (1, 1, 64, D), 0, 0.125, 0,
                   match=f"{s.name}: head dim must be a multiple of 8 from 32 to 256 (got {D})")


def t_no_gpu_message():
    if HAVE_GPU or (not HAVE_TORCH and _nvidia_smi()):
        raise Skip("a GPU is here")
    # the program's words (common/main.c), not CUDA's "driver version is insufficient"
    for s in flashcourse.stages():
        for D in (64, 32, 96, 248, 256):  # head dims pass the usage rule: the device is asked
            raises(RuntimeError, check_raw, s.name, 0, (1, 1, 64, D), 0, 0.125, 0,
                   match=[s.name, "no NVIDIA GPU here"])


def _nvidia_smi():
    try:
        return subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode == 0
    except OSError:
        return False


def t_without_torch():
    if HAVE_TORCH:
        raise Skip("PyTorch is installed here")
    raises(ImportError, flashcourse.attention, None, None, None, match="install torch")


HOPPER_BWD, BWD = _library.HOPPER_BACKWARD_STAGE, _library.BACKWARD_STAGE


def t_auto_backward_choice():
    # backward_stage="auto" is every entry point's default, and its choice, with the library's
    # answers faked (no GPU, no PyTorch, no library needed): stage 8 where its backward plans on
    # the device (within smem_limit) and it takes what the call asks (bits, variant), else
    # stage 7; probed once per device and limit; _plan and _takes_strides resolve it too.
    sdpa, fa = flashcourse.scaled_dot_product_attention, flashcourse.flash_attn_func
    for fn, param in ((flashcourse.attention, "backward_stage"), (sdpa, "backward_stage"),
                      (fa, "backward_stage"), (flashcourse.attention_backward, "stage")):
        default = inspect.signature(fn).parameters[param].default
        assert default == "auto", f"{fn.__name__}({param}={default!r})"
    assert "auto_backward_stage" in flashcourse.__all__
    b, P = _library, _plans
    every = b.TAKES_BF16 | b.TAKES_GQA | b.TAKES_STRIDES | b.TAKES_N_K

    def stage(name, variants=("default",), takes=0, backward_takes=0):
        return flashcourse.Stage(name=name, dtype="float16", variants=variants, adds="", path="",
                                 backward=bool(backward_takes), takes=takes,
                                 backward_takes=backward_takes)

    descs = {s.name: s for s in (
        stage("stage5_tuned"), stage(b.HOPPER_STAGE, takes=every),
        stage(BWD, ("default", "deterministic", "registers"), backward_takes=every),
        stage(HOPPER_BWD, ("default", "deterministic"), takes=every, backward_takes=every))}
    planned = []  # (stage, backward, device, smem_limit, D) of every plan made

    class FakePlan:  # the library's plan: the Hopper stages run on device 0 with >= 100000 B
        def __init__(self, library, backward, device, geometry, causal, s32, vi, smem_limit,
                     bf16=False, cache=None, local=None, varlen=None):
            name, D = library.stage.name, geometry[3]
            planned.append((name, backward, device, smem_limit, D))
            if D % 8 or not 32 <= D <= 256:  # the library's usage rule, every stage
                raise ValueError(f"{name}: head dim must be a multiple of 8 from 32 to 256")
            if name in (b.HOPPER_STAGE, HOPPER_BWD) and device == 2 and D != 200:
                raise ValueError(f"{name}: this fake compiled D = 200 alone on device 2")
            if name in (b.HOPPER_STAGE, HOPPER_BWD) and device not in (0, 2):
                raise ValueError(f"{name}: needs a Hopper GPU (sm_90)")
            if name in (b.HOPPER_STAGE, HOPPER_BWD) and D == 96:  # one the stage did not compile
                raise ValueError(f"{name}: head dim 96 is not compiled here")
            if name in (BWD, "stage5_tuned") and D == 200:
                raise ValueError(f"{name}: head dim 200 is not compiled here")
            if name == HOPPER_BWD and backward and D > 128 and \
                    library.stage.variants[vi] == "deterministic":  # as stage 8's unsupported()
                raise ValueError(f"{name}: variant deterministic runs head dims up to 128")
            if name == HOPPER_BWD and 0 < smem_limit < 100000:
                raise ValueError(f"{name}: the backward needs 100000 bytes of shared memory")
            self.stage = name

    fake_torch = SimpleNamespace(float16="float16", bfloat16="bfloat16")
    saved = (P.stage_library, P._Plan, b.torch_mod, dict(P._probed), dict(P._plans))
    P.stage_library = lambda name, who=None: SimpleNamespace(stage=descs[name])
    P._Plan = FakePlan
    if not HAVE_TORCH:
        b.torch_mod = fake_torch
    f16 = b._torch().float16
    for cache in (P._probed, P._plans):
        cache.clear()
    try:
        def choose(device, asks=0, variant="default", smem_limit=0):
            return P.resolve("auto", True, device, asks, variant, smem_limit)

        assert P.resolve("stage7_backward", True, 0) == "stage7_backward", "a name as given"
        assert choose(0) == HOPPER_BWD
        assert choose(0, b.TAKES_BF16 | b.TAKES_GQA | b.TAKES_N_K) == HOPPER_BWD
        assert choose(0, b.TAKES_LOCAL) == BWD, "a local window this stage 8 does not take"
        assert choose(0, b.TAKES_SOFTCAP) == BWD, "a softcap this stage 8 does not take"
        assert choose(0, b.TAKES_VARLEN) == BWD, "a packed batch this stage 8 does not take"
        assert choose(0, 0, "registers") == BWD, "a variant stage 8 lacks"
        assert choose(0, 0, "default", 65536) == BWD, "an smem_limit stage 8 does not fit"
        assert choose(0, 0, "default", 200000) == HOPPER_BWD
        assert choose(1) == BWD, "a device stage 8 does not run on"
        probes = len(planned)
        assert {(p[0], p[1], p[4]) for p in planned} == {(HOPPER_BWD, True, 64),
                                                          (HOPPER_BWD, True, 128)}, planned
        for _ in range(3):  # cached: no plan made again
            choose(0), choose(1), choose(0, 0, "default", 65536), choose(0, b.TAKES_GQA)
        assert len(planned) == probes, planned[probes:]
        # a head dim the first choice did not compile: the other where it runs it, either way;
        # one neither runs (outside the range): the first, whose plan says why; probed once
        assert choose(0, 0, "default", 0) == HOPPER_BWD
        assert P.resolve("auto", True, 0, 0, "default", 0, 96) == BWD
        assert P.resolve("auto", False, 0, 0, "default", 0, 96) == b.FORWARD_STAGE
        assert P.resolve("auto", True, 0, 0, "default", 0, 200) == HOPPER_BWD
        assert P.resolve("auto", True, 2, 0, "default", 0, 200) == HOPPER_BWD, "the other way"
        assert P.resolve("auto", False, 2, 0, "default", 0, 200) == b.HOPPER_STAGE
        assert P.resolve("auto", True, 2, 0, "default", 0, 64) == BWD
        assert P.resolve("auto", True, 1, 0, "default", 0, 200) == BWD, "neither: the first"
        assert P.resolve("auto", True, 0, 0, "default", 0, 100) == HOPPER_BWD
        assert P.resolve("auto", True, 0, 0, "registers", 0, 96) == BWD
        # a D the first compiled but not in the call's backward variant: the other
        assert P.resolve("auto", True, 0, 0, "deterministic", 0, 256) == BWD
        assert P.resolve("auto", True, 0, 0, "deterministic", 0, 136) == BWD
        assert P.resolve("auto", True, 0, 0, "default", 0, 256) == HOPPER_BWD
        assert P.resolve("auto", True, 0, 0, "deterministic", 0, 64) == HOPPER_BWD
        assert P.resolve("auto", True, 0, 0, "deterministic", 0, 120) == HOPPER_BWD
        assert P.resolve("auto", False, 0, 0, "deterministic", 0, 200) == b.HOPPER_STAGE
        assert P.resolve("auto", True, 2, b.TAKES_LOCAL, "default", 0, 200) == BWD, \
            "stage 8 does not take the window: stage 7's plan says why not"
        probes = len(planned)
        for D in (96, 200, 100):
            P.resolve("auto", True, 0, 0, "default", 0, D)
        assert len(planned) == probes, planned[probes:]
        # the forward's "auto": stage 6 where it plans, else stage 5, by the same function
        assert P.resolve("auto", False, 0) == b.HOPPER_STAGE
        assert P.resolve("auto", False, 1) == b.FORWARD_STAGE
        # plan() resolves "auto" for the backward (the backward's choice) and the forward (its own)
        g = (1, 4, 64, 64, 2, 96, None)  # grouped-query heads, N_k != N: stage 8 takes them
        assert P.plan("auto", True, g, 0, f16, True, 0.125, "default", 0).stage == HOPPER_BWD
        assert P.plan("auto", True, g, 1, f16, True, 0.125, "default", 0).stage == BWD
        assert P.plan("auto", True, g, 0, f16, True, 0.125, "registers", 0).stage == BWD
        assert P.plan("auto", False, g, 0, f16, True, 0.125, "default", 0).stage == \
            b.HOPPER_STAGE
        # a packed batch (varlen: total_q, total_k) asks for TAKES_VARLEN: this stage 8 lacks it
        assert P.plan("auto", True, g, 0, f16, True, 0.125, "default", 0,
                      varlen=(300, 500)).stage == BWD
        # takes_strides on the resolved names
        assert P.takes_strides(P.resolve("auto", False, 0), choose(0))
        assert not P.takes_strides(P.resolve("auto", False, 1), choose(1))
        assert P.takes_strides(b.HOPPER_STAGE, choose(1))  # stage 7's backward takes strides
        # a stage 8 that did not take bf16 or strides: stage 7 for a call that asks for them
        descs[HOPPER_BWD] = dataclasses.replace(descs[HOPPER_BWD],
                                                backward_takes=b.TAKES_GQA | b.TAKES_N_K)
        assert choose(0, b.TAKES_BF16) == BWD and choose(0, b.TAKES_GQA) == HOPPER_BWD
        assert not P.takes_strides(b.HOPPER_STAGE, choose(0))
        assert P.takes_strides(b.HOPPER_STAGE, choose(0, 0, "registers"))
    finally:
        P.stage_library, P._Plan, b.torch_mod = saved[:3]
        for cache, old in zip((P._probed, P._plans), saved[3:]):
            cache.clear()
            cache.update(old)


def t_one_auto_resolver():
    # "auto" is resolved in one function (_plans.resolve): no other module of the package
    # compares a stage with "auto" to pick one, and the package imports in one direction.
    import ast
    pkg = HERE.parent / "flashcourse"
    order = ["_version", "_library", "_plans", "_run", "_ops", "api", "dropins", "varlen", "_ring",
             "ring", "__init__"]
    for path in sorted(pkg.glob("*.py")):
        tree = ast.parse(path.read_text())
        if path.stem != "__main__":
            assert path.stem in order, f"{path.name} is not in the package's order {order}"
        assert len(path.read_text().splitlines()) <= 450, f"{path.name} is over 450 lines"
        for node in tree.body:  # imports at import time (module level) go back in the order only
            if isinstance(node, ast.ImportFrom) and node.level == 1 and path.stem in order:
                names = [node.module] if node.module else [a.name for a in node.names]
                for m in names:
                    assert order.index(m) < order.index(path.stem), \
                        f"{path.name} imports {m} at import time: against the package's order"
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.name in (
                    "_auto_stage", "_auto_backward_stage", "_resolve_backward_stage"):
                raise AssertionError(f"{path.name} defines {node.name}: resolve is the one place")
    src = (pkg / "_plans.py").read_text()
    assert src.count("def resolve(") == 1


# ---- GPU: results against the float64 reference ----

def scale32(x):
    return struct.unpack("f", struct.pack("f", x))[0]


def reference(q, k, v, causal, scale, rows=None):
    """float64 O and LSE, and O of a correct fp16 computation (P and O rounded to fp16, as
    common/reference.c's ref_row), at the query rows given (all if None)."""
    N = q.shape[2]
    q64, k64, v64 = q.double(), k.double(), v.double()
    if rows is not None:
        q64 = q64[:, :, rows]
    s = torch.matmul(q64, k64.transpose(-1, -2)) * scale
    if causal:
        qi = rows if rows is not None else torch.arange(N, device=q.device)
        mask = torch.arange(N, device=q.device)[None, :] > qi[:, None]
        s.masked_fill_(mask, -math.inf)
    m = s.amax(-1, keepdim=True)
    p = torch.exp(s - m)
    l = p.sum(-1, keepdim=True)
    o = (p @ v64) / l
    o16 = ((p.float().half().double() @ v64) / l).float().half().double()
    return o, (m + l.log()).squeeze(-1), o16


def check(o, lse, q, k, v, causal, scale, f16, rows=None):
    """The checker's rule; returns a description of the miss, or None."""
    oe, le, o16 = reference(q, k, v, causal, scale, rows)
    nonfinite = int((~torch.isfinite(o)).sum()) + int((~torch.isfinite(lse)).sum())
    if rows is not None:
        o, lse = o[:, :, rows], lse[:, :, rows]
    err = float((o.double() - oe).abs().max())
    lerr = float(((lse.double() - le).abs() / (1 + le.abs())).max())
    if f16:
        bound, lbound = 2 * float((o16 - oe).abs().max()) + 1e-4, 5e-4
    else:
        bound, lbound = 1e-4 * (1 + float(oe.abs().max())), 5e-5
    if nonfinite or not err <= bound or not lerr <= lbound:
        return (f"max_abs_err {err:.3g} (bound {bound:.3g}), lse_err {lerr:.3g} "
                f"(bound {lbound:.1g}), {nonfinite} NaN/Inf")
    return None


def make_qkv(shape, dtype, seed, peaky=False):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = (torch.randn(shape, generator=g, device="cuda", dtype=torch.float32)
               for _ in range(3))
    if peaky:
        q = q * 8
    return q.to(dtype), k.to(dtype), v.to(dtype)


CASES = [  # (B, H, N, D, causal, scale or None, peaky)
    (1, 1, 1, 64, False, None, False),
    (1, 1, 1, 128, True, None, False),
    (2, 3, 17, 64, True, None, False),
    (1, 2, 65, 128, False, None, False),
    (1, 2, 65, 128, True, None, False),
    (2, 3, 129, 64, False, None, False),
    (2, 3, 129, 64, True, None, False),
    (1, 2, 300, 128, True, None, False),
    (1, 2, 1000, 128, False, None, False),
    (1, 1, 2047, 64, True, None, False),
    (1, 1, 2047, 128, False, None, False),
    (1, 2, 129, 128, True, 0.3, False),  # custom scale
    (2, 1, 100, 64, False, 2.0, False),
    (1, 2, 255, 64, True, None, True),  # peaky: each query attends to a few keys
    (1, 1, 32768, 128, False, None, False),  # long: 256 sampled rows
]
QUICK_CASES = [CASES[i] for i in (2, 4, 7, 11, 13)]


def t_variant(st, variant, cases):
    need_gpu()
    f16 = st.dtype == "float16"
    misses, unsupported = [], []
    for ci, (B, H, N, D, causal, scale, peaky) in enumerate(cases):
        q, k, v = make_qkv((B, H, N, D), st.torch_dtype, 1000 + ci, peaky)
        try:
            o, lse = flashcourse.attention(q, k, v, causal=causal, scale=scale, stage=st.name,
                                           variant=variant, smem_limit=SMEM_LIMIT)
        except ValueError as e:  # unsupported on this GPU: the stage said why
            print(f"         {st.name} {variant} {(B, H, N, D)}: unsupported here: {e}")
            unsupported.append(str(e))
            continue
        assert o.shape == q.shape and o.dtype == q.dtype and o.device == q.device
        assert lse.shape == (B, H, N) and lse.dtype == torch.float32
        sc = scale32(scale if scale is not None else 1 / math.sqrt(D))
        rows = None
        if N > 4096:
            rows = torch.unique(torch.cat([torch.tensor([0, N - 1]),
                                           torch.randint(0, N, (254,))])).cuda()
        miss = check(o, lse, q, k, v, causal, sc, f16, rows)
        if miss:
            misses.append(f"B={B} H={H} N={N} D={D} causal={causal} scale={scale} "
                          f"peaky={peaky}: {miss}")
        # poison what the allocator hands out next, as the program poisons O before a run
        o.fill_(float("nan"))
        lse.fill_(float("nan"))
        del o, lse
    assert not misses, "\n".join(misses)
    if len(unsupported) == len(cases):  # nothing was checked: not a pass
        raise Skip(f"unsupported here: {unsupported[0]}")


# ---- GPU: what models feed (bf16, grouped-query heads, strides, N_q != N_k) ----

def model_reference(q, k, v, causal, scale, dtype):
    """float64 O and LSE of q [B, H, N, D] against k, v [B, H_kv, N_k, D] (query head h reads
    key/value head h // (H // H_kv); causal aligned to the bottom right: query i sees keys
    <= i + N_k - N; a row that sees none: O = 0, LSE = -inf), and O of a correct 16-bit
    computation (P and O rounded to `dtype`), as common/reference.c's ref_row."""
    B, H, N, D = q.shape
    H_kv, N_k = k.shape[1], k.shape[2]
    k64 = k.double().repeat_interleave(H // H_kv, dim=1)
    v64 = v.double().repeat_interleave(H // H_kv, dim=1)
    s = torch.matmul(q.double(), k64.transpose(-1, -2)) * scale
    if causal:
        keys = torch.arange(N_k, device=q.device)[None, :]
        s = s.masked_fill(keys > torch.arange(N, device=q.device)[:, None] + (N_k - N), -math.inf)
    m = s.amax(-1, keepdim=True)
    none = m == -math.inf  # rows that see no key
    p = torch.exp(s - torch.where(none, torch.zeros_like(m), m))
    l = p.sum(-1, keepdim=True)
    safe = torch.where(none, torch.ones_like(l), l)

    def rnd(x):
        return x.float().to(dtype).double()

    o = torch.where(none, 0.0, (p @ v64) / safe)
    o16 = torch.where(none, 0.0, rnd((rnd(p) @ v64) / safe))
    lse = torch.where(none, -math.inf, m + safe.log()).squeeze(-1)
    return o, lse, o16


def model_miss(o, lse, q, k, v, causal, scale):
    """The checker's rule for a 16-bit stage on these inputs; a description, or None."""
    oe, le, o16 = model_reference(q, k, v, causal, scale, q.dtype)
    none = le == -math.inf
    bad = int((~torch.isfinite(o)).sum()) + int((~torch.isfinite(lse) & ~none).sum())
    bad += int((lse[none] != -math.inf).sum())
    err = float((o.double() - oe).abs().max())
    lfin = torch.where(none, 0.0, le)
    lerr = float(torch.where(none, 0.0, (lse.double() - lfin).abs() / (1 + lfin.abs())).max())
    bound = 2 * float((o16 - oe).abs().max()) + 1e-4
    if bad or not err <= bound or not lerr <= 5e-4:
        return (f"max_abs_err {err:.3g} (bound {bound:.3g}), lse_err {lerr:.3g}, "
                f"{bad} non-finite or wrong -inf")
    return None


# (B, H, H_kv, N, N_k, D, causal, layout); layout: "bhnd", "bnhd" ([B, N, H, D] views), "qkv"
# (views of one fused [B, N, 3, H, D] projection)
MODEL_CASES = [
    (2, 4, 4, 300, 300, 64, True, "bnhd"),
    (1, 8, 2, 257, 257, 128, False, "bhnd"),
    (2, 8, 1, 129, 129, 64, True, "bnhd"),  # MQA
    (1, 6, 3, 100, 100, 128, True, "qkv"),
    (2, 4, 2, 1, 1000, 128, True, "bhnd"),  # one decode step
    (1, 4, 4, 17, 1000, 64, True, "bnhd"),
    (1, 4, 1, 500, 1000, 128, False, "bhnd"),
    (2, 2, 2, 2000, 1000, 64, True, "bnhd"),  # N > N_k: the first 1000 rows see no key
    (1, 8, 8, 4097, 4097, 128, True, "qkv"),
]


def make_model_inputs(case, dtype, seed):
    B, H, H_kv, N, N_k, D, causal, layout = case
    g = torch.Generator(device="cuda").manual_seed(seed)

    def rand(*shape):
        return torch.randn(shape, generator=g, device="cuda").to(dtype)

    if layout == "qkv":
        q, k, v = (t.transpose(1, 2) for t in rand(B, N, 3, H, D).unbind(2))
    elif layout == "bnhd":
        q, k, v = (rand(B, N, H, D).transpose(1, 2), rand(B, N_k, H_kv, D).transpose(1, 2),
                   rand(B, N_k, H_kv, D).transpose(1, 2))
    else:
        q, k, v = rand(B, H, N, D), rand(B, H_kv, N_k, D), rand(B, H_kv, N_k, D)
    return q, k, v


def model_dtypes(st):
    return [torch.float16] + ([torch.bfloat16] if st.takes & _library.TAKES_BF16 else [])


def t_model_inputs(st):
    need_gpu()
    want = _library.TAKES_GQA | _library.TAKES_STRIDES | _library.TAKES_N_K
    if st.takes & want != want:
        raise Skip(f"{st.name} takes the plain case only")
    misses, ran = [], 0
    for dtype in model_dtypes(st):
        for ci, case in enumerate(MODEL_CASES):
            q, k, v = make_model_inputs(case, dtype, 3000 + ci)
            sc = scale32(1 / math.sqrt(case[5]))
            try:
                o, lse = flashcourse.attention(q, k, v, causal=case[6], stage=st.name,
                                               smem_limit=SMEM_LIMIT)
            except ValueError as e:  # e.g. bf16 on the T4's path: the stage says why
                print(f"         {st.name} {case} {dtype}: unsupported here: {e}")
                continue
            ran += 1
            assert o.shape == q.shape and o.dtype == dtype and lse.shape == q.shape[:3]
            miss = model_miss(o, lse, q, k, v, case[6], sc)
            if miss:
                misses.append(f"{case} {dtype}: {miss}")
            o.fill_(float("nan"))
            del o, lse
    assert not misses, "\n".join(misses)
    if not ran:
        raise Skip("no case runs here")


def t_model_check_can_fail():
    need_gpu()
    # the rule catches a key/value head read for the wrong query head, a causal mask aligned to
    # the top left, and a no-key row given anything but O = 0, LSE = -inf
    q, k, v = make_model_inputs((1, 4, 2, 40, 60, 64, True, "bhnd"), torch.float16, 7)
    o, lse, _ = model_reference(q, k, v, True, 0.125, torch.float16)
    o, lse = o.half(), lse.float()
    assert model_miss(o, lse, q, k, v, True, 0.125) is None, "the reference fails itself"
    swapped = model_reference(q, k.flip(1), v.flip(1), True, 0.125, torch.float16)
    assert model_miss(swapped[0].half(), swapped[1].float(), q, k, v, True, 0.125), "GQA head"
    kr, vr = (t.double().repeat_interleave(2, dim=1) for t in (k, v))  # top-left aligned mask:
    sc = (q.double() @ kr.transpose(-1, -2)) * 0.125
    sc = sc.masked_fill(torch.ones(40, 60, dtype=torch.bool, device="cuda").triu(1), -math.inf)
    top_left = torch.softmax(sc, -1) @ vr
    assert model_miss(top_left.half(), lse, q, k, v, True, 0.125), "top-left causal not caught"
    q2, k2, v2 = make_model_inputs((1, 2, 2, 30, 10, 64, True, "bhnd"), torch.float16, 8)
    o2, l2, _ = model_reference(q2, k2, v2, True, 0.125, torch.float16)
    l2 = l2.float().clone()
    l2[0, 0, 0] = 0.0  # row 0 sees no key (N = 30 > N_k = 10): its LSE must be -inf
    assert model_miss(o2.half(), l2, q2, k2, v2, True, 0.125), "a no-key row's LSE not caught"


def model_forward_stage():
    """A built forward stage that takes what models feed and runs here (stage 6 on Hopper), or
    Skip."""
    want = _library.TAKES_GQA | _library.TAKES_STRIDES | _library.TAKES_N_K
    if flashcourse.stages() and _library.stage_library(flashcourse.auto_stage()).stage.takes & want == want:
        return flashcourse.auto_stage()
    raise Skip("no forward stage that takes grouped-query heads, strides and N_k != N runs here")


def t_flash_attn_func():
    need_gpu()
    model_forward_stage()
    # flash-attn's [B, N, H, D] signature against the reference, GQA and N_q != N_k included
    fa = flashcourse.flash_attn_func
    for ci, (B, N, N_k, H, H_kv, D, causal) in enumerate(
            [(2, 128, 128, 4, 4, 64, True), (1, 33, 200, 8, 2, 128, True),
             (2, 300, 100, 4, 1, 64, False), (1, 1, 513, 4, 4, 128, True)]):
        g = torch.Generator(device="cuda").manual_seed(4000 + ci)
        q = torch.randn((B, N, H, D), generator=g, device="cuda").half()
        k = torch.randn((B, N_k, H_kv, D), generator=g, device="cuda").half()
        v = torch.randn((B, N_k, H_kv, D), generator=g, device="cuda").half()
        o = fa(q, k, v, causal=causal)
        assert o.shape == q.shape and o.is_contiguous(), (tuple(o.shape), o.stride())
        oe, _, o16 = model_reference(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                     causal, scale32(1 / math.sqrt(D)), torch.float16)
        err = float((o.transpose(1, 2).double() - oe).abs().max())
        assert err <= 2 * float((o16 - oe).abs().max()) + 1e-4, f"case {ci}: {err:.3g}"
    q = torch.randn((1, 64, 2, 64), device="cuda").half()
    raises(NotImplementedError, fa, q, q, q, dropout_p=0.1, match="dropout")
    raises(ValueError, fa, q[0], q, q, match="[B, N, H, D]")


def t_model_inputs_backward(backward_stage="auto"):
    need_gpu()
    # gradients for these inputs where the backward stage takes them, else one clear error
    if not any(s.backward for s in flashcourse.stages()):
        raise Skip("no backward stage built")
    q, k, v = make_model_inputs((1, 8, 2, 100, 150, 64, True, "bnhd"), torch.float16, 21)
    leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
    want = _library.TAKES_GQA | _library.TAKES_STRIDES | _library.TAKES_N_K
    bst = _library.stage_library(backward_stage).stage if backward_stage != "auto" else None
    if bst is not None and bst.backward_takes & want != want:
        raises(ValueError, flashcourse.attention, *leaves, causal=True, stage="stage6_hopper",
               backward_stage=backward_stage, match=[bst.name, "does not take"])
        raise Skip(f"{bst.name}'s backward takes the plain case only: a clear error checked")
    try:
        o, _ = flashcourse.attention(*leaves, causal=True, stage=model_forward_stage(),
                                     backward_stage=backward_stage)
    except ValueError as e:
        if bst is None:
            raise
        raise Skip(f"{backward_stage} does not run here: {e}")
    if bst is None:  # auto: stage 8 takes these where it runs, as stage 7 does elsewhere
        with python_path():
            o2, _ = flashcourse.attention(*leaves, causal=True, stage=model_forward_stage())
        assert o2.grad_fn.bp.stage == flashcourse.auto_backward_stage(), o2.grad_fn.bp.stage
    do = torch.randn_like(o)
    o.backward(do)
    ref = [t.detach().double().requires_grad_(True) for t in (q, k, v)]
    oe, _, _ = model_reference(ref[0], ref[1], ref[2], True, scale32(1 / 8), torch.float16)
    exact = torch.autograd.grad(oe, ref, do.double())
    for name, g, ge in zip(("dq", "dk", "dv"), [t.grad for t in leaves], exact):
        err = float((g.double() - ge).abs().max())
        assert err <= 2e-2 * (1 + float(ge.abs().max())), f"{name}: {err:.3g}"


def t_check_can_fail():
    need_gpu()
    q, k, v = make_qkv((1, 2, 129, 64), torch.float16, 7)
    o, lse = flashcourse.attention(q, k, v, causal=True)
    sc = scale32(1 / 8)
    assert check(o, lse, q, k, v, True, sc, True) is None
    bad = o.clone()
    bad[0, 1, 100, 3] += 0.01
    assert check(bad, lse, q, k, v, True, sc, True) is not None, "a wrong O passed"
    assert check(o, lse + 1e-2, q, k, v, True, sc, True) is not None, "a wrong LSE passed"
    assert check(o, lse, q, k, v, False, sc, True) is not None, "causal ignored"
    nan = o.clone()
    nan[0, 0, 5, 5] = float("nan")
    assert check(nan, lse, q, k, v, True, sc, True) is not None, "a NaN passed"


def t_current_stream():
    need_gpu()
    # On a side stream: a long sleep, then q copied in, then attention. Run on any other
    # stream, attention would read q before the copy (zeros) and miss the reference.
    q, k, v = make_qkv((1, 4, 2048, 128), torch.float16, 11)
    q_late = torch.zeros_like(q)
    side = torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)
        q_late.copy_(q)
        o, lse = flashcourse.attention(q_late, k, v)
    side.synchronize()
    miss = check(o, lse, q, k, v, False, scale32(128 ** -0.5), True)
    assert miss is None, f"not on the current stream: {miss}"


def t_bad_inputs(st):
    need_gpu()
    name, dt = st.name, st.torch_dtype
    other = torch.float32 if dt == torch.float16 else torch.float16
    q, k, v = make_qkv((1, 2, 64, 64), dt, 3)
    call = flashcourse.attention
    raises(TypeError, call, q.cpu(), k, v, stage=name, match=[name, "CUDA", "cpu"])
    raises(TypeError, call, q, k.cpu(), v, stage=name, match=[name, "CUDA"])
    raises(TypeError, call, q.to(other), k, v, stage=name, match=[name, str(dt)])
    raises(TypeError, call, q, k, v.to(other), stage=name, match=[name, str(dt)])
    raises(TypeError, call, q.tolist(), k, v, stage=name, match=[name, "torch tensors"])
    raises(ValueError, call, q[0], k[0], v[0], stage=name, match=[name, "[B, H, N, D]"])
    raises(ValueError, call, q, k[:, :, :32], v, stage=name, match=[name, "one shape"])
    raises(ValueError, call, q.transpose(2, 3), k, v, stage=name, match=[name, "contiguous"])
    flat = torch.empty(q.numel() + 1, dtype=dt, device="cuda")
    raises(ValueError, call, flat[1:].view(q.shape), k, v, stage=name,
           match=[name, "aligned"])
    raises(ValueError, call, q, k, v, stage=name, variant="fastest",
           match=[name, "fastest", "default"])
    raises(ValueError, call, q, k, v, stage=name, scale=-1.0, match="scale")
    raises(ValueError, call, q, k, v, stage=name, scale=float("inf"), match="scale")
    raises(TypeError, call, q, k, v, stage=name, scale="big", match="scale")
    raises(TypeError, call, q, k, v, stage=name, causal="yes", match="causal")
    # whether this stage runs here at all (stage 6 needs sm_90a code and a Hopper GPU)
    try:
        check_raw(name, q.device.index or 0, tuple(q.shape), True, 0.125, 0)
        not_here = None
    except ValueError as e:
        not_here = str(e)
    qg = q.clone().requires_grad_(True)
    if st.dtype != "float16":  # the backward pass (stage 7) takes float16
        raises(TypeError, call, qg, k, v, stage=name, match=[name, "float16", "no_grad"])
    if not not_here:
        with torch.no_grad():
            call(qg, k, v, stage=name)  # fine without autograd
    # head dims: D = 96 is one (a multiple of 8 from 32 to 256) and reaches the stage, which runs
    # it or refuses it with its own reason (one it did not compile: stages 0-4); D = 100 is not
    # one, a usage error before any stage sees it
    q96, k96, v96 = make_qkv((1, 1, 64, 96), dt, 4)
    compiled_64_128 = name.startswith(("stage0", "stage1", "stage2", "stage3", "stage4"))
    try:
        o96, lse96 = call(q96, k96, v96, stage=name)
    except ValueError as e:
        msg = str(e)
        assert msg.startswith(f"{name}: ") and "\n" not in msg, msg
        assert "multiple of 8" not in msg, f"D = 96 refused as a usage error: {msg}"
        assert not compiled_64_128 or "head dim must be 64 or 128" in msg, msg
    else:
        assert not compiled_64_128, f"{name} ran D = 96"
        torch.cuda.synchronize()
        off = check(o96, lse96, q96, k96, v96, False, scale32(96 ** -0.5), st.dtype == "float16")
        assert off is None, f"{name} at D = 96: {off}"
    q100, k100, v100 = make_qkv((1, 1, 64, 100), dt, 4)
    raises(ValueError, call, q100, k100, v100, stage=name,
           match=f"{name}: head dim must be a multiple of 8 from 32 to 256 (got 100)")
    q0 = torch.empty((1, 1, 0, 64), dtype=dt, device="cuda")
    o0, lse0 = call(q0, q0, q0, stage=name)  # no rows: empty outputs, as torch answers
    assert o0.shape == q0.shape and tuple(lse0.shape) == (1, 1, 0), (o0.shape, lse0.shape)
    raises(ValueError, call, q, k, v, stage=name, smem_limit=100, match="smem_limit")
    raises(TypeError, call, q, k, v, stage=name, smem_limit="64k", match="smem_limit")
    if name.startswith("stage1"):  # its tiles need 64 KB (48 KB at D = 64)
        raises(ValueError, call, q, k, v, stage=name, smem_limit=16384,
               match=[name, "shared memory"])
    # the input survives, and a good call after all of these is still right
    if not_here:
        raise Skip(f"every bad input raised as it should; {name} does not run here: {not_here}")
    o, lse = call(q, k, v, stage=name, causal=True)
    torch.cuda.synchronize()
    assert check(o, lse, q, k, v, True, scale32(0.125), st.dtype == "float16") is None


def t_c_entry_checks():
    need_gpu()
    # What only the C entry point can see: too small a workspace, NULL pointers, and a CUDA
    # error from the stage (stage 5 returns cudaErrorMisalignedAddress for an odd pointer).
    q, k, v = make_qkv((1, 1, 64, 64), torch.float32, 5)
    o, lse = torch.empty_like(q), torch.empty((1, 1, 64), device="cuda")
    ptrs = [q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), lse.data_ptr(), None]
    sc = scale32(0.125)
    need = check_raw("stage0_naive", 0, (1, 1, 64, 64), False, sc, 0)
    assert need == 64 * 64 * 4, need
    raises(ValueError, forward_raw, "stage0_naive", 0, (1, 1, 64, 64), False, sc, 0,
           ptrs, 0, match=["stage0_naive", "NULL"])
    ws = torch.empty(need, dtype=torch.uint8, device="cuda")
    raises(ValueError, forward_raw, "stage0_naive", 0, (1, 1, 64, 64), False, sc, 0,
           ptrs[:5] + [ws.data_ptr()], need - 1, match=["stage0_naive", "workspace"])
    raises(ValueError, forward_raw, "stage0_naive", 0, (1, 1, 64, 64), False, sc, 0,
           [None] + ptrs[1:5] + [ws.data_ptr()], need, match="NULL")
    raises(ValueError, check_raw, "stage0_naive", 99, (1, 1, 64, 64), False, sc, 0,
           match="device 99")
    h = [t.half() for t in (q, k, v, o)]
    raises(RuntimeError, forward_raw, "stage5_tuned", 0, (1, 1, 64, 64), False, sc,
           0, [h[0].data_ptr() + 2] + [t.data_ptr() for t in h[1:]] + [lse.data_ptr(), None],
           match=["stage5_tuned", "forward failed", "misaligned"])
    torch.cuda.synchronize()  # the context is unharmed


def t_workspace_through_torch():
    need_gpu()
    # stage 0 needs [B, H, N, N] floats of scratch: it comes from PyTorch's allocator
    q, k, v = make_qkv((2, 2, 1024, 64), torch.float32, 9)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    o, lse = flashcourse.attention(q, k, v, stage="stage0_naive")
    peak = torch.cuda.max_memory_allocated() - base
    assert peak >= 2 * 2 * 1024 * 1024 * 4, f"peak {peak} bytes: workspace not from torch"


# ---- GPU: gradients (stage 7's backward pass through autograd) ----

def grad_reference(q, k, v, do, causal, scale, o):
    """dq, dk, dv of sum(o * do) on the stored values: exact (float64 autograd), and the same
    computation with the fp16 roundings a correct kernel makes (P, dS and the gradients rounded to
    fp16, the rest float64; D = rowsum(dO * O) from the forward's stored O, as the backward takes
    it), whose distance from the exact one sets the bound, as common/reference_bwd.c does."""
    N = q.shape[2]
    leaves = [t.detach().double().requires_grad_(True) for t in (q, k, v)]
    s = torch.matmul(leaves[0], leaves[1].transpose(-1, -2)) * scale
    if causal:
        mask = torch.ones(N, N, dtype=torch.bool, device=q.device).triu(1)
        s = s.masked_fill(mask, -math.inf)
    p = torch.softmax(s, dim=-1)
    exact = torch.autograd.grad(torch.matmul(p, leaves[2]), leaves, do.double())

    def f16(x):
        return x.float().half().double()

    q64, k64, v64, do64 = (t.detach().double() for t in (q, k, v, do))
    p = p.detach()
    p16 = f16(p)
    dp = do64 @ v64.transpose(-1, -2)
    ds16 = f16(p * (dp - (do64 * o.detach().double()).sum(-1, keepdim=True)))
    rounded = (f16(scale * ds16 @ k64), f16(scale * ds16.transpose(-1, -2) @ q64),
               f16(p16.transpose(-1, -2) @ do64))
    return exact, rounded


def grad_miss(got, q, k, v, do, causal, scale, o):
    """The pass rule of common/reference_bwd.c on dq, dk, dv: at most twice the error of the fp16
    computation plus 1e-4 (1 + max |exact|); NaN or Inf never passes. A description, or None.
    o: the forward's output, whose rounding the backward inherits through D = rowsum(dO * O)."""
    exact, f16 = grad_reference(q, k, v, do, causal, scale, o)
    misses = []
    for name, g, ge, gf in zip(("dq", "dk", "dv"), got, exact, f16):
        if g is None or g.shape != q.shape or g.dtype != q.dtype:
            misses.append(f"{name}: {None if g is None else (tuple(g.shape), g.dtype)}")
            continue
        err = float((g.double() - ge).abs().max())
        bound = 2 * float((gf.double() - ge).abs().max()) + 1e-4 * (1 + float(ge.abs().max()))
        if not torch.isfinite(g).all() or not err <= bound:
            misses.append(f"{name} max_abs_err {err:.3g} (bound {bound:.3g})")
    return "; ".join(misses) or None


GRAD_CASES = [  # (B, H, N, D, causal, scale or None, dist)
    (1, 1, 1, 64, False, None, "normal"),
    (1, 1, 2, 128, True, None, "normal"),
    (2, 3, 17, 64, True, None, "normal"),
    (1, 2, 63, 128, False, None, "normal"),
    (1, 2, 65, 64, True, 0.3, "normal"),  # custom scale
    (2, 1, 129, 128, True, None, "peaky"),
    (1, 3, 200, 64, False, 1.0, "uniform"),
    (1, 2, 255, 128, False, None, "large"),
    (1, 1, 1000, 64, True, None, "normal"),
    (1, 2, 1025, 128, True, 0.05, "peaky"),
    (2, 2, 1100, 64, False, None, "normal"),
]


def make_grad_inputs(shape, seed, dist):
    g = torch.Generator(device="cuda").manual_seed(seed)
    t = [torch.randn(shape, generator=g, device="cuda") for _ in range(4)]
    if dist == "peaky":
        t[0] = t[0] * 8
    elif dist == "uniform":
        t = [torch.rand(shape, generator=g, device="cuda") * 2 - 1 for _ in range(4)]
    elif dist == "large":  # |x| up to about 20: large scores, large row maxima
        t = [x * 5 for x in t]
    return [x.half() for x in t]


def t_gradients(stage, backward_variant, backward_stage="auto"):
    need_gpu()
    misses = []
    cases = GRAD_CASES[::3] if QUICK else GRAD_CASES
    for ci, (B, H, N, D, causal, scale, dist) in enumerate(cases):
        q, k, v, do = make_grad_inputs((B, H, N, D), 2000 + ci, dist)
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        try:
            o, lse = flashcourse.attention(*leaves, causal=causal, scale=scale, stage=stage,
                                           smem_limit=SMEM_LIMIT, backward_stage=backward_stage,
                                           backward_variant=backward_variant)
        except ValueError as e:
            raise Skip(f"{stage} forward, {backward_stage} backward do not run here: {e}")
        if backward_stage == "auto" and ci == 0:  # what auto chose, in the test's words
            print(f"         {stage} forward, auto backward: {flashcourse.auto_backward_stage()}")
        assert o.requires_grad and not lse.requires_grad or lse.grad_fn is not None
        o.backward(do)
        sc = scale32(scale if scale is not None else 1 / math.sqrt(D))
        miss = grad_miss([t.grad for t in leaves], q, k, v, do, causal, sc, o)
        if miss:
            misses.append(f"B={B} H={H} N={N} D={D} causal={causal} scale={scale} {dist}: {miss}")
    assert not misses, "\n".join(misses)


def t_gradient_check_can_fail():
    need_gpu()
    q, k, v, do = make_grad_inputs((1, 2, 129, 64), 31, "normal")
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    o, _ = flashcourse.attention(*leaves, causal=True)
    o.backward(do)
    got = [t.grad for t in leaves]
    sc = scale32(1 / 8)
    assert grad_miss(got, q, k, v, do, True, sc, o) is None
    for i in range(3):
        bad = [g.clone() for g in got]
        bad[i][0, 1, 100, 3] += 0.01
        assert grad_miss(bad, q, k, v, do, True, sc, o) is not None, f"a wrong grad {i} passed"
    assert grad_miss(got, q, k, v, do, False, sc, o) is not None, "causal ignored"
    nan = [g.clone() for g in got]
    nan[2][0, 0, 5, 5] = float("nan")
    assert grad_miss(nan, q, k, v, do, True, sc, o) is not None, "a NaN passed"


def t_backward_alone():
    need_gpu()
    q, k, v, do = make_grad_inputs((2, 2, 300, 128), 41, "normal")
    with torch.no_grad():
        o, lse = flashcourse.attention(q, k, v, causal=True, scale=0.1)
    got = flashcourse.attention_backward(q, k, v, o, lse, do, causal=True, scale=0.1)
    miss = grad_miss(got, q, k, v, do, True, scale32(0.1), o)
    assert miss is None, miss
    for bad in (o.float(), o[:, :, :5].contiguous()):
        raises((TypeError, ValueError), flashcourse.attention_backward, q, k, v, bad, lse, do)
    raises(ValueError, flashcourse.attention_backward, q, k, v, o, lse, do,
           stage="stage5_tuned", match=["stage5_tuned", "no backward pass"])
    raises(ValueError, flashcourse.attention_backward, q, k, v, o, lse, do,
           variant="fastest", match=["fastest", "deterministic"])


def stage8_not_here(smem_limit=0):
    """None where stage 8's backward plans on this device at D = 64 and 128 (within
    smem_limit), else why not, in the library's words."""
    dev = torch.cuda.current_device()
    try:
        for D in (64, 128):
            check_raw(HOPPER_BWD, dev, (1, 1, 128, D), False, 0.125, 0, smem_limit,
                                backward=True)
    except (flashcourse.LibraryNotBuiltError, ValueError, RuntimeError) as e:
        return str(e)
    return None


def t_auto_backward():
    need_gpu()
    with python_path():  # (o.grad_fn.bp below)
        auto_backward()


def auto_backward():
    # backward_stage="auto": stage 8 on an sm_90 GPU where its library is built (with sm_90a
    # code), stage 7 on any other; a variant stage 8 lacks or an smem_limit it does not fit:
    # stage 7; explicit names as given; errors name the stage chosen. What attention()
    # differentiates with is its autograd.Function's plan: o.grad_fn.bp.
    dev = torch.cuda.current_device()
    cc = torch.cuda.get_device_capability(dev)
    built = (flashcourse.library_dir() / f"lib{HOPPER_BWD}.so").is_file()
    why = stage8_not_here()
    if cc == (9, 0) and built:
        assert why is None or "sm_90a" in why, f"stage 8 does not run on this Hopper GPU: {why}"
    else:
        assert why is not None, f"stage 8's backward plans on an sm_{cc[0]}{cc[1]} GPU"
    want = HOPPER_BWD if why is None else BWD
    print(f"         sm_{cc[0]}{cc[1]}, stage 8 {'built' if built else 'not built'}: auto is "
          f"{want}{'' if why is None else f' (stage 8: {why})'}")
    for d in (None, dev, f"cuda:{dev}", torch.device("cuda", dev)):
        got = flashcourse.auto_backward_stage(d)
        assert got == want, f"auto_backward_stage({d!r}) = {got}, want {want}"
    q, k, v, do = make_grad_inputs((1, 2, 192, 64), 131, "normal")

    def used(**kw):
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        o, _ = flashcourse.attention(*leaves, causal=True, **kw)
        return o.grad_fn.bp.stage

    assert used() == want and used(backward_stage="auto") == want
    assert used(backward_stage=BWD) == BWD, "an explicit stage 7 not kept"
    if why is None:
        assert used(backward_stage=HOPPER_BWD) == HOPPER_BWD
        assert "registers" not in _library.stage_library(HOPPER_BWD).stage.variants
        assert used(backward_variant="deterministic") == HOPPER_BWD, "a variant both have"
    assert used(backward_variant="registers") == BWD, "a variant stage 8 lacks"
    for limit in (65536, 101376):  # a T4's and an L4's shared memory: stage 7's where 8 misses
        if why is None and stage8_not_here(limit) is not None:
            try:  # (where stage 5's forward and stage 7's backward run within it)
                for st, bwd in (("stage5_tuned", False), (BWD, True)):
                    check_raw(st, dev, tuple(q.shape), True, 0.125, 0, limit,
                                        backward=bwd)
            except ValueError:
                continue
            assert used(smem_limit=limit) == BWD, f"smem_limit {limit}: not stage 7"
            break
    # errors name the stage chosen
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    raises(ValueError, flashcourse.attention, *leaves, backward_variant="fastest",
           match=[BWD, "fastest", "deterministic"])
    q32 = q.float().requires_grad_(True)
    msg = raises(TypeError, flashcourse.attention, q32, k.float(), v.float(), stage="stage0_naive",
                 match=[want, "no_grad"])
    assert "auto" not in msg, msg
    # attention_backward: auto and stage 7 named, both against float64 autograd
    with torch.no_grad():
        o, lse = flashcourse.attention(q, k, v, causal=True)
    for stage in ("auto", BWD) + ((HOPPER_BWD,) if why is None else ()):
        got = flashcourse.attention_backward(q, k, v, o, lse, do, causal=True, stage=stage)
        miss = grad_miss(got, q, k, v, do, True, scale32(1 / 8), o)
        assert miss is None, f"attention_backward(stage={stage!r}): {miss}"
    raises(ValueError, flashcourse.attention_backward, q, k, v, o, lse, do, causal=True,
           variant="fastest", match=[BWD, "fastest"])
    # SDPA's and flash-attn's signatures: the same choice, and a name passed through
    for call, args in ((flashcourse.scaled_dot_product_attention, (q, k, v)),
                       (flashcourse.flash_attn_func, tuple(t.transpose(1, 2) for t in (q, k, v)))):
        for bs, expect in (("auto", want), (BWD, BWD)):
            leaves = [t.detach().clone().requires_grad_(True) for t in args]
            o2 = call(*leaves, backward_stage=bs)
            o2.float().sum().backward()
            assert all(t.grad is not None and torch.isfinite(t.grad).all() for t in leaves)
            node = o2.grad_fn
            while node is not None and not hasattr(node, "bp"):  # past transposes, copies
                node = node.next_functions[0][0] if node.next_functions else None
            assert node is not None and node.bp.stage == expect, (call.__name__, bs)


def t_deterministic_bit_identical():
    need_gpu()
    q, k, v, do = make_grad_inputs((2, 4, 2047, 64), 51, "normal")
    with torch.no_grad():
        o, lse = flashcourse.attention(q, k, v, causal=True)
    runs = [flashcourse.attention_backward(q, k, v, o, lse, do, causal=True,
                                           variant="deterministic") for _ in range(3)]
    for r in runs[1:]:
        for a, b in zip(runs[0], r):
            assert torch.equal(a, b), "deterministic gradients differ between runs"


def t_gradient_errors():
    need_gpu()
    q, k, v, do = make_grad_inputs((1, 2, 64, 64), 61, "normal")
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    o, lse = flashcourse.attention(*leaves)
    # lse is a constant: it requires no grad, and a loss through it adds no gradient
    assert not lse.requires_grad and lse.grad_fn is None, "lse is differentiable"
    try:
        lse.sum().backward()
    except RuntimeError as e:
        assert "does not require grad" in str(e), e
    else:
        raise AssertionError("a backward from lse alone did not raise")
    g_o = torch.autograd.grad((o.float() * do.float()).sum(), leaves)
    o, lse = flashcourse.attention(*leaves)
    g_both = torch.autograd.grad((o.float() * do.float()).sum() + lse.sum(), leaves)
    for a, b in zip(g_o, g_both):
        assert torch.equal(a, b), "lse changed the gradients"
    o, lse = flashcourse.attention(*leaves)
    (g,) = torch.autograd.grad((o * do).sum(), [leaves[0]], create_graph=True)
    try:
        g.sum().backward()
    except RuntimeError as e:
        assert "double backward" in str(e), e
    else:
        raise AssertionError("double backward did not raise")
    q32 = q.float().requires_grad_(True)
    raises(TypeError, flashcourse.attention, q32, k.float(), v.float(), stage="stage0_naive",
           match=["float16", "no_grad"])
    raises(ValueError, flashcourse.attention, *leaves, backward_variant="fastest",
           match=["fastest"])
    raises(ValueError, flashcourse.attention, *leaves, backward_stage="stage5_tuned",
           match=["no backward pass"])


def t_eager_op():
    need_gpu()
    # The eager operator (C++, make lib where python3 has torch) against the Python path, on the
    # same plans: o, lse and the deterministic gradients bit-identical; dO in o's layout, in its
    # own ([B, N, H, D] views: a plan per layout, four at most) and in more layouts than that
    # (copied into o's); double backward's error. (Both against float64: t_gradients.)
    path = flashcourse.eager_path()
    print(f"         eager path: {path}")
    lib = flashcourse.library_dir() / _run.EAGER_LIB
    if not path.startswith("C++"):
        if lib.is_file() and os.environ.get("FLASHCOURSE_EAGER_OP") != "0":
            raise AssertionError(f"{lib} is built but not used: {path}")
        raise Skip(f"the eager operator is not in use: {path}")
    B, H, H_kv, N, D = 2, 4, 2, 333, 64
    g = torch.Generator(device="cuda").manual_seed(141)
    q = torch.randn((B, H, N, D), generator=g, device="cuda").half()
    k, v = (torch.randn((B, H_kv, N, D), generator=g, device="cuda").half() for _ in range(2))
    base = torch.randn((B, N, H, D), generator=g, device="cuda").half()
    wide2 = torch.randn((B, N, H, 2 * D), generator=g, device="cuda").half()
    wide3 = torch.randn((B, N, H, 3 * D), generator=g, device="cuda").half()
    gaps = torch.randn((B, H, N + 7, D), generator=g, device="cuda").half()
    dos = [base.transpose(1, 2).contiguous(),  # o's layout: the binding's plan
           base.transpose(1, 2),  # [B, N, H, D]: a plan made by the operator
           wide3[..., D:2 * D].transpose(1, 2),  # rows 3 H D apart: a second
           gaps[:, :, 7:],  # a head's rows N + 7 apart: a third
           base.permute(2, 0, 1, 3).contiguous().permute(1, 0, 2, 3),  # [H, B, N, D]: the fourth
           wide2[..., D:].transpose(1, 2),  # a fifth layout: copied into o's
           base.flip(0).transpose(1, 2)]  # [B, N, H, D] again: the first plan made
    kw = dict(causal=True, scale=0.11, stage="stage5_tuned", backward_stage="stage7_backward",
              backward_variant="deterministic")

    def run_all():
        out = []
        for do in dos:
            leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
            o, lse = flashcourse.attention(*leaves, **kw)
            o.backward(do)
            out.append([o.detach(), lse] + [t.grad for t in leaves])
        return out

    cpp = run_all()
    with python_path():
        py = run_all()
    for i, (a, b) in enumerate(zip(cpp, py)):
        for name, x, y in zip(("o", "lse", "dq", "dk", "dv"), a, b):
            assert torch.equal(x, y), f"dO layout {i} {tuple(dos[i].stride())}: {name} differs"
    # create_graph: the gradients exist, their own gradient raises
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    o, _ = flashcourse.attention(*leaves, **kw)
    (gq,) = torch.autograd.grad((o * dos[0]).sum(), [leaves[0]], create_graph=True)
    assert torch.equal(gq, cpp[0][2]), "create_graph changed dq"
    msg = raises(RuntimeError, gq.sum().backward, match="double backward")
    assert "stage7_backward" in msg, msg


def t_plans_cached():
    need_gpu()
    # A repeated call runs from the cache: it never reaches the checked path again, and what
    # the cache cannot know (layout, alignment, another shape) still gets the checks' errors.
    q, k, v, do = make_grad_inputs((1, 2, 128, 64), 81, "normal")
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    flashcourse.attention(*leaves, causal=True)  # planned here
    checked = api._attention_checked
    calls = []

    def counting(*args):
        calls.append(args)
        return checked(*args)

    api._attention_checked = counting
    try:
        for _ in range(3):
            for t in leaves:
                t.grad = None
            o, _ = flashcourse.attention(*leaves, causal=True)
            o.backward(do)
        with torch.no_grad():
            flashcourse.attention(q, k, v, causal=True)  # no grad: its own plan, made once
            flashcourse.attention(q, k, v, causal=True)
        assert len(calls) == 1, f"{len(calls)} calls took the checked path, want 1"
        raises(ValueError, flashcourse.attention, q.transpose(2, 3).contiguous().transpose(2, 3),
               k, v, causal=True, match="contiguous")
        flat = torch.empty(q.numel() + 8, dtype=q.dtype, device="cuda")
        raises(ValueError, flashcourse.attention, flat[1:q.numel() + 1].view(q.shape), k, v,
               causal=True, match="aligned")
        raises(ValueError, flashcourse.attention, q, k[:, :, :64], v, causal=True,
               match="one shape")
    finally:
        api._attention_checked = checked
    miss = grad_miss([t.grad for t in leaves], q, k, v, do, True, scale32(1 / 8),
                     flashcourse.attention(q, k, v, causal=True)[0])
    assert miss is None, miss


def t_no_sync():
    need_gpu()
    # A forward and backward wait for nothing: torch's sync debug mode raises on any
    # synchronising call (a .item(), a .any() in Python, a blocking copy).
    q, k, v, do = make_grad_inputs((2, 2, 256, 64), 91, "normal")
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    for stage in ("stage5_tuned", "auto"):
        flashcourse.attention(*leaves, causal=True, stage=stage)[0].backward(do)  # planned
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            for _ in range(2):
                o, _ = flashcourse.attention(*leaves, causal=True, stage=stage)
                o.backward(do)
                o = flashcourse.scaled_dot_product_attention(*leaves, is_causal=True, stage=stage)
                o.backward(do)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()


def t_sdpa_drop_in():
    need_gpu()
    # SDPA's signature and layout, strided views (read in place) included, vs float64 autograd
    B, H, N, D = 2, 3, 200, 64
    g = torch.Generator(device="cuda").manual_seed(101)
    qkv = torch.randn((B, N, 3, H, D), generator=g, device="cuda").half()
    q, k, v = (t.transpose(1, 2) for t in qkv.unbind(2))  # [B, H, N, D] views, not contiguous
    do = torch.randn((B, H, N, D), generator=g, device="cuda").half()
    for causal in (False, True):
        leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
        o = flashcourse.scaled_dot_product_attention(*leaves, is_causal=causal)
        assert o.shape == q.shape and o.dtype == q.dtype
        want = torch.nn.functional.scaled_dot_product_attention(
            *[t.double() for t in (q, k, v)], is_causal=causal)
        assert float((o.double() - want).abs().max()) < 2e-3, "forward differs from SDPA's"
        o.backward(do)
        qc, kc, vc = (t.detach().contiguous() for t in (q, k, v))
        miss = grad_miss([t.grad for t in leaves], qc, kc, vc, do, causal, scale32(1 / 8),
                         o.detach())
        assert miss is None, miss
    call = flashcourse.scaled_dot_product_attention
    qc = q.contiguous()
    mask = torch.ones((N, N), dtype=torch.bool, device="cuda")
    raises(NotImplementedError, call, qc, qc, qc, mask, match="attn_mask")
    raises(NotImplementedError, call, qc, qc, qc, dropout_p=0.1, match="dropout")
    kv = qc[:, :1]  # one key/value head for three query heads: enable_gqa=True, as SDPA asks
    raises(ValueError, call, qc, kv, kv, match="enable_gqa")
    try:
        stage = model_forward_stage()
    except Skip:
        return  # (no forward stage takes grouped-query heads here: the rest needs one)
    o = call(qc, kv, kv, enable_gqa=True, is_causal=True, stage=stage)
    want = torch.nn.functional.scaled_dot_product_attention(
        qc.double(), kv.double(), kv.double(), is_causal=True, enable_gqa=True)
    assert float((o.double() - want).abs().max()) < 2e-3, "grouped-query heads differ from SDPA"
    raises(TypeError, call, qc.float(), qc.float(), qc.float(), match="float16")
    o = call(qc, qc, qc, scale=0.3)
    want = torch.nn.functional.scaled_dot_product_attention(qc.double(), qc.double(),
                                                            qc.double(), scale=0.3)
    assert float((o.double() - want).abs().max()) < 2e-3, "scale ignored"


def t_cuda_graph():
    need_gpu()
    # A forward and backward captured in a CUDA graph replay to the eager results
    q, k, v, do = make_grad_inputs((2, 2, 384, 128), 111, "normal")
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]

    def step():
        for t in leaves:
            t.grad = None
        o, _ = flashcourse.attention(*leaves, causal=True, stage="auto")
        o.backward(do)
        return o

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):  # warm-up: plans made, allocator pools filled
            step()
    torch.cuda.current_stream().wait_stream(side)
    eager = [step().detach().clone()] + [t.grad.clone() for t in leaves]
    graph = torch.cuda.CUDAGraph()
    for t in leaves:
        t.grad = None
    with torch.cuda.graph(graph):
        o_g = step()
    for t in leaves:  # new inputs, same buffers: the replay must read them
        t.data.copy_(t.data.flip(2))
    graph.replay()
    for t in leaves:
        t.data.copy_(t.data.flip(2))
    graph.replay()
    torch.cuda.synchronize()
    got = [o_g] + [t.grad for t in leaves]
    for a, b in zip(eager, got):
        assert torch.allclose(a.float(), b.float(), atol=2e-3, rtol=0), \
            float((a.float() - b.float()).abs().max())


def t_torch_compile():
    need_gpu()
    q, k, v, do = make_grad_inputs((2, 2, 256, 64), 71, "normal")

    def step(q, k, v):
        o, _ = flashcourse.attention(q, k, v, causal=True)
        return (o.float() * do.float()).sum()

    compiled = torch.compile(step, fullgraph=True)  # fullgraph: a graph break raises
    grads = []
    for fn in (step, compiled):
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        fn(*leaves).backward()
        grads.append([t.grad for t in leaves])
    for a, b in zip(*grads):
        assert torch.allclose(a.float(), b.float(), atol=2e-3, rtol=0), float((a - b).abs().max())


def t_compile_reduce_overhead():
    need_gpu()
    # A training step of a small attention model under torch.compile(mode="reduce-overhead"):
    # one graph (fullgraph), captured in a CUDA graph and replayed, agreeing with eager.
    torch.manual_seed(0)
    B, H, N, D = 2, 4, 256, 64
    lin = torch.nn.Linear(H * D, 3 * H * D, device="cuda", dtype=torch.float16)
    x = torch.randn((B, N, H * D), device="cuda", dtype=torch.float16)

    def loss_of(x):
        q, k, v = lin(x).view(B, N, 3, H, D).permute(2, 0, 3, 1, 4)
        o = flashcourse.scaled_dot_product_attention(q, k, v, is_causal=True)
        return o.float().square().mean()

    def train(fn, steps):
        for _ in range(steps):
            torch.compiler.cudagraph_mark_step_begin()
            lin.weight.grad = lin.bias.grad = None
            loss = fn(x)
            loss.backward()
            loss = loss.detach().clone()
        torch.cuda.synchronize()
        return [loss, lin.weight.grad.clone(), lin.bias.grad.clone()]

    eager = train(loss_of, 1)
    compiled = torch.compile(loss_of, mode="reduce-overhead", fullgraph=True)
    got = train(compiled, 4)  # the first steps record, the later ones replay the CUDA graphs
    for a, b in zip(eager, got):
        assert torch.allclose(a.float(), b.float(), atol=2e-3, rtol=1e-2), \
            float((a.float() - b.float()).abs().max())


def main():
    print(f"flashcourse binding tests: libraries in {flashcourse.library_dir()}, "
          f"torch {'%s' % torch.__version__ if HAVE_TORCH else 'absent'}, "
          f"GPU {torch.cuda.get_device_name() if HAVE_GPU else 'none'}"
          f"{', smem limit %d' % SMEM_LIMIT if SMEM_LIMIT else ''}")
    run("descriptors match the stage sources", t_descriptors)
    run("python3 -m flashcourse lists every stage", t_module_main)
    run("missing library says make lib", t_missing_library)
    run("unknown stage", t_unknown_stage)
    run("C entry point argument checks", t_c_argument_checks)
    run("no GPU: one clear error", t_no_gpu_message)
    run("no PyTorch: one clear error", t_without_torch)
    run("backward_stage='auto' by default: stage 8 where it plans and takes the call, else "
        "stage 7 (faked library answers)", t_auto_backward_choice)
    run("'auto' resolved in one function; the package's modules import in one order, each "
        "under 450 lines", t_one_auto_resolver)
    try:
        built = flashcourse.stages()
    except Exception:
        built = []
    run("the check can fail", t_check_can_fail)
    for st in built:
        for variant in st.variants:
            run(f"{st.name} {variant} vs float64 reference", t_variant, st, variant,
                QUICK_CASES if QUICK else CASES)
    for st in built:
        run(f"{st.name} bad inputs", t_bad_inputs, st)
    run("C entry point: workspace, NULL, CUDA error", t_c_entry_checks)
    run("workspace allocated through torch", t_workspace_through_torch)
    run("runs on torch.cuda.current_stream()", t_current_stream)
    run("the gradient check can fail", t_gradient_check_can_fail)
    run("the model-input check can fail", t_model_check_can_fail)
    for st in built:
        if st.takes:
            run(f"{st.name}: bf16, GQA, [B, N, H, D] and fused-QKV views, N_q != N_k",
                t_model_inputs, st)
    run("flash_attn_func: flash-attn's signature, GQA, N_q != N_k", t_flash_attn_func)
    run("gradients of what models feed, auto backward (or one clear error)",
        t_model_inputs_backward)
    for bst in [s for s in built if s.backward]:
        run(f"gradients of what models feed, {bst.name} (or one clear error)",
            t_model_inputs_backward, bst.name)
    fwds = [s.name for s in built if s.name in ("stage4_wmma", "stage5_tuned", "stage6_hopper")]
    for fwd in fwds:
        for bst in [s for s in built if s.backward]:
            for bv in bst.variants:
                run(f"gradients: {fwd} forward, {bst.name} {bv} backward vs float64 autograd",
                    t_gradients, fwd, bv, bst.name)
        run(f"gradients: {fwd} forward, auto backward (stage 8 on Hopper, else 7) vs float64 "
            "autograd", t_gradients, fwd, "default", "auto")
    run("backward_stage='auto': stage 8 on sm_90 where built, else stage 7; explicit names kept; "
        "errors name the stage chosen", t_auto_backward)
    run("attention_backward on its own", t_backward_alone)
    run("deterministic backward: bit-identical gradients", t_deterministic_bit_identical)
    run("lse a constant; double backward, float32 stage: clear errors", t_gradient_errors)
    run("the eager operator (C++) vs the Python path: bit-identical, dO in six layouts, "
        "double backward's error", t_eager_op)
    run("a repeated call runs from the plan cache; what it cannot know is still checked",
        t_plans_cached)
    run("forward and backward never synchronise (sync debug mode: error)", t_no_sync)
    run("scaled_dot_product_attention: SDPA's signature vs float64 autograd", t_sdpa_drop_in)
    run("a CUDA graph captures forward and backward and replays them", t_cuda_graph)
    run("torch.compile(fullgraph=True): forward and backward in one graph", t_torch_compile)
    run("torch.compile(mode='reduce-overhead'): a training step captured and replayed",
        t_compile_reduce_overhead)
    return summary()


if __name__ == "__main__":
    sys.exit(main())
