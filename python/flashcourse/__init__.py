"""flashcourse: the course's attention stages, called from PyTorch, with gradients.

    make lib                                   # in the repository root: build/lib/lib<stage>.so
    import flashcourse
    flashcourse.stages()                       # what is built: name, dtype, variants, backward
    o, lse = flashcourse.attention(q, k, v, causal=True, stage="stage5_tuned")
    o.sum().backward()                         # dq, dk, dv by stage 7's backward pass
    dq, dk, dv = flashcourse.attention_backward(q, k, v, o, lse, do, causal=True)

Each stage is the same attention.cu as its program, linked as a shared library with a small C
entry point (common/attn_lib.c) and loaded with ctypes: nothing is compiled at import, and
PyTorch is needed only by attention() and attention_backward(), which are PyTorch custom
operators (flashcourse::forward, flashcourse::backward), so torch.compile keeps them in its graph.
"""

from ._binding import (LibraryNotBuiltError, Stage, attention, attention_backward, exit_codes,
                       library_dir, stages)

__all__ = ["attention", "attention_backward", "stages", "Stage", "library_dir", "exit_codes",
           "LibraryNotBuiltError"]
