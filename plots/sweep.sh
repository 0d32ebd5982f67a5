#!/usr/bin/env bash
# sweep.sh: the main job's benchmark. Runs every stage program found in BUILD_DIR over the two
# sweeps of the course and writes one CSV: the program's columns, then `sweep` (long, fa2 or
# decode) and three of the decode sweep's (empty on the other rows): N_k and H_kv, the keys and KV
# heads the program's row does not name, and gbs, GB/s of cache read.
#
#   plots/sweep.sh BUILD_DIR OUT_CSV [--budget S] [--quick] [--stages "list"] [--sweeps "list"]
#                  [--append] [--no-sdpa]
#
#   long: B = H = 1, D = 128, non-causal, N = 1k ... 256k (262,144)
#   fa2:  B x N = 16,384 tokens, H = 2048 / D, D in {64, 128}, causal 0 and 1, N = 512 ... 16k
#   decode: only the decode stages (a program that takes --page-size: `STAGE --page-size 16
#         --help` exits 0), B = 1 and 8, H = 32 over H_kv = 8, D = 128, N_q = 1 and 4 (causal)
#         against a contiguous cache of N_k = 1k ... 256k keys; the row's N is N_q, its gbs
#         2 B N_k H_kv D x 2 bytes (fp16 K and V, each read once) / time. Then BUILD_DIR/copy_bw
#         (plots/copy_bw.cu, built by make bench): a copy's GB/s, for scale, as a row of
#         stage `copy` (no shape, its gbs only)
# (the N of each sweep, and of the quick one, come from plots/shapes.conf)
#
# Every run is `STAGE --batch B --heads H --seq N --dim D [--causal] --bench --csv --check 32
# --budget S` (decode: `--seq N_q --seq-k N_k --kv-heads 8 --layout bnhd` too, the program's
# normal path: every sequence holds all N_k keys): each row is checked before its time is kept. Within one stage's climb of a series
# (fixed D and causal) the next run's time is predicted from the last measured one, scaled by the
# work (B H N^2 D; for the long sweep that is (N_next / N_last)^2; decode: the bytes of the
# cache, B N_k H_kv D); if the prediction passes the
# budget, that N and every larger one get an over_budget row without running. An out-of-memory
# (exit 4), a run the program itself reports over budget, or a run that hangs past the guard
# ends the climb the same way. A wrong result (exit 1) is kept as a FAIL row, shouted about, and
# makes this script exit 1 at the end; an unsupported shape (exit 3) is kept and the climb goes on.
#
# Options:
#   --budget S      seconds one launch may take (default 60)
#   --quick         the quick sweep: QUICK_LONG_N and QUICK_FA2_N of plots/shapes.conf
#   --stages LIST   only these stages: names (stage3_cp_async), prefixes (stage3) or numbers (3)
#   --sweeps LIST   only these sweeps, of long, fa2 and decode (default all three)
#   --append        add the rows to OUT_CSV instead of rewriting it (under a header line of their
#                   own when its first line differs: the readers read a repeated header again)
#   --no-sdpa       do not add the PyTorch SDPA rows at the end
# Environment: SWEEP_TIMEOUT: seconds after which one run is killed as hung
#              (default 10 x budget + 300).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# The program's CSV columns, from their one home.
HEADER=$(sed -n 's/^#define CSV_HEADER "\(.*\)"$/\1/p' "$HERE/../common/csv_header.h")
[ -n "$HEADER" ] || { echo "sweep.sh: no CSV_HEADER in common/csv_header.h" >&2; exit 2; }
# The programs' exit codes (ATTN_EXIT_*), from their one home, the attn_exit enum of attention.h.
. "$HERE/../common/exit_codes.sh" || exit 2

usage() {
    sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | grep '^#' | sed 's/^# \{0,1\}//'
    exit 2
}

die() {
    echo "sweep.sh: $*" >&2
    exit 2
}

