#!/usr/bin/env python3
"""Labs: a stage's own source with the lesson's code cut into holes, and the grader for them.

The holes are marked in the stage's source files (any *.cu, *.cuh, *.h of its folder) by comment
lines, so a lab is generated from the code it teaches and cannot drift from it:

    // LAB HOLE 2 BEGIN: the online-softmax update        (a part of hole 2, with its title)
    // LAB TODO: what the learner must compute, the layouts, a hint (any number of lines)
    // LAB STUB: code the lab keeps in place of the hole  (optional; e.g. S[j] = 0.f so that
    //                                                     the unfilled lab still compiles)
    ...the solution's code...
    // LAB HOLE 2 END

A hole is numbered 1, 2, ... in the lesson's order (not necessarily the file's), and may have
several parts (the same number BEGIN ... END more than once, in one file or several): a part
keeps its title, and the hole is graded as one. A tag after BEGIN names the code path a hole is
on when not every build compiles it: `// LAB HOLE 3 BEGIN [t4]: ...` is code of the sm_75 (T4)
path, graded from PTX for compute_75 run with --smem-limit 65536 on a newer GPU; `[sm80]` is
code of sm_80 and newer (cp.async), graded natively from sm_80 on, and on a T4 only compiled
(PTX for compute_80) and reported as not gradable there. Markers are comments: the stage's
machine code is the same with them or without them.

An unfilled lab must fail fast and cleanly: a stub leaves wrong values, or, where doing nothing
would leave the kernel waiting forever (stage 6's producer: no arrival on an mbarrier the
consumers wait on), prints "lab hole N unfilled: ..." and traps; the grader reports that line.

A stage's holes live in its own folder's files (a primitive of common/device/ is not cut into a
lab). labs/<stage>/ gets a copy of each file that has holes; the grader builds the stage from a
tree of links to the repository in which those files are the learner's, with the Makefile, so a
lab is compiled and linked exactly as the stage's own program (stage 7's forward included).
Each program is built in build/lab/<stage>/ in a folder named by its target and a hash of its
files: jobs of the same content (every hole of a lab filled with the stage's code, the stage's own
program) are built and run once, a later grade finds them built, and a new folder starts from
the common objects of the last one (this stage's; else another stage's, for the same target).

In the lab the BEGIN and END lines stay (the grader finds the learner's code between them); in
between, every `LAB TODO:` line becomes `TODO:` and every `LAB STUB: code` line becomes `code`,
and the solution's lines are left out.

usage: labs.py lab STAGE [--restart]          write labs/<stage>/ (never over a learner's edits)
       labs.py grade STAGE [--arch A] [--smem-limit B] [--gpu-name NAME] [--jobs J] [--quick]
       labs.py render FILE                     a stage file's lab text, to stdout
       labs.py fill LAB_FILE SOLUTION_FILE [--except K]
                                               the lab with its holes (all, or all but hole K)
                                               filled from the solution, to stdout
       labs.py holes STAGE                     the stage's holes, one line each
"""

import argparse
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE_SUFFIXES = (".cu", ".cuh", ".h")
BEGIN = re.compile(r"^[ \t]*// LAB HOLE (\d+) BEGIN(?: \[([a-z0-9_]+)\])?: (\S.*)$")
END = re.compile(r"^[ \t]*// LAB HOLE (\d+) END$")
TODO = re.compile(r"^([ \t]*)// LAB TODO:(?: (.*))?$")
STUB = re.compile(r"^([ \t]*)// LAB STUB: (.*)$")
ANY = re.compile(r"LAB +(HOLE|TODO|STUB)\b")  # a marker, well formed or not
# The code paths a hole can be on, beyond the GPU's own: how to build and run each.
PATHS = {"t4": {"arch": "compute_75", "smem_limit": "65536",
                "what": "the sm_75 (T4) path: PTX for compute_75, --smem-limit 65536"},
         "sm80": {"min_arch": 80, "what": "code for sm_80 and newer"}}
# Where the grader compiles without a GPU (PTX only): compute_75, unless the stage's stage.mk
# names another (<stage>_LAB_ARCH: a stage whose kernels exist on one architecture only).
NO_GPU_ARCH = "compute_75"
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
SMOKE_TIMEOUT, SELF_TEST_TIMEOUT, BENCH_TIMEOUT = 60, 600, 300


def no_gpu_arch(sdir):
    """The target a lab compiles for without a GPU: the stage's <stage>_LAB_ARCH (one `:=` line of
    its stage.mk, which the Makefile reads too), else NO_GPU_ARCH."""
    mk = sdir / "stage.mk"
    if mk.exists():
        m = re.search(rf"^{re.escape(sdir.name)}_LAB_ARCH\s*:?=\s*(\S+)\s*$", mk.read_text(),
                      re.MULTILINE)
        if m:
            return m.group(1)
    return NO_GPU_ARCH


