#!/usr/bin/env python3
"""One source of truth in the host code: each shared fact has one home, and the others read it.

  the CSV header        common/csv_header.h (CSV_HEADER): main.c prints it; plots/sweep.sh,
                        plots/sdpa_baseline.py and the sweep tests' fake stage read the file
  the exit codes        the attn_exit enum of common/attention.h: main.c and attn_lib.c use it, the
                        binding asks the library (attn_lib_exit_codes), compare_fa2.py reads the
                        enum, the bash scripts source common/exit_codes.sh, the Makefile reads it
  the B x H limit       ATTN_MAX_BH (= ATTN_MAX_GRID_Y, CUDA's gridDim.y limit) in attention.h;
                        the binding asks the library (attn_lib_limits)
  the variants list     parsed by attn_variant_count/_index/_name in attention.h (C), and by the
                        binding's one split of the descriptor's string (Python)
  the FLOP count and    common/main.c for the programs; plots/measure.py for the scripts that
  the timing protocol   time other libraries beside them (sdpa_baseline.py, compare_fa2.py,
                        compare.py, sdpa_bwd.py: tools/, the examples)
  the graph protocol    common/main.c's GRAPH_* (--bench-graph); tools/compare.py reads them

Fails on a second definition: a run of the header's columns written out, an exit code tied to
its name by a literal number, a literal 65535 in code, a C loop over a `variants` string
outside attention.h; and on a reader that no longer names the home. The lessons and the README
may state the limit, and must state the one the home has. Ends with "N passed, M failed".
usage: one_home.py   (from anywhere: it looks at the checkout it sits in)
"""

import os
import re
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CODE_EXT = (".c", ".h", ".cu", ".cuh", ".py", ".sh", ".awk", ".gp", ".mk", ".ipynb", ".toml")
passed = failed = 0


def check(ok, what, detail=""):
    global passed, failed
    if ok:
        passed += 1
        print(f"ok    {what}")
    else:
        failed += 1
        print(f"FAIL  {what}" + (f":\n{detail}" if detail else ""))


def files():
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return sorted(f for f in out.splitlines() if os.path.isfile(os.path.join(ROOT, f)))


def read(path):
    with open(os.path.join(ROOT, path), encoding="utf-8", errors="replace") as f:
        return f.read()


ALL = files()
CODE = [f for f in ALL if f.endswith(CODE_EXT) or os.path.basename(f) == "Makefile"
        or f == ".ci/run"]
DOCS = [f for f in ALL if f.endswith(".md")]
SELF = os.path.relpath(os.path.abspath(__file__), ROOT)


def hits(paths, pattern, skip=(), flags=0):
    """'path:line: text' for every line of paths matching pattern, paths in skip left out."""
    rx = re.compile(pattern, flags)
    found = []
    for p in paths:
        if p in skip or p == SELF:
            continue
        for n, line in enumerate(read(p).splitlines(), 1):
            if rx.search(line):
                found.append(f"  {p}:{n}: {line.strip()[:140]}")
    return found


def names_home(readers):
    """The readers (path -> a regex that shows it reads the home) that do not."""
    return [f"  {p} (want /{rx}/)" for p, rx in readers.items() if not re.search(rx, read(p))]


# ---- the CSV header ----
HOME_CSV = "common/csv_header.h"
m = re.search(r'^#define CSV_HEADER "([^"]+)"$', read(HOME_CSV), re.M)
check(m is not None, f"{HOME_CSV} defines CSV_HEADER on one line (the scripts read that line)")
cols = m.group(1).split(",") if m else []
# any three consecutive columns written out is a copy of the header
# (with two columns of more than one letter: "B,H,N" alone is any shape's columns)
runs = [",".join(cols[i:i + 3]) for i in range(len(cols) - 2)
        if sum(len(c) > 1 for c in cols[i:i + 3]) >= 2]
found = hits(CODE + DOCS, "|".join(re.escape(r) for r in runs), skip={HOME_CSV}) if runs else []
check(runs and not found, f"no copy of the CSV header's columns outside {HOME_CSV}", "\n".join(found))
bad = names_home({
    "common/main.c": r'#include "csv_header.h"[\s\S]*CSV_HEADER',
    "plots/sweep.sh": r"csv_header\.h",
    "plots/sdpa_baseline.py": r"csv_header\.h",
    "plots/tests/fake_stage.sh": r"csv_header\.h",
})
check(not bad, "main.c, sweep.sh, sdpa_baseline.py and the tests' fake stage read the header "
      f"from {HOME_CSV}", "\n".join(bad))

