# ladder.gp: the ladder in one picture: every stage's TFLOP/s at N = 16,384 in the long sweep
# (B = H = 1, D = 128, non-causal), then PyTorch SDPA flash (FA2) and default, as bars.
#
#   gnuplot -e "csv='plots/h100-80gb-hbm3/results.csv'; outdir='plots/h100-80gb-hbm3'" \
#           plots/ladder.gp
#   optional: gpu='...' (default: the CSV's gpu column), NLADDER=16384
#
# Writes outdir/ladder.png. A stage without a number at that N gets an empty bar labelled with
# the reason (OOM, >budget, FAIL, n/a).

if (!exists("csv")) csv = 'results.csv'
if (!exists("outdir")) outdir = '.'
# series.awk sits beside this script
if (!exists("plotsdir")) plotsdir = exists("ARG0") && strlen(ARG0) > 0 ? \
                                    system(sprintf("dirname '%s'", ARG0)) : 'plots'
if (!exists("NLADDER")) NLADDER = 16384
S = sprintf("awk -F, -f '%s/csv.awk' -f '%s/series.awk' -v sweep=long", plotsdir, plotsdir)
Q = sprintf(" '%s'", csv)
if (!exists("gpu")) gpu = system(S . " -v mode=gpu" . Q)

if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) {
    set terminal pngcairo size 1200,800 noenhanced font 'Sans,11'
} else {
    set terminal png size 1200,800 noenhanced
}
set output outdir . '/ladder.png'

# Same colours as the other plots: stages by their place (series.awk mode=colour), then the
# PyTorch baselines black (FA2) and grey (default).
set linetype 1 lc rgb '#d62728'
set linetype 2 lc rgb '#ff7f0e'
set linetype 3 lc rgb '#bcbd22'
set linetype 4 lc rgb '#2ca02c'
set linetype 5 lc rgb '#17becf'
set linetype 6 lc rgb '#1f77b4'
set linetype 7 lc rgb '#9467bd'
set linetype 8 lc rgb '#8c564b'
set linetype 9 lc rgb '#000000'
set linetype 10 lc rgb '#7f7f7f'
set linetype 11 lc rgb '#e377c2'
why(s) = s eq 'OOM' ? 'OOM' : s eq 'over_budget' ? '>budget' : s eq 'FAIL' ? 'FAIL' : \
         s eq 'unsupported' ? 'n/a' : s
name(k) = k eq 'sdpa_flash' ? 'FA2 (SDPA flash)' : k eq 'sdpa_default' ? 'SDPA default' : k

bars = sprintf("%s -v mode=bar -v N=%d -v y=tflops%s", S, NLADDER, Q)
nbars = int(system(bars . " | awk 'END { print NR }'"))
ymax = real(system(bars . " | awk 'BEGIN { m = 0 } $2 > m { m = $2 } END { print m }'"))
if (ymax <= 0) ymax = 1

set title sprintf("TFLOP/s at N = %d (B = H = 1, D = 128, non-causal), each stage and PyTorch SDPA\n%s", NLADDER, gpu)
set ylabel 'TFLOP/s (4 N^2 D per pass)'
set xlabel 'stage'
set yrange [0 : ymax * 1.15]
set style fill solid 0.85 border rgb '#333333'
set boxwidth 0.7
set xtics rotate by -25 left nomirror scale 0
set grid ytics lc rgb '#dddddd'
unset key
set xrange [-0.6 : nbars - 0.4]

if (nbars > 0) {
    plot '< '.bars using 0:2:4:xtic(name(strcol(1))) with boxes lc variable, \
         '' using 0:2:(strcol(3) eq 'ok' ? sprintf('%.1f', $2) : why(strcol(3))) \
            with labels offset 0, 0.8 font ',11'
} else {
    set label sprintf('no long-sweep results at N = %d in this CSV', NLADDER) at graph 0.5, graph 0.5 center
    set xrange [0:1]
    plot NaN notitle
}
set output
