#!/usr/bin/env bash
# plots/tests/run.sh: CPU tests of the main job's scripts (no GPU): tables, README update,
# plots, make targets, and the sweep's budget / out-of-memory / failure logic with fake stages.
# Prints one line per check and `N passed, M failed, K skipped` last (common/tests/report.sh);
# exits 1 if any failed.
# A check that cannot run here (gnuplot missing) prints "SKIP  what: why", one line each, and
# counts as skipped, so the three numbers add up to the same total everywhere.
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 2
T=plots/tests
. common/tests/report.sh
SCRATCH=$(mktemp -d)
trap 'rm -rf "$SCRATCH"; report_cleanup' EXIT

check() { # description command...
    local what=$1
    shift
    if "$@" >"$SCRATCH/check.out" 2>&1; then ok "$what"; else
        bad "$what"
        sed 's/^/      /' "$SCRATCH/check.out" | head -n 20
    fi
}

# ---- table.awk: the fixture's tables, exactly
awk -F, -f plots/csv.awk -f plots/table.awk $T/fixture.csv >"$SCRATCH/tables.md" 2>&1
check "table.awk output matches $T/expected_tables.md" diff -u $T/expected_tables.md "$SCRATCH/tables.md"
{ awk -F, -v sweep=long -f plots/csv.awk -f plots/table.awk $T/fixture.csv; echo; awk -F, -v sweep=fa2 -f plots/csv.awk -f plots/table.awk $T/fixture.csv; } >"$SCRATCH/split.md"
check "table.awk sweep=long + sweep=fa2 == both" diff -u "$SCRATCH/tables.md" "$SCRATCH/split.md"
# the same rows in another order give the same tables (no dependence on awk's array order)
{ head -n 1 $T/fixture.csv; tail -n +2 $T/fixture.csv | grep -v ',stage3_cp_async,default,1,1,1024,' | sort -r; grep ',stage3_cp_async,default,1,1,1024,' $T/fixture.csv; } >"$SCRATCH/shuffled.csv"
awk -F, -f plots/csv.awk -f plots/table.awk "$SCRATCH/shuffled.csv" >"$SCRATCH/tables2.md"
check "table.awk: row order does not change the tables" diff -u $T/expected_tables.md "$SCRATCH/tables2.md"

# ---- update_readme.sh
cp $T/README.fixture.md "$SCRATCH/README.md"
if plots/update_readme.sh $T/fixture.csv "$SCRATCH/README.md" >"$SCRATCH/u.out" 2>&1; then
    ok "update_readme.sh runs"
else
    bad "update_readme.sh runs"
    sed 's/^/      /' "$SCRATCH/u.out"
fi
# outside the markers: byte-identical (drop what lies between the markers in both, compare)
strip_between() {
    awk '/^<!-- results:(long|fa2):begin -->$/ { print; s = 1; next }
         /^<!-- results:(long|fa2):end -->$/ { s = 0 } !s' "$1"
}
check "update_readme.sh leaves the rest byte-identical" \
    cmp <(strip_between $T/README.fixture.md; tail -c 1 $T/README.fixture.md | od -c) \
        <(strip_between "$SCRATCH/README.md"; tail -c 1 "$SCRATCH/README.md" | od -c)
check "update_readme.sh put the long table in" grep -q -F '| 32,768 | OOM | 830.1 | 31.20 |' "$SCRATCH/README.md"
check "update_readme.sh put the fa2 tables in" grep -q -F '**D = 128, causal**' "$SCRATCH/README.md"
check "update_readme.sh names the GPU and the CSV" \
    grep -q -F "Measured on NVIDIA H100 80GB HBM3; from \`$T/fixture.csv\`" "$SCRATCH/README.md"
# a backward section and a backward stage's lesson: the rows of pass bwd (the fixture, in the
# program's header with its pass column, plus a backward stage's and FA2's bwd rows)
awk -F, -v OFS=, 'NR == 1 { $3 = $3 ",pass"; print; next } { $3 = $3 ",fwd"; print }' $T/fixture.csv >"$SCRATCH/bwd.csv"
cat >>"$SCRATCH/bwd.csv" <<'ROWS'
NVIDIA H100 80GB HBM3,stage7_backward,default,bwd,1,1,1024,128,0,f16,0.2000,0.1900,12,26.84,1e-05,1e-04,1e-06,32,10.0,ok,long
NVIDIA H100 80GB HBM3,stage7_backward,default,fwd+bwd,1,1,1024,128,0,f16,0.2300,0.2200,12,32.68,1e-05,1e-04,1e-06,32,10.0,ok,long
NVIDIA H100 80GB HBM3,sdpa_flash,default,bwd,1,1,1024,128,0,f16,0.2500,0.2400,12,21.47,,,,0,10.0,ok,long
ROWS
printf '# t\n\n<!-- results:backward:begin -->\n<!-- results:backward:end -->\n' >"$SCRATCH/README.bwd.md"
printf '# t\n\n<!-- results:stage7:begin -->\n<!-- results:stage7:end -->\n' >"$SCRATCH/README.s7.md"
plots/update_readme.sh "$SCRATCH/bwd.csv" "$SCRATCH/README.bwd.md" "$SCRATCH/README.s7.md" >/dev/null 2>&1
check "update_readme.sh's backward section: the bwd rows, named as a backward time" \
    grep -q -F '| 1,024 | 0.200 | 0.250 |' "$SCRATCH/README.bwd.md"
check "the backward section's last column: FA2 time / best stage time (0.25 / 0.20), no stage 0 or 1 to compare" \
    grep -q -F '| 1,024 | 0.200 | 0.250 | stage7_backward 1.25 |' "$SCRATCH/README.bwd.md"
check "update_readme.sh's backward section says it times the backward" \
    grep -q '^Backward time in ms' "$SCRATCH/README.bwd.md"
check "a backward stage's lesson shows its bwd rows beside FA2's" \
    grep -q -F '| 1,024 | 0.200 |' "$SCRATCH/README.s7.md"
check "a backward stage's lesson: no forward row of another stage in it" \
    bash -c "! grep -q 'stage 6' '$SCRATCH/README.s7.md'"
# a GPU without FA2 (a T4): the fa2 tables compare with the memory-efficient kernel and say so
awk -F, -v OFS=, '$2 == "sdpa_flash" { $13 = ""; $10 = ""; $11 = ""; $19 = "unsupported" } { print }
                  $2 == "sdpa_flash" { $2 = "sdpa_mem_efficient"; $13 = 100; $10 = 1; $11 = 1; $19 = "ok"; print }' \
    $T/fixture.csv >"$SCRATCH/t4.csv"
awk -F, -v sweep=fa2 -f $T/../csv.awk -f $T/../table.awk "$SCRATCH/t4.csv" >"$SCRATCH/t4.md"
check "fa2 tables without FA2 compare the best stage with the memory-efficient kernel, saying so" \
    grep -q -F 'best stage / memory-efficient SDPA (no FA2 on this GPU)' "$SCRATCH/t4.md"
check "fa2 tables without FA2: FA2's cells say n/a" grep -q -F '| n/a |' "$SCRATCH/t4.md"
awk -F, -v lesson=3 -f $T/../csv.awk -f $T/../table.awk "$SCRATCH/t4.csv" >"$SCRATCH/t4l.md"
check "a lesson without FA2 compares with the memory-efficient kernel" \
    grep -q -F '| memory-efficient SDPA ms | memory-efficient SDPA time / stage 3 time |' "$SCRATCH/t4l.md"
