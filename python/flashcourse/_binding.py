"""The ctypes side of build/lib/lib<stage>.so (python/lib.mk, common/attn_lib.c).

Each library exports the stage descriptor `attn_this_stage` (common/attention.h) and the entry
points attn_lib_check / attn_lib_forward, attn_lib_backward_check / attn_lib_backward and
attn_lib_exit_codes. Nothing here compiles anything, and PyTorch is imported only when
attention() or attention_backward() is called, so stages() works on a machine without it.

attention() and attention_backward() check their arguments in plain Python on the tensors'
metadata (torch.compile traces that part), then call the custom operators of _ops.py
(flashcourse::forward, flashcourse::backward), whose bodies run the library on the current
stream and whose autograd formula ties the two together.
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

ABI = 3  # ATTN_LIB_ABI in common/attn_lib.c
_ERR_LEN = 1024
_INT_MAX = 2**31 - 1
_FLT_MIN = 2.0**-126  # the smallest normal float32
_ALIGN = 16  # the widest vector load any stage makes (16 bytes)
_DTYPES = {0: "float32", 1: "float16"}  # attn_dtype: ATTN_F32, ATTN_F16
BACKWARD_STAGE = "stage7_backward"  # the stage whose backward pass attention() differentiates with


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

    @property
    def torch_dtype(self):
        return getattr(_torch(), self.dtype)


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
_loaded: Dict[str, Tuple[Stage, ctypes.CDLL, Dict[str, int]]] = {}


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


def _load(path: Path) -> Tuple[Stage, ctypes.CDLL, Dict[str, int]]:
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
        # device, smem_limit, B, H, N, D, causal, scale, variant
        shape = [ctypes.c_int, ctypes.c_longlong] + [ctypes.c_int] * 5 + [ctypes.c_float,
                                                                          ctypes.c_int]
        tail = [ctypes.c_size_t, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
        check = shape + [ctypes.POINTER(ctypes.c_size_t), ctypes.c_char_p, ctypes.c_size_t]
        for fn, args in ((lib.attn_lib_check, check),
                         (lib.attn_lib_forward, shape + [ctypes.c_void_p] * 6 + tail),
                         (lib.attn_lib_backward_check, check),
                         (lib.attn_lib_backward, shape + [ctypes.c_void_p] * 10 + tail)):
            fn.restype, fn.argtypes = ctypes.c_int, args
        lib.attn_lib_exit_codes.restype = ctypes.c_char_p
        lib.attn_lib_exit_codes.argtypes = []
        codes = _parse_codes(lib.attn_lib_exit_codes().decode())
        st = Stage(
            name=desc.name.decode(),
            dtype=_DTYPES.get(desc.dtype, f"unknown({desc.dtype})"),
            variants=tuple(desc.variants.decode().split(",")),
            adds=desc.adds.decode(),
            path=key,
            backward=bool(desc.backward and desc.backward_workspace_bytes),
        )
        _loaded[key] = (st, lib, codes)
        return _loaded[key]


def stages() -> List[Stage]:
    """The stages built (one Stage per build/lib/lib<stage>.so), by name."""
    d = library_dir()
    paths = sorted(d.glob("libstage*.so")) if d.is_dir() else []
    if not paths:
        raise LibraryNotBuiltError(f"no stage libraries found: {_make_hint(d)}")
    return [_load(p)[0] for p in paths]


def exit_codes(stage: str = "stage5_tuned") -> Dict[str, int]:
    """The return codes of the stage's library, which are the programs' exit codes (their one
    home is the attn_exit enum of common/attention.h), by name: pass, wrong, usage, unsupported,
    oom."""
    return dict(_stage(stage)[2])


def _source_stages() -> List[str]:
    return sorted(p.parent.name for p in REPO.glob("stage[0-9]*/attention.cu")) if REPO else []


def _stage(name) -> Tuple[Stage, ctypes.CDLL, Dict[str, int]]:
    if not isinstance(name, str):
        raise TypeError(f"stage must be a stage name such as 'stage5_tuned', not "
                        f"{type(name).__name__}")
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
    if loaded[0].name != name:
        raise RuntimeError(f"{path} holds the stage '{loaded[0].name}', not '{name}'")
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


def _raise(rc: int, err, call: str, codes: Dict[str, int]):
    if rc == codes["pass"]:
        return
    msg = err.value.decode(errors="replace") or f"{call} returned {rc}"
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
    """Type, device, dtype, shape and layout of [B, H, N, D] tensors: tensor metadata only, so
    torch.compile traces it. named: [(name, tensor)], the first one's shape the reference."""
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
    if t0.dim() != 4:
        raise ValueError(f"{who} takes {n0}, k, v of shape [B, H, N, D]; {n0} has shape "
                         f"{tuple(t0.shape)}")
    for n, t in named[1:]:
        if t.shape != t0.shape:
            raise ValueError(f"{who} takes {', '.join(x for x, _ in named)} of one shape "
                             f"[B, H, N, D]; {n0} is {tuple(t0.shape)}, {n} is "
                             f"{tuple(t.shape)}")
    for n, t in named:
        if not t.is_contiguous():
            raise ValueError(f"{who} takes contiguous tensors; {n} is not "
                             f"(strides {tuple(t.stride())}): pass {n}.contiguous()")
    if any(x > _INT_MAX for x in t0.shape):
        raise ValueError(f"{who}: every dimension of [B, H, N, D] must fit in an int; "
                         f"got {tuple(t0.shape)}")


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


