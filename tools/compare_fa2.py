#!/usr/bin/env python3
"""Course stages against FlashAttention-2 and cuDNN, side by side, in one run on one GPU.

For every shape, times PyTorch's FLASH_ATTENTION backend of scaled_dot_product_attention
(FlashAttention-2) and its CUDNN_ATTENTION backend (cuDNN's fused attention, PyTorch's default
on Hopper) with CUDA events, inputs [B, H, N, D] fp16, then runs each stage program given with
--binary on the same shape and reads its median time from the CSV row. Prints a table and, per
program, the geometric mean and minimum of FA2 time / stage time and of cuDNN time / stage
time (> 1: the stage is faster), over the fa2 shapes and over the long shapes.

Shapes: fa2 = B*N = 16384 tokens, H = 2048 / D, N in 1k..16k, D in {64, 128}, causal 0/1;
long = B = H = 1, D = 128: N = 262144 only, or with --long the whole long sweep (1k..256k);
--no-fa2-shapes, --no-long-shapes leave either list out; --shape B,H,N,D[,causal] (repeatable)
adds one of kind "shape" after them.

--binary may be given several times (each program a column; PATH@VARIANT runs --variant
VARIANT). A program that exits 3 (unsupported on this GPU, e.g. stage 6 off Hopper) shows n/a.

tools/compare.py makes the comparison in one process instead, every library timed alike
(CUDA graphs of back-to-back calls), with the FA3-class kernels and the backward pass too; it
imports this file's shape list.

usage: python3 -m tools.compare_fa2 [--binary PROG[@VARIANT]]... [--quick] [--long]
                                    [--no-fa2-shapes] [--no-long-shapes]
                                    [--shape B,H,N,D[,causal]]... [--csv OUT]
"""
import argparse
import csv
import io
import math
import os
import re
import subprocess
import sys

from plots import measure  # the FLOP count and the timing protocol: one home

# Timed repetitions per PyTorch shape (median): the stage programs' --bench protocol
# (plots/measure.py: at least 10 calls and half a second). A short burst reads faster: on an H200,
# cuDNN timed in 15 calls ran about 10% faster than over half a second (the clocks drop under
# sustained load), which would compare a sustained stage with a cold-clock SDPA.
WARMUP = 3
LONG_NS = (1024, 2048, 4096, 8192, 16384, 24576, 32768, 49152, 65536, 131072, 262144)


def exit_codes(path=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common",
                                  "attention.h")):
    """The programs' exit codes from their one home, the attn_exit enum of common/attention.h, by
    name: PASS, WRONG, USAGE, UNSUPPORTED, OOM."""
    with open(path) as f:
        codes = {m.group(1): int(m.group(2))
                 for m in re.finditer(r"\bATTN_EXIT_([A-Z_]+)\s*=\s*(\d+)", f.read())}
    if "UNSUPPORTED" not in codes or "USAGE" not in codes:
        sys.exit("compare_fa2.py: no attn_exit enum in %s" % path)
    return codes


EXIT = exit_codes()


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    p.add_argument("--binary", action="append", metavar="PROG[@VARIANT]",
                   help="stage program, repeatable (default: build/stage5_tuned)")
    add_shape_options(p)
    p.add_argument("--csv", metavar="OUT", help="also write the table as CSV to OUT")
    args = p.parse_args(argv)
    check_shape_options(p, args)
    if not args.binary:
        args.binary = [os.path.join(here, "..", "build", "stage5_tuned")]
    return args


FA2_DIMS = (64, 128)  # FlashAttention-2's benchmark head dims
FA2_MODEL_DIM = 2048  # H x D of every fa2 shape (H = 2048 / D: 32 heads at 64, 16 at 128)


def head_dims(text):
    """argparse type of --dims: "64,96,256" -> (64, 96, 256), each a multiple of 8 in 32..256."""
    try:
        dims = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError("%r is not a comma-separated list of head dims" % text) \
            from None
    bad = [d for d in dims if d < 32 or d > 256 or d % 8]
    if bad or not dims:
        raise argparse.ArgumentTypeError("head dims are multiples of 8 from 32 to 256, got %r"
                                         % text)
    return dims


