"""Checks, plans and the auto rules: what a call is checked against once per shape.

A plan (_Plan) is one checked pass of one stage for one shape on one device: attn_lib_plan's
bytes for one attn_lib_request, the workspace the pass needs and what a run allocates, made once
per combination and kept (_plan). `resolve` is the one function that turns stage "auto" into a
stage's name, forward and backward: every other place calls it. The checks here look at tensor
metadata only (shapes, strides, dtypes, devices), so torch.compile traces them; data pointers
(alignment) are checked where a pass runs.
"""

import ctypes
import math
import struct
from typing import Dict, Optional

from ._library import (BACKWARD_STAGE, FORWARD_STAGE, HOPPER_BACKWARD_STAGE, HOPPER_STAGE,
                       PASS_BWD, PASS_DEC, PASS_FWD, TAKES_BF16, TAKES_GQA, TAKES_LOCAL,
                       TAKES_N_K, TAKES_SOFTCAP, TAKES_STRIDES, TAKES_VARLEN, Library,
                       LibraryNotBuiltError, Request, _torch, lib_dir_setting, stage_library,
                       stages)

_INT_MAX = 2**31 - 1
_FLT_MIN = 2.0**-126  # the smallest normal float32
ALIGN = 16  # the widest vector load any stage makes (16 bytes)
PLANS_MAX = 4096  # a long-running process with ever new shapes starts a cache over past this


def scale_checked(scale, D: int, who: str) -> float:
    """The scale as a Python float (default 1/sqrt(D)), or TypeError / ValueError. Plain Python
    on numbers: torch.compile traces it."""
    if scale is None:
        return 1.0 / math.sqrt(D) if D else 1.0
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        try:
            scale = float(scale)  # numpy scalars, 0-d tensors
        except (TypeError, ValueError, RuntimeError):
            raise TypeError(f"{who}: scale must be a number, not {type(scale).__name__}") from None
    scale = float(scale)
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"{who}: scale must be a positive finite number, got {scale}")
    return scale


def _scale32(scale: float) -> float:
    # The stage takes a float: the value it computes with.
    s32 = struct.unpack("f", struct.pack("f", scale))[0]
    if s32 < _FLT_MIN:
        raise ValueError(f"scale {scale} is not a normal float32 (it rounds to {s32})")
    return s32


def smem_limit_checked(smem_limit, who: str) -> int:
    if smem_limit is None:
        return 0
    if isinstance(smem_limit, bool) or not isinstance(smem_limit, int):
        raise TypeError(f"{who}: smem_limit must be a number of bytes, not "
                        f"{type(smem_limit).__name__}")
    if not 16384 <= smem_limit <= 2**30:
        raise ValueError(f"{who}: smem_limit must be in [16384, 2^30] bytes (65536: a T4's), "
                         f"got {smem_limit}")
    return smem_limit


def causal_checked(causal, who: str) -> bool:
    if not (isinstance(causal, bool) or (isinstance(causal, int) and causal in (0, 1))):
        raise TypeError(f"{who}: causal must be True or False, not {causal!r}")
    return bool(causal)


NO_LOCAL = (-1, -1, 0.0)  # a call's (window_left, window_right, softcap): neither


def local_checked(window_size, softcap, who: str) -> tuple:
    """flash-attn's window_size (ints left, right; -1: unbounded) and softcap (>= 0; 0: none) as
    (window_left, window_right, softcap), or TypeError / ValueError naming `who`."""
    pair = tuple(window_size) if isinstance(window_size, (tuple, list)) else ()
    if len(pair) != 2 or any(isinstance(x, bool) or not isinstance(x, int) for x in pair):
        raise TypeError(f"{who}: window_size must be a pair (left, right) of ints, not "
                        f"{window_size!r}")
    if not all(-1 <= x <= _INT_MAX for x in pair):
        raise ValueError(f"{who}: window_size {pair!r}: each side is -1 (unbounded) or 0 to "
                         f"{_INT_MAX} keys")
    if isinstance(softcap, bool) or not isinstance(softcap, (int, float)):
        raise TypeError(f"{who}: softcap must be a number, not {type(softcap).__name__}")
    if not 0.0 <= softcap <= 3.4028234663852886e38:  # a float32
        raise ValueError(f"{who}: softcap must be a finite number >= 0 (0: none), not "
                         f"{softcap!r}")
    return (int(pair[0]), int(pair[1]), float(softcap))


