#!/usr/bin/env python3
"""Executes python/colab_t4_l4.ipynb headless.

    python3 python/tests/run_notebook.py [EXECUTED.ipynb] [--cell-timeout S]
        every cell, from inside the repository (so it fetches nothing and needs no internet; on a
        GPU), printing each code cell's time and last lines. With nbclient, nbformat and ipykernel
        where installed (and the executed notebook written to EXECUTED.ipynb), else all cells in
        one python3 process (--engine plain). --cells 1-3, then --cells 1,2,4, ... runs it in
        parts (each part begins with cells 1 and 2, which set up the session; the build and the
        sweep's CSV stay in the checkout between parts).
    python3 python/tests/run_notebook.py --fresh
        as a fresh user would (CI, no GPU needed, seconds): the notebook file alone in an empty
        folder, its first cell run with a local bare repository pasted as REPO_URL, and again with
        an archive of the repository uploaded beside it; each twice, in a new kernel each time (a
        runtime restart), then the next cell, which must say in one line that it needs a GPU
        where there is none. Runs the cells with nbclient where it is installed, else each
        session in a new python3 process (the cells are plain Python: check_notebook.py).

Ends with "N passed, M failed" (over the code cells, or over the fresh-user checks); exit 1 if
any failed.
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from datetime import datetime
from pathlib import Path

NB = Path(__file__).resolve().parents[1] / "colab_t4_l4.ipynb"
REPO = NB.parents[1]
ANSI = re.compile(r"\x1b\[[0-9;]*m")

# The plain engine: one python3 process is one kernel; it runs the given cells in one namespace
# and marks where each cell's output starts, and the error that stopped it (IPython shows an
# exception's _render_traceback_() instead of the traceback, and so does this).
PLAIN = r"""
import json, sys, time, traceback, types
cells = json.load(open(sys.argv[1]))
try:
    import IPython.display  # noqa: F401
except ImportError:  # outside Jupyter: display() prints what a notebook would show
    ipy, disp = types.ModuleType("IPython"), types.ModuleType("IPython.display")
    disp.Image = lambda filename=None, **kw: "[image %s]" % filename
    disp.Markdown = lambda text: text
    disp.display = lambda *objs: [print(o) for o in objs]
    ipy.display, ipy.get_ipython, ipy.version_info = disp, lambda: None, (9, 0, 0)
    sys.modules["IPython"], sys.modules["IPython.display"] = ipy, disp
g = {"__name__": "__main__"}
for i, src in enumerate(cells):
    print("\x1ecell", flush=True)
    t0 = time.time()
    try:
        exec(compile(src, "cell", "exec"), g)
        print("\x1eseconds %.1f" % (time.time() - t0), flush=True)
    except BaseException as e:
        render = getattr(e, "_render_traceback_", None)
        print("\n".join(render()) if render else traceback.format_exc().rstrip(), flush=True)
        print("\x1eerror", flush=True)
        sys.exit(1)
