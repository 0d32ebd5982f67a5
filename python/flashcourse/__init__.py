"""flashcourse: the course's attention stages, called from PyTorch, with gradients.

    make lib                                   # in the repository root: build/lib/lib<stage>.so
    import flashcourse
    flashcourse.stages()                       # what is built: name, dtype, variants, backward
    o, lse = flashcourse.attention(q, k, v, causal=True)     # stage "auto": 6 on Hopper, else 5
    o.sum().backward()                         # dq, dk, dv by stage 8 (Hopper) or stage 7
    dq, dk, dv = flashcourse.attention_backward(q, k, v, o, lse, do, causal=True)
    o = flashcourse.scaled_dot_product_attention(q, k, v, is_causal=True)   # SDPA's, exactly
    o = flashcourse.flash_attn_func(q, k, v, causal=True)     # flash-attn 2's: [B, N, H, D]
    o = flashcourse.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, causal=True)
                                               # a packed batch: q [total_q, H, D], no padding
    o = flashcourse.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=lens,
                                            block_table=table, causal=True)   # decode: stage 9
    o, lse = flashcourse.ring_attention(q, k, v, causal=True)   # torchrun: this rank's slice
    flashcourse.ring_sizes(N, P)               # which tokens each rank holds (zigzag: 2P chunks)
    q = flashcourse.zigzag_split(q_all, P, rank, dim=2)          # this rank's slice, a copy
    o_all = flashcourse.zigzag_gather([o_0, o_1], dim=2)        # the whole, from every slice

Each stage is the same attention.cu as its program, linked as a shared library with a small C
entry point (common/attn_lib.c, common/attn_lib.h) and loaded with ctypes: nothing is compiled at
import, and PyTorch is needed only by the calls that take tensors. A call checks its arguments
once per shape and keeps the plan; later calls cost a dictionary lookup and the launches, through
one small C++ operator where `make lib` built it against this torch (flashcourse.eager_path()
says which; without it, the same calls in Python, with more host time a call). Under
torch.compile the passes are PyTorch custom operators (flashcourse::forward,
flashcourse::backward; a packed batch's flashcourse::varlen_forward and ::varlen_backward), kept
whole in its graph, and CUDA graphs capture them. `make wheel`
builds a wheel that holds the libraries (flashcourse/lib), for machines without the checkout.

The modules by role, each importing only those before it at import time (no cycle):
  _version   the version (pyproject.toml and the wheel read it)
  _library   finding and loading the libraries; the C ABI in ctypes (attn_lib_request)
  _plans     checks, plans (once per shape), and resolve(): the one place "auto" is resolved
  _run       the run paths: a pass of a plan, the call cache, the C++ eager operator's glue
  _ops       the PyTorch autograd.Function and the custom operators for torch.compile (imported
             by _run and api at a call's first use, never at their import: it imports torch)
  api        attention(), attention_backward(), auto_stage(), auto_backward_stage()
  dropins    scaled_dot_product_attention(), flash_attn_func(), flash_attn_with_kvcache()
  varlen     flash_attn_varlen_func(): packed batches of sequences of different lengths
  _ring      the ring's split, schedule, merge and loops, with no process group (tests run them)
  ring       ring_attention(): a sequence split over the ranks of a torch.distributed group
             (NCCL), K/V and dK/dV passed around a ring; ring_sizes(), zigzag_split(),
             zigzag_gather(): the split
"""

from ._library import LibraryNotBuiltError, Stage, exit_codes, library_dir, stages
from ._run import eager_path
from ._version import __version__
from .api import attention, attention_backward, auto_backward_stage, auto_stage
from .dropins import flash_attn_func, flash_attn_with_kvcache, scaled_dot_product_attention
from .ring import ring_attention, ring_sizes, zigzag_gather, zigzag_split
from .varlen import flash_attn_varlen_func

__all__ = ["attention", "attention_backward", "scaled_dot_product_attention", "flash_attn_func",
           "flash_attn_varlen_func", "flash_attn_with_kvcache", "ring_attention", "ring_sizes",
           "zigzag_split", "zigzag_gather",
           "stages", "Stage", "auto_stage", "auto_backward_stage", "library_dir", "exit_codes",
           "eager_path", "LibraryNotBuiltError", "__version__"]
