#!/usr/bin/env python3
"""Train train_gpt.py's small GPT with every sequence split over GPUs (context parallelism): its
attention by flashcourse.ring_attention, everything else on each GPU's slice of the tokens.

    make lib
    torchrun --nproc_per_node=2 python/examples/train_gpt_cp.py --compare   # two GPUs
    PYTHONPATH=python python3 python/examples/train_gpt_cp.py               # one: the ring of one

Each rank (one process and GPU, NCCL) holds the same model and the same batches, and of every
sequence its zigzag slice (flashcourse.zigzag_split: chunks r and 2P-1-r of 2P, --layout
contiguous: block r of P) of the tokens, of their targets and of their positions: the position
embeddings are looked up at the tokens' global positions. Everything in the model but attention
works token by token, so it runs on the slice as it is; attention is ring_attention, which
passes each rank's K/V around the ring (and in the backward dK/dV back to their owners).

The loss and the gradients, exactly one GPU's: each rank's loss is the cross-entropy summed over
its tokens divided by the batch's tokens (all ranks'), so the ranks' losses add up to one GPU's
mean over the batch; each rank's backward gives the gradient of its part with respect to the
weights it holds (the ring carries the dK/dV of other ranks' queries home), and their sum over the
ranks (one all_reduce, before the gradient scaler unscales and the norm is clipped) is one GPU's
gradient of the mean. Every rank then takes the same optimizer step: the weights stay identical
(checked at the end). The model, the text, the batches, the options and the step are
train_gpt.py's (imported).

Printed (by rank 0): the loss of the batch every few steps, the throughput (tokens of all ranks
per second, the first 10% of the steps left out, rank 0's clock). --compare: rank 0 also trains the
model on one GPU (flashcourse.scaled_dot_product_attention on whole sequences, as train_gpt.py's
course run), from the same initial weights on the same batches, a step after each step of the
ring, and prints the two loss curves' largest difference. Exit status: 0; 1 when --compare's
curves differ by more than AGREE nats at some step, a loss is not finite, or the ranks' weights
differ; 2 when something is missing (PyTorch, a CUDA GPU, the stage libraries: make lib) or an
option is wrong.
"""

import argparse
import functools
import math
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import train_gpt  # noqa: E402  the model, text, options, step (without torch: stdlib imports only)

flashcourse, torch = train_gpt.flashcourse, train_gpt.torch

# train_gpt.py's defaults but longer sequences in fewer of them (as many tokens a step): what is
# split is the sequence. --compare's check is judged over these steps.
CP_DEFAULTS = dict(train_gpt.DEFAULTS, steps=100, seq=4096, batch=4)
CP_SMALL = dict(train_gpt.SMALL, steps=100, seq=4096, batch=4)
AGREE = 0.05  # the largest |loss difference| (nats) at any step that counts as agreement
TIMEOUT = timedelta(minutes=5)  # a rank waiting longer for the others fails (NCCL's watchdog)
LAYOUTS = flashcourse.ring.LAYOUTS if flashcourse is not None else ("zigzag",)


def say(rank: int, msg: str) -> None:
    if rank == 0:
        train_gpt.say(msg)


def fail(msg: str, code: int = 2) -> int:
    """One line on stderr, and the exit status to return."""
    print(f"train_gpt_cp.py: {msg}", file=sys.stderr, flush=True)
    return code


def parse_args():
    ap = argparse.ArgumentParser(
        description="Train train_gpt.py's small character-level GPT with every sequence split "
                    "over the GPUs of a torchrun (context parallelism): attention by "
                    "flashcourse.ring_attention, the loss and the weight gradients summed over "
                    "the ranks, exactly one GPU's.",
        epilog="Launch: torchrun --nproc_per_node=P python/examples/train_gpt_cp.py (P GPUs); "
               "plain python3: the ring of one. Exit 0; 1: --compare's curves differ, a loss "
               "is not finite, or the ranks' weights differ; 2: something is missing.")
    train_gpt.model_options(ap, CP_DEFAULTS, CP_SMALL)
    ap.add_argument("--layout", choices=LAYOUTS, default=LAYOUTS[0],
                    help="how each sequence is split: zigzag (rank r holds chunks r and 2P-1-r "
                         "of 2P: causal work balanced) or contiguous (block r of P: the naive "
                         "ring) (default zigzag)")
    ap.add_argument("--compare", action="store_true",
                    help=f"also train on one GPU (rank 0, flashcourse's attention on whole "
                         f"sequences) from the same weights on the same batches, and check that "
                         f"the two loss curves agree within {AGREE} nats at every step")
    return train_gpt.model_args(ap, ap.parse_args(), CP_DEFAULTS, CP_SMALL)


