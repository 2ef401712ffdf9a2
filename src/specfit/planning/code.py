"""The code hash a rule carries as a param, so that an edit to the code a stage runs reruns its jobs, and only
then: the stage module's `specfit` imports, transitively, with the package data they read.
"""

from __future__ import annotations

import ast
import hashlib
from pathlib import Path

from specfit.speculative.kinds import BUILTIN

PACKAGE_DIR = Path(__file__).resolve().parent.parent


def _module_file(module: str) -> Path | None:
    parts = module.split(".")[1:]
    base = PACKAGE_DIR.joinpath(*parts)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _specfit_imports(path: Path, module: str) -> set[str]:
    """The ``specfit`` modules ``module`` imports when it runs: its imports outside ``if TYPE_CHECKING:`` blocks,
    and the packages above each of them (Python runs a package's ``__init__`` before its submodules)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    todo = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            todo.extend(node.orelse)  # type-only imports change no behaviour
            continue
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)
        todo.extend(ast.iter_child_nodes(node))
    parents = {".".join(m.split(".")[:i]) for m in found for i in range(1, m.count(".") + 1)}
    return {m for m in found | parents | {package} if m == "specfit" or m.startswith("specfit.")}


# Package data a module reads at run time: an edit to it reruns the rules that run the module.
MODULE_DATA = {
    "specfit.report.render": ("report/templates/report.html.j2", "report/templates/report.md.j2"),
    "specfit.report.page": ("report/templates/notes.j2",),
    "specfit.selection.coefficients": ("data/paper_coefficients.yaml",),
    "specfit.paper": ("data/paper_results.yaml",),
}


# Modules a module imports by name at run time: `build_method` imports the class of each built-in method kind.
RUNTIME_IMPORTS = {"specfit.speculative.methods": tuple(sorted({k.impl.partition(":")[0] for k in BUILTIN}))}


# Left out of every closure: the planning package decides which files and which spec a job gets, and Snakemake tracks
# those (inputs, outputs, params); what the job computes with them is the code of its stage and the libraries it runs.
PLANNING = "specfit.planning"


def code_closure(module: str) -> dict[str, Path]:
    """Every ``specfit`` module that runs when ``module`` runs, by name: its imports, transitively, outside
    ``if TYPE_CHECKING:`` blocks and those it imports by name (`RUNTIME_IMPORTS`), with the packages above them, the
    planning package (`PLANNING`) left out."""
    seen: dict[str, Path] = {}
    todo = [module]
    while todo:
        name = todo.pop()
        if name in seen or name == PLANNING or name.startswith(PLANNING + "."):
            continue
        path = _module_file(name)
        if path is None:
            continue
        seen[name] = path
        todo.extend(_specfit_imports(path, name))
        todo.extend(RUNTIME_IMPORTS.get(name, ()))
    return seen


def code_hash(module: str) -> str:
    """Hash of a stage module's `code_closure` with the package data those modules read (`MODULE_DATA`).

    Snakemake does not see edits to modules run with ``python -m``; a rule that carries this as a param
    reruns when its own code changes, and only then (not on every edit to the package). Methods imported
    from outside the package (``kind: "module:name"``) are not followed.
    """
    seen = code_closure(module)
    digest = hashlib.sha256()
    for name in sorted(seen):
        digest.update(name.encode() + b"\0" + seen[name].read_bytes() + b"\0")
        for data in MODULE_DATA.get(name, ()):
            digest.update(data.encode() + b"\0" + (PACKAGE_DIR / data).read_bytes() + b"\0")
    return digest.hexdigest()[:16]
