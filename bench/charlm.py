"""A small character-level language model for the boundary benchmark (``bench/boundary.py``).

Text comes from a fixed random order-2 Markov source over ``data.vocab`` symbols,
generated in memory from ``data.seed`` (no downloads): every pair of previous symbols
has its own peaked next-symbol distribution (mostly a random bigram, refined by the
symbol before), so the source's entropy rate is well below ln(vocab) and a model that
reads two symbols back learns most of it. The model is a tiny causal transformer
(``model.layers`` pre-norm blocks, ``model.d_model`` wide, explicit attention so it is
twice differentiable), trained with cross-entropy on next-symbol prediction: predicting
uniformly scores ln(vocab), the ``baseline_loss`` of its rules.

``train(config, report)`` follows the contract of ``sweeps/trainers/regression.py``:
``report`` every step with ``loss``, ``grad_norm`` (before clipping), ``lr``, and
``val_loss`` every ``training.eval_every`` steps; the trial seed (``config["sweep"]``)
sets the initial weights and the batch order; linear warmup then cosine decay;
``training.grad_clip``. A 300-step run takes a few seconds on one core.

``loss_closure(config)`` is the sharpness hook of ``sweeps stability --probe``
(``sweeps/results/sharpness.py``): the parameters as ``train`` builds them, the loss on
the first training batch, and the optimizer. Its closure also takes an optional batch
index (``closure(k)``: the loss on the k-th batch of the trial's stream), which the LR
range test of ``bench/lr_range_test.py`` uses for fresh batches; sweeps calls it bare.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from sweeps import Monitor
from sweeps.trainers.direction import make_scheduler, shuffled_batches

VAL_SEED_OFFSET = 1_000_003  # validation text uses data.seed + this
SOURCE_SEED_OFFSET = 7_919  # the Markov source uses data.seed + this

#: The base config (a sweep's ``base_config`` overrides any key).
DEFAULTS: dict[str, dict[str, Any]] = {
    "data": {"vocab": 32, "seq_len": 32, "n_train": 4096, "n_val": 256, "peak": 2.0,
             "seed": 0},
    "model": {"d_model": 32, "layers": 2, "heads": 2, "dropout": 0.1},
    "training": {"optimizer": "adamw", "lr": 3e-3, "weight_decay": 0.01, "grad_clip": 1.0,
                 "warmup_steps": 20, "schedule": "warmup_cosine", "min_lr_ratio": 0.1,
                 "batch_size": 32, "max_steps": 300, "eval_every": 75, "report_every": 1},
}


def baseline_loss(config: dict[str, Any] | None = None) -> float:
    """ln(vocab): the cross-entropy of predicting every symbol uniformly."""
    return math.log(int(_section(config or {}, "data")["vocab"]))


def _section(config: dict[str, Any], name: str) -> dict[str, Any]:
    return {**DEFAULTS[name], **(config.get(name) or {})}


# --------------------------------------------------------------------------- data


def source(vocab: int, seed: int, peak: float) -> torch.Tensor:
    """The order-2 Markov source: (vocab, vocab, vocab) next-symbol probabilities, from
    logits ``peak·(U[b] + W[a, b] / 2)`` after symbols a, b (U, W ~ N(0, 1)): mostly a
    bigram, which a model picks up in a few dozen steps, refined by the symbol before."""
    g = torch.Generator().manual_seed(seed)
    bigram = torch.randn(vocab, vocab, generator=g)
    pair = torch.randn(vocab, vocab, vocab, generator=g)
    return torch.softmax(peak * (bigram[None] + 0.5 * pair), dim=-1)


def entropy_rate(table: torch.Tensor) -> float:
    """The source's entropy per symbol (nats) under uniform pairs: the loss floor."""
    return float(-(table * table.clamp_min(1e-30).log()).sum(-1).mean())


def sample_text(table: torch.Tensor, n: int, length: int, seed: int) -> torch.Tensor:
    """``n`` independent sequences of ``length`` symbols (int64), vectorised over ``n``."""
    g = torch.Generator().manual_seed(seed)
    vocab = table.shape[0]
    out = torch.empty(n, length, dtype=torch.long)
    out[:, :2] = torch.randint(0, vocab, (n, 2), generator=g)
    for t in range(2, length):
        probs = table[out[:, t - 2], out[:, t - 1]]
        out[:, t] = torch.multinomial(probs, 1, generator=g).squeeze(1)
    return out


@dataclass
class Corpus:
    """Training and validation sequences, each ``seq_len + 1`` symbols long."""

    train: torch.Tensor
    val: torch.Tensor


def make_corpus(data: dict[str, Any]) -> Corpus:
    """The corpus of ``data`` (a config's ``data`` section), deterministic in its seed."""
    vocab, seed, length = int(data["vocab"]), int(data["seed"]), int(data["seq_len"]) + 1
    table = source(vocab, seed + SOURCE_SEED_OFFSET, float(data["peak"]))
    return Corpus(sample_text(table, int(data["n_train"]), length, seed),
                  sample_text(table, int(data["n_val"]), length, seed + VAL_SEED_OFFSET))


# --------------------------------------------------------------------------- model


