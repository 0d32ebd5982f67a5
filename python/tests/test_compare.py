#!/usr/bin/env python3
"""Tests of the comparison scripts that run without a GPU: tools/compare.py (in-process, CUDA
graphs) and tools/compare_fa2.py (stage programs as subprocesses), run as they are run, as modules
from the repository root (python3 -m tools.compare).

    python3 python/tests/test_compare.py

--help works (every option named); --softcap parses, and its setups call flash_attn_func as
they should (stand-ins for torch and flashcourse that record the calls); without PyTorch (hidden
from the import here, whether or not it is installed) each prints one line "skipped: ..." and
exits 0, as it does with PyTorch but no GPU; bad arguments exit 2 with argparse's error; the
shape lists (fa2: B*N = 16384, H = 2048 / D; long: B = H = 1, D = 128, N = 1k..256k; --quick,
--long, --no-fa2-shapes, --no-long-shapes); the FLOP count of each pass; the number of calls in
a graph; the cross-check's tolerances (on CPU tensors, where PyTorch is here). Ends with "N
passed, M failed, K skipped".
"""

import importlib
import math
import os
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
COMPARE = "tools.compare"  # the modules, imported from the repository root
COMPARE_FA2 = "tools.compare_fa2"
LONG_NS = [1024, 2048, 4096, 8192, 16384, 24576, 32768, 49152, 65536, 131072, 262144]
FA2_NS = [1024, 2048, 4096, 8192, 16384]
TOKENS, WIDTH = 16384, 2048  # the fa2 shapes: B * N tokens, H * D model width

from harness import Skip, run, summary  # noqa: E402  (the runner, shared with the other test)


def script(module, args, hide_torch=False):
    """(exit code, stdout, stderr) of `python3 -m module args` from the repository root, PyTorch
    hidden from its imports if hide_torch."""
    if hide_torch:
        code = ("import runpy, sys; sys.modules['torch'] = None; "
                f"runpy.run_module({module!r}, run_name='__main__', alter_sys=True)")
        cmd = [sys.executable, "-c", code] + args
    else:
        cmd = [sys.executable, "-m", module] + args
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT)
    return r.returncode, r.stdout, r.stderr


sys.path.insert(0, ROOT)  # the scripts' package (tools) and what they import (plots)
cmp = importlib.import_module(COMPARE)


def have_torch():
    try:
        import torch
    except ImportError:
        return None
    return torch


# ---- the command line ----

def t_help():
    for path in (COMPARE, COMPARE_FA2):
        rc, out, err = script(path, ["--help"], hide_torch=True)
        assert rc == 0, f"{path} --help: exit {rc}: {err}"
        assert out.startswith("usage:"), out[:200]
    rc, out, _ = script(COMPARE, ["--help"], hide_torch=True)
    for opt in ("--stage", "--pass", "--quick", "--long", "--no-fa2-shapes", "--no-long-shapes",
                "--shape", "--graph-ms", "--replays", "--rounds", "--softcap", "--csv"):
        assert opt in out, f"--help does not name {opt}"


def t_no_torch():
    for path, args in ((COMPARE, []), (COMPARE, ["--pass", "bwd", "--csv", os.devnull]),
                       (COMPARE, ["--stage", "stage5_tuned", "--stage", "stage6_hopper"]),
                       (COMPARE_FA2, [])):
        rc, out, err = script(path, args, hide_torch=True)
        assert rc == 0, f"{path} {args} without torch: exit {rc}: {err}"
        lines = out.splitlines()
        assert len(lines) == 1 and lines[0].startswith("skipped:"), f"stdout: {out!r}"
        assert not err, f"stderr: {err!r}"


def t_no_gpu():
    torch = have_torch()
    if torch is None:
        raise Skip("no PyTorch here (the run without it is tested above)")
    if torch.cuda.is_available():
        raise Skip("a CUDA GPU is here: the script would run the comparison")
    rc, out, err = script(COMPARE, ["--pass", "bwd"])
    lines = out.splitlines()
    assert rc == 0 and len(lines) == 1 and lines[0].startswith("skipped:"), (rc, out, err)


