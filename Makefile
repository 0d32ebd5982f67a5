# A staged FlashAttention course. `make help` lists the targets.
#
#   make                 build, sweep every stage, draw the plots, the tables (another GPU: plots/<gpu>/TABLES.md)
#   make QUICK=1         build, a 2-minute sweep (every stage, a few shapes), plots in build/quick/
#   make test            CPU tests + fat build + spill check + format check (+ self-tests on a GPU)
#   make check           every stage's --self-test on this GPU (SMEM_LIMIT=65536 for the T4 path)
#   make lab STAGE=n     write labs/<stage>/: the stage's code with the lesson cut into holes
#   make grade STAGE=n   build the lab with the course's host program, self-test it: a report card
#   make build ARCH=75   machine code for one target; ARCH=compute_75 for PTX only; BUILD=dir;
#                        several at once: ARCH="75 89"
# Builds run in parallel on every core (make -jN of your own overrides it).

CUDA_HOME ?= /usr/local/cuda
NVCC      ?= $(CUDA_HOME)/bin/nvcc
CC        ?= gcc
BUILD     ?= build
STAGES    := $(sort $(patsubst %/attention.cu,%,$(wildcard stage[0-9]*/attention.cu)))
# The fat build's targets: T4, A100, RTX 30/A10, L4/RTX 40, H100/H200, B200, RTX 50 (PTX for the
# newest). A toolkit that lacks a target (sm_100 and sm_120 need CUDA 12.8) builds the others
# and says which it left out. common/tests/check_spills.sh checks every target a build made.
FAT_ARCHS_WANTED := 75 80 86 89 90 100 120
NPROC     := $(shell nproc 2>/dev/null || echo 2)
# the fat build of every stage, 2 jobs at a time on 2 cores (measured: see the README)
FAT_BUILD_MINUTES := 5-8
empty :=
space := $(empty) $(empty)
ifeq ($(MAKELEVEL)$(filter -j%,$(MAKEFLAGS)),0)
MAKEFLAGS += -j$(NPROC)
endif

comma := ,
# The GPU present, by name (empty: none). GPU_NAME= on the command line pretends there is none.
ifeq ($(origin GPU_NAME),undefined)
GPU_NAME := $(shell n=$$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null) && \
                    printf '%s\n' "$$n" | head -n 1)
endif
# ARCH: from the GPU present, else the fat build (every target above plus PTX for the newest).
ifeq ($(origin ARCH),undefined)
ARCH := $(shell nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n1 | tr -d '.' | tr -cd '0-9')
endif
ifeq ($(strip $(ARCH)),)
FAT_NVCC_CODES := $(filter sm_%,$(shell $(NVCC) --list-gpu-code 2>/dev/null))
FAT_ARCHS := $(strip $(if $(FAT_NVCC_CODES),$(foreach a,$(FAT_ARCHS_WANTED),$(if $(filter sm_$(a),$(FAT_NVCC_CODES)),$(a))),$(FAT_ARCHS_WANTED)))
FAT_LEFT_OUT := $(filter-out $(FAT_ARCHS),$(FAT_ARCHS_WANTED))
GENCODE := $(foreach a,$(FAT_ARCHS),-gencode arch=compute_$(a),code=sm_$(a)) \
           -gencode arch=compute_$(lastword $(FAT_ARCHS)),code=compute_$(lastword $(FAT_ARCHS))
else
GENCODE := $(foreach a,$(ARCH),$(if $(filter compute_%,$(a)),-gencode arch=$(a)$(comma)code=$(a),\
             -gencode arch=compute_$(patsubst sm_%,%,$(a))$(comma)code=sm_$(patsubst sm_%,%,$(a))))
endif