BUILD_DIR=""
OUT_CSV=""
BUDGET=60
QUICK=0
STAGES=""
SWEEPS="long fa2 decode"
APPEND=0
SDPA=1
while [ $# -gt 0 ]; do
    case "$1" in
    --budget)
        [ $# -ge 2 ] || die "--budget needs a number of seconds"
        BUDGET=$2
        shift 2
        ;;
    --budget=*) BUDGET=${1#--budget=}; shift ;;
    --quick) QUICK=1; shift ;;
    --stages)
        [ $# -ge 2 ] || die "--stages needs a list, e.g. --stages \"0 3 stage5_tuned\""
        STAGES=$2
        shift 2
        ;;
    --stages=*) STAGES=${1#--stages=}; shift ;;
    --sweeps)
        [ $# -ge 2 ] || die "--sweeps needs a list, e.g. --sweeps decode"
        SWEEPS=$2
        shift 2
        ;;
    --sweeps=*) SWEEPS=${1#--sweeps=}; shift ;;
    --append) APPEND=1; shift ;;
    --no-sdpa) SDPA=0; shift ;;
    -h | --help) usage ;;
    -*) die "unknown option '$1' (allowed: --budget S, --quick, --stages LIST, --sweeps LIST, --append, --no-sdpa)" ;;
    *)
        if [ -z "$BUILD_DIR" ]; then BUILD_DIR=$1
        elif [ -z "$OUT_CSV" ]; then OUT_CSV=$1
        else die "unexpected argument '$1' (usage: sweep.sh BUILD_DIR OUT_CSV [options])"
        fi
        shift
        ;;
    esac
done
[ -n "$BUILD_DIR" ] && [ -n "$OUT_CSV" ] || die "usage: sweep.sh BUILD_DIR OUT_CSV [--budget S] [--quick] [--stages LIST] [--no-sdpa]"
[ -d "$BUILD_DIR" ] || die "BUILD_DIR '$BUILD_DIR' is not a directory (run make build first)"
awk -v b="$BUDGET" 'BEGIN { exit !(b ~ /^[0-9]+(\.[0-9]*)?$/ && b + 0 > 0) }' ||
    die "--budget must be a positive number of seconds, got '$BUDGET'"
for sw in $SWEEPS; do
    case $sw in long | fa2 | decode) ;; *) die "--sweeps: '$sw' is not one of long, fa2, decode" ;; esac
done
[ -n "${SWEEPS// /}" ] || die "--sweeps needs at least one of long, fa2, decode"
has_sweep() { [[ " $SWEEPS " == *" $1 "* ]]; }
TIMEOUT_S=${SWEEP_TIMEOUT:-$(awk -v b="$BUDGET" 'BEGIN { printf "%d", b * 10 + 300 }')}

# ---- the stage programs: BUILD_DIR/stage<digit>*, executable files without a dot, by number
BINS=()
while IFS= read -r f; do
    [ -n "$f" ] && BINS+=("$f")
