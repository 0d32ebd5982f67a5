#!/usr/bin/env python3
"""Stage 5 against FlashAttention-2, side by side, in one run on one GPU.

For every shape, times PyTorch's FLASH_ATTENTION backend of scaled_dot_product_attention
(FlashAttention-2; inputs [B, H, N, D] fp16) with CUDA events, then runs the stage 5 program on
the same shape and reads its median time from the CSV row. Prints a table and the geometric
mean and minimum of FA2 time / stage 5 time over the fa2 shapes (> 1: stage 5 is faster).

Shapes: fa2 = B*N = 16384 tokens, H = 2048 / D, N in 1k..16k, D in {64, 128}, causal 0/1;
long = B = H = 1, N = 262144, D = 128.

usage: python3 stage5_tuned/compare_fa2.py [--binary build/stage5_tuned] [--quick] [--csv OUT]
"""
import argparse
import csv
import io
import math
import os
import subprocess
import sys

REPS = 20  # timed repetitions per FA2 shape (median); at least 10
WARMUP = 3


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    p.add_argument("--binary", default=os.path.join(here, "..", "build", "stage5_tuned"),
                   help="stage 5 program (default: build/stage5_tuned)")
    p.add_argument("--quick", action="store_true", help="N up to 4096 only (no long shape)")
    p.add_argument("--csv", metavar="OUT", help="also write the table as CSV to OUT")
    return p.parse_args()


def shapes(quick):
    """(kind, B, H, N, D, causal) in table order."""
    out = []
    for d in (64, 128):
        for causal in (0, 1):
            for n in (1024, 2048, 4096, 8192, 16384):
                if quick and n > 4096:
                    continue
                out.append(("fa2", 16384 // n, 2048 // d, n, d, causal))
    if not quick:
        out.append(("long", 1, 1, 262144, 128, 0))
    return out


def flops(b, h, n, d, causal):
    f = 4.0 * b * h * n * n * d
    return f / 2 if causal else f


def time_fa2(torch, sdpa_kernel, backend, b, h, n, d, causal):
    """Median milliseconds of one FA2 forward, L2 flushed before each repetition."""
    q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.float16) for _ in range(3))
    flush = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device="cuda")  # > any L2
    f = torch.nn.functional.scaled_dot_product_attention
    times = []
    with sdpa_kernel(backend):
        for _ in range(WARMUP):
            f(q, k, v, is_causal=bool(causal))
        for _ in range(REPS):
            flush.zero_()
            start = torch.cuda.Event(enable_timing=True)
            stop = torch.cuda.Event(enable_timing=True)
            start.record()
            f(q, k, v, is_causal=bool(causal))
            stop.record()
            stop.synchronize()
            times.append(start.elapsed_time(stop))
    del q, k, v, flush
    torch.cuda.empty_cache()
    times.sort()
    return times[len(times) // 2]


def run_stage5(binary, b, h, n, d, causal):
    """(ms_median or None, status) from the stage 5 program's CSV row."""
    cmd = [binary, "--batch", str(b), "--heads", str(h), "--seq", str(n), "--dim", str(d),
           "--bench", "--csv", "--check", "16"] + (["--causal"] if causal else [])
    res = subprocess.run(cmd, capture_output=True, text=True)
    rows = list(csv.DictReader(io.StringIO(res.stdout)))
    if not rows:
        msg = (res.stderr.strip().splitlines() or ["no output"])[-1]
        return None, "exit %d: %s" % (res.returncode, msg)
    row = rows[-1]
    status = row.get("status", "?")
    try:
        ms = float(row["ms_median"])
    except (KeyError, ValueError):
        ms = None
    return (ms if status == "ok" else None), status


def main():
    args = parse_args()
    try:
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel
        if not torch.cuda.is_available():
            raise RuntimeError("no CUDA device")
    except Exception:  # no torch, too old a torch, or no GPU
        print("skipped: no torch/CUDA")
        return 0
    if not os.access(args.binary, os.X_OK):
        print("%s: not found (run make build first)" % args.binary, file=sys.stderr)
        return 2

    gpu = torch.cuda.get_device_name(0)
    print("GPU: %s, torch %s; ratio = FA2 time / stage 5 time (> 1: stage 5 faster)" %
          (gpu, torch.__version__))
    head = "%-34s %10s %9s %10s %9s %7s  %s" % ("shape", "FA2 ms", "TFLOP/s", "stage5 ms",
                                               "TFLOP/s", "ratio", "status")
    print(head)
    print("-" * len(head))
    table, ratios = [], []
    for kind, b, h, n, d, causal in shapes(args.quick):
        name = "%s B=%d H=%d N=%d D=%d%s" % (kind, b, h, n, d, " causal" if causal else "")
        fa2_ms = time_fa2(torch, sdpa_kernel, SDPBackend.FLASH_ATTENTION, b, h, n, d, causal)
        s5_ms, status = run_stage5(args.binary, b, h, n, d, causal)
        fl = flops(b, h, n, d, causal)
        fa2_tf = fl / (fa2_ms * 1e-3) / 1e12
        s5_tf = fl / (s5_ms * 1e-3) / 1e12 if s5_ms else float("nan")
        ratio = fa2_ms / s5_ms if s5_ms else float("nan")
        if kind == "fa2" and s5_ms:
            ratios.append(ratio)
        print("%-34s %10.3f %9.1f %10s %9.1f %7.3f  %s" %
              (name, fa2_ms, fa2_tf, "%.3f" % s5_ms if s5_ms else "-", s5_tf, ratio, status),
              flush=True)
        table.append([gpu, kind, b, h, n, d, causal, "%.4f" % fa2_ms, "%.1f" % fa2_tf,
                      "%.4f" % s5_ms if s5_ms else "", "%.1f" % s5_tf if s5_ms else "",
                      "%.4f" % ratio if s5_ms else "", status])
    if ratios:
        geo = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
        print("fa2 shapes: geometric mean ratio %.3f, minimum %.3f (%d shapes)" %
              (geo, min(ratios), len(ratios)))
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["gpu", "shape", "B", "H", "N", "D", "causal", "fa2_ms", "fa2_tflops",
                        "stage5_ms", "stage5_tflops", "ratio", "status"])
            w.writerows(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
