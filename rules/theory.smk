# Table 5: selection theory on the pools SpecFit recorded with the cache, under the paper's cost model.


rule theory:
    input:
        unpack(theory_inputs),
    output:
        theory=paths.theory("{model}", "{device}", "{workload}"),
    log:
        paths.log("theory", "{model}", "{device}", "{workload}"),
    conda:
        CONDA_ENV
    params:
        spec=spec(specs.theory),
        inputs=in_flags,
        code=code_hash("specfit.stages.theory"),
    shell:
        "python -m specfit.launch theory --spec {params.spec:q} {params.inputs} "
        "--out theory={output.theory:q} > {log:q} 2>&1"


# Beyond the paper: Table 5 on the pools specfit-ca or specfit-prefetch recorded, under their cache-aware cost
# (specfit.planning.specs.theory's "cost").
use rule theory as theory_cache_aware with:
    output:
        theory=paths.theory("{model}", "{device}", "{workload}", "{method}"),
    log:
        paths.log("theory", "{model}", "{device}", "{workload}", "{method}"),
