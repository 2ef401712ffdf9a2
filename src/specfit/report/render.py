"""The page on disk: the provenance block, the HTML page and its Markdown twin rendered from the Jinja2 templates
(templates/report.html.j2, templates/report.md.j2), and every table once more as data (tables.json: each by its id,
each row by its key, the cells as printed), which `specfit.bench.verdicts` compares between two runs.
"""

import dataclasses
import datetime
import hashlib
import importlib.metadata
import json
from pathlib import Path

import jinja2

from specfit.planning.specs import spec_json
from specfit.provenance import git_dirty, git_head

VERSIONS = ("specfit", "torch", "transformers", "snakemake", "numpy")
TEMPLATES = {"index.html": "report.html.j2", "report.md": "report.md.j2"}  # output file -> template


def config_hash(spec: dict) -> str:
    return hashlib.sha256(spec_json(spec).encode()).hexdigest()


def git_commit(folder: str | Path = ".") -> str:
    """HEAD of the git tree ``folder`` lies in (the working directory: the workflow root), marked when dirty."""
    head = git_head(folder)
    if head is None:
        return "unknown"
    return f"{head} (dirty tree)" if git_dirty(folder) else head


def versions() -> dict[str, str]:
    out = {}
    for name in VERSIONS:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def trained(record: dict) -> str:
    """A toy part's training record (training.json, acceptance.json) as provenance: the weights' sha256 and what
    computed them (`specfit.numerics.described`), which two machines compare first when their verdicts differ."""
    n = record.get("numerics") or {}
    how = ", ".join(f"{k} {n[k]}" for k in ("torch_cpu_capability", "MKL_CBWR") if n.get(k))
    return f"sha256 {record['sha256']}; trained on {n.get('cpu', 'an unrecorded CPU')}" + (f" ({how})" if how else "")


def shipped_by(manifest: dict) -> str:
    """The shipped toy's manifest (SHIPPED.json) as provenance: the commit and the CPU that trained each part, the
    parts trained alike named together."""
    commits, cpus = manifest["commit"], manifest["cpu"]  # by part (specfit.toy.ship)
    alike: dict[str, list[str]] = {}
    for part in sorted(commits):
        cpu = cpus[part]
        flags = ", ".join(cpu.get("flags") or [])
        how = (f"trained at commit {commits[part]} on {cpu.get('model_name') or 'an unrecorded CPU'}"
               + (f" ({flags})" if flags else ""))
        alike.setdefault(how, []).append(part)
    if len(alike) == 1:
        return next(iter(alike))
    return "; ".join(f"{' and '.join(names)} {how}" for how, names in alike.items())


def provenance(spec: dict, toy: dict[tuple[str, str], dict], shipped: dict[str, dict]) -> list[tuple[str, str]]:
    """The page's provenance block; ``toy``: (model, part) -> the toy part's training record (`Inputs.toy`);
    ``shipped``: model -> the shipped toy's manifest (`Inputs.shipped`)."""
    rows = [("Config hash (sha256 of the spec, sorted keys)", config_hash(spec)), ("Git commit", git_commit())]
    rows += [(f"Shipped toy (models.{model})", shipped_by(manifest)) for model, manifest in shipped.items()]
    rows += [(f"Weights of {model} {part}", trained(record)) for (model, part), record in toy.items()]
    rows += [(f"{name} version", v) for name, v in versions().items()]
    rows += [(f"Device {d}", d_spec.get("label") or d) for d, d_spec in spec["devices"].items()]
    rows += [(f"Workload {w}", w_spec.get("subset_label") or "full workload")
             for w, w_spec in spec["workloads"].items()]
    rows.append(("Seed", str(spec.get("seed", 0))))
    rows.append(("Date (UTC)", datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")))
    return rows


def md_cell(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def key_text(key) -> str:
    """A row's key as text: a run's (or any dataclass's) fields, a tuple's items, joined by "/"."""
    if dataclasses.is_dataclass(key):
        return "/".join(key_text(getattr(key, f.name)) for f in dataclasses.fields(key))
    if isinstance(key, tuple):
        return "/".join(key_text(k) for k in key)
    return str(key)


def tables_data(parts) -> list[dict]:
    """Every table of the page (`specfit.report.page.Part`), in order: its id, where it stands, its header, and each
    row's key with its cells as printed (a table without keys: the row's number, "#0", "#1", ...)."""
    return [{"id": t.id, "part": part.title, "section": section.title, "caption": t.caption, "header": t.header,
             "rows": [{"key": key_text(k), "cells": row}
                      for k, row in zip(t.keys or [f"#{n}" for n in range(len(t.rows))], t.rows, strict=True)]}
            for part in parts for section in part.sections for t in section.tables]


def render(context: dict, folder: Path) -> None:
    env = jinja2.Environment(loader=jinja2.PackageLoader("specfit.report", "templates"),
                             autoescape=lambda name: bool(name and name.endswith(".html.j2")),
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters["md"] = md_cell
    for name, template in TEMPLATES.items():
        (folder / name).write_text(env.get_template(template).render(**context))
    (folder / "tables.json").write_text(json.dumps({"tables": tables_data(context["parts"])}, indent=1) + "\n")