def grade_cases(sdir):
    """The quick cases and the timed shape of a stage's grade: (SMOKE, BENCH), or a decode stage's
    (its stage.mk's <stage>_LAB_CASES := decode, one `:=` line as _LAB_ARCH)."""
    mk = sdir / "stage.mk"
    if mk.exists() and re.search(rf"^{re.escape(sdir.name)}_LAB_CASES\s*:?=\s*decode\s*$",
                                 mk.read_text(), re.MULTILINE):
        return DECODE_SMOKE, DECODE_BENCH
    return SMOKE, BENCH


class LabError(Exception):
    pass


# ---- the markers -------------------------------------------------------------------------------


def parse(text, name):
    """The file's text as a list of pieces: str (lines outside the holes, kept as they are) or a
    dict for each hole part: hole, tag, title, begin and end (the marker lines), body (the lines
    between them), todo and stub (the learner's TODO text and stub code, rendered)."""
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
                raise LabError(f"{name}:{n}: LAB HOLE {e.group(1)} END without a BEGIN")
            if b:
                if out:
                    pieces.append("".join(out))
                out = []
                part = {"hole": int(b.group(1)), "tag": b.group(2) or "", "title": b.group(3),
                        "begin": line, "body": [], "line": n}
            else:
                out.append(line)
            continue
        if b:
            raise LabError(f"{name}:{n}: LAB HOLE {b.group(1)} BEGIN inside hole {part['hole']} "
                           f"(line {part['line']})")
        if e:
            if int(e.group(1)) != part["hole"]:
                raise LabError(f"{name}:{n}: LAB HOLE {e.group(1)} END closes hole {part['hole']} "
                               f"(line {part['line']})")
            part["end"] = line
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
            stub.append(f"{s.group(1)}{s.group(2)}\n")
    return "".join(todo + stub)


def render(text, name):
    """The lab version of a stage file's text."""
    out = []
    for p in parse(text, name):
        out.append(p if isinstance(p, str) else p["begin"] + lab_body(p) + p["end"])
    return "".join(out)


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


def stage_dir(stage):
    """The folder of stage `stage` (a number or a folder name)."""
    s = str(stage).rstrip("/")
    dirs = sorted(d for d in ROOT.glob("stage[0-9]*_*") if (d / "attention.cu").is_file())
    names = [d.name for d in dirs]
    for d in dirs:
        if s == d.name or re.fullmatch(r"\d+", s) and d.name.split("_")[0] == f"stage{s}":
            return d
    nums = " ".join(n.split("_")[0][5:] for n in names)
    raise LabError(f"STAGE={s}: no such stage (one of {nums})")


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


def cmd_lab(args):
    sdir = stage_dir(args.stage)
    files, holes = stage_files(sdir)
    if not holes:
        raise LabError(f"{sdir.name} has no lab yet (no LAB HOLE markers in its source)")
    dest = lab_dir(sdir)
    dest.mkdir(parents=True, exist_ok=True)
    rel = rel_path(dest)
    num = sdir.name.split("_")[0][5:]
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
    print(f"make lab: {len(holes)} holes: " + "; ".join(
        f"{n}. {hole_title(holes[n])}" for n in sorted(holes)))
    print(f"make lab: the guide is {guide.relative_to(ROOT) if guide.exists() else 'the lesson'}; "
          f"when a hole is written: make grade STAGE={num}")
    return 0


# ---- building and running ----------------------------------------------------------------------


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
           f"ARCH={arch}", str(out / sdir.name)]
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
    return [re.sub(r"^(?:\S*/src/)?(stage[0-9]+_\w+/)", r"labs/\1", ln) for ln in errs[:n]]


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
    stubs = [ln for ln in (out + err).splitlines() if re.match(r"lab hole \d+ unfilled", ln)]
    if stubs:  # a stub that stops the kernel (where doing nothing would hang it) said so
        return f"stopped by a stub: {stubs[0]}"
    fails = [ln for ln in (err + out).splitlines() if ln.startswith("FAILED: ")]
    if fails:
        return "first failing case: " + fails[0][len("FAILED: "):]
    described = [ln for ln in out.splitlines() if ln.endswith(" FAIL")]
    if rc == EXIT_WRONG and described:
        return "first failing case: " + described[0]
    last = [ln for ln in (err.strip() or out.strip()).splitlines()][-1:] or ["no output"]
    if rc < 0:
        return f"crashed (signal {-rc}): {last[0]}"
    if rc == EXIT_WRONG:  # no case failed its check: the program stopped (a CUDA error)
        return f"stopped: {last[0]}"
    return f"exit {rc}: {last[0]}"


