# The embedded toy pair, built by the workflow itself on CPU: tokenizer -> MoE target -> EAGLE-3 drafter.
# Saved with save_pretrained under data/models/{model}/ and loaded exactly as real checkpoints.


rule toy_tokenizer:
    input:
        questions=config["spec_bench"]["path"],
    output:
        tokenizer=directory("data/models/{model}/tokenizer"),
    log:
        "data/logs/toy/{model}/tokenizer.log",
    conda:
        CONDA_ENV
    params:
        spec=toy_spec("tokenizer"),
        code=code_hash("specfit.toy.tokenizer"),
    shell:
        "python -m specfit.toy.tokenizer --spec {params.spec:q} --in questions={input.questions:q} "
        "--out tokenizer={output.tokenizer:q} > {log:q} 2>&1"


rule toy_target:
    input:
        questions=config["spec_bench"]["path"],
        tokenizer="data/models/{model}/tokenizer",
    output:
        target=directory("data/models/{model}/target"),
    log:
        "data/logs/toy/{model}/target.log",
    conda:
        CONDA_ENV
    params:
        spec=toy_spec("target"),
        code=code_hash("specfit.toy.target"),
    shell:
        "python -m specfit.toy.target --spec {params.spec:q} --in questions={input.questions:q} "
        "--in tokenizer={input.tokenizer:q} --out target={output.target:q} > {log:q} 2>&1"


rule toy_drafter:
    input:
        questions=config["spec_bench"]["path"],
        target="data/models/{model}/target",
    output:
        drafter=directory("data/models/{model}/drafter"),
    log:
        "data/logs/toy/{model}/drafter.log",
    conda:
        CONDA_ENV
    params:
        spec=toy_spec("drafter"),
        code=code_hash("specfit.toy.drafter"),
    shell:
        "python -m specfit.toy.drafter --spec {params.spec:q} --in questions={input.questions:q} "
        "--in target={input.target:q} --out drafter={output.drafter:q} > {log:q} 2>&1"
