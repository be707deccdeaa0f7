"""
An estimate, not a measurement, of the training step time and MFU of the GPT-2
trainer on one GPU, from stated assumptions (every one a flag):
  - matmuls (qkv, proj, fc, fcproj, lm head; forward and backward) at a stated
    cuBLASLt rate;
  - attention from its instruction count: each m16n8k16 HMMA (4096 FLOP) costs
    --attn-instr-per-hmma issued instructions, 4 issued per SM per clock, and
    never faster than --attn-tc-tflops (mma.sync on the tensor cores);
  - the memory-bound kernels (layernorm, gelu, residual, the logits' softmax and
    cross-entropy, AdamW) at a fraction of the memory bandwidth;
  - host time on the critical path (the encoder-backward plan), added whole.

    python3 dev/roofline_estimate.py                 # d12 B=64 T=1024 on an H200
    python3 dev/roofline_estimate.py --attn-instr-per-hmma 7 --host-ms 0
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt2_sizes import gpt2_descriptors  # noqa: E402

DESCRIPTORS = gpt2_descriptors()  # {"d12": (L, NH, C), ...}, read from train_gpt.cu
V, VP, MAXT = 50257, 50304, 1024


def parse():
    p = argparse.ArgumentParser(description="estimated step time and MFU (assumptions, not measurements)")
    p.add_argument("--model", default="d12", choices=sorted(DESCRIPTORS))
    p.add_argument("-B", type=int, default=64)
    p.add_argument("-T", type=int, default=1024)
    p.add_argument("--peak-tflops", type=float, default=989.0, help="dense bf16 peak (H200 SXM: 989)")
    p.add_argument("--cublaslt-tflops", type=float, default=700.0, help="assumed cuBLASLt bf16 rate at these shapes")
    p.add_argument("--sms", type=int, default=132)
    p.add_argument("--clock-ghz", type=float, default=1.98)
    p.add_argument("--attn-instr-per-hmma", type=float, default=5.0,
                   help="issued instructions per HMMA in its loops (sass_report, HS 64, no doc mask: forward 6.3, dQ 4.5, dK/dV 4.3; weighted by FLOPs about 5)")
    p.add_argument("--attn-tc-tflops", type=float, default=660.0, help="mma.sync tensor-core ceiling")
    p.add_argument("--bandwidth-tbs", type=float, default=4.8, help="H200 HBM3e: 4.8 TB/s")
    p.add_argument("--bandwidth-eff", type=float, default=0.8, help="fraction of bandwidth the memory-bound kernels reach")
    p.add_argument("--elementwise-vectors", type=float, default=30.0,
                   help="bf16 vectors of C per token per layer read or written by non-matmul kernels, fwd+bwd")
    p.add_argument("--logit-passes", type=float, default=3.0, help="bf16 passes over the B*T*Vp logits")
    p.add_argument("--optimizer-bytes", type=float, default=26.0, help="bytes per parameter per AdamW step")
    p.add_argument("--host-ms", type=float, default=0.2,
                   help="host time per step on the critical path (the encoder plan: bench_train prints it, 0.2 ms at B*T=16384)")
    a = p.parse_args()
    if min(a.B, a.T) <= 0 or a.T > MAXT or min(a.cublaslt_tflops, a.bandwidth_tbs, a.bandwidth_eff, a.sms,
                                                a.clock_ghz, a.attn_tc_tflops, a.peak_tflops) <= 0:
        print(f"error: roofline_estimate: B, T (at most {MAXT}) and every rate must be positive", file=sys.stderr)
        sys.exit(1)
    return a


def estimate(a):
    """The components in ms, and the model FLOP of one step (bench_train's count)."""
    L, NH, C = DESCRIPTORS[a.model]
    tokens = a.B * a.T
    nparams = VP * C + MAXT * C + L * (12 * C * C + 13 * C) + 2 * C
    matmul_flop = 6.0 * tokens * (L * 12 * C * C + VP * C)
    # causal: forward QK^T and PV at half the square; backward recomputes QK^T and does 4 more: 7 T^2 C per layer
    attn_flop = 7.0 * a.B * a.T * a.T * C * L
    issue_ms = attn_flop / 4096 * a.attn_instr_per_hmma / (4 * a.sms * a.clock_ghz * 1e9) * 1e3
    bytes_moved = (tokens * L * a.elementwise_vectors * C * 2 + a.logit_passes * tokens * VP * 2 +
                   a.optimizer_bytes * nparams)
    parts = {
        "matmuls (cuBLASLt)": matmul_flop / (a.cublaslt_tflops * 1e12) * 1e3,
        "attention": max(issue_ms, attn_flop / (a.attn_tc_tflops * 1e12) * 1e3),
        "memory-bound kernels": bytes_moved / (a.bandwidth_tbs * 1e12 * a.bandwidth_eff) * 1e3,
        "host": a.host_ms,
    }
    model_flop = (6.0 * nparams + 6.0 * L * C * a.T) * tokens
    return parts, model_flop


def main():
    a = parse()
    parts, model_flop = estimate(a)
    total = sum(parts.values())
    print(f"ESTIMATE (from the assumptions below, not measured): {a.model} B={a.B} T={a.T}")
    for name, ms in parts.items():
        print(f"  {name:22s} {ms:7.1f} ms")
    mfu = model_flop / (total / 1e3) / (a.peak_tflops * 1e12)
    print(f"estimated step {total:.1f} ms, MFU {100 * mfu:.1f}% of {a.peak_tflops:.0f} TFLOP/s")
    print(f"assumptions: cuBLASLt {a.cublaslt_tflops:.0f} TFLOP/s; attention {a.attn_instr_per_hmma:g} instr/HMMA on "
          f"{a.sms} SMs at {a.clock_ghz} GHz, tensor cores at most {a.attn_tc_tflops:.0f} TFLOP/s; "
          f"{a.bandwidth_tbs} TB/s at {a.bandwidth_eff:.0%}; host {a.host_ms} ms")


if __name__ == "__main__":
    main()
