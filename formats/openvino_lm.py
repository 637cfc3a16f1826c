"""OpenVINO language-model folders (``openvino_lm``): what ``ptopt quantize --mode weight-only --engine
openvino`` writes, the CPU path optimum-intel takes to OpenVINO LLMs, done with OpenVINO and NNCF
directly (optimum-intel needs transformers<5.6).

Made in three steps, as optimum-intel makes its IRs:

1. ``openvino.convert_model`` of a wrapper around the Hugging Face model that takes the KV cache as
   explicit tensors and returns the grown cache (a TorchScript trace): inputs ``input_ids``,
   ``attention_mask`` and 2 x layers past key/value tensors ``[1, kv_heads, past, head_dim]``;
2. the stateful transformation (``apply_make_stateful_transformation``): each past key/value input and
   its present output become one state the CPU plugin keeps between calls, so a decode step sends one
   token and the attention mask, nothing else;
3. ``nncf.compress_weights``, data-free: int8 asymmetric per output channel (``--bits 8``), int4
   symmetric per ``group_size`` input columns (``--bits 4``, every layer int4, ratio 1.0; NNCF keeps
   the embedding and the output matrix int8).

The folder holds ``openvino_model.xml`` + ``.bin`` (the stateful IR; its two inputs are ``input_ids``
and ``attention_mask``), ``config.json`` (the source's), ``openvino_lm.json`` (bits, group size, NNCF
mode, the inference precision it was measured at) and the source's tokenizer files. Plain OpenVINO
reads it with ``openvino.Core().read_model(folder / "openvino_model.xml")``; ``ptopt.load_model(folder)``
returns :class:`OpenVINOLM`, which ``ptopt validate`` and ``optimize`` measure like a transformers model
(perplexity, prefill and decode tokens/s at batch 1). It is compiled with the CPU plugin's default
inference precision (bf16 activations on a CPU with avx512_bf16 or AMX, else f32), as OpenVINO users run
weight-compressed models. Batch 1, one sequence at a time; greedy decoding (no beam reordering).
"""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path
from typing import Any

from ptopt.core.errors import ModelLoadError, UnsupportedModelError
from ptopt.formats.base import Format, loaded_model
from ptopt.formats.lm_folder import Output
from ptopt.formats.openvino import (
    imported,
    level_properties,
    openvino_message,
    quiet,
    read_ir,
    require_openvino,
)

IR_FILE = "openvino_model.xml"
RECORD_FILE = "openvino_lm.json"
#: NNCF's weight compression mode per bit width
MODES = {8: "int8_asym", 4: "int4_sym"}


def cache_shape(config: Any, past: int) -> tuple[int, int, int, int]:
    """One layer's key (or value) cache for ``past`` tokens at batch 1."""
    from ptopt.formats.lm_graph import cache_shape as shape

    return shape(config, past, 1)


def convert(model: Any) -> Any:
    """``model`` (a transformers causal LM, fp32) as a stateful OpenVINO model in memory (steps 1-2)."""
    ov = imported("openvino")
    import torch
    from openvino._offline_transformations import apply_make_stateful_transformation

    from ptopt.formats.lm_experts import every_expert
    from ptopt.formats.lm_graph import step_module

    layers = model.config.num_hidden_layers
    kv = [torch.zeros(cache_shape(model.config, 5)) for _ in range(2 * layers)]
    ids = torch.randint(
        0, min(1000, model.config.vocab_size), (1, 3), generator=torch.Generator().manual_seed(0)
    )
    example = (ids, torch.ones(1, 8, dtype=torch.int64), *kv)
    try:
        with (
            torch.inference_mode(False),
            torch.no_grad(),
            warnings.catch_warnings(),
            quiet(),
            every_expert(model),
        ):
            warnings.simplefilter("ignore")  # the trace's TracerWarnings and transformers' deprecations
            ov_model = ov.convert_model(step_module(model, position_ids=False), example_input=example)
    except Exception as e:  # noqa: BLE001 - the tracer and OpenVINO's frontend raise many kinds
        raise UnsupportedModelError(
            f"OpenVINO {ov.__version__} cannot convert this model with its KV cache as explicit tensors: "
            f"{type(e).__name__}: {openvino_message(e)}"
        ) from None
    pairs = list(zip(ov_model.get_parameters()[2:], ov_model.get_results()[1:], strict=True))
    apply_make_stateful_transformation(ov_model, pairs)
    return ov_model


