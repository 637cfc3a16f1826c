"""Compare two timings of the same tests on two machines, file by file, and estimate the whole suite on the
other machine (issue 40: the suite's time on a CPU no session here runs on).

    python benchmarks/suite_compare.py OTHER.xml HERE.xml FULL.xml [--wall SECONDS]

``OTHER.xml`` and ``HERE.xml``: pytest's ``--junitxml`` (or the same gzipped, ``.xml.gz``) of the same
test list (``benchmarks/select_ids.py``) on the other machine and here, under the same torch; ``FULL.xml``: the
whole suite here (CI's command); ``--wall``: that run's wall time (pytest's figure), to turn the summed test
time into wall time. Prints the files whose time differs most and the whole suite's estimate with each file at
its measured ratio and every file not in the list at the ratio named in each row (1.0, the median file's
ratio, the whole list's ratio).
"""

from __future__ import annotations

import argparse
import gzip
import statistics
import xml.etree.ElementTree as ET
from collections import Counter

#: a file's ratio counts once it has at least this many seconds here (a shorter one is mostly noise)
MIN_SECONDS = 1.0


def cases(path: str) -> list[ET.Element]:
    """The ``testcase`` elements of a junit XML (``.xml`` or ``.xml.gz``)."""
    with (gzip.open if path.endswith(".gz") else open)(path, "rb") as fh:
        return list(ET.parse(fh).getroot().iter("testcase"))


def module_of(classname: str) -> str:
    """A junit ``classname``'s test file (``tests.x.test_y``): a test class's name dropped."""
    parts = classname.split(".")
    return classname if parts[-1].startswith("test_") else ".".join(parts[:-1])


def file_times(path: str) -> dict[str, float]:
    """Seconds per test file (its tests' setup + call + teardown) of a junit XML."""
    times: Counter[str] = Counter()
    for case in cases(path):
        times[module_of(case.get("classname", ""))] += float(case.get("time", 0))
    return dict(times)


def test_times(path: str) -> dict[str, float]:
    return {f"{c.get('classname')}::{c.get('name')}": float(c.get("time", 0)) for c in cases(path)}


def ratios(other: str, here: str) -> dict[str, float]:
    """Per file, the other machine's seconds over these, summed over the tests both ran."""
    a, b = test_times(other), test_times(here)
    num: Counter[str] = Counter()
    den: Counter[str] = Counter()
    for name in a.keys() & b.keys():
        module = module_of(name.split("::")[0])
        num[module] += a[name]
        den[module] += b[name]
    return {m: num[m] / den[m] for m in den if den[m] >= MIN_SECONDS}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("other")
    parser.add_argument("here")
    parser.add_argument("full")
    parser.add_argument("--wall", type=float, help="the whole suite's wall seconds here")
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args()
    per_file, full = ratios(args.other, args.here), file_times(args.full)
    other = test_times(args.other)
    listed_other = sum(other.values())
    listed_here = sum(v for k, v in test_times(args.here).items() if k in other)
    print(
        f"the list: {listed_other:.1f} s there, {listed_here:.1f} s here ({listed_other / listed_here:.2f}x)"
    )
    print(f"files with a ratio (>= {MIN_SECONDS:g} s here): {len(per_file)}")
    print("| file | here s | ratio |\n|---|---|---|")
    ranked = sorted(per_file, key=lambda m: -(per_file[m] - 1) * full.get(m, 0))
    for module in ranked[: args.top]:
        print(f"| {module} | {full.get(module, 0):.1f} | {per_file[module]:.2f} |")
    total = sum(full.values())
    covered = sum(v for m, v in full.items() if m in per_file)
    print(f"\nthe whole suite here: {total:.1f} s summed, {covered:.1f} s of it in files with a ratio")
    median, whole = statistics.median(per_file.values()), listed_other / listed_here
    print("| other files at | suite there, summed s | wall s |\n|---|---|---|")
    for label, default in (
        ("1.00x", 1.0),
        (f"{median:.2f}x (median file)", median),
        (f"{whole:.2f}x (list)", whole),
    ):
        est = sum(v * per_file.get(m, default) for m, v in full.items())
        wall = f"{est / total * args.wall:.0f}" if args.wall else ""
        print(f"| {label} | {est:.0f} | {wall} |")


if __name__ == "__main__":
    main()
