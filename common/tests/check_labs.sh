#!/usr/bin/env bash
# The labs' checks behind `make test` (common/labs.py says how holes are marked), with no GPU:
#   1. the markers: every stage with LAB HOLE markers renders a lab, and filling the lab's holes
#      from the markers gives back the stage's file byte for byte; leaving any one hole unfilled
#      does not (each hole has code of its own); and the lab with any one hole left as the TODO
#      compiles with the Makefile's nvcc command (front end only, -Xcicc -O0: seconds), holes in
#      any file of the stage's folder;
#   2. the marker grammar: a BEGIN without an END, a malformed marker, a TODO outside a hole and
#      a learner's file whose holes are not the stage's are each refused with the line named;
#   3. make lab writes the lab, never overwrites a learner's edits, and RESTART=1 keeps theirs;
#   4. make grade on each unfilled lab with no GPU (GPU_NAME=): it compiles with the Makefile's
#      flags (PTX for compute_75; stage 6: compute_90, its only target) and says in one line what
#      it cannot run; a lab with a compile error fails and names the line.
# Ends with "N passed, M failed, K skipped" (common/tests/report.sh).
# usage: check_labs.sh
set -u
cd "$(dirname "$0")/../.."
. common/tests/report.sh
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"; report_cleanup' EXIT
bad() { report_bad_ "$@"; [ -f "$tmp/out" ] && sed 's/^/      /' "$tmp/out" | head -n 10; }
mk() { # make with no jobserver of the caller's, output in $tmp/out, status in $rc
  env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make --no-print-directory "$@" >"$tmp/out" 2>&1
  rc=$?
}
labs=common/labs.py

