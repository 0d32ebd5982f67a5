"""The Python tests' runner and what several tests share.

The runner: each test a function, counted as passed, failed (its traceback printed) or skipped
(it raised Skip with the reason), one line each in the test suites' one format ("ok    name",
"FAIL  name", "SKIP  name: why": common/tests/report.sh), ending with "N passed, M failed, K
skipped"; python/tests/run.sh records each line. Imported by every test script here (each run as
a script from any folder: Python puts this folder first on the import path).

Shared by test_dropins.py, test_kvcache.py, test_varlen.py and test_ring.py: their start (setup: this
checkout's package first on the import path, PyTorch where it is installed), need_gpu(), the
one-line error check (raiser), the C toolchain and the fake stages linked with the library's C
entry (cuda_home, c_compiler, fake_stage_library), and the float64 references' pieces (key_mask,
softmax_ref) with the bound they are held to (miss, assert_within, check_flash_lse). Nothing here
imports PyTorch at import time: the tests that need no tensors run without it.
"""

import math
import os
import shutil
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]

results = {"passed": 0, "failed": 0, "skipped": 0}


class Skip(Exception):
    pass


def run(name, fn, *args):
    try:
        fn(*args)
    except Skip as e:
        results["skipped"] += 1
        print(f"SKIP  {name}: {e}")
        return
    except Exception:
        results["failed"] += 1
        print(f"FAIL  {name}")
        traceback.print_exc(file=sys.stdout)
        return
    results["passed"] += 1
    print(f"ok    {name}")


def summary():
    """Prints the counts; the exit status: 1 if any test failed."""
    p, f, s = results["passed"], results["failed"], results["skipped"]
    print(f"{p} passed, {f} failed, {s} skipped")
    return 1 if f else 0


# ---- a test script's start ----

_torch = None  # setup()'s PyTorch, or None
_have_gpu = False


def setup():
    """A test script's start: python/ first on the import path (so `import flashcourse` is this
    checkout's package, whatever is installed), then PyTorch where it is installed. Returns
    (torch or None, whether a CUDA GPU is here); need_gpu() reads the same."""
    global _torch, _have_gpu
    package = str(REPO / "python")
    if sys.path[0] != package:
        sys.path.insert(0, package)
    try:
        import torch
    except ImportError:
        return None, False
    _torch, _have_gpu = torch, torch.cuda.is_available()
    return _torch, _have_gpu


def need_gpu():
    """Skip, saying why, unless PyTorch and a CUDA GPU are here (setup())."""
    if _torch is None:
        raise Skip("no PyTorch here")
    if not _have_gpu:
        raise Skip("no CUDA GPU here")


# The package's private modules: no error message a user sees names them.
PRIVATE = ("_plans", "_run", "_library")


def raiser(*hidden):
    """A test file's raises(exc, fn, *args, match=(), **kw): fn(*args, **kw) raises exc with
    every string of match (one, or a list) in its one-line message, which names no private
    module (PRIVATE) and none of `hidden` (the file's own: its internal functions, 'auto');
    returns the message."""
    internal = PRIVATE + hidden

    def raises(exc, fn, *args, match=(), **kw):
        try:
            fn(*args, **kw)
        except exc as e:
            msg = str(e)
            assert "\n" not in msg.strip(), f"not one line: {msg!r}"
            for m in [match] if isinstance(match, str) else match:
                assert m in msg, f"{exc.__name__} {msg!r} lacks {m!r}"
            for name in internal:
                assert name not in msg, f"{msg!r} names {name!r}"
            return msg
        except Exception as e:
            raise AssertionError(f"expected {exc.__name__}, got {type(e).__name__}: {e}")
        raise AssertionError(f"expected {exc.__name__}, nothing raised")
    return raises


# ---- the C toolchain: fake stages linked with the library's C entry ----

def cuda_home() -> Path:
    """The CUDA toolkit with its headers (CUDA_HOME, /usr/local/cuda, or nvcc's), or Skip."""
    for home in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if home and (Path(home) / "include" / "cuda_runtime_api.h").is_file():
            return Path(home)
    nvcc = shutil.which("nvcc")
    if nvcc and (Path(nvcc).resolve().parents[1] / "include" / "cuda_runtime_api.h").is_file():
        return Path(nvcc).resolve().parents[1]
    raise Skip("no CUDA toolkit headers (cuda_runtime_api.h) here")


def c_compiler() -> str:
    """$CC, gcc or cc, or Skip."""
    cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if not cc:
        raise Skip("no C compiler here")
    return cc


