"""``ptopt package --format ray``: a folder a Ray cluster serves without ptopt's CLI.

    OUT/
      serve_config.yaml     what `serve run` / `serve deploy` take (applications, deployments, HTTP)
      ptopt_ray_app.py      the Serve application (import path ptopt_ray_app:app)
      ptopt_ray.json        the manifest: the models, their input specs, batching, replicas, limits
      model/NAME/...        the artifact's file(s) and its sidecar (a language model: its folder)
      model/NAME/tokenizer/ the tokenizer of the folder an encoder or classifier was made from: the
                            model takes text as well as tensors (``serve.text_inputs``)

The application file imports ``ptopt.serve.ray_app``: the cluster's Python needs ``ptopt[ray]``
(the replicas load the artifact through ptopt's format table, which also covers AOTInductor,
OpenVINO and the weight-only language-model folders; copying those loaders into the folder would
make a second loader to keep in step), and ``transformers`` where a model takes text (its ingress
loads the packaged tokenizer; without it, that model takes tensors only). The Serve config's
``working_dir`` is ``local://OUT``: the folder as it lies on this machine (every node of a cluster
needs it at that path, e.g. shared storage); for a cluster without it, zip the folder, put the zip
where the cluster reads URIs and set ``working_dir`` to its URI. ``ptopt serve --engine ray`` deploys
the same application.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ptopt.core.artifact import Artifact, staged_dir
from ptopt.core.errors import ModelLoadError, PtoptError, UsageError
from ptopt.core.formats import find_format, get_format, sniff_file
from ptopt.serve.prepare import _checked_model_name, default_name, model_name_for, prepare
from ptopt.serve.ray_config import (
    GRACEFUL_WAIT_LOOP_S,
    INGRESS_MAX_ONGOING,
    SERVE_FAST_PATH,
    RayServeConfig,
    logging_config,
)

MANIFEST = "ptopt_ray.json"
APP_FILE = "ptopt_ray_app.py"
CONFIG_FILE = "serve_config.yaml"
SCHEMA = "ptopt.ray/1"
INGRESS = "ingress"
DEFAULT_HTTP_PORT = 8000

_APP_SOURCE = '''"""The Ray Serve application of the ptopt package in this folder (``ptopt package --format ray``).

    serve run serve_config.yaml          # or, on a running cluster: serve deploy serve_config.yaml