done < <(
    for f in "$BUILD_DIR"/stage[0-9]*; do
        name=${f##*/}
        [ -f "$f" ] && [ -x "$f" ] && [[ $name != *.* ]] && printf '%s\n' "$f"
    done | sort -V
)
[ ${#BINS[@]} -gt 0 ] || die "no stage programs (stage[0-9]*) in '$BUILD_DIR' (run make build first)"
# Columns the sweep adds after the program's, on every row (empty where they mean nothing).
EXTRA_COLS=N_k,H_kv,gbs

if [ -n "$STAGES" ]; then
    picked=()
    for want in $STAGES; do
        found=0
        for f in "${BINS[@]}"; do
            name=${f##*/}
            if [ "$name" = "$want" ] || [[ $name == "$want"_* ]] ||
                { [[ $want =~ ^[0-9]+$ ]] && { [ "$name" = "stage$want" ] || [[ $name == "stage${want}"_* ]]; }; }; then
                picked+=("$f")
                found=1
            fi
        done
        [ $found = 1 ] || die "--stages: no stage program matches '$want' in '$BUILD_DIR'"
    done
    # keep the sorted order, drop repeats
    sel=()
    for f in "${BINS[@]}"; do
        for p in "${picked[@]}"; do
            if [ "$f" = "$p" ]; then sel+=("$f"); break; fi
        done
    done
    BINS=("${sel[@]}")
fi

# ---- the sweeps
. "$HERE/shapes.conf"
if [ "$QUICK" = 1 ]; then
    LONG_N=$QUICK_LONG_N
    FA2_N=$QUICK_FA2_N
    DECODE_B=$QUICK_DECODE_B
    DECODE_NQ=$QUICK_DECODE_NQ
    DECODE_NK=$QUICK_DECODE_NK
fi
# The decode stages: a program that takes the decode options (its descriptor has a decode path);
# any other refuses --page-size with a usage error before --help is read.
DECODE_BINS=()
for f in "${BINS[@]}"; do
    if "$f" --page-size 16 --help >/dev/null 2>&1; then DECODE_BINS+=("$f"); fi
done
has_sweep long || LONG_N=""
has_sweep fa2 || FA2_N=""
has_sweep decode || DECODE_BINS=()
count_words() { set -- $1; echo $#; }
PER_STAGE=$(($(count_words "$LONG_N") + 4 * $(count_words "$FA2_N")))
PER_DECODE=$(($(count_words "$DECODE_B") * $(count_words "$DECODE_NQ") * $(count_words "$DECODE_NK")))
TOTAL=$((${#BINS[@]} * PER_STAGE + ${#DECODE_BINS[@]} * PER_DECODE))
WIDTH=${#TOTAL}

mkdir -p "$(dirname "$OUT_CSV")"
LOG="${OUT_CSV%.csv}.log"
if [ "$APPEND" = 1 ] && [ -s "$OUT_CSV" ]; then
    [ "$(head -n 1 "$OUT_CSV" | tr -d '\r')" = "$HEADER,sweep,$EXTRA_COLS" ] || printf '%s,sweep,%s\n' "$HEADER" "$EXTRA_COLS" >>"$OUT_CSV"
else
    printf '%s,sweep,%s\n' "$HEADER" "$EXTRA_COLS" >"$OUT_CSV"
fi
[ "$APPEND" = 1 ] || : >"$LOG"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1) || GPU_NAME=""
[ -n "$GPU_NAME" ] || GPU_NAME=unknown
declare -A DTYPE=()
HEADER_WARNED=0
FAILS=0
RUN_I=0

decode_names=""
for f in "${DECODE_BINS[@]}"; do decode_names="$decode_names ${f##*/}"; done
echo "sweep: ${#BINS[@]} stage(s) from $BUILD_DIR, $TOTAL runs, budget ${BUDGET} s per launch$([ "$QUICK" = 1 ] && echo ", quick (long N: $LONG_N; fa2 N: $FA2_N; decode B: $DECODE_B, N_q: $DECODE_NQ, N_k: $DECODE_NK)"); decode stages:${decode_names:- none}; CSV: $OUT_CSV; program output: $LOG" >&2
SWEEP_T0=$(date +%s)

# What a row of the run in hand ends with after `sweep`: the decode shape's N_k and H_kv (TAIL_NK,
# TAIL_HKV; empty for long and fa2) and its GB/s (the argument; empty for a row without a time).
row_tail() { # gbs
    printf ',%s,%s,%s' "$TAIL_NK" "$TAIL_HKV" "$1"
}
TAIL_NK=""
TAIL_HKV=""

# One line of the CSV for a run that was not made (or made no row): the known columns filled in.
# A stage with a backward pass reports two rows a run (pass bwd and fwd+bwd; its --help names
# --dq): a run not made gets both.
declare -A PASSES
for f in "${BINS[@]}"; do
    PASSES[${f##*/}]=fwd
    if "$f" --help 2>/dev/null | grep -q -- '--dq'; then PASSES[${f##*/}]="bwd fwd+bwd"; fi
done

synth_row() { # stage B H N D causal status sweep
    local pass
    for pass in ${PASSES[$1]:-fwd}; do synth_pass_row "$pass" "$@"; done
}

synth_pass_row() { # pass stage B H N D causal status sweep
    local pass=$1 stage=$2 B=$3 H=$4 N=$5 D=$6 causal=$7 status=$8 sweep=$9
    local out="" col val
    local IFS=,
    for col in $HEADER; do
        case $col in
        gpu) val=$GPU_NAME ;;
        stage) val=$stage ;;
        variant) val=default ;;
        pass) val=$pass ;;
        B) val=$B ;;
        H) val=$H ;;
        N) val=$N ;;
        D) val=$D ;;
        causal) val=$causal ;;
        dtype) val=${DTYPE[$stage]:-} ;;
        repeats | rows_checked) val=0 ;;
        status) val=$status ;;
        *) val="" ;;
        esac
        out="${out:+$out,}$val"
    done
    printf '%s,%s%s\n' "$out" "$sweep" "$(row_tail "")"
}

