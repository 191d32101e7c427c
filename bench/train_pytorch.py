"""PyTorch eager baseline for the training-throughput benchmark
(`./bench/run.sh train`); bench/train_bench.cc is Loom's side, run.sh runs both.

The same model, initialisation, optimizer work, batch and threads as
loom::engine::Train in the benchmark (worker/engine/gpt.cc, optimizer.cc,
trainer.cc):
  GPT-2-style (Radford et al. 2019): token + learned position embeddings,
  4 pre-LayerNorm blocks of causal multi-head attention (4 heads, explicit
  masked softmax: torch 1.13 has no scaled_dot_product_attention) and a
  4x MLP with tanh GELU, final LayerNorm, LM head tied to the token
  embedding; d_model 256, vocab 50304, seq 256, dropout 0, fp32.
  Init (nanoGPT _init_weights): weights and embeddings ~ N(0, 0.02), the two
  residual projections (c_proj) ~ N(0, 0.02 / sqrt(2 * n_layer)), biases 0,
  LayerNorm gains 1.
  AdamW (lr 3e-4 constant, betas 0.9/0.95, eps 1e-8), weight decay 0.1 on
  parameters with dim >= 2, 0 on the rest; clip_grad_norm_ at 1.0;
  optimizer.zero_grad() with torch 1.13's default (zero-fill, as LibTorch's).
  Batch 8 x 256 tokens of uniformly random ids; the loss is read with
  .item() every step, as the engine does.

Run with Debian's interpreter: /usr/bin/python3 bench/train_pytorch.py
(bench/run.sh runs it in lockstep with Loom's side: --turn-in/--turn-out,
see class Turns).
Prints human-readable lines, then one machine-readable line
  PYTORCH_TRAIN tokens_per_second=<x> sgemm_flops_per_second=<x> ...
"""

import argparse
import math
import os
import select
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

N_LAYER, N_HEAD, D_MODEL, SEQ_LEN, VOCAB = 4, 4, 256, 256, 50304
BATCH = 8
LR, BETAS, EPS, WEIGHT_DECAY, GRAD_CLIP = 3e-4, (0.9, 0.95), 1e-8, 0.1, 1.0
INIT_STD = 0.02


class CausalSelfAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_attn = nn.Linear(D_MODEL, 3 * D_MODEL)
        self.c_proj = nn.Linear(D_MODEL, D_MODEL)
        # future[i][j] = True where j > i: query i may not attend to the future.
        self.register_buffer(
            "future", torch.ones(SEQ_LEN, SEQ_LEN, dtype=torch.bool).triu(1), persistent=False)

    def forward(self, x):
        b, t, d = x.shape
        hd = d // N_HEAD
        q, k, v = self.c_attn(x).split(d, dim=2)
        q = q.view(b, t, N_HEAD, hd).transpose(1, 2)
        k = k.view(b, t, N_HEAD, hd).transpose(1, 2)
        v = v.view(b, t, N_HEAD, hd).transpose(1, 2)
        att = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
        att = att.masked_fill(self.future[:t, :t], float("-inf"))
        att = torch.softmax(att, dim=-1)
        y = torch.matmul(att, v).transpose(1, 2).contiguous().view(b, t, d)
        return self.c_proj(y)


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_fc = nn.Linear(D_MODEL, 4 * D_MODEL)
        self.c_proj = nn.Linear(4 * D_MODEL, D_MODEL)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1 = nn.LayerNorm(D_MODEL, eps=1e-5)
        self.attn = CausalSelfAttention()
        self.ln_2 = nn.LayerNorm(D_MODEL, eps=1e-5)
        self.mlp = Mlp()

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Gpt(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(VOCAB, D_MODEL)
        self.wpe = nn.Embedding(SEQ_LEN, D_MODEL)
        self.h = nn.ModuleList(Block() for _ in range(N_LAYER))
        self.ln_f = nn.LayerNorm(D_MODEL, eps=1e-5)
        residual_std = INIT_STD / math.sqrt(2 * N_LAYER)  # GPT-2 section 2.3
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
        t = idx.size(1)
        pos = torch.arange(t, dtype=torch.long)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        x = self.ln_f(x)
        return F.linear(x, self.wte.weight)  # tied LM head


def sgemm_flops(n=2048, repeats=5):
    """Best of `repeats` n^3 fp32 matmuls after one warm-up (as
    loom::telemetry::MeasureGemmFlopsPerSecond)."""
    with torch.no_grad():
        a, b = torch.rand(n, n), torch.rand(n, n)
        torch.mm(a, b)
        best = 0.0
        for _ in range(repeats):
            start = time.perf_counter()
            torch.mm(a, b)
            best = max(best, 2.0 * n ** 3 / (time.perf_counter() - start))
    return best


class Turns:
    """Lockstep with Loom's side (train_bench.cc, class Turns): the two
    processes take turns through a pair of FIFOs, one byte passing the turn,
    so each side's timed work runs while the other is idle and both see the
    same background load. Loom takes the first turn; both take the same
    number. Without paths, acquire and release do nothing."""

    TIMEOUT_SECONDS = 600

    def __init__(self, in_path, out_path):
        self.enabled = bool(in_path)
        if self.enabled:
            # O_RDWR: does not wait for the other end, and keeps a reader on
            # `out`, so a write never raises SIGPIPE.
            self.fd_in = os.open(in_path, os.O_RDWR)
            self.fd_out = os.open(out_path, os.O_RDWR)

    def acquire(self):
        if not self.enabled:
            return
        ready, _, _ = select.select([self.fd_in], [], [], self.TIMEOUT_SECONDS)
        if not ready or os.read(self.fd_in, 1) != b"t":
            sys.exit("lockstep with the Loom side broke: it did not pass the turn in time")

    def release(self):
        if self.enabled:
            os.write(self.fd_out, b"t")


def blas_core():
    """OpenBLAS's kernel set, as train_bench.cc's BlasCoreName reports it."""
    try:
        import ctypes
        fn = ctypes.CDLL("libblas.so.3").openblas_get_corename
        fn.restype = ctypes.c_char_p
        return "OpenBLAS " + fn().decode()
    except (OSError, AttributeError):
        return "not OpenBLAS"


class SgemmSampler:
    """One 2048^3 fp32 matmul per sample on tensors made once, keeping the
    best rate (train_bench.cc, SgemmSampler); sampled after every step."""

    def __init__(self, n=2048):
        self.n = n
        self.a, self.b = torch.rand(n, n), torch.rand(n, n)
        self.c = torch.mm(self.a, self.b)  # warm-up
        self.best = 0.0

    def sample(self):
        with torch.no_grad():
            start = time.perf_counter()
            torch.mm(self.a, self.b, out=self.c)
            self.best = max(self.best, 2.0 * self.n ** 3 / (time.perf_counter() - start))


def op_class(name):
    classes = [
        (("aten::addmm", "aten::mm", "aten::bmm"), "matmul"),
        (("aten::_log_softmax", "aten::nll_loss"), "LM loss: log_softmax + nll, fwd + bwd"),
        (("aten::zero_", "aten::fill_"), "zero-fill (zero_grad, grad buffers)"),
        (("aten::_softmax",), "attention softmax, fwd + bwd"),
        (("aten::gelu",), "gelu, fwd + bwd"),
        (("aten::native_layer_norm",), "layer_norm, fwd + bwd"),
        (("aten::embedding",), "embedding, fwd + bwd"),
        (("aten::copy_", "aten::_to_copy", "aten::clone"), "copy / dtype conversion"),
        (("aten::sum",), "reductions (sum)"),
        (("aten::add", "aten::mul", "aten::div", "aten::sqrt", "aten::addcdiv", "aten::addcmul",
          "aten::pow", "aten::lerp", "aten::sub", "aten::neg", "aten::masked_fill",
          "aten::maximum", "aten::where", "aten::norm", "aten::linalg_vector_norm",
          "aten::clamp", "aten::stack", "aten::_foreach"),
         "elementwise (AdamW, clip, residuals, grad accumulation)"),
    ]
    for prefixes, cls in classes:
        if name.startswith(prefixes):
            return cls
    return "other (dispatch, views, autograd bookkeeping)"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=23)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--profile-steps", type=int, default=0,
                        help="extra steps, each under torch.profiler; the fastest is split "
                             "by operator")
    parser.add_argument("--turn-in", default="", help="FIFO: lockstep turns from Loom's side")
    parser.add_argument("--turn-out", default="", help="FIFO: lockstep turns to Loom's side")
    args = parser.parse_args()
    if bool(args.turn_in) != bool(args.turn_out):
        parser.error("--turn-in and --turn-out go together")
    turns = Turns(args.turn_in, args.turn_out)
    if args.steps <= args.warmup or args.warmup < 0:
        parser.error("need steps > warmup >= 0")
    torch.set_num_threads(args.threads)
    # The sgemm reference: best of 5 before the first step and after the last
    # (in lockstep, in those steps' turns), and one sample after every step.
    sgemm_before = sgemm_after = 0.0
    if not turns.enabled:
        sgemm_before = sgemm_flops()

    torch.manual_seed(1)
    model = Gpt()
    model.train()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": WEIGHT_DECAY},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=LR, betas=BETAS, eps=EPS)
    params = list(model.parameters())
    n_params = sum(p.numel() for p in params)

    tokens_per_step = BATCH * SEQ_LEN
    total_steps = args.steps + args.profile_steps
    g = torch.Generator().manual_seed(42)
    data = torch.randint(0, VOCAB, (total_steps * tokens_per_step + 1,), generator=g)

    def step(i):
        chunk = data[i * tokens_per_step:(i + 1) * tokens_per_step + 1]
        x = chunk[:-1].view(BATCH, SEQ_LEN)
        y = chunk[1:].view(BATCH, SEQ_LEN)
        optimizer.zero_grad()
        logits = model(x)
        loss = F.cross_entropy(logits.view(-1, VOCAB), y.reshape(-1))
        loss.backward()
        value = loss.item()
        torch.nn.utils.clip_grad_norm_(params, GRAD_CLIP)
        for group in optimizer.param_groups:
            group["lr"] = LR
        optimizer.step()
        return value

    step_seconds, losses = [], []
    sampler = SgemmSampler()
    turns.release()  # Loom's side takes the first turn
    for i in range(args.steps):
        turns.acquire()
        if turns.enabled and i == 0:
            sgemm_before = sgemm_flops()
        start = time.perf_counter()
        losses.append(step(i))
        step_seconds.append(time.perf_counter() - start)
        sampler.sample()
        if turns.enabled and i == args.steps - 1:
            sgemm_after = sgemm_flops()
        turns.release()
    if not turns.enabled:
        sgemm_after = sgemm_flops()
    sgemm = max(sgemm_before, sgemm_after, sampler.best)

    measured = step_seconds[args.warmup:]
    median = statistics.median(measured)
    tokens_per_second = tokens_per_step / median
    print(f"pytorch sgemm: {sgemm / 1e9:.1f} GFLOP/s (2048^3 fp32 torch.mm, {args.threads} "
          f"threads; best of 5 before training {sgemm_before / 1e9:.1f}, of 5 after "
          f"{sgemm_after / 1e9:.1f}, of one after each step {sampler.best / 1e9:.1f}; "
          f"BLAS: {blas_core()}; torch {torch.__version__})")
    print(f"pytorch: {tokens_per_second:.1f} tok/s, median step {median:.3f} s over "
          f"{len(measured)} steps (min {min(measured):.3f}, max {max(measured):.3f}; "
          f"{args.warmup} warm-up), {n_params} parameters; "
          f"loss {losses[0]:.3f} -> {losses[-1]:.3f}")

    if args.profile_steps > 0:
        # One step per profiler session; the fastest (least disturbed by other
        # load on the cores) is split by operator self time.
        from torch.profiler import ProfilerActivity, profile
        best = None
        turns.acquire()
        for i in range(args.profile_steps):
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                start = time.perf_counter()
                step(args.steps + i)
                seconds = time.perf_counter() - start
            if best is None or seconds < best[0]:
                best = (seconds, prof.key_averages())
        turns.release()
        seconds, averages = best
        total = sum(e.self_cpu_time_total for e in averages) / 1e6
        by_class = {}
        for e in averages:
            cls = op_class(e.key)
            by_class[cls] = by_class.get(cls, 0.0) + e.self_cpu_time_total / 1e6
        print(f"pytorch profile, operators (fastest of {args.profile_steps} steps under "
              f"torch.profiler, {seconds:.3f} s; self time, {total:.3f} s attributed):")
        for cls, s in sorted(by_class.items(), key=lambda kv: -kv[1]):
            print(f"  class {cls:<56} {s:7.3f} s  {100 * s / total:5.1f}%")
        for e in sorted(averages, key=lambda e: -e.self_cpu_time_total)[:15]:
            s = e.self_cpu_time_total / 1e6
            print(f"  op    {e.key:<56} {s:7.3f} s  {100 * s / total:5.1f}%")

    print(f"PYTORCH_TRAIN tokens_per_second={tokens_per_second:.3f} "
          f"sgemm_flops_per_second={sgemm:.1f} median_step_seconds={median:.6f} "
          f"min_step_seconds={min(measured):.6f} "
          f"steps={len(measured)} threads={args.threads} parameters={n_params}")


if __name__ == "__main__":
    main()
