"""Every third-party module the package imports, at the top or inside a function, is a declared dependency:
README command 1 installs only those."""

import ast
import re
import sys

import tomllib

DISTRIBUTION = {"yaml": "pyyaml"}  # import name -> distribution name, where they differ


def test_every_imported_package_is_declared(root):
    declared = {re.split(r"[<>=!~\[ ;]", d, maxsplit=1)[0].lower().replace("-", "_")
                for d in tomllib.loads((root / "pyproject.toml").read_text())["project"]["dependencies"]}
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
