# stage9_decode/stage.mk: what the build knows of this stage beyond its attention.cu (the
# top-level Makefile reads it; the variables are described there).
# make grade: decode's quick cases (a paged, ragged cache with new keys) and timed shape.
stage9_decode_LAB_CASES := decode
# make profile: one new token of 32 query heads over 8 KV heads against 32,768 keys; the memory
# system's view (the lesson's figure of merit is DRAM throughput), occupancy and the warp stalls.
stage9_decode_PROFILE_ARGS := --seq 1 --seq-k 32768 --heads 32 --kv-heads 8 --dim 128 --layout bnhd --check 0 --bench
stage9_decode_PROFILE_SECTIONS := SpeedOfLight MemoryWorkloadAnalysis Occupancy WarpStateStats
stage9_decode_PROFILE_KERNELS := regex:decode_kernel
# `make diff STAGE=9` shows decode against stage 5, whose fragments, swizzle and online softmax it keeps.
stage9_decode_DIFF_BASE := stage5_tuned
