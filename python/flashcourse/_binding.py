"""The ctypes side of build/lib/lib<stage>.so (python/lib.mk, common/attn_lib.c).

Each library exports the stage descriptor `attn_this_stage` and the entry points attn_lib_plan
(every check, once per shape), attn_lib_forward / attn_lib_backward (one pass of a plan),
attn_lib_last_error and attn_lib_exit_codes. Nothing here compiles anything, and PyTorch is
imported only when attention() or attention_backward() is called, so stages() works on a machine
without it.

The hot path: the first call of a combination of stage, variant, shapes, dtypes, devices,
causal, scale and whether gradients are wanted checks everything, in plain Python and in the
library (attn_lib_plan), and keeps the plans; a later call with the same combination looks
them up in one dict, checks what can differ between tensors of one shape (contiguity, 16-byte
alignment), allocates the outputs through PyTorch's caching allocator and makes one library call
a pass. Nothing waits for the GPU. Eagerly, the passes and their gradient go through the eager
operator, flashcourse_eager::attention (_eager.cpp, a torch::autograd::Function in C++ that calls
the same plans through the function pointers loaded here) where `make lib` built it for this
torch, else through a torch.autograd.Function (_ops.AttentionFunction) and ctypes. Under
torch.compile the same passes are the custom operators flashcourse::forward and
flashcourse::backward, which its graph keeps whole.
"""

import ctypes
import json
import math
import os
import struct
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

ABI = 5  # ATTN_LIB_ABI in common/attn_lib.c
_INT_MAX = 2**31 - 1
_FLT_MIN = 2.0**-126  # the smallest normal float32
_ALIGN = 16  # the widest vector load any stage makes (16 bytes)
_DTYPES = {0: "float32", 1: "float16"}  # attn_dtype: ATTN_F32, ATTN_F16
# attention.h's ATTN_TAKES_*: what a stage takes beyond the plain case
TAKES_BF16, TAKES_GQA, TAKES_STRIDES, TAKES_N_K = 1, 2, 4, 8
HOPPER_STAGE = "stage6_hopper"  # the fastest forward where it runs (sm_90a code on a Hopper GPU)
FORWARD_STAGE = "stage5_tuned"  # the fastest forward on every other GPU
HOPPER_BACKWARD_STAGE = "stage8_hopper_backward"  # the fastest backward where it runs (Hopper)
BACKWARD_STAGE = "stage7_backward"  # the backward elsewhere, and for the calls stage 8 refuses
_PASS_FWD, _PASS_BWD = 0, 1  # attn_lib_plan's pass


def _find_repo() -> Tuple[Optional[Path], Optional[Path]]:
    """(the repository, or None; the checkout _install.json names, if any). The repository is
    the one this file sits in (a checkout, or `pip install -e python`), else the one that
    `pip install ./python` recorded in _install.json beside this file (python/setup.py writes
    it), while it still holds the course."""
    here = Path(__file__).resolve().parents[2]
    if (here / "common" / "attention.h").is_file():
        return here, None
    try:
        with open(Path(__file__).with_name("_install.json")) as f:
            recorded = Path(json.load(f)["repo"])
    except (OSError, ValueError, KeyError, TypeError):
        return None, None
    return (recorded if (recorded / "common" / "attention.h").is_file() else None), recorded


REPO, _RECORDED_REPO = _find_repo()


class LibraryNotBuiltError(FileNotFoundError):
    """A stage library is missing: `make lib` in the repository root builds them."""


class _Descriptor(ctypes.Structure):
    # attn_stage (common/attention.h): the function pointers are reached through the attn_lib_*
    # entry points; here they only say whether the stage has a backward pass.
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("adds", ctypes.c_char_p),
        ("dtype", ctypes.c_int),
        ("variants", ctypes.c_char_p),
        ("unsupported", ctypes.c_void_p),
        ("workspace_bytes", ctypes.c_void_p),
        ("forward", ctypes.c_void_p),
        ("backward_workspace_bytes", ctypes.c_void_p),
        ("backward", ctypes.c_void_p),
        ("takes", ctypes.c_uint),
        ("backward_takes", ctypes.c_uint),
    ]


@dataclass(frozen=True)
class Stage:
    """One built stage, as its library describes itself."""

    name: str  # "stage5_tuned"
    dtype: str  # storage type of q, k, v and o: "float32" or "float16"
    variants: Tuple[str, ...]  # variants[0] is always "default"
    adds: str  # what this stage adds over the previous one
    path: str  # the library
    backward: bool = False  # the stage has a backward pass (attention_backward)
    takes: int = 0  # beyond [B, H, N, D] contiguous tensors of its dtype: TAKES_* bits
    backward_takes: int = 0  # the same for its backward pass

    @property
    def torch_dtype(self):
        return getattr(_torch(), self.dtype)

    def torch_dtypes(self, backward: bool = False):
        """The torch dtypes the stage's forward (backward) pass stores: its dtype, and bfloat16
        where it takes bf16."""
        torch = _torch()
        bf16 = (self.backward_takes if backward else self.takes) & TAKES_BF16
        return (self.torch_dtype, torch.bfloat16) if bf16 else (self.torch_dtype,)


def library_dir() -> Path:
    """Where the libraries are looked for: $FLASHCOURSE_LIB_DIR, else <repository>/build/lib."""
    env = os.environ.get("FLASHCOURSE_LIB_DIR")
    if env:
        return Path(env)
    return REPO / "build" / "lib" if REPO else Path("build") / "lib"


def _make_hint(d: Path) -> str:
    if REPO is None:
        where = ("does not know where the course's repository is" if _RECORDED_REPO is None else
                 f"was installed from {_RECORDED_REPO}, which no longer holds the course")
        return (f"this installed copy of flashcourse {where}: run `make lib` in the checkout and "
                "point FLASHCOURSE_LIB_DIR at its build/lib, or run `pip install ./python` "
                f"there again (looked in {d})")
    return (f"run `make lib` in {REPO} (it builds build/lib/lib<stage>.so for every stage), "
            f"or point FLASHCOURSE_LIB_DIR at the folder that holds them (looked in {d})")


_lock = threading.Lock()


class _Library:
    """One loaded stage library: its Stage, its entry points (argument types set once) and its
    return codes by name."""

    def __init__(self, path: Path, lib: ctypes.CDLL, stage: Stage, codes: Dict[str, int]):
        self.path, self.lib, self.stage, self.codes = path, lib, stage, codes
        self.plan_bytes = lib.attn_lib_plan_bytes()
        self.plan = lib.attn_lib_plan
        self.forward = lib.attn_lib_forward
        self.backward = lib.attn_lib_backward
        self.last_error = lib.attn_lib_last_error

    def check(self, rc: int, call: str):
        """Nothing if rc is the library's pass code, else the error its last_error names."""
        if rc != self.codes["pass"]:
            _raise(rc, self.last_error().decode(errors="replace") or f"{call} returned {rc}",
                   self.codes)


_loaded: Dict[str, _Library] = {}  # by the library's resolved path


