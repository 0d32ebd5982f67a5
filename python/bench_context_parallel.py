#!/usr/bin/env python3
"""PyTorch's own context parallelism, timed: the anchor stage 10's ring is measured against.

    torchrun --nproc_per_node=2 python/bench_context_parallel.py --seq 65536 131072 [--heads 32]

On every rank, the whole q, k, v and dO [B, H, N, D] are made from one seed; inside
torch.distributed.tensor.experimental.context_parallel (their sequence dimension sharded over the
ranks, causal load-balanced as PyTorch does it), F.scaled_dot_product_attention runs its ring over
NCCL with the default backend inside (cuDNN on Hopper). Timed: forward, and forward + backward,
between torch.cuda.synchronize() and a barrier, median of repeats; beside it, the same SDPA on the
whole sequence on one GPU (rank 0, the other ranks waiting), so efficiency = T_1 / (P T_P) as stage
10's program prints it. Where flashcourse.ring_attention is importable, the course's ring through
PyTorch is timed the same way on the same shards. One line per shape and path; the device and
the world size first. K and V have H heads here (context_parallel's SDPA takes no enable_gqa).

    torchrun --nproc_per_node=2 python/bench_context_parallel.py --per-call   # or plain python3

--per-call: what one call of flashcourse.ring_attention costs the host, beside SDPA's on this
rank's slice alone (no ring): --calls back-to-back calls at a tiny shape (B = 1, H = 1, 256
tokens a rank, D = 64, causal) between two synchronizations, per call, the median of runs taken
in turns; forward (no gradient) and forward + backward. Under plain python3: the ring of one.
"""

import argparse
import os
import statistics
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq", type=int, nargs="+", default=[65536, 131072])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-causal", action="store_true")
    ap.add_argument("--per-call", action="store_true", help="a call's host cost (tiny shape)")
    ap.add_argument("--calls", type=int, default=200, help="calls per timed run (--per-call)")
    args = ap.parse_args()
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel

    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__))))
    if args.per_call and "RANK" not in os.environ:
        return per_call(args, 0, 1)
    dist.init_process_group("nccl")
    if args.per_call:
        rc = per_call(args, rank, world)
        dist.destroy_process_group()
        return rc
    mesh = init_device_mesh("cuda", (world,))
    causal = not args.no_causal
    try:
        import flashcourse
        ring = getattr(flashcourse, "ring_attention", None)
    except ImportError:
        ring = None
    if rank == 0:
        print(f"{world} x {torch.cuda.get_device_name()}, torch {torch.__version__}, "
              f"B={args.batch} H={args.heads} D={args.dim} bf16 {'causal' if causal else ''}",
              flush=True)

    def timed(fn, reps):
        return timed_runs(fn, reps, barrier=dist.barrier)

    for N in args.seq:
        g = torch.Generator(device="cuda").manual_seed(N)
        shape = (args.batch, args.heads, N, args.dim)
        q, k, v, do = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=g)
                       for _ in range(4))
        one = {}
        if rank == 0:  # one GPU, the whole sequence
            qs, ks, vs = (t.clone().requires_grad_() for t in (q, k, v))

            def fwd1():
                with torch.no_grad():
                    F.scaled_dot_product_attention(qs, ks, vs, is_causal=causal)

            def fb1():
                F.scaled_dot_product_attention(qs, ks, vs, is_causal=causal).backward(do)

            one = {"fwd": timed_runs(fwd1, args.repeats), "fwd+bwd": timed_runs(fb1, args.repeats)}
            del qs, ks, vs
        dist.barrier()
        qc, kc, vc, dc = (t.clone() for t in (q, k, v, do))
        res = {}
        # the buffers are sharded in place on entry (resized: they cannot require grad yet)
        with context_parallel(mesh, buffers=[qc, kc, vc, dc], buffer_seq_dims=[2, 2, 2, 2]):
            # leaves of their own over the shards (the buffers are resized back on exit)
            qc, kc, vc = (t.detach().requires_grad_() for t in (qc, kc, vc))

            def fwd():
                with torch.no_grad():
                    F.scaled_dot_product_attention(qc, kc, vc, is_causal=causal)

            def fb():
                F.scaled_dot_product_attention(qc, kc, vc, is_causal=causal).backward(dc)

            res["torch"] = {"fwd": timed(fwd, args.repeats), "fwd+bwd": timed(fb, args.repeats)}
        if ring is not None and hasattr(flashcourse, "zigzag_split"):
            parts = [flashcourse.zigzag_split(t, world, rank, 2) for t in (q, k, v, do)]
            qr, kr, vr, dr = parts
            for t in (qr, kr, vr):
                t.requires_grad_()

            def rfwd():
                with torch.no_grad():
                    ring(qr, kr, vr, causal=causal)

            def rfb():
                ring(qr, kr, vr, causal=causal)[0].backward(dr)

            try:
                res["flashcourse.ring_attention"] = {"fwd": timed(rfwd, args.repeats),
                                                     "fwd+bwd": timed(rfb, args.repeats)}
            except (flashcourse.LibraryNotBuiltError, OSError) as e:
                if rank == 0:
                    print(f"flashcourse.ring_attention not timed: {e}", flush=True)
        if rank == 0:
            for name, t in res.items():
                line = [f"N={N} {name} on {world} GPUs:"]
                for p in ("fwd", "fwd+bwd"):
                    eff = one[p] / (world * t[p]) if one else float("nan")
                    line.append(f"{p} {1e3 * t[p]:.2f} ms (1 GPU SDPA {1e3 * one[p]:.2f}, "
                                f"efficiency {eff:.3f})")
                print(" ".join(line), flush=True)
        del q, k, v, do, qc, kc, vc, dc
        torch.cuda.empty_cache()
    dist.destroy_process_group()
    return 0


