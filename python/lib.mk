# python/lib.mk: `make lib` builds every stage as a shared library too, for python/flashcourse.
# Included by the top-level Makefile (run make from the repository root).
#
#   make lib             build/lib/lib<stage>.so for every stage (ARCH and BUILD as for make build),
#                        and the eager operator against $(PYTHON)'s torch
#   make wheel           build/wheel/flashcourse-<version>-py3-none-linux_<machine>.whl: the package
#                        with the libraries make lib built inside it (pip install it anywhere)
#
# PYTHON: the python whose torch the eager operator is built against (default: the first python3
# on PATH; `make lib PYTHON=/path/to/venv/bin/python` for another).
#
# A library is the stage's object, the very one its program links (compiled once, -fPIC), plus
# common/attn_lib.c, the C entry point the binding calls. It exports the stage descriptor
# `attn_this_stage` and attn_lib_*; the static CUDA runtime inside stays private
# (--exclude-libs), so it never binds to another runtime in the same process (PyTorch's).

STAGE_LIBS := $(patsubst %,$(BUILD)/lib/lib%.so,$(STAGES))

.PHONY: lib
lib: $(STAGE_LIBS)

PYTHON ?= python3

$(BUILD)/obj/attn_lib.o: common/attn_lib.c common/attn_lib.h common/attention.h common/device_info.h
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -fPIC -c $< -o $@

# the device facts and shape rules (common/device_info.c), position-independent and hidden: the
# library exports its descriptor and attn_lib_* only
$(BUILD)/obj/lib_device_info.o: common/device_info.c common/device_info.h common/attention.h
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -fPIC -fvisibility=hidden -c $< -o $@

# python/lib.map: the symbols a library exports (the descriptor and attn_lib_*), the rest local
$(BUILD)/lib/lib%.so: $(BUILD)/obj/%.o $(BUILD)/obj/attn_lib.o $(BUILD)/obj/lib_device_info.o python/lib.map
	@mkdir -p $(@D)
	$(NVCC) -shared -o $@ $(filter %.o,$^) -Xlinker --exclude-libs,ALL -Xlinker -z,defs \
	  -Xlinker --version-script=python/lib.map -lpthread $($*_LIBS)

# A stage that links another stage's forward pass carries it in its library too (its stage.mk's
# <stage>_FORWARD: the Makefile adds the object).

# The eager operator (python/flashcourse/_eager.cpp: attention's forward and backward as one
# torch::autograd::Function in C++, the binding's hot path) against $(PYTHON)'s torch, where it
# has one; python/build_eager.py says in one line why not otherwise, and the binding runs its
# Python path.
EAGER_OP := $(BUILD)/lib/libflashcourse_eager.so
.PHONY: eager-op
lib: eager-op
eager-op:
	@$(PYTHON) python/build_eager.py $(EAGER_OP)

# The wheel: the package and the libraries of $(BUILD)/lib (whatever ARCH they were built for:
# the fat build by default), written by python/build_wheel.py with the standard library alone.
.PHONY: wheel
wheel: lib
	@$(PYTHON) python/build_wheel.py $(BUILD)/lib $(BUILD)/wheel
