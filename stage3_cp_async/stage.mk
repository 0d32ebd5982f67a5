# stage3_cp_async/stage.mk: what the build knows of this stage beyond its attention.cu (the
# top-level Makefile reads it; the variables are described there).
# make profile: the warp stalls, long scoreboard first, that the double buffer hides
# (VARIANT=sync: stage 2's loads).
stage3_cp_async_PROFILE_SECTIONS := SpeedOfLight WarpStateStats
