#!/usr/bin/env python3
"""Decode against a KV cache: stage 9 beside PyTorch's SDPA backends, one protocol for all.

For every shape, one set of inputs (fixed seed): q [B, N_q, H, D] and a cache of N_k keys per
sequence, K and V [B, N_k, H_kv, D] (flash-attn's layout; --page-size P: the same keys in pages of
P, scattered by a random block table, for the course (and FlashInfer) only; --page-order
sequential: pages in the order of the keys, so that what scattering costs the HBM is told apart
from the table's reads; --table-upload: the table copied from pinned host memory before each call,
as a server's step uploads it, so that the call finds it where that copy left it rather than
flushed with the rest). Each library is timed the same way: a CUDA graph of --repeats rounds of
(flush the L2 cache: a buffer of twice its size is read; one call), replayed --replays times
between CUDA events, against a graph of the flushes alone (with --table-upload, of the flushes and
the uploads); a call's time is the difference of the fastest replays over --repeats. No host time
is counted, as a server replays its decode step in a CUDA graph; the stage programs' own --bench
(CUDA events around each launched call) counts the launch too. The flush reads, so that the cache
holds clean lines: one that writes (--flush write) leaves the L2 full of dirty lines, and the call
that evicts them pays for writing them back, tens of MB that are not its own (what that costs each
library: stage 9's LOG, step 8). Decode reads every key and value once, so the figure of merit is
their bytes over the time: GB/s, and the share of the HBM's peak (--peak-tbs, 4.8 for an H200).

Columns:
  course   flashcourse.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=N_k, causal=)
           (stage9_decode's library, `make lib`); --variant NAME for one of its variants
  FA2      torch.nn.functional.scaled_dot_product_attention on [B, H, N_q, D] views of the same
           tensors, SDPBackend.FLASH_ATTENTION, enable_gqa=True
  cuDNN    the same, SDPBackend.CUDNN_ATTENTION
  FlashInfer  with --flashinfer, where `import flashinfer` works: its paged decode (one query:
           BatchDecodeWithPagedKVCacheWrapper, tensor cores from 4 query heads a KV head) or paged
           prefill (more queries: BatchPrefillWithPagedKVCacheWrapper, causal bottom-right as
           the course's), planned once outside the graph, on the course's cache: its pages and
           block table with --page-size, else the contiguous cache seen as pages of 16 in the
           keys' order (as one page a sequence, FlashInfer does not split the keys: 6% of the HBM)
  copy     a device-to-device copy of 1 GiB (bytes read + written / time): a copy writes what it
           reads, so decode's long calls, which only read, can pass it
Causal with N_q > 1 is bottom-right (query i sees keys up to i + N_k - N_q) in the course; SDPA's
is_causal is top-left, so SDPA gets torch.nn.attention.bias.causal_lower_right(N_q, N_k).

Checks: each output against the first library that ran the shape (2e-2 absolute); over it, a FAIL
line on stderr and exit 1.

usage: python3 -m tools.decode_bench [--quick | --shape B,H,H_kv,D,N_q,N_k[,causal] ...]
                                     [--page-size P [--page-order random|sequential]
                                      [--table-upload]]
                                     [--variant NAME] [--repeats N]
                                     [--replays N] [--csv OUT [--append]] [--peak-tbs T]
                                     [--flush read|write] [--no-course | --no-sdpa]
                                     [--flashinfer] | --self-test
Without PyTorch or a CUDA GPU it prints one line, "skipped: ...", and exits 0.
"""
import argparse
import csv
import os
import statistics
import sys
import tempfile

# (B, H, H_kv, D, N_q, N_k, causal): the shapes, then the sweep
SHAPES = [(1, 32, 8, 128, 1, n, False) for n in (1024, 4096, 16384, 32768, 65536, 131072, 262144)]
SHAPES += [(8, 32, 8, 128, 1, n, False) for n in (4096, 32768)]
SHAPES += [(1, 32, 8, 128, 4, n, True) for n in (4096, 32768, 131072)]
SHAPES += [(1, 32, 8, 64, 1, 32768, False), (1, 32, 32, 128, 1, 32768, False)]
QUICK = [(1, 32, 8, 128, 1, 4096, False), (1, 32, 8, 128, 1, 32768, False),
         (8, 32, 8, 128, 1, 32768, False), (1, 32, 8, 128, 4, 32768, True)]


