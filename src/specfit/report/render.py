"""The page on disk: the provenance block, and the HTML page and its Markdown twin rendered from the Jinja2 templates
(templates/report.html.j2, templates/report.md.j2).
"""

import datetime
import hashlib
import importlib.metadata
import subprocess
from pathlib import Path

import jinja2

from specfit.workflow import spec_json

VERSIONS = ("specfit", "torch", "transformers", "snakemake", "numpy")
TEMPLATES = {"index.html": "report.html.j2", "report.md": "report.md.j2"}  # output file -> template


def config_hash(spec: dict) -> str:
    return hashlib.sha256(spec_json(spec).encode()).hexdigest()


def git_commit(folder: str | Path = ".") -> str:
    """HEAD of the git tree ``folder`` lies in (the working directory: the workflow root), marked when dirty."""
    try:
        head = subprocess.run(["git", "-C", str(folder), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(folder), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return f"{head} (dirty tree)" if dirty else head


def versions() -> dict[str, str]:
    out = {}
    for name in VERSIONS:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def provenance(spec: dict) -> list[tuple[str, str]]:
    rows = [("Config hash (sha256 of the spec, sorted keys)", config_hash(spec)), ("Git commit", git_commit())]
    rows += [(f"{name} version", v) for name, v in versions().items()]
    rows += [(f"Device {d}", d_spec.get("label") or d) for d, d_spec in spec["devices"].items()]
    rows += [(f"Workload {w}", w_spec.get("subset_label") or "full workload")
             for w, w_spec in spec["workloads"].items()]
    rows.append(("Seed", str(spec.get("seed", 0))))
    rows.append(("Date (UTC)", datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")))
    return rows


def md_cell(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def render(context: dict, folder: Path) -> None:
    env = jinja2.Environment(loader=jinja2.PackageLoader("specfit", "templates"),
                             autoescape=lambda name: bool(name and name.endswith(".html.j2")),
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters["md"] = md_cell
    for name, template in TEMPLATES.items():
        (folder / name).write_text(env.get_template(template).render(**context))
