#!/usr/bin/env python3
"""Tests of python/examples/train_gpt.py that run without a GPU or the stage libraries.

    python3 python/tests/test_train_gpt.py

--help names --dtype, --kv-heads and --backward-stage (auto: stage 8 on Hopper); bad options
(--kv-heads not dividing --heads, or below 1, an unknown --dtype) exit 2 with argparse's error;
without PyTorch (hidden from the import here, whether or not it is installed) one line naming it,
exit 2; the refusal before training of a stage whose descriptor does not take bf16 or grouped-query
heads (fake descriptors: no library needed); and, where PyTorch is installed, the hidden
--sdpa-only path on a tiny model with --dtype bf16 and --kv-heads (bf16 autocast on a CPU, both
runs SDPA, so their losses agree exactly). Ends with "N passed, M failed, K skipped".
"""

import csv
import importlib.util
import os
import subprocess
import sys
import tempfile
from types import SimpleNamespace

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TRAIN_GPT = os.path.join(ROOT, "python", "examples", "train_gpt.py")
sys.path.insert(0, os.path.join(ROOT, "python"))

from harness import Skip, run, summary  # noqa: E402  (the runner, shared with the other tests)


def script(args, hide_torch=False, timeout=120):
    """(exit code, stdout, stderr) of `python3 train_gpt.py args`, PyTorch hidden from its
    imports if hide_torch."""
    if hide_torch:
        code = ("import runpy, sys; sys.modules['torch'] = None; sys.argv = sys.argv[1:]; "
                "runpy.run_path(sys.argv[0], run_name='__main__')")
        cmd = [sys.executable, "-c", code, TRAIN_GPT] + args
    else:
        cmd = [sys.executable, TRAIN_GPT] + args
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    return r.returncode, r.stdout, r.stderr


def load_hidden_torch():
    """train_gpt.py as a module, loaded with PyTorch hidden (its checks before training need
    none; nor does the import of this test, wherever it runs)."""
    saved = sys.modules.get("torch", False)
    sys.modules["torch"] = None
    try:
        spec = importlib.util.spec_from_file_location("train_gpt", TRAIN_GPT)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    finally:
        if saved is False:
            del sys.modules["torch"]
        else:
            sys.modules["torch"] = saved
    return mod


def t_help():
    rc, out, err = script(["--help"], hide_torch=True)
    assert rc == 0 and out.startswith("usage:"), (rc, out[:200], err)
    for opt in ("--dtype {f16,bf16}", "--kv-heads H_KV", "enable_gqa=True", "no scaler",
                "--backward-stage BACKWARD_STAGE", "stage8_hopper_backward on a Hopper GPU",
                "--bound", "the most any attention could give this model"):
        assert opt in " ".join(out.split()), f"--help does not say {opt!r}"


def t_bad_options():
    bad = {("--kv-heads", "3"): "--kv-heads must divide --heads",
           ("--heads", "4", "--kv-heads", "8"): "8 does not divide 4",
           ("--kv-heads", "0"): "--kv-heads must be at least 1",
           ("--dtype", "fp8"): "argument --dtype: invalid choice",
           ("--dtype", "f32"): "argument --dtype: invalid choice",
           ("--kv-heads", "x"): "argument --kv-heads: invalid int value"}
    for args, want in bad.items():
        rc, out, err = script(list(args), hide_torch=True)
        assert rc == 2, f"{args}: exit {rc}, want 2 (stdout {out!r})"
        assert err.startswith("usage:") and want in err, f"{args}: stderr {err!r}"
        assert not out, f"{args}: stdout {out!r}"


def t_no_torch():
    rc, out, err = script(["--dtype", "bf16", "--kv-heads", "2"], hide_torch=True)
    lines = err.splitlines()
    assert rc == 2 and len(lines) == 1 and "needs PyTorch" in lines[0], (rc, out, err)
    assert not out, out


