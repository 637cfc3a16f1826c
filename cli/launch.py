"""``--nproc N``: start N processes of the same command on this machine through torchrun's own launcher
(``torch.distributed.launcher.api.elastic_launch``, what ``torchrun --standalone --nproc-per-node N``
runs), each with the environment torchrun gives (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, a free
rendezvous port). Rank 0 writes to this terminal; the other ranks' output goes to log files, shown
only when they fail where rank 0 did not. The exit code is the first failing rank's (2 for bad input;
a rank the launcher stopped after another failed does not count), 128 + N when the launcher itself
gets signal N (130 for Ctrl-C: rank 0 says "Aborted.").
"""

from __future__ import annotations

import os
import sys
from typing import Any

import click


def launched_here(options: dict[str, Any]) -> bool:
    """Run this command in ``--nproc`` processes when asked and not already one of them (the twin's
    keywords ``options``); returns whether it did (the caller then has nothing left to do). Refuses
    here, once, what would fail in every process."""
    from ptopt.compress import distributed as dist_util
    from ptopt.compress.distill import resolve_options
    from ptopt.core.errors import UsageError

    nproc = options.get("nproc") or 1
    if nproc == 1 or dist_util.env_world_size() > 1:
        return False  # one process, or one of torchrun's (the twin checks --nproc against them)
    _, tcfg, _, _ = resolve_options(options)
    if tcfg.strategy == "none":
        raise UsageError(f"--nproc {nproc} with --strategy none would train {nproc} separate models")
    dist_util.check_batch(tcfg.batch_size, nproc)
    code = launch(nproc, sys.argv[1:])
    if code:
        sys.exit(code)
    return True


def launch(nproc: int, args: list[str]) -> int:
    """``python -m ptopt.cli.main ARGS`` in ``nproc`` processes (module docstring); their exit code."""
    import logging
    import tempfile
    import uuid

    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    for name in ["torch.distributed.elastic", *logging.root.manager.loggerDict]:  # some set their own level
        if name.startswith("torch.distributed.elastic"):
            logging.getLogger(name).setLevel(logging.CRITICAL)
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    os.environ["PTOPT_LAUNCHED"] = "1"  # every rank says its error (ranks > 0 into their logs)
    with tempfile.TemporaryDirectory(prefix="ptopt-nproc-") as logs:
        config = LaunchConfig(
            min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id=str(uuid.uuid4()),
            rdzv_backend="c10d", rdzv_endpoint="localhost:0", max_restarts=0, monitor_interval=0.1,
            logs_specs=DefaultLogsSpecs(log_dir=logs, redirects={r: Std.ALL for r in range(1, nproc)}),
        )  # fmt: skip
        try:
            elastic_launch(config, sys.executable)("-m", "ptopt.cli.main", *args)
        except ChildFailedError as e:
            return _report(e, logs)
        except SignalException as e:  # Ctrl-C or kill: the workers got the same signal
            return 128 + int(e.sigval)
    return 0


def _report(error: Any, logs: str) -> int:
    """The first failing rank's exit code; its last error line unless rank 0 exited by itself (rank 0
    prints its own). A rank that ended by a signal (a negative exit code: the launcher stops the others
    once one fails) comes after those that exited by themselves."""
    failures = sorted(error.failures.items(), key=lambda kv: (not (kv[1].exitcode or 0) > 0, kv[0]))
    rank, failure = failures[0]
    zero = error.failures.get(0)
    if rank != 0 and (zero is None or (zero.exitcode or 0) <= 0):  # rank 0 ended by itself: it said why
        # a rank 0 the launcher stopped may not have printed its line: the same line twice beats none
        text = _tail(logs, rank)
        click.echo(
            text or f"error: process {rank} of the run failed (exit code {failure.exitcode})", err=True
        )
    return failure.exitcode if failure.exitcode and failure.exitcode > 0 else 3


def _tail(logs: str, rank: int) -> str:
    """The last ``error:`` line rank ``rank`` wrote to its log file."""
    from pathlib import Path

    for path in sorted(Path(logs).rglob("stderr.log")):
        if path.parent.name == str(rank):
            lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.startswith("error:")]
            return lines[-1] if lines else ""
    return ""
