#!/usr/bin/env bash
# fake_stage.sh: stands in for a stage program in plots/tests/run.sh (no GPU needed). Copied into
# a scratch build folder as stageN_fake; it reads its behaviour from the file beside it,
# stageN_fake.conf (a name with a dot, so sweep.sh does not take it for a stage), logs each call,
# and prints the program's CSV header and one row, with the program's exit codes.
#
# conf variables:
#   A=1          ms of one launch at B = H = 1, N = 1024, D = 128
#   EXP=2        time grows as B H D (N / 1024)^EXP
#   OOM_ELEMS=   out of memory (exit 4) when B H N^2 > OOM_ELEMS
#   FAIL_N=      wrong result (exit 1) at this N
#   UNSUP_D=     with --causal, unsupported (exit 3) at this D
#   NOGPU=       1: behave like the program on a machine without a CUDA device
#   DECODE=      1: a decode stage: takes --page-size (and `--page-size P --help` exits 0, as a
#                decode stage's program does; another refuses --page-size with a usage error);
#                a call with --seq-k takes DA ms per 1,048,576 keys of the cache (B N_k), and
#                is out of memory when B N_k > DOOM_KEYS
#   LOG=         file that gets one line per call: "name N D causal B H N_k H_kv layout"
set -euo pipefail

name=${0##*/}
A=1
EXP=2
OOM_ELEMS=
FAIL_N=
UNSUP_D=
NOGPU=
DECODE=
DA=1
DOOM_KEYS=
LOG=/dev/null
[ -f "$0.conf" ] && . "$0.conf"
# the program's exit codes (ATTN_EXIT_*), from their one home
. "${FAKE_REPO:-.}/common/exit_codes.sh"

B=1 H=1 N=0 D=0 causal=0 budget=60 Nk="" Hkv="" layout=bhnd
while [ $# -gt 0 ]; do
    case "$1" in
    --page-size)
        [ -n "$DECODE" ] || { echo "$name: error: --page-size: $name has no decode path" >&2; exit "$ATTN_EXIT_USAGE"; }
        shift 2
        ;;
    --help) echo "usage: $name [options]"; exit "$ATTN_EXIT_PASS" ;;
    --seq-k) Nk=$2; shift 2 ;;
    --kv-heads) Hkv=$2; shift 2 ;;
    --layout) layout=$2; shift 2 ;;
    --batch) B=$2; shift 2 ;;
    --heads) H=$2; shift 2 ;;
    --seq) N=$2; shift 2 ;;
    --dim) D=$2; shift 2 ;;
    --causal) causal=1; shift ;;
    --budget) budget=$2; shift 2 ;;
    --check) shift 2 ;;
    --bench | --csv) shift ;;
    *) echo "$name: bad option $1" >&2; exit "$ATTN_EXIT_USAGE" ;;
    esac
done
echo "$name $N $D $causal $B $H ${Nk:--} ${Hkv:--} $layout" >>"$LOG"

# the program's header, from its one home
sed -n 's/^#define CSV_HEADER "\(.*\)"$/\1/p' "${FAKE_REPO:-.}/common/csv_header.h"
if [ -n "$NOGPU" ]; then
    echo "$name: no CUDA device here" >&2
    echo "none,$name,default,fwd,$B,$H,$N,$D,$causal,f16,,,,,,,,0,0.0,unsupported"
    exit "$ATTN_EXIT_UNSUPPORTED"
fi
shape="Fake GPU,$name,default,fwd,$B,$H,$N,$D,$causal,f16"
if [ -n "$Nk" ]; then # a decode shape: N_q = N queries against N_k keys
    if [ -n "$DOOM_KEYS" ] && [ $((B * Nk)) -gt "$DOOM_KEYS" ]; then
        echo "$shape,,,0,,,,,0,,OOM"
        exit "$ATTN_EXIT_OOM"
    fi
    ms=$(awk -v a=$DA -v b=$B -v n=$Nk 'BEGIN { printf "%.4f", a * b * n / 1048576 }')
    tf=$(awk -v ms=$ms -v b=$B -v h=$H -v q=$N -v n=$Nk -v d=$D 'BEGIN { printf "%.3f", 4 * b * h * q * n * d / (ms * 1e9) }')
    echo "$shape,$ms,$ms,10,$tf,1.0e-04,2.0e-04,1.0e-05,32,1.0,ok"
    exit "$ATTN_EXIT_PASS"
fi
if [ -n "$OOM_ELEMS" ] && awk -v b=$B -v h=$H -v n=$N -v m=$OOM_ELEMS 'BEGIN { exit !(b * h * n * n > m) }'; then
    echo "$shape,,,0,,,,,0,,OOM"
    echo "$name: out of device memory" >&2
    exit "$ATTN_EXIT_OOM"
fi
if [ -n "$UNSUP_D" ] && [ $causal = 1 ] && [ "$D" = "$UNSUP_D" ]; then
    echo "$shape,,,0,,,,,0,,unsupported"
    exit "$ATTN_EXIT_UNSUPPORTED"
fi
if [ "$N" = "$FAIL_N" ]; then
    echo "$shape,,,0,,,,,32,,FAIL"
    echo "$name: row 7: max abs error 0.5 > bound" >&2
    exit "$ATTN_EXIT_WRONG"
fi
ms=$(awk -v a=$A -v e=$EXP -v b=$B -v h=$H -v n=$N -v d=$D 'BEGIN { printf "%.4f", a * b * h * (n / 1024) ^ e * d / 128 }')
tf=$(awk -v ms=$ms -v b=$B -v h=$H -v n=$N -v d=$D -v c=$causal 'BEGIN { printf "%.2f", 4 * b * h * n * n * d / (c ? 2 : 1) / (ms * 1e9) }')
if awk -v ms=$ms -v s=$budget 'BEGIN { exit !(ms > s * 1000) }'; then
    echo "$shape,$ms,$ms,1,$tf,,,,0,1.0,over_budget"
    exit "$ATTN_EXIT_PASS"
fi
echo "$shape,$ms,$ms,10,$tf,1.0e-04,2.0e-04,1.0e-05,32,1.0,ok"