def check_tensors(who: str, named, dtype=None):
    """Type, device, dtype and shape of q, k, v (and o, do): tensor metadata only, so
    torch.compile traces it. named: [(name, tensor)] starting with q, k, v: q [B, H, N, D], k and
    v [B, H_kv, N_k, D] (H_kv dividing H: grouped-query heads), any others q's shape; any strides
    with the last dimension contiguous (whether the stage takes strided, grouped or N_k != N
    inputs, its library says). Zero sizes pass here (the caller returns empty outputs)."""
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
    if k.shape[1] == 0 and H or k.shape[1] and H % k.shape[1]:
        raise ValueError(f"{who}: k and v's heads ({k.shape[1]}) must divide q's ({H}): each "
                         f"key/value head serves H / H_kv query heads")
    for n, t in named[3:]:
        if t.shape != q.shape:
            raise ValueError(f"{who} takes {n} of q's shape {tuple(q.shape)}; it is "
                             f"{tuple(t.shape)}")
    for n, t in named:
        if t.stride(3) != 1 and t.numel():
            raise ValueError(f"{who} takes tensors whose last dimension is contiguous; {n} is not "
                             f"(strides {tuple(t.stride())}): pass {n}.contiguous()")
    if any(x > _INT_MAX for x in tuple(q.shape) + tuple(k.shape)):
        raise ValueError(f"{who}: every dimension must fit in an int; got q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)}")


def check_aligned(who: str, named):
    # data_ptr() is not known while torch.compile traces: the library checks it in the operator
    for n, t in named:
        if t.data_ptr() % ALIGN:
            raise ValueError(f"{who} takes tensors whose data is {ALIGN}-byte aligned; "
                             f"{n} starts at an offset into its storage: pass {n}.clone()")


def rows(t) -> tuple:
    """A [B, H, N, D] tensor's batch, head and row strides (elements); a packed [total, H, D]
    one's (0, head, row): the batch stride unused (attention.h's attn_varlen)."""
    st = t.stride()
    return (st[0], st[1], st[2]) if len(st) == 4 else (0, st[1], st[0])


_like: Dict[tuple, tuple] = {}


def _like_rows(t) -> tuple:
    """The batch, head and row strides of torch.empty_like(t): the layout of an output allocated
    like its input (o and dq like q, dk like k, dv like v)."""
    key = (tuple(t.shape), t.stride())
    found = _like.get(key)
    if found is None:
        found = rows(_torch().empty_like(t, device="meta"))
        if len(_like) >= PLANS_MAX:
            _like.clear()
        _like[key] = found
    return found


def _dims(q, k, seqs: Optional[tuple]) -> tuple:
    """(B, H, N, D, H_kv, N_k) of q [B, H, N, D] and k [B, H_kv, N_k, D]; or of a packed batch
    (seqs: (B, max_seqlen_q, max_seqlen_k)) of q [total_q, H, D] and k [total_k, H_kv, D]."""
    if seqs is None:
        B, H, N, D = (int(x) for x in q.shape)
        return B, H, N, D, int(k.shape[1]), int(k.shape[2])
    return seqs[0], int(q.shape[1]), seqs[1], int(q.shape[2]), int(k.shape[1]), seqs[2]


def forward_geometry(q, k, seqs: Optional[tuple] = None) -> tuple:
    """What a forward plan's shape is: (B, H, N, D, H_kv, N_k, 24 strides: q, k, v (k's), o, and
    zeros for the backward's tensors); seqs: a packed batch's (B, max_seqlen_q, max_seqlen_k)."""
    kr = rows(k)
    return _dims(q, k, seqs) + (rows(q) + kr + kr + _like_rows(q) + (0,) * 12,)


def backward_geometry(q, k, v, o=None, do=None, seqs: Optional[tuple] = None) -> tuple:
    """A backward plan's: q, k, v, o and do as given (o and do None: laid out like an output of
    q, as attention() allocates o), dq, dk, dv allocated like q, k, v; seqs as
    forward_geometry's."""
    o_rows = rows(o) if o is not None else _like_rows(q)
    do_rows = rows(do) if do is not None else o_rows
    return _dims(q, k, seqs) + (rows(q) + rows(k) + rows(v) + o_rows + do_rows + _like_rows(q) +
                                _like_rows(k) + _like_rows(v),)


