#!/usr/bin/env python3
"""flashcourse.ring_attention (a sequence split over the ranks of a torch.distributed group, K/V
and dK/dV passed around a ring), its split (ring_sizes, zigzag_split, zigzag_gather) and
python/examples/train_gpt_cp.py.

    PYTHONPATH=python python3 python/tests/test_ring.py               # CPU (CI)
    python3 python/tests/test_ring.py --gpu                           # one GPU: P = 1, simulated
    torchrun --nproc_per_node=2 python/tests/test_ring.py --gpu       # two GPUs: P = 2, NCCL
    torchrun --nproc_per_node=2 python/tests/test_ring.py --bench     # the ring vs one GPU, timed

CPU (no GPU; without PyTorch the torch-free checks and SKIP lines for the rest): the split's rule
for P = 1..4, N in {1, 2, 3, 7, 8, 64, 1000}, both layouts, and that the schedule (ring_block)
covers each rank's causal or full mask exactly once, without PyTorch; zigzag_split /
zigzag_gather round trips; the merge; ring.py's own forward and backward loops (ring_forward,
ring_backward: the schedule, the merge, the travelling K/V and dK/dV buffers that ring_attention
runs) on P ranks simulated by threads of one process, float64 torch attention as each step's
call, against float64 attention on the whole sequence and its autograd gradients: causal and
not, grouped-query heads (H = 4, H_kv = 2), N not divisible by 2P, N < 2P (empty chunks and
slices); that this check can fail (a causal mask at s > r, the wrong chunk at s < r, a step left
out: each caught); over torch.distributed's gloo backend in P forked processes (CPU tensors,
float64 steps): the real exchange, the first call's check (refusing, on every rank, a slice of
the wrong length and a causal flag that differs) and the autograd.Function, and
train_gpt_cp.py's loss and weight gradients on a tiny GPT equal to one process's;
ring_attention's argument checks; train_gpt_cp.py's command line.

--gpu (each rank a GPU; under torchrun P = its world size, else P = 1): random q, k, v and dO made
on rank 0 and broadcast, each rank its slice; ring_attention's o, lse and dq, dk, dv, gathered,
against flashcourse.attention and its backward on the whole sequence on rank 0's GPU (the largest
absolute difference printed). The check: each error relative to its row's largest magnitude (o
and dq: a query's row, dk and dv: a key's; at least the tensor's mean magnitude; the LSE
absolute), at most twice the single-GPU result's own error against float64 attention (on the
GPU, every row) plus a floor (FLOOR_ULPS units of the dtype's precision; LSE_FLOOR); causal and
not, N in {1000, 4103}, GQA 8/2, D 128, fp16 and bf16, both layouts. With P = 1, also rings of
SIMULATED ranks on the one GPU (threads exchanging copies: the ring's steps on the course's
kernels, without NCCL). --bench: the ring's forward and forward+backward per call against one
GPU's on the whole sequence (BENCH_SHAPE: B = 1, H = 32, H_kv = 8, D = 128; bf16, causal, N in
{16k, 64k, 128k}: --seqs), the efficiency T1 / (P * T_P), the device's name and P.
Ends with "N passed, M failed, K skipped".
"""

import argparse
import functools
import importlib.util
import math
import os
import queue
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections import deque
from datetime import timedelta

from harness import REPO, Skip, key_mask, need_gpu, raiser, results, run, setup, softmax_ref, \
    summary

torch, HAVE_GPU = setup()
import flashcourse  # noqa: E402
from flashcourse import _ring, ring  # noqa: E402

RING = "flashcourse.ring_attention"
TRAIN_GPT_CP = REPO / "python" / "examples" / "train_gpt_cp.py"
PS = (1, 2, 3, 4)  # ranks simulated
NS = (1, 2, 3, 7, 8, 64, 1000)  # sequence lengths of the split's checks: tails, N < 2P, N = 2P
TIMEOUT = 60  # seconds a simulated or gloo rank waits for a message before the test fails
FLOOR_ULPS = 2  # the GPU check's floor: units of the dtype's precision (eps), relative to a row
LSE_FLOOR = 1e-3  # the GPU check's floor for the LSE (natural log, float32), absolute

raises = raiser("'auto'", "_ring_attention", "checked_sizes")


# ---- the split, without PyTorch ----

