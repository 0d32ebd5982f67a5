"""Finding and loading the stage libraries (build/lib/lib<stage>.so: python/lib.mk,
common/attn_lib.c), and their C ABI as ctypes declares it (common/attn_lib.h).

Each library exports the stage descriptor `attn_this_stage` and the attn_lib_* entry points.
Nothing here compiles anything, and PyTorch is imported only by the calls that take tensors
(_torch()), so stages() works on a machine without it.
"""

import ctypes
import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

ABI = 9  # ATTN_LIB_ABI in common/attn_lib.h
_DTYPES = {0: "float32", 1: "float16"}  # attn_dtype: ATTN_F32, ATTN_F16
# attention.h's ATTN_TAKES_*: what a stage takes beyond the plain case
TAKES_BF16, TAKES_GQA, TAKES_STRIDES, TAKES_N_K, TAKES_LOCAL, TAKES_SOFTCAP = 1, 2, 4, 8, 16, 32
TAKES_VARLEN = 64  # a packed batch (cu_seqlens: flash_attn_varlen_func)
PASS_FWD, PASS_BWD, PASS_DEC = 0, 1, 2  # attn_lib.h's ATTN_LIB_FORWARD, _BACKWARD, _DECODE
# The stages the package names (the auto rules: _plans.resolve)
HOPPER_STAGE = "stage6_hopper"  # the fastest forward where it runs (sm_90a code on a Hopper GPU)
FORWARD_STAGE = "stage5_tuned"  # the fastest forward on every other GPU
HOPPER_BACKWARD_STAGE = "stage8_hopper_backward"  # the fastest backward where it runs (Hopper)
BACKWARD_STAGE = "stage7_backward"  # the backward elsewhere, and for the calls stage 8 refuses
DECODE_STAGE = "stage9_decode"  # decode over a KV cache (flash_attn_with_kvcache)
# Where a wheel (`make wheel`) keeps the libraries, inside the package
PACKAGED_LIB_DIR = Path(__file__).resolve().parent / "lib"


def _find_repo() -> Tuple[Optional[Path], Optional[Path]]:
    """(the repository, or None; the checkout _install.json names, if any). The repository is
    the one this file sits in (a checkout, or `pip install -e python`), else the one that
    `pip install ./python` recorded in _install.json beside this file (python/setup.py writes
    it), while it still holds the course. A wheel's install (`make wheel`) has neither."""
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
    # entry points; here they only say whether the stage has a backward pass and a decode.
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
        ("decode_workspace_bytes", ctypes.c_void_p),
        ("decode", ctypes.c_void_p),
    ]


_I, _L = ctypes.c_int, ctypes.c_longlong


class Request(ctypes.Structure):
    """attn_lib_request (common/attn_lib.h): one pass to plan. Its one mirror in Python; the
    eager operator's call description embeds it (_run._EagerCall)."""
    _fields_ = ([("pass_", _I), ("device", _I), ("smem_limit", _L)] +
                [(n, _I) for n in ("B", "H", "N", "D", "causal")] +
                [("scale", ctypes.c_float)] +
                [(n, _I) for n in ("variant", "H_kv", "N_k", "bf16")] +
                [("strides", _L * 24)] +
                [(n, _I) for n in ("paged", "page_size", "num_pages", "max_pages", "N_new")] +
                [("new_strides", _L * 6)] +
                [(n, _I) for n in ("local", "window_left", "window_right")] +
                [("softcap", ctypes.c_float)] +
                [(n, _I) for n in ("varlen", "total_q", "total_k")])


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
    decode: bool = False  # the stage has a decode pass over a KV cache (flash_attn_with_kvcache)

    @property
    def torch_dtype(self):
        return getattr(_torch(), self.dtype)

    def torch_dtypes(self, backward: bool = False) -> tuple:
        """The torch dtypes the stage's forward (backward) pass stores: its dtype, and bfloat16
        where it takes bf16."""
        torch = _torch()
        bf16 = (self.backward_takes if backward else self.takes) & TAKES_BF16
        return (self.torch_dtype, torch.bfloat16) if bf16 else (self.torch_dtype,)


LIB_DIR_VAR = "FLASHCOURSE_LIB_DIR"
# os.environ's own mapping, keyed by encoded names: lib_dir_setting() reads it with one dict
# lookup, where os.environ.get encodes the name on every call and, for a variable not set, raises
# and catches a KeyError (about 1 us, on every call through a call cache). os.environ keeps it
# in step with every assignment and deletion made through os.environ.
_ENVIRON = getattr(os.environ, "_data", None)
_LIB_DIR_KEY = os.environ.encodekey(LIB_DIR_VAR) if hasattr(os.environ, "encodekey") else None


