# extract: a workload's questions (Spec-Bench, or the dataset its `source` names) -> prompts per workload and
# model (Parquet).


rule spec_bench:
    output:
        questions=config["spec_bench"]["path"],
    log:
        paths.log("spec_bench"),
    conda:
        CONDA_ENV
    params:
        spec=spec_json(specs.spec_bench(config)),
    shell:
        "python -m specfit.launch spec_bench --spec {params.spec:q} "
        "--out questions={output.questions:q} > {log:q} 2>&1"


rule extract:
    input:
        questions=questions_file,
        tokenizer=tokenizer_dir,
    output:
        prompts=paths.prompts("{model}", "{workload}"),
    log:
        paths.log("extract", "{model}", "{workload}"),
    wildcard_constraints:
        workload="|".join([*config["workloads"], "calibration", "predictor"]),
    conda:
        CONDA_ENV
    params:
        spec=spec(specs.extract),
        inputs=in_flags,
        code=code_hash("specfit.stages.extract"),
    shell:
        "python -m specfit.launch extract --spec {params.spec:q} {params.inputs} "
        "--out prompts={output.prompts:q} > {log:q} 2>&1"
