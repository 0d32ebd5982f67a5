"""The ctypes side of build/lib/lib<stage>.so (python/lib.mk, common/attn_lib.c).

Each library exports the stage descriptor `attn_this_stage` (common/attention.h) and
attn_lib_check / attn_lib_forward. Nothing here compiles anything, and PyTorch is imported only
when attention() is called, so stages() works on a machine without it.
"""

import ctypes
import math
import os
import struct
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

REPO = Path(__file__).resolve().parents[2]
ABI = 2  # ATTN_LIB_ABI in common/attn_lib.c
_ERR_LEN = 1024
_INT_MAX = 2**31 - 1
_FLT_MIN = 2.0**-126  # the smallest normal float32
_ALIGN = 16  # the widest vector load any stage makes (16 bytes)
_DTYPES = {0: "float32", 1: "float16"}  # attn_dtype: ATTN_F32, ATTN_F16

# The program's exit codes, as common/attn_lib.c returns them.
_OK, _CUDA, _BAD_ARG, _UNSUPPORTED, _OOM = 0, 1, 2, 3, 4


class LibraryNotBuiltError(FileNotFoundError):
    """A stage library is missing: `make lib` in the repository root builds them."""


class _Descriptor(ctypes.Structure):
    # The leading fields of attn_stage (common/attention.h); the function pointers after them
    # are reached through attn_lib_check / attn_lib_forward instead.
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("adds", ctypes.c_char_p),
        ("dtype", ctypes.c_int),
        ("variants", ctypes.c_char_p),
    ]


@dataclass(frozen=True)
class Stage:
    """One built stage, as its library describes itself."""

    name: str  # "stage5_tuned"
    dtype: str  # storage type of q, k, v and o: "float32" or "float16"
    variants: Tuple[str, ...]  # variants[0] is always "default"
    adds: str  # what this stage adds over the previous one
    path: str  # the library

    @property
    def torch_dtype(self):
        return getattr(_torch(), self.dtype)


def library_dir() -> Path:
    """Where the libraries are looked for: $FLASHCOURSE_LIB_DIR, else <repository>/build/lib."""
    env = os.environ.get("FLASHCOURSE_LIB_DIR")
    return Path(env) if env else REPO / "build" / "lib"


def _make_hint(d: Path) -> str:
    return (f"run `make lib` in {REPO} (it builds build/lib/lib<stage>.so for every stage), "
            f"or point FLASHCOURSE_LIB_DIR at the folder that holds them (looked in {d})")


_lock = threading.Lock()
_loaded: Dict[str, Tuple[Stage, ctypes.CDLL]] = {}


