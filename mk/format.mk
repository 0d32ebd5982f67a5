# mk/format.mk: the C/CUDA sources' formatter, read by the top-level Makefile: make format
# rewrites them, make format-check only checks them (make test runs it).

# The formatter is pinned (formatters of other versions disagree): clang-format from pip, kept
# in the user's cache (FLASHCOURSE_CACHE), outside the build folder: make clean keeps it, and
# every checkout shares it. Without it and without a package index to fetch it from (offline),
# format-check says in one line that it is skipped and why, and passes; FORMAT_CHECK_REQUIRED=1
# (CI) makes that a failure.
CLANG_FORMAT_VERSION := 19.1.7
FLASHCOURSE_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/flashcourse
CLANG_FORMAT_DIR = $(FLASHCOURSE_CACHE)/clang-format-$(CLANG_FORMAT_VERSION)
CLANG_FORMAT = $(CLANG_FORMAT_DIR)/clang_format/data/bin/clang-format
FORMAT_CHECK_REQUIRED ?=
FORMAT_FILES = $(wildcard common/*.c common/*.h common/tests/*.c common/device/*.cuh stage*/*.cu stage*/*.cuh \
  capstone/*.cu \
  python/flashcourse/*.cpp)
# Shell: installs the pinned clang-format unless it is there; sets $$why (empty: installed) when
# it cannot be had here; exits 1 when pip fails with a package index in reach.
define ensure_clang_format
why=; \
if [ ! -x '$(CLANG_FORMAT)' ]; then \
    if ! command -v python3 >/dev/null 2>&1 || ! python3 -m pip --version >/dev/null 2>&1; then \
        why="python3 with pip is not installed here"; \
    else \
        mkdir -p '$(FLASHCOURSE_CACHE)'; tmp='$(CLANG_FORMAT_DIR)'.tmp$$$$; rm -rf "$$tmp"; \
        if python3 -m pip install -q --disable-pip-version-check --no-warn-script-location \
               --retries 1 --timeout 20 --target "$$tmp" clang-format==$(CLANG_FORMAT_VERSION) \
               >'$(CLANG_FORMAT_DIR).log' 2>&1 && [ -x "$$tmp/clang_format/data/bin/clang-format" ]; then \
            mv -T "$$tmp" '$(CLANG_FORMAT_DIR)' 2>/dev/null || rm -rf "$$tmp"; \
            echo "$@: installed clang-format $(CLANG_FORMAT_VERSION) with pip into $(CLANG_FORMAT_DIR)"; \
        else \
            rm -rf "$$tmp"; \
            net=$$(grep -o -E 'Connection refused|Name or service not known|Temporary failure in name resolution|No address associated with hostname|Network is unreachable|timed out|ProxyError' '$(CLANG_FORMAT_DIR).log' | head -n 1); \
            [ -n "$$net" ] || net=$$(grep -o -E 'NewConnectionError|Failed to establish a new connection|Max retries exceeded' '$(CLANG_FORMAT_DIR).log' | head -n 1); \
            if [ -n "$$net" ]; then \
                why="no package index is reachable to install it (pip: $$net)"; \
            else \
                echo "$@: pip could not install clang-format==$(CLANG_FORMAT_VERSION) (see $(CLANG_FORMAT_DIR).log)" >&2; exit 1; \
            fi; \
        fi; \
    fi; \
fi
endef

format:
	@$(ensure_clang_format); \
	[ -z "$$why" ] || { echo "format: the pinned clang-format $(CLANG_FORMAT_VERSION) is not installed, and $$why" >&2; exit 1; }; \
	echo "$(CLANG_FORMAT) -i $(FORMAT_FILES)"; $(CLANG_FORMAT) -i $(FORMAT_FILES)

format-check:
	@$(ensure_clang_format); \
	if [ -n "$$why" ]; then \
	    if [ -n '$(FORMAT_CHECK_REQUIRED)' ]; then \
	        echo "format-check: cannot run (FORMAT_CHECK_REQUIRED is set): the pinned clang-format $(CLANG_FORMAT_VERSION) is not installed, and $$why"; \
	        echo "format-check: 0 passed, 1 failed"; exit 1; \
	    fi; \
	    echo "SKIP  format-check: the pinned clang-format $(CLANG_FORMAT_VERSION) is not installed, and $$why; formatting not checked here (CI checks it)"; \
	    exit 0; \
	fi; \
	bad=""; for f in $(FORMAT_FILES); do $(CLANG_FORMAT) $$f | cmp -s - $$f || bad="$$bad $$f"; done; \
	if [ -n "$$bad" ]; then echo "format-check: not formatted (make format fixes it):$$bad"; echo "format-check: 0 passed, 1 failed"; exit 1; fi; \
	echo "format-check: $(words $(FORMAT_FILES)) files formatted as clang-format $(CLANG_FORMAT_VERSION) does: 1 passed, 0 failed"
