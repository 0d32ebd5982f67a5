# tflops.gp: throughput against sequence length, fa2 sweep (B x N = 16,384 tokens, H = 2048 / D),
# one panel per (D, causal), with the device's dense fp16 tensor-core peak as a dashed line and
# PyTorch's FlashAttention-2 backend (sdpa_flash) drawn as the FA2 line to reach.
#
#   gnuplot -e "csv='plots/h100-80gb-hbm3/results.csv'; outdir='plots/h100-80gb-hbm3'; PEAK=989" \
#           plots/tflops.gp
#   optional: gpu='...' (default: the CSV's gpu column); PEAK=0: no peak line
#
# Writes outdir/tflops.png. FLOPs = 4 B H N^2 D, halved for causal. Points a stage could not
# measure are drawn in the band above the peak in the stage's colour with their own symbol.

if (!exists("csv")) csv = 'results.csv'
if (!exists("outdir")) outdir = '.'
# series.awk sits beside this script
if (!exists("plotsdir")) plotsdir = exists("ARG0") && strlen(ARG0) > 0 ? \
                                    system(sprintf("dirname '%s'", ARG0)) : 'plots'
if (!exists("PEAK")) PEAK = 0
S0 = sprintf("awk -F, -f '%s/csv.awk' -f '%s/series.awk' -v sweep=fa2", plotsdir, plotsdir)
Q = sprintf(" '%s'", csv)
if (!exists("gpu")) gpu = system(S0 . " -v mode=gpu" . Q)

if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) {
    set terminal pngcairo size 1600,1100 noenhanced font 'Sans,11'
} else {
    set terminal png size 1600,1100 noenhanced
}
set output outdir . '/tflops.png'

# Stages run warm (slow) to cool (fast), each in the same colour in every plot (series.awk
# mode=colour); the PyTorch baselines are black (FA2) and grey (default).
palette = "#d62728 #ff7f0e #bcbd22 #2ca02c #17becf #1f77b4 #9467bd #8c564b #000000 #7f7f7f #e377c2"
colour(k) = word(palette, int(system(sprintf("%s -v mode=colour -v key=%s%s", S0, k, Q))))
dash(k) = k eq 'sdpa_flash' ? 2 : k eq 'sdpa_default' ? 3 : 1
width(k) = k eq 'sdpa_flash' ? 3 : 2
name(k) = k eq 'sdpa_flash' ? 'FA2 (PyTorch SDPA flash)' : \
          k eq 'sdpa_default' ? 'PyTorch SDPA default' : k
label(s) = s eq 'OOM' ? 'out of memory' : s eq 'over_budget' ? 'over the time budget (not run)' : \
           s eq 'FAIL' ? 'wrong result (FAIL)' : 'unsupported here'
marker(s) = s eq 'OOM' ? 2 : s eq 'over_budget' ? 8 : s eq 'FAIL' ? 6 : 12
max(a, b) = a > b ? a : b

# Every key of the sweep, so a key keeps its row in the band in every panel.
keys = system(S0 . " -v mode=keys" . Q)
nk = words(keys)
dmax = real(system(S0 . " -v y=tflops -v mode=max" . Q))
dmin = real(system(S0 . " -v y=tflops -v mode=min" . Q))
marks = strlen(system(S0 . " -v mode=statuses" . Q)) > 0

set multiplot layout 2, 2 title sprintf("Attention forward throughput, B x N = 16,384 tokens, H = 2048 / D - %s", gpu)
set xlabel 'sequence length N (tokens)'
set ylabel 'TFLOP/s (4 B H N^2 D per pass, halved when causal)'
set logscale x 2
# log y: the first stages run at a few TFLOP/s, the last ones near FA2's hundreds
set logscale y
set format y '%.10g'
set xrange [400:20000]
set xtics ('512' 512, '1k' 1024, '2k' 2048, '4k' 4096, '8k' 8192, '16k' 16384)
set grid xtics ytics lc rgb '#dddddd'
set key outside right top box spacing 1.1 font ',9'

# The band of not-measured points sits above the peak (or the best measured point).
top = max(PEAK, dmax)
if (top <= 0) top = 1
if (dmin <= 0) dmin = top / 1000
step = 1.18
yband(i) = top * 1.35 * step ** (i - 1)
set yrange [dmin / 2 : marks ? top * 1.35 * step ** nk * 1.1 : top * 1.3]
if (PEAK > 0) {
    set arrow 1 from graph 0, first PEAK to graph 1, first PEAK nohead dt 2 lw 1.5 lc rgb '#444444'
    set label 1 sprintf('dense fp16 peak %g TFLOP/s', PEAK) at graph 0.99, first PEAK * 0.85 right tc rgb '#444444'
}
if (marks) {
    set arrow 2 from graph 0, first top * 1.2 to graph 1, first top * 1.2 nohead dt 3 lc rgb '#999999'
    set label 2 'not measured' at graph 0.99, first yband(1) * 0.93 right tc rgb '#555555'
}

do for [panel = 1:4] {
    d = (panel % 2 == 1) ? 128 : 64
    c = (panel > 2) ? 1 : 0
    S = sprintf("%s -v D=%d -v causal=%d -v y=tflops", S0, d, c)
    set title sprintf('D = %d, %s, H = %d', d, c ? 'causal' : 'non-causal', 2048 / d)
    cmd = ''
    do for [i = 1:nk] {
        k = word(keys, i)
        xy = sprintf("%s -v key=%s -v mode=xy%s", S, k, Q)
        mk = sprintf("%s -v key=%s -v mode=marks%s", S, k, Q)
        if (strlen(system(xy)) > 0) {
            cmd = cmd . sprintf('"< %s" using 1:2 with linespoints lw %d pt 7 ps 1.0 dt %d lc rgb "%s" title "%s", ', \
                                xy, width(k), dash(k), colour(k), name(k))
        }
        if (strlen(system(mk)) > 0) {
            cmd = cmd . sprintf('"< %s" using 1:(%g):2 with points pt variable ps 1.6 lw 2 lc rgb "%s" notitle, ', \
                                mk, yband(i), colour(k))
        }
    }
    statuses = system(S . " -v mode=statuses" . Q)
    do for [j = 1:words(statuses)] {
        s = word(statuses, j)
        cmd = cmd . sprintf('NaN with points pt %d ps 1.6 lw 2 lc rgb "#555555" title "%s", ', \
                            marker(s), label(s))
    }
    unset label 3
    if (strlen(cmd) == 0) {
        set label 3 'no results for this shape' at graph 0.5, graph 0.5 center
        cmd = 'NaN notitle, '
    }
    eval('plot ' . cmd[1:strlen(cmd) - 2])
}
unset multiplot
set output
