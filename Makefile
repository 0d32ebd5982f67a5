# A staged FlashAttention course. `make help` lists the targets.
#
#   make                 build, sweep every stage, draw the plots, the tables (another GPU: plots/<gpu>/TABLES.md)
#   make QUICK=1         build, a 2-minute sweep (every stage, a few shapes), plots in build/quick/
#   make test            CPU tests + fat build + spill check + format check (+ self-tests on a GPU)
#   make check           every stage's --self-test on this GPU (SMEM_LIMIT=65536 for the T4 path)
#   make fuzz            random shapes through every stage, every row checked (FUZZ_CASES, FUZZ_SEED)
#   make lab STAGE=n     write labs/<stage>/: the stage's code with the lesson cut into holes
#   make grade STAGE=n   build the lab with the course's host program, self-test it: a report card
#   make build ARCH=75   machine code for one target; ARCH=compute_75 for PTX only; BUILD=dir;
#                        several at once: ARCH="75 89"
# Builds run in parallel on every core (make -jN of your own overrides it).

# mk/: what the targets below read: detect.mk (the GPU, ARCH and its gencode, the tools),
# preflight.mk (each goal's one-line preconditions, flags.txt), format.mk (the formatter's targets)
include mk/detect.mk
CC        ?= gcc
BUILD     ?= build
STAGES    := $(sort $(patsubst %/attention.cu,%,$(wildcard stage[0-9]*/attention.cu)))

# What a stage needs beyond the generic rules below it declares in its folder's stage.mk (read
# here, so adding a stage takes its folder and the README's ladder row, nothing else):
#   <stage>_GENCODE  its targets, when they are not the build's (stages 6 and 8: $(sm90a_gencode),
#                    sm_90a for sm_90, mk/detect.mk)
#   <stage>_ARCH_LEVELS  the compute capabilities at which its code changes that the fat build
#                    cannot read from its #if __CUDA_ARCH__ lines (mk/fat_gencode.awk; stage 7: 90)
#   <stage>_LIBS     libraries its program and its library link (stage 0: cuBLAS)
#   <stage>_FORWARD  the stage whose forward pass it links (stage 7: stage 5's): that stage's
#                    attention.cu compiled a second time as obj/stage<n>_forward.o, its descriptor
#                    renamed attn_forward_stage (hidden: the library exports one descriptor)
#   <stage>_DIFF_BASE  what `make diff` shows it against, when not the stage before it
#   <stage>_PROFILE_SECTIONS  the ncu sections `make profile` shows: its lesson's (none: ncu's own)
#   <stage>_PROFILE_KERNELS   which kernels `make profile` measures (ncu --kernel-name; none: the
#                    first ones launched; a backward stage: its backward's, not its forward's)
#   <stage>_LAB_ARCH  the target `make grade` compiles a lab for without a GPU (PTX only; none:
#                    compute_75), when the stage's kernels exist on one architecture only
#                    (common/labs.py reads it: one `:=` line)
#   <stage>_LAB_CASES  decode: `make grade` runs decode's quick cases and timed shape (common/labs.py);
#                    ring: the ring's (stage 10)
#   <stage>_PROGRAM_SOURCES  a stage that is a program of its own, not a stage of common/main.c
#                    (stage 10: ring.cu): its sources, where its lab's holes are (common/labs.py)
#   <stage>_PROGRAM_LIBS  the stage libraries such a program loads at run time
#   <stage>_PROFILE_ARGS  the shape `make profile` runs (none: PROFILE_ARGS's default below)
include $(wildcard stage[0-9]*/stage.mk)
# the stages with a backward pass (a linked forward), named by the program to a forward-only one
BACKWARD_STAGES := $(strip $(foreach s,$(STAGES),$(if $($(s)_FORWARD),$(s))))
# $(call forward_obj,STAGE): the object of STAGE's linked forward pass
forward_obj = $(BUILD)/obj/$(firstword $(subst _, ,$(1)))_forward.o

NVCCFLAGS := -std=c++17 -O3 -lineinfo -Xptxas -v -Werror all-warnings -Icommon \
             -Xcompiler -Wall,-Wextra,-Werror
CFLAGS    := -std=c11 -O2 -Wall -Wextra -Werror -fopenmp -I$(CUDA_HOME)/include
LDLIBS    := -Xcompiler -fopenmp -lm -ldl

COMMON_SRC := common/main.c common/decode.c common/device_info.c common/reference.c common/reference_bwd.c common/npy.c
COMMON_OBJ := $(patsubst common/%.c,$(BUILD)/obj/%.o,$(COMMON_SRC))
HEADERS    := common/attention.h common/common.h common/csv_header.h common/device_info.h common/decode.h

