"""The names of the in-loop validation sets and the papers' downstream tasks: plain strings (no
torch), so a config's eval keys are checked at load."""

__all__ = ["PAPER_VALIDATION_SETS", "VALIDATION_SETS", "PAPER_DOWNSTREAM_TASKS"]

# paper 1 (docs/papers.md)
PAPER_VALIDATION_SETS = ("dolma_common-crawl", "dolma_stack", "m2d2_s2orc", "wikitext_103")
# The rest of OLMo-core's v3-small-ppl-validation mix
VALIDATION_SETS = PAPER_VALIDATION_SETS + (
    "c4_en",
    "dolma_books",
    "dolma_pes2o",
    "dolma_reddit",
    "dolma_wiki",
    "ice",
    "pile",
)
# The paper's seven tasks as ai2-olmo-eval labels them (OLMo-2's in-loop names; NQ/TriviaQA as CE
# loss -> PPL)
PAPER_DOWNSTREAM_TASKS = (
    "arc_easy",
    "hellaswag",
    "piqa",
    "sciq",
    "commonsense_qa",
    "trivia_qa_wiki_ppl",
    "natural_qs_open_ppl",
)
