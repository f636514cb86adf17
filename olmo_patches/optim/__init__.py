"""Learning-rate schedules as OLMo-core schedulers: lm-engine's power schedule, Megatron's step lag.
Imports torch and olmo_core only, nothing else of this package: it sits at the nn layer."""
