#!/usr/bin/env python3
"""Labs: a stage's own source with the lesson's code cut into holes, and the grader for them.

The holes are marked in the stage's source files (any *.cu, *.cuh, *.h of its folder) by comment
lines, so a lab is generated from the code it teaches and cannot drift from it:

    // LAB HOLE 2 BEGIN [design]: the online-softmax update  (a part of hole 2: its tags, its title)
    // LAB TODO: what the learner must compute, the layouts, the invariants (any number of lines)
    // LAB STUB: code the lab keeps in place of the hole  (optional; e.g. S[j] = 0.f so that
    //                                                     the unfilled lab still compiles)
    ...the solution's code...
    // LAB HOLE 2 END

A hole is numbered 1, 2, ... in the lesson's order (not necessarily the file's), and may have
several parts (the same number BEGIN ... END more than once, in one file or several): a part
keeps its title, and the hole is graded as one. A part's marker lines (BEGIN, TODO, STUB, END) are
indented as the code they sit in, all alike, and the lab keeps that indentation.

Tags, each in brackets after BEGIN (none, one or several; the parts of a hole carry the same code
path and the same [design]):
  [design]   a design hole: the learner writes a whole phase from the lesson's specification. Its
             TODO says what the code must compute, the layouts and the invariants it keeps, never
             the calls; the calls are in the stage's LAB.md, in folded hints, progressive (the
             idea, then the shape, then the code), each tied to its hole by its number:
                 <details><summary>Hint 2.1: the idea</summary> ... </details>
             (Hint N.k: hole N's k-th hint, k = 1, 2, ... in order). `labs.py lint` checks that
             no line of the hole's solution appears in its TODO or in its first hint (N.1): the
             code of a line without its // comment, its leading } and trailing { or ;, compared
             without whitespace; lines shorter than 12 characters or only punctuation are left
             out. Every [design] hole has a Hint N.1, and every hint a hole.
  [t4]       code of the sm_75 (T4) path: graded from PTX for compute_75 run with --smem-limit
             65536 on a newer GPU.
  [sm80]     code of sm_80 and newer (cp.async): graded natively from sm_80 on, and on a T4 only
             compiled (PTX for compute_80) and reported as not gradable there.
  [smem>=N]  code that runs only where a block may use at least N bytes of shared memory (the
             least, over the shapes the self-test runs, of what the kernel holding it needs): on
             a GPU or a path that gives a block less (a T4's 65536, an L4's 101376, or less by
             --smem-limit) the checker never runs it, and the report card says so ("not
             gradable on this GPU") instead of grading it. A part's own: a hole whose other
             parts run is graded on those, and the report card names the part it could not.
  [gpus>=N]  code that runs only where the program has at least N GPUs (stage 10's ring: the ring
             of one GPU sends nothing and merges nothing): on a machine with fewer the report
             card says that it is not gradable there, as for [smem>=N].
Markers are comments: the stage's machine code is the same with them or without them.

An unfilled lab must fail fast and cleanly: a stub leaves wrong values, or, where doing nothing
would leave the kernel waiting forever (stage 6's producer: no arrival on an mbarrier the
consumers wait on), prints "lab hole N unfilled: ..." and traps (host code returns its error with
that line: stage 10's transfers, where sending nothing would compute from unset buffers); the
grader reports that line.

A stage is a folder stage<n>_<name> with an attention.cu (a stage of the one host program,
common/main.c), or one whose stage.mk names the sources of a program of its own
(<stage>_PROGRAM_SOURCES := ring.cu: stage 10, whose program is common/ring_main.c around its
ring); such a program is built by its stage.mk's rule for $(BUILD)/<stage>, loads the stage
libraries <stage>_PROGRAM_LIBS names (make grade builds them once per target, in
build/lab/<stage>/libs-<target>/, and runs the program with --lib-dir there), and runs the quick
cases and the timed shape of its <stage>_LAB_CASES. A program that cannot be built here (stage 10
without NCCL) says so in one line, "make: <stage> skipped: why", and make grade repeats it and
exits 3, nothing graded. make diff says of such a stage that it is a program of its own.
A stage's holes live in its own folder's files (a primitive of common/device/ is not cut into a
lab). labs/<stage>/ gets a copy of each file that has holes; the grader builds the stage from a
tree of links to the repository in which those files are the learner's, with the Makefile, so a
lab is compiled and linked exactly as the stage's own program (stage 7's forward included).
Each program is built in build/lab/<stage>/ in a folder named by its target and a hash of its
files: jobs of the same content (every hole of a lab filled with the stage's code, the stage's own
program) are built and run once, a later grade finds them built, and a new folder starts from
the common objects of the last one (this stage's; else another stage's, for the same target).
A target given as PTX only (compute_75: the T4 path, or the build without a GPU) is built as that
PTX and, from the same PTX, machine code for its GPU (sm_75), so that ptxas reports on it.

The report card ends with a table: per kernel that holds a hole's code (its body has a part, or
calls a function that has one, or was written in one), the registers, spill stores and loads and
stack frame (ptxas -v, the build's report) of the learner's build beside the stage's own. With no
GPU the grader builds both for the stage's no-GPU target (compute_75, or its stage.mk's
<stage>_LAB_ARCH) and prints the table, then says that nothing was graded and exits 3 (the
programs' "unsupported here"): a compile is no grade. On a GPU where none of the holes can be
graded (all of them [gpus>=2] on a machine with one GPU) it runs your file all the same; if that
passes, it says that no hole was graded and exits 3 too (a failure is still a failure, exit 1).

The capstone (capstone/attention.cu, make lab STAGE=capstone) is a lab of one [design] hole: the
whole FlashAttention-2 forward pass, kernels and launcher, behind the stage contract, from a
specification. It builds and is graded like a stage (common/main.c and the learner's file, the
same checker and self-test); its solution is stage 5's kernel behind the capstone's contract, so
"the stage's own code" it is timed against is stage 5's.

In the lab the BEGIN and END lines stay (the grader finds the learner's code between them); in
between, every `LAB TODO:` line becomes `TODO:` and every `LAB STUB: code` line becomes `code`,
and the solution's lines are left out.

usage: labs.py lab STAGE [--restart]          write labs/<stage>/ (never over a learner's edits)
       labs.py grade STAGE [--arch A] [--smem-limit B] [--gpu-name NAME] [--jobs J] [--quick]
                           [--yours-only]      (--yours-only: the table without the stage's own
                                               kernels, which then are not built)
       labs.py render FILE                     a stage file's lab text, to stdout
       labs.py fill LAB_FILE SOLUTION_FILE [--except K]
                                               the lab with its holes (all, or all but hole K)
                                               filled from the solution, to stdout
       labs.py holes STAGE                     the stage's holes, one line each
       labs.py lint STAGE|DIR... [--need-design LIST]
                                               the markers, the hints and the design holes'
                                               TODOs and first hints (LIST: stage numbers whose
                                               lab must have a [design] hole)
       labs.py read STAGE [--plain]            the stage's files without lab markers, in its
                                               code map's order, lines numbered as in the files
       labs.py diff STAGE BASE [--all]         what STAGE adds over BASE (folders): the whole
                                               diff, or for a rewrite, one line saying so and
                                               the diffs of the files that correspond; a header
                                               comment that STAGE rewrites shows as STAGE's,
                                               BASE's as one line (--all: everything in full)
STAGE is a stage number, a stage's folder name, or capstone.
"""

import argparse
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE_SUFFIXES = (".cu", ".cuh", ".h")
BEGIN = re.compile(r"^([ \t]*)// LAB HOLE (\d+) BEGIN((?: \[[^\]\s]+\])*): (\S.*)$")
END = re.compile(r"^([ \t]*)// LAB HOLE (\d+) END$")
TODO = re.compile(r"^([ \t]*)// LAB TODO:(?: (.*))?$")
STUB = re.compile(r"^([ \t]*)// LAB STUB:(?: (.*))?$")
ANY = re.compile(r"LAB +(HOLE|TODO|STUB)\b")  # a marker, well formed or not
MARKER = re.compile(r"^[ \t]*// LAB (HOLE \d+ (BEGIN|END)\b|TODO:|STUB:)")  # a marker line
SMEM_TAG = re.compile(r"smem>=(\d+)")
GPUS_TAG = re.compile(r"gpus>=(\d+)")
# The code paths a hole can be on, beyond the GPU's own: how to build and run each.
PATHS = {"t4": {"arch": "compute_75", "smem_limit": "65536",
                "what": "the sm_75 (T4) path: PTX for compute_75, --smem-limit 65536"},
         "sm80": {"min_arch": 80, "what": "code for sm_80 and newer"}}
# The most shared memory a block may use (opt-in), by compute capability: the CUDA C++
# Programming Guide's table of technical specifications. A [smem>=N] part runs where the path's
# --smem-limit, else this, is at least N; a GPU not listed here is taken to run it.
SMEM_PER_BLOCK = {70: 98304, 72: 98304, 75: 65536, 80: 166912, 86: 101376, 87: 166912,
                  89: 101376, 90: 232448, 100: 232448, 103: 232448, 120: 101376, 121: 101376}
# Where the grader compiles without a GPU: compute_75, unless the stage's stage.mk names another
# (<stage>_LAB_ARCH: a stage whose kernels exist on one architecture only).
NO_GPU_ARCH = "compute_75"
CAPSTONE = "capstone"  # the capstone lab's folder (not a stage: no sweep, no fat build)
CAPSTONE_REFERENCE = "stage 5's kernel"  # what its solution runs, and its speed is measured against
# the programs' exit codes, from their one home: the attn_exit enum of common/attention.h
EXIT_CODES = {k: int(v) for k, v in re.findall(r"^\s*ATTN_EXIT_([A-Z]+)\s*=\s*(\d+)",
                                               (ROOT / "common" / "attention.h").read_text(), re.M)}
EXIT_PASS, EXIT_WRONG, EXIT_UNSUPPORTED = (EXIT_CODES[k] for k in ("PASS", "WRONG", "UNSUPPORTED"))
SMOKE = [  # quick cases run before the self-test, so a wrong kernel fails in seconds
    ["--batch", "2", "--heads", "3", "--seq", "1000", "--dim", "128", "--causal", "--dist", "peaky",
     "--check", "all"],
    ["--batch", "1", "--heads", "1", "--seq", "65", "--dim", "64", "--dist", "peaky", "--check",
     "all"],
]
BENCH = ["--batch", "1", "--heads", "16", "--seq", "4096", "--dim", "128", "--bench", "--check",
         "0", "--csv", "--budget", "20"]
