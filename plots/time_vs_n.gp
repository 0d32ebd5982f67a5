# time_vs_n.gp: forward time against sequence length, long sweep (B = H = 1, D = 128), log-log.
#
#   gnuplot -e "csv='plots/h100-80gb-hbm3/results.csv'; outdir='plots/h100-80gb-hbm3'" \
#           plots/time_vs_n.gp
#   optional: gpu='NVIDIA H100 80GB HBM3' (default: the CSV's gpu column)
#
# Writes outdir/time_vs_n.png. A point a stage could not measure (out of memory, over the time
# budget, wrong result) is drawn in the shaded "not measured" row under the data, one line per
# stage, in the stage's colour with its own symbol: the plot shows where each stage stopped,
# and nothing there reads as a time. Style (colours, dashes, points): plots/style.gpi.

if (!exists("csv")) csv = 'results.csv'
if (!exists("outdir")) outdir = '.'
# series.awk and style.gpi sit beside this script
if (!exists("plotsdir")) plotsdir = exists("ARG0") && strlen(ARG0) > 0 ? \
                                    system(sprintf("dirname '%s'", ARG0)) : 'plots'
W = 1200; HT = 800
load plotsdir . '/style.gpi'
S = STYLE_S . " -v sweep=long"
Q = STYLE_Q
if (!exists("gpu")) gpu = system(S . " -v mode=gpu" . Q)
set output outdir . '/time_vs_n.png'

keys = system(S . " -v mode=keys" . Q)
nk = words(keys)
ymax = real(system(S . " -v mode=max" . Q))
ymin = real(system(S . " -v mode=min" . Q))
if (ymax <= 0) { ymax = 1.0; ymin = 0.01 }
if (ymin <= 0) { ymin = ymax / 1000.0 }
# The keys with a point not measured, each its own line of the band under the data.
markkeys = ''
do for [i = 1:nk] {
    k = word(keys, i)
    if (int(system(sprintf("%s -v key=%s -v mode=count -v status=notok%s", S, k, Q))) > 0) {
        markkeys = markkeys . ' ' . k
    }
}
nm = words(markkeys)
lo10 = 10 ** floor(log10(ymin) - 0.0001)
step = 2.2
band_top = lo10 / 1.6
yband(i) = band_top / step ** i
bottom = nm > 0 ? band_top / step ** (nm + 1) : lo10

set title sprintf("Attention forward time vs sequence length (B = H = 1, D = 128, non-causal)\n%s", gpu)
set xlabel 'sequence length N (tokens)'
set ylabel 'time per forward pass (ms, median of repeats)'
set logscale xy
set xrange [800:340000]
set yrange [bottom : ymax * 3]
eval('set xtics ' . LONG_XTICS)
set mxtics default
# y tics only where the data are, never in the band
set ytics lo10, 10, ymax * 3
set format y '%.10g'
set key top left box opaque spacing 1.2
if (nm > 0) {
    set object 1 rect from graph 0, first bottom to graph 1, first band_top behind fc rgb BAND_FILL fs solid 1.0 noborder
    set label 1 'not measured (symbols: see the key)' at graph 0.5, first band_top / 1.3 center tc rgb BAND_TEXT font ',9'
}

cmd = ''
do for [i = 1:nk] {
    k = word(keys, i)
    xy = sprintf("%s -v key=%s -v mode=xy%s", S, k, Q)
    if (strlen(system(xy)) > 0) {
        cmd = cmd . sprintf('"< %s" using 1:2 with linespoints %s title "%s", ', xy, linestyle(k), name(k))
    }
}
do for [j = 1:nm] {
    k = word(markkeys, j)
    mk = sprintf("%s -v key=%s -v mode=marks%s", S, k, Q)
    set label (10 + j) k at graph 0.01, first yband(j) left tc rgb colour(k) font ',9'
    cmd = cmd . sprintf('"< %s" using 1:(%g):2 with points pt variable ps 1.8 lw 2 lc rgb "%s" notitle, ', \
                        mk, yband(j), colour(k))
}
# Key entries for the symbols of the band, only for the statuses that occur.
statuses = system(S . " -v mode=statuses" . Q)
do for [j = 1:words(statuses)] {
    s = word(statuses, j)
    cmd = cmd . sprintf('NaN with points pt %d ps 1.8 lw 2 lc rgb "%s" title "not measured: %s", ', \
                        marker(s), BAND_TEXT, label(s))
}
if (strlen(cmd) == 0) {
    set label 2 'no long-sweep results in this CSV' at graph 0.5, graph 0.5 center
    cmd = 'NaN notitle, '
}
eval('plot ' . cmd[1:strlen(cmd) - 2])
set output
