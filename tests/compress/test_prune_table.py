"""The pruning table: filled by the files of compress/prune/techniques (no list names them), read by
the CLI's --method choices and by make_config, and importable without torch."""

from __future__ import annotations

import subprocess
import sys

from click.testing import CliRunner

from ptopt.cli.main import cli as main_cli
from ptopt.compress.prune import config as C
from ptopt.compress.prune import table
from tests.helpers import assert_refused


def test_every_config_has_one_registered_pruner():
    configs = table.configs()
    assert set(configs) == {"l1-unstructured", "global", "structured"}
    for method, cls in configs.items():
        assert cls.method == method and issubclass(cls, C.PruneConfig)
        assert table.PRUNERS[cls].__module__.startswith("ptopt.compress.prune.techniques.")


def test_cli_method_choices_are_the_table(cli, tmp_path):
    out = CliRunner().invoke(main_cli, ["prune", "--help"]).output
    for method in table.methods():
        assert method in out
    assert_refused(
        cli,
        "prune",
        "m.pt",
        "--method",
        "random",
        "--amount",
        "0.5",
        "-o",
        "o.pt",
        match="'random'",
        where=tmp_path,
    )


def test_reading_the_table_imports_no_torch():
    code = (
        "import sys; from ptopt.compress.prune import table; table.methods(); print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