The replicas load the artifact through ptopt's format table: the cluster's Python needs
``pip install "ptopt[ray]"`` (the version that wrote this folder: {version}).
"""

from pathlib import Path

try:
    from ptopt.serve.ray_app import app_from_folder
except ImportError as e:  # pragma: no cover - a cluster without ptopt
    raise ImportError(
        "this Ray Serve application needs ptopt in the cluster's Python: pip install 'ptopt[ray]' (" + str(e) + ")"
    ) from None

app = app_from_folder(Path(__file__).resolve().parent)
'''


@dataclasses.dataclass
class RayModel:
    """One artifact to serve: its file (or folder), what it takes, and where its files are."""

    name: str
    path: Path
    format: str
    kind: str  # "tensor" | "text"
    inputs: list[dict[str, Any]]
    input_style: str
    precision: str
    files: list[Path]
    sidecar: dict[str, Any] | None
    parent: dict[str, Any] | None
    allow_pickle: bool = False
    #: a saved tokenizer (a folder) that turns text into this model's inputs, or None
    tokenizer: Path | None = None
    #: why this tensor model takes no text (or no pairs), where it was made from a folder with a tokenizer
    text_note: str = ""
    #: the sentence-transformers pooling the server adds as ``sentence_embedding`` (``serve.pooling``)
    pooling: dict[str, Any] | None = None
    pooling_note: str = ""
    #: a sequence classifier's class names, answered as ``label`` (``serve.labels``)
    labels: list[str] | None = None
    labels_note: str = ""

    @property
    def max_batch(self) -> int:
        return min((s["max_shape"][0] for s in self.inputs), default=1)


def prepare_model(
    artifact: Any,
    tmp: Path,
    name: str,
    *,
    input_shapes: Any = (),
    weights: Any = None,
    allow_pickle: bool = False,
) -> RayModel:
    """What to serve for ``artifact``: a file of a format Ray serves as it is (the format table's
    ``servers``), a language-model folder, or any other MODEL exported to TorchScript into ``tmp``."""
    text = _text_model(artifact, name, allow_pickle)
    if text is not None:
        return text
    prep = prepare(
        artifact, tmp, input_shapes=input_shapes, weights=weights, allow_pickle=allow_pickle,
        package="ray",
    )  # fmt: skip
    trusted = get_format(prep.format).trusted_load and allow_pickle  # prepare() refused it otherwise
    model = RayModel(
        name, prep.path, prep.format, "tensor", [s.to_dict() for s in prep.inputs], prep.input_style,
        prep.precision, list(prep.files), prep.sidecar, prep.parent, trusted,
    )  # fmt: skip
    _from_folder(model, artifact, tmp)
    return model


def _from_folder(model: RayModel, artifact: Any, tmp: Path) -> None:
    """What the Hugging Face folder ``artifact`` was made from (``core.sentences``: the sidecars' parents)
    adds to ``model``: its tokenizer, and with it a sentence encoder's pooling and a classifier's labels."""
    from ptopt.core.sentences import sentence_folder
    from ptopt.serve.labels import labels_of
    from ptopt.serve.pooling import pooling_of

    ref = artifact.path if isinstance(artifact, Artifact) else artifact
    folder = sentence_folder(ref) if isinstance(ref, (str, Path)) else None
    if folder is None:
        return
    model.tokenizer, model.text_note = _tokenizer(folder, model, tmp)
    if model.tokenizer is not None:
        model.pooling, model.pooling_note = pooling_of(folder)
        model.labels, model.labels_note = labels_of(folder)


def _tokenizer(folder: Path, model: RayModel, tmp: Path) -> tuple[Path | None, str]:
    """``folder``'s tokenizer, saved under ``tmp`` when the model takes what it makes
    (``serve.text_inputs``); else None and why not (empty when the folder holds no tokenizer)."""
    from ptopt.core.hf import has_tokenizer, load_tokenizer
    from ptopt.serve.text_inputs import why_no_padding, why_no_text

    if not has_tokenizer(folder):
        return None, ""
    reason = why_no_text(model.inputs)
    if reason is not None:
        return None, f"no text input ({folder.name}'s tokenizer not used: {reason})"
    try:
        tokenizer = load_tokenizer(folder)
    except PtoptError as e:  # a tokenizer this Python cannot read (a missing package, ...): tensors only
        return None, f"no text input ({folder.name}'s tokenizer cannot be read here: {str(e)[:200]})"
    reason = why_no_padding(tokenizer)
    if reason is not None:
        return None, f"no text input ({folder.name}'s tokenizer not used: {reason})"
    dest = tmp / f"{model.name}.tokenizer"
    tokenizer.save_pretrained(str(dest))
    names = {s["name"] for s in model.inputs}
    if "token_type_ids" not in names and "token_type_ids" in getattr(tokenizer, "model_input_names", ()):
        return dest, "pairs need token_type_ids, which this model does not take"
    return dest, ""


def _text_model(artifact: Any, name: str, allow_pickle: bool) -> RayModel | None:
    """A language-model folder (a format row that ``generates_text``), as it is; None otherwise."""
    if isinstance(artifact, Artifact):
        artifact = artifact.path
    if not isinstance(artifact, (str, Path)) or not Path(artifact).is_dir():
        return None
    path = Path(artifact)
    art = Artifact.maybe_load(path)
    row = find_format(art.format) if art is not None else sniff_file(path)
    if row is None:
        raise ModelLoadError(f"{path}: a folder that is no model ptopt knows (no config.json, no sidecar)")
    if not row.generates_text:
        return None
    from ptopt.core.hf import has_tokenizer

    if not has_tokenizer(path):
        raise ModelLoadError(
            f"{path}: a language model is served as text, and this folder has no tokenizer; "
            "save the tokenizer beside config.json"
        )
    files = sorted(p for p in path.rglob("*") if p.is_file())
    side = art.to_dict() if art is not None else None
    parent = {"path": str(path), "format": row.name, **({"sha256": art.sha256} if art and art.sha256 else {})}
    precision = art.precision if art is not None else "fp32"
    return RayModel(name, path, row.name, "text", [], "text", precision, files, side, parent, allow_pickle)


def manifest(models: list[RayModel], app_name: str, config: RayServeConfig) -> dict[str, Any]:
    """The package's ``ptopt_ray.json``: every model and the serving settings."""
    entries = []
    for m in models:
        entries.append(
            {
                "name": m.name,
                "path": f"model/{m.name}/{m.path.name}",
                "format": m.format,
                "kind": m.kind,
                "inputs": m.inputs,
                "input_style": m.input_style,
                "precision": m.precision,
                "max_batch": m.max_batch,
                "allow_pickle": m.allow_pickle,
                "tokenizer": f"model/{m.name}/tokenizer" if m.tokenizer is not None else None,
                "pooling": m.pooling,
                "labels": m.labels,
            }
        )
    return {
        "schema": SCHEMA,
        "app_name": app_name,
        "models": entries,
        **config.manifest(),
        "config": dataclasses.asdict(config),  # the options it was packaged with (ptopt serve reads them)
    }


def stage_folder(models: list[RayModel], dest: Path, man: dict[str, Any], serve_config: str) -> None:
    """Write the package into the (empty) folder ``dest``."""
    for m in models:
        home = dest / "model" / m.name
        home.mkdir(parents=True)
        base = m.path.parent
        for f in m.files:
            target = home / f.relative_to(base)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, target)
        if m.sidecar is not None:
            _write_sidecar(m, home / m.path.name)
        if m.tokenizer is not None:
            shutil.copytree(m.tokenizer, home / "tokenizer")
    (dest / MANIFEST).write_text(json.dumps(man, indent=2) + "\n", encoding="utf-8")
    (dest / APP_FILE).write_text(_APP_SOURCE.format(version=_version()), encoding="utf-8")
    (dest / CONFIG_FILE).write_text(serve_config, encoding="utf-8")


