"""The patch layer: the papers' blocks as OLMo-core configs (hourglass FFN and block, variable-width
transformer), their parameter and FLOP accounting, and the shape solver. Imports torch and olmo_core
only, nothing else of this package."""
