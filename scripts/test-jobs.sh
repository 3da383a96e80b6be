# Sourced by scripts/test and scripts/sanitize: how many tests run at once.
# FLAGOS_TEST_JOBS (default: the cores, at most 4) is ctest's -j, and the
# pytest-xdist workers of each pytest pass, a file to a worker (--dist
# loadfile: a file's tests run in order, in one process), each worker with a
# flagosd of its own (tests/python/conftest.py). A pass alone keeps about one
# core busy (the client and its daemon take turns), so two workers on 2 cores
# take about half the time. FLAGOS_TEST_JOBS=1 runs a pass in one process.
export FLAGOS_TEST_JOBS=${FLAGOS_TEST_JOBS:-$(( $(nproc) < 4 ? $(nproc) : 4 ))}
PYTEST_JOBS=()
((FLAGOS_TEST_JOBS <= 1)) || PYTEST_JOBS=(-n "$FLAGOS_TEST_JOBS" --dist loadfile)