# ---- planning: the library's checks, on shapes and names only (the fake operators use them) ----

def _plan(stage: str, backward: bool, shape, device: int, dtype, causal: bool, scale: float,
          variant: str, smem_limit: int, who: Optional[str] = None):
    """Every check the library makes before a pass, without running it: (lib, variant index,
    float32 scale, workspace bytes, codes). dtype: the tensors' torch dtype."""
    st, lib, codes = _stage(stage)
    torch = _torch()
    if backward and not st.backward:
        raise ValueError(f"{st.name} has no backward pass (stages with one: "
                         f"{', '.join(s.name for s in stages() if s.backward) or 'none built'})")
    if dtype != st.torch_dtype:
        if backward and who:
            raise TypeError(f"{who}: the backward pass ({st.name}) takes {st.torch_dtype} "
                            f"tensors, these are {dtype}")
        raise TypeError(f"{st.name} takes {st.torch_dtype} tensors (its storage type); "
                        f"these are {dtype}")
    vi = _variant_index(st, variant, "backward variant" if backward and who else "variant")
    s32 = _scale32(scale)
    B, H, N, D = (int(x) for x in shape)
    err = ctypes.create_string_buffer(_ERR_LEN)
    ws = ctypes.c_size_t(0)
    check = lib.attn_lib_backward_check if backward else lib.attn_lib_check
    if device is None:
        device = torch.cuda.current_device()
    rc = check(device, smem_limit, B, H, N, D, int(causal), s32, vi, ctypes.byref(ws), err,
               _ERR_LEN)
    _raise(rc, err, check.__name__, codes)
    return lib, vi, s32, ws.value, codes


def _run_forward(q, k, v, causal: bool, scale: float, stage: str, variant: str,
                 smem_limit: int):
    """The forward pass on the current stream: (o, lse). The operator's body."""
    torch = _torch()
    _check_aligned(stage, (("q", q), ("k", k), ("v", v)))
    dev = q.device.index if q.device.index is not None else torch.cuda.current_device()
    lib, vi, s32, ws, codes = _plan(stage, False, q.shape, dev, q.dtype, causal, scale, variant,
                                    smem_limit)
    B, H, N, D = (int(x) for x in q.shape)
    err = ctypes.create_string_buffer(_ERR_LEN)
    with torch.cuda.device(dev):
        stream = torch.cuda.current_stream(dev)
        o = torch.empty_like(q)
        lse = torch.empty((B, H, N), dtype=torch.float32, device=q.device)
        work = torch.empty(ws, dtype=torch.uint8, device=q.device) if ws else None
        rc = lib.attn_lib_forward(dev, smem_limit, B, H, N, D, int(causal), s32, vi,
                                  q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(),
                                  lse.data_ptr(), work.data_ptr() if work is not None else None,
                                  ws, stream.cuda_stream, err, _ERR_LEN)
        _raise(rc, err, "attn_lib_forward", codes)
    return o, lse