awk -F, -v summary=1 -f $T/../csv.awk -f $T/../table.awk "$SCRATCH/t4.csv" >"$SCRATCH/t4s.md"
check "the summary without FA2 compares with the memory-efficient kernel, saying so" \
    grep -q -F 'memory-efficient SDPA (no FA2 on this GPU) time / stage time' "$SCRATCH/t4s.md"
check "fa2 tables with FA2 keep comparing with FA2" bash -c "awk -F, -v sweep=fa2 -f $T/../csv.awk -f $T/../table.awk $T/fixture.csv | grep -q -F '| best stage / FA2 |'"
cp "$SCRATCH/README.md" "$SCRATCH/README.once"
plots/update_readme.sh $T/fixture.csv "$SCRATCH/README.md" >/dev/null 2>&1
check "update_readme.sh is idempotent" cmp "$SCRATCH/README.once" "$SCRATCH/README.md"
grep -v 'results:fa2:end' $T/README.fixture.md >"$SCRATCH/README.bad"
cp "$SCRATCH/README.bad" "$SCRATCH/README.bad.orig"
if plots/update_readme.sh $T/fixture.csv "$SCRATCH/README.bad" >"$SCRATCH/u.out" 2>&1; then
    bad "update_readme.sh fails when a marker is missing"
elif grep -q 'results:fa2:end' "$SCRATCH/u.out" && cmp -s "$SCRATCH/README.bad" "$SCRATCH/README.bad.orig"; then
    ok "update_readme.sh fails clearly when a marker is missing, and writes nothing"
else
    bad "update_readme.sh's missing-marker message"
    sed 's/^/      /' "$SCRATCH/u.out"
fi

# ---- a lesson's measured section (table.awk lesson=K), between its own markers
awk -F, -v lesson=3 -f plots/csv.awk -f plots/table.awk $T/fixture.csv >"$SCRATCH/lesson3.md" 2>&1
check "table.awk lesson=3 matches $T/expected_lesson3.md (previous stage: the nearest one measured)" \
    diff -u $T/expected_lesson3.md "$SCRATCH/lesson3.md"
printf '# Stage 3\n\nProse stays.\n\n<!-- results:stage3:begin -->\nold\n<!-- results:stage3:end -->\n\nMore prose.\n' \
    >"$SCRATCH/lesson.md"
plots/update_readme.sh $T/fixture.csv "$SCRATCH/lesson.md" >/dev/null 2>&1
check "update_readme.sh writes a lesson's section (stageK markers), the rest untouched" \
    cmp "$SCRATCH/lesson.md" <(printf '# Stage 3\n\nProse stays.\n\n<!-- results:stage3:begin -->\n\n'
        printf 'Measured on NVIDIA H100 80GB HBM3; from `%s` (regenerate: `make bench tables`).\n\n' $T/fixture.csv
        cat $T/expected_lesson3.md; printf '\n<!-- results:stage3:end -->\n\nMore prose.\n')
# ---- the summary (table.awk summary=1): fixture stage 3 at N = 1024, non-causal 77.64 and 84.04
# TFLOP/s; FA2 time / stage 3 time 0.237, 0.245 and 0.245 (its causal D = 64 row is unsupported)
printf 'Prose.\n<!-- results:summary:begin -->\nold\n<!-- results:summary:end -->\nMore.\n' >"$SCRATCH/summary.md"
plots/update_readme.sh $T/fixture.csv "$SCRATCH/summary.md" >/dev/null 2>&1
check "update_readme.sh writes the summary table (summary markers): stage 3's row" \
    grep -q -x -F '| stage3_cp_async | 77.6-84.0 | 0.24 (lowest 0.24; faster on 0 of 3) | 0.18 (lowest 0.17; faster on 0 of 3) |' \
    "$SCRATCH/summary.md"
# its closing line counts every row of the CSV (every pass), as grep counts them
rows=$(grep -v -c -e '^gpu,' -e '^$' $T/fixture.csv)
stage_rows=$(grep -c '^[^,]*,stage[0-9]' $T/fixture.csv)
check "the summary's closing line: the CSV's rows counted ($rows, $stage_rows of the stages)" \
    grep -q -x "The CSV: $rows rows (every pass): $stage_rows of the course's stages (28 ok, 1 FAIL, 4 OOM, 1 unsupported, 1 over_budget), $((rows - stage_rows)) of PyTorch's SDPA; 1 failed its check." \
    "$SCRATCH/summary.md"
check "update_readme.sh: the summary keeps the prose around it" \
    [ "$(head -n 1 "$SCRATCH/summary.md")" = "Prose." -a "$(tail -n 1 "$SCRATCH/summary.md")" = "More." ]
printf 'no markers here\n' >"$SCRATCH/nomark.md"
plots/update_readme.sh $T/fixture.csv "$SCRATCH/nomark.md" >"$SCRATCH/u.out" 2>&1
check "update_readme.sh: a README without markers is an error" \
    [ $? = 1 -a -n "$(grep 'holds no results markers' "$SCRATCH/u.out")" ]
printf '<!-- results:stage3:begin -->\n<!-- results:long:begin -->\n<!-- results:long:end -->\n<!-- results:stage3:end -->\n' \
    >"$SCRATCH/nested.md"
cp "$SCRATCH/nested.md" "$SCRATCH/nested.orig"
plots/update_readme.sh $T/fixture.csv "$SCRATCH/nested.md" >"$SCRATCH/u.out" 2>&1
check "update_readme.sh: nested marker pairs are an error, nothing written" \
    [ $? = 1 -a -n "$(grep 'inside another' "$SCRATCH/u.out")" -a "$(cat "$SCRATCH/nested.md")" = "$(cat "$SCRATCH/nested.orig")" ]

# ---- the decode sweep's table (decode.awk), alone and among the other sweeps' rows
DF=$T/decode_fixture.csv
cat $T/fixture.csv $DF >"$SCRATCH/both.csv" # two headers: csv.awk reads the second one again
awk -F, -f plots/csv.awk -f plots/decode.awk $DF >"$SCRATCH/decode.md"
check "decode.awk: a row per (B, N_q, N_k), GB/s and the share of the HBM's 3.35 TB/s, best stage / better of FA2, cuDNN" \
    grep -q -x -F '| 1 | 1 | 32,768 | 2556 (76%) | 2270 (68%) | 2461 (73%) | 1.04x |' "$SCRATCH/decode.md"
check "decode.awk: 16 rows (2 B x 2 N_q x 4 N_k), the columns stage, FA2, cuDNN" \
    bash -c "[ \$(grep -c '^| [18] | [14] | ' '$SCRATCH/decode.md') = 16 ] &&
             grep -q -x -F '| B | N_q | N_k | stage9_decode | FA2 (sdpa_flash) | cuDNN (sdpa_cudnn) | best stage / best of FA2, cuDNN |' '$SCRATCH/decode.md'"
check "decode.awk: cells without a number say why (OOM, n/a), no ratio there" \
    grep -q -x -F '| 8 | 4 | 262,144 | OOM | n/a | 1472 (44%) | - |' "$SCRATCH/decode.md"
check "decode.awk names the copy kernel of the same run, as a copy" \
    grep -q -F 'A copy kernel of the same run, which writes what it reads (decode only reads, and can pass it): 3068 GB/s (92%).' "$SCRATCH/decode.md"