def _write_sidecar(m: RayModel, copied: Path) -> None:
    """The sidecar of the copied file (or folder): what the artifact's said, measured again here."""
    data = dict(m.sidecar or {})
    data.setdefault("format", m.format)
    if m.kind == "tensor":
        data["inputs"], data["input_style"] = m.inputs, m.input_style
    data["files"] = [f.relative_to(m.path.parent).as_posix() for f in m.files]
    art = Artifact.from_dict(copied, data)
    art.sha256, art.hashes = "", {}
    art.finalize()


def serve_config_yaml(man: dict[str, Any], working_dir: str, host: str, port: int) -> str:
    """The Serve config (``serve run`` / ``serve deploy``) of one package: its application and the
    deployments' replicas, CPUs and concurrency, as ``serve.ray_app.build_app`` sets them."""
    import yaml

    deployments: list[dict[str, Any]] = [
        {
            "name": INGRESS,
            "num_replicas": int(man["ingress_replicas"]),
            "max_ongoing_requests": INGRESS_MAX_ONGOING,
            "ray_actor_options": {"num_cpus": 0},
            "graceful_shutdown_wait_loop_s": GRACEFUL_WAIT_LOOP_S,
        }
    ]
    for entry in man["models"]:
        dep: dict[str, Any] = {
            "name": f"model_{entry['name']}",
            "max_ongoing_requests": int(man["model_max_ongoing"]),
            "ray_actor_options": {"num_cpus": float(man["cpus_per_replica"])},
            "graceful_shutdown_wait_loop_s": GRACEFUL_WAIT_LOOP_S,
        }
        scaling = man["replicas"]
        if isinstance(scaling, dict):
            dep["autoscaling_config"] = {
                "min_replicas": scaling["min"],
                "max_replicas": scaling["max"],
                "target_ongoing_requests": scaling["target_ongoing_requests"],
            }
        else:
            dep["num_replicas"] = int(scaling)
        deployments.append(dep)
    logs = man.get("logging_config") or logging_config(False)
    config = {
        "proxy_location": "HeadOnly",
        "http_options": {"host": host, "port": int(port)},
        "logging_config": logs,
        "applications": [
            {
                "name": man["app_name"],
                "route_prefix": "/",
                "import_path": APP_FILE[: -len(".py")] + ":app",
                # the replicas' env (a cluster's proxy keeps its node's: set them there for it too)
                "runtime_env": {"working_dir": working_dir, "env_vars": dict(SERVE_FAST_PATH)},
                "logging_config": logs,
                "deployments": deployments,
            }
        ],
    }
    head = (
        f"# Ray Serve config of the ptopt package {man['app_name']!r}: serve run {CONFIG_FILE}"
        f" (or serve deploy {CONFIG_FILE} on a running cluster).\n"
        "# host 127.0.0.1 answers this machine only: 0.0.0.0 answers the network. working_dir: this folder,\n"
        "# at this path on every node (or the URI of a zip of it).\n"
    )
    return head + yaml.safe_dump(config, sort_keys=False)


def check_new_folder(output: Path) -> None:
    """A Ray Serve package is a new (or empty) folder: anything else is refused before any work
    (``ptopt run`` asks before its first step)."""
    if output.exists() and (not output.is_dir() or any(output.iterdir())):
        raise UsageError(
            f"-o {output}: a Ray Serve package is a new folder, and this one exists and is not empty"
        )


