"""The shipped toy's manifest: written over the part folders, read back, and checked whenever a part loads."""

import hashlib
import json
import shutil

import pytest

from specfit.errors import SpecFitError
from specfit.models import check_checkpoints
from specfit.models.shipped import MANIFEST, manifest_parts, read_manifest, verify, write_manifest
from specfit.planning import paths

PARTS = ("tokenizer", "target", "drafter")
FILES = {"tokenizer/tokenizer.json": b'{"model": {}}', "target/config.json": b'{"num_experts": 4}',
         "target/model.safetensors": bytes(range(256)) * 40, "target/training.json": b'{"sha256": "ab"}',
         "drafter/model.safetensors": b"\x00\x01" * 300, "drafter/nested/extra.txt": b"a file in a sub-folder"}


def fake_toy(folder):
    """Three part folders of made-up files, with Snakemake's marker beside them."""
    for name, data in FILES.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    (folder / "target/.snakemake_timestamp").write_bytes(b"")
    return folder


def test_manifest_round_trip(tmp_path):
    """Every file's sha256 by its path relative to the manifest's folder, the provenance as given, read back."""
    toy = fake_toy(tmp_path / "toy")
    written = write_manifest(toy, PARTS, commit="c0ffee", cpu={"model_name": "a test CPU", "flags": ["avx2"]},
                             records={"target": "target/training.json"})
    assert json.loads((toy / MANIFEST).read_text()) == written == read_manifest(toy / MANIFEST)
    assert written["files"] == {name: hashlib.sha256(data).hexdigest() for name, data in FILES.items()}
    assert (written["commit"], written["cpu"]["model_name"]) == ("c0ffee", "a test CPU")
    assert manifest_parts(written) == ["drafter", "target", "tokenizer"]
    for part in PARTS:
        verify(toy / part, f"models.toy.{part}")
    assert MANIFEST == "SHIPPED.json" and paths.SHIPPED_MANIFEST == "data/models/toy/SHIPPED.json"


@pytest.mark.parametrize("tamper, named", [
    (lambda toy: (toy / "target/model.safetensors").write_bytes(b"other weights"), "target/model.safetensors: sha256"),
    (lambda toy: (toy / "tokenizer/tokenizer.json").unlink(), "tokenizer/tokenizer.json: missing"),
    (lambda toy: (toy / "drafter/model-00002.safetensors").write_bytes(b"x"), "drafter/model-00002.safetensors: not "
                                                                              "in the manifest"),
])
def test_a_changed_missing_or_extra_file_is_refused_naming_it(tmp_path, tamper, named):
    """Loading any part checks every part's files: the message names the file, both sha256 and the way back."""
    toy = fake_toy(tmp_path / "toy")
    manifest = write_manifest(toy, PARTS)
    tamper(toy)
    with pytest.raises(SpecFitError) as err:
        verify(toy / "drafter", "models.toy.drafter")
    message = str(err.value)
    assert named in message and "`models.toy.drafter`" in message
    assert f"git checkout -- {toy}" in message and "another model name" in message
    assert "`snakemake --cores 1 data/models/<name>/drafter --configfile <name>.yaml`" in message  # retrains
    assert "`python -m specfit.toy.ship --from data/models/<name>" in message
    if "sha256" in named:
        actual = hashlib.sha256(b"other weights").hexdigest()
        expected = manifest["files"]["target/model.safetensors"]
        assert f"sha256 {actual[:12]}…, the manifest's {expected[:12]}…" in message


def test_the_files_are_hashed_once_until_one_changes(tmp_path, monkeypatch):
    """A stage checks and loads target and drafter (four calls): the files are hashed on the first; a file written
    since (a new size or modification time) is hashed again and refused."""
    from specfit.models import shipped

    toy = fake_toy(tmp_path / "toy")
    write_manifest(toy, PARTS)
    hashed = []
    monkeypatch.setattr(shipped, "sha256", lambda path, real=shipped.sha256: hashed.append(path) or real(path))
    for part in ("target", "drafter", "target", "drafter"):
        verify(toy / part, f"models.toy.{part}")
    assert len(hashed) == len(FILES)  # every file once
    (toy / "target/model.safetensors").write_bytes(b"other weights")
    with pytest.raises(SpecFitError, match="target/model.safetensors: sha256"):
        verify(toy / "target", "models.toy.target")


def test_folders_without_a_manifest_are_not_checked(tmp_path):
    """A trained toy (no manifest beside it) and a folder the manifest does not describe load as they are."""
    toy = fake_toy(tmp_path / "toy")
    verify(toy / "target", "models.mytoy.target")
    write_manifest(toy, ("target",))
    (toy / "drafter/model.safetensors").write_bytes(b"changed")
    verify(toy / "drafter", "models.toy.drafter")
    with pytest.raises(SpecFitError, match="cannot be read"):
        (toy / MANIFEST).write_text("{")
        verify(toy / "target", "models.toy.target")


def test_the_load_path_checks_the_manifest_before_any_weight(files, tmp_path):
    """check_checkpoints, which every stage runs before loading (and load_target / load_drafter run again), refuses a
    shipped pair whose drafter weights changed."""
    for part in ("target", "drafter"):
        shutil.copytree(files[part], tmp_path / part)
    write_manifest(tmp_path, ("target", "drafter"))
    check_checkpoints(tmp_path / "target", tmp_path / "drafter", "toy")
    weights = tmp_path / "drafter/model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1] + b"\x7f")
    with pytest.raises(SpecFitError, match=r"drafter/model\.safetensors: sha256 [0-9a-f]{12}…, the manifest's"):
        check_checkpoints(tmp_path / "target", tmp_path / "drafter", "toy")
