# The body of scripts/op-sweep and scripts/module-sweep (sourced; not run by
# itself): parses their common arguments, builds when needed, runs
# driver.py with its own flagosd, writes the page with report.py and prints
# the failures grouped by root cause and the wall time.
#   run_sweep SUITE NAME RESULTS PAGE MAX_SAMPLES TIMEOUT TIMEOUT_PER HELP_LINES -- "$@"
# SUITE: ops | modules; NAME: the script's name (scripts/NAME, in the page);
# RESULTS: the raw results file; PAGE: the generated markdown; MAX_SAMPLES,
# TIMEOUT, TIMEOUT_PER: the defaults; HELP_LINES: the sed range of the
# calling script's help comment. Runs in the repository root ($REPO).
run_sweep() {
  local suite=$1 name=$2 results=$3 page=$4 max_samples=$5 timeout=$6 timeout_per=$7 help_lines=$8
  shift 9
  local only=() command_line="scripts/$name${*:+ $*}" script="scripts/$name"
  while (($#)); do
    case $1 in
      --max-samples) max_samples=$2; shift 2 ;;
      --timeout) timeout=$2; shift 2 ;;
      --only) shift; while (($#)) && [[ $1 != --* ]]; do only+=("$1"); shift; done ;;
      -h|--help) sed -n "${help_lines}p" "$script" | sed 's/^# \{0,1\}//'; return 0 ;;
      *) echo "$name: unknown argument $1 (see --help)" >&2; return 2 ;;
    esac
  done

  if [[ ! -x build/bin/flagosd ]] || ! compgen -G "plugin/torch_fl/_C*.so" >/dev/null; then
    bash scripts/bootstrap
    bash scripts/build
  fi

  local started commit
  started=$(date +%s)
  # The commit the sweep tests: taken now, in case the tree changes while it runs.
  commit=$(python3 tests/opinfo/report.py --suite "$suite" --print-commit)
  export PYTHONPATH="$REPO/plugin${PYTHONPATH:+:$PYTHONPATH}"
  # The sweep starts its own daemon; an inherited endpoint must not redirect its workers.
  unset FLAGOS_ENDPOINT
  python3 tests/opinfo/driver.py --suite "$suite" --out "$results" --max-samples "$max_samples" \
    --timeout "$timeout" --timeout-per "$timeout_per" ${only[@]+--only "${only[@]}"}
  python3 tests/opinfo/report.py --suite "$suite" --results "$results" --markdown "$page" \
    --command "$command_line" --max-samples "$max_samples" --timeout "$timeout" --commit "$commit"
  echo "$name: wall time $(($(date +%s) - started)) s"
}