def write_package(
    models: list[RayModel],
    output: Path,
    app_name: str,
    config: RayServeConfig,
    *,
    host: str = "127.0.0.1",
    port: int = DEFAULT_HTTP_PORT,
) -> Artifact:
    """Write the package folder (module docstring) and its sidecar; returns the Artifact."""
    check_new_folder(output)
    man = manifest(models, app_name, config)
    # the config names the folder where it will be: staged_dir moves the files there
    serve_config = serve_config_yaml(man, f"local://{output.resolve()}", host, port)
    with staged_dir(output) as stage:
        stage_folder(models, stage, man, serve_config)
        written = sorted(p.relative_to(stage) for p in stage.rglob("*") if p.is_file())
    first = models[0]
    art = Artifact(
        output,
        "ray",
        inputs=[_spec(s) for s in first.inputs],
        input_style=first.input_style,
        config={"type": "package", "format": "ray", "model_name": app_name, **dataclasses.asdict(config)},
        parent=first.parent,
        precision=first.precision,
        files=[f"{output.name}/{p.as_posix()}" for p in written],
        extra={
            "model_name": app_name,
            "model_format": first.format,
            "models": [m.name for m in models],
            "text_input": {m.name: _text_input(m) for m in models if m.kind == "tensor"},
            "pooling": {m.name: _pooling(m) for m in models if m.kind == "tensor"},
            "labels": {m.name: _labels(m) for m in models if m.kind == "tensor"},
        },
    )
    return art.finalize()


def _text_input(m: RayModel) -> str:
    """What the package says of a tensor model's text input (``package`` prints it)."""
    if m.tokenizer is not None:
        what = "texts" if m.text_note else "texts, or pairs"
        note = f"; {m.text_note}" if m.text_note else ""
        return f"text_input (BYTES: {what}) tokenized by the tokenizer packaged beside it{note}"
    return m.text_note


def _pooling(m: RayModel) -> str:
    """What the package says of a sentence encoder's pooled output (``package`` prints it)."""
    if m.pooling is None:
        return m.pooling_note
    how = " + ".join(m.pooling["modes"]) + (", normalized" if m.pooling["normalize"] else "")
    return (
        f"sentence_embedding: last_hidden_state pooled by the folder's sentence-transformers modules ({how})"
    )


def _labels(m: RayModel) -> str:
    """What the package says of a classifier's ``label`` output (``package`` prints it)."""
    if m.labels is None:
        return m.labels_note
    shown = ", ".join(m.labels[:4]) + (", ..." if len(m.labels) > 4 else "")
    return f"label: the name of the largest logit ({shown}); score: its probability"


def _spec(d: dict[str, Any]) -> Any:
    from ptopt.core.inputspec import InputSpec

    return InputSpec.from_dict(d)


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("ptopt")
    except Exception:  # noqa: BLE001 - a source tree without distribution metadata
        return "unknown"


def read_manifest(folder: Path) -> dict[str, Any]:
    """A package folder's manifest (ModelLoadError when it is not one)."""
    path = Path(folder) / MANIFEST
    try:
        man = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"{folder}: not a ptopt Ray Serve package ({path.name}: {e})") from None
    if not isinstance(man, dict) or man.get("schema") != SCHEMA:
        raise ModelLoadError(f"{path}: not a ptopt Ray Serve manifest (schema {SCHEMA})")
    return man


def package_folder(
    artifact: Any, output: Path, model_name: str | None, input_shapes: Sequence,
    weights: Any, allow_pickle: bool, config: RayServeConfig,
) -> Artifact:  # fmt: skip
    """``ptopt.serve.package.package(..., format="ray")``: the folder (module docstring)."""
    import tempfile

    if output.exists() and not output.is_dir():
        raise UsageError(f"-o {output}: a Ray Serve package is a folder, and this is a file")
    name = _checked_model_name(model_name or model_name_for(default_name(artifact)))
    with tempfile.TemporaryDirectory(prefix="ptopt-package-") as tmp:
        model = prepare_model(
            artifact, Path(tmp), name, input_shapes=input_shapes, weights=weights, allow_pickle=allow_pickle
        )
        if (
            model.kind == "tensor"
            and config.max_batch_size > model.max_batch
            and model.inputs[0]["min_shape"][0] != model.max_batch
        ):
            raise UsageError(
                f"--max-batch-size {config.max_batch_size} is larger than the model's max batch {model.max_batch}"
            )
        return write_package([model], output, name, config)
