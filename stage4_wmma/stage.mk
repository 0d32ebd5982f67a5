# stage4_wmma/stage.mk: what the build knows of this stage beyond its attention.cu (the
# top-level Makefile reads it; the variables are described there).
# make profile: the tensor pipe's busy share (sm__pipe_tensor_op_hmma_cycles_active, the lesson's
# metric) beside the other pipes.
stage4_wmma_PROFILE_SECTIONS := SpeedOfLight ComputeWorkloadAnalysis
