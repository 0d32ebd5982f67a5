#!/usr/bin/env bash
# Fails if ptxas serialized a kernel's wgmma: in the sm_90a machine code of each NAME (a program
# in BUILD_DIR), a function that waits for every wgmma group to complete (WARPGROUP.DEPBAR.LE
# gsb0, 0x0) more often than every other HGMMA it issues. A kernel whose products overlap waits a
# few times a step; ptxas serializes them, a wait after each, when it cannot keep an accumulator's
# registers untouched through the asynchronous window, and its "Potential Performance Loss"
# warning (check_spills.sh) does not always say so (stage 8's LOG.md, step 70).
# A NAME whose build has no sm_90a code, or any NAME where no cuobjdump is on the PATH, is a skip
# (it says which); one with sm_90a code but no wgmma fails (the check would see nothing). One line
# per NAME and "N passed, M failed, K skipped" last.
# usage: check_wgmma.sh BUILD_DIR NAME...   (SASS_TEXT=1: each BUILD_DIR/NAME holds cuobjdump -sass's
#                                           text instead, for the gate's own test, check_targets.sh)
set -u
dir=$1; shift
. "$(dirname "$0")/report.sh"
MIN_HGMMA=8  # functions with fewer wgmma (a stage's small helpers) are not judged
has_sm90a() { [ "${SASS_TEXT:-0}" = 1 ] || cuobjdump -lelf "$1" 2>/dev/null | grep -q '\.sm_90a\.'; }
sass_of() { if [ "${SASS_TEXT:-0}" = 1 ]; then cat "$1"; else cuobjdump -sass -arch sm_90a "$1" 2>/dev/null; fi; }
# the machine code is read by the toolkit's cuobjdump: without it there is nothing to judge
reads_sass() { [ "${SASS_TEXT:-0}" = 1 ] || command -v cuobjdump >/dev/null; }
for s in "$@"; do
  f=$dir/$s
  if [ ! -f "$f" ]; then bad "$s: no program at $f"; continue; fi
  if ! reads_sass; then skip "$s: no cuobjdump here to read its machine code"; continue; fi
  if ! has_sm90a "$f"; then skip "$s: no sm_90a code in this build (wgmma exists only there)"; continue; fi
  # per function: its HGMMA and its waits for every group
  counts=$(sass_of "$f" | awk -v min=$MIN_HGMMA '
    /Function :/ { fn = $3 }
    /HGMMA/ { h[fn]++ }
    /WARPGROUP\.DEPBAR\.LE gsb0, 0x0/ { w[fn]++ }
    END { for (fn in h) if (h[fn] >= min) printf "%d %d %s\n", h[fn], w[fn] + 0, fn }')
  if [ -z "$counts" ]; then bad "$s: sm_90a code but no function with $MIN_HGMMA or more HGMMA"; continue; fi
  serial=$(awk '2 * $2 > $1' <<<"$counts")
  kernels=$(grep -c '' <<<"$counts")
  if [ -z "$serial" ]; then
    ok "$s: $kernels sm_90a kernels with wgmma, none serialized"
  else
    bad "$s: wgmma serialized (HGMMA, waits for every group, function):"
    head -5 <<<"$serial"
  fi
done
report_end
