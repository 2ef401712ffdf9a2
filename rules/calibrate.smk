# Calibration per (model, device, cache mode): probe cycles on EAGLE-3 states, NNLS fit of b_0..b_7 and beta.


rule calibrate:
    input:
        prompts=paths.prompts("{model}", "calibration"),
        target=target_dir,
        drafter=drafter_dir,
    output:
        coefficients=paths.calibration("{model}", "{device}", "{cache}"),
        points=paths.calibration_points("{model}", "{device}", "{cache}"),
    log:
        paths.log("calibrate", "{model}", "{device}", "{cache}"),
    conda:
        CONDA_ENV
    resources:
        gpu=device_gpus,
        gpu_model=device_gpu_model,
    params:
        spec=spec(specs.calibrate),
        code=code_hash("specfit.stages.calibrate"),
    shell:
        "python -m specfit.launch calibrate --spec {params.spec:q} --in prompts={input.prompts:q} "
        "--in target={input.target:q} --in drafter={input.drafter:q} "
        "--out coefficients={output.coefficients:q} --out points={output.points:q} > {log:q} 2>&1"
