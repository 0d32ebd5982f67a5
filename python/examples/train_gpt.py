#!/usr/bin/env python3
"""Train a small character-level GPT with the course's attention and with PyTorch's, side by side.

    make lib
    PYTHONPATH=python python3 python/examples/train_gpt.py            # H100 / H200: about a minute
    PYTHONPATH=python python3 python/examples/train_gpt.py --small    # a T4: a couple of minutes
    PYTHONPATH=python python3 python/examples/train_gpt.py --dtype bf16 --kv-heads 2   # Hopper

The same GPT is trained twice, the two runs taking turns of a few steps (CHUNK; the first to go
alternating), from the same initial weights, on the same batches in the same order, with the
same optimizer and autocast (--dtype: fp16, with a gradient scaler, or bf16,
without one): once with flashcourse.scaled_dot_product_attention (the forward pass by --stage, by
default stage 6 on a Hopper GPU and stage 5 elsewhere; the backward pass by --backward-stage, by
default stage 8, FlashAttention-3's backward, on a Hopper GPU and stage 7, FlashAttention-2's,
elsewhere; both printed as resolved) and once with F.scaled_dot_product_attention. The model calls
both the same way, o = sdpa(q, k, v, is_causal=True, enable_gqa=...): the function it is given is
the only difference, the one-line swap a user makes. --kv-heads makes it grouped-query attention:
the key and value projections make fewer heads than the query's, and both functions take k and v
with those heads (no repeat). bf16 and grouped-query heads need a stage whose descriptor says it
takes them (stage 5's or 6's forward, stage 7's or 8's backward; bf16 from sm_80); another stage is
refused before training, in one line. The text is the course itself: its lessons (README.md,
stage*/README.md) and its CUDA and C sources, read from this repository, character by character;
the last 10% of every file is held out for the validation loss.

Printed: which code runs the course's calls (flashcourse.eager_path(): the C++ eager operator that
`make lib` builds, or the Python path and why; the Python path costs more host time a call), a
progress line every few steps, each run's training throughput (tokens per second over
its turns but the first, the warm-up, each turn timed between two torch.cuda.synchronize() calls:
taking turns, a change in the machine's pace falls on both runs alike), its final loss
(the mean training loss of the last steps) and its validation loss (every held-out window, in
the same batches, for both). Written to --out (default plots/<gpu>/, as `make bench` names it):
train_gpt.csv (step, loss_course, loss_sdpa, after '# key: text' lines that describe the run)
and train_gpt.png, drawn by train_gpt.gp (beside this script) with gnuplot where it is installed.

--bound adds a third run, taking turns with the two, whose attention is no attention at all:
o = q, every other operation of the step kept (projections, norms, the MLP, the loss, the
optimizer). Its tokens per second are the most any attention could give this model, and each
run's step time less its own is what that run's attention costs a step: printed beside the two
(Amdahl's law, measured: the share of the step that attention is bounds what a faster attention
can gain; its losses are not compared).

The two runs are not expected to give identical numbers, only numbers that agree within noise:
their rounding differs, and training amplifies any difference. PyTorch's own attention is no
steadier: on an H100, two SDPA runs of the default settings (same seed, same batches) ended with
validation losses 0.04 apart, final losses 0.06 apart, their backward passes being
nondeterministic. Exit status: 0 when the two validation losses agree within 0.1 nats (a wrong
gradient costs far more), 1 when they do not or a loss is not finite, 2 when something is
missing (PyTorch, a CUDA GPU, the stage libraries: `make lib`, a stage that takes --dtype bf16 or
--kv-heads) or an option is wrong.
"""

import argparse
import functools
import math
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "python"))
try:
    import flashcourse  # stdlib only at import: works without torch
except ImportError as e:  # this file copied out of the repository
    flashcourse, FLASHCOURSE_ERROR = None, e

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except (ImportError, OSError) as e:  # main() says so in one line; --help still works
    torch, TORCH_ERROR = None, e

    class nn:  # noqa: N801  just enough for the class definitions below to be read
        Module = object

# The course's text, relative to the repository: lessons first, then the code they explain.
CORPUS = ("README.md", "stage*/README.md", "stage*/*.cu", "stage*/*.cuh", "common/*.h",
          "common/*.c", "common/*.cu")
HELD_OUT = 0.10  # the last 10% of every file: the validation text
AGREE = 0.1  # the largest |validation loss difference| (nats) that counts as agreement
SEED = 0

