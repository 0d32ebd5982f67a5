#!/usr/bin/env python3
"""Course stages against FA2, cuDNN and the FA3-class kernels: one process, one protocol for all.

For every shape, one set of fp16 inputs [B, H, N, D] (fixed seed) is shared by every library, and
each is timed the same way: a few eager calls on a side stream (warm-up: JIT compiles, cuDNN's
plans, lazily loaded kernels), then a CUDA graph of R back-to-back calls captured on that stream,
R chosen so one replay runs about 20 ms, replayed several times between CUDA events; the time of
a call is the median replay / R. No L2 flush: each call reads what the one before it left. With
--rounds K every library is timed K times per shape, interleaved with the others (the order
reversed every other round), and its fastest round is kept. A stage program's --bench-graph times
its own call the same way (common/main.c holds the protocol's constants, which this file reads), so
that the binding and the program can be set side by side.

Columns:
  course stages   flashcourse.attention(q, k, v, causal=, stage=, variant=), in-process through
                  the stage's library (make lib); --stage NAME[@VARIANT], repeatable
  FA2             torch.nn.functional.scaled_dot_product_attention, SDPBackend.FLASH_ATTENTION
  cuDNN           the same, SDPBackend.CUDNN_ATTENTION (PyTorch's default on Hopper)
  FA3-class       flash_attn.cute.flash_attn_func (FlashAttention-4's CuTe kernels, package
                  flash-attn-4; on sm_90 FA3's algorithm), on copies of q, k, v laid out
                  [B, N, H, D], made once per shape outside the graph; optional: where it is not
                  importable, one line says so and the column is n/a
A library that cannot run a shape (an exception, out of memory included) shows n/a there, with
its reason on stderr, and the run goes on.

--softcap C caps every score at C (C tanh(S / C), Gemma 2's logits) in every library that takes
it: the course's stages through flashcourse.flash_attn_func(..., softcap=C, stage=NAME) and the
FA3-class kernels on the [B, N, H, D] copies; SDPA has no softcap, so FA2's and cuDNN's columns
are n/a. A course stage's backward is then timed as the FA3-class kernels' (autograd from a
forward run once, backward_stage=NAME, its @VARIANT the backward_variant); a forward @VARIANT is
refused (the variants are attention()'s, which takes no softcap).

--pass bwd times the gradients only. The course's stage (stage7_backward, or
stage7_backward@deterministic) runs flashcourse.attention_backward from the O and LSE of its own
forward, computed once. SDPA and the FA3-class kernels run their forward once, outside the graph,
with inputs that require grad, and the graph holds R calls of
torch.autograd.grad(o, (q, k, v), do, retain_graph=True), as torch.cuda.make_graphed_callables
captures a backward. That forward runs on the stream the graph is captured on: the autograd
engine runs each backward op on the stream of its forward op, so only then does the backward
land in the capture. Backward TFLOP/s = 2.5 x the forward's FLOPs / time (the FA2/FA3 papers').

Checks: the output of each graph's last call, after the replays (O; or dQ, dK, dV), against the
reference library's: the first of FA2, cuDNN, FA3-class, then the stages, that ran the shape with
a finite output. Over tolerance (O: 2e-2 absolute; gradients: 5e-2 x max(1, max |reference|), per
tensor), or not finite, is a FAIL line on stderr, and the run exits 1 (a wrong result).

Output: the GPU and torch version, a line per shape (ms per call and TFLOP/s per column; ratios
X/Y = time of Y / time of X, > 1: X is faster: each stage over FA2, cuDNN and FA3-class, and
FA3-class over cuDNN), then per stage and shape kind the geometric mean and minimum of each ratio.
--csv OUT: one row per (shape, library), written as each shape ends: gpu, pass, shape (its kind),
B, H, N, D, causal, library, ms, tflops, status (ok, FAIL, OOM, n/a), max_abs_diff_vs_reference,
reference (the library it was checked against; on the reference's own row, itself).

Shapes (shared with tools/compare_fa2.py, imported from it): fa2 = B*N = 16384 tokens,
H = 2048 / D, N in 1k..16k, D in {64, 128}, causal 0/1; long = B = H = 1, D = 128: N = 262144
only, or with --long the whole long sweep (1k..256k); --shape B,H,N,D[,causal] (repeatable)
adds one of kind "shape" after them. --quick: N up to 4096.

Why a sibling of compare_fa2.py and not a mode of it: that script times stage programs as
subprocesses (their own --bench protocol, one CSV row per program) beside PyTorch's SDPA timed
call by call; this one times libraries in-process through CUDA graphs, with a backward pass, an
optional library and cross-checked outputs. As one script every option would first have to say
which mode it belongs to; as two, each reads top to bottom, and the shapes stay in one place.

Without PyTorch or a CUDA GPU it prints one line, "skipped: ...", and exits 0.

usage: python3 -m tools.compare [--stage NAME[@VARIANT]]... [--pass fwd|bwd] [--quick]
                                [--long] [--no-fa2-shapes] [--no-long-shapes]
                                [--shape B,H,N,D[,causal]]...
                                [--graph-ms MS] [--replays N] [--rounds K] [--softcap C]
                                [--csv OUT]
  e.g. python3 -m tools.compare --stage stage5_tuned --stage stage6_hopper
       python3 -m tools.compare --pass bwd --stage stage7_backward \\
               --stage stage7_backward@deterministic --no-long-shapes
       python3 -m tools.compare --stage stage6_hopper --softcap 30 --no-long-shapes
  (FLASHCOURSE_LIB_DIR names the stage libraries' folder, default build/lib: make lib)
"""
import argparse
import csv
import gc
import math
import os
import re
import sys