def fake_stage_library(name: str, source: str, defines=()):
    """A library linked here, as make lib links a stage's, from common/attn_lib.c,
    common/device_info.c and a fake stage's C source (given NAME="name" and `defines`, each
    "MACRO" or "MACRO=value"), against the static CUDA runtime: its _library.Library, or Skip
    where there is no compiler, toolkit or static runtime."""
    from flashcourse import _library
    cc, cuda = c_compiler(), cuda_home()
    static = cuda / "lib64" / "libcudart_static.a"
    if not static.is_file():
        raise Skip(f"no {static} here")
    d = Path(tempfile.mkdtemp(prefix=f"{name}_"))
    (d / "stage.c").write_text(source)
    so = d / f"lib{name}.so"
    flags = ["-std=c11", "-O1", "-Wall", "-Wextra", "-Werror", "-fPIC", f"-I{cuda}/include",
             f"-I{REPO}/common", f'-DNAME="{name}"'] + [f"-D{x}" for x in defines]
    cmd = [cc, "-shared", *flags, str(d / "stage.c"), str(REPO / "common" / "attn_lib.c"),
           str(REPO / "common" / "device_info.c"), "-o", str(so), str(static), "-lpthread",
           "-ldl", "-lrt", "-lm"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, f"{' '.join(cmd)}\n{r.stderr}"
    return _library._load(so)


# ---- float64 references and their bound (PyTorch) ----

def miss(got, want, what):
    """None if got is within the bound of want (2e-2 of want's largest magnitude, at least 1),
    else what and by how much."""
    bound = 2e-2 * max(1.0, want.abs().max().item()) if want.numel() else 0.0
    err = (got.double() - want.double()).abs().max().item() if got.numel() else 0.0
    return None if err <= bound else f"{what}: max error {err:.3g} > {bound:.3g}"


def assert_within(got, want, label, names=("o", "dq", "dk", "dv")):
    """Each of got within miss()'s bound of the same of want (o and the gradients, by default),
    or one AssertionError naming every one outside it."""
    bad = [m for m in (miss(a, b, f"{label} {n}") for a, b, n in zip(got, want, names)) if m]
    assert not bad, "; ".join(bad)


def check_flash_lse(lse, want, label):
    """The LSE a flash-attn drop-in returned against the reference's (-inf where a row sees no
    key): +inf at exactly those rows, as flash-attn returns them (attention() keeps the
    course's -inf), within the bound elsewhere."""
    seen = want.isfinite()
    none = lse == math.inf
    assert bool((none | lse.isfinite()).all()), f"{label}: lse -inf or NaN (flash-attn: +inf)"
    assert bool((none == ~seen).all()), f"{label}: lse +inf at other rows than those without keys"
    m = miss(lse[seen], want[seen], f"{label} lse")
    assert m is None, m


def key_mask(N, N_k, causal, left, right, max_k=None, device="cuda"):
    """[N, N_k] bool: the keys each query attends to (N queries, N_k keys), by attention.h's
    rules (attn_shape_complete then attn_key_range) with max_k as its N_k (a packed batch's
    max_seqlen_k, as flash-attn's mha_varlen_fwd and set_params_fprop; None: N_k): causal makes
    right 0; a bound at or past max_k, or negative, is unbounded, except an unbounded right
    beside a bounded left, which is max_k (flash-attn's); then query i sees keys
    i + N_k - N - left .. i + N_k - N + right."""
    import torch
    max_k = N_k if max_k is None else max_k
    if causal:
        right = 0
    left = -1 if left < 0 or left >= max_k else left
    right = -1 if right < 0 or right >= max_k else right
    if left >= 0 and right < 0:
        right = max_k
    i = torch.arange(N, device=device)[:, None]
    j = torch.arange(N_k, device=device)[None, :]
    diag = i + N_k - N
    mask = torch.ones(N, N_k, dtype=torch.bool, device=device)
    if right >= 0:
        mask &= j <= diag + right
    if left >= 0:
        mask &= j >= diag - left
    return mask


def softmax_ref(s, mask, v):
    """The softmax over each row's keys where mask is True of the scores s [..., N, N_k], times
    v [..., N_k, D], in s's dtype, differentiable: (o [..., N, D], lse [..., N]); a row that
    sees no key gets o = 0 and lse -inf (attention.h's rule)."""
    import torch
    s = s.masked_fill(~mask, float("-inf"))
    m = s.amax(-1, keepdim=True)
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m).detach()
    p = torch.exp(s - m)  # 0 where masked
    total = p.sum(-1, keepdim=True)
    o = (p @ v) / torch.where(total > 0, total, torch.ones_like(total))
    lse = torch.where(total > 0, m + torch.log(total), torch.full_like(total, float("-inf")))
    return o, lse[..., 0]
