"""The calibration fit T(S) = b_|S| + β F(S) (Appendix B) beside the paper's coefficients, the cache-aware model
T(S) = b_|S| + β_miss M(S) + β_hit H(S) (specfit-ca's cost) fitted on the same probes, and the probes' scatter."""

from specfit.planning import paths
from specfit.planning.matrix import calibration_modes
from specfit.report.figures import calibration_scatter, slug
from specfit.report.page import MISSING, Section, fmt, note, table, tagged
from specfit.report.scope import Scope
from specfit.report.verdict import at_least

R2_GOAL = 0.9  # the cache-aware model with the cache, R² on the probe means
NAMES = {"cache": "With cache", "nocache": "Without cache"}


def section(scope: Scope) -> Section:
    sec = Section("Calibration fit T(S) = b_|S| + β F(S) (Appendix B)")
    modes = calibration_modes(scope.spec, scope.device)
    fits = {mode: f for mode in modes if (f := scope.inputs.calibration.get((scope.model, scope.device, mode)))}
    sec.missing += [paths.calibration(scope.model, scope.device, mode) for mode in modes if mode not in fits]
    if not fits:
        return sec
    emulated = any(f["link_emulated"] for f in fits.values())
    n_b = max(len(f["b"]) for f in fits.values())

    def b(k):  # the fit's b_k (fits without the cache have fewer)
        return lambda f: fmt(f["b"][k], ".3f") if k < len(f["b"]) else MISSING

    rows = [*((f"b_{k}", f"b_{k} (ms)", b(k), b(k)) for k in range(n_b)),  # key, label, ours, the paper's
            ("beta", "β (ms per expert)", lambda f: fmt(f["beta"], ".4f"), lambda p: fmt(p["beta"], ".4f")),
            ("r2", "R²", lambda f: fmt(f["r2"], ".4f"), lambda p: MISSING),
            ("rmse_ms", "RMSE (ms)", lambda f: fmt(f["rmse_ms"], ".2f"), lambda p: MISSING),
            ("n_points", "Points", lambda f: fmt(f["n_points"], "d"), lambda p: "144"),
            ("source", "Source", lambda f: str(f["source"]), lambda p: "paper")]
    paper = scope.inputs.paper["coefficients_ms"][scope.gpu] if scope.gpu is not None else None
    sec.tables.append(table(scope.id("calibration"), tagged(f"Cost coefficients, {scope.model} / {scope.device}",
                                                            emulated), [
        ("Coefficient", lambda q: q[1]),
        *((fit_header(mode, f), lambda q, f=f: q[2](f)) for mode, f in fits.items()),
        *((f"Paper {scope.gpu}, {which}", lambda q, p=p: q[3](p)) for which, p in (
            (("with cache", paper["cache"]), ("without cache", paper["no_cache"])) if paper else ()))],
        rows, key=lambda q: q[0]))
    cache_aware(scope, sec, fits, [b(k) for k in range(n_b)], emulated)
    frames = {NAMES[mode]: scope.inputs.points[scope.model, scope.device, mode] for mode in fits
              if (scope.model, scope.device, mode) in scope.inputs.points}
    sec.missing += [paths.calibration_points(scope.model, scope.device, mode) for mode in fits
                    if NAMES[mode] not in frames and fits[mode]["source"] == "fit"]
    if frames:
        fig = calibration_scatter(frames, tagged(f"{scope.model} / {scope.device}: calibration probes", emulated))
        sec.figures.append(scope.figures.save(fig, slug(scope.model, scope.device, "calibration"), tagged(
            f"Calibration, {scope.model} / {scope.device}: measured vs predicted cycle time", emulated)))
    return sec


def fit_header(mode: str, fit: dict) -> str:
    return tagged(f"{NAMES[mode]} ({fit['slots']} slots)", fit["link_emulated"])


def cache_aware(scope: Scope, sec: Section, fits: dict, b_cells: list, emulated: bool) -> None:
    """The cache-aware model beside the paper's, fitted on the same probes, and the drafting time of one level;
    ``b_cells``: the cell of each b_k, as the paper's model prints it."""

    def ca(get):  # a quantity of the cache-aware fit: a dash where there is none (the paper's presets)
        return lambda mode, f: MISSING if f["cache_aware"] is None else get(f["cache_aware"])

    def goal(mode, f):
        ca = f["cache_aware"]
        return MISSING if mode != "cache" or ca is None else r2_goal(ca).word()

    def drafting(mode, f):
        d = f["drafting"]
        if d is None:
            return MISSING
        priced = f"{d['start_ms']:.3f} / {d['level_ms']:.3f} / {d['select_ms']:.3f}"
        if d.get("select_source") == "device":  # the emulated host's, the same on any machine
            return f"{priced} (selection: the emulated host's; measured {d['select_measured_ms']:.3f})"
        return priced

    rows = [*((f"b_{k}", f"b_{k} (ms)", ca(b_k)) for k, b_k in enumerate(b_cells)),
            ("beta_miss", "β_miss (ms per copied expert)", ca(lambda c: fmt(c["beta_miss"], ".4f"))),
            ("beta_hit", "β_hit (ms per resident expert)", ca(lambda c: fmt(c["beta_hit"], ".4f") + (
                "" if c["beta_hit_identified"] else " (not identified: no hits)"))),
            ("r2_means", "R², cache-aware, on the probe means", ca(lambda c: fmt(c["r2_means"], ".4f"))),
            ("r2_paper", "R², b + β F, on the probe means", lambda mode, f: fmt(f["r2"], ".4f")),
            ("r2", "R², cache-aware, per repeat (fitted)", ca(lambda c: fmt(c["r2"], ".4f"))),
            ("rmse_means_ms", "RMSE (ms), cache-aware, on the probe means",
             ca(lambda c: fmt(c["rmse_means_ms"], ".2f"))),
            ("rmse_paper", "RMSE (ms), b + β F, on the probe means", lambda mode, f: fmt(f["rmse_ms"], ".2f")),
            ("n_points", "Points (probes / repeats)", ca(lambda c: f"{c['n_probes']} / {c['n_points']}")),
            ("drafting", "Drafting cost D(d): start / further level / selection (ms)", drafting),
            ("goal", f"Goal: R² ≥ {R2_GOAL} with the cache", goal)]
    sec.tables.append(table(scope.id("calibration-cache-aware"), tagged(
        f"Cache-aware cost T(S) = b_|S| + β_miss M(S) + β_hit H(S) beside b_|S| + β F(S), "
        f"{scope.model} / {scope.device}",
        emulated), [("Quantity", lambda q: q[1]),
                    *((fit_header(mode, f), lambda q, mode=mode, f=f: q[2](mode, f)) for mode, f in fits.items())],
        rows, key=lambda q: q[0]))
    if "cache" in fits and (ca := fits["cache"]["cache_aware"]) is not None:
        sec.notes.append(note("calibration_goal", model=scope.model, device=scope.device, goal=R2_GOAL,
                              verdict=r2_goal(ca).verdict, r2_means=f"{ca['r2_means']:.3f}",
                              r2_paper=f"{fits['cache']['r2']:.3f}"))
    sec.notes.append(note("calibration_cache_aware"))


def r2_goal(ca: dict):
    return at_least(ca["r2_means"], R2_GOAL, f"R² {ca['r2_means']:.3f}")
