#!/usr/bin/env bash
# update_readme.sh: write the results of a results.csv into READMEs, between markers.
#
#   plots/update_readme.sh plots/h100-80gb-hbm3/results.csv README.md stage3_cp_async/README.md
#
# In each README, replaces what lies between the marker lines
#   <!-- results:long:begin -->   ... <!-- results:long:end -->    the long-sweep table
#   <!-- results:fa2:begin -->    ... <!-- results:fa2:end -->     the fa2-sweep tables
#   <!-- results:stageK:begin --> ... <!-- results:stageK:end -->  stage K's measured section
#   <!-- results:summary:begin --> ... <!-- results:summary:end --> every stage in one table
#   <!-- results:backward:begin --> ... <!-- results:backward:end --> both sweeps' backward rows
#   <!-- results:decode-sweep:begin --> ... <!-- results:decode-sweep:end --> the decode sweep
# with a line naming the GPU and the CSV, then plots/table.awk's tables (sweep=long, sweep=fa2,
# lesson=K, summary=1; backward: PASS=bwd, as a lesson of a stage whose rows are backward rows)
# or plots/decode.awk's (decode-sweep). A README holds any of these pairs (the top README the
# sweeps' and the summary, a lesson its own stage's); the marker lines themselves and everything outside them stay byte for byte as they
# were. Each marker must be on a line of its own, once, begin before end, pairs not nested; a
# README without any marker, or with a broken pair, is an error and nothing is written to it.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if [ $# -lt 2 ]; then
    echo "usage: plots/update_readme.sh RESULTS_CSV README [README...]" >&2
    exit 2
fi
CSV=$1
shift
[ -s "$CSV" ] || { echo "update_readme.sh: no results in '$CSV'" >&2; exit 1; }
for README in "$@"; do
    [ -f "$README" ] || { echo "update_readme.sh: '$README' not found" >&2; exit 1; }
done

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

MARKER_RE='^<!-- results:(long|fa2|summary|backward|decode-sweep|stage[0-9]+):(begin|end) -->$'

# The kinds of marker pairs in $1 (long fa2 stage3 ...), checked; exits on a broken pair.
marker_kinds() {
    local readme=$1 kinds kind m n b e
    kinds=$(tr -d '\r' <"$readme" | grep -E -x -- "$MARKER_RE" | sed -E 's/^<!-- results:([a-z0-9-]+):.*/\1/' | sort -u || true)
    if [ -z "$kinds" ]; then
        echo "update_readme.sh: $readme holds no results markers; put a pair such as" \
            "<!-- results:long:begin --> / <!-- results:long:end --> where the tables belong" >&2
        exit 1
    fi
    for kind in $kinds; do
        for end in begin end; do
            m="<!-- results:$kind:$end -->"
            n=$(tr -d '\r' <"$readme" | grep -c -x -F -- "$m" || true)
            if [ "$n" != 1 ]; then
                echo "update_readme.sh: $readme must hold the line '$m' exactly once (found $n);" \
                    "put the pair <!-- results:$kind:begin --> / <!-- results:$kind:end --> where" \
                    "the $kind tables belong" >&2
                exit 1
            fi
        done
        b=$(tr -d '\r' <"$readme" | grep -n -x -F -- "<!-- results:$kind:begin -->" | cut -d: -f1)
        e=$(tr -d '\r' <"$readme" | grep -n -x -F -- "<!-- results:$kind:end -->" | cut -d: -f1)
        if [ "$b" -ge "$e" ]; then
            echo "update_readme.sh: in $readme, <!-- results:$kind:end --> comes before its begin" >&2
            exit 1
        fi
    done
    # pairs one after the other, none inside another
    if ! tr -d '\r' <"$readme" | grep -E -x -- "$MARKER_RE" |
        awk '{ e = ($0 ~ /:end -->$/) } NR % 2 == 1 && e || NR % 2 == 0 && !e { exit 1 }'; then
        echo "update_readme.sh: in $readme, a results marker pair lies inside another" >&2
        exit 1
    fi
    echo "$kinds"
}

for README in "$@"; do marker_kinds "$README" >"$TMP/kinds.$(printf '%s' "$README" | cksum | tr ' ' -)"; done

gpus=$(awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == "gpu") g = i; next }
                $1 == "gpu" && $2 == "stage" { next }  # a repeated header (CSVs concatenated)
                g && !($g in seen) { seen[$g] = 1; out = out (out == "" ? "" : ", ") $g }
                END { print out }' "$CSV")
# The pass a stage's lesson shows: bwd for a stage whose CSV rows time its backward pass
# (stage 7), else fwd.
lesson_pass() {
    awk -F, -v k="stage$1_" 'NR == 1 { for (i = 1; i <= NF; i++) { if ($i == "stage") s = i; if ($i == "pass") p = i }; next }
                             p && index($s, k) == 1 && $p == "bwd" { found = 1; exit }
                             END { print found ? "bwd" : "fwd" }' "$CSV"
}
section() { # kind -> $TMP/kind.md
    [ -s "$TMP/$1.md" ] && return
    {
        echo
        printf 'Measured on %s; from `%s` (regenerate: `make bench tables`).\n' "${gpus:-an unknown GPU}" "$CSV"
        echo
        case $1 in
        long | fa2) awk -F, -v sweep="$1" -f "$HERE/csv.awk" -f "$HERE/table.awk" "$CSV" ;;
        stage*) awk -F, -v lesson="${1#stage}" -v PASS="$(lesson_pass "${1#stage}")" -f "$HERE/csv.awk" -f "$HERE/table.awk" "$CSV" ;;
        summary) awk -F, -v summary=1 -f "$HERE/csv.awk" -f "$HERE/table.awk" "$CSV" ;;
        backward) awk -F, -v PASS=bwd -f "$HERE/csv.awk" -f "$HERE/table.awk" "$CSV" ;;
        decode-sweep) awk -F, -f "$HERE/csv.awk" -f "$HERE/decode.awk" "$CSV" ;;
        esac
        echo
    } >"$TMP/$1.md"
}

for README in "$@"; do
    kinds=$(cat "$TMP/kinds.$(printf '%s' "$README" | cksum | tr ' ' -)")
    for kind in $kinds; do section "$kind"; done
    awk -v dir="$TMP" '
    function copy(f,    line) {
        while ((getline line < f) > 0) print line
        close(f)
    }
    { bare = $0; sub(/\r$/, "", bare) }
    bare ~ /^<!-- results:(long|fa2|summary|backward|decode-sweep|stage[0-9]+):begin -->$/ {
        kind = bare
        sub(/^<!-- results:/, "", kind)
        sub(/:begin -->$/, "", kind)
        print
        copy(dir "/" kind ".md")
        skip = 1
        next
    }
    bare ~ /^<!-- results:(long|fa2|summary|backward|decode-sweep|stage[0-9]+):end -->$/ { skip = 0; print; next }
    !skip { print }
    ' "$README" >"$TMP/new"

    # awk ends every line with a newline; keep a README that had none at its end as it was.
    if [ -n "$(tail -c 1 "$README")" ]; then
        head -c -1 "$TMP/new" >"$TMP/new2"
        mv "$TMP/new2" "$TMP/new"
    fi
    what=$(echo $kinds | sed -e 's/\bstage\([0-9]*\)/stage \1/g' -e 's/ \([a-z]\)/, \1/g')
    if cmp -s "$TMP/new" "$README"; then
        echo "update_readme.sh: $README already up to date" >&2
    else
        cat "$TMP/new" >"$README" # keeps the file's mode and links
        echo "update_readme.sh: wrote the results ($what) from $CSV into $README" >&2
    fi
done
