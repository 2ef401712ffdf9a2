# A toy pair trained by the workflow itself on CPU: tokenizer -> MoE target -> EAGLE-3 drafter, for every model with
# `toy: true` (TRAINED_TOYS); the shipped toy (`shipped: true`) is read as it is. Saved with save_pretrained under
# data/models/{model}/ and loaded exactly as real checkpoints.


rule toy_tokenizer:
    input:
        questions=config["spec_bench"]["path"],
    output:
        tokenizer=directory(paths.toy_model("{model}", "tokenizer")),
    log:
        paths.log("toy", "{model}", "tokenizer"),
    wildcard_constraints:
        model=TRAINED_TOYS,
    conda:
        CONDA_ENV
    params:
        spec=spec_json(specs.toy(config, "tokenizer")),
        code=code_hash("specfit.stages.toy_tokenizer"),
    shell:
        "python -m specfit.launch toy_tokenizer --spec {params.spec:q} --in questions={input.questions:q} "
        "--out tokenizer={output.tokenizer:q} > {log:q} 2>&1"


rule toy_target:
    input:
        questions=config["spec_bench"]["path"],
        tokenizer=paths.toy_model("{model}", "tokenizer"),
    output:
        target=directory(paths.toy_model("{model}", "target")),
    log:
        paths.log("toy", "{model}", "target"),
    wildcard_constraints:
        model=TRAINED_TOYS,
    conda:
        CONDA_ENV
    threads: config["train_threads"]  # the torch threads it trains with: no other job shares those cores
    params:
        spec=spec_json(specs.toy(config, "target")),
        code=code_hash("specfit.stages.toy_target"),
    shell:
        "python -m specfit.launch toy_target --spec {params.spec:q} --in questions={input.questions:q} "
        "--in tokenizer={input.tokenizer:q} --out target={output.target:q} > {log:q} 2>&1"


rule toy_drafter:
    input:
        questions=config["spec_bench"]["path"],
        target=paths.toy_model("{model}", "target"),
    output:
        drafter=directory(paths.toy_model("{model}", "drafter")),
    log:
        paths.log("toy", "{model}", "drafter"),
    wildcard_constraints:
        model=TRAINED_TOYS,
    conda:
        CONDA_ENV
    threads: config["train_threads"]  # the torch threads it trains with: no other job shares those cores
    params:
        spec=spec_json(specs.toy(config, "drafter")),
        code=code_hash("specfit.stages.toy_drafter"),
    shell:
        "python -m specfit.launch toy_drafter --spec {params.spec:q} --in questions={input.questions:q} "
        "--in target={input.target:q} --out drafter={output.drafter:q} > {log:q} 2>&1"
