# stage0_dataflow.gp: stage 0's three kernels and what each reads and writes in device memory
# (stage0_naive/README.md, "The idea"). Every arrow is a pass over global memory (HBM); the widest
# ones move the N x N matrix S. Sizes are the fa2 shape's (B = 4, H = 16, N = 4096, D = 128, fp32).
#   gnuplot plots/diagrams/stage0_dataflow.gp      (writes stage0_dataflow.png beside this script)

dir = system(sprintf("dirname '%s'", ARG0))
if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) {
    set terminal pngcairo size 1320, 600 noenhanced font 'Sans,11'
} else {
    set terminal png size 1320, 600 noenhanced
}
set output dir . '/stage0_dataflow.png'
unset border; unset tics; unset key
set margins 0, 0, 0, 0
set xrange [0:132]; set yrange [0:60]

KERN = '#fff3d6'; GMEM = '#e3ecf8'; SBIG = '#f4a261'; TENSOR = '#ffffff'; RED = '#b03030'
set style arrow 1 head filled size 1.2, 20 lw 1.5 lc rgb '#333333'
set style arrow 2 head filled size 1.6, 20 lw 5 lc rgb RED

o = 1
# ---- global memory and what lives there ----
set object o rect from 2, 2 to 130, 33 fc rgb GMEM fs solid 1.0 border lc rgb '#5577aa'; o = o + 1
set label 1 'global memory (HBM)' at 3.5, 31 left font 'Sans,12'
set object o rect from 6, 6 to 14, 27 fc rgb TENSOR fs solid 1.0 border lc rgb '#333333'; o = o + 1
set object o rect from 18, 6 to 26, 27 fc rgb TENSOR fs solid 1.0 border lc rgb '#333333'; o = o + 1
set object o rect from 44, 4 to 82, 29 fc rgb SBIG fs solid 1.0 border lc rgb '#333333'; o = o + 1
set object o rect from 92, 6 to 100, 27 fc rgb TENSOR fs solid 1.0 border lc rgb '#333333'; o = o + 1
set object o rect from 104, 6 to 107, 27 fc rgb TENSOR fs solid 1.0 border lc rgb '#333333'; o = o + 1
set object o rect from 114, 6 to 122, 27 fc rgb TENSOR fs solid 1.0 border lc rgb '#333333'; o = o + 1
set label 2 'Q' at 10, 18 center font 'Sans,14'
set label 3 'N x D' at 10, 14.5 center font 'Sans,9'
set label 4 'K' at 22, 18 center font 'Sans,14'
set label 5 'N x D' at 22, 14.5 center font 'Sans,9'
set label 6 'S, then P  (N x N per head)' at 63, 18.5 center font 'Sans,14'
set label 7 '[B, H, N, N] fp32: 4 GiB at the fa2 shape' at 63, 14.5 center
set label 8 'grows as N^2: one head at N = 262,144 needs 256 GiB' at 63, 11 center font 'Sans,10'
set label 9 'V' at 96, 18 center font 'Sans,14'
set label 10 'N x D' at 96, 14.5 center font 'Sans,9'
set label 11 'LSE' at 105.5, 18 center font 'Sans,9' rotate by 90
set label 12 'O' at 118, 18 center font 'Sans,14'
set label 13 'N x D' at 118, 14.5 center font 'Sans,9'
set label 14 'Q, K, V, O: 128 MiB each' at 116, 3.5 center font 'Sans,10'

# ---- the three kernels ----
set object o rect from 8, 42 to 38, 54 fc rgb KERN fs solid 1.0 border lc rgb '#bb8833'; o = o + 1
set object o rect from 50, 42 to 80, 54 fc rgb KERN fs solid 1.0 border lc rgb '#bb8833'; o = o + 1
set object o rect from 88, 42 to 118, 54 fc rgb KERN fs solid 1.0 border lc rgb '#bb8833'; o = o + 1
set label 20 '1. scores_kernel' at 23, 51 center font 'Sans,12'
set label 21 'S = scale Q K^T' at 23, 47.5 center
set label 22 'one thread per score' at 23, 44.5 center font 'Sans,9'
set label 23 '2. softmax_kernel' at 65, 51 center font 'Sans,12'
set label 24 'P = softmax(S), in place; LSE' at 65, 47.5 center
set label 25 'one block per row; max, sum, write' at 65, 44.5 center font 'Sans,9'
set label 26 '3. pv_kernel' at 103, 51 center font 'Sans,12'
set label 27 'O = P V' at 103, 47.5 center
set label 28 'one thread per output element' at 103, 44.5 center font 'Sans,9'
set label 29 'three launches, one after the other: each waits for the whole of S' at 66, 58 center

# ---- the passes over memory ----
set arrow 1 from 10, 27 to 16, 42 as 1
set arrow 2 from 22, 27 to 22, 42 as 1
set arrow 3 from 32, 42 to 50, 29 as 2
set label 30 'write S' at 43, 38 left tc rgb RED
set arrow 4 from 60, 29 to 60, 42 as 2
set label 31 'read' at 59, 36 right tc rgb RED
set arrow 5 from 68, 42 to 68, 29 as 2
set label 32 'rewrite' at 69, 36 left tc rgb RED
set arrow 6 from 78, 42 to 105.5, 27 as 1
set arrow 7 from 78, 29 to 92, 42 as 2
set label 33 'read P' at 85, 31.5 left tc rgb RED
set arrow 8 from 96, 27 to 100, 42 as 1
set arrow 9 from 112, 42 to 118, 27 as 1

plot NaN notitle
