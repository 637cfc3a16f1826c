"""What a serving replica runs: one artifact loaded through the format table, asked for named outputs.

:class:`ServedModel` loads any format ptopt writes the way ``ptopt validate`` does (``load_model``,
then the format row's runner: TorchScript, ExportedProgram, AOTInductor, ONNX Runtime, OpenVINO),
runs numpy batches and answers every output by name (the runtime's names for ONNX / OpenVINO,
``output__i`` otherwise). The language-model folders (a Hugging Face folder, ``quantize --mode
weight-only`` folders, their OpenVINO form: rows with ``generates_text``) generate text instead:
their tokenizer in, decoding with the KV cache (``core.lm.decode_tokens``: greedy, or sampled at the
request's ``temperature`` with its ``seed``: :func:`sampling_options`), text out.

``run_requests`` is the server-side batch: requests whose non-batch shapes agree run as one model
call (at most the spec's max batch rows), the outputs are split back per request, and a call the
model fails on is retried request by request so that only the request it fails on gets the error.
Nothing here knows the server: Ray Serve's replicas (``serve.ray_app``) and the tests call it alike.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from ptopt.core.errors import ModelLoadError, UsageError

#: the most tokens one generation request may ask for (``max_tokens``) unless the server says otherwise
DEFAULT_MAX_TOKENS = 256


class ServedModel:
    """One artifact, loaded once (module docstring). ``threads``: intra-op threads of its runtime."""

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        name: str = "model",
        allow_pickle: bool = False,
        threads: int | None = None,
        max_tokens: int = DEFAULT_MAX_TOKENS,
    ):
        import torch

        from ptopt.core.formats import get_format
        from ptopt.core.modelref import load_model

        if threads:
            torch.set_num_threads(int(threads))
        self.name, self.path, self.max_tokens = name, Path(path), int(max_tokens)
        loaded = load_model(self.path, allow_pickle=allow_pickle)
        self.format = loaded.format
        self.generates_text = bool(get_format(loaded.format).generates_text)
        self.precision = loaded.artifact.precision if loaded.artifact is not None else "fp32"
        if self.generates_text:
            self._init_text(loaded)
            return
        if not loaded.input_specs:
            from ptopt.serve.prepare import no_sidecar

            raise ModelLoadError(
                no_sidecar(self.path, path, "no input specs: nothing to check requests against")
            )
        self.style = loaded.input_style
        self.specs = [s.to_dict() for s in loaded.input_specs]
        self.max_batch = min(s.max_shape[0] for s in loaded.input_specs)
        self.runner = get_format(loaded.format).runner(name, loaded)
        self.runner.prepare(int(threads or torch.get_num_threads()))
        self.outputs = self._warm_up(loaded)

    # -- tensors ---------------------------------------------------------------------------------
    def _warm_up(self, loaded: Any) -> list[dict[str, Any]]:
        """A run at the spec's smallest shapes and one at its usual ones: the outputs' names, datatypes
        and shapes (-1 where the two runs differ: the batch, a token model's sequence), and the proof that
        the artifact runs here."""
        from ptopt.core.inputspec import make_inputs
        from ptopt.serve.oip import datatype_of, tensor_metadata

        runs = []
        for which in ("min", "opt"):
            x = make_inputs(loaded.input_specs, self.style, which=which)
            runs.append(
                self.run(
                    {s["name"]: t.numpy() for s, t in zip(self.specs, _as_list(x, self.specs), strict=True)}
                )
            )
        batched = self.specs[0]["min_shape"][0] != self.specs[0]["max_shape"][0]
        meta = []
        for (name, arr), (_, other) in zip(*runs, strict=True):
            shape = [-1 if a != b else a for a, b in zip(arr.shape, other.shape, strict=False)]
            if batched and shape:
                shape[0] = -1
            meta.append(tensor_metadata(name, datatype_of(arr.dtype), shape))
        return meta

    def run(self, arrays: dict[str, np.ndarray]) -> list[tuple[str, np.ndarray]]:
        """Every output of one batch ({input name: array}) as ``[(name, array)]``."""
        import torch

        tensors = [torch.from_numpy(np.ascontiguousarray(arrays[s["name"]])) for s in self.specs]
        if self.style == "keyword":
            x: Any = {s["name"]: t for s, t in zip(self.specs, tensors, strict=True)}
        else:
            x = tensors[0] if len(tensors) == 1 else tuple(tensors)
        return [(name, _to_numpy(t)) for name, t in self.runner.named_outputs(x)]

    def run_requests(self, requests: list[dict[str, np.ndarray]]) -> list[Any]:
        """For each request ({input name: batch array}, checked), its ``[(name, array)]`` outputs, or
        a string: why the model failed on it (module docstring)."""
        answers: list[Any] = [None] * len(requests)
        groups: dict[tuple, list[int]] = {}
        for i, req in enumerate(requests):
            groups.setdefault(tuple(req[s["name"]].shape[1:] for s in self.specs), []).append(i)
        for members in groups.values():
            chunk: list[int] = []
            rows = 0
            for i in members:
                n = int(requests[i][self.specs[0]["name"]].shape[0])
                if chunk and rows + n > self.max_batch:
                    self._run_chunk(requests, chunk, answers)
                    chunk, rows = [], 0
                chunk.append(i)
                rows += n
            if chunk:
                self._run_chunk(requests, chunk, answers)
        return answers

    def _run_chunk(self, requests: list[dict[str, np.ndarray]], chunk: list[int], answers: list[Any]) -> None:
        names = [s["name"] for s in self.specs]
        try:
            if len(chunk) == 1:
                outs = self.run(requests[chunk[0]])
            else:
                outs = self.run({n: np.concatenate([requests[i][n] for i in chunk]) for n in names})
        except Exception as e:  # noqa: BLE001 - the model rejected an input that fits its spec
            if len(chunk) > 1:  # find the request it fails on; the others still get their answer
                for i in chunk:
                    self._run_chunk(requests, [i], answers)
                return
            reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
            answers[chunk[0]] = f"the model failed on this input: {reason}"
            return
        pos = 0
        for i in chunk:
            n = int(requests[i][names[0]].shape[0])
            answers[i] = [(name, arr[pos : pos + n]) for name, arr in outs]
            pos += n

    # -- text ------------------------------------------------------------------------------------
    def _init_text(self, loaded: Any) -> None:
        from ptopt.core.hf import has_tokenizer, load_tokenizer
        from ptopt.core.lm import max_positions

        folder = Path(loaded.info.get("hf_dir") or loaded.path)
        if not has_tokenizer(folder):
            raise ModelLoadError(
                f"{folder}: a language model is served as text, and this folder has no tokenizer; "
                "save the tokenizer beside config.json"
            )
        self.module = loaded.module
        self.tokenizer = load_tokenizer(folder)
        self.positions = max_positions(self.module)
        self.eos = getattr(getattr(self.module, "config", None), "eos_token_id", None)
        self.specs, self.style, self.max_batch = [], "text", 1
        self.outputs = [{"name": "text_output", "datatype": "BYTES", "shape": [-1]}]

    def generate(
        self, prompt: str, max_tokens: int, temperature: float = 0.0, seed: int | None = None
    ) -> str:
        """The text generated after ``prompt`` (at most ``max_tokens`` tokens): greedy when
        ``temperature`` is 0, else sampled at that temperature, seeded by ``seed`` (``core.lm.decode_tokens``).
        UsageError when the request asks for more tokens than the server allows or than the model's
        positions hold, or for a bad temperature or seed (:func:`sampling_options`)."""
        import torch

        from ptopt.core.lm import decode_tokens

        sampling = sampling_options({"temperature": temperature, "seed": seed})
        if not 1 <= max_tokens <= self.max_tokens:
            raise UsageError(f"max_tokens {max_tokens}: this server generates 1 to {self.max_tokens} tokens")
        ids = torch.tensor(self.tokenizer(prompt)["input_ids"], dtype=torch.int64)
        if ids.numel() == 0:
            raise UsageError("the prompt is empty after tokenization")
        if self.positions and ids.numel() + max_tokens > self.positions:
            raise UsageError(
                f"the prompt is {ids.numel()} tokens; with max_tokens {max_tokens} that is past the "
                f"model's {self.positions} positions"
            )
        new = decode_tokens(self.module, ids, max_tokens, self.eos, **sampling)
        return self.tokenizer.decode(new, skip_special_tokens=True)

    # -- what clients see ----------------------------------------------------------------------
    def metadata(self) -> dict[str, Any]:
        """The model metadata of the Open Inference Protocol (``GET /v2/models/NAME``)."""
        from ptopt.serve.oip import spec_datatype, spec_shape, tensor_metadata

        if self.generates_text:
            inputs = [tensor_metadata("text_input", "BYTES", [-1])]
        else:
            inputs = [tensor_metadata(s["name"], spec_datatype(s), spec_shape(s)) for s in self.specs]
        return {
            "name": self.name,
            "versions": ["1"],
            "platform": f"ptopt_{self.format}",
            "inputs": inputs,
            "outputs": list(self.outputs),
            "parameters": {"precision": self.precision, "max_batch": self.max_batch},
        }


#: sampling parameters a generation request may carry only at their neutral value (this server samples
#: from the whole distribution: no nucleus or top-k filtering), each with that value
NEUTRAL_SAMPLING = {"top_p": 1.0, "top_k": 0}


def sampling_options(params: Any) -> dict[str, Any]:
    """``{"temperature": T, "seed": S}`` for :meth:`ServedModel.generate` from a generation request's
    parameters: ``temperature`` a finite number >= 0 (0 or absent: greedy decoding), ``seed`` an integer
    in [0, 2**64) or absent (sampling then differs between requests). ``top_p`` / ``top_k`` are refused
    unless neutral (``NEUTRAL_SAMPLING``): ignoring them would answer another distribution than the one
    asked for. Other parameters are not sampling's. UsageError naming the field."""
    import math

    params = params or {}
    temperature = params.get("temperature")
    temperature = 0.0 if temperature is None else temperature
    if (
        not isinstance(temperature, (int, float))
        or isinstance(temperature, bool)
        or not math.isfinite(temperature)
        or temperature < 0
    ):
        raise UsageError(
            f"temperature {temperature!r}: give a number >= 0 (0 or leaving it out: greedy decoding)"
        )
    seed = params.get("seed")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**64):
        raise UsageError(f"seed {seed!r}: give an integer from 0 to 2**64 - 1")
    for name, neutral in NEUTRAL_SAMPLING.items():
        value = params.get(name)
        if value is not None and (isinstance(value, bool) or value != neutral):
            raise UsageError(
                f"{name} {value!r}: this server samples from the whole distribution (temperature and "
                f"seed only); leave {name} out (or {neutral!r})"
            )
    return {"temperature": float(temperature), "seed": seed}


def _as_list(x: Any, specs: list[dict[str, Any]]) -> list[Any]:
    if isinstance(x, dict):
        return [x[s["name"]] for s in specs]
    return list(x) if isinstance(x, (tuple, list)) else [x]


def _to_numpy(t: Any) -> np.ndarray:
    """A CPU numpy array: quantized tensors dequantized, half precision as float32."""
    t = t.detach()
    if t.is_quantized:
        t = t.dequantize()
    if str(t.dtype) in ("torch.bfloat16", "torch.float16"):
        t = t.float()
    return t.cpu().numpy()
