#!/usr/bin/env python3
"""Tests of python/examples/generate.py that run without a GPU or the stage libraries.

    python3 python/tests/test_generate.py

--help names its options; bad options exit 2 with argparse's error; without PyTorch (hidden from
the import here, whether or not it is installed), without the stage libraries (an empty
FLASHCOURSE_LIB_DIR) and without a GPU (fake stage descriptors, where PyTorch is installed): one
line saying so, exit 0. Where PyTorch is installed: the paging helpers on CPU tensors (the block
table's pages, a write then a gather giving back what was written, at per-sequence starts), the
PyTorch stand-in for flash_attn_with_kvcache against attention over a contiguous cache (GQA,
ragged lengths, several new tokens, causal bottom-right), both caches' greedy loops against
generation without a cache (the whole sequence through the model at every step), and the
hidden --emulate run of the script on a tiny model. Ends with "N passed, M failed, K skipped".
"""

import importlib.util
import os
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
GENERATE = os.path.join(ROOT, "python", "examples", "generate.py")
sys.path.insert(0, os.path.join(ROOT, "python"))

from harness import Skip, run, summary  # noqa: E402  (the runner, shared with the other tests)

HAVE_TORCH = importlib.util.find_spec("torch") is not None


def script(args, hide_torch=False, env=None, timeout=300):
    """(exit code, stdout, stderr) of `python3 generate.py args`, PyTorch hidden from its
    imports if hide_torch."""
    if hide_torch:
        code = ("import runpy, sys; sys.modules['torch'] = None; sys.argv = sys.argv[1:]; "
                "runpy.run_path(sys.argv[0], run_name='__main__')")
        cmd = [sys.executable, "-c", code, GENERATE] + args
    else:
        cmd = [sys.executable, GENERATE] + args
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                       env=dict(os.environ, **(env or {})))
    return r.returncode, r.stdout, r.stderr


