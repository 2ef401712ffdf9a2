"""Shipping a trained toy: its folders copied unchanged, its manifest written with what trained it."""

import hashlib
import json

import pytest

from specfit.models.shipped import MANIFEST, verify
from specfit.planning import paths, specs
from specfit.planning.config import SCHEMA, load_config
from specfit.toy import ship
from specfit.toy.spec import PARTS


@pytest.fixture()
def trained(tmp_path):
    """A made-up toy as the toy rules leave it (config.yaml's steps and threads, this machine's CPU, Snakemake's
    markers)."""
    numerics = {"cpu": ship.this_cpu()["model_name"], "torch_cpu_capability": "AVX2", "MKL_CBWR": "COMPATIBLE,STRICT"}
    files = {"tokenizer/tokenizer.json": b"{}", "target/model.safetensors": b"target weights",
             "target/training.json": json.dumps({"steps": 600, "threads": 2, "numerics": numerics}).encode(),
             "drafter/model.safetensors": b"drafter weights",
             "drafter/acceptance.json": json.dumps({"steps": 600, "threads": 2, "numerics": numerics}).encode()}
    source = tmp_path / "data/models/mytoy"
    for name, data in files.items():
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        (source / name).write_bytes(data)
    for part in PARTS:
        (source / part / ".snakemake_timestamp").write_bytes(b"")
    return source, files


def test_ship_copies_the_folders_and_writes_the_manifest(root, trained, tmp_path, capsys):
    source, files = trained
    dest = tmp_path / "shipped"
    (dest / "target").mkdir(parents=True)
    (dest / "target/stale.bin").write_bytes(b"an earlier toy's file")
    ship.main(["--from", str(source), "--to", str(dest), "--config", str(root / "config.yaml"), "--commit", "c0ffee"])
    manifest = json.loads((dest / MANIFEST).read_text())
    assert manifest["files"] == {name: hashlib.sha256(data).hexdigest() for name, data in files.items()}
    assert all((dest / name).read_bytes() == data for name, data in files.items())
    assert not (dest / "target/stale.bin").exists() and not list(dest.rglob(".snakemake_timestamp"))
    config = load_config(root / "config.yaml", root / SCHEMA)
    assert manifest["specs"] == {part: specs.toy(config, part) for part in PARTS}
    assert manifest["commit"] == dict.fromkeys(sorted(PARTS), "c0ffee")
    assert manifest["cpu"] == dict.fromkeys(sorted(PARTS), ship.this_cpu())
    assert manifest["records"] == {"target": "target/training.json", "drafter": "drafter/acceptance.json"}
    assert manifest["numerics"]["target"]["MKL_CBWR"] == "COMPATIBLE,STRICT"
    verify(dest / "target", "models.toy.target")
    out = capsys.readouterr().out
    assert f"{dest / 'target'}: 0.0 MB" in out and "5 files" in out and "drafter trained at commit c0ffee" in out
    assert paths.toy_dir(paths.SHIPPED_TOY) == "data/models/toy"


def test_ship_refuses_another_config_or_machine(root, trained, tmp_path, capsys):
    """Records that disagree with the config's steps or name another CPU are refused, and nothing is copied."""
    source, _ = trained
    (tmp_path / "fewer.yaml").write_text("toy: {drafter: {steps: 30}}\n")
    args = ["--from", str(source), "--to", str(tmp_path / "shipped"), "--config", str(root / "config.yaml"),
            "--commit", "c0ffee"]
    with pytest.raises(SystemExit):
        ship.main([*args, "--configfile", str(tmp_path / "fewer.yaml")])
    assert "the drafter trained with steps = 600, and the config gives 30" in capsys.readouterr().err
    record = json.loads((source / "target/training.json").read_text())
    record["numerics"]["cpu"] = "another CPU"
    (source / "target/training.json").write_text(json.dumps(record))
    with pytest.raises(SystemExit):
        ship.main(args)
    assert "the target trained on 'another CPU'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        ship.main([*args[:3], str(source), *args[4:]])
    assert "are the same folder" in capsys.readouterr().err
    assert not (tmp_path / "shipped").exists()


def test_a_drafter_ships_alone_over_the_shipped_target(root, trained, tmp_path, capsys):
    """--parts drafter: the drafter's files and provenance replace the shipped drafter's; the tokenizer and target,
    which it must have trained on (the same files), keep theirs, written by part, from a manifest of the old form."""
    source, files = trained
    dest = tmp_path / "shipped"
    args = ["--from", str(source), "--to", str(dest), "--config", str(root / "config.yaml")]
    ship.main([*args, "--commit", "c0ffee"])
    old = json.loads((dest / MANIFEST).read_text())
    old_cpu = {"model_name": "the target's CPU", "flags": ["avx2"]}
    old |= {"commit": "0ld", "cpu": old_cpu}  # a manifest of a toy shipped in one go, before parts were
    (dest / MANIFEST).write_text(json.dumps(old))
    (source / "drafter/model.safetensors").write_bytes(b"a new drafter")
    ship.main([*args, "--commit", "d4af7e", "--parts", "drafter"])
    manifest = json.loads((dest / MANIFEST).read_text())
    assert (dest / "drafter/model.safetensors").read_bytes() == b"a new drafter"
    assert manifest["files"]["drafter/model.safetensors"] == hashlib.sha256(b"a new drafter").hexdigest()
    assert manifest["files"]["target/model.safetensors"] == old["files"]["target/model.safetensors"]
    assert manifest["commit"] == {"drafter": "d4af7e", "target": "0ld", "tokenizer": "0ld"}
    assert manifest["cpu"] == {"drafter": ship.this_cpu(), "target": old_cpu, "tokenizer": old_cpu}
    assert manifest["specs"]["target"] == old["specs"]["target"]
    verify(dest / "drafter", "models.toy.drafter")
    assert "drafter trained at commit d4af7e" in capsys.readouterr().out
    (source / "target/model.safetensors").write_bytes(b"another target")  # a drafter trained on another target
    with pytest.raises(SystemExit):
        ship.main([*args, "--commit", "d4af7e", "--parts", "drafter"])
    assert "has other tokenizer, target files than the shipped toy (target/model.safetensors)" in \
        capsys.readouterr().err