def t_sizes():
    for P in PS:
        for N in NS:
            for layout in ring.LAYOUTS:
                sizes = ring.ring_sizes(N, P, layout)
                assert len(sizes) == P, (N, P, layout, sizes)
                chunks = sorted(c for rank in sizes for c in rank)
                at = 0
                for start, n in chunks:  # every token once, chunks in order
                    assert start == at and n >= 0, (N, P, layout, chunks)
                    at += n
                assert at == N, (N, P, layout, chunks)
                parts = 2 * P if layout == "zigzag" else P
                want = [N // parts + (1 if i < N % parts else 0) for i in range(parts)]
                assert [n for _, n in chunks] == want, (N, P, layout, chunks)
                for r, rank in enumerate(sizes):  # rank r: chunks r and 2P-1-r, in that order
                    ids = (r, 2 * P - 1 - r) if layout == "zigzag" else (r,)
                    assert rank == [(sum(want[:i]), want[i]) for i in ids], (N, P, layout, r)
    assert ring.ring_sizes(10, 2) == [[(0, 3), (8, 2)], [(3, 3), (6, 2)]]
    assert ring.ring_sizes(10, 2, "contiguous") == [[(0, 5)], [(5, 5)]]


def t_sizes_refused():
    who = "flashcourse.ring_sizes"
    raises(ValueError, flashcourse.ring_sizes, 8, 0, match=[who, "P", "at least 1"])
    raises(ValueError, flashcourse.ring_sizes, -1, 2, match=[who, "N"])
    raises(TypeError, flashcourse.ring_sizes, 8.0, 2, match=[who, "N", "int"])
    raises(TypeError, flashcourse.ring_sizes, 8, True, match=[who, "P", "int"])
    raises(ValueError, flashcourse.ring_sizes, 8, 2, "striped", match=[who, "'zigzag'"])


def covered(N, P, causal, layout):
    """Per rank, the (global query, global key) pairs its steps compute (ring_block), each with
    how many times; the mask each block applies (causal: bottom-right, attention()'s rule)
    included."""
    sizes = ring.ring_sizes(N, P, layout)
    tokens = [[start + i for start, n in rank for i in range(n)] for rank in sizes]
    seen = []
    for r in range(P):
        pairs = {}
        for t in range(P):
            s = ring.ring_source(P, r, t)
            b = ring.ring_block(sizes, r, t, causal, layout)
            if b is None:
                continue
            rows, keys = tokens[r][b.q0:b.q1], tokens[s][b.k0:b.k1]
            for i, qi in enumerate(rows):
                for j, kj in enumerate(keys):
                    if not b.causal or j <= i + len(keys) - len(rows):
                        pairs[(qi, kj)] = pairs.get((qi, kj), 0) + 1
        seen.append(pairs)
    return tokens, seen


def t_schedule_covers_the_mask():
    # without PyTorch: every query sees exactly its keys (j <= i causal, all otherwise), once
    for P in PS:
        for N in NS[:-1] + (37,):
            for layout in ring.LAYOUTS:
                for causal in (False, True):
                    tokens, seen = covered(N, P, causal, layout)
                    for r in range(P):
                        want = {(i, j): 1 for i in tokens[r] for j in range(N)
                                if not causal or j <= i}
                        assert seen[r] == want, (N, P, layout, causal, r)


def t_zigzag_balances():
    # causal work per rank (query-key pairs), 2P dividing N: zigzag the same on every rank; the
    # contiguous ring's last rank does about 2P - 1 times its first's
    N, P = 512, 4
    work = {lay: [sum(s.values()) for s in covered(N, P, True, lay)[1]] for lay in ring.LAYOUTS}
    zz, cont = work["zigzag"], work["contiguous"]
    assert min(zz) == max(zz), zz
    assert cont[-1] / cont[0] > 2 * P - 2, cont


# ---- with PyTorch, on the CPU ----

def need_torch():
    if torch is None:
        raise Skip("no PyTorch here")


def t_round_trip():
    need_torch()
    for P in PS:
        for N in NS:
            for layout in ring.LAYOUTS:
                x = torch.arange(2 * N * 3).view(2, N, 3)
                parts = [flashcourse.zigzag_split(x, P, r, 1, layout) for r in range(P)]
                sizes = ring.ring_sizes(N, P, layout)
                for r, part in enumerate(parts):
                    index = [start + i for start, n in sizes[r] for i in range(n)]
                    assert part.is_contiguous() and torch.equal(part, x[:, index]), (N, P, r)
                back = flashcourse.zigzag_gather(parts, 1, layout)
                assert torch.equal(back, x), (N, P, layout)
                assert torch.equal(flashcourse.zigzag_gather(
                    [p.transpose(0, 1) for p in parts], -3, layout), x.transpose(0, 1))
    # a copy, not a view; a slice of the wrong length refused
    x = torch.zeros(8)
    flashcourse.zigzag_split(x, 1, 0, 0).add_(1)
    assert x.sum() == 0
    parts = [flashcourse.zigzag_split(torch.arange(9), 2, r, 0) for r in range(2)]
    raises(ValueError, flashcourse.zigzag_gather, [parts[0], parts[1][:-1]], 0,
           match=["flashcourse.zigzag_gather", "[5, 3]", "[4, 4]"])
    raises(ValueError, flashcourse.zigzag_split, x, 2, 2, 0,
           match=["flashcourse.zigzag_split", "rank"])
    raises(ValueError, flashcourse.zigzag_split, x, 2, 0, 1,
           match=["flashcourse.zigzag_split", "dim"])
    raises(TypeError, flashcourse.zigzag_gather, x, 0, match="flashcourse.zigzag_gather")


def t_merge():
    need_torch()
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 3, 5, 8, generator=g, dtype=torch.float64)
    k, v = (torch.randn(2, 3, 11, 8, generator=g, dtype=torch.float64) for _ in range(2))
    attend = attend64(0.3)
    o, lse = attend(q, k, v, False)
    o_acc, lse_acc = attend(q, k[:, :, :4], v[:, :, :4], False)
    o_s, lse_s = attend(q, k[:, :, 4:], v[:, :, 4:], False)
    ring.merge(o_acc, lse_acc, o_s, lse_s)
    assert (o_acc - o).abs().max() < 1e-12 and (lse_acc - lse).abs().max() < 1e-12
    # rows that no key of either part reaches: o = 0, lse = -inf, no NaN; one side alone: it
    none = torch.full((1, 1, 2), float("-inf"), dtype=torch.float64)
    o_acc, o_s = torch.zeros(1, 1, 2, 4, dtype=torch.float64), torch.ones(1, 1, 2, 4,
                                                                          dtype=torch.float64)
    lse_acc, lse_s = none.clone(), none.clone()
    lse_s[..., 1] = 0.5
    ring.merge(o_acc, lse_acc, o_s, lse_s)
    assert torch.equal(o_acc[0, 0, 0], torch.zeros(4, dtype=torch.float64)), o_acc
    assert torch.equal(o_acc[0, 0, 1], torch.ones(4, dtype=torch.float64)), o_acc
    assert lse_acc[0, 0, 0] == float("-inf") and lse_acc[0, 0, 1] == 0.5, lse_acc


