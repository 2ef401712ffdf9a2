"""The stages: one module per workflow rule, each with ``run(spec, inputs, outputs)`` and the command line every rule
calls, ``python -m specfit.stages.<name> --spec JSON --in name=path --out name=path`` (`specfit.planning.stage`).
A stage reads its files and its spec, runs the libraries (`specfit.engine`, `specfit.speculative`, `specfit.models`,
`specfit.toy`, `specfit.report`...) and writes its outputs atomically; nothing imports a stage.
"""
