"""Reference trainer: muon direction from detector pulses, the way sweeps expects it.

A small two-level transformer learns the direction of a muon track from the
light pulses it leaves in a toy neutrino detector (modelled on the IceCube
Kaggle task). Events are synthetic and generated in memory from a seed, with
the raw feature scales of the real data: times ~1e4 ns, charges up to ~3e3.

The part to copy into your own trainer is ``train``: it is an ordinary PyTorch
loop plus three things sweeps needs,

1. ``Monitor(model, optimizer, grad_clip=...)`` built once;
2. ``metrics = monitor.measure(loss, pred=..., target=...)`` right after
   ``loss.backward()`` and *before* clipping and ``zero_grad``;
3. ``report(metrics)`` once per step (with ``val_loss`` now and then), with no
   ``try``/``except`` around it: sweeps ends an unstable trial by raising
   out of ``report``.

Run one trial of it, with the rules judging every step, from the project folder::

    sweeps try examples/direction.yaml --set lr=3e-3
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

from sweeps import Monitor, compile_mode, compile_model

# --------------------------------------------------------------------------- detector

#: Horizontal (x, y) positions of the 10 strings, metres.
STRING_XY = (
    (-420.0, -380.0),
    (-150.0, -460.0),
    (180.0, -410.0),
    (450.0, -250.0),
    (-470.0, 60.0),
    (0.0, 0.0),
    (330.0, 120.0),
    (-260.0, 400.0),
    (90.0, 470.0),
    (440.0, 430.0),
)
#: Depths of the sensors on every string, metres.
SENSOR_Z = (-500.0, -300.0, -100.0, 100.0, 300.0, 500.0)

FEATURES = ("time", "charge", "auxiliary", "x", "y", "z")
CHARGE = FEATURES.index("charge")

SPEED_OF_LIGHT = 0.2998  # m/ns, the muon
SPEED_IN_ICE = SPEED_OF_LIGHT / 1.32  # m/ns, the photons
VAL_SEED_OFFSET = 1_000_003  # the validation set uses data.seed + this


def sensor_positions() -> torch.Tensor:
    """(n_sensors, 3) sensor positions in metres, string by string."""
    return torch.tensor([(x, y, z) for x, y in STRING_XY for z in SENSOR_Z])


N_SENSORS = len(STRING_XY) * len(SENSOR_Z)

# --------------------------------------------------------------------------- data


@dataclass
class Events:
    """Padded pulses of ``n`` events; a training batch is ``events.batch(indices)``.

    ``features`` is (n, max_pulses, 6) in the order of ``FEATURES``, ``mask`` is
    True for real pulses, ``sensor`` the sensor index of each pulse, ``target``
    the (n, 3) unit direction of the track.
    """

    features: torch.Tensor
    mask: torch.Tensor
    sensor: torch.Tensor
    target: torch.Tensor

    def __len__(self) -> int:
        return self.target.shape[0]

    def batch(self, index: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self.features[index], self.mask[index], self.sensor[index], self.target[index]


def make_dataset(
    n_events: int,
    seed: int,
    *,
    min_pulses: int = 8,
    max_pulses: int = 40,
    noise_fraction: float = 0.05,
    chunk: int = 100_000,
) -> Events:
    """Generate ``n_events`` muon events, vectorised, deterministic in ``seed``.

    Each event: a direction uniform on the sphere, a track through a point
    within ±150 m of the centre, and 8-40 pulses on the sensors near it. A
    pulse arrives at ``t0 + along/c + distance/c_ice + scatter`` (so the time
    order of the pulses along the track gives the direction away), with a
    lognormal charge that is larger near the track. A few pulses are noise
    (random sensor, time anywhere in the readout window, auxiliary flag 1).
    """
    generator = torch.Generator().manual_seed(seed)
    parts = [
        _make_events(
            min(chunk, n_events - start), generator, min_pulses, max_pulses, noise_fraction
        )
        for start in range(0, n_events, chunk)
    ]
    return Events(*(torch.cat(tensors) for tensors in zip(*parts, strict=True)))


def _make_events(n, g, min_pulses, max_pulses, noise_fraction):
    positions = sensor_positions()
    direction = F.normalize(torch.randn(n, 3, generator=g), dim=1)
    anchor = (torch.rand(n, 3, generator=g) - 0.5) * 300.0
    offset = positions[None] - anchor[:, None]  # (n, sensors, 3)
    along = (offset * direction[:, None]).sum(-1)  # distance along the track
    distance = (offset - along[..., None] * direction[:, None]).norm(dim=-1)  # from the track

    # Each pulse lands on a sensor, more likely the nearer the sensor is to the track.
    shape = (n, max_pulses)
    sensor = torch.multinomial(
        torch.exp(-distance / 100.0) + 1e-6, max_pulses, replacement=True, generator=g
    )
    along, distance = along.gather(1, sensor), distance.gather(1, sensor)

    t0 = 1.0e4 + 200.0 * torch.randn(n, 1, generator=g)
    scatter = -torch.log(torch.rand(shape, generator=g)) * (5.0 + 0.5 * distance)
    time_ns = t0 + along / SPEED_OF_LIGHT + distance / SPEED_IN_ICE + scatter
    median_charge = 50.0 * torch.exp(-distance / 40.0) + 0.3
    charge = median_charge * torch.exp(1.2 * torch.randn(shape, generator=g))
    aux = torch.rand(shape, generator=g) < 0.2

    noise = torch.rand(shape, generator=g) < noise_fraction
    sensor = torch.where(noise, torch.randint(0, N_SENSORS, shape, generator=g), sensor)
    time_ns = torch.where(noise, 5.0e3 + 7.5e4 * torch.rand(shape, generator=g), time_ns)
    charge = torch.where(noise, 0.3 * torch.exp(0.5 * torch.randn(shape, generator=g)), charge)
    aux = aux | noise

    n_pulses = torch.randint(min_pulses, max_pulses + 1, (n, 1), generator=g)
    mask = torch.arange(max_pulses)[None] < n_pulses
    features = torch.cat(
        [
            time_ns[..., None],
            charge.clamp(0.02, 3.0e3)[..., None],
            aux[..., None].float(),
            positions[sensor],
        ],
        dim=-1,
    )
    features = features * mask[..., None]  # padding is all zeros
    sensor = sensor * mask
    return features.float(), mask, sensor, direction.float()


def on_device(events: Events, device: torch.device) -> Events:
    """``events`` with every tensor on ``device`` (a trial keeps its data on its GPU)."""
    return Events(*(t.to(device) for t in (events.features, events.mask, events.sensor,
                                           events.target)))


def _transform(features: torch.Tensor) -> torch.Tensor:
    """Charge is heavy-tailed (0.02 to 3e3), so it is standardised on a log scale."""
    out = features.clone()
    out[..., CHARGE] = torch.log10(features[..., CHARGE].clamp_min(1e-3))
    return out


def feature_stats(events: Events) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-feature mean and std over the real pulses (compute on the training set only)."""
    pulses = _transform(events.features)[events.mask]
    return pulses.mean(0), pulses.std(0).clamp_min(1e-6)


