"""SpecFit: throughput-optimal verification subtrees for speculative decoding of offloaded MoE models."""

__version__ = "0.1.0"
