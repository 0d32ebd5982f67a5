# series.awk: pull one plottable series out of a results.csv (the gnuplot scripts call it).
#
#   awk -F, -f plots/csv.awk -f plots/series.awk -v mode=MODE [-v sweep=long|fa2] [-v key=K] [-v D=128]
#       [-v causal=0] [-v y=ms_median] [-v status=ok] [-v base=K] [-v N=16384]
#       [-v x=N_k] [-v batch=8] [-v nq=1] results.csv
#
# A series key is the stage name ("stage3_cp_async", "sdpa_flash"), or "stage:variant" for a
# row whose variant is not "default". Columns are found by their header names, so added columns
# do not break it. When a (key, D, causal, N) appears twice, the later row wins.
# x: the column the modes below call N (default N; the decode sweep's plot: N_k); batch and nq
# keep the rows of that B and that N column (the decode sweep's N_q) only.
#
# mode=keys    the keys present: stages by number, then sdpa_flash, sdpa_default, then others
# mode=gpu     the GPU name of the first row
# mode=xy      "N value" for rows with status ok and a value in column y, sorted by N; a blank
#              line where the key has a row without a number, so the plotted line breaks there
# mode=marks   "N pointtype status" for rows whose status is not ok (OOM, over_budget, FAIL),
#              sorted by N; pointtypes: OOM 2 (x), over_budget 8 (triangle), FAIL 6 (circle).
#              Unsupported rows (a stage that does not run on this GPU) are left out of every
#              mode: not drawn, no legend entry, no bar (the tables say n/a).
# mode=ratio   "N base_value/value" where both key and base are ok (y defaults to ms_median)
# mode=bar     "key value status colour" at N for every key (value 0 where it is not ok)
# mode=colour  the colour index of key: its place among all stages of the CSV (1, 2, ..., any
#              number), whatever the filters, so a stage keeps its colour in every plot;
#              sdpa_flash -1, sdpa_default -2, others -3
# mode=statuses  the not-ok statuses present (OOM over_budget FAIL unsupported, in that order)
# mode=max     the largest value of y over ok rows (0 if none); mode=min the smallest
# mode=count   how many lines mode=xy (or mode=marks with status=notok) would print
# mode=stagekey  the first key whose name starts with "stage" base (e.g. base=stage0)
# mode=groups  "B N" of every (B, N) pair of the rows kept, the copy roof's left out, sorted
# mode=hbm     the HBM's peak TB/s of the first row's GPU (csv.awk's hbm_tbs; 0: unknown)
# mode=first   the first value in column y of the rows kept (empty if none)

function marker(st) {
    if (st == "OOM") return 2
    if (st == "over_budget") return 8
    if (st == "FAIL") return 6
    return 12
}

BEGIN {
    if (y == "") y = (mode == "bar") ? "tflops" : "ms_median"
    if (status == "") status = "ok"
    nkeys = 0
    nall = 0
    nn = 0
    gpu = ""
}

{
    if (gpu == "") gpu = field("gpu")
    k = row_key()
    if (!(k in allseen)) { allseen[k] = 1; allkeys[++nall] = k }
    if (field("status") == "unsupported") next
    if (sweep != "" && row_sweep() != sweep) next
    if (D != "" && field("D") != D) next
    if (causal != "" && field("causal") != causal) next
    if (batch != "" && field("B") != batch) next
    if (nq != "" && field("N") != nq) next
    if (k != "copy" && !((field("B") + 0, field("N") + 0) in seengroup)) {
        seengroup[field("B") + 0, field("N") + 0] = 1
        groups[++ngroups] = sprintf("%09d %09d", field("B"), field("N"))
    }
    if (!(k in seen)) { seen[k] = 1; keys[++nkeys] = k }
    if (first == "") first = field(y)
    n = field(x == "" ? "N" : x) + 0
    if (!((k, n) in st)) {
        if (!(n in seenN)) { seenN[n] = 1; Ns[++nn] = n }
    }
    st[k, n] = field("status")
    val[k, n] = field(y)
}

