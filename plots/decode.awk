# decode.awk: the decode sweep's table (markdown) from a results.csv, for the top README's
# <!-- results:decode-sweep:begin/end --> section (plots/update_readme.sh).
#
#   awk -F, -f plots/csv.awk -f plots/decode.awk results.csv
#
# One row per (B, N_q, N_k) of the rows of sweep `decode`; a column per library (the course's
# stages by number, then FA2 = sdpa_flash, then the other SDPA backends): GB/s of K and V read
# (the gbs column: 2 B N_k H_kv D x 2 bytes / median time) and in brackets the share of the HBM's
# peak (csv.awk's hbm_tbs, by the GPU's name; none where unknown); the last column, the best stage's
# GB/s over the better of FA2 and cuDNN (sdpa_cudnn). The copy kernel's GB/s (stage `copy`) is
# named above the table for scale (a copy writes what it reads: decode, which only reads, can pass
# it). A cell without a number says why, as the other tables do: OOM, >budget, FAIL, n/a, - (no
# row). A CSV without decode rows gets one line that says so. The output depends only on the CSV's
# content.

function commas(n,    s, out) {
    s = sprintf("%d", n)
    out = ""
    while (length(s) > 3) {
        out = "," substr(s, length(s) - 2) out
        s = substr(s, 1, length(s) - 3)
    }
    return s out
}

function why(s) {
    if (s == "OOM") return "OOM"
    if (s == "over_budget") return ">budget"
    if (s == "FAIL") return "FAIL"
    if (s == "unsupported") return "n/a"
    return s == "ok" ? "?" : s
}

function title(k) {
    if (k == "sdpa_flash") return "FA2 (sdpa_flash)"
    if (k == "sdpa_cudnn") return "cuDNN (sdpa_cudnn)"
    return k
}

function pct(g) {
    return (hbm > 0) ? sprintf(" (%.0f%%)", 100 * g / (1000 * hbm)) : ""
}

{
    if (row_sweep() != "decode") next
    if (gpu == "") gpu = field("gpu")
    k = row_key()
    if (k == "copy") {
        if (field("status") == "ok" && isnum(field("gbs"))) roof = field("gbs") + 0
        next
    }
    if (H == "") { H = field("H"); Hkv = field("H_kv"); D = field("D") }
    g = sprintf("%09d %09d %012d", field("B"), field("N"), field("N_k"))
    if (!(g in seeng)) { seeng[g] = 1; G[++ng] = g }
    if (!(k in seenk)) { seenk[k] = 1; K[++nk] = k }
    st[g, k] = field("status")
    gb[g, k] = field("gbs")
    ndec++
}

function has(g, k) {
    return ((g, k) in st) && st[g, k] == "ok" && isnum(gb[g, k])
}

function cell(g, k) {
    if (!((g, k) in st)) return "-"
    if (has(g, k)) return sprintf("%.0f", gb[g, k]) pct(gb[g, k])
    return why(st[g, k])
}

END {
    if (ndec == 0) {
        print "There are no decode rows in this CSV yet: `make bench` on a GPU runs the decode sweep"
        print "(plots/shapes.conf: B = 1 and 8, H = 32 over H_kv = 8, D = 128, N_q = 1 and 4, N_k = 1k to 256k)"
        print "and writes them, with the copy kernel's GB/s as the roof."
        exit
    }
    hbm = hbm_tbs(gpu)
    sort_keys(K, nk)
    for (i = 2; i <= ng; i++) {
        t = G[i]
        for (j = i - 1; j >= 1 && G[j] > t; j--) G[j + 1] = G[j]
        G[j + 1] = t
    }
    printf "Decode: B sequences of N_q new queries (causal, bottom-right, when N_q > 1) against a contiguous\n"
    printf "cache of N_k keys each; H = %s query heads over H_kv = %s KV heads, D = %s, fp16. GB/s of K and V\n", H, Hkv, D
    printf "read (2 B N_k H_kv D x 2 bytes / median time, L2 flushed before each call)%s.",
           (hbm > 0 ? sprintf(", in brackets the share of the HBM's peak (%.3g TB/s)", hbm) : "")
    if (roof > 0)
        printf " A copy kernel of the same run, which writes what it reads (decode only reads, and" \
               " can pass it): %.0f GB/s%s.", roof, pct(roof)
    printf "\n\n"
    line = "| B | N_q | N_k |"
    rule = "|---:|---:|---:|"
    for (i = 1; i <= nk; i++) { line = line " " title(K[i]) " |"; rule = rule "---:|" }
    print line " best stage / best of FA2, cuDNN |"
    print rule "---:|"
    for (i = 1; i <= ng; i++) {
        g = G[i]
        split(g, p, " ")
        line = sprintf("| %d | %d | %s |", p[1], p[2], commas(p[3]))
        best = ""; ref = ""
        for (j = 1; j <= nk; j++) {
            k = K[j]
            line = line " " cell(g, k) " |"
            if (k ~ /^stage[0-9]/ && has(g, k) && (best == "" || gb[g, k] + 0 > best + 0)) best = gb[g, k]
            if ((k == "sdpa_flash" || k == "sdpa_cudnn") && has(g, k) && (ref == "" || gb[g, k] + 0 > ref + 0)) ref = gb[g, k]
        }
        line = line " " ((best != "" && ref != "" && ref + 0 > 0) ? sprintf("%.2fx", best / ref) : "-") " |"
        print line
    }
}
