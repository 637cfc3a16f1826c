"""Optional backends: is each one usable here, and if not, why and how to get it.

A missing backend is never a bare ImportError: ``require(name)`` raises MissingDependencyError with
the install instruction.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import os
import shutil
import subprocess

from ptopt.core.errors import MissingDependencyError
from ptopt.core.system import package_version


@dataclasses.dataclass
class Feature:
    name: str
    available: bool
    version: str | None = None
    detail: str = ""
    fix: str = ""


def _module_present(mod: str) -> bool:
    try:
        return importlib.util.find_spec(mod) is not None
    except (ImportError, ValueError):
        return False


def check_torch() -> Feature:
    import torch

    return Feature(
        "torch",
        True,
        torch.__version__,
        f"quantized engines: {', '.join(torch.backends.quantized.supported_engines)}",
    )


def check_cuda() -> Feature:
    import torch

    if torch.cuda.is_available():
        name = torch.cuda.get_device_name(0)
        return Feature("cuda", True, torch.version.cuda, f"{torch.cuda.device_count()} device(s): {name}")
    why = "torch is a CPU build" if torch.version.cuda is None else "no CUDA device visible"
    return Feature("cuda", False, None, why, "needs an NVIDIA GPU and a CUDA build of torch")


def check_onnxruntime() -> Feature:
    try:
        import onnxruntime as ort
    except ImportError as e:
        return Feature("onnxruntime", False, None, str(e), "pip install onnxruntime")
    return Feature(
        "onnxruntime", True, ort.__version__, f"providers: {', '.join(ort.get_available_providers())}"
    )


def check_onnx() -> Feature:
    v, script = package_version("onnx"), package_version("onnxscript")
    if v is None or script is None:
        missing = " and ".join(n for n, x in (("onnx", v), ("onnxscript", script)) if x is None)
        return Feature("onnx", False, v, f"{missing} not installed", "pip install onnx onnxscript")
    return Feature("onnx", True, v, f"export --target onnx (onnxscript {script}: torch's ONNX exporter)")


def check_torchao() -> Feature:
    """Whether torchao is installed: ``ptopt quantize --engine pt2e|auto`` needs it (the FX engine,
    the default, runs on torch.ao)."""
    v = package_version("torchao")
    if v is None:
        return Feature(
            "torchao",
            False,
            None,
            "not installed (optional; needed by ptopt quantize --engine pt2e|auto)",
            "pip install 'ptopt[torchao]'",
        )
    return Feature(
        "torchao",
        True,
        v,
        "quantize --engine pt2e|auto (PT2E int8), weight-only int8/int4 (--engine torchao)",
    )


def check_tensorrt() -> Feature:
    v = package_version("torch-tensorrt") or package_version("torch_tensorrt")
    fix = "pip install 'ptopt[tensorrt]' on a machine with an NVIDIA GPU, CUDA and TensorRT"
    if v is None or not _module_present("torch_tensorrt"):
        return Feature("torch_tensorrt", False, None, "torch_tensorrt is not installed", fix)
    try:
        import torch

        if not torch.cuda.is_available():
            return Feature("torch_tensorrt", False, v, "installed, but no CUDA device is available", fix)
        import tensorrt  # noqa: F401
    except Exception as e:  # noqa: BLE001 - broken TensorRT installs raise many kinds
        return Feature("torch_tensorrt", False, v, f"installed but not importable: {e}", fix)
    return Feature("torch_tensorrt", True, v, f"TensorRT {package_version('tensorrt') or '?'}")


def java_version() -> str | None:
    java = shutil.which("java") or (
        os.path.join(os.environ["JAVA_HOME"], "bin", "java") if os.environ.get("JAVA_HOME") else None
    )
    if not java or not os.path.exists(java):
        return None
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    first = (out.stderr or out.stdout).strip().splitlines()
    return first[0] if first else "unknown"


def _java_major(version_line: str) -> int | None:
    """17 from 'openjdk version "17.0.15" 2025-04-15'; 8 from '"1.8.0_402"'."""
    import re

    m = re.search(r'"(\d+)(?:\.(\d+))?', version_line)
    if not m:
        return None
    major = int(m.group(1))
    return int(m.group(2) or 0) if major == 1 else major


def check_java() -> Feature:
    v = java_version()
    fix = "install a JDK 17, e.g. apt-get install openjdk-17-jre-headless (or set JAVA_HOME)"
    if v is None:
        return Feature("java", False, None, "java not found on PATH (TorchServe needs Java 11+)", fix)
    major = _java_major(v)
    short = _java_release(v)
    if major is not None and major < 11:
        return Feature("java", False, short, f"Java {major} is too old: TorchServe needs Java 11+ ({v})", fix)
    return Feature("java", True, short, f"TorchServe's frontend (ptopt serve of a .mar); {v}")


def _java_release(version_line: str) -> str:
    """``17.0.15`` from 'openjdk version "17.0.15" 2025-04-15' (the line itself when it has none)."""
    import re

    m = re.search(r'"([^"]+)"', version_line)
    return m.group(1) if m else version_line


def check_torchserve() -> Feature:
    v = package_version("torchserve")
    fix = "pip install 'ptopt[serve]'"
    if v is None:
        return Feature("torchserve", False, None, "not installed", fix)
    missing = [m for m in ("model_archiver", "yaml") if not _module_present(m)]
    if missing:
        names = {"model_archiver": "torch-model-archiver", "yaml": "PyYAML (torchserve needs it, undeclared)"}
        return Feature("torchserve", False, v, "missing " + ", ".join(names[m] for m in missing), fix)
    # ptopt starts TorchServe through its Python entry point (ts.model_server), so the `torchserve`
    # script need not be on PATH; the Java frontend ships inside the package.
    spec = importlib.util.find_spec("ts")
    jar = (
        os.path.join(os.path.dirname(spec.origin), "frontend", "model-server.jar")
        if spec and spec.origin
        else None
    )
    if not _module_present("ts.model_server") or not jar or not os.path.isfile(jar):
        return Feature(
            "torchserve", False, v, "the ts package is incomplete (no ts.model_server or frontend jar)", fix
        )
    detail = f"package --format mar, serve of a .mar (torch-model-archiver {package_version('torch-model-archiver')})"
    if java_version() is None:
        detail += "; serving also needs Java (see the java row)"
    return Feature("torchserve", True, v, detail)


def check_ray() -> Feature:
    """Ray Serve (``ptopt serve --engine ray``, ``ptopt package --format ray``): ``ray[serve]``, whose
    serve extra brings the HTTP stack (starlette, uvicorn) the server needs."""
    v = package_version("ray")
    fix = "pip install 'ptopt[ray]'"
    if v is None:
        return Feature("ray", False, None, "not installed", fix)
    spec = importlib.util.find_spec("ray")  # ray.serve by its file: importing ray takes seconds
    serve_ok = bool(
        spec and spec.origin and os.path.isfile(os.path.join(os.path.dirname(spec.origin), "serve", "api.py"))
    )
    missing = [m for m in ("starlette", "uvicorn") if not _module_present(m)] + (
        [] if serve_ok else ["ray.serve"]
    )
    if missing:
        return Feature("ray", False, v, f"Ray without its serve extra (missing {', '.join(missing)})", fix)
    return Feature("ray", True, v, "Ray Serve")


def _package(name: str, dist: str, module: str, used_for: str, fix: str) -> Feature:
    """An optional package found by its metadata and module (never imported: OpenVINO's import sends
    telemetry, transformers' takes seconds)."""
    v = package_version(dist)
    if v is None or not _module_present(module):
        return Feature(name, False, v, f"not installed (optional; {used_for})", fix)
    return Feature(name, True, v, used_for)


def check_openvino() -> Feature:
    return _package(
        "openvino",
        "openvino",
        "openvino",
        "export --target openvino, optimize's OpenVINO candidates, --engine openvino language models",
        "pip install 'ptopt[openvino]'",
    )


def check_nncf() -> Feature:
    return _package(
        "nncf",
        "nncf",
        "nncf",
        "int8 OpenVINO IR (export --target openvino --precision int8), weight-only --engine openvino",
        "pip install 'ptopt[openvino]'",
    )


def check_transformers() -> Feature:
    return _package(
        "transformers",
        "transformers",
        "transformers",
        "Hugging Face models (hf:DIR), quantize --mode weight-only, perplexity in validate",
        "pip install 'ptopt[llm]'",
    )


def check_tritonclient() -> Feature:
    return _package(
        "tritonclient",
        "tritonclient",
        "tritonclient.http",
        "the Open Inference Protocol (KServe v2) client that ptopt's servers answer",
        "pip install 'tritonclient[http]'",
    )


CHECKS = {
    "torch": check_torch,
    "cuda": check_cuda,
    "onnx": check_onnx,
    "onnxruntime": check_onnxruntime,
    "openvino": check_openvino,
    "nncf": check_nncf,
    "torchao": check_torchao,
    "transformers": check_transformers,
    "torch_tensorrt": check_tensorrt,
    "torchserve": check_torchserve,
    "java": check_java,
    "ray": check_ray,
    "tritonclient": check_tritonclient,
}


def require(name: str, for_what: str = "") -> Feature:
    """Return the feature if usable, else raise MissingDependencyError with the fix."""
    f = CHECKS[name]()
    if not f.available:
        need = f" for {for_what}" if for_what else ""
        raise MissingDependencyError(
            f"{f.name} is needed{need} but unavailable here: {f.detail}. To fix: {f.fix}"
        )
    return f
