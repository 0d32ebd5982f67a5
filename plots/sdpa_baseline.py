#!/usr/bin/env python3
"""sdpa_baseline.py: PyTorch scaled_dot_product_attention on the sweeps' shapes, as CSV rows.

    python3 plots/sdpa_baseline.py OUT_CSV [--budget S] [--quick] [--dry-run]

Appends to OUT_CSV (the sweep's CSV; its header decides the column order; a new file gets
common/csv_header.h's columns and `sweep`) one row per shape and pass for
  sdpa_flash          sdpa_kernel(SDPBackend.FLASH_ATTENTION): FlashAttention-2 (sm_80 on)
  sdpa_mem_efficient  sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION): the memory-efficient kernel,
                      which runs on every GPU (PyTorch's default on a T4)
  sdpa_default        no backend forced: what PyTorch picks (cuDNN on Hopper, often)
with variant `default`, dtype f16, the error columns empty (nothing is checked here), pass `fwd`
(the forward alone) and `bwd` (the gradients of q, k, v alone, the forward's graph kept from an
untimed call; TFLOP/s counted as 2.5x the forward's FLOPs, as the stage programs count them).
--backends and --passes choose a subset (default: all of both).
Shapes, budget logic and timing follow the stage programs: the long sweep (B = H = 1, D = 128,
N = 1k ... 256k) and the fa2 sweep (B x N = 16,384, H = 2048 / D, D in {64, 128}, causal 0/1);
CUDA events around each call, the L2 flushed (256 MB written) before each, a warm-up, the median
of at least 10 calls and 0.5 s (3 calls when one takes over a second). A climb stops at an
out-of-memory or when the next call is predicted to take longer than the budget.
--dry-run lists the runs without touching torch.
"""

import argparse
import gc
import os
import re
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import measure  # noqa: E402  (the FLOP count and the timing protocol: one home)


def read_csv_header(path=os.path.join(HERE, "..", "common", "csv_header.h")):
    """The program's columns from their one home, common/csv_header.h (#define CSV_HEADER "...")."""
    with open(path) as f:
        m = re.search(r'^#define CSV_HEADER "([^"]*)"$', f.read(), re.M)
    if not m:
        raise SystemExit(f"sdpa_baseline.py: no CSV_HEADER in {path}")
    return m.group(1).split(",")


# The program's columns, then `sweep` (plots/sweep.sh writes the same header).
HEADER = read_csv_header() + ["sweep"]


def read_shapes(path=os.path.join(HERE, "shapes.conf")):
    """The sweeps' N lists from plots/shapes.conf (NAME=\"n n n\" lines), shared with sweep.sh."""
    out = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line and not line.startswith("#") and "=" in line:
                name, value = line.split("=", 1)
                out[name.strip()] = [int(n) for n in value.strip().strip('"').split()]
    return out


SHAPES = read_shapes()
LONG_N = SHAPES["LONG_N"]
FA2_N = SHAPES["FA2_N"]


