# Sourced by a run's run.sh on the GPU machine, from the repository root (fourteenth session on):
# installs the test wheels carried in .whl (device README: the machine has no network) and sets
# the environment every run's commands assume. Stops the run if the wheels do not install.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1 PYTHONPATH=.:/tmp/site
