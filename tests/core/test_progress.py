"""``ptopt.core.progress``: steps and notes reach the reporter a caller turned on (plain lines in a log,
bars on a terminal), a silent stretch gets a heartbeat, ``False`` mutes, nothing shows by default; the
CLI reports every command unless ``--quiet``."""

from __future__ import annotations

import io
import time

import pytest

from ptopt.core import progress


def test_nothing_is_shown_unless_turned_on(capsys):
    with progress.step("invisible", 3) as step:
        step.advance()
    progress.note("dropped")
    assert not progress.enabled()
    assert capsys.readouterr() == ("", "")


def test_plain_lines_to_a_callable_steps_notes_nesting_and_mute():
    lines: list[str] = []
    with progress.reporting(lines.append):
        assert progress.enabled()
        with progress.step("calibrating", 4, "batches") as outer:
            progress.note("a note")
            with progress.step("quick load", announce=False):  # no line unless it takes long
                pass
            outer.advance(4)
        with progress.reporting(False):
            progress.note("muted")
            with progress.step("muted step"):
                pass
        progress.note("after")
    assert lines == ["calibrating (4 batches)", "a note", "after"]
    assert not progress.enabled()


def test_a_silent_step_gets_a_heartbeat_and_says_when_it_ended(monkeypatch):
    monkeypatch.setattr(progress, "HEARTBEAT_S", 0.05)
    lines: list[str] = []
    with progress.reporting(lines.append):
        with progress.step("compiling", announce=False):
            deadline = time.monotonic() + 30  # waits for the heartbeat thread (a busy machine is slow)
            while not any("still working" in line for line in lines) and time.monotonic() < deadline:
                time.sleep(0.02)
    assert any(line.startswith("  compiling: still working (") for line in lines), lines
    assert lines[-1].startswith("  compiling: done in ")


@pytest.mark.parametrize(
    "raised, word",
    [(KeyboardInterrupt, "stopped after"), (SystemExit, "stopped after"), (ValueError, "failed after")],
)
def test_a_step_that_did_not_finish_is_not_said_done(monkeypatch, raised, word):
    """Ctrl-C during a long step printed "compiling: done in 14 s" (and "ptopt distill: done")."""
    monkeypatch.setattr(progress, "HEARTBEAT_S", 0.0)
    lines: list[str] = []
    with (
        pytest.raises(raised),
        progress.reporting(lines.append),
        progress.step("compiling", announce=False) as s,
    ):
        s.advance()  # a heartbeat line: the step was shown, so its end is said
        raise raised()
    assert lines[-1].startswith(f"  compiling: {word} ") and not any("done" in line for line in lines), lines
    # still the reporter's own line, not a message (tests.helpers: a refusal's error line is the last)
    assert all(progress.is_heartbeat(line) for line in lines), lines


def test_no_heartbeat_while_paused_and_the_step_goes_on_after(monkeypatch):
    """``ptopt serve``: once the server answers, waiting for requests is not long work."""
    monkeypatch.setattr(progress, "HEARTBEAT_S", 0.05)
    lines: list[str] = []

    def beats(more_than: int) -> int:  # waits for the heartbeat thread (a busy machine is slow)
        deadline = time.monotonic() + 30
        while len(lines) <= more_than and time.monotonic() < deadline:
            time.sleep(0.02)
        return len(lines)

    with progress.reporting(lines.append), progress.step("ptopt serve", announce=False):
        beats(0)  # starting: heartbeats
        with progress.paused():
            started = len(lines)  # counted inside: a beat may land just before the pause
            time.sleep(1.2)  # the thread looks twice a second
            assert len(lines) == started  # nothing while serving
        beats(started)  # stopping: heartbeats again
    assert started >= 1 and len(lines) > started + 1 and lines[-1].startswith("  ptopt serve: done in")


