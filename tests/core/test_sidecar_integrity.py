"""The artifact and its sidecar never disagree: the sidecar carries every file's sha256, a stale one
counts as absent, writes are locked and ordered (files, then sidecar), a killed writer's leftovers are
removed by the next write, and files get the umask's mode."""

import gzip
import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ptopt.core import artifact as artifact_mod
from ptopt.core.artifact import (
    Artifact,
    SidecarStatus,
    gzip_bytes,
    gzip_size,
    scan_file,
    sha256_file,
    sidecar_path,
)
from ptopt.core.atomic import (
    atomic_path,
    file_mode,
    lock_path,
    output_lock,
    remove_stale_temps,
    staged_dir,
    write_text_atomic,
)
from ptopt.core.errors import ModelLoadError
from ptopt.core.result import Result
from tests.helpers import assert_refused

REPO = Path(__file__).resolve().parents[2]


def _writer(payload: bytes, pause: float = 0.0):
    """A two-file artifact (model + external data) whose bytes and sidecar both name ``payload``."""

    def write(path: Path):
        path.write_bytes(payload * 64)
        time.sleep(pause)
        (path.parent / (path.name + ".data")).write_bytes(payload[::-1] * 64)
        return {"files": [path.name, path.name + ".data"], "extra": {"payload": payload.decode()}}

    return write


def _save(out: Path, payload: bytes) -> Artifact:
    return Result(None, Artifact(path=None, format="onnx"), _writer(payload)).save(out)


