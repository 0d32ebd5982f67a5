"""The course's measurement scripts, run from the repository root as modules:

    python3 -m tools.compare_fa2   stage programs (subprocesses) beside PyTorch's FA2 and cuDNN
    python3 -m tools.compare       the stages' libraries beside FA2, cuDNN and FA3-class in one
                                   process, CUDA graphs, forward or backward (--pass bwd)
    python3 -m tools.sdpa_bwd      PyTorch's FA2 and cuDNN backward, the programs' protocol
    bash tools/compare_bwd.sh      stage 7's backward program beside them, with the sanitizers

They import each other and plots/measure.py (the FLOP count and the timing protocol) as packages
of the repository (tools.compare_fa2, plots.measure), and flashcourse as installed (pip install
./python) or else from this checkout (python.flashcourse).
"""