progress() { # stage sweep N D causal ms tflops status [note]   (decode: N is N_k, tflops GB/s)
    local c=""
    [ "$5" = 1 ] && c=causal
    local t shape
    t=$(awk -v ms="$6" -v tf="$7" -v unit="$([ "$2" = decode ] && echo 'GB/s   ' || echo TFLOP/s)" 'BEGIN {
        printf "%10s ms %8s %s", (ms == "" ? "-" : sprintf("%.3f", ms)),
            (tf == "" ? "-" : sprintf("%.1f", tf)), unit }')
    if [ "$2" = decode ]; then
        shape=$(printf 'B=%-2s N_q=%-2s N_k=%-6s' "$DEC_B" "$DEC_NQ" "$3")
    else
        shape=$(printf 'N=%-6s D=%-3s' "$3" "$4")
    fi
    printf '[%*d/%d] %-20s %-6s %s %-6s %s  %s%s\n' "$WIDTH" "$RUN_I" "$TOTAL" "$1" \
        "$2" "$shape" "$c" "$t" "$8" "${9:+  ($9)}" >&2
}

# Column of a CSV line by header name (empty if absent).
col_of() { # header line name
    awk -F, -v h="$1" -v l="$2" -v want="$3" 'BEGIN {
        n = split(h, H, ","); split(l, L, ",")
        for (i = 1; i <= n; i++) if (H[i] == want) { print L[i]; exit } }'
}