HEADER = "gpu,B,H,H_kv,D,N_q,N_k,causal,cache,library,variant,ms_median,gbs,hbm_pct"


def parse_shape(text):
    """--shape's value, "B,H,H_kv,D,N_q,N_k" with ",1" for causal (",0" or nothing: not), as a
    SHAPES entry; argparse.ArgumentTypeError naming what is wrong."""
    try:
        v = [int(x) for x in text.split(",")]
    except ValueError:
        v = []
    if len(v) not in (6, 7):
        raise argparse.ArgumentTypeError(f"'{text}' is not B,H,H_kv,D,N_q,N_k[,causal] (integers)")
    B, H, H_kv, D, N_q, N_k = v[:6]
    causal = v[6] if len(v) == 7 else 0
    if min(B, H, H_kv, D, N_q, N_k) < 1:
        raise argparse.ArgumentTypeError(f"'{text}': every size must be >= 1")
    if H % H_kv:
        raise argparse.ArgumentTypeError(f"'{text}': H ({H}) must be a multiple of H_kv ({H_kv})")
    if causal not in (0, 1):
        raise argparse.ArgumentTypeError(f"'{text}': causal must be 0 or 1")
    return (B, H, H_kv, D, N_q, N_k, bool(causal))


def write_rows(path, rows, cache, variant, peak_tbs, append=False):
    """The timed rows, (gpu, B, H, H_kv, D, N_q, N_k, causal, library, ms, GB/s) with the course
    as "course", in the committed format (stage9_decode/measured/*.csv, read by
    tools/decode_table.py): the course's rows as stage9_decode with its variant, the cache
    ("contiguous" or "paged<P>"), the time in ms and the share of the HBM's peak. append: add
    them to the file (its header kept; written where the file is new or empty)."""
    header = not (append and os.path.exists(path) and os.path.getsize(path))
    with open(path, "a" if append else "w") as f:
        if header:
            f.write(HEADER + "\n")
        for (gpu, B, H, H_kv, D, N_q, N_k, causal, lib, ms, gbs) in rows:
            course = lib == "course"
            f.write(",".join(str(x) for x in (
                gpu, B, H, H_kv, D, N_q, N_k, causal, cache,
                "stage9_decode" if course else lib, variant if course else "",
                f"{ms:.5f}", f"{gbs:.0f}", f"{100 * gbs / (1000 * peak_tbs):.1f}")) + "\n")