def t_stage_refusal():
    mod = load_hidden_torch()
    fc = mod.flashcourse
    from flashcourse import _library as b
    hopper = b.TAKES_BF16 | b.TAKES_GQA | b.TAKES_STRIDES | b.TAKES_N_K

    def stage(name, takes=0, backward_takes=0):
        return fc.Stage(name=name, dtype="float16", variants=("default",), adds="", path="",
                        backward=bool(backward_takes), takes=takes, backward_takes=backward_takes)

    s5, s6, s7 = stage("stage5_tuned"), stage("stage6_hopper", hopper), \
        stage("stage7_backward", backward_takes=hopper)
    s7_f16_only = stage("stage7_backward", backward_takes=b.TAKES_GQA | b.TAKES_STRIDES)
    s8 = stage("stage8_hopper_backward", hopper, hopper)
    s8_f16_only = stage("stage8_hopper_backward", hopper, b.TAKES_GQA | b.TAKES_STRIDES)

    def why(built, stage_name, dtype="f16", kv_heads=8, auto=False,
            backward="stage7_backward", backward_auto=False):
        args = SimpleNamespace(stage=stage_name, dtype=dtype, heads=8, kv_heads=kv_heads,
                               backward_stage=backward)
        real = fc.stages
        fc.stages = lambda: built
        try:
            return mod.stages_take(args, auto, backward_auto)
        finally:
            fc.stages = real

    everything = [s5, s6, s7, s8]
    assert why(everything, "stage5_tuned") is None  # the plain case: every stage
    assert why(everything, "stage6_hopper", "bf16", 2) is None
    w = why(everything, "stage5_tuned", "bf16", auto=True)
    for part in ("--dtype bf16: stage5_tuned", "--stage auto", "bfloat16", "forward pass",
                 "descriptor's takes flags", "the built stages that do: stage6_hopper"):
        assert w and part in w, (part, w)
    w = why(everything, "stage5_tuned", kv_heads=2)
    for part in ("--kv-heads 2: stage5_tuned", "grouped-query heads (2 key/value heads for 8",
                 "forward pass"):
        assert w and part in w, (part, w)
    assert "--stage auto" not in w, w  # named, not chosen: no word about auto
    w = why([s5, s6, s7_f16_only], "stage6_hopper", "bf16")
    assert w and "stage7_backward" in w and "backward pass" in w and \
        "the built stages that do: none" in w, w
    assert why([s5, s7], "stage6_hopper", "bf16", 2) is None  # not built: the probe says so
    # the backward stage is the one named (--backward-stage, or auto's choice), stage 8 included
    assert why(everything, "stage6_hopper", "bf16", 2, backward="stage8_hopper_backward",
               backward_auto=True) is None
    w = why([s5, s6, s7, s8_f16_only], "stage6_hopper", "bf16",
            backward="stage8_hopper_backward", backward_auto=True)
    for part in ("--dtype bf16: stage8_hopper_backward", "--backward-stage auto", "backward pass",
                 "the built stages that do: stage7_backward"):
        assert w and part in w, (part, w)
    assert "--stage auto" not in w, w
    w = why(everything, "stage6_hopper", "bf16", backward="stage5_tuned")
    assert w and "stage5_tuned" in w and "backward pass" in w, w
    assert "--backward-stage auto" not in w, w


def t_sdpa_only_cpu():
    if importlib.util.find_spec("torch") is None:
        raise Skip("no PyTorch here (the command line without it is tested above)")
    with tempfile.TemporaryDirectory() as out:
        args = ["--sdpa-only", "--dtype", "bf16", "--heads", "2", "--kv-heads", "1",
                "--layers", "1", "--steps", "10", "--seq", "256", "--batch", "2", "--out", out,
                "--bound"]
        rc, stdout, err = script(args, timeout=300)
        assert rc == 0, f"exit {rc}\n{stdout[-2000:]}\n{err[-2000:]}"
        assert "bf16 autocast" in stdout and "enable_gqa=True" in stdout, stdout[-2000:]
        # --bound: the third run (o = q) in the turns, its line and its CSV line
        assert "none: o = q, no attention (--bound)" in stdout, stdout[-2000:]
        assert "--bound: without attention (o = q)" in stdout and "attention a step: course" \
            in stdout, stdout[-2000:]
        with open(os.path.join(out, "train_gpt.csv")) as f:
            lines = f.read().splitlines()
        model = next(x for x in lines if x.startswith("# model: "))
        assert any(x.startswith("# bound: without attention") for x in lines), lines[:8]
        assert "2 heads x 64" in model and "1 key/value head," in model and ", bf16;" in model, \
            model
        rows = list(csv.DictReader(x for x in lines if not x.startswith("#")))
        assert len(rows) == 10, len(rows)
        assert all(r["loss_course"] == r["loss_sdpa"] for r in rows), rows


def main():
    for name, fn in (("train_gpt.py --help names --dtype, --kv-heads and --backward-stage",
                      t_help),
                     ("train_gpt.py bad --kv-heads / --dtype: argparse's error, exit 2",
                      t_bad_options),
                     ("train_gpt.py without PyTorch: one line, exit 2", t_no_torch),
                     ("train_gpt.py refuses a forward or backward stage whose descriptor does "
                      "not take bf16 or grouped-query heads, in one line", t_stage_refusal),
                     ("train_gpt.py --sdpa-only --dtype bf16 --kv-heads 1 --bound on a tiny model",
                      t_sdpa_only_cpu)):
        run(name, fn)
    return summary()


if __name__ == "__main__":
    sys.exit(main())