def t_bad_arguments():
    bad = [["--pass", "sideways"], ["--stage", "5"], ["--stage", "stage5_tuned@"],
           ["--stage", "stage5_tuned@a@b"], ["--stage", "build/stage5_tuned"],
           ["--replays", "0"], ["--replays", "2.5"], ["--graph-ms", "-1"], ["--graph-ms", "x"],
           ["--rounds", "0"], ["--rounds", "1.5"],
           ["--no-fa2-shapes", "--no-long-shapes"],
           ["--stage", "stage5_tuned", "--stage", "stage5_tuned"], ["--bogus"], ["--csv"],
           ["--softcap", "0"], ["--softcap", "-30"], ["--softcap", "x"],
           ["--softcap", "30", "--stage", "stage6_hopper@nopdl"],
           ["--shape", "1,1,1024"], ["--shape", "1,1,1024,64,2"], ["--shape", "0,1,1024,64"],
           ["--shape", "1,1,1024,60"], ["--shape", "1,1,1024,64,0,1"], ["--shape", "a,1,1,64"]]
    for args in bad:
        rc, out, err = script(COMPARE, args, hide_torch=True)
        assert rc == 2, f"{args}: exit {rc}, want 2 (stdout {out!r})"
        assert "error:" in err and err.startswith("usage:"), f"{args}: stderr {err!r}"
        assert not out, f"{args}: stdout {out!r}"


def t_stage_specs():
    a = cmp.parse_args([])
    assert a.stage == [("stage5_tuned", None)] and a.which == "fwd", a
    a = cmp.parse_args(["--pass", "bwd"])
    assert a.stage == [("stage7_backward", None)] and a.which == "bwd", a
    a = cmp.parse_args(["--pass", "bwd", "--stage", "stage7_backward",
                        "--stage", "stage7_backward@deterministic"])
    assert a.stage == [("stage7_backward", None), ("stage7_backward", "deterministic")], a.stage
    assert [cmp.label(s) for s in a.stage] == ["stage7_backward",
                                               "stage7_backward@deterministic"]
    a = cmp.parse_args(["--graph-ms", "5", "--replays", "3"])
    assert (a.graph_ms, a.replays, a.rounds) == (5.0, 3, 1), a
    assert cmp.parse_args(["--rounds", "3"]).rounds == 3


# ---- the shapes ----

def shapes(*argv):
    return cmp.compare_fa2.shapes(cmp.parse_args(list(argv)))


def check_fa2(rows, ns):
    want = sorted((d, c, n) for d in (64, 128) for c in (0, 1) for n in ns)
    assert sorted((d, c, n) for _, _, _, n, d, c in rows) == want, rows
    for kind, b, h, n, d, c in rows:
        assert kind == "fa2" and b * n == TOKENS and h * d == WIDTH, (kind, b, h, n, d, c)


def check_long(rows, ns):
    assert [n for _, _, _, n, _, _ in rows] == ns, rows
    for kind, b, h, n, d, c in rows:
        assert (kind, b, h, d, c) == ("long", 1, 1, 128, 0), (kind, b, h, n, d, c)


def split(rows):
    fa2 = [r for r in rows if r[0] == "fa2"]
    long_ = [r for r in rows if r[0] == "long"]
    assert rows == fa2 + long_, "the fa2 shapes come first"
    return fa2, long_


def t_shapes():
    fa2, long_ = split(shapes())
    check_fa2(fa2, FA2_NS)
    check_long(long_, [262144])
    fa2, long_ = split(shapes("--quick"))
    check_fa2(fa2, [1024, 2048, 4096])
    check_long(long_, [])
    fa2, long_ = split(shapes("--long"))
    check_fa2(fa2, FA2_NS)
    check_long(long_, LONG_NS)
    fa2, long_ = split(shapes("--long", "--no-fa2-shapes"))
    assert not fa2
    check_long(long_, LONG_NS)
    fa2, long_ = split(shapes("--long", "--quick"))
    check_fa2(fa2, [1024, 2048, 4096])
    check_long(long_, [1024, 2048, 4096])
    fa2, long_ = split(shapes("--no-long-shapes"))
    check_fa2(fa2, FA2_NS)
    assert not long_
    # the same list as compare_fa2.py's, which the subprocess mode and the plots use
    fa2_mod = cmp.compare_fa2
    for argv in ([], ["--quick"], ["--long"], ["--long", "--no-fa2-shapes"], ["--no-long-shapes"]):
        assert fa2_mod.shapes(cmp.parse_args(argv)) == fa2_mod.shapes(fa2_mod.parse_args(argv)), argv
    assert list(fa2_mod.LONG_NS) == LONG_NS
    # --shape: its own kind, after the sweeps' shapes, or alone
    rows = shapes("--quick", "--shape", "1,33,16384,64", "--shape", "2,4,1000,96,1")
    assert rows[-2:] == [("shape", 1, 33, 16384, 64, 0), ("shape", 2, 4, 1000, 96, 1)], rows
    split(rows[:-2])
    rows = shapes("--no-fa2-shapes", "--no-long-shapes", "--shape", "1,1,512,128,1")
    assert rows == [("shape", 1, 1, 512, 128, 1)], rows


