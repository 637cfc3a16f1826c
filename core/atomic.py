"""Writing files safely: atomic renames, all-or-nothing folders, one writer at a time per output,
clean-up of what a killed writer left, and the file mode every other tool uses.

- :func:`atomic_path` yields a temp file ``.<name>.<random>.tmp`` next to the destination and renames
  it into place only if the block succeeds; :func:`staged_dir` does the same for several files
  through a ``.ptopt-stage-<random>`` folder.
- Both hold an ``flock`` on their temp file / folder while it is alive, so :func:`remove_stale_temps`
  can tell a live writer's temp from one a ``kill -9`` left behind (the kernel drops the lock with
  the process) and removes only the latter (and only once it is a few seconds old).
- :func:`output_lock` is an exclusive lock on an output path (``fcntl.flock`` on ``.<name>.lock``
  next to it, removed afterwards): writers of one output run one after the other, the last one wins
  whole. Re-entrant within a thread; threads and processes wait for each other.
- Files get ``0o666 & ~umask`` (e.g. 0644 under umask 022) like files any other tool creates, not
  the 0600 of ``tempfile.mkstemp``.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import os
import shutil
import stat
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

TMP_SUFFIX = ".tmp"
STAGE_PREFIX = ".ptopt-stage-"
LOCK_SUFFIX = ".lock"
#: a temp file or stage folder untouched for this long, and not locked, belongs to a dead writer
STALE_AFTER_S = 5.0

_umask_lock = threading.Lock()
_held = threading.local()
#: (dev, inode) of the files this process renamed into place, by real path: lets ``finalize`` tell
#: whether the file at a path is still the one it wrote, or another writer's that replaced it
_placed: dict[str, tuple[int, int]] = {}


# -- file mode -------------------------------------------------------------------------------------
def current_umask() -> int:
    """The process umask, read without changing it (``/proc``) where possible."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    with _umask_lock:  # no /proc: set and restore (briefly process-wide, hence the lock)
        old = os.umask(0o022)
        os.umask(old)
    return old


def file_mode() -> int:
    """The mode a new file gets from ``open()``: ``0o666`` less the umask."""
    return 0o666 & ~current_umask()


# -- placed files ----------------------------------------------------------------------------------
def _key(path: str | os.PathLike) -> str:
    """The path with its folder resolved; not the last part (a rename replaces a link, not its target)."""
    return os.path.join(os.path.realpath(os.path.dirname(path) or "."), os.path.basename(path))


def note_placed(path: str | os.PathLike, st: os.stat_result) -> None:
    """Remember that this process put the file ``st`` at ``path`` (see :func:`placed_by_us`)."""
    _placed[_key(path)] = (st.st_dev, st.st_ino)


def placed_by_us(path: str | os.PathLike, st: os.stat_result) -> bool:
    """False when this process renamed a file to ``path`` and ``st`` (of the file there now) is
    another one: a concurrent writer replaced it. True when it is ours or we never placed one."""
    mine = _placed.get(_key(path))
    return mine is None or mine == (st.st_dev, st.st_ino)


def _replace(src: Path, dest: Path) -> None:
    st = os.stat(src)  # before: after the rename, ``dest`` may already be another writer's file
    os.replace(src, dest)
    note_placed(dest, st)


# -- temp files and folders ------------------------------------------------------------------------
@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; rename it into place only if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=TMP_SUFFIX, dir=path.parent)
    tmp_path = Path(tmp)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # alive: remove_stale_temps leaves it alone
        yield tmp_path
        os.chmod(tmp_path, file_mode())
        _replace(tmp_path, path)
    finally:
        os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            tmp_path.unlink()


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    with atomic_path(path) as tmp:
        Path(tmp).write_text(text, encoding="utf-8")