def grad_input(backward_stage: str, o, do):
    """The upstream gradient do as the backward pass takes it: 16-byte aligned with a contiguous
    last dimension, in its own layout where the stage takes strides (no copy), else in o's."""
    if do.stride(-1) != 1 or do.data_ptr() % ALIGN:
        do = do.clone(memory_format=_torch().contiguous_format)
    if stage_library(backward_stage).stage.backward_takes & TAKES_STRIDES or \
            do.stride() == o.stride():
        return do
    return _torch().empty_like(o).copy_(do)


def grad_plan(bp: "_Plan", o, do):
    """The backward plan bp (made for do laid out as o) and do, for the gradient as it came:
    (plan, do)."""
    do = grad_input(bp.stage, o, do)
    return (bp.with_do(do) if bp.geometry[6] else bp), do


def variant_index(st, variant, what: str = "variant") -> int:
    if not isinstance(variant, str) or variant not in st.variants:
        raise ValueError(f"{st.name} has no {what} {variant!r} (variants: "
                         f"{', '.join(st.variants)})")
    return st.variants.index(variant)


def request(backward: bool, device: int, geometry: tuple, causal: bool, s32: float, vi: int,
            smem_limit: int, bf16: bool, cache: Optional[tuple] = None,
            local: tuple = NO_LOCAL, varlen: Optional[tuple] = None) -> Request:
    """The attn_lib_request of a pass (geometry: (B, H, N, D, H_kv, N_k, 24 strides or None));
    cache: a decode's (paged, page_size, num_pages, max_pages, N_new, 6 strides of k_new and
    v_new): decode_geometry's; local: (window_left, window_right, softcap) or NO_LOCAL; varlen:
    a packed batch's (total_q, total_k), its sequences' boundaries the run's (cu_seqlens)."""
    B, H, N, D, H_kv, N_k, strides = geometry
    pass_ = PASS_DEC if cache is not None else PASS_BWD if backward else PASS_FWD
    r = Request(pass_, device, smem_limit, B, H, N, D, int(causal), s32, vi, H_kv, N_k, int(bf16))
    r.window_left, r.window_right, r.softcap = local
    r.local = int(local[:2] != (-1, -1))
    if strides:
        r.strides[:] = strides
    if varlen is not None:
        r.varlen, r.total_q, r.total_k = 1, varlen[0], varlen[1]
    if cache is not None:
        r.paged, r.page_size, r.num_pages, r.max_pages, r.N_new = cache[:5]
        r.new_strides[:] = cache[5]
    return r


# ---- plans: the library's checks, once per shape ----

class _Plan:
    """One checked pass of one stage for one shape on one device: attn_lib_plan's bytes (the
    library keeps nothing; the plan lives as long as this object), the request it was made
    for, the workspace it needs, and what a run allocates. geometry: (B, H, N, D, H_kv, N_k, 24
    strides or None)."""

    __slots__ = ("library", "buf", "addr", "workspace", "device", "tdevice", "lse_shape",
                 "run", "stage", "geometry", "request", "by_do", "varlen")

    def __init__(self, library: Library, backward: bool, device: int, geometry: tuple,
                 causal: bool, s32: float, vi: int, smem_limit: int, bf16: bool = False,
                 cache: Optional[tuple] = None, local: tuple = NO_LOCAL,
                 varlen: Optional[tuple] = None):
        self.library, self.stage, self.geometry = library, library.stage.name, geometry
        self.request = request(backward, device, geometry, causal, s32, vi, smem_limit, bf16,
                               cache, local, varlen)
        self.varlen = varlen
        self.by_do = {}  # backward: the plans for other layouts of do (with_do)
        self.buf = ctypes.create_string_buffer(library.plan_bytes)
        self.addr = ctypes.addressof(self.buf)
        ws = ctypes.c_size_t(0)
        rc = library.plan(ctypes.byref(self.request), self.addr, library.plan_bytes,
                          ctypes.byref(ws))
        library.check(rc, "attn_lib_plan")
        self.workspace, self.device = ws.value, device
        self.tdevice = _torch().device("cuda", device)
        # lse [B, H, N]; a packed batch's [H, total_q]
        self.lse_shape = tuple(geometry[:3]) if varlen is None else (geometry[1], varlen[0])
        self.run = (library.decode if cache is not None else library.backward if backward else
                    library.forward)

    def with_do(self, do) -> "_Plan":
        """This backward plan for an upstream gradient do laid out as it is (a stage whose
        backward pass takes strides: no copy), kept per layout."""
        do_rows = rows(do)
        strides = self.geometry[6]
        if strides[12:15] == do_rows:
            return self
        p = self.by_do.get(do_rows)
        if p is None:
            g = self.geometry[:6] + (strides[:12] + do_rows + strides[15:],)
            r = self.request
            p = _Plan(self.library, True, r.device, g, bool(r.causal), r.scale, r.variant,
                      r.smem_limit, bool(r.bf16),
                      local=(r.window_left, r.window_right, r.softcap), varlen=self.varlen)
            self.by_do[do_rows] = p
        return p


