"""Every third-party module the package imports, at the top or inside a function, is a declared dependency:
README command 1 installs only those."""

import ast
import re
import sys

try:
    import tomllib  # Python 3.11 and later
except ModuleNotFoundError:  # Python 3.10, the package's floor (requires-python): `dependencies_array` reads it
    tomllib = None

DISTRIBUTION = {"yaml": "pyyaml"}  # import name -> distribution name, where they differ


def dependencies_array(pyproject: str) -> list[str]:
    """``[project]``'s ``dependencies`` without a TOML library: an array of quoted strings reads as a Python list."""
    array = re.search(r"^\[project\]$.*?^dependencies = (\[.*?^\])", pyproject, re.M | re.S)
    return ast.literal_eval(array.group(1))


def dependencies(pyproject: str) -> list[str]:
    return dependencies_array(pyproject) if tomllib is None else tomllib.loads(pyproject)["project"]["dependencies"]


def test_the_reader_without_tomllib_agrees_with_it(root):
    pyproject = (root / "pyproject.toml").read_text()
    assert dependencies_array(pyproject) == dependencies(pyproject)
    assert dependencies_array(pyproject)[0].startswith("torch")


def test_every_imported_package_is_declared(root):
    declared = {re.split(r"[<>=!~\[ ;]", d, maxsplit=1)[0].lower().replace("-", "_")
                for d in dependencies((root / "pyproject.toml").read_text())}
    imported = set()
    for path in (root / "src" / "specfit").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                imported.add(node.module.split(".")[0])
    third_party = {m for m in imported if m not in sys.stdlib_module_names and m not in ("specfit", "__future__")}
    missing = {m for m in third_party if DISTRIBUTION.get(m, m).lower() not in declared}
    assert not missing, f"imported but not in pyproject.toml's dependencies: {sorted(missing)}"
