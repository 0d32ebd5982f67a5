# table.awk: the README's results tables (markdown) from a results.csv.
#
#   awk -F, -v sweep=long -f plots/csv.awk -f plots/table.awk results.csv   # times, ms
#   awk -F, -v sweep=fa2  -f plots/csv.awk -f plots/table.awk results.csv   # TFLOP/s, one
#                                                                          # table per (D, causal)
#   (no sweep: both, long first)
#   awk -F, -v lesson=3 -f plots/csv.awk -f plots/table.awk results.csv   # stage 3's lesson
#   awk -F, -v summary=1 -f plots/csv.awk -f plots/table.awk results.csv  # the stages in one table
#
# lesson=K: the measured section of stage K's README: stage K against the stage before it (the
#       nearest lower stage in the CSV) and FA2 (sdpa_flash). A long-sweep table (every N: the
#       previous stage's and stage K's median ms, stage K's TFLOP/s, device MB and max abs error,
#       the speedup, FA2's ms and FA2 time / stage K time), an fa2-sweep table of the same columns at the N of
#       lesson_n (default "4096 16384") for every (D, causal), and one line per comparison over
#       all fa2 shapes (geometric mean, lowest and highest, each with its shape).
#
# summary=1: one row per stage over the fa2 shapes with N >= summary_n (default 1024: the
#       FlashAttention-2 paper's range): its TFLOP/s on the non-causal ones (lowest to highest),
#       then FA2 time / stage time and cuDNN (sdpa_default) time / stage time over all of them:
#       geometric mean, lowest, and on how many shapes the stage is the faster.
#
# long: N | each stage's median ms | sdpa_flash | sdpa_default | best stage's speedup over
#       stage 0 (over stage 1 where stage 0 has no number at that N)
# fa2:  N | each stage's TFLOP/s | FA2 (sdpa_flash) | sdpa_default | best stage / FA2
# FA2 is what the stages are measured against where the CSV's GPU runs it; on a GPU without it (a
# T4) the lessons, the summary and the fa2 tables' last column take PyTorch's memory-efficient kernel
# (sdpa_mem_efficient) instead, and say so.
# A cell without a number says why: OOM, >budget (over the time budget, not run),
# FAIL (wrong result), n/a (unsupported on this GPU), - (no row).
# Columns are found by header name; a repeated (key, D, causal, N) row: the later one wins.
# The output depends only on the CSV's content (keys and N are sorted), never on awk's order.

# What the rows time (csv.awk keeps one pass: PASS, default fwd), in words.
function pass_time() {
    if (PASS == "bwd") return "Backward time"
    if (PASS == "fwd+bwd") return "Forward + backward time"
    return "Forward time"
}
function pass_tflops() {
    if (PASS == "bwd") return "TFLOP/s (2.5x the forward's FLOPs; higher is better)"
    if (PASS == "fwd+bwd") return "TFLOP/s (3.5x the forward's FLOPs; higher is better)"
    return "TFLOP/s (higher is better)"
}

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
    if (field("status") == "ok" && (k == "sdpa_flash" || k == "sdpa_mem_efficient")) ran[k] = 1
    ms[cfg, k, n] = field("ms_median")
    tf[cfg, k, n] = field("tflops")
    mb[cfg, k, n] = field("device_mb")
    err[cfg, k, n] = field("max_abs_err")
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

# Whether key k has a number (metric) at any N of cfg.
function any_n(cfg, k, metric,    j) {
    for (j = 1; j <= nN[cfg]; j++) if (has(cfg, k, Ns[cfg, j], metric)) return 1
    return 0
}

