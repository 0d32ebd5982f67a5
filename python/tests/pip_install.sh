#!/usr/bin/env bash
# `pip install ./python` as a user runs it, offline: the package installed into a scratch folder
# (--target) records this checkout (flashcourse/_install.json, written by python/setup.py), so
# `python3 -m flashcourse` run from another folder finds the libraries `make lib` built, or says
# in one line how to get them; `pip install -e python` still works; neither leaves a file in
# python/ (no python/build/, no egg-info). Without the network pip cannot fetch setuptools for an
# isolated build, so it builds with the setuptools installed here (--no-build-isolation --no-deps
# --no-index); where that setuptools cannot build a wheel, each check says SKIP and why.
# Ends with "N passed, M failed, K skipped" (common/tests/report.sh).
# usage: python/tests/pip_install.sh BUILD_DIR   (BUILD_DIR/lib holds the libraries: make lib)
set -u
dir=$1
cd "$(dirname "$0")/../.."
repo=$(pwd -P)
libs=$(cd "$dir/lib" 2>/dev/null && pwd -P)
. common/tests/report.sh
ok() { report_ok_ "pip install: $*"; }
bad() { report_bad_ "pip install: $*"; }
checks=("pip install ./python succeeds offline" "_install.json names the checkout"
  "python3 -m flashcourse from another folder" "finds the libraries (FLASHCOURSE_LIB_DIR)"
  "one line saying how when no library is built" "one line without a recorded checkout"
  "pip install -e python" "the checkout is left as it was"
  "the torch extra asks for torch >= 2.4" "the sdist has LICENSE and README.md, no tests"
  "a build in pip's scratch folder (git+URL) records no checkout")
skip_all() {
  for c in "${checks[@]}"; do skip "pip install: $c: $1"; done
  report_end
  exit 0
}
command -v python3 >/dev/null 2>&1 || skip_all "python3 not found"
python3 -m pip --version >/dev/null 2>&1 || skip_all "python3 has no pip"
# What an isolated build would fetch: setuptools >= 61 (pyproject.toml), and a bdist_wheel
# (setuptools' own from 70.1, else the wheel package's).
why=$(python3 - <<'EOF'
try:
    import setuptools
except ImportError:
    print("setuptools is not installed for python3"); raise SystemExit
v = tuple(int(x) for x in setuptools.__version__.split(".")[:2] if x.isdigit())
if v < (61,):
    print(f"setuptools {setuptools.__version__} is older than 61"); raise SystemExit
try:
    import setuptools.command.bdist_wheel  # noqa: F401
except ImportError:
    try:
        import wheel.bdist_wheel  # noqa: F401
    except ImportError:
        print(f"setuptools {setuptools.__version__} has no bdist_wheel and the wheel package is not installed")
EOF
)
[ -z "$why" ] || skip_all "pip cannot build the package without the network here ($why; online, pip install ./python fetches it)"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"; report_cleanup' EXIT
mkdir "$tmp/elsewhere" "$tmp/empty"
export PYTHONDONTWRITEBYTECODE=1 PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1
unset PYTHONPATH FLASHCOURSE_LIB_DIR
before=$(git status --porcelain --ignored python)
pip_offline=(--no-build-isolation --no-deps --no-index)
# flashcourse as installed in $tmp/site, run from a folder outside the checkout
installed() { (cd "$tmp/elsewhere" && PYTHONPATH="$tmp/site" "$@"); }

if python3 -m pip install -q "${pip_offline[@]}" --target "$tmp/site" ./python >"$tmp/pip.log" 2>&1 &&
  [ -f "$tmp/site/flashcourse/_library.py" ]; then
  ok "${checks[0]} (--target, ${pip_offline[*]})"
else
  bad "${checks[0]}:"; cat "$tmp/pip.log"
fi

got=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["repo"])' "$tmp/site/flashcourse/_install.json" 2>&1)
if [ "$got" = "$repo" ]; then ok "${checks[1]} ($got)"; else bad "${checks[1]}: '$got', want '$repo'"; fi

