# mk/detect.mk: what the build finds on this machine, read by the top-level Makefile before its
# targets: the GPU, the targets to compile for (ARCH, or the fat build's list), the jobs, the
# tools (compute-sanitizer, ncu), and the gencode rule of the stages that need sm_90a.

CUDA_HOME ?= /usr/local/cuda
NVCC      ?= $(CUDA_HOME)/bin/nvcc
# The fat build's targets: T4, A100, RTX 30/A10, L4/RTX 40, H100/H200, B200, RTX 50 (PTX for the
# newest). A toolkit that lacks a target (sm_100 and sm_120 need CUDA 12.8) builds the others
# and says which it left out. common/tests/check_spills.sh checks every target a build made.
FAT_ARCHS_WANTED := 75 80 86 89 90 100 120
NPROC     := $(shell nproc 2>/dev/null || echo 2)
# the fat build of every stage, 2 jobs at a time on 2 cores (measured by .ci/run on fresh clones,
# 2026-11-29: 834 to 877 s, about half the sum of the objects' compile times the Makefile's
# COMPILE_ORDER lists)
FAT_BUILD_MINUTES := 14-15
empty :=
space := $(empty) $(empty)
comma := ,
ifeq ($(MAKELEVEL)$(filter -j%,$(MAKEFLAGS)),0)
MAKEFLAGS += -j$(NPROC)
endif

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

# $(sm90a_gencode): the build's targets with sm_90 made sm_90a, for a stage whose kernels use
# wgmma and setmaxnreg (they exist only in sm_90a code): wherever a build has sm_90 (native on a
# Hopper GPU, or in the fat build), that stage gets sm_90a instead; on every other target it
# builds host code and its unsupported() says why. A stage asks for it in its stage.mk:
# <stage>_GENCODE = $(sm90a_gencode).
sm90a_gencode = $(patsubst arch=compute_90$(comma)code=%,arch=compute_90a$(comma)code=%a,$(GENCODE))

# The tools of check, sanitize and profile: a tool not on PATH is looked for in the toolkit
# (CUDA_HOME) before it is called missing.
SANITIZER := $(or $(shell command -v compute-sanitizer 2>/dev/null),$(wildcard $(CUDA_HOME)/bin/compute-sanitizer),$(wildcard $(CUDA_HOME)/compute-sanitizer/compute-sanitizer))
NCU := $(or $(shell command -v ncu 2>/dev/null),$(wildcard $(CUDA_HOME)/bin/ncu),$(lastword $(sort $(wildcard $(CUDA_HOME)/nsight-compute*/ncu /opt/nvidia/nsight-compute/*/ncu))))
# $(call tool_missing,GOAL,TOOL,PACKAGE): why TOOL is not here, and how to get it
CUDA_PKG_VERSION = $(shell $(CUDA_HOME)/bin/nvcc --version 2>/dev/null | sed -n 's/.*release \([0-9]*\)\.\([0-9]*\).*/\1-\2/p')
tool_missing = $(1): $(2) not found: it is not on PATH, and $(if $(wildcard $(CUDA_HOME)/bin/nvcc),the CUDA toolkit in $(CUDA_HOME) does not include it (install the toolkit's $(3) package$(if $(CUDA_PKG_VERSION),$(comma) e.g. apt-get install $(3)-$(CUDA_PKG_VERSION)))$(comma) or set CUDA_HOME to a toolkit that has it,there is no CUDA toolkit in $(CUDA_HOME) (CUDA_HOME=dir names one))
