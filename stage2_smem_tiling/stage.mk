# stage2_smem_tiling/stage.mk: what the build knows of this stage beyond its attention.cu (the
# top-level Makefile reads it; the variables are described there).
# make profile: the bank conflicts that padding removes (VARIANT=nopad puts them back).
stage2_smem_tiling_PROFILE_SECTIONS := SpeedOfLight MemoryWorkloadAnalysis_Tables
