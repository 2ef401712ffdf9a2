# Learned routes (beyond the paper): per model, a route predictor trained on EAGLE-3 decodes of questions no
# workload evaluates; decode runs with `routes: learned` read it instead of an atlas.


rule predictor:
    input:
        prompts=paths.prompts("{model}", "predictor"),
        target=target_dir,
        drafter=drafter_dir,
    output:
        predictor=directory(paths.predictor("{model}")),
    log:
        paths.log("predictor", "{model}"),
    conda:
        CONDA_ENV
    threads: config["train_threads"]  # the torch threads it trains with: no other job shares those cores
    resources:
        gpu=device_gpus,
        gpu_model=device_gpu_model,
    params:
        spec=spec(specs.predictor),
        code=code_hash("specfit.stages.predictor"),
    shell:
        "python -m specfit.launch predictor --spec {params.spec:q} --in prompts={input.prompts:q} "
        "--in target={input.target:q} --in drafter={input.drafter:q} "
        "--out predictor={output.predictor:q} > {log:q} 2>&1"
