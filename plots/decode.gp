# decode.gp: the decode sweep: GB/s of KV-cache read (K and V, each read once: 2 B N_k H_kv D x 2
# bytes / time) against the cache's length N_k (log x), and on the right axis the share of the
# HBM's peak; one line per library (its colour) and (B, N_q) (its dash and symbol), the copy
# kernel's GB/s of the same run for scale (it writes what it reads), the HBM's peak at the top.
#
#   gnuplot -e "csv='plots/h200/results.csv'; outdir='plots/h200'; HBM=4.8" plots/decode.gp
#   optional: gpu='NVIDIA H200' (default: the CSV's gpu column); HBM: TB/s (default: by the GPU's
#   name, plots/csv.awk's hbm_tbs; 0: unknown, no share drawn)
#
# Writes outdir/decode.png; a CSV without decode rows (sweep `decode`) draws nothing and says so.
# A point not measured (out of memory, over the budget, a wrong result) is drawn on the x axis
# with the symbol of its status. Style (colours, names): plots/style.gpi.

if (!exists("csv")) csv = 'results.csv'
if (!exists("outdir")) outdir = '.'
if (!exists("plotsdir")) plotsdir = exists("ARG0") && strlen(ARG0) > 0 ? \
                                    system(sprintf("dirname '%s'", ARG0)) : 'plots'
W = 1200; HT = 800
load plotsdir . '/style.gpi'
S = STYLE_S . " -v sweep=decode -v x=N_k -v y=gbs"
Q = STYLE_Q

# the libraries (the copy roof is a line of its own)
allkeys = system(S . " -v mode=keys" . Q)
keys = ''
do for [i = 1:words(allkeys)] {
    if (word(allkeys, i) ne 'copy') { keys = keys . ' ' . word(allkeys, i) }
}
nk = words(keys)
if (nk == 0) {
    print sprintf("decode.gp: no decode rows in %s; decode.png not drawn", csv)
    exit
}
if (!exists("gpu")) gpu = system(S . " -v mode=gpu" . Q)
if (!exists("HBM")) HBM = real(system(S . " -v mode=hbm" . Q))
set output outdir . '/decode.png'

groups = system(S . " -v mode=groups" . Q)   # "B N_q" pairs
ng = words(groups) / 2
H = system(S . " -v mode=first -v y=H" . Q)
H_kv = system(S . " -v mode=first -v y=H_kv" . Q)
D = system(S . " -v mode=first -v y=D" . Q)
roof = real(system(S . " -v key=copy -v mode=max" . Q))
ymax = real(system(S . " -v mode=max" . Q))
top = ymax > roof ? ymax : roof
if (HBM > 0 && 1000.0 * HBM > top) top = 1000.0 * HBM
if (top <= 0) top = 1.0
top = top * 1.08

set title sprintf("Decode: GB/s of KV-cache read vs cache length (H = %s query heads over H_kv = %s, D = %s, fp16, contiguous cache)\n%s", \
                  H, H_kv, D, gpu)
set xlabel 'keys in the cache per sequence, N_k'
set ylabel 'GB/s of K and V read (2 B N_k H_kv D x 2 bytes / median time)'
set logscale x
set xrange [800:340000]
eval('set xtics ' . LONG_XTICS)
set mxtics default
set yrange [0:top]
set format y '%.0f'
if (HBM > 0) {
    set y2label sprintf('%% of the HBM peak (%.3g TB/s)', HBM)
    set y2range [0:top / (10.0 * HBM)]
    set y2tics 10 format '%.0f%%'
    set ytics nomirror
}
set key bottom right box opaque spacing 1.2 font ',9'

# (B, N_q) group j: its dash and symbol; a library keeps its colour (style.gpi)
GROUP_DASHES = "1 2 4 3 5"
GROUP_POINTS = "7 5 9 11 13"
gdash(j) = int(word(GROUP_DASHES, (j - 1) % 5 + 1))
gpoint(j) = int(word(GROUP_POINTS, (j - 1) % 5 + 1))
libname(k) = k eq 'sdpa_flash' ? 'FA2 (SDPA flash)' : k eq 'sdpa_cudnn' ? 'cuDNN (SDPA)' : name(k)

cmd = ''
if (HBM > 0) {
    cmd = cmd . sprintf('%g with lines lw 1 dt 3 lc rgb "#999999" title "HBM peak, %.3g TB/s", ', 1000.0 * HBM, HBM)
}
if (roof > 0) {
    cmd = cmd . sprintf('%g with lines lw 2 dt 2 lc rgb "#444444" title "copy kernel (writes what it reads), %.0f GB/s%s", ', \
                        roof, roof, HBM > 0 ? sprintf(" = %.0f%%", roof / (10.0 * HBM)) : "")
}
do for [i = 1:nk] {
    k = word(keys, i)
    do for [j = 1:ng] {
        b = word(groups, 2 * j - 1)
        q = word(groups, 2 * j)
        sel = sprintf("%s -v key=%s -v batch=%s -v nq=%s", S, k, b, q)
        xy = sel . " -v mode=xy" . Q
        if (strlen(system(xy)) > 0) {
            cmd = cmd . sprintf('"< %s" using 1:2 with linespoints lw %d pt %d ps 1.1 dt %d lc rgb "%s" title "%s, B = %s, N_q = %s%s", ', \
                                xy, width(k), gpoint(j), gdash(j), colour(k), libname(k), b, q, q > 1 ? " (causal)" : "")
        }
        if (int(system(sel . " -v mode=count -v status=notok" . Q)) > 0) {
            cmd = cmd . sprintf('"< %s -v mode=marks%s" using 1:(0):2 with points pt variable ps 1.8 lw 2 lc rgb "%s" notitle, ', \
                                sel, Q, colour(k))
        }
    }
}
statuses = system(S . " -v mode=statuses" . Q)
do for [j = 1:words(statuses)] {
    s = word(statuses, j)
    cmd = cmd . sprintf('NaN with points pt %d ps 1.8 lw 2 lc rgb "%s" title "not measured (on the axis): %s", ', \
                        marker(s), BAND_TEXT, label(s))
}
eval('plot ' . cmd[1:strlen(cmd) - 2])
set output