def _load(path: Path) -> Tuple[Stage, ctypes.CDLL]:
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
        lib.attn_lib_check.restype = ctypes.c_int
        lib.attn_lib_check.argtypes = shape + [
            ctypes.POINTER(ctypes.c_size_t), ctypes.c_char_p, ctypes.c_size_t]
        lib.attn_lib_forward.restype = ctypes.c_int
        lib.attn_lib_forward.argtypes = shape + [ctypes.c_void_p] * 6 + [
            ctypes.c_size_t, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
        st = Stage(
            name=desc.name.decode(),
            dtype=_DTYPES.get(desc.dtype, f"unknown({desc.dtype})"),
            variants=tuple(desc.variants.decode().split(",")),
            adds=desc.adds.decode(),
            path=key,
        )
        _loaded[key] = (st, lib)
        return st, lib


def stages() -> List[Stage]:
    """The stages built (one Stage per build/lib/lib<stage>.so), by name."""
    d = library_dir()
    paths = sorted(d.glob("libstage*.so")) if d.is_dir() else []
    if not paths:
        raise LibraryNotBuiltError(f"no stage libraries found: {_make_hint(d)}")
    return [_load(p)[0] for p in paths]


def _source_stages() -> List[str]:
    return sorted(p.parent.name for p in REPO.glob("stage[0-9]*/attention.cu"))


def _stage(name) -> Tuple[Stage, ctypes.CDLL]:
    if not isinstance(name, str):
        raise TypeError(f"stage must be a stage name such as 'stage5_tuned', not "
                        f"{type(name).__name__}")
    d = library_dir()
    path = d / f"lib{name}.so"
    if not path.is_file():
        built = sorted(p.name[3:-3] for p in d.glob("libstage*.so")) if d.is_dir() else []
        if name not in built and name not in _source_stages():
            known = ", ".join(sorted(set(built) | set(_source_stages()))) or "none"
            raise ValueError(f"unknown stage '{name}' (stages: {known})")
        raise LibraryNotBuiltError(f"{path} not found: {_make_hint(d)}")
    st, lib = _load(path)
    if st.name != name:
        raise RuntimeError(f"{path} holds the stage '{st.name}', not '{name}'")
    return st, lib


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


def _raise(rc: int, err, call: str):
    if rc == _OK:
        return
    msg = err.value.decode(errors="replace") or f"{call} returned {rc}"
    if rc in (_BAD_ARG, _UNSUPPORTED):
        raise ValueError(msg)
    if rc == _OOM:
        oom = getattr(getattr(_torch_mod, "cuda", None), "OutOfMemoryError", RuntimeError)
        raise oom(msg)
    raise RuntimeError(msg)


def _scale32(scale, D: int) -> float:
    if scale is None:
        scale = 1.0 / math.sqrt(D)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        try:
            scale = float(scale)  # numpy scalars, 0-d tensors
        except (TypeError, ValueError):
            raise TypeError(f"scale must be a number, not {type(scale).__name__}") from None
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale must be a positive finite number, got {scale}")
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


def _check_inputs(st: Stage, q, k, v, causal):
    torch = _torch()
    want = st.torch_dtype
    for n, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{st.name} takes torch tensors; {n} is a {type(t).__name__}")
        if t.device.type != "cuda":
            raise TypeError(f"{st.name} takes CUDA tensors; {n} is on {t.device}")
        if t.dtype != want:
            raise TypeError(f"{st.name} takes {want} tensors (its storage type); {n} is {t.dtype}")
    if k.device != q.device or v.device != q.device:
        raise TypeError(f"{st.name} takes q, k and v on one device; they are on {q.device}, "
                        f"{k.device} and {v.device}")
    if q.dim() != 4:
        raise ValueError(f"{st.name} takes q, k, v of shape [B, H, N, D]; q has shape "
                         f"{tuple(q.shape)}")
    if k.shape != q.shape or v.shape != q.shape:
        raise ValueError(f"{st.name} takes q, k and v of one shape [B, H, N, D]; they are "
                         f"{tuple(q.shape)}, {tuple(k.shape)} and {tuple(v.shape)}")
    for n, t in (("q", q), ("k", k), ("v", v)):
        if not t.is_contiguous():
            raise ValueError(f"{st.name} takes contiguous tensors; {n} is not "
                             f"(strides {tuple(t.stride())}): pass {n}.contiguous()")
        if t.data_ptr() % _ALIGN:
            raise ValueError(f"{st.name} takes tensors whose data is {_ALIGN}-byte aligned; "
                             f"{n} starts at an offset into its storage: pass {n}.clone()")
    if any(x > _INT_MAX for x in q.shape):
        raise ValueError(f"{st.name}: every dimension of [B, H, N, D] must fit in an int; "
                         f"got {tuple(q.shape)}")
    if not (isinstance(causal, bool) or (isinstance(causal, int) and causal in (0, 1))):
        raise TypeError(f"causal must be True or False, not {causal!r}")
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        raise ValueError(f"{st.name} has a forward pass only (no backward): call it under "
                         "torch.no_grad() or pass detached tensors")


def attention(q, k, v, *, causal=False, scale=None, stage="stage5_tuned", variant="default",
              smem_limit=None):
    """softmax(scale * q k^T) v through one of the course's stages.

    q, k, v: torch CUDA tensors [B, H, N, D], contiguous, on one device, in the stage's storage
    dtype (stages()[i].dtype: float32 for stages 0-1, float16 after). causal: query i attends to
    keys 0..i. scale: default 1/sqrt(D). Runs on torch.cuda.current_stream(); workspace, O and
    LSE are allocated through PyTorch on that stream. smem_limit: lower the shared memory per
    block the stage may use, as the program's --smem-limit (65536: a T4's path, 101376: an L4's).

    Returns (o, lse): o like q, lse [B, H, N] float32 (natural log of each row's softmax sum,
    including its max). Bad input raises TypeError (wrong type, device or dtype) or ValueError
    (shape, layout, variant, or a shape the stage does not support, with the stage's reason);
    a CUDA error raises RuntimeError naming the call.
    """
    st, lib = _stage(stage)
    _check_inputs(st, q, k, v, causal)
    if not isinstance(variant, str) or variant not in st.variants:
        raise ValueError(f"{st.name} has no variant {variant!r} (variants: "
                         f"{', '.join(st.variants)})")
    sl = _smem_limit(smem_limit)
    torch = _torch()
    B, H, N, D = (int(x) for x in q.shape)
    s32 = _scale32(scale, D)
    vi = st.variants.index(variant)
    dev = q.device.index if q.device.index is not None else torch.cuda.current_device()
    err = ctypes.create_string_buffer(_ERR_LEN)
    ws = ctypes.c_size_t(0)
    rc = lib.attn_lib_check(dev, sl, B, H, N, D, int(causal), s32, vi, ctypes.byref(ws), err,
                            _ERR_LEN)
    _raise(rc, err, "attn_lib_check")
    with torch.cuda.device(dev):
        stream = torch.cuda.current_stream(dev)
        o = torch.empty_like(q)
        lse = torch.empty((B, H, N), dtype=torch.float32, device=q.device)
        work = torch.empty(ws.value, dtype=torch.uint8, device=q.device) if ws.value else None
        rc = lib.attn_lib_forward(dev, sl, B, H, N, D, int(causal), s32, vi, q.data_ptr(),
                                  k.data_ptr(), v.data_ptr(), o.data_ptr(), lse.data_ptr(),
                                  work.data_ptr() if work is not None else None, ws.value,
                                  stream.cuda_stream, err, _ERR_LEN)
        _raise(rc, err, "attn_lib_forward")
    return o, lse


def _forward_raw(stage: str, device: int, shape, causal: bool, scale: float, variant: int,
                 ptrs, workspace_bytes: int = 0, stream: int = 0, smem_limit: int = 0):
    """attn_lib_forward on raw device pointers (q, k, v, o, lse, workspace): for the tests, which
    reach the C entry point's own checks with inputs attention() refuses first."""
    _, lib = _stage(stage)
    err = ctypes.create_string_buffer(_ERR_LEN)
    B, H, N, D = shape
    rc = lib.attn_lib_forward(device, smem_limit, B, H, N, D, int(causal), scale, variant, *ptrs,
                              workspace_bytes, stream, err, _ERR_LEN)
    _raise(rc, err, "attn_lib_forward")


def _check_raw(stage: str, device: int, shape, causal: bool, scale: float,
               variant: int, smem_limit: int = 0) -> int:
    """attn_lib_check: the workspace bytes, or the error it raises (tests; no torch needed)."""
    _, lib = _stage(stage)
    err = ctypes.create_string_buffer(_ERR_LEN)
    ws = ctypes.c_size_t(0)
    B, H, N, D = shape
    rc = lib.attn_lib_check(device, smem_limit, B, H, N, D, int(causal), scale, variant,
                            ctypes.byref(ws), err, _ERR_LEN)
    _raise(rc, err, "attn_lib_check")
    return ws.value
