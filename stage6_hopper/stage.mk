# stage6_hopper/stage.mk: what the build knows of this stage beyond its attention.cu (the
# top-level Makefile reads it; the variables are described there).
# The kernels use wgmma and setmaxnreg, which exist only in sm_90a code: wherever a build has
# sm_90 (native on a Hopper GPU, or in the fat build), this stage gets sm_90a instead. On every
# other target it builds host code and its unsupported() says why.
stage6_hopper_GENCODE = $(patsubst arch=compute_90$(comma)code=%,arch=compute_90a$(comma)code=%a,$(GENCODE))
