#!/usr/bin/env python3
"""CPU check of python/colab_t4_l4.ipynb: valid nbformat 4 JSON, stored without outputs, and every
code cell is plain Python that compiles (no IPython magics, so it also runs as a script).
The notebook itself runs on a GPU: python/tests/run_notebook.py executes it headless."""

import json
import sys
from pathlib import Path

NB = Path(__file__).resolve().parents[1] / "colab_t4_l4.ipynb"


def main() -> int:
    nb = json.loads(NB.read_text())
    problems = []
    if nb.get("nbformat") != 4:
        problems.append(f"nbformat {nb.get('nbformat')}, want 4")
    if nb.get("metadata", {}).get("kernelspec", {}).get("name") != "python3":
        problems.append("kernelspec is not python3")
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    for i, c in enumerate(code, 1):
        src = "".join(c["source"])
        if c.get("outputs") or c.get("execution_count") is not None:
            problems.append(f"code cell {i} is stored with outputs")
        try:
            compile(src, f"{NB.name} code cell {i}", "exec")
        except SyntaxError as e:
            problems.append(f"code cell {i}: {e}")
    for p in problems:
        print(f"{NB.name}: {p}")
    print(f"{NB.name}: {len(code)} code cells, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
