"""Building the report and reading it back: its tables by id and their rows by key, the Markdown's tables, the
metrics.json key behind a column, and the printed intervals (also used by tests/test_workflow_end_to_end.py)."""

import re

from specfit import report
from specfit.report.page import EMULATED, interval_note
from specfit.report.quantities import METRICS
from specfit.results import intervals


def build(spec: dict, inputs: dict, out) -> tuple[str, dict]:
    """The report written into ``out``: its Markdown, and its tables by id (`specfit.report.page.Table`)."""
    parts = report.write(spec, inputs, out)
    tables = {t.id: t for part in parts for section in part.sections for t in section.tables}
    return (out / "report.md").read_text(), tables


def rows(table) -> dict:
    """A table's rows by key."""
    assert len(set(table.keys)) == len(table.rows), table.id
    return dict(zip(table.keys, table.rows))


def ids(tables, name: str) -> list[str]:
    """The ids of the tables named ``name`` (the first part of an id)."""
    return [i for i in tables if i.split("/")[0] == name]


def md_tables(text: str) -> list[tuple[str, list[str], list[list[str]]]]:
    """Markdown tables as (bold caption line above, header, rows)."""
    tables = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("**") and line.endswith("**") and i + 2 < len(lines) and lines[i + 2].startswith("|"):
            block = []
            for row in lines[i + 2:]:
                if not row.startswith("|"):
                    break
                block.append([c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", row)[1:-1]])
            tables.append((line.strip("*"), block[0], block[2:]))
    return tables


def find(tables, prefix: str):
    hits = [(header, rows) for caption, header, rows in tables if caption.startswith(prefix)]
    assert len(hits) == 1, (prefix, [caption for caption, _, _ in tables])
    return hits[0]


def captions(tables) -> list[str]:
    return [caption for caption, _, _ in tables]


def key_of(header: str) -> str:
    label = header.replace(f" [{EMULATED}]", "")
    return next(k for k, q in METRICS.items() if q.label == label)


def missing_inputs(md: str) -> list[str]:
    """Every path the report lists under "Missing inputs"."""
    return re.findall(r"^- `([^`]+)`$", md, re.MULTILINE)


def tps_text(written, run) -> str:
    """A decode TPS cell as the report must print it, from the intervals module on the run's requests."""
    ci = intervals.tps_interval(written["requests", run], seed=0)
    return f"{written[run]['tps_dec']:.2f} [{ci['low']:.2f}, {ci['high']:.2f}]"


def ratio_of(written, num, den) -> dict:
    return intervals.ratio_interval(written["requests", num], written["requests", den], seed=0,
                                   spread=intervals.process_spread(written[num], written[den]))  # runs apart


def ratio_of_ratios(a, b, c, d, **kw) -> dict:
    """(TPS(a) / TPS(b)) / (TPS(c) / TPS(d)) of four runs' requests, paired (`intervals.products_ratio_interval`)."""
    return intervals.products_ratio_interval([a, d], [b, c], **kw)


def x_text(ci) -> str:
    return f"{ci['value']:.2f}× [{ci['low']:.2f}, {ci['high']:.2f}] {ci['verdict']}"


def pct_text(ci) -> str:
    pct = [100 * (ci[k] - 1) for k in ("value", "low", "high")]
    return f"{pct[0]:.1f} [{pct[1]:.1f}, {pct[2]:.1f}] {ci['verdict']}"


RATIO_CELL = re.compile(r"(-?\d+\.\d+)(×?) \[(-?\d+\.\d+), (-?\d+\.\d+)\] (faster|slower|tie)")


def assert_no_win_inside_a_tie(md: str) -> int:
    """Every ratio cell's verdict agrees with its printed interval (1× or 0%); returns how many there are."""
    cells = RATIO_CELL.findall(md)
    for value, x, low, high, verdict in cells:
        one = 1.0 if x else 0.0
        low, high = float(low), float(high)
        assert low <= float(value) <= high
        if verdict == "faster":
            assert low >= one, (value, low, high)
        elif verdict == "slower":
            assert high <= one, (value, low, high)
        else:
            assert low <= one <= high, (value, low, high)
    for section in md.split("\n### ")[1:]:  # every section that shows an interval says how it is computed
        if RATIO_CELL.search(section):
            assert interval_note(0) in section, section[:80]
    return len(cells)
