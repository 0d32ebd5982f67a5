# common/exit_codes.sh, sourced by the bash scripts that run the stage programs: sets
# ATTN_EXIT_PASS, ATTN_EXIT_WRONG, ATTN_EXIT_USAGE, ATTN_EXIT_UNSUPPORTED and ATTN_EXIT_OOM from
# their one home, the attn_exit enum of common/attention.h (beside this file). Returns 1, saying
# which, when one of them is not there.
eval "$(sed -n 's/^ *\(ATTN_EXIT_[A-Z]*\) *= *\([0-9][0-9]*\).*/\1=\2/p' "$(dirname "${BASH_SOURCE[0]}")/attention.h")"
for attn_exit_ in PASS WRONG USAGE UNSUPPORTED OOM; do
    attn_exit_=ATTN_EXIT_$attn_exit_
    if [ -z "${!attn_exit_:-}" ]; then
        echo "exit_codes.sh: no $attn_exit_ in the attn_exit enum of $(dirname "${BASH_SOURCE[0]}")/attention.h" >&2
        unset attn_exit_
        return 1
    fi
done
unset attn_exit_
