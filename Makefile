# A staged FlashAttention course. `make help` lists the targets.
#
#   make                 build, sweep every stage, draw the plots, rewrite the README tables
#   make test            CPU tests + fat build + spill check (+ every stage's self-test on a GPU)
#   make check           every stage's --self-test on this GPU (SMEM_LIMIT=65536 for the T4 path)
#   make build ARCH=75   machine code for one target; ARCH=compute_75 for PTX only; BUILD=dir

CUDA_HOME ?= /usr/local/cuda
NVCC      ?= $(CUDA_HOME)/bin/nvcc
CC        ?= gcc
BUILD     ?= build
STAGES    := $(sort $(patsubst %/attention.cu,%,$(wildcard stage[0-9]*/attention.cu)))
FAT_ARCHS := 75 80 86 89 90

# ARCH: from the GPU present, else the fat build (every target above plus PTX for the newest).
ifeq ($(origin ARCH),undefined)
ARCH := $(shell nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n1 | tr -d '.' | tr -cd '0-9')
endif
ifeq ($(strip $(ARCH)),)
GENCODE := $(foreach a,$(FAT_ARCHS),-gencode arch=compute_$(a),code=sm_$(a)) \
           -gencode arch=compute_$(lastword $(FAT_ARCHS)),code=compute_$(lastword $(FAT_ARCHS))
else ifneq ($(filter compute_%,$(ARCH)),)
GENCODE := -gencode arch=$(ARCH),code=$(ARCH)
else
GENCODE := -gencode arch=compute_$(patsubst sm_%,%,$(ARCH)),code=sm_$(patsubst sm_%,%,$(ARCH))
endif

# Stage 6's kernels use wgmma and setmaxnreg, which exist only in sm_90a code: wherever a build
# has sm_90 (native on a Hopper GPU, or in the fat build), stage 6 gets sm_90a instead. On every
# other target it builds host code and its unsupported() says why.
comma := ,
stage6_hopper_GENCODE = $(patsubst arch=compute_90$(comma)code=%,arch=compute_90a$(comma)code=%a,$(GENCODE))

NVCCFLAGS := -std=c++17 -O3 -lineinfo -Xptxas -v -Werror all-warnings -Icommon \
             -Xcompiler -Wall,-Wextra,-Werror
CFLAGS    := -std=c11 -O2 -Wall -Wextra -Werror -fopenmp -I$(CUDA_HOME)/include
LDLIBS    := -Xcompiler -fopenmp -lm
stage0_naive_LIBS := -lcublas

COMMON_SRC := common/main.c common/reference.c common/npy.c
COMMON_OBJ := $(patsubst common/%.c,$(BUILD)/obj/%.o,$(COMMON_SRC))
HEADERS    := common/attention.h common/common.h

.DEFAULT_GOAL := all
.PHONY: all build test check sanitize profile diff help clean format
.DELETE_ON_ERROR:
.SECONDARY:

build: $(addprefix $(BUILD)/,$(STAGES)) $(BUILD)/test_common

$(BUILD)/obj/%.o: common/%.c $(HEADERS)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -c $< -o $@

# The -Xptxas -v report (registers, shared memory, stack frame, spills) is kept beside the object.
$(BUILD)/obj/%.o: %/attention.cu common/attention.h
	@mkdir -p $(@D) $(BUILD)/ptxas
	@echo "$(NVCC) -c $< [$(if $(ARCH),ARCH=$(ARCH),fat build)] -> $@"
	@$(NVCC) $(NVCCFLAGS) -Xcompiler -fPIC $(or $($*_GENCODE),$(GENCODE)) -c $< -o $@ 2> $(BUILD)/ptxas/$*.txt || { cat $(BUILD)/ptxas/$*.txt; exit 1; }

$(BUILD)/stage%: $(BUILD)/obj/stage%.o $(COMMON_OBJ)
	$(NVCC) -o $@ $^ $(LDLIBS) $($(notdir $@)_LIBS)

$(BUILD)/test_common: common/tests/test_common.c $(BUILD)/obj/reference.o $(BUILD)/obj/npy.o
	$(CC) $(CFLAGS) -Icommon -o $@ $^ -lm

# ---- tests ----
TEST_BUILD ?= $(BUILD)/fat
test:
	$(MAKE) --no-print-directory -j$(shell nproc) build ARCH= BUILD=$(TEST_BUILD)
	bash common/tests/run.sh $(TEST_BUILD)

