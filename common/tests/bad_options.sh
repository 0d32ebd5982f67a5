#!/usr/bin/env bash
# Every bad input must give its documented exit code (bad usage or file, or out of host memory)
# and one line on stderr naming the problem; no GPU needed (options, output paths and .npy files
# are checked before the device is touched).
# One line per failed check and "N passed, M failed, K skipped" last (common/tests/report.sh;
# every check, passed or not, is in its record).
# usage: bad_options.sh BINARY FIXTURE_DIR   (fixtures from `test_common --fixtures DIR`)
set -u
bin=$1 fx=$2
. "$(dirname "$0")/report.sh"
ok() { report_record_ ok "$*"; } # a pass is recorded, not printed: the failures stand out
limit=""
expect() { # expect CODE PATTERN ARGS...  (with $limit set: under that address-space limit, KiB)
  local want=$1 pat=$2; shift 2
  local err rc
  if [ -n "$limit" ]; then
    err=$(bash -c 'ulimit -v "$0" && exec "$@"' "$limit" "$bin" "$@" 2>&1 >/dev/null); rc=$?
  else
    err=$("$bin" "$@" 2>&1 >/dev/null); rc=$?
  fi
  local lines; lines=$(printf '%s' "$err" | grep -c '' || true)
  if [ "$rc" -eq "$want" ] && { [ "$want" -eq 0 ] || [ "$lines" -eq 1 ]; } && { [ -z "$pat" ] || printf '%s' "$err" | grep -qiF -- "$pat"; }; then
    ok "$(basename "$bin") $* -> exit $rc"
  else
    bad "$(basename "$bin") $* -> exit $rc (want $want), stderr: $err"
  fi
}
expect 2 "unknown option '--frobnicate'" --frobnicate
expect 2 "--seq: '0'" --seq 0
expect 2 "--seq: '-5'" --seq -5
expect 2 "--seq: 'abc'" --seq abc
expect 2 "--seq needs a value" --seq
expect 2 "--seq: '0'" --seq=0
expect 2 "--self-test runs its own shapes" --seq=16 --self-test
expect 2 "--causal takes no value" --causal=1
expect 2 "--bench-graph takes no value" --bench-graph=1
expect 2 "--causal takes no value" --caus=1
expect 2 "option '--d' is ambiguous (--dim, --dtype, --dist" --d 64
expect 2 "--layout: 'nhd' is not one of bhnd, bnhd, qkv" --layout nhd
expect 2 "--kv-heads: 3 does not divide --heads 4" --heads 4 --kv-heads 3
expect 2 "--window: '3' is not L,R" --window 3
expect 2 "--window: '3,x' is not L,R" --window 3,x
expect 2 "--window: '-2,0' is not L,R" --window -2,0
expect 2 "--window: '1,2,3' is not L,R" --window 1,2,3
expect 2 "--window needs a value" --window
expect 2 "--softcap: '-1' is not a number >= 0" --softcap -1
expect 2 "--softcap: 'nan' is not a number >= 0" --softcap nan
expect 2 "--softcap: '1e-50' is outside the float range" --softcap 1e-50
expect 2 "--self-test runs its own shapes" --self-test --window 4,4
expect 2 "--self-test runs its own shapes" --self-test --softcap 30
# --varlen: a list (each Nq or Nq:Nk) or random; the list sets B, N and N_k, random takes them
expect 2 "--varlen needs a value" --varlen
expect 2 "--varlen: '' (sequence 1) is not Nq or Nq:Nk" --varlen ""
expect 2 "--varlen: 'x' (sequence 2) is not Nq or Nq:Nk" --varlen 5,x
expect 2 "--varlen: '' (sequence 3)" --varlen 5,6,
expect 2 "--varlen: '3:' (sequence 1)" --varlen 3:
expect 2 "--varlen: '-4' (sequence 1)" --varlen -4
expect 2 "--varlen: '1:2:3' (sequence 1)" --varlen 1:2:3
expect 2 "--varlen: 'randomly' (sequence 1)" --varlen randomly
expect 2 "--varlen: more than 1073741824 query tokens in all" --varlen 1073741824,1
expect 2 "--seq: --varlen's list sets the sequences' lengths" --varlen 5,6 --seq 10
expect 2 "--seq-k: --varlen's list sets the sequences' lengths" --varlen 5,6 --seq-k 10
expect 2 "--batch: 3, but --varlen lists 2 sequences" --varlen 5,6 --batch 3
expect 2 "--layout qkv: one fused projection has as many key/value heads" --varlen 5,6:7 --layout qkv
expect 2 "--layout qkv: one fused projection has as many key/value heads" --varlen 5,6 --layout qkv --heads 4 --kv-heads 2
expect 2 "--q: a packed batch (--varlen) makes its own inputs" --varlen 16 --q "$fx/good.npy"
# the B x H limit, from its home (attention.h: ATTN_MAX_BH is ATTN_MAX_GRID_Y)
max_bh=$(sed -n 's/^#define ATTN_MAX_GRID_Y \([0-9]*\).*/\1/p' "$(dirname "$0")/../attention.h")
expect 2 "--batch x --heads: 90000 is over $max_bh (--varlen's sequences x --heads)" --varlen random --batch 300 --heads 300
expect 2 "--varlen random: these $max_bh sequences pass 1073741824 tokens in all" --varlen random --batch "$max_bh" --seq 1073741824
expect 2 "--self-test runs its own shapes" --self-test --varlen 5
expect 2 "--self-test runs its own shapes" --self-test --varlen random
expect 2 "unknown option 'extra'" --seq 16 extra
expect 2 "unknown option '-x'" -x
expect 2 "--batch: '0'" --batch 0
expect 2 "--heads: '-1'" --heads -1
# head dims: a multiple of 8 from 32 to 256 (device_info.h); one in range passes the usage
# rules, shown by the next rule's error (--kv-heads is checked after --dim), GPU or not
for d in 24 36 100 264 0 -8; do
  case $d in
    0 | -8) expect 2 "--dim: '$d'" --dim "$d" ;;
    *) expect 2 "--dim: $d is not a head dim (a multiple of 8 from 32 to 256)" --dim "$d" ;;
  esac