class Block(nn.Module):
    """Pre-norm causal self-attention and a ReLU MLP, each with a residual."""

    def __init__(self, d_model: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.ReLU(),
                                 nn.Linear(4 * d_model, d_model))
        self.drop = nn.Dropout(dropout)

    def attend(self, x: torch.Tensor) -> torch.Tensor:
        """Explicit causal attention (matmul, mask, softmax): double backward works."""
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-2, -1) / math.sqrt(d // self.heads)
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        weights = torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1)
        return self.proj((self.drop(weights) @ v).transpose(1, 2).reshape(b, t, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop(self.attend(self.norm1(x)))
        return x + self.drop(self.mlp(self.norm2(x)))


class CharLM(nn.Module):
    """Symbol and position embeddings, ``layers`` blocks, a final LayerNorm, logits."""

    def __init__(self, vocab: int, seq_len: int, *, d_model: int = 48, layers: int = 2,
                 heads: int = 4, dropout: float = 0.1) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.pos = nn.Parameter(0.02 * torch.randn(seq_len, d_model))
        self.blocks = nn.ModuleList(Block(d_model, heads, dropout) for _ in range(layers))
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.pos[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def lm_loss(model: nn.Module, seqs: torch.Tensor) -> torch.Tensor:
    """Mean next-symbol cross-entropy over every position of ``seqs``."""
    logits = model(seqs[:, :-1])
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), seqs[:, 1:].reshape(-1))


@torch.no_grad()
def evaluate(model: nn.Module, seqs: torch.Tensor) -> float:
    """Validation cross-entropy, in eval mode."""
    was_training = model.training
    model.eval()
    loss = float(lm_loss(model, seqs))
    model.train(was_training)
    return loss


def make_optimizer(params, name: str, *, lr: float, weight_decay: float) -> torch.optim.Optimizer:
    """``adamw``, or ``sgd`` with momentum 0.9."""
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=0.9, weight_decay=weight_decay)
    raise ValueError(f"training.optimizer: unknown {name!r}; choose adamw or sgd")


# --------------------------------------------------------------------------- training


@dataclass
class Setup:
    """What ``train`` and ``loss_closure`` build from a config, in the same order."""

    corpus: Corpus
    batches: Iterator[torch.Tensor]
    net: CharLM
    optimizer: torch.optim.Optimizer
    seed: int
    max_steps: int


def build(config: dict[str, Any]) -> Setup:
    """Seed, corpus, batch order, model and optimizer of a run of ``config``."""
    data, net_cfg, opt = (_section(config, k) for k in ("data", "model", "training"))
    sweep = config.get("sweep") or {}
    seed = int(sweep.get("seed", 0))
    torch.manual_seed(seed)  # initial weights and dropout
    corpus = make_corpus(data)
    batches = shuffled_batches(len(corpus.train), int(opt["batch_size"]),
                               torch.Generator().manual_seed(seed))
    net = CharLM(int(data["vocab"]), int(data["seq_len"]), d_model=int(net_cfg["d_model"]),
                 layers=int(net_cfg["layers"]), heads=int(net_cfg["heads"]),
                 dropout=float(net_cfg["dropout"]))
    optimizer = make_optimizer(net.parameters(), str(opt["optimizer"]), lr=float(opt["lr"]),
                               weight_decay=float(opt["weight_decay"]))
    max_steps = int(sweep.get("max_steps") or opt["max_steps"])
    return Setup(corpus, batches, net, optimizer, seed, max_steps)


def loss_closure(config: dict[str, Any]) -> tuple[list[torch.Tensor], Callable[..., torch.Tensor],
                                                   torch.optim.Optimizer]:
    """(params, closure, optimizer) as training starts: ``closure()`` is the loss on the
    run's first batch, dropout off; ``closure(k)`` the loss on its k-th batch (k = 0: the
    first)."""
    s = build(config)
    s.net.eval()
    seen: list[torch.Tensor] = []

    def closure(batch: int | None = None) -> torch.Tensor:
        k = batch or 0
        while len(seen) <= k:
            seen.append(s.corpus.train[next(s.batches)])
        return lm_loss(s.net, seen[k])

    return list(s.net.parameters()), closure, s.optimizer


def train(config: dict[str, Any], report: Callable[[dict[str, Any]], None]) -> None:
    """Train the model, calling ``report(metrics)`` every ``training.report_every`` steps.
    Exceptions raised by ``report`` propagate: that is how sweeps stops a trial."""
    opt = _section(config, "training")
    s = build(config)
    eval_every = int(opt.get("eval_every") or s.max_steps)
    report_every = int(opt.get("report_every", 1))
    grad_clip = float(opt["grad_clip"]) if opt.get("grad_clip") else None
    scheduler = make_scheduler(s.optimizer, str(opt["schedule"]),
                               warmup_steps=int(opt["warmup_steps"]), max_steps=s.max_steps,
                               min_lr_ratio=float(opt["min_lr_ratio"]))
    monitor = Monitor(s.net, s.optimizer, grad_clip=grad_clip)
    for step in range(1, s.max_steps + 1):
        seqs = s.corpus.train[next(s.batches)]
        start = time.perf_counter()
        loss = lm_loss(s.net, seqs)
        loss.backward()
        metrics = monitor.measure(loss)  # before clip and zero_grad
        if grad_clip is not None:
            nn.utils.clip_grad_norm_(s.net.parameters(), grad_clip)
        s.optimizer.step()
        s.optimizer.zero_grad(set_to_none=True)
        scheduler.step()
        is_eval = step % eval_every == 0 or step == s.max_steps
        if step % report_every and not is_eval:
            continue
        metrics.update(step=step, step_time=time.perf_counter() - start)
        metrics.setdefault("clipped", 0.0)
        if is_eval:
            metrics["val_loss"] = evaluate(s.net, s.corpus.val)
        report(metrics)  # no try/except: sweeps stops a trial by raising here