def _parse_codes(text: str) -> Dict[str, int]:
    """attn_lib_exit_codes()'s "pass=<n>,wrong=<n>,..." as {"pass": <n>, "wrong": <n>, ...}."""
    codes = {}
    for item in text.split(","):
        name, _, value = item.partition("=")
        codes[name.strip()] = int(value)
    for need in ("pass", "wrong", "usage", "unsupported", "oom"):
        if need not in codes:
            raise ValueError(f"no '{need}' in {text!r}")
    return codes


def _declare(lib: ctypes.CDLL):
    """The entry points' C signatures (common/attn_lib.c)."""
    P, I, L, F, Z = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong, ctypes.c_float, ctypes.c_size_t
    sigs = {
        # pass, device, smem_limit, B, H, N, D, causal, scale, variant, H_kv, N_k, bf16,
        # strides (24 long long or NULL), plan, plan_bytes, &ws
        "attn_lib_plan": (I, [I, I, L, I, I, I, I, I, F, I, I, I, I, P, P, Z, ctypes.POINTER(Z)]),
        # plan, Q, K, V, O, lse, workspace, workspace_bytes, stream
        "attn_lib_forward": (I, [P] * 7 + [Z, P]),
        # plan, Q, K, V, O, lse, dO, dQ, dK, dV, workspace, workspace_bytes, stream
        "attn_lib_backward": (I, [P] * 11 + [Z, P]),
        "attn_lib_plan_bytes": (Z, []),
        "attn_lib_last_error": (ctypes.c_char_p, []),
        "attn_lib_exit_codes": (ctypes.c_char_p, []),
    }
    for name, (res, args) in sigs.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args


def _load(path: Path) -> _Library:
    key = str(path.resolve())
    with _lock:
        if key in _loaded:
            return _loaded[key]
        try:
            lib = ctypes.CDLL(key)
        except OSError as e:
            raise RuntimeError(f"cannot load {path}: {e}") from None
        try:
            abi = lib.attn_lib_abi
            desc = _Descriptor.in_dll(lib, "attn_this_stage")
        except (AttributeError, ValueError):
            raise RuntimeError(f"{path} is not a stage library (no attn_lib_abi or "
                               f"attn_this_stage): {_make_hint(path.parent)}") from None
        abi.restype = ctypes.c_int
        if abi() != ABI:
            raise RuntimeError(f"{path} has entry points of version {abi()}, this package "
                               f"speaks version {ABI}: rebuild with `make lib`")
        _declare(lib)
        codes = _parse_codes(lib.attn_lib_exit_codes().decode())
        st = Stage(
            name=desc.name.decode(),
            dtype=_DTYPES.get(desc.dtype, f"unknown({desc.dtype})"),
            variants=tuple(desc.variants.decode().split(",")),
            adds=desc.adds.decode(),
            path=key,
            backward=bool(desc.backward and desc.backward_workspace_bytes),
            takes=int(desc.takes),
            backward_takes=int(desc.backward_takes),
        )
        _loaded[key] = _Library(path, lib, st, codes)
        return _loaded[key]


def stages() -> List[Stage]:
    """The stages built (one Stage per build/lib/lib<stage>.so), by name."""
    d = library_dir()
    paths = sorted(d.glob("libstage*.so")) if d.is_dir() else []
    if not paths:
        raise LibraryNotBuiltError(f"no stage libraries found: {_make_hint(d)}")
    return [_load(p).stage for p in paths]


def exit_codes(stage: str = FORWARD_STAGE) -> Dict[str, int]:
    """The return codes of the stage's library, which are the programs' exit codes (their one
    home is the attn_exit enum of common/attention.h), by name: pass, wrong, usage, unsupported,
    oom."""
    return dict(_stage(stage).codes)


def _source_stages() -> List[str]:
    return sorted(p.parent.name for p in REPO.glob("stage[0-9]*/attention.cu")) if REPO else []


# (name, $FLASHCOURSE_LIB_DIR) -> the library: the folder is searched once per stage name
_by_name: Dict[Tuple[str, Optional[str]], _Library] = {}


def _stage(name) -> _Library:
    if not isinstance(name, str):
        raise TypeError(f"stage must be a stage name such as '{FORWARD_STAGE}', not "
                        f"{type(name).__name__}")
    key = (name, os.environ.get("FLASHCOURSE_LIB_DIR"))
    found = _by_name.get(key)
    if found is not None:
        return found
    d = library_dir()
    path = d / f"lib{name}.so"
    if not path.is_file():
        built = sorted(p.name[3:-3] for p in d.glob("libstage*.so")) if d.is_dir() else []
        if name not in built and name not in _source_stages():
            known = ", ".join(sorted(set(built) | set(_source_stages())))
            if not known:
                raise LibraryNotBuiltError(f"unknown stage '{name}', and no stage libraries "
                                           f"found: {_make_hint(d)}")
            raise ValueError(f"unknown stage '{name}' (stages: {known})")
        raise LibraryNotBuiltError(f"{path} not found: {_make_hint(d)}")
    loaded = _load(path)
    if loaded.stage.name != name:
        raise RuntimeError(f"{path} holds the stage '{loaded.stage.name}', not '{name}'")
    _by_name[key] = loaded
    return loaded


_torch_mod = None


def _torch():
    global _torch_mod
    if _torch_mod is None:
        try:
            import torch
        except ImportError as e:
            raise ImportError("flashcourse.attention takes PyTorch tensors: install torch "
                              f"(stages() works without it) [{e}]") from None
        _torch_mod = torch
    return _torch_mod


def _raise(rc: int, msg: str, codes: Dict[str, int]):
    if rc == codes["unsupported"] and "no NVIDIA GPU here" in msg:
        raise RuntimeError(msg)  # the machine, not the arguments
    if rc in (codes["usage"], codes["unsupported"]):
        raise ValueError(msg)
    if rc == codes["oom"]:
        oom = getattr(getattr(_torch_mod, "cuda", None), "OutOfMemoryError", RuntimeError)
        raise oom(msg)
    raise RuntimeError(msg)


def _scale_checked(scale, D: int) -> float:
    """The scale as a Python float (default 1/sqrt(D)), or TypeError / ValueError. Plain Python
    on numbers: torch.compile traces it."""
    if scale is None:
        return 1.0 / math.sqrt(D)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        try:
            scale = float(scale)  # numpy scalars, 0-d tensors
        except (TypeError, ValueError, RuntimeError):
            raise TypeError(f"scale must be a number, not {type(scale).__name__}") from None
    scale = float(scale)
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale must be a positive finite number, got {scale}")
    return scale


def _scale32(scale: float) -> float:
    # The stage takes a float: the value it computes with.
    s32 = struct.unpack("f", struct.pack("f", scale))[0]
    if s32 < _FLT_MIN:
        raise ValueError(f"scale {scale} is not a normal float32 (it rounds to {s32})")
    return s32


def _smem_limit(smem_limit) -> int:
    if smem_limit is None:
        return 0
    if isinstance(smem_limit, bool) or not isinstance(smem_limit, int):
        raise TypeError(f"smem_limit must be a number of bytes, not {type(smem_limit).__name__}")
    if not 16384 <= smem_limit <= 2**30:
        raise ValueError(f"smem_limit must be in [16384, 2^30] bytes (65536: a T4's), "
                         f"got {smem_limit}")
    return smem_limit