def normalized(events: Events, stats: tuple[torch.Tensor, torch.Tensor]) -> Events:
    """The same events with standardised features (padding stays zero)."""
    mean, std = stats
    features = (_transform(events.features) - mean) / std * events.mask[..., None]
    return Events(features, events.mask, events.sensor, events.target)


def shuffled_batches(n: int, batch_size: int, generator: torch.Generator) -> Iterator[torch.Tensor]:
    """Endless batches of indices: one ``torch.randperm`` per epoch, sliced.

    A permutation of 1 M indices costs milliseconds; no per-item sampler.
    The incomplete last batch of an epoch is dropped, so shapes stay fixed.
    """
    batch_size = min(batch_size, n)
    while True:
        order = torch.randperm(n, generator=generator)
        for start in range(0, n - batch_size + 1, batch_size):
            yield order[start : start + batch_size]


# --------------------------------------------------------------------------- model


NORMS = ("pre", "post", "none")


class EncoderLayer(nn.Module):
    """One transformer layer: self-attention, then a ReLU MLP, each with a residual.

    ``norm`` says where the LayerNorms go. ``pre`` normalises the input of each
    sublayer (the residual stream itself is not normalised, so ``Encoder`` ends
    with a LayerNorm); ``post`` normalises after each residual sum, as in the
    original Transformer; ``none`` has no LayerNorm, so nothing bounds the scale
    of the activations: raw inputs of ~1e4 stay ~1e4 and grow through the layers.
    """

    def __init__(self, d_model: int, heads: int, dropout: float, norm: str) -> None:
        super().__init__()
        if norm not in NORMS:
            raise ValueError(f"model.norm: unknown {norm!r}; choose one of {NORMS}")
        self.norm = norm
        self.attn = nn.MultiheadAttention(d_model, heads, dropout=dropout, batch_first=True)
        self.mlp = nn.Sequential(
            nn.Linear(d_model, 2 * d_model),
            nn.ReLU(),
            nn.Dropout(dropout),
            nn.Linear(2 * d_model, d_model),
        )
        self.norm1 = nn.LayerNorm(d_model) if norm != "none" else nn.Identity()
        self.norm2 = nn.LayerNorm(d_model) if norm != "none" else nn.Identity()
        self.dropout1, self.dropout2 = nn.Dropout(dropout), nn.Dropout(dropout)

    def _attend(self, x: torch.Tensor, padding: torch.Tensor) -> torch.Tensor:
        out = self.attn(x, x, x, key_padding_mask=padding, need_weights=False)[0]
        return self.dropout1(out)

    def forward(self, x: torch.Tensor, padding: torch.Tensor) -> torch.Tensor:
        if self.norm == "pre":
            x = x + self._attend(self.norm1(x), padding)
            return x + self.dropout2(self.mlp(self.norm2(x)))
        x = self.norm1(x + self._attend(x, padding))  # post; for none the norms are Identity
        return self.norm2(x + self.dropout2(self.mlp(x)))


