# SDPA backward times (FLASH_ATTENTION = FA2, CUDNN_ATTENTION) with the stage programs' protocol:
# CUDA events around each call, L2 flushed before each, warm-up, median of >= 10 calls and 0.5 s
# (plots/measure.py). CSV on stdout; tools/compare_bwd.sh runs it.
#   python3 -m tools.sdpa_bwd > sdpa.csv      (from the repository root)
import torch
from torch.nn.attention import sdpa_kernel, SDPBackend
import torch.nn.functional as F
from plots import measure  # the FLOP count and the timing protocol: one home
timer = measure.EventTimer(torch)
def timeit(fn):
    fn()  # warm-up
    return measure.median(timer.repeat(fn))
print("backend,B,H,N,D,causal,bwd_ms,tflops")
for D in (64, 128):
    for causal in (0, 1):
        for N in (1024, 2048, 4096, 8192, 16384):
            B, H = 16384 // N, 2048 // D
            g = torch.Generator(device="cuda").manual_seed(1)
            q, k, v, do = (torch.randn(B, H, N, D, device="cuda", dtype=torch.float16, generator=g) for _ in range(4))
            for name, be in (("sdpa_flash", SDPBackend.FLASH_ATTENTION), ("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION)):
                qq, kk, vv = (x.clone().requires_grad_() for x in (q, k, v))
                try:
                    with sdpa_kernel(be):
                        o = F.scaled_dot_product_attention(qq, kk, vv, is_causal=bool(causal))
                        ms = timeit(lambda: torch.autograd.grad(o, (qq, kk, vv), do, retain_graph=True))
                except Exception as e:
                    print(f"{name},{B},{H},{N},{D},{causal},,{type(e).__name__}", flush=True); continue
                fl = measure.flops(B, H, N, D, causal, "bwd")
                print(f"{name},{B},{H},{N},{D},{causal},{ms:.4f},{measure.tflops(fl, ms):.1f}", flush=True)
