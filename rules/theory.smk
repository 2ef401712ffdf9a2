# Table 5: selection theory on the pools SpecFit recorded with the cache.


rule theory:
    input:
        unpack(theory_inputs),
    output:
        theory="data/theory/{model}/{device}/{workload}.json",
    log:
        "data/logs/theory/{model}/{device}/{workload}.log",
    conda:
        CONDA_ENV
    params:
        spec=theory_spec,
        code=code_hash("specfit.theory"),
    shell:
        "python -m specfit.theory --spec {params.spec:q} --in cycles={input.cycles:q} "
        "--in requests={input.requests:q} "
        "--in atlas={input.atlas:q} --in coefficients={input.coefficients:q} "
        "--out theory={output.theory:q} > {log:q} 2>&1"
