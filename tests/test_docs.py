"""The README is a landing page (<= 12 KB, lines under 100 characters), its formats table is the
format table's, and every relative link of the README and docs/ resolves."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, ROOT / "CONTRIBUTING.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_readme_is_a_landing_page():
    text = README.read_text(encoding="utf-8")
    assert len(text.encode()) <= 12 * 1024
    wide = [i for i, line in enumerate(text.splitlines(), 1) if len(line) >= 100]
    assert not wide, f"README lines of 100+ characters: {wide}"


def test_readme_formats_table_is_the_format_table():
    import ptopt  # noqa: F401 - registers the formats
    from ptopt.core.formats import targets

    text = README.read_text(encoding="utf-8")
    rows = {m.group(1): m.group(0) for m in re.finditer(r"^\| `(\w+)` \| `\.\w+` \|.*$", text, re.M)}
    assert set(rows) == set(targets())
    for target, row in targets().items():
        line = rows[target]
        assert f"`{row.suffixes[0]}`" in line, (target, line)
        for device in row.devices:
            assert device in line, (target, device)
        for precision in row.converts:
            assert precision in line, (target, precision)
        servers = (("torchserve", "mar"), ("triton", "triton"), ("ray", "ray"))
        served = [s for s, name in servers if name in line.split("|")[-2]]
        assert served == [s for s, _ in servers if s in row.servers], (target, line)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_resolve(page):
    text = page.read_text(encoding="utf-8")
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text) + re.findall(r"^\[[^\]]+\]: (\S+)$", text, re.M)
    missing = [link for link in links if not re.match(r"[a-z]+:", link) and not (page.parent / link).exists()]
    assert not missing, f"{page.name}: {missing}"


def test_ptopt_help_names_every_export_target():
    """`ptopt --help` says what export writes; a new format's row must show up there too."""
    import ptopt  # noqa: F401 - registers the formats
    from ptopt.commands import COMMANDS
    from ptopt.core.formats import targets

    line = COMMANDS["export"].help
    for row in targets().values():
        assert row.label.split()[0] in line, (row.label, line)
