"""What a training checkpoint holds, taken from a run and put back into one (``ptopt.compress.trainer``);
the files are ``ptopt.compress.checkpoint``'s.

Tensors (every rank its shard, through DCP): the model and the trained parts of the loss, the
optimizer's state, the best-so-far weights. Everything else, from rank 0: the position in the run
(epoch, batch, optimizer step), the optimizer's hyper-parameters, scheduler and gradient scaler, the
history and step losses, the running sums of an unfinished epoch, and every rank's RNG states (a run
resumed on as many processes restores each rank's own; on another number, rank r takes state r mod n).
"""

from __future__ import annotations

from typing import Any

from ptopt.compress import checkpoint as ckpt_util
from ptopt.compress import distributed as dist_util


def copy_state(module: Any) -> dict[str, Any]:
    """A copy of ``module``'s state dict that training does not change (FSDP: this rank's shards)."""
    out = {}
    for k, v in module.state_dict().items():
        out[k] = v.detach().clone() if type(v).__name__ == "DTensor" else v.detach().to("cpu", copy=True)
    return out


def _state_dicts(run: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """(model, optimizer) state dicts by fully qualified names, DCP's resharding form."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    return get_state_dict(run.step, run.opt)


def save(run: Any, position: dict[str, int], stats: dict[str, Any] | None) -> None:
    """One checkpoint of ``run`` at ``position`` (collective)."""
    model_sd, optim_sd = _state_dicts(run)
    tensors: dict[str, Any] = {"model": model_sd, "optim": optim_sd["state"]}
    if run.best_state is not None:
        tensors["best"] = run.best_state
    rng = ckpt_util.rng_state()
    rngs = dist_util.gather_objects(rng) if run.distributed else [rng]
    trainer = {
        "fingerprint": run.fingerprint,
        "position": position,
        "world_size": run.world,
        "param_groups": optim_sd["param_groups"],
        "scheduler": run.sched.state_dict(),
        "scaler": run.scaler.state_dict() if run.scaler is not None else None,
        "rng": rngs,
        "history": run.history,
        "step_losses": run.step_losses,
        "epoch_stats": stats,
        "best_accuracy": run.best_acc,
        "best_epoch": run.best_epoch,
        "has_best": run.best_state is not None,
    }
    ckpt_util.save(run.checkpoint_dir, tensors, trainer if run.main else {}, position["step"])


def load(run: Any, folder: Any, state: dict[str, Any]) -> None:
    """Put the checkpoint in ``folder`` (its ``trainer.pt`` read as ``state``) back into ``run``."""
    from torch.distributed.checkpoint.state_dict import set_state_dict

    model_sd, optim_sd = _state_dicts(run)
    tensors: dict[str, Any] = {"model": model_sd, "optim": optim_sd["state"]}
    if state["has_best"]:
        tensors["best"] = copy_state(run.step.model)
    ckpt_util.load_tensors(folder, tensors)
    optim = {"state": tensors["optim"], "param_groups": state["param_groups"]}
    set_state_dict(run.step, run.opt, model_state_dict=tensors["model"], optim_state_dict=optim)
    run.sched.load_state_dict(state["scheduler"])
    if run.scaler is not None and state.get("scaler"):
        run.scaler.load_state_dict(state["scaler"])
    rngs = state["rng"]
    ckpt_util.set_rng_state(rngs[dist_util.rank() % len(rngs)])
    run.history, run.step_losses = list(state["history"]), list(state["step_losses"])
    run.carried = _carried(state["epoch_stats"])
    run.best_acc, run.best_epoch = state["best_accuracy"], state["best_epoch"]
    run.best_state = tensors.get("best")


#: an unfinished epoch's running sums (``trainer._EpochStats``, summed over ranks at the epoch's end);
#: the checkpoint holds every rank's total
SUMS = ("seen", "loss_sum", "weight", "correct", "labelled", "tokens")


def _carried(stats: dict[str, Any] | None) -> dict[str, Any] | None:
    """This rank's share of the checkpoint's running sums: rank 0 takes them all, the others none (the
    epoch's end sums them over the ranks)."""
    if stats is None or dist_util.rank() == 0:
        return stats
    return {k: (0 if k in SUMS else v) for k, v in stats.items()}