# The defaults (an H100 or H200: under a minute for both runs) and --small's (a T4). An option
# given on the command line wins over both; without --heads, the heads are width / --dim.
DEFAULTS = dict(steps=1000, layers=4, width=512, dim=64, seq=1024, batch=16, lr=1e-3)
SMALL = dict(steps=800, layers=4, width=256, dim=64, seq=1024, batch=16, lr=2e-3)


def say(msg: str) -> None:
    print(msg, flush=True)


def fail(msg: str, code: int = 2) -> int:
    """One line on stderr, and the exit status to return."""
    print(f"train_gpt.py: {msg}", file=sys.stderr, flush=True)
    return code


# ---- the text ----

def load_text(root: Path):
    """The course's files as (train text, held-out text, number of files): each file split at
    90%, the parts joined with blank lines."""
    files = []
    for pattern in CORPUS:
        for p in sorted(root.glob(pattern)):
            if p.is_file() and p not in files:
                files.append(p)
    train, held = [], []
    for p in files:
        text = p.read_text(encoding="utf-8", errors="replace")
        cut = int(len(text) * (1 - HELD_OUT))
        train.append(text[:cut])
        held.append(text[cut:])
    return "\n\n".join(train), "\n\n".join(held), len(files)


def char_ids(root: Path):
    """The course's text (load_text) as character ids, the vocabulary every character of it:
    (train ids, held-out ids, vocabulary size, number of files)."""
    train_text, val_text, nfiles = load_text(root)
    chars = sorted(set(train_text + val_text))
    index = {c: i for i, c in enumerate(chars)}
    return (torch.tensor([index[c] for c in train_text], dtype=torch.long),
            torch.tensor([index[c] for c in val_text], dtype=torch.long), len(chars), nfiles)


# ---- the model: a GPT whose attention is a function given to it ----