.DEFAULT_GOAL := all
.PHONY: all build objects test check sanitize fuzz profile diff help clean format format-check lab grade

.DELETE_ON_ERROR:
.SECONDARY:

STAGE_OBJ := $(patsubst %,$(BUILD)/obj/%.o,$(STAGES))
# STAGE=n (profile, diff): its folder; the stage numbers there are
STAGE_DIR = $(firstword $(wildcard stage$(STAGE)_*))
STAGE_NUMBERS := $(patsubst stage%,%,$(foreach s,$(STAGES),$(firstword $(subst _, ,$(s)))))
# the highest stage number, a program of its own included (stage 10): what lab and grade take
LAST_STAGE_NUMBER = $(lastword $(shell printf '%s\n' $(patsubst stage%,%,$(foreach d,$(wildcard stage[0-9]*_*),$(firstword $(subst _, ,$(d))))) | sort -n))

include mk/preflight.mk

# ---- build ----
# The objects that take longest to compile go first, so that the jobs end together. Measured on
# the fat build with 2 jobs on 2 cores (seconds from a compile's start to its end, the other core
# busy, 2026-11-29, a fresh clone's .ci/run): stage 3 368, stage 5 323 (its packed batches' MODEL
# kernels), stage 7 320, stage 2 284, stage 6 179, stage 1 79, stage 8 57, stage 9 42, stage 4 19,
# stage 0 11. A stage not named here follows, the last stages first.
COMPILE_ORDER := stage3_cp_async stage5_tuned stage7_backward stage2_smem_tiling stage6_hopper \
                 stage1_scalar_flash stage8_hopper_backward stage9_decode
reverse = $(if $(1),$(call reverse,$(wordlist 2,$(words $(1)),$(1))) $(firstword $(1)))
build: $(patsubst %,$(BUILD)/obj/%.o,$(filter $(STAGES),$(COMPILE_ORDER))) \
       $(addprefix $(BUILD)/,$(call reverse,$(STAGES))) $(BUILD)/test_common

# The stages' device code only (no link): what CI compiles with a second toolkit.
objects: $(STAGE_OBJ)

$(BUILD)/obj/%.o: common/%.c $(HEADERS)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -c $< -o $@
$(BUILD)/obj/main.o: CFLAGS += -DATTN_BACKWARD_STAGES='"$(or $(BACKWARD_STAGES),no stage)"'
$(BUILD)/obj/main.o: $(wildcard stage[0-9]*/stage.mk)