def _check_tensors(who: str, named, dtype=None):
    """Type, device, dtype and shape of q, k, v (and o, do): tensor metadata only, so
    torch.compile traces it. named: [(name, tensor)] starting with q, k, v: q [B, H, N, D], k and
    v [B, H_kv, N_k, D] (H_kv dividing H: grouped-query heads), any others q's shape; any strides
    with the last dimension contiguous (whether the stage takes strided, grouped or N_k != N
    inputs, its library says)."""
    torch = _torch()
    for n, t in named:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{who} takes torch tensors; {n} is a {type(t).__name__}")
        if t.device.type != "cuda":
            raise TypeError(f"{who} takes CUDA tensors; {n} is on {t.device}")
        if dtype is not None and t.dtype != dtype:
            raise TypeError(f"{who} takes {dtype} tensors (its storage type); {n} is {t.dtype}")
    n0, t0 = named[0]
    if dtype is None:
        for n, t in named[1:]:
            if t.dtype != t0.dtype:
                raise TypeError(f"{who} takes {', '.join(x for x, _ in named)} of one dtype; "
                                f"{n0} is {t0.dtype}, {n} is {t.dtype}")
    for n, t in named[1:]:
        if t.device != t0.device:
            raise TypeError(f"{who} takes {', '.join(x for x, _ in named)} on one device; "
                            f"{n0} is on {t0.device}, {n} on {t.device}")
    for n, t in named:
        if t.dim() != 4:
            raise ValueError(f"{who} takes q of shape [B, H, N, D] and k, v of shape "
                             f"[B, H_kv, N_k, D]; {n} has shape {tuple(t.shape)}")
    (_, q), (_, k), (_, v) = named[:3]
    B, H, N, D = q.shape
    if k.shape != v.shape or k.shape[0] != B or k.shape[3] != D:
        raise ValueError(f"{who} takes q [B, H, N, D] and k, v of one shape [B, H_kv, N_k, D]; "
                         f"q is {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    if H % k.shape[1]:
        raise ValueError(f"{who}: k and v's heads ({k.shape[1]}) must divide q's ({H}): each "
                         f"key/value head serves H / H_kv query heads")
    for n, t in named[3:]:
        if t.shape != q.shape:
            raise ValueError(f"{who} takes {n} of q's shape {tuple(q.shape)}; it is "
                             f"{tuple(t.shape)}")
    for n, t in named:
        if t.stride(3) != 1:
            raise ValueError(f"{who} takes tensors whose last dimension is contiguous; {n} is not "
                             f"(strides {tuple(t.stride())}): pass {n}.contiguous()")
    if any(x > _INT_MAX for x in tuple(q.shape) + tuple(k.shape)):
        raise ValueError(f"{who}: every dimension must fit in an int; got q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)}")


def _rows(t) -> tuple:
    """A [B, H, N, D] tensor's batch, head and row strides (elements)."""
    st = t.stride()
    return (st[0], st[1], st[2])


_like: Dict[tuple, tuple] = {}


def _like_rows(t) -> tuple:
    """The batch, head and row strides of torch.empty_like(t): the layout of an output allocated
    like its input (o and dq like q, dk like k, dv like v)."""
    key = (tuple(t.shape), t.stride())
    found = _like.get(key)
    if found is None:
        found = _rows(_torch().empty_like(t, device="meta"))
        if len(_like) >= _PLANS_MAX:
            _like.clear()
        _like[key] = found
    return found


def _forward_geometry(q, k) -> tuple:
    """What a forward plan's shape is: (B, H, N, D, H_kv, N_k, 24 strides: q, k, v (k's), o, and
    zeros for the backward's tensors)."""
    B, H, N, D = (int(x) for x in q.shape)
    kr = _rows(k)
    return (B, H, N, D, int(k.shape[1]), int(k.shape[2]),
            _rows(q) + kr + kr + _like_rows(q) + (0,) * 12)


def _backward_geometry(q, k, v, o=None, do=None) -> tuple:
    """A backward plan's: q, k, v, o and do as given (o and do None: laid out like an output of
    q, as attention() allocates o), dq, dk, dv allocated like q, k, v."""
    B, H, N, D = (int(x) for x in q.shape)
    o_rows = _rows(o) if o is not None else _like_rows(q)
    do_rows = _rows(do) if do is not None else o_rows
    return (B, H, N, D, int(k.shape[1]), int(k.shape[2]),
            _rows(q) + _rows(k) + _rows(v) + o_rows + do_rows + _like_rows(q) + _like_rows(k) +
            _like_rows(v))


def grad_input(backward_stage: str, o, do):
    """The upstream gradient do as the backward pass takes it: 16-byte aligned with a contiguous
    last dimension, in its own layout where the stage takes strides (no copy), else in o's."""
    if do.stride(3) != 1 or do.data_ptr() % _ALIGN:
        do = do.clone(memory_format=_torch().contiguous_format)
    if _stage(backward_stage).stage.backward_takes & TAKES_STRIDES or do.stride() == o.stride():
        return do
    return _torch().empty_like(o).copy_(do)


def grad_plan(bp: "_Plan", o, do):
    """The backward plan bp (made for do laid out as o) and do, for the gradient as it came:
    (plan, do)."""
    do = grad_input(bp.stage, o, do)
    return (bp.with_do(do) if bp.geometry[6] else bp), do


def _check_aligned(who: str, named):
    # data_ptr() is not known while torch.compile traces: the library checks it in the operator
    for n, t in named:
        if t.data_ptr() % _ALIGN:
            raise ValueError(f"{who} takes tensors whose data is {_ALIGN}-byte aligned; "
                             f"{n} starts at an offset into its storage: pass {n}.clone()")


def _check_causal(causal) -> bool:
    if not (isinstance(causal, bool) or (isinstance(causal, int) and causal in (0, 1))):
        raise TypeError(f"causal must be True or False, not {causal!r}")
    return bool(causal)


def _variant_index(st: Stage, variant, what: str = "variant") -> int:
    if not isinstance(variant, str) or variant not in st.variants:
        raise ValueError(f"{st.name} has no {what} {variant!r} (variants: "
                         f"{', '.join(st.variants)})")
    return st.variants.index(variant)


# ---- plans: the library's checks, once per shape ----

class _Plan:
    """One checked pass of one stage for one shape on one device: attn_lib_plan's bytes (the
    library keeps nothing; the plan lives as long as this object), the workspace it needs, and
    what a run allocates. geometry: (B, H, N, D, H_kv, N_k, 24 strides or None)."""

    __slots__ = ("library", "buf", "addr", "workspace", "device", "tdevice", "lse_shape",
                 "run", "stage", "geometry", "args", "by_do")

    def __init__(self, library: _Library, backward: bool, device: int, geometry: tuple,
                 causal: bool, s32: float, vi: int, smem_limit: int, bf16: bool = False):
        self.library, self.stage, self.geometry = library, library.stage.name, geometry
        self.args = (backward, device, causal, s32, vi, smem_limit, bf16)
        self.by_do = {}  # backward: the plans for other layouts of do (with_do)
        self.buf = ctypes.create_string_buffer(library.plan_bytes)
        self.addr = ctypes.addressof(self.buf)
        ws = ctypes.c_size_t(0)
        B, H, N, D, H_kv, N_k, strides = geometry
        c_strides = (ctypes.c_longlong * 24)(*strides) if strides else None
        rc = library.plan(_PASS_BWD if backward else _PASS_FWD, device, smem_limit, B, H, N, D,
                          int(causal), s32, vi, H_kv, N_k, int(bf16), c_strides, self.addr,
                          library.plan_bytes, ctypes.byref(ws))
        library.check(rc, "attn_lib_plan")
        self.workspace, self.device = ws.value, device
        self.tdevice = _torch().device("cuda", device)
        self.lse_shape = (B, H, N)
        self.run = library.backward if backward else library.forward

    def with_do(self, do) -> "_Plan":
        """This backward plan for an upstream gradient do laid out as it is (a stage whose
        backward pass takes strides: no copy), kept per layout."""
        rows = _rows(do)
        strides = self.geometry[6]
        if strides[12:15] == rows:
            return self
        p = self.by_do.get(rows)
        if p is None:
            g = self.geometry[:6] + (strides[:12] + rows + strides[15:],)
            backward, device, causal, s32, vi, smem_limit, bf16 = self.args
            p = _Plan(self.library, backward, device, g, causal, s32, vi, smem_limit, bf16)
            self.by_do[rows] = p
        return p


_plans: Dict[tuple, _Plan] = {}
_PLANS_MAX = 4096  # a long-running process with ever new shapes starts over past this many


def _plan(stage: str, backward: bool, shape, device: int, dtype, causal: bool, scale: float,
          variant: str, smem_limit: int, who: Optional[str] = None) -> _Plan:
    """Every check the library makes before a pass, without running it, once per combination:
    the plan, or TypeError / ValueError. shape: [B, H, N, D] (contiguous tensors, as many keys
    and key/value heads as queries) or a geometry (_forward_geometry, _backward_geometry);
    dtype: the tensors' torch dtype. stage "auto": the forward's (_auto_stage) or, with
    backward, the backward's (_auto_backward_stage) for what the call asks."""
    torch = _torch()
    if device is None:
        device = torch.cuda.current_device()
    geometry = tuple(shape)
    if len(geometry) == 4:
        B, H, N, D = (int(x) for x in geometry)
        geometry = (B, H, N, D, H, N, None)
    if stage == "auto":  # the one place a plan's "auto" is resolved (torch.compile's included)
        B, H, N, D, H_kv, N_k, _ = geometry
        asks = _asks_of(dtype, H, H_kv, N, N_k)
        stage = (_auto_backward_stage(device, asks, variant, smem_limit) if backward else
                 _auto_stage(device, asks))
    key = (stage, backward, geometry, device, dtype, causal, scale, variant, smem_limit,
           os.environ.get("FLASHCOURSE_LIB_DIR"))
    p = _plans.get(key)
    if p is not None:
        return p
    library = _stage(stage)
    st = library.stage
    if backward and not st.backward:
        raise ValueError(f"{st.name} has no backward pass (stages with one: "
                         f"{', '.join(s.name for s in stages() if s.backward) or 'none built'})")
    takes = st.torch_dtypes(backward)
    if dtype not in takes:
        names = " or ".join(str(t) for t in takes)
        if backward and who:
            raise TypeError(f"{who}: the backward pass ({st.name}) takes {names} tensors, "
                            f"these are {dtype}")
        raise TypeError(f"{st.name} takes {names} tensors (its storage type); these are {dtype}")
    vi = _variant_index(st, variant, "backward variant" if backward and who else "variant")
    p = _Plan(library, backward, device, geometry, causal, _scale32(scale), vi, smem_limit,
              dtype == torch.bfloat16)
    if len(_plans) >= _PLANS_MAX:
        _plans.clear()
    _plans[key] = p
    return p


def _raw_stream_public(device: int) -> int:
    return _torch_mod.cuda.current_stream(device).cuda_stream


# The current CUDA stream of a device as the raw handle the library takes: torch's own accessor
# where it has one (no Stream object made per call), set on the first pass.
_raw_stream = None


def _init_stream_accessor():
    global _raw_stream
    get = getattr(_torch()._C, "_cuda_getCurrentRawStream", None)
    _raw_stream = get if get is not None else _raw_stream_public


def forward_with(p: _Plan, q, k, v):
    """One forward pass of plan p on q, k, v (checked by whoever made p for their shape, dtype
    and device; contiguous and aligned): (o, lse), allocated through PyTorch on the current
    stream."""
    torch = _torch_mod
    o = torch.empty_like(q)
    lse = torch.empty(p.lse_shape, dtype=torch.float32, device=p.tdevice)
    ws = p.workspace
    work = torch.empty(ws, dtype=torch.uint8, device=p.tdevice) if ws else None
    rc = p.run(p.addr, q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), lse.data_ptr(),
               work.data_ptr() if ws else None, ws, _raw_stream(p.device))
    if rc:
        p.library.check(rc, "attn_lib_forward")
    return o, lse


