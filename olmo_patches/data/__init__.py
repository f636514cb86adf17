"""Token data: the embedded demo corpus, the OLMo-2 mix and its exact order."""