# A decode stage's (its stage.mk: <stage>_LAB_CASES := decode): new queries against a KV cache,
# paged and ragged with new keys, then a contiguous one (its program's plain path).
DECODE_SMOKE = [
    ["--batch", "3", "--heads", "8", "--kv-heads", "2", "--seq", "4", "--seq-k", "1000",
     "--page-size", "16", "--ragged", "--new-tokens", "2", "--causal", "--dist", "peaky", "--check",
     "all"],
    ["--batch", "1", "--heads", "32", "--kv-heads", "8", "--seq", "1", "--seq-k", "4097", "--dim",
     "64", "--dist", "peaky", "--check", "all"],
]
DECODE_BENCH = ["--batch", "1", "--heads", "32", "--kv-heads", "8", "--seq", "1", "--seq-k",
                "32768", "--dim", "128", "--layout", "bnhd", "--bench", "--check", "0", "--csv",
                "--budget", "20"]
# A ring's (stage 10's stage.mk: <stage>_LAB_CASES := ring), on every GPU here (one: the ring of
# one): forward and backward, checked against the ring of one on every element and against float64
# on sampled rows; the zigzag split with the causal mask over two chunks per GPU, then the
# contiguous one without a mask, in bf16, with slices of unequal sizes (4097 tokens). Timed: the
# ring's forward plus backward (the program also times the ring of one beside it).
RING_SMOKE = [
    ["--batch", "2", "--heads", "4", "--kv-heads", "2", "--seq", "1000", "--dim", "128",
     "--causal", "--backward", "--dist", "peaky"],
    ["--heads", "2", "--kv-heads", "1", "--seq", "4097", "--dim", "64", "--layout", "contiguous",
     "--bf16", "--backward", "--dist", "peaky"],
]
RING_BENCH = ["--seq", "32768", "--heads", "32", "--kv-heads", "8", "--causal", "--backward",
              "--dim", "128", "--bench", "--check", "0", "--csv", "--budget", "5"]
# <stage>_LAB_CASES -> the quick cases, the timed shape, the columns of its CSV row whose sum is the
# time compared (the main program's median; the ring's forward and backward), and what that is
CASES = {"": (SMOKE, BENCH, ("ms_median",), ""),
         "decode": (DECODE_SMOKE, DECODE_BENCH, ("ms_median",), ""),
         "ring": (RING_SMOKE, RING_BENCH, ("fwd_ms", "bwd_ms"), "forward + backward")}
SMOKE_TIMEOUT, SELF_TEST_TIMEOUT, BENCH_TIMEOUT = 60, 600, 300
# A program built as PTX for an older GPU (the T4 path, compute_75, on a newer GPU) is compiled by
# the driver when its first kernel launches: scalar stages' unrolled loops take tens of seconds to
# minutes of a loaded machine's CPU. The first quick case of such a program is given this much more
# (the driver keeps what it compiled: later runs start at once).
JIT_ALLOWANCE = 300


def stage_mk_value(sdir, var):
    """The value of the stage's stage.mk line `<stage>_<var> := value` (the Makefile reads it
    too), or None."""
    words = stage_mk_words(sdir, var)
    return words[0] if words and len(words) == 1 else None


def stage_mk_words(sdir, var):
    """The words of the stage's stage.mk line `<stage>_<var> := a b c`, or [] (no such line)."""
    mk = sdir / "stage.mk"
    if not mk.exists():
        return []
    m = re.search(rf"^{re.escape(sdir.name)}_{var}\s*:?=[ \t]*(\S.*?)\s*$", mk.read_text(), re.M)
    return m.group(1).split() if m else []


def program_sources(sdir):
    """The stage's sources that its program compiles, in its folder: attention.cu (a stage of the
    one host program), or its stage.mk's <stage>_PROGRAM_SOURCES (a program of its own)."""
    if (sdir / "attention.cu").is_file():
        return ["attention.cu"]
    return [f for f in stage_mk_words(sdir, "PROGRAM_SOURCES") if (sdir / f).is_file()]


def own_program(sdir):
    """Whether the stage is a program of its own (stage 10), not a stage of common/main.c."""
    return not (sdir / "attention.cu").is_file() and bool(program_sources(sdir))


def no_gpu_arch(sdir):
    """The target a lab compiles for without a GPU: the stage's <stage>_LAB_ARCH, else
    NO_GPU_ARCH."""
    return stage_mk_value(sdir, "LAB_ARCH") or NO_GPU_ARCH


def grade_cases(sdir):
    """The quick cases, the timed shape and the timed CSV columns of a stage's grade: (SMOKE,
    BENCH, ...), or those its stage.mk's <stage>_LAB_CASES names (decode, ring)."""
    kind = stage_mk_value(sdir, "LAB_CASES") or ""
    if kind not in CASES:
        raise LabError(f"{sdir.name}/stage.mk: {sdir.name}_LAB_CASES := {kind}: not one of "
                       f"{', '.join(k for k in CASES if k)}")
    return CASES[kind]


class LabError(Exception):
    pass


# ---- the markers -------------------------------------------------------------------------------


def parse_tags(tags, where):
    """(code path tag or '', design, least shared memory or 0, least GPUs or 0) from a BEGIN's
    ' [a] [b]' text."""
    path, design, smem, gpus = "", False, 0, 0
    for tag in re.findall(r"\[([^\]]+)\]", tags):
        m, g = SMEM_TAG.fullmatch(tag), GPUS_TAG.fullmatch(tag)
        if tag == "design" and not design:
            design = True
        elif tag in PATHS and not path:
            path = tag
        elif m and not smem:
            smem = int(m.group(1))
        elif g and not gpus and int(g.group(1)) >= 1:
            gpus = int(g.group(1))
        else:
            raise LabError(f"{where}: tag [{tag}] is not one of [design], [t4], [sm80], [smem>=N], "
                           f"[gpus>=N] (each once, a hole on one code path)")
    return path, design, smem, gpus


def parse(text, name):
    """The file's text as a list of pieces: str (lines outside the holes, kept as they are) or a
    dict for each hole part: hole, tag (its code path), design, smem, title, begin and end (the
    marker lines), body (the lines between them), line (BEGIN's) and end_line; gpus, the
    least GPUs its code runs on (0: any)."""
    pieces, out, part = [], [], None
    for n, line in enumerate(text.splitlines(keepends=True), 1):
        bare = line.rstrip("\n")
        b, e = BEGIN.match(bare), END.match(bare)
        if ANY.search(bare) and not (b or e or TODO.match(bare) or STUB.match(bare)):
            raise LabError(f"{name}:{n}: not a well-formed lab marker: {bare.strip()}")
        if part is None and (TODO.match(bare) or STUB.match(bare)):
            raise LabError(f"{name}:{n}: a LAB TODO or LAB STUB line outside a hole")
        if part is None:
            if e:
                raise LabError(f"{name}:{n}: LAB HOLE {e.group(2)} END without a BEGIN")
            if b:
                if out:
                    pieces.append("".join(out))
                out = []
                path, design, smem, gpus = parse_tags(b.group(3), f"{name}:{n}")
                part = {"hole": int(b.group(2)), "tag": path, "design": design, "smem": smem,
                        "gpus": gpus, "title": b.group(4), "begin": line, "indent": b.group(1),
                        "body": [], "line": n}
            else:
                out.append(line)
            continue
        if b:
            raise LabError(f"{name}:{n}: LAB HOLE {b.group(2)} BEGIN inside hole {part['hole']} "
                           f"(line {part['line']})")
        if e:
            if int(e.group(2)) != part["hole"]:
                raise LabError(f"{name}:{n}: LAB HOLE {e.group(2)} END closes hole {part['hole']} "
                               f"(line {part['line']})")
            part["end"] = line
            part["end_line"] = n
            part["body"] = "".join(part["body"])
            pieces.append(part)
            part = None
            continue
        part["body"].append(line)
    if part is not None:
        raise LabError(f"{name}:{part['line']}: LAB HOLE {part['hole']} BEGIN without an END")
    if out:
        pieces.append("".join(out))
    return pieces


def lab_body(part):
    """What the lab has between a part's BEGIN and END: its TODO text, then its stub."""
    todo, stub = [], []
    for line in part["body"].splitlines(keepends=True):
        t, s = TODO.match(line.rstrip("\n")), STUB.match(line.rstrip("\n"))
        if t:
            todo.append(f"{t.group(1)}// TODO:{' ' + t.group(2) if t.group(2) else ''}\n")
        elif s:
            stub.append(f"{s.group(1)}{s.group(2) or ''}".rstrip() + "\n")
    return "".join(todo + stub)


def solution_lines(part):
    """The part's solution: its body's lines that are not TODO or STUB lines, with their numbers."""
    out = []
    for k, line in enumerate(part["body"].splitlines(), part["line"] + 1):
        if not (TODO.match(line) or STUB.match(line)):
            out.append((k, line))
    return out


def todo_text(part):
    return " ".join((TODO.match(ln).group(2) or "") for ln in part["body"].splitlines()
                    if TODO.match(ln))


def render(text, name):
    """The lab version of a stage file's text."""
    out = []
    for p in parse(text, name):
        out.append(p if isinstance(p, str) else p["begin"] + lab_body(p) + p["end"])
    return "".join(out)


def without_markers(text, name):
    """A stage file's text with every lab marker line (BEGIN, END, TODO, STUB) left out, as
    [(line number in the file, line)]: the stage's code as it reads with no lab in it."""
    parse(text, name)  # well formed
    return [(n, ln) for n, ln in enumerate(text.splitlines(keepends=True), 1)
            if not MARKER.match(ln)]


def parts_of(pieces):
    return [p for p in pieces if not isinstance(p, str)]


def fill(lab_text, solution_text, keep, lab_name, solution_name):
    """The learner's file with every hole not in `keep` filled from the solution (the learner's
    own text outside the holes is kept). The two must have the same holes, in the same order."""
    lab, sol = parse(lab_text, lab_name), parse(solution_text, solution_name)
    lp, sp = parts_of(lab), parts_of(sol)
    if [(p["hole"], p["title"]) for p in lp] != [(p["hole"], p["title"]) for p in sp]:
        raise LabError(f"{lab_name}: its holes are not those of {solution_name} (the lab was "
                       f"written from another version of the stage: make lab STAGE=n --restart)")
    it = iter(sp)
    out = []
    for p in lab:
        if isinstance(p, str):
            out.append(p)
            continue
        s = next(it)
        out.append(p["begin"] + (p["body"] if p["hole"] in keep else s["body"]) + p["end"])
    return "".join(out)


def outside(pieces):
    return "".join(p for p in pieces if isinstance(p, str))


# ---- a stage and its lab -----------------------------------------------------------------------


def stage_dirs():
    """The stages' folders by number: those with an attention.cu, and those whose stage.mk names
    their program's sources (stage 10)."""
    return sorted((d for d in ROOT.glob("stage[0-9]*_*") if d.is_dir() and program_sources(d)),
                  key=lambda d: int(re.match(r"stage(\d+)", d.name).group(1)))


