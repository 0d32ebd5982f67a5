# tflops_bwd.gp: tflops.gp's figure for the backward pass: the rows of pass bwd (stage 7 and
# PyTorch's backward passes), FLOPs counted as 2.5x the forward's. Writes outdir/tflops_bwd.png.
#
#   gnuplot -e "csv='plots/h200/results.csv'; outdir='plots/h200'; PEAK=989" plots/tflops_bwd.gp

PASS = 'bwd'
if (!exists("plotsdir")) plotsdir = exists("ARG0") && strlen(ARG0) > 0 ? \
                                    system(sprintf("dirname '%s'", ARG0)) : 'plots'
load plotsdir . '/tflops.gp'