def attend64(scale):
    """Each step's attention call in float64 torch, as flashcourse.attention computes it: q
    [B, H, n, D] against k, v [B, H_kv, m, D] (grouped-query heads), causal aligned to the
    bottom right: (o, lse)."""
    def attend(q, k, v, causal):
        g = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
        mask = key_mask(q.shape[2], k.shape[2], causal, -1, -1, device=q.device)
        return softmax_ref((q @ k.transpose(-1, -2)) * scale, mask, v)
    return attend


def attend_backward64(scale):
    """Each step's backward call in float64 torch, as flashcourse.attention_backward computes it
    from the final o and lse (FlashAttention-2's backward): P = exp(S - lse), dV = P^T dO,
    dS = P (dO V^T - rowsum(dO o)), dQ = dS K scale, dK = dS^T Q scale, summed over each key/value
    head's query heads."""
    def attend_backward(q, k, v, o, lse, do, causal):
        B, H, n, D = q.shape
        H_kv, m = k.shape[1], k.shape[2]
        g = H // H_kv
        ke, ve = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
        mask = key_mask(n, m, causal, -1, -1, device=q.device)
        s = (q @ ke.transpose(-1, -2)) * scale
        p = torch.where(mask, torch.exp(s - lse[..., None]), torch.zeros_like(s))
        dv = p.transpose(-1, -2) @ do
        ds = p * (do @ ve.transpose(-1, -2) - (do * o).sum(-1, keepdim=True))
        dq = ds @ ke * scale
        dk = ds.transpose(-1, -2) @ q * scale
        return (dq, dk.view(B, H_kv, g, m, D).sum(2), dv.view(B, H_kv, g, m, D).sum(2))
    return attend_backward


class ThreadRing:
    """P ranks as threads of one process: each rank's exchange(send, recv) sends a copy of `send`
    to rank + 1 and receives from rank - 1 into `recv`, matched in the order posted (as NCCL and
    gloo match a pair's sends and receives); a message whose size is not the receive's fails."""

    def __init__(self, P):
        self.P = P
        self.boxes = [queue.Queue() for _ in range(P)]
        self.posted = [deque() for _ in range(P)]
        self.messages = 0
        self.lock = threading.Lock()

    def exchange_of(self, rank):
        def exchange(send, recv):
            self.boxes[(rank + 1) % self.P].put(send.clone())
            with self.lock:
                self.messages += 1
            req = {"recv": recv, "done": False}
            self.posted[rank].append(req)
            return ThreadWait(self, rank, req)
        return exchange


class ThreadWait:
    """wait(): this rank's posted receives filled from its box in the order posted, until this
    one is."""

    def __init__(self, ring_, rank, req):
        self.ring, self.rank, self.req = ring_, rank, req

    def wait(self):
        while not self.req["done"]:
            got = self.ring.boxes[self.rank].get(timeout=TIMEOUT)
            first = self.ring.posted[self.rank].popleft()
            assert got.numel() == first["recv"].numel(), \
                f"rank {self.rank} got {got.numel()} elements, expected {first['recv'].numel()}"
            first["recv"].copy_(got.view_as(first["recv"]))
            first["done"] = True


def inputs(B, H, H_kv, N, D, seed, dtype=None, device="cpu"):
    """q, k, v, do of the whole sequence, seeded."""
    dtype = dtype or torch.float64
    g = torch.Generator(device=device).manual_seed(seed)
    return [torch.randn(B, h, N, D, generator=g, device=device, dtype=dtype)
            for h in (H, H_kv, H_kv, H)]


def reference64(q, k, v, do, causal, scale):
    """float64 attention on the whole sequence and its autograd gradients: o, lse, dq, dk, dv."""
    leaves = [t.detach().double().requires_grad_(True) for t in (q, k, v)]
    o, lse = attend64(scale)(*leaves, causal)
    o.backward(do.double())
    return [o.detach(), lse.detach()] + [t.grad for t in leaves]


def simulate(q, k, v, do, P, causal, layout, scale, attend=None, attend_backward=None):
    """The ring's forward and backward on P simulated ranks (threads, ThreadRing), each with its
    slice, each step's calls float64 torch's (attend64, attend_backward64) or those given: the
    gathered o, lse, dq, dk, dv, and the messages sent."""
    attend = attend or attend64(scale)
    attend_backward = attend_backward or attend_backward64(scale)
    sizes = ring.ring_sizes(q.shape[2], P, layout)
    tr = ThreadRing(P)
    out = [None] * P
    errors = []

    def rank_main(r):
        try:
            mine = [flashcourse.zigzag_split(t, P, r, 2, layout) for t in (q, k, v, do)]
            rg = ring.Ring(r, P, sizes, layout, causal, tr.exchange_of(r), attend,
                           attend_backward)
            o, lse = ring.ring_forward(*mine[:3], rg)
            out[r] = [o, lse, *ring.ring_backward(*mine[:3], o, lse, mine[3], rg)]
        except Exception:
            errors.append(f"rank {r}: {traceback.format_exc()}")

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(P)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(TIMEOUT * 2)
    assert not errors, "\n".join(errors)
    assert all(x is not None for x in out), "a simulated rank did not finish"
    return [flashcourse.zigzag_gather([o[i] for o in out], 2, layout)
            for i in range(len(out[0]))], tr.messages


NAMES = ("o", "lse", "dq", "dk", "dv")


def worst(got, want):
    """The largest |got - want| of each of o, lse, dq, dk, dv (-inf equal to -inf)."""
    errs = []
    for a, b in zip(got, want):
        same = (a == b)  # (-inf rows)
        errs.append(0.0 if a.numel() == 0 else
                    float(torch.where(same, torch.zeros_like(a), (a - b).abs()).max()))
    return errs


SIM_CASES = [  # (B, H, H_kv, N, D): GQA, N not divisible by 2P for P > 1, N < 2P
    (2, 4, 2, 37, 8), (1, 4, 2, 64, 16), (1, 2, 1, 3, 8), (1, 4, 4, 1, 8)]