def _listing(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


# -- sidecar status ---------------------------------------------------------------------------------
def test_sidecar_records_every_file_and_status_ok(tmp_path):
    out = tmp_path / "m.onnx"
    art = _save(out, b"one")
    data = json.loads(sidecar_path(out).read_text())
    assert data["sha256"] == hashlib.sha256(b"one" * 64).hexdigest() == art.sha256
    assert data["hashes"] == {
        "m.onnx": art.sha256,
        "m.onnx.data": hashlib.sha256(b"eno" * 64).hexdigest(),
    }
    status = Artifact.sidecar_status(out)
    assert status and status.state == SidecarStatus.OK and status.reason == ""
    assert status.artifact.extra["payload"] == "one" and Artifact.maybe_load(out).sha256 == art.sha256
    assert data["extra"]["gzip_bytes"] == sum(
        len(gzip.compress(p.read_bytes(), compresslevel=6, mtime=0)) for p in art.file_paths
    )


def _replace_main(out):
    out.write_bytes(b"other bytes")


def _replace_data(out):
    Path(str(out) + ".data").write_bytes(b"other weights")


def _remove_data(out):
    Path(str(out) + ".data").unlink()


def _drop_sidecar(out):
    sidecar_path(out).unlink()


def _garble_sidecar(out):
    sidecar_path(out).write_text("{not json")


def _sidecar_a_list(out):
    sidecar_path(out).write_text("[1, 2]")


def _legacy_wrong_sha(out):
    data = json.loads(sidecar_path(out).read_text())
    del data["hashes"]
    data["sha256"] = "0" * 64
    sidecar_path(out).write_text(json.dumps(data))


def _legacy_no_sha(out):
    data = json.loads(sidecar_path(out).read_text())
    del data["hashes"]
    data["sha256"] = ""
    sidecar_path(out).write_text(json.dumps(data))


def _two_shas(out):
    data = json.loads(sidecar_path(out).read_text())
    data["sha256"] = data["hashes"]["m.onnx.data"]
    sidecar_path(out).write_text(json.dumps(data))


def _hash_outside(out):
    data = json.loads(sidecar_path(out).read_text())
    data["hashes"]["../../../../dev/zero"] = "0" * 64  # would never finish reading
    sidecar_path(out).write_text(json.dumps(data))


BROKEN = [
    (_hash_outside, "stale", "outside its folder"),
    (_replace_main, "stale", "sha256 of m.onnx is not"),
    (_replace_data, "stale", "sha256 of m.onnx.data is not"),
    (_remove_data, "stale", "m.onnx.data is missing"),
    (_legacy_wrong_sha, "stale", "sha256 of m.onnx is not"),
    (_legacy_no_sha, "stale", "records no sha256"),
    (_two_shas, "stale", "two different sha256"),
    (_drop_sidecar, "missing", "no sidecar"),
    (_garble_sidecar, "unreadable", "unreadable sidecar"),
    (_sidecar_a_list, "unreadable", "not an object"),
]


@pytest.mark.parametrize("damage, state, words", BROKEN, ids=[d.__name__.strip("_") for d, _, _ in BROKEN])
def test_sidecar_status_says_why_not(tmp_path, damage, state, words):
    out = tmp_path / "m.onnx"
    _save(out, b"one")
    damage(out)
    status = Artifact.sidecar_status(out)
    assert not status and status.state == state and words in status.reason and status.artifact is None
    assert_refused(Artifact.load, out, match=words, where=tmp_path, error=ModelLoadError)
    if state == "unreadable":
        assert_refused(Artifact.maybe_load, out, match=words, where=tmp_path, error=ModelLoadError)
    else:  # a stale sidecar counts as absent
        assert Artifact.maybe_load(out) is None


def test_legacy_sidecar_with_right_sha_still_loads(tmp_path):
    out = tmp_path / "m.onnx"
    _save(out, b"one")
    data = json.loads(sidecar_path(out).read_text())
    del data["hashes"]  # written before sidecars recorded every file
    sidecar_path(out).write_text(json.dumps(data))
    assert Artifact.sidecar_status(out) and Artifact.load(out).extra["payload"] == "one"


def test_finalize_of_a_folder_artifact_checks_its_files(tmp_path):
    repo = tmp_path / "repo"
    with staged_dir(repo) as d:
        (d / "m" / "1").mkdir(parents=True)
        (d / "m" / "1" / "model.pt").write_bytes(b"ts")
        (d / "m" / "config.pbtxt").write_text("cfg")
    art = Artifact(repo, "triton", files=["repo/m/1/model.pt", "repo/m/config.pbtxt"]).finalize()
    assert art.sha256 == "" and set(art.hashes) == {"repo/m/1/model.pt", "repo/m/config.pbtxt"}
    assert Artifact.sidecar_status(repo)
    (repo / "m" / "config.pbtxt").write_text("changed")
    assert Artifact.sidecar_status(repo).state == "stale"


# -- hashing ----------------------------------------------------------------------------------------
def test_scan_file_reads_once_for_sha_and_gzip(tmp_path):
    f = tmp_path / "w.bin"
    data = bytes(range(256)) * 5000 + b"\0" * 300_000
    f.write_bytes(data)
    facts = scan_file(f)
    assert facts.sha256 == hashlib.sha256(data).hexdigest() and facts.size == len(data)
    assert facts.gzip_bytes == len(gzip.compress(data, compresslevel=6, mtime=0))


def test_gzip_size_compresses_the_same_bytes_once(tmp_path, monkeypatch):
    """A file written (its sidecar measured) then validated in one process is deflated once; other bytes
    at the same path, or the same bytes elsewhere, get their own (exact) size."""
    monkeypatch.setattr(artifact_mod, "_gzip_memo", {})
    calls = []
    real = artifact_mod.zlib.compressobj
    monkeypatch.setattr(artifact_mod.zlib, "compressobj", lambda *a: calls.append(a) or real(*a))
    f, g = tmp_path / "w.bin", tmp_path / "copy.bin"
    first, second = bytes(range(256)) * 300, b"\0" * 70_000 + b"tail"
    f.write_bytes(first)
    measured = scan_file(f).gzip_bytes
    g.write_bytes(first)
    assert gzip_size([f, g]) == 2 * measured and len(calls) == 1  # served from memory, by content
    f.write_bytes(second)  # changed in place: compressed anew
    assert gzip_size([f]) == len(gzip.compress(second, compresslevel=6, mtime=0)) and len(calls) == 2
    assert gzip_size([g]) == measured == len(gzip.compress(first, compresslevel=6, mtime=0))
    # bytes in memory (prune's weights before / after, validate's in-memory reference) share the memory
    assert gzip_bytes(first) == measured and len(calls) == 2
    assert gzip_bytes(second + b"!") == len(gzip.compress(second + b"!", compresslevel=6, mtime=0))
    assert len(calls) == 3


def test_sha_of_a_fresh_file_is_never_served_from_memory(tmp_path):
    """A file changed in place right after it was hashed (same size, maybe the same timestamp tick)."""
    f = tmp_path / "w.bin"
    for i in range(20):
        f.write_bytes(b"%04d" % i)
        assert sha256_file(f) == hashlib.sha256(b"%04d" % i).hexdigest()


def test_sha_memory_is_keyed_on_the_file_state(tmp_path, monkeypatch):
    monkeypatch.setattr(artifact_mod, "_MEMO_MIN_AGE_NS", -(10**12))  # remember even fresh files
    monkeypatch.setattr(artifact_mod, "_sha_memo", {})
    f = tmp_path / "w.bin"
    f.write_bytes(b"first")
    assert sha256_file(f) == hashlib.sha256(b"first").hexdigest() and len(artifact_mod._sha_memo) == 1
    f.write_bytes(b"second!")  # another size: another key
    assert sha256_file(f) == hashlib.sha256(b"second!").hexdigest()
    os.replace(tmp_path / "w.bin", tmp_path / "gone.bin")
    (tmp_path / "w.bin").write_bytes(b"first")  # another inode
    assert sha256_file(f) == hashlib.sha256(b"first").hexdigest() and len(artifact_mod._sha_memo) == 3


# -- kill -9 at every step of a write -------------------------------------------------------------
KILLER = r"""
import os, signal, sys
from pathlib import Path
import ptopt.core.atomic as atomic
from ptopt.core.artifact import Artifact
from ptopt.core.result import Result

out, when, payload = Path(sys.argv[1]), sys.argv[2], sys.argv[3].encode()

def die():
    os.kill(os.getpid(), signal.SIGKILL)

def writer(path):
    path.write_bytes(payload * 64)
    if when == "while-writing":
        die()
    (path.parent / (path.name + ".data")).write_bytes(payload[::-1] * 64)
    return {"files": [path.name, path.name + ".data"], "extra": {"payload": payload.decode()}}

if when == "between-files":  # after the model file is renamed into place, before its .data
    real = atomic._replace
    atomic._replace = lambda src, dest: (real(src, dest), die())
if when == "before-sidecar":  # after every file is in place
    Artifact.write_sidecar = lambda self: die()
if when == "in-atomic-path":
    with atomic.atomic_path(out) as tmp:
        tmp.write_bytes(b"half")
        die()
Result(None, Artifact(path=None, format="onnx"), writer).save(out)
"""

# when -> (what is left beside the pair, the state of the sidecar, whose bytes m.onnx holds)
KILLS = {
    "while-writing": ({".ptopt-stage-", ".m.onnx.lock"}, "ok", b"old"),
    "between-files": ({".ptopt-stage-", ".m.onnx.lock"}, "stale", b"new"),
    "before-sidecar": ({".m.onnx.lock"}, "stale", b"new"),
    "in-atomic-path": ({".m.onnx."}, "ok", b"old"),
}


@pytest.mark.parametrize("when", list(KILLS))
def test_kill_9_never_leaves_a_trusted_wrong_sidecar(tmp_path, when):
    out = tmp_path / "m.onnx"
    _save(out, b"old")
    proc = subprocess.run(
        [sys.executable, "-c", KILLER, str(out), when, "new"], cwd=REPO, capture_output=True, text=True
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    left, state, holder = KILLS[when]
    extra = set(_listing(tmp_path)) - {"m.onnx", "m.onnx.data", "m.onnx.ptopt.json"}
    assert {next((x for x in extra if x.startswith(p)), None) for p in left} == extra, extra
    assert out.read_bytes() == holder * 64
    status = Artifact.sidecar_status(out)
    assert status.state == state, status.reason
    if state == "stale":
        assert Artifact.maybe_load(out) is None and "stale sidecar" in status.reason
        assert_refused(Artifact.load, out, match="stale", where=tmp_path, error=ModelLoadError)
    else:
        assert Artifact.load(out).extra["payload"] == "old"
    # the next write takes over the dead writer's lock (and removes it); fresh temps it leaves
    # (they might be a live writer's)...
    _save(out, b"next")
    assert Artifact.load(out).extra["payload"] == "next" and out.read_bytes() == b"next" * 64
    temps = {x for x in extra if not x.endswith(".lock")}
    assert set(_listing(tmp_path)) == {"m.onnx", "m.onnx.data", "m.onnx.ptopt.json"} | temps
    # ...and once they are a few seconds old and unlocked, it removes them
    for name in temps:
        os.utime(tmp_path / name, (time.time() - 60, time.time() - 60))
    _save(out, b"last")
    assert _listing(tmp_path) == ["m.onnx", "m.onnx.data", "m.onnx.ptopt.json"]
    assert Artifact.load(out).extra["payload"] == "last"


def test_live_writers_temps_are_left_alone(tmp_path):
    out = tmp_path / "m.pt"
    with atomic_path(out) as tmp, staged_dir(tmp_path) as stage:
        old = time.time() - 60
        tmp.write_bytes(b"in progress")
        (stage / "m.pt").write_bytes(b"in progress")
        os.utime(tmp, (old, old))
        os.utime(stage, (old, old))
        assert remove_stale_temps(out) == [] and tmp.is_file() and stage.is_dir()
    assert out.read_bytes() == b"in progress"
    assert _listing(tmp_path) == ["m.pt"]


# -- concurrent writers ---------------------------------------------------------------------------
WRITER = r"""
import random, sys, time
from pathlib import Path
from ptopt.core.artifact import Artifact, atomic_path
from ptopt.core.result import Result

out, who, rounds, how = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]

def pause():
    time.sleep(random.uniform(0, 0.02))

for i in range(rounds):
    while not (out.parent / f"go-{i}").exists():  # both writers start each round together
        time.sleep(0.001)
    payload = f"{who}{i:03d}".encode()
    if how == "result":
        def write(path, payload=payload):
            path.write_bytes(payload * 4096)
            pause()
            (path.parent / (path.name + ".data")).write_bytes(payload[::-1] * 4096)
            return {"files": [path.name, path.name + ".data"], "extra": {"payload": payload.decode()}}
        Result(None, Artifact(path=None, format="onnx"), write).save(out)
    else:  # a stage that renames its file itself, then calls finalize()
        with atomic_path(out) as tmp:
            tmp.write_bytes(payload * 4096)
        pause()
        Artifact(out, "torchscript", extra={"payload": payload.decode()}).finalize()
    (out.parent / f"done-{who}-{i}").touch()
"""


def _snapshot_agrees(out: Path) -> bool | None:
    """None when the pair cannot be read as one snapshot; else whether a sidecar whose sha256 matches
    the bytes read also describes them (its payload is the bytes')."""
    try:
        side = json.loads(sidecar_path(out).read_text())
        data = out.read_bytes()
    except (OSError, ValueError):
        return None
    if hashlib.sha256(data).hexdigest() != side["sha256"]:
        return None  # stale at this instant: ignored by every reader
    return data[:4].decode() == side["extra"]["payload"]


@pytest.mark.parametrize("how", ["result", "finalize"])
def test_two_concurrent_writers_end_with_a_consistent_pair(tmp_path, how):
    """Two processes write one output at the same time, round after round: while they write, a
    sidecar that matches the bytes describes them; when both are done the pair is consistent (the
    last writer won whole), and no temp or lock file is left."""
    out = tmp_path / "m.onnx"
    rounds = 12
    procs = [
        subprocess.Popen([sys.executable, "-c", WRITER, str(out), who, str(rounds), how], cwd=REPO)
        for who in "ab"
    ]
    try:
        for i in range(rounds):
            (tmp_path / f"go-{i}").touch()
            while not all((tmp_path / f"done-{who}-{i}").exists() for who in "ab"):
                assert all(p.poll() in (None, 0) for p in procs), "a writer failed"
                agrees = _snapshot_agrees(out) if out.exists() else None
                assert agrees is not False, "a sidecar whose sha256 matches describes another run's bytes"
            status = Artifact.sidecar_status(out)
            assert status, f"round {i}: {status.reason}"
            assert out.read_bytes() == status.artifact.extra["payload"].encode() * 4096
            assert status.artifact.extra["payload"] in (f"a{i:03d}", f"b{i:03d}")
        assert [p.wait(60) for p in procs] == [0, 0]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    names = {n for n in _listing(tmp_path) if not n.startswith(("go-", "done-"))}
    assert names == {"m.onnx", "m.onnx.ptopt.json"} | ({"m.onnx.data"} if how == "result" else set())


def test_output_lock_serializes_threads_and_is_reentrant(tmp_path):
    out = tmp_path / "m.pt"
    order = []
    inside = threading.Event()

    def other():
        with output_lock(out):
            order.append("other")

    with output_lock(out):
        with output_lock(out):  # re-entered by this thread: no deadlock
            assert lock_path(out).is_file()
        t = threading.Thread(target=other)
        t.start()
        inside.wait(0.3)
        order.append("first")
    t.join(10)
    assert order == ["first", "other"] and not lock_path(out).exists()
    assert _listing(tmp_path) == []


# -- file mode --------------------------------------------------------------------------------------
@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002], ids=["022", "077", "002"])
def test_files_get_the_umask_mode(tmp_path, umask):
    old = os.umask(umask)
    try:
        want = 0o666 & ~umask
        assert file_mode() == want
        _save(tmp_path / "m.onnx", b"one")
        with atomic_path(tmp_path / "a.bin") as tmp:
            tmp.write_bytes(b"a")
        write_text_atomic(tmp_path / "r.json", "{}")
        with staged_dir(tmp_path / "repo") as d:
            (d / "x").mkdir()
            (d / "x" / "f.txt").write_text("f")
        files = [p for p in tmp_path.rglob("*") if p.is_file()]
        assert len(files) == 6
        assert {p.name: oct(p.stat().st_mode & 0o777) for p in files} == {p.name: oct(want) for p in files}
    finally:
        os.umask(old)


