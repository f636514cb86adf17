#!/bin/bash
# Mutation testing of one core module with mutmut (dev extra); not in CI (minutes to an hour on 2 cores).
#   bash tests/mutation.sh MODULE [SECONDS [MUTANT ...]]   MODULE: hourglass | variable_width | order | resume | checkpoints
# Copies this checkout's files (committed and new, not ignored) to mutants-MODULE/ (or $MUTATION_DIR),
# mutates MODULE only and runs its fast in-process test set (below; MUTATION_FULL=1: its whole test
# files, hours), each mutant against the tests that reached the mutated function. One mutant at a time
# (MUTATION_CHILDREN, default 1). Stops after SECONDS (default: no limit); what finished is kept. Prints
# killed/survived/... counts and writes the per-mutant verdicts to results.txt there; inspect one
# with `cd mutants-MODULE && mutmut show NAME`. MUTANT names (globs) restrict the run to those mutants.
# MUTATION_PYTEST_ARGS adds pytest selection arguments (e.g. "--deselect NODE" for a faster pass).
# MUTATION_SAMPLE=F adds a uniform random sample (fraction F, seed 18) of the module's other mutants.
set -euo pipefail
order_fast=(test_layout_locates_every_instance test_blockwise_fill_then_shuffle_equals_reference
  test_paths_file_skips_blanks_and_comments_and_names_its_errors test_layout_keeps_its_paths_and_names_a_size_mismatch
  test_global_indices_file_as_the_old_trainer_writes_it test_pinned_list_is_olmo_core_mix_and_checksummed)
case "${1:-}" in
  hourglass) src=olmo_patches/nn/hourglass.py
    # the compiled FFN's test traces with fullgraph, which mutmut's trampoline breaks
    tests=(tests/test_hourglass.py --deselect tests/test_hourglass.py::test_compiled_ffn_matches_eager)
    full=(tests/test_hourglass.py) ;;
  variable_width) src=olmo_patches/nn/variable_width.py
    # all of test_variable_width.py but its training run and its compile/checkpointing run (a minute each)
    tests=(tests/test_variable_width_units.py tests/test_variable_width.py
      --deselect tests/test_variable_width.py::test_train_save_and_resume
      --deselect tests/test_variable_width.py::test_activation_checkpointing_and_compile_keep_the_numbers)
    full=(tests/test_variable_width_units.py tests/test_variable_width.py) ;;
  order) src=olmo_patches/data/order.py
    tests=(tests/test_order_units.py "${order_fast[@]/#/tests/test_data_order.py::}")
    full=(tests/test_order_units.py tests/test_data_order.py) ;;
  resume) src=olmo_patches/train/callbacks/checkpointer.py; tests=(tests/test_resume_units.py)
    full=(tests/test_resume_units.py tests/test_resume.py tests/test_rerun.py) ;;
  checkpoints) src=olmo_patches/train/checkpoints.py; tests=(tests/test_resume_units.py)
    full=(tests/test_resume_units.py tests/test_resume.py tests/test_checkpoint_contract.py) ;;
  *) echo "usage: bash tests/mutation.sh hourglass|variable_width|order|resume|checkpoints [SECONDS [MUTANT ...]]" >&2; exit 2 ;;
esac
[[ ${MUTATION_FULL:-0} == 1 ]] && tests=("${full[@]}")
read -ra extra <<< "${MUTATION_PYTEST_ARGS:-}"  # more selection arguments, e.g. --deselect NODE
tests+=("${extra[@]}")
repo=$(cd "$(dirname "$0")/.." && pwd)
work=${MUTATION_DIR:-$repo/mutants-$1}
rm -rf "$work" && mkdir -p "$work"
(cd "$repo" && git ls-files -co --exclude-standard -z | xargs -0 tar -cf - --) | tar -xf - -C "$work"
cd "$work"
# the training tests read the demo corpus from the checkout's cache (built by the first test run)
if [[ -d $repo/.cache/demo-corpus ]]; then mkdir -p .cache && cp -a "$repo/.cache/demo-corpus" .cache/; fi
present=()
for t in "${tests[@]}"; do [[ -f ${t%%::*} || $t == --* ]] && present+=("\"$t\""); done
# mutmut reads [tool.mutmut] from pyproject.toml.
cat >> pyproject.toml <<TOML

[tool.mutmut]
source_paths = ["olmo_patches"]
only_mutate = ["$src"]
also_copy = ["scripts", "configs", "data_order", ".cache"]
pytest_add_cli_args_test_selection = [$(IFS=,; echo "${present[*]}")]
pytest_add_cli_args = ["-x", "-q", "-p", "no:cacheprovider"]
process_isolation = "forkserver"
TOML
names=("${@:3}")
if [[ -n ${MUTATION_SAMPLE:-} ]]; then  # the module's mutant names as mutmut generates them (its own API)
  cat > sample.py <<'PY'
import fnmatch, random, sys
from mutmut.mutation.file_mutation import mutate_file_contents
src, fraction, globs = sys.argv[1], float(sys.argv[2]), sys.argv[3:]
module = src[:-3].replace("/", ".")
names = [f"{module}.{n}" for n in mutate_file_contents(src, open(src).read()).mutant_names]
rest = [n for n in names if not any(fnmatch.fnmatchcase(n, g) for g in globs)]
print(*sorted(random.Random(18).sample(rest, round(fraction * len(rest)))), sep="\n")
PY
  mapfile -t sample < <(python sample.py "$src" "$MUTATION_SAMPLE" "${names[@]}")
  names+=("${sample[@]}")
  printf '%s\n' "${names[@]}" > requested.txt
fi
unset PYTHONPATH  # mutmut puts its mutated copy first; children get it through tests/conftest.py child_env()
status=0
timeout "${2:-0}" nice mutmut run --max-children "${MUTATION_CHILDREN:-1}" "${names[@]}" > run.log 2>&1 || status=$?
mutmut results --all true > results.txt
echo "$1: $(grep -c ': ' results.txt) mutants; $(sed 's/.*: //' results.txt | sort | uniq -c | tr '\n' ' ')(mutmut exit $status)"
