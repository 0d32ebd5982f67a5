#!/usr/bin/env bash
# The fat build's targets: its list (FAT_ARCHS_WANTED, mk/detect.mk) has Blackwell (sm_100,
# sm_120) beside sm_75-sm_90; the build in BUILD_DIR made machine code for every one this nvcc
# knows, and PTX for the newest; the README's "GPUs built" names the same list; and the no-spill
# gate (check_spills.sh) fails on a report that spills, has a stack frame, or lacks one of the
# build's targets, and the wgmma gate (check_wgmma.sh) on serialized wgmma (tried on made-up
# reports and machine code). Ends with "N passed, M failed, K skipped"
# (common/tests/report.sh).
# usage: check_targets.sh BUILD_DIR   (a fat build: make build ARCH= BUILD=BUILD_DIR)
set -u
dir=$1
cd "$(dirname "$0")/../.."
. common/tests/report.sh
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"; report_cleanup' EXIT

wanted=$(sed -n 's/^FAT_ARCHS_WANTED *:= *//p' mk/detect.mk | tr -s ' ' | sed 's/ *$//')
missing=""
for a in 75 80 86 89 90 100 120; do [[ " $wanted " == *" $a "* ]] || missing="$missing sm_$a"; done
if [ -n "$wanted" ] && [ -z "$missing" ]; then
  ok "the fat build's targets (FAT_ARCHS_WANTED): $wanted"
else
  bad "FAT_ARCHS_WANTED in mk/detect.mk is '$wanted': it lacks$missing"
fi

nvcc=$(sed -n 's/^\([^ ]*nvcc\) .*/\1/p' "$dir/flags.txt" 2>/dev/null)
codes=$("${nvcc:-nvcc}" --list-gpu-code 2>/dev/null | tr '\n' ' ')
flags=$(cat "$dir/flags.txt" 2>/dev/null)
missing="" newest=""
for a in $wanted; do
  if [ -n "$codes" ] && [[ " $codes " != *" sm_$a "* ]]; then continue; fi # this nvcc cannot
  newest=$a
  [[ " $flags " == *"code=sm_$a "* ]] || missing="$missing sm_$a"
done
if [ -z "$flags" ]; then
  bad "no $dir/flags.txt: is $dir a build?"
elif [ -z "$missing" ] && [[ " $flags " == *"arch=compute_$newest,code=compute_$newest"* ]]; then
  ok "$dir was built for every target ${nvcc:-nvcc} has (up to sm_$newest) and PTX for compute_$newest"
else
  bad "$dir/flags.txt lacks$missing${missing:+ }or PTX for compute_$newest: $flags"
fi

# the README's list of the fat build's machine code, as mk/detect.mk has it
readme=$(awk '/^- \*\*GPUs built:\*\*/ { on = 1 } on && /and PTX for/ { print; exit } on { print }' README.md |
  grep -oE 'sm_[0-9]+' | sed 's/^sm_//' | awk '!seen[$0]++' | tr '\n' ' ' | sed 's/ *$//')
if [ "$readme" = "$wanted" ]; then
  ok "README's 'GPUs built' names the fat build's targets: $readme"
else
  bad "README's 'GPUs built' names '$readme', mk/detect.mk builds '$wanted'"
fi

# the gate itself, on made-up reports for a build of sm_80 and sm_100
mkdir -p "$tmp/b/ptxas"
echo "nvcc -gencode arch=compute_80,code=sm_80 -gencode arch=compute_100,code=sm_100 -gencode arch=compute_100,code=compute_100" >"$tmp/b/flags.txt"
report() { # report FILE TARGET BYTES...: one kernel per target, with that stack frame and spills
  local f=$1 t; shift
  for t in "$@"; do
    printf "ptxas info    : Compiling entry function '_Z6kernelv' for '%s'\n" "${t%:*}"
    printf "ptxas info    : Function properties for _Z6kernelv\n"
    printf "    %s bytes stack frame, %s bytes spill stores, %s bytes spill loads\n" "${t#*:}" "${t#*:}" "${t#*:}"
  done >"$f"
}
# the gate on made-up reports: its failures are what is checked here, so they are not recorded
gate() { env -u REPORT_FILE bash common/tests/check_spills.sh "$tmp/b" "$@" >"$tmp/out" 2>&1; }
report "$tmp/b/ptxas/stage1_x.txt" sm_80:0 sm_100:0
report "$tmp/b/ptxas/stage2_x.txt" sm_80:0 sm_100:8
report "$tmp/b/ptxas/stage3_x.txt" sm_80:0
if gate stage1_x; then ok "check_spills.sh passes a clean report of every target"; else bad "check_spills.sh fails a clean report: $(cat "$tmp/out")"; fi
if ! gate stage2_x && grep -q "^FAIL  stage2_x spills" "$tmp/out"; then
  ok "check_spills.sh fails a report with 8 bytes of spills on sm_100"
else
  bad "check_spills.sh on a report that spills on sm_100: $(cat "$tmp/out")"
fi
if ! gate stage3_x && grep -q "^FAIL  stage3_x: no kernel compiled for sm_100" "$tmp/out"; then
  ok "check_spills.sh fails a report that lacks one of the build's targets"
else
  bad "check_spills.sh on a report without sm_100: $(cat "$tmp/out")"
fi
echo "nvcc -gencode arch=compute_80,code=compute_80" >"$tmp/b/flags.txt"
if ! gate stage1_x && grep -q "no machine-code target" "$tmp/out"; then
  ok "check_spills.sh fails when the build's targets are unknown"
else
  bad "check_spills.sh with no code=sm_XX in flags.txt: $(cat "$tmp/out")"
fi

# the wgmma gate (check_wgmma.sh) on made-up machine code: one kernel whose 16 HGMMA overlap (two
# waits for every group), one whose 16 each wait (serialized)
sass() { # sass FILE WAITS_AFTER_EACH: a function of 16 HGMMA, with a wait after each or two in all
  local i
  {
    echo "        Function : _Z6kernelv"
    for i in $(seq 16); do
      echo "        /*0000*/                   HGMMA.64x64x16.F32 R24, gdesc[UR4], R24 ;"
      [ "$2" = 1 ] && echo "        /*0010*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;"
    done
    [ "$2" = 1 ] || printf '        /*0020*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;\n%.0s' 1 2
  } >"$1"
}
sass "$tmp/b/stage6_x" 0
sass "$tmp/b/stage8_x" 1
wgate() { env -u REPORT_FILE SASS_TEXT=1 bash common/tests/check_wgmma.sh "$tmp/b" "$@" >"$tmp/out" 2>&1; }
if wgate stage6_x; then ok "check_wgmma.sh passes a kernel whose wgmma overlap"; else bad "check_wgmma.sh fails overlapping wgmma: $(cat "$tmp/out")"; fi
if ! wgate stage8_x && grep -q "^FAIL  stage8_x: wgmma serialized" "$tmp/out"; then
  ok "check_wgmma.sh fails a kernel that waits after every wgmma"
else
  bad "check_wgmma.sh on serialized wgmma: $(cat "$tmp/out")"
fi
report_end
