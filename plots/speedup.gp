# speedup.gp: speedup of every stage (and of PyTorch SDPA) over stage 0 and over stage 1,
# long sweep (B = H = 1, D = 128, non-causal), two panels side by side.
#
#   gnuplot -e "csv='plots/h100-80gb-hbm3/results.csv'; outdir='plots/h100-80gb-hbm3'" \
#           plots/speedup.gp
#   optional: gpu='...' (default: the CSV's gpu column)
#
# Writes outdir/speedup.png. Speedup at N = time of the base stage / time of the stage, both
# measured; stage 0 runs out of memory at large N, so the right panel (over stage 1, the first
# fused kernel) carries the comparison to the end of the sweep.

if (!exists("csv")) csv = 'results.csv'
if (!exists("outdir")) outdir = '.'
# series.awk sits beside this script
if (!exists("plotsdir")) plotsdir = exists("ARG0") && strlen(ARG0) > 0 ? \
                                    system(sprintf("dirname '%s'", ARG0)) : 'plots'
S = sprintf("awk -F, -f '%s/csv.awk' -f '%s/series.awk' -v sweep=long", plotsdir, plotsdir)
Q = sprintf(" '%s'", csv)
if (!exists("gpu")) gpu = system(S . " -v mode=gpu" . Q)

if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) {
    set terminal pngcairo size 1600,700 noenhanced font 'Sans,11'
} else {
    set terminal png size 1600,700 noenhanced
}
set output outdir . '/speedup.png'

# Stages run warm (slow) to cool (fast), each in the same colour in every plot (series.awk
# mode=colour); the PyTorch baselines are black (FA2) and grey (default).
palette = "#d62728 #ff7f0e #bcbd22 #2ca02c #17becf #1f77b4 #9467bd #8c564b #000000 #7f7f7f #e377c2"
colour(k) = word(palette, int(system(sprintf("%s -v mode=colour -v key=%s%s", S, k, Q))))
dash(k) = k eq 'sdpa_flash' ? 2 : k eq 'sdpa_default' ? 3 : 1
name(k) = k eq 'sdpa_flash' ? 'PyTorch SDPA flash (FA2)' : \
          k eq 'sdpa_default' ? 'PyTorch SDPA default' : k

keys = system(S . " -v mode=keys" . Q)
nk = words(keys)

set multiplot layout 1, 2 title sprintf("Speedup over the first stages (B = H = 1, D = 128, non-causal) - %s", gpu)
set xlabel 'sequence length N (tokens)'
set ylabel 'speedup (time of base stage / time of stage, x)'
set logscale xy
set xrange [800:340000]
set xtics ('1k' 1024, '2k' 2048, '4k' 4096, '8k' 8192, '16k' 16384, '32k' 32768, \
           '64k' 65536, '128k' 131072, '256k' 262144)
set format y '%gx'
set grid xtics ytics mytics lc rgb '#dddddd'
set key outside right top box spacing 1.1 font ",9"

do for [p = 0:1] {
    base = system(sprintf("%s -v mode=stagekey -v base=stage%d%s", S, p, Q))
    unset label
    cmd = ''
    if (strlen(base) > 0) {
        set title sprintf('over %s', base)
        do for [i = 1:nk] {
            k = word(keys, i)
            if (!(k eq base)) {
                r = sprintf("%s -v key=%s -v base=%s -v mode=ratio%s", S, k, base, Q)
                if (strlen(system(r)) > 0) {
                    cmd = cmd . sprintf('"< %s" using 1:2 with linespoints lw 2 pt 7 ps 1.1 dt %d lc rgb "%s" title "%s", ', \
                                        r, dash(k), colour(k), name(k))
                }
            }
        }
    } else {
        set title sprintf('over stage %d', p)
    }
    if (strlen(cmd) == 0) {
        set label sprintf('no stage %d times to compare with', p) at graph 0.5, graph 0.5 center
        set yrange [0.5:2]
        cmd = 'NaN notitle, '
    } else {
        set yrange [*:*]
    }
    # the base stage itself: speedup 1
    eval('plot ' . cmd . '1 with lines dt 3 lc rgb "#999999" notitle')
}
unset multiplot
set output