# ---- the exit codes ----
HOME_H = "common/attention.h"
enum = dict((k, int(v)) for k, v in re.findall(r"^\s*ATTN_EXIT_([A-Z]+)\s*=\s*(\d+)",
                                              read(HOME_H), re.M))
check(set(enum) == {"PASS", "WRONG", "USAGE", "UNSUPPORTED", "OOM"},
      f"the attn_exit enum of {HOME_H}: {enum}")
found = hits(CODE, r"\bATTN_EXIT_[A-Z]+\s*=\s*\d", skip={HOME_H})
# codes tied to their names by numbers, comments included: a list ("0 pass, 1 wrong result"),
# a dict ("unsupported": 3), a string ("pass=0,"), a constant (UNSUPPORTED = 3), a shell case
# ("3) status=unsupported"), a test of the numbers ([[ $rc =~ ^[0134]$ ]])
NAMES = r"(pass\b|wrong result|bad usage|unsupported|out of)"
found += hits(CODE, rf"\b[0-4],? {NAMES}.*\b[0-4],? {NAMES}"
              r"|['\"](pass|wrong|usage|unsupported|oom)['\"]\s*:\s*[0-4]\b"
              r"|\b(pass|wrong|usage|unsupported|oom)=[0-4],"
              r"|^\s*[0-4]\)\s*status=|=~\s*\^?\[[0-4]+\]", skip={HOME_H}, flags=re.I)
found += hits(CODE, r"\b(PASS|WRONG|USAGE|UNSUPPORTED|OOM) += +[0-4]\b", skip={HOME_H})
check(not found, f"no exit code defined outside the attn_exit enum of {HOME_H}", "\n".join(found))
# the docs may list them ("Exit codes: 0 pass, 1 wrong result, ..."), as the enum has them
WORD = {"pass": "PASS", "wrong result": "WRONG", "bad usage": "USAGE",
        "unsupported": "UNSUPPORTED", "out of": "OOM"}
listed, wrong = 0, []
for p in DOCS:
    text = " ".join(read(p).split())
    for m in re.finditer(r"[Ee]xit codes?:", text):
        for n, word in re.findall(rf"\b([0-4]),? {NAMES}", text[m.end():m.end() + 300]):
            listed += 1
            if enum.get(WORD[word.strip()]) != int(n):
                wrong.append(f"  {p}: '{n} {word}', the enum has {enum.get(WORD[word.strip()])}")
check(not wrong, f"the docs that list exit codes ({listed} codes) list the enum's",
      "\n".join(wrong))
bad = names_home({
    "common/main.c": r"ATTN_EXIT_UNSUPPORTED",
    "common/attn_lib.c": r"ATTN_EXIT_PASS, ATTN_EXIT_WRONG, ATTN_EXIT_USAGE",
    "python/flashcourse/_library.py": r"attn_lib_exit_codes",
    "tools/compare_fa2.py": r"ATTN_EXIT_",
    "common/tests/fuzz.py": r"from labs import EXIT_CODES",
    "common/exit_codes.sh": r"attention\.h",
    "plots/sweep.sh": r"exit_codes\.sh",
    "plots/tests/fake_stage.sh": r"exit_codes\.sh",
    "common/tests/run.sh": r"exit_codes\.sh",
    "common/tests/sanitize.sh": r"exit_codes\.sh",
    "Makefile": r"attn_exit,UNSUPPORTED",
})
check(not bad, "main.c, attn_lib.c, the binding, compare_fa2.py, the scripts and the Makefile "
      "take the exit codes from the enum", "\n".join(bad))

# ---- the B x H limit ----
h = read(HOME_H)
grid = re.search(r"^#define ATTN_MAX_GRID_Y (\d+)", h, re.M)
bh = re.search(r"^#define ATTN_MAX_BH (\w+)", h, re.M)
limit = None
if grid and bh:
    limit = int(grid.group(1)) if bh.group(1) == "ATTN_MAX_GRID_Y" else int(bh.group(1), 0)
check(limit == 65535, f"{HOME_H}: ATTN_MAX_BH = {limit} (CUDA's gridDim.y limit)")
found = hits(CODE, r"\b65,?535\b|\b0x[fF]{4}\b|\(1 << 16\) - 1", skip={HOME_H})
check(not found, f"no literal B x H limit (65535) in code outside {HOME_H}", "\n".join(found))
bad = names_home({"common/attn_lib.c": r"ATTN_MAX_BH", "python/flashcourse/_library.py":
                  r"attn_lib_limits", "python/flashcourse/api.py": r"limits\[\"max_bh\"\]"})