class Encoder(nn.Module):
    """``layers`` EncoderLayers; pre-norm ones are followed by a final LayerNorm."""

    def __init__(self, d_model: int, heads: int, layers: int, dropout: float, norm: str) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            EncoderLayer(d_model, heads, dropout, norm) for _ in range(layers)
        )
        self.final_norm = nn.LayerNorm(d_model) if norm == "pre" else nn.Identity()

    def forward(self, x: torch.Tensor, padding: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x, padding)
        return self.final_norm(x)


class DirectionModel(nn.Module):
    """Two-level transformer: pulses of an event, then one token per hit sensor.

    Level 1 attends over all pulses of the event; the pulse outputs are
    averaged into one token per sensor; level 2 attends over the hit sensors;
    a mean-pool and a linear head give the direction as a unit vector.
    """

    def __init__(
        self,
        d_model: int = 32,
        heads: int = 4,
        layers: tuple[int, int] = (1, 1),
        dropout: float = 0.1,
        norm: str = "pre",
        n_features: int = len(FEATURES),
        n_sensors: int = N_SENSORS,
    ) -> None:
        super().__init__()
        self.n_sensors = n_sensors
        self.embed = nn.Linear(n_features, d_model)
        self.pulse_encoder = Encoder(d_model, heads, layers[0], dropout, norm)
        self.sensor_encoder = Encoder(d_model, heads, layers[1], dropout, norm)
        self.head = nn.Linear(d_model, 3)

    def forward(self, features, mask, sensor):
        h = self.pulse_encoder(self.embed(features), ~mask)
        h = h * mask[..., None]
        # Average the pulses of each sensor into one token. An event has at most one
        # hit sensor per pulse, so its sensors are numbered 0, 1, ... < n_pulses.
        batch, n_pulses, width = h.shape
        weight = mask.to(h.dtype)
        seen = h.new_zeros(batch, self.n_sensors).scatter_add(1, sensor, weight) > 0
        slot = (seen.cumsum(1) - 1).clamp_min(0).gather(1, sensor)  # token index of each pulse
        tokens = h.new_zeros(batch, n_pulses, width)
        tokens = tokens.scatter_add(1, slot[..., None].expand(-1, -1, width), h)
        counts = h.new_zeros(batch, n_pulses).scatter_add(1, slot, weight)
        tokens = tokens / counts.clamp_min(1.0)[..., None]
        hit = counts > 0
        tokens = self.sensor_encoder(tokens, ~hit)
        pooled = (tokens * hit[..., None]).sum(1) / hit.sum(1, keepdim=True)
        return F.normalize(self.head(pooled), dim=-1, eps=1e-8)


class DirectionMLP(nn.Module):
    """The quick first model: an MLP on the flattened, zero-padded pulses of an event.

    It returns the raw 3-vector (the loss normalises it), so nothing bounds its
    scale: with raw inputs (times ~1e4 ns) and a high LR its weights and outputs
    blow up to inf and NaN, the failure of the user report this trainer models.
    """

    def __init__(self, max_pulses: int, hidden: int = 128, layers: int = 2,
                 dropout: float = 0.1, n_features: int = len(FEATURES)) -> None:
        super().__init__()
        width, blocks = max_pulses * n_features, []
        for _ in range(layers):
            blocks += [nn.Linear(width, hidden), nn.ReLU(), nn.Dropout(dropout)]
            width = hidden
        self.body = nn.Sequential(*blocks)
        self.head = nn.Linear(width, 3)

    def forward(self, features, mask, sensor):
        # pulses in time order (padding last), so position k is the k-th light seen
        t = features[..., 0].masked_fill(~mask, float("inf"))
        order = t.argsort(dim=1)[..., None].expand_as(features)
        return self.head(self.body(features.gather(1, order).flatten(1)))


