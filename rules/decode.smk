# Decode runs: model x device x workload x method x expert slots, as the config's `runs` lists them.


rule decode:
    input:
        unpack(decode_inputs),
    output:
        requests="data/decode/{model}/{device}/{workload}/{method}/slots{slots}/requests.parquet",
        cycles="data/decode/{model}/{device}/{workload}/{method}/slots{slots}/cycles.parquet",
        metrics="data/decode/{model}/{device}/{workload}/{method}/slots{slots}/metrics.json",
    log:
        "data/logs/decode/{model}/{device}/{workload}/{method}/slots{slots}.log",
    conda:
        CONDA_ENV
    resources:
        gpu=device_gpus,
        gpu_model=device_gpu_model,
    params:
        spec=decode_spec,
        inputs=decode_in_flags,
        code=code_hash("specfit.decode"),
    shell:
        "python -m specfit.decode --spec {params.spec:q} {params.inputs} "
        "--out requests={output.requests:q} --out cycles={output.cycles:q} "
        "--out metrics={output.metrics:q} > {log:q} 2>&1"