class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention with `kv_heads` key/value heads (fewer than `heads`:
    grouped-query attention, query head h reading key/value head h // (heads / kv_heads)).
    `sdpa` is F.scaled_dot_product_attention or a drop-in with its signature; it gets q
    [B, H, N, D] and k, v [B, H_kv, N, D], contiguous, of attn_dtype (float16 or bfloat16 on the
    GPU: what the course's stages take). Both runs give it exactly the same q, k and v."""

    def __init__(self, heads: int, kv_heads: int, head_dim: int, sdpa, attn_dtype):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.sdpa, self.attn_dtype = sdpa, attn_dtype
        width = heads * head_dim
        # one fused projection: q's heads, then k's and v's (3 x width with kv_heads = heads)
        self.qkv = nn.Linear(width, width + 2 * kv_heads * head_dim)
        self.proj = nn.Linear(width, width)

    def forward(self, x):
        B, N, _ = x.shape
        H, H_kv, D = self.heads, self.kv_heads, self.head_dim
        q, k, v = self.qkv(x).split((H * D, H_kv * D, H_kv * D), dim=-1)
        q = q.view(B, N, H, D).transpose(1, 2)  # [B, H, N, D]
        k, v = (t.view(B, N, H_kv, D).transpose(1, 2) for t in (k, v))  # [B, H_kv, N, D]
        q, k, v = (t.to(self.attn_dtype).contiguous() for t in (q, k, v))
        # SDPA's call; enable_gqa only where the heads differ (torch < 2.5 does not know it)
        gqa = {"enable_gqa": True} if H_kv != H else {}
        o = self.sdpa(q, k, v, is_causal=True, **gqa)  # [B, H, N, D]
        return self.proj(o.transpose(1, 2).reshape(B, N, -1))


class Block(nn.Module):
    """Pre-norm transformer block: x + attention(norm(x)), then x + MLP(norm(x))."""

    def __init__(self, heads: int, kv_heads: int, head_dim: int, sdpa, attn_dtype):
        super().__init__()
        width = heads * head_dim
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attn = CausalSelfAttention(heads, kv_heads, head_dim, sdpa, attn_dtype)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(),
                                 nn.Linear(4 * width, width))

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class GPT(nn.Module):
    """Token and position embeddings, `layers` blocks, a final norm and the output layer (tied
    to the token embedding): logits for the next character at every position."""

    def __init__(self, vocab: int, seq: int, layers: int, heads: int, kv_heads: int,
                 head_dim: int, sdpa, attn_dtype):
        super().__init__()
        width = heads * head_dim
        self.tok = nn.Embedding(vocab, width)
        self.pos = nn.Embedding(seq, width)
        self.blocks = nn.ModuleList(Block(heads, kv_heads, head_dim, sdpa, attn_dtype)
                                    for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.tok.weight
        # GPT-2's initialisation: N(0, 0.02), the layers that write into the residual stream
        # scaled down by sqrt(2 x layers) so that its variance does not grow with depth.
        for name, p in self.named_parameters():
            if p.dim() == 1:
                nn.init.ones_(p) if "norm" in name else nn.init.zeros_(p)
            else:
                std = 0.02 / math.sqrt(2 * layers) if name.endswith(("proj.weight",
                                                                      "mlp.2.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, idx, positions=None):
        """idx [B, N] token ids at `positions` [N] in their sequences (default 0 .. N-1; a
        context-parallel rank's slice: its tokens' own, train_gpt_cp.py)."""
        if positions is None:
            positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.tok(idx) + self.pos(positions)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def course_sdpa(stage: str, backward_stage: str):
    """flashcourse's SDPA drop-in, its forward pass by `stage`, its backward by
    `backward_stage`. The swap in a model is this one line: F.scaled_dot_product_attention ->
    flashcourse.scaled_dot_product_attention (whose stage="auto" and backward_stage="auto" pick
    the stages themselves; they are named here so that --stage, --backward-stage and what is
    printed are the ones that ran)."""
    return functools.partial(flashcourse.scaled_dot_product_attention, stage=stage,
                             backward_stage=backward_stage)


# ---- training ----

def no_attention(q, k, v, is_causal=False, enable_gqa=False):
    """--bound's stand-in for attention: o = q (its shape, no work), so that the step keeps
    every other operation and the run's time is the step's without attention."""
    return q


def learning_rate(step: int, steps: int, peak: float) -> float:
    """Linear warm-up over the first 10% of the steps, then a cosine down to peak / 10."""
    warm = max(1, steps // 10)
    if step < warm:
        return peak * (step + 1) / warm
    t = (step - warm) / max(1, steps - warm)
    return peak * (0.1 + 0.45 * (1 + math.cos(math.pi * t)))


def autocast_dtype(dtype: str, device):
    """The autocast type of --dtype on `device`, or None: no autocast (float32). On the GPU
    float16 or bfloat16; on the CPU (--sdpa-only) bfloat16 with --dtype bf16, else float32 (the
    CPU's autocast type is bfloat16)."""
    if dtype == "bf16":
        return torch.bfloat16
    return torch.float16 if device.type == "cuda" else None


class Setup:
    """Everything the two runs share: the data on the device, the batch order, the initial
    weights, the options."""

    def __init__(self, args, device, train_ids, val_ids, vocab: int):
        self.args, self.device, self.vocab = args, device, vocab
        self.amp_dtype = autocast_dtype(args.dtype, device)
        self.amp = self.amp_dtype is not None
        self.train_ids, self.val_ids = train_ids.to(device), val_ids.to(device)
        self.offsets = torch.arange(args.seq + 1, device=device)
        # The batch order: window starts for every step, drawn once from a seeded generator.
        g = torch.Generator().manual_seed(SEED + 1)
        self.starts = torch.randint(0, len(train_ids) - args.seq, (args.steps, args.batch),
                                    generator=g).to(device)
        # The initial weights, made once and loaded into both models.
        torch.manual_seed(SEED)
        self.init_state = {k: v.detach().clone()
                           for k, v in self.new_model(F.scaled_dot_product_attention)
                           .state_dict().items()}

    def new_model(self, sdpa):
        a = self.args
        return GPT(self.vocab, a.seq, a.layers, a.heads, a.kv_heads, a.dim, sdpa,
                   self.amp_dtype or torch.float32).to(self.device)

    def batch(self, ids, starts):
        """Inputs and targets (the next characters) of the windows starting at `starts`."""
        w = ids[starts[:, None] + self.offsets]
        return w[:, :-1], w[:, 1:]

    def loss(self, model, x, y, reduction="mean"):
        with torch.autocast(self.device.type, dtype=self.amp_dtype, enabled=self.amp):
            logits = model(x)
        return F.cross_entropy(logits.float().view(-1, self.vocab), y.reshape(-1),
                               reduction=reduction)

    def sync(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize()


def validation_loss(s: Setup, model) -> float:
    """Mean loss per character over every whole window of the held-out text (windows of
    --seq + 1 characters, --batch at a time): the same windows, batches and order for both."""
    model.eval()
    seq, n = s.args.seq, (len(s.val_ids) - 1) // s.args.seq
    total = torch.zeros((), device=s.device)
    with torch.no_grad():
        for i in range(0, n, s.args.batch):
            starts = torch.arange(i, min(i + s.args.batch, n), device=s.device) * seq
            x, y = s.batch(s.val_ids, starts)
            total += s.loss(model, x, y, reduction="sum")
    model.train()
    return total.item() / (n * seq)


def optimizer(s: Setup, model):
    """The optimizer and the gradient scaler of a run: (opt, scaler)."""
    # AdamW on every weight matrix and embedding, no decay on biases and norms; fused: one
    # kernel, and with the gradient scaler no host-device synchronisation in the step.
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": rest, "weight_decay": 0.0}],
                            lr=s.args.lr, betas=(0.9, 0.95), fused=s.device.type == "cuda")
    # fp16 gradients can underflow: scale the loss up (and skip a step whose gradients overflow);
    # bf16 has float32's exponent range, and no scaler (disabled, it passes everything through)
    scaler = torch.amp.GradScaler(s.device.type, enabled=s.amp_dtype == torch.float16)
    return opt, scaler


def train_step(s: Setup, model, opt, scaler, step: int, loss_of, reduce_grads=None):
    """Training step `step` of a run: the learning rate of the schedule, loss_of() (the loss,
    computed here) and its backward through the gradient scaler, reduce_grads(model) where given
    (train_gpt_cp.py: the sum over the ranks, before the gradients are unscaled and clipped),
    the gradient norm clipped to 1, the optimizer's step. Returns (the loss, detached; the
    learning rate)."""
    lr = learning_rate(step, s.args.steps, s.args.lr)
    for group in opt.param_groups:
        group["lr"] = lr
    loss = loss_of()
    scaler.scale(loss).backward()
    if reduce_grads is not None:
        reduce_grads(model)
    scaler.unscale_(opt)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(opt)
    scaler.update()
    opt.zero_grad(set_to_none=True)
    return loss.detach(), lr


def train(s: Setup, name: str, sdpa, result: dict):
    """One run, as a generator: each next() trains the next chunk of steps (the last may be
    shorter) and yields how many steps are done; after the last, result gets the loss of every
    step and the validation loss. The caller times the chunks (train_both)."""
    a = s.args
    torch.manual_seed(SEED)  # the same random state in both runs (nothing in the step draws)
    model = s.new_model(sdpa)
    model.load_state_dict(s.init_state)
    opt, scaler = optimizer(s, model)

    losses = torch.zeros(a.steps, device=s.device)
    every = max(1, a.steps // 20)
    chunk = chunk_steps(a.steps)
    for step in range(a.steps):
        x, y = s.batch(s.train_ids, s.starts[step])
        loss, lr = train_step(s, model, opt, scaler, step, functools.partial(s.loss, model, x, y))
        losses[step] = loss  # kept on the device: no wait for the GPU in the loop
        if (step + 1) % every == 0 or step + 1 == a.steps:
            say(f"  [{name}] step {step + 1:5d}/{a.steps}  loss {losses[step].item():.4f}  "
                f"lr {lr:.2e}")
        if (step + 1) % chunk == 0 or step + 1 == a.steps:
            yield step + 1
    result["losses"] = losses.tolist()
    result["val"] = validation_loss(s, model)
    del model, opt
    if s.device.type == "cuda":
        torch.cuda.empty_cache()


CHUNK = 25  # steps a run trains before the other run's turn


def chunk_steps(steps: int) -> int:
    """Steps per turn: CHUNK, fewer for a short run (at least 4 turns each)."""
    return max(1, min(CHUNK, steps // 4))


def train_both(s: Setup, runs):
    """The runs, (key, attention function) each, trained in turns of chunk_steps() steps, the
    first to go alternating, each turn timed between two synchronisations of the device: a change
    in the machine's pace (clocks, the host's other work) falls on both runs alike, where two
    runs one after the other would each get their own. Returns {key: (the loss of every step,
    tokens per second, validation loss)}; the tokens per second count every turn but a run's
    first (the warm-up: first calls, allocations)."""
    a = s.args
    results = {key: {} for key, _ in runs}
    gens = {key: train(s, key, fn, results[key]) for key, fn in runs}
    seconds = dict.fromkeys(gens, 0.0)
    timed = dict.fromkeys(gens, 0)
    done = dict.fromkeys(gens, 0)
    turn = 0
    while gens:
        keys = list(gens) if turn % 2 == 0 else list(reversed(gens))
        for key in keys:
            s.sync()
            t0 = time.perf_counter()
            try:
                now = next(gens[key])
            except StopIteration:  # (the validation loss, after the last turn: not timed)
                del gens[key]
                continue
            s.sync()
            if done[key] > 0:
                seconds[key] += time.perf_counter() - t0
                timed[key] += now - done[key]
            done[key] = now
        turn += 1
    return {key: (r["losses"], timed[key] * a.batch * a.seq / seconds[key], r["val"])
            for key, r in results.items()}


# ---- the checks before training, the outputs after ----

def stages_take(args, auto: bool, backward_auto: bool = False):
    """None when the forward stage (args.stage) and the backward stage (args.backward_stage)
    take what the model asks beyond the plain case (bf16, grouped-query heads), as their
    descriptors' takes flags
    say (Stage.takes, Stage.backward_takes), else the reason (one line). A stage not built is
    left to course_ready's call, which names what to build."""
    from flashcourse._library import TAKES_BF16, TAKES_GQA  # attention.h's ATTN_TAKES_*
    asks = []
    if args.dtype == "bf16":
        asks.append(("--dtype bf16", "bfloat16 tensors", TAKES_BF16))
    if args.kv_heads != args.heads:
        asks.append((f"--kv-heads {args.kv_heads}", f"grouped-query heads ({args.kv_heads} "
                     f"key/value heads for {args.heads} query heads)", TAKES_GQA))
    built = {st.name: st for st in flashcourse.stages()}
    for flag, what, bit in asks:
        for name, backward in ((args.stage, False), (args.backward_stage, True)):
            st = built.get(name)
            if st is None or (st.backward_takes if backward else st.takes) & bit:
                continue
            which = "backward" if backward else "forward"
            takers = [s.name for s in built.values()
                      if (s.backward_takes if backward else s.takes) & bit]
            how = ""
            if auto and not backward:
                how = (" (--stage auto: stage6_hopper where it runs, a Hopper GPU, else "
                       "stage5_tuned)")
            elif backward_auto and backward:
                how = (" (--backward-stage auto: stage8_hopper_backward where it runs, a Hopper "
                       "GPU, else stage7_backward)")
            return (f"{flag}: {name}{how} does not take {what} in its {which} pass (its "
                    f"descriptor's takes flags); the built stages that do: "
                    f"{', '.join(takers) or 'none'}; or leave {flag} out")
    return None


def course_ready(args, auto: bool, backward_auto: bool = False):
    """None when the course's forward and backward stages train this model here, else
    the reason (one line): what their descriptors say they take, then a tiny forward and
    backward through the drop-in at the training's heads, key/value heads, length and dtype."""
    try:
        why = stages_take(args, auto, backward_auto)
        if why:
            return why
        dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
        q, k, v = (torch.randn((1, h, args.seq, args.dim), device="cuda", dtype=dtype,
                               requires_grad=True)
                   for h in (args.heads, args.kv_heads, args.kv_heads))
        gqa = {"enable_gqa": True} if args.kv_heads != args.heads else {}
        o = course_sdpa(args.stage, args.backward_stage)(q, k, v, is_causal=True, **gqa)
        o.float().sum().backward()
        torch.cuda.synchronize()
    except flashcourse.LibraryNotBuiltError as e:
        return str(e)
    except (ImportError, TypeError, ValueError, RuntimeError) as e:
        return f"the course's attention cannot train here ({args.stage} forward, " \
               f"{args.backward_stage} backward, {args.dtype}): {e}"
    return None


def sdpa_takes_gqa() -> bool:
    """Whether F.scaled_dot_product_attention takes enable_gqa (torch 2.5 and later)."""
    try:
        q, kv = torch.zeros(1, 2, 1, 8), torch.zeros(1, 1, 1, 8)
        F.scaled_dot_product_attention(q, kv, kv, enable_gqa=True)
    except (TypeError, RuntimeError):
        return False
    return True


def gpu_slug(name: str) -> str:
    """The GPU's folder name under plots/, as plots/plots.mk makes it: 'NVIDIA H200' -> 'h200'."""
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    return slug[len("nvidia-"):] if slug.startswith("nvidia-") else slug


def write_csv(path: Path, meta, course_losses, sdpa_losses):
    with open(path, "w") as f:
        for key, text in meta:
            f.write(f"# {key}: {text}\n")
        f.write("step,loss_course,loss_sdpa\n")
        for i, (lc, ls) in enumerate(zip(course_losses, sdpa_losses)):
            f.write(f"{i + 1},{lc:.5f},{ls:.5f}\n")


def draw(csv: Path, out: Path) -> str:
    """Run train_gpt.gp (beside this script) on the CSV; what happened, in words."""
    script = Path(__file__).resolve().with_name("train_gpt.gp")
    gnuplot = shutil.which("gnuplot")
    if gnuplot is None:
        return "plot skipped: gnuplot not found (apt-get install -y gnuplot-nox)"
    if not script.is_file():
        return f"plot skipped: {script} not found"
    quoted = [str(p) for p in (csv, out, REPO / "plots")]  # plots/style.gpi
    if any("'" in p for p in quoted):
        return "plot skipped: a path with a quote (') in it"
    r = subprocess.run([gnuplot, "-e", "csv='%s'; outdir='%s'; plotsdir='%s'" % tuple(quoted),
                        str(script)], capture_output=True, text=True)
    if r.returncode != 0 or not (out / "train_gpt.png").is_file():
        return f"plot failed (gnuplot {script.name}): {r.stderr.strip()[-300:]}"
    return f"plot: {out / 'train_gpt.png'}"


# ---- the program ----

def model_options(ap, defaults=DEFAULTS, small=SMALL):
    """The options of the model and its training, on the parser ap, with their help naming
    `defaults` and --small's `small` (train_gpt_cp.py takes them too, with its own); model_args()
    completes and checks them after parsing."""
    d, sm = defaults, small

    def default(flag):
        small = f"; --small: {sm[flag]:g}" if sm[flag] != d[flag] else ""
        return f"(default {d[flag]:g}{small})"

    def opt(flag, typ, what):
        ap.add_argument(f"--{flag}", type=typ, default=None, help=f"{what} {default(flag)}")

    opt("steps", int, "training steps of each run")
    opt("layers", int, "transformer blocks")
    ap.add_argument("--heads", type=int, default=None,
                    help=f"attention heads (default {d['width']} / D: {d['width'] // 64} at "
                         f"D = 64; --small: {sm['width']} / D)")
    ap.add_argument("--kv-heads", type=int, default=None, metavar="H_KV",
                    help="key/value heads, dividing --heads; fewer is grouped-query attention: "
                         "k, v projected to H_KV heads, both functions called with "
                         "enable_gqa=True (the course's stages that take it: stage 5's and 6's "
                         "forward, stage 7's and 8's backward) (default: --heads)")
    ap.add_argument("--dim", type=int, default=None, metavar="D",
                    help=f"head dimension D, a multiple of 8 from 32 to 256 {default('dim')}")
    ap.add_argument("--dtype", default="f16", choices=("f16", "bf16"),
                    help="autocast and attention type: f16 (float16, with a gradient scaler) "
                         "or bf16 (bfloat16, no scaler; the course's stages that take it: "
                         "stage 5's and 6's forward, stage 7's and 8's backward; sm_80 and newer) "
                         "(default f16)")
    opt("seq", int, "sequence length N (characters per window)")
    opt("batch", int, "sequences per step")
    opt("lr", float, "peak learning rate of AdamW, reached after a warm-up, then a cosine "
                      "down to a tenth")
    ap.add_argument("--stage", default="auto",
                    help="the course's forward stage (default auto: stage6_hopper on a Hopper "
                         "GPU, else stage5_tuned); printed as resolved")
    ap.add_argument("--backward-stage", default="auto",
                    help="the course's backward stage (default auto: stage8_hopper_backward on "
                         "a Hopper GPU, else stage7_backward); printed as resolved")
    ap.add_argument("--small", action="store_true",
                    help="smaller defaults, for a T4: a couple of minutes for both runs")


def model_args(ap, args, defaults=DEFAULTS, small=SMALL):
    """args (parsed with model_options' options) completed from `defaults` (or `small` with
    --small) and checked: ap.error (exit 2) on a bad one."""
    base = small if args.small else defaults
    for key, value in base.items():
        if key != "width" and getattr(args, key) is None:
            setattr(args, key, value)
    if args.dim % 8 or not 32 <= args.dim <= 256:
        ap.error(f"--dim must be a multiple of 8 from 32 to 256 (the stages' head dims), got "
                 f"{args.dim}")
    if args.heads is None:
        args.heads = max(1, base["width"] // args.dim)
    if args.kv_heads is None:
        args.kv_heads = args.heads
    for key in ("steps", "layers", "heads", "kv_heads", "seq", "batch"):
        if getattr(args, key) < 1:
            ap.error(f"--{key.replace('_', '-')} must be at least 1, got {getattr(args, key)}")
    if args.heads % args.kv_heads:
        ap.error(f"--kv-heads must divide --heads (each key/value head serves the same number "
                 f"of query heads): {args.kv_heads} does not divide {args.heads}")
    if args.steps < 10:
        ap.error(f"--steps must be at least 10 (the first steps are left out of the timing), "
                 f"got {args.steps}")
    if args.seq < 2:
        ap.error(f"--seq must be at least 2, got {args.seq}")
    if not (args.lr > 0 and math.isfinite(args.lr)):
        ap.error(f"--lr must be a positive number, got {args.lr}")
    return args


def parse_args():
    ap = argparse.ArgumentParser(
        description="Train a small character-level GPT twice, with the course's attention "
                    "(flashcourse.scaled_dot_product_attention: a forward stage + a backward "
                    "stage) and with PyTorch's F.scaled_dot_product_attention, called the "
                    "same way, and compare the two.",
        epilog="Defaults suit an H100 or H200 (about a minute for both runs); --small a T4. "
               "Exit 0: the validation losses agree; 1: they do not; 2: something is missing.")
    model_options(ap)
    ap.add_argument("--bound", action="store_true",
                    help="a third run, in turns with the two, whose attention is o = q: the "
                         "most any attention could give this model, and each run's attention "
                         "time a step (its step time less the third run's), printed")
    ap.add_argument("--out", type=Path, default=None,
                    help="folder for train_gpt.csv and train_gpt.png (default plots/<gpu>/, "
                         "as `make bench` names it)")
    # Hidden, for checking this script where the stage libraries are not built (on a CPU too):
    # both runs use SDPA, so they must agree exactly; nothing is said about the course.
    ap.add_argument("--sdpa-only", action="store_true", help=argparse.SUPPRESS)
    return model_args(ap, ap.parse_args())


def main() -> int:
    args = parse_args()  # argparse: exit 2 on a bad option
    if flashcourse is None:
        return fail(f"needs the course's Python package (python/flashcourse beside this "
                    f"example, or pip install ./python): {FLASHCOURSE_ERROR}")
    if torch is None:
        return fail(f"needs PyTorch (pip install torch): {TORCH_ERROR}")
    cuda = torch.cuda.is_available()
    if not cuda and not args.sdpa_only:
        return fail("needs a CUDA GPU: torch.cuda.is_available() is False "
                    f"(torch {torch.__version__})")
    device = torch.device("cuda" if cuda else "cpu")
    gqa = args.kv_heads != args.heads
    if gqa and not sdpa_takes_gqa():
        return fail(f"--kv-heads {args.kv_heads}: F.scaled_dot_product_attention takes no "
                    f"enable_gqa in torch {torch.__version__} (torch 2.5 and later do)")
    if cuda:
        if not args.sdpa_only:
            auto = args.stage == "auto"
            backward_auto = args.backward_stage == "auto"
            # the drop-in's own choices, named: what runs is what is printed
            try:
                if auto:
                    args.stage = flashcourse.auto_stage()
                if backward_auto:
                    args.backward_stage = flashcourse.auto_backward_stage()
            except (ImportError, RuntimeError) as e:
                return fail(f"the course's attention cannot train here: {e}")
            why = course_ready(args, auto, backward_auto)
            if why:
                return fail(why)
        gpu = torch.cuda.get_device_name()
    else:
        gpu = "CPU"

    # The text, as character ids; the vocabulary is every character of the course.
    train_ids, val_ids, vocab, nfiles = char_ids(REPO)
    if len(train_ids) <= args.seq + 1 or len(val_ids) <= args.seq + 1:
        return fail(f"the course's text ({len(train_ids)} characters to train on, "
                    f"{len(val_ids)} held out, from {nfiles} files under {REPO}) is too short "
                    f"for --seq {args.seq}")

    out = args.out
    if out is None:
        out = REPO / ("build/train_gpt" if args.sdpa_only else f"plots/{gpu_slug(gpu)}")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        return fail(f"cannot make the folder --out {out}: {e}")

    s = Setup(args, device, train_ids, val_ids, vocab)
    width = args.heads * args.dim
    params = sum(p.numel() for p in s.init_state.values()) - s.init_state["head.weight"].numel()
    course_name = "SDPA (--sdpa-only)" if args.sdpa_only else \
        f"{args.stage} forward + {args.backward_stage} backward"
    # the type the model computes in: --dtype's autocast (float32 on the CPU without bf16)
    dtype_name = {torch.float16: "fp16", torch.bfloat16: "bf16", None: "float32"}[s.amp_dtype]
    model_words = (f"{args.layers} layer{'s' * (args.layers > 1)}, {args.heads} "
                   f"head{'s' * (args.heads > 1)} x {args.dim} (width {width}), "
                   f"{args.kv_heads} key/value head{'s' * (args.kv_heads > 1)}, "
                   f"{params / 1e6:.1f}M parameters, {dtype_name}; {args.steps} steps of "
                   f"{args.batch} x {args.seq} characters, lr {args.lr:g}")
    amp_words = {"fp16": "fp16 autocast with a gradient scaler", "bf16": "bf16 autocast",
                 "float32": "float32"}[dtype_name]
    say(f"train_gpt.py on {gpu} (torch {torch.__version__}, {amp_words}"
        f"{'' if cuda else ' on the CPU'}, seed {SEED})")
    say(f"text: {nfiles} files of the course, {len(train_ids):,} characters to train on, "
        f"{len(val_ids):,} held out (the last {HELD_OUT:.0%} of each), {vocab} symbols")
    say(f"model: {model_words}")

    # One call in the model, two functions: the drop-in and SDPA itself (SDPA twice with
    # --sdpa-only, the check of this script without the course).
    call = f"(q, k, v, is_causal=True{', enable_gqa=True' if gqa else ''})"
    sdpa = F.scaled_dot_product_attention
    if args.sdpa_only:
        course = (f"F.scaled_dot_product_attention{call} in the course's place (--sdpa-only)",
                  sdpa)
    else:
        course = (f"flashcourse.scaled_dot_product_attention{call}: {course_name}",
                  course_sdpa(args.stage, args.backward_stage))
    runs = (("course", *course), ("sdpa", f"F.scaled_dot_product_attention{call}", sdpa))
    if args.bound:
        runs += (("none", "o = q, no attention (--bound)", no_attention),)
    for key, words, _ in runs:
        say(f"{key}: {words}")
    if not args.sdpa_only:  # the C++ eager operator or the Python path (its host time a call)
        say(f"course's calls run by: {flashcourse.eager_path()}")
    how_many = ("two", "three")[len(runs) - 2]
    say(f"the {how_many} runs take turns, {chunk_steps(args.steps)} steps each")
    try:
        results = train_both(s, [(key, fn) for key, _, fn in runs])
    except torch.cuda.OutOfMemoryError:
        return fail("out of GPU memory (the two models train side by side): try a smaller "
                    "--batch or --seq", code=1)

    # The summary: throughput, the mean of the last steps' losses, the validation loss.
    last = max(1, min(50, args.steps // 10))
    (lc, tc, vc), (ls, ts, vs) = results["course"], results["sdpa"]
    fc, fs = sum(lc[-last:]) / last, sum(ls[-last:]) / last
    say(f"{'':34s} {'course':>12s} {'sdpa':>12s} {'course vs sdpa':>15s}")
    say(f"{'tokens per second':34s} {tc:12,.0f} {ts:12,.0f} {tc / ts:14.2f}x")
    say(f"{f'final loss (mean of last {last} steps)':34s} {fc:12.4f} {fs:12.4f} {fc - fs:+15.4f}")
    say(f"{'validation loss':34s} {vc:12.4f} {vs:12.4f} {vc - vs:+15.4f}")
    bound = None
    if args.bound:  # step time = the rest + attention: the unattended run's time is the rest
        tn = results["none"][1]
        ms = {key: args.batch * args.seq / tps * 1e3 for key, tps in
              (("course", tc), ("sdpa", ts), ("none", tn))}
        bound = (f"without attention (o = q) {tn:,.0f} tokens/s, {tn / ts:.3f}x SDPA's: the "
                 f"most any attention gives this model; attention a step: course "
                 f"{ms['course'] - ms['none']:.3f} ms, SDPA {ms['sdpa'] - ms['none']:.3f} ms "
                 f"of {ms['sdpa']:.3f}")
        say(f"--bound: {bound}")

    def caption(words, tps, final, val):
        return (f"{words}: {tps:,.0f} tokens/s, final loss {final:.4f}, "
                f"validation {val:.4f}")
    csv = out / "train_gpt.csv"
    write_csv(csv, [("gpu", gpu), ("model", model_words),
                    ("course", caption(course_name, tc, fc, vc)),
                    ("sdpa", caption("PyTorch SDPA", ts, fs, vs))]
              + ([("bound", bound)] if bound else []), lc, ls)
    say(f"losses: {csv}")
    say(draw(csv, out))

    finite = all(math.isfinite(x) for x in (fc, fs, vc, vs))
    if not finite or abs(vc - vs) > AGREE:
        return fail(f"the validation losses differ by {vc - vs:+.4f} (more than {AGREE}): "
                    "the two attentions did not train alike", code=1)
    say(f"the two runs agree: validation losses within {abs(vc - vs):.4f} (<= {AGREE})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