# ---- the arithmetic ----

def t_flops():
    b, h, n, d = 16, 32, 1024, 64
    fwd = 4.0 * b * h * n * n * d
    assert cmp.pass_flops("fwd", b, h, n, d, 0) == fwd
    assert cmp.pass_flops("fwd", b, h, n, d, 1) == fwd / 2
    assert cmp.pass_flops("bwd", b, h, n, d, 0) == 2.5 * fwd
    assert cmp.pass_flops("bwd", b, h, n, d, 1) == 2.5 * fwd / 2


def t_calls():
    assert cmp.calls_for(0.1, 20.0) == 200
    assert cmp.calls_for(40.0, 20.0) == 1, "a call longer than a replay: one call"
    assert cmp.calls_for(1e-6, 20.0) == cmp.MAX_CALLS
    assert cmp.calls_for(0.0, 20.0) == cmp.MAX_CALLS
    assert cmp.calls_for(float("nan"), 20.0) == cmp.MAX_CALLS


def t_graph_protocol():
    import tempfile
    got = cmp.graph_protocol()  # from common/main.c, as the module's constants were
    assert (got["GRAPH_MS"], int(got["GRAPH_REPLAYS"]), int(got["GRAPH_MAX_CALLS"]),
            got["GRAPH_RECAPTURE_BELOW"]) == (cmp.GRAPH_MS, cmp.REPLAYS, cmp.MAX_CALLS,
                                              cmp.RECAPTURE_BELOW), got
    with tempfile.NamedTemporaryFile("w", suffix=".c") as f:
        f.write("#define GRAPH_MS 5.0\n#define GRAPH_REPLAYS 3\n")
        f.flush()
        try:
            cmp.graph_protocol(f.name)
        except SystemExit as e:
            assert "GRAPH_MAX_CALLS, GRAPH_RECAPTURE_BELOW" in str(e) and f.name in str(e), e
        else:
            raise AssertionError("a file without the constants was taken")


def t_summaries():
    assert cmp.geo_min([]) == "no ratio"
    assert cmp.geo_min([None, None]) == "no ratio"
    s = cmp.geo_min([0.5, 2.0, None])
    assert s == "geometric mean 1.000, minimum 0.500 (2 shapes)", s
    res = {"a": {"status": "ok", "ms": 2.0}, "b": {"status": "ok", "ms": 1.0},
           "c": {"status": "FAIL", "ms": 1.0}, "d": {"status": "n/a", "ms": None}}
    assert math.isclose(cmp.ratio(res, "b", "a"), 2.0), "b is twice as fast as a"
    assert cmp.ratio(res, "a", "c") is None and cmp.ratio(res, "a", "d") is None
    assert cmp.ratio(res, "a", "missing") is None


def t_check():
    torch = have_torch()
    if torch is None:
        raise Skip("no PyTorch here")
    g = torch.Generator().manual_seed(0)
    o = torch.randn(2, 3, 40, 16, generator=g).half()
    diff, why = cmp.check(torch, (o,), (o.clone(),), "fwd")
    assert diff == 0.0 and why is None, (diff, why)
    diff, why = cmp.check(torch, (o + 0.01,), (o,), "fwd")
    assert why is None and 0.005 < diff < cmp.FWD_TOL, (diff, why)
    diff, why = cmp.check(torch, (o + 0.05,), (o,), "fwd")
    assert why and "O" in why, (diff, why)
    bad = o.clone()
    bad[0, 0, 0, 0] = float("nan")
    assert cmp.check(torch, (bad,), (o,), "fwd")[1], "a NaN passed"
    assert cmp.check(torch, (bad,), None, "fwd")[1], "a NaN passed with no reference"
    assert cmp.check(torch, (o,), None, "fwd") == (None, None)
    # gradients: the tolerance grows with the reference's largest value
    small = (o / float(o.abs().max()) * 0.5).half()  # max |ref| = 0.5: limit 1 x GRAD_TOL
    big = (o * (10.0 / float(o.abs().max()))).half()  # max |ref| = 10: limit 10 x GRAD_TOL
    grads = (small, big, small)
    diff, why = cmp.check(torch, (small, big + 0.3, small), grads, "bwd")
    assert why is None and diff > 0.25, (diff, why)
    diff, why = cmp.check(torch, (small, big + 0.7, small), grads, "bwd")
    assert why and "dK" in why, (diff, why)
    diff, why = cmp.check(torch, (small, big, small + 0.04), grads, "bwd")
    assert why is None, (diff, why)
    diff, why = cmp.check(torch, (small, big, small + 0.1), grads, "bwd")
    assert why and "dV" in why, (diff, why)