awk -F, -f plots/csv.awk -f plots/decode.awk "$SCRATCH/both.csv" >"$SCRATCH/decode2.md"
check "decode.awk: the other sweeps' rows beside the decode rows change nothing" cmp "$SCRATCH/decode.md" "$SCRATCH/decode2.md"
awk -F, -f plots/csv.awk -f plots/table.awk "$SCRATCH/both.csv" >"$SCRATCH/tables3.md"
check "table.awk: decode rows beside the others leave the long and fa2 tables as they were" \
    diff -u $T/expected_tables.md "$SCRATCH/tables3.md"
check "decode.awk without decode rows: says there are none yet" \
    bash -c "awk -F, -f plots/csv.awk -f plots/decode.awk $T/fixture.csv | grep -q 'no decode rows in this CSV yet'"
# an older CSV without the sweep column: 1-16 queries against more keys is a decode row
cut -d, -f1-20,22- $DF >"$SCRATCH/nosweep.csv"
check "csv.awk: without a sweep column, N <= 16 with N_k > N is the decode sweep" \
    bash -c "awk -F, -f plots/csv.awk -f plots/decode.awk '$SCRATCH/nosweep.csv' | grep -q -x -F '| 1 | 1 | 32,768 | 2556 (76%) | 2270 (68%) | 2461 (73%) | 1.04x |'"
got=$(for n in "NVIDIA H200" "NVIDIA H100 80GB HBM3" "NVIDIA H100 PCIe" "NVIDIA A100-SXM4-80GB" "NVIDIA A100-SXM4-40GB" "NVIDIA L4" "Tesla T4" "Other"; do
    printf 'gpu,stage\n%s,x\n' "$n" | awk -F, -f plots/csv.awk -f plots/series.awk -v mode=hbm; done | tr '\n' ' ')
check "csv.awk hbm_tbs: the HBM peaks by GPU name ($got)" [ "$got" = "4.8 3.35 2 2.039 1.555 0.3 0.32 0 " ]
# update_readme.sh: the decode-sweep section, the rest untouched; idempotent; without decode rows
printf 'Prose.\n<!-- results:decode-sweep:begin -->\nold\n<!-- results:decode-sweep:end -->\nMore.\n' >"$SCRATCH/dsec.md"
plots/update_readme.sh "$SCRATCH/both.csv" "$SCRATCH/dsec.md" >/dev/null 2>&1
check "update_readme.sh writes the decode table between <!-- results:decode-sweep:begin/end -->" \
    cmp "$SCRATCH/dsec.md" <(printf 'Prose.\n<!-- results:decode-sweep:begin -->\n\n'
        printf 'Measured on NVIDIA H100 80GB HBM3; from `%s` (regenerate: `make bench tables`).\n\n' "$SCRATCH/both.csv"
        cat "$SCRATCH/decode.md"; printf '\n<!-- results:decode-sweep:end -->\nMore.\n')
cp "$SCRATCH/dsec.md" "$SCRATCH/dsec.once"
plots/update_readme.sh "$SCRATCH/both.csv" "$SCRATCH/dsec.md" >/dev/null 2>&1
check "update_readme.sh's decode section is idempotent" cmp "$SCRATCH/dsec.once" "$SCRATCH/dsec.md"
plots/update_readme.sh $T/fixture.csv "$SCRATCH/dsec.md" >/dev/null 2>&1
check "update_readme.sh's decode section from a CSV without decode rows: says so" \
    bash -c "grep -q 'no decode rows in this CSV yet' '$SCRATCH/dsec.md' && ! grep -q '^| 1 | 1 |' '$SCRATCH/dsec.md'"
check "the decode-sweep markers are not stage 9's results:decode ones (tools/decode_table.py)" \
    bash -c "printf '<!-- results:decode:begin -->\nkept\n<!-- results:decode:end -->\n' >'$SCRATCH/s9.md';
             ! plots/update_readme.sh $DF '$SCRATCH/s9.md' 2>/dev/null && grep -q -x kept '$SCRATCH/s9.md'"
check "the top README has one <!-- results:decode-sweep:begin/end --> pair" \
    [ "$(grep -c -x -F -e '<!-- results:decode-sweep:begin -->' -e '<!-- results:decode-sweep:end -->' README.md)" = 2 ]

# ---- the committed READMEs say what the committed reference results say: the top README's
# tables and every lesson's measured section are exactly what make tables writes from the CSV
REF_CSV=plots/h200/results.csv
lessons=$(grep -l -E -x '<!-- results:stage[0-9]+:begin -->' stage*/README.md 2>/dev/null)
for r in README.md $lessons; do
    mkdir -p "$SCRATCH/ref/$(dirname "$r")"
    cp "$r" "$SCRATCH/ref/$r"
    if plots/update_readme.sh $REF_CSV "$SCRATCH/ref/$r" >"$SCRATCH/u.out" 2>&1 && cmp -s "$r" "$SCRATCH/ref/$r"; then
        ok "$r: its generated results match $REF_CSV"
    else
        bad "$r: its generated results differ from $REF_CSV (make tables rewrites them)"
        { cat "$SCRATCH/u.out"; diff -u "$r" "$SCRATCH/ref/$r"; } | sed 's/^/      /' | head -n 20
    fi
