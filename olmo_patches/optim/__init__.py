"""Optimizer pieces as OLMo-core configs (the power LR schedule). Imports torch and olmo_core only,
nothing else of this package: it sits at the nn layer."""
