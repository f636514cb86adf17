"""Running an experiment on OLMo-core's Trainer: the wiring from a spec (experiment), resume and
checkpoint safety, progress, metrics, the batch trace. Imports config and the layers below it."""

from .experiment import OrderedDataLoaderConfig, build_experiment, device_for, exit_line, resolve_data, train

__all__ = ["OrderedDataLoaderConfig", "build_experiment", "device_for", "exit_line", "resolve_data", "train"]
