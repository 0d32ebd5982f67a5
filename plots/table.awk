# table.awk: the README's results tables (markdown) from a results.csv.
#
#   awk -F, -v sweep=long -f plots/csv.awk -f plots/table.awk results.csv   # times, ms
#   awk -F, -v sweep=fa2  -f plots/csv.awk -f plots/table.awk results.csv   # TFLOP/s, one
#                                                                          # table per (D, causal)
#   (no sweep: both, long first)
#
# long: N | each stage's median ms | sdpa_flash | sdpa_default | best stage's speedup over
#       stage 0 (over stage 1 where stage 0 has no number at that N)
# fa2:  N | each stage's TFLOP/s | FA2 (sdpa_flash) | sdpa_default | best stage / FA2
# A cell without a number says why: OOM, >budget (over the time budget, not run),
# FAIL (wrong result), n/a (unsupported on this GPU), - (no row).
# Columns are found by header name; a repeated (key, D, causal, N) row: the later one wins.
# The output depends only on the CSV's content (keys and N are sorted), never on awk's order.

function is_stage(k) {
    return k ~ /^stage[0-9]/
}

# 262144 -> 262,144
function commas(n,    s, out) {
    s = sprintf("%d", n)
    out = ""
    while (length(s) > 3) {
        out = "," substr(s, length(s) - 2) out
        s = substr(s, 1, length(s) - 3)
    }
    return s out
}

function fmt_ms(v) {
    v += 0
    if (v < 0.1) return sprintf("%.4f", v)
    if (v < 10) return sprintf("%.3f", v)
    if (v < 100) return sprintf("%.2f", v)
    if (v < 1000) return sprintf("%.1f", v)
    return sprintf("%.0f", v)
}

function fmt_x(r) {
    if (r >= 100) return sprintf("%.0fx", r)
    if (r >= 10) return sprintf("%.1fx", r)
    return sprintf("%.2fx", r)
}

function why(s) {
    if (s == "OOM") return "OOM"
    if (s == "over_budget") return ">budget"
    if (s == "FAIL") return "FAIL"
    if (s == "unsupported") return "n/a"
    if (s == "ok") return "?"
    return s
}

function title(k) {
    if (k == "sdpa_flash") return "FA2 (sdpa_flash)"
    return k
}

BEGIN {
    nrows = 0
}

{
    sw = row_sweep()
    if (sweep != "" && sw != sweep) next
    k = row_key()
    d = field("D") + 0
    c = field("causal") + 0
    n = field("N") + 0
    cfg = sw SUBSEP d SUBSEP c
    if (!(cfg in seencfg)) {
        seencfg[cfg] = 1
        ncfg[sw]++
        cfgs[sw, ncfg[sw]] = d SUBSEP c
        cfgH[cfg] = field("H")
        cfgT[cfg] = field("B") * n
        cfgB[cfg] = field("B")
    }
    if (!((sw, k) in seenkey)) {
        seenkey[sw, k] = 1
        nkey[sw]++
        keys[sw, nkey[sw]] = k
    }
    if (!((cfg, n) in seenN)) {
        seenN[cfg, n] = 1
        nN[cfg]++
        Ns[cfg, nN[cfg]] = n
    }
    st[cfg, k, n] = field("status")
    ms[cfg, k, n] = field("ms_median")
    tf[cfg, k, n] = field("tflops")
}

function has(cfg, k, n, metric) {
    return ((cfg, k, n) in st) && st[cfg, k, n] == "ok" &&
           isnum(metric == "ms" ? ms[cfg, k, n] : tf[cfg, k, n])
}

function cell(cfg, k, n, metric) {
    if (!((cfg, k, n) in st)) return "-"
    if (has(cfg, k, n, metric))
        return metric == "ms" ? fmt_ms(ms[cfg, k, n]) : sprintf("%.1f", tf[cfg, k, n])
    return why(st[cfg, k, n])
}

# Sort this sweep's keys and the configurations (D ascending, then causal) once.
function prepare(sw,    i, j, t, a, b) {
    nk = 0
    for (i = 1; i <= nkey[sw]; i++) K[++nk] = keys[sw, i]
    sort_keys(K, nk)
    nst = 0
    for (i = 1; i <= nk; i++) if (is_stage(K[i])) ++nst
    for (i = 2; i <= ncfg[sw]; i++) {
        t = cfgs[sw, i]
        split(t, b, SUBSEP)
        for (j = i - 1; j >= 1; j--) {
            split(cfgs[sw, j], a, SUBSEP)
            if (a[1] + 0 < b[1] + 0 || (a[1] + 0 == b[1] + 0 && a[2] + 0 <= b[2] + 0)) break
            cfgs[sw, j + 1] = cfgs[sw, j]
        }
        cfgs[sw, j + 1] = t
    }
}

