"""``ptopt package``: turn an artifact into something a model server loads.

- ``format="mar"``: a TorchServe model archive built by torch-model-archiver: the model file
  (TorchScript fp32/int8, ONNX run by ONNX Runtime in the worker, an AOTInductor package ``.pt2``
  or an ExportedProgram ``.pt2``, fp32 or PT2E int8), ptopt's self-contained handler
  (``serve/handler.py``), a ``model-config.yaml`` (batch size, max batch delay, workers, threads) and
  the artifact's sidecar, which tells the handler what inputs to accept.
- ``format="triton"``: a Triton Inference Server model repository (see ``ptopt.serve.triton``).
- ``format="ray"``: a Ray Serve application folder (``serve run``/``serve deploy`` config, application
  file, manifest, the artifact) that serves the Open Inference Protocol (see ``ptopt.serve.ray_package``).

ARTIFACT is a TorchScript ``.pt`` or ``.onnx`` file (with or without a ptopt sidecar), a ``.pt2``
(served as is in a .mar; for Triton an AOTInductor package goes to the PyTorch backend's
``torch_aoti`` platform), or any other MODEL reference (eager, ``pkg.module:factory``, ``zoo:NAME``),
which is exported to TorchScript first with ``ptopt.export``. An AOTInductor package is compiled
native code that runs when it loads: packaging one needs ``allow_pickle`` (``--allow-pickle``), as
loading it does anywhere else in ptopt (``ptopt.core.modelref``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ptopt.core.artifact import Artifact, atomic_path
from ptopt.core.errors import ModelLoadError, UsageError
from ptopt.core.formats import get_format
from ptopt.core.options import Options, Selector, fields_of, option
from ptopt.serve.prepare import (
    Prepared,
    _checked_model_name,
    default_name,
    model_name_for,
    prepare,
    servable_formats,
)
from ptopt.serve.ray_config import RayServeConfig

__all__ = ["package", "prepare", "servable_formats", "model_name_for", "Prepared"]

PACKAGE_FORMATS = ("mar", "triton", "ray")
#: How long TorchServe waits to fill a batch (ms) when batch_size > 1.
DEFAULT_MAX_BATCH_DELAY_MS = 5
DEFAULT_RESPONSE_TIMEOUT_S = 120
HANDLER_FILE = Path(__file__).with_name("handler.py")
#: name of the handler inside the .mar (a unique module name in the worker)
HANDLER_NAME = "ptopt_handler.py"
#: torch-model-archiver stages files in tempfile.gettempdir()/<model name>; one packaging at a time
_ARCHIVER_LOCK = threading.Lock()


@dataclasses.dataclass(frozen=True)
class PackageConfig:
    """How the server runs the packaged model: request batching, workers, threads, its name. Its
    fields are ``ptopt package``'s options (``ptopt.core.options``)."""

    batch_size: int = option(
        1, help="Server-side request batching: up to this many requests run as one batch."
    )
    max_batch_delay_ms: int = option(
        DEFAULT_MAX_BATCH_DELAY_MS,
        help="Milliseconds the server waits to fill a batch.",
        flag="--max-batch-delay",
    )
    workers: int | str = option(
        1,
        help="Worker processes (TorchServe) or model instances (Triton); 'auto': one per physical core, each "
        "with one thread (unless --threads).",
        metavar="N|auto",
    )
    threads: int | None = option(
        None, help="Intra-op threads per worker or replica (default: the runtime's; ray: its whole CPUs)."
    )
    model_name: str | None = option(
        None, help="Name served under (default: from the output / artifact name)."
    )
    response_timeout_s: int = option(
        DEFAULT_RESPONSE_TIMEOUT_S,
        help="Seconds TorchServe waits for one prediction before it restarts the worker.",
        flag="--response-timeout",
        applies=("mar",),
    )

    def __post_init__(self) -> None:
        workers = self.workers
        if isinstance(workers, str) and workers.strip().isdigit():
            object.__setattr__(self, "workers", int(workers))