function table(sw, ci, metric,    cfg, a, d, c, j, n, i, line, b, s0, s1, base, last, vs_ref) {
    split(cfgs[sw, ci], a, SUBSEP)
    d = a[1]
    c = a[2]
    cfg = sw SUBSEP d SUBSEP c
    for (j = 1; j <= nN[cfg]; j++) NN[j] = Ns[cfg, j]
    sort_num(NN, nN[cfg])
    if (metric == "ms") {
        printf "%s in ms (median; lower is better), B = %s, H = %s, D = %d, %s.\n\n",
            pass_time(), cfgB[cfg], cfgH[cfg], d, c ? "causal" : "non-causal"
        last = "best stage speedup"
    } else {
        last = ""
    }
    s0 = stage_key(0)
    s1 = stage_key(1)
    # a table without stage 0 or 1 (the backward pass: stage 7 alone) compares with the reference
    vs_ref = metric == "ms" && !(s0 != "" && any_n(cfg, s0, "ms")) && !(s1 != "" && any_n(cfg, s1, "ms"))
    if (vs_ref) last = REF_NAME " time / best stage time"
    if (metric != "ms") {
        printf "**D = %d, %s**: %s, B x N = %s tokens, H = %s.\n\n", d,
            c ? "causal" : "non-causal", pass_tflops(), commas(cfgT[cfg]), cfgH[cfg]
        last = "best stage / " REF_NAME (REF == "sdpa_flash" ? "" : " (no FA2 on this GPU)")
    }
    header(last)
    for (j = 1; j <= nN[cfg]; j++) {
        n = NN[j]
        line = "| " commas(n) " |"
        for (i = 1; i <= nk; i++) line = line " " cell(cfg, K[i], n, metric) " |"
        b = best_stage(cfg, n, metric)
        if (b == "") {
            line = line " - |"
        } else if (vs_ref) {
            if (has(cfg, REF, n, "ms") && ms[cfg, b, n] + 0 > 0)
                line = line " " b " " fmt_r(ms[cfg, REF, n] / ms[cfg, b, n]) " |"
            else line = line " - |"
        } else if (metric == "ms") {
            base = ""
            if (s0 != "" && has(cfg, s0, n, "ms")) base = s0
            else if (s1 != "" && has(cfg, s1, n, "ms")) base = s1
            if (base == "") line = line " - |"
            else line = line " " b " " fmt_x(ms[cfg, base, n] / ms[cfg, b, n]) " vs " \
                       (base == s0 ? "stage 0" : "stage 1") " |"
        } else {
            if (has(cfg, REF, n, "tf") && tf[cfg, REF, n] + 0 > 0)
                line = line " " b " " sprintf("%.2f", tf[cfg, b, n] / tf[cfg, REF, n]) " |"
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

# ---- lesson=K: one stage's measured section

function stage_label(k,    n) {
    if (match(k, /^stage[0-9]+/)) return "stage " substr(k, 6, RLENGTH - 5) + 0
    return title(k)
}

# The nearest stage below stage num among this sweep's keys (variants only if nothing else).
function prev_stage_key(num,    j, k) {
    for (j = num - 1; j >= 0; j--) {
        k = stage_key(j)
        if (k != "") return k
    }
    return ""
}

function ms_cell(cfg, k, n) {
    if (k == "") return "-"
    return cell(cfg, k, n, "ms")
}

# "1.23x" (time of base / time of k) or "-" where either has no time.
function speedup_cell(cfg, base, k, n) {
    if (base == "" || k == "" || !has(cfg, base, n, "ms") || !has(cfg, k, n, "ms") ||
        ms[cfg, k, n] + 0 <= 0)
        return "-"
    return fmt_x(ms[cfg, base, n] / ms[cfg, k, n])
}

# A time ratio below 1 has a digit more where it is small: 0.61, 0.038.
function fmt_r(r) {
    return sprintf(r < 0.1 ? "%.3f" : "%.2f", r)
}

# FA2 time / stage time, "0.61" (above 1: the stage is faster), or "-".
function vs_cell(cfg, base, k, n) {
    if (base == "" || k == "" || !has(cfg, base, n, "ms") || !has(cfg, k, n, "ms") ||
        ms[cfg, k, n] + 0 <= 0)
        return "-"
    return fmt_r(ms[cfg, base, n] / ms[cfg, k, n])
}

function lesson_header(first, me, prev) {
    printf "| %s |", first
    if (prev != "") printf " %s ms |", stage_label(prev)
    printf " %s ms | %s TFLOP/s | %s device MB | max abs error |", stage_label(me), stage_label(me), stage_label(me)
    if (prev != "") printf " %s vs %s |", stage_label(me), stage_label(prev)
    printf " %s ms | %s time / %s time |\n", REF_NAME, REF_NAME, stage_label(me)
    printf "|%s|", first == "N" ? "---:" : ":---"
    if (prev != "") printf "---:|"
    printf "---:|---:|---:|---:|"
    if (prev != "") printf "---:|"
    printf "---:|---:|\n"
}

function lesson_row(first, cfg, n, me, prev,    line) {
    line = "| " first " |"
    if (prev != "") line = line " " ms_cell(cfg, prev, n) " |"
    line = line " " ms_cell(cfg, me, n) " |"
    line = line " " (has(cfg, me, n, "tf") ? sprintf(tf[cfg, me, n] < 10 ? "%.2f" : "%.1f", tf[cfg, me, n]) : ms_cell(cfg, me, n)) " |"
    line = line " " (has(cfg, me, n, "ms") && isnum(mb[cfg, me, n]) && mb[cfg, me, n] + 0 > 0 ? \
                     sprintf("%.1f", mb[cfg, me, n]) : "-") " |"
    line = line " " (has(cfg, me, n, "ms") && isnum(err[cfg, me, n]) ? err[cfg, me, n] : "-") " |"
    if (prev != "") line = line " " speedup_cell(cfg, prev, me, n) " |"
    line = line " " ms_cell(cfg, REF, n) " | " vs_cell(cfg, REF, me, n) " |"
    print line
}

function shape_name(cfg, n,    a) {
    split(cfg, a, SUBSEP)
    return sprintf("D = %d, %s, N = %s (B = %d, H = %s)", a[2], a[3] ? "causal" : "non-causal",
                   commas(n), cfgT[cfg] / n, cfgH[cfg])
}

function short_shape(cfg, n,    a) {
    split(cfg, a, SUBSEP)
    return sprintf("D = %d %sN = %s", a[2], a[3] ? "causal " : "", commas(n))
}

# "geometric mean 1.04x, from 1.02x (shape) to 1.06x (shape)" of time(base) / time(k) over
# every fa2 shape where both have a time; "" if none.
function over_fa2(base, k, x,    ci, a, cfg, j, n, r, sum, cnt, lo, hi, lon, hin, f) {
    cnt = 0
    for (ci = 1; ci <= ncfg["fa2"]; ci++) {
        split(cfgs["fa2", ci], a, SUBSEP)
        cfg = "fa2" SUBSEP a[1] SUBSEP a[2]
        for (j = 1; j <= nN[cfg]; j++) {
            n = Ns[cfg, j]
            if (!has(cfg, base, n, "ms") || !has(cfg, k, n, "ms") || ms[cfg, k, n] + 0 <= 0 ||
                ms[cfg, base, n] + 0 <= 0)
                continue
            r = ms[cfg, base, n] / ms[cfg, k, n]
            sum += log(r)
            cnt++
            f = short_shape(cfg, n)
            if (cnt == 1 || r < lo || (r == lo && f < lon)) { lo = r; lon = f }
            if (cnt == 1 || r > hi || (r == hi && f < hin)) { hi = r; hin = f }
        }
    }
    if (cnt == 0) return ""
    if (x) return sprintf("geometric mean %s over %d shapes, from %s (%s) to %s (%s)", fmt_x(exp(sum / cnt)),
                          cnt, fmt_x(lo), lon, fmt_x(hi), hin)
    return sprintf("geometric mean %s over %d shapes, from %s (%s) to %s (%s)", fmt_r(exp(sum / cnt)), cnt,
                   fmt_r(lo), lon, fmt_r(hi), hin)
}

function emit_lesson(num,    sw, me, prev, ci, a, cfg, j, n, want, w, nw, printed, s, rows) {
    printed = 0
    if ("long" in ncfg) {
        prepare("long")
        me = stage_key(num)
        prev = prev_stage_key(num)
        if (me != "") {
            for (ci = 1; ci <= ncfg["long"]; ci++) {
                split(cfgs["long", ci], a, SUBSEP)
                cfg = "long" SUBSEP a[1] SUBSEP a[2]
                for (j = 1; j <= nN[cfg]; j++) NN[j] = Ns[cfg, j]
                sort_num(NN, nN[cfg])
                if (printed++) print ""
                printf "**Long sweep**: %s in ms (median; lower is better), B = %s, H = %s, D = %d, %s.\n\n",
                    tolower(pass_time()), cfgB[cfg], cfgH[cfg], a[1], a[2] ? "causal" : "non-causal"
                lesson_header("N", me, prev)
                for (j = 1; j <= nN[cfg]; j++) lesson_row(commas(NN[j]), cfg, NN[j], me, prev)
            }
        }
    }
    if ("fa2" in ncfg) {
        prepare("fa2")
        me = stage_key(num)
        prev = prev_stage_key(num)
        if (me != "") {
            if (printed++) print ""
            nw = split(lesson_n == "" ? "4096 16384" : lesson_n, want, " ")
            printf "**fa2 sweep** at N = "
            for (w = 1; w <= nw; w++) printf "%s%s", (w > 1 ? (w == nw ? " and " : ", ") : ""), commas(want[w])
            printf ": B x N = 16,384 tokens and H = 2048 / D heads (32 at D = 64, 16 at D = 128), so every shape" \
                   " moves the same number of elements (FlashAttention-2's benchmark shapes).\n\n"
            lesson_header("shape", me, prev)
            # a configuration measured at none of those N: its largest N
            for (ci = 1; ci <= ncfg["fa2"]; ci++) {
                split(cfgs["fa2", ci], a, SUBSEP)
                cfg = "fa2" SUBSEP a[1] SUBSEP a[2]
                rows = 0
                for (w = 1; w <= nw; w++)
                    if ((cfg, want[w] + 0) in seenN) {
                        lesson_row(shape_name(cfg, want[w] + 0), cfg, want[w] + 0, me, prev)
                        rows++
                    }
                if (!rows) {
                    for (j = 1; j <= nN[cfg]; j++) NN[j] = Ns[cfg, j]
                    sort_num(NN, nN[cfg])
                    lesson_row(shape_name(cfg, NN[nN[cfg]]), cfg, NN[nN[cfg]], me, prev)
                }
            }
            print ""
            if (prev != "" && (s = over_fa2(prev, me, 1)) != "")
                printf "Over the fa2 sweep, %s vs %s: %s.\n", stage_label(me), stage_label(prev), s
            if ((s = over_fa2(REF, me, 0)) != "")
                printf "Over the fa2 sweep, %s time / %s time: %s.\n", REF_NAME, stage_label(me), s
            if ((s = over_fa2("sdpa_default", me, 0)) != "")
                printf "Over the fa2 sweep, PyTorch SDPA default time / %s time: %s.\n", stage_label(me), s
        }
    }
    if (!printed) {
        printf "No results for stage %d in this CSV.\n", num
        return
    }
    print ""
    print "OOM: out of device memory; >budget: over the time budget, not run; FAIL: wrong result;" \
          " n/a: unsupported here; -: no result."
}

# ---- summary=1: the stages in one table

# "1.12 (lowest 1.04; faster on 20 of 20)": time(base) / time(k) over the fa2 shapes with
# N >= minn where both have a time, or "-".
function vs_summary(base, k, minn,    ci, a, cfg, j, n, r, sum, cnt, lo, faster) {
    cnt = faster = 0
    for (ci = 1; ci <= ncfg["fa2"]; ci++) {
        split(cfgs["fa2", ci], a, SUBSEP)
        cfg = "fa2" SUBSEP a[1] SUBSEP a[2]
        for (j = 1; j <= nN[cfg]; j++) {
            n = Ns[cfg, j]
            if (n < minn || !has(cfg, base, n, "ms") || !has(cfg, k, n, "ms") || ms[cfg, k, n] + 0 <= 0)
                continue
            r = ms[cfg, base, n] / ms[cfg, k, n]
            sum += log(r)
            if (++cnt == 1 || r < lo) lo = r
            if (r > 1) faster++
        }
    }
    if (cnt == 0) return "-"
    return sprintf("%s (lowest %s; faster on %d of %d)", fmt_r(exp(sum / cnt)), fmt_r(lo), faster, cnt)
}

# "324.2-378.7": k's TFLOP/s on the non-causal fa2 shapes with N >= minn, or "-".
function tf_summary(k, minn,    ci, a, cfg, j, n, cnt, lo, hi) {
    cnt = 0
    for (ci = 1; ci <= ncfg["fa2"]; ci++) {
        split(cfgs["fa2", ci], a, SUBSEP)
        if (a[2] + 0) continue
        cfg = "fa2" SUBSEP a[1] SUBSEP a[2]
        for (j = 1; j <= nN[cfg]; j++) {
            n = Ns[cfg, j]
            if (n < minn || !has(cfg, k, n, "tf")) continue
            if (++cnt == 1 || tf[cfg, k, n] + 0 < lo) lo = tf[cfg, k, n] + 0
            if (cnt == 1 || tf[cfg, k, n] + 0 > hi) hi = tf[cfg, k, n] + 0
        }
    }
    if (cnt == 0) return "-"
    return sprintf(hi < 10 ? "%.2f-%.2f" : "%.1f-%.1f", lo, hi)
}

function emit_summary(    minn, i, k) {
    minn = summary_n == "" ? 1024 : summary_n + 0
    prepare("fa2")
    printf "fa2 shapes with N >= %s: TFLOP/s on the non-causal ones; time ratios (above 1: the stage is" \
           " faster) over all of them.\n\n", commas(minn)
    printf "| stage | TFLOP/s, non-causal | %s time / stage time | %s time / stage time |\n",
           REF_NAME (REF == "sdpa_flash" ? "" : " (no FA2 on this GPU)"),
           REF == "sdpa_flash" ? "cuDNN (sdpa_default)" : "PyTorch default (sdpa_default)"
    print "|:---|---:|---:|---:|"
    for (i = 1; i <= nk; i++) {
        k = K[i]
        if (!is_stage(k) || index(k, ":")) continue  # stages, not their variants
        printf "| %s | %s | %s | %s |\n", k, tf_summary(k, minn), vs_summary(REF, k, minn),
               vs_summary("sdpa_default", k, minn)
    }
    printf "\nThe CSV: %d rows (every pass): %d of the course's stages (%s), %d of PyTorch's SDPA%s; %s.\n",
           nrows, nstage_rows, status_counts(), other_rows, copy_rows ? ", " copy_rows " of the copy roof" : "",
           failed_rows ? failed_rows (failed_rows == 1 ? " failed its check" : " failed their check") \
                       : "none failed its check"
}

# "314 ok, 1 OOM": the stage rows by status, in the CSV header's order of statuses.
function status_counts(    n, i, s, out) {
    n = split("ok FAIL OOM unsupported over_budget", s, " ")
    for (i = 1; i <= n; i++)
        if (s[i] in stage_status) out = out (out == "" ? "" : ", ") stage_status[s[i]] " " s[i]
    return out
}

# What the tables, the lessons and the summary measure the stages against: FA2 (sdpa_flash) where the GPU of
# the CSV runs it, else PyTorch's memory-efficient kernel (a T4 has no FA2); REF_NAME in words.
function csv_reference() {
    if ("sdpa_flash" in ran) return "sdpa_flash"
    if ("sdpa_mem_efficient" in ran) return "sdpa_mem_efficient"
    return "sdpa_flash"
}

END {
    REF = csv_reference()
    REF_NAME = REF == "sdpa_flash" ? "FA2" : "memory-efficient SDPA"
    if (summary != "") { emit_summary(); exit }
    if (lesson != "") { emit_lesson(lesson + 0); exit }
    if (sweep == "" || sweep == "long") emit("long", "ms")
    if (sweep == "") print ""
    if (sweep == "" || sweep == "fa2") emit("fa2", "tf")
}