# The -Xptxas -v report (registers, shared memory, stack frame, spills) is kept beside the object.
# The fat build compiles a stage's PTX once per level at which its code can change, not once per
# target (mk/fat_gencode.awk); any other build, for $(GENCODE).
stage_gencode = $(if $(strip $(ARCH)),$(GENCODE),$(shell awk -v targets='$(FAT_ARCHS)' \
                  -v levels='$($(1)_ARCH_LEVELS)' -f mk/fat_gencode.awk $(2)/*.cu $(wildcard $(2)/*.cuh) $(DEVICE_HEADERS)))
$(BUILD)/obj/%.o: %/attention.cu common/attention.h $(BUILD)/flags.txt mk/fat_gencode.awk
	@mkdir -p $(@D) $(BUILD)/ptxas
	@echo "$(NVCC) -c $< [$(if $(ARCH),ARCH=$(ARCH),fat build)] -> $@"
	@$(NVCC) $(NVCCFLAGS) -Xcompiler -fPIC $(or $($*_GENCODE),$(call stage_gencode,$*,$(<D))) -c $< -o $@ 2> $(BUILD)/ptxas/$*.txt || { cat $(BUILD)/ptxas/$*.txt; exit 1; }

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

$(BUILD)/test_common: common/tests/test_common.c common/ring.h $(BUILD)/obj/reference.o $(BUILD)/obj/reference_bwd.o $(BUILD)/obj/npy.o
	$(CC) $(CFLAGS) -Icommon -o $@ $(filter-out %.h,$^) -lm

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

# random shapes, every row checked (common/tests/fuzz.py): FUZZ_CASES per stage, from FUZZ_SEED;
# FUZZ_ARGS: more of its options (under memcheck: FUZZ_ARGS='--wrap "compute-sanitizer
# --error-exitcode 9" --max-work 2e7')
FUZZ_CASES ?= 100
FUZZ_SEED ?= 1
FUZZ_ARGS ?=
fuzz:
	@$(MAKE) --no-print-directory build
	python3 common/tests/fuzz.py $(BUILD) $(STAGES) --cases $(FUZZ_CASES) --seed $(FUZZ_SEED) \
	  $(if $(SMEM_LIMIT),--extra "--smem-limit $(SMEM_LIMIT)") $(FUZZ_ARGS)

# ---- one lesson at a time ----
# what a stage's diff is taken against: the stage of the host program before it (stage 10, a
# program of its own, is none), or its stage.mk's <stage>_DIFF_BASE
# (stage 7, the backward pass: stage 5, whose forward it reuses)
PREV_DIR  = $(or $($(STAGE_DIR)_DIFF_BASE),$(firstword $(wildcard stage$(shell p=; for n in $(STAGE_NUMBERS); do [ "$$n" -lt "$(STAGE)" ] 2>/dev/null && [ "$$n" -gt "$${p:--1}" ] && p=$$n; done; echo "$$p")_*)))
# make diff STAGE=n: what stage n adds over PREV_DIR, its code read without the labs' marker lines
# (// LAB HOLE, TODO, STUB: comments), by common/labs.py: the whole diff; or, where the stage is a
# rewrite of its base rather than an edit (less than a third of its lines are the base's: stage 1
# and stages 5-9), one line saying so and pointing to the lesson's code map, its files by role,
# and the diffs of those that correspond to an edited file of the base. A header comment the
# stage rewrites shows as the stage's, the base's folded to one line. ALL=1: the whole diff.
diff:
	@test -n "$(STAGE)" -a -n "$(STAGE_DIR)" -a -n "$(PREV_DIR)" || { echo "usage: make diff STAGE=n [ALL=1] (n = 1..$(words $(wordlist 2,99,$(STAGES))))"; exit 2; }
	@python3 common/labs.py diff $(STAGE_DIR) $(PREV_DIR) $(if $(filter-out 0,$(ALL)),--all)

# make read STAGE=n: the stage's code without the labs' marker lines, its files in the order its
# lesson's code map names them, each line numbered as in its file (the lessons link to those
# lines); in $PAGER (less) on a terminal. STAGE=capstone: the capstone's.
.PHONY: read
read:
	@test -n "$(STAGE)" || { echo "usage: make read STAGE=n (n = $(firstword $(STAGE_NUMBERS))..$(lastword $(STAGE_NUMBERS)), or capstone)"; exit 2; }
	@python3 common/labs.py read '$(STAGE)'

# ---- labs (common/labs.py says how the holes are marked in a stage's source) ----
# make lab STAGE=n writes labs/<stage>/ (ignored by git) and never overwrites a learner's edits
# (RESTART=1 starts over, keeping theirs as a .bak). make grade STAGE=n builds the learner's copy
# with this Makefile, as the stage's own program is built, and prints a report card, which ends
# with the registers, spills and stack frame (ptxas) of the kernels that hold the holes' code,
# the learner's beside the stage's own; ARCH= and SMEM_LIMIT= as for make check (ARCH=compute_75
# SMEM_LIMIT=65536: the T4 path), GPU_NAME= pretends there is no GPU (then it compiles, prints the
# table, says that nothing was graded, and the grader exits 3, the programs' "unsupported here":
# make reports "Error 3" and fails); QUICK=1 runs the quick cases only (no self-test, no timing);
# YOURS_ONLY=1 leaves the stage's own kernels out of the table (with no GPU: not built);
# LABS=dir keeps the labs somewhere else than labs/.
LAB_ARGS = '$(STAGE)' $(if $(filter command line,$(origin ARCH)),--arch '$(ARCH)') \
           $(if $(SMEM_LIMIT),--smem-limit '$(SMEM_LIMIT)') \
           $(if $(filter command line environment,$(origin GPU_NAME)),--gpu-name '$(GPU_NAME)') \
           $(if $(filter-out 0,$(QUICK)),--quick) $(if $(filter-out 0,$(YOURS_ONLY)),--yours-only)
lab grade:
	@test -n "$(STAGE)" || { echo "usage: make $@ STAGE=n (n = 1..$(LAST_STAGE_NUMBER), or capstone)"; exit 2; }
	@python3 common/labs.py $(if $(LABS),--labs '$(LABS)') $@ $(if $(filter lab,$@),'$(STAGE)' $(if $(filter-out 0,$(RESTART)),--restart),$(LAB_ARGS))

# The capstone lab (capstone/attention.cu): the whole FlashAttention-2 forward pass from its
# specification. make capstone writes it (make lab STAGE=capstone), make grade STAGE=capstone
# grades it. Not a stage (no sweep, no fat build): its program is linked as a stage's, the host
# program's objects and the learner's file; its solution is stage 5's kernel behind the
# capstone's contract (hence the dependency), which its speed is measured against.
.PHONY: capstone
capstone:
	@$(MAKE) --no-print-directory lab STAGE=capstone
$(BUILD)/capstone: $(BUILD)/obj/capstone.o $(COMMON_OBJ)
	$(NVCC) -o $@ $^ $(LDLIBS)
$(BUILD)/obj/capstone.o: $(wildcard stage5_tuned/*.cu stage5_tuned/*.cuh) $(DEVICE_HEADERS)

# ncu sections per lesson (each stage's stage.mk: <stage>_PROFILE_SECTIONS, _PROFILE_KERNELS);
# PROFILE_ARGS sets the shape.
PROFILE_ARGS ?= $(or $($(STAGE_DIR)_PROFILE_ARGS),--seq 4096 --dim 128 --heads 16 --batch 4 --check 0 --bench)
PROFILE_METRICS := l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.pct_of_peak_sustained_active
profile:
	@$(MAKE) --no-print-directory build
	'$(NCU)' --clock-control none --launch-skip 1 --launch-count 3 $(if $($(STAGE_DIR)_PROFILE_KERNELS),--kernel-name $($(STAGE_DIR)_PROFILE_KERNELS)) \
	  $(foreach s,$($(STAGE_DIR)_PROFILE_SECTIONS),--section $(s)) --metrics $(PROFILE_METRICS) \
	  $(BUILD)/$(STAGE_DIR) $(PROFILE_ARGS) $(if $(VARIANT),--variant $(VARIANT))

include mk/format.mk

clean:
	rm -rf $(BUILD)

help:
	@echo "make               build, sweep every stage (long and fa2 shapes; the decode stages: decode shapes and a copy roof), plots, tables (the READMEs: the reference GPU's; yours: plots/<gpu>/TABLES.md)"
	@echo "make build         build every stage into $(BUILD)/ (ARCH=75|sm_75|compute_75, BUILD=dir)"
	@echo "make QUICK=1       build, a quick sweep (every stage, a few shapes: ~2 min on an H200), plots in build/quick/"
	@echo "make test          CPU tests, fat build, no-spill check, format check; self-tests too on a GPU"
	@echo "make format        format the C/CUDA sources with the pinned clang-format $(CLANG_FORMAT_VERSION) (format-check: only check)"
	@echo "make check         every stage's --self-test on this GPU (SMEM_LIMIT=65536: T4 path)"
	@echo "make sanitize      compute-sanitizer memcheck, racecheck, synccheck on small shapes"
	@echo "make fuzz          random shapes through every stage, each checked whole (FUZZ_CASES=100 a stage, FUZZ_SEED=1; SMEM_LIMIT=65536: T4 path)"
	@echo "make bench         the sweep only (BUDGET=60 seconds per launch; QUICK=1: long N $(shell . plots/shapes.conf && echo $$QUICK_LONG_N | tr ' ' ,), fa2 N $(shell . plots/shapes.conf && echo $$QUICK_FA2_N | tr ' ' ,), decode N_k $(shell . plots/shapes.conf && echo $$QUICK_DECODE_NK | tr ' ' ,))"
	@echo "make plots         redraw the PNGs from the CSV"
	@echo "make tables        rewrite the README's results tables and each lesson's measured section from the reference CSV (another GPU: plots/<gpu>/TABLES.md)"
	@echo "make test-plots    CPU tests of the sweep, plots and tables only"
	@echo "make diff STAGE=n  what stage n adds over stage n-1 (a rewrite, as stages 1 and 5-9: its files by role; ALL=1: the whole diff, the stage before's header comment too)"
	@echo "make read STAGE=n  the stage's code without the lab's markers, in the order of its lesson's code map"
	@echo "make lab STAGE=n   write labs/<stage>/: the stage's kernel with the lesson cut into holes (a stage with none says so)"
	@echo "make grade STAGE=n build your lab, self-test it, time it: a report card and your kernels' registers and spills beside the stage's (no GPU: it compiles, prints that table, grades nothing and fails with the grader's exit 3; QUICK=1: no self-test)"
	@echo "make capstone      write labs/capstone/: the whole FlashAttention-2 forward from its specification (make grade STAGE=capstone: graded, timed against stage 5)"
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