def grade_program(prog, smem_limit, quick=False, smoke=SMOKE):
    """Runs the quick cases, then (unless quick) the self-test. Returns (passed, one line)."""
    extra = ["--smem-limit", smem_limit] if smem_limit else []
    for case in smoke:
        rc, out, err = run([str(prog)] + case + extra, SMOKE_TIMEOUT)
        if rc == EXIT_UNSUPPORTED:
            return False, "unsupported here: " + (err.strip().splitlines() or ["?"])[-1]
        why = first_failure(rc, out, err, SMOKE_TIMEOUT)
        if why:
            return False, why
    if quick:
        return True, f"the {len(smoke)} quick cases pass (no self-test: a quick grade)"
    rc, out, err = run([str(prog), "--self-test"] + extra, SELF_TEST_TIMEOUT)
    counts = re.findall(r"^(\d+) passed, (\d+) failed$", out, re.M)
    why = first_failure(rc, out, err, SELF_TEST_TIMEOUT)
    total = f"self-test {counts[-1][0]} passed, {counts[-1][1]} failed" if counts else "self-test"
    if why:
        return False, f"{total}; {why}"
    return True, total


def bench_ms(prog, bench=BENCH):
    rc, out, err = run([str(prog)] + bench, BENCH_TIMEOUT)
    rows = [ln.split(",") for ln in out.splitlines() if ln.count(",") > 10]
    if rc != 0 or len(rows) < 2:
        return None
    head = rows[0]
    try:
        return float(rows[1][head.index("ms_median")])
    except (ValueError, IndexError):
        return None


KEEP_BUILDS = 12  # build folders kept per stage (the most recently used)


def job_dir(build_root, arch, smem, texts):
    """The build folder of a program: named by its target and a hash of its stage files."""
    h = hashlib.sha1(f"{arch}\0{smem}".encode())
    for name in sorted(texts):
        h.update(f"\0{name}\0{texts[name]}".encode())
    return build_root / f"{arch}-{smem or 'native'}-{h.hexdigest()[:12]}"


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
    """Keeps the KEEP_BUILDS most recently used build folders (a folder is touched on use)."""
    dirs = sorted((d for d in build_root.iterdir() if d.is_dir()), key=lambda d: d.stat().st_mtime)
    for d in dirs[:-KEEP_BUILDS]:
        shutil.rmtree(d, ignore_errors=True)
        d.with_suffix(".log").unlink(missing_ok=True)
        d.with_suffix(".lock").unlink(missing_ok=True)