def _formats() -> tuple[str, ...]:
    return PACKAGE_FORMATS


def _takes(format: str) -> tuple[str, ...]:
    """The options ``--format`` takes: Ray Serve's settings for ``ray``, the rest for a .mar / Triton."""
    if format == "ray":
        return (*fields_of(RayServeConfig), "model_name")
    return tuple(fields_of(PackageConfig))


#: the options of ``ptopt package`` / ``ptopt.package``
OPTIONS = Options(
    "package",
    lambda: (PackageConfig, RayServeConfig),
    Selector(
        "format",
        "mar: a TorchServe model archive; triton: a Triton Inference Server model repository (a folder); "
        "ray: a Ray Serve application folder (serve run / serve deploy) speaking the Open Inference Protocol.",
        _formats,
        takes=_takes,
    ),
)


@OPTIONS.twin
def package(
    artifact: Any,
    format: str,
    output: str | os.PathLike,
    *,
    input_shapes: Sequence[tuple[str | None, tuple[int, ...]]] = (),
    weights: str | os.PathLike | None = None,
    allow_pickle: bool = False,
    **options: Any,
) -> Artifact:
    """Package ``artifact`` for serving; returns the written Artifact (``.mar`` file, Triton or Ray
    Serve folder).

    ``input_shapes`` (``[(name | None, shape)]`` or strings like ``"1x3x32x32"`` / ``"input_ids=1x128"``;
    the first dim is the batch) stand in for a missing sidecar. ``options``: ``PackageConfig``'s
    fields for ``mar``/``triton``, ``RayServeConfig``'s for ``ray`` (listed below):
    ``batch_size``/``max_batch_delay_ms`` configure the server's request batching, ``workers`` its
    worker processes (TorchServe) or instances (Triton), ``threads`` the intra-op threads per worker
    (or Ray Serve replica). ``workers="auto"``: one worker per physical core this process may use, each
    with one thread (unless ``threads`` says otherwise), so the workers together use every core once.
    ``format="ray"``: replicas, Serve's dynamic batching, CPUs per replica and limits
    (``ptopt.serve.ray_package``).
    """
    if format not in PACKAGE_FORMATS:
        raise UsageError(f"unknown --format {format!r}: choose one of {', '.join(PACKAGE_FORMATS)}")
    given = OPTIONS.check(options, format)
    input_shapes = _parsed_shapes(input_shapes)
    if format == "ray":
        from ptopt.serve.ray_package import package_folder

        config = OPTIONS.build(RayServeConfig, given)
        name = given.get("model_name")
        return package_folder(artifact, Path(output), name, input_shapes, weights, allow_pickle, config)
    cfg = OPTIONS.build(PackageConfig, given)
    batch_size, max_batch_delay_ms, model_name = cfg.batch_size, cfg.max_batch_delay_ms, cfg.model_name
    workers, threads, response_timeout_s = cfg.workers, cfg.threads, cfg.response_timeout_s
    workers, threads = resolve_workers(workers, threads)
    _check_options(format, batch_size, workers, max_batch_delay_ms, response_timeout_s, threads)
    output = _checked_output(format, Path(output))
    name = _checked_model_name(model_name or _default_model_name(format, output, artifact))
    if format == "mar":
        from ptopt.core.features import require

        require("torchserve", "packaging a .mar")  # torch-model-archiver comes with it (the serve extra)
    with tempfile.TemporaryDirectory(prefix="ptopt-package-") as tmp:
        opts = dict(input_shapes=input_shapes, weights=weights, allow_pickle=allow_pickle)
        prep = prepare(artifact, Path(tmp), package=format, **opts)
        _check_batch_fits(batch_size, prep)
        if format == "triton" and get_format(prep.format).triton_platform == "torch_aoti" and batch_size > 1:
            raise UsageError(
                f"--batch-size {batch_size}: Triton's torch_aoti platform does not batch requests yet "
                "(its max_batch_size is 0; a client sends whole batches); use --batch-size 1"
            )
        config = {
            "type": "package",
            "format": format,
            "batch_size": int(batch_size),
            "max_batch_delay_ms": int(max_batch_delay_ms),
            "workers": int(workers),
            "threads": threads,
            "model_name": name,
        }
        if format == "triton":
            from ptopt.serve.triton import write_repository

            return write_repository(prep, output, name, config)
        return _write_mar(prep, output, name, config, response_timeout_s, Path(tmp))