# Without FLASHCOURSE_LIB_DIR: the installed package looks in the recorded checkout's build/lib.
# make test's libraries are there when it builds in build/ (no GPU); elsewhere that folder may
# hold none, and the one line must name the checkout.
out=$(installed python3 -m flashcourse 2>&1)
rc=$?
where=$(installed python3 -c 'import flashcourse; print(flashcourse.__file__); print(flashcourse.library_dir())' 2>&1)
if [ "$(sed -n 1p <<<"$where")" != "$tmp/site/flashcourse/__init__.py" ] ||
  [ "$(sed -n 2p <<<"$where")" != "$repo/build/lib" ]; then
  bad "${checks[2]}: the installed package does not look in $repo/build/lib: $where"
elif [ "$rc" -eq 0 ] && grep -q "stages in $repo/build/lib:" <<<"$out"; then
  ok "${checks[2]}: lists the stages in $repo/build/lib"
elif [ "$rc" -eq 1 ] && [ "$(grep -c '' <<<"$out")" -eq 1 ] && grep -qF "run \`make lib\` in $repo " <<<"$out"; then
  ok "${checks[2]}: says in one line to run make lib in $repo (no library there)"
else
  bad "${checks[2]}: exit $rc: $out"
fi

out=$(FLASHCOURSE_LIB_DIR=$libs installed python3 -m flashcourse 2>&1)
rc=$?
missing=""
for src in stage[0-9]*/attention.cu; do
  s=${src%/attention.cu}
  grep -q "^  $s " <<<"$out" || missing="$missing $s"
done
codes=$(FLASHCOURSE_LIB_DIR=$libs installed python3 -c 'import flashcourse; print(flashcourse.exit_codes("stage5_tuned")["unsupported"])' 2>&1)
if [ -n "$libs" ] && [ "$rc" -eq 0 ] && [ -z "$missing" ] && [ "$codes" = 3 ]; then
  ok "${checks[3]}: every stage listed, stage5_tuned's library loaded"
else
  bad "${checks[3]}: exit $rc, missing:$missing, stage5_tuned: $codes; $out"
fi

out=$(FLASHCOURSE_LIB_DIR=$tmp/empty installed python3 -m flashcourse 2>&1)
rc=$?
if [ "$rc" -eq 1 ] && [ "$(grep -c '' <<<"$out")" -eq 1 ] && grep -qF "run \`make lib\` in $repo " <<<"$out" &&
  grep -qF "FLASHCOURSE_LIB_DIR" <<<"$out"; then
  ok "${checks[4]}"
else
  bad "${checks[4]}: exit $rc: $out"
fi

# A copy that records no checkout (built outside one), and one whose checkout has gone.
cp -r "$tmp/site" "$tmp/norecord" && rm -f "$tmp/norecord/flashcourse/_install.json"
out=$(cd "$tmp/elsewhere" && PYTHONPATH="$tmp/norecord" python3 -m flashcourse 2>&1)
rc=$?
cp -r "$tmp/site" "$tmp/moved" && echo '{"repo": "'"$tmp"'/gone"}' >"$tmp/moved/flashcourse/_install.json"
out2=$(cd "$tmp/elsewhere" && PYTHONPATH="$tmp/moved" python3 -m flashcourse 2>&1)
rc2=$?
if [ "$rc" -eq 1 ] && [ "$(grep -c '' <<<"$out")" -eq 1 ] && grep -q "does not know where the course's repository is" <<<"$out" &&
  grep -q FLASHCOURSE_LIB_DIR <<<"$out" && [ "$rc2" -eq 1 ] && [ "$(grep -c '' <<<"$out2")" -eq 1 ] &&
  grep -qF "installed from $tmp/gone, which no longer holds the course" <<<"$out2"; then
  ok "${checks[5]} or with a checkout that has gone"
else
  bad "${checks[5]}: exit $rc: $out / exit $rc2: $out2"
