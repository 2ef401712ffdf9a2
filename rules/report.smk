# reports/all: HTML (Jinja2 + matplotlib) and a Markdown twin, per model and device. The report reads exactly
# the files declared here, each list input passed as a repeated --in flag.


rule report:
    input:
        unpack(report_inputs),
    output:
        report=directory(paths.REPORT),
    log:
        paths.log("report"),
    conda:
        CONDA_ENV
    params:
        spec=spec_json(specs.report(config)),
        inputs=in_flags,
        code=code_hash("specfit.stages.report"),
    shell:
        "python -m specfit.launch report --spec {params.spec:q} {params.inputs} "
        "--out report={output.report:q} > {log:q} 2>&1"
