"""The run paths: one pass of a plan on tensors, and what a cached call runs.

A call that passed its checks is kept as a function of (q, k, v) in `calls` (api.attention looks
it up first: the per-call cost is that lookup and the launches; flash_attn_func's runs on its
[B, N, H, D] tensors as they are); a packed batch's (flash_attn_varlen_func) as a function of
(q, k, v, cu_seqlens_q, cu_seqlens_k), the sequences' boundaries passed to the library as
pointers, never read here. Eagerly it runs through the
eager operator, flashcourse_eager::attention (_eager.cpp: the forward pass and, through autograd,
the backward pass as one torch::autograd::Function in C++ over the same plans), where `make lib`
built it for this torch, else through the Python path (_ops.AttentionFunction over ctypes; the
forward pass alone where no gradient is wanted). Under torch.compile the passes are the custom
operators of _ops.py, whose bodies are run_forward and run_backward here. Nothing waits for the
GPU; outputs and workspace come from PyTorch's caching allocator, on the current stream.
"""

import ctypes
import os
from typing import Dict, Optional

from . import _library
from ._library import TAKES_STRIDES, Request, _torch, lib_dir_setting, library_dir, stage_library
from ._plans import (ALIGN, NO_LOCAL, PLANS_MAX, _Plan, _plans, _scale32, backward_geometry,
                     check_aligned, device_of, forward_geometry, plan, variant_index)


def _raw_stream_public(device: int) -> int:
    return _library.torch_mod.cuda.current_stream(device).cuda_stream


# The current CUDA stream of a device as the raw handle the library takes: torch's own accessor
# where it has one (no Stream object made per call), set on the first pass.
_raw_stream = None


def init_stream_accessor():
    global _raw_stream
    if _raw_stream is None:
        get = getattr(_torch()._C, "_cuda_getCurrentRawStream", None)
        _raw_stream = get if get is not None else _raw_stream_public


def _cu(cu) -> tuple:
    """A packed batch's (cu_seqlens_q, cu_seqlens_k) as the pointers a run takes; (None, None):
    not packed."""
    return (None, None) if cu is None else (cu[0].data_ptr(), cu[1].data_ptr())


def forward_with(p: _Plan, q, k, v, cu=None):
    """One forward pass of plan p on q, k, v (checked by whoever made p for their shape, dtype
    and device; aligned): (o, lse), allocated through PyTorch on the current stream. cu: a
    packed plan's (cu_seqlens_q, cu_seqlens_k) tensors."""
    torch = _library.torch_mod
    o = torch.empty_like(q)
    lse = torch.empty(p.lse_shape, dtype=torch.float32, device=p.tdevice)
    ws = p.workspace
    work = torch.empty(ws, dtype=torch.uint8, device=p.tdevice) if ws else None
    rc = p.run(p.addr, q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), lse.data_ptr(),
               *_cu(cu), work.data_ptr() if ws else None, ws, _raw_stream(p.device))
    if rc:
        p.library.check(rc, "attn_lib_forward")
    return o, lse


def backward_with(p: _Plan, q, k, v, o, lse, do, cu=None):
    """One backward pass of plan p: (dq, dk, dv) like q, k, v, on the current stream."""
    torch = _library.torch_mod
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)  # their layouts
    ws = p.workspace
    work = torch.empty(ws, dtype=torch.uint8, device=p.tdevice) if ws else None
    rc = p.run(p.addr, q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), lse.data_ptr(),
               do.data_ptr(), dq.data_ptr(), dk.data_ptr(), dv.data_ptr(), *_cu(cu),
               work.data_ptr() if ws else None, ws, _raw_stream(p.device))
    if rc:
        p.library.check(rc, "attn_lib_backward")
    return dq, dk, dv


def _packed(q, k, packed) -> tuple:
    """(seqs, varlen, cu) of a packed batch (cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
    max_seqlen_k) for plan() and a run; (None, None, None): not packed."""
    if packed is None:
        return None, None, None
    cu_q, cu_k, max_q, max_k = packed
    return ((int(cu_q.shape[0]) - 1, int(max_q), int(max_k)),
            (int(q.shape[0]), int(k.shape[0])), (cu_q, cu_k))