fi

# The editable install, into a virtual environment that sees this python's setuptools.
if ! python3 -m venv --system-site-packages --without-pip "$tmp/venv" >"$tmp/venv.log" 2>&1; then
  skip "pip install: ${checks[6]}: python3 -m venv does not work here ($(tail -n 1 "$tmp/venv.log"))"
elif "$tmp/venv/bin/python" -m pip install -q "${pip_offline[@]}" -e ./python >"$tmp/pip-e.log" 2>&1; then
  where=$(cd "$tmp/elsewhere" && "$tmp/venv/bin/python" -c 'import flashcourse; print(flashcourse.__file__); print(flashcourse.library_dir())' 2>&1)
  if [ "$where" = "$repo/python/flashcourse/__init__.py"$'\n'"$repo/build/lib" ]; then
    ok "${checks[6]}: imports the checkout's package, looks in $repo/build/lib"
  else
    bad "${checks[6]}: $where"
  fi
else
  bad "${checks[6]}:"; cat "$tmp/pip-e.log"
fi

# The wheel's metadata: the torch extra's lower bound (torch.library.custom_op: torch 2.4).
if python3 -m pip wheel -q "${pip_offline[@]}" -w "$tmp/wheel" ./python >"$tmp/wheel.log" 2>&1 &&
  meta=$(python3 -c 'import sys, zipfile; z = zipfile.ZipFile(sys.argv[1]); print(z.read(next(n for n in z.namelist() if n.endswith("/METADATA"))).decode())' "$tmp"/wheel/*.whl 2>&1) &&
  grep -qE "^Requires-Dist: torch ?>= ?2\.4; extra == .torch." <<<"$meta"; then
  ok "${checks[8]}"
else
  bad "${checks[8]}: $(grep -i '^requires-dist' <<<"${meta:-}") $(tail -n 3 "$tmp/wheel.log")"
fi

# The sdist, as `python -m build --sdist` would make it (setup.py sdist: no network needed).
if (cd python && python3 setup.py -q sdist -d "$tmp/sdist") >"$tmp/sdist.log" 2>&1; then
  files=$(tar -tzf "$tmp"/sdist/*.tar.gz)
  if grep -qE '^[^/]+/LICENSE$' <<<"$files" && grep -qE '^[^/]+/README.md$' <<<"$files" &&
    ! grep -qE '/tests/|/examples/' <<<"$files"; then
    ok "${checks[9]}"
  else
    bad "${checks[9]}: $(tr '\n' ' ' <<<"$files")"
  fi
else
  bad "${checks[9]}: setup.py sdist failed: $(tail -n 3 "$tmp/sdist.log")"
fi

# pip install git+URL#subdirectory=python builds in a pip-req-build-* clone that pip deletes:
# recording that folder would send the package to a checkout that does not exist.
scratch=$tmp/pip-req-build-x1y2
mkdir -p "$scratch/common" && cp common/attention.h "$scratch/common/" && cp -rL python "$scratch/"
rm -rf "$scratch/python/build" "$scratch/python/"*.egg-info
if python3 -m pip install -q "${pip_offline[@]}" --target "$tmp/site2" "$scratch/python" >"$tmp/pip2.log" 2>&1 &&
  [ -f "$tmp/site2/flashcourse/_library.py" ] && [ ! -e "$tmp/site2/flashcourse/_install.json" ]; then
  ok "${checks[10]}"
else
  bad "${checks[10]}: $(ls "$tmp/site2/flashcourse" 2>&1 | tr '\n' ' ') $(tail -n 3 "$tmp/pip2.log")"
fi

after=$(git status --porcelain --ignored python)
if [ "$after" = "$before" ]; then
  ok "${checks[7]} (no python/build/, no egg-info, no _install.json)"
else
  bad "${checks[7]}: new in python/: $(diff <(echo "$before") <(echo "$after") | grep '^>' | tr '\n' ' ')"
fi
report_end
