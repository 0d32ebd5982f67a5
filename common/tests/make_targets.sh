#!/usr/bin/env bash
# The Makefile's first-hour behaviour, without a GPU and without building anything (every make
# here either stops before its first compile or runs with -n): what `make bench`, `make QUICK=1`,
# a mistyped ARCH, `make sanitize` / `make profile` and the format check say and do when
# something is missing; and how .ci/run sums make test's closing count. GPU_NAME= pretends there
# is no GPU, GPU_NAME=name that there is one. Ends with "N passed, M failed, K skipped"
# (common/tests/report.sh).
# usage: make_targets.sh
set -u
cd "$(dirname "$0")/../.."
. common/tests/report.sh
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"; report_cleanup' EXIT
# every make here uses a build folder of its own: the checkout's build/ (flags.txt) stays as it is
flags_before=$(cat build/flags.txt 2>/dev/null)
bad() { report_bad_ "$@"; sed 's/^/      /' "$tmp/out" | head -n 10; }
# mk ARGS...: make with the output (stdout and stderr) in $tmp/out, its status in $rc; never a
# real compile (NVCC and CC fail at once if it came to that). Not FORMAT_CHECK_REQUIRED from the
# caller (.ci/run sets it): the tests below give it where they mean it.
mk() {
  env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL -u FORMAT_CHECK_REQUIRED make --no-print-directory NVCC=false CC=false "$@" >"$tmp/out" 2>&1
  rc=$?
}
lines() { grep -c '' "$tmp/out"; }
has() { grep -q -F -- "$1" "$tmp/out"; }

# ---- 1. make bench without a GPU: says so before building anything
mk bench GPU_NAME= ARCH= BUILD="$tmp/bench"
if [ "$rc" -ne 0 ] && has "bench: no NVIDIA GPU found" && ! has "false " && [ ! -e "$tmp/bench/obj" ]; then
  ok "make bench without a GPU: says so first and builds nothing"
else
  bad "make bench without a GPU (exit $rc): should say there is no GPU before building"
fi
# make QUICK=1 without a GPU: one line first, saying it is a plain make
mk QUICK=1 GPU_NAME= ARCH=75 BUILD="$tmp/quick"
first=$(head -n 1 "$tmp/out")
if [[ "$first" == "make QUICK=1: no NVIDIA GPU here"*"plain make"*"committed results"* ]]; then
  ok "make QUICK=1 without a GPU: its first line says it is a plain make"
else
  bad "make QUICK=1 without a GPU: first line '$first'"
fi

# ---- 2. a mistyped ARCH fails at once and leaves the build folder (flags.txt) as it was
if command -v "${NVCC:-/usr/local/cuda/bin/nvcc}" >/dev/null 2>&1; then
  nvcc=$(command -v "${NVCC:-/usr/local/cuda/bin/nvcc}")
  mkdir -p "$tmp/arch"
  for arch in 99 sm_99 compute_99 "75 98" abc; do
    echo "flags of an earlier build" >"$tmp/arch/flags.txt"
    mk build ARCH="$arch" BUILD="$tmp/arch" NVCC="$nvcc"
    if [ "$rc" -eq 2 ] && [ "$(lines)" -eq 1 ] && has "ARCH=$arch: " && has "has no target" &&
      [ "$(cat "$tmp/arch/flags.txt")" = "flags of an earlier build" ] && [ ! -e "$tmp/arch/obj" ]; then
      ok "make build ARCH='$arch': one line, exit 2, flags.txt untouched"
    else
      bad "make build ARCH='$arch' (exit $rc): want one line naming it, exit 2, flags.txt untouched"
    fi
  done
  # the forms that are right pass the check (-n: nothing runs)
  mk -n build ARCH="75 sm_80 compute_75 sm_90a" BUILD="$tmp/arch" NVCC="$nvcc"
  if [ "$rc" -eq 0 ]; then ok "ARCH='75 sm_80 compute_75 sm_90a' is accepted"; else bad "ARCH='75 sm_80 compute_75 sm_90a' (exit $rc)"; fi
else
  skip "make build ARCH=99 (mistyped): no nvcc here to list the targets it knows"
fi

# ---- 4. sanitize, fuzz and profile: the stage number first, then the GPU, then the tool
mk profile STAGE=99 GPU_NAME=
if [ "$rc" -eq 2 ] && [ "$(lines)" -eq 1 ] && has "STAGE=99 is not a stage number" && ! has ncu && ! has GPU; then
  ok "make profile STAGE=99: names the stage number, nothing else"
else
  bad "make profile STAGE=99 (exit $rc): want one line about the stage number"
fi
mk profile GPU_NAME=
if [ "$rc" -eq 2 ] && [ "$(lines)" -eq 1 ] && has "which stage?"; then ok "make profile without STAGE: asks which"; else bad "make profile without STAGE (exit $rc)"; fi
for goal in sanitize fuzz "profile STAGE=1" check; do
  # shellcheck disable=SC2086
  mk $goal GPU_NAME=
  if [ "$rc" -eq 2 ] && [ "$(lines)" -eq 1 ] && has "no NVIDIA GPU here" && ! has compute-sanitizer && ! has ncu; then
    ok "make $goal without a GPU: names the missing GPU first"
  else
    bad "make $goal without a GPU (exit $rc): want one line naming the missing GPU"
  fi