def compress_weights(ov_model: Any, bits: int, group_size: int | None, ignored: Any = None) -> Any:
    """NNCF's data-free weight compression of ``ov_model`` (step 3); returns the compressed model.
    ``ignored``: an ``nncf.IgnoredScope`` of ops whose weights stay float."""
    nncf = imported("nncf")

    kwargs: dict[str, Any] = {"group_size": group_size or 128, "ratio": 1.0} if bits == 4 else {}
    if ignored is not None:
        kwargs["ignored_scope"] = ignored
    with quiet():
        return nncf.compress_weights(ov_model, mode=nncf.CompressWeightsMode(MODES[bits]), **kwargs)


def constant_bytes(ov_model: Any) -> int:
    """Bytes of the model's constants (its weights as stored)."""
    return sum(op.get_byte_size() for op in ov_model.get_ops() if op.get_type_name() == "Constant")


def as_saved(ov_model: Any) -> tuple[Any, Any]:
    """``ov_model`` saved and read back, as users get it (the model, and the temporary folder that holds
    its files, to keep while the model is used). Compiled straight from memory, an NNCF-compressed
    model computes wrong results at the CPU plugin's bf16 default (OpenVINO 2026.4: SmolLM2-135M int8,
    perplexity 20.83 against 15.05 for the same model saved and read back, fp32 15.06)."""
    from ptopt.core.atomic import ScratchDir

    ov = imported("openvino")

    tmp = ScratchDir(prefix="ptopt-openvino-lm-")
    ov.save_model(ov_model, Path(tmp.name) / IR_FILE, compress_to_fp16=False)
    return read_ir(Path(tmp.name) / IR_FILE), tmp


def compressed_matrices(ov_model: Any) -> dict[str, int]:
    """How many weight matrices the model stores per integer type (``u8``, ``i4`` ...): integer
    constants whose last dimension is not 1 (zero points are ``[out, 1]`` or ``[out, groups, 1]``)."""
    out: dict[str, int] = {}
    for op in ov_model.get_ops():
        if op.get_type_name() == "Constant":
            kind, shape = op.get_element_type().get_type_name(), list(op.get_output_shape(0))
            if kind in ("u8", "i8", "u4", "i4") and len(shape) >= 2 and shape[-1] > 1:
                out[kind] = out.get(kind, 0) + 1
    return out


class OpenVINOLM:
    """A stateful OpenVINO causal LM (module docstring) behind the interface ``ptopt.core.lm`` measures:
    ``model(input_ids=..., use_cache=..., past_key_values=...)`` returns ``.logits`` (a torch tensor) and,
    with ``use_cache``, ``past_key_values``: the number of tokens the plugin's states hold, to be passed
    back. A call without ``past_key_values`` starts a new sequence (the states reset to an empty cache)."""

    def __init__(
        self, ov_model: Any, config: Any, threads: int | None = None, precision: str | None = None
    ) -> None:
        ov = imported("openvino")

        # precision f32 / bf16; None: the plugin's default
        props: dict[str, Any] = {"PERFORMANCE_HINT": "LATENCY", **level_properties(precision)}
        if threads:
            props["INFERENCE_NUM_THREADS"] = int(threads)
        self.compiled = ov.Core().compile_model(ov_model, "CPU", props)
        self.request = self.compiled.create_infer_request()
        self.config, self.seen, self.ov_model = config, 0, ov_model
        #: the folder's ``openvino_lm.json`` when loaded from one
        self.record: dict[str, Any] | None = None
        #: the temporary folder holding the IR it was read from (``as_saved``), kept while it runs
        self.files: Any = None
        self.weight_bytes = constant_bytes(ov_model)
        #: the precision the plugin runs activations in (``bf16`` / ``f32``)
        self.precision = self.compiled.get_property("INFERENCE_PRECISION_HINT").to_string()

    def _new_sequence(self) -> None:
        import numpy as np

        ov = imported("openvino")

        self.request.reset_state()
        empty = np.zeros(cache_shape(self.config, 0), np.float32)
        for state in self.request.query_state():  # the default initial state has no heads dimension
            state.state = ov.Tensor(empty)
        self.seen = 0

    def forward(
        self, input_ids: Any, use_cache: bool = False, past_key_values: Any = None, **_: Any
    ) -> Output:
        import numpy as np
        import torch

        if past_key_values is None:
            self._new_sequence()
        elif past_key_values != self.seen:
            raise ValueError(
                f"this model holds {self.seen} tokens, not {past_key_values}: one sequence at a time"
            )
        ids = input_ids.numpy() if hasattr(input_ids, "numpy") else np.asarray(input_ids)
        if ids.shape[0] != 1:
            raise ValueError(f"an OpenVINO language model runs batch 1, got {ids.shape[0]}")
        self.seen += ids.shape[1]
        result = self.request.infer([ids, np.ones((1, self.seen), np.int64)])
        logits = torch.from_numpy(result[self.compiled.outputs[0]].copy())
        return Output(logits=logits, past_key_values=self.seen if use_cache else None)

    __call__ = forward

    def eval(self) -> OpenVINOLM:
        return self

    def generate(self, input_ids: Any, max_new_tokens: int = 32, attention_mask: Any = None) -> Any:
        """Greedy decoding (batch 1) with the cache the plugin keeps."""
        from ptopt.formats.lm_folder import greedy

        return greedy(self, input_ids, max_new_tokens, attention_mask)


