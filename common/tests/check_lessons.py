#!/usr/bin/env python3
"""The lessons' checks, run by `make test` (common/tests/check_lessons.sh):

1. Code map. In every stage*/README.md the section "## Code map" lists the functions to read, one
   line each, written exactly as "- `name()` in `path`: role". Each name must be defined in that
   file: the name, its parenthesised parameters, then `{` (C, CUDA, shell), or `def name(`
   (Python). A lesson without such a list fails.
2. Line references. Every `path:LINE` (or `path:FIRST-LAST`, or a link `path#LLINE`) in a lesson
   must name a file of the repository with at least that many lines. A code map entry's own
   reference (the first on its line into the file it names) must point inside the function it
   names: from the head of its declaration (template, return type) to its closing brace.
3. Figures from a run. A number typed in a lesson's prose that reads as a measurement (a time in
   ms, us or s, a rate in TFLOP/s, GB/s or TB/s, a speedup like 1.60x, a percentage with a
   decimal, or a ratio or error with two decimals or more) must appear in the committed results:
   as a number of a generated section (between <!-- results:...:begin/end --> markers of any
   README, which plots/tests/run.sh checks against plots/h200/results.csv), or as a time or
   TFLOP/s of a committed CSV (plots/*/results.csv, stage*/measured/*.csv) at the precision typed
   (three significant digits or more), or in the committed record its sentence cites: a step or
   a section of the stage's LOG.md ("LOG.md, step 9", "LOG.md, steps 5 and 6", "LOG.md, \"What
   did not work\"", a link to LOG.md#what-did-not-work; another stage's as ../stageN_x/LOG.md),
   whose text must hold the figure as typed, or a CSV named in a `code span` or a link, one of
   whose cells must round to it. Not checked: the generated sections themselves, code
   blocks and `code spans`, <details> answers whose summary names their run ("measured on ...",
   "by hand", a .csv), and sentences that say the figure is not a measurement (a prediction, a
   peak, an expectation, a bound). LOG.md files are not lessons: they keep their history.
   The top README.md is not a lesson either (it has no code map), but its prose quotes the same
   runs: rule 3, and only rule 3, applies to it.
4. Length. A lesson holds at most 2,300 words (3,000 for stages 5-10, whose lessons explain a
   schedule and must stand without their LOG.md) outside its generated sections (between
   <!-- results:...:begin/end --> markers) and its HTML comments; a word is a run of non-blank
   characters with a letter or a digit in it (a table's "|" or a list's "-" is none). The
   step-by-step history belongs in the stage's LOG.md.

usage: check_lessons.py [--root DIR] [README.md ...]   (default: every stage*/README.md, and the
                                                        top README.md's prose)
       check_lessons.py --self-test                   (the fixtures: each broken one must fail)
Prints one line per problem, one line per passed check, and "N passed, M failed" last.
"""

import argparse
import csv
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
FIXTURES = HERE / "lessons_fixture"

MAP_LINE = re.compile(r"^- `([A-Za-z_][A-Za-z0-9_]*)\(\)` in `([^`]+)`: \S")
LINE_REF = re.compile(r"(?<![\w/.-])((?:[\w.-]+/)*[\w.-]+\.(?:cu|cuh|c|h|py|sh|gp|awk|mk|ipynb|md))"
                      r"(?::(\d+)(?:-(\d+))?|#L(\d+)(?:-L(\d+))?)")

# ---- 1 and 2: code map and line references -----------------------------------------------------


def strip_c(text):
    """C/CUDA text with comments and string literals blanked (newlines kept)."""
    out = re.sub(r"/\*.*?\*/", lambda m: re.sub(r"[^\n]", " ", m.group(0)), text, flags=re.S)
    out = re.sub(r"//[^\n]*", "", out)
    return re.sub(r'"(?:\\.|[^"\\\n])*"', '""', out)


def defines(path, name):
    """Whether the file at `path` defines function `name`."""
    return bool(extents(path, name))