from plots import measure as course_measure  # the FLOP count: one home; measure() is this file's
from tools import compare_fa2  # the shapes and the exit codes: one home each

EXIT = compare_fa2.EXIT


def graph_protocol(path=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common",
                                     "main.c")):
    """The graph protocol's constants from their one home, common/main.c, whose --bench-graph times
    a stage program the same way: GRAPH_MS, GRAPH_MAX_CALLS, GRAPH_RECAPTURE_BELOW, GRAPH_REPLAYS
    by name."""
    with open(path) as f:
        found = {m.group(1): float(m.group(2))
                 for m in re.finditer(r"^#define (GRAPH_[A-Z_]+) ([0-9.]+)\b", f.read(), re.M)}
    names = ("GRAPH_MS", "GRAPH_MAX_CALLS", "GRAPH_RECAPTURE_BELOW", "GRAPH_REPLAYS")
    missing = [n for n in names if n not in found]
    if missing:
        sys.exit("compare.py: no %s in %s" % (", ".join(missing), path))
    return found


_GRAPH = graph_protocol()
# One replay of a graph lasts about this long: the graph's launch (some microseconds) and the
# events' resolution (about half a microsecond) stay under 0.1% of it, and 20 shapes x 5 columns x
# (1 + REPLAYS) replays take under a minute.
GRAPH_MS = _GRAPH["GRAPH_MS"]
# Timed replays per library and shape (the median is taken), after WARMUP_REPLAYS untimed.
REPLAYS = int(_GRAPH["GRAPH_REPLAYS"])
# Rounds per shape (--rounds): on an H200 held at its power limit a library's time moves by 2-10%
# between rounds seconds apart, as much as the ratios a run is meant to show; with K rounds, each
# library is timed K times, interleaved with the others, and its fastest round is kept.
ROUNDS = 1
WARMUP_REPLAYS = 1
# Eager calls on the capture stream before capturing: the first compiles (FA3-class) or builds a
# plan (cuDNN) and loads lazily loaded kernels; PyTorch's make_graphed_callables warms up 3 times.
WARMUP_CALLS = 3
# Eager calls timed together to choose R.
ESTIMATE_CALLS = 3
# At most this many calls in one graph: bounds the capture's time and the graph's size. The
# smallest shape (long, N = 1024: about 15 us a call) needs about 1300 for GRAPH_MS.
MAX_CALLS = int(_GRAPH["GRAPH_MAX_CALLS"])
# An eager estimate of a short call is the launch overhead: a graph that replays in less than
# this fraction of GRAPH_MS is captured again with R from its own time.
RECAPTURE_BELOW = _GRAPH["GRAPH_RECAPTURE_BELOW"]
SEED = 1
# Tolerances of the cross-check (each library against the reference library, not against exact
# math). O is a convex combination of V's rows (|O| <= max |V|, about 5 for normal inputs), fp16's
# spacing at 4 is 0.004: 2e-2 is 5 units there, while a wrong mask or layout moves O by 0.1 or more.
FWD_TOL = 2e-2
# Gradients reach several units (dP = dO V^T has a standard deviation of sqrt(D); the first keys
# of a causal row collect every query's part), where fp16's spacing is 0.004 to 0.008, and each
# library rounds P and dS to 16 bits at different places: 5e-2 x max(1, max |reference|).
GRAD_TOL = 5e-2