def stage_dir(stage):
    """The folder of stage `stage` (a number or a folder name), or the capstone's."""
    s = str(stage).rstrip("/")
    if s == CAPSTONE and (ROOT / CAPSTONE / "attention.cu").is_file():
        return ROOT / CAPSTONE
    dirs = stage_dirs()
    for d in dirs:
        if s == d.name or re.fullmatch(r"\d+", s) and d.name.split("_")[0] == f"stage{s}":
            return d
    nums = " ".join(d.name.split("_")[0][5:] for d in dirs)
    raise LabError(f"STAGE={s}: no such stage (one of {nums}, or {CAPSTONE})")


def stage_number(sdir):
    """What STAGE= names a stage's folder by: its number, or capstone."""
    m = re.match(r"stage(\d+)_", sdir.name)
    return m.group(1) if m else sdir.name


def stage_files(sdir):
    """The stage's source files that have holes: {relative path: text}, and every hole's parts."""
    files, holes = {}, {}
    for f in sorted(sdir.iterdir()):
        if f.suffix not in SOURCE_SUFFIXES or not f.is_file():
            continue
        text = f.read_text()
        pieces = parse(text, f"{sdir.name}/{f.name}")
        if not parts_of(pieces):
            continue
        files[f.name] = text
        for p in parts_of(pieces):
            holes.setdefault(p["hole"], []).append(dict(p, file=f.name))
    if holes and sorted(holes) != list(range(1, len(holes) + 1)):
        raise LabError(f"{sdir.name}: holes numbered {sorted(holes)}: they must be 1..{len(holes)}")
    for n, ps in holes.items():
        if len({p["tag"] for p in ps}) > 1:
            raise LabError(f"{sdir.name}: hole {n}: its parts are on different code paths")
        if len({p["design"] for p in ps}) > 1:
            raise LabError(f"{sdir.name}: hole {n}: [design] on some of its parts only (a design "
                           f"hole's parts carry it all)")
    return files, holes


def rel_path(p):
    try:
        return p.relative_to(ROOT)
    except ValueError:
        return p


def hole_title(parts):
    """A hole's title: its one part's, or the part titles' common head ("the cp.async pipeline:
    tile 0 on its way" and "the cp.async pipeline: wait for tile kt" make "the cp.async pipeline")."""
    heads = {p["title"].split(": ")[0] for p in parts}
    if len(parts) > 1 and len(heads) == 1:
        return f"{heads.pop()} ({len(parts)} parts)"
    return parts[0]["title"]


LABS = ROOT / "labs"


def lab_dir(sdir):
    return LABS / sdir.name


def plural(n, word):
    return f"{n} {word}" + ("" if n == 1 else "s")


def cmd_lab(args):
    sdir = stage_dir(args.stage)
    files, holes = stage_files(sdir)
    if not holes:
        raise LabError(f"{sdir.name} has no lab yet (no LAB HOLE markers in its source)")
    dest = lab_dir(sdir)
    dest.mkdir(parents=True, exist_ok=True)
    rel = rel_path(dest)
    num = stage_number(sdir)
    wrote, kept, same = [], [], []
    for name, text in files.items():
        lab_text = render(text, f"{sdir.name}/{name}")
        path = dest / name
        if path.exists() and path.read_text() == lab_text:
            same.append(name)
            continue
        if path.exists() and not args.restart:
            kept.append(name)
            continue
        if path.exists():
            old = path.with_name(f"{name}.{time.strftime('%Y%m%d-%H%M%S')}.bak")
            path.rename(old)
            print(f"make lab: your {rel}/{name} is kept as {rel}/{old.name}")
        path.write_text(lab_text)
        wrote.append(name)
    guide = sdir / "LAB.md"
    for name in wrote:
        print(f"make lab: wrote {rel}/{name}")
    for name in kept:
        print(f"make lab: {rel}/{name} has your edits: kept as it is (to start over from the "
              f"stage's code: make lab STAGE={num} RESTART=1, which keeps yours as a .bak)")
    for name in same:
        print(f"make lab: {rel}/{name} is there already, not yet edited: unchanged")
    print(f"make lab: {plural(len(holes), 'hole')}: " + "; ".join(
        f"{n}. {hole_title(holes[n])}" + (" (design)" if holes[n][0]["design"] else "")
        for n in sorted(holes)))
    need = sorted({p["gpus"] for ps in holes.values() for p in ps if p["gpus"] > 1})
    for g in need:
        ns = [str(n) for n in sorted(holes) if any(p["gpus"] == g for p in holes[n])]
        many = len(ns) > 1
        print(f"make lab: hole{'s' if many else ''} {', '.join(ns)} run{'' if many else 's'} only "
              f"where the program has {g} GPUs or more: make grade STAGE={num} grades "
              f"{'them' if many else 'it'} on a machine with {g} (with fewer it says so)")
    print(f"make lab: the guide is {guide.relative_to(ROOT) if guide.exists() else 'the lesson'}; "
          f"when a hole is written: make grade STAGE={num}")
    return 0


# ---- lint: the markers, the hints, the design holes --------------------------------------------

HINT = re.compile(r"<details>\s*<summary>\s*Hint (\d+)\.(\d+)\b[^<]*</summary>(.*?)</details>",
                  re.S)
MIN_LINE = 12  # solution lines shorter than this (stripped) are not checked against the TODO


def code_of(line):
    """A solution line's code for the copy check: without its // comment, its leading } and
    trailing { or ;, whitespace collapsed; '' for a line too short or only punctuation."""
    code = re.sub(r'"(?:\\.|[^"\\])*"', lambda m: m.group(0).replace("//", "\0"), line)
    code = code.split("//", 1)[0].replace("\0", "//").strip()
    code = re.sub(r"^\}\s*", "", code)
    code = re.sub(r"\s*[{;]\s*$", "", code).strip()
    code = re.sub(r"\s+", " ", code)
    if len(code) < MIN_LINE or re.fullmatch(r"[\s{}()\[\];,]*", code):
        return ""
    return code


def squeeze(text):
    return re.sub(r"\s+", "", text)


def hints(guide):
    """{(hole, k): text} of a LAB.md's folded hints, and the problems of their numbering."""
    out, problems = {}, []
    text = guide.read_text() if guide.exists() else ""
    for m in HINT.finditer(text):
        key = (int(m.group(1)), int(m.group(2)))
        if key in out:
            problems.append(f"{guide.name}: Hint {key[0]}.{key[1]} twice")
        out[key] = m.group(3)
    opened = len(re.findall(r"<summary>\s*Hint \d", text))
    if opened != len(out) + sum(1 for p in problems if p.endswith("twice")):
        problems.append(f"{guide.name}: a <details><summary>Hint N.k ...</summary> without its "
                        f"</details> (or not of that form)")
    return out, problems


def lint_stage(sdir, need_design):
    """The problems of a stage's lab, one line each (none: it passes)."""
    problems = []
    try:
        files, holes = stage_files(sdir)
    except LabError as e:
        return [str(e)]
    for n, ps in sorted(holes.items()):
        for p in ps:
            where = f"{sdir.name}/{p['file']}:{p['line']}"
            for k, line in enumerate(p["body"].splitlines(), p["line"] + 1):
                m = TODO.match(line) or STUB.match(line)
                if m and m.group(1) != p["indent"]:
                    problems.append(f"{sdir.name}/{p['file']}:{k}: hole {n}: a marker indented "
                                    f"otherwise than its BEGIN (line {p['line']})")
            if END.match(p["end"].rstrip("\n")).group(1) != p["indent"]:
                problems.append(f"{where}: hole {n}: its END is indented otherwise than its BEGIN")
    if not holes:
        return problems + ([f"{sdir.name}: no lab (no LAB HOLE markers), and it must have a "
                            f"[design] hole"] if need_design else [])
    guide = sdir / "LAB.md"
    tips, hint_problems = hints(guide)
    problems += [f"{sdir.name}/{p}" for p in hint_problems]
    for (n, k) in sorted(tips):
        if n not in holes:
            problems.append(f"{sdir.name}/LAB.md: Hint {n}.{k} is for hole {n}, which the stage "
                            f"does not have")
    for n in sorted({n for n, _ in tips}):
        ks = sorted(k for m, k in tips if m == n)
        if ks != list(range(1, len(ks) + 1)):
            problems.append(f"{sdir.name}/LAB.md: hole {n}'s hints are numbered {ks}: they must "
                            f"be {n}.1 .. {n}.{len(ks)}")
    design = [n for n in sorted(holes) if holes[n][0]["design"]]
    if need_design and not design:
        problems.append(f"{sdir.name}: no [design] hole (a lab has at least one: the learner "
                        f"writes a whole phase from the specification)")
    for n in design:
        if (n, 1) not in tips:
            problems.append(f"{sdir.name}: hole {n} [design] has no Hint {n}.1 in LAB.md "
                            f"(<details><summary>Hint {n}.1: the idea</summary>)")
        todo = squeeze(" ".join(todo_text(p) for p in holes[n]))
        first = squeeze(tips.get((n, 1), ""))
        said = set()
        for p in holes[n]:
            for k, line in solution_lines(p):
                code = code_of(line)
                if not code or code in said:
                    continue
                said.add(code)
                for what, text in (("its TODO", todo), (f"its Hint {n}.1", first)):
                    if squeeze(code) in text:
                        problems.append(f"{sdir.name}/{p['file']}:{k}: hole {n} [design]: {what} "
                                        f"holds this line of the solution: {code}")
    return problems


def cmd_lint(args):
    need = set(args.need_design.replace(",", " ").split())
    bad = 0
    for s in args.stages:
        sdir = Path(s) if Path(s).is_dir() and not re.fullmatch(r"\d+", s) else stage_dir(s)
        sdir = sdir.resolve()
        problems = lint_stage(sdir, stage_number(sdir) in need or sdir.name in need)
        for p in problems:
            print(f"labs.py lint: {p}")
        bad += bool(problems)
    return 1 if bad else 0


# ---- read and diff: a stage's code without the lab's markers -----------------------------------


def include_order(sdir):
    """The folder's source files, its program's first (attention.cu, or stage.mk's
    <stage>_PROGRAM_SOURCES), then each as it is first included (depth first), then the rest by
    name."""
    names = sorted(f.name for f in sdir.iterdir() if f.suffix in SOURCE_SUFFIXES and f.is_file())
    order = []

    def visit(name):
        if name in order or name not in names:
            return
        order.append(name)
        for inc in re.findall(r'^\s*#\s*include\s*"([^"/]+)"', (sdir / name).read_text(), re.M):
            visit(inc)

    for first in program_sources(sdir) or ["attention.cu"]:
        visit(first)
    return order + [n for n in names if n not in order]


def code_map_order(sdir):
    """The folder's source files in the order its lesson's code map names them, then the others
    in include order."""
    readme = sdir / "README.md"
    text = readme.read_text() if readme.exists() else ""
    m = re.search(r"^## Code map\s*$(.*?)(?=^## |\Z)", text, re.M | re.S)
    names = include_order(sdir)
    order = []
    for f in re.findall(r"`(?:[\w./]*/)?([\w.]+\.(?:cu|cuh|h))`", m.group(1) if m else ""):
        if f in names and f not in order:
            order.append(f)
    return order + [n for n in names if n not in order]


