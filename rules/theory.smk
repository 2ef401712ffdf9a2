# Table 5: selection theory on the pools SpecFit recorded with the cache.


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
        spec=theory_spec,
        inputs=in_flags,
        code=code_hash("specfit.theory"),
    shell:
        "python -m specfit.theory --spec {params.spec:q} {params.inputs} "
        "--out theory={output.theory:q} > {log:q} 2>&1"