def test_inspect_reports_a_stale_sidecar_and_ignores_it(tmp_path):
    """``ptopt inspect`` says ok / stale; a stale sidecar's input specs are not used."""
    import torch

    from ptopt.core.inputspec import InputSpec
    from ptopt.core.inspect import inspect_model
    from tests.helpers import tiny_cnn

    out = tmp_path / "m.pt"
    spec = InputSpec("x", (1, 1, 8, 8), (2, 1, 8, 8), (4, 1, 8, 8))
    scripted = torch.jit.script(tiny_cnn().eval())
    Result(scripted, Artifact(path=None, format="torchscript", inputs=[spec]), scripted.save).save(out)
    report = inspect_model(str(out))
    assert report["sidecar"] == {"state": "ok", "reason": ""} and report["inputs"][0]["name"] == "x"
    torch.jit.save(torch.jit.script(torch.nn.Linear(3, 2)), out)  # another model, same name
    report = inspect_model(str(out))
    assert report["sidecar"]["state"] == "stale" and "sha256 of m.pt" in report["sidecar"]["reason"]
    assert report["inputs"] == [] and "artifact" not in report


def test_inspect_cli_prints_the_sidecar_state(tmp_path, cli):
    import torch

    from tests.helpers import tiny_cnn

    out = tmp_path / "m.pt"
    scripted = torch.jit.script(tiny_cnn().eval())
    Result(scripted, Artifact(path=None, format="torchscript"), scripted.save).save(out)
    code, stdout, err = cli("inspect", out)
    assert code == 0 and "sidecar:    ok" in stdout, err
    torch.jit.save(torch.jit.script(torch.nn.Linear(3, 2)), out)
    code, stdout, err = cli("inspect", out)
    assert code == 0 and "sidecar:    stale (" in stdout and "sha256 of m.pt" in stdout, err