def cmd_read(args):
    sdir = stage_dir(args.stage)
    out = []
    for name in code_map_order(sdir):
        lines = without_markers((sdir / name).read_text(), f"{sdir.name}/{name}")
        if args.plain:
            out.append(f"// ==== {sdir.name}/{name}\n")
            out += [ln for _, ln in lines]
            continue
        out.append(f"// ==== {sdir.name}/{name} ({plural(len(lines), 'line')}; numbered as in the "
                   f"file, the lab's marker lines left out)\n")
        out += [f"{n:5d}  {ln}" for n, ln in lines]
    text = "".join(out)
    pager = os.environ.get("PAGER") or "less"
    if sys.stdout.isatty() and shutil.which(pager.split()[0]):
        subprocess.run(pager, shell=True, input=text, text=True)
    else:
        sys.stdout.write(text)
    return 0


REWRITE_KEPT = 1 / 3  # a stage whose code keeps less of its base's lines than this is a rewrite


def git_diff(cwd, *args, capture=False):
    """git diff --no-index in cwd, paths without a/ b/ prefixes; its output, or to stdout."""
    cmd = ["git", "--no-pager", "diff", "--no-index", "--no-prefix", *args]
    if capture:
        return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd).stdout
    sys.stdout.flush()
    rc = subprocess.run(cmd, cwd=cwd).returncode
    if rc > 1:  # 1: the files differ
        raise LabError(f"git diff failed (exit {rc})")
    return ""


def numstat(cwd, a, b):
    """(lines added, lines removed) from a to b."""
    out = git_diff(cwd, "--numstat", a, b, capture=True).split()
    return (int(out[0]), int(out[1])) if len(out) >= 2 and out[0].isdigit() else (0, 0)


def stage_code(d):
    """{file: its text without lab markers} of a stage's folder, in include order."""
    return {name: "".join(ln for _, ln in
                          without_markers((d / name).read_text(), f"{d.name}/{name}"))
            for name in include_order(d)}


def header_comment(text):
    """The /* ... */ block a file opens with (its description: prose), or ''."""
    m = re.match(r"/\*.*?\*/\n", text, re.S)
    return m.group(0) if m else ""


def fold_base_headers(base, sdir, code):
    """BASE's texts with each header comment that STAGE rewrites as one line: a rewritten
    description is prose that diffs line by line into noise; STAGE's own stays whole, the diff's
    caption."""
    out = {}
    for name, text in code[base].items():
        old, new = header_comment(text), header_comment(code[sdir].get(name, ""))
        n = old.count("\n")
        if n > 1 and new and old != new:
            text = f"/* {base.name}'s header comment ({plural(n, 'line')}; ALL=1 shows it) */\n" + \
                text[len(old):]
        out[name] = text
    return out


def cmd_diff(args):
    sdir, base = stage_dir(args.stage), stage_dir(args.base)
    if own_program(sdir):  # no stage of the host program before it: nothing it edits
        num = stage_number(sdir)
        print(f"make diff: {sdir.name} is a program of its own, not a stage of the host program: "
              f"no stage before it to diff it against; read {', '.join(program_sources(sdir))} in "
              f"its code map's order ({sdir.name}/README.md, \"Code map\"; make read "
              f"STAGE={num})")
        return 0
    code = {base: stage_code(base), sdir: stage_code(sdir)}
    with tempfile.TemporaryDirectory() as tmp:
        whole, files = Path(tmp) / "whole", Path(tmp) / "files"

        def write(d, texts):  # the whole stage as one text (whole/<stage>), and by file
            (files / d.name).mkdir(parents=True, exist_ok=True)
            whole.mkdir(exist_ok=True)
            (whole / d.name).write_text("".join(f"// ==== {d.name}/{name}\n{text}"
                                                for name, text in texts.items()))
            for name, text in texts.items():
                (files / d.name / name).write_text(text)

        for d in (base, sdir):  # counted whole, headers too; shown with the base's folded
            write(d, code[d])
        added, removed = numstat(whole, base.name, sdir.name)
        lines = (whole / sdir.name).read_text().count("\n")
        kept = (lines - added) / max(lines, 1)
        if args.all or kept >= REWRITE_KEPT:
            if not args.all:
                write(base, fold_base_headers(base, sdir, code))
            git_diff(whole, "--stat", base.name, sdir.name)
            git_diff(whole, base.name, sdir.name)
            return 0
        num = stage_number(sdir)
        print(f"make diff: {sdir.name} rewrites {base.name} ({kept:.0%} of its {lines:,} lines are "
              f"{base.name}'s): read it in its code map's order ({sdir.name}/README.md, \"Code "
              f"map\"; make read STAGE={num}). Its files, by role:")
        edits = []
        for name, text in code[sdir].items():
            n = text.count("\n")
            if name not in code[base]:
                print(f"  {name:<22} new ({plural(n, 'line')})")
                continue
            a, b = f"{base.name}/{name}", f"{sdir.name}/{name}"
            ad, rm = numstat(files, a, b)
            if (n - ad) / max(n, 1) >= REWRITE_KEPT:
                edits.append((a, b))
                print(f"  {name:<22} {base.name}'s, edited (+{ad} -{rm}): its diff below")
            else:
                print(f"  {name:<22} {base.name}'s, rewritten (+{ad} -{rm}; {n} lines)")
        for name in code[base]:
            if name not in code[sdir]:
                print(f"  {name:<22} {base.name}'s, not in {sdir.name}")
        print(f"make diff STAGE={num} ALL=1: the whole diff anyway (+{added} -{removed})")
        write(base, fold_base_headers(base, sdir, code))
        for a, b in edits:
            git_diff(files, a, b)
    return 0


# ---- the kernels that hold a hole's code, and their resources (ptxas -v) ------------------------

NOT_NAMES = {"if", "for", "while", "switch", "catch", "return", "sizeof", "alignof", "decltype",
             "static_assert", "__launch_bounds__", "alignas", "defined", "__attribute__"}


def clean_source(text):
    """The text with comments and string and character literals blanked, preprocessor lines
    blanked, and of each #if group only its first branch kept, newlines kept: braces balance, and
    offsets and line numbers are the text's."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
        else:
            out.append(c)
            i += 1
            continue
        out.append(re.sub(r"[^\n]", " ", text[i:j]))
        i = j
    lines, stack, cont = "".join(out).split("\n"), [], False
    for k, line in enumerate(lines):
        if cont or line.lstrip().startswith("#"):
            if not cont:
                word = re.match(r"\s*#\s*(\w*)", line).group(1)
                if word.startswith("if"):
                    stack.append(False)
                elif word in ("elif", "else") and stack:
                    stack[-1] = True  # a later branch: left out
                elif word == "endif" and stack:
                    stack.pop()
            cont = line.rstrip().endswith("\\")
            lines[k] = " " * len(line)
        elif any(stack):
            lines[k] = " " * len(line)
    return "\n".join(lines)


def function_name(clean, brace):
    """The name of the function whose body opens at `brace`, or None (not a function's body)."""
    head = clean[:brace].rstrip()
    while True:
        m = re.search(r"\b(const|noexcept|override|final|mutable|volatile)$", head)
        if not m:
            break
        head = head[:m.start()].rstrip()
    if not head.endswith(")"):
        return None, None
    depth, k = 0, len(head) - 1
    while k >= 0:
        depth += {")": 1, "(": -1}.get(head[k], 0)
        if depth == 0:
            break
        k -= 1
    m = re.search(r"([A-Za-z_]\w*)\s*$", head[:k])
    if not m or m.group(1) in NOT_NAMES:
        return None, None
    start = max(head.rfind(";", 0, m.start()), head.rfind("}", 0, m.start()),
                head.rfind("{", 0, m.start()))
    return m.group(1), "__global__" in head[start + 1:m.start()]


def functions(clean):
    """[{name, kernel, start, end}] of the function definitions (their bodies' braces)."""
    found, stack = [], []
    for m in re.finditer(r"[{}]", clean):
        if m.group() == "{":
            if any(kind == "f" for kind, _ in stack):
                stack.append(("i", None))
                continue
            name, kernel = function_name(clean, m.start())
            stack.append(("f", (name, kernel, m.start())) if name else ("o", None))
        elif stack:
            kind, what = stack.pop()
            if kind == "f":
                found.append({"name": what[0], "kernel": what[1], "start": what[2],
                              "end": m.start()})
    if stack:
        return None  # unbalanced: not understood
    return found


def resolve_include(name, where):
    for d in (where.parent, ROOT / "common"):
        p = (d / name).resolve()
        if p.is_file() and ROOT in p.parents:
            return p
    return None


def hole_kernels(sdir, texts):
    """The names of the kernels that hold a hole's code, from the stage's files (texts: {file
    name: text}, the learner's or the stage's): a kernel whose body, or the body of a function it
    calls (by name, through the files its folder includes), has a hole's part, or that was
    defined inside a part (or in a file included from inside one). None where the code is not
    understood (then every kernel is shown)."""
    seen, funcs = {}, []

    def load(path, text, in_hole):
        key = path.resolve()
        if key in seen and (seen[key] or not in_hole):
            return True
        seen[key] = in_hole
        clean = clean_source(text)
        fs = functions(clean)
        if fs is None:
            return False
        starts = [0] + [m.end() for m in re.finditer("\n", text)]
        spans = []
        if key.parent == sdir.resolve():
            spans = [(starts[p["line"] - 1], starts[p["end_line"] - 1])
                     for p in parts_of(parse(text, path.name))]
        for f in fs:
            f["hole"] = in_hole or any(f["start"] < b < f["end"] or b < f["start"] < e
                                       for b, e in spans)
            f["calls"] = set(re.findall(r"[A-Za-z_]\w*", clean[f["start"]:f["end"]]))
            funcs.append(f)
        ok = True
        for m in re.finditer(r'^[ \t]*#[ \t]*include[ \t]*"([^"]+)"', text, re.M):
            inc = resolve_include(m.group(1), path)
            if inc is None:
                continue
            inner = in_hole or any(b < m.start() < e for b, e in spans)
            body = texts.get(inc.name) if inc.parent == sdir.resolve() else None
            ok &= load(inc, body if body is not None else inc.read_text(), inner)
        return ok

    ok = True
    for name in sorted(set(include_order(sdir)) | set(texts)):
        path = sdir / name
        text = texts.get(name)
        if text is None:
            if not path.is_file():
                continue
            text = path.read_text()
        try:
            ok &= load(path, text, False)
        except (LabError, OSError, IndexError):
            ok = False
    if not ok:
        return None
    by_name = {}
    for f in funcs:
        by_name.setdefault(f["name"], []).append(f)
    holding = {}

    def holds(name, path=()):
        if name in holding:
            return holding[name]
        if name in path:
            return False
        fs = by_name.get(name, [])
        r = any(f["hole"] for f in fs) or any(
            holds(c, path + (name,)) for f in fs for c in f["calls"] if c in by_name and c != name)
        if not path:
            holding[name] = r
        return r

    return {f["name"] for f in funcs if f["kernel"] and holds(f["name"])}


def ptxas_report(path):
    """{entry: {arch, registers, stack, spill_stores, spill_loads}} from an nvcc -Xptxas -v log."""
    out, entry, props = {}, None, None
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        m = re.search(r"Compiling entry function '([^']+)' for '([^']+)'", line)
        if m:
            entry = m.group(1)
            out[entry] = {"arch": m.group(2)}
            continue
        m = re.search(r"Function properties for (\S+)", line)
        if m:
            props = m.group(1)
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads",
                      line)
        if m and props in out:
            out[props].update(stack=int(m.group(1)), spill_stores=int(m.group(2)),
                              spill_loads=int(m.group(3)))
            continue
        m = re.search(r"Used (\d+) registers", line)
        if m and entry in out:
            out[entry]["registers"] = int(m.group(1))
    return {k: v for k, v in out.items() if "registers" in v}