def test_the_silence_counts_from_since():
    """``since`` (the CLI: the process's start): the time before reporting was turned on (the interpreter
    starting, the imports) counts towards the first heartbeat, and the step's time includes it."""
    lines: list[str] = []
    past = time.monotonic() - progress.HEARTBEAT_S
    with progress.reporting(lines.append, since=past):
        with progress.step("ptopt optimize", announce=False, since=past):
            deadline = time.monotonic() + 30  # the heartbeat thread checks every 0.5 s
            while not lines and time.monotonic() < deadline:
                time.sleep(0.02)
    assert lines[0].startswith("  ptopt optimize: still working (") and lines[-1].startswith(
        "  ptopt optimize: done in "
    )
    assert int(lines[-1].split("done in ")[1].split()[0]) >= progress.HEARTBEAT_S - 1


def test_a_loop_that_advances_after_a_silence_says_how_far_it_got(monkeypatch):
    monkeypatch.setattr(progress, "HEARTBEAT_S", 0.0)
    lines: list[str] = []
    with progress.reporting(lines.append):
        for _ in progress.track(range(3), "windows", "windows"):
            pass
    assert lines[0] == "windows (3 windows)" and any(
        ln.startswith("  windows: 3/3 windows, ") for ln in lines
    )


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_bars_on_a_terminal_and_notes_above_them(monkeypatch):
    term = _Terminal()
    monkeypatch.setattr("sys.stderr", term)
    monkeypatch.setenv("TERM", "xterm")
    with progress.reporting(True):
        with progress.step("calibrating", 2, "batches") as step:
            step.advance(2)
        progress.note("wrote x.pt")
    out = term.getvalue()
    assert "wrote x.pt" in out and "calibrating" in out and "\x1b[" in out  # drawn in place


@pytest.mark.parametrize(
    "given, expect", [(True, True), (None, False), (False, False)], ids=["on", "inherit", "mute"]
)
def test_a_twin_turns_reporting_on_only_when_asked(given, expect, capsys):
    @progress.reported
    def twin(progress: bool | None = True) -> bool:  # noqa: ARG001 - read by the decorator
        from ptopt.core import progress as p

        p.note("from the twin")
        return p.enabled()

    assert twin(progress=given) is expect
    assert ("from the twin" in capsys.readouterr().err) is expect
    lines: list[str] = []
    with progress.reporting(lines.append):  # under a caller's reporting (the CLI), True/None report there
        twin(progress=given)
    assert lines == ([] if given is False else ["from the twin"])


def test_cli_reports_unless_quiet_and_says_it_created_folders(cli, tmp_path):
    from ptopt.core.data import load_data

    data = tmp_path / "d32.pt"
    load_data("builtin:digits:test").take(32).save(data)  # one calibration batch: the test stays short
    quantize = ("quantize", "tests.helpers:tiny_cnn", "--mode", "static", "--calib-data", data)
    code, stdout, err = cli(*quantize, "-o", tmp_path / "nodir" / "sub" / "x.pt")
    assert code == 0, err
    assert "calibrating (1 batches)" in err and "created folder nodir/sub/ for x.pt" in err, err
    # a quality figure measured on the calibration data says so
    assert "on 32 samples of" in stdout and "(the calibration data; no --eval-data given)" in stdout, stdout
    code, stdout, err = cli(*quantize, "--no-progress", "-o", tmp_path / "y.pt")
    assert code == 0 and "calibrating" not in err and "created folder" not in err, err


def test_a_heartbeat_never_says_0_s():
    """After a long silence, a step opened a moment before the heartbeat was named with its own time:
    "still working (0 s)". The heartbeat names the innermost step that has run a second at least."""
    lines: list[str] = []
    past = time.monotonic() - progress.HEARTBEAT_S
    with (
        progress.reporting(lines.append, since=past),
        progress.step("ptopt export", announce=False, since=past),
    ):
        for _ in range(6):  # quick steps one after another, each less than the heartbeat thread's 0.5 s
            with progress.step("loading", announce=False):
                time.sleep(0.25)
    beats = [ln for ln in lines if "still working" in ln]
    assert beats and not any("(0 s)" in ln for ln in lines), lines
    assert beats[0].startswith("  ptopt export: still working (")
