"""PyTorch eager baseline of the GPU benchmark (loom_gpu_check bench,
bench/gpu/gpu_check_bench.cc, which runs it and reads its last line).

The model, batch and optimizer work of the Loom side (loom::engine::Train
on the same shape), written as plain PyTorch, as bench/train_pytorch.py does
for the CPU benchmark: GPT-2 (Radford et al. 2019): token + learned position
embeddings, pre-LayerNorm blocks of causal multi-head attention
(F.scaled_dot_product_attention; an explicit masked softmax on torch 1.x,
which has none) and a 4x MLP with tanh GELU, final LayerNorm, LM head tied
to the token embedding, dropout 0. Init as nanoGPT's _init_weights. bf16:
the forward under torch.autocast (as nanoGPT), fp32 master weights.
torch.optim.AdamW with its defaults for the device (foreach on CUDA),
lr 3e-4 held, betas 0.9/0.95, eps 1e-8, weight decay 0.1 on parameters
with dim >= 2, clip_grad_norm_ at 1.0; zero_grad(set_to_none) as the
default; the loss read with .item() every step, as the engine does.
Batches of uniformly random ids, made on the device.

Usage: gpt_eager.py --device cuda --dtype bf16 --layers 24 --d-model 2048
         --heads 16 --seq-len 2048 --vocab 50304 --batch 8 --steps 13 --warmup 3
Last line:
  EAGER tokens_per_second=<x> median_step_seconds=<x> loss_first=<x>
        loss_last=<x> peak_allocated_bytes=<n> parameters=<n> torch=<version>
"""

import argparse
import contextlib
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

INIT_STD = 0.02
LR, BETAS, EPS, WEIGHT_DECAY, GRAD_CLIP = 3e-4, (0.9, 0.95), 1e-8, 0.1, 1.0


class CausalSelfAttention(nn.Module):
    def __init__(self, d, heads, seq_len):
        super().__init__()
        self.heads = heads
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)
        self.sdpa = hasattr(F, "scaled_dot_product_attention")
        if not self.sdpa:
            self.register_buffer(
                "future", torch.ones(seq_len, seq_len, dtype=torch.bool).triu(1),
                persistent=False)

    def forward(self, x):
        b, t, d = x.shape
        hd = d // self.heads
        q, k, v = self.c_attn(x).split(d, dim=2)
        q = q.view(b, t, self.heads, hd).transpose(1, 2)
        k = k.view(b, t, self.heads, hd).transpose(1, 2)
        v = v.view(b, t, self.heads, hd).transpose(1, 2)
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
            att = att.masked_fill(self.future[:t, :t], float("-inf"))
            y = torch.matmul(torch.softmax(att, dim=-1), v)
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, d))


class Block(nn.Module):
    def __init__(self, d, heads, seq_len):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d, eps=1e-5)
        self.attn = CausalSelfAttention(d, heads, seq_len)
        self.ln_2 = nn.LayerNorm(d, eps=1e-5)
        self.c_fc = nn.Linear(d, 4 * d)
        self.c_proj = nn.Linear(4 * d, d)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.c_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class Gpt(nn.Module):
    def __init__(self, layers, d, heads, seq_len, vocab):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(seq_len, d)
        self.h = nn.ModuleList(Block(d, heads, seq_len) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d, eps=1e-5)
        residual_std = INIT_STD / math.sqrt(2 * layers)  # GPT-2 section 2.3
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith("c_proj.weight"):
                    p.normal_(0.0, residual_std)
                elif name.endswith("bias"):
                    p.zero_()
                elif p.dim() >= 2:
                    p.normal_(0.0, INIT_STD)
                else:
                    p.fill_(1.0)

    def forward(self, idx):
        pos = torch.arange(idx.size(1), dtype=torch.long, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        return F.linear(self.ln_f(x), self.wte.weight)  # tied LM head


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16")
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--d-model", type=int, default=2048)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--vocab", type=int, default=50304)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=13)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args()
    if args.steps <= args.warmup or args.warmup < 0:
        parser.error("need steps > warmup >= 0")
    device = torch.device(args.device)
    cuda = device.type == "cuda"

    torch.manual_seed(1)
    # Built on the device where torch can (2.x): a CPU init of 1.3B
    # parameters would take longer than the benchmark.
    where = torch.device(device) if hasattr(torch.device, "__enter__") else contextlib.nullcontext()
    with where:
        model = Gpt(args.layers, args.d_model, args.heads, args.seq_len, args.vocab)
    model.to(device).train()
    params = list(model.parameters())
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": WEIGHT_DECAY},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=LR, betas=BETAS, eps=EPS)
    autocast = (torch.autocast(device_type=device.type, dtype=torch.bfloat16)
                if args.dtype == "bf16" else contextlib.nullcontext())

    g = torch.Generator(device=device).manual_seed(42)

    def step():
        batch = torch.randint(0, args.vocab, (args.batch, args.seq_len + 1), generator=g,
                              device=device)
        x, y = batch[:, :-1], batch[:, 1:]
        optimizer.zero_grad(set_to_none=True)
        with autocast:
            logits = model(x)
        loss = F.cross_entropy(logits.float().view(-1, args.vocab), y.reshape(-1))
        loss.backward()
        value = loss.item()
        torch.nn.utils.clip_grad_norm_(params, GRAD_CLIP)
        optimizer.step()
        return value

    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    seconds, losses = [], []
    for _ in range(args.steps):
        if cuda:
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        losses.append(step())
        if cuda:
            torch.cuda.synchronize(device)
        seconds.append(time.perf_counter() - start)
    timed = seconds[args.warmup:]
    median = statistics.median(timed)
    tokens_per_second = args.batch * args.seq_len / median
    peak = torch.cuda.max_memory_allocated(device) if cuda else 0
    n_params = sum(p.numel() for p in params)
    print(f"pytorch eager: {tokens_per_second:.0f} tok/s, median step {median * 1e3:.1f} ms over "
          f"{len(timed)} steps ({args.warmup} warm-up), {n_params} parameters, {args.dtype}, "
          f"loss {losses[0]:.3f} -> {losses[-1]:.3f}, torch {torch.__version__}, "
          f"AdamW {'foreach' if cuda else 'for-loop'} (the default)")
    print(f"EAGER tokens_per_second={tokens_per_second:.3f} median_step_seconds={median:.6f} "
          f"loss_first={losses[0]:.6f} loss_last={losses[-1]:.6f} peak_allocated_bytes={peak} "
          f"parameters={n_params} torch={torch.__version__}")


if __name__ == "__main__":
    main()