def physical_cores() -> int:
    """Physical cores among the CPUs this process may run on (hyper-threads counted once), from
    /proc/cpuinfo's (physical id, core id) pairs; the usable CPU count where that is not available."""
    try:
        usable = os.sched_getaffinity(0)
    except AttributeError:
        usable = set(range(os.cpu_count() or 1))
    cores, cpu, phys = set(), None, "0"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                key, _, value = (part.strip() for part in line.partition(":"))
                if key == "processor":
                    cpu, phys = int(value), "0"
                elif key == "physical id":
                    phys = value
                elif key == "core id" and cpu in usable:
                    cores.add((phys, value))
    except (OSError, ValueError):
        cores = set()
    return max(1, len(cores) or len(usable))


def resolve_workers(workers: int | str, threads: int | None) -> tuple[int, int | None]:
    """``(workers, threads)`` with ``"auto"`` resolved (see :func:`package`); other text is refused."""
    if isinstance(workers, str):
        if workers.strip().lower() == "auto":
            return physical_cores(), 1 if threads is None else threads
        try:
            workers = int(workers)
        except ValueError:
            raise UsageError(f"--workers {workers!r}: give a number of workers or 'auto'") from None
    return int(workers), threads


def _parsed_shapes(input_shapes: Sequence) -> Sequence:
    """``[(name | None, shape)]`` from the CLI's and recipes' spelling (``"input_ids=1x128"``) too."""
    if not any(isinstance(v, str) for v in input_shapes):
        return input_shapes
    from ptopt.core.inputspec import parse_named_shapes

    return [v for s in input_shapes for v in (parse_named_shapes([s]) if isinstance(s, str) else [s])]


def _check_options(
    format: str,
    batch_size: int,
    workers: int,
    max_batch_delay_ms: int,
    response_timeout_s: int,
    threads: int | None,
) -> None:
    for opt, v, lo in (
        ("--batch-size", batch_size, 1),
        ("--workers", workers, 1),
        ("--max-batch-delay", max_batch_delay_ms, 0),
        ("--response-timeout", response_timeout_s, 1),
    ):
        if int(v) < lo:
            raise UsageError(f"{opt} must be >= {lo}, got {v}")
    if threads is not None and int(threads) < 1:
        raise UsageError(f"--threads must be >= 1, got {threads}")


def _checked_output(format: str, output: Path) -> Path:
    """A ``.mar`` file name for TorchServe, a folder (or a new name) for Triton."""
    if format == "mar" and output.suffix != ".mar":
        raise UsageError(f"-o {output}: a TorchServe archive must end in .mar")
    if output.is_dir() and format == "mar":
        raise UsageError(f"-o {output} is a folder; give a file name ending in .mar")
    if format == "triton" and output.exists() and not output.is_dir():
        raise UsageError(f"-o {output}: a Triton model repository is a folder, and this is a file")
    return output


def _default_model_name(format: str, output: Path, artifact: Any) -> str:
    return model_name_for(output if format == "mar" else default_name(artifact))


def _check_batch_fits(batch_size: int, prep: Prepared) -> None:
    """The server's batch must fit the model's dynamic batch range (a fixed batch is not checked here)."""
    first = prep.inputs[0]
    if batch_size > first.max_shape[0] and first.max_shape[0] != first.min_shape[0]:
        raise UsageError(
            f"--batch-size {batch_size} is larger than the model's max batch "
            f"{first.max_shape[0]} ({first.describe()})"
        )


# -- TorchServe ------------------------------------------------------------------------------


