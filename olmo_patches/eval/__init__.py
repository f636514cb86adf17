"""In-loop evaluation: the validation sets and downstream tasks, as OLMo-core evaluator callbacks
(``evaluators``), and their names as plain strings that a config is checked against without torch
(``names``). Imports olmo_core only, nothing else of this package."""
