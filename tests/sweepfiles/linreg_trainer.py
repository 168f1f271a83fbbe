"""A tiny trainer whose unstable regions are known exactly (used by the tests).

Linear regression by plain SGD on standardised features: the loss Hessian's
largest eigenvalue is about 2, so an LR above ~1 diverges (finite at first,
then overflowing to inf/NaN), an LR below ~1e-3 leaves the loss at the target
variance (the random-prediction baseline, 1.0 here) for the whole budget.
With ``train.fragile_above`` set, an LR above it is the best on seeds divisible by
3 (the search seed 0) and settles in a bad basin on every other seed:
the first weight stays at zero, the loss is smooth and finite, and no rule can fire.
With ``train.eval_compiled`` the validation loss goes through the compiled model under
``no_grad`` (as nanoGPT-style trainers do), a recompile for every trial;
``train.recompile_limit`` sets dynamo's limit (1: that evaluation runs eagerly).
``train.wiring`` plants a mistake in how the loop is wired: ``measure_late`` measures
after ``zero_grad`` (grad norm 0), ``report_twice`` reports every step twice, ``dead``
multiplies the prediction by 0 (every gradient there and zero: a dead model).
"""

import os
import shutil
import signal
import sys
import time
from os import _exit as end_process  # bound at import: a guard must not rely on the name

import torch

from sweeps import Monitor, compile_model

EXITS = {"sys_exit": lambda: sys.exit(3), "os_exit": lambda: os._exit(3),
         "named_exit": lambda: end_process(3),
         "sigkill": lambda: os.kill(os.getpid(), signal.SIGKILL)}


def train(config, report):
    t = config["train"]
    run = config.get("sweep", {})
    torch.manual_seed(int(run.get("seed", 0)))
    steps = int(run.get("max_steps", t["steps"]))
    if t.get("fail") == "raise":
        raise RuntimeError("planted failure before any report\n---\nkey: [/INST] value")
    if float(t["lr"]) > float(t.get("crash_above", "inf")):
        raise RuntimeError(f"planted failure: lr {t['lr']} above crash_above")
    if t.get("fail") == "silent":
        return  # a trainer that never reports
    gen = torch.Generator().manual_seed(123)
    x = torch.randn(512, 8, generator=gen)
    w_true = torch.randn(8, 1, generator=gen)
    w_true = w_true / w_true.norm()
    y = x @ w_true + 0.05 * torch.randn(512, 1, generator=gen)
    y = y / y.std()
    model = torch.nn.Linear(8, 1, bias=False)
    torch.nn.init.zeros_(model.weight)
    if "recompile_limit" in t:
        torch._dynamo.config.recompile_limit = int(t["recompile_limit"])
    forward = compile_model(model, t.get("compile", "none"))
    opt = torch.optim.SGD(model.parameters(), lr=float(t["lr"]))
    monitor = Monitor(model, opt)
    first = 1
    if run.get("checkpoint"):  # a retried trial continues from its last checkpoint
        state = torch.load(run["checkpoint"])
        model.load_state_dict(state["model"])
        first = state["step"] + 1
    if t.get("pid_dir"):
        os.makedirs(t["pid_dir"], exist_ok=True)
        with open(os.path.join(t["pid_dir"], f"{run['trial_id']}.pid"), "w") as fh:
            fh.write(str(os.getpid()))
    for step in range(first, steps + 1):
        if t.get("hang_at") == step:
            time.sleep(3600)  # a hung data loader
        idx = torch.randint(0, 384, (64,))
        pred = forward(x[idx])
        if t.get("wiring") == "dead":  # a model whose loss does not reach its parameters
            pred = pred * 0.0
        loss = torch.nn.functional.mse_loss(pred, y[idx])
        opt.zero_grad()
        loss.backward()
        metrics = monitor.measure(loss)
        if run.get("seed") in t.get("nan_on_seeds", []) and step >= 20:
            metrics["loss"] = float("nan")  # unstable only on an unlucky seed
        if step == 5 and t.get("fail") in EXITS:
            EXITS[t["fail"]]()  # a trainer that ends its own process
        if step >= 5 and t.get("fail") == "text":
            metrics["loss"] = "banana"  # text where a number belongs
        if step == 5 and t.get("fail") == "huge":
            metrics.update(loss=10**400, extra=10**400)  # past a float's range
        if step == 5 and t.get("scribble"):  # a trainer writing into its results folder
            with open(t["scribble"], "wb") as fh:
                fh.write(b"garbage,\x00")
        if step == t.get("remove_at") and t.get("remove_dir"):  # its results folder, rm -rf
            shutil.rmtree(t["remove_dir"], ignore_errors=True)
        if t.get("fail") == "raise_late" and step == 5:
            raise ValueError("planted failure at step 5")
        opt.step()
        if t.get("wiring") == "measure_late":  # a loop that measures after zero_grad
            opt.zero_grad()
            metrics.update(monitor.measure(loss))
        if t.get("fragile_above") and float(t["lr"]) > t["fragile_above"] and \
                int(run.get("seed", 0)) % 3:
            with torch.no_grad():  # the bad basin of an unlucky seed
                model.weight[:, 0] = 0.0
        metrics["step"] = step
        last = step == steps and t.get("fail") != "no_final_val"
        if (step % 10 == 0 or last) and t.get("fail") != "no_val":
            with torch.no_grad():
                evaluate = forward if t.get("eval_compiled") else model
                metrics["val_loss"] = float(torch.nn.functional.mse_loss(evaluate(x[384:]),
                                                                         y[384:]))
        if t.get("sleep"):
            time.sleep(float(t["sleep"]))
        if t.get("wiring") == "report_twice":  # per micro-batch, as if accumulating
            report(dict(metrics))
        every = int(t.get("checkpoint_every", 0))
        if every and step % every == 0:
            report(metrics, checkpoint={"model": model.state_dict(), "step": step})
        else:
            report(metrics)