"""


def code_sources(nb_path):
    nb = json.loads(Path(nb_path).read_text())
    return ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]


def session(nb_path, numbers, cwd, engine, timeout=300):
    """Runs code cells `numbers` (1-based) of the notebook in one new kernel whose working folder
    is cwd; returns [(ok, text)] per cell (a cell after a failed one: (False, 'not run'))."""
    if engine == "nbclient":
        import nbformat
        from nbclient import NotebookClient

        nb = nbformat.read(str(nb_path), as_version=4)
        code = [(i, c) for i, c in enumerate(nb.cells) if c.cell_type == "code"]
        client = NotebookClient(nb, timeout=timeout, kernel_name="python3", allow_errors=True,
                                resources={"metadata": {"path": str(cwd)}})
        results = []
        with client.setup_kernel():
            for n in numbers:
                if results and not results[-1][0]:
                    results.append((False, "not run"))
                    continue
                i, cell = code[n - 1]
                client.execute_cell(cell, i)
                results.append(outputs_of(cell))
        return results
    return [(ok, text) for ok, text, _ in plain_cells(nb_path, numbers, cwd, timeout)]


def plain_cells(nb_path, numbers, cwd, timeout):
    """The plain engine: code cells `numbers` in one new python3 process; [(ok, text, seconds)]."""
    srcs = code_sources(nb_path)
    prog = Path(cwd) / ".." / f".cells-{os.getpid()}.json"
    prog.write_text(json.dumps([srcs[n - 1] for n in numbers]))
    try:
        p = subprocess.run([sys.executable, "-c", PLAIN, str(prog)], cwd=cwd, capture_output=True,
                           text=True, timeout=timeout)
        out = p.stdout + p.stderr
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode(errors="replace") + "\n\x1eerror\n"
    finally:
        prog.unlink()
    results = []
    for part in out.split("\x1ecell\n")[1:]:
        failed = "\x1eerror" in part
        t = re.search(r"\x1eseconds ([0-9.]+)\n", part)
        text = re.sub(r"\x1e(seconds [0-9.]+|error)\n?", "", part).rstrip()
        results.append((not failed, text, float(t.group(1)) if t else None))
    results += [(False, "not run", None)] * (len(numbers) - len(results))
    return results


def outputs_of(cell):
    text, ok = [], True
    for o in cell.get("outputs", []):
        if o.get("output_type") == "stream":
            text.append(o.get("text", ""))
        elif o.get("output_type") == "error":
            ok = False
            text.append("\n".join(ANSI.sub("", t) for t in o.get("traceback", [])) + "\n")
    return ok, "".join(text).rstrip()


def fresh_user(engine):
    """The fresh-user checks; returns (passed, failed)."""
    counts = [0, 0]

    def check(what, cond, detail=""):
        counts[0 if cond else 1] += 1
        print(f"{'ok    ' if cond else 'FAILED'} {what}")
        if not cond and detail:
            print("       " + detail.replace("\n", "\n       ")[:2000])

    no_gpu = shutil.which("nvidia-smi") is None or subprocess.run(
        ["nvidia-smi", "-L"], capture_output=True).returncode != 0
    nb_text = NB.read_text()
    src1 = code_sources(NB)[0]
    check("cell 1 has the line a user pastes the URL into: REPO_URL = \"\"",
          re.search(r'^REPO_URL = ""', src1, re.M) is not None)
    executable = subprocess.run(["git", "-C", str(REPO), "ls-files", "-s"], capture_output=True,
                                text=True).stdout
    scripts = [line.split("\t")[1] for line in executable.splitlines() if line.startswith("100755")]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        bare = tmp / "course.git"
        subprocess.run(["git", "clone", "--quiet", "--bare", str(REPO), str(bare)], check=True)
        archive = tmp / "course-main.zip"
        subprocess.run(["git", "-C", str(REPO), "archive", "--format=zip", "--prefix=course-main/",
                        "-o", str(archive), "HEAD"], check=True)
        cases = [("URL", f"file://{bare}", None, "cloned from"),
                 ("upload", None, archive, "unpacked from course-main.zip")]
        for name, url, upload, first in cases:
            user = tmp / name
            user.mkdir()
            text = nb_text.replace('REPO_URL = \\"\\"', f'REPO_URL = \\"{url}\\"') if url else nb_text
            (user / "lab.ipynb").write_text(text)
            if upload:
                shutil.copy(upload, user / upload.name)
            course = user / "flashattention-course"
            (ok, out), = session(user / "lab.ipynb", [1], user, engine)
            check(f"{name}: cell 1 in an empty folder fetches the course ({first})",
                  ok and first in out and (course / "Makefile").is_file(), out)
            if scripts:
                check(f"{name}: the fetched course keeps its executable scripts ({scripts[0]})",
                      os.access(course / scripts[0], os.X_OK))
            (ok1, out1), (ok2, out2) = session(user / "lab.ipynb", [1, 2], user, engine)
            check(f"{name}: cell 1 again after a restart reuses the course",
                  ok1 and "fetched before: reused" in out1, out1)
            if no_gpu:
                lines = [ln for ln in out2.splitlines() if ln.strip()]
                check(f"{name}: without a GPU, cell 2 says in one line that it needs one",
                      not ok2 and len(lines) == 1 and "needs an NVIDIA GPU" in lines[0], out2)
            else:
                check(f"{name}: cell 2 finds the GPU", ok2, out2)
        empty = tmp / "nothing"
        empty.mkdir()
        shutil.copy(NB, empty / "lab.ipynb")
        (ok, out), = session(empty / "lab.ipynb", [1], empty, engine)
        lines = [ln for ln in out.splitlines() if ln.strip()]
        check("with neither a URL nor an archive, cell 1 says in one line what to do",
              not ok and len(lines) == 1 and "REPO_URL" in lines[0]
              and not (empty / "flashattention-course").exists(), out)
    return counts


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


def cell_numbers(spec, count):
    """'1,2,5-12' -> [1, 2, 5, ..., 12]; None -> every code cell."""
    if not spec:
        return list(range(1, count + 1))
    out = []
    try:
        for part in spec.split(","):
            a, _, b = part.partition("-")
            out += range(int(a), int(b or a) + 1)
    except ValueError:
        out = []
    if not out or min(out) < 1 or max(out) > count:
        sys.exit(f"--cells {spec}: the notebook has code cells 1..{count}")
    return out


def default_engine():
    import importlib.util as u

    return "nbclient" if u.find_spec("ipykernel") and u.find_spec("nbclient") else "plain"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", nargs="?", default="executed.ipynb")
    ap.add_argument("--cell-timeout", type=int, default=900)
    ap.add_argument("--times", help="write {cell number: seconds} as JSON here")
    ap.add_argument("--fresh", action="store_true", help="the fresh-user checks (see above)")
    ap.add_argument("--engine", choices=("nbclient", "plain"), help="default: nbclient if installed")
    ap.add_argument("--cells", help="plain engine: only these code cells, e.g. 1-4 or 1,2,5-12 (a "
                    "run longer than one sitting, split; the build folder is reused)")
    args = ap.parse_args()
    engine = args.engine or default_engine()
    if args.fresh:
        print(f"fresh-user checks of {NB.name}, cells run by {engine}")
        passed, failed = fresh_user(engine)
        print(f"{passed} passed, {failed} failed")
        return 1 if failed else 0
    if engine == "plain" or args.cells:  # code cells in one python3 process, inside the repository
        srcs = code_sources(NB)
        numbers = cell_numbers(args.cells, len(srcs))
        print(f"{NB.name}: code cells {args.cells or 'all'} run by the plain engine")
        results = plain_cells(NB, numbers, NB.parent, args.cell_timeout * len(numbers))
        passed = sum(ok for ok, _, _ in results)
        for n, (ok, text, t) in zip(numbers, results):
            state = "ok" if ok else ("not run" if text == "not run" else "FAILED")
            print(f"cell {n} [{state}, {'%.1f s' % t if t is not None else '-'}] {srcs[n - 1].splitlines()[0]}")
            for line in ANSI.sub("", text).splitlines()[-4:]:
                print(f"    {line}")
        if args.times:
            Path(args.times).write_text(json.dumps({n: t for n, (_, _, t) in zip(numbers, results) if t}))
        print(f"{passed} passed, {len(numbers) - passed} failed")
        return 0 if passed == len(numbers) else 1
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

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