@contextlib.contextmanager
def staged_dir(final_dir: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary folder; on success move each file it holds into ``final_dir``.

    For writers that produce several files (ONNX + external data, a Triton repository): nothing
    appears at the destination until every file was written. Existing files of the same names are
    replaced; every file gets the umask's mode.
    """
    final_dir = Path(final_dir)
    final_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=STAGE_PREFIX, dir=final_dir))
    fd = os.open(tmp, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # alive: remove_stale_temps leaves it alone
        yield tmp
        mode = file_mode()
        for item in sorted(tmp.rglob("*")):
            if item.is_file():
                dest = final_dir / item.relative_to(tmp)
                dest.parent.mkdir(parents=True, exist_ok=True)
                if not item.is_symlink():
                    os.chmod(item, mode)
                _replace(item, dest)
    finally:
        os.close(fd)
        shutil.rmtree(tmp, ignore_errors=True)


def _in_use(path: Path) -> bool:
    """Whether a live writer holds the flock on ``path`` (a temp file or a stage folder)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return True  # cannot tell: leave it
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # also drops the probe's lock
    return False


def remove_stale_temps(path: str | os.PathLike, older_than: float = STALE_AFTER_S) -> list[Path]:
    """Remove what a killed writer of ``path`` left next to it: ``.<name>.*.tmp`` files and
    ``.ptopt-stage-*`` folders that no live writer holds and that are ``older_than`` seconds old.
    Returns what was removed."""
    path = Path(path)
    if not path.parent.is_dir():
        return []
    pattern = f".{glob.escape(path.name)}.*{TMP_SUFFIX}"
    candidates = [*path.parent.glob(pattern), *path.parent.glob(STAGE_PREFIX + "*")]
    removed = []
    now = time.time()
    for p in candidates:
        try:
            st = os.lstat(p)
        except FileNotFoundError:
            continue
        is_dir = stat.S_ISDIR(st.st_mode)
        if not (is_dir or stat.S_ISREG(st.st_mode)) or now - st.st_mtime < older_than or _in_use(p):
            continue
        if is_dir:
            shutil.rmtree(p, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
        removed.append(p)
    return removed


# -- one writer per output -------------------------------------------------------------------------
def lock_path(path: str | os.PathLike) -> Path:
    """The lock file of an output: ``.<name>.lock`` in its (real) folder."""
    key = Path(_key(path))
    return key.parent / f".{Path(path).name}{LOCK_SUFFIX}"


def _acquire(lock: Path) -> int:
    """An fd holding the flock on ``lock``, the file that is at that path now (a holder unlinks
    it before letting go; a waiter that got the lock on an unlinked file tries again)."""
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, file_mode())
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            mine = os.fstat(fd)
            try:
                now = os.stat(lock)
            except FileNotFoundError:
                now = None
        except BaseException:
            os.close(fd)
            raise
        if now is not None and (now.st_dev, now.st_ino) == (mine.st_dev, mine.st_ino):
            return fd
        os.close(fd)


@contextlib.contextmanager
def output_lock(path: str | os.PathLike) -> Iterator[None]:
    """Hold the exclusive lock of output ``path`` (see the module doc)."""
    lock = lock_path(path)
    held: dict[Path, int] = _held.__dict__.setdefault("locks", {})
    if lock in held:  # re-entered by this thread
        held[lock] += 1
        try:
            yield
        finally:
            held[lock] -= 1
        return
    lock.parent.mkdir(parents=True, exist_ok=True)
    fd = _acquire(lock)
    held[lock] = 1
    try:
        yield
    finally:
        del held[lock]
        with contextlib.suppress(FileNotFoundError):
            lock.unlink()  # while still locked: a waiter on this file sees it gone and retries
        os.close(fd)


class ScratchDir:
    """A temporary folder that lives as long as this object (an unsaved Result's files) and is removed
    when it is collected or :meth:`cleanup` is called. ``tempfile.TemporaryDirectory`` does the same but
    warns when collected (``ResourceWarning: Implicitly cleaning up <TemporaryDirectory ...>``), which
    is the normal end of a Result nobody saved, not a leak. ``name`` as TemporaryDirectory's."""

    def __init__(self, prefix: str) -> None:
        import weakref

        self.name = tempfile.mkdtemp(prefix=prefix)
        self._finalizer = weakref.finalize(self, shutil.rmtree, self.name, ignore_errors=True)

    def cleanup(self) -> None:
        self._finalizer()

    def __repr__(self) -> str:
        return f"<ScratchDir {self.name!r}>"