SMEM_LIMIT ?=
check: build
	@fail=0; for s in $(STAGES); do \
	  $(BUILD)/$$s --self-test $(if $(SMEM_LIMIT),--smem-limit $(SMEM_LIMIT)) || fail=1; \
	done; exit $$fail

SANITIZE_TOOLS ?= memcheck racecheck synccheck
sanitize: build
	bash common/tests/sanitize.sh $(BUILD) "$(SANITIZE_TOOLS)" $(STAGES)

# ---- one lesson at a time ----
STAGE_DIR = $(firstword $(wildcard stage$(STAGE)_*))
PREV_DIR  = $(firstword $(wildcard stage$(shell expr $(STAGE) - 1 2>/dev/null)_*))
diff:
	@test -n "$(STAGE)" -a -n "$(STAGE_DIR)" -a -n "$(PREV_DIR)" || { echo "usage: make diff STAGE=n (n = 1..5)"; exit 2; }
	-git diff --no-index --stat $(PREV_DIR)/attention.cu $(STAGE_DIR)/attention.cu
	-git diff --no-index $(PREV_DIR)/attention.cu $(STAGE_DIR)/attention.cu

# ncu sections per lesson; PROFILE_ARGS sets the shape.
PROFILE_ARGS ?= --seq 4096 --dim 128 --heads 16 --batch 4 --check 0 --bench
PROFILE_SECTIONS_0 := SpeedOfLight MemoryWorkloadAnalysis
PROFILE_SECTIONS_1 := SpeedOfLight MemoryWorkloadAnalysis_Tables
PROFILE_SECTIONS_2 := SpeedOfLight MemoryWorkloadAnalysis_Tables
PROFILE_SECTIONS_3 := SpeedOfLight WarpStateStats
PROFILE_SECTIONS_4 := SpeedOfLight ComputeWorkloadAnalysis
PROFILE_SECTIONS_5 := SpeedOfLight ComputeWorkloadAnalysis Occupancy WarpStateStats
PROFILE_METRICS := l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.pct_of_peak_sustained_active
profile: build
	@test -n "$(STAGE_DIR)" || { echo "usage: make profile STAGE=n [VARIANT=name] [PROFILE_ARGS=...]"; exit 2; }
	ncu --clock-control none --launch-skip 1 --launch-count 3 \
	  $(foreach s,$(PROFILE_SECTIONS_$(STAGE)),--section $(s)) --metrics $(PROFILE_METRICS) \
	  $(BUILD)/$(STAGE_DIR) $(PROFILE_ARGS) $(if $(VARIANT),--variant $(VARIANT))

format:
	clang-format -i common/*.c common/*.h common/tests/*.c stage*/attention.cu

clean:
	rm -rf $(BUILD)

help:
	@echo "make               build, sweep every stage (long and fa2 shapes), plots, README tables"
	@echo "make build         build every stage into $(BUILD)/ (ARCH=75|sm_75|compute_75, BUILD=dir)"
	@echo "make test          CPU tests, fat build, no-spill check; self-tests too when a GPU is present"
	@echo "make check         every stage's --self-test on this GPU (SMEM_LIMIT=65536: T4 path)"
	@echo "make sanitize      compute-sanitizer memcheck, racecheck, synccheck on small shapes"
	@echo "make bench         the sweep only (BUDGET=60 seconds per launch, QUICK=1 for N <= 16k)"
	@echo "make plots         redraw the PNGs from the CSV"
	@echo "make tables        rewrite the README's results tables from the CSV"
	@echo "make test-plots    CPU tests of the sweep, plots and tables only"
	@echo "make diff STAGE=n  what stage n adds over stage n-1"
	@echo "make profile STAGE=n [VARIANT=name]  ncu with the sections for that lesson"
	@echo "stages: $(STAGES)"

include plots/plots.mk
include python/lib.mk

# The main job. On a machine with a GPU: sweep, then plots and tables from this GPU's CSV (a FAIL
# row still draws the plots, then fails the job). Without one: from the committed reference run.
all: build
	@status=0; \
	if [ -n '$(GPU_SLUG)' ]; then \
	    $(MAKE) --no-print-directory bench BENCH_DEPS= || status=$$?; \
	else \
	    echo "make: no NVIDIA GPU here: built every stage; plots and tables come from the committed results in plots/$(REF_GPU)/"; \
	fi; \
	$(MAKE) --no-print-directory plots tables || status=$$?; \
	exit $$status