def cmd_grade(args):
    sdir = stage_dir(args.stage)
    num = sdir.name.split("_")[0][5:]
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

    def job(key, keep, arch, smem, what):
        """A program to build: the files (yours with the holes not in `keep` filled from the
        stage; keep None: the stage's own), in a build folder named by what it builds, so that
        jobs of the same content share one build (and one run), and a later grade reuses it."""
        fl = {name: fill(mine[name], files[name], keep, f"{rel}/{name}", f"{sdir.name}/{name}")
              if keep is not None else files[name] for name in files}
        return {"key": key, "files": fl, "arch": arch, "smem": smem, "what": what,
                "dir": job_dir(build_root, arch, smem, fl)}

    if gpu is None:
        arch = args.arch or no_gpu_arch(sdir)
        j = job("yours", set(holes), arch, None, "your file")
        j["seed"] = seed_for(build_root, j["dir"], sdir)
        ok, _ = build(j, sdir, arch, j["dir"].with_suffix(".log"))
        if not ok:
            print(f"make grade: {rel}: does not compile (ARCH={arch}):")
            for ln in compile_errors(j["dir"].with_suffix(".log")):
                print("  " + ln)
            return 1
        # compiled, not graded: the programs' "unsupported here", so that neither a script nor a
        # learner's `&&` reads it as a pass
        print(f"make grade: no NVIDIA GPU here: {rel} compiles (ARCH={arch}, PTX only), but "
              f"nothing was graded: the self-test and the timing need a GPU (make grade "
              f"STAGE={num} on one); exit {EXIT_UNSUPPORTED}, unsupported here")
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
        if tag and tag not in PATHS:
            raise LabError(f"{sdir.name}: hole {n}: unknown code path [{tag}]")
        if tag and tag not in paths:
            paths[tag] = code_path(tag, gpu, cc, native_arch, paths[""])
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
        if not started[n]:
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
    ref = job("stage", None, native_arch, native_smem, "the stage's own code")

    first = {}  # build folder -> the first job that builds it (the others share its result)
    for j in jobs:
        first.setdefault(j["dir"], j)
    for j in first.values():
        j["seed"] = seed_for(build_root, j["dir"], sdir)
    print(f"make grade: {sdir.name}, {rel}, on {paths[''][2]}: building {len(first)} programs "
          f"for {len(jobs)} jobs (logs in {build_root.relative_to(ROOT)}/)"
          + ("; quick: the quick cases only, no self-test, not timed" if args.quick else ""),
          flush=True)

    def do(j):
        t0 = time.time()
        ok, prog = build(j, sdir, j["arch"], j["dir"].with_suffix(".log"))
        took = f"build {time.time() - t0:.0f} s"
        if not ok:
            return j["key"], (False, "does not compile: " + "; ".join(
                compile_errors(j["dir"].with_suffix(".log"), 3)), None, took)
        if j["key"] == "stage":
            return j["key"], (True, prog, prog, took)
        if not j["runs"]:
            return j["key"], (None, f"compiles (ARCH={j['arch']}); its code cannot run on this GPU: "
                                    f"not graded here", prog, took)
        t1 = time.time()
        res = grade_program(prog, j["smem"], args.quick, grade_cases(sdir)[0])
        return j["key"], res + (prog, f"{took}, run {time.time() - t1:.0f} s")

    results = {}
    with ThreadPoolExecutor(max_workers=jobs_n) as pool:
        for key, res in pool.map(do, list(first.values())):
            results[key] = res
            print(f"  {key}: {verdict(res[0])} ({res[3]})", flush=True)
    for j in jobs:
        if j["key"] not in results:
            results[j["key"]] = results[first[j["dir"]]["key"]]
            print(f"  {j['key']}: the same program as {first[j['dir']]['key']}", flush=True)
    prune(build_root)

    width = max(len(hole_title(ps)) + len(ps[0]["tag"]) + 3 for ps in holes.values()) + 9
    print(f"\nReport card: {sdir.name} lab ({rel}) on {paths[''][2]}")
    passing, gradable = 0, 0
    for n in sorted(holes):
        tag = holes[n][0]["tag"]
        title = f"hole {n}  {hole_title(holes[n])}" + (f" [{tag}]" if tag else "")
        if not started[n]:
            gradable += paths[tag][3]
            print(f"  {title:<{width}} FAIL  not started (still the TODO)")
            continue
        ok, line = results[hole_job[n]][:2]
        gradable += ok is not None
        passing += ok is True
        print(f"  {title:<{width}} {verdict(ok)}  {line}")
    all_ok = True
    for j in jobs:
        if not j["key"].startswith("yours"):
            continue
        ok, line = results[j["key"]][:2]
        all_ok &= ok is not False
        print(f"  {j['what']:<{width}} {verdict(ok)}  {line}")
    speed = "not timed: your file does not pass yet"
    if all_ok and args.quick:
        speed = "not timed (a quick grade: make grade without QUICK=1 times it)"
    elif all_ok:
        same = ref["dir"] == jobs[0]["dir"]
        print("  your file passes: " + ("the same program as the stage's own code; timing it twice"
                                        if same else "building the stage's own code to time both"),
              flush=True)
        ref["seed"] = seed_for(build_root, ref["dir"], sdir)
        results["stage"] = do(ref)[1]
        if not results["stage"][0]:
            speed = "not timed: the stage's own code did not build (" + results["stage"][1] + ")"
        else:
            bench = grade_cases(sdir)[1]
            mine_ms = bench_ms(results["yours"][2], bench)
            ref_ms = bench_ms(results["stage"][1], bench)
            if mine_ms and ref_ms:
                speed = (f"{ref_ms / mine_ms:.2f} of the stage's own kernel's speed ({mine_ms:.3f} "
                         f"ms vs {ref_ms:.3f} ms, {' '.join(bench[:8])})")
            else:
                speed = "not timed: a timing run failed"
    print(f"  {'speed':<{width}} {speed}")
    for note in notes:
        print("  " + note)
    left = len(holes) - gradable
    if args.quick:
        print("  quick grade: only the quick cases ran (make grade without QUICK=1: the self-test)")
    print(f"holes passing: {passing} of {gradable}" + (
        f" ({left} not gradable on this GPU: see above)" if left else ""))
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
            tag = f" [{p['tag']}]" if p["tag"] else ""
            print(f"{sdir.name}/{p['file']}:{p['line']}: hole {n}{tag}: {p['title']} "
                  f"({lines} lines)")
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
    a = sub.add_parser("render")
    a.add_argument("file")
    a = sub.add_parser("fill")
    a.add_argument("lab")
    a.add_argument("solution")
    a.add_argument("--except", dest="except_hole", type=int, default=0)
    a = sub.add_parser("holes")
    a.add_argument("stage")
    ap.add_argument("--labs", default=str(LABS), help="where the labs are (default: labs/)")
    args = ap.parse_args()
    LABS = Path(args.labs).resolve()
    try:
        return {"lab": cmd_lab, "grade": cmd_grade, "render": cmd_render, "fill": cmd_fill,
                "holes": cmd_holes}[args.cmd](args)
    except LabError as e:
        print(f"make {args.cmd}: {e}" if args.cmd in ("lab", "grade") else f"labs.py: {e}",
              file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