# A small Itanium C++ demangler: a kernel's name and template arguments, for the table.
BUILTIN = {"v": "void", "b": "bool", "c": "char", "a": "signed char", "h": "unsigned char",
           "s": "short", "t": "unsigned short", "i": "int", "j": "unsigned", "l": "long",
           "m": "unsigned long", "x": "long long", "y": "unsigned long long", "f": "float",
           "d": "double", "e": "long double"}


class Demangler:
    def __init__(self, s):
        self.s, self.i = s, 0
        self.subs = []  # the substitution candidates so far (S_, S0_, S1_ ...): names, pointers

    def peek(self, k=1):
        return self.s[self.i:self.i + k]

    def eat(self, c):
        if not self.s.startswith(c, self.i):
            raise ValueError(c)
        self.i += len(c)

    def number(self):
        m = re.compile(r"n?\d+").match(self.s, self.i)
        if not m:
            raise ValueError("number")
        self.i = m.end()
        return m.group().replace("n", "-")

    def source_name(self):
        n = int(re.compile(r"\d+").match(self.s, self.i).group())
        self.i += len(str(n))
        name = self.s[self.i:self.i + n]
        self.i += n
        return "(anonymous namespace)" if name.startswith("_GLOBAL__N") else name

    def name(self):
        if self.peek() == "N":
            self.eat("N")
            parts = []
            while self.peek() != "E":
                if self.peek() == "I":
                    parts[-1] += self.template_args()
                elif self.peek() in ("K", "V", "r"):
                    self.i += 1
                else:
                    parts.append(self.unqualified())
            self.eat("E")
            return "::".join(parts)
        sub = self.peek() == "S"
        n = self.unqualified()
        if self.peek() == "I":
            if not sub:
                self.subs.append(n)  # a template's name is a candidate, before its arguments
            n += self.template_args()
        return n

    def unqualified(self):
        if self.peek() == "S":
            return self.substitution()
        if self.peek().isdigit():
            return self.source_name()
        raise ValueError("name")

    def substitution(self):
        self.eat("S")
        if self.peek() == "t":
            self.eat("t")
            return "std::" + self.unqualified()
        seq = ""
        while self.peek() != "_":
            seq += self.peek()
            self.i += 1
        self.eat("_")
        k = int(seq, 36) + 1 if seq else 0  # S_ is the first candidate, S0_ the second, ...
        return self.subs[k] if k < len(self.subs) else "?"

    def template_args(self):
        self.eat("I")
        args = []
        while self.peek() != "E":
            args.append(self.template_arg())
        self.eat("E")
        return "<" + ", ".join(args) + ">"

    def template_arg(self):
        c = self.peek()
        if c == "L":
            self.eat("L")
            if self.peek(2) == "_Z":
                raise ValueError("external name")
            t = self.type()
            v = self.number()
            self.eat("E")
            return {"bool": {"0": "false", "1": "true"}.get(v, v)}.get(t, v if t in (
                "int", "unsigned", "long", "unsigned long", "long long", "unsigned long long",
                "char", "short") else f"({t}){v}")
        if c == "J":
            self.eat("J")
            args = []
            while self.peek() != "E":
                args.append(self.template_arg())
            self.eat("E")
            return ", ".join(args)
        if c == "X":
            depth = 0
            while True:
                ch = self.s[self.i]
                self.i += 1
                depth += (ch in "XLIN") - (ch == "E")
                if depth == 0:
                    return "..."
        return self.type()

    def type(self):
        c = self.peek()
        if c in BUILTIN:
            self.i += 1
            return BUILTIN[c]
        if c in "PRK":  # a pointer, a reference, a const type: each a substitution candidate
            self.eat(c)
            r = {"P": "{} *", "R": "{} &", "K": "const {}"}[c].format(self.type())
            self.subs.append(r)
            return r
        if c == "D":
            code = self.peek(2)
            self.i += 2
            return {"Dh": "half", "Dn": "decltype(nullptr)"}.get(code, code)
        if c == "T":
            self.eat("T")
            while self.peek() != "_":
                self.i += 1
            self.eat("_")
            self.subs.append("T")
            return "T"
        start = self.i
        r = self.name()
        if self.s[start] != "S" or self.s[self.i - 1] == "E":  # not a bare substitution
            self.subs.append(r)
        return r


def demangle(sym):
    """A kernel's name and template arguments ("attention_kernel<64, 64, true>"), or sym."""
    if not sym.startswith("_Z"):
        return sym
    d = Demangler(sym)
    d.i = 2
    try:
        return d.name()
    except (ValueError, IndexError, AttributeError):
        return sym


def base_name(sym):
    """The unqualified name of a kernel's symbol, without its template arguments."""
    depth, out = 0, ""
    for ch in demangle(sym):
        depth += (ch == "<") - (ch == ">")
        if depth == 0 and ch != ">":
            out += ch
    return out.split("::")[-1]


MAX_ROWS = 16  # kernels listed one by one; the others are summed up per kernel name


def resource_table(mine, ref, kernels_mine, kernels_ref, what_ref, where=(), target=""):
    """The table's lines: per kernel that holds a hole's code, your build's registers, spills and
    stack frame beside the stage's own (ref None: yours alone). mine, ref: ptxas_report()s;
    kernels_*: hole_kernels() (None: every kernel); where: the reports' paths, for the kernels
    the table sums up; target: the machine code's, named when no kernel names it."""
    def keep(report, names):
        return {k: v for k, v in (report or {}).items() if names is None or base_name(k) in names}

    a, b, both = keep(mine, kernels_mine), keep(ref, kernels_ref), ref is not None
    archs = sorted({v["arch"] for v in list(a.values()) + list(b.values())})
    lines = [f"registers, spills and stack frame (ptxas -v, {', '.join(archs) or target}) "
             f"of the kernels that hold a hole's code: yours" + (f" beside {what_ref}" if both
                                                                 else "")]
    if mine is None:
        return lines + ["  (your build left no ptxas report)"]

    def spilled(v):
        return v["spill_stores"] or v["spill_loads"] or v["stack"]

    def sp(v):
        return "-" if v is None else f"{v['spill_stores']}/{v['spill_loads']}"

    def num(v, key):
        return "-" if v is None else str(v[key])

    def note(x, y):
        if x is None:
            return "not in your build"
        if y is None:
            return "not in the stage's build" if both else ""
        words = []
        if x["spill_stores"] + x["spill_loads"] > y["spill_stores"] + y["spill_loads"]:
            words.append("yours spills more")
        if x["stack"] > y["stack"]:
            words.append("a bigger stack frame")
        if x["registers"] != y["registers"]:
            words.append(f"{x['registers'] - y['registers']:+d} registers")
        return ", ".join(words)

    def summary(name, vs, tail):
        regs = sorted(v["registers"] for v in vs)
        span = f"{regs[0]}" if regs[0] == regs[-1] else f"{regs[0]}-{regs[-1]}"
        odd = sum(1 for v in vs if spilled(v))
        return (f"    {name}: {plural(len(vs), 'instantiation')}, {span} registers, "
                + (f"{odd} with spills or a stack frame" if odd else "no spill, no stack frame")
                + tail)

    def by_name(keys):
        return sorted(keys, key=lambda k: (base_name(k), demangle(k)))

    def alone(side, keys):  # one build's kernels: listed, or summed up per kernel name
        if len(keys) > MAX_ROWS:
            groups = {}
            for k in keys:
                groups.setdefault(base_name(k), []).append(side[k])
            return [summary(n, vs, "") for n, vs in groups.items()]
        out = ["    registers  spills (bytes st/ld)  stack frame  kernel"]
        for k in keys:
            v = side[k]
            out.append(f"    {v['registers']:>9}  {sp(v):<20}  {v['stack']:>11}  {demangle(k)}")
        return out

    if not both or not set(a) & set(b):  # yours alone, or two sets of kernels (the capstone)
        if a:
            lines += ["  yours:"] + alone(a, by_name(a))
        else:
            lines.append("  yours: none (no kernel of yours holds a hole's code yet)")
        if both:
            lines += [f"  {what_ref}:"] + alone(b, by_name(b))
        return lines
    keys = by_name(set(a) | set(b))
    odd = [k for k in keys if note(a.get(k), b.get(k)) or any(
        v and spilled(v) for v in (a.get(k), b.get(k)))]
    listed = odd[:MAX_ROWS] if odd or len(keys) > MAX_ROWS else keys
    if listed:
        lines += ["     registers     spills (bytes st/ld)   stack frame",
                  "    yours stage    yours     stage       yours stage   kernel"]
    for k in listed:
        x, y = a.get(k), b.get(k)
        n = note(x, y)
        lines.append(f"    {num(x, 'registers'):>5} {num(y, 'registers'):>5}    {sp(x):<9} "
                     f"{sp(y):<11} {num(x, 'stack'):>5} {num(y, 'stack'):>5}   {demangle(k)}"
                     + (f"   ({n})" if n else ""))
    rest = {}
    for k in keys:
        if k not in listed:
            rest.setdefault(base_name(k), []).append(k)
    for name, ks in rest.items():
        same = all(k in a and k in b and not note(a[k], b[k]) for k in ks)
        vs = [a[k] for k in ks if k in a] + [b[k] for k in ks if k in b and k not in a]
        lines.append(summary(f"{name}" + (" (more)" if listed else ""), vs,
                             ", the same in both builds" if same else
                             ", some differ between the builds"))
    if rest and where:
        lines.append("    (every kernel: " + "; ".join(str(w) for w in where) + ")")
    return lines


# ---- building and running ----------------------------------------------------------------------


def build_target(arch):
    """The ARCH a job's program is built for: a PTX-only target (compute_75) also gets the machine
    code of its GPU from the same PTX (sm_75), which ptxas reports on; where no such GPU is, the
    driver compiles the PTX as before."""
    m = re.fullmatch(r"compute_(\d+[af]?)", arch)
    return f"{arch} sm_{m.group(1)}" if m else arch