def backward_with(p: _Plan, q, k, v, o, lse, do):
    """One backward pass of plan p: (dq, dk, dv) like q, k, v, on the current stream."""
    torch = _torch_mod
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)  # their layouts
    ws = p.workspace
    work = torch.empty(ws, dtype=torch.uint8, device=p.tdevice) if ws else None
    rc = p.run(p.addr, q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), lse.data_ptr(),
               do.data_ptr(), dq.data_ptr(), dk.data_ptr(), dv.data_ptr(),
               work.data_ptr() if ws else None, ws, _raw_stream(p.device))
    if rc:
        p.library.check(rc, "attn_lib_backward")
    return dq, dk, dv


def _device_of(t) -> int:
    index = t.device.index
    return index if index is not None else _torch().cuda.current_device()


def _run_forward(q, k, v, causal: bool, scale: float, stage: str, variant: str,
                 smem_limit: int):
    """The forward pass on the current stream: (o, lse). The custom operator's body."""
    _check_aligned(stage, (("q", q), ("k", k), ("v", v)))
    if _raw_stream is None:
        _init_stream_accessor()
    p = _plan(stage, False, _forward_geometry(q, k), _device_of(q), q.dtype, causal, scale,
              variant, smem_limit)
    return forward_with(p, q, k, v)


def _run_backward(q, k, v, o, lse, do, causal: bool, scale: float, stage: str, variant: str,
                  smem_limit: int):
    """The backward pass on the current stream: (dq, dk, dv). The custom operator's body."""
    _check_aligned(stage, (("q", q), ("k", k), ("v", v), ("o", o), ("lse", lse), ("do", do)))
    if _raw_stream is None:
        _init_stream_accessor()
    p = _plan(stage, True, _backward_geometry(q, k, v, o, do), _device_of(q), q.dtype, causal,
              scale, variant, smem_limit)
    return backward_with(p, q, k, v, o, lse, do)


def _compiling() -> bool:
    """Whether torch.compile is tracing this call (False where PyTorch is absent)."""
    try:
        torch = _torch()
    except ImportError:
        return False
    return torch.compiler.is_compiling()


# ---- the hot path: one dict lookup per call ----

# What a call with these arguments runs, once they have passed every check: a function of
# (q, k, v). Keyed by everything the checks looked at except what can differ between tensors of
# one shape, dtype and device (contiguity and alignment: checked on every call).
_calls: Dict[tuple, object] = {}


