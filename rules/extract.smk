# Stage 1: a workload's questions (Spec-Bench, or the dataset its `source` names) -> prompts per workload and
# model (Parquet).
from specfit.questions import workload_file


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
        # Spec-Bench's question.jsonl (the spec_bench rule's output) or the workload's own local dataset; none for
        # a Hub dataset, which is read from the local cache
        questions=lambda w: workload_file(config, w.workload) or [],
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
        spec=extract_spec,
        inputs=in_flags,
        code=code_hash("specfit.extract"),
    shell:
        "python -m specfit.extract --spec {params.spec:q} {params.inputs} "
        "--out prompts={output.prompts:q} > {log:q} 2>&1"
