"""Text to a tensor model's token inputs, on the server: an encoder or classifier exported from a Hugging
Face folder (a sentence encoder, a BERT classifier, a cross-encoder) takes ``text_input`` (``BYTES``)
as well as its tensors, tokenized by the folder's own tokenizer.

``text_input`` of shape ``[N]`` or ``[N, 1]`` is N texts; ``[N, 2]`` is N pairs (a cross-encoder's
query and passage: ``token_type_ids`` set where the model takes them). Each request is padded to a
bucket (the next power of two of its longest text, within the artifact's sequence range), so that
requests of similar lengths batch together on the server; the ``attention_mask`` marks the padding,
which is why a model without one takes no text (padding would change its answer), nor a tokenizer
without a padding token or one that pads on the left. A text longer than the artifact's longest sequence
(128 tokens unless it was exported longer) is cut there, and the answer's parameters count it
(``truncated``); ``"truncate": false`` refuses it instead.

Where the tokenizer comes from: ``serve.ray_package`` finds the folder an artifact was made from
(``core.sentences.sentence_folder``: the sidecars' parents) and copies its tokenizer into the package.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from ptopt.core.errors import UsageError
from ptopt.core.sentences import TOKEN_INPUTS

TEXT_INPUT = "text_input"


def why_no_text(specs: list[dict[str, Any]]) -> str | None:
    """None when a model of these input specs takes text (module docstring), else why not."""
    names = [s["name"] for s in specs]
    other = [n for n in names if n not in TOKEN_INPUTS]
    if other:
        return f"it takes {', '.join(other)}, which no tokenizer makes"
    if "input_ids" not in names or "attention_mask" not in names:
        return "it takes no attention_mask, so padding texts to one length would change its answer"
    ids = next(s for s in specs if s["name"] == "input_ids")
    if len(ids["max_shape"]) != 2:
        return f"its input_ids has {len(ids['max_shape'])} dimensions, not [batch, tokens]"
    return None


def why_no_padding(tokenizer: Any) -> str | None:
    """None when ``tokenizer`` pads as the server pads texts (a padding token, on the right: the real
    tokens keep the positions they have alone), else why not."""
    if getattr(tokenizer, "pad_token", None) is None:
        return "its tokenizer has no padding token, and a batch of texts is padded to one length"
    if getattr(tokenizer, "padding_side", "right") != "right":
        return "its tokenizer pads on the left, which moves each text's tokens to other positions"
    return None


class TextInputs:
    """A tokenizer folder and the token inputs it fills (module docstring)."""

    def __init__(self, folder: str | os.PathLike, specs: list[dict[str, Any]]):
        from ptopt.core.hf import load_tokenizer

        reason = why_no_text(specs)
        if reason is not None:
            raise UsageError(f"this model takes no text: {reason}")
        self.tokenizer = load_tokenizer(folder)
        reason = why_no_padding(self.tokenizer)
        if reason is not None:
            raise UsageError(f"this model takes no text: {reason}")
        self.specs = specs
        self.names = [s["name"] for s in specs]
        ids = next(s for s in specs if s["name"] == "input_ids")
        self.min_tokens, self.max_tokens = int(ids["min_shape"][1]), int(ids["max_shape"][1])
        self.max_rows = int(ids["max_shape"][0])

    def arrays(self, texts: np.ndarray, truncate: bool = True) -> tuple[dict[str, np.ndarray], int]:
        """``text_input``'s texts (or pairs) as the model's inputs, and how many were cut (module
        docstring). UsageError (the request's fault) for a shape or a text it cannot take."""
        first, second = self._split(texts)
        if len(first) > self.max_rows:  # before tokenizing them all
            raise UsageError(
                f"{TEXT_INPUT} holds {len(first)} texts; this model takes at most {self.max_rows} a request"
            )
        from ptopt.core.quiet import silenced

        with silenced(["transformers"]):
            enc = self.tokenizer(first, second, truncation=False)
            lengths = [len(ids) for ids in enc["input_ids"]]
            cut = sum(n > self.max_tokens for n in lengths)
            if cut and not truncate:
                i = next(i for i, n in enumerate(lengths) if n > self.max_tokens)
                raise UsageError(
                    f"text {i} is {lengths[i]} tokens; this model takes at most {self.max_tokens} "
                    '(leave out "truncate": false to cut it there)'
                )
            if cut:
                enc = self.tokenizer(first, second, truncation=True, max_length=self.max_tokens)
            width = bucket(max(min(n, self.max_tokens) for n in lengths), self.min_tokens, self.max_tokens)
            padded = self.tokenizer.pad(enc, padding="max_length", max_length=width, return_tensors="np")
        types = padded.get("token_type_ids")
        if second is not None and types is not None and types.any() and "token_type_ids" not in self.names:
            raise UsageError(
                "pairs: this model takes no token_type_ids, which its tokenizer sets to tell a pair's two "
                "texts apart (it would read each pair as one text); send single texts, or export the model "
                "from its folder with --data pairs.tsv (query<TAB>passage lines)"
            )
        out = {}
        for spec in self.specs:
            name = spec["name"]
            arr = padded.get(name)
            if arr is None:  # token_type_ids the tokenizer does not make: one segment
                arr = np.zeros_like(padded["input_ids"])
            out[name] = np.ascontiguousarray(arr, dtype=spec["dtype"])
        return out, cut

    @staticmethod
    def _split(texts: np.ndarray) -> tuple[list[str], list[str] | None]:
        if texts.ndim == 2 and texts.shape[1] in (1, 2):
            columns = [texts[:, j] for j in range(texts.shape[1])]
        elif texts.ndim == 1:
            columns = [texts]
        else:
            raise UsageError(
                f"{TEXT_INPUT} has shape {list(texts.shape)}; send [N] texts, [N, 1], or [N, 2] pairs"
            )
        if texts.shape[0] == 0:
            raise UsageError(f"{TEXT_INPUT} holds no text")
        decoded = [[_text(v) for v in col.tolist()] for col in columns]
        return decoded[0], (decoded[1] if len(decoded) == 2 else None)


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def bucket(longest: int, low: int, high: int) -> int:
    """The padded length of a request whose longest text is ``longest`` tokens: the next power of two,
    within [low, high]."""
    width = 1 << max(0, int(longest) - 1).bit_length()
    return max(low, min(high, width))


# -- the protocol's side (the Ray Serve ingress) ------------------------------------------------


def request_arrays(text: TextInputs, request: Any) -> tuple[dict[str, np.ndarray], dict[str, Any] | None]:
    """An infer request (``serve.oip.InferRequest``) holding ``text_input`` as the model's checked
    inputs, and the answer's parameters (``truncated`` when a text was cut). ProtocolError 400 naming
    what is wrong."""
    from ptopt.serve import oip

    if set(request.inputs) != {TEXT_INPUT} or request.datatypes[TEXT_INPUT] != "BYTES":
        got = ", ".join(f"{n} ({request.datatypes[n]})" for n in request.inputs)
        raise oip.ProtocolError(
            400, f"send {TEXT_INPUT} (BYTES) alone, or the model's tensors without it; got {got}"
        )
    truncate = (request.parameters or {}).get("truncate", True)
    if not isinstance(truncate, bool):
        import json

        raise oip.ProtocolError(400, f'"truncate": {json.dumps(truncate)}: give true or false')
    try:
        arrays, cut = text.arrays(request.inputs[TEXT_INPUT], truncate)
    except UsageError as e:
        raise oip.ProtocolError(400, str(e)) from None
    typed = {s["name"]: oip.spec_datatype(s) for s in text.specs}
    checked = oip.checked_inputs(oip.InferRequest(arrays, typed), text.specs)
    return checked, ({"truncated": cut} if cut else None)


def payload_texts(payload: Any) -> np.ndarray | None:
    """The texts of a plain JSON request (``{"inputs": "a text"}``, ``["a", "b"]`` or pairs
    ``[["query", "passage"], ...]``) as ``text_input`` would carry them; None when it holds no text."""
    inputs = payload.get("inputs") if isinstance(payload, dict) else None
    if isinstance(inputs, str):
        return np.array([inputs], dtype=object)
    if isinstance(inputs, list) and inputs and all(isinstance(v, str) for v in inputs):
        return np.array(inputs, dtype=object)
    if isinstance(inputs, list) and inputs and all(_is_pair(v) for v in inputs):
        return np.array(inputs, dtype=object).reshape(len(inputs), 2)
    return None


def _is_pair(value: Any) -> bool:
    return isinstance(value, list) and len(value) == 2 and all(isinstance(v, str) for v in value)


def with_text_input(meta: dict[str, Any], text: TextInputs) -> dict[str, Any]:
    """The model metadata of a model that takes text: ``text_input`` listed before its tensors (either
    is a whole request), and what it takes in the parameters."""
    from ptopt.serve.oip import tensor_metadata

    meta = dict(meta)
    meta["inputs"] = [tensor_metadata(TEXT_INPUT, "BYTES", [-1]), *meta["inputs"]]
    meta["parameters"] = {
        **meta.get("parameters", {}),
        TEXT_INPUT: (
            f"[N] texts or [N, 2] pairs, tokenized here (at most {text.max_tokens} tokens, longer ones cut "
            'unless "truncate": false); or the tensors instead'
        ),
    }
    return meta