def model_config_yaml(
    batch_size: int, max_batch_delay_ms: int, workers: int, threads: int | None, response_timeout_s: int
) -> str:
    """TorchServe's per-model config (model-config.yaml), read when the .mar is registered."""
    import yaml

    cfg: dict[str, Any] = {
        "minWorkers": workers,
        "maxWorkers": workers,
        "batchSize": batch_size,
        "maxBatchDelay": max_batch_delay_ms,
        "responseTimeout": response_timeout_s,
    }
    if threads:
        cfg["handler"] = {"threads": int(threads)}
    return yaml.safe_dump(cfg, sort_keys=False)


def _write_mar(
    prep: Prepared, output: Path, name: str, config: dict[str, Any], response_timeout_s: int, tmp: Path
) -> Artifact:
    """Stage the files, run torch-model-archiver, move the .mar into place, write its sidecar."""
    staged = _stage_mar_files(prep, tmp / "stage", config, response_timeout_s)
    built = _run_archiver(staged, name, tmp)
    with atomic_path(output) as dest:
        shutil.copyfile(built, dest)
    art = Artifact(
        output,
        "mar",
        inputs=prep.inputs,
        input_style=prep.input_style,
        config=config,
        parent=prep.parent,
        precision=prep.precision,
        extra={
            "model_name": name,
            "model_format": prep.format,
            "model_file": prep.path.name,
            "response_timeout_s": response_timeout_s,
        },
    )
    return art.finalize()


@dataclasses.dataclass
class _MarFiles:
    """What goes into the archive, staged in one folder."""

    model_file: Path
    extra: list[Path]
    handler: Path
    model_config: Path


def _stage_mar_files(
    prep: Prepared, stage: Path, config: dict[str, Any], response_timeout_s: int
) -> _MarFiles:
    """The model's files, its sidecar (the handler reads the inputs from it), the handler and the
    model-config.yaml, copied into ``stage``."""
    stage.mkdir()
    extra: list[Path] = []
    for f in prep.files:
        shutil.copy2(f, stage / f.name)
        if f.name != prep.path.name:
            extra.append(stage / f.name)
    side = stage / (prep.path.name + ".ptopt.json")
    side.write_text(json.dumps(prep.sidecar, indent=2) + "\n", encoding="utf-8")
    extra.append(side)
    handler = stage / HANDLER_NAME
    shutil.copy2(HANDLER_FILE, handler)
    model_cfg = stage / "model-config.yaml"
    model_cfg.write_text(
        model_config_yaml(
            config["batch_size"],
            config["max_batch_delay_ms"],
            config["workers"],
            config["threads"],
            response_timeout_s,
        ),
        encoding="utf-8",
    )
    return _MarFiles(stage / prep.path.name, extra, handler, model_cfg)


def _run_archiver(files: _MarFiles, name: str, tmp: Path) -> Path:
    """torch-model-archiver, kept inside ``tmp``; returns the built ``<name>.mar``."""
    from model_archiver.model_archiver_config import ModelArchiverConfig
    from model_archiver.model_packaging import package_model
    from model_archiver.model_packaging_utils import ModelExportUtils

    export_dir = tmp / "out"
    export_dir.mkdir()
    archiver_tmp = tmp / "archiver"
    archiver_tmp.mkdir()
    cfg = ModelArchiverConfig(
        model_name=name,
        handler=str(files.handler),
        version="1.0",
        serialized_file=str(files.model_file),
        extra_files=",".join(str(p) for p in files.extra),
        export_path=str(export_dir),
        config_file=str(files.model_config),
        force=True,
    )
    with _ARCHIVER_LOCK:
        saved = tempfile.tempdir
        tempfile.tempdir = str(archiver_tmp)  # the archiver stages in gettempdir()/<name>: keep it private
        try:
            manifest = ModelExportUtils.generate_manifest_json(cfg)
            package_model(cfg, manifest=manifest)
        except Exception as e:  # noqa: BLE001 - ModelArchiverError, OSError...
            raise ModelLoadError(f"torch-model-archiver failed: {type(e).__name__}: {e}") from None
        finally:
            tempfile.tempdir = saved
    return export_dir / f"{name}.mar"
