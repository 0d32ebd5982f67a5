#!/usr/bin/env python3
"""Executes python/colab_t4_l4.ipynb headless with nbclient, from inside the repository (so it
clones nothing and needs no internet), and prints each code cell's time and last lines.

    python3 python/tests/run_notebook.py [EXECUTED.ipynb] [--cell-timeout S]

Needs nbclient, nbformat and ipykernel. Ends with "N passed, M failed" over the code cells
(a cell after a failed one is not run and counts as failed); exit 1 if any failed.
"""

import argparse
import json
import re
import sys
from datetime import datetime
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

NB = Path(__file__).resolve().parents[1] / "colab_t4_l4.ipynb"


def seconds(cell):
    ex = cell.get("metadata", {}).get("execution", {})
    try:
        a = datetime.fromisoformat(ex["iopub.execute_input"].replace("Z", "+00:00"))
        b = datetime.fromisoformat(ex["shell.execute_reply"].replace("Z", "+00:00"))
        return (b - a).total_seconds()
    except (KeyError, ValueError):
        return None


def text_of(cell):
    out = []
    for o in cell.get("outputs", []):
        if o.get("output_type") == "stream":
            out.append(o.get("text", ""))
        elif o.get("output_type") == "error":
            out.append(f"{o.get('ename')}: {o.get('evalue')}\n")
        elif "data" in o and "text/plain" in o["data"]:
            out.append(o["data"]["text/plain"] + "\n")
    return "".join(out)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", nargs="?", default="executed.ipynb")
    ap.add_argument("--cell-timeout", type=int, default=900)
    ap.add_argument("--times", help="write {cell number: seconds} as JSON here")
    args = ap.parse_args()
    nb = nbformat.read(NB, as_version=4)
    client = NotebookClient(nb, timeout=args.cell_timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(NB.parent)}})
    error = None
    try:
        client.execute()
    except CellExecutionError as e:
        msg = re.sub(r"\x1b\[[0-9;]*m", "", str(e)).strip()
        error = msg.splitlines()[-1] if msg else "cell failed"
    except Exception as e:  # the kernel died, a timeout
        error = f"{type(e).__name__}: {e}"
    nbformat.write(nb, args.out)
    passed = failed = 0
    times = {}
    for n, cell in enumerate((c for c in nb.cells if c.cell_type == "code"), 1):
        t = seconds(cell)
        errs = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
        ran = t is not None
        ok = ran and not errs
        passed += ok
        failed += not ok
        if t is not None:
            times[n] = round(t, 1)
        tail = text_of(cell).rstrip().splitlines()[-4:]
        head = "".join(cell.source).splitlines()[0]
        print(f"cell {n} [{'ok' if ok else ('FAILED' if ran else 'not run')}, "
              f"{'%.1f s' % t if t is not None else '-'}] {head}")
        for line in tail:
            print(f"    {line}")
    if error:
        print(f"notebook stopped: {error}")
    if args.times:
        Path(args.times).write_text(json.dumps(times))
    print(f"{passed} passed, {failed} failed")
    return 1 if failed or error else 0


if __name__ == "__main__":
    sys.exit(main())
