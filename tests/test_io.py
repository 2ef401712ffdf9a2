"""Atomic outputs: a failed writer leaves nothing Snakemake could take as a finished output."""

import json

import pytest

from specfit.io import atomic_path, write_json


def test_file_appears_only_when_complete(tmp_path):
    target = tmp_path / "out" / "metrics.json"
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            tmp.write_text("half")
            raise RuntimeError("killed")
    assert not target.exists() and list(target.parent.iterdir()) == []
    write_json({"b": 1}, target)
    assert json.loads(target.read_text()) == {"b": 1}
    assert [p.name for p in target.parent.iterdir()] == ["metrics.json"]


def test_directory_is_replaced_whole(tmp_path):
    target = tmp_path / "model"
    with atomic_path(target, directory=True) as tmp:
        (tmp / "config.json").write_text("{}")
    with pytest.raises(RuntimeError):
        with atomic_path(target, directory=True) as tmp:
            (tmp / "other.json").write_text("{}")
            raise RuntimeError("killed")
    assert [p.name for p in tmp_path.iterdir()] == ["model"]
    assert [p.name for p in target.iterdir()] == ["config.json"]
