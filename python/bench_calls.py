#!/usr/bin/env python3
"""What one attention call costs a PyTorch user: flashcourse beside PyTorch's SDPA backends.

    make lib
    PYTHONPATH=python python3 python/bench_calls.py                  # the table, then the CSV
    PYTHONPATH=python python3 python/bench_calls.py --train          # + train_gpt.py's tokens/s
    python3 python/bench_calls.py --readme README.md                 # table from the CSV (no GPU)

Per-call wall time, the CPU included: `calls` back-to-back calls after a warm-up, between two
torch.cuda.synchronize(), divided by `calls`; the median of --rounds such runs, the eager rows'
runs taken in turns (round 1 of each row, then round 2, ...), so that a change in the host's pace
falls on all of them alike. At the tiny shape the GPU finishes each call long before the next is
issued, so this is host time: what Python, the binding and the launches cost. At the small GPT's
shape it is the kernels' time unless the host is slower than them. Each call is timed
  eager     forward (no gradient), and forward + backward (o.backward(do), q, k, v requiring grad);
  graph     the same calls captured once in a CUDA graph of `calls` calls and replayed: what is
            left when the host is out of the way (the kernels and their gaps).
Rows: flashcourse, each labelled by the forward and the backward stage it runs (stage 5's forward
with stage 7's backward everywhere, and on Hopper also what stage="auto" and backward_stage="auto"
pick there: stage 6's forward with stage 8's backward), flash-attn's drop-ins on the same tokens
(flash_attn_func in their [B, N, H, D] layout, flash_attn_varlen_func with the batch packed as B
sequences of N), beside SDPA's default and its
FLASH_ATTENTION (FlashAttention-2) and CUDNN_ATTENTION backends; and, eagerly, three rows that
locate the binding's cost: `Python path` (the last pair's calls through the binding's
torch.autograd.Function and ctypes instead of its C++ operator: what a call costs where
`make lib` did not build that), `plan only` (one ctypes call on a kept plan, the outputs
allocated: the floor of any Python binding over this C entry point) and `custom op` (the same
forward through the torch.library operator that torch.compile uses). The flashcourse rows run
through the eager path flashcourse.eager_path() names (printed first).

With --train, python/examples/train_gpt.py runs too, --train-runs times (3) per forward and
backward stage pair, and the tokens per second (course / SDPA) of the run with the median ratio
are written beside. Results: plots/<gpu>/bench_calls.csv
(--out); --readme FILE rewrites the table between <!-- results:bench-calls:begin --> and
<!-- results:bench-calls:end --> from the reference GPU's CSV.
"""

import argparse
import contextlib
import csv
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))

SHAPES = {  # name: (B, H, N, D), causal
    "tiny": ((1, 1, 128, 64), True),
    "gpt": ((16, 8, 1024, 64), True),  # train_gpt.py's default shape
}
REF_GPU = "h200"  # the committed results the README's table is drawn from
BEGIN, END = "<!-- results:bench-calls:begin -->", "<!-- results:bench-calls:end -->"
FIELDS = ["gpu", "shape", "B", "H", "N", "D", "causal", "impl", "mode", "pass", "us_per_call"]


