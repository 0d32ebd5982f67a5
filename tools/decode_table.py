#!/usr/bin/env python3
"""Stage 9's measured section, generated from its committed CSV (no number typed by hand).

Reads stage9_decode/measured/h200_decode.csv (tools/decode_bench.py's rows, one protocol for all:
CUDA graphs of L2-flushed calls) and writes the tables between the lines
<!-- results:decode:begin --> and <!-- results:decode:end --> of stage9_decode/README.md:
  1. every shape: stage 9, FA2 and cuDNN, time per call and the share of the HBM's peak it turns
     into cache reads, and stage 9's speed over the faster of the two; where the CSV has
     FlashInfer's rows (decode_bench --flashinfer), its column and stage 9's speed over it too;
  2. the lessons switched off (variants nopack and nosplit) and the paged cache (pages of 16) on
     the shapes they were run on, against the default on a contiguous cache.
--check: exit 1 (and say so) if the README's section is not what the CSV gives.

usage: python3 -m tools.decode_table [--csv FILE] [--readme FILE] [--check]
"""
import argparse
import csv
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CSV = ROOT / "stage9_decode/measured/h200_decode.csv"
README = ROOT / "stage9_decode/README.md"
BEGIN, END = "<!-- results:decode:begin -->", "<!-- results:decode:end -->"


def shape_key(r):
    return (int(r["B"]), int(r["H"]), int(r["H_kv"]), int(r["D"]), int(r["N_q"]), int(r["N_k"]),
            int(r["causal"]))


def shape_name(k):
    B, H, H_kv, D, N_q, N_k, causal = k
    q = f"{N_q} quer{'y' if N_q == 1 else 'ies'}" + (", causal" if causal else "")
    return f"B = {B}, {H}/{H_kv} heads, D = {D}, N_k = {N_k:,}, {q}"


def cell(r):
    return f"{float(r['ms_median']) * 1e3:.1f} us ({float(r['hbm_pct']):.0f}%)"


def tables(rows):
    gpu = rows[0]["gpu"]
    out = [f"Measured on {gpu}; from `stage9_decode/measured/h200_decode.csv` "
           "(regenerate: `python3 -m tools.decode_bench --csv F`; the same with `--quick "
           "--no-sdpa --csv F --append` and `--variant nopack`, `--variant nosplit`, "
           "`--page-size 16`; then `python3 -m tools.decode_table`). Time per call, and in "
           "brackets the share of the HBM's 4.8 TB/s turned into cache reads (bytes of K and V "
           "/ time); CUDA graphs of calls with the L2 flushed before each (a read of twice its "
           "size: clean lines, no write-back charged to the call), the same for every library.",
           ""]
    fi = any(r["library"] == "FlashInfer" and r["cache"] == "contiguous" for r in rows)
    if fi:
        out += ["| shape | stage 9 | FA2 | cuDNN | FlashInfer | best of FA2, cuDNN / stage 9 | "
                "FlashInfer / stage 9 |", "|:---|---:|---:|---:|---:|---:|---:|"]
    else:
        out += ["| shape | stage 9 | FA2 | cuDNN | best of FA2, cuDNN / stage 9 |",
                "|:---|---:|---:|---:|---:|"]
    by = {}
    for r in rows:
        by.setdefault((r["cache"], r["variant"] or "default", shape_key(r)), {})[r["library"]] = r
    keys = []
    for r in rows:
        k = shape_key(r)
        if r["cache"] == "contiguous" and k not in keys:
            keys.append(k)
    wins = 0
    for k in keys:
        libs = by.get(("contiguous", "default", k), {})
        s9, fa2, cudnn = libs.get("stage9_decode"), libs.get("FA2"), libs.get("cuDNN")
        if not s9:
            continue
        others = [float(x["ms_median"]) for x in (fa2, cudnn) if x]
        ratio = min(others) / float(s9["ms_median"]) if others else None
        wins += ratio is not None and ratio >= 1.0
        line = (f"| {shape_name(k)} | {cell(s9)} | {cell(fa2) if fa2 else 'n/a'} | "
                f"{cell(cudnn) if cudnn else 'n/a'} | ")
        if fi:
            fin = libs.get("FlashInfer")
            line += f"{cell(fin) if fin else 'n/a'} | "
        line += f"{f'{ratio:.2f}' if ratio is not None else '-'} |"
        if fi:
            line += (f" {float(fin['ms_median']) / float(s9['ms_median']):.2f} |" if fin
                     else " - |")
        out.append(line)
    out += ["", f"Stage 9 is at least as fast as both on {wins} of {len(keys)} shapes.", ""]
    out += ["| shape | default | nopack | nosplit | default, pages of 16 |",
            "|:---|---:|---:|---:|---:|"]
    for k in keys:
        cells = []
        for cache, var in (("contiguous", "default"), ("contiguous", "nopack"),
                           ("contiguous", "nosplit"), ("paged16", "default")):
            r = by.get((cache, var, k), {}).get("stage9_decode")
            cells.append(cell(r) if r else None)
        if all(c is not None for c in cells):
            out.append(f"| {shape_name(k)} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--csv", default=str(CSV))
    ap.add_argument("--readme", default=str(README))
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    with open(args.csv, newline="") as f:
        rows = list(csv.DictReader(f))
    text = Path(args.readme).read_text()
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        print(f"decode_table: {args.readme} needs one {BEGIN} ... {END} pair", file=sys.stderr)
        return 2
    head, rest = text.split(BEGIN)
    _, tail = rest.split(END)
    new = head + BEGIN + "\n\n" + tables(rows) + "\n\n" + END + tail
    if args.check:
        if new != text:
            print(f"FAIL decode_table: {args.readme}'s measured section is not what {args.csv} "
                  "gives (python3 -m tools.decode_table rewrites it)")
            return 1
        print(f"ok    decode_table: {args.readme}'s measured section is {args.csv}'s")
        return 0
    Path(args.readme).write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