def t_simulated_ring():
    need_torch()
    checked = 0
    for B, H, H_kv, N, D in SIM_CASES:
        q, k, v, do = inputs(B, H, H_kv, N, D, seed=N)
        scale = 0.7 / math.sqrt(D)
        for causal in (False, True):
            want = reference64(q, k, v, do, causal, scale)
            for P in PS:
                for layout in ring.LAYOUTS:
                    got, messages = simulate(q, k, v, do, P, causal, layout, scale)
                    errs = worst(got, want)
                    assert max(errs) < 1e-10, \
                        f"P {P} {layout} causal {causal} N {N}: " + \
                        ", ".join(f"{n} {e:.2e}" for n, e in zip(NAMES, errs))
                    # K/V: P - 1 exchanges forward and backward; dK/dV: P (none for P = 1)
                    assert messages == (3 * P - 2) * P if P > 1 else messages == 0, messages
                    checked += 1
    assert checked == len(SIM_CASES) * 2 * len(PS) * len(ring.LAYOUTS)


def t_check_can_fail():
    # the same simulation with one step wrong: each must be caught (forward or backward)
    need_torch()
    q, k, v, do = inputs(1, 4, 2, 37, 8, seed=5)
    scale = 1 / math.sqrt(8)
    want = reference64(q, k, v, do, True, scale)
    real = ring.ring_block

    def wrong_mask(sizes, r, t, causal, layout):  # s > r: a causal mask where none belongs
        b = real(sizes, r, t, causal, layout)
        return b._replace(causal=True) if b and ring.ring_source(len(sizes), r, t) > r else b

    def wrong_keys(sizes, r, t, causal, layout):  # s < r: the source's second chunk
        b = real(sizes, r, t, causal, layout)
        s = ring.ring_source(len(sizes), r, t)
        if b and causal and s < r and layout == "zigzag":
            first = sizes[s][0][1]
            return b._replace(k0=first, k1=first + sizes[s][1][1])
        return b

    def no_step(sizes, r, t, causal, layout):  # the last step left out
        return None if t == len(sizes) - 1 else real(sizes, r, t, causal, layout)

    try:
        for name, fake in (("a causal mask at s > r", wrong_mask),
                           ("the second chunk's keys at s < r", wrong_keys),
                           ("the last step left out", no_step)):
            _ring.ring_block = fake  # where ring_forward and ring_backward look it up
            got, _ = simulate(q, k, v, do, 3, True, "zigzag", scale)
            errs = worst(got, want)
            assert max(errs) > 1e-3, f"{name}: not caught ({errs})"
    finally:
        _ring.ring_block = real


# ---- over torch.distributed's gloo backend (CPU tensors), P processes ----

def gloo_ranks(P, work, *args):
    """work(rank, P, group, *args) in P forked processes joined by a gloo process group: each
    rank's answer, in rank order (AssertionError with a rank's traceback where one raised)."""
    need_torch()
    import multiprocessing
    dist = torch.distributed
    if not dist.is_available() or not dist.is_gloo_available():
        raise Skip("this PyTorch has no torch.distributed gloo backend")
    if "fork" not in multiprocessing.get_all_start_methods():
        raise Skip("no fork here (the ranks are forked processes)")
    ctx = multiprocessing.get_context("fork")
    out, port = ctx.Queue(), free_port()

    def rank_main(rank):
        try:
            torch.set_num_threads(1)
            dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                    world_size=P, timeout=timedelta(seconds=TIMEOUT))
        except Exception as e:  # the machine (no loopback, no host name), not the ring
            out.put((rank, None, f"{type(e).__name__}: {e}".splitlines()[0]))
            return
        try:
            answer = work(rank, P, dist.group.WORLD, *args)
            dist.destroy_process_group()
            out.put((rank, True, answer))
        except BaseException:
            out.put((rank, False, traceback.format_exc()))

    procs = [ctx.Process(target=rank_main, args=(r,)) for r in range(P)]
    for p in procs:
        p.start()
    answers = {}
    try:
        for _ in procs:
            try:
                rank, ok, answer = out.get(timeout=TIMEOUT * 2)
            except queue.Empty:
                raise AssertionError(f"P {P}: a rank did not answer (exit codes "
                                     f"{[p.exitcode for p in procs]})") from None
            if ok is None:
                raise Skip(f"gloo does not start here ({answer})")
            assert ok, f"P {P} rank {rank}: {answer}"
            answers[rank] = answer
    finally:
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
    return [answers[r] for r in range(P)]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gloo_ring(rank, P, group, cases):
    """On each rank: the real exchange (ring's, over gloo), the first call's check
    (checked_sizes) and ring_function's autograd.Function, with float64 steps: the worst errors
    against float64 attention on the whole sequence, per case; then the check's refusals."""
    got = []
    for B, H, H_kv, N, D, causal, layout in cases:
        q, k, v, do = inputs(B, H, H_kv, N, D, seed=N + P)
        scale = 1 / math.sqrt(D)
        want = reference64(q, k, v, do, causal, scale)
        mine = [flashcourse.zigzag_split(t, P, rank, 2, layout) for t in (q, k, v, do)]
        leaves = [t.requires_grad_(True) for t in mine[:3]]
        assert ring.ring_group(None) == (group, P, rank), ring.ring_group(None)
        sizes = ring.checked_sizes(*leaves[:2], group, P, rank, layout, causal)
        rg = ring.Ring(rank, P, sizes, layout, causal, ring._Exchange(group, P, rank),
                       attend64(scale), attend_backward64(scale))
        o, lse = ring.ring_function().apply(*leaves, rg)
        o.backward(mine[3])
        mine_want = [flashcourse.zigzag_split(t, P, rank, 2, layout) for t in want]
        got.append(worst([o.detach(), lse] + [t.grad for t in leaves], mine_want))
    # the first call's check: rank 0's slice a row too long (no split of N = 10 is [4, 3, 3] or
    # [6, 4]), or its causal flag not the others'; each check a shape no rank has seen
    refusals = []
    for H, longer, causal in ((2, True, False), (4, False, rank == 0)):
        q, k, _, _ = inputs(1, H, 2, 9, 8, seed=1)
        mine = [flashcourse.zigzag_split(t, P, rank, 2) for t in (q, k)]
        if longer and rank == 0:
            mine = [torch.cat([t, t[:, :, :1]], 2) for t in mine]
        try:
            ring.checked_sizes(*mine, group, P, rank, "zigzag", causal)
            refusals.append("no error")
        except ValueError as e:
            refusals.append(str(e))
    return got, refusals


