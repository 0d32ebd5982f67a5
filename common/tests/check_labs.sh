#!/usr/bin/env bash
# The labs' checks behind `make test` (common/labs.py says how holes are marked), with no GPU:
#   1. the markers: every stage with LAB HOLE markers renders a lab, and filling the lab's holes
#      from the markers gives back the stage's file byte for byte; leaving any one hole unfilled
#      does not (each hole has code of its own); and the lab with any one hole left as the TODO
#      compiles with the Makefile's nvcc command, front end only (-fdevice-syntax-only, and the
#      host compiler's -fsyntax-only: every warning of both, as errors, in seconds; the code
#      generation of a lab is what make grade compiles in 4), holes in any file of the folder;
#   2. the marker grammar: a BEGIN without an END, a malformed marker, a TODO outside a hole and
#      a learner's file whose holes are not the stage's are each refused with the line named;
#   3. make lab writes the lab, never overwrites a learner's edits, and RESTART=1 keeps theirs;
#   4. make grade on each unfilled lab with no GPU (GPU_NAME=): it compiles with the Makefile's
#      flags (PTX for compute_75; stage 6: compute_90, its only target), says in one line what
#      compiled and that nothing was graded, and fails with the programs' "unsupported here"
#      (labs.py exits ATTN_EXIT_UNSUPPORTED, 3; make reports its "Error 3" and exits 2, as make
#      does when a recipe fails); a lab with a compile error fails and names the line.
# The compiles of 1 and 4 are independent: one queue runs them, the longest first, as many at a
# time as there are cores (nproc; LAB_JOBS=n for another number), while 2 and 3 run.
# Ends with "N passed, M failed, K skipped" (common/tests/report.sh).
# usage: check_labs.sh
set -u
cd "$(dirname "$0")/../.."
. common/tests/report.sh
. common/exit_codes.sh || exit 1 # ATTN_EXIT_*: the programs' exit codes, from attention.h
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"; report_cleanup' EXIT
bad() { report_bad_ "$@"; [ -f "$tmp/out" ] && sed 's/^/      /' "$tmp/out" | head -n 10; }
mk() { # make with no jobserver of the caller's, output in $tmp/out, status in $rc
  env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make --no-print-directory "$@" >"$tmp/out" 2>&1
  rc=$?
}
labs=common/labs.py
jobs=${LAB_JOBS:-$(nproc 2>/dev/null || echo 2)} # compiles at a time

# ---- 1. every lab: generated, and filled back to the stage's file byte for byte; each hole
# alone left as the TODO differs from it. One python process (labs.py's render and fill, which
# its command line runs: section 2 runs that), which also writes the trees of 1b: for each stage
# and hole, the stage's folder with that hole's parts left as the TODO, the rest filled
files=$(grep -l -E '^[[:space:]]*// LAB HOLE [0-9]+ BEGIN' stage*/*.cu stage*/*.cuh stage*/*.h 2>/dev/null)
stages=$(for f in $files; do dirname "$f"; done | sort -u)
[ -n "$stages" ] && ok "labs found: $(echo $stages)" || bad "no stage has LAB HOLE markers"
# shellcheck disable=SC2086
python3 - "$tmp/one" $files >"$tmp/marks" 2>"$tmp/marks.err" <<'EOF'
import re, shutil, sys
from pathlib import Path
sys.path.insert(0, "common")
import labs
one, files = Path(sys.argv[1]), sys.argv[2:]
holes = {}  # stage -> hole -> [files]
for f in files:
    text = Path(f).read_text()
    try:
        lab = labs.render(text, f)
    except labs.LabError as e:
        print(f"FAIL\t{f}: the lab does not render: {e}")
        continue
    try:
        same = labs.fill(lab, text, set(), f, f) == text
    except labs.LabError:
        same = False
    print(f"{'ok' if same else 'FAIL'}\t{f}: its lab, filled from the markers, "
          + ("is the stage's file byte for byte" if same else "differs from the stage's file"))
    ns = sorted({int(n) for n in re.findall(r"// LAB HOLE (\d+) BEGIN", text)})
    kept = (re.search(r"^[ \t]*// LAB HOLE", lab, re.M) and lab != text
            and "// LAB TODO" not in lab and "// LAB STUB" not in lab)
    print(f"ok\t{f}: the lab keeps the {len(ns)} holes' markers and none of their LAB TODO/STUB lines"
          if kept else f"FAIL\t{f}: the lab should keep the BEGIN/END markers and turn LAB TODO/STUB "
          "lines into TODO/code")
    s = str(Path(f).parent)
    for k in ns:
        try:
            body = labs.fill(lab, text, {k}, f, f)
        except labs.LabError:
            body = text
        print(f"ok\t{f}: hole {k} alone left as the TODO: not the stage's file" if body != text
              else f"FAIL\t{f}: hole {k} alone left as the TODO should differ from the stage's file")
        d = one / f"{s}.{k}" / s
        if not d.exists():
            d.mkdir(parents=True)
            for src in Path(s).iterdir():
                if src.suffix in labs.SOURCE_SUFFIXES and src.is_file():
                    shutil.copy(src, d / src.name)
        (d / Path(f).name).write_text(body)
        holes.setdefault(s, {}).setdefault(k, []).append(Path(f).name)
