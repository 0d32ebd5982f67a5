# stage7_backward/stage.mk: what the build knows of this stage beyond its attention.cu (the
# top-level Makefile reads it; the variables are described there).
# The forward pass is stage 5's, linked beside this stage's backward (not copied).
stage7_backward_FORWARD := stage5_tuned
# `make diff STAGE=7` shows the backward pass against stage 5, whose forward it reuses.
stage7_backward_DIFF_BASE := stage5_tuned
# make profile: the backward's kernels (not the forward's, launched first): the tensor pipe's busy
# share and the warp stalls (exercise 7: which stall reason shrinks with VARIANT=atomics).
stage7_backward_PROFILE_KERNELS := regex:backward
stage7_backward_PROFILE_SECTIONS := SpeedOfLight ComputeWorkloadAnalysis WarpStateStats
# Its kernels add dQ by bulk reductions from sm_90 on (config.cuh: dq_bulk(__CUDA_ARCH__ / 10),
# DQ_BULK_ARCH): a level of the fat build's PTX that mk/fat_gencode.awk cannot read.
stage7_backward_ARCH_LEVELS := 90
