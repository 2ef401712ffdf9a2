"""specfit-online: specfit-ca that should never fall behind the tree a user tunes by hand (beyond the paper)."""

from specfit.speculative.methods import SpecFitCA


class SpecFitOnline(SpecFitCA):
    """specfit-ca with every change that keeps it from falling behind a fixed tree (beyond the paper; the options of
    `MethodConfig`, each on by default here, each one measured on its own by config.selection.yaml):

    - its commit probabilities calibrated online from the verifications before (`specfit.selection.calibration`);
    - the look-ahead stopping rule (`SpecFit.chain_pays`): drafting goes on while a chain through the levels not
      drafted yet could pay, where one level alone may not;
    - no skipping: every cycle drafts, and the selection decides how much of the pool to verify (the root alone, when
      nothing pays);
    - with ``k_max`` above 7 (and the calibration's intercepts for it, ``calibration.sizes``), subtrees of up to 16
      nodes, searched exactly.

    Its host work, like every SpecFit kind's: a learned route source is asked nothing where the cost has no expert
    term (`SpecFit.asks_routes`: the resident per-pair gather), each node is calibrated and its routes predicted once
    per cycle, and what it learns from a verification counts as select time.

    Deployable: it reads learned routes (``routes: learned``) or an atlas, and learns only from what the decode has
    already verified.
    """

    DEFAULTS = {"calibration": "online", "lookahead": True, "skip": False}
