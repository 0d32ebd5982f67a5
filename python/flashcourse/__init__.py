"""flashcourse: the course's attention stages, called from PyTorch, with gradients.

    make lib                                   # in the repository root: build/lib/lib<stage>.so
    import flashcourse
    flashcourse.stages()                       # what is built: name, dtype, variants, backward
    o, lse = flashcourse.attention(q, k, v, causal=True, stage="stage5_tuned")
    o.sum().backward()                         # dq, dk, dv by stage 8 (Hopper) or stage 7
    dq, dk, dv = flashcourse.attention_backward(q, k, v, o, lse, do, causal=True)
    o = flashcourse.scaled_dot_product_attention(q, k, v, is_causal=True)   # SDPA's signature
    o = flashcourse.flash_attn_func(q, k, v, causal=True)     # flash-attn's: [B, N, H, D]

Each stage is the same attention.cu as its program, linked as a shared library with a small C
entry point (common/attn_lib.c) and loaded with ctypes: nothing is compiled at import, and
PyTorch is needed only by the calls that take tensors. A call checks its arguments once per
shape and keeps the plan; later calls cost a dictionary lookup and the launches, through one
small C++ operator where `make lib` built it against this torch (flashcourse.eager_path() says
which; without it, the same calls in Python, with more host time a call). Under
torch.compile the passes are PyTorch custom operators (flashcourse::forward,
flashcourse::backward), kept whole in its graph, and CUDA graphs capture them.
"""

from ._binding import (LibraryNotBuiltError, Stage, attention, attention_backward,
                       auto_backward_stage, auto_stage, eager_path, exit_codes, flash_attn_func,
                       library_dir, scaled_dot_product_attention, stages)

__all__ = ["attention", "attention_backward", "scaled_dot_product_attention", "flash_attn_func",
           "stages", "Stage", "auto_stage", "auto_backward_stage", "library_dir", "exit_codes",
           "eager_path", "LibraryNotBuiltError"]
