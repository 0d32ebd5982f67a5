#!/usr/bin/env python3
"""Generate text with the small GPT of train_gpt.py from a paged KV cache: the course's prefill and
decode (stage 9) beside the same loop on PyTorch's SDPA.

    make lib
    PYTHONPATH=python python3 python/examples/generate.py                 # a few seconds on an H200
    PYTHONPATH=python python3 python/examples/generate.py --kv-heads 2 --dtype bf16 --batch 16

The model is train_gpt.py's GPT (imported, not copied): character-level, its vocabulary every
character of the course's text. Its weights: --train-steps steps of training on the course's text
with PyTorch's SDPA first (default 300, a few seconds on an H100 or H200; 0: the random weights
of its initialisation, whose greedy text just repeats a character), or --checkpoint FILE (loaded
when it exists, else written after training: the next run skips it). The prompts are --batch
windows of --prompt-len characters from the course's held-out text (or --prompt TEXT for every
sequence); each sequence gets --new-tokens characters, greedy (argmax), twice from the same
weights:

  course   the prompt through flashcourse.flash_attn_func(q, k, v, causal=True) (--stage: stage 6
           on Hopper, else stage 5), its keys and values written into a paged cache: per layer
           k_cache, v_cache [num_pages, page_size, H_kv, D], sequence b's key t in row
           t % page_size of page block_table[b, t // page_size], the pages of all sequences
           shuffled through one pool (as a server's allocator leaves them). Then each new token
           through flashcourse.flash_attn_with_kvcache(q, k_cache, v_cache, k=k_new, v=v_new,
           cache_seqlens=lengths, block_table=table, causal=True) (stage9_decode), which writes
           the token's key and value into its page itself; lengths [B] int32 stays on the GPU,
           advanced there by the loop (nothing in the loop waits for the GPU).
  sdpa     PyTorch only: the prompt through F.scaled_dot_product_attention(is_causal=True), a
           contiguous cache [B, H_kv, N_max, D] per layer, each new token's key and value
           written at position L, then SDPA of the one query over cache[:, :, :L + 1]
           (enable_gqa=True with --kv-heads).

Printed: the model and where its weights came from, the cache's pages, each loop's prefill time
and decode tokens per second (wall time between torch.cuda.synchronize() calls, after a warm-up
run of each; the median of --repeats runs), the largest logit difference of the two at the first
generated token and the first decode step, how many greedy tokens agree (fp16 and bf16 round
differently in the two attentions: a near tie can flip, after which the sequences go apart; the
first position where they differ is printed), and the prompts and generated text of the first
sequences. --cuda-graph replays the course's decode step as one CUDA graph (its lengths live on
the device, so one capture serves every token); SDPA's loop stays eager (its keys,
cache[:, :, :L + 1], change shape every token).

Without PyTorch, without a CUDA GPU or without the stage libraries (`make lib`): one line saying
so, exit 0. Exit 1 when a logit is not finite; 2 for a bad option.
"""

import argparse
import math
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import train_gpt  # noqa: E402  (the model, the text; flashcourse and, where it is, torch)
from train_gpt import REPO, flashcourse, torch  # noqa: E402

if torch is not None:
    import torch.nn.functional as F

SEED = 0
TRAIN_BATCH = 32  # windows per training step
TRAIN_LR = 2e-3
MIN_CONTEXT = 256  # the model's position table: at least this, at least prompt + new tokens


def say(msg: str = "") -> None:
    print(msg, flush=True)


def skip(msg: str) -> int:
    """The one line of a run that cannot happen here (exit 0: nothing is wrong)."""
    say(f"generate.py: {msg}")
    return 0


# ---- the paged cache: pure PyTorch helpers (tested on the CPU) ----

