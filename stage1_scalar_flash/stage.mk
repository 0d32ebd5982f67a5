# stage1_scalar_flash/stage.mk: what the build knows of this stage beyond its attention.cu (the
# top-level Makefile reads it; the variables are described there).
# make profile: the shared-memory bank conflicts of the unpadded tiles (the lesson's metric,
# l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum, in the memory tables).
stage1_scalar_flash_PROFILE_SECTIONS := SpeedOfLight MemoryWorkloadAnalysis_Tables