def _call_key(q, k, v, causal, scale, stage, variant, smem_limit, backward_stage,
              backward_variant, grad: bool):
    return (type(q), type(k), type(v), q.shape, k.shape, v.shape, q.stride(), k.stride(),
            v.stride(), q.dtype, k.dtype, v.dtype, q.device, k.device, v.device, causal, scale,
            stage, variant, smem_limit, backward_stage, backward_variant, grad,
            os.environ.get("FLASHCOURSE_LIB_DIR"))


def _ready(q, k, v) -> bool:
    """What the cached checks cannot know: 16-byte aligned tensors (the strides are the key's)."""
    return not (q.data_ptr() | k.data_ptr() | v.data_ptr()) % _ALIGN


def _make_call(fp: _Plan, bp: Optional[_Plan], stage: str):
    """The function a cached call runs: the forward plan alone, or both through autograd; by
    the eager operator (C++) where it is loaded, else in Python."""
    op = _eager_op()
    if op is not None:
        call = _eager_call(fp, bp)
        return lambda q, k, v: op(q, k, v, call)
    if bp is None:
        return lambda q, k, v: forward_with(fp, q, k, v)
    from . import _ops
    apply = _ops.AttentionFunction.apply
    return lambda q, k, v: apply(q, k, v, fp, bp, stage)


# ---- the eager operator: the hot path in C++ (python/flashcourse/_eager.cpp) ----

_EAGER_ABI = 1  # EAGER_ABI in _eager.cpp
_DO_LAYOUTS_MAX = 4  # DO_LAYOUTS_MAX in _eager.cpp
_EAGER_LIB = "libflashcourse_eager.so"


_P, _I, _L, _U = ctypes.c_void_p, ctypes.c_int32, ctypes.c_int64, ctypes.c_uint64


class _EagerCall(ctypes.Structure):
    """_eager.cpp's struct eager_call: one cached call, its plans and entry points."""
    _fields_ = ([("abi", _L),
                 ("forward", _P), ("forward_plan", _U), ("forward_workspace", _U),
                 ("forward_error", _P),
                 ("backward", _P), ("backward_plan", _U), ("backward_workspace", _U),
                 ("backward_error", _P),
                 ("plan", _P), ("plan_bytes", _U)] +
                [(n, _I) for n in ("device", "B", "H", "N", "D", "causal", "variant", "H_kv",
                                   "N_k", "bf16")] +
                [("smem_limit", _L), ("scale", ctypes.c_float), ("backward_takes_strides", _I),
                 ("strides", _L * 24)] +
                [(n, _I) for n in ("code_pass", "code_usage", "code_unsupported", "code_oom")] +
                [("backward_stage", _P), ("do_plans", _U), ("do_layouts", _I),
                 ("do_rows", (_L * 3) * _DO_LAYOUTS_MAX),
                 ("do_workspace", _U * _DO_LAYOUTS_MAX)])


def _address(fn) -> int:
    return ctypes.cast(fn, ctypes.c_void_p).value


def _eager_call(fp: _Plan, bp: Optional[_Plan]):
    """The eager operator's description of a call: a CPU byte tensor holding an _EagerCall, the
    forward plan, the backward plan and room for DO_LAYOUTS_MAX more (_eager.cpp's eager_call;
    the plans are copies, so the tensor alone holds what the operator and its autograd node
    read)."""
    torch = _torch()
    c = _EagerCall()
    c.abi = _EAGER_ABI
    lib = fp.library
    head = ctypes.sizeof(_EagerCall)
    c.forward, c.forward_plan, c.forward_workspace = _address(lib.forward), head, fp.workspace
    c.forward_error = _address(lib.last_error)
    for name in ("pass", "usage", "unsupported", "oom"):
        setattr(c, f"code_{name}", lib.codes[name])
    size = head + lib.plan_bytes
    if bp is not None:
        blib = bp.library
        c.backward, c.backward_plan = _address(blib.backward), size
        c.backward_workspace, c.backward_error = bp.workspace, _address(blib.last_error)
        c.plan, c.plan_bytes = _address(blib.plan), blib.plan_bytes
        backward, device, causal, s32, vi, smem_limit, bf16 = bp.args
        B, H, N, D, H_kv, N_k, strides = bp.geometry
        c.device, c.B, c.H, c.N, c.D, c.causal, c.variant = device, B, H, N, D, int(causal), vi
        c.H_kv, c.N_k, c.bf16, c.smem_limit, c.scale = H_kv, N_k, int(bf16), smem_limit, s32
        c.backward_takes_strides = int(bool(blib.stage.backward_takes & TAKES_STRIDES))
        c.strides[:] = strides if strides else (0,) * 24
        c.backward_stage = _address(_stage_names.setdefault(bp.stage, ctypes.create_string_buffer(
            bp.stage.encode())))
        c.do_plans = size + blib.plan_bytes
        size = c.do_plans + _DO_LAYOUTS_MAX * blib.plan_bytes
    t = torch.zeros(size, dtype=torch.uint8)
    base = t.data_ptr()
    ctypes.memmove(base, ctypes.addressof(c), head)
    ctypes.memmove(base + c.forward_plan, fp.addr, lib.plan_bytes)
    if bp is not None:
        ctypes.memmove(base + c.backward_plan, bp.addr, bp.library.plan_bytes)
    return t


_stage_names: Dict[str, ctypes.Array] = {}  # the backward stages' names, for _EagerCall (kept)


_eager = None  # (the operator or None, where it came from or why not): _eager_op()


def _eager_op():
    """The eager operator flashcourse_eager::attention, loaded at the first call, or None: not
    built (`make lib` builds it where python3 has torch), built for another torch, not loadable,
    or FLASHCOURSE_EAGER_OP=0 (read once)."""
    global _eager
    if _eager is None:
        _eager = _load_eager()
    return _eager[0]


def _load_eager():
    torch = _torch()
    if os.environ.get("FLASHCOURSE_EAGER_OP", "1") == "0":
        return None, "Python (FLASHCOURSE_EAGER_OP=0)"
    path = library_dir() / _EAGER_LIB
    if not path.is_file():
        return None, f"Python ({path} not built: `make lib` builds it where python3 has torch)"
    try:
        built = path.with_suffix(".torch").read_text().strip()
    except OSError:
        built = "unknown"
    if built != torch.__version__:
        return None, (f"Python ({path} was built for torch {built}, this is "
                      f"{torch.__version__}: `make lib` again)")
    try:
        torch.ops.load_library(str(path))
        op = torch.ops.flashcourse_eager.attention.default
    except (OSError, RuntimeError, AttributeError) as e:
        return None, f"Python ({path} does not load: {str(e).splitlines()[0]})"
    return op, f"C++ ({path})"


class _PythonPath:
    """Eager calls by the Python path (torch.autograd.Function over ctypes) inside the block,
    whatever eager_path() says, with a call cache of this object's own (kept from one block to
    the next); the eager operator and its cache are back afterwards. For the tests that read the
    Python path's plan (o.grad_fn.bp) and bench_calls.py's `Python path` row."""

    def __init__(self):
        self.calls = {}

    def __enter__(self):
        global _eager, _calls
        self.saved = _eager, _calls
        _eager, _calls = (None, "Python (a _PythonPath block)"), self.calls
        return self

    def __exit__(self, *exc):
        global _eager, _calls
        _eager, _calls = self.saved


