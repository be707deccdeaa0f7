"""
dev/train_llama3.py's Llama against transformers' LlamaForCausalLM with the
same weights, in fp32 on the CPU: logits, loss and every weight gradient.

    python3 dev/check_llama3_vs_hf.py [--tol 1e-5]

Cases: grouped-query attention (NH=4, NKV=2) and multi-query (NKV=1), the LM
head tied and untied, Llama 3.1's RoPE scaling with positions past the
original context (where the scaled frequencies matter) and without scaling.
Norm weights are drawn away from 1 so that each one is seen. Prints one line
per case with the largest absolute differences and ends with
"check_llama3_vs_hf: N passed, M failed" (exit 1 on a failure). Without torch
or transformers: one `error:` line, exit 1.

The two models differ by design in one place: transformers computes the RoPE
frequencies and angles in fp32, train_llama3.py (like llmc/kernels/rope.cuh) in
double, rounded once. At position p the angle then differs by about p * f * 6e-8
radians, so the positions here stay small enough for the stated bound.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference_mode  # noqa: E402

reference_mode.pin_env()  # before torch is imported: the comparison runs in reference mode
import argparse
from dataclasses import replace

try:
    import torch
    from transformers import LlamaConfig as HFConfig
    from transformers import LlamaForCausalLM
except ImportError as e:
    print(f"error: dev/check_llama3_vs_hf.py needs torch and transformers ({e})", file=sys.stderr)
    sys.exit(1)

import train_llama3 as ref  # noqa: E402

reference_mode.pin_torch(torch)


def hf_model(cfg, params, plant=False):
    """LlamaForCausalLM (eager attention, fp32) holding params, split into transformers' modules.
    plant: the key heads handed over in reverse order (a wrong q -> kv head mapping)."""
    rope = {"rope_type": "default", "rope_theta": cfg.rope_theta}
    if cfg.rope_factor != 1.0:
        rope = {"rope_type": "llama3", "rope_theta": cfg.rope_theta, "factor": cfg.rope_factor,
                "low_freq_factor": cfg.rope_low_freq_factor, "high_freq_factor": cfg.rope_high_freq_factor,
                "original_max_position_embeddings": cfg.rope_original_max_position}
    hcfg = HFConfig(vocab_size=cfg.padded_vocab_size, hidden_size=cfg.channels, intermediate_size=cfg.ffn_hidden,
                    num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads,
                    num_key_value_heads=cfg.num_kv_heads, max_position_embeddings=max(cfg.max_seq_len, int(cfg.rope_original_max_position * cfg.rope_factor)),
                    rms_norm_eps=cfg.norm_eps, tie_word_embeddings=cfg.tied, rope_parameters=rope,
                    attention_bias=False, mlp_bias=False)
    hcfg._attn_implementation = "eager"
    m = LlamaForCausalLM(hcfg).float().eval()
    NH, NKV, HS, F_ = cfg.num_heads, cfg.num_kv_heads, cfg.head_size, cfg.ffn_hidden
    with torch.no_grad():
        m.model.embed_tokens.weight.copy_(params["wte"])
        for l, layer in enumerate(m.model.layers):
            q, k, v = params["qkvw"][l].split([NH * HS, NKV * HS, NKV * HS], dim=0)
            layer.self_attn.q_proj.weight.copy_(q)
            layer.self_attn.k_proj.weight.copy_(k.view(NKV, HS, -1).flip(0).reshape(NKV * HS, -1) if plant else k)
            layer.self_attn.v_proj.weight.copy_(v)
            layer.self_attn.o_proj.weight.copy_(params["attprojw"][l])
            gate, up = params["fcw"][l].split(F_, dim=0)
            layer.mlp.gate_proj.weight.copy_(gate)
            layer.mlp.up_proj.weight.copy_(up)
            layer.mlp.down_proj.weight.copy_(params["fcprojw"][l])
            layer.input_layernorm.weight.copy_(params["attnnormw"][l])
            layer.post_attention_layernorm.weight.copy_(params["mlpnormw"][l])
        m.model.norm.weight.copy_(params["normfw"])
        if not cfg.tied:
            m.lm_head.weight.copy_(params["lmheadw"])
    if cfg.tied and m.lm_head.weight.data_ptr() != m.model.embed_tokens.weight.data_ptr():
        raise RuntimeError("transformers did not tie lm_head to embed_tokens")
    return m


def hf_grads(cfg, m):
    """transformers' gradients stacked into train_llama3.py's tensors."""
    L = m.model.layers
    g = {
        "wte": m.model.embed_tokens.weight.grad,
        "attnnormw": torch.stack([x.input_layernorm.weight.grad for x in L]),
        "qkvw": torch.stack([torch.cat([x.self_attn.q_proj.weight.grad, x.self_attn.k_proj.weight.grad,
                                        x.self_attn.v_proj.weight.grad]) for x in L]),
        "attprojw": torch.stack([x.self_attn.o_proj.weight.grad for x in L]),
        "mlpnormw": torch.stack([x.post_attention_layernorm.weight.grad for x in L]),
        "fcw": torch.stack([torch.cat([x.mlp.gate_proj.weight.grad, x.mlp.up_proj.weight.grad]) for x in L]),
        "fcprojw": torch.stack([x.mlp.down_proj.weight.grad for x in L]),
        "normfw": m.model.norm.weight.grad,
    }
    if not cfg.tied:
        g["lmheadw"] = m.lm_head.weight.grad
    return g


def compare(cfg, T, seed, plant=False):
    """Max abs differences of logits, loss and weight gradients for one batch of 2 x T tokens."""
    params = ref.init_params(cfg, seed)
    gen = torch.Generator().manual_seed(seed)
    for name in ("attnnormw", "mlpnormw", "normfw"):
        params[name] = 1 + 0.3 * torch.randn(params[name].shape, generator=gen)
    idx = torch.randint(0, cfg.vocab_size, (2, T + 1), generator=gen)
    x, y = idx[:, :-1], idx[:, 1:]
    ours = ref.Llama(cfg, params)
    logits = ours(x)
    loss = ours.loss_sum(logits, y) / y.numel()
    loss.backward()
    m = hf_model(cfg, params, plant)
    out = m(input_ids=x)
    hl = out.logits
    hloss = torch.nn.functional.cross_entropy(hl[..., :cfg.vocab_size].reshape(-1, cfg.vocab_size), y.reshape(-1))
    hloss.backward()
    hg = hf_grads(cfg, m)
    d_logits = float((logits - hl).abs().max().detach())
    d_loss = abs(loss.item() - hloss.item())
    d_grad = max(float((getattr(ours, n).grad - hg[n]).abs().max()) for n in ref.param_names(cfg))
    return d_logits, d_loss, d_grad


def main():
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("--tol", type=float, default=1e-5, help="largest absolute difference allowed (default 1e-5)")
    args = ap.parse_args()
    torch.manual_seed(0)
    small = ref.SMALL
    # a short original context, so that positions below max_seq_len already reach the scaled band
    scaled = replace(small, rope_theta=10000.0, rope_original_max_position=32)
    cases = [
        ("GQA NH=4 NKV=2, tied, Llama 3.1 scaling", scaled),
        ("GQA NH=4 NKV=2, untied, Llama 3.1 scaling", replace(scaled, tied=False)),
        ("MQA NH=4 NKV=1, untied, no scaling", replace(small, num_kv_heads=1, tied=False, rope_factor=1.0)),
        ("MHA NH=4 NKV=4, tied, theta 5e5 scaling", replace(small, num_kv_heads=4)),
    ]
    passed = failed = 0
    for k, (what, cfg) in enumerate(cases):
        d_logits, d_loss, d_grad = compare(cfg, 48, 100 + k)
        ok = max(d_logits, d_loss, d_grad) <= args.tol
        passed, failed = passed + ok, failed + (not ok)
        print(f"{'PASS' if ok else 'FAIL'} {what}: max |diff| logits {d_logits:.2e}, loss {d_loss:.2e}, "
              f"weight grads {d_grad:.2e} (<= {args.tol:g})")
    # the bound can fail: the same comparison with the key heads swapped on the transformers side
    d_logits, d_loss, d_grad = compare(cases[0][1], 48, 100, plant=True)
    ok = max(d_logits, d_loss, d_grad) > args.tol
    passed, failed = passed + ok, failed + (not ok)
    print(f"{'PASS' if ok else 'FAIL'} planted: transformers given the key heads reversed is rejected "
          f"(max |diff| logits {d_logits:.2e}, weight grads {d_grad:.2e} > {args.tol:g})")
    print(f"check_llama3_vs_hf: {passed} passed, {failed} failed")
    sys.exit(0 if failed == 0 else 1)


if __name__ == "__main__":
    main()
