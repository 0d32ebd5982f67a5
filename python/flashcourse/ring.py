"""ring_attention: attention over a sequence split along its tokens across the ranks of a
torch.distributed process group (context parallelism), forward and backward.

    torchrun --nproc_per_node=2 train.py          # one process per GPU, NCCL
    # in train.py, on each rank:
    torch.cuda.set_device(local_rank); torch.distributed.init_process_group("nccl")
    q, k, v = (flashcourse.zigzag_split(t, P, rank, dim=2) for t in (q_all, k_all, v_all))
    o, lse = flashcourse.ring_attention(q, k, v, causal=True)   # this rank's rows of o
    o.sum().backward()                                          # dq, dk, dv of this rank's slice

The sequence of N tokens lies in 2P chunks (layout "zigzag": rank r holds chunks r and 2P-1-r,
which balances causal work) or P blocks ("contiguous": the naive ring); ring_sizes() is the one
home of that rule. At step t = 0 .. P-1, rank r holds the K/V slice of rank s = (r - t) mod P:
one flashcourse.attention call of the rows and keys ring_block() names (on views, no copies)
gives a partial (o, lse), merged into fp32 accumulators by merge() (the log-sum-exp merge of
split-KV attention); meanwhile the next K/V slice travels from rank r - 1 (ring.exchange(), the
one exchange both passes use). The backward runs the same steps with
flashcourse.attention_backward on the final o and lse: dq adds up where it is, and an fp32 dK/dV
accumulator travels with the K/V it belongs to, P exchanges, the last returning it to its owner.

ring_sizes, ring_block, merge, ring_forward and ring_backward (in _ring.py, beside this module)
are plain functions of tensors, with the attention calls and the exchange given to them: tests
run the same schedule on the CPU in float64, P ranks simulated in one process
(python/tests/test_ring.py). This module adds what needs a process group: the exchange over
torch.distributed, the first call's check of the ranks' slices, and the autograd Function.
"""

from typing import TYPE_CHECKING, Optional, Tuple

from ._library import _torch
from ._plans import PLANS_MAX, causal_checked, check_tensors, scale_checked
from ._ring import (DTYPES, LAYOUTS, RING, Ring, _layout_checked, _slice_lengths, ring_backward,
                    ring_forward, ring_sizes)
from ._ring import merge, ring_block, ring_source, zigzag_gather, zigzag_split  # noqa: F401
from .api import _OWN_ERRORS, attention, attention_backward, named_by

if TYPE_CHECKING:
    from torch import Tensor


# ---- over torch.distributed ----

def _dist():
    """torch.distributed, or ImportError where this PyTorch has none."""
    torch = _torch()
    if not torch.distributed.is_available():
        raise ImportError(f"{RING} needs torch.distributed, which this PyTorch "
                          f"({torch.__version__}) was built without")
    return torch.distributed


class _Exchange:
    """The ring's one exchange over a process group: send to the next rank and receive from the
    previous one in one batch_isend_irecv (an empty tensor is neither sent nor received: both
    sides know it is empty). NCCL runs it on its own stream after the work queued so far on the
    current one; wait() makes the current stream wait for it (the host does not wait)."""

    def __init__(self, group, P: int, rank: int):
        dist = _dist()
        self.group = group
        self.next = dist.get_global_rank(group, (rank + 1) % P)  # P2POp takes global ranks
        self.prev = dist.get_global_rank(group, (rank - 1) % P)

    def __call__(self, send, recv):
        dist = _dist()
        ops = []
        if send.numel():
            ops.append(dist.P2POp(dist.isend, send, self.next, self.group))
        if recv.numel():
            ops.append(dist.P2POp(dist.irecv, recv, self.prev, self.group))
        return _Works(dist.batch_isend_irecv(ops) if ops else [])


class _Works:
    def __init__(self, works):
        self.works = works

    def wait(self):
        for w in self.works:
            w.wait()


def ring_group(group):
    """(group, P, rank) of the process group given (None: the default group; where
    torch.distributed has no default group, (None, 1, 0): the ring of one), or TypeError /
    ValueError."""
    torch = _torch()
    dist = torch.distributed if torch.distributed.is_available() else None
    if group is None:
        if dist is None or not dist.is_initialized():
            return None, 1, 0
        group = dist.group.WORLD
    elif dist is None or not isinstance(group, dist.ProcessGroup):
        raise TypeError(f"{RING}: group must be a torch.distributed process group (or None: the "
                        f"default group), not {type(group).__name__}")
    rank = dist.get_rank(group)
    if rank < 0:
        raise ValueError(f"{RING}: this process (global rank {dist.get_rank()}) is not in the "
                         "group given")
    return group, dist.get_world_size(group), rank


