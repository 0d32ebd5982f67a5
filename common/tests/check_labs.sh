#!/usr/bin/env bash
# The labs' checks behind `make test` (common/labs.py says how holes are marked), with no GPU:
#   1. the markers: every stage with LAB HOLE markers (and the capstone) renders a lab, and
#      filling the lab's holes from the markers gives back the stage's file byte for byte; the
#      lab keeps each marker line's indentation; leaving any one hole unfilled does not give the
#      file back (each hole has code of its own); and the lab with any one hole left as the TODO
#      compiles with the Makefile's nvcc command, front end only (-fdevice-syntax-only, and the
#      host compiler's -fsyntax-only: every warning of both, as errors, in seconds; the code
#      generation of a lab is what make grade compiles in 4), holes in any file of the folder;
#      a stage that is a program of its own (stage 10: its stage.mk's <stage>_PROGRAM_SOURCES)
#      compiles its program's source (ring.cu) with its stage.mk's command, NCCL's header
#      included; where the program cannot be built here (no NCCL) a SKIP line says why;
#      the capstone's solution (stage 5's kernel behind its contract) compiles the same way;
#   2. the marker grammar: a BEGIN without an END, a malformed marker, a TODO outside a hole, an
#      unknown tag and a learner's file whose holes are not the stage's are each refused with the
#      line named; a [smem>=N] part is not gradable where a block gets less shared memory (the
#      T4 and L4 paths, a T4, an L4) and is where it gets N (an H200); a [gpus>=N] part is not
#      gradable on a machine with fewer GPUs and is on one with N;
#   3. labs.py lint on every lab: markers indented alike, hints numbered per hole, and no line of
#      a [design] hole's solution in its TODO or its first hint; every stage of DESIGN_STAGES
#      has a [design] hole; and fixtures that break each rule fail it, naming the rule;
#   4. make lab writes the lab, never overwrites a learner's edits, and RESTART=1 keeps theirs;
#      make capstone writes the capstone's; make read prints a stage's files without a marker
#      line, each line numbered as in its file; make diff shows an edit's diff, and says of a
#      rewrite (stages 5-8) that it is one, with its files by role (ALL=1: the whole diff), and
#      of a program of its own (stage 10) that it is one, pointing to make read and its code map;
#   5. make grade on each unfilled lab with no GPU (GPU_NAME=; but GRADE_SKIP's stages, whose
#      whole compile takes minutes: their holes compile in 1, one by one): it compiles with the
#      Makefile's flags (PTX for compute_75 and sm_75 machine code from it), prints the
#      registers, spills and stack frame of the kernels that hold the holes' code (stage 1:
#      beside the stage's own, built too; the others: YOURS_ONLY=1, the learner's alone), says
#      in one line that nothing was graded, and fails with the programs'
#      "unsupported here" (labs.py exits ATTN_EXIT_UNSUPPORTED, 3; make reports its "Error 3"
#      and exits 2, as make does when a recipe fails); a lab with a compile error fails and names
#      the line; a program of its own that cannot be built here (stage 10 with NCCL_ROOT=, as
#      where there is no NCCL) says so in one line and fails with exit 3 (make's "Error 3").
# The compiles of 1 and 5 are independent: one queue runs them, the longest first, as many at a
# time as there are cores (nproc; LAB_JOBS=n for another number), while 2, 3 and 4 run. Only what
# changed is compiled again: a front-end compile of 1b that passed is remembered under a hash of
# all it reads (the compile command, nvcc's and g++'s versions, the lab's tree, common/'s headers
# and the folders its sources include: an edit of one stage compiles that stage's labs again, and
# those that include it) in $FLASHCOURSE_CACHE/labs-syntax (~/.cache/flashcourse), and
# the same compile passes from there, said so on its line; LAB_CACHE=0 compiles everything. A
# failing compile is never remembered; CI starts with no cache.
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
# The stages whose lab must have a [design] hole (numbers, space-separated): a stage joins when its
# lab is redesigned, and the check then fails if it loses its design holes.
DESIGN_STAGES="1 2 3 4 5 6 7 8 9 10"