def one_shape(text):
    """--shape B,H,N,D[,causal]: (B, H, N, D, causal) of one shape of kind "shape"."""
    try:
        f = tuple(int(x) for x in text.split(","))
    except ValueError:
        f = ()
    if len(f) not in (4, 5) or min(f[:4]) < 1 or (len(f) == 5 and f[4] not in (0, 1)):
        raise argparse.ArgumentTypeError("%r is not B,H,N,D or B,H,N,D,causal (positive sizes, "
                                         "causal 0 or 1)" % text)
    if f[3] < 32 or f[3] > 256 or f[3] % 8:
        raise argparse.ArgumentTypeError("head dims are multiples of 8 from 32 to 256, got %d"
                                         % f[3])
    return f if len(f) == 5 else f + (0,)


def add_shape_options(p):
    """The options shapes() reads (this script's and tools/compare.py's)."""
    p.add_argument("--quick", action="store_true", help="N up to 4096 only")
    p.add_argument("--long", action="store_true",
                   help="the whole long sweep (B = H = 1, D = 128, N = 1k..256k)")
    p.add_argument("--no-fa2-shapes", action="store_true", help="skip the fa2 shapes")
    p.add_argument("--no-long-shapes", action="store_true", help="skip the long shapes")
    p.add_argument("--dims", type=head_dims, default=FA2_DIMS, metavar="D,D,...",
                   help="head dims of the fa2 shapes, H = 2048 / D heads each (default %s)"
                        % ",".join(map(str, FA2_DIMS)))
    p.add_argument("--shape", action="append", type=one_shape, default=[],
                   metavar="B,H,N,D[,causal]",
                   help="a shape of kind 'shape', repeatable, timed after the sweeps' (with "
                        "--no-fa2-shapes --no-long-shapes: these alone)")


def check_shape_options(p, args):
    if args.no_fa2_shapes and args.no_long_shapes and not args.shape:
        p.error("--no-fa2-shapes and --no-long-shapes leave no shape (add --shape)")


def shapes(args):
    """(kind, B, H, N, D, causal) in table order."""
    out = []
    if not args.no_fa2_shapes:
        for d in args.dims:
            for causal in (0, 1):
                for n in (1024, 2048, 4096, 8192, 16384):
                    if args.quick and n > 4096:
                        continue
                    out.append(("fa2", 16384 // n, FA2_MODEL_DIM // d, n, d, causal))
    long_ns = () if args.no_long_shapes else LONG_NS if args.long else (LONG_NS[-1],)
    for n in long_ns:
        if args.quick and n > 4096:
            continue
        out.append(("long", 1, 1, n, 128, 0))
    out += [("shape",) + f for f in args.shape]
    return out


def flops(b, h, n, d, causal):
    return measure.flops(b, h, n, d, causal)


def time_sdpa(torch, sdpa_kernel, backend, b, h, n, d, causal):
    """Median milliseconds of one SDPA forward on `backend`, L2 flushed before each repetition;
    None if the backend cannot run the shape here."""
    try:
        q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.float16) for _ in range(3))
        timer = measure.EventTimer(torch)  # the L2 flushed before each call
        f = torch.nn.functional.scaled_dot_product_attention
        with sdpa_kernel(backend):
            for _ in range(WARMUP):
                f(q, k, v, is_causal=bool(causal))
            times = timer.repeat(lambda: f(q, k, v, is_causal=bool(causal)))
    except (RuntimeError, torch.cuda.OutOfMemoryError) as e:  # no kernel for it, or no memory
        print("  (%s: %s)" % (backend, str(e).splitlines()[0][:100]), file=sys.stderr)
        return None
    finally:
        q = k = v = timer = None
        torch.cuda.empty_cache()
    return measure.median(times)


def run_stage(spec, b, h, n, d, causal):
    """(ms_median or None, status) from the stage program's CSV row; status n/a if the program
    says the shape or GPU is unsupported (exit 3)."""
    binary, _, variant = spec.partition("@")
    cmd = [binary, "--batch", str(b), "--heads", str(h), "--seq", str(n), "--dim", str(d),
           "--bench", "--csv", "--check", "16"] + (["--causal"] if causal else [])
    if variant:
        cmd += ["--variant", variant]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode == EXIT["UNSUPPORTED"]:
        return None, "n/a"
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


