"""The PyTorch peer: a nanoGPT-shaped GPT in PyTorch, trained as the trainer trains.

Runs only inside the torch venv (bench/torch_env.py), as a script: it imports nothing of this
project. The model is nanoGPT's (Karpathy's model.py), written out here at the resolved
config's shape: learned token and position embeddings, n_layer pre-LayerNorm blocks (causal
self-attention through `scaled_dot_product_attention`, one fused QKV projection; an MLP of
d_ff with exact GELU), a final LayerNorm and logits through the tied token embedding, biases
everywhere (GPT-2's), N(0, 0.02) init. The optimizer is AdamW with the trainer's settings:
warmup + cosine schedule to the peak its run plan derives (passed in), weight decay on matrices
only, betas, global clipping; `fused=True`, PyTorch's one-kernel update (the trainer's is
FusedAdamW), so each side takes its fastest path.

Input: the same Examples' windows, which the bench reads with TensorFlow and hands over as a
raw int32 file of (windows, seq_len + 1) (this venv has no TensorFlow); batches are drawn from
it by a seeded permutation in memory, so the input costs nothing, as the trainer's does not
stall (bench/input_bench.py).

    python bench/peer_torch.py speed --windows FILE --config-json JSON --steps N [--compile]
    python bench/peer_torch.py matmul --n 2048

Each prints one JSON line. `speed` times steps as the trainer's TrainMonitor does: wall time
from the first step's loss on the host to the last step's (the first step, which
`torch.compile` compiles, is not timed; its seconds are reported as `first_step_s`).
`matmul` is the best FLOP/s of an n x n float32 matmul, as bench/mfu_bench.py times
TensorFlow's: the best of a few half-second repetitions.
"""

from __future__ import annotations

import argparse
import json
import math
import time

import torch
from torch import nn
from torch.nn import functional as F


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("mode", choices=("speed", "matmul"))
    p.add_argument("--windows", help="speed: raw int32 file of (windows, seq_len + 1) tokens")
    p.add_argument("--config-json", help="speed: trainer.config.config_to_dict JSON")
    p.add_argument("--steps", type=int, default=16, help="speed: steps to train")
    p.add_argument("--peak-lr", type=float, default=0.0, help="speed: the trainer's plan's")
    p.add_argument("--compile", action="store_true", help="speed: torch.compile the model")
    p.add_argument("--n", type=int, default=2048, help="matmul: the square's side")
    p.add_argument("--threads", type=int, default=0, help="intra- and inter-op threads")
    return p.parse_args()


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model: int, n_head: int):
        super().__init__()
        self.n_head = n_head
        self.c_attn = nn.Linear(d_model, 3 * d_model)
        self.c_proj = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, H, T, D)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, T, D)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class Block(nn.Module):
    def __init__(self, d_model: int, n_head: int, d_ff: int, eps: float):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d_model, eps=eps)
        self.attn = CausalSelfAttention(d_model, n_head)
        self.ln_2 = nn.LayerNorm(d_model, eps=eps)
        self.c_fc = nn.Linear(d_model, d_ff)
        self.c_proj = nn.Linear(d_ff, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.c_proj(F.gelu(self.c_fc(self.ln_2(x))))


class GPT(nn.Module):
    def __init__(self, m: dict):
        super().__init__()
        d = m["d_model"]
        self.wte = nn.Embedding(m["vocab_size"], d)
        self.wpe = nn.Embedding(m["seq_len"], d)
        eps = m["layer_norm_epsilon"]
        self.h = nn.ModuleList(Block(d, m["n_head"], m["d_ff"], eps) for _ in range(m["n_layer"]))
        self.ln_f = nn.LayerNorm(d, eps=eps)
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=m["init_std"])
            if isinstance(module, nn.Linear):
                nn.init.zeros_(module.bias)

    def forward(self, ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        T = ids.shape[1]
        x = self.wte(ids) + self.wpe(torch.arange(T, device=ids.device))  # (B, T, C)
        for block in self.h:
            x = block(x)
        logits = self.ln_f(x) @ self.wte.weight.t()  # (B, T, V): the tied embedding
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))


def learning_rate(step: int, peak: float, t: dict, total: int) -> float:
    """trainer/run_plan.py's `learning_rate_at`: linear warmup to `peak`, then cosine decay."""
    warmup = t["warmup_steps"]
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
    return peak * (t["min_lr_ratio"] + (1.0 - t["min_lr_ratio"]) * cosine)


def optimizer(model: nn.Module, t: dict) -> torch.optim.Optimizer:
    """AdamW as nanoGPT configures it: weight decay on matrices only; one fused kernel."""
    matrices = [p for p in model.parameters() if p.dim() >= 2]
    vectors = [p for p in model.parameters() if p.dim() < 2]
    groups = [
        {"params": matrices, "weight_decay": t["weight_decay"]},
        {"params": vectors, "weight_decay": 0.0},
    ]
    betas = (t["beta_1"], t["beta_2"])
    return torch.optim.AdamW(groups, lr=0.0, betas=betas, fused=True)


def speed(args: argparse.Namespace) -> dict:
    cfg = json.loads(args.config_json)
    m, t = cfg["model"], cfg["train"]
    torch.manual_seed(t["seed"])
    with open(args.windows, "rb") as f:
        data = torch.frombuffer(bytearray(f.read()), dtype=torch.int32)
    windows = data.view(-1, m["seq_len"] + 1).long()
    model = GPT(m)
    opt = optimizer(model, t)
    step_fn = torch.compile(model) if args.compile else model
    order = torch.randperm(len(windows), generator=torch.Generator().manual_seed(t["seed"]))
    batch = t["batch_size"]
    started = time.perf_counter()
    first_end = last_end = 0.0
    loss_value = float("nan")
    for step in range(args.steps):
        rows = order[(torch.arange(batch) + step * batch) % len(windows)]
        x, y = windows[rows, :-1], windows[rows, 1:]  # (B, T) each
        for group in opt.param_groups:
            group["lr"] = learning_rate(step, args.peak_lr, t, args.steps)
        loss = step_fn(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if t["grad_clip_norm"]:
            nn.utils.clip_grad_norm_(model.parameters(), t["grad_clip_norm"])
        opt.step()
        if step in (0, args.steps - 1):
            loss_value = loss.item()
            if step == 0:
                first_end = time.perf_counter()
            else:
                last_end = time.perf_counter()
    timed = args.steps - 1
    return {
        "tokens_per_second": batch * m["seq_len"] * timed / max(last_end - first_end, 1e-9),
        "timed_steps": timed,
        "first_step_s": first_end - started,
        "params": sum(p.numel() for p in model.parameters()),
        "final_loss": loss_value,
        "compiled": args.compile,
    }


def matmul(n: int, repeats: int = 8, seconds: float = 0.5) -> dict:
    a, b = torch.randn(n, n), torch.randn(n, n)
    started = time.perf_counter()
    torch.mm(a, b)
    calls = max(1, int(seconds / max(time.perf_counter() - started, 1e-6)))
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(calls):
            torch.mm(a, b)
        best = min(best, (time.perf_counter() - started) / calls)
    return {"flops_per_second": 2 * n**3 / best, "n": n}


def main() -> None:
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
        torch.set_num_interop_threads(args.threads)
    result = speed(args) if args.mode == "speed" else matmul(args.n)
    versions = {"torch": torch.__version__, "mkldnn": torch.backends.mkldnn.is_available()}
    print(json.dumps({**result, "versions": versions}))


if __name__ == "__main__":
    main()