def load():
    """generate.py as a module (its import needs no torch; with torch its helpers work)."""
    spec = importlib.util.spec_from_file_location("generate", GENERATE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def need_torch():
    if not HAVE_TORCH:
        raise Skip("no PyTorch here (the command line without it is tested above)")
    import torch
    return torch


def t_help():
    rc, out, err = script(["--help"], hide_torch=True)
    assert rc == 0 and out.startswith("usage:"), (rc, out[:200], err)
    words = " ".join(out.split())
    for opt in ("--batch BATCH", "--prompt-len PROMPT_LEN", "--new-tokens NEW_TOKENS",
                "--page-size PAGE_SIZE", "--dtype {fp16,bf16}", "--kv-heads H_KV",
                "--train-steps TRAIN_STEPS", "--checkpoint FILE", "--cuda-graph",
                "flash_attn_with_kvcache", "stage9_decode"):
        assert opt in words, f"--help does not say {opt!r}"
    assert "--emulate" not in out  # the CPU check's switch stays hidden


def t_bad_options():
    bad = {("--page-size", "24"): "--page-size must be a power of two",
           ("--heads", "8", "--kv-heads", "3"): "3 does not divide 8",
           ("--new-tokens", "1"): "--new-tokens must be at least 2",
           ("--batch", "0"): "--batch must be at least 1",
           ("--dtype", "fp32"): "argument --dtype: invalid choice",
           ("--dim", "96"): "argument --dim: invalid choice"}
    for args, want in bad.items():
        rc, out, err = script(list(args), hide_torch=True)
        assert rc == 2, f"{args}: exit {rc}, want 2 (stdout {out!r})"
        assert err.startswith("usage:") and want in err, f"{args}: stderr {err!r}"
        assert not out, f"{args}: stdout {out!r}"


def one_line(rc, out, err, want):
    lines = out.splitlines()
    assert rc == 0 and len(lines) == 1 and want in lines[0], (rc, out, err)
    assert not err, err


def t_no_torch():
    one_line(*script(["--batch", "4"], hide_torch=True), "needs PyTorch")


def t_no_libraries():
    need_torch()
    with tempfile.TemporaryDirectory() as empty:
        one_line(*script([], env={"FLASHCOURSE_LIB_DIR": empty}),
                 "needs the course's stage libraries")


def t_no_gpu():
    torch = need_torch()
    if torch.cuda.is_available():
        raise Skip("a GPU is here: the no-GPU line is for machines without one")
    mod = load()
    fc = mod.flashcourse

    def stage(name, decode=False):
        return fc.Stage(name=name, dtype="float16", variants=("default",), adds="", path="",
                        backward=False, takes=0, backward_takes=0, decode=decode)

    real = fc.stages
    fc.stages = lambda: [stage("stage5_tuned")]
    try:
        import contextlib
        import io
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            rc = mod.main([])
        one_line(rc, out.getvalue(), "", "needs stage9_decode's library")
        fc.stages = lambda: [stage("stage5_tuned"), stage("stage9_decode", decode=True)]
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            rc = mod.main([])
        one_line(rc, out.getvalue(), "", "needs a CUDA GPU")
    finally:
        fc.stages = real


def t_block_table():
    torch = need_torch()
    mod = load()
    g = torch.Generator().manual_seed(1)
    for B, cap, ps in ((4, 100, 16), (1, 1, 16), (8, 64, 16), (5, 300, 128), (3, 7, 1)):
        table, pages = mod.allocate_block_table(B, cap, ps, g)
        max_pages = -(-cap // ps)
        assert table.dtype == torch.int32 and tuple(table.shape) == (B, max_pages), table.shape
        assert pages == B * max_pages and max_pages * ps >= cap
        assert sorted(table.flatten().tolist()) == list(range(pages))  # each page once
    table, _ = mod.allocate_block_table(8, 256, 16, torch.Generator().manual_seed(2))
    assert table.flatten().tolist() != list(range(table.numel())), "the pool is not shuffled"
    for bad in ((0, 10, 16), (2, 0, 16), (2, 10, 0)):
        try:
            mod.allocate_block_table(*bad)
        except ValueError:
            continue
        raise AssertionError(f"{bad}: no ValueError")


def t_write_gather():
    torch = need_torch()
    mod = load()
    g = torch.Generator().manual_seed(3)
    B, ps, H_kv, D, cap = 4, 16, 2, 8, 70
    table, pages = mod.allocate_block_table(B, cap, ps, g)
    cache = torch.zeros(pages, ps, H_kv, D)
    x = torch.randn(B, cap, H_kv, D, generator=g)
    mod.write_pages(cache, table, x[:, :33], 0)  # a prompt, then tokens one or three at a time
    starts = torch.full((B,), 33, dtype=torch.int32)
    for n in (1, 1, 3, 1):
        s = int(starts[0])
        mod.write_pages(cache, table, x[:, s:s + n], starts)
        starts += n
    L = int(starts[0])
    assert torch.equal(mod.gather_pages(cache, table, L), x[:, :L])
    # key t of sequence b: row t % ps of page table[b, t // ps]
    for b, t in ((0, 0), (1, 17), (3, L - 1), (2, 31)):
        assert torch.equal(cache[table[b, t // ps].item(), t % ps], x[b, t])
    # per-sequence starts: each sequence's key lands at its own length
    cache.zero_()
    lens = torch.tensor([0, 5, 16, 69], dtype=torch.int32)
    new = torch.randn(B, 1, H_kv, D, generator=g)
    mod.write_pages(cache, table, new, lens)
    for b in range(B):
        t = int(lens[b])
        assert torch.equal(cache[table[b, t // ps].item(), t % ps], new[b, 0])
    assert int((cache != 0).any(-1).any(-1).sum()) == B  # nothing else written


def t_kvcache_stand_in():
    torch = need_torch()
    mod = load()
    g = torch.Generator().manual_seed(4)
    B, H, H_kv, D, ps, cap = 3, 4, 2, 16, 16, 90
    table, pages = mod.allocate_block_table(B, cap, ps, g)
    for n_q, n_new in ((1, 1), (4, 4), (2, 0)):
        kc, vc = (torch.zeros(pages, ps, H_kv, D) for _ in range(2))
        lens = torch.tensor([0, 17, 60], dtype=torch.int32)
        full_k, full_v = (torch.randn(B, cap, H_kv, D, generator=g) for _ in range(2))
        # the keys already there: each sequence its own length
        for b in range(B):
            L = int(lens[b])
            if L:
                sub = table[b:b + 1]
                mod.write_pages(kc, sub, full_k[b:b + 1, :L], 0)
                mod.write_pages(vc, sub, full_v[b:b + 1, :L], 0)
        q = torch.randn(B, n_q, H, D, generator=g)
        k = v = None
        if n_new:
            k = torch.stack([full_k[b, int(lens[b]):int(lens[b]) + n_new] for b in range(B)])
            v = torch.stack([full_v[b, int(lens[b]):int(lens[b]) + n_new] for b in range(B)])
        o = mod.kvcache_attention_torch(q, kc, vc, k, v, lens, table, causal=True)
        assert tuple(o.shape) == (B, n_q, H, D)
        for b in range(B):
            L = int(lens[b]) + n_new
            if L == 0:
                continue
            kb = full_k[b, :L].transpose(0, 1).repeat_interleave(H // H_kv, 0)  # [H, L, D]
            vb = full_v[b, :L].transpose(0, 1).repeat_interleave(H // H_kv, 0)
            s = torch.einsum("hqd,hkd->hqk", q[b].transpose(0, 1), kb) / D ** 0.5
            i = torch.arange(n_q)[:, None]
            j = torch.arange(L)[None, :]
            s = s.masked_fill(j > i + L - n_q, float("-inf"))  # bottom-right causal
            want = torch.einsum("hqk,hkd->hqd", s.softmax(-1), vb).transpose(0, 1)
            err = (o[b] - want).abs().max().item()
            assert err < 1e-5, (n_q, n_new, b, err)


def tiny_model(mod, torch, kv_heads=1, layers=2):
    """train_gpt.py's GPT, tiny, its weights drawn wide enough that greedy text does not just
    repeat a character."""
    torch.manual_seed(5)
    cfg = dict(layers=layers, heads=2, kv_heads=kv_heads, dim=16, context=64)
    model = mod.new_model(cfg, 30, torch.float32, torch.device("cpu"))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.2 if "tok" in name or "pos" in name else 1.0)
    return model.eval(), cfg


def t_loops_match_no_cache():
    torch = need_torch()
    mod = load()
    for kv_heads, ps in ((1, 4), (2, 16), (2, 1)):
        model, cfg = tiny_model(mod, torch, kv_heads)
        B, P, N = 4, 7, 20
        prompts = torch.randint(0, 30, (B, P), generator=torch.Generator().manual_seed(6))
        with torch.no_grad():  # greedy without a cache: the whole sequence at every step
            seq = prompts
            for _ in range(N):
                seq = torch.cat([seq, model(seq)[:, -1].argmax(-1)[:, None]], 1)
            want = seq[:, P:]
            assert len(set(want.flatten().tolist())) >= 3, "the tiny model repeats itself"
            paged = mod.PagedCache(cfg["layers"], B, P + N - 1, ps, kv_heads, 16, torch.float32,
                                   "cpu", "auto", emulate=True)
            contiguous = mod.ContiguousCache(cfg["layers"], B, P + N - 1, kv_heads, 16,
                                             torch.float32, "cpu", gqa=False)
            for cache in (paged, contiguous):
                for _ in range(2):  # a second run over the same cache: reset() starts afresh
                    mod.use_cache(model, cache)
                    tokens, _, _, _, _ = mod.generate(model, cache, prompts, N, lambda: None)
                    assert torch.equal(tokens, want), (type(cache).__name__, ps, tokens, want)
            assert paged.lengths.tolist() == [P + N - 1] * B  # advanced on the device
            mod.use_cache(model, None)


def t_emulate_run():
    need_torch()
    with tempfile.TemporaryDirectory() as d:
        ckpt = os.path.join(d, "gpt.pt")
        args = ["--emulate", "--layers", "1", "--heads", "2", "--kv-heads", "1", "--train-steps",
                "0", "--batch", "4", "--prompt-len", "12", "--new-tokens", "10", "--repeats", "1",
                "--checkpoint", ckpt]
        for first in (True, False):  # written, then loaded
            rc, out, err = script(args)
            assert rc == 0, f"exit {rc}\n{out[-2000:]}\n{err[-2000:]}"
            for want in ("paged cache: 8 pages of 16 keys", "decode, tokens per second",
                         "greedy tokens: all 40 agree", "sequence 3: prompt",
                         "saved to" if first else "loaded from"):
                assert want in out, (want, out)
            assert os.path.isfile(ckpt)
        rc, out, err = script(args[:-2] + ["--prompt", "__global__ \u00e9"])
        assert rc == 2 and "outside the model's vocabulary" in out, (rc, out, err)


def main():
    for name, fn in (("generate.py --help names its options", t_help),
                     ("generate.py bad options: argparse's error, exit 2", t_bad_options),
                     ("generate.py without PyTorch: one line, exit 0", t_no_torch),
                     ("generate.py without the stage libraries: one line, exit 0",
                      t_no_libraries),
                     ("generate.py without stage9_decode or a GPU: one line, exit 0", t_no_gpu),
                     ("allocate_block_table: every page once, shuffled", t_block_table),
                     ("write_pages / gather_pages: keys where the block table says",
                      t_write_gather),
                     ("kvcache_attention_torch: the contiguous cache's attention (GQA, ragged, "
                      "new keys, causal bottom-right)", t_kvcache_stand_in),
                     ("paged and contiguous greedy loops = generation without a cache",
                      t_loops_match_no_cache),
                     ("generate.py --emulate on a tiny model, --checkpoint written then loaded",
                      t_emulate_run)):
        run(name, fn)
    return summary()


if __name__ == "__main__":
    sys.exit(main())