# ---- 1. every lab: generated, and filled back to the stage's file byte for byte; each hole
# alone left as the TODO differs from it. One python process (labs.py's render and fill, which
# its command line runs: section 2 runs that), which also writes the trees of 1b: for each stage
# and hole, the stage's folder with that hole's parts left as the TODO, the rest filled
files=$(grep -l -E '^[[:space:]]*// LAB HOLE [0-9]+ BEGIN' stage*/*.cu stage*/*.cuh stage*/*.h capstone/*.cu 2>/dev/null)
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
    indent = all(p["begin"] == q["begin"] and p["end"] == q["end"] and
                 [re.match(r"[ \t]*", ln).group() for ln in p["body"].splitlines()
                  if ln.lstrip().startswith("// TODO:")] ==
                 [m.group(1) for m in map(labs.TODO.match, q["body"].splitlines()) if m]
                 for p, q in zip(labs.parts_of(labs.parse(lab, f)), labs.parts_of(labs.parse(text, f))))
    print(f"{'ok' if indent else 'FAIL'}\t{f}: the lab's marker lines keep their indentation"
          + ("" if indent else " (a BEGIN, END or TODO line of the lab is indented otherwise)"))
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
# and host: what a TODO can break; make grade in 5 compiles an unfilled lab), for the one target
# whose code has the holes (lab_arch) and, where a hole is tagged [sm80], compute_80 too; and the
# capstone's solution, capstone/attention.cu itself (the stages' own files: the fat build's)
main_source() { # main_source DIR: the file its program compiles: attention.cu, or the first of its
  # stage.mk's <stage>_PROGRAM_SOURCES (a program of its own: stage 10's ring.cu)
  local f
  f=$(sed -n "s/^$1_PROGRAM_SOURCES *:\{0,1\}= *\([^ ]*\).*\$/\1/p" "$1/stage.mk" 2>/dev/null)
  echo "${f:-attention.cu}"
}
nvcc_cmd() { # nvcc_cmd STAGE_DIR ARCH: the Makefile's compile command of the stage, without -c/-o
  env -u MAKEFLAGS make -n --no-print-directory BUILD="$tmp/n$2" ARCH="$2" "$tmp/n$2/obj/$1.o" 2>/dev/null |
    grep -m 1 -- "-c $1/$(main_source "$1") -o" | sed -E 's/ -c [^ ]+ -o .*//'
}
own_program() { # own_program DIR: a stage that is a program of its own (stage 10)
  grep -q "^$1_PROGRAM_SOURCES *:\{0,1\}=" "$1/stage.mk" 2>/dev/null
}
unbuildable() { # unbuildable STAGE_DIR: why its program cannot be built here, the line its
  # stage.mk prints then ("make: <stage> skipped: why": stage 10 without NCCL), or nothing
  own_program "$1" || return 0
  env -u MAKEFLAGS make -n --no-print-directory BUILD="$tmp/u" "$tmp/u/$1" 2>/dev/null |
    sed -n "s/^echo [\"']make: $1 skipped: \(.*\)[\"']\$/\1/p" | head -n 1
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
keys=()     # i -> a front-end compile's hash of all it reads (its pass remembered under it)
cache=
if [ "${LAB_CACHE:-1}" != 0 ]; then
  cache=${FLASHCOURSE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/flashcourse}/labs-syntax
  mkdir -p "$cache" 2>/dev/null || cache=
fi
# what every front-end compile reads besides its lab's tree and its nvcc: common/'s headers (and the
# host compiler nvcc runs: the first g++ on PATH, nvcc's default); a folder's compile also reads
# the folders its sources include ("../stage5_tuned/attention.cu"), theirs too: included_dirs
common_sum=$({ g++ --version 2>&1 | head -n 1; cat common/*.h common/device/*.cuh; } | sha256sum | cut -d' ' -f1)
included_dirs() { # included_dirs DIR: the folders DIR's sources include, and theirs, DIR left out
  local todo=" $1 " seen=" " d
  while [ -n "${todo// /}" ]; do
    read -r d todo <<<"$todo"
    case "$seen" in *" $d "*) continue ;; esac
    seen="$seen$d "
    todo="$todo $(cat "$d"/*.cu "$d"/*.cuh "$d"/*.h 2>/dev/null | sed -n 's|^ *#include "\.\./\([^/"]*\)/.*|\1|p' | sort -u | tr '\n' ' ')"
  done
  echo "${seen/ $1 / }"
}
declare -A nvcc_version=() # nvcc's path -> its --version
declare -A dir_sum=()      # a folder -> the hash of common_sum and the folders it includes
key_of() { # key_of COMMAND TREE DIR: sets key to the hash a front-end compile's pass is remembered
  # under (TREE: the lab's copy of the folder DIR)
  local nv=${1%% *} d
  [ -n "${nvcc_version[$nv]+set}" ] || nvcc_version[$nv]=$("$nv" --version 2>&1)
  if [ -z "${dir_sum[$3]+set}" ]; then
    dir_sum[$3]=$({ echo "$common_sum"; for d in $(included_dirs "$3"); do echo "$d"; cat "$d"/*; done; } |
      sha256sum | cut -d' ' -f1)
  fi
  key=$({ echo "${dir_sum[$3]}"; echo "${nvcc_version[$nv]}"; echo "${1//$tmp/TMP}"; cat "$2"/* 2>/dev/null; } |
    sha256sum | cut -d' ' -f1)
}
for s in $stages; do
  sfiles=$(for f in $files; do [ "$(dirname "$f")" = "$s" ] && echo "$f"; done)
  archs=$(lab_arch "$s")
  grep -q 'LAB HOLE [0-9]* BEGIN .*\[sm80\]' $sfiles && archs="$archs compute_80"
  for a in $archs; do
    cmd=$(nvcc_cmd "$s" "$a")
    why=
    [ -z "$cmd" ] && why=$(unbuildable "$s")
    if [ -n "$why" ]; then skip "$s: its holes left as the TODO, compiled for $a: $why"; continue; fi
    if [ -z "$cmd" ]; then bad "$s: no nvcc command from make -n for $a"; continue; fi
    while IFS=$'\t' read -r _ _ k in; do
      i=${#tasks[@]} d=$tmp/one/$s.$k
      queue[i]="$cmd -fdevice-syntax-only -Xcompiler -fsyntax-only -c $d/$s/$(main_source "$s") -o $d.$a.o"
      cost[i]=1
      [ -n "$cache" ] && key_of "${queue[i]}" "$d/$s" "$s" && keys[i]=$key
      tasks[i]="$s: hole $k ($in) left as the TODO, the rest filled:|compiles for $a (front end, warnings as errors)|does not compile for $a"
    done < <(grep -P "^tree\t$s\t" "$tmp/marks")
  done
done
cmd=$(nvcc_cmd capstone compute_75)
if [ -z "$cmd" ]; then
  bad "capstone: no nvcc command from make -n for compute_75 (the Makefile's capstone rules)"
else
  i=${#tasks[@]}
  queue[i]="$cmd -fdevice-syntax-only -Xcompiler -fsyntax-only -c capstone/attention.cu -o $tmp/capstone.o"
  cost[i]=3
  [ -n "$cache" ] && key_of "${queue[i]}" capstone capstone && keys[i]=$key
  tasks[i]="capstone/attention.cu, the capstone's solution (stage 5's kernel behind its contract),|compiles for compute_75 (front end, warnings as errors)|does not compile for compute_75"
fi

# ---- 5, queued with 1b: make grade with no GPU on each unfilled lab (labs of their own in $G;
# each stage's build folder is its own, build/lab/<stage>/): compiles it, prints its kernels'
# registers and spills (stage 1 beside the stage's own: one more compile; the others alone,
# YOURS_ONLY=1), says that nothing was graded and exits ATTN_EXIT_UNSUPPORTED; and a lab with a
# compile error
# The whole compile of a lab is up to minutes on a 2-core machine (stage 8 with the forward it
# links about 205 s of CPU, stage 6 172 s, stage 3 73 s, stage 7 51 s, the others 6-20 s), and
# CI's 20 minutes are tight: stage 1 (its table beside the stage's own) and the capstone show
# that a lab builds whole without a GPU; every other lab's holes compile above one by one (front
# end), and make grade builds them whole on a GPU (gpu_labs.sh). GRADE_SKIP: the stages this
# check does not compile whole (stage 10: its holes compile above, and its grade where its program
# cannot be built is checked below; GRADE_SKIP= compiles every lab whole, stage 10's program
# without the stage libraries it loads).
G=$tmp/glabs
GRADE_SKIP=${GRADE_SKIP-"stage2_smem_tiling stage3_cp_async stage4_wmma stage5_tuned stage6_hopper stage7_backward stage8_hopper_backward stage9_decode stage10_context_parallel"}
for s in $stages; do
  case " $GRADE_SKIP " in *" $s "*) continue ;; esac
  n=${s#stage}; n=${n%%_*}
  i=${#tasks[@]}
  queue[i]="env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make --no-print-directory lab STAGE=$n LABS='$G' >'$tmp/lab.$i' 2>&1 &&
    env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make --no-print-directory grade STAGE=$n LABS='$G' GPU_NAME= $([ "$n" = 1 ] || echo YOURS_ONLY=1)"
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
    k=${keys[i]:-}
    if [ -n "$k" ] && [ -f "$cache/$k" ]; then # the same compile passed before: nothing changed
      echo "0 0 cached" >"$tmp/rc.$i"
      continue
    fi
    (t0=$(date +%s); bash -c "${queue[i]}" >"$tmp/log.$i" 2>&1; r=$?
      [ "$r" = 0 ] && [ -n "$k" ] && : >"$cache/$k"
      echo "$r $(($(date +%s) - t0))" >"$tmp/rc.$i") &
  done
  wait
) &
queue_pid=$!

# ---- 2. the grammar: each broken file refused, with its line
src=stage1_scalar_flash/attention.cu
tac "$src" | awk '!gone && /LAB HOLE [0-9]+ END/ { gone = 1; next } 1' | tac >"$tmp/no_end.cu" # the last END
sed 's|\(// LAB HOLE 1 BEGIN[^:]*\): |\1 |' "$src" >"$tmp/malformed.cu"
sed '0,/LAB HOLE 1 BEGIN/s|^\(.*LAB HOLE 1 BEGIN.*\)$|// LAB TODO: stray\n\1|' "$src" >"$tmp/stray.cu"
sed 's|// LAB HOLE 1 BEGIN|// LAB HOLE 1 BEGIN [t5]|' "$src" >"$tmp/tag.cu"
for t in no_end:"BEGIN without an END" malformed:"not a well-formed lab marker" stray:"outside a hole" tag:"tag [t5] is not one of"; do
  name=${t%%:*} want=${t#*:}
  python3 $labs render "$tmp/$name.cu" >/dev/null 2>"$tmp/out"
  if [ $? -eq 2 ] && grep -qF "$want" "$tmp/out" && grep -qE "$name\.cu:[0-9]+:" "$tmp/out"; then
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

# [smem>=N]: which parts the grader can run where (labs.unrun_parts, as make grade decides it),
# for a hole of two parts, one of them [smem>=132096] (as stage 7's shared-memory kernel's)
python3 - >"$tmp/smem" 2>&1 <<'EOF'
import sys
sys.path.insert(0, "common")
import labs
text = """// x
    // LAB HOLE 1 BEGIN [design]: the hole: its registers part
    int a = 1;
    // LAB HOLE 1 END
    // LAB HOLE 1 BEGIN [design] [smem>=132096]: the hole: its shared-memory part
    int b = 2;
    // LAB HOLE 1 END
    // LAB HOLE 2 BEGIN [smem>=132096]: all of it in the shared-memory kernel
    int c = 3;
    // LAB HOLE 2 END
"""
parts = labs.parts_of(labs.parse(text, "fixture.cu"))
holes = {}
for p in parts:
    holes.setdefault(p["hole"], []).append(dict(p, file="fixture.cu"))
assert parts[0]["design"] and parts[1]["smem"] == 132096 and not parts[0]["smem"]
cases = [("an H200", "90", ""), ("an H200, the T4 path (--smem-limit 65536)", "90", "65536"),
         ("an H200, the L4 path (--smem-limit 101376)", "90", "101376"), ("a T4", "75", ""),
         ("an L4", "89", ""), ("an A100", "80", "")]
for what, cc, limit in cases:
    unrun = labs.unrun_parts(holes, {"": ("x", limit, "", True)}, cc)
    print(what, len(unrun[1]), len(unrun[2]), unrun[2][0]["why"] if unrun[2] else "")
EOF
want="an H200 0 0 |an H200, the T4 path (--smem-limit 65536) 1 1 its code runs only where a block may use 132,096 bytes of shared memory, and --smem-limit gives it 65,536|an H200, the L4 path (--smem-limit 101376) 1 1 its code runs only where a block may use 132,096 bytes of shared memory, and --smem-limit gives it 101,376|a T4 1 1 its code runs only where a block may use 132,096 bytes of shared memory, and this GPU (sm_75) gives it 65,536|an L4 1 1 its code runs only where a block may use 132,096 bytes of shared memory, and this GPU (sm_89) gives it 101,376|an A100 0 0 |"
if [ "$(tr '\n' '|' <"$tmp/smem")" = "$want" ]; then
  ok "[smem>=N]: a part is not gradable where a block gets less shared memory (the T4 and L4 paths, a T4, an L4: the reason named) and is on an H200 and an A100; a hole's other parts still are"
else
  cp "$tmp/smem" "$tmp/out"; bad "[smem>=N]: the parts the grader can run per GPU and path are not as expected"
fi
# [gpus>=N]: a hole of one part that runs on 2 GPUs or more (stage 10's ring), and one on any
python3 - >"$tmp/gpus" 2>&1 <<'EOF'
import sys
sys.path.insert(0, "common")
import labs
text = """// x
    // LAB HOLE 1 BEGIN [design] [gpus>=2]: the ring's transfer
    int a = 1;
    // LAB HOLE 1 END
    // LAB HOLE 2 BEGIN: on any number of GPUs
    int b = 2;
    // LAB HOLE 2 END
"""
holes = {}
for p in labs.parts_of(labs.parse(text, "fixture.cu")):
    holes.setdefault(p["hole"], []).append(dict(p, file="fixture.cu"))
for gpus in (1, 2, 8, None):
    unrun = labs.unrun_parts(holes, {"": ("x", "", "", True)}, "90", gpus)
    print(gpus, len(unrun[1]), len(unrun[2]), unrun[1][0]["why"] if unrun[1] else "")
EOF
want="1 1 0 its code runs only where the program has 2 GPUs or more, and this machine has 1|2 0 0 |8 0 0 |None 0 0 |"
if [ "$(tr '\n' '|' <"$tmp/gpus")" = "$want" ]; then
  ok "[gpus>=N]: a part is not gradable on a machine with fewer GPUs (the reason named), and is with N or more; a hole without the tag always is"
else
  cp "$tmp/gpus" "$tmp/out"; bad "[gpus>=N]: the parts the grader can run per number of GPUs are not as expected"
fi

# ---- 3. lint: every lab (markers, hints, design holes), then fixtures that break each rule
python3 $labs lint $stages --need-design "$DESIGN_STAGES" >"$tmp/out" 2>&1
if [ $? -eq 0 ]; then
  ok "labs.py lint: every lab's markers indented alike, its hints numbered per hole, no [design] hole's solution line in its TODO or first hint; a [design] hole in each of DESIGN_STAGES (${DESIGN_STAGES:-none yet})"
else
  bad "labs.py lint: $(grep -c '' "$tmp/out") problems"
fi
F=$tmp/fx/stage99_fixture # a lab of one design hole that passes; each fixture breaks one rule
mkdir -p "$F"
cat >"$F/attention.cu.ok" <<'EOF'
__device__ float twice_plus_one(float x) {
    // LAB HOLE 1 BEGIN [design]: y from x
    // LAB TODO: y is twice x, plus one.
    // LAB STUB: return x;
    const float y = fmaf(x, 2.0f, 1.0f);
    return y;
    // LAB HOLE 1 END
}
EOF
cat >"$F/LAB.md.ok" <<'EOF'
<details><summary>Hint 1.1: the idea</summary>

A fused multiply-add.
</details>

<details><summary>Hint 1.2: the code</summary>

`const float y = fmaf(x, 2.0f, 1.0f);`
</details>
EOF
fixture() { # fixture NAME WANT [--need-design 99] with $F/attention.cu, $F/LAB.md written
  python3 $labs lint "$F" "${@:3}" >"$tmp/out" 2>&1
  local rc=$?
  if [ "$1" = passes ]; then
    [ $rc -eq 0 ] && ok "lint fixture: $2 passes" || bad "lint fixture: $2 should pass"
  elif [ $rc -eq 1 ] && grep -qF -- "$2" "$tmp/out"; then
    ok "lint fixture: $1 fails it ($2)"
  else
    bad "lint fixture: $1 should fail lint with '$2' (exit $rc)"
  fi
}
fx() { cp "$F/attention.cu.ok" "$F/attention.cu"; cp "$F/LAB.md.ok" "$F/LAB.md"; }
fx; fixture passes "a design hole whose TODO and Hint 1.1 hold no line of its solution" --need-design 99
fx; sed -i 's|// LAB TODO: y is twice x, plus one.|// LAB TODO: const float y = fmaf(x, 2.0f, 1.0f);|' "$F/attention.cu"
fixture "a solution line in a design hole's TODO" "attention.cu:5: hole 1 [design]: its TODO holds this line of the solution: const float y = fmaf(x, 2.0f, 1.0f)"
fx; sed -i 's|^A fused multiply-add.|A fused multiply-add: `const float y = fmaf(x,2.0f,1.0f)`.|' "$F/LAB.md"
fixture "a solution line, spaced otherwise, in a design hole's first hint" "its Hint 1.1 holds this line of the solution"
fx; sed -i 's|Hint 1.1: the idea|Hint 1.3: the idea|' "$F/LAB.md"
fixture "a design hole without a Hint 1.1" "hole 1 [design] has no Hint 1.1"
fx; printf '%s\n' '<details><summary>Hint 2.1: the idea</summary>' 'x' '</details>' >>"$F/LAB.md"
fixture "a hint for a hole the stage does not have" "Hint 2.1 is for hole 2"
fx; sed -i 's|// LAB HOLE 1 BEGIN \[design\]:|// LAB HOLE 1 BEGIN:|' "$F/attention.cu"
fixture "a stage of DESIGN_STAGES without a design hole" "no [design] hole" --need-design 99
fx; sed -i 's|^    // LAB STUB: return x;|        // LAB STUB: return x;|' "$F/attention.cu"
fixture "a marker indented otherwise than its BEGIN" "a marker indented otherwise than its BEGIN"
fx; printf '%s\n' '// LAB HOLE 1 BEGIN: y from x, a second part' '// LAB HOLE 1 END' >>"$F/attention.cu"
fixture "a hole with [design] on some of its parts only" "[design] on some of its parts only"

# ---- 4. make lab: writes, keeps the learner's edits, RESTART=1 keeps theirs as a .bak
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
mk capstone LABS="$L"
if [ $rc -eq 0 ] && python3 $labs render capstone/attention.cu | cmp -s - "$L/capstone/attention.cu" &&
  ! grep -q '#include "\.\./stage' "$L/capstone/attention.cu"; then
  ok "make capstone writes labs/capstone/attention.cu: the contract and the signatures, not the solution"
else
  bad "make capstone (exit $rc) should write the capstone's lab"
fi
# make read: each stage's files, every line but the markers, numbered as in its file
for s in $stages; do
  n=${s#stage}; n=${n%%_*}
  mk read STAGE="$n"
  want=0
  for f in "$s"/*.cu "$s"/*.cuh "$s"/*.h; do
    [ -f "$f" ] && want=$((want + $(grep -c '' "$f") - $(grep -c -E '^[[:space:]]*// LAB (HOLE [0-9]+ (BEGIN|END)|TODO:|STUB:)' "$f") + 1))
  done
  first=$(grep -v '^// ==== ' "$tmp/out" | head -n 1)
  if [ $rc -eq 0 ] && [ "$(grep -c '' "$tmp/out")" -eq "$want" ] && ! grep -q -E '// LAB (HOLE|TODO|STUB)' "$tmp/out" &&
    [ "$first" = "    1  $(head -n 1 "$(grep -m 1 '^// ==== ' "$tmp/out" | cut -d' ' -f3)")" ]; then
    ok "make read STAGE=$n: its files without a marker line, every other line numbered as in its file"
  else
    bad "make read STAGE=$n (exit $rc, $(grep -c '' "$tmp/out") lines, want $want): its files without the markers, lines numbered"
  fi
done
# make diff: an edit's whole diff, a rewrite's one line and its files by role (stages 5-8)
for n in $(seq 1 "$(ls -d stage[0-9]*_* | sed -E 's/^stage([0-9]+)_.*/\1/' | sort -n | tail -n 1)"); do
  if ! ls stage"$n"_*/attention.cu >/dev/null 2>&1; then # stage 10: a program of its own
    s=$(ls -d stage"$n"_* 2>/dev/null | head -n 1)
    [ -n "$s" ] && own_program "$s" || continue
    mk diff STAGE="$n"
    if [ $rc -eq 0 ] && [ "$(grep -c '' "$tmp/out")" -eq 1 ] &&
      grep -q "^make diff: $s is a program of its own, .*README.md, \"Code map\"; make read STAGE=$n)\$" "$tmp/out"; then
      ok "make diff STAGE=$n: a program of its own, said in one line, pointing to its code map and make read STAGE=$n"
    else
      bad "make diff STAGE=$n (exit $rc): should say in one line that $s is a program of its own and point to make read STAGE=$n"
    fi
    continue
  fi
  mk diff STAGE="$n"
  markers=$(grep -c -E '^[-+ ].*// LAB (HOLE [0-9]+ (BEGIN|END)|TODO:|STUB:)' "$tmp/out")
  if [ $rc -ne 0 ] || [ "$markers" -ne 0 ]; then
    bad "make diff STAGE=$n: exit $rc, $markers marker lines in it"
  elif head -n 1 "$tmp/out" | grep -q "^make diff: stage${n}_[a-z_0-9]* rewrites .*make read STAGE=$n)\. Its files, by role:$"; then
    ok "make diff STAGE=$n: a rewrite, said in one line, then its files by role"
  elif [ "$n" -ge 5 ] && [ "$n" -le 8 ]; then
    bad "make diff STAGE=$n: stage $n rewrites its base: it should say so in one line"
  elif grep -q '^diff --git' "$tmp/out"; then
    ok "make diff STAGE=$n: the diff of an edit ($(grep -c '^[-+][^-+]' "$tmp/out") lines changed), without the lab's markers"
  else
    bad "make diff STAGE=$n: neither a diff nor a rewrite's line"
  fi
done
mk diff STAGE=6 ALL=1
if [ $rc -eq 0 ] && grep -q '^diff --git stage5_tuned stage6_hopper' "$tmp/out"; then
  ok "make diff STAGE=6 ALL=1: the whole diff of a rewrite"
else
  bad "make diff STAGE=6 ALL=1 (exit $rc) should print the whole diff"
fi
# make grade of a program of its own where it cannot be built: stage 10 with NCCL_ROOT= (empty:
# its stage.mk builds as where there is no NCCL, and make grade's own make inherits it)
for s in $stages; do
  own_program "$s" || continue
  n=${s#stage}; n=${n%%_*}
  mk lab STAGE="$n" LABS="$tmp/nolabs"
  [ $rc -eq 0 ] && mk grade STAGE="$n" LABS="$tmp/nolabs" GPU_NAME= NCCL_ROOT=
  if [ $rc -eq 2 ] && [ "$(grep -c '' "$tmp/out")" -eq 2 ] &&
    grep -q "^make grade: $s cannot be built here: no NCCL here .*; nothing was graded, exit $ATTN_EXIT_UNSUPPORTED (unsupported here)\$" "$tmp/out" &&
    tail -n 1 "$tmp/out" | grep -q -E "^make: \*\*\* \[.*grade\] Error $ATTN_EXIT_UNSUPPORTED\$"; then
    ok "make grade STAGE=$n without NCCL (NCCL_ROOT=): says so in one line, nothing graded, exit $ATTN_EXIT_UNSUPPORTED"
  else
    bad "make grade STAGE=$n without NCCL (NCCL_ROOT=; exit $rc): should say in one line that it cannot be built here and exit $ATTN_EXIT_UNSUPPORTED"
  fi
done

# ---- the queue's results: 1b, then 5
wait "$queue_pid"
for i in "${!tasks[@]}"; do
  case ${tasks[i]} in grade*) continue ;; esac
  IFS='|' read -r what yes no <<<"${tasks[i]}"
  rc=-1 took=-1 how=; read -r rc took how <"$tmp/rc.$i" # -1: the task left no exit code
  if [ "$rc" = 0 ]; then
    ok "$what $yes${how:+ (cached: this compile of the same sources passed before)}"
  else
    cp "$tmp/log.$i" "$tmp/out"; bad "$what $no"
  fi
done
for i in "${!tasks[@]}"; do
  case ${tasks[i]} in "grade stage"* | "grade capstone") ;; *) continue ;; esac
  s=${tasks[i]#grade } n=${s#stage}; n=${n%%_*}
  rc=-1 took=-1; read -r rc took <"$tmp/rc.$i" # -1: the task left no exit code
  cp "$tmp/log.$i" "$tmp/out"
  why=$(unbuildable "$s")
  if [ -n "$why" ]; then # a program of its own that cannot be built here: its one line
    if [ "$rc" -eq 2 ] && grep -q "^make grade: $s cannot be built here: " "$tmp/out"; then
      skip "make grade STAGE=$n, the unfilled lab, no GPU: not compiled: $why (it says so in one line, exit $ATTN_EXIT_UNSUPPORTED)"
    else
      bad "make grade STAGE=$n where its program cannot be built ($why): should say so in one line and exit $ATTN_EXIT_UNSUPPORTED"
    fi
    continue
  fi
  a=$(no_gpu_arch "$s") sm=sm_$(no_gpu_arch "$s" | sed 's/^compute_//')
  # labs.py's lines (what compiled, the table, nothing graded), then make's own line: "Error 3"
  # a kernel's row, or a kernel's instantiations summed up (more than labs.py's MAX_ROWS)
  rows=$(grep -c -E '^      ( +[0-9]+  [0-9]+/[0-9]+ +[0-9]+  [A-Za-z_]|[A-Za-z_][A-Za-z_0-9]*: [0-9]+ instantiations?, [0-9-]+ registers)' "$tmp/out")
  if [ "$n" = 1 ]; then # beside the stage's own: both columns in every row
    table=$(grep -c -E '^ +[0-9]+ +[0-9]+ +[0-9]+/[0-9]+ +[0-9]+/[0-9]+ +[0-9]+ +[0-9]+   attention_kernel<[0-9, ]+>' "$tmp/out")
    what="its kernels' registers and spills beside the stage's own ($table kernels)"
  elif [ "$s" = capstone ] && grep -q '^    yours: none (no kernel of yours holds a hole.s code yet)$' "$tmp/out"; then
    table=1 what="its table (no kernel yet)"
  else
    table=$rows what="its kernels' registers and spills ($rows kernels)"
  fi
  if [ "$rc" -eq 2 ] && [ "$table" -gt 0 ] &&
    grep -q "^make grade: no NVIDIA GPU here: .* compiles (ARCH=$a: its PTX, and $sm machine code from it by ptxas)\$" "$tmp/out" &&
    grep -q -E "^  registers, spills and stack frame \\(ptxas -v, ${sm}a?\\) of the kernels that hold a hole's code: yours" "$tmp/out" &&
    grep -q "^make grade: nothing was graded: the self-test and the timing need a GPU" "$tmp/out" &&
    [ "$(tail -n 1 "$tmp/out" | grep -c -E "^make: \*\*\* \[.*grade\] Error $ATTN_EXIT_UNSUPPORTED\$")" -eq 1 ]; then
    ok "make grade STAGE=$n, the unfilled lab, no GPU: compiles for $sm, prints $what, says that nothing was graded, exit $ATTN_EXIT_UNSUPPORTED (unsupported here) ($took s)"
  else
    bad "make grade STAGE=$n with no GPU (make's exit $rc): should compile, print its kernels' table, say that nothing was graded, and fail with exit $ATTN_EXIT_UNSUPPORTED"
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
