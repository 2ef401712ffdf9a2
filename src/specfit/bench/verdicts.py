"""``python -m specfit.bench verdicts A B``: do two reports of the same config give the same verdicts, cell by cell?

``A`` and ``B`` are two report folders (``reports/all`` of two runs, e.g. before and after ``snakemake --cores 1
reports/all --forcerun decode``), or their ``tables.json`` files. A verdict cell is one the report judged: a ratio's
verdict after its interval (faster / slower / tie, several in one cell for the slot sweep), a goal's answer (yes / no
/ not judged ...) and a claim's (confirmed / refuted / tie). Cells are matched by table id, row key and column, never
by caption or position, so numbers may move. It prints how many cells both reports judged, how many agree, and each
difference by kind: a reversal (faster against slower, confirmed against refuted) would mean the verdicts are not
reproducible; a tie against a direction is a ratio near the edge of its interval. Cells judged in one report only
(a section the other could not show) are counted apart.

    python -m specfit.bench verdicts /tmp/run1/reports/all reports/all
"""

import json
import re
from collections import Counter
from pathlib import Path

from specfit import bench

RATIO = re.compile(r"\] (faster|slower|tie)\b")  # "1.03× [0.97, 1.09] tie": a ratio after its interval
WORD = re.compile(r"^(yes|no|confirmed|refuted|tie|met|not met|not judged|not required)( \(.*\))?$")  # a whole cell
REVERSALS = ({"faster", "slower"}, {"confirmed", "refuted"})


def verdict_words(cell: str) -> tuple[str, ...]:
    """The verdicts a printed cell holds: its ratios' (in order), or the cell's one word; () for any other cell."""
    ratios = RATIO.findall(cell)
    if ratios:
        return tuple(ratios)
    word = WORD.match(cell.strip())
    return (word.group(1),) if word else ()


def read_tables(path: Path) -> list[dict]:
    file = path / "tables.json" if path.is_dir() else path
    if not file.is_file():
        raise SystemExit(f"{file} does not exist: give a report folder that holds tables.json (reports written "
                         "since tables.json exists; render an older run's again with `snakemake --forcerun report`)")
    return json.loads(file.read_text())["tables"]


def verdicts(tables: list[dict]) -> dict[tuple[str, str, str], tuple[str, ...]]:
    """(table id, row key, column) -> the cell's verdicts, for every cell that holds one. Rows without a key (their
    number, "#0", ...: lists of divergences or reasons, whose rows are not the same things in two runs) are left out."""
    out = {}
    for t in tables:
        for row in t["rows"]:
            if row["key"].startswith("#"):
                continue
            for column, cell in zip(t["header"], row["cells"]):
                if words := verdict_words(cell):
                    out[t["id"], row["key"], column] = words
    return out


DIRECTIONS = {"faster", "slower", "confirmed", "refuted"}
GOAL_ANSWERS = ({"yes", "no"}, {"met", "not met"})


def kind(a: tuple[str, ...], b: tuple[str, ...]) -> str:
    """How two verdicts of one cell differ: "reversal" if any pair is opposite (faster / slower, confirmed /
    refuted), "tie against a direction" if each differing pair is a tie and a direction, "goal answer" for yes / no
    or met / not met (a goal judged on such a ratio, or a number against its bound), else "other"."""
    pairs = [{x, y} for x, y in zip(a, b) if x != y]
    if len(a) != len(b) or not pairs:
        return "other"
    if any(p in REVERSALS for p in pairs):
        return "reversal"
    if all("tie" in p and p & DIRECTIONS for p in pairs):
        return "tie against a direction"
    if all(p in GOAL_ANSWERS for p in pairs):
        return "goal answer"
    return "other"


def compare(a: dict, b: dict) -> dict:
    common = sorted(a.keys() & b.keys())
    differ = [(k, a[k], b[k]) for k in common if a[k] != b[k]]
    kinds = Counter(kind(x, y) for _, x, y in differ)
    return {"common": len(common), "agree": len(common) - len(differ), "differ": differ, "kinds": kinds,
            "only_a": len(a.keys() - b.keys()), "only_b": len(b.keys() - a.keys())}


def main(argv=None) -> None:
    parser = bench.parser(__name__, __doc__.splitlines()[0])
    parser.add_argument("a", type=Path, help="the first run's report folder (or its tables.json)")
    parser.add_argument("b", type=Path, help="the second run's report folder (or its tables.json)")
    args = parser.parse_args(argv)
    r = compare(verdicts(read_tables(args.a)), verdicts(read_tables(args.b)))
    if not r["common"]:
        parser.error(f"{args.a} and {args.b} have no verdict cell in common: reports of the same config needed")
    print(f"{r['common']} verdict cells in both reports: {r['agree']} agree, {len(r['differ'])} differ "
          f"({100 * r['agree'] / r['common']:.1f}% agree); only in A {r['only_a']}, only in B {r['only_b']}")
    for name, n in sorted(r["kinds"].items()):
        print(f"  {name}: {n}")
    for (table, key, column), x, y in r["differ"]:
        print(f"  {table} | {key} | {column}: {', '.join(x)} -> {', '.join(y)}")


if __name__ == "__main__":
    main()
