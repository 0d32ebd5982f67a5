# stage0_naive/stage.mk: what the build knows of this stage beyond its attention.cu (the
# top-level Makefile reads it; the variables are described there).
# The variant cublas runs both products with cuBLAS.
stage0_naive_LIBS := -lcublas
# make profile: the bytes S costs in HBM (dram__bytes.sum, the lesson's metric, in the memory
# workload analysis).
stage0_naive_PROFILE_SECTIONS := SpeedOfLight MemoryWorkloadAnalysis
