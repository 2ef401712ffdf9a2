"""Shared fixtures: the repository root and Spec-Bench's question.jsonl where the config expects it."""

from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT


@pytest.fixture(scope="session")
def questions_path() -> Path:
    path = ROOT / yaml.safe_load((ROOT / "config.yaml").read_text())["spec_bench"]["path"]
    if not path.is_file():
        pytest.fail(f"Spec-Bench's question.jsonl is expected at {path} (see README: place it there first)")
    return path
