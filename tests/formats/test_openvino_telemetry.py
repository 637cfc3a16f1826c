"""OpenVINO's converter and NNCF send no usage events from ptopt's calls unless the user opted in:
each event forks the process and tries HTTPS for up to 3 s (17 events per ``export --target openvino``
of a tiny CNN, measured), while ptopt times models."""

from __future__ import annotations

import pytest

pytest.importorskip("openvino")

# openvino ships it: were it to move, these tests fail rather than skip (the feature would be gone)
from openvino_telemetry.utils import sender as telemetry  # noqa: E402

from ptopt.formats import openvino as O  # noqa: E402

FACTORY = "tests.helpers:tiny_cnn"
#: OpenVINO sends nothing at all on a CI runner (its own rule): these tests need it to try
CI_VARIABLES = ("CI", "TF_BUILD", "JENKINS_URL")


@pytest.fixture
def sends(monkeypatch, tmp_path):
    """Events that reached OpenVINO's sender ("sent") and those ptopt dropped ("dropped"); the consent
    folder is a fresh one (no file: OpenVINO's default would send)."""
    from openvino_telemetry.utils.opt_in_checker import OptInChecker

    seen = {"sent": 0, "dropped": 0}

    def sent(self, backend, message):
        seen["sent"] += 1

    def dropped(self, backend, message):
        seen["dropped"] += 1

    monkeypatch.setattr(telemetry.TelemetrySender, "send", sent)
    monkeypatch.setattr(O, "_drop_event", dropped)
    monkeypatch.setattr(OptInChecker, "consent_file_base_dir", staticmethod(lambda: str(tmp_path)))
    for name in CI_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    _as_on_a_users_machine(monkeypatch)
    return seen


def _as_on_a_users_machine(monkeypatch):
    """OpenVINO's telemetry is one object per process whose consent is fixed when it is first made: an
    earlier test in this worker may have made it on a CI runner (``CI=true``, consent off), where it would
    never try to send and these tests would prove nothing. Consent is set as a user's machine has it."""
    from openvino_telemetry import Telemetry

    try:
        made = Telemetry()  # the one already made; none yet: the first converter call makes it, env above
    except RuntimeError:
        return
    monkeypatch.setattr(made, "consent", True)


def test_events_are_dropped_in_the_block_and_the_sender_restored_after(sends):
    original = telemetry.TelemetrySender.send
    with O.telemetry_off():
        with O.telemetry_off():  # re-entrant: the inner block's end restores nothing yet
            pass
        assert telemetry.TelemetrySender.send is O._drop_event
    assert telemetry.TelemetrySender.send is original


def test_the_sender_is_restored_when_the_block_raises(sends):
    original = telemetry.TelemetrySender.send
    with pytest.raises(RuntimeError, match="conversion failed"), O.telemetry_off():
        raise RuntimeError("conversion failed")
    assert telemetry.TelemetrySender.send is original


def test_a_changed_telemetry_api_never_breaks_an_export(sends, monkeypatch):
    """Should openvino_telemetry change (here: its consent check raises), events go out as OpenVINO
    sends them and the block runs."""
    from openvino_telemetry.utils.opt_in_checker import OptInChecker

    def changed(*args, **kwargs):
        raise TypeError("check() got an unexpected keyword argument")

    monkeypatch.setattr(OptInChecker, "check", changed)
    original = telemetry.TelemetrySender.send
    with O.telemetry_off():
        assert telemetry.TelemetrySender.send is original


def test_a_user_who_opted_in_keeps_openvinos_telemetry(sends, tmp_path):
    (tmp_path / "intel").mkdir()
    (tmp_path / "intel" / "openvino_telemetry").write_text("1\n")
    original = telemetry.TelemetrySender.send
    with O.telemetry_off():
        assert telemetry.TelemetrySender.send is original


def test_api_export_sends_nothing(sends, tmp_path):
    import ptopt

    ptopt.export(FACTORY, "openvino", tmp_path / "m.xml")
    assert sends["dropped"] > 0 and sends["sent"] == 0  # the converter tried; nothing went out


def test_cli_quantize_int8_sends_nothing(sends, cli, tmp_path):
    """Through the CLI, with NNCF's quantize (whose own telemetry is a stub under pytest: the fresh
    process below covers it)."""
    code, _, err = cli(
        "export", FACTORY, "--target", "openvino", "--precision", "int8", "--data", "builtin:digits:train",
        "-o", tmp_path / "m.int8.xml",
    )  # fmt: skip
    assert code == 0, err
    assert sends["dropped"] > 0 and sends["sent"] == 0


def test_a_fresh_process_sends_nothing_not_even_on_import(tmp_path):
    """Outside pytest NNCF's own telemetry is live too, and ``import openvino`` sends an event the first
    time: a fresh process running the CLI's int8 export counts what reaches OpenVINO's sender."""
    import os
    import subprocess
    import sys

    from tests.conftest import REPO

    code = f"""
import sys
from openvino_telemetry.utils.opt_in_checker import OptInChecker
from openvino_telemetry.utils.sender import TelemetrySender
from ptopt.formats import openvino as O
seen = {{"sent": 0, "dropped": 0}}
def sent(self, backend, message): seen["sent"] += 1
def dropped(self, backend, message): seen["dropped"] += 1
TelemetrySender.send, O._drop_event = sent, dropped
OptInChecker.consent_file_base_dir = staticmethod(lambda: {str(tmp_path)!r})
from ptopt.cli.main import main
try:
    main(["export", "{FACTORY}", "--target", "openvino", "--precision", "int8", "--data",
          "builtin:digits:train", "-o", {str(tmp_path / "m.xml")!r}])
except SystemExit as e:
    assert not e.code, e.code
assert "pytest" not in sys.modules and "openvino" in sys.modules
print(seen["sent"], seen["dropped"])
"""
    env = {k: v for k, v in os.environ.items() if k not in CI_VARIABLES} | {"PYTHONPATH": str(REPO)}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    sent, dropped = map(int, run.stdout.split()[-2:])
    assert sent == 0 and dropped > 0, run.stdout
