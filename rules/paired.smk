# The paper's claims from one process: on each cell of the config's `paired`, AR, EAGLE-3 and SpecFit with and
# without the cache take turns on every prompt (specfit.paired).


rule paired:
    input:
        unpack(paired_inputs),
    output:
        requests=paths.paired("{model}", "{device}", "{workload}", "requests.parquet"),
        metrics=paths.paired("{model}", "{device}", "{workload}", "metrics.json"),
    log:
        paths.log("paired", "{model}", "{device}", "{workload}"),
    conda:
        CONDA_ENV
    resources:
        gpu=device_gpus,
        gpu_model=device_gpu_model,
    params:
        spec=spec(specs.paired),
        inputs=in_flags,
        code=code_hash("specfit.paired"),
    shell:
        "python -m specfit.paired --spec {params.spec:q} {params.inputs} "
        "--out requests={output.requests:q} --out metrics={output.metrics:q} > {log:q} 2>&1"