def self_test():
    """Without a GPU: the rows of a full run, then of three --append runs (nopack, nosplit, pages
    of 16), written as write_rows writes them, make both of decode_table's tables, with one
    header and every cell where it belongs; a FlashInfer row adds its column. Exit 0 when all
    hold."""
    from tools import decode_table
    shape = ("GPU X", 1, 32, 8, 128, 1, 4096, 0)
    nbytes = 2 * 1 * 4096 * 8 * 128 * 2
    timed = {"course": 0.0125, "FA2": 0.0200, "cuDNN": 0.0150}
    problems = []
    with tempfile.TemporaryDirectory() as d:
        path = f"{d}/rows.csv"
        write_rows(path, [shape + (lib, ms, nbytes / ms / 1e6) for lib, ms in timed.items()],
                   "contiguous", "default", 4.8)
        for cache, variant, ms in (("contiguous", "nopack", 0.0150),
                                   ("contiguous", "nosplit", 0.0600),
                                   ("paged16", "default", 0.0130)):
            write_rows(path, [shape + ("course", ms, nbytes / ms / 1e6)], cache, variant, 4.8,
                       append=True)
        text = open(path).read()
        if text.count(HEADER) != 1 or not text.startswith(HEADER):
            problems.append(f"one header, first: found {text.count(HEADER)}")
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
    if len(rows) != 6:
        problems.append(f"6 rows: found {len(rows)}")
    try:
        out = decode_table.tables(rows)
    except (KeyError, ValueError) as e:  # a row decode_table cannot read
        out = ""
        problems.append(f"decode_table cannot read the rows: {type(e).__name__}: {e}")
    want = ["| B = 1, 32/8 heads, D = 128, N_k = 4,096, 1 query | 12.5 us (28%) | 20.0 us (18%) | "
            "15.0 us (23%) | 1.20 |",
            "| B = 1, 32/8 heads, D = 128, N_k = 4,096, 1 query | 12.5 us (28%) | 15.0 us (23%) | "
            "60.0 us (6%) | 13.0 us (27%) |"]
    for line in want:
        if line not in out.splitlines():
            problems.append(f"decode_table's line missing: {line}")
    # FlashInfer's rows (--flashinfer) add its column and its ratio; without them, as above
    fi_row = dict(rows[0], library="FlashInfer", ms_median="0.02500", hbm_pct="14.0")
    try:
        out_fi = decode_table.tables(rows + [fi_row])
    except (KeyError, ValueError) as e:
        out_fi = ""
        problems.append(f"decode_table cannot read a FlashInfer row: {type(e).__name__}: {e}")
    want_fi = ("| B = 1, 32/8 heads, D = 128, N_k = 4,096, 1 query | 12.5 us (28%) | "
               "20.0 us (18%) | 15.0 us (23%) | 25.0 us (14%) | 1.20 | 2.00 |")
    if want_fi not in out_fi.splitlines():
        problems.append(f"decode_table's line with FlashInfer missing: {want_fi}")
    if parse_shape("1,32,8,64,4,4096,1") != (1, 32, 8, 64, 4, 4096, True) or \
            parse_shape("8,32,8,128,1,32768") != (8, 32, 8, 128, 1, 32768, False):
        problems.append("parse_shape reads a good --shape wrong")
    for bad in ("1,32,8,128,1", "1,32,8,128,1,0", "1,32,5,128,1,64", "1,32,8,128,1,64,2", "a,b"):
        try:
            parse_shape(bad)
            problems.append(f"parse_shape takes '{bad}'")
        except argparse.ArgumentTypeError:
            pass
    for p in problems:
        print(f"FAIL  decode_bench --self-test: {p}")
    print("ok    decode_bench --self-test: write_rows, --append and decode_table agree; "
          "--shape parsed"
          if not problems else f"{len(problems)} failed")
    return 1 if problems else 0