# Climb one series of one stage: run N upwards until budget / memory stop it. The decode sweep
# climbs N_k (its series: DEC_B sequences of DEC_NQ queries; N, the row's, is N_q).
climb() { # bin sweep D causal Ns...
    local bin=$1 sweep=$2 D=$3 causal=$4
    shift 4
    local stage=${bin##*/}
    local stop="" stop_note="" last_ms="" last_work="" N B H Nrow X="N" what work pred rc hdr row rows status ms tf
    if [ "$sweep" = decode ]; then X=N_k; TAIL_HKV=$DECODE_HKV; else TAIL_NK=""; TAIL_HKV=""; fi
    for N in "$@"; do
        RUN_I=$((RUN_I + 1))
        Nrow=$N
        if [ "$sweep" = long ]; then B=1; H=1
        elif [ "$sweep" = fa2 ]; then B=$((16384 / N)); H=$((2048 / D))
        else B=$DEC_B; H=$DECODE_H; Nrow=$DEC_NQ; TAIL_NK=$N
        fi
        if [ "$sweep" = decode ]; then
            what="B=$B N_q=$Nrow N_k=$N causal=$causal"
            work=$(awk -v b=$B -v n=$N -v h=$DECODE_HKV -v d=$D 'BEGIN { printf "%.17g", b * n * h * d }')
        else
            what="N=$N D=$D causal=$causal"
            work=$(awk -v b=$B -v h=$H -v n=$N -v d=$D 'BEGIN { printf "%.17g", b * h * n * n * d }')
        fi
        if [ -n "$stop" ]; then
            synth_row "$stage" $B $H $Nrow $D $causal "$stop" "$sweep" >>"$OUT_CSV"
            progress "$stage" $sweep $N $D $causal "" "" "$stop" "not run: $stop_note"
            continue
        fi
        if [ -n "$last_ms" ]; then
            pred=$(awk -v ms="$last_ms" -v w="$work" -v lw="$last_work" 'BEGIN { printf "%.6g", ms * w / lw }')
            if awk -v p="$pred" -v b="$BUDGET" 'BEGIN { exit !(p > b * 1000) }'; then
                stop=over_budget
                stop_note="predicted $(awk -v p="$pred" 'BEGIN { printf "%.2f", p / 1000 }') s at $X=$N > budget $BUDGET s"
                synth_row "$stage" $B $H $Nrow $D $causal "$stop" "$sweep" >>"$OUT_CSV"
                progress "$stage" $sweep $N $D $causal "" "" "$stop" "not run: $stop_note"
                continue
            fi
        fi

        local args=(--batch $B --heads $H --seq $Nrow --dim $D)
        [ "$sweep" = decode ] && args+=(--kv-heads $DECODE_HKV --seq-k $N --layout bnhd)
        [ "$causal" = 1 ] && args+=(--causal)
        args+=(--bench --csv --check 32 --budget "$BUDGET")
        printf '\n== %s %s\n' "$bin" "${args[*]}" >>"$LOG"
        rc=0
        if command -v timeout >/dev/null 2>&1; then
            timeout --kill-after=10 "$TIMEOUT_S" "$bin" "${args[@]}" >"$TMP/out" 2>>"$LOG" || rc=$?
        else
            "$bin" "${args[@]}" >"$TMP/out" 2>>"$LOG" || rc=$?
        fi
        cat "$TMP/out" >>"$LOG"
        hdr=$(grep -m 1 '^gpu,' "$TMP/out" || true)
        row=""
        if [ -n "$hdr" ]; then
            # every row after the header (one per pass); the last one's time drives the climb
            rows=$(awk 'f && NF { print } /^gpu,/ { f = 1 }' "$TMP/out" | tr -d '\r')
            row=$(printf '%s\n' "$rows" | tail -n 1)
            if [ "$hdr" != "$HEADER" ] && [ $HEADER_WARNED = 0 ]; then
                echo "sweep.sh: WARNING: $stage's CSV header differs from the one this script writes:" >&2
                echo "  program: $hdr" >&2
                echo "  sweep:   $HEADER" >&2
                HEADER_WARNED=1
            fi
        fi
        status=""
        [ -n "$row" ] && status=$(col_of "$hdr" "$row" status)
        local note=""
        if [ $rc = 124 ] || [ $rc = 137 ]; then
            # killed by the guard: a hang is a failure, and the larger N would hang too
            status=FAIL
            row=""
            note="killed after ${TIMEOUT_S} s"
            stop=FAIL
            stop_note="$X=$N hung"
        elif [ -z "$status" ]; then
            case $rc in
            "$ATTN_EXIT_PASS") status=FAIL; note="exit $rc (pass) but no CSV row" ;;
            "$ATTN_EXIT_WRONG") status=FAIL ;;
            "$ATTN_EXIT_UNSUPPORTED") status=unsupported ;;
            "$ATTN_EXIT_OOM") status=OOM ;;
            *) status=FAIL; note="exit code $rc" ;;
            esac
            row=""
        elif [ "$rc" != "$ATTN_EXIT_PASS" ] && [ "$rc" != "$ATTN_EXIT_WRONG" ] &&
            [ "$rc" != "$ATTN_EXIT_UNSUPPORTED" ] && [ "$rc" != "$ATTN_EXIT_OOM" ]; then
            note="exit code $rc"
            status=FAIL
            row=""
        fi
        if [ -n "$row" ]; then
            local gpu dt
            gpu=$(col_of "$hdr" "$row" gpu)
            dt=$(col_of "$hdr" "$row" dtype)
            if [ "$gpu" = none ]; then
                echo "sweep.sh: $stage sees no CUDA device (its message is in $LOG); stopping" >&2
                tail -n 3 "$LOG" | sed 's/^/    /' >&2
                exit 2
            fi
            [ -n "$gpu" ] && GPU_NAME=$gpu
            [ -n "$dt" ] && DTYPE[$stage]=$dt
            ms=$(col_of "$hdr" "$row" ms_median)
            tf=$(col_of "$hdr" "$row" tflops)
            local gbs=""
            if [ "$sweep" = decode ]; then
                # GB/s of cache read: K and V, B N_k H_kv D elements each, read once
                gbs=$(awk -v ms="$ms" -v b=$B -v n=$N -v h=$DECODE_HKV -v d=$D -v dt="${dt:-f16}" 'BEGIN {
                    if (ms + 0 > 0) printf "%.1f", 2 * b * n * h * d * (dt == "f32" ? 4 : 2) / ms / 1e6 }')
                tf=$gbs
            fi
            printf '%s\n' "$rows" | while IFS= read -r r; do
                printf '%s,%s%s\n' "$r" "$sweep" "$(row_tail "$gbs")"
            done >>"$OUT_CSV"
        else
            synth_row "$stage" $B $H $Nrow $D $causal "$status" "$sweep" >>"$OUT_CSV"
            ms=""
            tf=""
        fi
        progress "$stage" $sweep $N $D $causal "$ms" "$tf" "$status" "$note"

        case $status in
        FAIL)
            FAILS=$((FAILS + 1))
            echo "FAIL: $stage $sweep $what: wrong result or crash${note:+ ($note)}; see $LOG; reproduce: $bin ${args[*]}" >&2
            tail -n 5 "$LOG" | sed 's/^/    /' >&2
            ;;
        OOM)
            stop=OOM
            stop_note="out of memory at $X=$N"
            ;;
        over_budget)
            stop=over_budget
            stop_note="$X=$N took over $BUDGET s"
            ;;
        esac
        if [ "$status" = ok ] && [ -n "$ms" ]; then
            last_ms=$ms
            last_work=$work
        fi
    done
}

