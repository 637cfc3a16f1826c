"""Progress of long work, reported one way by every stage: nothing long is silent.

A stage wraps each step that can take more than a few seconds (loading a model, calibrating, building
a candidate, a perplexity pass, compiling) and says what it learnt on the way::

    from ptopt.core import progress

    with progress.step("calibrating", total=len(batches), unit="batches") as step:
        for batch in batches:
            ...
            step.advance()
    progress.note("created folder out/sub/ for x.pt")

Nothing is shown unless a caller turned reporting on with :func:`reporting` (the CLI does around
every command, ``--quiet`` turns it off; a Python twin does for ``progress=True``, or sends the lines
to a ``progress=callable``). Where it goes:

- stderr is a terminal: rich progress bars, one row per open step (nested steps nest), cleared when
  the step ends; notes print above them;
- otherwise (CI logs, pipes, a callable): plain lines: one when a step starts, and whenever
  :data:`HEARTBEAT_S` seconds passed without a line while a step is open, one saying how far the
  innermost step got (a background thread writes it, so a single long call, e.g. a compile, is not
  silent either); a step that needed such a line says when it ended.

The lines go to the stderr that was current when reporting was turned on, through a duplicate of its
file descriptor, so a block that captures descriptor 2 (``core.quiet.silenced(native=True)``)
does not hold them back.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

#: a plain-text reporter writes a line when a step has been silent this long (seconds)
HEARTBEAT_S = 8.0
#: the lines a plain-text reporter writes on its own while a step runs (heartbeats, how far, the end)
HEARTBEAT_LINE = re.compile(
    r"^  \S.*: (still working \(.*\)|\d+/\d+ .*, \d+ s|\d+ s|(done in|stopped after|failed after) \d+ s)$"
)

_lock = threading.RLock()
_active: list[Any] = []  # the reporters turned on, innermost last (the innermost one reports)


class Step:
    """One open step: ``advance(n)`` moves it on, ``total``/``done`` say how far it is."""

    def __init__(
        self, title: str, total: int | None, unit: str, announce: bool = True, since: float | None = None
    ) -> None:
        self.title, self.total, self.unit, self.done = title, total, unit, 0
        self.announce = announce
        self.started = time.monotonic() if since is None else since
        self.beat = False  # a heartbeat line was printed for it
        self.task: Any = None

    def advance(self, n: int = 1) -> None:
        self.done += n
        reporter = _current()
        if reporter is not None:
            reporter.update(self)

    def where(self) -> str:
        """``12/32 batches, 40 s`` or ``40 s``."""
        elapsed = f"{time.monotonic() - self.started:.0f} s"
        if self.total:
            return f"{self.done}/{self.total} {self.unit}, {elapsed}".replace("  ", " ")
        return elapsed


class _Plain:
    """Plain lines to ``write`` (see the module docstring); a heartbeat thread for open steps."""

    def __init__(self, write: Callable[[str], None], since: float | None = None) -> None:
        self.write, self.steps = write, []
        self.last = time.monotonic() if since is None else since
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="ptopt-progress", daemon=True)
        self._thread.start()

    def line(self, text: str) -> None:
        with _lock:
            self.write(text)
            self.last = time.monotonic()

    def start(self, step: Step) -> None:
        self.steps.append(step)
        if step.announce:
            self.line(step.title + (f" ({step.total} {step.unit})" if step.total else ""))

    def update(self, step: Step) -> None:
        if time.monotonic() - self.last >= HEARTBEAT_S:
            step.beat = True
            self.line(f"  {step.title}: {step.where()}")

    def finish(self, step: Step, failed: BaseException | None = None) -> None:
        if step in self.steps:
            self.steps.remove(step)
        if step.beat:
            self.line(f"  {step.title}: {_ended(failed)} {time.monotonic() - step.started:.0f} s")

    def _beat(self) -> None:
        while not self._stop.wait(0.5):
            with _lock:
                step = self._due()
                if step is not None:
                    step.beat = True
                    self.line(f"  {step.title}: still working ({step.where()})")

    def _due(self) -> Step | None:
        """The step a heartbeat names now, after :data:`HEARTBEAT_S` of silence: the innermost open one
        that has run a second at least (one opened a moment ago, after quiet ones, read "still working
        (0 s)"); None: no line now (the innermost one is named once it has run that second)."""
        now = time.monotonic()
        if not self.steps or now - self.last < HEARTBEAT_S:
            return None
        return next((s for s in reversed(self.steps) if now - s.started >= 1.0), None)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)


