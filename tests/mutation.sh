#!/bin/bash
# Mutation testing of one core module with mutmut (dev extra); not in CI (minutes to hours on 2 cores).
#   bash tests/mutation.sh MODULE [SECONDS [MUTANT ...]]   MODULE: hourglass | variable_width | order | resume
# Copies this checkout's files (committed and new, not ignored) to mutants-MODULE/ (or $MUTATION_DIR),
# mutates MODULE only and runs only its fast test files, each mutant against the tests that reached
# the mutated function. Stops after SECONDS (default: no limit); what finished is kept. Prints
# killed/survived/... counts and writes the per-mutant verdicts to results.txt there; inspect one
# with `cd mutants-MODULE && mutmut show NAME`. MUTANT names (globs) restrict the run to those mutants.
set -euo pipefail
case "${1:-}" in
  hourglass) src=olmo_patches/nn/hourglass.py; tests=(tests/test_hourglass.py) ;;
  variable_width) src=olmo_patches/nn/variable_width.py; tests=(tests/test_variable_width.py) ;;
  order) src=olmo_patches/data/order.py; tests=(tests/test_data_order.py) ;;
  resume) src=olmo_patches/train/resume.py; tests=(tests/test_resume.py tests/test_rerun.py) ;;
  *) echo "usage: bash tests/mutation.sh hourglass|variable_width|order|resume [SECONDS]" >&2; exit 2 ;;
esac
repo=$(cd "$(dirname "$0")/.." && pwd)
work=${MUTATION_DIR:-$repo/mutants-$1}
rm -rf "$work" && mkdir -p "$work"
(cd "$repo" && git ls-files -co --exclude-standard -z | xargs -0 tar -cf - --) | tar -xf - -C "$work"
cd "$work"
present=()
for t in "${tests[@]}"; do [[ -f $t ]] && present+=("\"$t\""); done
# mutmut reads [tool.mutmut] from pyproject.toml before setup.cfg.
cat >> pyproject.toml <<TOML

[tool.mutmut]
source_paths = ["olmo_patches"]
only_mutate = ["$src"]
also_copy = ["scripts", "configs", "data_order"]
pytest_add_cli_args_test_selection = [$(IFS=,; echo "${present[*]}")]
pytest_add_cli_args = ["-x", "-q", "-p", "no:cacheprovider"]
process_isolation = "forkserver"
TOML
unset PYTHONPATH  # mutmut puts its mutated copy first; children get it through tests/conftest.py child_env()
status=0
timeout "${2:-0}" nice mutmut run --max-children "${MUTATION_CHILDREN:-2}" "${@:3}" > run.log 2>&1 || status=$?
mutmut results --all true > results.txt
echo "$1: $(grep -c ': ' results.txt) mutants; $(sed 's/.*: //' results.txt | sort | uniq -c | tr '\n' ' ')(mutmut exit $status)"