def py_extent(lines, first):
    """The lines (1-based, inclusive) of the Python def on line `first`: its indented body."""
    indent = len(lines[first - 1]) - len(lines[first - 1].lstrip())
    last = first
    for n in range(first + 1, len(lines) + 1):
        line = lines[n - 1]
        if line.strip() and len(line) - len(line.lstrip()) <= indent:
            break
        if line.strip():
            last = n
    return first, last


def head_start(code_lines, n):
    """The first line of the declaration whose name is on line n: the lines above it that carry
    on the declaration (a template, a return type, __launch_bounds__) count as its head."""
    while n > 1:
        prev = code_lines[n - 2].strip()
        if not prev or prev.endswith((";", "}", "{")) or prev.startswith("#"):
            break
        n -= 1
    return n


def extents(path, name):
    """(first, last) lines of every definition of function `name` in the file at `path`: from
    the head of its declaration to its closing brace (Python: to the end of its body)."""
    text = path.read_text(errors="replace")
    if path.suffix == ".py":
        lines = text.splitlines()
        return [py_extent(lines, text.count("\n", 0, m.start()) + 1)
                for m in re.finditer(rf"^\s*(?:async\s+)?def\s+{name}\s*\(", text, re.M)]
    code = strip_c(text) if path.suffix != ".sh" else re.sub(r"#[^\n]*", "", text)
    code_lines = code.split("\n")
    found = []
    for m in re.finditer(rf"(?<![\w.>]){name}\s*\(", code):
        if re.search(r"(\.|->|::)\s*$", code[max(0, m.start() - 3):m.start()]):
            continue  # a member call
        depth, i = 0, m.end() - 1
        while i < len(code):  # the matching parenthesis
            depth += {"(": 1, ")": -1}.get(code[i], 0)
            if depth == 0:
                break
            i += 1
        rest = code[i + 1:i + 200]
        # after the parameters: qualifiers, a trailing return type or an initializer list, then {
        body = re.match(r"\s*(?:const\s*|noexcept\s*|override\s*|->\s*[\w:<>\s\*&]+)*\{", rest)
        if not body:
            continue
        j, depth = i + 1 + body.end() - 1, 0
        while j < len(code):  # the matching brace
            depth += {"{": 1, "}": -1}.get(code[j], 0)
            if depth == 0:
                break
            j += 1
        first = head_start(code_lines, code.count("\n", 0, m.start()) + 1)
        found.append((first, code.count("\n", 0, j) + 1))
    return found


def code_map_problems(readme, root):
    lines = readme.read_text().splitlines()
    problems, entries, inside = [], 0, False
    for n, line in enumerate(lines, 1):
        if line.startswith("## "):
            inside = line.strip() == "## Code map"
            continue
        if not inside or not line.startswith("- `"):
            continue
        m = MAP_LINE.match(line)
        if not m:
            problems.append(f"{readme}:{n}: code map line not of the form "
                            f"\"- `name()` in `path`: role\": {line[:80]}")
            continue
        entries += 1
        name, rel = m.groups()
        path = root / rel
        if not path.is_file():
            problems.append(f"{readme}:{n}: code map: {rel} does not exist")
        elif not defines(path, name):
            problems.append(f"{readme}:{n}: code map: {name}() is not defined in {rel}")
        else:
            problems += ref_outside(readme, root, n, line, name, path)
    if entries == 0:
        problems.append(f"{readme}: no \"## Code map\" section listing \"- `name()` in `path`: role\"")
    return problems


def ref_outside(readme, root, n, line, name, path):
    """The entry's line reference (the first on its line into the named function's file: where
    the function is) when it does not point inside the function (any of its definitions). Later
    references on the line may point elsewhere: where the function is called, say."""
    problems, spans = [], extents(path, name)
    for m in LINE_REF.finditer(line):
        target = next((p for p in (root / m.group(1), readme.parent / m.group(1)) if p.is_file()),
                      None)
        if target is None or target.resolve() != path.resolve():
            continue
        nums = [int(x) for x in m.groups()[1:] if x]
        if not any(first <= min(nums) and max(nums) <= last for first, last in spans):
            where = ", ".join(f"{first}-{last}" for first, last in spans)
            problems.append(f"{readme}:{n}: code map: {m.group(0)} is not inside {name}() "
                            f"(lines {where} of {m.group(1)})")
        break
    return problems


