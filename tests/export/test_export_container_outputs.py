"""A model that returns a library's container class (a Hugging Face ``ModelOutput``) exports to an
ExportedProgram that ptopt reads back in a process that never imported that library: ``inspect`` and
``validate`` of a BERT's ``.pt2`` beside an ONNX reference failed with torch's "error when
deserializing" (``SequenceClassifierOutput in pytree is not registered``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import ptopt
from ptopt.core.errors import ModelLoadError
from ptopt.formats.exported_program import ensure_container_types, unregistered_note

pytest.importorskip("transformers")


class TinyClassifier(nn.Module):
    """Returns what a transformers classifier returns: a ``SequenceClassifierOutput``."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> object:
        from transformers.modeling_outputs import SequenceClassifierOutput

        return SequenceClassifierOutput(logits=self.fc(x))


def test_program_with_transformers_outputs_loads_in_a_fresh_process(tmp_path):
    torch.manual_seed(0)
    out = tmp_path / "clf.pt2"
    ptopt.export(TinyClassifier().eval(), "exported_program", out, input_shapes=["1x8"], progress=False)
    # a fresh process: transformers not imported, as for `ptopt inspect clf.pt2`
    code = "from ptopt.cli.main import main; main()"
    proc = subprocess.run(
        [sys.executable, "-c", code, "inspect", str(out), "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    facts = json.loads(proc.stdout)
    assert [o["name"] for o in facts["outputs"]] == ["logits"]


def test_an_unregistered_container_class_is_named_in_one_line(tmp_path):
    """A class of another library is not imported (that would run code the file names): torch's load
    fails, and the one line names the class to import."""
    text = '{"out_spec": "[1, {\\"type\\": \\"mylib.outputs.Out\\", \\"context\\": null}]"}'
    assert ensure_container_types(Path(tmp_path / "m.pt2"), texts=[text]) == ["mylib.outputs.Out"]
    assert "mylib.outputs.Out, which torch reads back only once" in unregistered_note(["mylib.outputs.Out"])


def test_builtin_containers_and_devices_need_nothing(tmp_path):
    text = '{"type": "builtins.dict"} {"type": "cpu"} {\\"type\\": \\"collections.OrderedDict\\"}'
    assert ensure_container_types(Path(tmp_path / "m.pt2"), texts=[text]) == []
    assert unregistered_note([]) == ""


WRAPPER = 'out_spec_ = R"([1, {"type": "%s", "context": "[\\"logits\\"]", "children_spec": []}])";\n'


def _package(path: Path, out_type: str) -> Path:
    """A zip laid out as an AOTInductor package whose generated wrapper names ``out_type`` (the spec
    is all that is read before loading)."""
    import zipfile

    with zipfile.ZipFile(path, "w") as z:
        z.writestr("model/data/aotinductor/model/abc.wrapper.cpp", WRAPPER % out_type)
    return path


def test_aoti_package_registers_transformers_outputs_before_loading(tmp_path):
    """An `aoti` package of a HF classifier loaded where transformers was not imported failed at every
    call (validate: 'data does not fit ...: Deserializing ... SequenceClassifierOutput ... not registered')."""
    pkg = _package(tmp_path / "clf.pt2", "transformers.modeling_outputs.SequenceClassifierOutput")
    code = (
        "import sys; from ptopt.formats.aoti_files import check_container_types as c; c(sys.argv[1]); "
        "from torch.utils._pytree import SERIALIZED_TYPE_TO_PYTHON_TYPE as R; "
        "print('transformers.modeling_outputs.SequenceClassifierOutput' in R)"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(pkg)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "True"


def test_aoti_package_with_an_unregistered_output_class_is_refused_in_one_line(tmp_path):
    from ptopt.formats.aoti_files import check_container_types

    pkg = _package(tmp_path / "m.pt2", "mylib.outputs.Out")
    with pytest.raises(
        ModelLoadError, match=r"m\.pt2: its calls cannot run; its inputs or outputs are mylib"
    ):
        check_container_types(pkg)
