"""Assemble docs/benchmarks.md from benchmarks/results/*.md (run the bench_*.py scripts first)."""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent
ORDER = [
    "quantize",
    "prune",
    "prune_archs",
    "distill",
    "distill_parity",
    "distill_memory",
    "distill_lm",
    "export",
    "aoti",
    "half_parity",
    "gpu",
    "validate",
    "validate_time",
    "suite_cpus",
    "serve",
    "serve_resnet",
    "serve_minilm",
    "serve_cpu_resnet",
    "overhead",
    "int8_ceiling",
    "autoquant",
    "optimize",
    "real",
    "real_minilm",
    "real_resnet",
    "real_crepe",
    "llm",
    "llm_g128",
]


def main() -> None:
    parts = sorted(
        (HERE / "results").glob("*.md"),
        key=lambda p: (ORDER.index(p.stem) if p.stem in ORDER else 99, p.stem),
    )
    head = (
        "# Benchmarks\n\nEvery figure below was produced by the script named under its heading, on the machine "
        "it names. Rerun one with that command; `python benchmarks/collect.py` rebuilds this page.\n\n"
    )
    out = HERE.parent / "docs" / "benchmarks.md"
    out.write_text(head + "\n".join(p.read_text(encoding="utf-8") for p in parts), encoding="utf-8")
    print(f"wrote {out} ({len(parts)} sections)")


if __name__ == "__main__":
    main()