def run_forward(q, k, v, causal: bool, scale: float, stage: str, variant: str,
                smem_limit: int, local: tuple = NO_LOCAL, packed: Optional[tuple] = None):
    """The forward pass on the current stream: (o, lse). The custom operators' body. packed: a
    packed batch's (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)."""
    check_aligned(stage, (("q", q), ("k", k), ("v", v)))
    init_stream_accessor()
    seqs, varlen, cu = _packed(q, k, packed)
    p = plan(stage, False, forward_geometry(q, k, seqs), device_of(q), q.dtype, causal, scale,
             variant, smem_limit, local=local, varlen=varlen)
    return forward_with(p, q, k, v, cu)


def run_backward(q, k, v, o, lse, do, causal: bool, scale: float, stage: str, variant: str,
                 smem_limit: int, local: tuple = NO_LOCAL, packed: Optional[tuple] = None):
    """The backward pass on the current stream: (dq, dk, dv). The custom operators' body."""
    check_aligned(stage, (("q", q), ("k", k), ("v", v), ("o", o), ("lse", lse), ("do", do)))
    init_stream_accessor()
    seqs, varlen, cu = _packed(q, k, packed)
    p = plan(stage, True, backward_geometry(q, k, v, o, do, seqs), device_of(q), q.dtype, causal,
             scale, variant, smem_limit, local=local, varlen=varlen)
    return backward_with(p, q, k, v, o, lse, do, cu)


# ---- the call cache: one dict lookup per call ----

# What a call with these arguments runs, once they have passed every check: a function of
# (q, k, v). Keyed by everything the checks looked at except what can differ between tensors of
# one shape, dtype and device (alignment: checked on every call, ready()).
calls: Dict[tuple, object] = {}


def call_key(q, k, v, *flags) -> tuple:
    """The key of a call on q, k, v in `calls`: the tensors' types, shapes, strides, dtypes and
    devices, the flags as the caller gave them (attention()'s: causal, scale, stage, variant,
    smem_limit, backward_stage, backward_variant, grad, local; a flash-attn drop-in's: its name
    first, api.given_key) and FLASHCOURSE_LIB_DIR."""
    return (type(q), type(k), type(v), q.shape, k.shape, v.shape, q.stride(), k.stride(),
            v.stride(), q.dtype, k.dtype, v.dtype, q.device, k.device, v.device, flags,
            lib_dir_setting())


def ready(q, k, v) -> bool:
    """What the cached checks cannot know: 16-byte aligned tensors (the strides are the key's)."""
    return not (q.data_ptr() | k.data_ptr() | v.data_ptr()) % ALIGN


def remember(key_of, call, scale, cache: Optional[dict] = None) -> None:
    """Keeps `call`, what a call that passed every check runs, in a call cache (cache: calls, the
    default, or kv_calls) under key_of()'s key, so that the next call with these arguments costs
    a dict lookup. Nothing is kept where the scale was given as other than None, an int or a
    float (a 0-d tensor hashes by its identity, not its value) or where the key cannot be made
    or hashed (an unhashable argument): such calls are checked every time. A full cache
    (PLANS_MAX calls) starts over. attention() and the flash-attn drop-ins keep their calls
    through it."""
    if not (scale is None or type(scale) in (int, float)):
        return
    try:
        key = key_of()
        hash(key)
    except TypeError:
        return
    if cache is None:
        cache = calls  # (looked up now: a PythonPath block has its own)
    if len(cache) >= PLANS_MAX:
        cache.clear()
    cache[key] = call


def make_call(fp: _Plan, bp: Optional[_Plan], bnhd: bool = False):
    """The function a cached call runs: the forward plan alone, or both through autograd; by
    the eager operator (C++) where it is loaded, else in Python. A packed plan's (fp.varlen) is
    a function of (q, k, v, cu_seqlens_q, cu_seqlens_k). bnhd: plans of [B, H, N, D] views run
    on the [B, N, H, D] tensors they view (flash_attn_func's): o [B, N, H, D], lse [B, H, N]."""
    op = eager_op()
    if op is not None:
        call = _eager_call(fp, bp, bnhd)
        if fp.varlen is not None:
            op = _eager[2]
            return lambda q, k, v, cu_q, cu_k: op(q, k, v, cu_q, cu_k, call)
        return lambda q, k, v: op(q, k, v, call)
    if bnhd:  # the Python path runs on the views
        return on_bnhd(make_call(fp, bp))
    if bp is None:
        if fp.varlen is not None:
            return lambda q, k, v, cu_q, cu_k: forward_with(fp, q, k, v, (cu_q, cu_k))
        return lambda q, k, v: forward_with(fp, q, k, v)
    from . import _ops  # (imports torch.library: only for calls with gradients)
    apply = _ops.AttentionFunction.apply
    if fp.varlen is not None:
        return lambda q, k, v, cu_q, cu_k: apply(q, k, v, fp, bp, cu_q, cu_k)
    return lambda q, k, v: apply(q, k, v, fp, bp, None, None)


