"""The README and docs/: every relative link resolves, and the README's two commands are the ones CI runs."""

import re

LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def markdown_files(root):
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def test_relative_links_resolve(root):
    broken = [f"{page.relative_to(root)} -> {target}"
              for page in markdown_files(root) for target in LINK.findall(page.read_text())
              if "://" not in target and not (page.parent / target).exists()]
    assert not broken, f"links to missing paths: {broken}"


def test_readme_commands_are_what_ci_runs(root):
    """.ci/run runs command 1's install and command 2 verbatim; the README shows them in full."""
    readme = root / "README.md"
    ci = (root / ".ci" / "run").read_text().splitlines()
    commands = [line for line in readme.read_text().splitlines() if line.startswith("python3 -m venv .venv && ")]
    assert len(commands) == 2
    install = next(line for line in ci if line.startswith("python3 -m venv") and '".[test]"' not in line)
    assert commands[0].startswith(install + " && ")
    assert commands[1] in ci
