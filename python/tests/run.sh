#!/usr/bin/env bash
# The Python binding's part of `make test`: links every stage library from BUILD_DIR's objects
# (make lib), checks what each exports, then runs python/tests/test_binding.py against them (its
# GPU and PyTorch tests say `skipped` where there is neither), installs the package as a user
# does (pip_install.sh: `pip install ./python` finds this checkout's libraries; wheel.sh: the wheel
# `make wheel` writes, installed into a fresh venv, finds its own), the drop-ins against torch's
# SDPA and flash-attn's keywords (test_dropins.py: GPU), flash_attn_with_kvcache (test_kvcache.py:
# its CPU checks anywhere, stage9_decode against a float64 reference on a GPU),
# flash_attn_varlen_func (test_varlen.py: its CPU checks anywhere, packed batches against a
# float64 reference on a GPU), ring_attention (test_ring.py: the ring's schedule and merge
# simulated on the CPU, its exchange over gloo; two GPUs under torchrun), tests the
# comparison scripts' command line and shape lists (test_compare.py, no GPU needed) and train_gpt.py's (test_train_gpt.py:
# --dtype, --kv-heads, the stages it refuses, --sdpa-only on a CPU where PyTorch is), checks the
# notebook's cells parse, and that the example says in one line that it needs PyTorch where there
# is none. Ends with "N passed, M failed, K skipped"
# (common/tests/report.sh: each skip a line "SKIP  what: why", the Python tests' included).
# usage: python/tests/run.sh BUILD_DIR
set -u
dir=$1
cd "$(dirname "$0")/../.."
. common/tests/report.sh

# ARCH= keeps the objects of the fat build that `make test` has just made: only linking is left.
if make --no-print-directory lib ARCH= BUILD="$dir"; then ok "make lib"; else bad "make lib"; fi
for src in stage[0-9]*/attention.cu; do
  s=${src%/attention.cu} so="$dir/lib/lib${s}.so"
  if [ ! -f "$so" ]; then bad "$so not built"; continue; fi
  # exactly the descriptor and the entry points; the static CUDA runtime inside stays private
  got=$(nm -D --defined-only "$so" | awk '$3 !~ /^_/ { print $3 }' | sort | tr '\n' ' ')
  want="attn_lib_abi attn_lib_backward attn_lib_decode attn_lib_exit_codes attn_lib_forward attn_lib_last_error attn_lib_limits attn_lib_plan attn_lib_plan_bytes attn_this_stage "
  if [ "$got" = "$want" ]; then ok "$so exports: $got"; else bad "$so exports: '$got', want '$want'"; fi
done

if ! command -v python3 >/dev/null 2>&1; then
  skip "the binding's tests, the notebook checks and the example's: python3 not found"
else
  # the eager operator's build without torch (hidden here, whether or not it is installed): one
  # line saying so, exit 0, nothing written (make lib goes on; the binding runs its Python path)
  tmp=$(mktemp -d)
  err=$(python3 -c "import runpy, sys; sys.modules['torch'] = None
sys.argv = ['build_eager.py', '$tmp/libflashcourse_eager.so']
runpy.run_path('python/build_eager.py', run_name='__main__')" 2>&1)
  rc=$?
  if [ "$rc" -eq 0 ] && [ "$(grep -c '' <<<"$err")" -eq 1 ] && grep -q 'no torch' <<<"$err" &&
    [ -z "$(ls -A "$tmp")" ]; then
    ok "build_eager.py without torch: one line, exit 0, nothing built"
  else
    bad "build_eager.py without torch: exit $rc, output: $err"
  fi
  rm -rf "$tmp"
  # make wheel's wheel installed into a fresh venv outside the checkout: finds its own libraries.
  # It packs every library (a few seconds of deflate) while pip_install.sh builds the package: in
  # the background, its lines read into the record below (report_run), its exit code kept.
  wtmp=$(mktemp -d)
  (env -u REPORT_FILE bash python/tests/wheel.sh "$dir" >"$wtmp/out" 2>&1; echo $? >"$wtmp/rc") &
  wheel_pid=$!
  FLASHCOURSE_LIB_DIR="$dir/lib" report_run test_binding.py python3 python/tests/test_binding.py
  # pip install ./python (not -e): the installed package finds this checkout's libraries
  report_run pip_install.sh bash python/tests/pip_install.sh "$dir"
  wait "$wheel_pid"
  report_run wheel.sh bash -c 'cat "$1"; exit "$(cat "$2" 2>/dev/null || echo 1)"' wheel.sh "$wtmp/out" "$wtmp/rc"
  rm -rf "$wtmp"
  # the drop-ins against torch's SDPA (GPU; SKIP lines without one)
  FLASHCOURSE_LIB_DIR="$dir/lib" report_run test_dropins.py python3 python/tests/test_dropins.py
  # flash_attn_with_kvcache and the library's decode entry: its signature, refused keywords, the
  # ctypes mirror and the C checks anywhere (fake stages linked here); stage9_decode on a GPU
  FLASHCOURSE_LIB_DIR="$dir/lib" report_run test_kvcache.py python3 python/tests/test_kvcache.py
  # flash_attn_varlen_func and the library's packed entry: its signature, refusals, scalar checks,
  # the prototypes and the C checks anywhere (fake stages linked here); stages 5-8 on a GPU
  FLASHCOURSE_LIB_DIR="$dir/lib" report_run test_varlen.py python3 python/tests/test_varlen.py
  report_run test_ring.py python3 python/tests/test_ring.py
  # the comparison scripts (tools/compare.py, tools/compare_fa2.py) without a GPU
  report_run test_compare.py python3 python/tests/test_compare.py
  # train_gpt.py's options and checks before training without a GPU (its --sdpa-only run where
  # PyTorch is installed)
  report_run test_train_gpt.py python3 python/tests/test_train_gpt.py
  # generate.py's options, its one line without PyTorch, the libraries or a GPU, its paging helpers
  # and both greedy loops on the CPU where PyTorch is (the course's calls stood in for by PyTorch)
  report_run test_generate.py python3 python/tests/test_generate.py
  if python3 python/tests/check_notebook.py; then ok "notebook cells parse"; else bad "notebook cells parse"; fi
  if python3 python/tests/run_notebook.py --fresh; then ok "notebook: fetched by URL and by upload, re-run, one line without a GPU"; else bad "notebook as a fresh user (run_notebook.py --fresh)"; fi
  for cells in 99 2-1 x; do # a bad --cells: one line naming the notebook's cells, exit 1, no cell run
    err=$(python3 python/tests/run_notebook.py --cells "$cells" 2>&1)
    if [ $? -eq 1 ] && [ "$(grep -c '' <<<"$err")" -eq 1 ] && grep -q 'has code cells 1\.\.' <<<"$err"; then
      ok "run_notebook.py --cells $cells: one line, exit 1"
    else
      bad "run_notebook.py --cells $cells: $err"
    fi
  done
  # the example without PyTorch (hidden from the import here, whether or not it is installed):
  # one line naming it, exit 3, no traceback
  err=$(python3 -c "import runpy, sys; sys.modules['torch'] = None; sys.argv = ['transformer_block.py']
runpy.run_path('python/examples/transformer_block.py', run_name='__main__')" 2>&1 >/dev/null)
  rc=$?
  if [ "$rc" -eq 3 ] && [ "$(grep -c '' <<<"$err")" -eq 1 ] && grep -q 'needs PyTorch' <<<"$err"; then
    ok "transformer_block.py without PyTorch: one line, exit 3"
  else
    bad "transformer_block.py without PyTorch: exit $rc (want 3), stderr: $err"
  fi
fi
report_end