# What every rank's call must agree on besides its slice's length, in the order gathered
_AGREED = ("B", "H", "H_kv", "D", "dtype", "layout", "causal")
_DTYPE_CODES = {"torch.float16": 1, "torch.bfloat16": 2, "torch.float32": 3, "torch.float64": 4}
_checked_sizes = {}  # call key -> ring_sizes of the whole sequence, once every rank agreed


def checked_sizes(q, k, group, P: int, rank: int, layout: str, causal: bool):
    """ring_sizes(N, P, layout) of the sequence the ranks' slices make, after one all_gather of
    every rank's shapes, dtype, layout, causal flag and slice length (at the first call of a
    shape on this rank; kept): ValueError, on every rank alike, where they differ but in the
    length or the lengths are not the layout's split of their sum N."""
    torch = _torch()
    dist = _dist()
    key = (group, P, rank, tuple(q.shape), tuple(k.shape), q.dtype, q.device, layout, causal)
    found = _checked_sizes.get(key)
    if found is not None:
        return found
    B, H, n, D = (int(x) for x in q.shape)
    mine = [B, H, int(k.shape[1]), D, _DTYPE_CODES.get(str(q.dtype), 0), LAYOUTS.index(layout),
            int(causal), n]
    sent = torch.tensor(mine, dtype=torch.int64, device=q.device)
    every = [torch.empty_like(sent) for _ in range(P)]
    dist.all_gather(every, sent, group=group)
    every = [e.tolist() for e in every]  # (the host waits here: the first call of a shape only)
    for other, got in enumerate(every):
        if got[:-1] != mine[:-1]:
            said = ", ".join(f"{name} {a} vs {b}" for name, a, b in zip(_AGREED, got, mine)
                             if a != b)
            raise ValueError(f"{RING}: every rank's call must agree on all but its slice's "
                             f"length; rank {other}'s differs from rank {rank}'s: {said} "
                             f"(dtype {', '.join(f'{c}: {t}' for t, c in _DTYPE_CODES.items())};"
                             f" layout {', '.join(f'{i}: {x}' for i, x in enumerate(LAYOUTS))})")
    lengths = [got[-1] for got in every]
    sizes = ring_sizes(sum(lengths), P, layout)
    if lengths != _slice_lengths(sizes):
        raise ValueError(f"{RING}: the ranks' slices have lengths {lengths} (rank order), not "
                         f"the {layout} split of their {sum(lengths)} tokens over {P} ranks "
                         f"({_slice_lengths(sizes)}: ring_sizes); take each rank's with "
                         f"zigzag_split(x, P, rank, dim=2, layout={layout!r})")
    if len(_checked_sizes) >= PLANS_MAX:
        _checked_sizes.clear()
    _checked_sizes[key] = sizes
    return sizes


_function = None  # the autograd.Function, made at first use (PyTorch is imported then)


def ring_function():
    """The autograd.Function of ring_forward and ring_backward: apply(q, k, v, ring) ->
    (o, lse), lse not differentiable."""
    global _function
    if _function is None:
        torch = _torch()

        class RingAttention(torch.autograd.Function):
            @staticmethod
            def forward(ctx, q, k, v, ring):
                o, lse = ring_forward(q, k, v, ring)
                ctx.save_for_backward(q, k, v, o, lse)
                ctx.ring = ring
                ctx.mark_non_differentiable(lse)
                return o, lse

            @staticmethod
            def backward(ctx, do, _dlse):
                q, k, v, o, lse = ctx.saved_tensors
                return (*ring_backward(q, k, v, o, lse, do, ctx.ring), None)

        _function = RingAttention
    return _function