for s in holes:
    for k in sorted(holes[s]):
        print(f"tree\t{s}\t{k}\t{', '.join(holes[s][k])}")
EOF
[ -s "$tmp/marks.err" ] && { cp "$tmp/marks.err" "$tmp/out"; bad "labs.py's render and fill, in one process: $(tail -n 1 "$tmp/marks.err")"; }
while IFS=$'\t' read -r status what; do
  case $status in ok) ok "$what" ;; FAIL) rm -f "$tmp/out"; bad "$what" ;; esac
done <"$tmp/marks"

# ---- 1b. a lab with any one hole left as the TODO (the rest filled) compiles: the tree above, its
# attention.cu compiled with the Makefile's nvcc command for the stage, front end only (device
# and host: what a TODO can break; make grade in 4 compiles an unfilled lab to PTX), for the one
# target whose code has the holes (lab_arch) and, where a hole is tagged [sm80], compute_80 too
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
tasks=()    # i -> "check|passes|fails": what each compile of the queue checks
queue=()    # i -> its command (run from the repository's root)
cost=()     # i -> its rough cost, for the order (the longest first)
for s in $stages; do
  sfiles=$(for f in $files; do [ "$(dirname "$f")" = "$s" ] && echo "$f"; done)
  archs=$(lab_arch "$s")
  grep -q 'LAB HOLE [0-9]* BEGIN \[sm80\]' $sfiles && archs="$archs compute_80"
  for a in $archs; do
    cmd=$(nvcc_cmd "$s" "$a")
    if [ -z "$cmd" ]; then bad "$s: no nvcc command from make -n for $a"; continue; fi
    while IFS=$'\t' read -r _ _ k in; do
      i=${#tasks[@]} d=$tmp/one/$s.$k
      queue[i]="$cmd -fdevice-syntax-only -Xcompiler -fsyntax-only -c $d/$s/attention.cu -o $d.$a.o"
      cost[i]=1
      tasks[i]="$s: hole $k ($in) left as the TODO, the rest filled:|compiles for $a (front end, warnings as errors)|does not compile for $a"
    done < <(grep -P "^tree\t$s\t" "$tmp/marks")
  done
done

# ---- 4, queued with 1b: make grade with no GPU on each unfilled lab (labs of their own in $G;
# each stage's build folder is its own, build/lab/<stage>/): compiles it, says so in one line,
# grades nothing and exits ATTN_EXIT_UNSUPPORTED; and a lab with a compile error
G=$tmp/glabs
for s in $stages; do
  n=${s#stage}; n=${n%%_*}
  i=${#tasks[@]}
  queue[i]="env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make --no-print-directory lab STAGE=$n LABS='$G' >'$tmp/lab.$i' 2>&1 &&
    env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make --no-print-directory grade STAGE=$n LABS='$G' GPU_NAME="
  cost[i]=$((10 + $(cat "$s"/*.cu "$s"/*.cuh 2>/dev/null | wc -l) / 100)) # a whole compile: first
  tasks[i]="grade $s"
done
E=$tmp/elabs # the lab of stage 1 with a compile error, in a labs folder of its own
mk lab STAGE=1 LABS="$E"
sed -i 's|^\( *\)// LAB HOLE 3 END|\1lse[i] = m_i + logf(l_missing);\n&|' "$E/stage1_scalar_flash/attention.cu"
i=${#tasks[@]}
queue[i]="env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make --no-print-directory grade STAGE=1 LABS='$E' GPU_NAME="
cost[i]=1
tasks[i]="grade error"

# the queue, in the background: the longest first, $jobs at a time; each writes its output to
# $tmp/log.i and "EXIT SECONDS" to $tmp/rc.i
order=$(for i in "${!queue[@]}"; do echo "${cost[i]} $i"; done | sort -k1,1nr -k2,2n | cut -d' ' -f2)
(
  for i in $order; do
    while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n; done
    (t0=$(date +%s); bash -c "${queue[i]}" >"$tmp/log.$i" 2>&1; echo "$? $(($(date +%s) - t0))" >"$tmp/rc.$i") &
  done
  wait
) &
queue_pid=$!

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

# ---- the queue's results: 1b, then 4
wait "$queue_pid"
for i in "${!tasks[@]}"; do
  case ${tasks[i]} in grade*) continue ;; esac
  IFS='|' read -r what yes no <<<"${tasks[i]}"
  rc=-1 took=-1; read -r rc took <"$tmp/rc.$i" # -1: the task left no exit code
  if [ "$rc" = 0 ]; then ok "$what $yes"; else cp "$tmp/log.$i" "$tmp/out"; bad "$what $no"; fi
done
for i in "${!tasks[@]}"; do
  case ${tasks[i]} in "grade stage"*) ;; *) continue ;; esac
  s=${tasks[i]#grade } n=${s#stage}; n=${n%%_*}
  rc=-1 took=-1; read -r rc took <"$tmp/rc.$i" # -1: the task left no exit code
  cp "$tmp/log.$i" "$tmp/out"
  a=$(no_gpu_arch "$s")
  # labs.py's one line, then make's own line for the failed recipe: "Error 3"
  if [ "$rc" -eq 2 ] && [ "$(grep -c '' "$tmp/out")" -eq 2 ] &&
    grep -q "^make grade: no NVIDIA GPU here: .* compiles (ARCH=$a, PTX only), but nothing was graded: the self-test and the timing need a GPU" "$tmp/out" &&
    grep -qE "^make: \*\*\* \[.*grade\] Error $ATTN_EXIT_UNSUPPORTED\$" "$tmp/out"; then
    ok "make grade STAGE=$n, the unfilled lab, no GPU: compiles, one line says nothing was graded, exit $ATTN_EXIT_UNSUPPORTED (unsupported here) ($took s)"
  else
    bad "make grade STAGE=$n with no GPU (make's exit $rc, $(grep -c '' "$tmp/out") lines): should compile, say in one line that nothing was graded, and fail with exit $ATTN_EXIT_UNSUPPORTED"
  fi
done
# the grader's own exit code: labs.py, as make grade runs it (stage 1's build is there: no compile)
python3 $labs --labs "$G" grade 1 --gpu-name '' >"$tmp/out" 2>&1
rc=$?
if [ "$rc" -eq "$ATTN_EXIT_UNSUPPORTED" ] && grep -q "nothing was graded" "$tmp/out"; then
  ok "labs.py grade with no GPU: exit $ATTN_EXIT_UNSUPPORTED (unsupported here), not 0: nothing was graded"
else
  bad "labs.py grade with no GPU: exit $rc, want $ATTN_EXIT_UNSUPPORTED (ATTN_EXIT_UNSUPPORTED)"
fi
for i in "${!tasks[@]}"; do [ "${tasks[i]}" = "grade error" ] && break; done
rc=-1 took=-1; read -r rc took <"$tmp/rc.$i"
cp "$tmp/log.$i" "$tmp/out"
if [ "$rc" -gt 0 ] && grep -q "does not compile" "$tmp/out" && grep -qE 'attention\.cu\([0-9]+\): error: identifier "l_missing"' "$tmp/out"; then
  ok "make grade on a lab that does not compile: fails and names the line"
else
  bad "make grade on a lab with a compile error (exit $rc) should fail and name the line"
fi
report_end
