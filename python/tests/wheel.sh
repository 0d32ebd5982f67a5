#!/usr/bin/env bash
# The wheel as a user without the checkout installs it: python/build_wheel.py (what `make wheel`
# runs) packs BUILD_DIR/lib's libraries into a wheel, `pip install` puts it into a fresh virtual
# environment outside the checkout (offline: --no-index --no-deps), and its python, run from
# another folder with no FLASHCOURSE_LIB_DIR, imports flashcourse from the environment, finds
# every stage in the wheel's own flashcourse/lib (stages()), and has the version of
# flashcourse/_version.py. No GPU and no torch needed. Where python3 cannot make a virtual
# environment with pip (python3-venv missing), each check says SKIP and why.
# Ends with "N passed, M failed, K skipped" (common/tests/report.sh).
# usage: python/tests/wheel.sh BUILD_DIR   (BUILD_DIR/lib holds the libraries: make lib)
set -u
dir=$1
cd "$(dirname "$0")/../.."
. common/tests/report.sh
ok() { report_ok_ "wheel: $*"; }
bad() { report_bad_ "wheel: $*"; }
checks=("build_wheel.py packs BUILD_DIR/lib" "pip install of the wheel into a fresh venv"
  "the venv's flashcourse lists every stage from its own lib folder, with its __version__")
skip_all() {
  for c in "${checks[@]}"; do skip "wheel: $c: $1"; done
  report_end
  exit 0
}
command -v python3 >/dev/null 2>&1 || skip_all "python3 not found"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"; report_cleanup' EXIT
export PYTHONDONTWRITEBYTECODE=1 PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1
unset PYTHONPATH FLASHCOURSE_LIB_DIR
# The environment without pip of its own (ensurepip takes longer than the rest of this suite):
# this python's pip installs into it (pip --python, pip 22.3 or newer); an older pip gets an
# environment with pip.
if python3 -m venv --without-pip "$tmp/venv" >"$tmp/venv.log" 2>&1 &&
  python3 -m pip --python "$tmp/venv/bin/python" --version >/dev/null 2>&1; then
  venv_pip=(python3 -m pip --python "$tmp/venv/bin/python")
elif python3 -m venv --clear "$tmp/venv" >"$tmp/venv.log" 2>&1 && "$tmp/venv/bin/python" -m pip --version >/dev/null 2>&1; then
  venv_pip=("$tmp/venv/bin/python" -m pip)
else
  skip_all "python3 -m venv cannot make an environment with pip here ($(tail -n 1 "$tmp/venv.log"); python3-venv installs it)"
fi

if wheel=$(python3 python/build_wheel.py "$dir/lib" "$tmp/dist" 2>"$tmp/build.log") && [ -f "$wheel" ]; then
  ok "${checks[0]}: $(basename "$wheel")"
else
  bad "${checks[0]}: $(tail -n 3 "$tmp/build.log")"
fi

mkdir "$tmp/elsewhere"
if (cd "$tmp/elsewhere" && "${venv_pip[@]}" install -q --no-index --no-deps "${wheel:-none}") >"$tmp/pip.log" 2>&1; then
  ok "${checks[1]}"
else
  bad "${checks[1]}: $(tail -n 3 "$tmp/pip.log")"
fi

want_stages=$(ls stage[0-9]*/attention.cu | cut -d/ -f1 | sort | tr '\n' ' ')
want_version=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' python/flashcourse/_version.py)
got=$(cd "$tmp/elsewhere" && "$tmp/venv/bin/python" -c '
import flashcourse
print(flashcourse.__version__)
print(flashcourse.library_dir())
print(" ".join(s.name for s in flashcourse.stages()) + " ")
print(flashcourse.__file__)' 2>&1)
site_lib=$(sed -n 4p <<<"$got")
if [ "$(sed -n 1p <<<"$got")" = "$want_version" ] && [ "$(sed -n 3p <<<"$got")" = "$want_stages" ] &&
  [ "$(sed -n 2p <<<"$got")" = "$(dirname "$site_lib")/lib" ] && [[ "$site_lib" == "$tmp/venv/"* ]]; then
  ok "${checks[2]} ($want_version, $(sed -n 2p <<<"$got"))"
else
  bad "${checks[2]}: want version $want_version, stages $want_stages, libraries in the venv; got: $got"
fi
report_end
