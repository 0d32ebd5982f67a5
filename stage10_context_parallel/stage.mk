# stage10_context_parallel/stage.mk: what the build knows of this stage (the top-level Makefile
# reads it). Stage 10 is not a stage of the one host program: its program drives several GPUs
# (common/ring_main.c) around its ring (ring.cu), calls the course's best stage for the GPU
# through that stage's library (build/lib: stages 8 and 6 on Hopper, 7 and 5 elsewhere), and
# needs NCCL. So it has no attention.cu: the sweep and the tables leave it out, this file builds
# it, and its lab is found by the lines below that name its sources.
#
#   make cp          build it (and the stage libraries it loads), run its self-test on every GPU
#                    here (one GPU: the ring of one)
#   make cp ARGS="--seq 131072 --heads 32 --kv-heads 8 --causal --backward --bench"
#
# NCCL: its header and library from NCCL_HOME, the toolkit, the system, or the nvidia-nccl wheel
# PyTorch installs (python3's nvidia.nccl); without it every other stage builds and this one says
# why it is skipped. NCCL_ROOT= (empty, on the command line or in the environment) builds as if
# there were none (the labs' check tests that path so; make grade's own make inherits it).
CP := stage10_context_parallel
NCCL_HOME ?=
ifneq ($(and $(filter command line environment,$(origin NCCL_ROOT)),$(if $(strip $(NCCL_ROOT)),,none)),)
NCCL_ROOT :=
else
NCCL_WHEEL := $(shell python3 -c 'import nvidia.nccl as n; print(list(n.__path__)[0])' 2>/dev/null)
# the first root that has both the header and the library
NCCL_ROOT := $(firstword $(foreach d,$(NCCL_HOME) $(CUDA_HOME) /usr /usr/local $(NCCL_WHEEL),\
               $(if $(wildcard $(d)/include/nccl.h),$(if $(wildcard $(d)/lib/libnccl.so* $(d)/lib64/libnccl.so* $(d)/lib/x86_64-linux-gnu/libnccl.so*),$(d)))))
endif
NCCL_LIBDIR := $(patsubst %/,%,$(dir $(firstword $(wildcard $(NCCL_ROOT)/lib64/libnccl.so* $(NCCL_ROOT)/lib/libnccl.so* $(NCCL_ROOT)/lib/x86_64-linux-gnu/libnccl.so*))))
# the wheel has libnccl.so.2 only (no unversioned link): link the file itself
NCCL_LINK := -L$(NCCL_LIBDIR) $(if $(wildcard $(NCCL_LIBDIR)/libnccl.so),-lnccl,-l:libnccl.so.2) \
             -Xlinker -rpath,$(NCCL_LIBDIR)
# What its lab needs to know (common/labs.py reads these `:=` lines; make lab, make grade, make read
# and make diff take stage 10 as a stage through them, though it has no attention.cu):
#   <stage>_PROGRAM_SOURCES  the stage's sources of its program, in its folder (the first is the
#                    one compiled), where the lab's holes are
#   <stage>_PROGRAM_LIBS  the stage libraries its program loads at run time: the backward stages
#                    (their forward passes linked inside); make grade builds them once per target
#   <stage>_LAB_CASES  ring: make grade's quick cases and timed shape are the ring's (the self-test
#                    runs the ring of one and of every GPU here)
stage10_context_parallel_PROGRAM_SOURCES := ring.cu
stage10_context_parallel_PROGRAM_LIBS := stage7_backward stage8_hopper_backward
stage10_context_parallel_LAB_CASES := ring
CP_INNER := $(stage10_context_parallel_PROGRAM_LIBS)
# its kernels are elementwise (the merge, the sums, the inputs): one PTX, machine code per
# generation in the fat build
CP_GENCODE := $(if $(strip $(ARCH)),$(GENCODE),-gencode 'arch=compute_75,code=[sm_75,sm_80,sm_90,compute_75]')

.PHONY: cp cp-build
ifneq ($(NCCL_ROOT),)
build: $(BUILD)/$(CP)
cp-build: $(BUILD)/$(CP) $(patsubst %,$(BUILD)/lib/lib%.so,$(CP_INNER))
$(BUILD)/obj/$(CP).o: $(addprefix $(CP)/,$($(CP)_PROGRAM_SOURCES)) common/ring.h common/attn_lib.h common/attention.h $(BUILD)/flags.txt
	@mkdir -p $(@D) $(BUILD)/ptxas
	@echo "$(NVCC) -c $< [$(if $(ARCH),ARCH=$(ARCH),fat build)] -> $@"
	@$(NVCC) $(NVCCFLAGS) -I$(NCCL_ROOT)/include $(CP_GENCODE) -c $< -o $@ 2> $(BUILD)/ptxas/$(CP).txt || { cat $(BUILD)/ptxas/$(CP).txt; exit 1; }
$(BUILD)/obj/ring_main.o: common/ring_main.c common/ring.h common/attn_lib.h $(HEADERS)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -c $< -o $@
$(BUILD)/$(CP): $(BUILD)/obj/$(CP).o $(BUILD)/obj/ring_main.o $(BUILD)/obj/reference.o $(BUILD)/obj/reference_bwd.o $(BUILD)/obj/npy.o
	$(NVCC) -o $@ $^ $(LDLIBS) $(NCCL_LINK)
cp: cp-build
	$(BUILD)/$(CP) $(or $(ARGS),--self-test)
else
build: cp-skipped
# make cp asked for it: the line, and a failure (exit 3, the programs' "unsupported here")
cp-build cp: cp-skipped
	@exit 3
.PHONY: cp-skipped
cp-skipped:
	@echo "make: $(CP) skipped: no NCCL here (nccl.h and libnccl: NCCL_HOME=dir, the toolkit, the system's libnccl-dev, or pip install nvidia-nccl-cu13)"
# the program asked for by name (make grade builds it so): that line, and a failure
$(BUILD)/$(CP): cp-skipped
	@exit 3
endif