done
for d in 32 40 248 256; do expect 2 "--kv-heads: 3 does not divide --heads 4" --dim "$d" --heads 4 --kv-heads 3; done
expect 2 "--dim: '0'" --dim 0
expect 2 "--batch x --heads" --batch 300 --heads 300
expect 2 "--scale: '-1'" --scale -1
expect 2 "--scale: 'nan'" --scale nan
expect 2 "--scale: '1e-50' is outside the float range" --scale 1e-50
expect 2 "--scale: '1e39' is outside the float range" --scale 1e39
expect 2 "--scale: '1e-40' is outside the float range" --scale 1e-40
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
expect 2 "has N = 16, but --seq 32 was given" --seq 32 --q "$fx/good.npy"
expect 2 "good32.npy' has N = 32, but --q '$fx/good.npy' has N = 16" --q "$fx/good.npy" --k "$fx/good32.npy"
expect 2 "good.npy' has N = 16, but --k '$fx/good32.npy' has N = 32" --k "$fx/good32.npy" --v "$fx/good.npy"
expect 2 "structured dtype" --q "$fx/struct.npy"
expect 2 "file shorter than its shape says" --q "$fx/absurd.npy"
expect 2 "shape too large" --k "$fx/overflow.npy"
expect 2 "--out: cannot write '$fx/no/such/dir/o.npy'" --q "$fx/good.npy" --out "$fx/no/such/dir/o.npy"
expect 2 "--lse: '$fx' is a directory" --lse "$fx"
expect 2 "--self-test runs its own shapes" --self-test --seq 128
expect 2 "--self-test runs its own shapes" --self-test --causal
expect 2 "--self-test runs its own shapes" --self-test --dist peaky
expect 2 "has D = 24, which is not a head dim (a multiple of 8 from 32 to 256)" --q "$fx/dim24.npy"
# a file whose D is not a head dim says so, whichever file sets the shape (not "D = 100, but ...")
expect 2 "--q: '$fx/dim100.npy' has D = 100, which is not a head dim" --q "$fx/dim100.npy" --k "$fx/good.npy"
expect 2 "--q: '$fx/dim100.npy' has D = 100, which is not a head dim" --k "$fx/good.npy" --q "$fx/dim100.npy"
expect 2 "--k: '$fx/dim100.npy' has D = 100, which is not a head dim" --q "$fx/good.npy" --k "$fx/dim100.npy"
expect 2 "--v: '$fx/dim100.npy' has D = 100, which is not a head dim" --dim 64 --v "$fx/dim100.npy"
# a file of a head dim in range is read on (the next check's error: its N against --seq)
expect 2 "--q: '$fx/dim96.npy' has N = 16, but --seq 32 was given" --seq 32 --q "$fx/dim96.npy"
expect 2 "--k: '$fx/dim96.npy' has D = 96, but --q '$fx/good.npy' has D = 64" --q "$fx/good.npy" --k "$fx/dim96.npy"
expect 2 "takes no --q" --self-test --q "$fx/good.npy"
# the decode path's options (--page-size, --ragged, --new-tokens): a stage with a decode path (its
# descriptor's `decode`) checks their values before the device is touched; any other stage refuses
# them, naming the option
if "$bin" --page-size 16 2>&1 >/dev/null | grep -qF "has no decode path"; then
  expect 2 "--page-size: " --page-size 16
  expect 2 "has no decode path" --ragged
  expect 2 "--new-tokens: " --seq 4 --new-tokens 1
  expect 2 "has no decode path" --self-test --page-size 16
