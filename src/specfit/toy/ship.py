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
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from specfit import numerics
from specfit.errors import SpecFitError
from specfit.io import read_json
from specfit.models.shipped import MANIFEST, SKIPPED, write_manifest
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


def ship(source: str | Path, dest: str | Path, config: dict, commit: str, cpu: dict | None = None) -> dict:
    """Copy ``source``'s part folders onto ``dest``'s, unchanged (Snakemake's markers left out), and write ``dest``'s
    manifest; return it. ``config``: the validated workflow config the toy trained with."""
    source, dest = Path(source), Path(dest)
    if source.resolve() == dest.resolve():
        raise SpecFitError(f"--from and --to are the same folder ({dest}): train the toy under another model name")
    cpu = this_cpu() if cpu is None else cpu
    toy_specs = {part: specs.toy(config, part) for part in PARTS}
    records = training_records(source)
    check_trained_as(records, toy_specs, cpu)
    dest.mkdir(parents=True, exist_ok=True)
    for part in PARTS:
        shutil.rmtree(dest / part, ignore_errors=True)
        shutil.copytree(source / part, dest / part, ignore=shutil.ignore_patterns(*SKIPPED))
    return write_manifest(dest, PARTS, commit=commit, cpu=cpu, specs=toy_specs,
                          numerics={part: record.get("numerics") for part, record in records.items()},
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
    args = parser.parse_args(argv)
    try:
        # the shipped toy's own manifest is what this writes: the config's files are not checked
        config = load_config(args.config, Path(args.config).parent / SCHEMA, *args.configfile, check_files=False)
        manifest = ship(args.source, args.dest, config, args.commit or head_commit())
    except SpecFitError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    dest = Path(args.dest)
    for part in PARTS:
        size = sum((dest / name).stat().st_size for name in manifest["files"] if name.startswith(f"{part}/"))
        print(f"{dest / part}: {size / 1e6:.1f} MB")
    print(f"{dest / MANIFEST}: {len(manifest['files'])} files, commit {manifest['commit']}, "
          f"trained on {manifest['cpu']['model_name']}")


if __name__ == "__main__":
    main()
