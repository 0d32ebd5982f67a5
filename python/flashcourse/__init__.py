"""flashcourse: the course's attention stages, called from PyTorch.

    make lib                                   # in the repository root: build/lib/lib<stage>.so
    import flashcourse
    flashcourse.stages()                       # what is built: name, dtype, variants
    o, lse = flashcourse.attention(q, k, v, causal=True, stage="stage5_tuned")

Each stage is the same attention.cu as its program, linked as a shared library with a small C
entry point (common/attn_lib.c) and loaded with ctypes: nothing is compiled at import, and
PyTorch is needed only by attention().
"""

from ._binding import LibraryNotBuiltError, Stage, attention, library_dir, stages

__all__ = ["attention", "stages", "Stage", "library_dir", "LibraryNotBuiltError"]
