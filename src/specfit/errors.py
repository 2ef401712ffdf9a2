"""The package's one user-facing error."""


class SpecFitError(Exception):
    """Bad input, a missing file, a model that does not fit, a config the schema or its cross references refuse
    (`specfit.planning.config.validate_config`): printed by the stage CLI without a traceback.

    The message names what is wrong and what to do about it.
    """