def line_ref_problems(readme, root):
    problems = []
    for n, line in enumerate(readme.read_text().splitlines(), 1):
        for m in LINE_REF.finditer(line):
            rel = m.group(1)
            nums = [int(x) for x in m.groups()[1:] if x]
            path = next((p for p in (root / rel, readme.parent / rel) if p.is_file()), None)
            if path is None:
                problems.append(f"{readme}:{n}: {m.group(0)}: no such file")
                continue
            count = len(path.read_text(errors="replace").splitlines())
            if max(nums) > count or min(nums) < 1:
                problems.append(f"{readme}:{n}: {m.group(0)}: {rel} has {count} lines")
    return problems


# ---- 3: figures from a run ---------------------------------------------------------------------

NUM = r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?(?:e[-+]?\d+)?"
GROUP = re.compile(rf"(?<![\w.,/^_-])((?:{NUM})(?:\s*(?:-|–|/)\s*(?:{NUM}))*)(?![\w.]*\.\d)"
                   r"(\s*(?:TFLOP/s|GB/s|TB/s|ms\b|us\b|µs\b|s\b|%)|x(?![\w])|×)?")
NOT_MEASURED = re.compile(r"predict(?!ions? held)|peak|expect|would|\bat most\b|ceiling|upper bound|per clock|"
                          r"in theory|datasheet|spec sheet|at least|>=", re.I)
VERSIONED = re.compile(r"(CUDA|driver|ncu|nvcc|PyTorch|torch|Python|gcc|clang-format|version|"
                       r"nbformat|sm_|compute_|v)\s*$", re.I)
NAMES_RUN = re.compile(r"measured|by hand|\.csv", re.I)


def norm(token):
    return token.replace(",", "").rstrip("x×")


def generated_numbers(root):
    """Every number between results markers of the committed READMEs (not counts such as "14 of
    20"); speedups (1.79x) also under their own key, "x", since a speedup typed in prose must be
    one of those."""
    out, speedups = set(), set()
    for readme in [root / "README.md", *sorted(root.glob("stage*/README.md"))]:
        if not readme.is_file():
            continue
        # (an exercise's answer block, results:answer-KEY, is generated too, but prose quotes none)
        for block in re.findall(r"<!-- results:(?!answer-)[\w-]+:begin -->(.*?)<!-- results:[\w-]+:end -->",
                                readme.read_text(), re.S):
            block = re.sub(r"\b\d+ of \d+\b", " ", block)  # counts ("faster on 14 of 20"), no readings
            out.update(norm(t) for t in re.findall(NUM, block))
            speedups.update(norm(t) for t in re.findall(rf"(?:{NUM})(?=[x×])", block))
    return out, speedups


def csv_values(root):
    """Times (ms) and TFLOP/s of the committed result CSVs."""
    ms, tf = [], []
    for path in [*root.glob("plots/*/results.csv"), *root.glob("stage*/measured/*.csv")]:
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                for key, dest in (("ms_median", ms), ("ms_min", ms), ("tflops", tf)):
                    try:
                        dest.append(float(row.get(key) or ""))
                    except ValueError:
                        pass
    return ms, tf