def on_bnhd(run):
    """A call of (q, k, v) [B, H, N, D] -> (o, lse) as one on the [B, N, H, D] tensors they are
    views of: run on their transposes, o transposed back (flash-attn's layout)."""
    def call(q, k, v):
        o, lse = run(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        return o.transpose(1, 2), lse
    return call


# ---- the eager operator: the hot path in C++ (python/flashcourse/_eager.cpp) ----

_EAGER_ABI = 6  # EAGER_ABI in _eager.cpp
_DO_LAYOUTS_MAX = 4  # DO_LAYOUTS_MAX in _eager.cpp
EAGER_LIB = "libflashcourse_eager.so"

_P, _I, _L, _U = ctypes.c_void_p, ctypes.c_int32, ctypes.c_int64, ctypes.c_uint64


class _EagerCall(ctypes.Structure):
    """_eager.cpp's struct eager_call: one cached call, its plans and entry points."""
    _fields_ = ([("abi", _L),
                 ("forward", _P), ("forward_plan", _U), ("forward_workspace", _U),
                 ("forward_error", _P),
                 ("backward", _P), ("backward_plan", _U), ("backward_workspace", _U),
                 ("backward_error", _P),
                 ("plan", _P), ("plan_bytes", _U), ("request", Request),
                 ("backward_takes_strides", _I)] +
                [(n, _I) for n in ("code_pass", "code_usage", "code_unsupported", "code_oom",
                                   "bnhd")] +
                [("backward_stage", _P), ("do_plans", _U), ("do_layouts", _I),
                 ("do_rows", (_L * 3) * _DO_LAYOUTS_MAX),
                 ("do_workspace", _U * _DO_LAYOUTS_MAX)])


def _address(fn) -> int:
    return ctypes.cast(fn, ctypes.c_void_p).value


_stage_names: Dict[str, ctypes.Array] = {}  # the backward stages' names, for _EagerCall (kept)


def _eager_call(fp: _Plan, bp: Optional[_Plan], bnhd: bool = False):
    """The eager operator's description of a call: a CPU byte tensor holding an _EagerCall, the
    forward plan, the backward plan and room for DO_LAYOUTS_MAX more (_eager.cpp's eager_call;
    the plans are copies, so the tensor alone holds what the operator and its autograd node
    read). bnhd: the operator takes the [B, N, H, D] tensors the plans' views are of."""
    torch = _torch()
    c = _EagerCall()
    c.abi, c.bnhd = _EAGER_ABI, int(bnhd)
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
        c.request = bp.request  # (a copy)
        c.backward_takes_strides = int(bool(blib.stage.backward_takes & TAKES_STRIDES))
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


# (the operator or None, where it came from or why not, its packed batches' operator):
# eager_op()
_eager = None


def eager_op():
    """The eager operator flashcourse_eager::attention, loaded at the first call, or None: not
    built (`make lib` builds it where its python3 has torch), built for another torch, not
    loadable, or FLASHCOURSE_EAGER_OP=0 (read once). Its packed batches' twin,
    flashcourse_eager::attention_varlen, comes with it (_eager[2])."""
    global _eager
    if _eager is None:
        _eager = _load_eager()
    return _eager[0]


def _load_eager():
    torch = _torch()
    if os.environ.get("FLASHCOURSE_EAGER_OP", "1") == "0":
        return None, "Python (FLASHCOURSE_EAGER_OP=0)", None
    path = library_dir() / EAGER_LIB
    if not path.is_file():
        return None, (f"Python ({path} not built: `make lib` builds it where the python3 it "
                      f"runs, or its PYTHON, has torch)"), None
    try:
        built = path.with_suffix(".torch").read_text().strip()
    except OSError:
        built = "unknown"
    if built != torch.__version__:
        return None, (f"Python ({path} was built for torch {built}, this is "
                      f"{torch.__version__}: `make lib` again with this torch's python)"), None
    try:
        torch.ops.load_library(str(path))
        op = torch.ops.flashcourse_eager.attention.default
        op_varlen = torch.ops.flashcourse_eager.attention_varlen.default
    except (OSError, RuntimeError, AttributeError) as e:
        return None, f"Python ({path} does not load: {str(e).splitlines()[0]})", None
    return op, f"C++ ({path})", op_varlen


class PythonPath:
    """Eager calls by the Python path (torch.autograd.Function over ctypes) inside the block,
    whatever eager_path() says, with a call cache of this object's own (kept from one block to
    the next); the eager operator and its cache are back afterwards. For the tests that read the
    Python path's plan (o.grad_fn.bp) and bench_calls.py's `Python path` row."""

    def __init__(self):
        self.calls = {}

    def __enter__(self):
        global _eager, calls
        self.saved = _eager, calls
        _eager, calls = (None, "Python (a PythonPath block)", None), self.calls
        return self

    def __exit__(self, *exc):
        global _eager, calls
        _eager, calls = self.saved


def eager_path() -> str:
    """Which code runs an eager call's passes: "C++ (<the eager operator's library>)" or "Python
    (<why not the C++ operator>)". Both give the same results; the C++ operator costs less host
    time per call."""
    eager_op()
    return _eager[1]


# ---- raw entry points, for the tests ----

def forward_raw(p: _Plan, ptrs, workspace_bytes: int = 0, stream: int = 0, cu=(None, None)):
    """attn_lib_forward of plan p (the tests' raw_plan) on raw device pointers (q, k, v, o, lse,
    workspace; cu: cu_seqlens_q, cu_seqlens_k): the tests reach the C entry point's own checks
    with inputs attention() refuses first."""
    p.library.check(p.run(p.addr, *ptrs[:5], *cu, ptrs[5], workspace_bytes, stream),
                    "attn_lib_forward")


def backward_raw(p: _Plan, ptrs, workspace_bytes: int = 0, stream: int = 0, cu=(None, None)):
    """attn_lib_backward of plan p on raw device pointers (q, k, v, o, lse, do, dq, dk, dv,
    workspace; cu as forward_raw's)."""
    p.library.check(p.run(p.addr, *ptrs[:9], *cu, ptrs[9], workspace_bytes, stream),
                    "attn_lib_backward")


# ---- decode over a KV cache: flash_attn_with_kvcache's plans and run path ----

def _rows_of(t) -> tuple:
    """A [B, N, H, D] tensor's batch, head and row strides (elements)."""
    st = t.stride()
    return (st[0], st[2], st[1])


def decode_geometry(q, k_cache, v_cache, k, v, max_pages: Optional[int]):
    """A decode plan's (geometry, cache) (request()): q, k_cache, v_cache by their strides, o
    [B, N_q, H, D] contiguous, N_k the keys a sequence can hold; k and v (None: no new keys) by
    theirs; the cache's sizes (max_pages: the block table's row length, None: contiguous)."""
    B, N_q, H, D = (int(x) for x in q.shape)
    rows = int(k_cache.shape[1])  # keys per page, or per sequence
    geometry = (B, H, N_q, D, int(k_cache.shape[2]), rows * (max_pages or 1),
                _rows_of(q) + _rows_of(k_cache) + _rows_of(v_cache) + (N_q * H * D, D, H * D) +
                (0,) * 12)
    news = (0,) * 6 if k is None else _rows_of(k) + _rows_of(v)
    paged = max_pages is not None
    cache = (int(paged), rows if paged else 0, int(k_cache.shape[0]) if paged else 0,
             max_pages or 0, 0 if k is None else int(k.shape[1]), news)
    return geometry, cache


def decode_plan(stage: str, device: int, dtype, geometry: tuple, cache: tuple, causal: bool,
                scale: float, variant: str) -> "_Plan":
    """The library's checks of a decode call, once per combination: its plan, or ValueError."""
    key = ("decode", stage, geometry, cache, device, dtype, causal, scale, variant,
           lib_dir_setting())
    p = _plans.get(key)
    if p is None:
        library = stage_library(stage)
        vi = variant_index(library.stage, variant)
        p = _Plan(library, False, device, geometry, causal, _scale32(scale), vi, 0,
                  dtype == _torch().bfloat16, cache)
        if len(_plans) >= PLANS_MAX:
            _plans.clear()
        _plans[key] = p
    return p


# What a decode call with these arguments runs once they passed every check: a function of the
# call's tensors (kv_key: everything the checks looked at but alignment, checked on every call).
kv_calls: Dict[tuple, object] = {}


def _meta(t):
    return None if t is None else (type(t), t.shape, t.stride(), t.dtype, t.device)


def kv_key(q, k_cache, v_cache, k, v, cache_seqlens, block_table, *flags):
    """The call cache's key of a decode call: the tensors' metadata (cache_seqlens: an int's type,
    not its value, which the call checks), and flags (scale, causal, ...) as given."""
    seqlens = int if type(cache_seqlens) is int else _meta(cache_seqlens)
    return (_meta(q), _meta(k_cache), _meta(v_cache), _meta(k), _meta(v), seqlens,
            _meta(block_table), flags, lib_dir_setting())


def kv_ready(q, k_cache, v_cache, k, v) -> bool:
    """What the cached checks cannot know: 16-byte aligned tensors."""
    ptrs = q.data_ptr() | k_cache.data_ptr() | v_cache.data_ptr()
    return not (ptrs | (k.data_ptr() | v.data_ptr() if k is not None else 0)) % ALIGN


def decode_with(p: _Plan, q, k_cache, v_cache, seqlens, block_table, k, v):
    """One decode of plan p (checked for these tensors' metadata; aligned): (o [B, N_q, H, D],
    lse [B, H, N_q]), allocated through PyTorch on the current stream; k, v (None: none) written
    into the cache at seqlens by the stage."""
    torch = _library.torch_mod
    B, H, N = p.lse_shape
    o = torch.empty((B, N, H, q.shape[3]), dtype=q.dtype, device=p.tdevice)
    lse = torch.empty(p.lse_shape, dtype=torch.float32, device=p.tdevice)
    ws = p.workspace
    work = torch.empty(ws, dtype=torch.uint8, device=p.tdevice) if ws else None
    rc = p.run(p.addr, q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), seqlens.data_ptr(),
               None if block_table is None else block_table.data_ptr(),
               None if k is None else k.data_ptr(), None if v is None else v.data_ptr(),
               o.data_ptr(), lse.data_ptr(), work.data_ptr() if ws else None, ws,
               _raw_stream(p.device))
    if rc:
        p.library.check(rc, "attn_lib_decode")
    return o, lse


