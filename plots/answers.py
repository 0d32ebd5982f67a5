#!/usr/bin/env python3
"""answers.py: write the exercise answers measured by common/tests/measure_answers.sh into the
lessons, between markers.

    python3 plots/answers.py [--gpu h200] [README.md ...]   (default: every stage*/README.md)

A lesson's answer carries its table between the lines
    <!-- results:answer-KEY:begin -->  ...  <!-- results:answer-KEY:end -->
(KEY: s6e1 = stage 6, exercise 1), and stageN_*/measured/<gpu>_answers.csv (the reference GPU's
by default: the lessons argue from its numbers) holds the rows whose column "answer" is KEY: one
run each, the command an exercise asks for. The block becomes a line naming the GPU, the commit
and the CSV, then a table: the run, its command, the median time, TFLOP/s, the time over the
default variant's at the same shape, and the result (exit code, self-test line, note). A block
with no rows in the CSV (no CSV yet) is left as it is; everything outside the blocks stays byte
for byte. Prints what it wrote.
"""

import argparse
import csv
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"^(<!-- results:answer-(\w+):begin -->\n)(.*?)(^<!-- results:answer-\2:end -->$)",
                   re.S | re.M)


def rows_by_answer(gpu):
    out = {}
    for path in sorted(ROOT.glob(f"stage*/measured/{gpu}_answers.csv")):
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                out.setdefault(row["answer"], []).append((path.relative_to(ROOT), row))
    return out


def shape_of(label):
    return label.split(", ", 1)[1] if ", " in label else ""


def table(rows):
    path = rows[0][0]
    first = rows[0][1]
    default = {shape_of(r["label"]): r for _, r in rows
               if r["label"].startswith("default") and r["ms_median"] not in ("", "-")}
    lines = [f"Measured on {first['gpu']} (commit {first['commit']}) by "
             f"`common/tests/measure_answers.sh`, from `{path}`:", "",
             "| run | command | median ms | TFLOP/s | time / default's | result |",
             "|:---|:---|---:|---:|---:|:---|"]
    for _, r in rows:
        ms = r["ms_median"]
        base = default.get(shape_of(r["label"]))
        ratio = "-"
        if base is not None and ms not in ("", "-"):
            ratio = f"{float(ms) / float(base['ms_median']):.3f}"
        result = [f"exit {r['rc']}"]
        result += [r[k] for k in ("self_test", "note") if r[k] not in ("", "-")]
        if r["status"] not in ("", "-", "ok"):
            result.append(r["status"])
        lines.append(f"| {r['label']} | `{r['command']}` | {ms or '-'} | {r['tflops'] or '-'} | "
                     f"{ratio} | {'; '.join(result)} |")
    return "\n" + "\n".join(lines) + "\n\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("readmes", nargs="*", type=Path)
    ap.add_argument("--gpu", default="h200", help="the GPU folder name of the answers' CSVs")
    args = ap.parse_args()
    answers = rows_by_answer(args.gpu)
    readmes = args.readmes or sorted(ROOT.glob("stage*/README.md"))
    for readme in readmes:
        text = readme.read_text()
        done = []

        def fill(m):
            rows = answers.get(m.group(2))
            if not rows:
                return m.group(0)
            done.append(m.group(2))
            return m.group(1) + table(rows) + m.group(4)

        new = BLOCK.sub(fill, text)
        if new != text:
            readme.write_text(new)
            print(f"answers.py: wrote the measured answers ({', '.join(done)}) into {readme}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
