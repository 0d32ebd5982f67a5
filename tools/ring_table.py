#!/usr/bin/env python3
"""Stage 10's measured section, generated from its committed CSVs (no number typed by hand).

Reads stage10_context_parallel/measured/h200x2.csv (the program's `--csv` rows: the ring on P GPUs
beside the ring of one, common/csv_header.h's RING_CSV_HEADER) and h200x2_torch_cp.csv (PyTorch's
context_parallel, python/bench_context_parallel.py), and writes between the lines
<!-- results:ring:begin --> and <!-- results:ring:end --> of stage10_context_parallel/README.md:
  1. the course's ring: per N, split and H_kv, its forward and backward times beside one GPU's,
     and the efficiencies T_1 / (P T_P);
  2. PyTorch's ring against the course's on the shapes both ran (H_kv = H).
--check: exit 1 (and say so) if the README's section is not what the CSVs give.

usage: python3 -m tools.ring_table [--check]
"""
import argparse
import csv
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STAGE = ROOT / "stage10_context_parallel"
CSV = STAGE / "measured/h200x2.csv"
TORCH_CSV = STAGE / "measured/h200x2_torch_cp.csv"
README = STAGE / "README.md"
BEGIN, END = "<!-- results:ring:begin -->", "<!-- results:ring:end -->"


def rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def num(x, digits=3):
    return f"{float(x):.{digits}f}" if x not in ("", None) else "n/a"


def section(ring, torch):
    gpu = ring[0]["gpu"] if ring else "?"
    P = ring[0]["gpus"] if ring else "?"
    out = [f"The course's ring on {P} x {gpu} (B = {ring[0]['B']}, H = {ring[0]['H']}, D = "
           f"{ring[0]['D']}, {ring[0]['dtype']}, causal; efficiency = one GPU's time / ({P} x the "
           f"ring's), from `stage10_context_parallel/measured/h200x2.csv`):", "",
           "| N | split | H_kv | forward ms | one GPU | efficiency | backward ms | one GPU "
           "| fwd+bwd efficiency |", "|---|---|---|---|---|---|---|---|---|"]
    for r in ring:
        out.append(f"| {int(r['N']):,} | {r['layout']} | {r['H_kv']} | {num(r['fwd_ms'])} | "
                   f"{num(r['fwd_ms_1gpu'])} | {num(r['fwd_efficiency'])} | {num(r['bwd_ms'])} | "
                   f"{num(r['bwd_ms_1gpu'])} | {num(r['fwd_bwd_efficiency'])} |")
    out += ["", "PyTorch's `context_parallel` (its SDPA inside: cuDNN on Hopper; H_kv = H) against "
            "the course's ring on the same shapes, forward and backward, from "
            "`stage10_context_parallel/measured/h200x2_torch_cp.csv` and "
            "`stage10_context_parallel/measured/h200x2.csv`:", "",
            "| N | PyTorch ms | its efficiency | course ms | course efficiency | course / PyTorch |",
            "|---|---|---|---|---|---|"]
    for t in torch:
        same = [r for r in ring if r["N"] == t["N"] and r["H_kv"] == t["H_kv"] and
                r["layout"] == "zigzag" and r["bwd_ms"]]
        if not same:
            continue
        r = same[0]
        course = float(r["fwd_ms"]) + float(r["bwd_ms"])
        out.append(f"| {int(t['N']):,} | {num(t['fwd_bwd_ms'], 2)} | "
                   f"{num(t['fwd_bwd_efficiency'])} | {course:.2f} | "
                   f"{num(r['fwd_bwd_efficiency'])} | {float(t['fwd_bwd_ms']) / course:.2f}x |")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="fail if the README is not up to date")
    args = ap.parse_args()
    text = README.read_text()
    if text.count(BEGIN) != 1 or text.count(END) != 1:
        print(f"ring_table.py: {README.name} needs one {BEGIN} and one {END}")
        return 1
    head, rest = text.split(BEGIN)
    _, tail = rest.split(END)
    new = head + BEGIN + "\n" + section(rows(CSV), rows(TORCH_CSV)) + "\n" + END + tail
    if args.check:
        if new != text:
            print(f"ring_table.py: {README.relative_to(ROOT)}'s measured section is not its CSVs' "
                  f"(python3 -m tools.ring_table rewrites it)")
            return 1
        print(f"ring_table.py: {README.relative_to(ROOT)}'s measured section is its CSVs'")
        return 0
    README.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