# What a stage needs beyond the generic rules below it declares in its folder's stage.mk (read
# here, so adding a stage takes its folder and the README's ladder row, nothing else):
#   <stage>_GENCODE  its targets, when they are not the build's (stage 6: sm_90a for sm_90)
#   <stage>_LIBS     libraries its program and its library link (stage 0: cuBLAS)
#   <stage>_FORWARD  the stage whose forward pass it links (stage 7: stage 5's): that stage's
#                    attention.cu compiled a second time as obj/stage<n>_forward.o, its descriptor
#                    renamed attn_forward_stage (hidden: the library exports one descriptor)
#   <stage>_DIFF_BASE  what `make diff` shows it against, when not the stage before it
include $(wildcard stage[0-9]*/stage.mk)
# the stages with a backward pass (a linked forward), named by the program to a forward-only one
BACKWARD_STAGES := $(strip $(foreach s,$(STAGES),$(if $($(s)_FORWARD),$(s))))
# $(call forward_obj,STAGE): the object of STAGE's linked forward pass
forward_obj = $(BUILD)/obj/$(firstword $(subst _, ,$(1)))_forward.o

NVCCFLAGS := -std=c++17 -O3 -lineinfo -Xptxas -v -Werror all-warnings -Icommon \
             -Xcompiler -Wall,-Wextra,-Werror
CFLAGS    := -std=c11 -O2 -Wall -Wextra -Werror -fopenmp -I$(CUDA_HOME)/include
LDLIBS    := -Xcompiler -fopenmp -lm -ldl

COMMON_SRC := common/main.c common/device_info.c common/reference.c common/reference_bwd.c common/npy.c
COMMON_OBJ := $(patsubst common/%.c,$(BUILD)/obj/%.o,$(COMMON_SRC))
HEADERS    := common/attention.h common/common.h common/csv_header.h common/device_info.h

.DEFAULT_GOAL := all
.PHONY: all build objects test check sanitize profile diff help clean format format-check lab grade

.DELETE_ON_ERROR:
.SECONDARY:

STAGE_OBJ := $(patsubst %,$(BUILD)/obj/%.o,$(STAGES))

# make QUICK=1 with no GPU has nothing to sweep: say first that it is a plain make.
ifeq ($(strip $(GPU_NAME))$(MAKELEVEL),0)
ifneq ($(filter-out 0,$(QUICK)),)
ifneq ($(filter all,$(or $(MAKECMDGOALS),all)),)
$(info make QUICK=1: no NVIDIA GPU here, so no quick sweep: this is a plain make (build every stage, then plots and tables from the committed results))
endif
endif
endif