class _Bars:
    """rich progress bars on a terminal; notes above them."""

    def __init__(self, stream: Any) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            SpinnerColumn,
            TextColumn,
            TimeElapsedColumn,
        )

        self.console = Console(file=stream)
        self.bars = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=self.console,
            transient=True,
            redirect_stdout=True,  # what others print goes above the bars
            redirect_stderr=True,
        )
        self.open = 0

    def line(self, text: str) -> None:
        self.console.print(text, markup=False, highlight=False, soft_wrap=True)

    def start(self, step: Step) -> None:
        if self.open == 0:
            self.bars.start()
        self.open += 1
        step.task = self.bars.add_task(step.title, total=step.total)

    def update(self, step: Step) -> None:
        self.bars.update(step.task, completed=step.done, description=step.title)

    def finish(self, step: Step, failed: BaseException | None = None) -> None:
        if step.task is None:
            return
        self.bars.remove_task(step.task)
        self.open -= 1
        if self.open == 0:
            self.bars.stop()

    def close(self) -> None:
        if self.open:
            self.bars.stop()


def _current() -> Any:
    with _lock:
        return _active[-1] if _active else None


def is_heartbeat(line: str) -> bool:
    """Whether ``line`` is one the reporter wrote by itself while a step ran (``HEARTBEAT_LINE``), not a
    message: a slow machine adds them before anything (a refusal's one ``error:`` line too)."""
    return bool(HEARTBEAT_LINE.match(line.rstrip("\n")))


def _muted() -> bool:
    """Whether a caller muted reporting here (``reporting(False)``: ``--quiet``)."""
    with _lock:
        return bool(_active) and _active[-1] is None


def enabled() -> bool:
    """Whether anything is reported (a caller turned reporting on and no inner block muted it)."""
    return _current() is not None


@contextlib.contextmanager
def reporting(
    progress: bool | Callable[[str], None] | None = True, since: float | None = None
) -> Iterator[None]:
    """Report the steps and notes of the block: ``True`` to stderr (bars on a terminal, plain lines
    elsewhere), a callable gets each plain line, ``None`` changes nothing (what the caller set
    applies), ``False`` mutes the block. ``since``: the ``time.monotonic()`` the silence counts from
    (the CLI: when the process started, so its imports count towards the first heartbeat)."""
    if progress is None:
        yield
        return
    if progress is False:
        reporter = None
        closing: Callable[[], None] = lambda: None  # noqa: E731
    elif callable(progress):
        reporter = _Plain(progress, since)
        closing = reporter.close
    else:
        stream, close_stream = _stderr()
        reporter = (
            _Bars(stream)
            if _terminal(stream)
            else _Plain(lambda text: (stream.write(text + "\n"), stream.flush()), since)
        )

        def closing() -> None:
            reporter.close()
            close_stream()

    with _lock:
        _active.append(reporter)
    try:
        yield
    finally:
        with _lock:
            _active.remove(reporter) if reporter is not None else _active.pop()
        closing()


def twin(progress: bool | Callable[[str], None] | None) -> contextlib.AbstractContextManager:
    """What a Python twin's ``progress`` argument turns on: ``True`` (stderr) or a callable (its lines)
    where nothing reports yet (under the CLI, the command's reporting goes on; under its ``--quiet``,
    ``True`` stays muted), ``False`` mutes the call, ``None`` changes nothing."""
    if progress is False:
        return reporting(False)
    if progress is None or enabled() or (progress is True and _muted()):
        return contextlib.nullcontext()
    return reporting(progress)


