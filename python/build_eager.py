"""Builds the eager operator, python/flashcourse/_eager.cpp, into <lib dir>/libflashcourse_eager.so
against the torch that the python running it imports (`make lib` runs it with $(PYTHON), the
first python3 on PATH unless PYTHON names another; python/lib.mk):

    python3 python/build_eager.py build/lib/libflashcourse_eager.so

It is a C++ shared library that registers the operator flashcourse_eager::attention with
PyTorch's dispatcher (torch.ops.load_library loads it), linked against that torch's libraries
and no Python: the version of torch it was built for is written beside it (.torch), and the
binding loads it only under that version. Without torch, or without a C++ compiler, it says so
in one line and exits 0: the binding then runs its Python path (same results, more host time
per call). Built again when the source or torch's version changed; a compile error fails.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

SOURCE = Path(__file__).resolve().parent / "flashcourse" / "_eager.cpp"
HEADERS = Path(__file__).resolve().parents[1] / "common"  # attn_lib.h: the entry points' ABI


def say(msg: str):
    print(f"build_eager: {msg}", flush=True)


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    out = Path(sys.argv[1])
    stamp = out.with_suffix(".torch")
    try:
        import torch
        from torch.utils import cpp_extension
    except ImportError:
        say(f"{sys.executable} has no torch: {out.name} not built (the binding runs its Python "
            "path; PYTHON=<a python with torch> make lib builds it)")
        return 0
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if not cxx:
        say(f"no C++ compiler (g++): {out.name} not built (the binding runs its Python path)")
        return 0
    version = torch.__version__
    if (out.is_file() and stamp.is_file() and stamp.read_text().strip() == version and
            out.stat().st_mtime >= max(SOURCE.stat().st_mtime,
                                       (HEADERS / "attn_lib.h").stat().st_mtime)):
        return 0  # up to date
    std = "-std=c++20"
    probe = subprocess.run([cxx, std, "-x", "c++", "-E", "-"], input="", capture_output=True,
                           text=True)
    if probe.returncode != 0:
        std = "-std=c++17"
    abi = int(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", 1))
    lib_dirs = cpp_extension.library_paths()
    cmd = [cxx, std, "-O2", "-fPIC", "-shared", "-Wall", "-Werror", "-Wno-unused-parameter",
           f"-D_GLIBCXX_USE_CXX11_ABI={abi}"]
    cmd += [f"-I{HEADERS}"] + [f"-isystem{p}" for p in cpp_extension.include_paths()]
    cmd += [str(SOURCE), "-o", str(out)]
    cmd += [f"-L{p}" for p in lib_dirs] + [f"-Wl,-rpath,{p}" for p in lib_dirs]
    cmd += ["-lc10", "-ltorch_cpu", "-ltorch"]
    out.parent.mkdir(parents=True, exist_ok=True)
    say(f"{out} for torch {version} (about a minute: torch's headers)")
    print(" ".join(cmd), flush=True)
    if subprocess.run(cmd).returncode != 0:
        out.unlink(missing_ok=True)
        say(f"compiling {SOURCE.name} failed")
        return 1
    stamp.write_text(version + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
