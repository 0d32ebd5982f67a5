# plots/plots.mk: the main job's benchmark, plots and README tables. Included by the top-level
# Makefile (run make from the repository root); it uses BUILD, the folder of the stage programs.
#
#   make bench        sweep every stage program in $(BUILD) into plots/<gpu>/results.csv: the
#                     long and fa2 sweeps, and the decode sweep of the decode stages with the
#                     copy roof of $(BUILD)/copy_bw (plots/copy_bw.cu, built here)
#                     (needs an NVIDIA GPU; BUDGET=60 seconds per launch, SWEEP_STAGES="0 3":
#                     only those stages; SWEEPS=decode: only those sweeps, of long fa2 decode;
#                     APPEND=1: add the rows to the CSV instead of rewriting it). QUICK=1: the
#                     quick sweep (every stage, the few shapes of plots/shapes.conf, about 2
#                     minutes on an H200) into $(QUICK_DIR)/
#   make plots        draw the PNGs from plots/<gpu>/results.csv into that folder; on a machine
#                     without a GPU (or without results for it) from plots/$(REF_GPU)/. They are
#                     redrawn only when the CSV or the plot scripts changed (plots.cksum in that
#                     folder records what they were drawn from, and which PNGs a script drew
#                     none of: decode.png without decode rows), so a clean tree stays clean.
#                     QUICK=1: from and into $(QUICK_DIR)/
#   make tables       rewrite the results tables of $(README) and the measured section of every
#                     stage README from the reference GPU's CSV, plots/$(REF_GPU)/results.csv (or
#                     PLOT_CSV), and the exercises' measured answers (plots/answers.py); on any other
#                     GPU with results, leave them alone and write the same tables for that GPU into
#                     plots/<gpu>/TABLES.md (plots/gpu_tables.sh) instead: the lessons' prose argues
#                     from the reference run (QUICK=1: print the tables instead). A stage
#                     README carries its section between <!-- results:stageK:begin --> and
#                     <!-- results:stageK:end -->; one without those markers is left alone.
#                     LESSON_READMES=list overrides which (default: every stage*/README.md with
#                     markers when README is README.md, none when README names another file).
#                     The top README's decode table sits between <!-- results:decode-sweep:begin -->
#                     and <!-- results:decode-sweep:end --> (plots/decode.awk)
#   make test-plots   CPU tests of all of this (no GPU needed)
#
# <gpu> is the name nvidia-smi reports, lowercased, punctuation to '-', 'nvidia-' dropped:
# "NVIDIA H100 80GB HBM3" -> h100-80gb-hbm3. PLOT_CSV=path draws/tabulates that CSV instead,
# PLOT_DIR=dir puts the PNGs elsewhere, PEAK=TFLOP/s overrides the peak line of tflops.png,
# HBM=TB/s the HBM peak of decode.png (default: plots/csv.awk's hbm_tbs, by the CSV's GPU name).

BUILD ?= build
BUDGET ?= 60
QUICK ?=
SWEEP_STAGES ?=
SWEEPS ?=
APPEND ?=
REF_GPU ?= h200
README ?= README.md
LESSON_READMES ?= $(if $(filter README.md,$(README)),$(shell grep -l -E -x '<!-- results:stage[0-9]+:begin -->' stage*/README.md 2>/dev/null))
PLOT_CSV ?=
PLOT_DIR ?=
PEAK ?=
HBM ?=
# what bench needs first (the lead's build target); empty it to sweep what is already built
BENCH_DEPS ?= build
QUICK_DIR ?= build/quick/$(or $(GPU_SLUG),no-gpu)
QUICK_ON := $(filter-out 0,$(QUICK))

ifeq ($(origin GPU_NAME),undefined)
GPU_NAME := $(shell n=$$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null) && \
                    printf '%s\n' "$$n" | head -n 1)
endif
GPU_SLUG := $(shell printf '%s' '$(GPU_NAME)' | tr 'A-Z' 'a-z' | \
                    sed -e 's/[^a-z0-9][^a-z0-9]*/-/g' -e 's/^-//' -e 's/-$$//' -e 's/^nvidia-//')
