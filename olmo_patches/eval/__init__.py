"""In-loop evaluation: the validation sets and downstream tasks, as OLMo-core evaluator callbacks.
Imports olmo_core only, nothing else of this package."""
