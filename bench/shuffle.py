"""Data pipeline: the direction trainer's per-epoch shuffle against a naive per-item sampler.

For 10 K, 100 K and 1 M events (``sweeps.trainers.direction.make_dataset``), per epoch at batch 64:

- ``randperm``: ``shuffled_batches``' one ``torch.randperm(n)`` per epoch;
- ``index pipeline``: ``shuffled_batches`` + ``Events.batch(index)`` for every batch of the
  epoch (the whole input pipeline the trainer runs);
- ``naive sampler``: ``DataLoader(dataset, batch_size=64, sampler=RandomSampler(dataset))``
  over a ``Dataset`` whose ``__getitem__`` returns one event (default collation), what
  users had. Above ``--naive-full`` events it is timed on ``--naive-batches`` batches and
  extrapolated to the epoch (said in the table).

Each is given as ms per epoch and as a share of the epoch, where the epoch is
n / 64 training steps of the reference model (``d_model`` 32, 1 layer per level, 1 thread,
step time measured here on 30 steps) plus that pipeline.

    python bench/shuffle.py --quick
    python bench/shuffle.py --sizes 10000,100000,1000000 --naive-full 1000000
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import machine, save, table  # noqa: E402

BATCH = 64


def step_time(events, steps: int = 30) -> float:
    """Median seconds of one training step of the reference model (1 thread)."""
    import torch

    from sweeps.trainers.direction import DirectionModel, angular_distance

    torch.manual_seed(0)
    model = DirectionModel()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    times = []
    g = torch.Generator().manual_seed(0)
    for _ in range(steps + 5):
        idx = torch.randint(0, len(events), (BATCH,), generator=g)
        features, mask, sensor, target = events.batch(idx)
        start = time.perf_counter()
        loss = angular_distance(model(features, mask, sensor), target).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times[5:])


def time_randperm(n: int, repeats: int = 5) -> float:
    import torch

    g = torch.Generator().manual_seed(0)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        torch.randperm(n, generator=g)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def time_index_pipeline(events) -> float:
    """One epoch of shuffled_batches + Events.batch gathers."""
    import torch

    from sweeps.trainers.direction import shuffled_batches

    n = len(events)
    batches = shuffled_batches(n, BATCH, torch.Generator().manual_seed(0))
    start = time.perf_counter()
    for _ in range(n // BATCH):
        events.batch(next(batches))
    return time.perf_counter() - start


def time_naive(events, max_batches: int | None) -> tuple[float, bool]:
    """Seconds per epoch of RandomSampler + per-item __getitem__ + default collate."""
    import torch
    from torch.utils.data import DataLoader, Dataset, RandomSampler

    class PerItem(Dataset):
        def __len__(self):
            return len(events)

        def __getitem__(self, i):
            return (events.features[i], events.mask[i], events.sensor[i], events.target[i])

    ds = PerItem()
    loader = DataLoader(ds, batch_size=BATCH, sampler=RandomSampler(
        ds, generator=torch.Generator().manual_seed(0)), drop_last=True)
    n_batches = len(events) // BATCH
    todo = n_batches if max_batches is None else min(max_batches, n_batches)
    start = time.perf_counter()
    for i, _batch in enumerate(loader):
        if i + 1 >= todo:
            break
    spent = time.perf_counter() - start
    return spent * n_batches / todo, todo < n_batches


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help="10K/100K/1M, naive sampler extrapolated from 300 batches above 100K")
    ap.add_argument("--sizes", default="10000,100000,1000000")
    ap.add_argument("--naive-full", type=int, default=100_000,
                    help="largest size the naive sampler runs a whole epoch on")
    ap.add_argument("--naive-batches", type=int, default=1000)
    args = ap.parse_args()
    if args.quick:
        args.naive_full, args.naive_batches = 100_000, 300
    import torch

    from sweeps.trainers.direction import make_dataset

    torch.set_num_threads(1)
    rows, raw = [], []
    for n in [int(s) for s in args.sizes.split(",")]:
        t0 = time.perf_counter()
        events = make_dataset(n, 0)
        gen_s = time.perf_counter() - t0
        step = step_time(events)
        train_s = (n // BATCH) * step
        perm = time_randperm(n)
        pipe = time_index_pipeline(events)
        naive, extrapolated = time_naive(events, None if n <= args.naive_full
                                         else args.naive_batches)
        rec = {"events": n, "generate_s": gen_s, "step_s": step, "train_epoch_s": train_s,
               "randperm_s": perm, "index_pipeline_s": pipe, "naive_s": naive,
               "naive_extrapolated": extrapolated}
        raw.append(rec)
        rows.append({
            "events": f"{n:,}",
            "training steps / epoch": n // BATCH,
            "step ms": step * 1e3,
            "randperm ms": perm * 1e3,
            "randperm % of epoch": 100 * perm / (train_s + perm),
            "index pipeline ms": pipe * 1e3,
            "index pipeline % of epoch": 100 * pipe / (train_s + pipe),
            "naive sampler ms": naive * 1e3,
            "naive % of epoch": 100 * naive / (train_s + naive),
            "naive ÷ index pipeline": naive / pipe,
            "naive timed on": (f"{args.naive_batches} batches, extrapolated" if extrapolated
                               else "whole epoch"),
        })
        print(f"{n:,} events done ({gen_s:.1f} s to generate)", flush=True)
        del events
    print(table(rows, floatfmt=".4g"))
    target_ok = all(r["index pipeline % of epoch"] < 1 for r in rows)
    print(f"\ntarget (per-epoch shuffle < 1 % of the epoch at every size): "
          f"{'met' if target_ok else 'MISSED'}")
    path = save("shuffle", {"args": vars(args), "rows": rows, "raw": raw})
    print(f"raw figures: {path}; machine load {machine()['loadavg']}")


if __name__ == "__main__":
    main()
