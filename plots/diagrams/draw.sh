#!/usr/bin/env bash
# Renders the lessons' diagrams: every plots/diagrams/*.gp (gnuplot) to the PNG of the same name
# beside it. Each script writes its own PNG next to itself, so this can run from any folder.
#   bash plots/diagrams/draw.sh            every diagram
#   bash plots/diagrams/draw.sh stage1_*   only those whose name matches
set -eu
here=$(cd "$(dirname "$0")" && pwd)
command -v gnuplot >/dev/null 2>&1 || { echo "draw.sh: gnuplot not found (apt-get install gnuplot-nox)" >&2; exit 1; }
pattern=${1:-*}
status=0
for gp in "$here"/$pattern.gp; do
    [ -e "$gp" ] || { echo "draw.sh: no diagram matches $pattern.gp" >&2; exit 1; }
    if gnuplot "$gp"; then
        echo "drew ${gp%.gp}.png"
    else
        echo "draw.sh: gnuplot failed on $gp" >&2
        status=1
    fi
done
exit $status