def lib_dir_setting():
    """$FLASHCOURSE_LIB_DIR as the caches key it (None where it is not set; bytes or str): the
    libraries, plans and calls a process keeps are those of the folder it named then."""
    if _ENVIRON is not None and _LIB_DIR_KEY is not None:
        return _ENVIRON.get(_LIB_DIR_KEY)
    return os.environ.get(LIB_DIR_VAR)


def library_dir() -> Path:
    """Where the libraries are looked for: $FLASHCOURSE_LIB_DIR; else, from a checkout (or a
    `pip install ./python` that recorded one), its build/lib; else the libraries a wheel
    (`make wheel`) holds inside the package."""
    env = os.environ.get(LIB_DIR_VAR)
    if env:
        return Path(env)
    if REPO is not None:
        return REPO / "build" / "lib"
    if PACKAGED_LIB_DIR.is_dir():
        return PACKAGED_LIB_DIR
    return Path("build") / "lib"


def _make_hint(d: Path) -> str:
    if d == PACKAGED_LIB_DIR:
        return (f"this wheel of flashcourse holds no library for it (looked in {d}): build the "
                "wheel again with `make lib wheel`, or point FLASHCOURSE_LIB_DIR at a build/lib")
    if REPO is None:
        where = ("does not know where the course's repository is" if _RECORDED_REPO is None else
                 f"was installed from {_RECORDED_REPO}, which no longer holds the course")
        return (f"this installed copy of flashcourse {where}: run `make lib` in the checkout and "
                "point FLASHCOURSE_LIB_DIR at its build/lib, run `pip install ./python` there "
                f"again, or install the wheel `make wheel` builds (looked in {d})")
    return (f"run `make lib` in {REPO} (it builds build/lib/lib<stage>.so for every stage), "
            f"or point FLASHCOURSE_LIB_DIR at the folder that holds them (looked in {d})")


_lock = threading.Lock()


class Library:
    """One loaded stage library: its Stage, its entry points (argument types set once), its
    return codes and shape limits by name."""

    def __init__(self, path: Path, lib: ctypes.CDLL, stage: Stage, codes: Dict[str, int],
                 limits: Dict[str, int]):
        self.path, self.lib, self.stage, self.codes, self.limits = path, lib, stage, codes, limits
        self.plan_bytes = lib.attn_lib_plan_bytes()
        self.plan = lib.attn_lib_plan
        self.forward = lib.attn_lib_forward
        self.backward = lib.attn_lib_backward
        self.decode = lib.attn_lib_decode
        self.last_error = lib.attn_lib_last_error

    def check(self, rc: int, call: str):
        """Nothing if rc is the library's pass code, else the error its last_error names."""
        if rc != self.codes["pass"]:
            _raise(rc, self.last_error().decode(errors="replace") or f"{call} returned {rc}",
                   self.codes)


_loaded: Dict[str, Library] = {}  # by the library's resolved path


def _parse_names(text: str, need: Tuple[str, ...]) -> Dict[str, int]:
    """"a=<n>,b=<n>,..." as {"a": <n>, "b": <n>, ...}; ValueError if a name in need is absent."""
    found = {}
    for item in text.split(","):
        name, _, value = item.partition("=")
        found[name.strip()] = int(value)
    for n in need:
        if n not in found:
            raise ValueError(f"no '{n}' in {text!r}")
    return found


def _declare(lib: ctypes.CDLL):
    """The entry points' C signatures (common/attn_lib.h)."""
    P, I, Z = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
    sigs = {
        "attn_lib_plan": (I, [ctypes.POINTER(Request), P, Z, ctypes.POINTER(Z)]),
        # plan, Q, K, V, O, lse, cu_seqlens_q, cu_seqlens_k, workspace, workspace_bytes, stream
        "attn_lib_forward": (I, [P] * 9 + [Z, P]),
        # plan, Q, K, V, O, lse, dO, dQ, dK, dV, cu_seqlens_q, cu_seqlens_k, workspace,
        # workspace_bytes, stream
        "attn_lib_backward": (I, [P] * 13 + [Z, P]),
        # plan, Q, K_cache, V_cache, seqlens, block_table, K_new, V_new, O, lse, workspace,
        # workspace_bytes, stream
        "attn_lib_decode": (I, [P] * 11 + [Z, P]),
        "attn_lib_plan_bytes": (Z, []),
        "attn_lib_last_error": (ctypes.c_char_p, []),
        "attn_lib_exit_codes": (ctypes.c_char_p, []),
        "attn_lib_limits": (ctypes.c_char_p, []),
    }
    for name, (res, args) in sigs.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args