def t_gloo_ring():
    cases = [(1, 4, 2, 37, 8, causal, layout) for causal in (False, True)
             for layout in ring.LAYOUTS] + [(1, 2, 1, 3, 8, True, "zigzag")]
    for P in (2, 3):
        for rank, (got, refusals) in enumerate(gloo_ranks(P, gloo_ring, cases)):
            for case, errs in zip(cases, got):
                assert max(errs) < 1e-10, f"P {P} rank {rank} {case}: " + \
                    ", ".join(f"{n} {e:.2e}" for n, e in zip(NAMES, errs))
            longer, causal = refusals
            assert RING in longer and "not the zigzag split" in longer and \
                "zigzag_split" in longer, longer
            assert RING in causal and ("causal 1 vs 0" in causal or "causal 0 vs 1" in causal), \
                causal


def load_example(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def example_gradients(rank, P, group, layout):
    """On each rank: train_gpt_cp.py's loss (rank_loss) and gradients (each rank's backward,
    then sum_over_ranks) of a tiny GPT (GQA 4/2, N 37) in float64, its attention
    (ring_sdpa's ring_attention) the ring over gloo with float64 steps; and one process's on the
    whole sequence. Returns the largest differences: (loss, every weight's gradient)."""
    cp = load_example("train_gpt_cp", TRAIN_GPT_CP)
    gpt = cp.train_gpt

    def cpu_ring(q, k, v, *, causal, group, layout, stage, backward_stage):
        scale = 1 / math.sqrt(q.shape[-1])
        sizes = ring.checked_sizes(q, k, group, P, rank, layout, causal)
        rg = ring.Ring(rank, P, sizes, layout, causal, ring._Exchange(group, P, rank),
                       attend64(scale), attend_backward64(scale))
        return ring.ring_function().apply(q, k, v, rg)

    cp.flashcourse.ring_attention = cpu_ring  # (this forked process's own module)
    B, N, vocab = 2, 37, 11
    args = argparse.Namespace(layout=layout, stage="auto", backward_stage="auto")

    def whole(q, k, v, is_causal=False, enable_gqa=False):
        return attend64(1 / math.sqrt(q.shape[-1]))(q, k, v, is_causal)[0]

    models = []
    for sdpa in (cp.ring_sdpa(args, group), whole):
        torch.manual_seed(0)
        models.append(gpt.GPT(vocab, N, 1, 4, 2, 8, sdpa, torch.float64).double())
    ring_model, one = models
    s = gpt.Setup.__new__(gpt.Setup)  # what Setup.loss reads: no autocast, on the CPU
    s.device, s.amp_dtype, s.amp, s.vocab = torch.device("cpu"), None, False, vocab
    g = torch.Generator().manual_seed(1)
    x, y = (torch.randint(0, vocab, (B, N), generator=g) for _ in range(2))
    split = functools.partial(flashcourse.zigzag_split, P=P, rank=rank, layout=layout)
    loss = cp.rank_loss(s, ring_model, x, y, split, split(torch.arange(N), dim=0))
    loss.backward()
    cp.sum_over_ranks(group)(ring_model)
    total = loss.detach().clone()
    torch.distributed.all_reduce(total, group=group)
    loss1 = s.loss(one, x, y)  # (the cross-entropy in float32, as the example's)
    loss1.backward()
    grads = [float((a.grad - b.grad).abs().max())
             for a, b in zip(ring_model.parameters(), one.parameters())]
    return float((total - loss1.detach()).abs()), max(grads), cp.same_weights(ring_model, group)


def t_example_gradients():
    for P in (2, 3):
        for layout in ring.LAYOUTS:
            for rank, (dl, dg, same) in enumerate(gloo_ranks(P, example_gradients, layout)):
                assert dl < 1e-5 and dg < 1e-12 and same, (P, layout, rank, dl, dg, same)


# ---- ring_attention's arguments (no GPU needed for these) ----

def t_signature():
    import inspect
    params = inspect.signature(flashcourse.ring_attention).parameters
    assert list(params)[:3] == ["q", "k", "v"], list(params)
    kw = {n: p.default for n, p in params.items() if p.kind == p.KEYWORD_ONLY}
    assert kw == {"causal": False, "scale": None, "group": None, "layout": "zigzag",
                  "stage": "auto", "backward_stage": "auto"}, kw
    for name in ("ring_attention", "ring_sizes", "zigzag_split", "zigzag_gather"):
        assert name in flashcourse.__all__, name
        assert f"{name}(" in flashcourse.__doc__, name


def t_refused():
    need_torch()
    x = torch.zeros(1, 2, 4, 8, dtype=torch.float16)
    raises(TypeError, flashcourse.ring_attention, x, x, x, group="world",
           match=[RING, "process group"])
    raises(ValueError, flashcourse.ring_attention, x, x, x, layout="striped",
           match=[RING, "'zigzag'", "'contiguous'"])
    raises(TypeError, flashcourse.ring_attention, x, x, x, causal="yes", match=[RING, "causal"])
    raises(TypeError, flashcourse.ring_attention, x, x, x, match=[RING, "CUDA"])
    raises(TypeError, flashcourse.ring_attention, [1], x, x, match=[RING, "torch tensors"])


# ---- train_gpt_cp.py's command line (no GPU needed) ----

def cp_script(args, hide_torch=False):
    code = "import runpy, sys; sys.argv = sys.argv[1:]; "
    if hide_torch:
        code += "sys.modules['torch'] = None; "
    code += "runpy.run_path(sys.argv[0], run_name='__main__')"
    r = subprocess.run([sys.executable, "-c", code, str(TRAIN_GPT_CP)] + args,
                       capture_output=True, text=True, timeout=120,
                       env={k: v for k, v in os.environ.items()
                            if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")})
    return r.returncode, r.stdout, r.stderr


def t_example_options():
    rc, out, err = cp_script(["--help"], hide_torch=True)
    assert rc == 0 and out.startswith("usage:"), (rc, out[:300], err)
    said = " ".join(out.split())
    for words in ("--layout {zigzag,contiguous}", "--compare", "torchrun", "--kv-heads H_KV",
                  "--dtype {f16,bf16}", "--steps STEPS"):
        assert words in said, f"--help does not say {words!r}"
    for args, want in ((["--layout", "striped"], "argument --layout: invalid choice"),
                       (["--kv-heads", "3"], "--kv-heads must divide --heads"),
                       (["--steps", "5"], "--steps must be at least 10"),
                       (["--seq", "1"], "--seq must be at least 2")):
        rc, out, err = cp_script(args, hide_torch=True)
        assert rc == 2 and err.startswith("usage:") and want in err, (args, rc, err)
        assert not out, (args, out)
    rc, out, err = cp_script(["--compare"], hide_torch=True)
    lines = err.splitlines()
    assert rc == 2 and len(lines) == 1 and "needs PyTorch" in lines[0], (rc, out, err)
    # the options as parsed: train_gpt.py's, with this example's defaults and its own
    saved_torch, saved_argv = sys.modules.get("torch", False), sys.argv
    sys.modules["torch"] = None  # (the options need no PyTorch; nor does this test's import)
    try:
        mod = load_example("train_gpt_cp", TRAIN_GPT_CP)
        sys.argv = ["train_gpt_cp.py", "--layout", "contiguous", "--compare", "--kv-heads", "2"]
        a = mod.parse_args()
        assert (a.layout, a.compare, a.kv_heads) == ("contiguous", True, 2), a
        for key, value in mod.CP_DEFAULTS.items():
            if key != "width":
                assert getattr(a, key) == value, (key, getattr(a, key), value)
        sys.argv = ["train_gpt_cp.py", "--seq", "999", "--steps", "12"]
        a = mod.parse_args()
        assert (a.layout, a.compare, a.seq, a.steps) == ("zigzag", False, 999, 12), a
    finally:
        sys.argv = saved_argv
        if saved_torch is False:
            del sys.modules["torch"]
        else:
            sys.modules["torch"] = saved_torch
    if torch is not None and not HAVE_GPU:
        rc, out, err = cp_script(["--steps", "10"])
        lines = err.splitlines()
        assert rc == 2 and len(lines) == 1 and "needs a CUDA GPU" in lines[0], (rc, out, err)


def cpu_tests():
    run("ring_sizes: every token once, the chunk sizes, rank r's chunks r and 2P-1-r (P 1..4, "
        "N 1..1000, both layouts)", t_sizes)
    run("ring_sizes: bad N, P, layout refused naming it", t_sizes_refused)
    run("ring_block: the steps cover each rank's causal (or full) mask exactly once",
        t_schedule_covers_the_mask)
    run("causal work per rank: zigzag balanced, the contiguous ring not", t_zigzag_balances)
    run("zigzag_split / zigzag_gather: round trips (P 1..4, N 1..1000, both layouts), refusals",
        t_round_trip)
    run("merge: two halves of the keys make the whole; rows without keys stay 0, -inf",
        t_merge)
    run("ring_forward / ring_backward on simulated ranks (threads), float64 steps: o, lse, dq, "
        "dk, dv as attention on the whole sequence (P 1..4, both layouts, causal and not, GQA "
        "4/2, N 37, 64, 3, 1)", t_simulated_ring)
    run("the check can fail: a causal mask at s > r, the wrong chunk at s < r, a step left out",
        t_check_can_fail)
    run("over gloo, P = 2 and 3 processes: the exchange, the autograd.Function, the first "
        "call's check refusing a slice of the wrong length and a differing causal on every "
        "rank", t_gloo_ring)
    run("train_gpt_cp.py over gloo, P = 2 and 3, both layouts: a tiny GPT's loss and weight "
        "gradients (its slices, global positions, the sum over the ranks) equal one process's, "
        "float64", t_example_gradients)
    run("ring_attention: keyword-only arguments, exported, in the package's docstring",
        t_signature)
    run("ring_attention: a bad group, layout, causal, CPU tensors: one line naming it",
        t_refused)
    run("train_gpt_cp.py: --help, bad options (exit 2), no PyTorch (one line), the options "
        "parsed, no GPU (one line)", t_example_options)


# ---- on GPUs: --gpu and --bench (under torchrun, or one GPU alone) ----

def start_ranks():
    """(P, rank, group) of this process: torchrun's (NCCL, this rank's GPU set), or (1, 0, None)
    alone: the ring of one."""
    if "WORLD_SIZE" not in os.environ:
        return 1, 0, None
    dist = torch.distributed
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl", timeout=timedelta(seconds=10 * TIMEOUT))
    return dist.get_world_size(), dist.get_rank(), dist.group.WORLD


def gather_rows(x, P, group, layout):
    """The whole tensor on every rank from each rank's slice along dim 2 (slices of different
    lengths padded to the longest for all_gather)."""
    if P == 1:
        return x
    dist = torch.distributed
    n = torch.tensor([x.shape[2]], device=x.device)
    every = [torch.empty_like(n) for _ in range(P)]
    dist.all_gather(every, n, group=group)
    lengths = [int(e) for e in every]
    padded = torch.zeros(*x.shape[:2], max(lengths), *x.shape[3:], dtype=x.dtype,
                         device=x.device)
    padded[:, :, :x.shape[2]] = x
    parts = [torch.empty_like(padded) for _ in range(P)]
    dist.all_gather(parts, padded.contiguous(), group=group)
    return flashcourse.zigzag_gather([p[:, :, :m] for p, m in zip(parts, lengths)], 2, layout)


GPU_CASES = [(B, 8, 2, N, 128) for B, N in ((2, 1000), (1, 4096 + 7))]
SIMULATED = (2, 3)  # rings simulated on one GPU where there is no other (P = 1)
BENCH_SHAPE = (1, 32, 8, 128)  # --bench's B, H, H_kv, D (bf16, causal): the lesson's efficiency shape


def gpu_case(P, rank, group, B, H, H_kv, N, D, dtype, causal, layout, simulated=0):
    """One shape on every rank (ring_attention over the group), or with simulated = P' > 0 on
    this GPU alone: P' ranks simulated by threads (ThreadRing), each step flashcourse.attention
    or attention_backward. Returns rank 0's lines (the errors and bounds) and whether it passed
    (rank 0's answer; True elsewhere)."""
    dist = torch.distributed
    q, k, v, do = inputs(B, H, H_kv, N, D, seed=N, dtype=dtype, device="cuda")
    if simulated:
        def attend(q, k, v, causal):
            return flashcourse.attention(q, k, v, causal=causal)

        def attend_backward(q, k, v, o, lse, do, causal):
            return flashcourse.attention_backward(q, k, v, o, lse, do, causal=causal)

        got = simulate(q, k, v, do, simulated, causal, layout, 1 / math.sqrt(D), attend,
                       attend_backward)[0]
    else:
        if P > 1:  # rank 0's tensors, everywhere
            for t in (q, k, v, do):
                dist.broadcast(t, 0, group=group)
        mine = [flashcourse.zigzag_split(t, P, rank, 2, layout).requires_grad_(i < 3)
                for i, t in enumerate((q, k, v, do))]
        o, lse = flashcourse.ring_attention(*mine[:3], causal=causal, layout=layout,
                                            group=group)
        o.backward(mine[3])
        got = [gather_rows(t, P, group, layout) for t in (o.detach(), lse, mine[0].grad,
                                                          mine[1].grad, mine[2].grad)]
    if rank != 0:
        return [], True
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    o1, lse1 = flashcourse.attention(*leaves, causal=causal)
    o1.backward(do)
    single = [o1.detach(), lse1] + [t.grad for t in leaves]
    want = reference64(q, k, v, do, causal, 1 / math.sqrt(D))
    eps = torch.finfo(dtype).eps
    lines, ok = [], True
    for name, a, b, w in zip(NAMES, got, single, want):
        scale = None if name == "lse" else \
            w.abs().amax(-1, keepdim=True).clamp_min(float(w.abs().mean()))
        diff, own = row_error(a, b, scale), row_error(b, w, scale)
        bound = 2 * own + (LSE_FLOOR if name == "lse" else FLOOR_ULPS * eps)
        good = diff <= bound and bool(torch.isfinite(a).all())
        ok &= good
        how = "absolute" if scale is None else \
            f"max |ring - single| {row_error(a, b, None):.2e}; relative to the row"
        lines.append(f"{name}: {how}: ring-single {diff:.2e}, single-float64 {own:.2e}, bound "
                     f"{bound:.2e}{'' if good else '  <-- over'}")
    return lines, ok


def row_error(a, want, scale):
    """The largest |a - want| (in float64), each divided by its row's scale (a row: the last
    dimension; its largest |want|, at least the tensor's mean |want|: a row of zeros, such as a
    causal dq's first, counts in the tensor's units); scale None: absolute (the LSE's)."""
    err = (a.double() - want.double()).abs()
    return float((err if scale is None else err / scale).max()) if err.numel() else 0.0


def gpu_tests(P, rank, group):
    def ring_case(B, H, H_kv, N, D, dtype, causal, layout, simulated=0):
        lines, ok = gpu_case(P, rank, group, B, H, H_kv, N, D, dtype, causal, layout, simulated)
        for line in lines:
            print(f"      {line}")
        assert ok, "over the bound"

    def no_gpu():
        need_gpu()
        try:
            built = {st.name for st in flashcourse.stages()}
            want = {flashcourse.auto_stage(), flashcourse.auto_backward_stage()}
        except (flashcourse.LibraryNotBuiltError, ImportError, RuntimeError) as e:
            raise Skip(f"no flashcourse libraries here (make lib): {e}")
        if not want <= built:
            raise Skip(f"{', '.join(sorted(want - built))} not built here (make lib)")

    run(f"GPU: {torch.cuda.get_device_name() if HAVE_GPU else 'none'}, P = {P}", no_gpu)
    if results["skipped"]:
        return
    for B, H, H_kv, N, D in GPU_CASES:
        for dtype in (torch.float16, torch.bfloat16):
            for causal in (False, True):
                for layout in ring.LAYOUTS:
                    what = (f"B {B} H {H}/{H_kv} N {N} D {D} {str(dtype)[6:]} "
                            f"{'causal' if causal else 'full'} {layout}: o, lse, dq, dk, dv vs "
                            "one GPU's")
                    run(f"P {P}: {what}", ring_case, B, H, H_kv, N, D, dtype, causal, layout)
                    for sim in SIMULATED if P == 1 else ():
                        run(f"P {sim} simulated on this GPU (threads): {what}", ring_case, B, H,
                            H_kv, N, D, dtype, causal, layout, sim)

    def refused_dtype():
        x = torch.zeros(1, 2, 4, 8, device="cuda")
        raises(TypeError, flashcourse.ring_attention, x, x, x, group=group,
               match=[RING, "float16 or bfloat16"])
        y = torch.zeros(1, 2, 5, 8, device="cuda", dtype=torch.float16)
        raises(ValueError, flashcourse.ring_attention, y, y[:, :, :4], y[:, :, :4], group=group,
               match=[RING, "as many rows"])
    run("ring_attention: float32, k of another length refused naming it", refused_dtype)


def bench(P, rank, group, seqs, layout, repeats):
    """The ring's forward and forward+backward per call, and one GPU's on the whole sequence
    (rank 0), at B = 1, H = 32, H_kv = 8, D = 128, bf16, causal: median wall time between
    synchronisations (the slowest rank's), the efficiency T1 / (P * T_P)."""
    dist = torch.distributed
    B, H, H_kv, D = BENCH_SHAPE
    dtype = torch.bfloat16
    say = print if rank == 0 else (lambda *a: None)
    say(f"ring_attention bench on {torch.cuda.get_device_name()} x {P} (P = {P}), {layout}, "
        f"B {B} H {H}/{H_kv} D {D} bf16 causal; median of {repeats} calls after one warm-up")
    say(f"{'N':>8s} {'fwd T1 ms':>10s} {'fwd TP ms':>10s} {'fwd eff':>8s} {'f+b T1 ms':>10s} "
        f"{'f+b TP ms':>10s} {'f+b eff':>8s}")

    def timed(fn, everyone):
        times = []
        for i in range(repeats + 1):
            if everyone and P > 1:
                dist.barrier(group=group)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            dt = torch.tensor([time.perf_counter() - t0], device="cuda")
            if everyone and P > 1:
                dist.all_reduce(dt, op=dist.ReduceOp.MAX, group=group)
            if i:
                times.append(float(dt))
        return sorted(times)[len(times) // 2] * 1e3

    for N in seqs:
        n = ring._slice_lengths(ring.ring_sizes(N, P, layout))[rank]
        g = torch.Generator(device="cuda").manual_seed(rank)
        q, k, v, do = (torch.randn(B, h, n, D, device="cuda", dtype=dtype, generator=g)
                       for h in (H, H_kv, H_kv, H))
        leaves = [t.requires_grad_(True) for t in (q, k, v)]

        def fwd():
            with torch.no_grad():
                flashcourse.ring_attention(q, k, v, causal=True, layout=layout, group=group)

        def fwd_bwd():
            for t in leaves:  # (no accumulation into the last call's gradients)
                t.grad = None
            o, _ = flashcourse.ring_attention(*leaves, causal=True, layout=layout, group=group)
            o.backward(do)

        tp = (timed(fwd, True), timed(fwd_bwd, True))
        del q, k, v, do, leaves
        t1 = (float("nan"), float("nan"))
        if rank == 0:
            q, k, v, do = (torch.randn(B, h, N, D, device="cuda", dtype=dtype)
                           for h in (H, H_kv, H_kv, H))
            leaves = [t.requires_grad_(True) for t in (q, k, v)]

            def fwd1():
                with torch.no_grad():
                    flashcourse.attention(q, k, v, causal=True)

            def fwd_bwd1():
                for t in leaves:
                    t.grad = None
                o, _ = flashcourse.attention(*leaves, causal=True)
                o.backward(do)

            t1 = (timed(fwd1, False), timed(fwd_bwd1, False))
            del q, k, v, do, leaves
        if P > 1:
            dist.barrier(group=group)
        torch.cuda.empty_cache()
        say(f"{N:8d} {t1[0]:10.2f} {tp[0]:10.2f} {t1[0] / (P * tp[0]):8.2f} {t1[1]:10.2f} "
            f"{tp[1]:10.2f} {t1[1] / (P * tp[1]):8.2f}")


def gpu_main(args):
    if torch is None or not HAVE_GPU:
        print(f"SKIP  ring_attention on GPUs: {'no PyTorch' if torch is None else 'no CUDA GPU'}"
              " here")
        print("0 passed, 0 failed, 1 skipped")
        return 0
    P, rank, group = start_ranks()
    captured = None
    if rank != 0:  # one rank speaks; another's failures come out on stderr at the end
        import io
        captured = sys.stdout = io.StringIO()
    try:
        if args.bench:
            bench(P, rank, group, args.seqs, args.layout, args.repeats)
            return 0
        print(f"ring_attention tests on {P} rank{'s' * (P > 1)}: libraries in "
              f"{flashcourse.library_dir()}, torch {torch.__version__}")
        gpu_tests(P, rank, group)
        status = summary()
        if captured is not None and results["failed"]:
            print(f"rank {rank}:\n{captured.getvalue()}", file=sys.stderr)
        return status
    finally:
        if group is not None:
            torch.distributed.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description="flashcourse.ring_attention's tests (CPU by "
                                             "default; --gpu and --bench under torchrun)")
    ap.add_argument("--gpu", action="store_true", help="the GPU tests, P = torchrun's ranks")
    ap.add_argument("--bench", action="store_true", help="time the ring against one GPU")
    ap.add_argument("--layout", choices=ring.LAYOUTS, default="zigzag", help="--bench's layout")
    ap.add_argument("--seqs", type=int, nargs="+", default=[16384, 65536, 131072],
                    help="--bench's sequence lengths")
    ap.add_argument("--repeats", type=int, default=5, help="--bench's timed calls per point")
    args = ap.parse_args()
    if args.gpu or args.bench:
        return gpu_main(args)
    print(f"ring_attention tests (CPU): torch "
          f"{torch.__version__ if torch is not None else 'absent'}")
    cpu_tests()
    return summary()


if __name__ == "__main__":
    sys.exit(main())
