"""PyTorch oracle and benchmark anchor for runtime.models.transformer (run with the Python 3.11 torch env).

Independent of `runtime`: it rebuilds the same architecture from standard torch modules.

    python torch_oracle.py IN.npz OUT.npz
        IN holds "config" (JSON text), "idx" (B, T), "targets" (B, T) and "param.<name>" weights in the runtime's
        naming; OUT gets "logits", "loss" and "grad.<name>" for every parameter (float32, computed in float32).
    python torch_oracle.py --bench --config JSON [--batch 16] [--seq 64] [--steps 20] [--warmup 3] [--threads 2]
        Prints JSON with tokens/s of forward + backward + Adam steps on random bytes.
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812 - torch's usual alias
from torch import nn


class CausalSelfAttention(nn.Module):
    def __init__(self, config: dict) -> None:
        super().__init__()
        self.n_head = config["n_head"]
        self.c_attn = nn.Linear(config["n_embd"], 3 * config["n_embd"], bias=config["bias"])
        self.c_proj = nn.Linear(config["n_embd"], config["n_embd"], bias=config["bias"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.c_attn(x).split(width, dim=2)
        q, k, v = (t.view(batch, length, self.n_head, width // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, nh, T, hs)
        return self.c_proj(y.transpose(1, 2).contiguous().view(batch, length, width))


class MLP(nn.Module):
    def __init__(self, config: dict) -> None:
        super().__init__()
        self.c_fc = nn.Linear(config["n_embd"], 4 * config["n_embd"], bias=config["bias"])
        self.c_proj = nn.Linear(4 * config["n_embd"], config["n_embd"], bias=config["bias"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, config: dict) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config["n_embd"], bias=config["bias"])
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config["n_embd"], bias=config["bias"])
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Transformer(nn.Module):
    def __init__(self, config: dict) -> None:
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config["vocab_size"], config["n_embd"])
        self.wpe = nn.Embedding(config["context"], config["n_embd"])
        self.blocks = nn.ModuleList(Block(config) for _ in range(config["n_layer"]))
        self.ln_f = nn.LayerNorm(config["n_embd"], bias=config["bias"])
        self.lm_head = None if config["tied_head"] else nn.Linear(config["n_embd"], config["vocab_size"], bias=False)
        for name, parameter in self.named_parameters():  # GPT-2 style, only used by the benchmark
            if name.endswith(".bias"):
                nn.init.zeros_(parameter)
            elif ".ln_" in name or name.startswith("ln_f."):
                nn.init.ones_(parameter)
            else:
                std = 0.02 / math.sqrt(2 * config["n_layer"]) if name.endswith("c_proj.weight") else 0.02
                nn.init.normal_(parameter, 0.0, std)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        positions = torch.arange(idx.shape[1])
        x = self.wte(idx) + self.wpe(positions)
        for block in self.blocks:
            x = block(x)
        x = self.ln_f(x)
        head = self.wte.weight if self.lm_head is None else self.lm_head.weight
        logits = F.linear(x, head)
        loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100)
        return logits, loss


def run_grads(in_path: str, out_path: str) -> None:
    data = np.load(in_path)
    config = json.loads(str(data["config"]))
    model = Transformer(config)
    own = dict(model.named_parameters())
    given = {key[len("param.") :]: data[key] for key in data.files if key.startswith("param.")}
    if set(given) != set(own):
        sys.exit(f"parameter names differ: only runtime {sorted(set(given) - set(own))}, "
                 f"only torch {sorted(set(own) - set(given))}")
    with torch.no_grad():
        for name, parameter in own.items():
            parameter.copy_(torch.from_numpy(given[name].astype(np.float32)))
    logits, loss = model(torch.from_numpy(data["idx"]).long(), torch.from_numpy(data["targets"]).long())
    loss.backward()
    result = {"logits": logits.detach().numpy(), "loss": loss.detach().numpy()}
    result.update({f"grad.{name}": parameter.grad.numpy() for name, parameter in own.items()})
    np.savez(out_path, **result)


def run_bench(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    config = json.loads(args.config)
    model = Transformer(config)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    rng = np.random.default_rng(args.seed)
    tokens = torch.from_numpy(rng.integers(0, config["vocab_size"], (args.batch, args.seq + 1))).long()
    loss = torch.zeros(())

    def step() -> None:
        nonlocal loss
        _, loss = model(tokens[:, :-1], tokens[:, 1:])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    for _ in range(args.warmup):
        step()
    step_seconds = []
    cpu_start = time.process_time()
    for _ in range(args.steps):
        start = time.perf_counter()
        step()
        step_seconds.append(time.perf_counter() - start)
    elapsed = sum(step_seconds)
    cpu_seconds = time.process_time() - cpu_start
    print(json.dumps({
        "engine": f"torch {torch.__version__}",
        "threads": args.threads,
        "steps": args.steps,
        "batch": args.batch,
        "seq": args.seq,
        "seconds_per_step": elapsed / args.steps,
        "tokens_per_second": args.batch * args.seq * args.steps / elapsed,
        "cpu_seconds_per_step": cpu_seconds / args.steps,  # all threads together
        "best_seconds_per_step": min(step_seconds),  # robust to other load on the machine
        "final_loss": float(loss.detach()),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("in_path", nargs="?", help="npz with config, idx, targets and param.<name> weights")
    parser.add_argument("out_path", nargs="?", help="npz to write logits, loss and grad.<name> into")
    parser.add_argument("--bench", action="store_true", help="measure training throughput instead")
    parser.add_argument("--config", help="TransformerConfig as JSON (bench mode)")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.bench:
        if not args.config:
            parser.error("--bench needs --config")
        run_bench(args)
    elif args.in_path and args.out_path:
        run_grads(args.in_path, args.out_path)
    else:
        parser.error("give IN.npz OUT.npz, or --bench --config JSON")


if __name__ == "__main__":
    main()