def eager_path() -> str:
    """Which code runs an eager call's passes: "C++ (<the eager operator's library>)" or "Python
    (<why not the C++ operator>)". Both give the same results; the C++ operator costs less host
    time per call."""
    _eager_op()
    return _eager[1]


# ---- the public calls ----

def attention(q, k, v, *, causal=False, scale=None, stage=FORWARD_STAGE, variant="default",
              smem_limit=None, backward_stage="auto", backward_variant="default"):
    """softmax(scale * q k^T) v through one of the course's stages; differentiable.

    q: a torch CUDA tensor [B, H, N, D]; k, v [B, H_kv, N_k, D], on q's device, in the stage's
    storage dtype (stages()[i].dtype: float32 for stages 0-1, float16 after; bfloat16 too where
    the stage takes it). Stages 0-4 take H_kv = H, N_k = N and contiguous tensors; stages 5 and
    6 and the backward passes of stages 7 and 8 (the stages whose Stage.takes say so) also
    grouped-query heads (H_kv dividing H: query head h reads key/value head h // (H // H_kv)),
    N_k != N, bf16, and any strides with a contiguous last
    dimension ([B, N, H, D] views, a fused projection's slices: read in place, no copy). causal:
    query i attends to keys 0 .. i + N_k - N (aligned to the bottom right, as flash-attn 2.1 and
    later; a row that attends to no key gets o = 0 and lse = -inf). scale: default 1/sqrt(D).
    stage: a stage name, or "auto": stage 6 (the Hopper forward) where it runs and takes the
    inputs, else stage 5. Runs on torch.cuda.current_stream(); o, lse and the
    workspace are allocated through PyTorch's caching allocator; nothing waits for the GPU, so
    CUDA graphs capture it. smem_limit: lower the shared memory per block the stage may use, as
    the program's --smem-limit (65536: a T4's path, 101376: an L4's).

    Returns (o, lse): o like q (torch.empty_like(q)'s layout), lse [B, H, N] float32 (natural
    log of each row's softmax sum, including its max). Where q, k or v require grad (and grad mode is on), o is differentiable
    with respect to them: the forward pass by `stage`, the backward pass by `backward_stage`
    with `backward_variant` ("deterministic": bit-identical gradients from run to run, stage
    7's); backward_stage: a stage name, or "auto" (the default): stage 8 (the Hopper backward)
    where it runs and takes the inputs, else stage 7 (a variant stage 8 lacks, an smem_limit it
    does not fit: stage 7; flashcourse.auto_backward_stage() says which). Under torch.compile
    both passes are custom operators in its graph. lse is returned
    as a constant (it does not require grad: a loss through it contributes no gradient, as
    flash-attn's); double backward raises RuntimeError.

    The first call of a combination of stage, variant, shapes, dtypes, devices, causal and scale
    checks everything and keeps the plan; later calls cost a dict lookup and the launches.

    Bad input raises TypeError (wrong type, device or dtype, or requires_grad on a float32
    stage) or ValueError (shape, layout, variant, or a shape the stage does not support, with
    the stage's reason, naming the stage that ran, "auto" resolved); a CUDA error raises
    RuntimeError naming the call.
    """
    torch = _torch_mod
    if torch is not None and not torch.compiler.is_compiling():
        try:
            grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or
                                                v.requires_grad)
            call = _calls.get(_call_key(q, k, v, causal, scale, stage, variant, smem_limit,
                                        backward_stage, backward_variant, grad))
        except (AttributeError, TypeError):  # not tensors, an unhashable argument: checked below
            call = None
        if call is not None and _ready(q, k, v):
            return call(q, k, v)
    return _attention_checked(q, k, v, causal, scale, stage, variant, smem_limit,
                              backward_stage, backward_variant)


def _device_index(device) -> int:
    """A CUDA device (None: the current one; an index, "cuda:1", a torch.device) as its index."""
    torch = _torch()
    if isinstance(device, int) and not isinstance(device, bool):
        return device
    index = None if device is None else torch.device(device).index
    return torch.cuda.current_device() if index is None else index


def auto_stage(device=None) -> str:
    """The forward stage that stage="auto" runs on a CUDA device (default: the current one):
    stage 6 (the Hopper forward) where its library is built and runs there, else stage 5."""
    return _auto_stage(_device_index(device))


def auto_backward_stage(device=None) -> str:
    """The backward stage that backward_stage="auto" (the default) runs on a CUDA device
    (default: the current one): stage 8 (the Hopper backward) where its library is built and
    runs there, else stage 7. For one call it is stage 8 where that stage also takes what the
    call asks (its dtype, heads and key count; the backward variant, which stage 8 has only as
    "default"; smem_limit), else stage 7; this says it for the default variant, no smem_limit."""
    return _auto_backward_stage(_device_index(device))


def _asks_of(dtype, H: int, H_kv: int, N: int, N_k: int) -> int:
    """What a call asks of a stage beyond the plain case, strides aside (TAKES_* bits)."""
    asks = TAKES_BF16 if dtype == _torch().bfloat16 else 0
    asks |= TAKES_GQA if H_kv != H else 0
    return asks | (TAKES_N_K if N_k != N else 0)


def _asks(q, k) -> int:
    return _asks_of(q.dtype, q.shape[1], k.shape[1], q.shape[2], k.shape[2])


def _takes_strides(stage: str, backward_stage: Optional[str], device: int = 0, asks: int = 0,
                   backward_variant: str = "default", smem_limit: int = 0) -> bool:
    """Whether the stage's forward (and the backward stage's backward, if given) take strided
    tensors; "auto" for either is resolved as a call on `device` that asks `asks` would be."""
    if stage == "auto":
        stage = _auto_stage(device, asks)
    if not _stage(stage).stage.takes & TAKES_STRIDES:
        return False
    if backward_stage == "auto":
        backward_stage = _auto_backward_stage(device, asks, backward_variant, smem_limit)
    return backward_stage is None or bool(_stage(backward_stage).stage.backward_takes &
                                          TAKES_STRIDES)


def _auto_stage(device: int, asks: int = 0) -> str:
    """stage="auto": the Hopper stage where its library is built, runs on this device and takes
    what the inputs ask (asks: TAKES_* bits), else stage 5."""
    found = _auto_probe(device)
    if asks and found == HOPPER_STAGE and _stage(found).stage.takes & asks != asks:
        return FORWARD_STAGE
    return found


def _auto_probe(device: int) -> str:
    """Whether the Hopper stage runs on this device, asked once per device."""
    found = _auto.get(device)
    if found is None:
        found = FORWARD_STAGE
        try:
            _plan(HOPPER_STAGE, False, (1, 1, 128, 64), device, _torch().float16, False, 0.125,
                  "default", 0)
            found = HOPPER_STAGE
        except (LibraryNotBuiltError, ValueError, RuntimeError):
            pass
        _auto[device] = found
    return found


_auto: Dict[int, str] = {}


