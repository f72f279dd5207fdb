"""A simulation run: what it is (`spec.RunSpec`, typed), what it is made of (`build`: the
services' options and the workload), and how one runs as `gpuyard sim` runs it (`single`).
Commands, comparisons, sweeps and forked processes carry a `RunSpec`, never command lines."""
