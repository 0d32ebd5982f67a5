# csv.awk: reading a results.csv, shared by series.awk and table.awk (give it first:
# awk -F, -f plots/csv.awk -f plots/table.awk results.csv). Columns are found by their header
# names, so added columns do not break the readers; a repeated header line (CSVs concatenated)
# is read again; blank lines are skipped. A row's key is its stage name ("stage3_cp_async",
# "sdpa_flash"), or "stage:variant" for a variant other than "default".

function trim(s) {
    sub(/\r$/, "", s)
    return s
}

function field(name) {
    return (name in col) ? $(col[name]) : ""
}

function isnum(s) {
    return s ~ /^[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?$/
}

function row_key(    k, v) {
    k = field("stage")
    v = field("variant")
    return (v != "" && v != "default") ? k ":" v : k
}

# Rows without a sweep column (older CSVs): 1 to 16 queries against more keys (N_k) is the decode
# sweep, B = H = 1 the long sweep, the rest fa2.
function row_sweep(    s) {
    s = field("sweep")
    if (s != "") return s
    if (field("N_k") != "" && field("N") + 0 <= 16 && field("N_k") + 0 > field("N") + 0) return "decode"
    return (field("B") == 1 && field("H") == 1) ? "long" : "fa2"
}

# The HBM's peak bandwidth in TB/s (the datasheet's) by GPU name, for the decode sweep's share of
# it (decode.gp, decode.awk); 0 where unknown (then no share is given).
function hbm_tbs(name,    g) {
    g = "-" tolower(name) "-"
    gsub(/[^a-z0-9]+/, "-", g)
    if (g ~ /-gh200-/) return 4.0
    if (g ~ /-h200-/) return 4.8
    if (g ~ /-h100-.*pcie/) return 2.0
    if (g ~ /-h100-.*nvl/) return 3.9
    if (g ~ /-(h100|h800)-/) return 3.35
    if (g ~ /-b200-/) return 8.0
    if (g ~ /-a100-.*80gb/) return g ~ /pcie/ ? 1.935 : 2.039
    if (g ~ /-(a100|a800)-/) return 1.555
    if (g ~ /-l40s-/ || g ~ /-l40-/) return 0.864
    if (g ~ /-a10-/) return 0.6
    if (g ~ /-l4-/) return 0.3
    if (g ~ /-t4-/) return 0.32
    return 0
}

# Order of keys: stages by their number, then SDPA baselines, then the rest by name.
function rank(k,    n) {
    if (match(k, /^stage[0-9]+/)) {
        n = substr(k, 6, RLENGTH - 5) + 0
        return sprintf("0 %09d %s", n, k)
    }
    if (k == "sdpa_flash") return "1 0 " k
    if (k == "sdpa_default") return "1 1 " k
    return "2 0 " k
}

function sort_keys(arr, n,    i, j, t) {
    for (i = 2; i <= n; i++) {
        t = arr[i]
        for (j = i - 1; j >= 1 && rank(arr[j]) > rank(t); j--) arr[j + 1] = arr[j]
        arr[j + 1] = t
    }
}

function sort_num(arr, n,    i, j, t) {
    for (i = 2; i <= n; i++) {
        t = arr[i]
        for (j = i - 1; j >= 1 && arr[j] + 0 > t + 0; j--) arr[j + 1] = arr[j]
        arr[j + 1] = t
    }
}

{ $0 = trim($0) }

NR == 1 || ($1 == "gpu" && $2 == "stage") {
    delete col
    for (i = 1; i <= NF; i++) col[$i] = i
    next
}

$0 == "" { next }

# Every row of every pass, counted before the pass filter below (the summary's closing line):
# the course's stages by status, the copy roof of the decode sweep, and the rest (PyTorch's SDPA rows).
{
    nrows++
    if (field("stage") ~ /^stage[0-9]/) { nstage_rows++; stage_status[field("status")]++ }
    else if (field("stage") == "copy") copy_rows++
    else other_rows++
    if (field("status") == "FAIL") failed_rows++
}

# The pass column (common/csv_header.h): readers see the forward rows (a CSV without the column
# has only those) unless they ask for another pass with -v PASS=bwd or PASS=fwd+bwd (PASS=any:
# every pass, as style.gpi's colours need: a key keeps its colour in every figure).
PASS != "any" && (field("pass") == "" ? "fwd" : field("pass")) != (PASS == "" ? "fwd" : PASS) { next }
