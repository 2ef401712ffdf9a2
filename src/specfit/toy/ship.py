"""Ship a toy the workflow trained: copy its tokenizer, target and drafter folders, unchanged, into the toy that the
repository ships (``data/models/toy/``, `specfit.planning.paths.SHIPPED_TOY`) and write their manifest
(`specfit.models.shipped`): the sha256 of every file, the commit and the CPU that trained them, the spec each toy
rule passed its stage, and where the training records lie. From the workflow root, on the machine that trained it
and at the commit that trained it (docs/toy.md, "The shipped toy")::

    snakemake --cores 1 data/models/mytoy/drafter --configfile mytoy.yaml    # models.mytoy: {toy: true, ...}
    python -m specfit.toy.ship --from data/models/mytoy --configfile mytoy.yaml

The CPU is this machine's (/proc/cpuinfo), and must be the one the training records name; the commit is the
checkout's HEAD unless ``--commit`` names it. The config (config.yaml with ``--configfile`` overlays, as Snakemake
merges them) must be the one the toy trained with: the specs are rebuilt from it (`specfit.planning.specs.toy`), and
step and thread counts that differ from the training records' are refused.

``--parts drafter`` ships a drafter trained on the shipped target (its toy's tokenizer and target folders copies of
the shipped ones, checked file by file against the manifest): the other parts stay, with the commit, CPU and spec
that trained them, and the manifest records each part's own (``commit``, ``cpu`` and ``specs`` by part).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from specfit import numerics
from specfit.errors import SpecFitError
from specfit.io import read_json
from specfit.models.shipped import MANIFEST, SKIPPED, by_part, part_files, read_manifest, sha256, write_manifest
from specfit.planning import paths, specs
from specfit.planning.config import SCHEMA, load_config
from specfit.provenance import git_head
from specfit.toy.spec import PARTS

# the /proc/cpuinfo flags that choose torch's, MKL's and oneDNN's kernels (specfit.numerics): with the model name,
# what to compare first when another machine trains other weights
CPU_FLAGS = ("avx", "avx2", "fma", "f16c", "avx512f", "avx512dq", "avx512bw", "avx512vl", "avx512_vnni",
             "avx512_bf16", "amx_tile", "amx_bf16")


def this_cpu() -> dict:
    """This machine's CPU: its model name and which of `CPU_FLAGS` it has."""
    flags = set((numerics.cpuinfo("flags") or "").split())
    return {"model_name": numerics.cpu_name(),
            "flags": [f for f in CPU_FLAGS if f in flags]}


def head_commit() -> str:
    head = git_head()
    if head is None:
        raise SpecFitError("no git commit here to record (`git rev-parse HEAD` failed): give --commit")
    return head


def training_records(source: Path) -> dict[str, dict]:
    """Each trained part's record (training.json, acceptance.json), after checking the three folders are there."""
    for part in PARTS:
        if not (source / part).is_dir():
            raise SpecFitError(f"no {part} folder in {source}: --from names a trained toy's folder "
                               f"({paths.toy_model('<model>', '{' + ','.join(PARTS) + '}')})")
    records = {}
    for part, name in paths.TOY_RECORDS.items():
        path = source / part / name
        if not path.is_file():
            raise SpecFitError(f"no training record {path}: {source} is not a toy the workflow's rules trained")
        records[part] = read_json(path)
    return records


def kept_provenance(source: Path, dest: Path, kept: list[str]) -> dict:
    """The shipped manifest's provenance of the ``kept`` parts, after checking that ``source`` holds those parts
    unchanged (a drafter shipped alone must have trained on the shipped target)."""
    if not (dest / MANIFEST).is_file():
        raise SpecFitError(f"no manifest {dest / MANIFEST} to keep {', '.join(kept)} from: ship every part")
    manifest = read_manifest(dest / MANIFEST)
    theirs = {name: digest for name, digest in manifest["files"].items() if name.split("/", 1)[0] in kept}
    ours = {name: sha256(source / name) for name in part_files(source, kept)}
    if differ := sorted(name for name in set(theirs) | set(ours) if theirs.get(name) != ours.get(name)):
        raise SpecFitError(f"{source} has other {', '.join(kept)} files than the shipped toy ({', '.join(differ)}): "
                           "a part shipped alone must have trained on the shipped toy's other parts (copy them "
                           f"from {dest} before training)")
    return {key: {part: value for part, value in by_part(manifest[key], PARTS).items() if part in kept}
            for key in ("commit", "cpu", "specs", "numerics") if key in manifest}


