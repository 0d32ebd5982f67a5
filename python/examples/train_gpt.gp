# train_gpt.gp: the two loss curves of python/examples/train_gpt.py on one figure: a small
# character-level GPT trained once with the course's attention (a forward stage and stage 7's
# backward pass) and once with PyTorch's F.scaled_dot_product_attention, from the same weights
# on the same batches. Top: the training loss of every step of both runs; bottom: their
# difference, course - SDPA, which stays near zero when the two attentions train alike.
#
#   gnuplot -e "csv='plots/h200/train_gpt.csv'; outdir='plots/h200'" python/examples/train_gpt.gp
#   optional: gpu='...' (default: the CSV's '# gpu:' line)
#
# Writes outdir/train_gpt.png (train_gpt.py runs this itself after training). The CSV is what
# train_gpt.py writes: '# key: text' lines (gpu, model, course, sdpa: the captions below) and
# then step,loss_course,loss_sdpa rows; with a CSV of another kind, the train_gpt.csv in outdir
# if there is one, else a figure that says how to make it. Style: plots/style.gpi (plotsdir,
# default plots: run it from the repository's root).

if (!exists("csv")) csv = 'train_gpt.csv'
if (!exists("outdir")) outdir = '.'
if (!exists("plotsdir")) plotsdir = 'plots'
W = 1200; HT = 800
load plotsdir . '/style.gpi'
set output outdir . '/train_gpt.png'

HEADER = 'step,loss_course,loss_sdpa'
is_train(f) = int(system(sprintf("grep -q -x -F '%s' '%s' 2>/dev/null && echo 1 || echo 0", HEADER, f)))
data = is_train(csv) ? csv : is_train(outdir . '/train_gpt.csv') ? outdir . '/train_gpt.csv' : ''

if (strlen(data) == 0) {
    set title 'Character-level GPT: training loss, course attention vs PyTorch SDPA'
    set label 1 sprintf("no training run in %s:\npython3 python/examples/train_gpt.py --out %s writes train_gpt.csv and draws this plot", \
                        outdir, outdir) at graph 0.5, graph 0.5 center
    unset xtics
    unset ytics
    set xrange [0:1]
    set yrange [0:1]
    plot NaN notitle
    set output
    exit
}

# A '# key: text' line of the CSV, without its key ('' where there is none).
meta(k) = system(sprintf("awk '/^# %s: / { sub(/^# %s: /, \"\"); print; exit }' '%s'", k, k, data))
g = meta('gpu')
if (strlen(g) > 0 || !exists("gpu")) gpu = g
model = meta('model')
course = meta('course')
sdpa = meta('sdpa')
if (strlen(course) == 0) course = 'course attention'
if (strlen(sdpa) == 0) sdpa = 'PyTorch SDPA'
# The course's line in its forward stage's colour (stage k: palette entry k + 1, as in the
# sweep's plots), solid; SDPA black and dashed on top of it, as FA2 is drawn there.
k = system(sprintf("awk '/^# course: / { if (match($0, /stage[0-9]+/)) print substr($0, RSTART + 5, RLENGTH - 5); exit }' '%s'", data))
ci = strlen(k) > 0 ? int(k) + 1 : 6
if (ci < 1 || ci > 8) ci = 6
COURSE_STYLE = sprintf('lw 2 dt 1 lc rgb "%s"', index_colour(ci))
SDPA_STYLE = sprintf('lw 2 dt 2 lc rgb "%s"', index_colour(-1))
ROWS = sprintf("< awk -F, '/^[0-9]/' '%s'", data)

set datafile separator comma
set multiplot title sprintf("Character-level GPT trained with the course's attention and with PyTorch SDPA (same weights, same batches)\n%s%s%s", \
                            gpu, strlen(gpu) > 0 && strlen(model) > 0 ? ': ' : '', model)

# Top: the training loss of each step, both runs.
set lmargin at screen 0.08
set rmargin at screen 0.97
set tmargin at screen 0.88
set bmargin at screen 0.36
set format x ''
set ylabel 'training loss (cross-entropy, nats per character)'
set key top right box opaque spacing 1.3 font ',10'
plot ROWS using 1:2 with lines @COURSE_STYLE title course, \
     ''   using 1:3 with lines @SDPA_STYLE title sdpa

# Bottom: course - SDPA at each step (same batch, same step: only the attention differs).
set tmargin at screen 0.33
set bmargin at screen 0.08
set format x '%g'
set xlabel 'training step'
set ylabel 'course - SDPA'
# symmetric about zero, never empty (two runs of one attention can agree exactly)
dmax = real(system(sprintf("awk -F, '/^[0-9]/ { d = $2 - $3; if (d < 0) d = -d; if (d > m) m = d } END { print m + 0 }' '%s'", data)))
dmax = dmax > 0.005 ? 1.1 * dmax : 0.005
set yrange [-dmax:dmax]
unset key
plot ROWS using 1:($2 - $3) with lines lw 1 lc rgb index_colour(ci), \
     0 with lines dt 3 lc rgb '#999999'
unset multiplot
set output
