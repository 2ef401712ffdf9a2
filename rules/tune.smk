# Tuning: the fixed EAGLE-3 tree a user tunes by hand (a method of kind eagle3-tuned), chosen by a sweep over the
# config's `tune` grid on questions the workload does not evaluate; under cross-fitting (a workload's `tune_folds`),
# one tree per fold, chosen on the other folds' questions ({fold}: ".fold<f>", empty without folds). One tune
# job sweeps the grid at every slot count the method runs at in the cell (on an emulated device, priced on one decode
# per tree).


rule extract_tune:
    input:
        questions=questions_file,
        tokenizer=tokenizer_dir,
    output:
        prompts=paths.tune_prompts("{model}", "{workload}", "{fold}"),
    log:
        paths.log("extract_tune", "{model}", "{workload}{fold}"),
    conda:
        CONDA_ENV
    params:
        spec=spec(specs.extract_tune),
        inputs=in_flags,
        code=code_hash("specfit.stages.extract"),
    shell:
        "python -m specfit.launch extract --spec {params.spec:q} {params.inputs} "
        "--out prompts={output.prompts:q} > {log:q} 2>&1"


rule tune:
    input:
        prompts=paths.tune_prompts("{model}", "{workload}", "{fold}"),
        target=target_dir,
        drafter=drafter_dir,
    output:
        grid=paths.tune_grid("{model}", "{device}", "{workload}", "{method}", "{fold}"),
    log:
        paths.log("tune", "{model}", "{device}", "{workload}", "{method}{fold}"),
    conda:
        CONDA_ENV
    resources:
        gpu=device_gpus,
        gpu_model=device_gpu_model,
    params:
        spec=spec(specs.tune),
        inputs=in_flags,
        code=code_hash("specfit.stages.tune"),
    shell:
        "python -m specfit.launch tune --spec {params.spec:q} {params.inputs} "
        "--out grid={output.grid:q} > {log:q} 2>&1"


# One slot count's part of the sweep, the file a tuned method's decode and the report read.
rule tune_choice:
    input:
        grid=paths.tune_grid("{model}", "{device}", "{workload}", "{method}", "{fold}"),
    output:
        tune=paths.tune(
            "{model}", "{device}", "{workload}", "{method}", "{slots}", "{fold}"
        ),
    log:
        paths.log(
            "tune_choice",
            "{model}",
            "{device}",
            "{workload}",
            "{method}",
            "slots{slots}{fold}",
        ),
    conda:
        CONDA_ENV
    params:
        spec=spec(specs.tune_choice),
        inputs=in_flags,
        code=code_hash("specfit.stages.tune_choice"),
    shell:
        "python -m specfit.launch tune_choice --spec {params.spec:q} {params.inputs} "
        "--out tune={output.tune:q} > {log:q} 2>&1"
