#!/usr/bin/env python3
"""sdpa_baseline.py: PyTorch scaled_dot_product_attention on the sweeps' shapes, as CSV rows.

    python3 plots/sdpa_baseline.py OUT_CSV [--budget S] [--quick] [--sweeps "long fa2 decode"] [--dry-run]

Appends to OUT_CSV (the sweep's CSV; its last header line decides the column order; a new file
gets common/csv_header.h's columns, `sweep`, N_k, H_kv and gbs) one row per shape and pass for
  sdpa_flash          sdpa_kernel(SDPBackend.FLASH_ATTENTION): FlashAttention-2 (sm_80 on)
  sdpa_mem_efficient  sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION): the memory-efficient kernel,
                      which runs on every GPU (PyTorch's default on a T4)
  sdpa_default        no backend forced: what PyTorch picks (cuDNN on Hopper, often)
and, in the decode sweep only (forward only), sdpa_flash and
  sdpa_cudnn          sdpa_kernel(SDPBackend.CUDNN_ATTENTION): cuDNN's attention
with variant `default`, dtype f16, the error columns empty (nothing is checked here), pass `fwd`
(the forward alone) and `bwd` (the gradients of q, k, v alone, the forward's graph kept from an
untimed call; TFLOP/s counted as 2.5x the forward's FLOPs, as the stage programs count them).
--backends and --passes choose a subset (default: all of both).
Shapes, budget logic and timing follow the stage programs: the long sweep (B = H = 1, D = 128,
N = 1k ... 256k) and the fa2 sweep (B x N = 16,384, H = 2048 / D, D in {64, 128}, causal 0/1);
CUDA events around each call, the L2 flushed (256 MB written) before each, a warm-up, the median
of at least 10 calls and 0.5 s (3 calls when one takes over a second). A climb stops at an
out-of-memory or when the next call is predicted to take longer than the budget.
The decode sweep (plots/shapes.conf's DECODE_*): q [B, N_q, H, D] and a cache K, V [B, N_k, H_kv,
D] (flash-attn's layouts), given to SDPA as [B, heads, tokens, D] views with enable_gqa=True;
N_q > 1 causal, bottom-right as the stages take it (torch.nn.attention.bias.causal_lower_right);
its rows carry N_k, H_kv and gbs (measure.decode_bytes / time), as plots/sweep.sh writes them.
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


# The program's columns, then `sweep` and the decode sweep's (plots/sweep.sh writes the same header).
HEADER = read_csv_header() + ["sweep", "N_k", "H_kv", "gbs"]


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
DECODE_H = SHAPES["DECODE_H"][0]
DECODE_HKV = SHAPES["DECODE_HKV"][0]
DECODE_D = SHAPES["DECODE_D"][0]


def series(quick, sweeps=("long", "fa2")):
    """The sweeps as (sweep, D, causal, [(B, H, N), ...]) climbs, in the sweep script's order."""
    long_n = SHAPES["QUICK_LONG_N"] if quick else LONG_N
    fa2_n = SHAPES["QUICK_FA2_N"] if quick else FA2_N
    out = [("long", 128, 0, [(1, 1, n) for n in long_n])] if "long" in sweeps else []
    for d in (64, 128):
        for causal in (0, 1):
            if "fa2" in sweeps:
                out.append(("fa2", d, causal, [(16384 // n, 2048 // d, n) for n in fa2_n]))
    return out


def decode_series(quick):
    """The decode sweep as (B, N_q, causal, [N_k, ...]) climbs, in the sweep script's order."""
    pre = "QUICK_DECODE_" if quick else "DECODE_"
    return [(b, nq, int(nq > 1), SHAPES[pre + "NK"]) for b in SHAPES[pre + "B"]
            for nq in SHAPES[pre + "NQ"]]


def csv_header(path):
    """The existing file's columns (so added columns stay aligned): its last header line, the one
    the rows at its end are read under; None for a new file."""
    if not os.path.exists(path) or os.path.getsize(path) == 0:
        return None
    last = None
    with open(path) as f:
        for line in f:
            if line.startswith("gpu,stage,"):
                last = line.strip()
    return last.split(",") if last else None


BACKENDS = ("sdpa_flash", "sdpa_mem_efficient", "sdpa_default", "sdpa_cudnn")
PREFILL_BACKENDS = ("sdpa_flash", "sdpa_mem_efficient", "sdpa_default")  # the long and fa2 sweeps
DECODE_BACKENDS = ("sdpa_flash", "sdpa_cudnn")  # the decode sweep (forward only)
DECODE_COLS = ("N_k", "H_kv", "gbs")  # what a decode row needs beyond the program's columns
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
            if hasattr(SDPBackend, "CUDNN_ATTENTION"):
                self.contexts["sdpa_cudnn"] = lambda: sdpa_kernel(SDPBackend.CUDNN_ATTENTION)
        except ImportError:  # torch < 2.3
            self.contexts = {
                "sdpa_flash": lambda: torch.backends.cuda.sdp_kernel(
                    enable_flash=True, enable_math=False, enable_mem_efficient=False),
                "sdpa_mem_efficient": lambda: torch.backends.cuda.sdp_kernel(
                    enable_flash=False, enable_math=False, enable_mem_efficient=True),
            }

    def timed(self, run, base):
        """run() warmed up once, then timed under the budget (the protocol of plots/measure.py):
        (status, ms_median, ms_min, repeats, device_mb), device_mb the peak above `base`."""
        warm = self.timer.once(run)  # warm-up: kernel selection, workspace, first-touch
        mb = (self.torch.cuda.max_memory_allocated() - base) / 2**20
        if warm > self.budget_ms:
            return "over_budget", warm, warm, 1, mb
        first = self.timer.once(run)
        if first > self.budget_ms:
            return "over_budget", first, first, 1, mb
        times = self.timer.repeat(run, first)
        return "ok", measure.median(times), min(times), len(times), mb

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

            return self.timed(run, base)
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


    def measure_decode(self, backend, b, h, h_kv, n_q, n_k, d, causal):
        """One decode shape through SDPA: returns (status, ms_median, ms_min, repeats, device_mb)."""
        torch = self.torch
        q = k = v = mask = None
        ctx = self.contexts.get(backend)
        if ctx is None:
            print(f"sdpa_baseline.py: {backend}: this torch has no such backend", file=sys.stderr)
            return "unsupported", None, None, 0, None
        try:
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            gen = torch.Generator(device="cuda").manual_seed(0)
            # flash-attn's layouts, [B, tokens, heads, D]; SDPA takes [B, heads, tokens, D] views
            q = torch.randn(b, n_q, h, d, device="cuda", dtype=torch.float16, generator=gen)
            k, v = (torch.randn(b, n_k, h_kv, d, device="cuda", dtype=torch.float16, generator=gen)
                    for _ in range(2))
            qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
            if causal and n_q > 1:  # bottom-right: query i sees keys up to i + N_k - N_q
                from torch.nn.attention.bias import causal_lower_right
                mask = causal_lower_right(n_q, n_k)

            def run():
                with ctx():
                    if mask is not None:
                        return self.sdpa(qt, kt, vt, attn_mask=mask, enable_gqa=True)
                    return self.sdpa(qt, kt, vt, enable_gqa=True)

            return self.timed(run, base)
        except torch.cuda.OutOfMemoryError:
            return "OOM", None, None, 0, None
        except (RuntimeError, TypeError, ImportError) as e:  # no kernel, no enable_gqa, no bias
            print(f"sdpa_baseline.py: {backend} decode B={b} N_q={n_q} N_k={n_k}: "
                  f"{str(e).splitlines()[0] if str(e) else type(e).__name__}", file=sys.stderr)
            return "unsupported", None, None, 0, None
        finally:
            del q, k, v, mask
            torch.cuda.synchronize()
            torch.cuda.empty_cache()


def decode_plan(backends, passes, quick):
    """The decode sweep's runs: (backend, B, N_q, causal, [N_k, ...]) climbs (forward only)."""
    if "fwd" not in passes:
        return []
    return [(be,) + s for be in DECODE_BACKENDS if be in backends for s in decode_series(quick)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_csv")
    ap.add_argument("--budget", type=float, default=60.0, help="seconds one call may take")
    ap.add_argument("--quick", action="store_true", help="the quick sweep's shapes (plots/shapes.conf)")
    ap.add_argument("--dry-run", action="store_true", help="list the runs, touch nothing")
    ap.add_argument("--sweeps", default="long fa2 decode",
                    help="which sweeps, of long, fa2 and decode (default all three)")
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
    sweeps = args.sweeps.replace(",", " ").split()
    for x in sweeps:
        if x not in ("long", "fa2", "decode"):
            ap.error(f"--sweeps: '{x}' is not one of long, fa2, decode")

    plan = series(args.quick, sweeps)
    runs = [(be, pa) for be in backends if be in PREFILL_BACKENDS for pa in passes]
    dplan = decode_plan(backends, passes, args.quick) if "decode" in sweeps else []
    total = len(runs) * sum(len(s[3]) for s in plan) + sum(len(s[4]) for s in dplan)
    if args.dry_run:
        for backend, pass_ in runs:
            for sweep, d, causal, shapes in plan:
                for b, h, n in shapes:
                    print(f"{backend} {pass_} {sweep} B={b} H={h} N={n} D={d} causal={causal}")
        for backend, b, n_q, causal, nks in dplan:
            for n_k in nks:
                print(f"{backend} fwd decode B={b} H={DECODE_H} H_kv={DECODE_HKV} N_q={n_q} "
                      f"N_k={n_k} D={DECODE_D} causal={causal}")
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
    if dplan and not all(c in cols for c in DECODE_COLS) and not args.dry_run:
        # an older CSV: the decode rows go under a header line of their own (csv.awk reads it)
        cols = HEADER
        with open(args.out_csv, "a") as out:
            out.write(",".join(cols) + "\n")
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
        for backend, b, n_q, causal, nks in dplan:
            stop, stop_note = None, ""
            last_ms = last_work = None
            h, h_kv, d = DECODE_H, DECODE_HKV, DECODE_D
            for n_k in nks:
                i += 1
                nbytes = measure.decode_bytes(b, n_k, h_kv, d)
                note = ""
                if stop is None and last_ms is not None and last_ms * nbytes / last_work > runner.budget_ms:
                    stop = "over_budget"
                    stop_note = (f"predicted {last_ms * nbytes / last_work / 1000:.2f} s at N_k={n_k} "
                                 f"> budget {args.budget:g} s")
                if stop is not None:
                    status, med, mn, reps, mb = stop, None, None, 0, None
                    note = "not run: " + stop_note
                else:
                    status, med, mn, reps, mb = runner.measure_decode(backend, b, h, h_kv, n_q, n_k,
                                                                      d, causal)
                    if status == "ok":
                        last_ms, last_work = med, nbytes
                    elif status == "OOM":
                        stop, stop_note = "OOM", f"out of memory at N_k={n_k}"
                        gc.collect()
                        torch.cuda.empty_cache()
                    elif status == "over_budget":
                        stop, stop_note = "over_budget", f"N_k={n_k} took over {args.budget:g} s"
                tf = measure.tflops(measure.decode_flops(b, h, n_q, n_k, d), med) if med else None
                g = measure.gbs(nbytes, med) if med else None
                row = {
                    "gpu": gpu, "stage": backend, "variant": "default", "pass": "fwd",
                    "B": b, "H": h, "N": n_q, "D": d, "causal": causal, "dtype": "f16",
                    "ms_median": f"{med:.4f}" if med is not None else "",
                    "ms_min": f"{mn:.4f}" if mn is not None else "",
                    "repeats": reps, "tflops": f"{tf:.3f}" if tf is not None else "",
                    "rows_checked": 0, "device_mb": f"{mb:.1f}" if mb is not None else "",
                    "status": status, "sweep": "decode", "N_k": n_k, "H_kv": h_kv,
                    "gbs": f"{g:.1f}" if g is not None else "",
                }
                out.write(",".join(str(row.get(c, "")) for c in cols) + "\n")
                out.flush()
                t = (f"{med:10.3f} ms {g:8.1f} GB/s   " if med is not None
                     else f"{'-':>10} ms {'-':>8} GB/s   ")
                print(f"[{i:{width}d}/{total}] {backend:<18} fwd decode B={b:<2} N_q={n_q:<2} "
                      f"N_k={n_k:<6} {'causal' if causal else '':<6} {t}  {status}"
                      f"{'  (' + note + ')' if note else ''}", file=sys.stderr, flush=True)
    print(f"sdpa_baseline.py: {total} rows appended to {args.out_csv} in {time.time() - t0:.0f} s",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