def allocate_block_table(batch: int, capacity: int, page_size: int, generator=None):
    """A block table for `batch` sequences of up to `capacity` keys: (table int32 [batch,
    max_pages], num_pages). Every page of the pool belongs to one sequence; the pool is shuffled,
    so a sequence's pages are scattered through it as a server's allocator leaves them after
    requests have come and gone (a kernel that ignored the table would read other sequences')."""
    if batch < 1 or capacity < 1 or page_size < 1:
        raise ValueError(f"batch, capacity and page_size must be at least 1, got {batch}, "
                         f"{capacity}, {page_size}")
    max_pages = -(-capacity // page_size)
    num_pages = batch * max_pages
    order = torch.randperm(num_pages, generator=generator)
    return order.view(batch, max_pages).to(torch.int32), num_pages


def page_slots(table, positions, page_size: int):
    """(page, row) long tensors [B, n] of the keys at `positions` [B, n] (or [1, n]) of each
    sequence: key t of sequence b is row t % page_size of page table[b, t // page_size]."""
    positions = positions.expand(table.shape[0], positions.shape[-1])
    page = table.long().gather(1, torch.div(positions, page_size, rounding_mode="floor"))
    return page, positions % page_size


def new_slots(table, n: int, start, page_size: int):
    """page_slots of positions start .. start + n - 1 of each sequence; start an int or a tensor
    [B] (each sequence its own)."""
    t = torch.arange(n, device=table.device)[None, :]
    t = t + (start if isinstance(start, int) else start.to(table.device).long()[:, None])
    return page_slots(table, t, page_size)


def write_pages(cache, table, new, start):
    """Writes new [B, n, H_kv, D] into the paged cache [num_pages, page_size, H_kv, D] at
    positions start .. start + n - 1 of each sequence; start an int or a tensor [B] (each
    sequence its own)."""
    page, row = new_slots(table, new.shape[1], start, cache.shape[1])
    cache[page, row] = new


def gather_pages(cache, table, length: int):
    """The first `length` keys of every sequence from the paged cache: [B, length, H_kv, D]."""
    t = torch.arange(length, device=cache.device)[None, :]
    page, row = page_slots(table, t, cache.shape[1])
    return cache[page, row]


def expand_kv(t, heads: int):
    """[B, H_kv, N, D] -> [B, heads, N, D]: key/value head h // (heads / H_kv) for query head h."""
    return t if t.shape[1] == heads else t.repeat_interleave(heads // t.shape[1], dim=1)


def kvcache_attention_torch(q, k_cache, v_cache, k, v, cache_seqlens, block_table, causal=True):
    """What flashcourse.flash_attn_with_kvcache computes over a paged cache, in plain PyTorch (the
    check of this script where there is no GPU): k, v [B, N_new, H_kv, D] written into the pages
    at cache_seqlens, then q [B, N_q, H, D] attends over each sequence's cache_seqlens + N_new
    keys, causal aligned to the bottom right. Reads the longest length back to the host: a
    reference, not a decode kernel."""
    B, n_q, H, D = q.shape
    n_new = 0 if k is None else k.shape[1]
    if k is not None:
        write_pages(k_cache, block_table, k, cache_seqlens)
        write_pages(v_cache, block_table, v, cache_seqlens)
    lens = cache_seqlens.long() + n_new  # [B]
    L = int(lens.max())
    keys, values = (gather_pages(c, block_table, L).transpose(1, 2) for c in (k_cache, v_cache))
    j = torch.arange(L, device=q.device)[None, None, :]
    mask = j < lens[:, None, None]  # [B, 1, L]
    if causal:
        i = torch.arange(n_q, device=q.device)[None, :, None]
        mask = mask & (j <= i + lens[:, None, None] - n_q)  # [B, N_q, L]
    o = F.scaled_dot_product_attention(q.transpose(1, 2), expand_kv(keys, H),
                                       expand_kv(values, H), attn_mask=mask[:, None])
    return o.transpose(1, 2)


# ---- the two caches, each the attention of every layer of the model ----

class PagedCache:
    """The course's loop: per layer a paged k_cache, v_cache [num_pages, page_size, H_kv, D]; one
    block table and one lengths tensor [B] int32 on the device for all layers. `emulate`: the
    course's two calls replaced by PyTorch (SDPA for the prompt, kvcache_attention_torch for a
    token), for checking the loop on a CPU."""

    def __init__(self, layers, batch, capacity, page_size, kv_heads, head_dim, dtype, device,
                 stage, emulate=False):
        g = torch.Generator().manual_seed(SEED + 2)
        table, self.num_pages = allocate_block_table(batch, capacity, page_size, g)
        self.table = table.to(device)
        shape = (self.num_pages, page_size, kv_heads, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.lengths = torch.zeros(batch, dtype=torch.int32, device=device)
        self.stage, self.emulate, self.decoding = stage, emulate, False
        self.slots = None  # the prompt's (page, row): made by the first layer, used by all

    def reset(self):
        self.lengths.zero_()
        self.decoding, self.slots = False, None

    def positions(self, n: int):
        """The positions of the next n tokens of each sequence: [B, n] long on the device."""
        return self.lengths.long()[:, None] + torch.arange(n, device=self.lengths.device)

    def attend(self, layer: int, q, k, v):
        """q [B, H, n, D], k, v [B, H_kv, n, D] (the model's layout) -> o [B, H, n, D]."""
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [B, n, heads, D] views: flash-attn's
        if not self.decoding:  # the prompt: the course's forward, its keys into the pages
            if self.emulate:
                H = q.shape[2]
                o = F.scaled_dot_product_attention(q.transpose(1, 2),
                                                   expand_kv(k.transpose(1, 2), H),
                                                   expand_kv(v.transpose(1, 2), H),
                                                   is_causal=True).transpose(1, 2)
            else:
                o = flashcourse.flash_attn_func(q, k, v, causal=True, stage=self.stage)
            if self.slots is None:  # every layer's keys go to the same places: found once
                self.slots = new_slots(self.table, k.shape[1], self.lengths, self.k[0].shape[1])
            self.k[layer][self.slots] = k
            self.v[layer][self.slots] = v
        elif self.emulate:
            o = kvcache_attention_torch(q, self.k[layer], self.v[layer], k, v, self.lengths,
                                        self.table, causal=True)
        else:  # a token: stage 9 appends its key and value and attends over the pages
            o = flashcourse.flash_attn_with_kvcache(q, self.k[layer], self.v[layer], k=k, v=v,
                                                    cache_seqlens=self.lengths,
                                                    block_table=self.table, causal=True)
        return o.transpose(1, 2)

    def advance(self, n: int):
        self.lengths += n  # on the device: no wait for the GPU
        self.decoding, self.slots = True, None


class ContiguousCache:
    """The PyTorch loop: per layer k, v [B, H_kv, N_max, D] (SDPA's layout), every sequence the
    same length L, known on the host (the prompts have one length)."""

    def __init__(self, layers, batch, capacity, kv_heads, head_dim, dtype, device, gqa: bool):
        shape = (batch, kv_heads, capacity, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.gqa = gqa  # F.scaled_dot_product_attention takes enable_gqa (torch 2.5 and later)
        self.length, self.batch, self.device = 0, batch, device

    def reset(self):
        self.length = 0

    def positions(self, n: int):
        return torch.arange(self.length, self.length + n, device=self.device)[None, :]

    def sdpa(self, q, k, v, causal: bool):
        H = q.shape[1]
        if k.shape[1] == H:
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        if self.gqa:
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
        return F.scaled_dot_product_attention(q, expand_kv(k, H), expand_kv(v, H),
                                              is_causal=causal)

    def attend(self, layer: int, q, k, v):
        L, n = self.length, q.shape[2]
        self.k[layer][:, :, L:L + n] = k
        self.v[layer][:, :, L:L + n] = v
        if L == 0:  # the prompt
            return self.sdpa(q, k, v, causal=True)
        # one new token: its query sees every key so far, its own included (n = 1: no mask)
        return self.sdpa(q, self.k[layer][:, :, :L + n], self.v[layer][:, :, :L + n],
                         causal=False)

    def advance(self, n: int):
        self.length += n


class LayerAttention:
    """What the model's CausalSelfAttention calls in place of SDPA (its `sdpa` attribute):
    the same call, o = sdpa(q, k, v, is_causal=True, enable_gqa=...), routed to a cache."""

    def __init__(self, cache, layer: int):
        self.cache, self.layer = cache, layer

    def __call__(self, q, k, v, is_causal=True, enable_gqa=False):
        return self.cache.attend(self.layer, q, k, v)


def use_cache(model, cache):
    """Routes every layer's attention to `cache` (None: back to F.scaled_dot_product_attention,
    the model as train_gpt.py made it)."""
    for i, block in enumerate(model.blocks):
        block.attn.sdpa = F.scaled_dot_product_attention if cache is None else \
            LayerAttention(cache, i)


def last_logits(model, ids, positions):
    """GPT.forward at the given positions (the next ones of each sequence, not 0 .. n - 1), the
    logits of the last: [B, vocab]. The blocks are the model's own; their attention is the
    cache's (use_cache)."""
    x = model.tok(ids) + model.pos(positions)
    for block in model.blocks:
        x = block(x)
    return model.head(model.norm(x[:, -1]))


def generate(model, cache, prompts, new_tokens: int, sync, graph=None):
    """Greedy generation: the prompts [B, P] through the model (filling the cache), then
    new_tokens - 1 decode steps. Returns (tokens [B, new_tokens], prefill seconds, decode
    seconds, logits of the first token, logits of the first decode step)."""
    B, P = prompts.shape
    cache.reset()
    out = torch.empty((B, new_tokens), dtype=torch.long, device=prompts.device)
    sync()
    t0 = time.perf_counter()
    logits0 = last_logits(model, prompts, cache.positions(P))
    cache.advance(P)
    ids = logits0.argmax(-1)
    out[:, 0] = ids
    sync()
    t1 = time.perf_counter()
    logits1 = None
    if graph is not None:  # the decode step as one CUDA graph: static ids in, next ids out
        graph.ids.copy_(ids[:, None])
        for i in range(1, new_tokens):
            graph.replay()
            out[:, i] = graph.ids[:, 0]
            if i == 1:
                logits1 = graph.logits.clone()
    else:
        for i in range(1, new_tokens):
            logits = last_logits(model, ids[:, None], cache.positions(1))
            cache.advance(1)
            ids = logits.argmax(-1)
            out[:, i] = ids
            if i == 1:
                logits1 = logits
    sync()
    t2 = time.perf_counter()
    return out, t1 - t0, t2 - t1, logits0, logits1


class DecodeGraph:
    """The course's decode step captured as one CUDA graph: the model on `ids` at the cache's
    lengths, flash_attn_with_kvcache appending and attending, lengths += 1, the argmax written
    back into `ids`. One capture serves every token: what changes (the lengths, the pages'
    contents) lives on the device."""

    def __init__(self, model, cache, batch: int, prompt_len: int):
        self.ids = torch.zeros((batch, 1), dtype=torch.long, device="cuda")
        saved = cache.lengths.clone()
        cache.lengths.fill_(prompt_len)  # the warm-up's keys land where the real steps' will
        cache.decoding = True
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up off the capture (plans made, workspaces sized)
            for _ in range(3):
                self._step(model, cache)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self._step(model, cache)
        cache.lengths.copy_(saved)  # the warm-up's tokens are written again by the real steps

    def _step(self, model, cache):
        self.logits = last_logits(model, self.ids, cache.positions(1))
        cache.lengths += 1
        self.ids.copy_(self.logits.argmax(-1)[:, None])

    def replay(self):
        self.graph.replay()


# ---- the model's weights ----

def train(model, ids, steps: int, context: int, amp_dtype, device):
    """`steps` steps of AdamW on windows of the course's text, with PyTorch's SDPA (the model as
    train_gpt.py trains it, in short: warm-up and cosine of train_gpt.learning_rate, gradient
    clipping, a scaler for fp16). Returns the mean loss of the last steps."""
    model.train()
    g = torch.Generator().manual_seed(SEED + 1)
    starts = torch.randint(0, len(ids) - context - 1, (steps, TRAIN_BATCH), generator=g)
    ids, offsets = ids.to(device), torch.arange(context + 1, device=device)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": rest, "weight_decay": 0.0}], lr=TRAIN_LR,
                            betas=(0.9, 0.95))
    scaler = torch.amp.GradScaler(device.type, enabled=amp_dtype == torch.float16)
    losses = torch.zeros(steps, device=device)
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = train_gpt.learning_rate(step, steps, TRAIN_LR)
        w = ids[starts[step].to(device)[:, None] + offsets]
        with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
            logits = model(w[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), w[:, 1:].reshape(-1))
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        losses[step] = loss.detach()
    model.eval()
    last = max(1, min(50, steps // 10))
    return losses[-last:].mean().item()


def new_model(cfg, vocab: int, attn_dtype, device):
    torch.manual_seed(SEED)
    return train_gpt.GPT(vocab, cfg["context"], cfg["layers"], cfg["heads"], cfg["kv_heads"],
                         cfg["dim"], F.scaled_dot_product_attention, attn_dtype).to(device)


def model_and_vocab(args, device, dtype):
    """(model in `dtype`, eval mode; the vocabulary (a string, character i = token i); the
    held-out text; words saying where the weights came from)."""
    train_text, held_text, nfiles = train_gpt.load_text(REPO)
    cfg = dict(layers=args.layers, heads=args.heads, kv_heads=args.kv_heads, dim=args.dim,
               context=max(MIN_CONTEXT, args.prompt_len + args.new_tokens))
    amp_dtype = dtype if device.type == "cuda" else None  # the CPU check trains in float32
    ckpt = args.checkpoint
    if ckpt is not None and ckpt.is_file():
        saved = torch.load(ckpt, map_location="cpu", weights_only=True)
        chars, cfg = saved["chars"], dict(saved["config"])
        if cfg["context"] < args.prompt_len + args.new_tokens - 1:
            raise ValueError(f"--checkpoint {ckpt}: its model has {cfg['context']} positions, "
                             f"fewer than --prompt-len + --new-tokens - 1 = "
                             f"{args.prompt_len + args.new_tokens - 1}")
        model = new_model(cfg, len(chars), dtype, device)
        model.load_state_dict(saved["state"])
        words = f"loaded from {ckpt} (its shape, not the command line's)"
    else:
        chars = "".join(sorted(set(train_text + held_text)))
        model = new_model(cfg, len(chars), amp_dtype or torch.float32, device)
        if args.train_steps:
            index = {c: i for i, c in enumerate(chars)}
            ids = torch.tensor([index[c] for c in train_text], dtype=torch.long)
            t0 = time.perf_counter()
            loss = train(model, ids, args.train_steps, cfg["context"], amp_dtype, device)
            words = (f"trained here with PyTorch's SDPA: {args.train_steps} steps of "
                     f"{TRAIN_BATCH} x {cfg['context']} characters of the course "
                     f"({nfiles} files), final loss {loss:.3f}, {time.perf_counter() - t0:.1f} s")
        else:
            words = "random (GPT-2's initialisation, seed 0; --train-steps 0): expect a repeated " \
                    "character"
        if ckpt is not None:
            ckpt.parent.mkdir(parents=True, exist_ok=True)
            torch.save({"config": cfg, "chars": chars,
                        "state": {k: t.detach().cpu() for k, t in model.state_dict().items()}},
                       ckpt)
            words += f"; saved to {ckpt}"
    model = model.to(dtype).eval()
    for block in model.blocks:
        block.attn.attn_dtype = dtype
    return model, chars, held_text, cfg, words


def make_prompts(args, chars: str, held_text: str):
    """[B, P] token ids: --prompt for every sequence, else B windows of the held-out text spread
    evenly through it, each at the start of a line that starts with a letter."""
    index = {c: i for i, c in enumerate(chars)}
    if args.prompt is not None:
        texts = [args.prompt] * args.batch
    else:
        P, texts = args.prompt_len, []
        for b in range(args.batch):
            at = (b * (len(held_text) - P)) // args.batch
            line = re.compile(r"\n(?=[A-Za-z])").search(held_text, at, len(held_text) - P)
            at = line.end() if line else at  # a line that starts with a word
            texts.append(held_text[at:at + P])
    missing = sorted({c for t in texts for c in t if c not in index})
    if missing:
        raise ValueError(f"--prompt has characters outside the model's vocabulary: {missing!r}")
    return torch.tensor([[index[c] for c in t] for t in texts], dtype=torch.long), texts


# ---- the program ----

def parse_args(argv=None):
    ap = argparse.ArgumentParser(
        description="Greedy generation with the small GPT of train_gpt.py from a paged KV cache: "
                    "the prompt through flashcourse.flash_attn_func (stage 5 or 6), each new "
                    "token through flashcourse.flash_attn_with_kvcache (stage9_decode), beside "
                    "the same loop on PyTorch's SDPA with a contiguous cache; tokens per second "
                    "of both and whether their greedy tokens agree.",
        epilog="Without PyTorch, a CUDA GPU or the stage libraries (make lib): one line, exit 0.")
    ap.add_argument("--batch", type=int, default=8, help="sequences generated together (default 8)")
    ap.add_argument("--prompt-len", type=int, default=48,
                    help="characters of each prompt (default 48)")
    ap.add_argument("--prompt", default=None,
                    help="a prompt for every sequence (default: --batch windows of the course's "
                         "held-out text); its length is the prompt length")
    ap.add_argument("--new-tokens", type=int, default=128,
                    help="characters generated per sequence, the first by the prompt's pass, "
                         "the others by decode steps (default 128)")
    ap.add_argument("--page-size", type=int, default=16,
                    help="keys per page of the paged cache, a power of two (default 16)")
    ap.add_argument("--dtype", default="fp16", choices=("fp16", "bf16"),
                    help="the model's and the caches' type (default fp16; bf16 from sm_80)")
    ap.add_argument("--layers", type=int, default=4, help="transformer blocks (default 4)")
    ap.add_argument("--heads", type=int, default=8, help="query heads (default 8)")
    ap.add_argument("--kv-heads", type=int, default=None, metavar="H_KV",
                    help="key/value heads, dividing --heads; fewer is grouped-query attention "
                         "(default: --heads)")
    ap.add_argument("--dim", type=int, default=64, choices=(64, 128),
                    help="head dimension (default 64)")
    ap.add_argument("--train-steps", type=int, default=300,
                    help="training steps with PyTorch's SDPA before generating (default 300; 0: "
                         "random weights)")
    ap.add_argument("--checkpoint", type=Path, default=None, metavar="FILE",
                    help="the model's weights: loaded when FILE exists (its shape wins over the "
                         "options), else written after training")
    ap.add_argument("--stage", default="auto",
                    help="the course's forward stage for the prompt (default auto: stage6_hopper "
                         "on a Hopper GPU, else stage5_tuned)")
    ap.add_argument("--repeats", type=int, default=3,
                    help="timed runs of each loop after the warm-up; the median is printed "
                         "(default 3)")
    ap.add_argument("--cuda-graph", action="store_true",
                    help="replay the course's decode step as one CUDA graph (SDPA's loop stays "
                         "eager: its key count changes every token)")
    ap.add_argument("--show", type=int, default=4,
                    help="sequences whose text is printed (default 4)")
    # Hidden, for checking this script without a GPU: the course's two calls replaced by PyTorch
    # over the same paged cache (SDPA for the prompt, kvcache_attention_torch for a token),
    # float32 on the CPU; the two loops must then give the same tokens.
    ap.add_argument("--emulate", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.prompt is not None:
        args.prompt_len = len(args.prompt)
    if args.kv_heads is None:
        args.kv_heads = args.heads
    for key in ("batch", "prompt_len", "layers", "heads", "kv_heads", "repeats"):
        if getattr(args, key) < 1:
            ap.error(f"--{key.replace('_', '-')} must be at least 1, got {getattr(args, key)}")
    for key in ("train_steps", "show"):
        if getattr(args, key) < 0:
            ap.error(f"--{key.replace('_', '-')} must be at least 0, got {getattr(args, key)}")
    if args.new_tokens < 2:
        ap.error(f"--new-tokens must be at least 2 (one from the prompt, the rest decode "
                 f"steps), got {args.new_tokens}")
    if args.page_size < 1 or args.page_size & (args.page_size - 1):
        ap.error(f"--page-size must be a power of two, got {args.page_size}")
    if args.heads % args.kv_heads:
        ap.error(f"--kv-heads must divide --heads: {args.kv_heads} does not divide {args.heads}")
    return args


def both_loops(args, model, paged, contiguous, prompts, sync):
    """Each loop once as a warm-up, then --repeats timed runs, the loops taking turns (a change
    of the machine's pace falls on both). Returns ({loop: generate()'s result of its last run},
    {loop: [(prefill s, decode s) of every timed run]})."""
    (B, P), N = prompts.shape, args.new_tokens
    runs = {}
    with torch.no_grad():
        graph = None
        for name, cache in (("course", paged), ("sdpa", contiguous)):
            use_cache(model, cache)
            generate(model, cache, prompts, N, sync)  # the warm-up: plans, allocations
            if name == "course" and args.cuda_graph:
                graph = DecodeGraph(model, cache, B, P)
        times = {"course": [], "sdpa": []}
        for _ in range(args.repeats):  # the loops take turns: a change of pace hits both
            for name, cache in (("course", paged), ("sdpa", contiguous)):
                use_cache(model, cache)
                r = generate(model, cache, prompts, N, sync, graph if name == "course" else None)
                times[name].append(r[1:3])
                runs[name] = r
    return runs, times


def first_differences(a, b):
    """Per sequence, the first position where the token rows differ (None: they agree)."""
    diff = (a != b)
    return [int(row.nonzero()[0]) if row.any() else None for row in diff]


def main(argv=None) -> int:
    args = parse_args(argv)
    if flashcourse is None:
        return skip(f"needs the course's Python package (python/flashcourse beside this "
                    f"example): {train_gpt.FLASHCOURSE_ERROR}")
    if torch is None:
        return skip(f"needs PyTorch (pip install torch): {train_gpt.TORCH_ERROR}")
    emulate = args.emulate
    if not emulate:
        try:
            built = {st.name: st for st in flashcourse.stages()}
        except flashcourse.LibraryNotBuiltError as e:
            return skip(f"needs the course's stage libraries: {e}")
        from flashcourse._library import DECODE_STAGE
        if DECODE_STAGE not in built:
            return skip(f"needs {DECODE_STAGE}'s library (make lib), not among the built: "
                        f"{', '.join(sorted(built))}")
        if not torch.cuda.is_available():
            return skip(f"needs a CUDA GPU: torch.cuda.is_available() is False (torch "
                        f"{torch.__version__})")
        try:
            if args.stage == "auto":
                args.stage = flashcourse.auto_stage()
        except (ImportError, RuntimeError) as e:
            return skip(f"the course's forward cannot run here: {e}")
        device = torch.device("cuda")
        dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
        gpu = torch.cuda.get_device_name()
        sync = torch.cuda.synchronize
    else:
        device, dtype, gpu, sync = torch.device("cpu"), torch.float32, "CPU", lambda: None
        args.cuda_graph = False

    try:
        model, chars, held_text, cfg, weights = model_and_vocab(args, device, dtype)
        prompts, texts = make_prompts(args, chars, held_text)
    except (ValueError, KeyError, OSError, RuntimeError) as e:
        say(f"generate.py: {e}")
        return 2
    prompts = prompts.to(device)
    B, P, N = args.batch, args.prompt_len, args.new_tokens
    layers, H, H_kv, D = cfg["layers"], cfg["heads"], cfg["kv_heads"], cfg["dim"]
    capacity = P + N - 1  # the last token is generated, never attended to
    kind = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "float32"}[dtype]
    course_words = ("PyTorch in the course's place (--emulate: SDPA, then "
                    "kvcache_attention_torch over the pages)" if emulate else
                    f"{args.stage} prefill (flash_attn_func), stage9_decode per token "
                    f"(flash_attn_with_kvcache){', one CUDA graph a token' * args.cuda_graph}")
    say(f"generate.py on {gpu} (torch {torch.__version__}, {kind}, seed {SEED})")
    say(f"model: train_gpt.py's GPT, {layers} layers, {H} heads x {D}, {H_kv} key/value "
        f"head{'s' * (H_kv > 1)}, {len(chars)} characters, {cfg['context']} positions; weights "
        f"{weights}")

    gqa = H_kv != H
    paged = PagedCache(layers, B, capacity, args.page_size, H_kv, D, dtype, device, args.stage,
                       emulate)
    contiguous = ContiguousCache(layers, B, capacity, H_kv, D, dtype, device,
                                 gqa and train_gpt.sdpa_takes_gqa())
    page_bytes = args.page_size * H_kv * D * torch.finfo(dtype).bits // 8 * 2 * layers
    say(f"paged cache: {paged.num_pages} pages of {args.page_size} keys ({paged.table.shape[1]} "
        f"a sequence, shuffled through the pool), {paged.num_pages * page_bytes / 2**20:.1f} MiB "
        f"of K and V over {layers} layers")
    say(f"batch {B} x prompt {P} characters, {N} new each (greedy)")
    say(f"course: {course_words}")
    say(f"sdpa:   F.scaled_dot_product_attention, contiguous cache [B, H_kv, N_max, D]"
        f"{', enable_gqa=True' if contiguous.gqa else ', k/v heads repeated' if gqa else ''}")

    try:
        runs, times = both_loops(args, model, paged, contiguous, prompts, sync)
    except (ValueError, TypeError, NotImplementedError) as e:  # a call refused the shapes
        say(f"generate.py: {e}")
        return 2
    finally:
        use_cache(model, None)

    def median(xs):
        xs = sorted(xs)
        return xs[len(xs) // 2] if len(xs) % 2 else (xs[len(xs) // 2 - 1] + xs[len(xs) // 2]) / 2

    say()
    say(f"{'':34s} {'course':>12s} {'sdpa':>12s} {'course speed-up':>16s}")
    pre = {k: median([t[0] for t in v]) for k, v in times.items()}
    dec = {k: B * (N - 1) / median([t[1] for t in v]) for k, v in times.items()}
    say(f"{'prefill, ms (' + str(B * P) + ' tokens)':34s} {pre['course'] * 1e3:12.2f} "
        f"{pre['sdpa'] * 1e3:12.2f} {pre['sdpa'] / pre['course']:15.2f}x")
    say(f"{'decode, tokens per second':34s} {dec['course']:12,.0f} {dec['sdpa']:12,.0f} "
        f"{dec['course'] / dec['sdpa']:15.2f}x")
    e2e = {k: B * N / (pre[k] + B * (N - 1) / dec[k]) for k in pre}
    say(f"{'end to end, tokens per second':34s} {e2e['course']:12,.0f} {e2e['sdpa']:12,.0f} "
        f"{e2e['course'] / e2e['sdpa']:15.2f}x")
    say(f"(median of {args.repeats} run{'s' * (args.repeats > 1)} after a warm-up; "
        f"decode: {B} x {N - 1} tokens)")

    (tc, _, _, c0, c1), (ts, _, _, s0, s1) = runs["course"], runs["sdpa"]
    d0 = (c0.float() - s0.float()).abs().max().item()
    d1 = (c1.float() - s1.float()).abs().max().item()
    say(f"largest logit difference, course vs sdpa: {d0:.4g} at the first token (prefill), "
        f"{d1:.4g} at the first decode step")
    tc, ts = tc.cpu(), ts.cpu()
    same = int((tc == ts).sum())
    firsts = first_differences(tc, ts)
    if all(f is None for f in firsts):
        say(f"greedy tokens: all {B * N} agree")
    else:
        b = min((f, b) for b, f in enumerate(firsts) if f is not None)[1]
        differ = sum(f is not None for f in firsts)
        say(f"greedy tokens: {same} of {B * N} agree; {differ} of {B} sequences differ, the "
            f"earliest at new token {firsts[b]} (from 0) of sequence {b} (the two attentions round "
            f"differently in {kind}: a near tie flips, and the sequences go apart from there)")
    for b in range(min(args.show, B)):
        say(f"\nsequence {b}: prompt {texts[b]!r}")
        course_text = "".join(chars[i] for i in tc[b].tolist())
        say(f"  course: {course_text!r}")
        if firsts[b] is None:
            say("  sdpa:   the same")
        else:
            say(f"  sdpa:   {''.join(chars[i] for i in ts[b].tolist())!r} "
                f"(differs from new token {firsts[b]} on)")
    if not all(math.isfinite(x) for x in (d0, d1)) or \
            not all(torch.isfinite(t.float()).all() for t in (c0, c1, s0, s1)):
        say("generate.py: a logit is not finite")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
