#!/usr/bin/env bash
# Whether two builds made the same machine code: for each object, every kernel and device function
# of every target, compared instruction by instruction (cuobjdump -sass: the instructions and their
# encodings, without the addresses, which the function's own offsets repeat). For a refactor that
# must leave the machine code alone (one build from before it, one from after, same ARCH and
# toolkit). Not run by `make test`: it needs two builds, minutes each on 2 cores.
# usage: same_sass.sh BASE_BUILD NEW_BUILD [NAME...]
#   NAME: an object of BUILD/obj (default: stage5_tuned stage6_hopper stage7_backward
#   stage7_forward). Prints one line per object and target ("N functions, N identical"), a line for
#   each function that differs or is in one build only, and "N passed, M failed" last (an object a
#   pass when every function of every target is identical).
# e.g.  make objects ARCH=90 BUILD=build/base90   (at the old commit, in another worktree)
#       make objects ARCH=90 BUILD=build/new90
#       bash common/tests/same_sass.sh ../old/build/base90 build/new90
set -u
if [ $# -lt 2 ]; then
  echo "usage: same_sass.sh BASE_BUILD NEW_BUILD [NAME...]" >&2
  exit 2
fi
base=$1 new=$2
shift 2
names=${*:-stage5_tuned stage6_hopper stage7_backward stage7_forward}
CUOBJDUMP=${CUOBJDUMP:-$(command -v cuobjdump || echo "${CUDA_HOME:-/usr/local/cuda}/bin/cuobjdump")}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# "target function checksum" for every function of an object: the checksum of its instruction
# lines ("/*0a30*/ FFMA R1, R2, R3, R4 ; /* 0x... */" and the encoding's second line), addresses
# stripped and runs of blanks folded (cuobjdump's padding follows the longest name in the object,
# so a kernel renamed elsewhere in it would otherwise make every function differ).
functions() {
  local d=$2.d
  rm -rf "$d" && mkdir -p "$d"
  "$CUOBJDUMP" -sass "$1" | awk -v d="$d" '
    /^[ \t]*arch = / { if (fn != "") close(fn); arch = $3; fn = ""; next }
    /^[ \t]*Function : / {
      if (fn != "") close(fn)
      n++; fn = d "/" n; printf "" > fn; print arch, $3 > (d "/index"); next
    }
    fn != "" && /\/\*[0-9a-f]+\*\// {
      sub(/^[ \t]*\/\*[0-9a-f]+\*\/[ \t]*/, "")
      gsub(/[ \t]+/, " ")  # cuobjdump pads to the longest name in the object: only the text counts
      print > fn; next
    }
    fn != "" && /^[ \t]*\/\* 0x[0-9a-f]+ \*\/[ \t]*$/ { gsub(/[ \t]/, ""); print > fn; next }'
  if [ ! -s "$d/index" ]; then : >"$2"; return; fi
  # the n-th function of the index, its checksum
  (cd "$d" && md5sum $(seq 1 "$(wc -l <index)")) | sort -n -k2 | awk '{print $1}' |
    paste -d' ' "$d/index" - | sort >"$2"
}

passed=0 failed=0
for n in $names; do
  a=$base/obj/$n.o b=$new/obj/$n.o
  if [ ! -f "$a" ] || [ ! -f "$b" ]; then
    echo "FAILED: $n: missing object ($([ -f "$a" ] || echo "$a ")$([ -f "$b" ] || echo "$b"))"
    failed=$((failed + 1))
    continue
  fi
  functions "$a" "$tmp/a"
  functions "$b" "$tmp/b"
  bad=0
  for t in $(cat "$tmp/a" "$tmp/b" | awk '{print $1}' | sort -u -V); do
    awk -v t="$t" '$1 == t {print $2, $3}' "$tmp/a" >"$tmp/ta"
    awk -v t="$t" '$1 == t {print $2, $3}' "$tmp/b" >"$tmp/tb"
    total=$(cat "$tmp/ta" "$tmp/tb" | awk '{print $1}' | sort -u | wc -l)
    same=$(comm -12 "$tmp/ta" "$tmp/tb" | wc -l)
    echo "$n $t: $total functions, $same identical"
    if [ "$same" -ne "$total" ] || [ "$(wc -l <"$tmp/ta")" -ne "$(wc -l <"$tmp/tb")" ]; then
      bad=1
      join -a1 -a2 -e missing -o 0,1.2,2.2 <(sort "$tmp/ta") <(sort "$tmp/tb") |
        awk '$2 != $3 { w = $2 == "missing" ? "only in the new build" : $3 == "missing" ? "only in the base build" : "differs"; print "  " w ": " $1 }'
    fi
  done
  if [ ! -s "$tmp/a" ]; then echo "FAILED: $n: no machine code in $a"; bad=1; fi
  if [ $bad -eq 0 ]; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
done
echo "same machine code: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