MODELS = ("transformer", "mlp")


def build_model(net_cfg: dict[str, Any], max_pulses: int) -> nn.Module:
    """``model.kind``: ``transformer`` (DirectionModel, default) or ``mlp`` (DirectionMLP)."""
    kind = str(net_cfg.get("kind", "transformer"))
    dropout = float(net_cfg.get("dropout", 0.1))
    if kind == "mlp":
        return DirectionMLP(max_pulses, hidden=int(net_cfg.get("hidden", 128)),
                            layers=int(net_cfg.get("layers", 2)), dropout=dropout)
    if kind != "transformer":
        raise ValueError(f"model.kind: unknown {kind!r}; choose one of {MODELS}")
    layers = net_cfg.get("layers", 1)
    return DirectionModel(
        d_model=int(net_cfg.get("d_model", 32)),
        heads=int(net_cfg.get("heads", 4)),
        layers=(layers, layers) if isinstance(layers, int) else tuple(layers),
        dropout=dropout,
        norm=str(net_cfg.get("norm", "pre")),
    )


def angular_distance(pred: torch.Tensor, target: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Angle in radians between ``pred`` (any length) and unit ``target``, per row.

    acos has an infinite slope at ±1, and clamping to exactly ±1 still gives
    inf × 0 = NaN gradients when a prediction hits its target (or its
    opposite) exactly; so the cosine is clamped to [-1 + eps, 1 - eps].
    Random predictions score π/2 on average.
    """
    pred = F.normalize(pred, dim=-1, eps=1e-8)
    cos = (pred * target).sum(-1).clamp(-1.0 + eps, 1.0 - eps)
    return torch.acos(cos)


def vmf_nll(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Negative log-likelihood of unit ``target`` under a von Mises-Fisher distribution
    with mean direction ``pred / |pred|`` and concentration ``kappa = |pred|``, per row.

    ``kappa (1 - cos) - log kappa + log 2 pi + log(1 - exp(-2 kappa))``: the usual
    loss of direction models that also predict their uncertainty. A confident wrong
    prediction costs ``kappa`` times its miss, so nothing bounds the gradient: at a
    high LR kappa runs away and the loss, the weights and then the outputs go non-finite.
    """
    kappa = pred.norm(dim=-1).clamp_min(1e-6)
    cos = (pred * target).sum(-1) / kappa
    return kappa * (1.0 - cos) - torch.log(kappa) + math.log(2 * math.pi) + \
        torch.log(-torch.expm1(-2.0 * kappa))


LOSSES = {"angle": angular_distance, "vmf": vmf_nll}


@torch.no_grad()
def evaluate(model: nn.Module, events: Events, batch_size: int = 500) -> float:
    """Mean angular distance over ``events``, in eval mode."""
    was_training = model.training
    model.eval()
    total = 0.0
    for start in range(0, len(events), batch_size):
        features, mask, sensor, target = events.batch(slice(start, start + batch_size))
        total += float(angular_distance(model(features, mask, sensor), target).sum())
    model.train(was_training)
    return total / len(events)


# --------------------------------------------------------------------------- optimizer

OPTIMIZERS = ("adamw", "sgd")


def make_optimizer(params, name: str, *, lr: float, weight_decay: float) -> torch.optim.Optimizer:
    """``adamw``, or ``sgd`` with momentum 0.9.

    AdamW scales each step to about ``lr`` per weight whatever the gradient;
    SGD steps by ``lr`` x the gradient, so large gradients (raw inputs) mean
    large steps.
    """
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=0.9, weight_decay=weight_decay)
    raise ValueError(f"training.optimizer: unknown {name!r}; choose one of {OPTIMIZERS}")


# --------------------------------------------------------------------------- schedule

SCHEDULES = ("warmup_cosine", "constant", "cosine_restarts_bug")