function header(last,    i, line, rule) {
    line = "| N |"
    rule = "|---:|"
    for (i = 1; i <= nk; i++) {
        line = line " " title(K[i]) " |"
        rule = rule "---:|"
    }
    print line " " last " |"
    print rule ":---|"
}

# The first stage key that is stage <num> itself (a variant of it only if nothing else).
function stage_key(num,    i, fallback) {
    fallback = ""
    for (i = 1; i <= nk; i++) {
        if (K[i] ~ ("^stage" num "(_|$)") && index(K[i], ":") == 0) return K[i]
        if (K[i] ~ ("^stage" num "(_|$)") && fallback == "") fallback = K[i]
    }
    return fallback
}

function best_stage(cfg, n, metric,    i, b) {
    b = ""
    for (i = 1; i <= nk; i++) {
        if (!is_stage(K[i]) || !has(cfg, K[i], n, metric)) continue
        if (b == "") b = K[i]
        else if (metric == "ms" && ms[cfg, K[i], n] + 0 < ms[cfg, b, n] + 0) b = K[i]
        else if (metric == "tf" && tf[cfg, K[i], n] + 0 > tf[cfg, b, n] + 0) b = K[i]
    }
    return b
}

function table(sw, ci, metric,    cfg, a, d, c, j, n, i, line, b, s0, s1, base, last) {
    split(cfgs[sw, ci], a, SUBSEP)
    d = a[1]
    c = a[2]
    cfg = sw SUBSEP d SUBSEP c
    for (j = 1; j <= nN[cfg]; j++) NN[j] = Ns[cfg, j]
    sort_num(NN, nN[cfg])
    if (metric == "ms") {
        printf "Forward time in ms (median; lower is better), B = %s, H = %s, D = %d, %s.\n\n",
            cfgB[cfg], cfgH[cfg], d, c ? "causal" : "non-causal"
        last = "best stage speedup"
    } else {
        printf "**D = %d, %s**: TFLOP/s (higher is better), B x N = %s tokens, H = %s.\n\n", d,
            c ? "causal" : "non-causal", commas(cfgT[cfg]), cfgH[cfg]
        last = "best stage / FA2"
    }
    header(last)
    s0 = stage_key(0)
    s1 = stage_key(1)
    for (j = 1; j <= nN[cfg]; j++) {
        n = NN[j]
        line = "| " commas(n) " |"
        for (i = 1; i <= nk; i++) line = line " " cell(cfg, K[i], n, metric) " |"
        b = best_stage(cfg, n, metric)
        if (b == "") {
            line = line " - |"
        } else if (metric == "ms") {
            base = ""
            if (s0 != "" && has(cfg, s0, n, "ms")) base = s0
            else if (s1 != "" && has(cfg, s1, n, "ms")) base = s1
            if (base == "") line = line " - |"
            else line = line " " b " " fmt_x(ms[cfg, base, n] / ms[cfg, b, n]) " vs " \
                       (base == s0 ? "stage 0" : "stage 1") " |"
        } else {
            if (has(cfg, "sdpa_flash", n, "tf") && tf[cfg, "sdpa_flash", n] + 0 > 0)
                line = line " " b " " sprintf("%.2f", tf[cfg, b, n] / tf[cfg, "sdpa_flash", n]) \
                       " |"
            else line = line " - |"
        }
        print line
    }
}

function emit(sw, metric,    ci) {
    if (!(sw in ncfg)) {
        printf "No %s-sweep results in this CSV.\n", sw
        return
    }
    prepare(sw)
    for (ci = 1; ci <= ncfg[sw]; ci++) {
        if (ci > 1) print ""
        table(sw, ci, metric)
    }
    print ""
    print "OOM: out of device memory; >budget: over the time budget, not run; FAIL: wrong result;" \
          " n/a: unsupported here; -: no result."
}

END {
    if (sweep == "" || sweep == "long") emit("long", "ms")
    if (sweep == "") print ""
    if (sweep == "" || sweep == "fa2") emit("fa2", "tf")
}
