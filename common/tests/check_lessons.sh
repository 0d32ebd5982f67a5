#!/usr/bin/env bash
# The lessons' checks behind `make test` (common/tests/check_lessons.py says what they are): first
# the checker on its fixtures (a wrong function name, a line reference past the end or outside the
# function its code map entry names, and the stale
# figures of the lessons before issue 19 must each be reported; a correct lesson must pass), then
# every stage*/README.md: code map, line references, at most 2,300 words (3,000 for stages 5-8)
# outside its generated sections, no untraced figure from a run in its prose
# (and the top README.md: its prose only); stage 9's generated section against its CSV;
# and every diagram script under plots/diagrams/ draws its picture.
# Ends with "N passed, M failed, K skipped" (common/tests/report.sh; a check that cannot run here: a
# line "SKIP  what: why" each); exit 1 if any failed.
set -u
cd "$(dirname "$0")/../.."
. common/tests/report.sh
if ! command -v python3 >/dev/null 2>&1; then
  bad "python3 not found: the lessons' checks need it"
  report_end
  exit 1
fi
for args in --self-test ""; do
  report_run "check_lessons.py${args:+ $args}" python3 common/tests/check_lessons.py $args
done
# stage 9's measured section is its CSV's (tools/decode_table.py; decode is timed apart from the
# sweeps that make tables regenerates)
report_run "decode_table.py --check" python3 -m tools.decode_table --check
# ... and the rows decode_bench.py writes (--csv, --append) are what decode_table.py reads
report_run "decode_bench.py --self-test" python3 -m tools.decode_bench --self-test
# stage 10's measured section is its CSVs' (tools/ring_table.py; the ring is timed on two GPUs)
report_run "ring_table.py --check" python3 -m tools.ring_table --check
# the lessons' diagrams drawn by gnuplot scripts: each renders its PNG without a warning
if command -v gnuplot >/dev/null 2>&1; then
  tmp=$(mktemp -d)
  for gp in plots/diagrams/*.gp; do
    [ -f "$gp" ] || continue
    name=$(basename "$gp" .gp)
    cp "$gp" "$tmp/$name.gp" # a copy: every script writes its PNG beside itself, here in $tmp
    if gnuplot "$tmp/$name.gp" >"$tmp/out" 2>&1 && [ -s "$tmp/$name.png" ] &&
      ! grep -qi -E 'warning|error' "$tmp/out"; then
      ok "$gp draws $name.png"
    else
      bad "$gp draws $name.png"; sed 's/^/      /' "$tmp/out" | head -n 10
    fi
  done
  rm -rf "$tmp"
else
  for gp in plots/diagrams/*.gp; do
    [ -f "$gp" ] || continue
    skip "$gp draws $(basename "$gp" .gp).png: gnuplot is not installed"
  done
fi
report_end
