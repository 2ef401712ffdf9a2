"""Stage tune_choice: one slot count's part of a tune job's sweep (`specfit.stages.tune`), the file a tuned method's
decode and the report read (`specfit.speculative.tuning.choice`).

spec: {"slots": the slot count}
inputs: grid (the tune job's JSON)
outputs: tune (JSON: the chosen tree, every tree's row, how they were clocked, the questions, the clock)
"""

from __future__ import annotations

import logging

from specfit.io import read_json, write_json
from specfit.planning.stage import stage_main
from specfit.speculative.tuning import choice, tree_label

log = logging.getLogger("specfit.stages.tune_choice")


def run(spec: dict, inputs: dict, outputs: dict) -> None:
    part = choice(read_json(inputs["grid"]), int(spec["slots"]))
    write_json(part, outputs["tune"])
    log.info("slots %s: %s, %s", spec["slots"], tree_label(part["chosen"]), part["clocked"])


main = stage_main(run)

if __name__ == "__main__":
    main()
