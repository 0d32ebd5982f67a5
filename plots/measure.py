"""measure.py: how the course counts and times, in Python: the one home of the FLOP count and of
the timing protocol that the stage programs use (their C side: common/main.c), for every script
that times another library beside them (plots/sdpa_baseline.py, tools/compare_fa2.py,
tools/compare.py, tools/sdpa_bwd.py, python/examples).

FLOPs: the forward is two matrix products of 2 N^2 D each per head, 4 B H N^2 D, halved when
causal; the backward is five products against the forward's two: 2.5x the forward's (the
FlashAttention papers' convention). TFLOP/s = FLOPs / time.

Decode (N_q new queries against a cache of N_k keys, H query heads over H_kv KV heads): FLOPs
4 B H N_q N_k D (causal's saving at N_q <= 16 neglected, as common/decode.c counts them); bytes
the K and V of the cache, each read once, 2 B N_k H_kv D x the element size; GB/s = bytes / time
(plots/sweep.sh counts the stage rows' the same way).

Timing (the programs' protocol): CUDA events around each call, the L2 cache flushed before each
(FLUSH_BYTES written), a warm-up, then the median of at least MIN_REPS calls and MIN_SECONDS of
them, or of SLOW_REPS calls when one call takes longer than SLOW_MS. (The comparisons with other
libraries replay CUDA graphs instead: tools/compare.py.)

Standard library only: the caller passes its torch module.
"""

import statistics

BWD_FLOPS = 2.5  # the backward's FLOPs as a multiple of the forward's
FLUSH_BYTES = 256 << 20  # more than any GPU's L2
MIN_REPS = 10  # timing: at least this many calls ...
MIN_SECONDS = 0.5  # ... and this much measured time,
SLOW_MS = 1000.0  # unless one call takes longer than this: then ...
SLOW_REPS = 3  # ... this many calls
MAX_REPS = 10000


def flops(b, h, n, d, causal, pass_="fwd"):
    """FLOPs of one pass ("fwd", "bwd", or "fwd+bwd") of attention on [b, h, n, d]."""
    fwd = 4.0 * b * h * n * n * d / (2.0 if causal else 1.0)
    return fwd * {"fwd": 1.0, "bwd": BWD_FLOPS, "fwd+bwd": 1.0 + BWD_FLOPS}[pass_]


def decode_flops(b, h, n_q, n_k, d):
    """FLOPs of one decode call: N_q queries per sequence against N_k keys."""
    return 4.0 * b * h * n_q * n_k * d


def decode_bytes(b, n_k, h_kv, d, elem_bytes=2):
    """Bytes of K and V cache one decode call reads (each once)."""
    return 2.0 * b * n_k * h_kv * d * elem_bytes


def gbs(nbytes, ms):
    """GB/s (1e9 bytes) of `nbytes` moved in `ms` milliseconds."""
    return nbytes / (ms * 1e-3) / 1e9


def tflops(flop, ms):
    """TFLOP/s of `flop` FLOPs done in `ms` milliseconds."""
    return flop / (ms * 1e-3) / 1e12


def median(times):
    """The median (the mean of the middle two of an even count, as the programs take it)."""
    return statistics.median(times)


def enough(times):
    """Whether the calls timed so far (ms, the first one first) are enough to stop."""
    if times[0] > SLOW_MS:
        return len(times) >= SLOW_REPS
    return len(times) >= MIN_REPS and (sum(times) >= MIN_SECONDS * 1000.0
                                       or len(times) >= MAX_REPS)


class EventTimer:
    """Milliseconds of one call of fn, by CUDA events, on a cold L2 (flush=True) or not."""

    def __init__(self, torch, flush=True):
        self.torch = torch
        self.flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device="cuda") if flush else None
        self.start = torch.cuda.Event(enable_timing=True)
        self.end = torch.cuda.Event(enable_timing=True)

    def once(self, fn):
        if self.flush is not None:
            self.flush.zero_()  # nothing of the inputs stays in L2
        self.start.record()
        fn()
        self.end.record()
        self.end.synchronize()
        return self.start.elapsed_time(self.end)

    def repeat(self, fn, first=None):
        """The times of calls of fn until enough(), after `first` (a time already taken) if given."""
        times = [first if first is not None else self.once(fn)]
        while not enough(times):
            times.append(self.once(fn))
        return times
