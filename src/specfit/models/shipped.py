"""The toy shipped in the repository: its manifest, written once when it is shipped and checked whenever it loads.

The manifest (``SHIPPED.json``, `specfit.planning.paths.SHIPPED_MANIFEST`) lies beside the part folders it describes
(``tokenizer/``, ``target/``, ``drafter/``) and records the sha256 of every file in them by its path relative to the
manifest's folder, with what trained them (commit, CPU, the specs the toy rules got; `specfit.toy.ship` writes it).
Loading any part of the toy checks every file (`verify`): a changed, missing or extra file stops the stage, naming
the file, before any weight is read. Torch-free; a process hashes the files once, and again only when a file's size
or modification time changes.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path, PurePath

from specfit.errors import SpecFitError
from specfit.planning import paths

MANIFEST = PurePath(paths.SHIPPED_MANIFEST).name  # found beside the part folders it describes
SKIPPED = (".snakemake_timestamp",)  # Snakemake's marker in a directory output: not part of a model
PREFIX = 12  # hex digits of a sha256 an error message shows
_VERIFIED: set[tuple] = set()  # the file stamps `verify` found matching their manifest in this process


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def part_files(folder: Path, parts) -> list[str]:
    """Every file under ``folder``'s ``parts`` (sub-folders included), by its POSIX path relative to ``folder``,
    sorted; Snakemake's markers left out (`SKIPPED`)."""
    return sorted(p.relative_to(folder).as_posix() for part in parts for p in (folder / part).rglob("*")
                  if p.is_file() and p.name not in SKIPPED)


def write_manifest(folder: str | os.PathLike, parts, **provenance) -> dict:
    """Write ``folder``/SHIPPED.json: ``provenance`` (commit, CPU, specs, records) and ``files``, the sha256 of every
    file of ``parts`` by its path relative to ``folder``; return it."""
    folder = Path(folder)
    manifest = {**provenance, "files": {name: sha256(folder / name) for name in part_files(folder, parts)}}
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return manifest


def by_part(value, parts) -> dict:
    """A manifest's provenance entry (``commit``, ``cpu``, ``specs``, ``numerics``) by part: as written, or one value
    for every part where a manifest records one for the whole toy (a toy shipped in one go before parts were)."""
    if isinstance(value, dict) and set(value) <= set(parts) and value:
        return value
    return {part: value for part in parts}


def read_manifest(path: str | os.PathLike) -> dict:
    path = Path(path)
    try:
        manifest = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise SpecFitError(f"the shipped toy's manifest {path} cannot be read ({err}): "
                           f"{restore(path.parent)}") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
        raise SpecFitError(f"{path} is no shipped toy's manifest (no `files`): {restore(path.parent)}")
    return manifest


def manifest_parts(manifest: dict) -> list[str]:
    """The part folders a manifest describes: the first component of its files' paths."""
    return sorted({name.split("/", 1)[0] for name in manifest["files"]})


def restore(folder: Path) -> str:
    return (f"restore the shipped files with `git checkout -- {folder}` (and remove files the manifest does not list), "
            "or retrain under another model name and ship that: `snakemake --cores 1 data/models/<name>/drafter "
            "--configfile <name>.yaml` then `python -m specfit.toy.ship --from data/models/<name> --configfile "
            "<name>.yaml` (docs/toy.md, \"The shipped toy\")")


def verify(path: str | os.PathLike, key: str) -> None:
    """Check a shipped toy's files when ``path``, a folder about to be loaded, is one of its parts (a manifest lies
    beside it and lists it); nothing for any other folder. Every file of every part must have its manifest's
    sha256 and no file may be unlisted, else `SpecFitError` names each such file, the expected and actual sha256
    and the command that restores them. ``key``: the config key that named ``path`` (``models.toy.target``)."""
    path = Path(path)
    manifest_path = path.parent / MANIFEST
    if not manifest_path.is_file():
        return
    manifest = read_manifest(manifest_path)
    parts = manifest_parts(manifest)
    if path.name not in parts:
        return
    folder = path.parent
    present = part_files(folder, parts)
    # a stage checks the target and the drafter, then loads each (four calls): the files hashed once per process, and
    # again when any file's size or modification time changed since
    stamp = (str(manifest_path.resolve()), manifest_path.stat().st_mtime_ns,
             tuple((name, (st := (folder / name).stat()).st_size, st.st_mtime_ns) for name in present))
    if stamp in _VERIFIED:
        return
    expected = manifest["files"]
    problems = []
    for name in sorted(set(expected) | set(present)):
        if name not in present:
            problems.append(f"{folder / name}: missing (the manifest's sha256 {expected[name][:PREFIX]}…)")
        elif name not in expected:
            problems.append(f"{folder / name}: not in the manifest")
        elif (actual := sha256(folder / name)) != expected[name]:
            problems.append(f"{folder / name}: sha256 {actual[:PREFIX]}…, the manifest's {expected[name][:PREFIX]}…")
    if problems:
        raise SpecFitError(f"the shipped toy at {folder} (loaded as `{key}`) is not the one its manifest "
                           f"{manifest_path} lists:\n  " + "\n  ".join(problems) + f"\n{restore(folder)}")
    _VERIFIED.add(stamp)
