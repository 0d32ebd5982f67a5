# ladder.gp: the ladder in one picture: every stage's TFLOP/s at N = 16,384 in the long sweep
# (B = H = 1, D = 128, non-causal), then PyTorch SDPA flash (FA2) and default, as bars on a log
# axis (the first stages run at a few TFLOP/s, the last ones at hundreds: a linear axis would
# flatten stages 0-3 to nothing).
#
#   gnuplot -e "csv='plots/h100-80gb-hbm3/results.csv'; outdir='plots/h100-80gb-hbm3'" \
#           plots/ladder.gp
#   optional: gpu='...' (default: the CSV's gpu column), NLADDER=16384
#
# Writes outdir/ladder.png. A stage without a number at that N (OOM, over budget, FAIL) gets no
# bar, only its reason written in the shaded row at the foot; a stage unsupported on this GPU
# is left out. Style (colours): plots/style.gpi.

if (!exists("csv")) csv = 'results.csv'
if (!exists("outdir")) outdir = '.'
# series.awk and style.gpi sit beside this script
if (!exists("plotsdir")) plotsdir = exists("ARG0") && strlen(ARG0) > 0 ? \
                                    system(sprintf("dirname '%s'", ARG0)) : 'plots'
if (!exists("NLADDER")) NLADDER = 16384
W = 1200; HT = 800
load plotsdir . '/style.gpi'
S = STYLE_S . " -v sweep=long"
Q = STYLE_Q
if (!exists("gpu")) gpu = system(S . " -v mode=gpu" . Q)
set output outdir . '/ladder.png'

bname(k) = k eq 'sdpa_flash' ? 'FA2 (SDPA flash)' : k eq 'sdpa_default' ? 'SDPA default' : k

bars = sprintf("%s -v mode=bar -v N=%d -v y=tflops%s", S, NLADDER, Q)
# colours by series.awk's colour index (column 4 of mode=bar), as in the other plots: linetype i
# for stage i, the other libraries' after the last stage's
NSTAGE_LT = int(system(bars . " | awk '$4 > m { m = $4 } END { print m + 0 }'"))
do for [i = 1:NSTAGE_LT + words(OTHER_COLOURS)] {
    eval(sprintf("set linetype %d lc rgb '%s'", i, index_colour(i <= NSTAGE_LT ? i : NSTAGE_LT - i)))
}
bar_lt(i) = i > 0 ? i : NSTAGE_LT - i
nbars = int(system(bars . " | awk 'END { print NR }'"))
ymax = real(system(bars . " | awk 'BEGIN { m = 0 } $2 > m { m = $2 } END { print m }'"))
ymin = real(system(bars . " | awk '$2 > 0 && (m == \"\" || $2 < m) { m = $2 } END { print (m == \"\" ? 0 : m) }'"))
if (ymax <= 0) ymax = 1.0
if (ymin <= 0) ymin = ymax / 100.0
lo10 = 10 ** floor(log10(ymin) - 0.0001)
# the shaded row at the foot, for the reasons of stages without a bar
band_top = lo10 / 1.6
haveband = nbars > 0 && int(system(bars . " | awk '$3 != \"ok\" { n++ } END { print n + 0 }'")) > 0
bottom = haveband ? band_top / 4 : lo10

set title sprintf("TFLOP/s at N = %d (B = H = 1, D = 128, non-causal), each stage and PyTorch SDPA\n%s", NLADDER, gpu)
set ylabel 'TFLOP/s (4 N^2 D per pass; log scale)'
set xlabel 'stage'
set logscale y
set yrange [bottom : ymax * 3]
set ytics lo10, 10, ymax * 3
set format y '%.10g'
set style fill solid 0.85 border rgb '#333333'
set xtics rotate by -25 left nomirror scale 0
set grid ytics mytics lc rgb '#dddddd'
unset key
set xrange [-0.6 : nbars - 0.4]

if (nbars > 0) {
    if (haveband) {
        set object 1 rect from graph 0, first bottom to graph 1, first band_top behind fc rgb BAND_FILL fs solid 1.0 noborder
        set label 1 'not measured' at graph 0.01, first band_top / 1.25 left tc rgb BAND_TEXT font ',9'
    }
    # bars from the foot of the data (lo10) up to the value; the value above each bar
    plot '< '.bars using 0:(strcol(3) eq 'ok' ? sqrt($2 * lo10) : NaN):($0 - 0.35):($0 + 0.35):(lo10):($2 > 0 ? $2 : NaN):(bar_lt($4)):xtic(bname(strcol(1))) \
            with boxxyerror lc variable fs solid 0.85 border rgb '#333333', \
         '' using 0:(strcol(3) eq 'ok' ? $2 * 1.25 : NaN):(sprintf('%.1f', $2)) with labels font ',11', \
         '' using 0:(strcol(3) eq 'ok' ? NaN : band_top / 2):(why(strcol(3))) with labels font ',11' tc rgb BAND_TEXT
} else {
    set label sprintf('no long-sweep results at N = %d in this CSV', NLADDER) at graph 0.5, graph 0.5 center
    set xrange [0:1]
    plot NaN notitle
}
set output
