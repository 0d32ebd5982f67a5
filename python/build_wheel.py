"""Writes the wheel of flashcourse with the built libraries inside it (`make wheel`; python/lib.mk):

    python3 python/build_wheel.py build/lib build/wheel

The wheel holds the package (python/flashcourse/*.py, py.typed), the stage libraries of LIB_DIR
(lib<stage>.so: whatever ARCH `make lib` built them for, the fat build by default) and the eager
operator where it was built (libflashcourse_eager.so and its .torch stamp) in flashcourse/lib/,
where the installed package finds them (flashcourse.library_dir()), and its metadata from
pyproject.toml, the version from flashcourse/_version.py. It needs the standard library alone (no
setuptools, no wheel package, no network): a wheel is a zip archive with a RECORD of sha256
digests (PEP 427). The libraries are x86-64 Linux code calling the CUDA driver, so the tag is
py3-none-linux_<machine>: `pip install` of it works on such a machine with a driver, without
the checkout or the CUDA toolkit. Prints the wheel's path.
"""

import base64
import hashlib
import platform
import re
import sys
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PACKAGE = HERE / "flashcourse"


def load_toml(path: Path) -> dict:
    try:
        import tomllib  # Python 3.11
    except ImportError:
        try:
            from pip._vendor import tomli as tomllib  # what pip itself reads pyproject.toml with
        except ImportError:
            sys.exit("build_wheel.py: reading pyproject.toml needs Python 3.11 or pip")
    with open(path, "rb") as f:
        return tomllib.load(f)


def version() -> str:
    m = re.search(r'^__version__ = "([^"]+)"$', (PACKAGE / "_version.py").read_text(), re.M)
    if not m:
        sys.exit("build_wheel.py: no __version__ in flashcourse/_version.py")
    return m.group(1)


def metadata(project: dict, ver: str) -> str:
    lines = ["Metadata-Version: 2.1", f"Name: {project['name']}", f"Version: {ver}",
             f"Summary: {project['description']}",
             f"Requires-Python: {project['requires-python']}", "License-File: LICENSE"]
    for extra, reqs in project.get("optional-dependencies", {}).items():
        lines.append(f"Provides-Extra: {extra}")
        lines += [f"Requires-Dist: {r}; extra == \"{extra}\"" for r in reqs]
    readme = (HERE / project["readme"]).read_text()
    return "\n".join(lines + ["Description-Content-Type: text/markdown", "", readme])


def digest(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    libs, out_dir = Path(sys.argv[1]), Path(sys.argv[2])
    stage_libs = sorted(libs.glob("libstage*.so"))
    if not stage_libs:
        print(f"build_wheel.py: no stage library in {libs}: `make lib` first", file=sys.stderr)
        return 1
    project = load_toml(HERE / "pyproject.toml")["project"]
    ver = version()
    name = project["name"]
    tag = f"py3-none-linux_{platform.machine()}"
    dist = f"{name}-{ver}.dist-info"
    files = [(f"flashcourse/{p.name}", p.read_bytes()) for p in sorted(PACKAGE.iterdir())
             if p.suffix in (".py", ".typed")]
    extras = [libs / "libflashcourse_eager.so", libs / "libflashcourse_eager.torch"]
    for p in stage_libs + [e for e in extras if e.is_file()]:
        files.append((f"flashcourse/lib/{p.name}", p.read_bytes()))
    files += [(f"{dist}/METADATA", metadata(project, ver).encode()),
              (f"{dist}/WHEEL", (f"Wheel-Version: 1.0\nGenerator: flashcourse build_wheel.py\n"
                                 f"Root-Is-Purelib: false\nTag: {tag}\n").encode()),
              (f"{dist}/LICENSE", (HERE / "LICENSE").read_bytes())]
    record = "".join(f"{n},{digest(d)},{len(d)}\n" for n, d in files) + f"{dist}/RECORD,,\n"
    out_dir.mkdir(parents=True, exist_ok=True)
    wheel = out_dir / f"{name}-{ver}-{tag}.whl"
    tmp = wheel.with_suffix(".tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
        for n, d in files + [(f"{dist}/RECORD", record.encode())]:
            info = zipfile.ZipInfo(n, date_time=(2020, 1, 1, 0, 0, 0))  # the same bytes each time
            info.external_attr = (0o755 if n.endswith(".so") else 0o644) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, d)
    tmp.replace(wheel)
    print(wheel)
    return 0


if __name__ == "__main__":
    sys.exit(main())