done
# every stage's lesson, the Hopper chapter (6) and the backward pass (7) included; a decode stage's
# measured section is tools/decode_table.py's, between <!-- results:decode:begin/end -->
nstages=0
for d in stage[0-9]*/; do
    k=${d#stage}; k=${k%%_*} r=${d}README.md nstages=$((nstages + 1))
    if grep -q -x -F '<!-- results:ring:begin -->' "$r"; then # stage 10's: tools/ring_table.py
        check "$r (the ring) has its measured section between <!-- results:ring:begin/end -->" \
            [ "$(grep -c -x -F -e "<!-- results:ring:begin -->" -e "<!-- results:ring:end -->" "$r")" = 2 ]
    elif grep -q -x -F '<!-- results:decode:begin -->' "$r"; then
        check "$r (a decode stage) has its measured section between <!-- results:decode:begin/end -->" \
            [ "$(grep -c -x -F -e "<!-- results:decode:begin -->" -e "<!-- results:decode:end -->" "$r")" = 2 ]
    else
        check "$r has its measured section between <!-- results:stage$k:begin/end -->" \
            [ "$(grep -c -x -F -e "<!-- results:stage$k:begin -->" -e "<!-- results:stage$k:end -->" "$r")" = 2 ]
    fi
done
check "the measured sections checked cover stages 0-7 at least ($nstages stages)" [ "$nstages" -ge 8 ]

# ---- gnuplot scripts: each renders a non-empty PNG from the fixture, without warnings
is_png() { [ -s "$1" ] && [ "$(head -c 8 "$1" | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ]; }
if command -v gnuplot >/dev/null 2>&1; then
    for gp in plots/*.gp; do
        name=$(basename "$gp" .gp)
        rm -f "$SCRATCH/$name.png"
        gnuplot -e "csv='$SCRATCH/both.csv'; outdir='$SCRATCH'; gpu='Test GPU'; PEAK=989; plotsdir='plots'" \
            "$gp" >"$SCRATCH/gp.out" 2>&1
        rc=$?
        if [ $rc = 0 ] && is_png "$SCRATCH/$name.png" && ! grep -qi -E 'warning|error' "$SCRATCH/gp.out"; then
            ok "$gp renders $name.png from the fixture with decode rows ($(wc -c <"$SCRATCH/$name.png") bytes)"
        else
            bad "$gp renders $name.png (rc $rc)"
            sed 's/^/      /' "$SCRATCH/gp.out" | head -n 20
        fi
    done
    mkdir -p "$SCRATCH/dnone"
    gnuplot -e "csv='$T/fixture.csv'; outdir='$SCRATCH/dnone'; plotsdir='plots'" plots/decode.gp >"$SCRATCH/gp.out" 2>&1
    check "decode.gp without decode rows: exit 0, no PNG, says so" \
        bash -c "[ $? = 0 ] && [ -z \"\$(ls '$SCRATCH/dnone')\" ] && grep -q 'no decode rows' '$SCRATCH/gp.out' && ! grep -qi -E 'warning|error' '$SCRATCH/gp.out'"
    gnuplot -e "csv='$DF'; outdir='$SCRATCH/dnone'; plotsdir='plots'; HBM=0" plots/decode.gp >"$SCRATCH/gp.out" 2>&1
    check "decode.gp with an unknown HBM peak (HBM=0): GB/s alone, no warning" \
        bash -c "[ $? = 0 ] && [ -s '$SCRATCH/dnone/decode.png' ] && ! grep -qi -E 'warning|error' '$SCRATCH/gp.out'"
    # Every gnuplot script on CSV into folder OUT with peak PEAK: each draws its PNG (decode.gp
    # none, saying so, for a CSV without decode rows), with no warning or error (printed where one
    # does); status 1 if any failed.
    draw_all() {
        local csv=$1 out=$2 peak=$3 all=0 gp name
        mkdir -p "$out"
        for gp in plots/*.gp; do
            name=$(basename "$gp" .gp)
            if ! gnuplot -e "csv='$csv'; outdir='$out'; PEAK=$peak" "$gp" >"$SCRATCH/gp.out" 2>&1 ||
                { ! is_png "$out/$name.png" && ! grep -q "no decode rows in $csv; decode.png not drawn" "$SCRATCH/gp.out"; } ||
                grep -qi -E 'warning|error' "$SCRATCH/gp.out"; then
                all=1
                sed "s/^/      $name: /" "$SCRATCH/gp.out" | head -n 10
            fi
        done
        return $all
    }
    # a CSV with no SDPA rows and only a long sweep must still plot (empty panels say so)
    grep -v -E ',sdpa_|,fa2$' $T/fixture.csv >"$SCRATCH/nosdpa.csv"
    draw_all "$SCRATCH/nosdpa.csv" "$SCRATCH/nosdpa" 0 && all=1 || all=0
    [ $all = 1 ] && ok "gnuplot scripts cope with a CSV without SDPA and fa2 rows" ||
        bad "gnuplot scripts cope with a CSV without SDPA and fa2 rows"
    # a stage unsupported on this GPU at every shape (stage 6 off Hopper) is simply not drawn
    { cat $T/fixture.csv
      for n in 1024 16384; do echo "NVIDIA H100 80GB HBM3,stage6_hopper,default,1,1,$n,128,0,f16,,,0,,,,,0,,unsupported,long"; done
      echo "NVIDIA H100 80GB HBM3,stage6_hopper,default,16,16,1024,128,0,f16,,,0,,,,,0,,unsupported,fa2"; } >"$SCRATCH/unsup.csv"
    draw_all "$SCRATCH/unsup.csv" "$SCRATCH/unsup" 989 && all=1 || all=0
    keys=$(awk -F, -f plots/csv.awk -f plots/series.awk -v mode=keys "$SCRATCH/unsup.csv" | tr '\n' ' ')
    [ $all = 1 ] && [ -n "$keys" ] && [ -z "$(echo "$keys" | grep stage6)" ] &&
        ok "gnuplot scripts: an all-unsupported stage is left out of the plots (keys: $keys)" ||
        bad "gnuplot scripts with an all-unsupported stage (keys: $keys)"
    # more stages than the hand-picked colours: each keeps a colour of its own
    { cat $T/fixture.csv
      for s in 8 9 10 11 12 13 14; do
        awk -F, -v s=$s 'BEGIN { OFS = "," } NR > 1 && $2 ~ /^stage1_/ { $2 = "stage" s "_extra"; print }' $T/fixture.csv
      done; } >"$SCRATCH/many.csv"
    draw_all "$SCRATCH/many.csv" "$SCRATCH/many" 989 && all=1 || all=0
    cols=$(for k in $(awk -F, -f plots/csv.awk -f plots/series.awk -v mode=keys "$SCRATCH/many.csv" | grep '^stage'); do
        gnuplot -e "csv='$SCRATCH/many.csv'; plotsdir='plots'; W = 10; HT = 10; load 'plots/style.gpi'; print colour('$k')" 2>&1
    done | sort | uniq -d)
    [ $all = 1 ] && [ -z "$cols" ] &&
        ok "gnuplot scripts: more stages than the hand-picked colours, each stage a colour of its own" ||
        bad "gnuplot scripts with many stages (a colour shared: $cols)"
else
    for gp in plots/*.gp; do
        skip "$gp renders $(basename "$gp" .gp).png: gnuplot is not installed (apt-get install -y gnuplot-nox)"
    done
    skip "decode.gp without decode rows: gnuplot is not installed"
    skip "decode.gp with an unknown HBM peak: gnuplot is not installed"
    skip "gnuplot scripts cope with a CSV without SDPA and fa2 rows: gnuplot is not installed"
    skip "gnuplot scripts leave an all-unsupported stage out: gnuplot is not installed"
    skip "gnuplot scripts give each of many stages a colour: gnuplot is not installed"
fi

# ---- plots.mk targets on the fixture
if command -v make >/dev/null 2>&1; then
    mkdir -p "$SCRATCH/mk"
    cp $T/README.fixture.md "$SCRATCH/mk/README.md"
    lessons_before=$(cat stage*/README.md | cksum)
    if make -s -f plots/plots.mk plots tables PLOT_CSV=$T/fixture.csv PLOT_DIR="$SCRATCH/mk" \
        README="$SCRATCH/mk/README.md" GPU_NAME= >"$SCRATCH/mk.out" 2>&1 &&
        cmp -s "$SCRATCH/mk/README.md" "$SCRATCH/README.md"; then
        if command -v gnuplot >/dev/null 2>&1; then
            n=0
            for f in "$SCRATCH"/mk/*.png; do is_png "$f" && n=$((n + 1)); done
            [ $n = "$(($(ls plots/*.gp | wc -l) - 1))" ] && [ ! -e "$SCRATCH/mk/decode.png" ] &&
                grep -q 'nothing to draw: decode.png' "$SCRATCH/mk.out" &&
                ok "make plots tables (PLOT_CSV=fixture): $n PNGs (no decode.png: no decode rows, said so) and the README" ||
                bad "make plots: $n PNGs"
        else
            ok "make tables (PLOT_CSV=fixture); plots skipped without gnuplot"
        fi
    else
        bad "make -f plots/plots.mk plots tables PLOT_CSV=fixture"
        sed 's/^/      /' "$SCRATCH/mk.out" | head -n 20
    fi
    check "make tables README=elsewhere leaves the stage READMEs alone" [ "$(cat stage*/README.md | cksum)" = "$lessons_before" ]
    # without gnuplot (and no apt-get to fetch it): says how to get it, skips, tables still made
    mkdir -p "$SCRATCH/nognu/bin" "$SCRATCH/nognu/out"
    for d in /usr/local/bin /usr/bin /bin; do ln -s "$d"/* "$SCRATCH/nognu/bin/" 2>/dev/null; done
    rm -f "$SCRATCH"/nognu/bin/gnuplot* "$SCRATCH/nognu/bin/apt-get"
    cp $T/README.fixture.md "$SCRATCH/nognu/README.md"
    if PATH="$SCRATCH/nognu/bin" make -s -f plots/plots.mk plots tables PLOT_CSV=$T/fixture.csv \
        PLOT_DIR="$SCRATCH/nognu/out" README="$SCRATCH/nognu/README.md" GPU_NAME= \
        >"$SCRATCH/nognu.out" 2>&1 && grep -q 'apt-get install -y gnuplot-nox' "$SCRATCH/nognu.out" &&
        cmp -s "$SCRATCH/nognu/README.md" "$SCRATCH/README.md" && [ -z "$(ls "$SCRATCH/nognu/out")" ]; then
        ok "make plots tables without gnuplot: prints the install command, skips, still writes the tables"
    else
        bad "make plots tables without gnuplot"
        sed 's/^/      /' "$SCRATCH/nognu.out" | head -n 20
    fi
    # PNGs beside their CSV are redrawn only when the CSV or the scripts changed
    if command -v gnuplot >/dev/null 2>&1; then
        mkdir -p "$SCRATCH/stamp"
        cp $T/fixture.csv "$SCRATCH/stamp/results.csv"
        stampmk() { make -s -f plots/plots.mk plots PLOT_CSV="$SCRATCH/stamp/results.csv" GPU_NAME= 2>&1; }
        stampmk >"$SCRATCH/stamp1.out"
        before=$(ls -l --time-style=+%s.%N "$SCRATCH"/stamp/*.png | md5sum)
        sleep 1
        stampmk >"$SCRATCH/stamp2.out"
        after=$(ls -l --time-style=+%s.%N "$SCRATCH"/stamp/*.png | md5sum)
        tail -n 1 $T/fixture.csv >>"$SCRATCH/stamp/results.csv" # same data, another file
        stampmk >"$SCRATCH/stamp3.out"
        if [ -s "$SCRATCH/stamp/plots.cksum" ] && [ "$before" = "$after" ] && grep -q 'up to date' "$SCRATCH/stamp2.out" &&
            ! grep -q 'up to date' "$SCRATCH/stamp3.out"; then
            ok "make plots redraws only when the CSV changed (plots.cksum; no decode.png without decode rows, and still up to date)"
        else
            bad "make plots redraws only when the CSV changed"
            cat "$SCRATCH"/stamp[123].out | sed 's/^/      /' | head -n 20
        fi
        # decode rows come: decode.png is drawn; they go: it is removed, and the stamp says so
        cp "$SCRATCH/both.csv" "$SCRATCH/stamp/results.csv"
        stampmk >"$SCRATCH/stamp4.out"
        drew=$([ -s "$SCRATCH/stamp/decode.png" ] && echo yes)
        stampmk >"$SCRATCH/stamp5.out"
        cp $T/fixture.csv "$SCRATCH/stamp/results.csv"
        stampmk >"$SCRATCH/stamp6.out"
        if [ "$drew" = yes ] && grep -q 'up to date' "$SCRATCH/stamp5.out" && [ ! -e "$SCRATCH/stamp/decode.png" ] &&
            grep -q -x 'no decode.png' "$SCRATCH/stamp/plots.cksum"; then
            ok "make plots draws decode.png from decode rows, and removes it when the CSV has none"
        else
            bad "make plots and decode.png"
            cat "$SCRATCH"/stamp[456].out "$SCRATCH/stamp/plots.cksum" | sed 's/^/      /' | head -n 20
        fi
    else
        skip "make plots' redraw stamp: gnuplot is not installed"
        skip "make plots and decode.png: gnuplot is not installed"
    fi
    printf 'peak:\n\t@set -- "$(NAME)"; $(peak_of)\nslug:\n\t@echo $(GPU_SLUG)\n' >"$SCRATCH/probe.mk"
    got=""
    for n in "NVIDIA H100 80GB HBM3" "NVIDIA H200" "NVIDIA A100-SXM4-80GB" "NVIDIA L4" "Tesla T4" \
        "NVIDIA H100 PCIe" "NVIDIA L40S" "Some Other GPU"; do
        got="$got $(make -s -f plots/plots.mk -f "$SCRATCH/probe.mk" peak NAME="$n" GPU_NAME= 2>&1)"
    done
    check "plots.mk peak table" [ "$got" = " 989 989 312 121 65 756 362 0" ]
    got=""
    for n in "NVIDIA H100 80GB HBM3" "Tesla T4" "NVIDIA A100-SXM4-80GB" "NVIDIA H200"; do
        got="$got $(make -s -f plots/plots.mk -f "$SCRATCH/probe.mk" slug GPU_NAME="$n" 2>&1)"
    done
    check "plots.mk GPU_SLUG" [ "$got" = " h100-80gb-hbm3 tesla-t4 a100-sxm4-80gb h200" ]
else
    skip "plots.mk: make is not installed"
fi

# ---- sweep.sh with fake stages
FB="$SCRATCH/build"
mkdir -p "$FB"
for s in stage0_fake stage1_fake stage2_fake; do cp $T/fake_stage.sh "$FB/$s"; chmod +x "$FB/$s"; done
: >"$FB/stage3_fake.ptxas.txt" # not a program: a dot in the name
chmod +x "$FB/stage3_fake.ptxas.txt"
mkdir "$FB/stage4_dir" # not a program: a folder
# stage0: tiny times, out of memory once B*H*N^2 > 5e8 (long: from N = 24576)
printf 'A=0.01\nOOM_ELEMS=500000000\nLOG=%s\n' "$FB/calls.log" >"$FB/stage0_fake.conf"
# stage1: 1 ms at N = 1024, times as N^2: with a 1 s budget the long climb stops after 24576
printf 'A=1\nLOG=%s\n' "$FB/calls.log" >"$FB/stage1_fake.conf"
# stage2: times as N^3 (the N^2 prediction underestimates; the program reports over_budget
# itself at long N = 8192), a wrong result at N = 2048, causal D = 64 unsupported
printf 'A=2\nEXP=3\nFAIL_N=2048\nUNSUP_D=64\nLOG=%s\n' "$FB/calls.log" >"$FB/stage2_fake.conf"

: >"$FB/calls.log"
plots/sweep.sh "$FB" "$SCRATCH/sweep/results.csv" --budget 1 >"$SCRATCH/sweep.out" 2>"$SCRATCH/sweep.err"
rc=$?
CSV="$SCRATCH/sweep/results.csv"
check "sweep.sh exits 1 when a run FAILs" [ $rc = 1 ]
check "sweep.sh shouts FAIL: for the wrong result" grep -q '^FAIL: stage2_fake long N=2048' "$SCRATCH/sweep.err"
check "sweep.sh: one header, the program's columns then sweep,N_k,H_kv,gbs" \
    [ "$(grep -c '^gpu,' "$CSV")" = 1 -a "$(head -n 1 "$CSV" | cut -d, -f21-)" = sweep,N_k,H_kv,gbs ]
check "sweep.sh: 3 stages x 35 rows, 24 columns each, no decode row (no decode stage)" \
    awk -F, 'NF != 24 || $21 == "decode" { exit 1 } END { exit !(NR == 106) }' "$CSV"
check "sweep.sh ignores stage[0-9]* names with a dot and folders" \
    [ "$(tail -n +2 "$CSV" | cut -d, -f2 | sort -u | tr '\n' ' ')" = "stage0_fake stage1_fake stage2_fake " ]

# expected runs, "stage N D causal", in the order made
{
    for n in 1024 2048 4096 8192 16384 24576; do echo "stage0_fake $n 128 0"; done
    for n in 1024 2048 4096 8192 16384 24576; do echo "stage1_fake $n 128 0"; done
    for n in 1024 2048 4096 8192; do echo "stage2_fake $n 128 0"; done
    for c in 0 1; do for n in 512 1024; do echo "stage0_fake $n 64 $c"; done; done
    for c in 0 1; do for n in 512 1024 2048; do echo "stage0_fake $n 128 $c"; done; done
    for d in 64 128; do for c in 0 1; do for n in 512 1024 2048; do echo "stage1_fake $n $d $c"; done; done; done
    for n in 512 1024; do echo "stage2_fake $n 64 0"; done
    for n in 512 1024 2048 4096 8192 16384; do echo "stage2_fake $n 64 1"; done
    for c in 0 1; do for n in 512 1024; do echo "stage2_fake $n 128 $c"; done; done
} >"$SCRATCH/expected_calls"
check "sweep.sh runs exactly the expected shapes, none past a stop" \
    diff -u "$SCRATCH/expected_calls" <(cut -d' ' -f1-4 "$FB/calls.log")

rows() { # sweep stage D causal status -> the N of matching rows, space-separated
    awk -F, -v sw="$1" -v st="$2" -v d="$3" -v c="$4" -v s="$5" \
        'NR > 1 && $21 == sw && $2 == st && $8 == d && $9 == c && $20 == s { printf "%s ", $7 }' "$CSV"
}
check "stage0 long: OOM from 24576 on (ran once, then not run)" \
    [ "$(rows long stage0_fake 128 0 OOM)" = "24576 32768 49152 65536 131072 262144 " ]
check "stage1 long: over_budget predicted from 32768 on" \
    [ "$(rows long stage1_fake 128 0 over_budget)" = "32768 49152 65536 131072 262144 " ]
check "stage2 long: FAIL row at 2048 kept, over_budget (reported by the program) from 8192" \
    [ "$(rows long stage2_fake 128 0 FAIL)" = "2048 " -a \
      "$(rows long stage2_fake 128 0 over_budget)" = "8192 16384 24576 32768 49152 65536 131072 262144 " ]
check "stage2 fa2 causal D=64: unsupported rows, the climb went on" \
    [ "$(rows fa2 stage2_fake 64 1 unsupported)" = "512 1024 2048 4096 8192 16384 " ]
check "stage1 fa2: over_budget predicted by work (B H N^2 D) from 4096" \
    [ "$(rows fa2 stage1_fake 128 1 over_budget)" = "4096 8192 16384 " ]
check "stage0 fa2 D=128: OOM from 2048" [ "$(rows fa2 stage0_fake 128 0 OOM)" = "2048 4096 8192 16384 " ]
check "a row not run has the shape filled in (B H for fa2) and empty times" \
    grep -q -x 'Fake GPU,stage1_fake,default,fwd,4,16,4096,128,1,f16,,,0,,,,,0,,over_budget,fa2,,,' "$CSV"
check "progress lines: one per run, numbered" \
    [ "$(grep -c '^\[ *[0-9]*/105\]' "$SCRATCH/sweep.err")" = 105 ]