def _run_backward(q, k, v, o, lse, do, causal: bool, scale: float, stage: str, variant: str,
                  smem_limit: int):
    """The backward pass on the current stream: (dq, dk, dv). The operator's body."""
    torch = _torch()
    _check_aligned(stage, (("q", q), ("k", k), ("v", v), ("o", o), ("lse", lse), ("do", do)))
    dev = q.device.index if q.device.index is not None else torch.cuda.current_device()
    lib, vi, s32, ws, codes = _plan(stage, True, q.shape, dev, q.dtype, causal, scale, variant,
                                    smem_limit)
    B, H, N, D = (int(x) for x in q.shape)
    err = ctypes.create_string_buffer(_ERR_LEN)
    with torch.cuda.device(dev):
        stream = torch.cuda.current_stream(dev)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        work = torch.empty(ws, dtype=torch.uint8, device=q.device) if ws else None
        rc = lib.attn_lib_backward(dev, smem_limit, B, H, N, D, int(causal), s32, vi,
                                   q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(),
                                   lse.data_ptr(), do.data_ptr(), dq.data_ptr(), dk.data_ptr(),
                                   dv.data_ptr(), work.data_ptr() if work is not None else None,
                                   ws, stream.cuda_stream, err, _ERR_LEN)
        _raise(rc, err, "attn_lib_backward", codes)
    return dq, dk, dv


def _compiling() -> bool:
    """Whether torch.compile is tracing this call (False where PyTorch is absent)."""
    try:
        torch = _torch()
    except ImportError:
        return False
    return torch.compiler.is_compiling()


# ---- the public calls ----

def attention(q, k, v, *, causal=False, scale=None, stage="stage5_tuned", variant="default",
              smem_limit=None, backward_stage=BACKWARD_STAGE, backward_variant="default"):
    """softmax(scale * q k^T) v through one of the course's stages; differentiable.

    q, k, v: torch CUDA tensors [B, H, N, D], contiguous, on one device, in the stage's storage
    dtype (stages()[i].dtype: float32 for stages 0-1, float16 after). causal: query i attends to
    keys 0..i. scale: default 1/sqrt(D). Runs on torch.cuda.current_stream(); workspace, O and
    LSE are allocated through PyTorch on that stream. smem_limit: lower the shared memory per
    block the stage may use, as the program's --smem-limit (65536: a T4's path, 101376: an L4's).

    Returns (o, lse): o like q, lse [B, H, N] float32 (natural log of each row's softmax sum,
    including its max). Where q, k or v require grad (and grad mode is on), o is differentiable
    with respect to them: the forward pass by `stage`, the backward pass by `backward_stage`
    (stage 7, float16) with `backward_variant` ("deterministic": bit-identical gradients from
    run to run), both registered as PyTorch custom operators, so torch.compile keeps them in
    its graph. A gradient into lse, and double backward, raise RuntimeError.

    Bad input raises TypeError (wrong type, device or dtype, or requires_grad on a float32
    stage) or ValueError (shape, layout, variant, or a shape the stage does not support, with
    the stage's reason); a CUDA error raises RuntimeError naming the call.
    """
    if not isinstance(stage, str):
        raise TypeError(f"stage must be a stage name such as 'stage5_tuned', not "
                        f"{type(stage).__name__}")
    if not _compiling():
        _stage(stage)  # an unknown stage or a missing library first, whatever the tensors
    torch = _torch()
    _check_tensors(stage, (("q", q), ("k", k), ("v", v)))
    causal = _check_causal(causal)
    scale = _scale_checked(scale, int(q.shape[-1]))
    sl = _smem_limit(smem_limit)
    if not isinstance(variant, str):
        raise ValueError(f"{stage}: variant must be a name such as 'default', not {variant!r}")
    grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    eager = not _compiling()  # then the library's checks now, with clear errors
    if eager:  # (under torch.compile the operator makes them while it traces)
        _check_aligned(stage, (("q", q), ("k", k), ("v", v)))
        dev = q.device.index if q.device.index is not None else torch.cuda.current_device()
        _plan(stage, False, q.shape, dev, q.dtype, causal, scale, variant, sl)
    if grad and q.dtype != torch.float16:
        raise TypeError(f"{stage} stores {q.dtype}, and the backward pass ({backward_stage}) "
                        "takes float16: for gradients use a float16 stage (stage 2 on), or call "
                        "it under torch.no_grad() or with detached tensors")
    if grad and not (isinstance(backward_stage, str) and isinstance(backward_variant, str)):
        raise TypeError("backward_stage and backward_variant are names (str)")
    if grad and eager:
        _plan(backward_stage, True, q.shape, dev, q.dtype, causal, scale, backward_variant, sl,
              who=stage)
    from . import _ops
    return _ops.forward(q, k, v, causal, scale, stage, variant, sl, backward_stage,
                        backward_variant)