def make_decode_call(who: str, p: _Plan, capacity: int, copy_new: bool):
    """The function a cached decode call runs on (q, k_cache, v_cache, k, v, cache_seqlens,
    block_table): the lengths as a device tensor (an int or None: made on the current stream,
    no copy from the host that waits), q, k, v copied where their strides are not whole 16-byte
    chunks (copy_new: as the plan was made), the table contiguous, then the plan."""
    torch = _library.torch_mod
    B, N_new = p.lse_shape[0], p.request.N_new

    def call(q, k_cache, v_cache, k, v, seqlens, block_table):
        if seqlens is None or type(seqlens) is int:
            n = capacity if seqlens is None else seqlens
            if not 0 <= n <= capacity - N_new:
                raise ValueError(f"{who}: cache_seqlens {n} with {N_new} new keys is past the "
                                 f"cache ({capacity} keys a sequence)")
            seqlens = torch.full((B,), n, dtype=torch.int32, device=p.tdevice)
        elif not seqlens.is_contiguous():
            seqlens = seqlens.contiguous()
        if block_table is not None and not block_table.is_contiguous():
            block_table = block_table.contiguous()
        if copy_new:
            q = q.contiguous()
            k, v = (None, None) if k is None else (k.contiguous(), v.contiguous())
        return decode_with(p, q, k_cache, v_cache, seqlens, block_table, k, v)
    return call
