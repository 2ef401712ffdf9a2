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
    """The configured question.jsonl; missing, it is fetched from the pinned commit as the workflow would."""
    from specfit.extract import fetch
    from specfit.stage import SpecFitError
    from specfit.workflow import validate_config

    config = validate_config(yaml.safe_load((ROOT / "config.yaml").read_text()),
                             ROOT / "workflow/schemas/config.schema.yaml")
    source = config["spec_bench"]
    path = ROOT / source["path"]
    if not path.is_file():
        try:
            fetch({"url": source["url"], "sha256": source["sha256"]}, {}, {"questions": path})
        except SpecFitError as err:
            pytest.fail(str(err))
    return path