def prose_units(text, csvs=None):
    """The lesson's prose, as (line, sentence, citing) triples, without what is not checked: citing
    is the text whose citations hold for the sentence (a table's row: the row and the sentence that
    introduces the table, the last of the paragraph right above it). A CSV file named
    in a `code span` or a link target leaves a token CSVREF<letters> in its sentence, the letters
    its place in `csvs` (filled if given), so that rule 3 can read the figures the sentence cites
    from it; a link to a LOG.md keeps its target (with its #anchor) in the sentence."""
    csvs = [] if csvs is None else csvs

    def csv_ref(path):
        csvs.append(path)
        i, letters = len(csvs) - 1, ""
        while True:
            letters = chr(ord("a") + i % 26) + letters
            i = i // 26 - 1
            if i < 0:
                return f" CSVREF{letters} "

    text = re.sub(r"<!-- results:([\w-]+):begin -->.*?<!-- results:\1:end -->",
                  lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    text = re.sub(r"```.*?```", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)

    def details(m):
        summary = re.search(r"<summary>(.*?)</summary>", m.group(0), re.S)
        named = summary and NAMES_RUN.search(summary.group(1))
        return "\n" * m.group(0).count("\n") if named else m.group(0)

    text = re.sub(r"<details>.*?</details>", details, text, flags=re.S)
    text = re.sub(r"<!--.*?-->", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    text = re.sub(r"`([^`\n]*)`", lambda m: csv_ref(m.group(1)) if CSV_NAME.fullmatch(m.group(1))
                  else " ", text)

    def link(m):
        target = m.group(1)
        if CSV_NAME.fullmatch(target):
            return "]" + csv_ref(target)
        if LOG_NAME.fullmatch(target):
            return "] " + target + " "
        return "]"

    text = re.sub(r"\]\(([^)\s]*)\)", link, text)
    units, para, start, intro = [], [], 0, ""
    for n, line in enumerate(text.split("\n") + [""], 1):
        if line.strip() and not line.lstrip().startswith("|"):
            if not para:
                start = n
            para.append(line.strip())
            continue
        if para:
            joined = " ".join(para)
            sentences = re.split(r"(?<=[.;!?])\s+(?=[A-Z(*\[])", joined)
            units += [(start, s, s) for s in sentences]
            intro = sentences[-1]  # what a table right after this paragraph cites
            para = []
        if line.lstrip().startswith("|"):
            units.append((n, line, line + " " + intro))
        elif line.strip():
            intro = ""
    return units


# A figure may also come from the committed record the sentence cites: the sentence names a step
# or a section of a LOG.md ("LOG.md, step 9", "LOG.md, steps 5 and 6", "LOG.md, \"What did not
# work\"", a link to LOG.md#what-did-not-work) or a committed CSV (`measured/x.csv`), and the figure
# is written there: in the step's or section's text as typed (commas and a trailing x aside), or as
# a number of the CSV's cells at the precision typed.
CSV_NAME = re.compile(r"(?:\.\./)*(?:[\w.-]+/)*[\w.-]+\.csv")
LOG_NAME = re.compile(r"(?:\.\./[\w.-]+/)?LOG\.md(?:#[\w-]+)?")
CITE_STEPS = re.compile(r"((?:\.\./[\w.-]+/)?LOG\.md)\]?\s*,?\s*steps?\s+"
                        r"(\d+(?:\s*(?:,|-|–|and|to)\s*\d+)*)")
CITE_SECTION = re.compile(r"((?:\.\./[\w.-]+/)?LOG\.md)(?:#([\w-]+)|\]?\s*,?\s*\"([^\"]+)\")")


def slug(heading):
    """A heading's anchor as GitHub makes it."""
    return re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", heading.strip().lower()))


def log_parts(path):
    """A LOG.md's steps and sections: {("step", N): text, ("section", slug): text}. A step is a
    heading "## Step N..." (to the next heading of its level or above) or a numbered item
    "N. **..." (to the next line that starts at the margin); a section is any heading."""
    parts, lines = {}, path.read_text(errors="replace").splitlines()
    for i, line in enumerate(lines):
        head = re.match(r"^(#{1,6})\s+(.*)", line)
        item = re.match(r"^\s{0,3}(\d+)\.\s+\*\*", line)
        if head:
            level, end = len(head.group(1)), len(lines)
            for j in range(i + 1, len(lines)):
                h = re.match(r"^(#{1,6})\s", lines[j])
                if h and len(h.group(1)) <= level:
                    end = j
                    break
            body = "\n".join(lines[i:end])
            parts[("section", slug(head.group(2)))] = body
            step = re.match(r"Step (\d+)\b", head.group(2))
            if step:
                parts.setdefault(("step", int(step.group(1))), body)
        elif item:
            end = len(lines)
            for j in range(i + 1, len(lines)):
                if lines[j].strip() and not lines[j][0].isspace():
                    end = j
                    break
            parts.setdefault(("step", int(item.group(1))), "\n".join(lines[i:end]))
    return parts


def cited_numbers(readme, sentence, csvs):
    """What the sentence cites: (the numbers, normalised, of the LOG steps and sections it names;
    the numeric cells of the CSVs it names)."""
    words, cells = set(), []

    def log_at(rel):
        path = readme.parent / rel
        return log_parts(path) if path.is_file() else {}

    for m in CITE_STEPS.finditer(sentence):
        parts = log_at(m.group(1))
        nums = [int(x) for x in re.findall(r"\d+", m.group(2))]
        steps = set(nums)
        for a, b in re.findall(r"(\d+)\s*(?:-|–|to)\s*(\d+)", m.group(2)):
            steps.update(range(int(a), int(b) + 1))
        for n in steps:
            words.update(norm(t) for t in re.findall(NUM, parts.get(("step", n), "")))
    for m in CITE_SECTION.finditer(sentence):
        parts = log_at(m.group(1))
        key = m.group(2) or slug(m.group(3) or "")
        words.update(norm(t) for t in re.findall(NUM, parts.get(("section", key), "")))
    for letters in re.findall(r"CSVREF([a-z]+)", sentence):
        i = 0
        for ch in letters:
            i = i * 26 + ord(ch) - ord("a") + 1
        rel = csvs[i - 1] if 0 < i <= len(csvs) else ""
        path = next((p for p in (readme.parent / rel, HERE.parents[1] / rel) if rel and p.is_file()),
                    None)
        if path is None:
            continue
        with open(path, newline="") as f:
            for row in csv.reader(f):
                for cell in row:
                    try:
                        cells.append(float(cell.replace(",", "")))
                    except ValueError:
                        pass
    return words, cells


def figure_problems(readme, gen, ms, tf):
    problems, csvs = [], []
    for n, sentence, citing in prose_units(readme.read_text(), csvs):
        if NOT_MEASURED.search(sentence) and not re.search(r"measured", sentence, re.I):
            continue
        cited = None  # (numbers of the LOG text it cites, cells of the CSVs), worked out once
        for m in GROUP.finditer(sentence):
            group, unit = m.group(1), (m.group(2) or "").strip()
            if VERSIONED.search(sentence[:m.start()]):
                continue
            for tok in re.findall(NUM, group):
                t = norm(tok)
                frac = t.split(".")[1] if "." in t and "e" not in t else ""
                if unit == "" and not ("e" in t or len(frac) >= 2):
                    continue  # an integer, or one decimal, without a unit: not read as a reading
                if unit == "%" and not frac:
                    continue  # whole percentages: shares worked out by hand, as a rule
                if t in (gen[1] if unit in ("x", "×") else gen[0]):
                    continue
                scale = {"ms": 1.0, "us": 1e-3, "µs": 1e-3, "s": 1e3}.get(unit)
                pool = tf if unit == "TFLOP/s" else ms if scale else []
                want = float(t) * (scale or 1.0)
                places = max(len(frac) + {"us": 3, "µs": 3, "s": -3}.get(unit, 0), 0)
                digits = len(t.replace(".", "").lstrip("0"))

                def near(values, value=want, at=places):
                    return any(abs(round(x, at) - value) <= 1e-9 * max(1.0, value) for x in values)

                if digits >= 3 and near(pool):
                    continue
                if cited is None:
                    cited = cited_numbers(readme, citing, csvs)
                if t in cited[0]:
                    continue  # written so in the LOG step or section the sentence cites
                if digits >= 3 and near(cited[1], float(t), len(frac)):
                    continue  # a number of a CSV the sentence cites
                shown = tok + unit if unit in ("x", "×") else f"{tok} {unit}".strip()
                problems.append(f"{readme}:{n}: \"{shown}\" typed in prose matches nothing in "
                                f"the committed results: quote the generated tables, cite the LOG "
                                f"step or the CSV it is written in, or move it into an exercise's "
                                f"answer that names its run")
    return problems


# ---- 4: length --------------------------------------------------------------------------------

MAX_WORDS = 2300
MAX_WORDS_LONG = 3000  # the lessons of stages 5-10: a schedule to explain, and a LOG to stand without
LONG_LESSONS = range(5, 11)


def word_limit(readme):
    """The most words a lesson may hold: MAX_WORDS_LONG for stages 5-8, MAX_WORDS elsewhere."""
    m = re.match(r"stage(\d+)_", Path(readme).resolve().parent.name)
    return MAX_WORDS_LONG if m and int(m.group(1)) in LONG_LESSONS else MAX_WORDS


def word_count(text):
    """The words of a lesson outside its generated sections and HTML comments (rule 4)."""
    text = re.sub(r"<!-- results:([\w-]+):begin -->.*?<!-- results:\1:end -->", " ", text, flags=re.S)
    text = re.sub(r"<!--.*?-->", " ", text, flags=re.S)
    return sum(1 for w in text.split() if re.search(r"[A-Za-z0-9]", w))


def length_problems(readme, limit=None):
    limit = limit or word_limit(readme)
    n = word_count(readme.read_text())
    if n <= limit:
        return []
    return [f"{readme}: {n:,} words outside its generated sections, more than {limit:,}: move the "
            f"step-by-step history into the stage's LOG.md"]


# ---- driver ------------------------------------------------------------------------------------


def check(readmes, root):
    gen = generated_numbers(root)
    ms, tf = csv_values(root)
    top = (root / "README.md").resolve()
    results = []  # (name, problems)
    for r in readmes:
        full = r.resolve()  # r: a file as named from here, or under root
        # named relative to root when that also names it from here (as from the repository's root)
        r = full.relative_to(root) if full.is_relative_to(root) and Path.cwd().resolve() == root else full
        if full != top:  # a lesson; the top README is held to rule 3 only
            results.append((f"{r}: code map", code_map_problems(r, root)))
            results.append((f"{r}: line references", line_ref_problems(r, root)))
            results.append((f"{r}: at most {word_limit(full):,} words", length_problems(r)))
        results.append((f"{r}: no untraced figure in prose", figure_problems(r, gen, ms, tf)))
    return results


def report(results):
    passed = failed = 0
    for name, problems in results:
        if problems:
            failed += 1
            print(f"FAIL  {name}")
            for p in problems[:12]:
                print(f"      {p[:300]}")
            if len(problems) > 12:
                print(f"      ... and {len(problems) - 12} more")
        else:
            passed += 1
            print(f"ok    {name}")
    return passed, failed


def self_test(root):
    """Each fixture must give exactly the problems it was made for."""
    fx = FIXTURES
    outcomes = []

    def expect(what, problems, *needles, none=False):
        if none:
            ok = not problems
        else:
            ok = all(any(nd in p for p in problems) for nd in needles)
        outcomes.append((f"self-test: {what}", [] if ok else
                         [f"expected {'no problem' if none else needles}, got {problems}"]))

    good = fx / "good" / "README.md"
    expect("a correct lesson passes the code map check", code_map_problems(good, fx / "good"),
           none=True)
    expect("a correct lesson passes the line reference check",
           line_ref_problems(good, fx / "good"), none=True)
    bad = fx / "bad" / "README.md"
    cm = code_map_problems(bad, fx / "bad")
    expect("a wrong function name fails", cm, "missing_function() is not defined")
    expect("a call is not a definition", cm, "only_called() is not defined")
    expect("a declaration is not a definition", cm, "only_declared() is not defined")
    expect("a missing file fails", cm, "nowhere.cu does not exist")
    expect("a malformed code map line fails", cm, "not of the form")
    expect("no code map fails", code_map_problems(fx / "no_map.md", fx / "bad"), "no \"## Code map\"")
    expect("a line reference past the end fails", line_ref_problems(bad, fx / "bad"),
           "kernel.cu#L500", "kernel.cu:999")
    expect("a code map entry's line outside its function fails", cm,
           "kernel.cu:2 is not inside defined_here()")
    # rule 4: a lesson one word over the limit fails, one at the limit passes, and the words of a
    # generated section, a comment or a table's rules do not count
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        body = good.read_text()
        base = word_count(body)
        over, at = Path(tmp) / "over.md", Path(tmp) / "at.md"
        filler = lambda n: " ".join(["word"] * n)
        over.write_text(body + "\n" + filler(MAX_WORDS + 1 - base) + "\n")
        at.write_text(body + "\n" + filler(MAX_WORDS - base) + "\n<!-- results:stage1:begin -->\n" +
                      filler(500) + "\n<!-- results:stage1:end -->\n<!-- " + filler(50) +
                      " -->\n| --- | --- |\n")
        expect("a lesson over the word limit fails", length_problems(over),
               f"{MAX_WORDS + 1:,} words outside")
        expect("a lesson at the word limit passes (generated sections, comments, rules uncounted)",
               length_problems(at), none=True)
        # stages 5-8 may hold MAX_WORDS_LONG words: over MAX_WORDS passes there, one over fails
        (Path(tmp) / "stage5_x").mkdir()
        (Path(tmp) / "stage4_x").mkdir()
        long_at, long_over = Path(tmp) / "stage5_x" / "README.md", Path(tmp) / "stage5_x" / "o.md"
        short_over = Path(tmp) / "stage4_x" / "README.md"
        long_at.write_text(body + "\n" + filler(MAX_WORDS_LONG - base) + "\n")
        long_over.write_text(body + "\n" + filler(MAX_WORDS_LONG + 1 - base) + "\n")
        short_over.write_text(body + "\n" + filler(MAX_WORDS + 1 - base) + "\n")
        expect("a lesson of stages 5-8 at its longer limit passes", length_problems(long_at),
               none=True)
        expect("a lesson of stages 5-8 over its longer limit fails", length_problems(long_over),
               f"{MAX_WORDS_LONG + 1:,} words outside")
        expect("a lesson of another stage keeps the shorter limit", length_problems(short_over),
               f"{MAX_WORDS + 1:,} words outside")
        # rule 3's citations: a figure written in the LOG step, the LOG section or the CSV that
        # its sentence cites passes; cited from the wrong step, or not in the CSV, it fails
        stage = Path(tmp) / "stage6_x"
        (stage / "measured").mkdir(parents=True)
        (stage / "LOG.md").write_text(
            "# Log\n\n## The steps\n\n1. **One.** Measured: 412.57 TFLOP/s, 0.9613 of the time.\n"
            "2. **Two.** Measured: 1.0078 of cuDNN,\n   and 3.1416 ms.\n\n## What did not work\n\n"
            "- A try: 0.8765 of the time.\n\n## Step 7: a heading step\n\n2.7183 ms.\n")
        (stage / "measured" / "run.csv").write_text("shape,ms\nfa2,1.23456\n")
        cites = stage / "README.md"
        cites.write_text(
            "# Cites\n\n"
            "A 0.9613 (LOG.md, step 1). And 3.1416 ms ([LOG.md](LOG.md), steps 1 and 2).\n\n"
            "A try gave 0.8765 (LOG.md, \"What did not work\"); Again 0.8765\n"
            "([LOG.md](LOG.md#what-did-not-work)). Then 2.7183 ms (LOG.md, step 7).\n\n"
            "The run took 1.235 ms (`measured/run.csv`).\n\n"
            "Wrong: 1.0078 (LOG.md, step 1). Wrong: 1.2399 ms (`measured/run.csv`). Wrong: 0.9613.\n\n"
            "As measured (LOG.md, step 1):\n\n| run | TFLOP/s |\n|---|---|\n| one | 412.57 |\n\n"
            "## A table that cites nothing\n\n| run | TFLOP/s |\n|---|---|\n| one | 412.57 |\n")
        cited = figure_problems(cites, (set(), set()), [], [])
        for needle in ["1.0078", "1.2399 ms"]:
            expect(f"a figure its citation does not hold ({needle}) is caught", cited, f'"{needle}"')
        expect("a figure with no citation is caught", cited, '"0.9613"')
        expect("a table's figure its introducing sentence does not cite is caught",
               [p for p in cited if ":22:" in p], '"412.57"')
        expect("figures their cited LOG step, section or CSV holds pass (a table's: its "
               "introducing sentence's)", [p for p in cited if not re.search(r":(10|22):", p)],
               none=True)
    gen = generated_numbers(root)
    ms, tf = csv_values(root)
    # The fixture's stale readings, taken out of what the results hold: a later sweep may measure
    # one of them for real, and the check must still be seen to catch a figure they do not hold.
    stale_tf, stale_ms = ("337.3", "331.2"), ("101.7", "103.3", "14")
    gen = (gen[0] - {*stale_tf, *stale_ms}, gen[1])
    tf = [x for x in tf if f"{x:.1f}" not in stale_tf]
    ms = [x for x in ms if f"{x:.1f}" not in stale_ms and f"{x:.0f}" not in stale_ms]
    stale = figure_problems(fx / "stale.md", gen, ms, tf)
    for needle in ["337.3 TFLOP/s", "1.000", "0.959", "1.044", "331.2 TFLOP/s", "101.7 ms",
                   "103.3 ms", "1.015", "1.125", "1.046", "1.129", "0.971", "1.5x", "1.7x", "1.4x",
                   "1.6x", "14 ms", "2x", "16.01"]:
        expect(f"the stale figure {needle} is caught", stale, f'"{needle}"')
    # and every stale passage of the fixture (paragraphs after its header) has a problem
    lines = (fx / "stale.md").read_text().splitlines()
    start = None
    for n, line in enumerate(lines + [""], 1):
        if line.strip() and start is None and n > 4:
            start = n
        elif not line.strip() and start is not None:
            hit = [p for p in stale if start <= int(p.split(":")[1]) < n]
            outcomes.append((f"self-test: stale passage at stale.md:{start} is caught",
                             [] if hit else [f"nothing reported in lines {start}-{n - 1}"]))
            start = None
    expect("figures that are not readings pass (predictions, peaks, code, named answers)",
           figure_problems(fx / "fine.md", gen, ms, tf), none=True)
    # the top README (README.md at the root): its prose is checked, and only its prose
    top = fx / "top" / "README.md"
    names = [name for name, _ in check([top], fx / "top")]
    outcomes.append(("self-test: the top README gets the figure check only (no code map)",
                     [] if names == [f"{top}: no untraced figure in prose"] else
                     [f"expected only its figure check, got {names}"]))
    # its stale figures taken out of the generated tables' numbers, as the stale readings above
    top_figures = ("42", "139", "689", "700", "267", "146", "60")
    top_stale = figure_problems(top, (gen[0] - set(top_figures), gen[1]), ms, tf)
    for needle in [f"{t} s" for t in top_figures]:
        expect(f"the top README's stale figure {needle} is caught", top_stale, f'"{needle}"')
    return outcomes


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("readmes", nargs="*", type=Path)
    ap.add_argument("--root", type=Path, default=HERE.parents[1])
    ap.add_argument("--self-test", action="store_true")
    args = ap.parse_args()
    root = args.root.resolve()
    if args.self_test:
        results = self_test(root)
    else:
        readmes = args.readmes or sorted(root.glob("stage*/README.md"))
        readmes = [r if r.is_file() else root / r for r in map(Path, readmes)]
        if not args.readmes:
            # A lesson not yet rewritten in the lesson format (no "## Code map": issue 19) is named
            # and skipped, not checked against rules it was not written to; every lesson in the
            # format is checked, and a lesson named on the command line always is.
            waiting = [r for r in readmes if "\n## Code map" not in r.read_text()]
            for r in waiting:
                print(f"SKIP  {r.relative_to(root)}: not yet in the lesson format (no '## Code map')")
            readmes = [r for r in readmes if r not in waiting]
            if (root / "README.md").is_file():
                readmes.append(root / "README.md")  # the course page: its prose (rule 3) only
        results = check(readmes, root)
    passed, failed = report(results)
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