check "summary: stage 0's out-of-memory N" grep -q 'stage0_fake ran out of device memory from N=24576' "$SCRATCH/sweep.err"
check "summary: speedups at N=16384" grep -q 'N=16384 (long): best stage0_fake 2.560 ms; 1.0x over stage0_fake (2.560 ms); 100.0x over stage1_fake' "$SCRATCH/sweep.err"
check "summary: fastest at the largest common N" grep -q 'fastest stage at N=4096 (the largest N every stage measured' "$SCRATCH/sweep.err"
check "summary: rows per status" grep -q '^rows: ok 37 FAIL 1 OOM 24 over_budget 37 unsupported 6$' "$SCRATCH/sweep.err"
if python3 -c 'import torch; assert torch.cuda.is_available()' >/dev/null 2>&1; then
    skip "sweep.sh says it skipped SDPA: torch with CUDA is present here, so SDPA ran"
else
    check "sweep.sh says it skipped SDPA" grep -q -x 'SDPA baseline skipped: python3 with torch and CUDA not found' "$SCRATCH/sweep.err"
fi

# --quick and --stages
: >"$FB/calls.log"
plots/sweep.sh "$FB" "$SCRATCH/quick.csv" --budget 100 --quick --stages "1 stage0" --no-sdpa >/dev/null 2>"$SCRATCH/quick.err"
rc=$?
. plots/shapes.conf
quick_rows=$(($(set -- $QUICK_LONG_N; echo $#) + 4 * $(set -- $QUICK_FA2_N; echo $#)))
check "sweep.sh --quick --stages '1 stage0': exit 0, 2 x $quick_rows rows, only the quick shapes" \
    awk -F, -v rc=$rc -v want=$((2 * quick_rows + 1)) -v ln=" $QUICK_LONG_N " -v fn=" $QUICK_FA2_N " \
    'NR > 1 && (index($21 == "long" ? ln : fn, " " $7 " ") == 0 || $2 == "stage2_fake") { exit 1 } END { exit !(rc == 0 && NR == want) }' "$SCRATCH/quick.csv"
check "sweep.sh --stages keeps the stages' order" \
    [ "$(cut -d' ' -f1 "$FB/calls.log" | uniq | head -n 2 | tr '\n' ' ')" = "stage0_fake stage1_fake " ]
plots/sweep.sh "$FB" "$SCRATCH/x.csv" --stages 9 >/dev/null 2>"$SCRATCH/bad.err"
check "sweep.sh --stages with no match: exit 2 and says so" \
    [ $? = 2 -a -n "$(grep 'no stage program matches' "$SCRATCH/bad.err")" ]
plots/sweep.sh "$SCRATCH/nothing" "$SCRATCH/x.csv" >/dev/null 2>&1
check "sweep.sh without a build folder: exit 2" [ $? = 2 ]
mkdir -p "$SCRATCH/nogpu"
cp $T/fake_stage.sh "$SCRATCH/nogpu/stage0_fake"
printf 'NOGPU=1\nLOG=%s\n' "$SCRATCH/nogpu/calls.log" >"$SCRATCH/nogpu/stage0_fake.conf"
plots/sweep.sh "$SCRATCH/nogpu" "$SCRATCH/x.csv" --no-sdpa >/dev/null 2>"$SCRATCH/nogpu.err"
check "sweep.sh stops (exit 2) when the programs see no CUDA device" \
    [ $? = 2 -a "$(wc -l <"$SCRATCH/nogpu/calls.log")" = 1 -a -n "$(grep 'sees no CUDA device' "$SCRATCH/nogpu.err")" ]

quick_decode=$(($(set -- $QUICK_DECODE_B; echo $#) * $(set -- $QUICK_DECODE_NQ; echo $#) * $(set -- $QUICK_DECODE_NK; echo $#)))
full_decode=$(($(set -- $DECODE_B; echo $#) * $(set -- $DECODE_NQ; echo $#) * $(set -- $DECODE_NK; echo $#)))
# ---- the decode sweep: the decode stages only (a program that takes --page-size), its shapes
# through the program's normal path, GB/s per row, an out-of-memory stop, the copy roof's row
DB="$SCRATCH/dbuild"
mkdir -p "$DB"
for s in stage1_fake stage9_fake; do cp $T/fake_stage.sh "$DB/$s"; chmod +x "$DB/$s"; done
printf 'A=0.01\nLOG=%s\n' "$DB/calls.log" >"$DB/stage1_fake.conf"
# stage9: a decode stage, 1 ms per 1,048,576 keys of cache, out of memory past B N_k = 1,048,576
printf 'A=0.01\nDECODE=1\nDA=1\nDOOM_KEYS=1048576\nLOG=%s\n' "$DB/calls.log" >"$DB/stage9_fake.conf"
printf '#!/bin/sh\necho "copy_bw: 1024 MiB" >&2\necho "0.7000 0.6950 20 3067.5 2048.0"\n' >"$DB/copy_bw"
chmod +x "$DB/copy_bw"
: >"$DB/calls.log"
plots/sweep.sh "$DB" "$SCRATCH/dec/results.csv" --budget 10 --sweeps decode --no-sdpa >/dev/null 2>"$SCRATCH/dec.err"
rc=$?
DCSV="$SCRATCH/dec/results.csv"
check "sweep.sh --sweeps decode with a decode stage: exit 0, decode rows only" \
    bash -c "[ $rc = 0 ] && [ \"\$(tail -n +2 '$DCSV' | cut -d, -f21 | sort -u)\" = decode ]"
check "sweep.sh: a stage without a decode path gets no decode run and no decode row" \
    bash -c "! awk '\$1 == \"stage1_fake\" && \$7 != \"-\"' '$DB/calls.log' | grep -q . &&
             ! awk -F, '\$2 == \"stage1_fake\" && \$21 == \"decode\"' '$DCSV' | grep -q ."
{
    for b in $DECODE_B; do for q in $DECODE_NQ; do for k in $DECODE_NK; do
        echo "stage9_fake $q 128 $([ $q -gt 1 ] && echo 1 || echo 0) $b 32 $k 8 bnhd"
    done; done; done
} >"$SCRATCH/expected_decode_calls"
check "sweep.sh's decode runs: B x N_q x N_k of plots/shapes.conf, N_q = 4 causal, 32 heads over 8, D = 128, bnhd" \
    diff -u "$SCRATCH/expected_decode_calls" <(awk '$7 != "-"' "$DB/calls.log")
check "sweep.sh's decode rows: $full_decode, sweep decode, N = N_q, N_k and H_kv filled in" \
    awk -F, -v want=$full_decode '$2 == "stage9_fake" && $21 == "decode" { n++; if ($22 == "" || $23 != 8 || $6 != 32 || ($7 != 1 && $7 != 4)) exit 1 }
                                 END { exit !(n == want) }' "$DCSV"
check "sweep.sh's decode rows: gbs = 2 B N_k H_kv D x 2 bytes / ms" \
    awk -F, '$21 == "decode" && $2 != "copy" && $20 == "ok" { n++; g = 2 * $5 * $22 * $23 * $8 * 2 / $11 / 1e6
                                                           if ($24 - g > 0.06 || g - $24 > 0.06) exit 1 }
             END { exit !(n > 0) }' "$DCSV"
check "sweep.sh's decode climb: out of memory at B = 8, N_k = 262,144 (B N_k over the fake's memory)" \
    [ "$(awk -F, '$21 == "decode" && $20 == "OOM" { printf "%s:%s:%s ", $5, $7, $22 }' "$DCSV")" = "8:1:262144 8:4:262144 " ]
check "sweep.sh: the copy roof's row (stage copy, sweep decode, its gbs, no shape)" \
    grep -q -x 'Fake GPU,copy,default,fwd,,,,,,,0.7000,0.6950,20,,,,,0,2048.0,ok,decode,,,3067.5' "$DCSV"
check "sweep.sh's summary names the decode GB/s and the share of the copy roof" \
    grep -q '^decode stage9_fake B=1 N_q=1 N_k=262144: .* GB/s (.*% of the copy roof, 3068 GB/s)' "$SCRATCH/dec.err"
check "sweep.sh: progress lines count the decode runs" \
    [ "$(grep -c "^\[ *[0-9]*/$full_decode\]" "$SCRATCH/dec.err")" = $full_decode ]
check "the decode sweep's CSV feeds decode.awk: the stage's column, the roof" \
    bash -c "awk -F, -f plots/csv.awk -f plots/decode.awk '$DCSV' | grep -q -F '| 1 | 4 | 1,024 | ' &&
             awk -F, -f plots/csv.awk -f plots/decode.awk '$DCSV' | grep -q 'copy kernel of the same run, which writes what it reads (decode only reads, and can pass it): 3068 GB/s'"
: >"$DB/calls.log"
rm "$DB/copy_bw"
plots/sweep.sh "$DB" "$SCRATCH/decq.csv" --budget 10 --quick --stages 9 --no-sdpa >/dev/null 2>"$SCRATCH/decq.err"
check "sweep.sh --quick: $quick_decode decode runs (QUICK_DECODE_*), at most 3" \
    [ "$(awk '$7 != "-"' "$DB/calls.log" | wc -l)" = $quick_decode -a $quick_decode -le 3 ]
check "sweep.sh without copy_bw: says there is no copy roof, no copy row" \
    bash -c "grep -q 'no copy roof' '$SCRATCH/decq.err' && ! grep -q ',copy,' '$SCRATCH/decq.csv'"
check "sweep.sh --quick: the quick long and fa2 shapes as before, the decode stage among them" \
    [ "$(awk '$7 == "-"' "$DB/calls.log" | wc -l)" = $quick_rows ]
# --append: the decode rows added to an older CSV (no N_k, H_kv, gbs columns) under a header of
# their own; the tables of the other sweeps stay as they were, the decode table reads them
cp $T/fixture.csv "$SCRATCH/app.csv"
plots/sweep.sh "$DB" "$SCRATCH/app.csv" --budget 10 --quick --sweeps decode --append --no-sdpa >/dev/null 2>&1
check "sweep.sh --sweeps decode --append: the old rows kept, a second header, the decode rows" \
    bash -c "[ \"\$(head -n \$(wc -l <$T/fixture.csv) '$SCRATCH/app.csv' | cksum)\" = \"\$(cksum <$T/fixture.csv)\" ] &&
             [ \$(grep -c '^gpu,stage,' '$SCRATCH/app.csv') = 2 ] && [ \$(grep -c ',decode,' '$SCRATCH/app.csv') = $quick_decode ]"
check "the appended CSV: long and fa2 tables unchanged, the decode table has the rows" \
    bash -c "awk -F, -f plots/csv.awk -f plots/table.awk '$SCRATCH/app.csv' | diff -q - $T/expected_tables.md >/dev/null &&
             awk -F, -f plots/csv.awk -f plots/decode.awk '$SCRATCH/app.csv' | grep -q '^| 1 | 1 | 4,096 | '"

# the sweep's CSV feeds the tables and plots
check "table.awk reads the sweep's CSV" awk -F, -f plots/csv.awk -f plots/table.awk "$CSV"
check "sdpa_baseline.py --dry-run --quick plans the quick shapes, 3 backends x 2 passes x $quick_rows runs and FA2, cuDNN x $quick_decode decode runs, without torch" \
    [ "$(python3 $T/../sdpa_baseline.py "$SCRATCH/s.csv" --dry-run --quick | wc -l)" = $((6 * quick_rows + 2 * quick_decode)) ]
check "sdpa_baseline.py --dry-run plans 3 backends x 2 passes x 35 runs and FA2, cuDNN x $full_decode decode runs (plots/shapes.conf)" \
    [ "$(python3 $T/../sdpa_baseline.py "$SCRATCH/s.csv" --dry-run | wc -l)" = $((210 + 2 * full_decode)) ]
check "sdpa_baseline.py's decode runs: the sweep's shapes, N_q = 4 causal" \
    bash -c "python3 $T/../sdpa_baseline.py '$SCRATCH/s.csv' --dry-run | grep -q -x 'sdpa_cudnn fwd decode B=8 H=32 H_kv=8 N_q=4 N_k=262144 D=128 causal=1'"
check "sdpa_baseline.py --passes bwd plans no decode run" \
    bash -c "! python3 $T/../sdpa_baseline.py '$SCRATCH/s.csv' --dry-run --passes bwd | grep -q decode"
check "sdpa_baseline.py --backends sdpa_mem_efficient --passes bwd plans 35 runs" \
    [ "$(python3 $T/../sdpa_baseline.py "$SCRATCH/s.csv" --dry-run --backends sdpa_mem_efficient --passes bwd | grep -c '^sdpa_mem_efficient bwd ')" = 35 ]
check "sdpa_baseline.py --backends with an unknown name: exit 2" \
    bash -c "python3 $T/../sdpa_baseline.py $SCRATCH/s.csv --dry-run --backends sdpa_magic >/dev/null 2>&1; [ \$? -eq 2 ]"

# ---- make tables on a GPU other than the reference one: the lessons and the top README stay as
# they are (their prose argues from the reference run), and plots/<gpu>/TABLES.md holds that GPU's
# tables; on the reference GPU the lessons are rewritten from plots/h200/results.csv as before
if command -v make >/dev/null 2>&1; then
    R=$SCRATCH/gpu_repo
    mkdir -p "$R"
    cp -r plots README.md "$R/"
    for d in stage*/; do mkdir -p "$R/$d" && cp "$d/README.md" "$R/$d/"; done
    mkdir -p "$R/plots/fake-gpu" && cp $T/fixture.csv "$R/plots/fake-gpu/results.csv"
    before=$(cd "$R" && cat README.md stage*/README.md | cksum)
    if make -s -C "$R" -f plots/plots.mk tables GPU_NAME="NVIDIA Fake GPU" >"$SCRATCH/fake.out" 2>&1; then
        check "make tables on a non-reference GPU leaves the lessons and the top README untouched" \
            [ "$(cd "$R" && cat README.md stage*/README.md | cksum)" = "$before" ]
        check "make tables on a non-reference GPU writes plots/<gpu>/TABLES.md with every stage's tables from its CSV" \
            bash -c "[ \$(grep -c -F 'Measured on NVIDIA H100 80GB HBM3; from \`plots/fake-gpu/results.csv\`' '$R/plots/fake-gpu/TABLES.md') -ge 8 ] &&
                     grep -q -x '<!-- results:stage7:begin -->' '$R/plots/fake-gpu/TABLES.md'"
        check "make tables on a non-reference GPU names the page" grep -q 'plots/fake-gpu/TABLES.md' "$SCRATCH/fake.out"
        # its stage 3 section is what update_readme.sh writes into a lesson from the same CSV
        printf '<!-- results:stage3:begin -->\n<!-- results:stage3:end -->\n' >"$SCRATCH/l3.md"
        plots/update_readme.sh "$R/plots/fake-gpu/results.csv" "$SCRATCH/l3.md" 2>/dev/null
        check "TABLES.md's stage 3 section is the lesson's section for that CSV" \
            bash -c "awk '/^<!-- results:stage3:begin -->\$/,/^<!-- results:stage3:end -->\$/' '$R/plots/fake-gpu/TABLES.md' |
                     sed 's|$R/||' | diff - <(sed 's|$R/||' '$SCRATCH/l3.md')"
    else
        bad "make tables GPU_NAME='NVIDIA Fake GPU'"
        sed 's/^/      /' "$SCRATCH/fake.out" | head -n 20
    fi
    # the reference GPU: its CSV rewrites the lessons (here: the committed results, so no change)
    if make -s -C "$R" -f plots/plots.mk tables GPU_NAME="NVIDIA H200" >"$SCRATCH/ref.out" 2>&1; then
        check "make tables on the reference GPU writes no TABLES.md" [ ! -e "$R/plots/h200/TABLES.md" ]
    else
        bad "make tables GPU_NAME='NVIDIA H200'"
        sed 's/^/      /' "$SCRATCH/ref.out" | head -n 20
    fi
else
    skip "make tables on a non-reference GPU: make is not installed"
fi

# ---- answers.py: an exercise's answer block takes its table from the answers' CSV; a block with
# no rows, and everything outside the blocks, stay as they were
if command -v python3 >/dev/null 2>&1; then
    A=$SCRATCH/answers_repo
    mkdir -p "$A/plots" "$A/stage7_backward/measured"
    cp plots/answers.py "$A/plots/"
    printf '# t\n\nProse.\n<!-- results:answer-s7e2:begin -->\nold 2\n<!-- results:answer-s7e2:end -->\nMore.\n<!-- results:answer-s7e3:begin -->\nold 3\n<!-- results:answer-s7e3:end -->\n' \
        >"$A/stage7_backward/README.md"
    { echo 'answer,label,command,rc,ms_median,tflops,status,self_test,note,gpu,commit'
      echo '"s7e2","default, B = 1","build/stage7_backward --variant default","0","2.000","300.0","ok","-","-","NVIDIA H200","abc1234"'
      echo '"s7e2","registers, B = 1","build/stage7_backward --variant registers","0","2.500","240.0","ok","-","-","NVIDIA H200","abc1234"'
    } >"$A/stage7_backward/measured/h200_answers.csv"
    python3 "$A/plots/answers.py" >"$SCRATCH/answers.out" 2>&1
    check "answers.py writes an answer's table from the CSV, its ratio to the default's time" \
        grep -q -F '| registers, B = 1 | `build/stage7_backward --variant registers` | 2.500 | 240.0 | 1.250 | exit 0 |' "$A/stage7_backward/README.md"
    check "answers.py leaves a block without rows, and the prose, as they were" \
        bash -c "grep -q -x 'old 3' '$A/stage7_backward/README.md' && ! grep -q -x 'old 2' '$A/stage7_backward/README.md' &&
                 grep -q -x 'More.' '$A/stage7_backward/README.md'"
    cp "$A/stage7_backward/README.md" "$SCRATCH/answers.once"
    python3 "$A/plots/answers.py" >/dev/null 2>&1
    check "answers.py is idempotent" cmp "$SCRATCH/answers.once" "$A/stage7_backward/README.md"
else
    skip "answers.py: python3 is not installed"
fi

report_end