def _load(path: Path) -> Library:
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
        codes = _parse_names(lib.attn_lib_exit_codes().decode(),
                             ("pass", "wrong", "usage", "unsupported", "oom"))
        limits = _parse_names(lib.attn_lib_limits().decode(), ("max_bh", "max_n"))
        st = Stage(
            name=desc.name.decode(),
            dtype=_DTYPES.get(desc.dtype, f"unknown({desc.dtype})"),
            variants=tuple(desc.variants.decode().split(",")),
            adds=desc.adds.decode(),
            path=key,
            backward=bool(desc.backward and desc.backward_workspace_bytes),
            takes=int(desc.takes),
            backward_takes=int(desc.backward_takes),
            decode=bool(desc.decode and desc.decode_workspace_bytes),
        )
        _loaded[key] = Library(path, lib, st, codes, limits)
        return _loaded[key]


def stages() -> List[Stage]:
    """The stages built (one Stage per lib<stage>.so in library_dir()), by name."""
    d = library_dir()
    paths = sorted(d.glob("libstage*.so")) if d.is_dir() else []
    if not paths:
        raise LibraryNotBuiltError(f"no stage libraries found: {_make_hint(d)}")
    return [_load(p).stage for p in paths]


def exit_codes(stage: str = FORWARD_STAGE) -> Dict[str, int]:
    """The return codes of the stage's library, which are the programs' exit codes (their one
    home is the attn_exit enum of common/attention.h), by name: pass, wrong, usage, unsupported,
    oom."""
    return dict(stage_library(stage).codes)


def source_stages() -> List[str]:
    """The stages of the checkout's sources (none outside a checkout)."""
    return sorted(p.parent.name for p in REPO.glob("stage[0-9]*/attention.cu")) if REPO else []


# (name, $FLASHCOURSE_LIB_DIR) -> the library: the folder is searched once per stage name
_by_name: Dict[Tuple[str, object], Library] = {}


def stage_library(name, who: Optional[str] = None) -> Library:
    """The loaded library of the stage `name`, or LibraryNotBuiltError / ValueError / TypeError
    (named by `who`, the call the user made, where given)."""
    if not isinstance(name, str):
        raise TypeError(f"{who + ': ' if who else ''}stage must be a stage name such as "
                        f"'{FORWARD_STAGE}', not {type(name).__name__}")
    key = (name, lib_dir_setting())
    found = _by_name.get(key)
    if found is not None:
        return found
    d = library_dir()
    path = d / f"lib{name}.so"
    if not path.is_file():
        built = sorted(p.name[3:-3] for p in d.glob("libstage*.so")) if d.is_dir() else []
        if name not in built and name not in source_stages():
            known = ", ".join(sorted(set(built) | set(source_stages())))
            if not known:
                raise LibraryNotBuiltError(f"unknown stage '{name}', and no stage libraries "
                                           f"found: {_make_hint(d)}")
            raise ValueError(f"{who + ': ' if who else ''}unknown stage '{name}' "
                             f"(stages: {known})")
        raise LibraryNotBuiltError(f"{path} not found: {_make_hint(d)}")
    loaded = _load(path)
    if loaded.stage.name != name:
        raise RuntimeError(f"{path} holds the stage '{loaded.stage.name}', not '{name}'")
    _by_name[key] = loaded
    return loaded


torch_mod = None  # PyTorch once _torch() imported it


def _torch():
    global torch_mod
    if torch_mod is None:
        try:
            import torch
        except ImportError as e:
            raise ImportError("flashcourse.attention takes PyTorch tensors: install torch "
                              f"(stages() works without it) [{e}]") from None
        torch_mod = torch
    return torch_mod


def _raise(rc: int, msg: str, codes: Dict[str, int]):
    if rc == codes["unsupported"] and "no NVIDIA GPU here" in msg:
        raise RuntimeError(msg)  # the machine, not the arguments
    if rc in (codes["usage"], codes["unsupported"]):
        raise ValueError(msg)
    if rc == codes["oom"]:
        oom = getattr(getattr(torch_mod, "cuda", None), "OutOfMemoryError", RuntimeError)
        raise oom(msg)
    raise RuntimeError(msg)