check(not bad, "the binding splits calls over B x H by the limit the library reads from "
      f"{HOME_H} (attn_lib_limits)", "\n".join(bad))
stated = hits(DOCS, r"B (x|\*|·|×) H (is at most|<=|≤|must be at most) ")
wrong = [s for s in stated
         if int(re.search(r"B (?:x|\*|·|×) H (?:is at most|<=|≤|must be at most) ([\d,]+)",
                          s).group(1).replace(",", "")) != limit]
check(stated and not wrong, f"the lessons and README state B x H <= {limit}, as {HOME_H} does "
      f"({len(stated)} places)", "\n".join(wrong or ["  (none found)"]))

# ---- the variants list ----
found = hits([f for f in CODE if f.endswith((".c", ".h", ".cu", ".cuh"))],
             r"variants.*(strchr|strtok|strsep|==\s*',')|variants;\s*\*", skip={HOME_H})
for name in ("attn_variant_count", "attn_variant_index", "attn_variant_name"):
    if not re.search(r"static inline \w+ " + name + r"\(", h):
        found.append(f"  {HOME_H}: no {name}")
check(not found, f"the C code parses a stage's variants only in {HOME_H}", "\n".join(found))
splits = hits([f for f in CODE if f.endswith((".py", ".ipynb"))], r"variants.*\.split\(")
check(len(splits) == 1 and "python/flashcourse/_library.py" in splits[0],
      "the Python code splits the descriptor's variants once, in _library.py", "\n".join(splits))

# ---- the FLOP count and the timing protocol ----
HOME_PY = "plots/measure.py"
# the count written out (4 B H N^2 D), or the backward's factor as a number, outside the homes
# (main.c for the programs, measure.py for the scripts), the tests that check them, and the
# sweep tests' fake stage (a stand-in program, not a reader)
flop_homes = {"common/main.c", HOME_PY, "python/tests/test_compare.py", "plots/tests/fake_stage.sh"}
found = hits([f for f in CODE if f.endswith((".py", ".c", ".h", ".sh", ".awk", ".ipynb"))],
             r"4(\.0)? \* .*\b(n \* n|N \* N|N \* s->N)\b|\b2\.5 \* 4\b|BWD_FLOPS\w* = ",
             skip=flop_homes - {HOME_PY})
found = [f for f in found if not f.startswith(f"  {HOME_PY}:")]
check(not found, f"the FLOP count is written in common/main.c and {HOME_PY} only", "\n".join(found))
found = hits([f for f in CODE if f.endswith((".py", ".ipynb"))],
             r"^\s*(MIN_REPS|MIN_SECONDS|MAX_REPS|FLUSH_BYTES)\s*=", skip={HOME_PY})
check(not found, f"the scripts' timing protocol (repeats, seconds, L2 flush) is set in {HOME_PY} only",
      "\n".join(found))
bad = names_home({"plots/sdpa_baseline.py": r"import measure", "tools/compare_fa2.py":
                  r"import measure", "tools/compare.py": r"import measure",
                  "tools/sdpa_bwd.py": r"import measure"})
check(not bad, f"the scripts that count FLOPs or time SDPA read {HOME_PY}", "\n".join(bad))
# the graph protocol (a replay's length, its calls, its replays): common/main.c's GRAPH_*, which
# its --bench-graph uses and tools/compare.py reads
graph = dict(re.findall(r"^#define (GRAPH_[A-Z_]+) ([0-9.]+)", read("common/main.c"), re.M))
check(set(graph) >= {"GRAPH_MS", "GRAPH_MAX_CALLS", "GRAPH_RECAPTURE_BELOW", "GRAPH_REPLAYS"},
      f"the graph protocol's constants in common/main.c: {graph}")
found = hits([f for f in CODE if f.endswith((".py", ".ipynb"))],
             r"^\s*(GRAPH_MS|REPLAYS|MAX_CALLS|RECAPTURE_BELOW)\s*=\s*[0-9]")
check(not found, "the graph protocol is set in common/main.c only (tools/compare.py reads it)",
      "\n".join(found))
bad = names_home({"tools/compare.py": r"GRAPH_\[A-Z_\]\+|GRAPH_MAX_CALLS"})
check(not bad, "tools/compare.py reads the graph protocol from common/main.c", "\n".join(bad))

print(f"one home each: {passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