FA2, CUDNN, FA3 = "FA2", "cuDNN", "FA3-class"
CSV_COLUMNS = ["gpu", "pass", "shape", "B", "H", "N", "D", "causal", "library", "ms", "tflops",
               "status", "max_abs_diff_vs_reference", "reference"]
STAGE_SPEC = re.compile(r"^(stage\w+)(?:@(\w+))?$")


def stage_spec(text):
    """argparse type of --stage: NAME[@VARIANT] -> (name, variant or None)."""
    m = STAGE_SPEC.match(text)
    if not m:
        raise argparse.ArgumentTypeError(
            "%r is not NAME[@VARIANT] (e.g. stage5_tuned, stage7_backward@deterministic)" % text)
    return m.group(1), m.group(2)


def positive(kind):
    def parse(text):
        try:
            x = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError("%r is not a number" % text) from None
        if not x > 0:
            raise argparse.ArgumentTypeError("must be > 0, got %s" % text)
        return x
    return parse


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n")[0],
        epilog="The module's docstring (the top of this file) says how each column is timed.")
    p.add_argument("--stage", action="append", type=stage_spec, metavar="NAME[@VARIANT]",
                   help="course stage, repeatable (default: stage5_tuned forward, "
                        "stage7_backward backward)")
    p.add_argument("--pass", dest="which", choices=("fwd", "bwd"), default="fwd",
                   help="fwd: the forward pass (default); bwd: the gradients only")
    compare_fa2.add_shape_options(p)
    p.add_argument("--graph-ms", type=positive(float), default=GRAPH_MS, metavar="MS",
                   help="the length of one replay R is chosen for (default %g)" % GRAPH_MS)
    p.add_argument("--replays", type=positive(int), default=REPLAYS, metavar="N",
                   help="timed replays per library and shape, median taken (default %d)"
                        % REPLAYS)
    p.add_argument("--rounds", type=positive(int), default=ROUNDS, metavar="K",
                   help="rounds per shape, each timing every library once, the order reversed "
                        "every other round; a library's time is its fastest round (default %d)"
                        % ROUNDS)
    p.add_argument("--softcap", type=positive(float), metavar="C",
                   help="cap the scores at C (C tanh(S / C)) where a library takes it; SDPA's "
                        "columns n/a")
    p.add_argument("--csv", metavar="OUT", help="also write one row per (shape, library) to OUT")
    args = p.parse_args(argv)
    compare_fa2.check_shape_options(p, args)
    labels = [label(s) for s in args.stage or ()]
    twice = sorted(set(x for x in labels if labels.count(x) > 1))
    if twice:
        p.error("--stage %s given twice" % ", ".join(twice))
    if not args.stage:
        args.stage = [("stage7_backward" if args.which == "bwd" else "stage5_tuned", None)]
    if args.softcap and args.which == "fwd" and any(v for _, v in args.stage):
        p.error("--softcap with a forward @VARIANT: the variants are attention()'s, which takes "
                "no softcap")
    return args


