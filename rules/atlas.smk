# Route atlas per SpecFit variant (method = route source, cache mode = coefficient set): the pools and
# target routes of every cycle of that variant's own trajectory, built outside any timer.


rule atlas:
    input:
        unpack(atlas_inputs),
    output:
        atlas=paths.atlas("{model}", "{device}", "{workload}", "{method}-{cache}"),
        requests=paths.atlas(
            "{model}", "{device}", "{workload}", "{method}-{cache}", "requests.parquet"
        ),
        cycles=paths.atlas(
            "{model}", "{device}", "{workload}", "{method}-{cache}", "cycles.parquet"
        ),
        metrics=paths.atlas(
            "{model}", "{device}", "{workload}", "{method}-{cache}", "metrics.json"
        ),
    log:
        paths.log("atlas", "{model}", "{device}", "{workload}", "{method}-{cache}"),
    conda:
        CONDA_ENV
    resources:
        gpu=device_gpus,
        gpu_model=device_gpu_model,
    params:
        spec=spec(specs.atlas),
        inputs=in_flags,
        code=code_hash("specfit.stages.atlas"),
    shell:
        "python -m specfit.launch atlas --spec {params.spec:q} {params.inputs} --out atlas={output.atlas:q} "
        "--out requests={output.requests:q} --out cycles={output.cycles:q} "
        "--out metrics={output.metrics:q} > {log:q} 2>&1"
