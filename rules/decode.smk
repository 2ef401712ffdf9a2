# Decode runs: model x device x workload x method x expert slots, as the config's `runs` lists them.


rule decode:
    input:
        unpack(decode_inputs),
    output:
        requests=paths.decode(
            "{model}",
            "{device}",
            "{workload}",
            "{method}",
            "{slots}",
            "requests.parquet",
        ),
        cycles=paths.decode(
            "{model}",
            "{device}",
            "{workload}",
            "{method}",
            "{slots}",
            "cycles.parquet",
        ),
        metrics=paths.decode(
            "{model}", "{device}", "{workload}", "{method}", "{slots}", "metrics.json"
        ),
    log:
        paths.log(
            "decode", "{model}", "{device}", "{workload}", "{method}", "slots{slots}"
        ),
    conda:
        CONDA_ENV
    resources:
        gpu=device_gpus,
        gpu_model=device_gpu_model,
    params:
        spec=spec(specs.decode),
        inputs=in_flags,
        code=code_hash("specfit.stages.decode"),
    shell:
        "python -m specfit.launch decode --spec {params.spec:q} {params.inputs} "
        "--out requests={output.requests:q} --out cycles={output.cycles:q} "
        "--out metrics={output.metrics:q} > {log:q} 2>&1"
