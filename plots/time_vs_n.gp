# time_vs_n.gp: forward time against sequence length, long sweep (B = H = 1, D = 128), log-log.
#
#   gnuplot -e "csv='plots/h100-80gb-hbm3/results.csv'; outdir='plots/h100-80gb-hbm3'" \
#           plots/time_vs_n.gp
#   optional: gpu='NVIDIA H100 80GB HBM3' (default: the CSV's gpu column)
#
# Writes outdir/time_vs_n.png. A point a stage could not measure (out of memory, over the time
# budget, wrong result, unsupported) is drawn in the band at the top in the stage's colour, with
# its own symbol, so the plot shows where each stage stopped instead of silently ending a line.

if (!exists("csv")) csv = 'results.csv'
if (!exists("outdir")) outdir = '.'
# series.awk sits beside this script
if (!exists("plotsdir")) plotsdir = exists("ARG0") && strlen(ARG0) > 0 ? \
                                    system(sprintf("dirname '%s'", ARG0)) : 'plots'
S = sprintf("awk -F, -f '%s/csv.awk' -f '%s/series.awk' -v sweep=long", plotsdir, plotsdir)
Q = sprintf(" '%s'", csv)
if (!exists("gpu")) gpu = system(S . " -v mode=gpu" . Q)

if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) {
    set terminal pngcairo size 1200,800 noenhanced font 'Sans,11'
} else {
    set terminal png size 1200,800 noenhanced
}
set output outdir . '/time_vs_n.png'

# Stages run warm (slow) to cool (fast), each in the same colour in every plot (series.awk
# mode=colour); the PyTorch baselines are black (FA2) and grey (default).
palette = "#d62728 #ff7f0e #bcbd22 #2ca02c #17becf #1f77b4 #9467bd #8c564b #000000 #7f7f7f #e377c2"
colour(k) = word(palette, int(system(sprintf("%s -v mode=colour -v key=%s%s", S, k, Q))))
dash(k) = k eq 'sdpa_flash' ? 2 : k eq 'sdpa_default' ? 3 : 1
name(k) = k eq 'sdpa_flash' ? 'PyTorch SDPA flash (FA2)' : \
          k eq 'sdpa_default' ? 'PyTorch SDPA default' : k
label(s) = s eq 'OOM' ? 'out of memory' : s eq 'over_budget' ? 'over the time budget (not run)' : \
           s eq 'FAIL' ? 'wrong result (FAIL)' : 'unsupported here'
marker(s) = s eq 'OOM' ? 2 : s eq 'over_budget' ? 8 : s eq 'FAIL' ? 6 : 12

keys = system(S . " -v mode=keys" . Q)
nk = words(keys)
ymax = real(system(S . " -v mode=max" . Q))
ymin = real(system(S . " -v mode=min" . Q))
if (ymax <= 0) { ymax = 1.0; ymin = 0.01 }
if (ymin <= 0) { ymin = ymax / 1000 }
# The band of not-measured points sits above the largest time, one row per key.
band0 = ymax * 4
step = 1.35
yband(i) = band0 * step ** (i - 1)

set title sprintf("Attention forward time vs sequence length (B = H = 1, D = 128, non-causal)\n%s", gpu)
set xlabel 'sequence length N (tokens)'
set ylabel 'time per forward pass (ms, median of repeats)'
set logscale xy
set xrange [800:340000]
set yrange [ymin / 2 : band0 * step ** nk * 1.5]
set xtics ('1k' 1024, '2k' 2048, '4k' 4096, '8k' 8192, '16k' 16384, '32k' 32768, \
           '64k' 65536, '128k' 131072, '256k' 262144)
set mxtics default
set format y '%.10g'
set grid xtics ytics mytics lc rgb '#dddddd'
set key bottom right box opaque spacing 1.2
set arrow from graph 0, first ymax * 2.2 to graph 1, first ymax * 2.2 nohead dt 3 lc rgb '#999999'
set label 'not measured' at graph 0.01, first band0 * step ** (nk / 2.0) left tc rgb '#555555'

cmd = ''
do for [i = 1:nk] {
    k = word(keys, i)
    xy = sprintf("%s -v key=%s -v mode=xy%s", S, k, Q)
    mk = sprintf("%s -v key=%s -v mode=marks%s", S, k, Q)
    if (strlen(system(xy)) > 0) {
        cmd = cmd . sprintf('"< %s" using 1:2 with linespoints lw 2 pt 7 ps 1.1 dt %d lc rgb "%s" title "%s", ', \
                            xy, dash(k), colour(k), name(k))
    }
    if (strlen(system(mk)) > 0) {
        cmd = cmd . sprintf('"< %s" using 1:(%g):2 with points pt variable ps 1.8 lw 2 lc rgb "%s" notitle, ', \
                            mk, yband(i), colour(k))
    }
}
# Key entries for the symbols of the band, only for the statuses that occur.
statuses = system(S . " -v mode=statuses" . Q)
do for [j = 1:words(statuses)] {
    s = word(statuses, j)
    cmd = cmd . sprintf('NaN with points pt %d ps 1.8 lw 2 lc rgb "#555555" title "%s", ', \
                        marker(s), label(s))
}
if (strlen(cmd) == 0) {
    set label 'no long-sweep results in this CSV' at graph 0.5, graph 0.5 center
    cmd = 'NaN notitle, '
}
eval('plot ' . cmd[1:strlen(cmd) - 2])
set output