for sweep in long fa2; do
    has_sweep $sweep || continue
    for bin in "${BINS[@]}"; do
        if [ $sweep = long ]; then
            climb "$bin" long 128 0 $LONG_N
        else
            for D in 64 128; do
                for causal in 0 1; do
                    climb "$bin" fa2 $D $causal $FA2_N
                done
            done
        fi
    done
done

# ---- decode: the decode stages, then the copy roof
DEC_B=""
DEC_NQ=""
for bin in "${DECODE_BINS[@]}"; do
    for DEC_B in $DECODE_B; do
        for DEC_NQ in $DECODE_NQ; do
            climb "$bin" decode "$DECODE_D" $((DEC_NQ > 1 ? 1 : 0)) $DECODE_NK
        done
    done
done
TAIL_NK=""
TAIL_HKV=""
# One row of stage `copy`: BUILD_DIR/copy_bw's median time and GB/s (bytes read + written / time),
# no shape. copy_bw prints "ms_median ms_min repeats gbs device_mb" on stdout.
copy_row() { # ms_median ms_min repeats gbs device_mb status
    local out="" col val
    local IFS=,
    for col in $HEADER; do
        case $col in
        gpu) val=$GPU_NAME ;;
        stage) val=copy ;;
        variant) val=default ;;
        pass) val=fwd ;;
        ms_median) val=$1 ;;
        ms_min) val=$2 ;;
        repeats) val=$3 ;;
        rows_checked) val=0 ;;
        device_mb) val=$5 ;;
        status) val=$6 ;;
        *) val="" ;;
        esac
        out="${out:+$out,}$val"
    done
    printf '%s,decode,,,%s\n' "$out" "$4"
}
if [ ${#DECODE_BINS[@]} -gt 0 ]; then
    if [ -x "$BUILD_DIR/copy_bw" ]; then
        printf '\n== %s\n' "$BUILD_DIR/copy_bw" >>"$LOG"
        rc=0
        copy_out=$("$BUILD_DIR/copy_bw" 2>>"$LOG") || rc=$?
        printf '%s\n' "$copy_out" >>"$LOG"
        read -r c_ms c_min c_reps c_gbs c_mb _ <<<"$copy_out" || true
        if [ $rc = 0 ] && awk -v g="${c_gbs:-}" 'BEGIN { exit !(g + 0 > 0) }'; then
            copy_row "$c_ms" "$c_min" "$c_reps" "$c_gbs" "$c_mb" ok >>"$OUT_CSV"
            echo "copy roof: $c_gbs GB/s ($BUILD_DIR/copy_bw: $c_ms ms a copy)" >&2
        else
            echo "sweep.sh: WARNING: $BUILD_DIR/copy_bw failed (exit $rc; see $LOG): no copy roof in the CSV" >&2
        fi
    else
        echo "sweep.sh: no $BUILD_DIR/copy_bw (make bench builds it from plots/copy_bw.cu): no copy roof in the CSV" >&2
    fi
fi

# ---- summary
awk -F, '
function isnum(s) { return s ~ /^[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?$/ }
$1 == "gpu" && $2 == "stage" { delete c; for (i = 1; i <= NF; i++) c[$i] = i; next }
{
    st = $c["status"]; count[st]++
    if ($c["sweep"] != "long") next
    k = $c["stage"]; n = $c["N"] + 0
    if (!(k in seen)) { seen[k] = 1; keys[++nk] = k }
    if (!(n in seenN)) { seenN[n] = 1; Ns[++nn] = n }
    S[k, n] = st
    if (st == "ok" && isnum($c["ms_median"])) T[k, n] = $c["ms_median"] + 0
}
function best(n,    i, b) {
    b = ""
    for (i = 1; i <= nk; i++) if ((keys[i], n) in T && (b == "" || T[keys[i], n] < T[b, n])) b = keys[i]
    return b
}
END {
    for (i = 2; i <= nn; i++) { t = Ns[i]; for (j = i - 1; j >= 1 && Ns[j] > t; j--) Ns[j + 1] = Ns[j]; Ns[j + 1] = t }
    for (i = 1; i <= nk; i++) { if (keys[i] ~ /^stage0/ && s0 == "") s0 = keys[i]; if (keys[i] ~ /^stage1/ && s1 == "") s1 = keys[i] }
    print "---- summary"
    common = ""
    for (j = nn; j >= 1 && common == ""; j--) {
        all = 1
        for (i = 1; i <= nk; i++) if (!((keys[i], Ns[j]) in T)) all = 0
        if (all) common = Ns[j]
    }
    if (common != "") {
        b = best(common)
        printf "fastest stage at N=%d (the largest N every stage measured, long sweep): %s, %.3f ms\n", common, b, T[b, common]
    } else {
        for (j = nn; j >= 1; j--) if (best(Ns[j]) != "") break
        if (j >= 1) printf "no N was measured by every stage; at N=%d (the largest measured) the fastest is %s, %.3f ms\n", Ns[j], best(Ns[j]), T[best(Ns[j]), Ns[j]]
        else print "no long-sweep times measured"
    }
    if (s0 == "") print "stage 0: not in this sweep"
    else {
        oom = ""
        for (j = 1; j <= nn; j++) if (S[s0, Ns[j]] == "OOM") { oom = Ns[j]; break }
        if (oom != "") printf "%s ran out of device memory from N=%d (long sweep)\n", s0, oom
        else printf "%s never ran out of device memory in the long sweep\n", s0
    }
    n = 16384
    b = best(n)
    if (b == "") print "N=16384 (long): no stage measured"
    else {
        line = sprintf("N=16384 (long): best %s %.3f ms", b, T[b, n])
        if (s0 != "") line = line (((s0, n) in T) ? sprintf("; %.1fx over %s (%.3f ms)", T[s0, n] / T[b, n], s0, T[s0, n]) : sprintf("; %s has no time (%s)", s0, ((s0, n) in S) ? S[s0, n] : "not run"))
        if (s1 != "") line = line (((s1, n) in T) ? sprintf("; %.1fx over %s (%.3f ms)", T[s1, n] / T[b, n], s1, T[s1, n]) : sprintf("; %s has no time (%s)", s1, ((s1, n) in S) ? S[s1, n] : "not run"))
        print line
    }
    split("ok FAIL OOM over_budget unsupported", order, " ")
    line = "rows:"
    for (i = 1; i <= 5; i++) { line = line sprintf(" %s %d", order[i], count[order[i]] + 0); done[order[i]] = 1 }
    for (s in count) if (!(s in done)) line = line sprintf(" %s %d", s, count[s])
    print line
}' "$OUT_CSV" >&2

# the decode sweep: each decode stage's GB/s at the largest N_k it measured, per (B, N_q), and the
# share of the copy roof it reaches
awk -F, '
$1 == "gpu" && $2 == "stage" { delete c; for (i = 1; i <= NF; i++) c[$i] = i; next }
!("gbs" in c) || $c["sweep"] != "decode" || $c["status"] != "ok" || $c["gbs"] == "" { next }
$c["stage"] == "copy" { roof = $c["gbs"] + 0; next }
{
    k = $c["stage"] " B=" $c["B"] " N_q=" $c["N"]
    if (!(k in nk)) order[++n] = k
    if ($c["N_k"] + 0 >= nk[k] + 0) { nk[k] = $c["N_k"] + 0; g[k] = $c["gbs"] + 0 }
}
END {
    for (i = 1; i <= n; i++)
        printf "decode %s N_k=%d: %.0f GB/s%s\n", order[i], nk[order[i]], g[order[i]],
            (roof > 0) ? sprintf(" (%.0f%% of the copy roof, %.0f GB/s)", 100 * g[order[i]] / roof, roof) : ""
}' "$OUT_CSV" >&2

# ---- PyTorch SDPA baseline rows
if [ "$SDPA" = 1 ]; then
    if python3 -c 'import torch; assert torch.cuda.is_available()' >/dev/null 2>&1; then
        sdpa_args=("$OUT_CSV" --budget "$BUDGET" --sweeps "$SWEEPS")
        [ "$QUICK" = 1 ] && sdpa_args+=(--quick)
        if python3 "$HERE/sdpa_baseline.py" "${sdpa_args[@]}"; then
            awk -F, '
            $1 == "gpu" && $2 == "stage" { delete c; for (i = 1; i <= NF; i++) c[$i] = i; next }
            $c["sweep"] == "fa2" && $c["D"] == 128 && $c["N"] == 16384 && $c["status"] == "ok" {
                k = $c["stage"] SUBSEP $c["causal"]; tf[k] = $c["tflops"] + 0
                if ($c["stage"] ~ /^stage[0-9]/ && tf[k] > best[$c["causal"]] + 0) { best[$c["causal"]] = tf[k]; who[$c["causal"]] = $c["stage"] }
            }
            END {
                for (cz = 0; cz <= 1; cz++) {
                    f = tf["sdpa_flash" SUBSEP cz]
                    if (f > 0 && who[cz] != "")
                        printf "fa2 D=128 N=16384%s: best %s %.1f TFLOP/s = %.2f x FA2 (sdpa_flash %.1f TFLOP/s)\n", cz ? " causal" : "", who[cz], best[cz], best[cz] / f, f
                }
            }' "$OUT_CSV" >&2
        else
            echo "sweep.sh: WARNING: plots/sdpa_baseline.py failed; the CSV has no (or partial) SDPA rows" >&2
        fi
    else
        echo "SDPA baseline skipped: python3 with torch and CUDA not found" >&2
    fi
fi

echo "sweep: done in $(($(date +%s) - SWEEP_T0)) s ($TOTAL stage runs$([ "$SDPA" = 1 ] && echo ' and the SDPA rows'))" >&2
if [ $FAILS -gt 0 ]; then
    echo "FAIL: $FAILS run(s) gave a wrong result or crashed (status FAIL in $OUT_CSV); see $LOG" >&2
    exit 1
fi
exit 0