# ---- 1. every lab: generated, and filled back to the stage's file byte for byte
files=$(grep -l -E '^[[:space:]]*// LAB HOLE [0-9]+ BEGIN' stage*/*.cu stage*/*.cuh stage*/*.h 2>/dev/null)
stages=$(for f in $files; do dirname "$f"; done | sort -u)
[ -n "$stages" ] && ok "labs found: $(echo $stages)" || bad "no stage has LAB HOLE markers"
for f in $files; do
  if ! python3 $labs render "$f" >"$tmp/lab" 2>"$tmp/out"; then bad "$f: the lab does not render"; continue; fi
  if python3 $labs fill "$tmp/lab" "$f" 2>"$tmp/out" | cmp -s - "$f"; then
    ok "$f: its lab, filled from the markers, is the stage's file byte for byte"
  else
    bad "$f: its lab, filled from the markers, differs from the stage's file"
  fi
  n=$(grep -oE '// LAB HOLE [0-9]+ BEGIN' "$f" | sort -u | wc -l)
  if grep -qE '^[[:space:]]*// LAB HOLE' "$tmp/lab" && ! cmp -s "$tmp/lab" "$f" &&
    ! grep -q '// LAB TODO\|// LAB STUB' "$tmp/lab"; then
    ok "$f: the lab keeps the $n holes' markers and none of their LAB TODO/STUB lines"
  else
    bad "$f: the lab should keep the BEGIN/END markers and turn LAB TODO/STUB lines into TODO/code"
  fi
  for k in $(grep -oE '// LAB HOLE [0-9]+ BEGIN' "$f" | grep -oE '[0-9]+' | sort -un); do
    if python3 $labs fill "$tmp/lab" "$f" --except "$k" >"$tmp/one" 2>"$tmp/out" && ! cmp -s "$tmp/one" "$f"; then
      ok "$f: hole $k alone left as the TODO: not the stage's file"
    else
      bad "$f: hole $k alone left as the TODO should differ from the stage's file"
    fi
  done
done

# ---- 1b. a lab with any one hole left as the TODO (the rest filled) compiles: the stage's folder
# copied, the files with that hole's parts replaced, its attention.cu compiled with the Makefile's
# nvcc command for the stage (-Xcicc -O0 added: the front end's warnings are errors all the same,
# in seconds; LAB_JOBS=2 at a time), for the one target whose code has the holes (lab_arch) and,
# where a hole is tagged [sm80], compute_80 too
nvcc_cmd() { # nvcc_cmd STAGE_DIR ARCH: the Makefile's compile command of the stage, without -c/-o
  env -u MAKEFLAGS make -n --no-print-directory BUILD="$tmp/n$2" ARCH="$2" "$tmp/n$2/obj/$1.o" 2>/dev/null |
    grep -m 1 -- "-c $1/attention.cu -o" | sed -E 's/ -c [^ ]+ -o .*//'
}
no_gpu_arch() { # where make grade compiles STAGE_DIR's lab without a GPU: its stage.mk's
  # <stage>_LAB_ARCH (stage 6: compute_90, its only target), else compute_75 (common/labs.py)
  local a
  a=$(sed -n "s/^$1_LAB_ARCH *:\{0,1\}= *\([^ ]*\) *\$/\1/p" "$1/stage.mk" 2>/dev/null)
  echo "${a:-compute_75}"
}
lab_arch() { # stage 7's main kernel is compiled from sm_80 on; the others as make grade compiles
  case $1 in stage7_*) echo compute_80 ;; *) no_gpu_arch "$1" ;; esac
}
jobs=${LAB_JOBS:-2}  # compiles at a time
tasks=()
for s in $stages; do
  sfiles=$(for f in $files; do [ "$(dirname "$f")" = "$s" ] && echo "$f"; done)
  archs=$(lab_arch "$s")
  grep -q 'LAB HOLE [0-9]* BEGIN \[sm80\]' $sfiles && archs="$archs compute_80"
  for a in $archs; do
    cmd=$(nvcc_cmd "$s" "$a")
    if [ -z "$cmd" ]; then bad "$s: no nvcc command from make -n for $a"; continue; fi
    for k in $(grep -ohE '// LAB HOLE [0-9]+ BEGIN' $sfiles | grep -oE '[0-9]+' | sort -un); do
      i=${#tasks[@]} d=$tmp/one$i
      mkdir -p "$d/$s" && cp "$s"/*.cu "$d/$s/" && cp "$s"/*.cuh "$s"/*.h "$d/$s/" 2>/dev/null
      in=""
      for f in $sfiles; do
        grep -qE "// LAB HOLE $k BEGIN" "$f" || continue
        in="$in${in:+, }$(basename "$f")"
        python3 $labs render "$f" >"$tmp/lab.$i" && python3 $labs fill "$tmp/lab.$i" "$f" --except "$k" >"$d/$f"
      done
      echo "$cmd -Xcicc -O0 -c $d/$s/attention.cu -o $d.o" >"$tmp/cmd.$i"
      tasks+=("$s: hole $k ($in) left as the TODO, the rest filled:|compiles for $a, warnings as errors|does not compile for $a")
    done
  done
done
for i in "${!tasks[@]}"; do  # $jobs at a time
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n; done
  (bash "$tmp/cmd.$i" >"$tmp/log.$i" 2>&1; echo $? >"$tmp/rc.$i") &
done
wait
for i in "${!tasks[@]}"; do
  IFS='|' read -r what yes no <<<"${tasks[$i]}"
  if [ "$(cat "$tmp/rc.$i")" = 0 ]; then ok "$what $yes"; else cp "$tmp/log.$i" "$tmp/out"; bad "$what $no"; fi
done

# ---- 2. the grammar: each broken file refused, with its line
src=stage1_scalar_flash/attention.cu
awk '!/LAB HOLE 3 END/' "$src" >"$tmp/no_end.cu"
sed 's|// LAB HOLE 1 BEGIN: |// LAB HOLE 1 BEGIN |' "$src" >"$tmp/malformed.cu"
sed '0,/LAB HOLE 1 BEGIN/s|^\(.*LAB HOLE 1 BEGIN.*\)$|// LAB TODO: stray\n\1|' "$src" >"$tmp/stray.cu"
for t in no_end:"BEGIN without an END" malformed:"not a well-formed lab marker" stray:"outside a hole"; do
  name=${t%%:*} want=${t#*:}
  python3 $labs render "$tmp/$name.cu" >/dev/null 2>"$tmp/out"
  if [ $? -eq 2 ] && grep -q "$want" "$tmp/out" && grep -qE "$name\.cu:[0-9]+:" "$tmp/out"; then
    ok "a file with a marker $name is refused, its line named ($want)"
  else
    bad "a file with a marker $name should be refused with its line and '$want'"
  fi
done
python3 $labs render "$src" | awk '!/LAB HOLE 3 (BEGIN|END)/' >"$tmp/fewer.cu"
python3 $labs fill "$tmp/fewer.cu" "$src" >/dev/null 2>"$tmp/out"
if [ $? -eq 2 ] && grep -q "not those of" "$tmp/out"; then
  ok "a learner's file whose holes are not the stage's is refused"
else
  bad "a learner's file whose holes are not the stage's should be refused"
fi

# ---- 3. make lab: writes, keeps the learner's edits, RESTART=1 keeps theirs as a .bak
L=$tmp/labs
mk lab STAGE=1 LABS="$L"
lab1=$L/stage1_scalar_flash/attention.cu
if [ $rc -eq 0 ] && [ -f "$lab1" ] && python3 $labs render "$src" | cmp -s - "$lab1"; then
  ok "make lab STAGE=1 writes the lab"
else
  bad "make lab STAGE=1 (exit $rc) should write $lab1"
fi
echo "        S[0] += 1.f;  // the learner's line" >>"$lab1"
cp "$lab1" "$tmp/edited"
mk lab STAGE=1 LABS="$L"
if [ $rc -eq 0 ] && cmp -s "$lab1" "$tmp/edited" && grep -q "kept as it is" "$tmp/out" && grep -q "RESTART=1" "$tmp/out"; then
  ok "make lab again: the learner's edited copy is kept, and it says how to start over"
else
  bad "make lab again (exit $rc) must keep the edited copy and say how to start over"
fi
mk lab STAGE=1 LABS="$L" RESTART=1
bak=$(ls "$L"/stage1_scalar_flash/attention.cu.*.bak 2>/dev/null | head -n 1)
if [ $rc -eq 0 ] && [ -n "$bak" ] && cmp -s "$bak" "$tmp/edited" && python3 $labs render "$src" | cmp -s - "$lab1"; then
  ok "make lab RESTART=1: a fresh lab, the learner's copy kept as a .bak"
else
  bad "make lab RESTART=1 (exit $rc) should write a fresh lab and keep the old one as a .bak"
fi
rm -rf "$L"
mk lab STAGE=0 LABS="$L"
if [ $rc -ne 0 ] && grep -q "has no lab yet" "$tmp/out"; then ok "make lab STAGE=0: no lab there, said in one line"; else bad "make lab STAGE=0 (exit $rc) should say it has no lab"; fi

# ---- 4. make grade with no GPU: each unfilled lab compiles; one line says what cannot run
# (LAB_JOBS stages at a time, each in its own build folder)
for s in $stages; do
  n=${s#stage}; n=${n%%_*}
  mk lab STAGE="$n" LABS="$L"
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n; done
  (t0=$(date +%s); env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make --no-print-directory grade STAGE="$n" LABS="$L" GPU_NAME= >"$tmp/grade.$n" 2>&1
    echo "$? $(($(date +%s) - t0))" >"$tmp/grade_rc.$n") &
done
wait
for s in $stages; do
  n=${s#stage}; n=${n%%_*}
  read -r rc took <"$tmp/grade_rc.$n"
  cp "$tmp/grade.$n" "$tmp/out"
  lines=$(grep -c '' "$tmp/out")
  a=$(no_gpu_arch "$s")
  if [ $rc -eq 0 ] && [ "$lines" -eq 1 ] && grep -q "no NVIDIA GPU here: .* compiles (ARCH=$a), but the self-test and the timing need a GPU" "$tmp/out"; then
    ok "make grade STAGE=$n, the unfilled lab, no GPU: compiles, and one line says what it cannot run ($took s)"
  else
    bad "make grade STAGE=$n with no GPU (exit $rc, $lines lines): should compile and say so in one line"
  fi
done
sed -i 's|^\( *\)// LAB HOLE 3 END|\1lse[i] = m_i + logf(l_missing);\n&|' "$L/stage1_scalar_flash/attention.cu"
mk grade STAGE=1 LABS="$L" GPU_NAME=
if [ $rc -ne 0 ] && grep -q "does not compile" "$tmp/out" && grep -qE 'attention\.cu\([0-9]+\): error: identifier "l_missing"' "$tmp/out"; then
  ok "make grade on a lab that does not compile: fails and names the line"
else
  bad "make grade on a lab with a compile error (exit $rc) should fail and name the line"
fi
report_end
