# reports/all: HTML (Jinja2 + matplotlib) and a Markdown twin, per model and device.


rule report:
    input:
        metrics=all_decode_metrics(),
        requests=all_decode_requests(),
        calibration=all_calibration(),
        theory=all_theory(),
    output:
        report=directory("reports/all"),
    log:
        "data/logs/report.log",
    conda:
        CONDA_ENV
    params:
        spec=report_spec,
        code=code_hash("specfit.report"),
    shell:
        "python -m specfit.report --spec {params.spec:q} --in root=. --out report={output.report:q} > {log:q} 2>&1"
