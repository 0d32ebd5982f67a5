#!/usr/bin/env python3
"""A pre-norm transformer block with random weights whose attention goes through a course stage
instead of F.scaled_dot_product_attention.

    make lib
    PYTHONPATH=python python3 python/examples/transformer_block.py [--causal] [--stages 1,5]

For every stage built (or those named), the same block runs twice from the same weights and
input, once with SDPA and once with the stage, in the stage's dtype (float32 for stages 0-1,
float16 after). Printed per stage: the largest difference of the block's output from the SDPA
block's, and the median time of one forward pass of the block with each. A stage passes when its
block is as close to the float64 block (SDPA in float64) as the SDPA block in the same dtype is,
within the checker's rule: error <= 2 x SDPA's error + 1e-4 x (1 + max |out|). Nothing is
downloaded; exit 1 if a stage misses, 3 (one line) without PyTorch or without a GPU.
"""

import argparse
import math
import sys
from pathlib import Path

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ModuleNotFoundError as e:  # only a missing PyTorch gets this line; anything else raises
    if e.name != "torch" and not (e.name or "").startswith("torch."):
        raise
    print("transformer_block.py: needs PyTorch, which is not installed here (pip install torch); "
          "the course's C programs need none", file=sys.stderr)
    sys.exit(3)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import flashcourse  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "plots"))
import measure  # noqa: E402  (the timing protocol: one home)


class Attention(nn.Module):
    def __init__(self, heads: int, head_dim: int, causal: bool):
        super().__init__()
        self.heads, self.head_dim, self.causal = heads, head_dim, causal
        width = heads * head_dim
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)
        self.backend = "sdpa"  # or a stage name: "stage5_tuned"

    def forward(self, x):
        B, N, _ = x.shape
        q, k, v = self.qkv(x).view(B, N, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        if self.backend == "sdpa":
            o = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        else:  # q, k, v as the fused projection's views: the stages that take strides (5, 6)
            # read them in place; the binding gives the others contiguous copies
            o, _ = flashcourse.attention(q, k, v, causal=self.causal, stage=self.backend)
        return self.out(o.transpose(1, 2).reshape(B, N, -1))


class Block(nn.Module):
    def __init__(self, heads: int, head_dim: int, causal: bool):
        super().__init__()
        width = heads * head_dim
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attn = Attention(heads, head_dim, causal)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(),
                                 nn.Linear(4 * width, width))

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


def time_forward(block, x, reps: int) -> float:
    """Median milliseconds of one forward pass (CUDA events, after warm-up; the L2 kept warm, as
    in a model's step)."""
    for _ in range(3):
        block(x)
    timer = measure.EventTimer(torch, flush=False)
    return measure.median([timer.once(lambda: block(x)) for _ in range(reps)])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--dim", type=int, default=64,
                    help="head dim, a multiple of 8 from 32 to 256 (stages 5-8 run every one, "
                         "stages 0-4 64 and 128: the others say unsupported)")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--stages", default="", help="comma-separated names or numbers (all built)")
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("transformer_block.py: needs a CUDA GPU", file=sys.stderr)
        return 3

    built = flashcourse.stages()
    if args.stages:
        want = [w.strip() for w in args.stages.split(",") if w.strip()]
        chosen = [s for s in built
                  if any(s.name == w or s.name.startswith(f"stage{w}_") for w in want)]
        if not chosen:
            print(f"transformer_block.py: no built stage matches {args.stages!r}",
                  file=sys.stderr)
            return 2
    else:
        chosen = built

    torch.manual_seed(0)
    block32 = Block(args.heads, args.dim, args.causal).cuda().eval()
    x32 = torch.randn(args.batch, args.seq, args.heads * args.dim, device="cuda")
    print(f"{torch.cuda.get_device_name()}: block of width {args.heads * args.dim} "
          f"({args.heads} heads x {args.dim}), batch {args.batch}, {args.seq} tokens"
          f"{', causal' if args.causal else ''}; random weights, seed 0")
    print(f"{'stage':22s} {'dtype':8s} {'max |out - sdpa out|':>21s} {'ms/forward':>11s} "
          f"{'sdpa ms':>9s} {'err vs fp64':>12s} {'sdpa err':>9s}")
    failed = 0
    with torch.no_grad():
        block64 = Block(args.heads, args.dim, args.causal).cuda().eval().double()
        block64.load_state_dict(block32.state_dict())
        exact = block64(x32.double())
        floor = 1e-4 * (1 + exact.abs().max().item())
        for st in chosen:
            dtype = st.torch_dtype
            block = Block(args.heads, args.dim, args.causal).cuda().eval().to(dtype)
            block.load_state_dict(block32.state_dict())
            x = x32.to(dtype)
            block.attn.backend = "sdpa"
            ref = block(x)
            ms_sdpa = time_forward(block, x, args.reps)
            block.attn.backend = st.name
            try:
                out = block(x)
            except ValueError as e:  # a shape or GPU the stage does not support
                print(f"{st.name:22s} {st.dtype:8s} unsupported here: {e}")
                continue
            diff = (out.float() - ref.float()).abs().max().item()
            ms = time_forward(block, x, args.reps)
            err = (out.double() - exact).abs().max().item()
            err_sdpa = (ref.double() - exact).abs().max().item()
            ok = math.isfinite(err) and err <= 2 * err_sdpa + floor
            failed += not ok
            print(f"{st.name:22s} {st.dtype:8s} {diff:21.3e} {ms:11.3f} {ms_sdpa:9.3f} "
                  f"{err:12.3e} {err_sdpa:9.3e}{'' if ok else '  <- FAIL: over 2x sdpa err'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
