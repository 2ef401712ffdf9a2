# Route atlas per SpecFit variant (method = route source, cache mode = coefficient set): the pools and
# target routes of every cycle of that variant's own trajectory, built outside any timer.


rule atlas:
    input:
        unpack(atlas_inputs),
    output:
        atlas="data/atlas/{model}/{device}/{workload}/{method}-{cache}/atlas.parquet",
        requests="data/atlas/{model}/{device}/{workload}/{method}-{cache}/requests.parquet",
        cycles="data/atlas/{model}/{device}/{workload}/{method}-{cache}/cycles.parquet",
        metrics="data/atlas/{model}/{device}/{workload}/{method}-{cache}/metrics.json",
    log:
        "data/logs/atlas/{model}/{device}/{workload}/{method}-{cache}.log",
    conda:
        CONDA_ENV
    resources:
        gpu=device_gpus,
        gpu_model=device_gpu_model,
    params:
        spec=atlas_spec,
        code=code_hash("specfit.atlas"),
    shell:
        "python -m specfit.atlas --spec {params.spec:q} --in prompts={input.prompts:q} "
        "--in target={input.target:q} --in drafter={input.drafter:q} "
        "--in coefficients={input.coefficients:q} --out atlas={output.atlas:q} "
        "--out requests={output.requests:q} --out cycles={output.cycles:q} "
        "--out metrics={output.metrics:q} > {log:q} 2>&1"