def labels(specs):
    """Column names: the program's file name (and @VARIANT); with its folder where two programs
    share a file name (build/sm90/stage5_tuned and build/old/stage5_tuned)."""
    def name(spec, parts):
        binary, _, variant = spec.partition("@")
        path = os.path.normpath(binary).split(os.sep)
        return "/".join(path[-parts:]) + ("@" + variant if variant else "")
    short = [name(s, 1) for s in specs]
    return [name(s, 2) if short.count(n) > 1 else n for s, n in zip(specs, short)]


def fmt(x, spec="%.3f"):
    return spec % x if x is not None else "n/a"


def ratio(ref_ms, ms):
    return ref_ms / ms if ref_ms and ms else None


def summary(name, kind, rs):
    rs = [r for r in rs if r is not None]
    if not rs:
        return "%s, %s shapes: no ratio" % (name, kind)
    geo = math.exp(sum(math.log(r) for r in rs) / len(rs))
    return "geometric mean %.3f, minimum %.3f (%d shapes)" % (geo, min(rs), len(rs))


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
    for spec in args.binary:
        binary = spec.partition("@")[0]
        if not os.access(binary, os.X_OK):
            print("%s: not found (run make build first)" % binary, file=sys.stderr)
            return EXIT["USAGE"]
    cudnn = getattr(SDPBackend, "CUDNN_ATTENTION", None)

    gpu = torch.cuda.get_device_name(0)
    names = labels(args.binary)
    print("GPU: %s, torch %s; /FA2 = FA2 time / stage time, /cuDNN = cuDNN time / stage time "
          "(> 1: the stage is faster)" % (gpu, torch.__version__))
    head = "%-32s %8s %8s" % ("shape", "FA2 ms", "cuDNN ms")
    for nm in names:
        head += " | %-22s" % nm[-22:]
    print(head)
    sub = "%-32s %8s %8s" % ("", "", "")
    for _ in names:
        sub += " | %8s %6s %6s" % ("ms", "/FA2", "/cuDNN")
    print(sub)
    print("-" * len(sub))
    table = []
    ratios = {}  # (program, kind, "fa2" | "cudnn") -> [ratio]
    for kind, b, h, n, d, causal in shapes(args):
        name = "%s B=%d H=%d N=%d D=%d%s" % (kind, b, h, n, d, " causal" if causal else "")
        fa2_ms = time_sdpa(torch, sdpa_kernel, SDPBackend.FLASH_ATTENTION, b, h, n, d, causal)
        cudnn_ms = (time_sdpa(torch, sdpa_kernel, cudnn, b, h, n, d, causal)
                    if cudnn is not None else None)
        line = "%-32s %8s %8s" % (name, fmt(fa2_ms), fmt(cudnn_ms))
        fl = flops(b, h, n, d, causal)
        for spec, nm in zip(args.binary, names):
            ms, status = run_stage(spec, b, h, n, d, causal)
            rf, rc = ratio(fa2_ms, ms), ratio(cudnn_ms, ms)
            ratios.setdefault((nm, kind, "fa2"), []).append(rf)
            ratios.setdefault((nm, kind, "cudnn"), []).append(rc)
            line += " | %8s %6s %6s" % (fmt(ms), fmt(rf), fmt(rc))
            if status not in ("ok", "n/a"):
                line += " [%s]" % status
            table.append([gpu, kind, b, h, n, d, causal, fmt(fa2_ms, "%.4f"),
                          fmt(cudnn_ms, "%.4f"), nm, fmt(ms, "%.4f"),
                          fmt(measure.tflops(fl, ms) if ms else None, "%.1f"),
                          fmt(rf, "%.4f"), fmt(rc, "%.4f"), status])
        print(line, flush=True)
    kinds = [k for k in ("fa2", "long", "shape") if any(s[0] == k for s in shapes(args))]
    for nm in names:
        for kind in kinds:
            print("%s, %s shapes: vs FA2 %s; vs cuDNN %s" %
                  (nm, kind, summary(nm, kind, ratios.get((nm, kind, "fa2"), [])),
                   summary(nm, kind, ratios.get((nm, kind, "cudnn"), []))))
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["gpu", "shape", "B", "H", "N", "D", "causal", "fa2_ms", "cudnn_ms",
                        "program", "ms", "tflops", "ratio_fa2", "ratio_cudnn", "status"])
            w.writerows(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