def reported(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A Python twin whose ``progress`` keyword (default: its signature's) is :func:`twin`'s: the
    stage's steps are reported for ``progress=True`` or to a callable, muted for ``False``."""
    import functools
    import inspect

    default = inspect.signature(fn).parameters["progress"].default

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        with twin(kwargs.get("progress", default)):
            return fn(*args, **kwargs)

    return call


def _terminal(stream: Any) -> bool:
    """A terminal or a notebook, where bars redraw in place (rich decides: ``TTY_COMPATIBLE``,
    ``TERM=dumb`` ...)."""
    if not getattr(stream, "isatty", lambda: False)() and "ipykernel" not in sys.modules:
        return False  # no rich import for the common non-terminal case (CI logs, pipes)
    from rich.console import Console

    console = Console(file=stream)
    return console.is_terminal or console.is_jupyter


def _stderr() -> tuple[Any, Callable[[], None]]:
    """The current stderr; the process's own through a duplicate of descriptor 2 (module docstring)."""
    stream = sys.stderr
    try:
        if stream is sys.__stderr__ and stream.fileno() == 2:
            dup = os.fdopen(os.dup(2), "w", buffering=1, encoding="utf-8", errors="replace")
            return dup, dup.close
    except (AttributeError, ValueError, OSError, io.UnsupportedOperation):
        pass
    return stream, lambda: None


@contextlib.contextmanager
def step(
    title: str, total: int | None = None, unit: str = "", announce: bool = True, since: float | None = None
) -> Iterator[Step]:
    """One step of long work (module docstring); reported only where reporting is on. ``announce``:
    False for a step whose start the caller already printed, or that is usually quick (loading a
    model): plain text then shows it only once it has run :data:`HEARTBEAT_S` seconds."""
    s = Step(title, total, unit, announce, since)
    reporter = _current()
    if reporter is not None:
        reporter.start(s)
    failed: BaseException | None = None
    try:
        yield s
    except BaseException as e:  # only noted ("stopped" / "failed", not "done"), then raised
        failed = e
        raise
    finally:
        if reporter is not None:
            reporter.finish(s, failed)


def _ended(failed: BaseException | None) -> str:
    """How a step that was shown ended: ``done in``, ``stopped after`` (Ctrl-C, a signal, an exit) or
    ``failed after`` (an error, whose line follows)."""
    if failed is None:
        return "done in"
    stopped = isinstance(failed, (KeyboardInterrupt, SystemExit)) or "Signal" in type(failed).__name__
    return "stopped after" if stopped else "failed after"


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """No heartbeat and no bar inside the block: a server waiting for requests is idle, not at work.
    The steps it runs inside of go on after it as if it had not run (no "done in" for the wait)."""
    reporter = _current()
    if isinstance(reporter, _Plain):
        with _lock:
            held, reporter.steps[:] = reporter.steps[:], []
            for s in held:
                s.beat = False
    elif isinstance(reporter, _Bars) and reporter.open:
        reporter.bars.stop()
    try:
        yield
    finally:
        if isinstance(reporter, _Plain):
            with _lock:
                reporter.steps[:0] = held
                reporter.last = time.monotonic()
        elif isinstance(reporter, _Bars) and reporter.open:
            reporter.bars.start()


def note(text: str) -> None:
    """A line of its own (what a step found, a file written, a choice made); dropped when off."""
    reporter = _current()
    if reporter is not None:
        reporter.line(text)


def track(items: Any, title: str, unit: str = "", total: int | None = None) -> Iterator[Any]:
    """``items`` as they are consumed, as one step that advances per item."""
    if total is None:
        try:
            total = len(items)
        except TypeError:
            total = None
    with step(title, total, unit) as s:
        for item in items:
            yield item
            s.advance()