# The goals that compile CUDA, without a CUDA compiler: one line saying what to install and where
# CUDA_HOME points, instead of the shell's "nvcc: not found" in the middle of a build.
ifneq ($(filter all build lib objects,$(or $(MAKECMDGOALS),all)),)
ifeq ($(shell command -v '$(NVCC)' 2>/dev/null),)
$(error no CUDA compiler: $(NVCC) not found (CUDA_HOME=$(CUDA_HOME)); install the CUDA toolkit, 12.4 or newer (NVIDIA's cuda-toolkit package), or point CUDA_HOME at one: make $(or $(firstword $(MAKECMDGOALS)),all) CUDA_HOME=/usr/local/cuda-12.8)
endif
endif

# Before a fat build (no GPU found, nothing built yet): say what is coming and for how long.
ifeq ($(strip $(ARCH))$(MAKELEVEL),0)
ifneq ($(filter all build test lib,$(or $(MAKECMDGOALS),all)),)
ifneq ($(words $(wildcard $(STAGE_OBJ))),$(words $(STAGE_OBJ)))
$(info make: no NVIDIA GPU found (nvidia-smi): building every stage for sm_$(subst $(space), sm_,$(FAT_ARCHS)) + PTX (the fat build, $(words $(STAGES)) stages, $(NPROC) jobs at a time); about $(FAT_BUILD_MINUTES) minutes on 2 cores; the stages print a line each as they start)
endif
endif
endif
# A fat build with a toolkit that lacks some of its targets: say which are left out.
ifneq ($(FAT_LEFT_OUT),)
ifeq ($(MAKELEVEL),0)
ifneq ($(filter all build test objects lib,$(or $(MAKECMDGOALS),all)),)
$(info make: $(NVCC) cannot compile for sm_$(subst $(space), sm_,$(FAT_LEFT_OUT)): the fat build leaves $(if $(word 2,$(FAT_LEFT_OUT)),them,it) out (sm_100 and sm_120 need CUDA 12.8 or newer))
endif
endif
endif

# the last stages first: their objects take longest to compile, so the jobs end together
reverse = $(if $(1),$(call reverse,$(wordlist 2,$(words $(1)),$(1))) $(firstword $(1)))
build: $(addprefix $(BUILD)/,$(call reverse,$(STAGES))) $(BUILD)/test_common

# The stages' device code only (no link): what CI compiles with a second toolkit.
objects: $(STAGE_OBJ)

# check, sanitize and profile need a GPU (and a tool): without one, one line naming what is
# missing and exit 2, before anything is built. In this order: profile's stage number, the GPU,
# the tool. A tool not on PATH is looked for in the toolkit (CUDA_HOME) before it is called missing.
STAGE_DIR = $(firstword $(wildcard stage$(STAGE)_*))
STAGE_NUMBERS := $(patsubst stage%,%,$(foreach s,$(STAGES),$(firstword $(subst _, ,$(s)))))
SANITIZER := $(or $(shell command -v compute-sanitizer 2>/dev/null),$(wildcard $(CUDA_HOME)/bin/compute-sanitizer),$(wildcard $(CUDA_HOME)/compute-sanitizer/compute-sanitizer))
NCU := $(or $(shell command -v ncu 2>/dev/null),$(wildcard $(CUDA_HOME)/bin/ncu),$(lastword $(sort $(wildcard $(CUDA_HOME)/nsight-compute*/ncu /opt/nvidia/nsight-compute/*/ncu))))
# $(call tool_missing,GOAL,TOOL,PACKAGE): why TOOL is not here, and how to get it
CUDA_PKG_VERSION = $(shell $(CUDA_HOME)/bin/nvcc --version 2>/dev/null | sed -n 's/.*release \([0-9]*\)\.\([0-9]*\).*/\1-\2/p')
tool_missing = $(1): $(2) not found: it is not on PATH, and $(if $(wildcard $(CUDA_HOME)/bin/nvcc),the CUDA toolkit in $(CUDA_HOME) does not include it (install the toolkit's $(3) package$(if $(CUDA_PKG_VERSION),$(comma) e.g. apt-get install $(3)-$(CUDA_PKG_VERSION)))$(comma) or set CUDA_HOME to a toolkit that has it,there is no CUDA toolkit in $(CUDA_HOME) (CUDA_HOME=dir names one))
ifneq ($(filter check sanitize profile,$(MAKECMDGOALS)),)
ifneq ($(filter profile,$(MAKECMDGOALS)),)
ifeq ($(strip $(STAGE)),)
$(error profile: which stage? make profile STAGE=n [VARIANT=name] [PROFILE_ARGS=...], n one of $(STAGE_NUMBERS))
endif
ifneq ($(words $(STAGE)),1)
$(error profile: STAGE=$(STAGE) is not one stage number (one of $(STAGE_NUMBERS)))
else ifeq ($(filter $(STAGE),$(STAGE_NUMBERS)),)
$(error profile: STAGE=$(STAGE) is not a stage number (one of $(STAGE_NUMBERS)))
endif
endif
ifeq ($(strip $(GPU_NAME)),)
$(error $(firstword $(filter check sanitize profile,$(MAKECMDGOALS))): no NVIDIA GPU here (nvidia-smi finds none), and it runs the kernels on one; make test runs the tests that need none)
endif
ifneq ($(filter sanitize,$(MAKECMDGOALS)),)
ifeq ($(SANITIZER),)
$(error $(call tool_missing,sanitize,compute-sanitizer,cuda-sanitizer))
endif
endif
ifneq ($(filter profile,$(MAKECMDGOALS)),)
ifeq ($(NCU),)
$(error $(call tool_missing,profile,ncu (Nsight Compute),cuda-nsight-compute))
endif
endif
endif

# Objects remember the flags they were built with: a build folder reused with another ARCH or
# toolkit is rebuilt, not mixed.
BUILD_FLAGS := $(NVCC) $(NVCCFLAGS) $(GENCODE)
ifeq ($(filter clean help diff format format-check lab grade,$(MAKECMDGOALS)),)
# An ARCH given by hand is checked against the targets this nvcc knows before flags.txt is
# touched: a typo (ARCH=99) fails at once and leaves the build folder as it was, so the next
# plain make rebuilds nothing. (sm_90a and the like: the base target must be known.)
ifneq ($(filter command line environment,$(origin ARCH)),)
ifneq ($(strip $(ARCH)),)
NVCC_TARGETS := $(shell $(NVCC) --list-gpu-code 2>/dev/null; $(NVCC) --list-gpu-arch 2>/dev/null)
ARCH_TARGETS := $(foreach a,$(ARCH),$(if $(filter compute_%,$(a)),$(a),sm_$(patsubst sm_%,%,$(a))))
ARCH_BAD := $(strip $(foreach t,$(ARCH_TARGETS),$(if $(filter $(patsubst %a,%,$(patsubst %f,%,$(t))),$(NVCC_TARGETS)),,$(t))))
ifneq ($(and $(NVCC_TARGETS),$(ARCH_BAD)),)
$(error ARCH=$(strip $(ARCH)): $(NVCC) has no target $(ARCH_BAD); it knows $(filter sm_%,$(NVCC_TARGETS)) (ARCH=75 or sm_75: machine code; compute_75: PTX only); $(BUILD)/ is left as it was)
endif
endif
endif
$(shell mkdir -p $(BUILD) && { [ "$$(cat $(BUILD)/flags.txt 2>/dev/null)" = '$(BUILD_FLAGS)' ] || echo '$(BUILD_FLAGS)' > $(BUILD)/flags.txt; })
endif

$(BUILD)/obj/%.o: common/%.c $(HEADERS)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -c $< -o $@
$(BUILD)/obj/main.o: CFLAGS += -DATTN_BACKWARD_STAGES='"$(or $(BACKWARD_STAGES),no stage)"'
$(BUILD)/obj/main.o: $(wildcard stage[0-9]*/stage.mk)

# The -Xptxas -v report (registers, shared memory, stack frame, spills) is kept beside the object.
$(BUILD)/obj/%.o: %/attention.cu common/attention.h $(BUILD)/flags.txt
	@mkdir -p $(@D) $(BUILD)/ptxas
	@echo "$(NVCC) -c $< [$(if $(ARCH),ARCH=$(ARCH),fat build)] -> $@"
	@$(NVCC) $(NVCCFLAGS) -Xcompiler -fPIC $(or $($*_GENCODE),$(GENCODE)) -c $< -o $@ 2> $(BUILD)/ptxas/$*.txt || { cat $(BUILD)/ptxas/$*.txt; exit 1; }

$(BUILD)/stage%: $(BUILD)/obj/stage%.o $(COMMON_OBJ)
	$(NVCC) -o $@ $^ $(LDLIBS) $($(notdir $@)_LIBS)

# A stage's attention.cu includes the .cuh files of its folder and the device primitives that
# stages share (common/device/: PTX wrappers, split-KV's plan and merge, the tensor-map encoder).
DEVICE_HEADERS := $(wildcard common/device/*.cuh)
$(foreach s,$(STAGES),$(eval $(BUILD)/obj/$(s).o: $(wildcard $(s)/*.cuh) $(DEVICE_HEADERS)))

# A stage that links another stage's forward pass (<stage>_FORWARD): that stage's own object with
# its descriptor renamed attn_forward_stage (objcopy: the same machine code, not compiled twice),
# linked into the program and the library.
OBJCOPY ?= objcopy
define forward_rules
$(call forward_obj,$(1)): $(BUILD)/obj/$($(1)_FORWARD).o
	@mkdir -p $$(@D)
	$(OBJCOPY) --redefine-sym attn_this_stage=attn_forward_stage $$< $$@
$(BUILD)/$(1): $(call forward_obj,$(1))
$(BUILD)/lib/lib$(1).so: $(call forward_obj,$(1))
endef
$(foreach s,$(BACKWARD_STAGES),$(eval $(call forward_rules,$(s))))

$(BUILD)/test_common: common/tests/test_common.c $(BUILD)/obj/reference.o $(BUILD)/obj/npy.o
	$(CC) $(CFLAGS) -Icommon -o $@ $^ -lm

# ---- tests ----
# The fat build: where there is no GPU that is what `make` built, in $(BUILD); on a GPU machine
# `make` builds for that GPU only and the fat build goes to $(BUILD)/fat.
TEST_BUILD ?= $(if $(strip $(ARCH)),$(BUILD)/fat,$(BUILD))
test:
	@$(MAKE) --no-print-directory build ARCH= BUILD=$(TEST_BUILD)
	MAKEFLAGS= bash common/tests/run.sh $(TEST_BUILD) # the tests' own makes: no jobserver, no warning

SMEM_LIMIT ?=
# $(call attn_exit,NAME): the programs' exit code NAME, from the attn_exit enum of attention.h
attn_exit = $(shell sed -n 's/^ *ATTN_EXIT_$(1) *= *\([0-9][0-9]*\).*/\1/p' common/attention.h)
check:
	@$(MAKE) --no-print-directory build
	@fail=0; for s in $(STAGES); do \
	  $(BUILD)/$$s --self-test $(if $(SMEM_LIMIT),--smem-limit $(SMEM_LIMIT)); rc=$$?; \
	  [ $$rc -eq $(call attn_exit,PASS) ] || [ $$rc -eq $(call attn_exit,UNSUPPORTED) ] || fail=1; \
	done; exit $$fail

SANITIZE_TOOLS ?= memcheck racecheck synccheck
sanitize:
	@$(MAKE) --no-print-directory build
	SANITIZER='$(SANITIZER)' bash common/tests/sanitize.sh $(BUILD) "$(SANITIZE_TOOLS)" $(STAGES)

# ---- one lesson at a time ----
# what a stage's diff is taken against: the stage before it, or its stage.mk's <stage>_DIFF_BASE
# (stage 7, the backward pass: stage 5, whose forward it reuses)
PREV_DIR  = $(or $($(STAGE_DIR)_DIFF_BASE),$(firstword $(wildcard stage$(shell expr $(STAGE) - 1 2>/dev/null)_*)))
# A stage's code as one text in reading order: attention.cu, then the .cuh files of its folder in
# the order attention.cu includes them (those it does not name last), each after a line naming it;
# the labs' marker lines (// LAB HOLE, TODO, STUB: comments) left out, so the diff is the lesson's.
stage_code = for f in $(1)/attention.cu $$(sed -n 's/^\#include "\([^/"]*\.cuh\)".*/\1/p' $(1)/attention.cu | sed 's|^|$(1)/|') \
               $$(ls $(1)/*.cuh 2>/dev/null | grep -v -x -F "$$(sed -n 's/^\#include "\([^/"]*\.cuh\)".*/$(1)\/\1/p' $(1)/attention.cu)"); do \
               [ -f "$$f" ] && { echo "// ==== $$f"; grep -v -E '^[[:space:]]*// LAB (HOLE [0-9]+ (BEGIN|END)|TODO:|STUB:)' "$$f"; }; done
# git diff --no-index exits 1 when the files differ, which they always do: that is no error.
diff:
	@test -n "$(STAGE)" -a -n "$(STAGE_DIR)" -a -n "$(PREV_DIR)" || { echo "usage: make diff STAGE=n (n = 1..$(words $(wordlist 2,99,$(STAGES))))"; exit 2; }
	@tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && mkdir -p "$$tmp/a" "$$tmp/b" && \
	{ $(call stage_code,$(PREV_DIR)); } > "$$tmp/a/$(PREV_DIR)" && { $(call stage_code,$(STAGE_DIR)); } > "$$tmp/b/$(STAGE_DIR)" && \
	cd "$$tmp" && { git --no-pager diff --no-index --stat a/$(PREV_DIR) b/$(STAGE_DIR); [ $$? -le 1 ]; } && \
	{ git --no-pager diff --no-index a/$(PREV_DIR) b/$(STAGE_DIR); [ $$? -le 1 ]; }

# ---- labs (common/labs.py says how the holes are marked in a stage's source) ----
# make lab STAGE=n writes labs/<stage>/ (ignored by git) and never overwrites a learner's edits
# (RESTART=1 starts over, keeping theirs as a .bak). make grade STAGE=n builds the learner's copy
# with this Makefile, as the stage's own program is built, and prints a report card; ARCH= and
# SMEM_LIMIT= as for make check (ARCH=compute_75 SMEM_LIMIT=65536: the T4 path), GPU_NAME=
# pretends there is no GPU (then it only compiles, and says what it cannot run); QUICK=1 runs the
# quick cases only (no self-test, no timing); LABS=dir keeps the labs somewhere else than labs/.
LAB_ARGS = $(STAGE) $(if $(filter command line,$(origin ARCH)),--arch '$(ARCH)') \
           $(if $(SMEM_LIMIT),--smem-limit '$(SMEM_LIMIT)') \
           $(if $(filter command line environment,$(origin GPU_NAME)),--gpu-name '$(GPU_NAME)') \
           $(if $(filter-out 0,$(QUICK)),--quick)
lab grade:
	@test -n "$(STAGE)" || { echo "usage: make $@ STAGE=n (n = 1..$(words $(wordlist 2,99,$(STAGES))))"; exit 2; }
	@python3 common/labs.py $(if $(LABS),--labs '$(LABS)') $@ $(if $(filter lab,$@),$(STAGE) $(if $(filter-out 0,$(RESTART)),--restart),$(LAB_ARGS))

# ncu sections per lesson; PROFILE_ARGS sets the shape.
PROFILE_ARGS ?= --seq 4096 --dim 128 --heads 16 --batch 4 --check 0 --bench
PROFILE_SECTIONS_0 := SpeedOfLight MemoryWorkloadAnalysis
PROFILE_SECTIONS_1 := SpeedOfLight MemoryWorkloadAnalysis_Tables
PROFILE_SECTIONS_2 := SpeedOfLight MemoryWorkloadAnalysis_Tables
PROFILE_SECTIONS_3 := SpeedOfLight WarpStateStats
PROFILE_SECTIONS_4 := SpeedOfLight ComputeWorkloadAnalysis
PROFILE_SECTIONS_5 := SpeedOfLight ComputeWorkloadAnalysis Occupancy WarpStateStats
PROFILE_METRICS := l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.pct_of_peak_sustained_active
profile:
	@$(MAKE) --no-print-directory build
	'$(NCU)' --clock-control none --launch-skip 1 --launch-count 3 \
	  $(foreach s,$(PROFILE_SECTIONS_$(STAGE)),--section $(s)) --metrics $(PROFILE_METRICS) \
	  $(BUILD)/$(STAGE_DIR) $(PROFILE_ARGS) $(if $(VARIANT),--variant $(VARIANT))

# The formatter is pinned (formatters of other versions disagree): clang-format from pip, kept
# in the user's cache (FLASHCOURSE_CACHE), outside the build folder: make clean keeps it, and
# every checkout shares it. Without it and without a package index to fetch it from (offline),
# format-check says in one line that it is skipped and why, and passes; FORMAT_CHECK_REQUIRED=1
# (CI) makes that a failure.
CLANG_FORMAT_VERSION := 19.1.7
FLASHCOURSE_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/flashcourse
CLANG_FORMAT_DIR = $(FLASHCOURSE_CACHE)/clang-format-$(CLANG_FORMAT_VERSION)
CLANG_FORMAT = $(CLANG_FORMAT_DIR)/clang_format/data/bin/clang-format
FORMAT_CHECK_REQUIRED ?=
FORMAT_FILES = $(wildcard common/*.c common/*.h common/tests/*.c common/device/*.cuh stage*/attention.cu stage*/*.cuh \
  python/flashcourse/*.cpp)
# Shell: installs the pinned clang-format unless it is there; sets $$why (empty: installed) when
# it cannot be had here; exits 1 when pip fails with a package index in reach.
define ensure_clang_format
why=; \
if [ ! -x '$(CLANG_FORMAT)' ]; then \
    if ! command -v python3 >/dev/null 2>&1 || ! python3 -m pip --version >/dev/null 2>&1; then \
        why="python3 with pip is not installed here"; \
    else \
        mkdir -p '$(FLASHCOURSE_CACHE)'; tmp='$(CLANG_FORMAT_DIR)'.tmp$$$$; rm -rf "$$tmp"; \
        if python3 -m pip install -q --disable-pip-version-check --no-warn-script-location \
               --retries 1 --timeout 20 --target "$$tmp" clang-format==$(CLANG_FORMAT_VERSION) \
               >'$(CLANG_FORMAT_DIR).log' 2>&1 && [ -x "$$tmp/clang_format/data/bin/clang-format" ]; then \
            mv -T "$$tmp" '$(CLANG_FORMAT_DIR)' 2>/dev/null || rm -rf "$$tmp"; \
            echo "$@: installed clang-format $(CLANG_FORMAT_VERSION) with pip into $(CLANG_FORMAT_DIR)"; \
        else \
            rm -rf "$$tmp"; \
            net=$$(grep -o -E 'Connection refused|Name or service not known|Temporary failure in name resolution|No address associated with hostname|Network is unreachable|timed out|ProxyError' '$(CLANG_FORMAT_DIR).log' | head -n 1); \
            [ -n "$$net" ] || net=$$(grep -o -E 'NewConnectionError|Failed to establish a new connection|Max retries exceeded' '$(CLANG_FORMAT_DIR).log' | head -n 1); \
            if [ -n "$$net" ]; then \
                why="no package index is reachable to install it (pip: $$net)"; \
            else \
                echo "$@: pip could not install clang-format==$(CLANG_FORMAT_VERSION) (see $(CLANG_FORMAT_DIR).log)" >&2; exit 1; \
            fi; \
        fi; \
    fi; \
fi
endef

format:
	@$(ensure_clang_format); \
	[ -z "$$why" ] || { echo "format: the pinned clang-format $(CLANG_FORMAT_VERSION) is not installed, and $$why" >&2; exit 1; }; \
	echo "$(CLANG_FORMAT) -i $(FORMAT_FILES)"; $(CLANG_FORMAT) -i $(FORMAT_FILES)

format-check:
	@$(ensure_clang_format); \
	if [ -n "$$why" ]; then \
	    if [ -n '$(FORMAT_CHECK_REQUIRED)' ]; then \
	        echo "format-check: cannot run (FORMAT_CHECK_REQUIRED is set): the pinned clang-format $(CLANG_FORMAT_VERSION) is not installed, and $$why"; \
	        echo "format-check: 0 passed, 1 failed"; exit 1; \
	    fi; \
	    echo "SKIP  format-check: the pinned clang-format $(CLANG_FORMAT_VERSION) is not installed, and $$why; formatting not checked here (CI checks it)"; \
	    exit 0; \
	fi; \
	bad=""; for f in $(FORMAT_FILES); do $(CLANG_FORMAT) $$f | cmp -s - $$f || bad="$$bad $$f"; done; \
	if [ -n "$$bad" ]; then echo "format-check: not formatted (make format fixes it):$$bad"; echo "format-check: 0 passed, 1 failed"; exit 1; fi; \
	echo "format-check: $(words $(FORMAT_FILES)) files formatted as clang-format $(CLANG_FORMAT_VERSION) does: 1 passed, 0 failed"

clean:
	rm -rf $(BUILD)

help:
	@echo "make               build, sweep every stage (long and fa2 shapes), plots, tables (the READMEs: the reference GPU's; yours: plots/<gpu>/TABLES.md)"
	@echo "make build         build every stage into $(BUILD)/ (ARCH=75|sm_75|compute_75, BUILD=dir)"
	@echo "make QUICK=1       build, a quick sweep (every stage, a few shapes: ~2 min on an H200), plots in build/quick/"
	@echo "make test          CPU tests, fat build, no-spill check, format check; self-tests too on a GPU"
	@echo "make format        format the C/CUDA sources with the pinned clang-format $(CLANG_FORMAT_VERSION) (format-check: only check)"
	@echo "make check         every stage's --self-test on this GPU (SMEM_LIMIT=65536: T4 path)"
	@echo "make sanitize      compute-sanitizer memcheck, racecheck, synccheck on small shapes"
	@echo "make bench         the sweep only (BUDGET=60 seconds per launch; QUICK=1: long N $(shell . plots/shapes.conf && echo $$QUICK_LONG_N | tr ' ' ,), fa2 N $(shell . plots/shapes.conf && echo $$QUICK_FA2_N | tr ' ' ,))"
	@echo "make plots         redraw the PNGs from the CSV"
	@echo "make tables        rewrite the README's results tables and each lesson's measured section from the reference CSV (another GPU: plots/<gpu>/TABLES.md)"
	@echo "make test-plots    CPU tests of the sweep, plots and tables only"
	@echo "make diff STAGE=n  what stage n adds over stage n-1"
	@echo "make lab STAGE=n   write labs/<stage>/: the stage's kernel with the lesson cut into holes (stages 1-7)"
	@echo "make grade STAGE=n build your lab, self-test it, time it: a report card (no GPU: it only compiles; QUICK=1: no self-test)"
	@echo "make profile STAGE=n [VARIANT=name]  ncu with the sections for that lesson"
	@echo "make lib           every stage also as build/lib/lib<stage>.so, for python/flashcourse (see README: From Python)"
	@echo "stages: $(STAGES)"

include plots/plots.mk
include python/lib.mk

# The main job. On a machine with a GPU: sweep, then plots from this GPU's CSV and its tables in
# plots/<gpu>/TABLES.md (the READMEs keep the reference GPU's; a FAIL row still draws the plots,
# then fails the job). Without one: from the committed reference run.
all: build
	@status=0; \
	if [ -n '$(GPU_SLUG)' ]; then \
	    $(MAKE) --no-print-directory bench BENCH_DEPS= || status=$$?; \
	else \
	    echo "make: no NVIDIA GPU here: built every stage; plots and tables come from the committed results in plots/$(REF_GPU)/ (nothing to redraw unless they changed)"; \
	fi; \
	$(MAKE) --no-print-directory plots tables || status=$$?; \
	if [ -n '$(GPU_SLUG)' ] && [ '$(GPU_SLUG)' != '$(REF_GPU)' ] && [ -s 'plots/$(GPU_SLUG)/TABLES.md' ]; then \
	    echo "make: this GPU's tables: plots/$(GPU_SLUG)/TABLES.md (the lessons show the reference GPU's, plots/$(REF_GPU)/)"; \
	fi; \
	exit $$status
