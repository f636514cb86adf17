"""The patch layer: the papers' blocks as OLMo-core configs (hourglass FFN and block, variable-width
transformer, MoE), and the parameter and FLOP accounting of a built model. Imports torch, olmo_core
and shapes/ (the closed-form counts) only."""