def _auto_backward_stage(device: int, asks: int = 0, variant: str = "default",
                         smem_limit: int = 0) -> str:
    """backward_stage="auto": the Hopper backward (stage 8) where its library is built, runs on
    this device within smem_limit and takes what the call asks (asks: TAKES_* bits; the
    backward variant, of its variants), else stage 7. A dict lookup once probed."""
    found = _auto_backward_probe(device, smem_limit)
    if found == HOPPER_BACKWARD_STAGE and (asks or variant != "default"):
        st = _stage(found).stage
        if st.backward_takes & asks != asks or variant not in st.variants:
            return BACKWARD_STAGE
    return found


def _auto_backward_probe(device: int, smem_limit: int = 0) -> str:
    """Whether stage 8's backward runs on this device (at both head dims, within smem_limit:
    0 for the device's own), asked once per device and limit."""
    key = (device, smem_limit)
    found = _auto_bwd.get(key)
    if found is None:
        found = BACKWARD_STAGE
        try:
            for D in (64, 128):
                _plan(HOPPER_BACKWARD_STAGE, True, (1, 1, 128, D), device, _torch().float16,
                      False, 0.125, "default", smem_limit)
            found = HOPPER_BACKWARD_STAGE
        except (LibraryNotBuiltError, ValueError, RuntimeError):
            pass
        _auto_bwd[key] = found
    return found


_auto_bwd: Dict[Tuple[int, int], str] = {}


def _resolve_backward(stage: str, q, k, variant: str, smem_limit: int) -> str:
    """A backward stage name as given, or what "auto" is for q and k (the custom operators')."""
    if stage != "auto":
        return stage
    return _auto_backward_stage(_device_of(q), _asks(q, k), variant, smem_limit)


def _attention_checked(q, k, v, causal, scale, stage, variant, smem_limit, backward_stage,
                       backward_variant):
    """attention() with every check made: the first call of a combination, every call under
    torch.compile (which traces the checks), and every call that fails one."""
    given = (causal, scale, stage, variant, smem_limit)  # the cache's key: as the caller gave them
    given_backward = backward_stage  # ("auto" stays "auto" in the key, as attention() looks it up)
    if not isinstance(stage, str):
        raise TypeError(f"stage must be a stage name such as '{FORWARD_STAGE}', not "
                        f"{type(stage).__name__}")
    eager = not _compiling()  # then the library's checks now, with clear errors
    if eager and stage != "auto":
        _stage(stage)  # an unknown stage or a missing library first, whatever the tensors
    torch = _torch()
    _check_tensors(stage, (("q", q), ("k", k), ("v", v)))
    if eager and stage == "auto":  # (under torch.compile the operators resolve it: _plan)
        stage = _auto_stage(_device_of(q), _asks(q, k))
    causal = _check_causal(causal)
    scale = _scale_checked(scale, int(q.shape[-1]))
    sl = _smem_limit(smem_limit)
    if not isinstance(variant, str):
        raise ValueError(f"{stage}: variant must be a name such as 'default', not {variant!r}")
    grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    if grad and not (isinstance(backward_stage, str) and isinstance(backward_variant, str)):
        raise TypeError("backward_stage and backward_variant are names (str)")
    if eager and grad and backward_stage == "auto":  # (under torch.compile: _ops, _plan)
        backward_stage = _auto_backward_stage(_device_of(q), _asks(q, k), backward_variant, sl)
    if grad and q.dtype == torch.float32:
        named = (backward_stage if backward_stage != "auto" else
                 f"{HOPPER_BACKWARD_STAGE} or {BACKWARD_STAGE}")
        raise TypeError(f"{stage} stores {q.dtype}, and the backward pass ({named}) takes "
                        "float16: for gradients use a float16 stage (stage 2 on), or call it "
                        "under torch.no_grad() or with detached tensors")
    # A stage that does not take strided tensors (or whose backward pass does not, with
    # gradients) gets contiguous copies; under torch.compile, which traces no library call, any
    # strided input is copied.
    strided = not (q.is_contiguous() and k.is_contiguous() and v.is_contiguous())
    copy = strided and (not eager or not _takes_strides(stage, backward_stage if grad else None))
    keys = (q, k, v)  # the cache's key: the tensors as given
    if copy:
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    if not eager:  # (under torch.compile the operators make the library's checks as they trace)
        from . import _ops
        return _ops.forward(q, k, v, causal, scale, stage, variant, sl, backward_stage,
                            backward_variant)
    _check_aligned(stage, (("q", q), ("k", k), ("v", v)))
    if _raw_stream is None:
        _init_stream_accessor()
    dev = _device_of(q)
    fp = _plan(stage, False, _forward_geometry(q, k), dev, q.dtype, causal, scale, variant, sl)
    bp = _plan(backward_stage, True, _backward_geometry(q, k, v), dev, q.dtype, causal, scale,
               backward_variant, sl, who=stage) if grad else None
    call = _make_call(fp, bp, stage)
    if copy:
        run = call
        call = lambda q, k, v: run(q.contiguous(), k.contiguous(), v.contiguous())  # noqa: E731
    if given[1] is None or type(given[1]) in (int, float):  # (a 0-d tensor hashes by identity)
        try:
            key = _call_key(*keys, *given, given_backward, backward_variant, grad)
        except TypeError:  # an unhashable argument: checked every call
            key = None
        if key is not None:
            if len(_calls) >= _PLANS_MAX:
                _calls.clear()
            _calls[key] = call
    return call(q, k, v)


