#!/usr/bin/env bash
# cuda12.sh DIR: puts a CUDA 12.4 compiler in DIR (nothing outside DIR is touched) and prints DIR.
# CI compiles every stage with it for sm_75 (the T4), so the course is known to build with the
# CUDA 12 of Colab and Kaggle (where the T4s are), not only with the newest toolkit.
#
# Where the pieces come from: PyPI's nvidia-cuda-nvcc-cu12 wheels (12.4 to 12.9) hold ptxas,
# libnvvm and the crt headers but not the nvcc driver, cicc or cudafe++, so the compiler
# binaries come from Debian's nvidia-cuda-toolkit 12.4 package (trixie, non-free; downloaded with
# apt-get into DIR, not installed) and the headers from the -cu12 wheels of the same release:
# nvidia-cuda-nvcc-cu12 (crt/), nvidia-cuda-runtime-cu12 (cuda_runtime.h, cuda_fp16.h, mma.h)
# and nvidia-cublas-cu12 (cublas_v2.h for stage 0; only its headers are kept). Compile only: no
# CUDA 12 runtime library to link or run against is needed for that.
set -euo pipefail
DIR=${1:?usage: cuda12.sh DIR}
DEB_VERSION=12.4.131~12.4.1-2
WHEELS="nvidia-cuda-nvcc-cu12==12.4.131 nvidia-cuda-runtime-cu12==12.4.127 nvidia-cublas-cu12==12.4.5.8"
say() { echo "cuda12.sh: $*" >&2; }

if [ -x "$DIR/bin/nvcc" ] && "$DIR/bin/nvcc" --version 2>/dev/null | grep -q 'release 12.4'; then
    echo "$DIR"
    exit 0
fi
command -v apt-get >/dev/null || { say "apt-get not found (Debian's nvidia-cuda-toolkit package is where nvcc 12.4 comes from)"; exit 1; }
command -v python3 >/dev/null || { say "python3 not found (pip fetches the CUDA 12.4 headers)"; exit 1; }
command -v unzip >/dev/null || { say "unzip not found (apt-get install unzip)"; exit 1; }
rm -rf "$DIR"
mkdir -p "$DIR"/{bin,include,nvvm/libdevice} "$DIR"/tmp/apt/{lists/partial,cache/archives/partial} "$DIR"/tmp/x
T=$DIR/tmp
echo "deb http://deb.debian.org/debian trixie main non-free" >"$T/apt/sources.list"
o=(-o "Dir::Etc::SourceList=$T/apt/sources.list" -o Dir::Etc::SourceParts=/dev/null
   -o "Dir::State::Lists=$T/apt/lists" -o "Dir::Cache=$T/apt/cache" -o APT::Architecture=amd64
   -o APT::Sandbox::User=root -o Debug::NoLocking=1)
say "downloading Debian's nvidia-cuda-toolkit $DEB_VERSION (about 90 MB) and the CUDA 12.4 headers from PyPI"
apt-get "${o[@]}" update -qq >"$T/apt.log" 2>&1 || { cat "$T/apt.log" >&2; say "apt-get update failed"; exit 1; }
(cd "$T" && apt-get "${o[@]}" download "nvidia-cuda-toolkit=$DEB_VERSION" >>"$T/apt.log" 2>&1) ||
    { tail -n 5 "$T/apt.log" >&2; say "apt-get download nvidia-cuda-toolkit=$DEB_VERSION failed"; exit 1; }
dpkg -x "$T"/nvidia-cuda-toolkit_*.deb "$T/deb"
tk=$T/deb/usr/lib/nvidia-cuda-toolkit
cp "$tk/bin/nvcc" "$tk/bin/cicc" "$DIR/bin/"
cp -r "$tk/bin/crt" "$DIR/bin/"
for b in cudafe++ ptxas fatbinary nvlink bin2c; do cp "$T/deb/usr/bin/$b" "$DIR/bin/"; done
cp "$tk/libdevice/libdevice.10.bc" "$DIR/nvvm/libdevice/"
# shellcheck disable=SC2086
python3 -m pip download -q --disable-pip-version-check --no-deps -d "$T/wheels" $WHEELS
for w in "$T"/wheels/*.whl; do unzip -q -o "$w" 'nvidia/*/include/*' -d "$T/x"; done
for p in cuda_nvcc cuda_runtime cublas; do cp -r "$T/x/nvidia/$p/include/." "$DIR/include/"; done
rm -f "$DIR/include/__init__.py"
cat >"$DIR/bin/nvcc.profile" <<'PROFILE'
TOP                = $(_HERE_)/..
NVVMIR_LIBRARY_DIR = $(TOP)/nvvm/libdevice
PATH              += $(_HERE_):
INCLUDES          +=  "-I$(TOP)/include" $(_SPACE_)
PROFILE
rm -rf "$T"
"$DIR/bin/nvcc" --version | grep -q 'release 12.4' || { say "the assembled nvcc does not run"; exit 1; }
say "nvcc $("$DIR/bin/nvcc" --version | sed -n 's/.*release \([0-9.]*\), \(V[0-9.]*\).*/\1 (\2)/p') in $DIR ($(du -sh "$DIR" | cut -f1))"
echo "$DIR"