def make_scheduler(
    optimizer: torch.optim.Optimizer,
    schedule: str,
    *,
    warmup_steps: int,
    max_steps: int,
    min_lr_ratio: float,
) -> torch.optim.lr_scheduler.LRScheduler:
    """The LR schedule, stepped once per optimizer step.

    ``warmup_cosine``: linear warmup, then cosine decay to ``min_lr_ratio`` × lr
    at ``max_steps``. ``constant``: linear warmup, then flat.
    ``cosine_restarts_bug`` reproduces a real mistake: a warm-restart cosine
    whose period was meant in epochs but which is stepped per batch, so the LR
    decays and then jumps back to its peak every ``max_steps // 4`` steps.
    """
    if schedule == "cosine_restarts_bug":
        base_lr = optimizer.param_groups[0]["lr"]
        return torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(
            optimizer, T_0=max(2, max_steps // 4), eta_min=min_lr_ratio * base_lr
        )
    if schedule not in SCHEDULES:
        raise ValueError(f"training.schedule: unknown {schedule!r}; choose one of {SCHEDULES}")

    def factor(step: int) -> float:  # step = optimizer steps done so far
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        if schedule == "constant":
            return 1.0
        progress = min(1.0, (step - warmup_steps) / max(1, max_steps - warmup_steps))
        return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


# --------------------------------------------------------------------------- training


def lr_scheduler(config: dict[str, Any], optimizer: torch.optim.Optimizer):
    """Preflight hook: the LR scheduler ``train`` builds for ``config``.

    ``sweeps`` steps it through the whole budget before any trial runs and flags
    a zero LR after warmup or an unintended warm restart.
    """
    opt = config["training"]
    sweep = config.get("sweep") or {}
    return make_scheduler(
        optimizer,
        str(opt.get("schedule", "warmup_cosine")),
        warmup_steps=int(opt.get("warmup_steps", 0)),
        max_steps=int(sweep.get("max_steps") or opt.get("max_steps", 300)),
        min_lr_ratio=float(opt.get("min_lr_ratio", 0.1)),
    )


def sample_batch(config: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Preflight hook: the real (unpadded) pulse features as the first layer sees them.

    ``sweeps`` names every feature whose mean or spread would blow up a first layer.
    """
    data = config.get("data", {})
    events = make_dataset(2_000, int(data.get("seed", 0)))
    if data.get("normalize_inputs", True):
        events = normalized(events, feature_stats(events))
    pulses = events.features[events.mask]
    return {name: pulses[:, i] for i, name in enumerate(FEATURES)}


def train(config: dict[str, Any], report: Callable[[dict], None]) -> None:
    """Train the direction model, calling ``report(metrics)`` every step.

    ``config`` has the layout of ``examples/configs/direction.yaml`` plus,
    under sweeps, ``sweep: {trial_id, seed, max_steps, device, gpu_ids}`` (seed 0,
    ``training.max_steps`` and the CPU without it). Exceptions raised by ``report``
    propagate: that is how sweeps stops an unstable trial.
    """
    data, net_cfg, opt = config.get("data", {}), config.get("model", {}), config["training"]
    sweep = config.get("sweep") or {}
    seed = int(sweep.get("seed", 0))
    max_steps = int(sweep.get("max_steps") or opt.get("max_steps", 300))
    batch_size = int(opt.get("batch_size", 64))
    eval_every = int(opt.get("eval_every") or max_steps)
    report_every = int(opt.get("report_every", 1))
    grad_clip = float(opt["grad_clip"]) if opt.get("grad_clip") else None
    mode = compile_mode(opt.get("compile"), key="training.compile")  # null / false: eager
    device = torch.device(sweep.get("device") or "cpu")  # the trial's GPU, as sweeps hands it
    torch.manual_seed(seed)  # initial weights and dropout

    # Data: generated once, as padded tensors; a step only indexes into them.
    data_seed = int(data.get("seed", 0))
    train_set = make_dataset(int(data.get("n_events", 30_000)), data_seed)
    val_set = make_dataset(int(data.get("n_val", 2_000)), data_seed + VAL_SEED_OFFSET)
    if data.get("normalize_inputs", True):
        stats = feature_stats(train_set)
        train_set, val_set = normalized(train_set, stats), normalized(val_set, stats)
    train_set, val_set = on_device(train_set, device), on_device(val_set, device)
    batches = shuffled_batches(len(train_set), batch_size, torch.Generator().manual_seed(seed))

    net = build_model(net_cfg, max_pulses=train_set.features.shape[1]).to(device)
    model = compile_model(net, mode)  # evaluation uses the eager `net`
    optimizer = make_optimizer(
        net.parameters(),
        str(opt.get("optimizer", "adamw")),
        lr=float(opt["lr"]),
        weight_decay=float(opt.get("weight_decay", 0.0)),
    )
    scheduler = lr_scheduler(config, optimizer)
    monitor = Monitor(net, optimizer, grad_clip=grad_clip)
    loss_name = str(opt.get("loss", "angle"))  # val_loss is the mean angle either way
    if loss_name not in LOSSES:
        raise ValueError(f"training.loss: unknown {loss_name!r}; choose one of {tuple(LOSSES)}")
    if loss_name == "vmf" and not isinstance(net, DirectionMLP):
        raise ValueError("training.loss: vmf needs model.kind: mlp (the transformer returns "
                         "unit vectors, so its concentration would be fixed at 1)")
    loss_fn = LOSSES[loss_name]

    once: dict[str, float] = {}  # metrics for the next report only
    for step in range(1, max_steps + 1):
        features, mask, sensor, target = train_set.batch(next(batches).to(device))
        start = time.perf_counter()
        pred = model(features, mask, sensor)
        loss = loss_fn(pred, target).mean()
        loss.backward()
        metrics = monitor.measure(loss, pred=pred, target=target)  # before clip and zero_grad
        if grad_clip is not None:
            nn.utils.clip_grad_norm_(net.parameters(), grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        scheduler.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # the GPU's work, not only its launch
        step_time = time.perf_counter() - start  # forward, backward, monitor, clip, step
        if step == 1 and mode != "none":
            once["compile_s"] = step_time  # the first step includes compilation

        is_eval = step % eval_every == 0 or step == max_steps
        if step % report_every and not is_eval:
            continue
        metrics.update(once, step=step, step_time=step_time)
        metrics.setdefault("clipped", 0.0)  # Monitor sets it only when clipping is on
        once = {}
        if is_eval:
            metrics["val_loss"] = evaluate(net, val_set)
        report(metrics)  # no try/except: sweeps stops a trial by raising here


def loss_closure(config: dict[str, Any]) -> tuple[
        list[torch.Tensor], Callable[..., torch.Tensor], torch.optim.Optimizer]:
    """Sharpness hook of ``sweeps stability --probe``: ``(params, closure, optimizer)`` as
    ``train`` builds them for ``config`` (same seed, data, model and optimizer).

    ``closure()`` is the training loss on the run's first batch, in eval mode (no dropout),
    attention in PyTorch's math kernel (twice differentiable); ``closure(k)`` is the loss on
    the k-th batch of the run's stream (k = 0: the first), for an LR range test on fresh
    batches (``bench/lr_range_test.py``). ``train`` is unchanged by it.
    """
    from torch.nn.attention import SDPBackend, sdpa_kernel

    data, net_cfg, opt = config.get("data", {}), config.get("model", {}), config["training"]
    sweep = config.get("sweep") or {}
    seed = int(sweep.get("seed", 0))
    device = torch.device(sweep.get("device") or "cpu")
    torch.manual_seed(seed)  # initial weights, as train draws them
    data_seed = int(data.get("seed", 0))
    train_set = make_dataset(int(data.get("n_events", 30_000)), data_seed)
    if data.get("normalize_inputs", True):
        train_set = normalized(train_set, feature_stats(train_set))
    train_set = on_device(train_set, device)
    batches = shuffled_batches(len(train_set), int(opt.get("batch_size", 64)),
                               torch.Generator().manual_seed(seed))
    net = build_model(net_cfg, max_pulses=train_set.features.shape[1]).to(device).eval()
    optimizer = make_optimizer(net.parameters(), str(opt.get("optimizer", "adamw")),
                               lr=float(opt["lr"]),
                               weight_decay=float(opt.get("weight_decay", 0.0)))
    loss_name = str(opt.get("loss", "angle"))
    if loss_name not in LOSSES:
        raise ValueError(f"training.loss: unknown {loss_name!r}; choose one of {tuple(LOSSES)}")
    loss_fn = LOSSES[loss_name]
    seen: list[tuple[torch.Tensor, ...]] = []

    def closure(batch: int | None = None) -> torch.Tensor:
        k = batch or 0
        while len(seen) <= k:
            seen.append(train_set.batch(next(batches).to(device)))
        features, mask, sensor, target = seen[k]
        with sdpa_kernel([SDPBackend.MATH]):
            return loss_fn(net(features, mask, sensor), target).mean()

    return list(net.parameters()), closure, optimizer
