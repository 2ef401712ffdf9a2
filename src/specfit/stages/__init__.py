"""The stages: one module per workflow rule, each with ``run(spec, inputs, outputs)`` and its command line
(`specfit.planning.stage`), which every rule calls through ``python -m specfit.launch <name> --spec JSON --in
name=path --out name=path`` (`specfit.launch`; ``python -m specfit.stages.<name> ...`` runs the same).
A stage reads its files and its spec, runs the libraries (`specfit.engine`, `specfit.speculative`, `specfit.models`,
`specfit.toy`, `specfit.report`...) and writes its outputs atomically; nothing imports a stage.
"""
