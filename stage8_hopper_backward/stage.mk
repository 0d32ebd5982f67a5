# stage8_hopper_backward/stage.mk: what the build knows of this stage beyond its attention.cu (the
# top-level Makefile reads it; the variables are described there).
# The main kernel uses wgmma and setmaxnreg, which exist only in sm_90a code: wherever a build has
# sm_90, this stage gets sm_90a instead (mk/detect.mk, as stage 6). On every other target it builds
# host code and the passes before and after, and its unsupported() says why.
stage8_hopper_backward_GENCODE = $(sm90a_gencode)
# make grade without a GPU compiles the lab where its kernels exist: PTX for compute_90 (sm_90a).
stage8_hopper_backward_LAB_ARCH := compute_90
# The forward pass is stage 6's, linked beside this stage's backward (not copied).
stage8_hopper_backward_FORWARD := stage6_hopper
# `make diff STAGE=8` shows the backward on wgmma against stage 7's on mma.sync.
stage8_hopper_backward_DIFF_BASE := stage7_backward
# make profile: the backward's main kernel (not stage 6's forward, launched first): the tensor
# pipe's busy share under the five wgmma products, the memory traffic of dQ's bulk reduce-adds in
# L2 (VARIANT=atomics against it), and the warp stalls of the producer/consumer schedule.
stage8_hopper_backward_PROFILE_KERNELS := regex:backward
stage8_hopper_backward_PROFILE_SECTIONS := SpeedOfLight ComputeWorkloadAnalysis MemoryWorkloadAnalysis WarpStateStats
