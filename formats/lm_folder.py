"""What the language-model export folders share (``onnx_lm``, ``exported_program_lm``, ``aoti_lm``: what
``ptopt export hf:DIR --target onnx|exported_program|aoti`` writes for a causal LM).

A folder holds the decoder graph with its KV cache as explicit inputs and outputs
(``ptopt.formats.lm_graph``: optimum's names), the source's ``config.json`` and tokenizer files, and
``ptopt_lm.json`` (the target, the graph's inputs and outputs, the cache layout, the batch and
position ranges, the weight bytes, the library versions and the check made at export). Loaded
(``ptopt.load_model(folder)``), it is a :class:`CachedLM`: called like a transformers causal LM
(``model(input_ids=..., attention_mask=..., use_cache=True, past_key_values=...)`` returns ``.logits``
and ``past_key_values``), with a greedy ``generate``; this is what ``ptopt validate`` scores
(perplexity) and times (prefill and decode tokens/s) beside transformers itself.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any, ClassVar

from ptopt.core.errors import ModelLoadError
from ptopt.formats.base import Format, loaded_model

RECORD_FILE = "ptopt_lm.json"


class Output(dict):
    """What a transformers model returns, as far as ``ptopt.core.lm`` reads it: ``out.logits``, ``out[key]``."""

    __getattr__ = dict.__getitem__


class Past:
    """The cache a :class:`CachedLM` hands back: the present tensors (in the runtime's own arrays) and
    the attention mask they were computed under."""

    __slots__ = ("kv", "mask")

    def __init__(self, kv: list[Any], mask: Any) -> None:
        self.kv, self.mask = kv, mask

    @property
    def length(self) -> int:
        return int(self.mask.shape[1])


class CachedLM:
    """One exported decoder step behind the interface of a transformers causal LM (module docstring).
    Subclasses run the step: :meth:`_run` takes and returns the runtime's arrays, in the graph's order."""

    #: how reports name what runs it
    runtime: ClassVar[str] = ""

    def __init__(self, config: Any, record: dict[str, Any]) -> None:
        from ptopt.formats.lm_graph import layout

        self.config, self.record = config, record
        self.layout = layout(config)
        #: bytes of the weights the graph holds (``ptopt.core.lm.weight_bytes`` reads it)
        self.weight_bytes = int(record.get("weight_bytes") or 0)
        self.max_positions = int(record.get("max_positions") or 0) or None

    # -- what a runtime provides -------------------------------------------------------------------------
    def _run(self, feeds: list[Any]) -> list[Any]:  # pragma: no cover - abstract
        raise NotImplementedError

    def _native(self, t: Any) -> Any:
        """A torch tensor as the runtime takes it."""
        return t

    def _torch(self, a: Any) -> Any:
        """A runtime output as a torch tensor."""
        return a

    def _empty(self, batch: int) -> list[Any]:
        import torch

        from ptopt.formats.lm_graph import cache_shape

        empty = self._native(torch.zeros(cache_shape(self.config, 0, batch)))
        return [empty] * (2 * self.layout["layers"])

    # -- the transformers interface ----------------------------------------------------------------------
    def forward(
        self,
        input_ids: Any,
        attention_mask: Any = None,
        use_cache: bool = False,
        past_key_values: Any = None,
        position_ids: Any = None,
        **_: Any,
    ) -> Output:
        import torch

        ids = torch.as_tensor(input_ids, dtype=torch.int64)
        batch, seq = ids.shape
        past = (
            past_key_values
            if past_key_values is not None
            else Past(self._empty(batch), ids.new_zeros(batch, 0))
        )
        mask = _full_mask(attention_mask, past, batch, seq)
        if self.max_positions is not None and mask.shape[1] > self.max_positions:
            raise ValueError(f"{mask.shape[1]} tokens: the model covers {self.max_positions} positions")
        if position_ids is None:
            position_ids = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)[:, -seq:]
        feeds = [self._native(ids), self._native(mask), self._native(torch.as_tensor(position_ids)), *past.kv]
        outs = self._run(feeds)
        logits = self._torch(outs[0])
        return Output(logits=logits, past_key_values=Past(list(outs[1:]), mask) if use_cache else None)

    __call__ = forward

    def eval(self) -> CachedLM:
        return self

    def generate(self, input_ids: Any, max_new_tokens: int = 32, attention_mask: Any = None) -> Any:
        """Greedy decoding with the cache (:func:`greedy`)."""
        return greedy(self, input_ids, max_new_tokens, attention_mask)


def greedy(model: Any, input_ids: Any, max_new_tokens: int, attention_mask: Any = None) -> Any:
    """Greedy decoding with ``model``'s cache: the prompt's ids followed by ``max_new_tokens`` new ones
    (no stop token: always that many)."""
    import torch

    ids = torch.as_tensor(input_ids, dtype=torch.int64)
    with torch.inference_mode():
        out = model(input_ids=ids, attention_mask=attention_mask, use_cache=True)
        tokens = [out.logits[:, -1].argmax(-1, keepdim=True)]
        for _ in range(max_new_tokens - 1):
            out = model(input_ids=tokens[-1], use_cache=True, past_key_values=out.past_key_values)
            tokens.append(out.logits[:, -1].argmax(-1, keepdim=True))
    return torch.cat([ids, *tokens], dim=1)


def _full_mask(mask: Any, past: Past, batch: int, seq: int) -> Any:
    """The attention mask over past + new tokens: given whole (transformers' way), given for the new
    tokens only, or ones for them."""
    import torch

    if mask is None:
        new = torch.ones(batch, seq, dtype=torch.int64)
    else:
        mask = torch.as_tensor(mask, dtype=torch.int64)
        if mask.shape[1] == past.length + seq:
            return mask
        if mask.shape[1] != seq:
            raise ValueError(
                f"attention_mask of {mask.shape[1]} positions for {past.length} past + {seq} new tokens"
            )
        new = mask
    return torch.cat([past.mask.to(torch.int64), new], dim=1)


# -- the folder -------------------------------------------------------------------------------------------


def read_record(path: Path) -> dict[str, Any]:
    """The folder's ``ptopt_lm.json`` (ModelLoadError when it is not ptopt's)."""
    try:
        record = json.loads((path / RECORD_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"{path / RECORD_FILE}: unreadable ({e})") from None
    if not isinstance(record, dict) or not isinstance(record.get("target"), str):
        raise ModelLoadError(f"{path / RECORD_FILE}: not a ptopt language-model export record")
    return record


def write_record(folder: Path, record: dict[str, Any], name: str = RECORD_FILE) -> None:
    (folder / name).write_text(json.dumps(record, indent=2, default=str) + "\n", encoding="utf-8")


def write_companions(
    folder: Path, module: Any, record: dict[str, Any], source_dir: Any, name: str
) -> list[str]:
    """``config.json``, the source's tokenizer and generation files, and the record (``name``); returns
    every file of the folder relative to its parent (the writer's ``files``)."""
    from ptopt.formats.hf import copy_companions

    module.config.to_json_file(str(folder / "config.json"))
    write_record(folder, record, name)
    return copy_companions(source_dir, folder)


class LMFolder(Format):
    """A language-model export folder (module docstring); subclasses name the graph file and open it."""

    folder = True
    reexportable = False
    devices = ("cpu",)
    #: served as text (greedy generation through the exported step) by Ray Serve, as the OpenVINO folder
    servers = ("ray",)
    generates_text = True
    sniff_rank = 37  # before the Hugging Face folders: it has a config.json too
    #: the graph's file inside the folder
    file: ClassVar[str] = ""
    #: the ``export --target`` that writes it for a causal LM
    lm_target: ClassVar[str] = ""
    #: the attention implementation the graph is captured with (None: the model's own)
    attention: ClassVar[str | None] = None
    #: whether a mixture of experts is captured computing every expert (``formats.lm_experts``: every
    #: target; transformers' grouped_mm is a Python custom op a graph file cannot carry)
    every_expert: ClassVar[bool] = True
    #: the record's file in the folder
    record_file: ClassVar[str] = RECORD_FILE

    def sniff(self, path: Path) -> bool:
        if not (path.is_dir() and (path / RECORD_FILE).is_file() and (path / self.file).is_file()):
            return False
        try:
            return read_record(path)["target"] == self.lm_target
        except ModelLoadError:
            return False

    def files(self, path: Path) -> list[Path]:
        return sorted(p for p in path.rglob("*") if p.is_file())

    def check_file(self, path: Path) -> None:
        read_record(path)
        if not (path / self.file).is_file():
            raise ModelLoadError(f"{path}: no {self.file}")

    def load(self, path: Path, art: Any, allow_pickle: bool) -> Any:
        from ptopt.core.hf import config_of

        self.check_file(path)
        module = self.open(path, config_of(path), read_record(path), allow_pickle)
        return loaded_model(path, self.name, module, path, art, info={"hf_dir": str(path)})

    def write_lm(self, module: Any, folder: Path, record: dict[str, Any]) -> None:
        """Capture ``module``'s step (``lm_graph.capture``: the record's batch range and positions, the
        attention ``eager`` where the format asks for it) and write it into ``folder``."""
        from ptopt.formats.lm_experts import every_expert
        from ptopt.formats.lm_graph import attention, capture

        experts = every_expert(module) if self.every_expert else contextlib.nullcontext()
        with attention(module, self.attention), experts:
            program = capture(module, tuple(record["batch"]), record["max_positions"])
        self.write_graph(program, folder, record, module.config)

    def open(self, path: Path, config: Any, record: dict[str, Any], allow_pickle: bool) -> CachedLM:
        """The folder's model, ready to run (:class:`CachedLM`)."""
        raise NotImplementedError

    def write_graph(self, program: Any, folder: Path, record: dict[str, Any], config: Any) -> None:
        """Write the captured step (an ExportedProgram of the model of ``config``) as this format's graph
        file(s) into ``folder``; may add facts to ``record``."""
        raise NotImplementedError