function ok(k, n) {
    return ((k, n) in st) && st[k, n] == "ok" && isnum(val[k, n])
}

# A key's colour index: a stage's place among all the stage keys of the CSV (1, 2, ... whatever
# the filters and however many stages), so a stage has the same colour in every plot; the other
# libraries below zero: sdpa_flash -1, sdpa_default -2, anything else -3 (plots/style.gpi).
function colour(k,    i, c) {
    if (k == "sdpa_flash") return -1
    if (k == "sdpa_default") return -2
    if (k !~ /^stage[0-9]/) return -3
    c = 0
    for (i = 1; i <= nall; i++) {
        if (allkeys[i] ~ /^stage[0-9]/) c++
        if (allkeys[i] == k) return c
    }
    return -3
}

END {
    if (mode == "gpu") { print gpu; exit }
    if (mode == "hbm") { print hbm_tbs(gpu); exit }
    if (mode == "first") { print first; exit }
    if (mode == "groups") {
        for (i = 2; i <= ngroups; i++) {
            t = groups[i]
            for (j = i - 1; j >= 1 && groups[j] > t; j--) groups[j + 1] = groups[j]
            groups[j + 1] = t
        }
        for (i = 1; i <= ngroups; i++) { split(groups[i], g, " "); print g[1] + 0, g[2] + 0 }
        exit
    }
    sort_keys(allkeys, nall)
    sort_keys(keys, nkeys)
    sort_num(Ns, nn)
    if (mode == "keys") {
        for (i = 1; i <= nkeys; i++) print keys[i]
        exit
    }
    if (mode == "stagekey") {
        for (i = 1; i <= nkeys; i++)
            if (index(keys[i], base "_") == 1 || keys[i] == base) { print keys[i]; exit }
        exit
    }
    if (mode == "max" || mode == "min") {
        m = ""
        for (i = 1; i <= nkeys; i++)
            for (j = 1; j <= nn; j++)
                if (ok(keys[i], Ns[j]) && (key == "" || keys[i] == key))
                    if (m == "" || (mode == "max" && val[keys[i], Ns[j]] + 0 > m + 0) ||
                        (mode == "min" && val[keys[i], Ns[j]] + 0 < m + 0))
                        m = val[keys[i], Ns[j]]
        print (m == "") ? 0 : m
        exit
    }
    if (mode == "colour") {
        print colour(key)
        exit
    }
    if (mode == "bar") {
        for (i = 1; i <= nkeys; i++) {
            k = keys[i]
            c = colour(k)
            if (!((k, N + 0) in st)) continue
            if (ok(k, N + 0)) print k, val[k, N + 0], "ok", c
            else print k, 0, st[k, N + 0], c
        }
        exit
    }
    if (mode == "statuses") {
        for (i = 1; i <= nkeys; i++)
            for (j = 1; j <= nn; j++)
                if ((keys[i], Ns[j]) in st) have[st[keys[i], Ns[j]]] = 1
        out = ""
        split("OOM over_budget FAIL unsupported", order, " ")
        for (i = 1; i <= 4; i++) if (order[i] in have) out = out (out == "" ? "" : " ") order[i]
        print out
        exit
    }
    cnt = 0
    for (j = 1; j <= nn; j++) {
        n = Ns[j]
        if (mode == "xy" || (mode == "count" && status == "ok")) {
            if (!ok(key, n)) {
                # a blank line breaks the plotted line where this key has no number
                if (mode == "xy" && cnt > 0 && (key, n) in st) print ""
                continue
            }
            if (mode == "xy") print n, val[key, n]
            cnt++
        } else if (mode == "marks" || mode == "count") {
            if (!((key, n) in st) || st[key, n] == "ok") continue
            if (mode == "marks") print n, marker(st[key, n]), st[key, n]
            cnt++
        } else if (mode == "ratio") {
            if (!ok(key, n) || !ok(base, n) || val[key, n] + 0 <= 0) continue
            printf "%d %.6g\n", n, (val[base, n] + 0) / (val[key, n] + 0)
            cnt++
        }
    }
    if (mode == "count") print cnt
}