def series(quick):
    """The sweeps as (sweep, D, causal, [(B, H, N), ...]) climbs, in the sweep script's order."""
    long_n = SHAPES["QUICK_LONG_N"] if quick else LONG_N
    fa2_n = SHAPES["QUICK_FA2_N"] if quick else FA2_N
    out = [("long", 128, 0, [(1, 1, n) for n in long_n])]
    for d in (64, 128):
        for causal in (0, 1):
            out.append(("fa2", d, causal, [(16384 // n, 2048 // d, n) for n in fa2_n]))
    return out


def csv_header(path):
    """The existing file's columns (so added columns stay aligned), or None for a new file."""
    if not os.path.exists(path) or os.path.getsize(path) == 0:
        return None
    with open(path) as f:
        first = f.readline().strip()
    return first.split(",") if first else None


BACKENDS = ("sdpa_flash", "sdpa_mem_efficient", "sdpa_default")
PASSES = ("fwd", "bwd")


class Runner:
    def __init__(self, torch, budget_s):
        self.torch = torch
        self.budget_ms = budget_s * 1000.0
        self.timer = measure.EventTimer(torch)
        from torch.nn.functional import scaled_dot_product_attention as sdpa
        self.sdpa = sdpa
        try:
            from torch.nn.attention import SDPBackend, sdpa_kernel

            self.contexts = {
                "sdpa_flash": lambda: sdpa_kernel(SDPBackend.FLASH_ATTENTION),
                "sdpa_mem_efficient": lambda: sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION),
            }
        except ImportError:  # torch < 2.3
            self.contexts = {
                "sdpa_flash": lambda: torch.backends.cuda.sdp_kernel(
                    enable_flash=True, enable_math=False, enable_mem_efficient=False),
                "sdpa_mem_efficient": lambda: torch.backends.cuda.sdp_kernel(
                    enable_flash=False, enable_math=False, enable_mem_efficient=True),
            }

    def measure(self, backend, pass_, b, h, n, d, causal):
        """Returns (status, ms_median, ms_min, repeats, device_mb)."""
        torch = self.torch
        q = k = v = o = do = None
        try:
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            gen = torch.Generator(device="cuda").manual_seed(0)
            q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.float16, generator=gen,
                                   requires_grad=pass_ == "bwd") for _ in range(3))
            ctx = self.contexts.get(backend)

            def forward():
                if ctx is None:
                    return self.sdpa(q, k, v, is_causal=bool(causal))
                with ctx():
                    return self.sdpa(q, k, v, is_causal=bool(causal))

            if pass_ == "bwd":  # the forward once, untimed; then its gradients, timed
                o = forward()
                do = torch.randn(o.shape, device="cuda", dtype=o.dtype, generator=gen)

                def run():
                    if ctx is None:
                        torch.autograd.grad(o, (q, k, v), do, retain_graph=True)
                    else:
                        with ctx():
                            torch.autograd.grad(o, (q, k, v), do, retain_graph=True)
            else:
                run = forward

            warm = self.timer.once(run)  # warm-up: kernel selection, workspace, first-touch
            mb = (torch.cuda.max_memory_allocated() - base) / 2**20
            if warm > self.budget_ms:
                return "over_budget", warm, warm, 1, mb
            first = self.timer.once(run)
            if first > self.budget_ms:
                return "over_budget", first, first, 1, mb
            times = self.timer.repeat(run, first)
            return "ok", measure.median(times), min(times), len(times), mb
        except torch.cuda.OutOfMemoryError:
            return "OOM", None, None, 0, None
        except RuntimeError as e:  # e.g. "No available kernel" for this backend and shape
            print(f"sdpa_baseline.py: {backend} B={b} H={h} N={n} D={d} causal={causal}: "
                  f"{str(e).splitlines()[0] if str(e) else type(e).__name__}", file=sys.stderr)
            return "unsupported", None, None, 0, None
        finally:
            del q, k, v, o, do
            torch.cuda.synchronize()
            torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_csv")
    ap.add_argument("--budget", type=float, default=60.0, help="seconds one call may take")
    ap.add_argument("--quick", action="store_true", help="the quick sweep's shapes (plots/shapes.conf)")
    ap.add_argument("--dry-run", action="store_true", help="list the runs, touch nothing")
    ap.add_argument("--backends", default=",".join(BACKENDS),
                    help=f"comma-separated subset of {','.join(BACKENDS)}")
    ap.add_argument("--passes", default=",".join(PASSES),
                    help=f"comma-separated subset of {','.join(PASSES)}")
    args = ap.parse_args()
    if args.budget <= 0:
        ap.error("--budget must be a positive number of seconds")
    backends = tuple(x for x in args.backends.split(",") if x)
    passes = tuple(x for x in args.passes.split(",") if x)
    for x in backends:
        if x not in BACKENDS:
            ap.error(f"--backends: unknown backend '{x}' (backends: {', '.join(BACKENDS)})")
    for x in passes:
        if x not in PASSES:
            ap.error(f"--passes: unknown pass '{x}' (passes: {', '.join(PASSES)})")
    if not backends or not passes:
        ap.error("--backends and --passes need at least one name each")

    plan = series(args.quick)
    runs = [(be, pa) for be in backends for pa in passes]
    total = len(runs) * sum(len(s[3]) for s in plan)
    if args.dry_run:
        for backend, pass_ in runs:
            for sweep, d, causal, shapes in plan:
                for b, h, n in shapes:
                    print(f"{backend} {pass_} {sweep} B={b} H={h} N={n} D={d} causal={causal}")
        return 0

    try:
        import torch
    except ImportError:
        print("sdpa_baseline.py: python3 has no torch; no SDPA rows written", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("sdpa_baseline.py: torch sees no CUDA device; no SDPA rows written", file=sys.stderr)
        return 2

    gpu = torch.cuda.get_device_name()
    cols = csv_header(args.out_csv)
    new_file = cols is None
    if new_file:
        cols = HEADER
    runner = Runner(torch, args.budget)
    width = len(str(total))
    i = 0
    t0 = time.time()
    with open(args.out_csv, "a") as out:
        if new_file:
            out.write(",".join(cols) + "\n")
        for backend, pass_ in runs:
            for sweep, d, causal, shapes in plan:
                stop, stop_note = None, ""
                last_ms = last_work = None
                for b, h, n in shapes:
                    i += 1
                    work = float(b) * h * n * n * d
                    note = ""
                    if stop is None and last_ms is not None:
                        pred = last_ms * work / last_work
                        if pred > runner.budget_ms:
                            stop = "over_budget"
                            stop_note = (f"predicted {pred / 1000:.2f} s at N={n} > budget "
                                         f"{args.budget:g} s")
                    if stop is not None:
                        status, med, mn, reps, mb = stop, None, None, 0, None
                        note = "not run: " + stop_note
                    else:
                        status, med, mn, reps, mb = runner.measure(backend, pass_, b, h, n, d,
                                                                   causal)
                        if status == "ok":
                            last_ms, last_work = med, work
                        elif status == "OOM":
                            stop, stop_note = "OOM", f"out of memory at N={n}"
                            gc.collect()  # the exception's frames held the inputs
                            torch.cuda.empty_cache()
                        elif status == "over_budget":
                            stop, stop_note = "over_budget", f"N={n} took over {args.budget:g} s"
                    tf = measure.tflops(measure.flops(b, h, n, d, causal, pass_), med) if med else None
                    row = {
                        "gpu": gpu, "stage": backend, "variant": "default", "pass": pass_,
                        "B": b, "H": h,
                        "N": n, "D": d, "causal": causal, "dtype": "f16",
                        "ms_median": f"{med:.4f}" if med is not None else "",
                        "ms_min": f"{mn:.4f}" if mn is not None else "",
                        "repeats": reps, "tflops": f"{tf:.2f}" if tf is not None else "",
                        "rows_checked": 0, "device_mb": f"{mb:.1f}" if mb is not None else "",
                        "status": status, "sweep": sweep,
                    }
                    out.write(",".join(str(row.get(c, "")) for c in cols) + "\n")
                    out.flush()
                    t = (f"{med:10.3f} ms {tf:8.1f} TFLOP/s" if med is not None and tf is not None
                         else f"{'-':>10} ms {'-':>8} TFLOP/s")
                    print(f"[{i:{width}d}/{total}] {backend:<18} {pass_:<3} {sweep:<4} N={n:<6} D={d:<3} "
                          f"{'causal' if causal else '':<6} {t}  {status}"
                          f"{'  (' + note + ')' if note else ''}", file=sys.stderr, flush=True)
    print(f"sdpa_baseline.py: {total} rows appended to {args.out_csv} in {time.time() - t0:.0f} s",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