def attention_backward(q, k, v, o, lse, do, *, causal=False, scale=None, stage=BACKWARD_STAGE,
                       variant="default", smem_limit=None):
    """dq, dk, dv of attention(q, k, v) for the upstream gradient do = dLoss/do, by `stage`'s
    backward pass (stage 7: FlashAttention-2's), on the current stream.

    q, k, v, o, do: [B, H, N, D] CUDA tensors of the stage's dtype (float16), contiguous; o and
    lse [B, H, N] float32 (natural log) as attention() returned them for the same causal and
    scale (any forward stage: they share the contract). variant: the backward stage's variants
    ("default": dq by fp32 atomics, "deterministic": bit-identical from run to run,
    "registers": the layout with P and dS kept in registers, as on GPUs with less shared memory).
    Returns (dq, dk, dv) like q. Errors as attention()'s.
    """
    if not isinstance(stage, str):
        raise TypeError(f"stage must be a stage name such as '{BACKWARD_STAGE}', not "
                        f"{type(stage).__name__}")
    if not _compiling():
        _stage(stage)
    torch = _torch()
    named = (("q", q), ("k", k), ("v", v), ("o", o), ("do", do))
    _check_tensors(stage, named)
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
    if not _compiling():
        _check_aligned(stage, named + (("lse", lse),))
        dev = q.device.index if q.device.index is not None else torch.cuda.current_device()
        _plan(stage, True, q.shape, dev, q.dtype, causal, scale, variant, sl)
    from . import _ops
    return _ops.backward(q, k, v, o, lse, do, None, causal, scale, stage, variant, sl)


# ---- raw entry points, for the tests ----

def _forward_raw(stage: str, device: int, shape, causal: bool, scale: float, variant: int,
                 ptrs, workspace_bytes: int = 0, stream: int = 0, smem_limit: int = 0):
    """attn_lib_forward on raw device pointers (q, k, v, o, lse, workspace): for the tests, which
    reach the C entry point's own checks with inputs attention() refuses first."""
    _, lib, codes = _stage(stage)
    err = ctypes.create_string_buffer(_ERR_LEN)
    B, H, N, D = shape
    rc = lib.attn_lib_forward(device, smem_limit, B, H, N, D, int(causal), scale, variant, *ptrs,
                              workspace_bytes, stream, err, _ERR_LEN)
    _raise(rc, err, "attn_lib_forward", codes)


def _backward_raw(stage: str, device: int, shape, causal: bool, scale: float, variant: int,
                  ptrs, workspace_bytes: int = 0, stream: int = 0, smem_limit: int = 0):
    """attn_lib_backward on raw device pointers (q, k, v, o, lse, do, dq, dk, dv, workspace)."""
    _, lib, codes = _stage(stage)
    err = ctypes.create_string_buffer(_ERR_LEN)
    B, H, N, D = shape
    rc = lib.attn_lib_backward(device, smem_limit, B, H, N, D, int(causal), scale, variant,
                               *ptrs, workspace_bytes, stream, err, _ERR_LEN)
    _raise(rc, err, "attn_lib_backward", codes)


def _check_raw(stage: str, device: int, shape, causal: bool, scale: float,
               variant: int, smem_limit: int = 0, backward: bool = False) -> int:
    """attn_lib_check (or attn_lib_backward_check): the workspace bytes, or the error it raises
    (tests; no torch needed)."""
    _, lib, codes = _stage(stage)
    err = ctypes.create_string_buffer(_ERR_LEN)
    ws = ctypes.c_size_t(0)
    B, H, N, D = shape
    check = lib.attn_lib_backward_check if backward else lib.attn_lib_check
    rc = check(device, smem_limit, B, H, N, D, int(causal), scale, variant, ctypes.byref(ws),
               err, _ERR_LEN)
    _raise(rc, err, check.__name__, codes)
    return ws.value