def target_words(arch):
    m = re.fullmatch(r"compute_(\d+[af]?)", arch)
    return (f"ARCH={arch}: its PTX, and sm_{m.group(1)} machine code from it by ptxas" if m
            else f"ARCH={arch}")


def gpu_present(name_given):
    """(name, compute capability as '90') of the GPU, or (None, None)."""
    if name_given is not None and name_given.strip() == "":
        return None, None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,compute_cap", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None, None
    if out.returncode != 0 or not out.stdout.strip():
        return None, None
    name, cc = [x.strip() for x in out.stdout.strip().splitlines()[0].rsplit(",", 1)]
    return name_given or name, cc.replace(".", "")


def make_tree(where, sdir, override):
    """A copy of the repository made of links, where the stage's folder has the files of
    `override` ({name: text}) in place of its own: the Makefile builds it as it builds the stage.
    A build folder is named by what it builds (job_dir): a tree already there has this content,
    and is kept, so that make rebuilds only what changed in the repository since."""
    if (where / ".complete").exists():
        return
    if where.exists():
        shutil.rmtree(where)
    where.mkdir(parents=True)
    for entry in ROOT.iterdir():
        if entry.name in (".git", "labs") or entry.name.startswith("build"):
            continue
        if entry.name == sdir.name:
            (where / entry.name).mkdir()
            for f in entry.iterdir():
                if f.name in override:
                    (where / entry.name / f.name).write_text(override[f.name])
                else:
                    (where / entry.name / f.name).symlink_to(f)
        else:
            (where / entry.name).symlink_to(entry)
    (where / ".complete").touch()


def build(job, sdir, arch, log):
    """Builds one job's program with the repository's Makefile. Returns (ok, program path)."""
    base = job["dir"]
    base.parent.mkdir(parents=True, exist_ok=True)
    with open(base.with_suffix(".lock"), "w") as lock:  # one build at a time in a folder (two
        fcntl.flock(lock, fcntl.LOCK_EX)                # grades side by side may share it)
        return build_locked(job, sdir, arch, log)


def build_locked(job, sdir, arch, log):
    base = job["dir"]
    make_tree(base / "src", sdir, job["files"])
    os.utime(base)  # used now (prune keeps the latest)
    out = base / "out"
    seed = job.get("seed")
    if not out.exists() and seed and seed.exists():  # the common objects (and a forward pass)
        with open(seed.parent.with_suffix(".lock"), "w") as lock:  # not while it is rebuilt
            fcntl.flock(lock, fcntl.LOCK_SH)
            shutil.copytree(seed, out, copy_function=shutil.copy2, symlinks=True)
    other = None if out.exists() else common_seed(base.parent, base.name.rsplit("-", 1)[0])
    if other:  # no build of this stage yet: another stage's common objects
        with open(other.parent.parent.with_suffix(".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_SH)
            (out / "obj").mkdir(parents=True)
            for c in sorted((ROOT / "common").glob("*.c")):
                if (other / f"{c.stem}.o").is_file():
                    shutil.copy2(other / f"{c.stem}.o", out / "obj" / f"{c.stem}.o")
    cmd = ["make", "--no-print-directory", "-C", str(base / "src"), f"BUILD={out}",
           f"ARCH={build_target(arch)}", str(out / sdir.name)]
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    with open(log, "w") as f:
        f.write(" ".join(cmd) + "\n")
        f.flush()
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env).returncode
    return rc == 0, out / sdir.name


def compile_errors(log, n=12):
    """The compiler's error lines from a build log (the first n), paths made relative."""
    lines = Path(log).read_text(errors="replace").splitlines()
    errs = [ln for ln in lines if re.search(r"error|warning", ln, re.I) and "Error " not in ln]
    errs = errs or lines[-n:]
    return [re.sub(rf"^(?:\S*/src/)?(stage[0-9]+_\w+/|{CAPSTONE}/)", r"labs/\1", ln)
            for ln in errs[:n]]


def run(cmd, timeout):
    """(exit code, stdout, stderr); 124 when it ran past the timeout (killed)."""
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        return p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:
        def s(x):
            return x.decode(errors="replace") if isinstance(x, bytes) else (x or "")
        return 124, s(e.stdout), s(e.stderr)


def first_failure(rc, out, err, timeout):
    """One line saying why a run did not pass, or None when it passed."""
    if rc == EXIT_PASS:
        return None
    if rc == 124:
        return f"did not finish in {timeout} s (a hang? killed)"
    stubs = [m.group() for m in re.finditer(r"lab hole \d+ unfilled.*", out + err)]
    if stubs:  # a stub that stops the kernel (where doing nothing would hang it) said so
        return f"stopped by a stub: {stubs[0]}"
    fails = [ln for ln in (err + out).splitlines() if ln.startswith("FAILED: ")]
    if fails:
        return "first failing case: " + fails[0][len("FAILED: "):]
    described = [ln for ln in out.splitlines() if ln.endswith(" FAIL")] or [
        re.sub(r"\s+", " ", ln) for ln in out.splitlines() if re.search(r"\sFAIL\b", ln)]
    if rc == EXIT_WRONG and described:
        return "first failing case: " + described[0]
    last = [ln for ln in (err.strip() or out.strip()).splitlines()][-1:] or ["no output"]
    if rc < 0:
        return f"crashed (signal {-rc}): {last[0]}"
    if rc == EXIT_WRONG:  # no case failed its check: the program stopped (a CUDA error)
        return f"stopped: {last[0]}"
    return f"exit {rc}: {last[0]}"


def grade_program(prog, smem_limit, quick=False, smoke=SMOKE, jit=False, libs=None):
    """Runs the quick cases, then (unless quick) the self-test. Returns (passed, one line).
    jit: the program's PTX is compiled by the driver at its first launch (JIT_ALLOWANCE); libs:
    the folder of the stage libraries the program loads (--lib-dir), if it loads any."""
    extra = (["--smem-limit", smem_limit] if smem_limit else []) + lib_args(libs)
    for i, case in enumerate(smoke):
        limit = SMOKE_TIMEOUT + (JIT_ALLOWANCE if jit and i == 0 else 0)
        rc, out, err = run([str(prog)] + case + extra, limit)
        if rc == EXIT_UNSUPPORTED:
            return False, "unsupported here: " + (err.strip().splitlines() or ["?"])[-1]
        why = first_failure(rc, out, err, limit)
        if why:
            if rc == 124 and limit > SMOKE_TIMEOUT:
                why += " (with the driver's compile of its PTX)"
            return False, why
    if quick:
        return True, f"the {len(smoke)} quick cases pass (no self-test: a quick grade)"
    rc, out, err = run([str(prog), "--self-test"] + extra, SELF_TEST_TIMEOUT)
    counts = re.findall(r"^(\d+) passed, (\d+) failed(?:$|,)", out, re.M)
    why = first_failure(rc, out, err, SELF_TEST_TIMEOUT)
    total = f"self-test {counts[-1][0]} passed, {counts[-1][1]} failed" if counts else "self-test"
    if why:
        return False, f"{total}; {why}"
    return True, total


def bench_ms(prog, bench=BENCH, columns=("ms_median",), libs=None):
    """The program's time of the timed shape: the sum of `columns` of its CSV row, or None."""
    rc, out, err = run([str(prog)] + bench + lib_args(libs), BENCH_TIMEOUT)
    rows = [ln.split(",") for ln in out.splitlines() if ln.count(",") > 10]
    if rc != 0 or len(rows) < 2:
        return None
    head = rows[0]
    try:
        return sum(float(rows[1][head.index(c)]) for c in columns)
    except (ValueError, IndexError):
        return None


def lib_args(libs):
    return ["--lib-dir", str(libs)] if libs else []


def unbuildable(log, sdir):
    """Why the stage's program cannot be built here at all, from its build log: the one line its
    stage.mk prints then ("make: <stage> skipped: why", stage 10 without NCCL), or None."""
    try:
        text = Path(log).read_text(errors="replace")
    except OSError:
        return None
    m = re.search(rf"^make: {re.escape(sdir.name)} skipped: (.*)$", text, re.M)
    return m.group(1).strip() if m else None


LIBS_BUILT = {}  # (stage, target) -> program_libs()'s answer, once per grade
LIBS_LOCK = threading.Lock()


def program_libs(sdir, build_root, arch):
    """(folder, None) of the stage libraries the stage's program loads (its stage.mk's
    <stage>_PROGRAM_LIBS), built once per target from the repository in
    build_root/libs-<target>/ and reused by later grades; (None, None) for a program that loads
    none; (None, why) when they do not build."""
    names = stage_mk_words(sdir, "PROGRAM_LIBS")
    if not names:
        return None, None
    with LIBS_LOCK:  # the grade's jobs ask at once: the first builds, the others wait for it
        key = (sdir.name, build_target(arch))
        if key not in LIBS_BUILT:
            LIBS_BUILT[key] = build_libs(build_root, arch, names)
        return LIBS_BUILT[key]


def build_libs(build_root, arch, names):
    out = build_root / f"libs-{build_target(arch).replace(' ', '+')}"
    log = out.with_suffix(".log")
    libs = [out / "lib" / f"lib{n}.so" for n in names]
    t0 = time.time()
    with open(out.with_suffix(".lock"), "w") as lock:  # two grades side by side: one builds
        fcntl.flock(lock, fcntl.LOCK_EX)
        out.mkdir(parents=True, exist_ok=True)
        os.utime(out)  # used now (prune keeps it)
        cmd = ["make", "--no-print-directory", "-C", str(ROOT), f"BUILD={out}",
               f"ARCH={build_target(arch)}"] + [str(x) for x in libs]
        env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
        with open(log, "w") as f:
            f.write(" ".join(cmd) + "\n")
            f.flush()
            rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env).returncode
    if rc != 0:
        return None, (f"the stage libraries its program loads ({', '.join(names)}) did not build: "
                      f"see {rel_path(log)}")
    print(f"  the stage libraries its program loads ({', '.join(names)}): ready for "
          f"ARCH={arch} in {rel_path(out / 'lib')} ({time.time() - t0:.0f} s; built once)",
          flush=True)
    return out / "lib", None


def gpu_count():
    """The GPUs a program may use here (nvidia-smi's, within CUDA_VISIBLE_DEVICES), or 0."""
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    n = sum(1 for ln in out.stdout.splitlines() if ln.startswith("GPU "))
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        n = min(n, len([x for x in visible.split(",") if x.strip()]))
    return n


KEEP_BUILDS = 24  # build folders kept per stage (the most recently used; grades side by side)


def job_dir(build_root, arch, smem, texts):
    """The build folder of a program: named by its target and a hash of its stage files."""
    h = hashlib.sha1(f"{arch}\0{smem}".encode())
    for name in sorted(texts):
        h.update(f"\0{name}\0{texts[name]}".encode())
    target = build_target(arch).replace(" ", "+")
    return build_root / f"{target}-{smem or 'native'}-{h.hexdigest()[:12]}"


