# mk/fat_gencode.awk: a stage's -gencode flags in the fat build, from the fewest PTX compiles.
#
# nvcc compiles a .cu once per virtual architecture (cicc, NVVM: most of a compile, e.g. 40 s of
# stage 3's 55 per target) and then once per machine-code target (ptxas). Each target takes its
# PTX from the highest "level" not above it, where the levels are where the code can change:
#   - 75, 80, 90 and 100: the lowest fat target, the CUDA headers' branches (cuda_fp16.hpp,
#     cuda_bf16.hpp: NV_PROVIDES_SM_75, _80, _90), and the data-centre generations (sm_100's code
#     made from compute_90 PTX differs from the code made from compute_100's, cuobjdump -sass: a
#     new generation keeps its own PTX). sm_120 takes compute_100's unless the stage's code tells
#     120 apart (`__CUDA_ARCH__ >= 1200`: stage 7), one PTX compile a stage less: the fat build's
#     share of CI's 20 minutes. So sm_86 and sm_89 take compute_80's PTX, whose machine code
#     is the one compute_86's and compute_89's give (common/tests/same_sass.sh, a fat build with
#     one PTX per target against this one, CUDA 13.0: every function of stages 0-4 identical on
#     every target);
#   - every `__CUDA_ARCH__ <op> N` comparison in the files read (the stage's .cu and .cuh files,
#     common/device/*.cuh), N / 10;
#   - the stage's own list (levels="...": its stage.mk's <stage>_ARCH_LEVELS), for a stage that
#     uses `__CUDA_ARCH__` as a number (stage 7: `dq_bulk(__CUDA_ARCH__ / 10)`);
#   - a `__CUDA_ARCH__` used any other way in a stage without its own list: every target is its
#     own level, as without this script.
# (`defined(__CUDA_ARCH__)` and `#ifdef __CUDA_ARCH__` tell device code from host code: no level.)
# The PTX kept for GPUs newer than the targets is the last target's level's.
#
# Comments (from // to the end of a line) are not read.
# usage: awk -v targets="75 80 86 89 90 100 120" [-v levels="90"] -f mk/fat_gencode.awk FILE...
# prints e.g. "-gencode 'arch=compute_75,code=sm_75' -gencode 'arch=compute_80,code=[sm_80,sm_86,
# sm_89]' -gencode 'arch=compute_90,code=sm_90' ... -gencode arch=compute_120,code=compute_120"
BEGIN {
    q = "\047"  # a list of targets in brackets is quoted for the shell
    nt = split(targets, t, " ")
    level[75] = level[80] = level[90] = level[100] = 1
    own = split(levels, given, " ")
    for (i = 1; i <= own; i++) level[given[i] + 0] = 1
    every = 0
}
{
    line = $0
    sub(/\/\/.*/, "", line)
    while ((p = index(line, "__CUDA_ARCH__")) > 0) {
        before = substr(line, 1, p - 1)
        line = substr(line, p + length("__CUDA_ARCH__"))
        if (match(line, /^[ \t]*(>=|<=|==|!=|>|<)[ \t]*[0-9]+/)) {
            n = substr(line, RSTART, RLENGTH)
            gsub(/[^0-9]/, "", n)
            level[int(n / 10)] = 1
        } else if (before !~ /defined[ \t]*\($/ && before !~ /#[ \t]*if(n?def)[ \t]*$/) {
            every = 1
        }
    }
}
END {
    out = ""
    ptx = 0
    for (i = 1; i <= nt; i++) {
        a = t[i] + 0
        if (every && !own) { l = a } else { l = t[1] + 0; for (x in level) if (x + 0 <= a && x + 0 > l) l = x + 0 }
        if (l != ptx && codes != "") { out = out flush(ptx, codes); codes = "" }
        codes = codes (codes == "" ? "" : ",") "sm_" a
        ptx = l
    }
    if (codes != "") out = out flush(ptx, codes)
    printf "%s-gencode arch=compute_%d,code=compute_%d\n", out, ptx, ptx
}
function flush(l, c) {
    return sprintf("-gencode %sarch=compute_%d,code=%s%s ", q, l, index(c, ",") ? "[" c "]" : c, q)
}