def pass_flops(which, b, h, n, d, causal):
    """FLOPs of the pass `which` ("fwd" or "bwd": 2.5x the forward's), from plots/measure.py."""
    return course_measure.flops(b, h, n, d, causal, which)


def label(spec):
    name, variant = spec
    return name + ("@" + variant if variant else "")


def first_line(e):
    """One line for an exception; with the one it interrupted, if any (an error inside a graph
    capture surfaces as the capture's end failing)."""
    def one(x):
        text = str(x).strip().splitlines()
        return "%s: %s" % (type(x).__name__, text[0][:160] if text else "(no message)")
    ctx = e.__context__
    if ctx is not None and not e.__suppress_context__ and ctx is not e:
        return "%s (raised while handling %s)" % (one(e), one(ctx))
    return one(e)


def geo_min(rs):
    """'geometric mean G, minimum M (K shapes)' of the ratios that exist."""
    rs = [r for r in rs if r]
    if not rs:
        return "no ratio"
    geo = math.exp(sum(math.log(r) for r in rs) / len(rs))
    return "geometric mean %.3f, minimum %.3f (%d shape%s)" % (geo, min(rs), len(rs),
                                                                "s" if len(rs) > 1 else "")


# ---- the libraries: each a setup(t, causal) -> (call, unpack) ----
#
# t holds the shape's tensors (q, k, v [B, H, N, D]; do for bwd; qt, kt, vt, dot [B, N, H, D] when
# the FA3-class kernels are here). setup runs on the capture stream, once per library and shape;
# call() is one pass, what the graph repeats; unpack(call()) is the outputs as [B, H, N, D]
# tensors, O or (dQ, dK, dV), for the check.

def stage_setup(torch, fc, name, variant, which, softcap=None):
    variant = variant or "default"
    if softcap:
        return capped_stage_setup(torch, fc, name, variant, which, softcap)

    def setup(t, causal):
        q, k, v = t["q"], t["k"], t["v"]
        if which == "fwd":
            return (lambda: fc.attention(q, k, v, causal=causal, stage=name, variant=variant)[0],
                    lambda o: (o,))
        o, lse = fc.attention(q, k, v, causal=causal, stage=name)  # the stage's own forward
        do = t["do"]
        return (lambda: fc.attention_backward(q, k, v, o, lse, do, causal=causal, stage=name,
                                              variant=variant),
                tuple)
    return setup


def to_bhnd(outs):
    """[B, N, H, D] outputs (flash-attn's layout) as [B, H, N, D] views, for the check."""
    return tuple(x.transpose(1, 2) for x in outs)


def capped_stage_setup(torch, fc, name, variant, which, softcap):
    """A course stage with a softcap: flashcourse.flash_attn_func on the [B, N, H, D] copies,
    the forward by `name`; for bwd, a forward by the default stage run once and the gradients by
    backward_stage=name (its variant the backward_variant), as fa3_setup times the FA3-class
    kernels' backward."""
    def setup(t, causal):
        if which == "fwd":
            q, k, v = t["qt"], t["kt"], t["vt"]
            return (lambda: fc.flash_attn_func(q, k, v, causal=causal, softcap=softcap,
                                               stage=name),
                    lambda o: to_bhnd((o,)))
        q, k, v = (t[x].detach().requires_grad_() for x in ("qt", "kt", "vt"))
        o = fc.flash_attn_func(q, k, v, causal=causal, softcap=softcap, backward_stage=name,
                               backward_variant=variant)
        do = t["dot"]
        return lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True), to_bhnd
    return setup


def sdpa_setup(torch, sdpa_kernel, backend, which):
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def setup(t, causal):
        if which == "fwd":
            q, k, v = t["q"], t["k"], t["v"]

            def call():
                with sdpa_kernel(backend):
                    return sdpa(q, k, v, is_causal=causal)
            return call, lambda o: (o,)
        q, k, v = (t[x].detach().requires_grad_() for x in ("q", "k", "v"))
        with sdpa_kernel(backend):
            o = sdpa(q, k, v, is_causal=causal)
        do = t["do"]
        return lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True), tuple
    return setup


