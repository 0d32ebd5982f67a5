#!/usr/bin/env python3
"""Random shapes through the stages' programs, each checked whole against the float64 reference.

    python3 common/tests/fuzz.py BUILD_DIR [--cases N] [--seed S] [--jobs J] [--extra ARGS]
                                 [--wrap CMD] [--max-work W] STAGE...

Each case is one run of a stage's program with `--check all`: B, H, H_kv (GQA and MQA), N and
N_k (N_k != N, one token, tile tails), every head dim of the contract (a multiple of 8 from 32 to
256: a stage runs the dims it compiled and masks the rest), causal, local windows, softcap, bf16,
the three layouts, packed batches (`--varlen random`: empty sequences among them), peaky inputs, an
explicit scale, and a variant taken at random from the stage's list (one that refuses the shape, its
reason naming it, gives way to the default: the case runs, the refusal is counted); for a stage
with a decode path (a KV cache), the decode shapes instead: 1 to 16 queries, contiguous or paged
caches (pages of 1 to 256 keys), ragged lengths, new tokens written into the cache, causal. Stages
0-4 take the plain shapes only (what they accept). The cases come from --seed alone: a failure
prints the command that reproduces it.

Exit code 0 passes, 3 (unsupported: a head dim, type or feature this stage or GPU does not run) is
counted as skipped, anything else fails: a wrong result (1), a refused option (2: the fuzzer asked
for a shape the contract allows), out of memory (4), a crash or a timeout. --extra appends options
to every run (`--smem-limit 65536` for the T4 path on a PTX build); --wrap runs each under a
tool (`--wrap "compute-sanitizer --error-exitcode 9" --max-work 2e7`: random shapes under memcheck,
smaller ones, any error reported failing the case). Ends with "N passed, M failed, K skipped",
each stage's counts and the skips' reasons above it; exits 1 if any failed, 3 if none ran (no
GPU, or nothing this build runs).
"""

import argparse
import os
import random
import re
import shlex
import subprocess
import sys
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from labs import EXIT_CODES as EXIT  # noqa: E402  the programs' exit codes, read from attention.h

HEAD_DIMS = list(range(32, 257, 8))
COMPILED_DIMS = [64, 96, 128, 256]  # drawn more often: the kernels a stage compiles first
# the float64 reference's work a case may cost (B x H x N x N_k x D): a few seconds on two threads
MAX_WORK = 2.5e9
WRAP = []  # --wrap: the command every run goes under


def stage_number(stage):
    return int(re.match(r"stage(\d+)_", stage).group(1))


def variants_of(prog):
    out = subprocess.run([prog, "--help"], capture_output=True, text=True).stdout
    m = re.search(r"--variant NAME\s+one of: (\S+)", out)
    return m.group(1).split(",") if m else ["default"]


def has_decode(prog):
    """A stage with a KV-cache path takes --page-size (one without refuses it: exit 2)."""
    r = subprocess.run([prog, "--page-size", "16", "--seq-k", "64", "--dim", "64", "--check", "0"],
                       capture_output=True, text=True)
    return r.returncode != EXIT["USAGE"]


def head_dim(rng):
    return rng.choice(COMPILED_DIMS) if rng.random() < 0.5 else rng.choice(HEAD_DIMS)


def length(rng, most):
    """A token count: short, near a tile's edge, or anything up to `most`."""
    r = rng.random()
    if r < 0.2:
        return rng.randint(1, 8)
    if r < 0.5:
        return max(1, rng.choice([64, 128, 176, 192, 256, 512, 1024]) + rng.randint(-1, 1))
    return rng.randint(1, most)


