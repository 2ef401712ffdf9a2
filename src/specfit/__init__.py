"""SpecFit: throughput-optimal verification subtrees for speculative decoding of offloaded MoE models."""

from specfit import numerics

numerics.pin()  # before anything imports torch: one CPU arithmetic on every machine (specfit.numerics)

__version__ = "0.1.0"
