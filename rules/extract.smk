# Stage 1: Spec-Bench questions -> prompts per workload and model (Parquet).


rule spec_bench:
    output:
        questions=config["spec_bench"]["path"],
    log:
        paths.log("spec_bench"),
    conda:
        CONDA_ENV
    params:
        spec=spec_json({k: config["spec_bench"][k] for k in ("url", "sha256")}),
    shell:
        "python -m specfit.extract fetch --spec {params.spec:q} "
        "--out questions={output.questions:q} > {log:q} 2>&1"


rule extract:
    input:
        questions=config["spec_bench"]["path"],
        tokenizer=tokenizer_dir,
    output:
        prompts=paths.prompts("{model}", "{workload}"),
    log:
        paths.log("extract", "{model}", "{workload}"),
    wildcard_constraints:
        workload="|".join([*config["workloads"], "calibration"]),
    conda:
        CONDA_ENV
    params:
        spec=extract_spec,
        code=code_hash("specfit.extract"),
    shell:
        "python -m specfit.extract --spec {params.spec:q} --in questions={input.questions:q} "
        "--in tokenizer={input.tokenizer:q} --out prompts={output.prompts:q} > {log:q} 2>&1"
