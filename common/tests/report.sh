# shellcheck shell=bash
# common/tests/report.sh: the test suites' one reporter, sourced by each bash suite of `make test`
# (after its cd to the repository): every check is one line of one format, and one record.
#   ok WHAT              a check that passed: prints "ok    WHAT"
#   bad WHAT             a check that failed: prints "FAIL  WHAT" (the suite may print details after)
#   skip WHAT: WHY       a check that cannot run here: prints "SKIP  WHAT: WHY"
#   report_run NAME COMMAND...
#                        runs a suite and echoes its output. A bash suite of this reporter records
#                        its own checks; for any other program (the C unit tests, a Python suite,
#                        make format-check) the record is read from its output: its lines "ok x", "FAIL x" and
#                        "SKIP x: why" are its checks (the Python harness's "FAILED x" and
#                        "skipped x" read the same); passes or failures that its last "N passed, M
#                        failed" counts beyond those lines are checks "NAME: unnamed check k". A
#                        non-zero exit with no failure is one more failure "NAME: exit RC"; a
#                        program that prints no check and no count passes as one check, NAME.
#   report_end           prints "N passed, M failed, K skipped": this suite's checks, those of the
#                        suites it ran included; returns 1 when any failed
# The record: each check is also a line "STATUS<tab>SUITE<tab>WHAT" (STATUS: ok, FAIL or SKIP)
# appended to the file $REPORT_FILE. run.sh names one for every suite it runs (a suite inherits it,
# and so do the suites it runs), so `make test`'s total, its list of failures and its list of skips
# all come from that one record; a suite started alone keeps a file of its own, removed by
# report_end or by report_cleanup (for a suite's own EXIT trap). A suite run by another as the
# object of a check (its failures are the expected output) runs with REPORT_FILE unset.
# REPORT_SUITE: the suite's name in the record (default: the sourcing script's path).
REPORT_SUITE=${REPORT_SUITE:-${BASH_SOURCE[1]:-${0}}}
if [ -z "${REPORT_FILE:-}" ]; then
  REPORT_FILE=$(mktemp) || exit 1
  report_own_=1
  trap 'report_cleanup' EXIT
else
  report_own_=0
fi
export REPORT_FILE
report_start_=$(grep -c '' "$REPORT_FILE")

report_cleanup() { # the record of a suite started alone goes with it
  [ "$report_own_" = 1 ] && rm -f "$REPORT_FILE"
  return 0
}

report_record_() { # report_record_ STATUS WHAT: one line of the record (WHAT on one line)
  local what=${2//$'\t'/ }
  printf '%s\t%s\t%s\n' "$1" "$REPORT_SUITE" "${what//$'\n'/ | }" >>"$REPORT_FILE"
}
report_ok_() { echo "ok    $*"; report_record_ ok "$*"; }
report_bad_() { echo "FAIL  $*"; report_record_ FAIL "$*"; }
ok() { report_ok_ "$@"; } # a suite may redefine ok and bad, around report_ok_ and report_bad_
bad() { report_bad_ "$@"; }
skip() { echo "SKIP  $*"; report_record_ SKIP "$*"; }

report_run() {
  local name=$1 out rc before fails
  shift
  out=$(mktemp)
  before=$(grep -c '' "$REPORT_FILE")
  "$@" >"$out" 2>&1
  rc=$?
  cat "$out"
  # a bash suite of this reporter has recorded its own checks; any other program is read here
  [ "$(grep -c '' "$REPORT_FILE")" -gt "$before" ] || awk -v suite="$REPORT_SUITE" -v name="$name" '
    function rec(status, what) {
      gsub(/\t/, " ", what); printf "%s\t%s\t%s%s\n", status, suite, name == suite ? "" : name ": ", what }
    /^ok +[^ ]/ { sub(/^ok +/, ""); rec("ok", $0); p++; next }
    /^FAIL(ED)?:? +[^ ]/ { sub(/^FAIL(ED)?:? +/, ""); rec("FAIL", $0); f++; next }
    /^(SKIP|skipped) +[^ ]/ { sub(/^(SKIP|skipped) +/, ""); rec("SKIP", $0); next }
    match($0, /[0-9]+ passed, [0-9]+ failed/) { split(substr($0, RSTART, RLENGTH), c, /[ ,]+/); P = c[1]; F = c[3] }
    END {
      for (k = p + 1; k <= P; k++) rec("ok", "unnamed check " k)
      for (k = f + 1; k <= F; k++) rec("FAIL", "unnamed check " k)
    }' "$out" >>"$REPORT_FILE"
  rm -f "$out"
  fails=$(tail -n +$((before + 1)) "$REPORT_FILE" | grep -c '^FAIL')
  local label="$name: "
  [ "$name" = "$REPORT_SUITE" ] && label=""
  if [ "$rc" -ne 0 ] && [ "$fails" -eq 0 ]; then
    echo "FAIL  ${label}exit $rc"
    report_record_ FAIL "${label}exit $rc"
  elif [ "$(grep -c '' "$REPORT_FILE")" -eq "$before" ]; then
    report_record_ ok "${label}exit 0"
  fi
  return "$rc"
}

report_counts_() { # the record's lines from line $1 on -> "N passed, M failed, K skipped"
  tail -n +"$1" "$REPORT_FILE" | awk -F'\t' '{ n[$1]++ }
    END { printf "%d passed, %d failed, %d skipped\n", n["ok"], n["FAIL"], n["SKIP"] }'
}

report_end() {
  local line
  line=$(report_counts_ $((report_start_ + 1)))
  echo "$line"
  report_cleanup
  case $line in *" 0 failed,"*) return 0 ;; esac
  return 1
}
