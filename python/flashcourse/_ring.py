"""The ring's parts that need no process group (ring.py runs them over torch.distributed): the
split of a sequence over P ranks (ring_sizes, zigzag_split, zigzag_gather: the one home of the
rule stage 10's program follows too, common/ring.h), the schedule (ring_source, ring_block: which
rows meet which keys at each step, with or without the mask), the log-sum-exp merge, and the
forward and backward loops (ring_forward, ring_backward), the attention calls and the exchange
given to them: the tests run the same loops on the CPU, P ranks simulated in one process.
"""

from typing import TYPE_CHECKING, Callable, List, NamedTuple, Optional, Tuple

from ._library import _torch
from ._plans import ALIGN

if TYPE_CHECKING:
    from torch import Tensor

RING = "flashcourse.ring_attention"
LAYOUTS = ("zigzag", "contiguous")  # the first is the default
DTYPES = ("float16", "bfloat16")  # what q, k, v may be (the stages that take N_k != N store them)


# ---- the split: one home for which tokens each rank holds ----

def _layout_checked(layout, who: str) -> str:
    if layout not in LAYOUTS:
        raise ValueError(f"{who}: layout must be one of {', '.join(map(repr, LAYOUTS))}, not "
                         f"{layout!r}")
    return layout


def _count_checked(x, name: str, least: int, who: str) -> int:
    if isinstance(x, bool) or not isinstance(x, int):
        raise TypeError(f"{who}: {name} must be an int, not {type(x).__name__}")
    if x < least:
        raise ValueError(f"{who}: {name} must be at least {least}, got {x}")
    return x