def start():
    """(P, rank, group): torchrun's ranks over NCCL, each on its GPU (LOCAL_RANK); a plain
    python3 (no WORLD_SIZE): (1, 0, None), the ring of one."""
    if "WORLD_SIZE" not in os.environ:
        return 1, 0, None
    dist = torch.distributed
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl", timeout=TIMEOUT)
    return dist.get_world_size(), dist.get_rank(), dist.group.WORLD


def ring_sdpa(args, group):
    """The model's attention call (F.scaled_dot_product_attention's, as train_gpt.py's
    CausalSelfAttention makes it) on this rank's slice: ring_attention's o (it takes the
    key/value heads as they are: enable_gqa needs nothing more)."""
    def sdpa(q, k, v, is_causal=False, enable_gqa=False):
        o, _ = flashcourse.ring_attention(q, k, v, causal=is_causal, group=group,
                                          layout=args.layout, stage=args.stage,
                                          backward_stage=args.backward_stage)
        return o
    return sdpa


def sum_over_ranks(group):
    """reduce_grads for train_gpt.train_step: every weight's gradient summed over the ranks (one
    all_reduce of them all, flattened), so that every rank holds one GPU's."""
    def reduce_grads(model):
        if group is None:
            return
        params = list(model.parameters())
        for p in params:
            if p.grad is None:  # (a weight this rank's tokens did not reach: a zero gradient)
                p.grad = torch.zeros_like(p)
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        torch.distributed.all_reduce(flat, group=group)
        for p, part in zip(params, flat.split([p.numel() for p in params])):
            p.grad.copy_(part.view_as(p.grad))
    return reduce_grads


def rank_loss(s, model, x, y, split, positions):
    """This rank's part of the batch's mean loss (x, y: the whole batch's inputs and targets
    [B, N]; split: this rank's slice along a dim; positions: its tokens'): the cross-entropy
    summed over its tokens, divided by the batch's tokens on every rank."""
    return s.loss(functools.partial(model, positions=positions), split(x, dim=1),
                  split(y, dim=1), reduction="sum") / x.numel()


def same_weights(model, group) -> bool:
    """Whether every rank holds the same weights (their sum and sum of squares in float64, the
    smallest and largest over the ranks equal)."""
    if group is None:
        return True
    dist = torch.distributed
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).double()
    stats = torch.stack([flat.sum(), (flat * flat).sum()])
    low, high = stats.clone(), stats.clone()
    dist.all_reduce(low, op=dist.ReduceOp.MIN, group=group)
    dist.all_reduce(high, op=dist.ReduceOp.MAX, group=group)
    return torch.equal(low, high)


def main() -> int:
    args = parse_args()  # argparse: exit 2 on a bad option
    if flashcourse is None:
        return fail(f"needs the course's Python package (python/flashcourse beside this "
                    f"example, or pip install ./python): {train_gpt.FLASHCOURSE_ERROR}")
    if torch is None:
        return fail(f"needs PyTorch (pip install torch): {train_gpt.TORCH_ERROR}")
    if not torch.cuda.is_available():
        return fail("needs a CUDA GPU: torch.cuda.is_available() is False "
                    f"(torch {torch.__version__})")
    P, rank, group = start()
    try:
        return train(args, P, rank, group)
    finally:
        if group is not None:
            torch.distributed.destroy_process_group()


