"""Planning: what the workflow runs, decided before any job starts and free of torch, so that ``snakemake -n`` stays
fast. The file names of every artifact (`paths`), the config loaded and validated (`config`), the run matrix and the
files each run reads (`matrix`), each rule's spec (`specs`), the code hash a rule carries (`code`) and the command
line every stage shares (`stage`). The Snakefile, the tests and the benches import it; what a job computes is in its
stage (`specfit.stages`) and the libraries that stage runs, whose code hash leaves this package out: a change here
reaches a job through its spec and files, which Snakemake tracks.
"""
