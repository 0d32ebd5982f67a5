#!/usr/bin/env bash
# Every exercise edit that measure_answers.sh makes still applies to the source: each `prepare NAME
# DIR FILE EDIT` of its builds section with an edit must change DIR/FILE (the sed script run on a
# copy), or measuring that answer on a GPU would only report that the exercise's line moved. No GPU
# needed; the builds section itself is evaluated, with `prepare` checking instead of building.
# First the check on a made-up file (an edit that matches, one that does not). One line per edit
# and "N passed, M failed, K skipped" last (common/tests/report.sh).
# usage: check_answer_edits.sh [SCRIPT]   (default common/tests/measure_answers.sh)
set -u
cd "$(dirname "$0")/../.."
script=${1:-common/tests/measure_answers.sh}
. common/tests/report.sh
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"; report_cleanup' EXIT

# edit_applies FILE EDIT: 0 when the sed script EDIT changes FILE (why not, in $tmp/why)
edit_applies() {
  cp "$1" "$tmp/copy"
  if ! sed -i "$2" "$tmp/copy" 2>"$tmp/why"; then return 1; fi
  if cmp -s "$tmp/copy" "$1"; then echo "the edit changes nothing (the exercise's line moved?)" >"$tmp/why"; return 1; fi
}
printf 'const float alpha = expf(m_i - m_ref);\n' >"$tmp/made_up.cu"
if edit_applies "$tmp/made_up.cu" 's|expf(m_i - m_ref)|1.f|' && ! edit_applies "$tmp/made_up.cu" 's|expf(m_new)|1.f|'; then
  ok "an edit that matches applies, one that matches nothing is caught (made-up file)"
else
  bad "the check on a made-up file: $(cat "$tmp/why")"
fi

want() { return 0; }  # every answer
hopper=1              # the Hopper-only edits too
prepare() {           # as measure_answers.sh's, checking the edit instead of building
  local name=$1 dir=$2 file=$3 edit=$4
  [ -n "$edit" ] || return 0
  if [ ! -f "$dir/$file" ]; then
    bad "$name: no $dir/$file"
  elif edit_applies "$dir/$file" "$edit"; then
    ok "$name: its edit applies to $dir/$file"
  else
    bad "$name: $dir/$file: $(cat "$tmp/why")"
  fi
}
section=$(sed -n '/^# ---- the builds, side by side/,/^wait$/p' "$script")
if ! grep -q "prepare " <<<"$section"; then
  bad "$script: no builds section (from '# ---- the builds, side by side' to 'wait')"
else
  eval "$section"
fi
report_end
