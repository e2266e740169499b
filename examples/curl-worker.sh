#!/usr/bin/env bash
# A worker of django-jobs' HTTP API (docs: /jobs/api/, protocol v1) in bash, curl and jq: it
# holds no database connection, only a token. Run it with
#   API_URL=http://127.0.0.1:8000/jobs/api/ API_TOKEN=djt_... examples/curl-worker.sh
# Settings: API_URL, API_TOKEN (or TOKEN_FILE, a file holding it), WORKER (default: the host's
# name), QUEUES (comma-separated, default "remote"). SIGTERM or SIGINT stops it between jobs.
set -uo pipefail

API_URL="${API_URL:?set API_URL, e.g. http://127.0.0.1:8000/jobs/api/}"
API_URL="${API_URL%/}/"
[ -z "${API_TOKEN:-}" ] && [ -n "${TOKEN_FILE:-}" ] && API_TOKEN=$(tr -d '[:space:]' <"$TOKEN_FILE")
API_TOKEN="${API_TOKEN:?set API_TOKEN or TOKEN_FILE}"
WORKER="${WORKER:-$(hostname)}"
QUEUES="${QUEUES:-remote}"
BODY=$(mktemp)
CLAIM=""

# On SIGTERM/SIGINT: stop the long poll at once; a job being run is finished first (bash runs
# the trap between commands). A claim the server answered as curl was stopped is given back by
# the reaper, like any job of a worker that went away.
RUNNING=1
trap 'RUNNING=0; [ -n "$CLAIM" ] && kill "$CLAIM" 2>/dev/null' TERM INT
trap 'rm -f "$BODY"' EXIT

# post PATH JSON: POST to the API; the answer's body goes to $BODY, its status to stdout
# ("000" when the server could not be reached).
CURL=(curl -sS -o "$BODY" -w '%{http_code}' -X POST --max-time 60
    -H "Authorization: Bearer $API_TOKEN" -H 'Content-Type: application/json')
post() { "${CURL[@]}" --data "$2" "$API_URL$1"; }

# run TASK JOB_JSON: the job's result as JSON on stdout, or its error message on stderr (and a
# failing status). One branch per task this worker runs.
run() {
    case "$1" in
        remote.upper) jq -ce '.args[0] | ascii_upcase' <<<"$2" ;;
        *) echo "this worker does not run $1" >&2 && return 1 ;;
    esac
}

CLAIM_BODY=$(jq -nc --arg worker "$WORKER" --arg queues "$QUEUES" \
    '{worker: $worker, queues: ($queues | split(",")), tasks: ["remote.upper"], wait: 20}')
while [ "$RUNNING" = 1 ]; do
    # 1. Claim: wait up to 20 s for a job. In the background, so that a signal ends the wait.
    "${CURL[@]}" --data "$CLAIM_BODY" "${API_URL}v1/claim" >"$BODY.status" &
    CLAIM=$!
    wait "$CLAIM"
    CLAIM=""
    status=$(cat "$BODY.status" 2>/dev/null)
    rm -f "$BODY.status"
    [ "$RUNNING" = 1 ] || break
    case "$status" in
        200) ;;
        204) continue ;; # nothing came within the wait: ask again
        *) echo "claim answered ${status:-nothing}: $(cat "$BODY")" >&2 && sleep 1 && continue ;;
    esac
    job=$(jq -c .job "$BODY")
    id=$(jq -r .id <<<"$job")
    lease=$(jq -c '{lease}' <<<"$job")

    # 2. Run it. A job that runs longer than the worker timeout must heartbeat meanwhile;
    #    this one heartbeats once, and stops if the lease is lost (the job was reaped).
    [ "$(post "v1/jobs/$id/heartbeat" "$lease")" = 200 ] || { echo "job $id: lease lost" >&2; continue; }
    if result=$(run "$(jq -r .task <<<"$job")" "$job" 2>"$BODY.error"); then
        ending=$(jq -c --argjson result "$result" '. + {outcome: "done", result: $result}' <<<"$lease")
    else
        ending=$(jq -c --rawfile error "$BODY.error" '. + {outcome: "error", error: $error}' <<<"$lease")
    fi
    rm -f "$BODY.error"

    # 3. Finish it: done with its result, or error with the message (the job is retried while
    #    it has attempts left). 409: the lease was lost meanwhile, and the finish not recorded.
    status=$(post "v1/jobs/$id/finish" "$ending")
    [ "$status" = 200 ] || echo "job $id: finish answered $status: $(cat "$BODY")" >&2
done