done
# a toolkit without the tools, and a PATH without them: the message names the tool and says the
# toolkit lacks it (not "put the toolkit's bin folder on PATH")
mkdir -p "$tmp/cuda/bin" "$tmp/path"
for d in /usr/local/bin /usr/bin /bin; do ln -s "$d"/* "$tmp/path/" 2>/dev/null; done
rm -f "$tmp/path/compute-sanitizer" "$tmp/path/ncu" "$tmp/path/nvidia-smi"
printf '#!/bin/sh\necho "Cuda compilation tools, release 13.0, V13.0.88"\n' >"$tmp/cuda/bin/nvcc"
chmod +x "$tmp/cuda/bin/nvcc"
mkpath() { PATH="$tmp/path" mk "$@"; }
mkpath sanitize GPU_NAME="Test GPU" CUDA_HOME="$tmp/cuda"
if [ "$rc" -eq 2 ] && [ "$(lines)" -eq 1 ] && has "compute-sanitizer not found" && has "$tmp/cuda does not include it" &&
  has "cuda-sanitizer-13-0" && ! has "put the toolkit"; then
  ok "make sanitize, toolkit without compute-sanitizer: names the tool and the toolkit that lacks it"
else
  bad "make sanitize with a toolkit lacking compute-sanitizer (exit $rc)"
fi
mkpath profile STAGE=5 GPU_NAME="Test GPU" CUDA_HOME="$tmp/cuda"
if [ "$rc" -eq 2 ] && [ "$(lines)" -eq 1 ] && has "ncu (Nsight Compute) not found" && has "$tmp/cuda does not include it" &&
  ! has "put the toolkit"; then
  ok "make profile, toolkit without ncu: names the tool and the toolkit that lacks it"
else
  bad "make profile with a toolkit lacking ncu (exit $rc)"
fi
mkpath sanitize GPU_NAME="Test GPU" CUDA_HOME="$tmp/nocuda"
if [ "$rc" -eq 2 ] && has "there is no CUDA toolkit in $tmp/nocuda"; then
  ok "make sanitize with no toolkit at CUDA_HOME: says so"
else
  bad "make sanitize with no toolkit at CUDA_HOME (exit $rc)"
fi
# a tool in the toolkit but not on PATH is found there and used (-n: nothing runs)
printf '#!/bin/sh\nexit 0\n' >"$tmp/cuda/bin/compute-sanitizer"
chmod +x "$tmp/cuda/bin/compute-sanitizer"
mkpath -n sanitize GPU_NAME="Test GPU" CUDA_HOME="$tmp/cuda" BUILD="$tmp/sanbuild"
if [ "$rc" -eq 0 ] && has "SANITIZER='$tmp/cuda/bin/compute-sanitizer'"; then
  ok "make sanitize finds compute-sanitizer in the toolkit when it is not on PATH"
else
  bad "make sanitize with compute-sanitizer in CUDA_HOME/bin only (exit $rc)"
fi

# ---- 3. the pinned clang-format lives outside the build folder; offline, the check is skipped
probe='print-%:
	@echo $($*)'
printf '%s\n' "$probe" >"$tmp/probe.mk"
cfdir=$(env -u MAKEFLAGS make --no-print-directory -s -f Makefile -f "$tmp/probe.mk" print-CLANG_FORMAT_DIR GPU_NAME= BUILD="$tmp/probe")
case "$cfdir" in
  build/* | "$PWD"/* | "$tmp"/*) echo "clang-format in $cfdir" >"$tmp/out"; bad "the pinned clang-format lives in the build folder or the checkout: $cfdir" ;;
  "") echo "" >"$tmp/out"; bad "CLANG_FORMAT_DIR is empty" ;;
  *) ok "the pinned clang-format lives outside the build folder (make clean keeps it): $cfdir" ;;
esac
# a formatter already in the cache is used as it is, no pip (a stand-in that formats nothing)
mkdir -p "$tmp/cache/clang-format-19.1.7/clang_format/data/bin"
printf '#!/bin/sh\n[ "$1" = -i ] && exit 0\ncat "$1"\n' >"$tmp/cache/clang-format-19.1.7/clang_format/data/bin/clang-format"
chmod +x "$tmp/cache/clang-format-19.1.7/clang_format/data/bin/clang-format"
PIP_CONFIG_FILE=/dev/null PIP_FIND_LINKS= PIP_INDEX_URL=http://127.0.0.1:9/simple mk -s format-check FLASHCOURSE_CACHE="$tmp/cache"
if [ "$rc" -eq 0 ] && has "1 passed, 0 failed"; then ok "format-check uses the formatter in FLASHCOURSE_CACHE"; else bad "format-check with the formatter cached (exit $rc)"; fi
# offline (no package index reachable) and nothing cached: one line, skipped, exit 0
offline() { PIP_CONFIG_FILE=/dev/null PIP_FIND_LINKS= PIP_INDEX_URL=http://127.0.0.1:9/simple mk -s format-check FLASHCOURSE_CACHE="$tmp/empty" "$@"; }
offline FORMAT_CHECK_REQUIRED=  # as a learner runs it (CI exports FORMAT_CHECK_REQUIRED=1)
if [ "$rc" -eq 0 ] && [ "$(lines)" -eq 1 ] && grep -q '^SKIP  format-check: .*no package index is reachable' "$tmp/out"; then
  ok "format-check offline: one SKIP line saying why, exit 0"
else
  bad "format-check offline (exit $rc): want one SKIP line and exit 0"
fi
offline FORMAT_CHECK_REQUIRED=1
if [ "$rc" -ne 0 ] && has "0 passed, 1 failed"; then ok "format-check offline with FORMAT_CHECK_REQUIRED=1 (CI): fails"; else bad "format-check offline, FORMAT_CHECK_REQUIRED=1 (exit $rc)"; fi

# ---- 7. .ci/run sums make test's closing "N passed, M failed, K skipped" with the CUDA 12.4
# spill check's and fails on any failure or a missing count (its closing block, run on samples)
sed -n '/^# make test.s closing/,$p' .ci/run >"$tmp/sum.sh"
ci_sum() { # ci_sum MAKE_TEST_LOG_LINE SPILL_LINE -> the sum line; status as .ci/run's
  printf 'x\n%s\nmore\n' "$1" >"$tmp/log"
  log="$tmp/log" spill12=$2 bash -c 'set -euo pipefail; source "$0"' "$tmp/sum.sh" 2>&1
}
got=$(ci_sum "447 passed, 0 failed, 31 skipped" "check_spills: 12 passed, 0 failed"); rc=$?
[ "$rc" -eq 0 ] && [ "$got" = "459 passed, 0 failed, 31 skipped" ] && ok ".ci/run sums the counts: $got" ||
  { echo "$got" >"$tmp/out"; bad ".ci/run's sum (exit $rc): '$got'"; }
got=$(ci_sum "440 passed, 2 failed, 31 skipped" "12 passed, 0 failed"); rc=$?
[ "$rc" -ne 0 ] && [ "$got" = "452 passed, 2 failed, 31 skipped" ] && ok ".ci/run fails on make test's failures" ||
  { echo "$got" >"$tmp/out"; bad ".ci/run with failures (exit $rc): '$got'"; }
got=$(ci_sum "no count" "12 passed, 0 failed"); rc=$?
[ "$rc" -ne 0 ] && ok ".ci/run fails when make test printed no count ($got)" ||
  { echo "$got" >"$tmp/out"; bad ".ci/run without make test's count (exit $rc): '$got'"; }
# stage 10 without NCCL (NCCL_ROOT= builds as there): make cp says why in one line and fails;
# make build goes on with every other stage, the same line said
mk cp NCCL_ROOT= GPU_NAME= ARCH=75 BUILD="$tmp/cp"
if [ "$rc" -ne 0 ] && has "stage10_context_parallel skipped: no NCCL here" && ! has "false "; then
  ok "make cp without NCCL: says so in one line and fails"
else
  bad "make cp without NCCL (exit $rc): should say there is no NCCL and fail"
fi
mk -n build NCCL_ROOT= GPU_NAME= ARCH=75 BUILD="$tmp/cp"
if [ "$rc" -eq 0 ] && has "stage10_context_parallel skipped: no NCCL here" && has "stage5_tuned"; then
  ok "make build without NCCL: builds every other stage, says stage 10 is skipped"
else
  bad "make build without NCCL (exit $rc): should build the other stages and say stage 10 is skipped"
fi
# run.sh's closing count is report.sh's report_end over its record: on a sample record of one
# pass, two failures and one skip it prints the line .ci/run reads, and fails
printf 'ok\ta\tx\nFAIL\ta\ty\nSKIP\tb\tz: why\nFAIL\tb\tw\n' >"$tmp/record"
got=$(REPORT_FILE="$tmp/record" bash -c '. common/tests/report.sh; report_start_=0; report_end' 2>&1); rc=$?
if [ "$(tail -n 1 common/tests/run.sh)" = report_end ] && [ "$rc" -ne 0 ] &&
  [ "$got" = "1 passed, 2 failed, 1 skipped" ]; then
  ok "common/tests/run.sh ends with report_end: the count .ci/run reads ($got)"
else
  echo "$got" >"$tmp/out"; bad "common/tests/run.sh's closing count (report_end, exit $rc) is not 'N passed, M failed, K skipped'"
fi

if [ "$(cat build/flags.txt 2>/dev/null)" = "$flags_before" ]; then
  ok "build/flags.txt is as it was (none of these makes touched the checkout's build)"
else
  : >"$tmp/out"; bad "build/flags.txt changed while these tests ran (the next make rebuilds everything)"
fi

report_end
