# stage0_naive/stage.mk: what the build knows of this stage beyond its attention.cu (the
# top-level Makefile reads it; the variables are described there).
# The variant cublas runs both products with cuBLAS.
stage0_naive_LIBS := -lcublas
