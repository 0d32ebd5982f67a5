#!/usr/bin/env python3
"""CPU check of python/colab_t4_l4.ipynb: valid nbformat 4 JSON, stored without outputs, every
code cell plain Python that compiles (no IPython magics, so it also runs as a script), and the
lab's shape: the first cell takes a pasted REPO_URL or an uploaded ARCHIVE, every lesson is
linked, every code cell is followed by a "What to look for" note except the two exercises the
notebook ends with, and their answers, one <details> fold each, in the last cell. The notebook itself runs on a GPU: python/tests/run_notebook.py executes it
headless, and its --fresh checks run the first cells as a fresh user would."""

import json
import re
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
    cells = nb["cells"]
    first = "".join(code[0]["source"]) if code else ""
    for line in ('REPO_URL = ""', 'ARCHIVE = ""'):
        if line not in first:
            problems.append(f"code cell 1 lacks the line {line!r} a user fills in")
    markdown = "".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    for lesson in sorted(NB.parents[1].glob("stage[0-9]*/README.md")):
        if f"../{lesson.parent.name}/README.md" not in markdown:
            problems.append(f"no link to the lesson {lesson.parent.name}/README.md")
    exercises = [i for i, c in enumerate(cells) if c["cell_type"] == "markdown"
                 and re.search(r"^## Exercise \d", "".join(c["source"]), re.M)]
    if len(exercises) != 2 or len(cells) < 3 or cells[-2]["cell_type"] != "code" or \
            cells[-3] is not cells[exercises[-1]]:
        problems.append("the notebook must end with two exercises (a '## Exercise N' note and its "
                        "cell), then their answers")
    answers = "".join(cells[-1]["source"]) if cells and cells[-1]["cell_type"] == "markdown" else ""
    if not answers.startswith("## Answers") or answers.count("<details>") != 2 or \
            answers.count("</details>") != 2:
        problems.append("the last cell must be '## Answers', one folded <details> answer per exercise")
    body = [i for i, c in enumerate(cells) if c["cell_type"] == "code"
            and not (exercises and i > exercises[0])]
    for n, i in enumerate(body, 1):
        after = cells[i + 1] if i + 1 < len(cells) else None
        if not after or after["cell_type"] != "markdown" or \
                "**What to look for:**" not in "".join(after["source"]):
            problems.append(f"code cell {n} is not followed by a '**What to look for:**' note")
    for p in problems:
        print(f"{NB.name}: {p}")
    print(f"{NB.name}: {len(code)} code cells, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
