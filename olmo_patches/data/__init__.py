"""Token data: the embedded demo corpus, the OLMo-2 Stage 1 mix and its exact order, the local
prefix. Imports numpy, tokenizers and rich only, nothing else of this package."""
