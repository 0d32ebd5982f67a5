# stage5_tuned/stage.mk: what the build knows of this stage beyond its attention.cu (the
# top-level Makefile reads it; the variables are described there).
# make profile: the tensor pipe's busy share and the shared-load bank conflicts (the lesson's
# metrics; VARIANT=noswizzle for the conflicts), occupancy and the warp stalls.
stage5_tuned_PROFILE_SECTIONS := SpeedOfLight ComputeWorkloadAnalysis Occupancy WarpStateStats
