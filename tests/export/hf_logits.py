#!/usr/bin/python3
"""An independent reader of Loom's Hugging Face export.

Written from the published formats, not from Loom's code: the safetensors
file layout (an 8-byte little-endian header length, a JSON header of
{name: {dtype, shape, data_offsets}}, then the raw data), config.json as
Hugging Face's GPT-2 and Llama read it, and the two architectures as their
papers and Hugging Face's modeling code define them (GPT-2: Conv1D weights
[in, out], gelu_new, learned positions, tied head; Llama: RMSNorm, rotary
embeddings in the rotate_half form, grouped key/value heads, SwiGLU,
untied head). Uses Debian's python3-torch for the arithmetic only.

Usage: hf_logits.py EXPORT_DIR ID [ID ...]
Prints the logits of the last position as one line of space-separated
floats (repr precision), after a first line naming the architecture.
"""
import json
import math
import struct
import sys

import torch


def load_safetensors(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n).decode("utf-8"))
        data = f.read()
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] != "F32":
            raise SystemExit(f"{name}: dtype {info['dtype']}, expected F32")
        begin, end = info["data_offsets"]
        t = torch.frombuffer(bytearray(data[begin:end]), dtype=torch.float32)
        tensors[name] = t.reshape(info["shape"])
    return tensors


def causal_attention(q, k, v):
    # q, k, v: [heads, T, hd]
    t = q.shape[1]
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    mask = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)
    scores = scores.masked_fill(mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def gpt2_logits(cfg, w, ids):
    d, heads = cfg["n_embd"], cfg["n_head"]
    hd = d // heads
    eps = cfg["layer_norm_epsilon"]
    t = len(ids)
    x = w["transformer.wte.weight"][ids] + w["transformer.wpe.weight"][:t]

    def ln(h, name):
        return torch.nn.functional.layer_norm(h, (d,), w[name + ".weight"], w[name + ".bias"], eps)

    def conv1d(h, name):  # Conv1D: x @ W[in, out] + b
        return h @ w[name + ".weight"] + w[name + ".bias"]

    def gelu_new(h):
        return 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * h ** 3)))

    for i in range(cfg["n_layer"]):
        p = f"transformer.h.{i}."
        qkv = conv1d(ln(x, p + "ln_1"), p + "attn.c_attn")
        q, k, v = qkv.split(d, dim=-1)
        q, k, v = (m.reshape(t, heads, hd).transpose(0, 1) for m in (q, k, v))
        y = causal_attention(q, k, v).transpose(0, 1).reshape(t, d)
        x = x + conv1d(y, p + "attn.c_proj")
        x = x + conv1d(gelu_new(conv1d(ln(x, p + "ln_2"), p + "mlp.c_fc")), p + "mlp.c_proj")
    x = ln(x, "transformer.ln_f")
    return x @ w["transformer.wte.weight"].T


def llama_logits(cfg, w, ids):
    d, heads, kv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = d // heads
    eps, theta = cfg["rms_norm_eps"], cfg["rope_theta"]
    t = len(ids)

    def rms(h, weight):
        return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps) * weight

    inv_freq = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    angles = torch.outer(torch.arange(t, dtype=torch.float64), inv_freq).float()
    emb = torch.cat([angles, angles], dim=-1)
    cos, sin = emb.cos(), emb.sin()

    def rotate_half(h):
        h1, h2 = h[..., : hd // 2], h[..., hd // 2:]
        return torch.cat([-h2, h1], dim=-1)

    def rope(h):  # [heads, T, hd]
        return h * cos + rotate_half(h) * sin

    x = w["model.embed_tokens.weight"][ids]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        a = rms(x, w[p + "input_layernorm.weight"])
        q = (a @ w[p + "self_attn.q_proj.weight"].T).reshape(t, heads, hd).transpose(0, 1)
        k = (a @ w[p + "self_attn.k_proj.weight"].T).reshape(t, kv, hd).transpose(0, 1)
        v = (a @ w[p + "self_attn.v_proj.weight"].T).reshape(t, kv, hd).transpose(0, 1)
        q, k = rope(q), rope(k)
        k = k.repeat_interleave(heads // kv, dim=0)  # Hugging Face's repeat_kv
        v = v.repeat_interleave(heads // kv, dim=0)
        y = causal_attention(q, k, v).transpose(0, 1).reshape(t, d)
        x = x + y @ w[p + "self_attn.o_proj.weight"].T
        m = rms(x, w[p + "post_attention_layernorm.weight"])
        gate = m @ w[p + "mlp.gate_proj.weight"].T
        up = m @ w[p + "mlp.up_proj.weight"].T
        x = x + (torch.nn.functional.silu(gate) * up) @ w[p + "mlp.down_proj.weight"].T
    x = rms(x, w["model.norm.weight"])
    return x @ w["lm_head.weight"].T


def main():
    out_dir, ids = sys.argv[1], [int(a) for a in sys.argv[2:]]
    with open(out_dir + "/config.json") as f:
        cfg = json.load(f)
    w = load_safetensors(out_dir + "/model.safetensors")
    with torch.no_grad():
        if cfg["model_type"] == "gpt2":
            logits = gpt2_logits(cfg, w, ids)
        elif cfg["model_type"] == "llama":
            logits = llama_logits(cfg, w, ids)
        else:
            raise SystemExit("unknown model_type " + cfg["model_type"])
    print(cfg["model_type"])
    print(" ".join(repr(float(v)) for v in logits[-1]))


if __name__ == "__main__":
    main()
