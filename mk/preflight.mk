# mk/preflight.mk: what a goal needs, said in one line before anything is built, read by the
# top-level Makefile after mk/detect.mk and the stages' stage.mk files: a plain make that cannot
# sweep, a missing CUDA compiler, the fat build coming (and the targets this toolkit lacks),
# check, sanitize, fuzz and profile without a GPU or a tool, a mistyped ARCH; then the build folder's
# record of its flags (flags.txt), so that objects built with other flags are rebuilt.

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

# check, sanitize, fuzz and profile need a GPU (and a tool): without one, one line naming what is
# missing and exit 2, before anything is built. In this order: profile's stage number, the GPU,
# the tool (mk/detect.mk looks for it).
ifneq ($(filter check sanitize fuzz profile,$(MAKECMDGOALS)),)
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
$(error $(firstword $(filter check sanitize fuzz profile,$(MAKECMDGOALS))): no NVIDIA GPU here (nvidia-smi finds none), and it runs the kernels on one; make test runs the tests that need none)
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
ifeq ($(filter clean help diff read format format-check lab grade capstone,$(MAKECMDGOALS)),)
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