def seed_for(build_root, where, sdir):
    """For a new build folder: the out/ of the latest built one of the same target, whose
    common objects (stage 7: and its forward pass) make need not build again; make rebuilds the
    stage's own object, whose files are newer."""
    if (where / "out").exists():
        return None
    target = where.name.rsplit("-", 1)[0]
    done = [d for d in build_root.glob(f"{target}-*") if (d / "out" / sdir.name).is_file()]
    return max(done, key=lambda d: d.stat().st_mtime) / "out" if done else None


def common_seed(build_root, target):
    """The obj/ of the latest build of another stage for the same target: its objects of
    common/*.c (the host program, compiled alike for every stage) are this build's too; make
    rebuilds any whose sources are newer. Not the other stage's own objects (nor a forward pass
    compiled from a learner's lab of that stage)."""
    done = [d for d in build_root.parent.glob(f"*/{target}-*")
            if d.is_dir() and d.parent != build_root and (d / "out" / d.parent.name).is_file()]
    return max(done, key=lambda d: d.stat().st_mtime) / "out" / "obj" if done else None


def prune(build_root):
    """Keeps the KEEP_BUILDS most recently used build folders (a folder is touched on use), and
    the stage libraries (libs-<target>)."""
    builds = (d for d in build_root.iterdir() if d.is_dir() and not d.name.startswith("libs-"))
    dirs = sorted(builds, key=lambda d: d.stat().st_mtime)
    for d in dirs[:-KEEP_BUILDS]:
        shutil.rmtree(d, ignore_errors=True)
        d.with_suffix(".log").unlink(missing_ok=True)
        d.with_suffix(".lock").unlink(missing_ok=True)


def smem_available(path, cc):
    """(bytes of shared memory a block may use on a grading path, and what sets it) or
    (None, ...) where the grader does not know (then a [smem>=N] part is taken to run)."""
    smem = path[1]
    if smem:
        return int(smem), f"--smem-limit gives it {int(smem):,}"
    n = SMEM_PER_BLOCK.get(int(cc))
    return n, f"this GPU (sm_{cc}) gives it {n:,}" if n else "this GPU's is not known"


def unrun_parts(holes, paths, cc, gpus=None):
    """{hole: its parts the checker cannot run on the hole's path ([smem>=N] where a block gets
    less shared memory, [gpus>=N] where the program has fewer GPUs), each with `why`}. paths:
    {code path tag: (arch, smem limit, ...)}; gpus: the GPUs here (None: not known, taken to be
    enough)."""
    unrun = {}
    for n, ps in holes.items():
        have, why = smem_available(paths[ps[0]["tag"]], cc)
        unrun[n] = []
        for p in ps:
            if p["smem"] and have is not None and have < p["smem"]:
                unrun[n].append(dict(p, why=f"its code runs only where a block may use "
                                            f"{p['smem']:,} bytes of shared memory, and {why}"))
            elif p.get("gpus") and gpus is not None and gpus < p["gpus"]:
                unrun[n].append(dict(p, why=f"its code runs only where the program has "
                                            f"{p['gpus']} GPUs or more, and this machine has "
                                            f"{gpus}"))
    return unrun


