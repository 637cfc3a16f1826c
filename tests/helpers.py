"""Tiny models for fast tests, importable as ``tests.helpers:NAME`` factories."""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import nn


class TinyCNN(nn.Module):
    """Conv-BN-ReLU ×2, residual add, flatten, Linear: the shapes users write, on 1×8×8 digits."""

    def __init__(self, width: int = 8, num_classes: int = 10):
        super().__init__()
        self.conv1 = nn.Conv2d(1, width, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.fc = nn.Linear(width * 8 * 8, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.bn1(self.conv1(x)))
        x = F.relu(x + self.bn2(self.conv2(x)))
        return self.fc(torch.flatten(x, 1))

    def example_inputs(self, batch: int = 2) -> torch.Tensor:
        return torch.randn(batch, 1, 8, 8, generator=torch.Generator().manual_seed(0))


def tiny_cnn() -> TinyCNN:
    torch.manual_seed(0)
    return TinyCNN()


def tiny_cnn_features() -> TinyCNN:
    """``tiny_cnn`` with its classifier removed (``fc = nn.Identity()``): 512 features, not class scores."""
    model = tiny_cnn()
    model.fc = nn.Identity()
    return model


class TwoInput(nn.Module):
    """Keyword inputs like a text model: ``input_ids`` + ``attention_mask``."""

    def __init__(
        self, vocab: int = 1 + 64 * 17, dim: int = 16, num_classes: int = 10
    ):  # fits builtin:digits-tokens
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.fc = nn.Linear(dim, num_classes)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        m = attention_mask.unsqueeze(-1).float()
        return self.fc((self.embed(input_ids) * m).sum(1) / m.sum(1).clamp(min=1))


def two_input() -> TwoInput:
    torch.manual_seed(0)
    return TwoInput()


def broken_factory() -> nn.Module:
    raise RuntimeError("this factory is broken on purpose")


def digits8_batches():
    """A DATA function: batches of (x, y) of 8×8 digits."""
    from ptopt.core.data import load_data

    ds = load_data("builtin:digits:test")
    return [(b.x, b.y) for b in ds.batches(50)]


def digits8_xy():
    """A DATA function returning ``(x, y)``: the 8×8 test digits (N×1×8×8) and their labels."""
    from ptopt.core.data import load_data

    ds = load_data("builtin:digits:test")
    return ds.x, ds.y


def digits8_x():
    """A DATA function returning one tensor: the inputs, N×1×8×8 (not N batches of 1×8×8)."""
    return digits8_xy()[0]


def tokens_xy():
    """A DATA function returning ``(keyword inputs, labels)`` for ``two_input``."""
    from ptopt.core.data import load_data

    ds = load_data("builtin:digits-tokens:test")
    return ds.x, ds.y


def tokens_kw():
    """A DATA function returning the keyword inputs of ``two_input`` as a dict (no ``x`` key)."""
    return tokens_xy()[0]


# -- refusals ----------------------------------------------------------------------------------------


def _files_under(where) -> set:
    from pathlib import Path

    return {p for p in Path(where).rglob("*") if p.is_file()} if where is not None else set()


#: a file name of each export target (the format table's first suffix; another is refused)
SUFFIX = {
    "torchscript": ".pt",
    "exported_program": ".pt2",
    "onnx": ".onnx",
    "aoti": ".pt2",
    "openvino": ".xml",
}


def assert_refused(call, *args, match=(), where=None, error=None, **kwargs) -> str:
    """Bad input is refused the way ptopt promises: exit 2 (or a ``PtoptError`` with exit_code 2 from
    the Python API), one line on stderr starting ``error:``, no traceback, and no new file under
    ``where``. Returns the message.

    ``call`` is the ``cli`` fixture (``assert_refused(cli, "quantize", ...)``), the ``run_ptopt``
    fixture (a subprocess), or any Python callable (``assert_refused(ptopt.quantize, model, ...)``).
    ``match``: substrings (a str or a tuple of them) the message must contain. ``error``: the
    ``PtoptError`` subclass the Python API must raise.
    """
    import subprocess

    from ptopt.core.errors import PtoptError
    from ptopt.core.progress import is_heartbeat

    needles = (match,) if isinstance(match, str) else tuple(match)
    before = _files_under(where)
    if getattr(call, "is_cli", False) or getattr(call, "is_subprocess", False):
        out = call(*args, **kwargs)
        if isinstance(out, subprocess.CompletedProcess):
            code, err = out.returncode, out.stderr
        else:
            code, _, err = out
        assert code == 2, f"exit {code}, not 2: {err}"
        assert "Traceback" not in err, err
        # a heartbeat (ptopt.core.progress: "  ptopt validate: still working (9 s)") is no message: a
        # slow machine writes one before anything
        # nor are the steps it reported before the refusal ("calibrating (32 batches)"): the message is the
        # one "error:" line, and it is the last thing said
        lines = [ln for ln in err.splitlines() if ln.strip() and not is_heartbeat(ln)]
        errors = [ln for ln in lines if ln.startswith("error:")]
        assert len(errors) == 1 and lines[-1] == errors[0], f"not one 'error:' line, last: {err!r}"
        message = errors[0]
    else:
        try:
            call(*args, **kwargs)
        except PtoptError as e:
            assert e.exit_code == 2, f"{type(e).__name__} has exit code {e.exit_code}, not 2"
            if error is not None:
                assert isinstance(e, error), f"{type(e).__name__} is not a {error.__name__}: {e}"
            message = str(e)
        else:
            raise AssertionError(f"{getattr(call, '__name__', call)} accepted bad input")
    for needle in needles:
        assert needle in message, f"{needle!r} not in {message!r}"
    new = _files_under(where) - before
    assert not new, f"a refused command wrote {sorted(map(str, new))}"
    return message


def not_progress(stderr: str) -> list[str]:
    """The lines of ``stderr`` that are not ptopt's own progress (``ptopt.core.progress`` heartbeats):
    what upstream libraries printed, which must be nothing."""
    from ptopt.core.progress import is_heartbeat

    return [ln for ln in stderr.splitlines() if ln.strip() and not is_heartbeat(ln)]


def worker_threads() -> int | None:
    """Torch threads per test process when pytest-xdist runs several (``-n N``): the cores split
    between the workers, so N processes never oversubscribe them (OpenMP spins on a busy core)."""
    n = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 0)
    if n < 2:
        return None
    return max(1, len(os.sched_getaffinity(0)) // n)


def torchao(module: str = "torchao"):
    """``module`` of torchao imported the way ptopt imports it (``ptopt.core.quiet.quiet_imports``: the CUDA
    kernels not loaded on a machine without CUDA, for that import only, and its notices dropped): the
    suite leaves the environment as a user's, so the library's own scoping is what is tested."""
    import importlib

    from ptopt.core.quiet import quiet_imports

    with quiet_imports():
        return importlib.import_module(module)


#: the words of :func:`bert_folder`'s tokenizer, after BERT's special tokens
WORDS = "the a cat dog sat on mat ran fast slow red blue house tree big small and is was".split()
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]


def bert_folder(folder, num_labels: int = 3):
    """A tiny seeded ``BertForSequenceClassification`` (1 layer, width 32) saved in ``folder`` with a
    WordPiece tokenizer of VOCAB: a Hugging Face classifier folder as users save one."""
    import inspect

    from ptopt.core.hf import import_transformers

    tf = import_transformers()
    torch.manual_seed(0)
    config = tf.BertConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        vocab_size=len(VOCAB), num_labels=num_labels,
    )  # fmt: skip
    tf.BertForSequenceClassification(config).eval().save_pretrained(folder)
    if "vocab" in inspect.signature(tf.BertTokenizer.__init__).parameters:  # transformers 5: the words
        tokenizer = tf.BertTokenizer(vocab={w: i for i, w in enumerate(VOCAB)})
    else:  # 4: a file
        os.makedirs(folder, exist_ok=True)
        (folder / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
        tokenizer = tf.BertTokenizer(vocab_file=str(folder / "vocab.txt"))
    tokenizer.save_pretrained(folder)
    return folder
