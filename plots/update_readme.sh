#!/usr/bin/env bash
# update_readme.sh: write the results tables of a results.csv into the README, between markers.
#
#   plots/update_readme.sh plots/h100-80gb-hbm3/results.csv README.md
#
# Replaces what lies between the marker lines
#   <!-- results:long:begin --> ... <!-- results:long:end -->
#   <!-- results:fa2:begin -->  ... <!-- results:fa2:end -->
# with a line naming the GPU and the CSV, then plots/table.awk's tables for that sweep. The
# marker lines themselves and everything outside them stay byte for byte as they were. Each
# marker must be on a line of its own, once, begin before end; otherwise nothing is written.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if [ $# -ne 2 ]; then
    echo "usage: plots/update_readme.sh RESULTS_CSV README" >&2
    exit 2
fi
CSV=$1
README=$2
[ -s "$CSV" ] || { echo "update_readme.sh: no results in '$CSV'" >&2; exit 1; }
[ -f "$README" ] || { echo "update_readme.sh: '$README' not found" >&2; exit 1; }

for sweep in long fa2; do
    for end in begin end; do
        m="<!-- results:$sweep:$end -->"
        n=$(tr -d '\r' <"$README" | grep -c -x -F -- "$m" || true)
        if [ "$n" != 1 ]; then
            echo "update_readme.sh: $README must hold the line '$m' exactly once (found $n);" \
                "put the pair <!-- results:$sweep:begin --> / <!-- results:$sweep:end --> where" \
                "the $sweep tables belong" >&2
            exit 1
        fi
    done
    b=$(tr -d '\r' <"$README" | grep -n -x -F -- "<!-- results:$sweep:begin -->" | cut -d: -f1)
    e=$(tr -d '\r' <"$README" | grep -n -x -F -- "<!-- results:$sweep:end -->" | cut -d: -f1)
    if [ "$b" -ge "$e" ]; then
        echo "update_readme.sh: in $README, <!-- results:$sweep:end --> comes before its begin" >&2
        exit 1
    fi
done

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

gpus=$(awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == "gpu") g = i; next }
                g && !($g in seen) { seen[$g] = 1; out = out (out == "" ? "" : ", ") $g }
                END { print out }' "$CSV")
for sweep in long fa2; do
    {
        echo
        printf 'Measured on %s; from `%s` (regenerate: `make bench tables`).\n' "${gpus:-an unknown GPU}" "$CSV"
        echo
        awk -F, -v sweep=$sweep -f "$HERE/csv.awk" -f "$HERE/table.awk" "$CSV"
        echo
    } >"$TMP/$sweep.md"
done

awk -v longf="$TMP/long.md" -v fa2f="$TMP/fa2.md" '
function copy(f,    line) {
    while ((getline line < f) > 0) print line
    close(f)
}
{ bare = $0; sub(/\r$/, "", bare) }
bare == "<!-- results:long:begin -->" { print; copy(longf); skip = 1; next }
bare == "<!-- results:fa2:begin -->" { print; copy(fa2f); skip = 1; next }
bare == "<!-- results:long:end -->" || bare == "<!-- results:fa2:end -->" { skip = 0; print; next }
!skip { print }
' "$README" >"$TMP/new"

# awk ends every line with a newline; keep a README that had none at its end as it was.
if [ -n "$(tail -c 1 "$README")" ]; then
    head -c -1 "$TMP/new" >"$TMP/new2"
    mv "$TMP/new2" "$TMP/new"
fi
if cmp -s "$TMP/new" "$README"; then
    echo "update_readme.sh: $README already up to date" >&2
else
    cat "$TMP/new" >"$README" # keeps the file's mode and links
    echo "update_readme.sh: wrote the long and fa2 tables from $CSV into $README" >&2
fi