_plans: Dict[tuple, _Plan] = {}


def plan(stage: str, backward: bool, shape, device: Optional[int], dtype, causal: bool,
         scale: float, variant: str, smem_limit: int, who: Optional[str] = None,
         local: tuple = NO_LOCAL, varlen: Optional[tuple] = None) -> _Plan:
    """Every check the library makes before a pass, without running it, once per combination:
    the plan, or TypeError / ValueError (named by `who`, the call the user made, where given).
    shape: [B, H, N, D] (contiguous tensors, as many keys and key/value heads as queries) or a
    geometry (forward_geometry, backward_geometry); dtype: the tensors' torch dtype. stage
    "auto": resolve's for what the call asks. local: (window_left, window_right, softcap);
    varlen: a packed batch's (total_q, total_k) (its geometry's B, N, N_k: the sequences, the
    longest's lengths)."""
    torch = _torch()
    if device is None:
        device = torch.cuda.current_device()
    geometry = tuple(shape)
    if len(geometry) == 4:
        B, H, N, D = (int(x) for x in geometry)
        geometry = (B, H, N, D, H, N, None)
    if stage == "auto":
        B, H, N, D, H_kv, N_k, _ = geometry
        stage = resolve(stage, backward, device, asks_of(dtype, H, H_kv, N, N_k, local) |
                        (TAKES_VARLEN if varlen else 0), variant, smem_limit, D)
    key = (stage, backward, geometry, device, dtype, causal, scale, variant, smem_limit, local,
           varlen, lib_dir_setting())
    p = _plans.get(key)
    if p is not None:
        return p
    library = stage_library(stage, who)
    st = library.stage
    if backward and not st.backward:
        raise ValueError(f"{st.name} has no backward pass (stages with one: "
                         f"{', '.join(s.name for s in stages() if s.backward) or 'none built'})")
    takes = st.torch_dtypes(backward)
    if dtype not in takes:
        names = " or ".join(str(t) for t in takes)
        what = f"the backward pass ({st.name})" if backward else st.name
        lead = f"{who}: {what}" if who and who != st.name else what
        raise TypeError(f"{lead} takes {names} tensors (its storage type); these are {dtype}")
    vi = variant_index(st, variant, "backward variant" if backward and who else "variant")
    p = _Plan(library, backward, device, geometry, causal, _scale32(scale), vi, smem_limit,
              dtype == torch.bfloat16, local=local, varlen=varlen)
    if len(_plans) >= PLANS_MAX:
        _plans.clear()
    _plans[key] = p
    return p


# ---- "auto": the one place it is resolved ----

def asks_of(dtype, H: int, H_kv: int, N: int, N_k: int, local: tuple = NO_LOCAL) -> int:
    """What a call asks of a stage beyond the plain case, strides aside (TAKES_* bits); any
    window_size but (-1, -1) asks for a local window (even one the library writes as causal)."""
    asks = TAKES_BF16 if dtype == _torch().bfloat16 else 0
    asks |= TAKES_GQA if H_kv != H else 0
    asks |= TAKES_LOCAL if local[:2] != (-1, -1) else 0
    asks |= TAKES_SOFTCAP if local[2] > 0 else 0
    return asks | (TAKES_N_K if N_k != N else 0)


