"""The README and docs/: every relative link resolves, the README's two commands are the ones CI runs, and the
artifacts of `specfit.planning.paths` (the one table of them) are the ones the README's DAG and data/README.md draw and
.gitignore leaves out; every package of src/specfit opens with one paragraph."""

import ast
import inspect
import itertools
import re
import shutil
import subprocess

import pytest

from specfit.planning import paths

LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def markdown_files(root):
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def test_relative_links_resolve(root):
    broken = [f"{page.relative_to(root)} -> {target}"
              for page in markdown_files(root) for target in LINK.findall(page.read_text())
              if "://" not in target and not (page.parent / target).exists()]
    assert not broken, f"links to missing paths: {broken}"


def test_readme_commands_are_what_ci_runs(root):
    """.ci/run runs command 1's install and command 2 verbatim; the README shows them in full (beside them, the
    install of torch's CPU build from PyTorch's index, which CI's local wheel store makes needless)."""
    readme = root / "README.md"
    ci = (root / ".ci" / "run").read_text().splitlines()
    commands = [line for line in readme.read_text().splitlines()
                if line.startswith("python3 -m venv .venv && ") and "--index-url" not in line]
    assert len(commands) == 2
    install = next(line for line in ci if line.startswith("python3 -m venv") and '".[test]"' not in line)
    assert commands[0].startswith(install + " && ")
    assert commands[1] in ci


# ------------------------------------------------------------------ the artifacts: specfit.planning.paths is the table
PARTS = ("tokenizer", "target", "drafter")  # a toy's folders (`paths.toy_model`)
VALUES = {  # what a parameter of a paths function takes; any other is its wildcard, "{name}"
    "cache": paths.CACHE_MODES, "part": PARTS, "variant": tuple(f"{{method}}-{c}" for c in paths.CACHE_MODES),
    "name": (*paths.ATLAS_FILES, *paths.RUN_FILES), "parts": ((), ("{wildcards}",)),
}


def artifact_patterns() -> set[str]:
    """Every pattern a function of `specfit.planning.paths` builds, each parameter a wildcard or one of its values
    (and its default), with the module's own paths: the single source the docs are checked against."""
    found = {paths.REPORT, paths.SHIPPED_MANIFEST}
    for name, function in inspect.getmembers(paths, inspect.isfunction):
        if name.startswith("_") or function.__module__ != paths.__name__:
            continue
        choices = []
        for param in inspect.signature(function).parameters.values():
            values = VALUES.get(param.name, (f"{{{param.name}}}",))
            if param.default is not inspect.Parameter.empty:
                values = (*values, param.default)
            choices.append([(v,) if param.kind != param.VAR_POSITIONAL else v for v in values])
        for args in itertools.product(*choices):
            try:
                path = function(*itertools.chain.from_iterable(args))
            except ValueError:  # not a path function (cache_mode of a wildcard), or a file another folder holds
                continue
            if isinstance(path, str) and path.startswith(("data/", "reports/")):
                found.add(path)
    return found


def _normal(text: str) -> str:
    return re.sub(r"\{\w+\}", "{}", text)


def drawn(text: str) -> str:
    """A doc's paths with every optional part (``[.{method}]``) and alternative (``{a,b}``, ``{a|b}``) spelt out,
    one line each, and each wildcard written ``{}``."""
    out = []
    for line in text.splitlines():
        pieces = re.split(r"(\[[^\[\]]*\]|\{[^{}]*[,|][^{}]*\})", line)
        options = [("", p[1:-1]) if p.startswith("[") else tuple(re.split(r"[,|]", p[1:-1])) if p.startswith("{")
                   and re.search(r"[,|]", p) else (p,) for p in pieces]
        out += [_normal("".join(choice)) for choice in itertools.product(*options)]
    return "\n".join(out)


def undrawn(patterns, text: str, strip: str = "") -> list[str]:
    """The patterns a doc does not draw: neither the whole pattern nor its folder and its file name appear."""
    missing = []
    for pattern in sorted(patterns):
        path = _normal(pattern.removeprefix(strip))
        folder, _, file = path.rpartition("/")
        if path not in text and not (f"{folder}/" in text and re.search(rf"(^|[\s/`,]){re.escape(file)}\b", text,
                                                                          re.M)):
            missing.append(pattern)
    return missing


def test_the_readme_dag_draws_every_artifact(root):
    readme = (root / "README.md").read_text()
    dag = readme.split("## The DAG", 1)[1].split("```")[1]
    assert not undrawn(artifact_patterns(), drawn(dag)), "specfit.planning.paths patterns missing from the README's DAG"


def test_data_readme_lists_every_artifact_under_data(root):
    under_data = {p for p in artifact_patterns() if p.startswith("data/")}
    missing = undrawn(under_data, drawn((root / "data" / "README.md").read_text()), strip="data/")
    assert not missing, "specfit.planning.paths patterns missing from data/README.md"


def test_gitignore_covers_every_output_and_not_the_shipped_toy(root):
    if shutil.which("git") is None or not (root / ".git").exists():
        pytest.skip("needs git and the checkout's .git")
    shipped = paths.toy_dir(paths.SHIPPED_TOY)
    outputs = sorted({re.sub(r"\{\w+\}", "x", p) for p in artifact_patterns() if not p.startswith(shipped + "/")})
    kept = [paths.SHIPPED_MANIFEST,
            *(f"{paths.toy_model(paths.SHIPPED_TOY, part)}/model.safetensors" for part in PARTS)]
    asked = [*outputs, *(f"{p}/f" for p in outputs), *kept]  # a folder's pattern ignores what it holds
    check = subprocess.run(["git", "check-ignore", "--no-index", "--stdin"], cwd=root, input="\n".join(asked),
                           capture_output=True, text=True)
    ignored = set(check.stdout.split())
    assert not [p for p in outputs if p not in ignored and f"{p}/f" not in ignored], "outputs .gitignore lets through"
    assert not [p for p in kept if p in ignored], "shipped toy files .gitignore hides"


def test_every_package_opens_with_one_paragraph(root):
    """Each package folder of src/specfit says what it holds in its __init__.py's docstring, one paragraph."""
    src = root / "src"
    docs = {p.parent.relative_to(src).as_posix(): ast.get_docstring(ast.parse(p.read_text()))
            for p in sorted((src / "specfit").rglob("__init__.py"))}
    assert not [name for name, doc in docs.items() if not doc or "\n\n" in doc.strip()]
