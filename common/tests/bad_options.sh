#!/usr/bin/env bash
# Every bad option must give exit 2 and one line on stderr naming the problem; no GPU needed
# (options and .npy files are checked before the device is touched).
# usage: bad_options.sh BINARY FIXTURE_DIR   (fixtures from `test_common --fixtures DIR`)
set -u
bin=$1 fx=$2
passed=0 failed=0
expect() { # expect CODE PATTERN ARGS...
  local want=$1 pat=$2; shift 2
  local err; err=$("$bin" "$@" 2>&1 >/dev/null); local rc=$?
  local lines; lines=$(printf '%s' "$err" | grep -c '' || true)
  if [ "$rc" -eq "$want" ] && { [ "$want" -ne 2 ] || [ "$lines" -eq 1 ]; } && { [ -z "$pat" ] || printf '%s' "$err" | grep -qiF -- "$pat"; }; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
    echo "FAILED: $(basename "$bin") $* -> exit $rc (want $want), stderr: $err"
  fi
}
expect 2 "unknown option '--frobnicate'" --frobnicate
expect 2 "--seq: '0'" --seq 0
expect 2 "--seq: '-5'" --seq -5
expect 2 "--seq: 'abc'" --seq abc
expect 2 "--seq needs a value" --seq
expect 2 "--batch: '0'" --batch 0
expect 2 "--heads: '-1'" --heads -1
expect 2 "--dim: 96 is not supported" --dim 96
expect 2 "--dim: '0'" --dim 0
expect 2 "--batch x --heads" --batch 300 --heads 300
expect 2 "--scale: '-1'" --scale -1
expect 2 "--scale: 'nan'" --scale nan
expect 2 "--dist: 'uniform'" --dist uniform
expect 2 "--check: 'some'" --check some
expect 2 "--budget: '0'" --budget 0
expect 2 "--variant: 'nosuch'" --variant nosuch
expect 2 "--smem-limit: '100'" --smem-limit 100
expect 2 "--q: cannot open" --q "$fx/does_not_exist.npy"
expect 2 "not a .npy file" --k "$fx/notnpy.npy"
expect 2 "has 3 dimensions" --q "$fx/rank3.npy"
expect 2 "dtype <i4 not supported" --v "$fx/int32.npy"
expect 2 "shorter than its shape" --q "$fx/short.npy"
expect 2 "N (--seq) = 16, want 32" --seq 32 --q "$fx/good.npy"
expect 2 "--dim: 32 is not supported" --q "$fx/dim32.npy"
expect 2 "takes no --q" --self-test --q "$fx/good.npy"
expect 0 "" --help
echo "$(basename "$bin") bad options: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
