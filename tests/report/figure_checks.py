"""A report figure as a reader sees it: drawn, every text on it (tick labels, titles, value labels, legend entries)
must lie on the canvas and overlap no other, every legend too, and drawing or saving it must raise no warning (a
layout engine's "not applied" among them). `checking` puts these checks into every figure the report saves; the page
must embed every figure file with alt text naming what it shows (`assert_embedded`)."""

import re
import warnings

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.text import Text

from specfit.report.figures import Figures

MD_IMAGE = r"!\[((?:[^][]|\[[^][]*\])*)\]\(([^)]+)\)"  # ![alt](src), the alt text's brackets balanced
SLACK = 1.0  # pixels: a bounding box may touch the canvas edge or a neighbour's by this much


def drawn_texts(fig) -> tuple[list[tuple[str, object]], object]:
    """Draws ``fig``; returns each text drawn (its string and window extent) and the renderer."""
    drawn, draw = [], Text.draw

    def recording(self, renderer):
        draw(self, renderer)
        if self.get_visible() and self.get_text().strip():
            drawn.append((self.get_text(), self.get_window_extent(renderer)))

    canvas = FigureCanvasAgg(fig)
    Text.draw = recording
    try:
        canvas.draw()
    finally:
        Text.draw = draw
    return drawn, canvas.get_renderer()


def outside(box, width: float, height: float) -> bool:
    return box.x0 < -SLACK or box.y0 < -SLACK or box.x1 > width + SLACK or box.y1 > height + SLACK


def overlap(a, b) -> bool:
    return min(a.x1, b.x1) - max(a.x0, b.x0) > SLACK and min(a.y1, b.y1) - max(a.y0, b.y0) > SLACK


def layout_problems(fig) -> list[str]:
    """What a reader would stumble on in ``fig``: a warning while it is drawn, a text or legend off the canvas, two
    texts on top of each other."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        texts, renderer = drawn_texts(fig)
    problems = [f"warning while drawing: {w.message}" for w in caught]
    width, height = fig.bbox.width, fig.bbox.height
    problems += [f"text {t!r} leaves the canvas" for t, box in texts if outside(box, width, height)]
    legends = [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend() is not None)]
    problems += ["a legend leaves the canvas" for legend in legends
                 if outside(legend.get_window_extent(renderer), width, height)]
    problems += [f"texts {a!r} and {b!r} overlap" for i, (a, box_a) in enumerate(texts) for b, box_b in texts[i + 1:]
                 if overlap(box_a, box_b)]
    return problems


def checking(monkeypatch) -> dict[str, list[str]]:
    """Checks every figure the report saves from now on (`layout_problems`, and no warning while it is saved),
    failing at the first with a problem; returns, by file name as saved, the texts each figure drew."""
    seen, save = {}, Figures.save

    def checked(self, fig, name, caption):
        problems = layout_problems(fig)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            figure = save(self, fig, name, caption)
        problems += [f"warning while saving: {w.message}" for w in caught]
        assert not problems, (name, problems)
        seen[name] = [t for t, _ in drawn_texts(fig)[0]]
        return figure

    monkeypatch.setattr(Figures, "save", checked)
    return seen


def assert_embedded(out, names: list[str]) -> dict[str, str]:
    """The page in ``out`` embeds every figure file there is, each with alt text that names every model, device and
    workload of ``names`` its file name carries, and the Markdown twin links the same files with the same text;
    returns the alt text by file."""
    files = {f"figures/{p.name}" for p in (out / "figures").glob("*.png")}
    html = dict((src, alt) for src, alt in re.findall(r'<img src="([^"]+)" alt="([^"]*)">', (out / "index.html")
                                                      .read_text()))
    md = dict((src, alt) for alt, src in re.findall(MD_IMAGE, (out / "report.md").read_text()))
    assert files and set(html) == files and set(md) == files
    for src, alt in html.items():
        assert alt.replace("&#39;", "'").replace("&amp;", "&") == md[src].replace("\\|", "|"), src
        stem = f"-{src.removeprefix('figures/').removesuffix('.png')}-"
        named = [n for n in names if f"-{n}-" in stem]
        assert named and all(n in alt for n in named), (src, alt)
    return html
