"""Stage spec_bench: Spec-Bench's question.jsonl downloaded from the pinned commit and checked against its sha256;
offline, the error says where to put the file.

spec: {url, sha256}
outputs: {questions: question.jsonl}
"""

from __future__ import annotations

import hashlib
import logging
import urllib.request

from specfit.errors import SpecFitError
from specfit.io import atomic_path
from specfit.planning.stage import stage_main

log = logging.getLogger("specfit.stages.spec_bench")


def run(spec: dict, inputs: dict, outputs: dict) -> None:
    """Download question.jsonl from the pinned commit and check its sha256; else say where to put it."""
    path = outputs["questions"]
    try:
        with urllib.request.urlopen(spec["url"], timeout=30) as response:
            data = response.read()
    except OSError as err:
        raise SpecFitError(
            f"Spec-Bench's question.jsonl is missing at {path} and could not be downloaded ({err}). "
            f"Put the file from {spec['url']} there, or set spec_bench.path in config.yaml to where it lies."
        ) from err
    digest = hashlib.sha256(data).hexdigest()
    if digest != spec["sha256"]:
        raise SpecFitError(f"downloaded question.jsonl has sha256 {digest}, expected {spec['sha256']}")
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
    log.info("downloaded %s (%d bytes, sha256 ok)", path, len(data))


main = stage_main(run)

if __name__ == "__main__":
    main()