PLOT_SCRIPTS := $(sort $(wildcard plots/*.gp))

# Dense fp16 tensor-core peak (TFLOP/s, fp32 accumulate, no sparsity) by GPU name, for the
# dashed line of tflops.png. $$1: the GPU name as the CSV has it. Unknown GPUs: 0, no line.
define peak_of
g=-$$(printf '%s' "$$1" | tr 'A-Z' 'a-z' | sed -e 's/[^a-z0-9][^a-z0-9]*/-/g')-; \
case "$$g" in \
*-h100-*pcie*) echo 756 ;; \
*-h100-*nvl*) echo 835 ;; \
*-h100-*|*-h200-*|*-gh200-*|*-h800-*) echo 989 ;; \
*-a100-*|*-a800-*) echo 312 ;; \
*-l40s-*) echo 362 ;; \
*-l4-*) echo 121 ;; \
*-t4-*) echo 65 ;; \
*) echo 0 ;; \
esac
endef

# Sets $$csv: PLOT_CSV, else this GPU's results, else the committed reference results (and
# says so); fails if there is none.
define resolve_csv
csv='$(PLOT_CSV)'; \
if [ -z "$$csv" ] && [ -n '$(QUICK_ON)' ] && [ -n '$(GPU_SLUG)' ]; then csv='$(QUICK_DIR)/results.csv'; fi; \
if [ -z "$$csv" ]; then \
    if [ -n '$(GPU_SLUG)' ] && [ -s 'plots/$(GPU_SLUG)/results.csv' ]; then \
        csv='plots/$(GPU_SLUG)/results.csv'; \
    else \
        csv='plots/$(REF_GPU)/results.csv'; \
        if [ -n '$(GPU_SLUG)' ]; then \
            echo "$@: no plots/$(GPU_SLUG)/results.csv yet (make bench makes it); using the committed reference results in $$csv"; \
        else \
            echo "$@: no GPU here; using the committed reference results in $$csv"; \
        fi; \
    fi; \
fi; \
[ -s "$$csv" ] || { echo "$@: $$csv not found or empty (make bench on a GPU writes it)" >&2; exit 1; }
endef

# Installs gnuplot when it is missing and that is possible without asking (root + apt-get);
# bounded in time, for machines without a network.
define ensure_gnuplot
if ! command -v gnuplot >/dev/null 2>&1 && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
    echo "$@: gnuplot not found; installing gnuplot-nox with apt-get"; \
    t=$$(command -v timeout >/dev/null 2>&1 && echo 'timeout 300'); \
    { $$t apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$t apt-get install -y -qq gnuplot-nox; } >/dev/null || \
        echo "$@: apt-get could not install gnuplot-nox" >&2; \
fi
endef

.PHONY: bench plots tables test-plots

# The decode sweep's roof: a copy kernel, for this GPU (NVCC and GENCODE: mk/detect.mk).
$(BUILD)/copy_bw: plots/copy_bw.cu
	@mkdir -p $(@D)
	$(NVCC) -std=c++17 -O3 $(GENCODE) -o $@ $<

# no GPU: say so at once, before building anything
bench: $(if $(GPU_SLUG),$(BENCH_DEPS) $(BUILD)/copy_bw)
	@if [ -z '$(GPU_SLUG)' ]; then \
	    echo "bench: no NVIDIA GPU found (nvidia-smi); without one, make plots and make tables use plots/$(REF_GPU)/" >&2; \
	    exit 1; \
	fi
	plots/sweep.sh '$(BUILD)' $(if $(QUICK_ON),$(QUICK_DIR),plots/$(GPU_SLUG))/results.csv --budget '$(BUDGET)' \
	    $(if $(QUICK_ON),--quick) $(if $(strip $(SWEEP_STAGES)),--stages '$(SWEEP_STAGES)') \
	    $(if $(strip $(SWEEPS)),--sweeps '$(SWEEPS)') $(if $(filter-out 0,$(APPEND)),--append)

plots:
	@$(resolve_csv); \
	out='$(PLOT_DIR)'; [ -n "$$out" ] || out=$$(dirname "$$csv"); \
	mkdir -p "$$out"; \
	sum=$$(cat "$$csv" $(PLOT_SCRIPTS) plots/style.gpi plots/csv.awk plots/series.awk | cksum | tr ' ' -); \
	if [ -z '$(PLOT_DIR)' ] && [ "$$(head -n 1 "$$out/plots.cksum" 2>/dev/null)" = "$$sum" ] && \
	   [ -z '$(PLOTS_FORCE)' ] && for gp in $(PLOT_SCRIPTS); do png=$$(basename $$gp .gp).png; \
	       [ -s "$$out/$$png" ] || grep -q -x -F "no $$png" "$$out/plots.cksum" || exit 1; done; then \
	    echo "plots: $$out/*.png are up to date with $$csv and the plot scripts ($$out/plots.cksum; PLOTS_FORCE=1 redraws)"; \
	    exit 0; \
	fi; \
	$(ensure_gnuplot); \
	if ! command -v gnuplot >/dev/null 2>&1; then \
	    echo "plots: gnuplot not found; install it with: sudo apt-get install -y gnuplot-nox" \
	         "(macOS: brew install gnuplot). Skipping the plots; the CSV and tables are unaffected."; \
	    exit 0; \
	fi; \
	gpu=$$(awk -F, -f plots/csv.awk -f plots/series.awk -v mode=gpu "$$csv"); \
	peak='$(PEAK)'; [ -n "$$peak" ] || peak=$$(set -- "$$gpu"; $(peak_of)); \
	hbm='$(HBM)'; [ -n "$$hbm" ] || hbm=$$(awk -F, -f plots/csv.awk -f plots/series.awk -v mode=hbm "$$csv"); \
	drawn=''; none=''; \
	for gp in $(PLOT_SCRIPTS); do \
	    png=$$(basename $$gp .gp).png; rm -f "$$out/$$png"; \
	    gnuplot -e "csv='$$csv'; outdir='$$out'; gpu='$$gpu'; PEAK=$$peak; HBM=$$hbm; plotsdir='plots'" "$$gp" || exit 1; \
	    if [ -s "$$out/$$png" ]; then drawn="$$drawn $$png"; else none="$$none $$png"; fi; \
	done; \
	[ -n '$(PLOT_DIR)' ] || { echo "$$sum"; for p in $$none; do echo "no $$p"; done; } >"$$out/plots.cksum"; \
	echo "plots:$$drawn from $$csv ($$gpu, peak $$peak TFLOP/s, HBM $$hbm TB/s) in $$out/$${none:+ (nothing to draw:$$none)}"

tables:
	@$(resolve_csv); \
	if [ -n '$(QUICK_ON)' ] && [ -n '$(GPU_SLUG)' ] && [ -z '$(PLOT_CSV)' ]; then \
	    awk -F, -f plots/csv.awk -f plots/table.awk "$$csv"; \
	    echo; awk -F, -f plots/csv.awk -f plots/decode.awk "$$csv"; \
	    echo "tables: the quick sweep's tables from $$csv (the READMEs keep the full run's)"; \
	elif [ -z '$(PLOT_CSV)' ] && [ "$$csv" != 'plots/$(REF_GPU)/results.csv' ]; then \
	    plots/gpu_tables.sh "$$csv" "$$(dirname "$$csv")/TABLES.md" $(LESSON_READMES); \
	    echo "tables: the lessons keep the reference GPU's tables (plots/$(REF_GPU)/results.csv);" \
	         "this GPU's tables: $$(dirname "$$csv")/TABLES.md"; \
	else \
	    plots/update_readme.sh "$$csv" '$(README)' $(LESSON_READMES); \
	    if grep -q '^<!-- results:bench-calls:begin -->$$' '$(README)' && command -v python3 >/dev/null; then \
	        python3 python/bench_calls.py --readme '$(README)'; \
	    fi; \
	    if [ -z '$(PLOT_CSV)' ] && [ -n '$(LESSON_READMES)' ] && command -v python3 >/dev/null; then \
	        python3 plots/answers.py --gpu '$(REF_GPU)' $(LESSON_READMES); \
	    fi; \
	fi

test-plots:
	env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL plots/tests/run.sh
