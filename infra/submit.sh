#!/usr/bin/env bash
# Submit a bucketray training run to a Ray cluster through the Ray Jobs API.
#
# Usage:  infra/submit.sh CONFIG [--set KEY=VALUE ...]
#   CONFIG is a path relative to the repository root (it travels in the working dir);
#   every argument after it is passed through to `python -m jobs.train`.
#
# Environment:
#   RAY_ADDRESS          dashboard address (default http://127.0.0.1:8265, e.g. a port-forward)
#   SUBMISSION_ID        job id; default <run name>-<UTC timestamp>. Ray refuses a second job with
#                        an id it already knows, so a resubmission gets a new id by default; resume
#                        comes from checkpoint.run_name + checkpoint.storage_path, not from this id.
#   RUN_NAME             used only to derive SUBMISSION_ID; default: --set checkpoint.run_name=...,
#                        else checkpoint.run_name in CONFIG, else the config's file name
#   ENTRYPOINT_NUM_CPUS  CPUs reserved for the driver (default 1)
#   ENTRYPOINT_RESOURCES custom resources for the driver as JSON, e.g. '{"bucketray_data": 1}' to put
#                        it (and the feeder and row cache, which follow it) on the data node the
#                        infra/ clusters mark with that resource; default: none (any node)
#   STOP_WAIT_S          RAY_JOB_STOP_WAIT_TIME_S of the job (default 600): how long `ray job stop`
#                        waits after SIGTERM before SIGKILL, i.e. the time the graceful stop has to
#                        finish its step and write its checkpoint (docs/cluster.md, Stopping a run)
#   ENTRYPOINT           command before the config arguments (default "python -m jobs.train");
#                        split on whitespace, no shell quoting
#   NO_WAIT=1            return after submission instead of tailing the logs
#   DRY_RUN=1            print the `ray job submit` command instead of running it
#
# Token authentication stays on: RAY_AUTH_MODE=token is exported, and the token is read by Ray
# from RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token (in that order). Secrets (W&B key,
# AWS credentials) are never passed here: the cluster's nodes get them from Kubernetes Secrets or
# their environment, so they do not end up in the job's stored runtime env.
set -euo pipefail

die() {
    echo "submit.sh: $*" >&2
    exit 2
}

[[ $# -ge 1 && $1 != -* ]] || die "usage: infra/submit.sh CONFIG [--set KEY=VALUE ...]"
config=$1
shift

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo_root"
[[ $config != /* ]] || die "CONFIG must be relative to the repository root ($repo_root): it is shipped in the working dir"
[[ -f $config ]] || die "config not found: $repo_root/$config"

# Run name for the default submission id: the last --set checkpoint.run_name=... wins, as in jobs.train.
run_name=${RUN_NAME:-}
if [[ -z $run_name ]]; then
    for arg in "$@"; do
        [[ $arg == checkpoint.run_name=* ]] && run_name=${arg#checkpoint.run_name=}
    done
fi
if [[ -z $run_name ]]; then
    # First `run_name:` key in the file (only the checkpoint section has one); quotes stripped.
    run_name=$(sed -n -E "s/^[[:space:]]+run_name:[[:space:]]*['\"]?([^'\"#[:space:]]+).*/\1/p" "$config" | head -n 1)
fi
if [[ -z $run_name ]]; then
    run_name=$(basename "$config")
    run_name=${run_name%.*}
fi
run_name=$(printf '%s' "$run_name" | tr -c 'A-Za-z0-9_.-' '-')
submission_id=${SUBMISSION_ID:-$run_name-$(date -u +%Y%m%dT%H%M%SZ)}

export RAY_ADDRESS=${RAY_ADDRESS:-http://127.0.0.1:8265}
export RAY_AUTH_MODE=token

# Excludes are gitignore patterns relative to the working dir ("/x/" = only the top-level x).
# Ray also skips what .gitignore lists; these are named so the upload stays small either way.
stop_wait=${STOP_WAIT_S:-600}
[[ $stop_wait =~ ^[0-9]+$ ]] || die "STOP_WAIT_S must be a whole number of seconds, got '$stop_wait'"
runtime_env='{"excludes": ["/data/", "/runs/", "/wandb/", "/.venv/", "/.git/", "/out/", "__pycache__/", "*.pyc"], '
runtime_env+="\"env_vars\": {\"RAY_JOB_STOP_WAIT_TIME_S\": \"$stop_wait\"}}"

read -r -a entrypoint <<<"${ENTRYPOINT:-python -m jobs.train}"
((${#entrypoint[@]} > 0)) || die "ENTRYPOINT is empty"

cmd=(
    ray job submit
    --address "$RAY_ADDRESS"
    --submission-id "$submission_id"
    --working-dir .
    --runtime-env-json "$runtime_env"
    --entrypoint-num-cpus "${ENTRYPOINT_NUM_CPUS:-1}"
    --metadata-json "{\"run_name\": \"$run_name\", \"config\": \"${config//[\"\\]/_}\"}"
)
[[ -n ${ENTRYPOINT_RESOURCES:-} ]] && cmd+=(--entrypoint-resources "$ENTRYPOINT_RESOURCES")
[[ ${NO_WAIT:-0} == 1 ]] && cmd+=(--no-wait)
cmd+=(-- "${entrypoint[@]}" --config "$config" "$@")

if [[ ${DRY_RUN:-0} == 1 ]]; then
    printf '%q ' "${cmd[@]}"
    printf '\n'
    exit 0
fi

if [[ -z ${RAY_AUTH_TOKEN:-} && -z ${RAY_AUTH_TOKEN_PATH:-} && ! -s $HOME/.ray/auth_token ]]; then
    die "no Ray auth token: set RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH, or put the cluster's token in ~/.ray/auth_token (docs/cluster.md, Token authentication)"
fi

echo "submit.sh: submission id $submission_id -> $RAY_ADDRESS" >&2
exec "${cmd[@]}"
