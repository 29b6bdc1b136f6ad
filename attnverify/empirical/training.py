"""Paper B's evidence for easing gradient vanishing: gradient histories during a short training run.

Paper B [stated, docs/THEORY.md §8] shows gradient histories *during training*, softmax against
daGPAM. Here [choice] a small pre-norm (LayerNorm) decoder — ``layers`` blocks of single-head
causal attention and a 4× MLP, width ``width``, byte-level tokens (ids 0–255) — is trained for
``steps`` Adam steps on next-byte prediction over windows of the text, once with softmax
attention and once per daGPAM setting, from the same initial weights and the same batches. Every
``log_every`` steps the Frobenius norm of the gradient of each layer's query weight ``W_Q``
(``W_Q⁺`` for daGPAM) and of all its attention weights is recorded, with the loss.

daGPAM with two parameters [choice]: ``P = (1 + λ⁺)·softmax(Q⁺Kᵀ/√d) − λ⁻·softmax(Q⁻Kᵀ/√d)``,
``Q⁻ = ReLU(Q⁺)·W_Q⁻``, causal; λ⁺ = λ⁻ = λ is paper B's one-λ form (rows sum to 1); otherwise
every row sums to the fixed total ``1 + λ⁺ − λ⁻``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from attnverify.empirical.collapse import kind_name


class Attention(nn.Module):
    def __init__(self, width: int, lam_pos: float, lam_neg: float):
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(width, width, bias=False) for _ in range(4))
        self.q_neg = nn.Linear(width, width, bias=False) if (lam_pos or lam_neg) else None
        self.lam_pos, self.lam_neg = lam_pos, lam_neg

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, d = x.shape[-2], x.shape[-1]
        q, k, v = self.q(x), self.k(x), self.v(x)
        mask = torch.ones(n, n, dtype=torch.bool, device=x.device).triu(1)
        scores = (q @ k.transpose(-1, -2) / math.sqrt(d)).masked_fill(mask, float("-inf"))
        p = torch.softmax(scores, dim=-1)
        if self.q_neg is not None:
            neg = self.q_neg(torch.relu(q)) @ k.transpose(-1, -2) / math.sqrt(d)
            p_neg = torch.softmax(neg.masked_fill(mask, float("-inf")), dim=-1)
            p = (1 + self.lam_pos) * p - self.lam_neg * p_neg
        return self.o(p @ v)


class Block(nn.Module):
    def __init__(self, width: int, lam_pos: float, lam_neg: float):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attn = Attention(width, lam_pos, lam_neg)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(),
                                 nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class TinyDecoder(nn.Module):
    def __init__(self, layers: int, width: int, context: int, lam_pos=0.0, lam_neg=0.0):
        super().__init__()
        self.embed = nn.Embedding(256, width)
        self.position = nn.Parameter(torch.zeros(context, width))
        self.blocks = nn.ModuleList(Block(width, lam_pos, lam_neg) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, 256, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids) + self.position[: ids.shape[-1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def byte_batches(prose: str, context: int, batch: int, steps: int, seed: int) -> torch.Tensor:
    """``[steps, batch, context + 1]`` byte windows drawn uniformly from the text (seeded)."""
    data = torch.tensor(list(prose.encode("utf-8")[: 2_000_000]), dtype=torch.long)
    if data.numel() < context + 2:
        raise ValueError(f"the text has {data.numel()} bytes; training needs {context + 2}")
    gen = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, data.numel() - context - 1, (steps, batch), generator=gen)
    return data[starts[..., None] + torch.arange(context + 1)]


def train_one(kind: tuple[float, float], batches: torch.Tensor, layers: int, width: int,
              seed: int, log_every: int, lr: float) -> dict[str, list]:
    """Train one decoder; per logged step: loss and per-layer gradient norms."""
    torch.manual_seed(seed)
    model = TinyDecoder(layers, width, batches.shape[-1] - 1, *kind)
    if kind != (0.0, 0.0):  # the same initial weights as softmax for everything shared
        torch.manual_seed(seed)
        reference = TinyDecoder(layers, width, batches.shape[-1] - 1)
        model.load_state_dict(reference.state_dict(), strict=False)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    history = {"step": [], "loss": [], "grad_q": [], "grad_attention": []}
    for step, window in enumerate(batches):
        logits = model(window[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, 256), window[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if step % log_every == 0 or step == len(batches) - 1:
            history["step"].append(step)
            history["loss"].append(loss.item())
            history["grad_q"].append([float(b.attn.q.weight.grad.norm()) for b in model.blocks])
            history["grad_attention"].append([_norm(b.attn) for b in model.blocks])
        opt.step()
    return history


def _norm(module: nn.Module) -> float:
    grads = [p.grad.square().sum() for p in module.parameters() if p.grad is not None]
    return float(torch.stack(grads).sum().sqrt())


def gradient_histories(prose: str, kinds: Sequence[tuple[float, float]], layers: int,
                       width: int, context: int, batch: int, steps: int, seed: int,
                       log_every: int, lr: float = 1e-3) -> dict[str, dict]:
    """Softmax first, then every daGPAM ``(λ⁺, λ⁻)``; the same batches and seed for all."""
    batches = byte_batches(prose, context, batch, steps, seed)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        out = {}
        for kind in ((0.0, 0.0), *kinds):
            out[kind_name(*kind)] = {"lambda_pos": kind[0], "lambda_neg": kind[1],
                                     **train_one(kind, batches, layers, width, seed,
                                                 log_every, lr)}
        return out
    finally:
        torch.set_num_threads(threads)