def ring_sizes(N: int, P: int, layout: str = "zigzag") -> List[List[Tuple[int, int]]]:
    """Which tokens of a sequence of N each of P ranks holds: for rank r, its chunks as
    (start, length) in the order its slice holds them. zigzag: the sequence in 2P chunks, chunk
    i of N // (2P) tokens plus one where i < N % (2P); rank r holds chunks r and 2P-1-r.
    contiguous: P blocks, block r of N // P tokens plus one where r < N % P. A chunk may be empty
    (N < 2P)."""
    who = "flashcourse.ring_sizes"
    N, P = _count_checked(N, "N", 0, who), _count_checked(P, "P", 1, who)
    layout = _layout_checked(layout, who)
    parts = 2 * P if layout == "zigzag" else P
    lengths = [N // parts + (1 if i < N % parts else 0) for i in range(parts)]
    starts = [sum(lengths[:i]) for i in range(parts)]
    chunks = [(r, 2 * P - 1 - r) if layout == "zigzag" else (r,) for r in range(P)]
    return [[(starts[i], lengths[i]) for i in c] for c in chunks]


def _slice_lengths(sizes) -> List[int]:
    """Each rank's slice length (rows) from ring_sizes()'s answer."""
    return [sum(n for _, n in chunks) for chunks in sizes]


def zigzag_split(x: "Tensor", P: int, rank: int, dim: int, layout: str = "zigzag") -> "Tensor":
    """Rank `rank`'s slice of x along dim (x.shape[dim] = N tokens) for P ranks: its chunks
    (ring_sizes) one after the other, as a new contiguous tensor. Any tensor: q, k, v
    [B, H, N, D] with dim=2, token ids [B, N] with dim=1, positions [N] with dim=0."""
    who = "flashcourse.zigzag_split"
    torch = _torch()
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{who} takes a torch tensor; x is a {type(x).__name__}")
    P = _count_checked(P, "P", 1, who)
    rank = _count_checked(rank, "rank", 0, who)
    if rank >= P:
        raise ValueError(f"{who}: rank must be below P = {P}, got {rank}")
    dim = _dim_checked(x, dim, who)
    pieces = [x.narrow(dim, start, n) for start, n in
              ring_sizes(int(x.shape[dim]), P, layout)[rank]]
    return torch.cat(pieces, dim).contiguous()


def zigzag_gather(parts, dim: int, layout: str = "zigzag") -> "Tensor":
    """The whole tensor from every rank's slice along dim (parts: a list in rank order, as
    zigzag_split made them; P = len(parts), N the sum of their lengths): the inverse of
    zigzag_split. The parts must be on one device."""
    who = "flashcourse.zigzag_gather"
    torch = _torch()
    if not isinstance(parts, (list, tuple)) or not parts or \
            not all(isinstance(p, torch.Tensor) for p in parts):
        raise TypeError(f"{who} takes a list of torch tensors, one per rank in rank order")
    dim = _dim_checked(parts[0], dim, who)
    lengths = [int(p.shape[dim]) for p in parts]
    sizes = ring_sizes(sum(lengths), len(parts), layout)
    if lengths != _slice_lengths(sizes):
        raise ValueError(f"{who}: slices of lengths {lengths} along dim {dim} are not the "
                         f"{layout} split of {sum(lengths)} tokens over {len(parts)} ranks "
                         f"({_slice_lengths(sizes)})")
    pieces = []  # (global start, the chunk's rows of its part)
    for part, chunks in zip(parts, sizes):
        at = 0
        for start, n in chunks:
            pieces.append((start, part.narrow(dim, at, n)))
            at += n
    return torch.cat([p for _, p in sorted(pieces, key=lambda x: x[0])], dim)


def _dim_checked(x, dim, who: str) -> int:
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise TypeError(f"{who}: dim must be an int, not {type(dim).__name__}")
    if not -x.dim() <= dim < x.dim():
        raise ValueError(f"{who}: dim {dim} is out of range for a tensor of {x.dim()} "
                         f"dimensions")
    return dim % x.dim()


# ---- the schedule and the merge: plain functions the ring and its tests share ----

class Block(NamedTuple):
    """One step's attention call on rank r: its query rows q0 .. q1 - 1 (of its slice) against
    keys k0 .. k1 - 1 of the source's slice, causal or not."""
    q0: int
    q1: int
    k0: int
    k1: int
    causal: bool


def ring_source(P: int, rank: int, t: int) -> int:
    """The rank whose K/V slice rank `rank` holds at step t: (rank - t) mod P."""
    return (rank - t) % P


def ring_block(sizes, rank: int, t: int, causal: bool, layout: str) -> Optional[Block]:
    """What rank `rank` computes at step t (sizes: ring_sizes(N, P, layout)), or None: nothing
    (no key of the source is seen by any of its queries, or an empty chunk).

    Not causal: all rows against all keys. Causal, at t = 0 (its own keys): all rows against all
    keys, causal (its slice keeps the sequence's order, so the local mask is the global one).
    Causal zigzag, source s < r: all rows against s's first chunk (chunk s comes before both of
    r's chunks; chunk 2P-1-s after both); s > r: the rows of r's second chunk (2P-1-r, after
    both of s's chunks) against all of s's keys; r's first chunk sees none of them. Causal
    contiguous: s < r all against all; s > r nothing (the imbalance zigzag removes)."""
    P = len(sizes)
    s = ring_source(P, rank, t)
    rows, keys = _slice_lengths(sizes)[rank], _slice_lengths(sizes)[s]
    if not causal:
        block = Block(0, rows, 0, keys, False)
    elif s == rank:
        block = Block(0, rows, 0, keys, True)
    elif layout == "contiguous":
        block = Block(0, rows, 0, keys, False) if s < rank else None
    elif s < rank:
        block = Block(0, rows, 0, sizes[s][0][1], False)
    else:
        block = Block(sizes[rank][0][1], rows, 0, keys, False)
    if block is None or block.q0 == block.q1 or block.k0 == block.k1:
        return None
    return block


def merge(o_acc: "Tensor", lse_acc: "Tensor", o_s: "Tensor", lse_s: "Tensor") -> None:
    """Merges a partial result (o_s, lse_s: softmax over one set of keys) into the accumulated
    one (o_acc, lse_acc: over the keys before), in place: lse = log(e^lse_acc + e^lse_s), o_acc
    = o_acc e^(lse_acc - lse) + o_s e^(lse_s - lse). A row that neither part's keys reach (-inf
    both) stays o = 0, lse = -inf. o [..., rows, D], lse [..., rows] (views are fine)."""
    torch = _torch()
    lse = torch.logaddexp(lse_acc, lse_s)
    # -inf rows: subtract 0 instead, so that the weights are exp(-inf) = 0, not exp(nan)
    base = lse.masked_fill(lse == float("-inf"), 0.0)
    o_acc.mul_(torch.exp(lse_acc - base).unsqueeze(-1))
    o_acc.addcmul_(o_s, torch.exp(lse_s - base).unsqueeze(-1))
    lse_acc.copy_(lse)


class Ring(NamedTuple):
    """What ring_forward and ring_backward need besides the tensors: this rank's place (rank of
    size P), the split (sizes: ring_sizes), the layout and causal flag, the exchange
    (exchange(send, recv) starts sending `send` to rank + 1 and receiving `recv` from rank - 1,
    returning what to wait() on before either is touched again), and the block calls:
    attend(q, k, v, causal) -> (o, lse) and attend_backward(q, k, v, o, lse, do, causal) ->
    (dq, dk, dv), flashcourse.attention's and attention_backward's (float64 torch in the
    tests)."""
    rank: int
    size: int
    sizes: list
    layout: str
    causal: bool
    exchange: Callable
    attend: Callable
    attend_backward: Callable


def _kv_parts(flat, B: int, H_kv: int, n: int, D: int):
    """k and v [B, H_kv, n, D] (contiguous views) of one slice's flat buffer."""
    kv = flat.view(2, B, H_kv, n, D)
    return kv[0], kv[1]


def _travelling(ring: Ring, B: int, H_kv: int, D: int, dtype, device):
    """The two flat buffers that one kind of slice (K/V, or dK/dV) travels in, each sized for
    the longest slice, and the element count of a source's: a step reads one while the next
    slice arrives in the other."""
    torch = _torch()
    per_row = 2 * B * H_kv * D
    lengths = _slice_lengths(ring.sizes)
    bufs = [torch.empty(per_row * max(lengths), dtype=dtype, device=device) for _ in range(2)]
    return bufs, [per_row * n for n in lengths]


class _Done:
    def wait(self):
        pass


def _own_kv(ring: Ring, k, v, bufs, numel):
    """This rank's K/V packed into the first travelling buffer (the one copy the ring makes),
    as the flat slice it sends."""
    B, H_kv, n, D = (int(x) for x in k.shape)
    cur = bufs[0][:numel[ring.rank]]
    k_own, v_own = _kv_parts(cur, B, H_kv, n, D)
    k_own.copy_(k)
    v_own.copy_(v)
    return cur


def _kv_steps(ring: Ring, k, v):
    """The K/V slices in the order a rank visits them: yields (t, source, k, v) for t = 0 ..
    P-1, its own k, v first. Before step t's slice is handed out, the exchange for step t + 1
    has started (so it overlaps step t's work); it is waited on before step t + 1 reads it
    (P - 1 exchanges)."""
    B, H_kv, _, D = (int(x) for x in k.shape)
    P, lengths = ring.size, _slice_lengths(ring.sizes)
    bufs, numel = _travelling(ring, B, H_kv, D, k.dtype, k.device) if P > 1 else (None, None)
    cur = _own_kv(ring, k, v, bufs, numel) if P > 1 else None
    for t in range(P):
        s = ring_source(P, ring.rank, t)
        pending = _Done()
        if t + 1 < P:
            nxt = bufs[(t + 1) % 2][:numel[ring_source(P, ring.rank, t + 1)]]
            pending = ring.exchange(cur, nxt)
        ks, vs = (k, v) if t == 0 else _kv_parts(cur, B, H_kv, lengths[s], D)
        yield t, s, ks, vs
        pending.wait()
        if t + 1 < P:
            cur = nxt


def ring_forward(q, k, v, ring: Ring) -> Tuple["Tensor", "Tensor"]:
    """This rank's rows of attention over the whole sequence: (o like q, lse [B, H, n] in
    float32, float64 for float64 inputs). q [B, H, n, D], k, v [B, H_kv, n, D]: this rank's
    slice. Each step's block (ring_block) by ring.attend, merged in place (merge)."""
    torch = _torch()
    acc = torch.promote_types(q.dtype, torch.float32)
    o_acc = lse_acc = None
    for t, s, ks, vs in _kv_steps(ring, k, v):
        b = ring_block(ring.sizes, ring.rank, t, ring.causal, ring.layout)
        if b is None:
            continue
        o_s, lse_s = ring.attend(q[:, :, b.q0:b.q1], ks[:, :, b.k0:b.k1], vs[:, :, b.k0:b.k1],
                                 b.causal)
        if t == 0:  # every row against its own keys: the accumulators start as this block
            o_acc, lse_acc = o_s.to(acc), lse_s.to(acc)
        else:
            merge(o_acc[:, :, b.q0:b.q1], lse_acc[:, :, b.q0:b.q1], o_s, lse_s)
    if o_acc is None:  # an empty slice (N < 2P): nothing of this rank's to compute
        return torch.zeros_like(q), q.new_zeros(q.shape[:3], dtype=acc)
    return o_acc.to(q.dtype), lse_acc


def ring_backward(q, k, v, o, lse, do, ring: Ring) -> Tuple["Tensor", "Tensor", "Tensor"]:
    """dq, dk, dv of this rank's slice, given the final o and lse of its rows and do = dLoss/do.
    Each step's block (ring_block, as the forward's) by ring.attend_backward on the final o and
    lse: dq adds up here (fp32); dK/dV add up in an fp32 accumulator that travels with the K/V it
    belongs to (sent on after each step, while the next step's block runs; waited on just
    before the next step adds to it), P exchanges, the last bringing each home."""
    torch = _torch()
    acc = torch.promote_types(q.dtype, torch.float32)
    B, H_kv, n, D = (int(x) for x in k.shape)
    P, r, lengths = ring.size, ring.rank, _slice_lengths(ring.sizes)
    if do.stride(-1) != 1 or do.data_ptr() % ALIGN:  # what the backward stages read
        do = do.clone(memory_format=torch.contiguous_format)
    bufs, numel = _travelling(ring, B, H_kv, D, acc, q.device)
    lse_rows = {}  # (q0, q1) -> lse of those rows, contiguous (the backward's requirement)
    dq_acc = torch.zeros_like(q, dtype=acc) if n == 0 else None
    home = 0  # which buffer holds the accumulator of the K/V at hand: this rank's own, first
    pending = _Done()
    for t, s, ks, vs in _kv_steps(ring, k, v):
        b = ring_block(ring.sizes, r, t, ring.causal, ring.layout)
        if b is not None:
            rows, keys = slice(b.q0, b.q1), slice(b.k0, b.k1)
            if (b.q0, b.q1) not in lse_rows:
                lse_rows[(b.q0, b.q1)] = lse[:, :, rows].contiguous()
            dq_s, dk_s, dv_s = ring.attend_backward(q[:, :, rows], ks[:, :, keys],
                                                    vs[:, :, keys], o[:, :, rows],
                                                    lse_rows[(b.q0, b.q1)], do[:, :, rows],
                                                    b.causal)
        pending.wait()  # (t > 0) source s's accumulator, from rank r - 1
        dk_acc, dv_acc = _kv_parts(bufs[home][:numel[s]], B, H_kv, lengths[s], D)
        if t == 0 and b is not None:  # every row against its own keys: the sums start here
            dq_acc = dq_s.to(acc)
            dk_acc.copy_(dk_s)
            dv_acc.copy_(dv_s)
        elif b is not None:
            dq_acc[:, :, rows] += dq_s
            dk_acc[:, :, keys] += dk_s
            dv_acc[:, :, keys] += dv_s
        if P > 1:  # on to rank r + 1; the next step's (source s - 1's) comes from rank r - 1
            nxt = 1 - home
            pending = ring.exchange(bufs[home][:numel[s]],
                                    bufs[nxt][:numel[ring_source(P, r, t + 1)]])
            home = nxt
    pending.wait()  # the P-th exchange: this rank's own dK/dV, home
    dk_acc, dv_acc = _kv_parts(bufs[home][:numel[r]], B, H_kv, n, D)
    return dq_acc.to(q.dtype), dk_acc.to(k.dtype), dv_acc.to(v.dtype)