def timed_runs(fn, reps, barrier=None, warm=True):
    """Median seconds of fn over reps runs after a warm-up (warm=False: none, the caller's), each
    between synchronizations (and, given a barrier, every rank's: the slowest rank's time)."""
    import torch
    if warm:
        fn()
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        if barrier:
            barrier()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        if barrier:
            barrier()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def per_call(args, rank: int, world: int) -> int:
    """us per call of ring_attention and of SDPA on the rank's slice, forward and fwd+bwd."""
    import torch
    import torch.nn.functional as F
    import flashcourse
    n = 256  # tokens a rank
    shape = (1, 1, n, 64)
    g = torch.Generator(device="cuda").manual_seed(rank)
    q, k, v, do = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=g)
                   for _ in range(4))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    calls = {
        "flashcourse.ring_attention": (
            lambda: flashcourse.ring_attention(q, k, v, causal=True),
            lambda: flashcourse.ring_attention(q, k, v, causal=True)[0].backward(do)),
        "SDPA (this rank's slice)": (
            lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
            lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(do)),
    }
    us = {name: {"fwd": [], "fwd+bwd": []} for name in calls}

    def run(fn, grad):
        with torch.enable_grad() if grad else torch.no_grad():
            for _ in range(args.calls):
                fn()

    for f, fb in calls.values():  # warm-up
        run(f, False)
        run(fb, True)
    for _ in range(max(args.repeats, 5)):  # the rows' runs in turns
        for name, (f, fb) in calls.items():
            for mode, fn, grad in (("fwd", f, False), ("fwd+bwd", fb, True)):
                t = timed_runs(lambda: run(fn, grad), 1, warm=False)  # warmed up above
                us[name][mode].append(1e6 * t / args.calls)
    if rank == 0:
        print(f"{world} x {torch.cuda.get_device_name()}, torch {torch.__version__}: us per call, "
              f"B=1 H=1 {n} tokens a rank D=64 bf16 causal, {args.calls} calls, median", flush=True)
        for name, m in us.items():
            print(f"{name:34s} fwd {statistics.median(m['fwd']):8.1f}   "
                  f"fwd+bwd {statistics.median(m['fwd+bwd']):8.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
