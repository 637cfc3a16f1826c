"""A pickled module (``torch.save(model)``) names the module of its class; ptopt finds it in the current
folder as ``python -c "torch.load(...)"`` and a ``pkg.module:factory`` do. ``ptopt export model.pt
--allow-pickle`` run beside the user's ``mymodels.py`` said ``No module named 'mymodels'``."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

import ptopt
from ptopt.core.errors import ModelLoadError

MODULE = textwrap.dedent(
    """
    import torch


    class PickledNet(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(8, 3)

        def forward(self, x):
            return self.fc(x)
    """
)


@pytest.fixture
def pickled(tmp_path, monkeypatch):
    """``model.pt`` pickled by a script in ``tmp_path/code`` beside its ``pickled_user_mod.py``; this
    process has not imported that module and its folder is not on the path."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "pickled_user_mod.py").write_text(MODULE)
    saver = "import torch, pickled_user_mod; torch.save(pickled_user_mod.PickledNet(), 'model.pt')"
    subprocess.run([sys.executable, "-c", saver], cwd=code, check=True, timeout=120)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(code))])
    monkeypatch.delitem(sys.modules, "pickled_user_mod", raising=False)
    return code / "model.pt"


def test_cli_loads_a_pickled_module_whose_code_is_in_the_current_folder(cli, pickled, monkeypatch):
    monkeypatch.chdir(pickled.parent)
    code, out, err = cli("inspect", pickled.name, "--allow-pickle", "--input-shape", "1x8")
    assert code == 0, err
    assert "PickledNet" in out or "fc" in out


def test_python_names_the_module_it_cannot_import(pickled, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # not the folder of the code
    with pytest.raises(ModelLoadError, match="the module 'pickled_user_mod' that defines its classes is not"):
        ptopt.load_model(pickled, allow_pickle=True)