def cmd_grade(args):
    sdir = stage_dir(args.stage)
    num = stage_number(sdir)
    files, holes = stage_files(sdir)
    if not holes:
        raise LabError(f"{sdir.name} has no lab yet (no LAB HOLE markers in its source)")
    ldir = lab_dir(sdir)
    rel = rel_path(ldir)
    mine = {}
    for name in files:
        if not (ldir / name).is_file():
            raise LabError(f"no {rel}/{name}: make lab STAGE={num} writes it")
        mine[name] = (ldir / name).read_text()
    # the learner's code of each hole, and whether it is still the TODO
    started, notes = {n: False for n in holes}, []
    for name, text in files.items():
        lab_pieces = parse(mine[name], f"{rel}/{name}")
        fill(mine[name], text, set(), f"{rel}/{name}", f"{sdir.name}/{name}")  # same holes?
        for p, q in zip(parts_of(lab_pieces), parts_of(parse(text, name))):
            if p["body"] != lab_body(q):
                started[p["hole"]] = True
        if outside(lab_pieces) != outside(parse(render(text, name), name)):
            notes.append(f"note: {rel}/{name} differs from the lab outside its holes too (graded "
                         f"as it is)")

    gpu, cc = gpu_present(args.gpu_name)
    build_root = ROOT / "build" / "lab" / sdir.name
    build_root.mkdir(parents=True, exist_ok=True)
    jobs_n = args.jobs or max(1, (os.cpu_count() or 2) // 2)
    capstone = sdir.name == CAPSTONE
    ref_what = (f"{CAPSTONE_REFERENCE} (the capstone's reference solution)" if capstone
                else "the stage's own code")

    def job(key, keep, arch, smem, what):
        """A program to build: the files (yours with the holes not in `keep` filled from the
        stage; keep None: the stage's own), in a build folder named by what it builds, so that
        jobs of the same content share one build (and one run), and a later grade reuses it."""
        fl = {name: fill(mine[name], files[name], keep, f"{rel}/{name}", f"{sdir.name}/{name}")
              if keep is not None else files[name] for name in files}
        return {"key": key, "files": fl, "arch": arch, "smem": smem, "what": what,
                "dir": job_dir(build_root, arch, smem, fl), "runs": False}

    def table(yours, ref):
        """The resource table's lines for two built jobs (ref None: yours alone)."""
        def report(j):
            return ptxas_report(j["dir"] / "out" / "ptxas" / f"{sdir.name}.txt")
        km = hole_kernels(sdir, yours["files"])
        kr = hole_kernels(sdir, ref["files"]) if ref else km
        km, kr = (km if km is not None else kr), (kr if kr is not None else km)  # one not read
        return resource_table(report(yours), report(ref) if ref else None, km, kr, ref_what,
                              where=reports(yours, ref),
                              target="sm_" + re.sub(r"^(sm_|compute_)", "",
                                                    build_target(yours["arch"]).split()[-1]))

    def reports(yours, ref):
        def path(j):
            return rel_path(j["dir"] / "out" / "ptxas" / f"{sdir.name}.txt")
        if ref is None or ref["dir"] == yours["dir"]:
            return [f"{path(yours)}" + (" (yours and the stage's: the same program)" if ref
                                        else "")]
        return [f"{path(yours)} (yours)", f"{path(ref)} (the stage's)"]

    if gpu is None:
        arch = args.arch or no_gpu_arch(sdir)
        todo = [job("yours", set(holes), arch, None, "your file")]
        if not args.yours_only:
            todo.append(job("stage", None, arch, None, ref_what))
        if len(todo) > 1 and todo[1]["dir"] == todo[0]["dir"]:  # yours is the stage's own
            todo[1] = todo[0]
        for j in todo:
            j["seed"] = seed_for(build_root, j["dir"], sdir)
        with ThreadPoolExecutor(max_workers=min(jobs_n, len(todo))) as pool:
            built = list(pool.map(lambda j: build(j, sdir, arch, j["dir"].with_suffix(".log")),
                                  {id(j): j for j in todo}.values()))
        built = built + built[-1:] * (len(todo) - len(built))
        why = None if built[0][0] else unbuildable(todo[0]["dir"].with_suffix(".log"), sdir)
        if why:
            print(f"make grade: {sdir.name} cannot be built here: {why}; nothing was graded, exit "
                  f"{EXIT_UNSUPPORTED} (unsupported here)")
            return EXIT_UNSUPPORTED
        if not built[0][0]:
            print(f"make grade: {rel}: does not compile (ARCH={arch}):")
            for ln in compile_errors(todo[0]["dir"].with_suffix(".log")):
                print("  " + ln)
            return 1
        print(f"make grade: no NVIDIA GPU here: {rel} compiles ({target_words(arch)})")
        ref = todo[1] if len(todo) > 1 and built[1][0] else None
        for ln in table(todo[0], ref):
            print("  " + ln)
        if len(todo) > 1 and not built[1][0]:
            print(f"  ({ref_what} does not compile here: see {rel_path(todo[1]['dir'])}.log)")
        # compiled, not graded: the programs' "unsupported here", so that neither a script nor a
        # learner's `&&` reads it as a pass
        print(f"make grade: nothing was graded: the self-test and the timing need a GPU (make "
              f"grade STAGE={num} on one); exit {EXIT_UNSUPPORTED}, unsupported here")
        return EXIT_UNSUPPORTED

    native_arch = args.arch or cc
    native_smem = args.smem_limit
    if int(cc) < 75:
        print(f"make grade: {gpu} is sm_{cc}; the course needs sm_75 or newer (a T4 or later)")
        return EXIT_UNSUPPORTED
    paths = {"": (native_arch, native_smem, f"{gpu}, ARCH={native_arch}"
                  + (f", --smem-limit {native_smem}" if native_smem else ""), True)}
    for n, ps in holes.items():
        tag = ps[0]["tag"]
        if tag and tag not in paths:
            paths[tag] = code_path(tag, gpu, cc, native_arch, paths[""])
    gpus = gpu_count()
    unrun = unrun_parts(holes, paths, cc, gpus)
    gradable_here = {n: paths[ps[0]["tag"]][3] and len(unrun[n]) < len(ps)
                     for n, ps in holes.items()}
    jobs = [job("yours", set(holes), *paths[""][:2], "your file")]
    jobs[0]["runs"] = True
    for tag in paths:  # your file on each other code path that has a hole you started
        if tag and paths[tag] != paths[""] and any(
                started[n] for n in holes if holes[n][0]["tag"] == tag):
            j = job(f"yours-{tag}", set(holes), *paths[tag][:2], f"your file [{tag}]")
            j["runs"] = paths[tag][3]
            jobs.append(j)
    hole_job = {}
    for n in sorted(holes):
        if not started[n] or (paths[holes[n][0]["tag"]][3] and not gradable_here[n]):
            continue
        arch, smem, _, runs = paths[holes[n][0]["tag"]]
        same = [j for j in jobs if j["arch"] == arch and j["smem"] == smem]
        if len(holes) == 1 and same:
            hole_job[n] = same[0]["key"]
            continue
        j = job(f"hole{n}", {n}, arch, smem, f"hole {n}")
        j["runs"] = runs
        jobs.append(j)
        hole_job[n] = j["key"]
    ref = job("stage", None, native_arch, native_smem, ref_what)  # the table's, and the timing's

    by_dir = {}  # build folder -> the jobs that share it (one build, one run)
    for j in jobs + [ref]:
        by_dir.setdefault(j["dir"], []).append(j)
    for d, js in by_dir.items():
        js[0]["seed"] = seed_for(build_root, d, sdir)
    print(f"make grade: {sdir.name}, {rel}, on {paths[''][2]}: building {len(by_dir)} programs "
          f"for {len(jobs)} jobs and the stage's own code (logs in "
          f"{build_root.relative_to(ROOT)}/)"
          + ("; quick: the quick cases only, no self-test, not timed" if args.quick else ""),
          flush=True)

    cases = grade_cases(sdir)

    def do(d):
        js = by_dir[d]
        lead = js[0]
        t0 = time.time()
        ok, prog = build(lead, sdir, lead["arch"], d.with_suffix(".log"))
        took = f"build {time.time() - t0:.0f} s"
        if not ok:
            why = unbuildable(d.with_suffix(".log"), sdir)
            if why:
                return d, ("unbuildable", why, None, took)
            return d, (False, "does not compile: " + "; ".join(
                compile_errors(d.with_suffix(".log"), 3)), None, took)
        graded = [j for j in js if j is not ref]
        if not graded:
            return d, ("built", "", prog, took)
        if not any(j["runs"] for j in graded):
            return d, (None, f"compiles (ARCH={lead['arch']}); its code cannot run on this GPU: "
                             f"not graded here", prog, took)
        libs, why = program_libs(sdir, build_root, lead["arch"])
        if why:
            return d, (False, why, None, took)
        t1 = time.time()
        jit = lead["arch"].startswith("compute_") and arch_number(lead["arch"]) != int(cc)
        res = grade_program(prog, lead["smem"], args.quick, cases[0], jit, libs)
        return d, res + (prog, f"{took}, run {time.time() - t1:.0f} s")

    results = {}
    alone = by_dir[ref["dir"]] == [ref]  # the stage's own code, not one of the graded programs
    order = [d for d in by_dir if not (alone and d == ref["dir"])] + ([ref["dir"]] if alone else [])
    with ThreadPoolExecutor(max_workers=jobs_n) as pool:
        for d, res in pool.map(do, order):
            for k, j in enumerate(by_dir[d]):
                results[j["key"]] = res
                if k:
                    print(f"  {j['key']}: the same program as {by_dir[d][0]['key']}", flush=True)
                elif res[0] in ("built", "unbuildable"):
                    print(f"  {j['key']}: {res[0]} ({res[3]})", flush=True)
                else:
                    print(f"  {j['key']}: {verdict(res[0])} ({res[3]})", flush=True)
    prune(build_root)
    why = next((r[1] for r in results.values() if r[0] == "unbuildable"), None)
    if why:  # the program cannot be built here at all (stage 10 without NCCL)
        print(f"make grade: {sdir.name} cannot be built here: {why}; nothing was graded, exit "
              f"{EXIT_UNSUPPORTED} (unsupported here)")
        return EXIT_UNSUPPORTED

    width = max(len(hole_title(ps)) + len(ps[0]["tag"]) + 3 for ps in holes.values()) + 9
    print(f"\nReport card: {sdir.name} lab ({rel}) on {paths[''][2]}")
    passing, gradable = 0, 0
    for n in sorted(holes):
        tag = holes[n][0]["tag"]
        title = f"hole {n}  {hole_title(holes[n])}" + (f" [{tag}]" if tag else "")
        if paths[tag][3] and not gradable_here[n]:
            print(f"  {title:<{width}} ----  not gradable on this GPU: {unrun[n][0]['why']}"
                  + ("" if started[n] else " (and still the TODO)"))
            continue
        if not started[n]:
            gradable += paths[tag][3]
            print(f"  {title:<{width}} FAIL  not started (still the TODO)")
        else:
            ok, line = results[hole_job[n]][:2]
            gradable += ok is not None
            passing += ok is True
            print(f"  {title:<{width}} {verdict(ok)}  {line}"
                  + (" (its other parts only: see below)" if unrun[n] else ""))
        for p in unrun[n]:
            print(f"    (its part in {p['file']}:{p['line']}, {p['title'].split(': ')[-1]}, is not "
                  f"gradable on this GPU: {p['why']})")
    all_ok = True
    for j in jobs:
        if not j["key"].startswith("yours"):
            continue
        ok, line = results[j["key"]][:2]
        all_ok &= ok is not False
        print(f"  {j['what']:<{width}} {verdict(ok)}  {line}")
    speed = "not timed: your file does not pass yet"
    if all_ok and holes and not gradable:
        speed = "not timed: none of the holes' code runs on this GPU (see above)"
    elif all_ok and args.quick:
        speed = "not timed (a quick grade: make grade without QUICK=1 times it)"
    elif all_ok:
        same = ref["dir"] == jobs[0]["dir"]
        print("  your file passes: " + ("the same program as the stage's own code; timing it twice"
                                        if same else f"timing it and {ref_what}"), flush=True)
        if results["stage"][2] is None:
            speed = f"not timed: {ref_what} did not build (" + results["stage"][1] + ")"
        else:
            bench, columns, what = cases[1], cases[2], cases[3]
            libs = program_libs(sdir, build_root, native_arch)[0]
            mine_ms = bench_ms(results["yours"][2], bench, columns, libs)
            ref_ms = bench_ms(results["stage"][2], bench, columns, libs)
            of = f"{CAPSTONE_REFERENCE}'s speed" if capstone else "the stage's own kernel's speed"
            if mine_ms and ref_ms:
                speed = (f"{ref_ms / mine_ms:.2f} of {of} ({mine_ms:.3f} ms vs {ref_ms:.3f} ms, "
                         + (f"{what}, " if what else "") + f"{' '.join(bench[:8])})")
            else:
                speed = "not timed: a timing run failed"
    print(f"  {'speed':<{width}} {speed}")
    if results["yours"][2] is not None:  # your file compiled: its kernels' resources
        ref_ok = results["stage"][2] is not None
        for ln in table(jobs[0], ref if ref_ok else None):
            print("  " + ln)
        if not ref_ok:
            print(f"    ({ref_what} does not build: the table has yours alone)")
    for note in notes:
        print("  " + note)
    left = len(holes) - gradable
    if args.quick:
        print("  quick grade: only the quick cases ran (make grade without QUICK=1: the self-test)")
    print(f"holes passing: {passing} of {gradable}" + (
        f" ({left} not gradable on this GPU: see above)" if left else ""))
    if holes and not gradable and all_ok:  # what ran passed, but no hole was graded: no pass
        print(f"make grade: no hole was graded: none of their code runs on this GPU; exit "
              f"{EXIT_UNSUPPORTED}, unsupported here")
        return EXIT_UNSUPPORTED
    return 0 if all_ok and passing == gradable else 1


def verdict(ok):
    return {True: "PASS", False: "FAIL", None: "----"}[ok]


def arch_number(arch):
    return int(re.sub(r"\D", "", arch) or 0)


def code_path(tag, gpu, cc, native_arch, native):
    """(arch, smem limit, description, runs here) of the code path a hole's tag names."""
    want = PATHS[tag]
    if "arch" in want:  # a fixed older path (t4): native when the build is that path already
        if arch_number(native_arch) == arch_number(want["arch"]):
            return native
        return want["arch"], want["smem_limit"], f"{gpu}, {want['what']}", True
    if arch_number(native_arch) >= want["min_arch"]:  # a newer path (sm80): native if it has it
        return native
    if int(cc) >= want["min_arch"]:
        return cc, "", f"{gpu}, ARCH={cc} ({want['what']})", True
    return f"compute_{want['min_arch']}", "", f"PTX for compute_{want['min_arch']}, compile only", False


# ---- the small commands the tests use ----------------------------------------------------------


def cmd_render(args):
    sys.stdout.write(render(Path(args.file).read_text(), args.file))
    return 0


def cmd_fill(args):
    lab, sol = Path(args.lab).read_text(), Path(args.solution).read_text()
    holes = {p["hole"] for p in parts_of(parse(sol, args.solution))}
    keep = {args.except_hole} if args.except_hole else set()
    if args.except_hole and args.except_hole not in holes:
        raise LabError(f"{args.solution} has no hole {args.except_hole}")
    sys.stdout.write(fill(lab, sol, keep, args.lab, args.solution))
    return 0


def cmd_holes(args):
    sdir = stage_dir(args.stage)
    _, holes = stage_files(sdir)
    for n in sorted(holes):
        for p in holes[n]:
            lines = p["body"].count("\n")
            tags = "".join(f" [{t}]" for t in (["design"] if p["design"] else []) +
                           ([p["tag"]] if p["tag"] else []) +
                           ([f"smem>={p['smem']}"] if p["smem"] else []) +
                           ([f"gpus>={p['gpus']}"] if p["gpus"] else []))
            print(f"{sdir.name}/{p['file']}:{p['line']}: hole {n}{tags}: {p['title']} "
                  f"({lines} lines)")
    return 0


def cmd_kernels(args):
    """The kernels that hold a hole's code (the table's rows), by name."""
    sdir = stage_dir(args.stage)
    files, _ = stage_files(sdir)
    names = hole_kernels(sdir, files)
    print(" ".join(sorted(names)) if names is not None else "(not understood: every kernel)")
    return 0


def main():
    global LABS
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("lab")
    a.add_argument("stage")
    a.add_argument("--restart", action="store_true")
    a = sub.add_parser("grade")
    a.add_argument("stage")
    a.add_argument("--arch", default="")
    a.add_argument("--smem-limit", default="")
    a.add_argument("--gpu-name", default=None)
    a.add_argument("--jobs", type=int, default=0)
    a.add_argument("--quick", action="store_true",
                   help="the quick cases only: no self-test, no timing")
    a.add_argument("--yours-only", action="store_true",
                   help="the resource table without the stage's own kernels (not built then)")
    a = sub.add_parser("render")
    a.add_argument("file")
    a = sub.add_parser("fill")
    a.add_argument("lab")
    a.add_argument("solution")
    a.add_argument("--except", dest="except_hole", type=int, default=0)
    a = sub.add_parser("holes")
    a.add_argument("stage")
    a = sub.add_parser("kernels")
    a.add_argument("stage")
    a = sub.add_parser("lint")
    a.add_argument("stages", nargs="+")
    a.add_argument("--need-design", default="",
                   help="stage numbers (or folders) whose lab must have a [design] hole")
    a = sub.add_parser("read")
    a.add_argument("stage")
    a.add_argument("--plain", action="store_true", help="no line numbers")
    a = sub.add_parser("diff")
    a.add_argument("stage")
    a.add_argument("base")
    a.add_argument("--all", action="store_true",
                   help="the whole diff, even of a rewrite, and the base's header comments")
    ap.add_argument("--labs", default=str(LABS), help="where the labs are (default: labs/)")
    args = ap.parse_args()
    LABS = Path(args.labs).resolve()
    try:
        return {"lab": cmd_lab, "grade": cmd_grade, "render": cmd_render, "fill": cmd_fill,
                "holes": cmd_holes, "kernels": cmd_kernels, "lint": cmd_lint, "read": cmd_read,
                "diff": cmd_diff}[args.cmd](args)
    except LabError as e:
        print(f"make {args.cmd}: {e}" if args.cmd in ("lab", "grade", "read", "diff")
              else f"labs.py: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # a reader (head, a pager) that stopped reading: not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
