"""Running an experiment on OLMo-core's Trainer, as OLMo-core's own main template does (run): a
spec's data sources (sources), optimizer (optimizer) and OLMo-core configs (experiment), the
checkpoints of a save folder (checkpoints), and the callbacks that add what OLMo-core's lack
(callbacks/). Imports config and the layers below it."""

from .experiment import Experiment, OrderedDataLoaderConfig, build_experiment, device_for
from .run import exit_line, train
from .sources import DataSources, resolve_data

__all__ = [
    "DataSources",
    "Experiment",
    "OrderedDataLoaderConfig",
    "build_experiment",
    "device_for",
    "exit_line",
    "resolve_data",
    "train",
]
