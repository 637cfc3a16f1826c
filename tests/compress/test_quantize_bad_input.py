"""Bad input to ``ptopt quantize``: exit 2, one clear message, nothing written."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.helpers import assert_refused

TINY = "tests.helpers:tiny_cnn"


def _assert_clean_failure(cli, tmp_path: Path, args: tuple, *needles: str) -> None:
    """exit 2, one ``error:`` line naming ``needles``, nothing written (not even a temp file)."""
    assert_refused(cli, "quantize", *args, "-o", tmp_path / "out.pt", match=needles, where=tmp_path)


@pytest.mark.parametrize(
    "args,needle",
    [((TINY, "--mode", "static"), "--calib-data"), ((TINY, "--mode", "qat"), "--train-data")],
    ids=["static-without-calibration-data", "qat-without-training-data"],
)
def test_missing_data(cli, tmp_path: Path, args: tuple, needle: str) -> None:
    _assert_clean_failure(cli, tmp_path, args, needle)


def test_data_that_does_not_fit(cli, tmp_path: Path) -> None:
    _assert_clean_failure(
        cli,
        tmp_path,
        (TINY, "--mode", "static", "--calib-data", "builtin:digits32:test"),
        "expected",
        "got",
        "1x32x32",
    )


def test_nan_in_calibration_data(cli, tmp_path: Path) -> None:
    x = torch.rand(16, 1, 8, 8)
    x[3, 0, 2, 2] = float("nan")
    x[4, 0, 1, 1] = float("inf")
    torch.save({"x": x}, tmp_path / "bad.pt")
    _assert_clean_failure(
        cli, tmp_path, (TINY, "--mode", "static", "--calib-data", tmp_path / "bad.pt"), "NaN/Inf"
    )


def test_untraceable_model_names_module_and_remedy(cli, tmp_path: Path) -> None:
    _assert_clean_failure(
        cli,
        tmp_path,
        (
            "tests.compress.quant_models:untraceable",
            "--mode",
            "static",
            "--calib-data",
            "builtin:digits:train",
        ),
        "'gate'",
        "if x.sum() > 0",
        "--exclude gate",
        "--mode dynamic",
    )


@pytest.mark.parametrize(
    "args,needle",
    [
        (("--backend", "tpu"), "unknown backend 'tpu' (known: x86, fbgemm, qnnpack)"),
        (("--observer", "magic"), "unknown observer 'magic'"),
        (("--exclude", "nope"), "--exclude nope: no such module"),
    ],
    ids=["backend", "observer", "exclude"],
)
def test_bad_options(cli, tmp_path: Path, args: tuple[str, ...], needle: str) -> None:
    _assert_clean_failure(
        cli, tmp_path, (TINY, "--mode", "static", "--calib-data", "builtin:digits:train", *args), needle
    )


def test_dynamic_convolutions_refused(cli, tmp_path: Path) -> None:
    _assert_clean_failure(cli, tmp_path, (TINY, "--mode", "dynamic", "--layers", "conv2d"), "--mode static")


def test_torchscript_model_refused(cli, tmp_path: Path) -> None:
    import warnings

    from tests.helpers import tiny_cnn

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.jit.save(torch.jit.trace(tiny_cnn().eval(), torch.rand(1, 1, 8, 8)), str(tmp_path / "ts.pt"))
    _assert_clean_failure(cli, tmp_path, (tmp_path / "ts.pt", "--mode", "dynamic"), "eager nn.Module")


def test_static_with_integer_inputs_points_to_dynamic(cli, tmp_path: Path) -> None:
    ids = torch.randint(1, 18, (8, 12), generator=torch.Generator().manual_seed(0))
    torch.save({"x": {"input_ids": ids, "attention_mask": torch.ones_like(ids)}}, tmp_path / "tokens.pt")
    _assert_clean_failure(
        cli,
        tmp_path,
        (
            "tests.helpers:two_input",
            "--mode",
            "static",
            "--engine",  # fx's refusal (auto goes on to PT2E, whose int8 is 1% of it: refused as mostly float)
            "fx",
            "--calib-data",
            tmp_path / "tokens.pt",
            "--no-progress",
        ),
        "integer tensor",
        "--mode dynamic",
    )
