"""`python -m specfit.bench drafter`: a drafter step's CPU time after a pause, beside the device's model."""

import re

import pytest

from specfit.bench.drafter import main, spin, step_times
from specfit.workflow import load_config


class Recording:
    """The drafter, recording the cache length each call sees."""

    def __init__(self, drafter):
        self.drafter, self.fc, self.embed_tokens, self.seen = drafter, drafter.fc, drafter.embed_tokens, []

    def __call__(self, ids, hidden, position_ids, past_key_values):
        self.seen.append(past_key_values.get_seq_length())
        return self.drafter(ids, hidden, position_ids, past_key_values=past_key_values)


def test_every_step_sees_the_same_cache(drafter):
    """Each timed step runs over ``past`` cached positions: the cache is cropped back after every step."""
    recording = Recording(drafter)
    times = step_times(recording, past=16, positions=2, pause_s=1e-4, wait=spin, steps=7)
    assert recording.seen == [0] + [16] * 7  # the prompt's forward, then every timed step
    assert len(times) == 7 and all(t > 0 for t in times)


def test_main_prints_a_row_per_pause_and_way_of_waiting(files, root, capsys):
    main(["--target", str(files["target"]), "--drafter", str(files["drafter"]), "--config", str(root / "config.yaml"),
          "--past", "16", "--steps", "5", "--pause-ms", "0", "1"])
    out = capsys.readouterr().out
    draft_ms = load_config(root / "config.yaml")["devices"]["cpu-a100"]["emulate"]["draft_ms"]
    assert f"modelled drafted level on cpu-a100: {draft_ms:.3f} ms (CPU timing)" in out
    rows = re.findall(r"^\s+(\d+\.\d) +(sleep|spin) +(\d+\.\d+) +(\d+\.\d+) +(\d+\.\d+) +(\d+\.\d)%$", out, re.M)
    assert [(p, w) for p, w, *_ in rows] == [("0.0", "sleep"), ("0.0", "spin"), ("1.0", "sleep"), ("1.0", "spin")]
    assert all(0 < float(median) <= float(p99) for _, _, median, _, p99, _ in rows)


def test_a_device_without_a_model_is_refused(files, root):
    with pytest.raises(SystemExit):
        main(["--target", str(files["target"]), "--drafter", str(files["drafter"]),
              "--config", str(root / "config.yaml"), "--device", "cpu-a100link"])