def ring_attention(q, k, v, *, causal: bool = False, scale: Optional[float] = None, group=None,
                   layout: str = "zigzag", stage: str = "auto",
                   backward_stage: str = "auto") -> Tuple["Tensor", "Tensor"]:
    """Attention over a sequence split along its tokens across the ranks of a process group:
    this rank's rows of flashcourse.attention(q_all, k_all, v_all) of the whole sequence;
    differentiable.

        o, lse = flashcourse.ring_attention(q, k, v, causal=True)   # under torchrun, NCCL

    q [B, H, n, D], k, v [B, H_kv, n, D]: this rank's slice of the sequence's rows (its n
    tokens, as zigzag_split(x, P, rank, dim=2, layout) takes them), CUDA tensors of one dtype
    (float16 or bfloat16) on this rank's GPU (torch.cuda.current_device()), any strides with a
    contiguous last dimension. group: a torch.distributed process group whose backend moves
    CUDA tensors (NCCL), every rank of it calling with its slice; None: the default group, or,
    where torch.distributed has none (a plain `python3 script.py`), the ring of one. layout:
    "zigzag" (rank r holds chunks r and 2P-1-r of 2P: causal work balanced) or "contiguous" (P
    blocks in rank order: the naive ring); ring_sizes() says which tokens each rank holds.
    causal, scale: as flashcourse.attention's (on the whole sequence: query i sees keys 0 .. i).
    stage, backward_stage: the stages of each step's flashcourse.attention and
    flashcourse.attention_backward call ("auto": as theirs).

    Returns (o, lse): o like q, lse [B, H, n] float32, this rank's rows, as flashcourse.attention
    returns them on the whole sequence (within rounding: each step's partial o is rounded to
    q's dtype before the merge). Where q, k or v require grad, o is differentiable: the backward
    runs the ring again (dK/dV travel with their K/V, fp32), each rank's backward() taking part.
    P = 1: flashcourse.attention itself, no communication.

    Every rank calls it with the same shapes but the slice's length, dtype, layout and causal:
    the first call of a shape on a rank gathers them (one all_gather, and the host waits for it)
    and raises ValueError on every rank where they disagree or the lengths are not the layout's
    split; later calls of that shape trust it (a rank whose call differs from a shape it saw
    before leaves the others waiting). Every rank's backward must run too (each passes the
    others' dK/dV on). Eager calls: it is not tested under torch.compile or CUDA graphs. Other
    bad input raises TypeError or ValueError naming flashcourse.ring_attention.
    """
    try:
        return _ring_attention(q, k, v, causal, scale, group, layout, stage, backward_stage)
    except _OWN_ERRORS as e:
        renamed = named_by(RING, e)
        if renamed is e:
            raise
        raise renamed from None


def _ring_attention(q, k, v, causal, scale, group, layout, stage, backward_stage):
    torch = _torch()
    causal = causal_checked(causal, RING)
    layout = _layout_checked(layout, RING)
    group, P, rank = ring_group(group)
    check_tensors(RING, (("q", q), ("k", k), ("v", v)))
    if str(q.dtype).replace("torch.", "") not in DTYPES:
        raise TypeError(f"{RING} takes {' or '.join(DTYPES)} tensors; these are {q.dtype}")
    if k.shape[2] != q.shape[2]:
        raise ValueError(f"{RING} takes q, k and v of one slice of the sequence (as many rows); "
                         f"q has {q.shape[2]}, k and v {k.shape[2]}")
    if P == 1:
        return attention(q, k, v, causal=causal, scale=scale, stage=stage,
                         backward_stage=backward_stage)
    backend = str(_dist().get_backend(group))
    if "nccl" not in backend.lower():
        raise ValueError(f"{RING} takes a process group whose backend moves CUDA tensors "
                         f"(NCCL); this group's is {backend}")
    if q.device.index != torch.cuda.current_device():
        raise ValueError(f"{RING}: q, k, v are on {q.device}, but this rank's GPU (NCCL's) is "
                         f"cuda:{torch.cuda.current_device()}: torch.cuda.set_device(local_rank) "
                         f"before init_process_group, and the tensors there")
    scale = scale_checked(scale, int(q.shape[-1]), RING)
    sizes = checked_sizes(q, k, group, P, rank, layout, causal)

    def attend(q, k, v, causal):
        return attention(q, k, v, causal=causal, scale=scale, stage=stage)

    def attend_backward(q, k, v, o, lse, do, causal):
        return attention_backward(q, k, v, o, lse, do, causal=causal, scale=scale,
                                  stage=backward_stage)

    ring = Ring(rank, P, sizes, layout, causal, _Exchange(group, P, rank), attend,
                attend_backward)
    return ring_function().apply(q, k, v, ring)