def gpu_slug(name: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    return slug[len("nvidia-"):] if slug.startswith("nvidia-") else slug


def warm_up(fn, calls: int):
    for _ in range(max(10, calls // 10)):
        fn()


def eager_round(torch, fn, calls: int) -> float:
    """One timed run: `calls` calls of fn between two synchronisations, us per call."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls * 1e6


def graph_us(torch, fn, calls: int, rounds: int) -> float:
    """fn called `calls` times inside one CUDA graph; the median replay / calls, in us."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    times = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        graph.replay()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(times)


def label(pair) -> str:
    """A flashcourse row's name: its forward and backward stages."""
    return f"flashcourse {pair[0]} + {pair[1]}"


def implementations(torch, flashcourse, pairs):
    """name -> (forward(q, k, v, causal) -> o, the context every call of it runs in). pairs:
    the (forward, backward) stages of the flashcourse rows, both named in the call (what runs
    is what the row says). SDPA's backend is chosen once around the whole measurement, as a
    model would (a context manager entered per call costs more than the call)."""
    F = torch.nn.functional
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def sdpa(q, k, v, causal):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    def course(stage, backward_stage):
        return lambda q, k, v, c: flashcourse.attention(q, k, v, causal=c, stage=stage,
                                                        backward_stage=backward_stage)[0]

    impls = {label(p): (course(*p), contextlib.nullcontext) for p in pairs}
    impls["SDPA default"] = (sdpa, contextlib.nullcontext)
    impls["SDPA FA2"] = (sdpa, lambda: sdpa_kernel(SDPBackend.FLASH_ATTENTION))
    impls["SDPA cuDNN"] = (sdpa, lambda: sdpa_kernel(SDPBackend.CUDNN_ATTENTION))
    return impls


def bench_shape(torch, flashcourse, name, shape, causal, pairs, calls, rounds, rows, gpu):
    """The rows at one shape. The eager rows (host time) are timed round by round in turn (each
    round a run of `calls` calls), so that a change in the host's pace falls on all of them
    alike; the graph rows (the GPU's time) one implementation after the other. A row's value is
    the median of its rounds."""
    from flashcourse import _ops, _plans, _run
    B, H, N, D = shape
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(shape, generator=g, device="cuda", dtype=torch.float16)
                   for _ in range(4))
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    timers = []  # the eager rows: (impl, mode, pass, context, one timed round)
    measured = []

    def add(impl, mode, pss, us):
        measured.append(dict(gpu=gpu, shape=name, B=B, H=H, N=N, D=D, causal=int(causal),
                             impl=impl, mode=mode, **{"pass": pss}, us_per_call=f"{us:.1f}"))
        print(f"  {name:5s} {impl:52s} {mode:6s} {pss:17s} {us:9.1f} us", flush=True)

    def eager(impl, pss, context, fn):
        with context():
            warm_up(fn, calls)
        timers.append((impl, "eager", pss, context, lambda: eager_round(torch, fn, calls)))

    def graphs(impl, fwd, fwd_bwd, grads):
        # CUDA graphs: the GPU's time, which the host's pace does not move; each graph timed and
        # dropped at once (a graph kept while other calls allocate and free could replay into
        # memory that is no longer its own: a backend's workspace, the leaves' gradients)
        add(impl, "graph", "forward", graph_us(torch, fwd, calls, rounds))
        for t in grads:
            t.grad = None
        add(impl, "graph", "forward+backward", graph_us(torch, fwd_bwd, calls, rounds))
        for t in grads:
            t.grad = None

    impls = implementations(torch, flashcourse, pairs)
    # Where the binding's time goes: the last pair's calls by its Python path (where the eager
    # operator is not built), its floor (one ctypes call on a kept plan, outputs allocated) and
    # the custom operator's path (what torch.compile runs).
    python_path = _run.PythonPath()  # (one call cache for all its rounds)
    impls[f"{label(pairs[-1])}, Python path"] = (impls[label(pairs[-1])][0], lambda: python_path)
    for impl, (fn, context) in impls.items():
        with context():
            try:
                with torch.no_grad():
                    fn(q, k, v, causal)
            except Exception as e:  # noqa: BLE001  a backend this GPU or shape lacks
                print(f"  {name:5s} {impl:52s} skipped: {str(e).splitlines()[0][:80]}")
                continue

        def fwd(fn=fn):
            with torch.no_grad():
                fn(q, k, v, causal)

        def fwd_bwd(fn=fn):
            fn(*leaves, causal).backward(do)

        eager(impl, "forward", context, fwd)
        eager(impl, "forward+backward", context, fwd_bwd)
        if impl.endswith("Python path"):
            continue
        with context():  # (graphs: the GPU's time)
            graphs(impl, fwd, fwd_bwd, leaves)
    # flash-attn's drop-ins on the same tokens, in their own layout ([B, N, H, D], contiguous):
    # flash_attn_func, and flash_attn_varlen_func with the batch packed as B sequences of N
    # ([B N, H, D] and cu_seqlens), each with its stages chosen by "auto"
    bnhd = [t.transpose(1, 2).contiguous() for t in (q, k, v, do)]
    cu = torch.arange(0, (B + 1) * N, N, device="cuda", dtype=torch.int32)
    packed = [t.reshape(B * N, H, D) for t in bnhd]
    for impl, inputs, call in (
            ("flashcourse flash_attn_func", bnhd,
             lambda q_, k_, v_, c: flashcourse.flash_attn_func(q_, k_, v_, causal=c)),
            ("flashcourse flash_attn_varlen_func", packed,
             lambda q_, k_, v_, c: flashcourse.flash_attn_varlen_func(q_, k_, v_, cu, cu, N, N,
                                                                      causal=c))):
        mine = [t.clone().requires_grad_(True) for t in inputs[:3]]

        def fwd(call=call, inputs=inputs):
            with torch.no_grad():
                call(*inputs[:3], causal)

        def fwd_bwd(call=call, mine=mine, grad=inputs[3]):
            call(*mine, causal).backward(grad)

        eager(impl, "forward", contextlib.nullcontext, fwd)
        eager(impl, "forward+backward", contextlib.nullcontext, fwd_bwd)
        graphs(impl, fwd, fwd_bwd, mine)
    stage, backward_stage = pairs[-1]
    p = _plans.plan(stage, False, shape, q.device.index, q.dtype, causal, D ** -0.5, "default",
                    0)
    eager(f"flashcourse {stage} plan only", "forward", contextlib.nullcontext,
          lambda: _run.forward_with(p, q, k, v))
    eager(f"flashcourse {stage} custom op", "forward", contextlib.nullcontext,
          lambda: _ops.forward(q, k, v, causal, -1, -1, 0.0, D ** -0.5, stage, "default", 0,
                               backward_stage, "default"))

    times = [[] for _ in timers]
    for _ in range(rounds):
        for i, (impl, mode, pss, context, one) in enumerate(timers):
            with context():
                times[i].append(one())
    for (impl, mode, pss, _, _), ts in zip(timers, times):
        add(impl, mode, pss, statistics.median(ts))
    names = list(dict.fromkeys(t[0] for t in timers))  # the rows in the order of the table
    rows.extend(sorted(measured, key=lambda r: (names.index(r["impl"]), r["mode"], r["pass"])))


def train_ratio(gpu: str, pair, out: Path, rows, runs: int):
    """train_gpt.py's tokens per second, course (forward and backward by the stages of `pair`)
    and SDPA, as two rows named "train_gpt course|sdpa <forward> + <backward>". train_gpt.py
    trains the course's model, then SDPA's, in one process; that is done `runs` times and the run
    with the median ratio is kept (a single pair of runs moves by several percent: the small
    model's steps are short and the host's share of them varies)."""
    stage, backward_stage = pair
    cmd = [sys.executable, str(REPO / "python/examples/train_gpt.py"), "--stage", stage,
           "--backward-stage", backward_stage, "--out", str(out)]
    found = []
    for k in range(runs):
        print(f"running ({k + 1} of {runs}) " + " ".join(cmd[1:]), flush=True)
        r = subprocess.run(cmd, capture_output=True, text=True)
        print(r.stdout[-1200:], r.stderr[-2000:], flush=True)
        m = re.search(r"tokens per second\s+([\d,]+)\s+([\d,]+)\s+([\d.]+)x", r.stdout)
        if not m:
            print("bench_calls.py: no tokens per second in train_gpt.py's output",
                  file=sys.stderr)
            return
        found.append(tuple(float(x.replace(",", "")) for x in m.groups()[:2]))
    found.sort(key=lambda cs: cs[0] / cs[1])
    print("ratios: " + ", ".join(f"{c / s:.3f}" for c, s in found), flush=True)
    course, sdpa = found[(len(found) - 1) // 2]
    run = f"{stage} + {backward_stage}"
    for impl, value in ((f"train_gpt course {run}", course), (f"train_gpt sdpa {run}", sdpa)):
        rows.append(dict(gpu=gpu, shape="gpt", B="", H="", N="", D="", causal=1, impl=impl,
                         mode="eager", **{"pass": "tokens/s"}, us_per_call=f"{value:.0f}"))


def table(rows) -> str:
    """The README's table: per-call microseconds, each row an implementation, each column a
    shape, pass and mode; then train_gpt.py's tokens per second."""
    shapes = {r["shape"]: r for r in rows if r["B"]}
    impls = list(dict.fromkeys(r["impl"] for r in rows if r["B"]))
    cols = [(s, m, p) for s in shapes for m in ("eager", "graph")
            for p in ("forward", "forward+backward")]
    have = {(r["impl"], r["shape"], r["mode"], r["pass"]): r["us_per_call"] for r in rows}
    cols = [c for c in cols if any((i,) + c in have for i in impls)]
    short = {"forward": "fwd", "forward+backward": "fwd+bwd"}
    lines = ["| us per call | " + " | ".join(f"{s} {short[p]}{' (graph)' * (m == 'graph')}"
                                             for s, m, p in cols) + " |",
             "|---|" + "---:|" * len(cols)]
    for i in impls:
        lines.append(f"| {i} | " + " | ".join(have.get((i,) + c, "") for c in cols) + " |")
    legend = "; ".join(f"{s}: B={r['B']} H={r['H']} N={r['N']} D={r['D']}"
                       f"{' causal' if str(r['causal']) == '1' else ''}"
                       for s, r in shapes.items())
    gpu = rows[0]["gpu"] if rows else "?"
    text = ("\n".join(lines) + f"\n\n{legend}. Measured on the {gpu} by `python/bench_calls.py` "
            f"(plots/{gpu}/bench_calls.csv); eager: wall time per call, the CPU included; graph: "
            "the same calls replayed from a CUDA graph (the GPU's time).")
    tps = {r["impl"]: float(r["us_per_call"]) for r in rows if r["pass"] == "tokens/s"}
    runs = [i[len("train_gpt course "):] for i in tps if i.startswith("train_gpt course ")]
    for run in runs:  # "<forward> + <backward>" (older CSVs: "<forward>", the backward stage 7)
        c, s = tps[f"train_gpt course {run}"], tps.get(f"train_gpt sdpa {run}")
        stage, _, backward = run.partition(" + ")
        how = (f"`train_gpt.py --stage {stage} --backward-stage {backward}`" if backward else
               f"`train_gpt.py --stage {stage}` (backward by stage 7)")
        if s:
            text += (f"\n{how}: course {c:,.0f} "
                     f"tokens/s, SDPA (default backend) {s:,.0f}: **{c / s:.2f}x**.")
    return text


def write_readme(path: Path, csv_path: Path) -> int:
    if not csv_path.is_file():
        print(f"bench_calls.py: no {csv_path}: the table in {path} is left as it is")
        return 0
    with open(csv_path) as f:
        rows = list(csv.DictReader(f))
    text = path.read_text()
    if BEGIN not in text or END not in text:
        print(f"bench_calls.py: {path} has no {BEGIN} ... {END} markers", file=sys.stderr)
        return 1
    a, b = text.index(BEGIN) + len(BEGIN), text.index(END)
    new = text[:a] + "\n" + table(rows) + "\n" + text[b:]
    if new != text:
        path.write_text(new)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=200, help="calls per timed run (200)")
    ap.add_argument("--rounds", type=int, default=7, help="timed runs, the median kept (7)")
    ap.add_argument("--shapes", default="tiny,gpt", help="of: " + ", ".join(SHAPES))
    ap.add_argument("--train", action="store_true", help="also train_gpt.py's tokens/s ratio")
    ap.add_argument("--train-runs", type=int, default=3,
                    help="train_gpt.py runs per stage pair, the median ratio kept (3)")
    ap.add_argument("--out", type=Path, default=None, help="folder (default plots/<gpu>/)")
    ap.add_argument("--readme", type=Path, default=None,
                    help="only rewrite FILE's table from plots/%s/bench_calls.csv" % REF_GPU)
    args = ap.parse_args()
    if args.readme:
        return write_readme(args.readme, REPO / "plots" / REF_GPU / "bench_calls.csv")
    if args.train_runs < 1:
        ap.error(f"--train-runs must be at least 1, got {args.train_runs}")
    try:
        import torch
    except ImportError as e:
        print(f"bench_calls.py needs PyTorch: {e}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("bench_calls.py needs a CUDA GPU", file=sys.stderr)
        return 2
    import flashcourse
    gpu_name = torch.cuda.get_device_name()
    gpu = gpu_slug(gpu_name)
    # stage 5's forward with stage 7's backward everywhere, and what "auto" picks for each where
    # it differs (on Hopper: stage 6's forward, stage 8's backward)
    from flashcourse import _library
    pairs = list(dict.fromkeys([(_library.FORWARD_STAGE, _library.BACKWARD_STAGE),
                                (flashcourse.auto_stage(), flashcourse.auto_backward_stage())]))
    print(f"{gpu_name}, torch {torch.__version__}, eager path {flashcourse.eager_path()}, "
          f"forward + backward "
          f"{' and '.join(f'{f} + {b}' for f, b in pairs)}; {args.calls} calls x {args.rounds} "
          f"rounds", flush=True)
    rows = []
    for name in args.shapes.split(","):
        shape, causal = SHAPES[name]
        bench_shape(torch, flashcourse, name, shape, causal, pairs, args.calls, args.rounds,
                    rows, gpu)
    out = args.out or REPO / "plots" / gpu
    out.mkdir(parents=True, exist_ok=True)
    if args.train:
        for pair in pairs:
            train_ratio(gpu, pair, out, rows, args.train_runs)
    with open(out / "bench_calls.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        w.writerows(rows)
    print()
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
