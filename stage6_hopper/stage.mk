# stage6_hopper/stage.mk: what the build knows of this stage beyond its attention.cu (the
# top-level Makefile reads it; the variables are described there).
# The kernels use wgmma and setmaxnreg, which exist only in sm_90a code: wherever a build has
# sm_90, this stage gets sm_90a instead (mk/detect.mk); on every other target it builds host code
# and its unsupported() says why.
stage6_hopper_GENCODE = $(sm90a_gencode)
# make grade without a GPU compiles the lab where its kernels exist: PTX for compute_90 (sm_90a).
stage6_hopper_LAB_ARCH := compute_90
# make profile: the tensor pipe's busy share (the lesson's metric; VARIANT=nooverlap against it)
# and the warp stalls of the producer/consumer schedule.
stage6_hopper_PROFILE_SECTIONS := SpeedOfLight ComputeWorkloadAnalysis WarpStateStats