def fa3_setup(torch, flash_attn_func, which, softcap=None):
    cap = softcap or 0.0  # (its default: none)

    def out(r):  # flash_attn_func returns (out, lse)
        return r[0] if isinstance(r, (tuple, list)) else r

    def setup(t, causal):
        if which == "fwd":
            q, k, v = t["qt"], t["kt"], t["vt"]
            return (lambda: out(flash_attn_func(q, k, v, causal=causal, softcap=cap)),
                    lambda o: to_bhnd((o,)))
        q, k, v = (t[x].detach().requires_grad_() for x in ("qt", "kt", "vt"))
        o = out(flash_attn_func(q, k, v, causal=causal, softcap=cap))
        do = t["dot"]
        return lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True), to_bhnd
    return setup


# ---- the protocol ----

def calls_for(ms_per_call, graph_ms):
    """R: calls in one graph so that a replay lasts about graph_ms."""
    if not ms_per_call > 0:
        return MAX_CALLS
    return max(1, min(MAX_CALLS, int(round(graph_ms / ms_per_call))))


def capture_and_time(torch, stream, call, calls, replays):
    """A CUDA graph of `calls` back-to-back calls captured on `stream`, replayed on the current
    stream: (the graph, the last call's outputs, median replay ms / calls)."""
    graph = torch.cuda.CUDAGraph()
    out = None
    # No garbage collection while capturing: a finalizer it runs (a library's kernel module
    # unloaded, memory freed) would make a call that is not allowed during a capture and end it.
    collecting = gc.isenabled()
    gc.disable()
    try:
        with torch.cuda.graph(graph, stream=stream):
            for _ in range(calls):
                out = None  # the previous call's outputs go back to the graph's pool first
                out = call()
    finally:
        if collecting:
            gc.enable()
    for _ in range(WARMUP_REPLAYS):
        graph.replay()
    start = torch.cuda.Event(enable_timing=True)
    stop = torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(replays):
        start.record()
        graph.replay()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    times.sort()
    return graph, out, times[len(times) // 2] / calls


def check(torch, outs, ref, which):
    """(max abs difference over the outputs, None or why it fails). ref: the reference's outputs,
    or None (then only finiteness is checked)."""
    for x in outs:
        if not bool(torch.isfinite(x).all()):
            return None, "not finite (NaN or Inf in the output)"
    if ref is None:
        return None, None
    worst, why = 0.0, None
    for i, (x, r) in enumerate(zip(outs, ref)):
        diff = float((x.float() - r.float()).abs().max())
        if which == "bwd":
            limit = GRAD_TOL * max(1.0, float(r.float().abs().max()))
            name = ("dQ", "dK", "dV")[i]
        else:
            limit, name = FWD_TOL, "O"
        if not diff <= limit and why is None:
            why = "max |%s - reference| = %.3g > %.3g" % (name, diff, limit)
        worst = max(worst, diff)
    return worst, why


def measure(torch, setup, t, causal, ref, which, graph_ms, replays):
    """One library on one shape: (ms per call, max abs diff vs ref or None, why it fails or None,
    its outputs cloned if they may serve as the reference, else None)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    start = torch.cuda.Event(enable_timing=True)
    stop = torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(stream):
        call, unpack = setup(t, causal)
        for _ in range(WARMUP_CALLS):
            out = call()
        out = None
        start.record()
        for _ in range(ESTIMATE_CALLS):
            out = call()
        stop.record()
        out = None
    stop.synchronize()
    calls = calls_for(start.elapsed_time(stop) / ESTIMATE_CALLS, graph_ms)
    graph, out, ms = capture_and_time(torch, stream, call, calls, replays)
    if ms * calls < RECAPTURE_BELOW * graph_ms and calls < MAX_CALLS:
        graph = out = None
        calls = calls_for(ms, graph_ms)
        graph, out, ms = capture_and_time(torch, stream, call, calls, replays)
    torch.cuda.synchronize()
    outs = unpack(out)
    diff, why = check(torch, outs, ref, which)
    mine = tuple(x.clone() for x in outs) if ref is None and why is None else None
    return ms, diff, why, mine


def make_tensors(torch, which, b, h, n, d, flash_layout):
    g = torch.Generator(device="cuda").manual_seed(SEED)
    names = ("q", "k", "v", "do") if which == "bwd" else ("q", "k", "v")
    t = {x: torch.randn(b, h, n, d, device="cuda", dtype=torch.float16, generator=g)
         for x in names}
    if flash_layout:  # [B, N, H, D], contiguous: once per shape, outside every graph
        for x in names:
            t[("dot" if x == "do" else x + "t")] = t[x].transpose(1, 2).contiguous()
    torch.cuda.synchronize()
    return t


# ---- output ----

def fmt_ms(ms):
    return "n/a" if ms is None else ("%.4f" % ms if ms < 10 else "%.2f" % ms)


def fmt(x, spec):
    return "n/a" if x is None else spec % x


def ratio(res, x, y):
    """Time of y / time of x (> 1: x is faster), where both ran and passed."""
    a, b = res.get(x), res.get(y)
    if a and b and a["status"] == "ok" and b["status"] == "ok":
        return b["ms"] / a["ms"]
    return None


class Table:
    def __init__(self, stages, libs):
        self.stages, self.libs = stages, libs
        self.w = {x: max(16, len(x)) for x in libs}  # a library: "ms TFLOP/s"
        self.rw = {x: max(20, len(x)) for x in stages}  # a stage's ratios: /FA2 /cuDNN /FA3
        self.shape_w = 34

    def header(self):
        top = "%-*s" % (self.shape_w, "shape")
        sub = "%-*s" % (self.shape_w, "")
        for x in self.libs:
            top += " | %-*s" % (self.w[x], x)
            sub += " | %*s %6s" % (self.w[x] - 7, "ms", "TF/s")
        for x in self.stages:
            top += " | %-*s" % (self.rw[x], x)
            sub += " | %*s %6s %6s" % (self.rw[x] - 14, "/FA2", "/cuDNN", "/FA3")
        top += " | FA3-class"
        sub += " | %9s" % "/cuDNN"
        return "%s\n%s\n%s" % (top, sub, "-" * len(sub))

    def row(self, name, res):
        line = "%-*s" % (self.shape_w, name)
        for x in self.libs:
            r = res[x]
            if r["status"] == "ok":
                line += " | %*s %6.0f" % (self.w[x] - 7, fmt_ms(r["ms"]), r["tflops"])
            else:
                line += " | %*s" % (self.w[x], r["status"])
        for x in self.stages:
            line += " | %*s %6s %6s" % (self.rw[x] - 14,
                                        fmt(ratio(res, x, FA2), "%.3f"),
                                        fmt(ratio(res, x, CUDNN), "%.3f"),
                                        fmt(ratio(res, x, FA3), "%.3f"))
        line += " | %9s" % fmt(ratio(res, FA3, CUDNN), "%.3f")
        return line


def summary(stages, kinds, ratios):
    lines = ["summary: X/Y = time of Y / time of X over the shapes where both ran and passed "
             "(> 1: X is faster)"]
    for x in stages:
        for kind in kinds:
            lines.append("%s, %s shapes: /FA2 %s; /cuDNN %s; /FA3-class %s" % (
                x, kind, geo_min(ratios.get((x, FA2, kind), [])),
                geo_min(ratios.get((x, CUDNN, kind), [])),
                geo_min(ratios.get((x, FA3, kind), []))))
    for kind in kinds:
        lines.append("FA3-class, %s shapes: /cuDNN %s" % (
            kind, geo_min(ratios.get((FA3, CUDNN, kind), []))))
    return "\n".join(lines)


def import_flashcourse():
    """The course's package: as installed (pip install ./python), else this checkout's
    python/flashcourse, a package of the repository (python.flashcourse)."""
    try:
        import flashcourse
    except ImportError:
        from python import flashcourse
    return flashcourse


def main(argv=None):
    args = parse_args(argv)
    try:
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel
        if not torch.cuda.is_available():
            raise RuntimeError("no CUDA device")
    except Exception as e:  # no torch, too old a torch, or no GPU
        print("skipped: no torch/CUDA (%s)" % first_line(e))
        return 0
    flashcourse = import_flashcourse()

    try:
        built = {s.name: s for s in flashcourse.stages()}
    except Exception as e:  # LibraryNotBuiltError, or a library that does not load
        print("compare.py: %s" % first_line(e), file=sys.stderr)
        return EXIT["USAGE"]
    for name, variant in args.stage:
        st = built.get(name)
        why = None
        if st is None:
            why = "not built in %s (built: %s; make lib builds them)" % (
                flashcourse.library_dir(), ", ".join(sorted(built)))
        elif variant and variant not in st.variants:
            why = "has no variant %r (%s)" % (variant, ", ".join(st.variants))
        elif args.which == "bwd" and not st.backward:
            why = "has no backward pass (stages with one: %s)" % (
                ", ".join(s for s in sorted(built) if built[s].backward) or "none built")
        if why:
            print("compare.py: --stage %s: %s" % (label((name, variant)), why), file=sys.stderr)
            return EXIT["USAGE"]

    out_csv = writer = None
    if args.csv:
        try:
            out_csv = open(args.csv, "w", newline="")
        except OSError as e:
            print("compare.py: --csv %s: %s" % (args.csv, e.strerror), file=sys.stderr)
            return EXIT["USAGE"]
        writer = csv.writer(out_csv)
        writer.writerow(CSV_COLUMNS)
        out_csv.flush()

    gpu = torch.cuda.get_device_name(0)
    print("GPU: %s, torch %s (CUDA %s); %s pass, fp16%s; a time: median of %d replays of a CUDA "
          "graph of R calls (R for ~%g ms a replay) / R%s" % (
              gpu, torch.__version__, torch.version.cuda,
              "backward" if args.which == "bwd" else "forward",
              ", softcap %g" % args.softcap if args.softcap else "", args.replays, args.graph_ms,
              "; the fastest of %d rounds" % args.rounds if args.rounds > 1 else ""))
    stage_names = [label(s) for s in args.stage]
    setups = {}
    for (name, variant), x in zip(args.stage, stage_names):
        setups[x] = stage_setup(torch, flashcourse, name, variant, args.which, args.softcap)
    cudnn = getattr(SDPBackend, "CUDNN_ATTENTION", None)
    skipped = {}
    if args.softcap:
        skipped[FA2] = skipped[CUDNN] = "SDPA has no softcap"
    else:
        setups[FA2] = sdpa_setup(torch, sdpa_kernel, SDPBackend.FLASH_ATTENTION, args.which)
        if cudnn is None:
            skipped[CUDNN] = "this torch has no SDPBackend.CUDNN_ATTENTION"
        else:
            setups[CUDNN] = sdpa_setup(torch, sdpa_kernel, cudnn, args.which)
    try:
        from flash_attn.cute import flash_attn_func
        setups[FA3] = fa3_setup(torch, flash_attn_func, args.which, args.softcap)
    except Exception as e:  # not installed, or it does not load here
        skipped[FA3] = "flash_attn.cute not importable: %s" % first_line(e)
    for x, why in skipped.items():
        print("%s: skipped (%s)" % (x, why))
    print("checks: each output against the first of FA2, cuDNN, FA3-class, then the stages, that "
          "ran the shape; tolerance %s" % (
              "%g x max(1, max |reference|) per gradient" % GRAD_TOL if args.which == "bwd"
              else "%g absolute on O" % FWD_TOL))

    libs = stage_names + [FA2, CUDNN, FA3]  # the table's order
    order = [FA2, CUDNN, FA3] + stage_names  # the run's: the reference candidates first
    table = Table(stage_names, libs)
    print(table.header(), flush=True)
    ratios = {}  # (X, Y, kind) -> [time of Y / time of X]
    failures = 0
    kinds = []
    try:
        for kind, b, h, n, d, causal in compare_fa2.shapes(args):
            if kind not in kinds:
                kinds.append(kind)
            name = "%s B=%d H=%d N=%d D=%d%s" % (kind, b, h, n, d, " causal" if causal else "")
            fl = pass_flops(args.which, b, h, n, d, causal)
            res = {x: {"status": "n/a", "ms": None, "tflops": None, "diff": None}
                   for x in libs}
            ref = ref_name = None
            try:
                t = make_tensors(torch, args.which, b, h, n, d,
                                 FA3 in setups or bool(args.softcap))
            except torch.cuda.OutOfMemoryError as e:
                t = None
                print("  %s: inputs: OOM (%s)" % (name, first_line(e)), file=sys.stderr)
                for x in libs:
                    res[x]["status"] = "OOM"
            # Round 0 runs the reference candidates first; later rounds reverse the order every
            # other time, and keep a library's fastest time (a failed check in any round stays).
            runs = [(rnd, x) for rnd in range(args.rounds)
                    for x in (order if rnd % 2 == 0 else order[::-1])]
            for rnd, x in runs if t is not None else ():
                if x not in setups or (rnd > 0 and res[x]["status"] != "ok"):
                    continue
                r = res[x]
                try:
                    ms, diff, why, mine = measure(torch, setups[x], t, bool(causal), ref,
                                                  args.which, args.graph_ms, args.replays)
                except torch.cuda.OutOfMemoryError as e:
                    if rnd == 0:  # (a later round keeps an earlier round's result)
                        r["status"] = "OOM"
                    print("  %s, %s: OOM (%s)" % (x, name, first_line(e)), file=sys.stderr)
                except Exception as e:  # the library cannot run this shape here
                    if rnd == 0:
                        r["status"] = "n/a"
                    print("  %s, %s: n/a (%s)" % (x, name, first_line(e)), file=sys.stderr)
                else:
                    if why or r["ms"] is None or ms < r["ms"]:  # else an earlier round was faster
                        r.update(ms=ms, tflops=course_measure.tflops(fl, ms), diff=diff,
                                 status="FAIL" if why else "ok")
                    if why:
                        failures += 1
                        print("FAIL  %s, %s: %s (reference: %s)" % (x, name, why,
                                                                    ref_name or "none"),
                              file=sys.stderr, flush=True)
                    if mine is not None:
                        ref, ref_name = mine, x
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
            if t is not None and ref_name is not None and sum(
                    res[x]["status"] in ("ok", "FAIL") for x in libs) == 1:
                print("  %s: only %s ran: nothing to check it against" % (name, ref_name),
                      file=sys.stderr)
            t = ref = None
            gc.collect()  # once per shape, outside every capture (see capture_and_time)
            torch.cuda.empty_cache()
            print(table.row(name, res), flush=True)
            for x in stage_names:
                for y in (FA2, CUDNN, FA3):
                    ratios.setdefault((x, y, kind), []).append(ratio(res, x, y))
            ratios.setdefault((FA3, CUDNN, kind), []).append(ratio(res, FA3, CUDNN))
            if writer:
                for x in libs:
                    r = res[x]
                    writer.writerow([gpu, args.which, kind, b, h, n, d, causal, x,
                                     "" if r["ms"] is None else "%.5f" % r["ms"],
                                     "" if r["tflops"] is None else "%.1f" % r["tflops"],
                                     r["status"],
                                     "" if r["diff"] is None else "%.3g" % r["diff"],
                                     ref_name or ""])
                out_csv.flush()
    except KeyboardInterrupt:  # timeout -s INT: keep what was measured
        print("interrupted: the summary covers the shapes above", file=sys.stderr)
    finally:
        if out_csv:
            out_csv.close()
    print(summary(stage_names, kinds, ratios))
    if failures:
        print("%d result(s) over tolerance or not finite: the FAIL lines on stderr" % failures,
              file=sys.stderr)
        return EXIT["WRONG"]
    return 0


if __name__ == "__main__":
    sys.exit(main())