def check_trained_as(records: dict[str, dict], toy_specs: dict[str, dict], cpu: dict) -> None:
    """The records must say what the config says (steps, threads) and name this machine's CPU."""
    for part, record in records.items():
        for key, spec_key in (("steps", "steps"), ("threads", "threads")):
            if record.get(key) != toy_specs[part][spec_key]:
                raise SpecFitError(
                    f"the {part} trained with {key} = {record.get(key)}, and the config gives "
                    f"{toy_specs[part][spec_key]} (toy.{part}.{spec_key}, train_threads): give the config it trained "
                    "with (--configfile)")
        trained_on = (record.get("numerics") or {}).get("cpu")
        if trained_on != cpu["model_name"]:
            raise SpecFitError(f"the {part} trained on {trained_on!r}, and this machine is {cpu['model_name']!r}: ship "
                               "a toy on the machine that trained it, which the manifest names")


def ship(source: str | Path, dest: str | Path, config: dict, commit: str, cpu: dict | None = None,
         parts=PARTS) -> dict:
    """Copy ``source``'s ``parts`` folders onto ``dest``'s, unchanged (Snakemake's markers left out), and write
    ``dest``'s manifest; return it. ``config``: the validated workflow config the toy trained with. Parts left out
    must be in ``source`` as they are shipped (`kept_provenance`), and keep their provenance."""
    source, dest = Path(source), Path(dest)
    if source.resolve() == dest.resolve():
        raise SpecFitError(f"--from and --to are the same folder ({dest}): train the toy under another model name")
    cpu = this_cpu() if cpu is None else cpu
    records = training_records(source)
    kept = [part for part in PARTS if part not in parts]
    kept_from = kept_provenance(source, dest, kept) if kept else {}
    toy_specs = {part: specs.toy(config, part) for part in PARTS}
    check_trained_as({part: record for part, record in records.items() if part in parts}, toy_specs, cpu)
    dest.mkdir(parents=True, exist_ok=True)
    for part in parts:
        shutil.rmtree(dest / part, ignore_errors=True)
        shutil.copytree(source / part, dest / part, ignore=shutil.ignore_patterns(*SKIPPED))
    provenance = {"commit": {part: commit for part in parts}, "cpu": {part: cpu for part in parts},
                  "specs": {part: toy_specs[part] for part in parts},
                  "numerics": {part: records[part].get("numerics") for part in parts if part in records}}
    for key, value in kept_from.items():
        provenance[key] |= value
    return write_manifest(dest, PARTS, **{key: dict(sorted(value.items())) for key, value in provenance.items()},
                          records={part: f"{part}/{name}" for part, name in paths.TOY_RECORDS.items()})


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--from", dest="source", required=True, metavar="DIR",
                        help="the trained toy's folder, holding tokenizer/, target/ and drafter/ (data/models/<model>)")
    parser.add_argument("--to", dest="dest", default=paths.toy_dir(paths.SHIPPED_TOY), metavar="DIR",
                        help="the shipped toy's folder (default: %(default)s)")
    parser.add_argument("--config", default="config.yaml", help="the workflow's config, in the workflow root")
    parser.add_argument("--configfile", nargs="*", default=[], metavar="FILE",
                        help="config files merged over it, as Snakemake's --configfile: as the toy trained")
    parser.add_argument("--commit", help="the commit that trained the toy (default: the checkout's HEAD)")
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS),
                        help="the parts to ship (default: all); the others must be the shipped ones, and stay")
    args = parser.parse_args(argv)
    try:
        # the shipped toy's own manifest is what this writes: the config's files are not checked
        config = load_config(args.config, Path(args.config).parent / SCHEMA, *args.configfile, check_files=False)
        manifest = ship(args.source, args.dest, config, args.commit or head_commit(), parts=args.parts)
    except SpecFitError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    dest = Path(args.dest)
    for part in PARTS:
        size = sum((dest / name).stat().st_size for name in manifest["files"] if name.startswith(f"{part}/"))
        print(f"{dest / part}: {size / 1e6:.1f} MB")
    for part in args.parts:
        print(f"{dest / MANIFEST}: {part} trained at commit {manifest['commit'][part]} on "
              f"{manifest['cpu'][part]['model_name']}")
    print(f"{dest / MANIFEST}: {len(manifest['files'])} files")


if __name__ == "__main__":
    main()