def train(args, P: int, rank: int, group) -> int:
    dist = torch.distributed
    device = torch.device("cuda", torch.cuda.current_device())
    auto, backward_auto = args.stage == "auto", args.backward_stage == "auto"
    try:  # the drop-in's own choices, named: what runs is what is printed (train_gpt.py's)
        args.stage = flashcourse.auto_stage() if auto else args.stage
        if backward_auto:
            args.backward_stage = flashcourse.auto_backward_stage()
    except (ImportError, RuntimeError) as e:
        return fail(f"the course's attention cannot train here: {e}")
    why = train_gpt.course_ready(args, auto, backward_auto)
    if why:
        return fail(why)
    train_ids, val_ids, vocab, nfiles = train_gpt.char_ids(train_gpt.REPO)
    if len(train_ids) <= args.seq + 1:
        return fail(f"the course's text ({len(train_ids)} characters to train on) is too short "
                    f"for --seq {args.seq}")
    s = train_gpt.Setup(args, device, train_ids, val_ids, vocab)  # the same on every rank
    N, tokens = args.seq, args.batch * args.seq  # a batch's, all ranks'
    split = functools.partial(flashcourse.zigzag_split, P=P, rank=rank, layout=args.layout)
    positions = split(torch.arange(N, device=device), dim=0)  # this rank's tokens' own

    say(rank, f"train_gpt_cp.py on {P} x {torch.cuda.get_device_name()} (torch "
              f"{torch.__version__}, {args.dtype}, seed {train_gpt.SEED}): the sequence split "
              f"over {P} rank{'s' * (P > 1)}, {args.layout}, ring_attention ({args.stage} "
              f"forward, {args.backward_stage} backward)")
    say(rank, f"model: {args.layers} layer{'s' * (args.layers > 1)}, {args.heads} "
              f"head{'s' * (args.heads > 1)} x {args.dim}, {args.kv_heads} key/value "
              f"head{'s' * (args.kv_heads > 1)}; {args.steps} steps of {args.batch} x {N} "
              f"characters (rank {rank}: {positions.numel()} of each sequence), lr {args.lr:g}; "
              f"text: {nfiles} files, {len(train_ids):,} characters, {vocab} symbols")

    model = s.new_model(ring_sdpa(args, group))
    model.load_state_dict(s.init_state)  # (made from one seed: the same on every rank)
    opt, scaler = train_gpt.optimizer(s, model)
    one = None
    if args.compare and rank == 0:  # one GPU's run of the same steps, beside the ring's
        one = s.new_model(train_gpt.course_sdpa(args.stage, args.backward_stage))
        one.load_state_dict(s.init_state)
        opt1, scaler1 = train_gpt.optimizer(s, one)
        losses1 = torch.zeros(args.steps, device=device)

    losses = torch.zeros(args.steps, device=device)
    every, warm = max(1, args.steps // 20), max(1, args.steps // 10)
    seconds = 0.0
    try:
        for step in range(args.steps):
            x, y = s.batch(s.train_ids, s.starts[step])  # every rank the whole batch
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            loss, lr = train_gpt.train_step(s, model, opt, scaler, step,
                                            lambda: rank_loss(s, model, x, y, split, positions),
                                            sum_over_ranks(group))
            if group is not None:
                dist.all_reduce(loss, group=group)  # the ranks' parts: the batch's mean
            torch.cuda.synchronize()
            if step >= warm:
                seconds += time.perf_counter() - t0
            losses[step] = loss
            if one is not None:
                losses1[step] = train_gpt.train_step(s, one, opt1, scaler1, step,
                                                     functools.partial(s.loss, one, x, y))[0]
            if (step + 1) % every == 0 or step + 1 == args.steps:
                also = f"  (one GPU {losses1[step].item():.4f})" if one is not None else ""
                say(rank, f"  step {step + 1:5d}/{args.steps}  loss {losses[step].item():.4f}"
                          f"{also}  lr {lr:.2e}")
    except (TypeError, ValueError) as e:  # the course's refusals (a stage, a shape), in a line
        if not str(e).startswith(("flashcourse.", "stage")):
            raise
        return fail(str(e))
    except torch.cuda.OutOfMemoryError:
        return fail("out of GPU memory: try a smaller --batch or --seq", code=1)

    timed = args.steps - warm
    say(rank, f"throughput: {timed * tokens / seconds:,.0f} tokens per second over {P} "
              f"GPU{'s' * (P > 1)} (steps {warm + 1}..{args.steps}, rank 0's clock)")
    verdict = torch.zeros(1, device=device)  # rank 0's: 0 agree, 1 not (sent to every rank)
    if not same_weights(model, group):
        say(rank, "the ranks' weights differ: their steps were not the same")
        verdict += 1
    if not all(math.isfinite(x) for x in losses.tolist()):
        say(rank, "a loss is not finite")
        verdict += 1
    if one is not None:
        gap = (losses - losses1).abs()
        worst = int(gap.argmax())
        say(rank, f"ring of {P} vs one GPU: loss curves {float(gap.max()):.4f} apart at most "
                  f"(step {worst + 1}; mean {float(gap.mean()):.4f}); final losses "
                  f"{losses[-1].item():.4f} and {losses1[-1].item():.4f}")
        if not bool(gap.max() <= AGREE):
            say(rank, f"the curves differ by more than {AGREE} nats: the ring did not train as "
                      "one GPU does")
            verdict += 1
        else:
            say(rank, f"the curves agree within {AGREE} nats")
    if group is not None:
        dist.broadcast(verdict, 0, group=group)
    return 1 if verdict.item() else 0


if __name__ == "__main__":
    sys.exit(main())