def t_softcap():
    a = cmp.parse_args(["--softcap", "30", "--pass", "bwd", "--stage",
                        "stage8_hopper_backward@deterministic"])
    assert a.softcap == 30.0 and a.stage == [("stage8_hopper_backward", "deterministic")], a
    assert cmp.parse_args([]).softcap is None

    # The setups with stand-ins for torch and flashcourse (no GPU, no PyTorch needed): a tensor
    # is a name, transpose(1, 2) marks it, autograd.grad and flash_attn_func record their calls.
    class T:
        def __init__(self, name):
            self.name = name

        def detach(self):
            return self

        def requires_grad_(self):
            return T(self.name + "*")

        def transpose(self, a, b):
            assert (a, b) == (1, 2), (a, b)
            return "bhnd(%s)" % self.name

    calls = []

    class Course:
        def flash_attn_func(self, q, k, v, **kw):
            calls.append(("fwd", q.name, k.name, v.name, kw))
            return T("o")

    def grad(o, inputs, do, retain_graph):
        calls.append(("grad", o.name, tuple(x.name for x in inputs), do.name, retain_graph))
        return tuple(T("d" + x.name) for x in inputs)

    torch = type("torch", (), {"autograd": type("autograd", (), {"grad": staticmethod(grad)})})
    t = {x: T(x) for x in ("q", "k", "v", "qt", "kt", "vt", "dot")}
    call, unpack = cmp.stage_setup(torch, Course(), "stage6_hopper", None, "fwd", 30.0)(t, True)
    assert not calls, "nothing runs before the calls"
    assert unpack(call()) == ("bhnd(o)",)
    assert calls == [("fwd", "qt", "kt", "vt",
                      dict(causal=True, softcap=30.0, stage="stage6_hopper"))], calls
    calls.clear()
    call, unpack = cmp.stage_setup(torch, Course(), "stage8_hopper_backward", "deterministic",
                                   "bwd", 50.0)(t, False)
    assert calls == [("fwd", "qt*", "kt*", "vt*",
                      dict(causal=False, softcap=50.0, backward_stage="stage8_hopper_backward",
                           backward_variant="deterministic"))], calls
    assert unpack(call()) == ("bhnd(dqt*)", "bhnd(dkt*)", "bhnd(dvt*)")
    assert unpack(call()) and len(calls) == 3, "the forward once, a backward per call"
    assert calls[1] == ("grad", "o", ("qt*", "kt*", "vt*"), "dot", True), calls[1]
    calls.clear()
    call, _ = cmp.stage_setup(torch, Course(), "stage8_hopper_backward", None, "bwd", 50.0)(t, 1)
    assert calls[0][4]["backward_variant"] == "default", calls
    calls.clear()
    call, unpack = cmp.stage_setup(torch, Course(), "stage5_tuned", None, "fwd")(t, True)
    assert not calls  # no softcap: attention() on the [B, H, N, D] tensors, as before


def t_csv_columns():
    need = ["gpu", "pass", "shape", "B", "H", "N", "D", "causal", "library", "ms", "tflops",
            "status", "max_abs_diff_vs_reference"]
    assert cmp.CSV_COLUMNS[:len(need)] == need, cmp.CSV_COLUMNS


def main():
    for name, fn in (("--help (compare.py and compare_fa2.py)", t_help),
                     ("without PyTorch: one line 'skipped: ...', exit 0", t_no_torch),
                     ("with PyTorch but no GPU: one line 'skipped: ...', exit 0", t_no_gpu),
                     ("bad arguments: argparse's error, exit 2", t_bad_arguments),
                     ("--stage NAME[@VARIANT] and the default stage of each pass", t_stage_specs),
                     ("the shape lists (fa2, long, --quick, --long, --no-*-shapes)", t_shapes),
                     ("FLOPs: forward 4 B H N^2 D (causal: half), backward 2.5x", t_flops),
                     ("calls per graph", t_calls),
                     ("the graph protocol, read from common/main.c", t_graph_protocol),
                     ("ratios and their geometric mean", t_summaries),
                     ("the cross-check's tolerances, NaN", t_check),
                     ("--softcap: the stages' calls through flash_attn_func", t_softcap),
                     ("the CSV's columns", t_csv_columns)):
        run(name, fn)
    return summary()


if __name__ == "__main__":
    sys.exit(main())
