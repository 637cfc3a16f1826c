"""The decode step of a weight-only language model as a ``torch.export`` ExportedProgram:
``decode_step.pt2`` inside the weight-only folder (``ptopt quantize --mode weight-only
--decode-step N``), for runtimes that take an exported graph (ExecuTorch, ``torch.compile``, serving
code that owns the generation loop).

What it is: one token in, its logits out, with a static KV cache of ``N`` positions held as
buffers inside the program (transformers' ``TorchExportableModuleWithStaticCache``, the recipe its
ExecuTorch integration uses). Inputs ``input_ids`` (1x1 int64) and ``cache_position`` (1 int64: the
token's position, 0 for the first); output the logits (1x1xvocab). A prompt is fed one token at a
time; the cache is the program's own state, so one loaded program serves one sequence (load it again
for the next). Load it with ``import torchao`` first (its int8/int4 weight tensors), then
``torch.export.load(path).module()``. Its weights are pickled tensor subclasses, so ptopt's own
loaders read it only with ``--allow-pickle``.

Checked before anything is written: the program, saved and read back from memory, replays a prompt
token by token and its logits are compared with the quantized model's own forward pass on the whole
prompt (worst cosine over positions >= ``MIN_COSINE``). AOTInductor cannot compile this program with
torch 2.13 + transformers 5.x (the cache's position counter is a lifted tensor the compiler refuses
to mutate), so the folder gets the ExportedProgram only.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator
from typing import Any

from ptopt.core.errors import ParityError, UnsupportedModelError, UsageError

DECODE_FILE = "decode_step.pt2"
#: prompt tokens replayed through the saved program to check it
CHECK_TOKENS = 16
MIN_COSINE = 0.999


def capture(module: Any, cache_len: int) -> tuple[bytes, dict[str, Any]]:
    """The saved program of ``module``'s decode step with a ``cache_len``-token static cache, and its
    record (inputs, cache length, the check's figures). UsageError for a cache longer than the model's
    positions; UnsupportedModelError when torch.export cannot capture the model."""
    import torch

    from ptopt.core.lm import max_positions

    longest = max_positions(module)
    if longest is not None and cache_len > longest:
        raise UsageError(f"--decode-step {cache_len}: the model's positions end at {longest}")
    program = _export(module, cache_len)
    buffer = io.BytesIO()
    torch.export.save(program, buffer)
    data = buffer.getvalue()
    check = _check(module, data, min(CHECK_TOKENS, cache_len))
    record = {
        "file": DECODE_FILE,
        "max_cache_len": cache_len,
        "inputs": {"input_ids": "1x1 int64", "cache_position": "1 int64"},
        "check": check,
    }
    return data, record


def _export(module: Any, cache_len: int) -> Any:
    from ptopt.core.hf import import_transformers
    from ptopt.core.quiet import quiet_imports, silenced

    tf = import_transformers()
    saved = module.generation_config
    module.generation_config = tf.GenerationConfig(
        use_cache=True,
        cache_implementation="static",
        cache_config={"batch_size": 1, "max_cache_len": cache_len},
    )
    try:
        with quiet_imports(), silenced(["transformers", "torch"]):
            from transformers.integrations.executorch import convert_and_export_with_cache

            with _shared_int8_once(module):
                return convert_and_export_with_cache(module, strict=False)
    except Exception as e:  # noqa: BLE001 - torch.export raises many kinds; the user gets one line
        import torch

        raise UnsupportedModelError(
            f"torch.export cannot capture this model's decode step (torch {torch.__version__}, "
            f"transformers {tf.__version__}): {type(e).__name__}: {str(e).splitlines()[0][:200]}; "
            "leave out --decode-step to write the folder alone"
        ) from None
    finally:
        module.generation_config = saved


@contextlib.contextmanager
def _shared_int8_once(module: Any) -> Iterator[None]:
    """While exporting, an embedding that reads the int8 matrix of a tied output layer (``core.lm.
    use_int8_embedding``) reads it through that layer, its own ``weight`` unregistered: torch.export
    lists a shared weight under both names and ``torch.export.save`` pickles each tensor-subclass
    weight on its own (a plain tensor's storage is written once), so the program would hold the matrix
    twice (57 MB instead of 28.5 MB for SmolLM2-135M, and twice in memory once loaded)."""
    import types

    import torch

    from ptopt.core.lm import int8_rows

    owners = {id(m.weight): m for m in module.modules() if isinstance(m, torch.nn.Linear)}
    moved = []
    for m in module.modules():
        owner = owners.get(id(getattr(m, "weight", None)))
        routed = type(m) is torch.nn.Embedding and "forward" in m.__dict__  # use_int8_embedding's
        if routed and owner is not None and type(owner.weight).__name__ == "Int8Tensor":
            moved.append((m, m._parameters.pop("weight"), m.__dict__["forward"]))
            m.forward = types.MethodType(lambda self, ids, owner=owner: int8_rows(owner.weight, ids), m)
    try:
        yield
    finally:
        for m, weight, forward in moved:
            m.weight, m.forward = weight, forward


def _check(module: Any, data: bytes, n: int) -> dict[str, Any]:
    """Replay ``n`` prompt tokens through the program read back from ``data``; ParityError when its
    logits drift from ``module``'s."""
    import torch

    vocab = int(module.config.vocab_size)
    ids = torch.randint(0, vocab, (1, n), generator=torch.Generator().manual_seed(0))
    step = torch.export.load(io.BytesIO(data)).module()
    with torch.inference_mode():
        ref = module(input_ids=ids, use_cache=False).logits[0].float()
        got = torch.stack(
            [step(input_ids=ids[:, i : i + 1], cache_position=torch.tensor([i]))[0, -1] for i in range(n)]
        ).float()
    cosine = float(torch.nn.functional.cosine_similarity(got, ref, dim=-1).min())
    diff = float((got - ref).abs().max())
    if not cosine >= MIN_COSINE:
        raise ParityError(
            f"the exported decode step drifts from the model: worst cosine {cosine:.6f} < {MIN_COSINE} over "
            f"{n} replayed tokens (max abs diff {diff:.3g}); leave out --decode-step"
        )
    return {"tokens": n, "worst_cosine": cosine, "max_abs_diff": diff}