else
  expect 2 "--page-size: 3 is not a power of two" --page-size 3
  expect 2 "--page-size: '0' is not an integer in [1, 1024]" --page-size 0
  expect 2 "--page-size: '2048' is not an integer in [1, 1024]" --page-size 2048
  expect 2 "--page-size needs a value" --page-size
  expect 2 "--ragged takes no value" --ragged=1
  expect 2 "--new-tokens: '-1'" --new-tokens -1
  expect 2 "--new-tokens: 5 is more than --seq-k 4" --new-tokens 5 --seq-k 4
  expect 2 "--seq: 17 queries per sequence; the decode path takes 1 to 16" --ragged --seq 17
  expect 2 "--layout: the decode path lays Q and O out" --page-size 16 --layout qkv
  expect 2 "--window: the decode path takes no local window or softcap" --ragged --window 4,0
  expect 2 "--softcap: the decode path takes no local window or softcap" --ragged --softcap 30
  expect 2 "--q: the decode path" --ragged --q "$fx/good.npy"
  expect 2 "--varlen: the decode path (--page-size, --ragged, --new-tokens) takes no packed batch" --ragged --varlen 5,6
  expect 2 "--self-test runs its own shapes" --self-test --page-size 16
fi
expect 0 "" --help
help=$("$bin" --help)
for want in "B x H <= ${max_bh:-(no ATTN_MAX_GRID_Y in attention.h)}" "--dim D            head dim: a multiple of 8 from 32 to 256" "in the stage's storage type (float" "4 out of device or host memory" "--page-size P" "--window L,R" "--softcap C" "--varlen SPEC"; do
  if grep -qF -- "$want" <<<"$help"; then ok "--help says '$want'"; else bad "--help does not say '$want'"; fi
done
limit=2097152 # 2 GiB of address space: the 8 GiB of big.npy do not fit
expect 4 "out of host memory" --q "$fx/big.npy"
limit=""
report_end