def asks(q, k, local: tuple = NO_LOCAL, seqs: Optional[tuple] = None) -> int:
    """asks_of for q and k: [B, H, N, D], or packed (seqs: forward_geometry's) [total, H, D]."""
    _, H, N, _, H_kv, N_k = _dims(q, k, seqs)
    return asks_of(q.dtype, H, H_kv, N, N_k, local) | (TAKES_VARLEN if seqs else 0)


_probed: Dict[tuple, object] = {}


def _probe(backward: bool, device: int, smem_limit: int) -> str:
    """The Hopper stage (6; backward: 8) where built and planning here at D 64 and 128, else 5/7"""
    key = (backward, device, smem_limit)
    found = _probed.get(key)
    if found is None:
        hopper, found = ((HOPPER_BACKWARD_STAGE, BACKWARD_STAGE) if backward else
                         (HOPPER_STAGE, FORWARD_STAGE))
        if all(_runs(hopper, backward, device, smem_limit, D) for D in (64, 128)):
            found = hopper
        _probed[key] = found
    return found


def _runs(stage: str, backward: bool, device: int, smem_limit: int, D: int,
          variant: str = "default") -> bool:
    """Whether the stage is built and plans head dim D on this device within smem_limit, in the
    backward's variant (a D it did not compile, or one the variant does not run, its
    unsupported() refuses: stage 8's deterministic variant from D = 136 on): asked once per
    stage, device, limit, D and variant."""
    key = (stage, backward, device, smem_limit, D, variant)
    if key not in _probed:
        try:
            plan(stage, backward, (1, 1, 128, D), device, _torch().float16, False, 0.125,
                 variant, smem_limit)
            _probed[key] = True
        except (LibraryNotBuiltError, ValueError, RuntimeError):
            _probed[key] = False
    return _probed[key]


def resolve(stage: str, backward: bool, device: int, asks: int = 0, variant: str = "default",
            smem_limit: int = 0, D: int = 0) -> str:
    """A stage name as given, or what "auto" is for a call on `device` asking `asks` (TAKES_*
    bits) at head dim D (0: any): stage 6 (the Hopper forward; backward: stage 8) where it is
    built, plans here within smem_limit and takes what is asked (and the backward variant), else
    stage 5 (7); for a D the first does not run (not compiled, or not in the backward variant),
    the other where it runs D. Probed once."""
    if stage != "auto":
        return stage
    hopper, other = ((HOPPER_BACKWARD_STAGE, BACKWARD_STAGE) if backward else
                     (HOPPER_STAGE, FORWARD_STAGE))
    found = _probe(backward, device, smem_limit)
    if found == hopper and not _takes(hopper, backward, asks, variant):
        found = other
    probed = variant if backward else "default"  # (a forward's variant is not _takes' either)
    if not D or D in (64, 128) or _runs(found, backward, device, smem_limit, D, probed):
        return found
    alt = other if found == hopper else hopper
    if _takes(alt, backward, asks, variant) and _runs(alt, backward, device, smem_limit, D,
                                                       probed):
        return alt
    return found  # (its plan says why not)


def _takes(stage: str, backward: bool, asks: int, variant: str) -> bool:
    """Whether the stage's pass takes what a call asks (TAKES_* bits) and the backward variant."""
    try:
        st = stage_library(stage).stage
    except (LibraryNotBuiltError, ValueError, RuntimeError):
        return False
    takes = st.backward_takes if backward else st.takes
    return takes & asks == asks and not (backward and variant not in st.variants)


def takes_strides(stage: str, backward_stage: Optional[str]) -> bool:
    """Whether the stage's forward (and the backward stage's backward, if given; both resolved)
    take strided tensors."""
    if not stage_library(stage).stage.takes & TAKES_STRIDES:
        return False
    return backward_stage is None or bool(stage_library(backward_stage).stage.backward_takes &
                                          TAKES_STRIDES)


def device_of(t) -> int:
    index = t.device.index
    return index if index is not None else _torch().cuda.current_device()


def device_index(device) -> int:
    """A CUDA device (None: the current one; an index, "cuda:1", a torch.device) as its index."""
    torch = _torch()
    if isinstance(device, int) and not isinstance(device, bool):
        return device
    index = None if device is None else torch.device(device).index
    return torch.cuda.current_device() if index is None else index