def flashinfer_call(flashinfer, torch, q, kc, vc, table, page, N_k, causal):
    """FlashInfer on the course's cache, planned once (its plan runs on the host: outside the
    graph): kc, vc [pages, page, H_kv, D] with `table` [B, pages a sequence] int32, every sequence
    N_k keys. One query: the paged decode wrapper; more: the paged prefill wrapper, causal
    aligned bottom-right (FlashInfer's rule when the keys outnumber the queries). Returns a call
    whose output is [B, N_q, H, D]."""
    B, N_q, H, D = q.shape
    H_kv = kc.shape[2]
    dev = q.device
    per = table.shape[1]
    indptr = torch.arange(B + 1, dtype=torch.int32, device=dev) * per
    indices = table.reshape(-1).contiguous()
    last = torch.full((B,), N_k - (per - 1) * page, dtype=torch.int32, device=dev)
    ws = torch.zeros(128 << 20, dtype=torch.uint8, device=dev)
    if N_q == 1:
        w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            ws, "NHD", use_cuda_graph=True, use_tensor_cores=H // H_kv >= 4,
            paged_kv_indptr_buffer=indptr, paged_kv_indices_buffer=indices,
            paged_kv_last_page_len_buffer=last)
        w.plan(indptr, indices, last, H, H_kv, D, page, q_data_type=q.dtype,
               kv_data_type=kc.dtype)
        qq = q.view(B, H, D)
        return lambda: w.run(qq, (kc, vc)).view(B, 1, H, D)
    qo = torch.arange(B + 1, dtype=torch.int32, device=dev) * N_q
    w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
        ws, "NHD", use_cuda_graph=True, qo_indptr_buf=qo, paged_kv_indptr_buf=indptr,
        paged_kv_indices_buf=indices, paged_kv_last_page_len_buf=last)
    w.plan(qo, indptr, indices, last, H, H_kv, D, page, causal=bool(causal),
           q_data_type=q.dtype, kv_data_type=kc.dtype)
    qq = q.reshape(B * N_q, H, D)
    return lambda: w.run(qq, (kc, vc)).view(B, N_q, H, D)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--shape", type=parse_shape, action="append", metavar="B,H,H_kv,D,N_q,N_k[,c]",
                    help="time this shape instead of the list (repeatable; c = 1: causal)")
    ap.add_argument("--page-size", type=int, default=0)
    ap.add_argument("--page-order", choices=("random", "sequential"), default="random",
                    help="with --page-size: the block table a random permutation of the pages "
                    "(default) or the pages in order")
    ap.add_argument("--table-upload", action="store_true",
                    help="with --page-size: the block table copied from pinned host memory "
                    "after each flush and before the call, in the timed graph and in its "
                    "baseline alike (a server uploads its step's table so)")
    ap.add_argument("--variant", default="default")
    ap.add_argument("--repeats", type=int, default=20, help="calls per graph (default 20)")
    ap.add_argument("--replays", type=int, default=7, help="replays per graph (default 7)")
    ap.add_argument("--csv", help="write the rows here, in stage 9's measured format")
    ap.add_argument("--append", action="store_true", help="add the rows to --csv's file (its "
                    "header kept) instead of replacing it: one file from several runs")
    ap.add_argument("--peak-tbs", type=float, default=4.8)
    ap.add_argument("--flush", choices=("read", "write"), default="read",
                    help="how the L2 is flushed before each call: a buffer of twice its size "
                    "read (default) or written (the call's reads then evict dirty lines, and "
                    "it pays for their write-back)")
    ap.add_argument("--no-course", action="store_true", help="SDPA and the copy only")
    ap.add_argument("--no-sdpa", action="store_true", help="the course and the copy only")
    ap.add_argument("--flashinfer", action="store_true",
                    help="a FlashInfer column too (its wheels installed: n/a otherwise)")
    ap.add_argument("--self-test", action="store_true",
                    help="without a GPU: write_rows and --append against tools/decode_table.py")
    args = ap.parse_args()
    if args.self_test:
        return self_test()
    if args.table_upload and not args.page_size:
        ap.error("--table-upload needs --page-size (a contiguous cache has no block table)")
    try:
        import torch
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError as e:
        print(f"skipped: PyTorch not importable ({e})")
        return 0
    if not torch.cuda.is_available():
        print("skipped: no CUDA GPU")
        return 0
    course = None
    if not args.no_course:
        try:
            import flashcourse
            course = flashcourse.flash_attn_with_kvcache
        except (ImportError, AttributeError) as e:
            print(f"course: not importable ({e}): its column is n/a", file=sys.stderr)

    dev = torch.device("cuda")
    l2 = torch.cuda.get_device_properties(dev).L2_cache_size
    flush = torch.zeros(2 * l2 // 4 + 1, dtype=torch.int32, device=dev)
    flush_sum = torch.zeros((), dtype=torch.int64, device=dev)

    def flush_l2():
        if args.flush == "write":  # the cache left holding the buffer's last lines, dirty
            flush.zero_()
        else:  # read: the cache left holding clean lines (their eviction writes nothing back)
            torch.sum(flush, dim=0, dtype=torch.int64, out=flush_sum)

    def graph_of(fns, reps):
        """A CUDA graph of `reps` rounds of fns, captured on a side stream after a warm-up."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                for f in fns:
                    f()
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=side):
                for _ in range(reps):
                    for f in fns:
                        f()
        torch.cuda.synchronize()
        return graph

    def replay_ms(graph):
        times = []
        for _ in range(args.replays):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            graph.replay()
            b.record()
            torch.cuda.synchronize()
            times.append(a.elapsed_time(b))
        return statistics.median(times)

    # One protocol for all: a CUDA graph of R rounds of (flush the L2, one call) against a graph
    # of R flushes alone; a call's time is the difference / R (no host time: as a server replays
    # its decode step in a graph).
    flush_graph = graph_of([flush_l2], args.repeats)

    def timed(fn, before=()):
        """A call's time; `before`: work each round does after the flush and before the call,
        in the baseline graph too, so that only the call is counted."""
        g = graph_of([flush_l2, *before, fn], args.repeats)
        base_graph = graph_of([flush_l2, *before], args.repeats) if before else flush_graph
        base, both = [], []
        for _ in range(2):  # interleaved, so a drift of the clocks hits both
            base.append(replay_ms(base_graph))
            both.append(replay_ms(g))
        return max(min(both) - min(base), 1e-6) / args.repeats

    src = torch.empty(1 << 29, dtype=torch.float16, device=dev)
    dst = torch.empty_like(src)
    # the copy: a device-to-device copy by the SMs, eager (captured in a graph, a copy becomes a
    # copy-engine node, which is slower); at 1 GiB a call's host time is lost in its length
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
    for _ in range(2):
        dst.copy_(src)
    ev[0].record()
    for _ in range(10):
        dst.copy_(src)
    ev[1].record()
    torch.cuda.synchronize()
    copy_ms = ev[0].elapsed_time(ev[1]) / 10
    copy_gbs = 2 * src.numel() * 2 / copy_ms / 1e6
    del src, dst
    name = torch.cuda.get_device_name(dev)
    print(f"{name}, torch {torch.__version__}; copy {copy_gbs:.0f} GB/s "
          f"({100 * copy_gbs / (1000 * args.peak_tbs):.0f}% of {args.peak_tbs} TB/s)")
    rows = []
    failed = False
    libs = ["course", "FA2", "cuDNN"] + (["FlashInfer"] if args.flashinfer else [])
    flashinfer = None
    if args.flashinfer:
        try:
            import flashinfer
        except Exception as e:  # not installed, or its import fails on this machine
            print(f"FlashInfer: not importable ({type(e).__name__}: {e}): its column is n/a",
                  file=sys.stderr)
    print(f"{'B':>2} {'H':>3} {'Hkv':>3} {'D':>3} {'Nq':>2} {'N_k':>7} {'c':>1}  " +
          "  ".join(f"{x:>22}" for x in libs))
    for (B, H, H_kv, D, N_q, N_k, causal) in (args.shape or (QUICK if args.quick else SHAPES)):
        g = torch.Generator(device=dev).manual_seed(1)
        q = torch.randn(B, N_q, H, D, device=dev, dtype=torch.float16, generator=g)
        k = torch.randn(B, N_k, H_kv, D, device=dev, dtype=torch.float16, generator=g)
        v = torch.randn(B, N_k, H_kv, D, device=dev, dtype=torch.float16, generator=g)
        nbytes = 2 * B * N_k * H_kv * D * 2
        mask = None
        if causal and N_q > 1:  # bottom-right, as SDPA takes it: a CausalBias
            from torch.nn.attention.bias import causal_lower_right
            mask = causal_lower_right(N_q, N_k)
        qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        calls, before = {}, {}
        if course is not None:
            seqlens = torch.full((B,), N_k, dtype=torch.int32, device=dev)
            if args.page_size:
                P = args.page_size
                pages = (N_k + P - 1) // P
                if args.page_order == "random":
                    perm = torch.randperm(B * pages, device=dev, generator=g)
                else:
                    perm = torch.arange(B * pages, device=dev)
                table = perm.to(torch.int32).view(B, pages)
                kp = torch.empty(B * pages, P, H_kv, D, device=dev, dtype=torch.float16)
                vp = torch.empty_like(kp)
                kpad = torch.zeros(B, pages * P, H_kv, D, device=dev, dtype=torch.float16)
                vpad = torch.zeros_like(kpad)
                kpad[:, :N_k], vpad[:, :N_k] = k, v
                kp[table.long().flatten()] = kpad.view(B * pages, P, H_kv, D)
                vp[table.long().flatten()] = vpad.view(B * pages, P, H_kv, D)
                calls["course"] = lambda: course(q, kp, vp, cache_seqlens=seqlens,
                                                 block_table=table, causal=causal,
                                                 variant=args.variant)
                if args.table_upload:  # the step's table from the host, as a server sends it
                    host_table = table.cpu().pin_memory()
                    before["course"] = (lambda: table.copy_(host_table, non_blocking=True),)
            else:
                calls["course"] = lambda: course(q, k, v, cache_seqlens=seqlens, causal=causal,
                                                 variant=args.variant)
        if flashinfer is not None:
            try:
                if args.page_size:
                    calls["FlashInfer"] = flashinfer_call(flashinfer, torch, q, kp, vp, table,
                                                          args.page_size, N_k, causal)
                else:  # the contiguous cache as it is, seen as pages of 16 in the keys' order
                    P = 16 if N_k % 16 == 0 else N_k
                    n = B * N_k // P
                    calls["FlashInfer"] = flashinfer_call(
                        flashinfer, torch, q, k.view(n, P, H_kv, D), v.view(n, P, H_kv, D),
                        torch.arange(n, dtype=torch.int32, device=dev).view(B, n // B), P, N_k,
                        causal)
            except Exception as e:  # a shape or build it does not take: n/a, and go on
                print(f"FlashInfer: {type(e).__name__}: {str(e).splitlines()[0][:160]}",
                      file=sys.stderr)
        if not args.no_sdpa:
            calls["FA2"] = (SDPBackend.FLASH_ATTENTION,)
            calls["cuDNN"] = (SDPBackend.CUDNN_ATTENTION,)
        out, ref = [], None
        for lib in libs:
            fn = calls.get(lib)
            if fn is None:
                out.append(None)
                continue
            if isinstance(fn, tuple):
                backend = fn[0]

                def fn(backend=backend):
                    with sdpa_kernel(backend):
                        if mask is not None:
                            return F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask,
                                                                  enable_gqa=True)
                        return F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True,
                                                              is_causal=False)
            try:
                o = fn()
                o = o.transpose(1, 2) if lib in ("FA2", "cuDNN") else o
                ms = timed(fn, before.get(lib, ()))
            except Exception as e:  # a library that cannot run the shape: n/a, and go on
                print(f"{lib}: {type(e).__name__}: {str(e).splitlines()[0][:160]}", file=sys.stderr)
                out.append(None)
                continue
            torch.cuda.synchronize()
            if ref is None:
                ref = o.float()
            else:
                err = (o.float() - ref).abs().max().item()
                if not err <= 2e-2:
                    print(f"FAIL {lib} B={B} H={H} N_k={N_k} N_q={N_q}: max |diff| {err:.3g}",
                          file=sys.stderr)
                    failed = True
            out.append(ms)
            rows.append((name, B, H, H_kv, D, N_q, N_k, int(causal), lib, ms,
                         nbytes / ms / 1e6))
        cells = []
        for ms in out:
            if ms is None:
                cells.append(f"{'n/a':>22}")
            else:
                gbs = nbytes / ms / 1e6
                pct = 100 * gbs / (1000 * args.peak_tbs)
                cells.append(f"{ms * 1e3:8.1f} us {gbs:5.0f} {pct:3.0f}%")
        print(f"{B:>2} {H:>3} {H_kv:>3} {D:>3} {N_q:>2} {N_k:>7} {int(causal):>1}  "
              + "  ".join(cells), flush=True)
    if args.csv:
        cache = "contiguous"
        if args.page_size:  # (decode_table reads the random tables' rows: "paged16")
            order = "" if args.page_order == "random" else "-sequential"
            upload = "-upload" if args.table_upload else ""
            cache = f"paged{args.page_size}{order}{upload}"
        write_rows(args.csv, rows, cache, args.variant, args.peak_tbs, args.append)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