def plain_case(rng):
    """What stages 0-4 take: B, H, N, D, causal, scale, the input distribution."""
    B, H = rng.randint(1, 3), rng.randint(1, 4)
    D = rng.choice([64, 128]) if rng.random() < 0.8 else head_dim(rng)  # their two, and refusals
    N = length(rng, 1500)
    while B * H * N * N * D > MAX_WORK:
        N = max(1, N // 2)
    a = ["--batch", B, "--heads", H, "--seq", N, "--dim", D]
    if rng.random() < 0.5:
        a.append("--causal")
    if rng.random() < 0.15:
        a += ["--scale", f"{rng.uniform(0.01, 0.5):.4f}"]
    if rng.random() < 0.2:
        a += ["--dist", "peaky"]
    return a


def model_case(rng):
    """Stages 5-8: what models feed, windows, softcap, packed batches."""
    D = head_dim(rng)
    H_kv = rng.randint(1, 4)
    H = H_kv * rng.choice([1, 1, 2, 4, 8])
    B = rng.randint(1, 3)
    a = []
    varlen = rng.random() < 0.2
    if varlen:
        B = rng.randint(1, 8)
        N = length(rng, 2000)
        N_k = length(rng, 2000) if rng.random() < 0.5 else None
        while B * H * N * (N_k or N) * D > MAX_WORK:
            N, N_k = max(1, N // 2), N_k and max(1, N_k // 2)
        a += ["--varlen", "random", "--batch", B, "--seq", N]
        if N_k:
            a += ["--seq-k", N_k]
    else:
        # one case in six with long rows (few heads): the kernels a stage picks from 4,096 keys
        most = 9000 if rng.random() < 0.17 else 2500
        if most > 2500:
            B, H_kv, H = 1, 1, rng.choice([1, 2])
        N = length(rng, most)
        N_k = N if rng.random() < 0.5 else length(rng, most)
        while B * H * N * N_k * D > MAX_WORK:
            N, N_k = max(1, N // 2), max(1, N_k // 2)
        a += ["--batch", B, "--seq", N]
        if N_k != N:
            a += ["--seq-k", N_k]
    a += ["--heads", H, "--dim", D]
    if H_kv != H:
        a += ["--kv-heads", H_kv]
    causal = rng.random() < 0.5
    if causal:
        a.append("--causal")
    if rng.random() < 0.25:
        span = max(N, N_k or N)
        side = lambda: -1 if rng.random() < 0.25 else rng.randint(0, span)  # noqa: E731
        a += ["--window", f"{side()},{side()}"]
    if rng.random() < 0.2:
        a += ["--softcap", rng.choice(["5", "30", "50", f"{rng.uniform(1, 100):.2f}"])]
    if rng.random() < 0.3:
        a += ["--dtype", "bf16"]
    # qkv: one fused projection, as many key/value heads and keys as queries
    same = H_kv == H and "--seq-k" not in a
    layouts = ["bhnd", "bnhd"] + (["qkv"] if same else [])
    if rng.random() < 0.5:
        a += ["--layout", rng.choice(layouts)]
    if rng.random() < 0.15:
        a += ["--dist", "peaky"]
    if rng.random() < 0.1:
        a += ["--scale", f"{rng.uniform(0.01, 0.5):.4f}"]
    return a


def decode_case(rng):
    """A decode stage: queries against a KV cache, contiguous or paged."""
    D = rng.choice([64, 128]) if rng.random() < 0.85 else head_dim(rng)  # its two, and refusals
    H_kv = rng.randint(1, 4)
    H = H_kv * rng.choice([1, 4, 8])
    B = rng.randint(1, 4)
    N_q = rng.choice([1, 1, 2, 4, 16, rng.randint(1, 16)])
    N_max = length(rng, 40000) if rng.random() < 0.3 else length(rng, 5000)
    while B * H * N_q * N_max * D > MAX_WORK:
        N_max = max(1, N_max // 2)
    a = ["--batch", B, "--heads", H, "--kv-heads", H_kv, "--dim", D, "--seq", N_q,
         "--seq-k", N_max]
    if rng.random() < 0.6:
        a += ["--page-size", 2 ** rng.randint(0, 8)]
    if rng.random() < 0.5:
        a.append("--ragged")
    if rng.random() < 0.3:
        a += ["--new-tokens", rng.randint(0, min(N_max, 16))]
    if N_q > 1 and rng.random() < 0.5:
        a.append("--causal")
    if rng.random() < 0.3:
        a += ["--dtype", "bf16"]
    if not {"--page-size", "--ragged", "--new-tokens"} & set(map(str, a)):
        a += ["--page-size", 16]  # one of the three selects the decode path
    return a


def cases_for(stage, prog, n, rng):
    variants = variants_of(prog)
    number = stage_number(stage)
    make = decode_case if has_decode(prog) else model_case if number >= 5 else plain_case
    for _ in range(n):
        a = make(rng) + ["--seed", rng.randint(1, 10**6), "--check", "all"]
        if len(variants) > 1 and rng.random() < 0.5:
            a += ["--variant", rng.choice(variants)]
        yield [str(prog)] + [str(x) for x in a]


def blank_numbers(line):
    """A program's line with its numbers blanked: the same reason for every shape counts once."""
    return re.sub(r"\b\d+\b", "#", line)


def variant_refused(cmd, rc, tail):
    """The case's --variant refused its shape (exit 3, the reason naming the variant): the name, or
    None. Such a case runs again as the default variant, so that a stage whose variants take only
    some shapes (stage 5's run the plain kernels only) still has the shape checked."""
    if rc != EXIT["UNSUPPORTED"] or "--variant" not in cmd or not tail:
        return None
    name = cmd[cmd.index("--variant") + 1]
    return name if "variant" in tail[-1] or name in tail[-1] else None


def without_variant(cmd):
    i = cmd.index("--variant")
    return cmd[:i] + cmd[i + 2:]


def run(cmd, extra, timeout):
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "2"))
    try:
        r = subprocess.run(WRAP + cmd + extra, capture_output=True, text=True, timeout=timeout,
                           env=env)
        lines = (r.stdout + r.stderr).strip().splitlines()
        if any(re.search(r"ERROR SUMMARY: [1-9]", ln) for ln in lines):  # a tool's errors fail it
            return "errors reported", [ln for ln in lines
                                       if re.search(r"Invalid|Race|hazard|ERROR SUMMARY", ln)][:3]
        return r.returncode, lines[-3:]
    except subprocess.TimeoutExpired:
        return "timeout", []


def main():
    global MAX_WORK, WRAP
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("build", type=Path)
    ap.add_argument("stages", nargs="+")
    ap.add_argument("--cases", type=int, default=100, help="cases per stage (100)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--jobs", type=int, default=4, help="runs at once (4)")
    ap.add_argument("--extra", default="", help="options appended to every run")
    ap.add_argument("--timeout", type=float, default=300, help="seconds a run may take (300)")
    ap.add_argument("--wrap", default="", help="a command each run goes under (a sanitizer)")
    ap.add_argument("--max-work", type=float, default=MAX_WORK,
                    help=f"the largest B x H x N x N_k x D a case draws ({MAX_WORK:g})")
    args = ap.parse_args()
    MAX_WORK, WRAP = args.max_work, shlex.split(args.wrap)
    rng = random.Random(args.seed)
    extra = shlex.split(args.extra)
    work = []
    for stage in args.stages:
        prog = args.build / stage
        if stage_number(stage) >= 10:  # a program of its own (NCCL's ring): not this contract
            print(f"SKIP  {stage}: its own program and self-test")
            continue
        if not os.access(prog, os.X_OK):
            print(f"FAIL  {stage}: no program {prog}")
            return 1
        work += list(cases_for(stage, prog, args.cases, rng))
    rng.shuffle(work)  # the stages interleaved: a run cut short has sampled every one
    by_stage = {}  # stage -> [passed, failed, skipped]
    why_skipped = Counter()  # each skip's reason, its numbers blanked: what the skips were
    gave_way = Counter()  # variants that refused a shape and gave way to the default, and why

    def run_case(cmd):  # (the command that ran, its result, the variant's refusal or None)
        rc, tail = run(cmd, extra, args.timeout)
        name = variant_refused(cmd, rc, tail)
        if name is None:
            return cmd, (rc, tail), None
        cmd = without_variant(cmd)
        return cmd, run(cmd, extra, args.timeout), f"{Path(cmd[0]).name} {name}: " \
            f"{blank_numbers(tail[-1])}"

    with ThreadPoolExecutor(args.jobs) as pool:
        for cmd, (rc, tail), refusal in pool.map(run_case, work):
            if refusal:
                gave_way[refusal] += 1
            count = by_stage.setdefault(Path(cmd[0]).name, [0, 0, 0])
            count[0 if rc == EXIT["PASS"] else 2 if rc == EXIT["UNSUPPORTED"] else 1] += 1
            if rc == EXIT["UNSUPPORTED"]:
                why_skipped[blank_numbers(tail[-1]) if tail else "(said nothing)"] += 1
            elif rc != EXIT["PASS"]:
                what = f"exit {rc}" if isinstance(rc, int) else rc
                print(f"FAIL  {what}: {shlex.join(WRAP + cmd + extra)}")
                for line in tail:
                    print(f"      {line}")
            sys.stdout.flush()
    for stage, (p, f, k) in sorted(by_stage.items()):
        print(f"{stage:24s} passed {p:4d}  failed {f:4d}  skipped {k:4d}")
    for why, n in gave_way.most_common():
        print(f"{n:5d} ran as the default, the variant refusing the shape: {why}")
    for why, n in why_skipped.most_common():
        print(f"{n:5d} skipped: {why}")
    passed, failed, skipped = (sum(c[i] for c in by_stage.values()) for i in range(3))
    print(f"{passed} passed, {failed} failed, {skipped} skipped")
    if failed:
        return 1
    return EXIT["PASS"] if passed else EXIT["UNSUPPORTED"]  # nothing ran is not a pass


if __name__ == "__main__":
    sys.exit(main())
