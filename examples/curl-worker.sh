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

# Resuming: the claim's answer carries what earlier attempts of the job kept, the results of its
# recorded steps ("steps") and the values of its cursors ("cursors"), by name. These use the job
# being run: $job (the claim's answer), $id and $lease.

# step NAME COMMAND...: the result of the job's step NAME: the one an earlier attempt recorded,
# or else COMMAND's output (JSON), recorded before it is used, so that no later attempt runs it.
step() {
    local name=$1 result
    shift
    if jq -e --arg name "$name" '.steps // {} | has($name)' <<<"$job" >/dev/null; then
        jq -c --arg name "$name" '.steps[$name]' <<<"$job"
        return
    fi
    result=$("$@") || return
    case "$(post "v1/jobs/$id/steps" "$(jq -c --arg name "$name" --argjson result "$result" \
        '. + {name: $name, result: $result}' <<<"$lease")")" in
        200 | 201) jq -c .result "$BODY" ;; # 200: recorded already, and its result stands
        *) echo "step $name: $(cat "$BODY")" >&2 && return 1 ;;
    esac
}

# cursor NAME DEFAULT: the value an earlier attempt saved as the cursor NAME (JSON), or DEFAULT.
cursor() {
    jq -c --arg name "$1" --argjson default "$2" \
        'if .cursors // {} | has($name) then .cursors[$name] else $default end' <<<"$job"
}

# save_cursor NAME VALUE: save VALUE (JSON) as the cursor NAME, for a later attempt to go on
# from; fails once the lease is lost (409).
save_cursor() {
    [ "$(post "v1/jobs/$id/cursor" "$(jq -c --arg name "$1" --argjson value "$2" \
        '. + {name: $name, value: $value}' <<<"$lease")")" = 200 ] ||
        { echo "cursor $1: $(cat "$BODY")" >&2 && return 1; }
}

# remote.count N SECONDS: count from 1 to N, a number every SECONDS: a long job. It heartbeats
# and saves its cursor after each number, and goes on after the last one saved; its step keeps
# when the count first started.
count() {
    local n pause started from i
    n=$(jq -e '.args[0] | numbers | floor' <<<"$job") || { echo "count to a number" >&2 && return 1; }
    pause=$(jq -r '.args[1] // 0' <<<"$job")
    started=$(step started date -u +'"%Y-%m-%dT%H:%M:%SZ"') || return
    from=$(cursor next 1) || return
    for ((i = from; i <= n; i++)); do
        sleep "$pause" # the work of number $i
        [ "$(post "v1/jobs/$id/heartbeat" "$lease")" = 200 ] || { echo "lease lost" >&2 && return 1; }
        save_cursor next $((i + 1)) || return
    done
    jq -nc --argjson n "$n" --argjson from "$from" --argjson started "$started" \
        '{counted: $n, from: $from, started: $started}'
}

# run TASK: the result of $job, of task TASK, as JSON on stdout, or its error message on stderr
# (and a failing status). One branch per task this worker runs.
run() {
    case "$1" in
        remote.upper) jq -ce '.args[0] | ascii_upcase' <<<"$job" ;;
        remote.count) count ;;
        *) echo "this worker does not run $1" >&2 && return 1 ;;
    esac
}

CLAIM_BODY=$(jq -nc --arg worker "$WORKER" --arg queues "$QUEUES" \
    '{worker: $worker, queues: ($queues | split(",")), tasks: ["remote.upper", "remote.count"],
      wait: 20}')
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

    # 2. Run it. A job that runs longer than the worker timeout must heartbeat meanwhile (as
    #    remote.count does); this loop heartbeats once, and stops if the lease is lost.
    [ "$(post "v1/jobs/$id/heartbeat" "$lease")" = 200 ] || { echo "job $id: lease lost" >&2; continue; }
    if result=$(run "$(jq -r .task <<<"$job")" 2>"$BODY.error"); then
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