def write_folder(saved: Path, folder: Path, record: dict[str, Any], config: Any, source_dir: Any) -> dict:
    """The folder of the module docstring, its IR copied from ``saved`` (the folder :func:`as_saved`
    wrote: the files that were measured); returns the writer's facts (``files``)."""
    from ptopt.formats.hf import copy_companions

    folder.mkdir(parents=True, exist_ok=True)
    for name in (IR_FILE, IR_FILE.replace(".xml", ".bin")):
        shutil.copyfile(Path(saved) / name, folder / name)
    config.to_json_file(str(folder / "config.json"))
    (folder / RECORD_FILE).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return {"files": copy_companions(source_dir, folder)}


def read_record(path: Path) -> dict[str, Any]:
    """The folder's ``openvino_lm.json`` (ModelLoadError when it is not ptopt's)."""
    try:
        record = json.loads((path / RECORD_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"{path / RECORD_FILE}: unreadable ({e})") from None
    fp32 = isinstance(record, dict) and record.get("bits") is None and record.get("precision") == "fp32"
    if not isinstance(record, dict) or (record.get("bits") not in MODES and not fp32):
        raise ModelLoadError(f"{path / RECORD_FILE}: not a ptopt OpenVINO language-model record")
    return record


def load_folder(path: Path, threads: int | None = None) -> OpenVINOLM:
    """The :class:`OpenVINOLM` of a folder ptopt wrote."""
    from ptopt.core.hf import config_of

    require_openvino()
    record = read_record(path)
    if threads is None:
        import torch

        threads = torch.get_num_threads()
    # an fp32 export runs as it was checked (f32); weight-only folders at the plugin's default
    precision = record.get("inference_precision") if record.get("bits") is None else None
    runner = OpenVINOLM(read_ir(path / IR_FILE), config_of(path), threads, precision)
    runner.record = record
    return runner


class OpenVINOLMFolder(Format):
    """A folder of ``ptopt quantize --mode weight-only --engine openvino`` (module docstring), or of
    ``ptopt export hf:DIR --target openvino`` (the same stateful IR, fp32 weights, run at f32)."""

    name = "openvino_lm"
    label = "OpenVINO language-model folder (stateful IR, NNCF weights)"
    folder = True
    servers = ("ray",)
    generates_text = True
    runtime = "openvino"
    devices = ("cpu",)
    packages = ("openvino", "nncf", "transformers")
    isa_libraries = ("onednn", "mlas")
    reexportable = False
    sniff_rank = 38  # before the Hugging Face folders: it has a config.json too
    #: ``export --target`` that writes it for a causal LM (``ptopt.export.lm``), and its record
    lm_target = "openvino"
    record_file = RECORD_FILE

    def sniff(self, path: Path) -> bool:
        return path.is_dir() and (path / RECORD_FILE).is_file() and (path / IR_FILE).is_file()

    def files(self, path: Path) -> list[Path]:
        return sorted(p for p in path.rglob("*") if p.is_file())

    def check_file(self, path: Path) -> None:
        require_openvino()
        read_record(path)
        read_ir(path / IR_FILE)

    def load(self, path: Path, art: Any, allow_pickle: bool) -> Any:
        module = load_folder(path)
        return loaded_model(path, self.name, module, path, art, info={"hf_dir": str(path)})

    def write_lm(self, module: Any, folder: Path, record: dict[str, Any]) -> None:
        """``ptopt export``'s IR of a causal LM: steps 1-2 of the module docstring, weights fp32, into ``folder``."""
        ov = imported("openvino")
        ov.save_model(convert(module), folder / IR_FILE, compress_to_fp16=False)
        method = "openvino.convert_model (TorchScript trace, KV cache as tensors) + stateful transformation"
        record |= {"bits": None, "inference_precision": "f32", "openvino": ov.__version__, "method": method}


FORMAT = OpenVINOLMFolder()