def attention_backward(q, k, v, o, lse, do, *, causal=False, scale=None, stage="auto",
                       variant="default", smem_limit=None):
    """dq, dk, dv of attention(q, k, v) for the upstream gradient do = dLoss/do, by `stage`'s
    backward pass, on the current stream. stage: a stage name, or "auto" (the default): stage 8
    (the Hopper backward, FlashAttention-3's) where it runs and takes the inputs, else stage 7
    (FlashAttention-2's), as attention()'s backward_stage.

    q, k, v, o, do: [B, H, N, D] CUDA tensors of the stage's dtype (float16), contiguous; o and
    lse [B, H, N] float32 (natural log) as attention() returned them for the same causal and
    scale (any forward stage: they share the contract). variant: the backward stage's variants
    (stage 7's: "default": dq by fp32 atomics, "deterministic": bit-identical from run to run,
    "registers": the layout with P and dS kept in registers, as on GPUs with less shared memory;
    stage 8 has "default" only, so "auto" with another variant is stage 7).
    Returns (dq, dk, dv) like q. Errors as attention()'s, naming the stage that ran.
    """
    if not isinstance(stage, str):
        raise TypeError(f"stage must be a stage name such as '{BACKWARD_STAGE}', not "
                        f"{type(stage).__name__}")
    eager = not _compiling()
    if eager and stage != "auto":
        _stage(stage)
    torch = _torch()
    named = (("q", q), ("k", k), ("v", v), ("o", o), ("do", do))
    _check_tensors(stage, named)
    if eager and stage == "auto":  # (under torch.compile the operator resolves it: _ops)
        stage = _auto_backward_stage(_device_of(q), _asks(q, k), variant,
                                     _smem_limit(smem_limit))
    if not isinstance(lse, torch.Tensor):
        raise TypeError(f"{stage} takes torch tensors; lse is a {type(lse).__name__}")
    if lse.device != q.device or lse.dtype != torch.float32:
        raise TypeError(f"{stage} takes lse as float32 on q's device ({q.device}); it is "
                        f"{lse.dtype} on {lse.device}")
    if tuple(lse.shape) != tuple(q.shape[:3]) or not lse.is_contiguous():
        raise ValueError(f"{stage} takes lse of shape [B, H, N] = {tuple(q.shape[:3])}, "
                         f"contiguous; it is {tuple(lse.shape)} (strides {tuple(lse.stride())})")
    causal = _check_causal(causal)
    scale = _scale_checked(scale, int(q.shape[-1]))
    sl = _smem_limit(smem_limit)
    if not isinstance(variant, str):
        raise ValueError(f"{stage}: variant must be a name such as 'default', not {variant!r}")
    if not eager:
        from . import _ops
        return _ops.backward(q, k, v, o, lse, do, causal, scale, stage, variant, sl)
    return _run_backward(q, k, v, o, lse, do, causal, scale, stage, variant, sl)


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, scale=None, enable_gqa=False, *, stage="auto",
                                 backward_stage="auto", backward_variant="default"):
    """torch.nn.functional.scaled_dot_product_attention's signature and layout, over the
    course's stages: a one-line swap into a model,

        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        o = flashcourse.scaled_dot_product_attention(q, k, v, is_causal=True)

    query [B, H, N, D], key and value [B, H_kv, N_k, D] (H_kv < H: grouped-query heads, with
    enable_gqa=True as SDPA asks), CUDA tensors of one dtype the stage stores (float16; bfloat16
    where the stages take it: stage 6, stage 7's and stage 8's backward), head dim 64 or 128, any
    strides with a contiguous last dimension (views of a fused projection are read in place).
    is_causal with N != N_k: aligned to the bottom right (query i sees keys <= i + N_k - N; SDPA
    aligns to the top left). Returns the output [B, H, N, D]; differentiable as attention().
    stage: "auto" (stage 6 on Hopper, else stage 5) or a stage name; backward_stage: "auto"
    (stage 8, the Hopper backward, where it runs and takes the inputs, else stage 7) or a stage
    name. What SDPA takes and the stages do not (an attn_mask, dropout) raises
    NotImplementedError saying so; inputs a stage does not take raise ValueError naming it.
    """
    if attn_mask is not None:
        raise NotImplementedError("flashcourse.scaled_dot_product_attention takes no attn_mask "
                                  "(the stages compute full or causal attention: is_causal=True)")
    if dropout_p:
        raise NotImplementedError(f"flashcourse.scaled_dot_product_attention has no dropout "
                                  f"(dropout_p={dropout_p!r}): pass dropout_p=0.0")
    torch = _torch()
    tensors = all(isinstance(t, torch.Tensor) for t in (query, key, value))
    if (tensors and query.dim() == key.dim() == 4 and key.shape[1] != query.shape[1] and
            not enable_gqa):
        raise ValueError(f"flashcourse.scaled_dot_product_attention: key and value have "
                         f"{key.shape[1]} heads, query {query.shape[1]}: pass enable_gqa=True "
                         f"for grouped-query heads (as SDPA asks)")
    o, _ = attention(query, key, value, causal=is_causal, scale=scale, stage=stage,
                     backward_stage=backward_stage, backward_variant=backward_variant)
    return o


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, *, stage="auto",
                    backward_stage="auto", backward_variant="default"):
    """flash-attn's flash_attn_func signature and layout over the course's stages:

        from flash_attn import flash_attn_func          # or:
        from flashcourse import flash_attn_func
        o = flash_attn_func(q, k, v, causal=True)

    q [B, N, H, D], k and v [B, N_k, H_kv, D] (H_kv dividing H: grouped-query heads), CUDA
    tensors of one dtype the stage stores (float16; bfloat16 where it takes it), any strides with
    a contiguous last dimension (q, k, v of one fused [B, N, 3, H, D] projection are read in
    place). causal with N != N_k: aligned to the bottom right, as flash-attn 2.1 and later.
    Returns o [B, N, H, D]; differentiable as attention(). stage: "auto" (stage 6 on Hopper,
    else stage 5) or a stage name; backward_stage: "auto" (stage 8, the Hopper backward, where
    it runs and takes the inputs, else stage 7) or a stage name. dropout_p must be 0 (no
    dropout: NotImplementedError otherwise).
    """
    if dropout_p:
        raise NotImplementedError(f"flashcourse.flash_attn_func has no dropout (dropout_p="
                                  f"{dropout_p!r}): pass dropout_p=0.0")
    torch = _torch()
    for n, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"flash_attn_func takes torch tensors; {n} is a {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"flash_attn_func takes q [B, N, H, D], k and v [B, N_k, H_kv, D]; "
                             f"{n} has shape {tuple(t.shape)}")
    # [B, N, H, D] -> [B, H, N, D] views: the same memory, the stages read it through strides
    o, _ = attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=causal,
                     scale=softmax_scale, stage=stage, backward_stage=backward_stage,
                     backward_variant=backward_variant)
    o = o.transpose(1, 2)  # [B, N, H, D]: contiguous unless a stage without strides took copies
    return o if o.is_contiguous() else o.contiguous()


# ---- raw entry points, for the tests ----

def _raw_plan(stage: str, backward: bool, device: int, shape, causal: bool, scale: float,
              variant: int, smem_limit: int = 0) -> _Plan:
    B, H, N, D = shape
    return _Plan(_stage(stage), backward, device, (B, H, N, D, H, N, None), causal, scale,
                 variant, smem_limit)


def _forward_raw(stage: str, device: int, shape, causal: bool, scale: float, variant: int,
                 ptrs, workspace_bytes: int = 0, stream: int = 0, smem_limit: int = 0):
    """attn_lib_forward on raw device pointers (q, k, v, o, lse, workspace): for the tests, which
    reach the C entry point's own checks with inputs attention() refuses first."""
    p = _raw_plan(stage, False, device, shape, causal, scale, variant, smem_limit)
    p.library.check(p.run(p.addr, *ptrs, workspace_bytes, stream), "attn_lib_forward")


def _backward_raw(stage: str, device: int, shape, causal: bool, scale: float, variant: int,
                  ptrs, workspace_bytes: int = 0, stream: int = 0, smem_limit: int = 0):
    """attn_lib_backward on raw device pointers (q, k, v, o, lse, do, dq, dk, dv, workspace)."""
    p = _raw_plan(stage, True, device, shape, causal, scale, variant, smem_limit)
    p.library.check(p.run(p.addr, *ptrs, workspace_bytes, stream), "attn_lib_backward")


def _check_raw(stage: str, device: int, shape, causal: bool, scale: float,
               variant: int, smem_limit: int = 0, backward: bool = False) -> int:
    """attn_lib_plan without a plan: the workspace bytes, or the error it raises (tests; no
    torch needed)."""
    library = _stage(stage)
    ws = ctypes.c_size_t(0)
    B, H, N, D = shape
    rc = library.plan(_PASS_BWD if backward else _PASS_FWD, device, smem_limit, B, H, N, D,
                      int(causal), scale, variant, H, N, 0, None, None, 0, ctypes.byref(ws))
    library.check(rc, "attn_lib_plan")
    return ws.value
