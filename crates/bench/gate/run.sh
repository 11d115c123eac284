#!/usr/bin/env bash
# Issue 73's gate: the delivery log beside today's full path, the minimal
# queue, "minimal + attempt row" and PgQ, in raw SQL with one tool (pgbench),
# so that the shapes differ only in their SQL. Each run builds its shape in a
# fresh schema with the same backlog, then 16 pgbench clients drain it; three
# rounds, each in another order, and the median of each shape is printed.
# Two stress cases follow for the log shape: a transaction held open
# elsewhere for the whole drain (also for minimal + attempt row, as a
# reference), and an endpoint that never answers while rotation drops the
# log's partitions.
#
#   crates/bench/gate/run.sh [--rounds N] [--backlog N] [--endpoints N]
#       [--clients N] [--shapes "full-100 log-100 ..."] [--no-stall]
#       [--wait-for FILE] [--smoke] [--stall-only] [--slots N]
#       [--publishers N] [--publish-size K] [--publish-rate R]
#
# Shapes are named shape-claimsize[-open|-pub]: full, minimal, minatt (minimal +
# attempt row), log, logwait (the log with claims that wait for a busy flow
# row: for --endpoints 1), pgq; "-open" holds a transaction open elsewhere;
# "-pub" (log shapes) runs --publishers more pgbench clients (default 4)
# publishing --publish-size events per transaction (default 10) to random
# endpoints through their flow rows (publish.pgbench) during the drain, and
# adds the events published per second to the line: the cost of ADR 0047's
# sequence numbers from the flow row, which publishers and claimers share.
# logstage: the log whose publishes take no lock a claim holds: they append
# to an inbox (publish_stage.pgbench), and each claim first folds one
# endpoint's inbox into its log (fold.pgbench). Suffixes combine:
# logstage-100-pub-open. logstagewait: the same with claims that wait for a
# busy flow row (for --endpoints 1).
# The single-endpoint case: --endpoints 1 --shapes "full-100 minatt-100
# logwait-100" --no-stall.
#
# --smoke: a small backlog, 4 clients, one round, every shape: checks the
# SQL and each shape's invariants (every delivery drained once, cursors and
# attempt counts agreeing), not the speed.
# --stall-only: only the stalled-endpoint case (with --backlog 2000000
# --slots 10 it shows rotation while the others drain).
# --wait-for FILE: before the timed rounds, waits up to 100 minutes for FILE
# to exist (someone creates it when the machine is quiet).
#
# Needs psql and pgbench, and PgQ on the server for the pgq shapes
# (apt-get install postgresql-15-pgq3). GATE_DATABASE_URL names the database
# (default postgres://postgres@127.0.0.1:5432/test).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
migrations=$here/../../store-postgres/src/migrations
DB=${GATE_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}
ROUNDS=3
BACKLOG=200000
ENDPOINTS=16
CLIENTS=16
SHAPES="full-100 full-500 minimal-100 minimal-500 minatt-100 minatt-500 log-100 log-500 pgq-100 pgq-500 log-100-open minatt-100-open"
STALL=1
WAIT_FOR=""
# Seconds a failed delivery of the log shape waits before its retry: short
# enough that retries are claimed again within a round.
BACKOFF=1
# Time partitions the log's backlog was appended over.
SLOTS=3
STALL_ONLY=0
PUBLISHERS=4
PUBLISH_SIZE=10
# Publish transactions per second over all publishers (pgbench -R); 0: as fast as they go.
PUBLISH_RATE=0
publisher_pid=""
while [ $# -gt 0 ]; do
  case $1 in
    --rounds) ROUNDS=$2; shift 2 ;;
    --backlog) BACKLOG=$2; shift 2 ;;
    --endpoints) ENDPOINTS=$2; shift 2 ;;
    --clients) CLIENTS=$2; shift 2 ;;
    --shapes) SHAPES=$2; shift 2 ;;
    --no-stall) STALL=0; shift ;;
    --stall-only) STALL_ONLY=1; shift ;;
    --slots) SLOTS=$2; shift 2 ;;
    --publishers) PUBLISHERS=$2; shift 2 ;;
    --publish-size) PUBLISH_SIZE=$2; shift 2 ;;
    --publish-rate) PUBLISH_RATE=$2; shift 2 ;;
    --wait-for) WAIT_FOR=$2; shift 2 ;;
    --smoke) ROUNDS=1; BACKLOG=20000; CLIENTS=4; ENDPOINTS=4; BACKOFF=0; shift ;;
    *) echo "unknown argument: $1 (see the head of $0)" >&2; exit 64 ;;
  esac
done
if [ "$CLIENTS" != "$ENDPOINTS" ] && [[ " $SHAPES " == *" pgq-"* ]]; then
  echo "the pgq shapes need --clients = --endpoints: each client is the one consumer of one endpoint's queue" >&2
  exit 64
fi

work=$(mktemp -d /tmp/gate.XXXXXX)
# "logwait": the log shape whose claim waits for the flow row instead of
# skipping it, for a single endpoint, where skipping would leave most
# claims empty while another claim or an outcome holds that one row.
sed 's/FOR UPDATE SKIP LOCKED/FOR UPDATE/' "$here/log.pgbench" >"$work/log_wait.pgbench"
cat "$here/fold.pgbench" "$here/log.pgbench" >"$work/log_stage.pgbench"
cat "$here/fold.pgbench" "$work/log_wait.pgbench" >"$work/log_stage_wait.pgbench"
holder_app="gate_holder_$$"
holder_pid=""
rotator_pid=""

q() { PGOPTIONS="${PGOPTIONS:-} -c client_min_messages=warning" psql "$DB" -X -q -At -v ON_ERROR_STOP=1 "$@"; }

stop_holder() {
  if [ -n "$holder_pid" ]; then
    q -c "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = '$holder_app'" >/dev/null
    wait "$holder_pid" 2>/dev/null || true
    holder_pid=""
  fi
}
# Publishers of the log beside a drain ("-pub" shapes), until stopped.
start_publishers() {
  local script=$here/publish.pgbench rate=""
  [ "$PUBLISH_RATE" = 0 ] || rate="-R $PUBLISH_RATE"
  case $1 in logstage-*|logstagewait-*) script=$here/publish_stage.pgbench ;; esac
  # shellcheck disable=SC2086
  PGOPTIONS="-c search_path=gate_log" pgbench -n -M prepared -c "$PUBLISHERS" -j 1 -T 3600 $rate \
    -f "$script" -D endpoints="$ENDPOINTS" -D k="$PUBLISH_SIZE" -D slot=$((SLOTS + 1)) \
    "$DB" >"$work/publishers.out" 2>&1 &
  publisher_pid=$!
  sleep 0.5
}
stop_publishers() {
  if [ -n "$publisher_pid" ]; then
    kill "$publisher_pid" 2>/dev/null || true
    wait "$publisher_pid" 2>/dev/null || true
    publisher_pid=""
  fi
}
cleanup() {
  stop_publishers
  stop_holder
  if [ -n "$rotator_pid" ]; then kill "$rotator_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

# One transaction held open elsewhere: it has an xid and a snapshot, so no
# row version deleted after it began can be removed, by vacuum or by the
# pruning that readers do, until it ends.
start_holder() {
  PGAPPNAME=$holder_app psql "$DB" -X -q -c "BEGIN" -c "SELECT txid_current()" -c "SELECT pg_sleep(7200)" \
    >/dev/null 2>&1 &
  holder_pid=$!
  for _ in $(seq 50); do
    [ "$(q -c "SELECT count(*) FROM pg_stat_activity WHERE application_name = '$holder_app' AND backend_xid IS NOT NULL")" = 1 ] && return
    sleep 0.1
  done
  echo "the open transaction did not start" >&2
  exit 1
}

fresh_schema() { q -c "DROP SCHEMA IF EXISTS $1 CASCADE" -c "CREATE SCHEMA $1" 2>/dev/null; }

# n copies of a value, as an array literal.
array_of() { local out="" i; for ((i = 0; i < $1; i++)); do out+="${out:+,}$2"; done; echo "{$out}"; }

# The schema and the session settings each shape's SQL runs with. The full
# path runs the adapter's plan settings (generic plans forced, ADR 0040);
# the others PostgreSQL's default plan choice, as in BENCHMARKS.md's earlier
# raw-SQL rounds (forced generic plans made the minimal queue 3 x slower).
schema_of() {
  case $1 in
    full-*) echo gate_full ;; minimal-*|minatt-*) echo gate_minimal ;; log-*|logwait-*|logstage-*|logstagewait-*) echo gate_log ;; pgq-*) echo public ;;
  esac
}
options_of() {
  local o="-c search_path=$(schema_of "$1")"
  case $1 in
    full-*) o+=" -c plan_cache_mode=force_generic_plan -c enable_seqscan=off -c enable_hashjoin=off -c enable_mergejoin=off" ;;
  esac
  echo "$o"
}

# Builds the shape's schema and backlog; not timed.
setup() {
  local shape=$1 n=$2 s now
  s=$(schema_of "$shape")
  case $shape in
    full-*)
      fresh_schema "$s"
      { echo "SET search_path TO $s;"; cat "$migrations"/*.sql; } | q -1 >/dev/null
      now=$(date +%s%3N)
      echo "$now" > "$work/now"
      PGOPTIONS="-c search_path=$s" q -v now="$now" -v endpoints="$ENDPOINTS" -v backlog="$BACKLOG" \
        -f "$here/full_setup.sql" >/dev/null ;;
    minimal-*|minatt-*)
      fresh_schema "$s"
      PGOPTIONS="-c search_path=$s" q -v backlog="$BACKLOG" -f "$here/minimal_setup.sql" >/dev/null ;;
    log-*|logwait-*|logstage-*|logstagewait-*)
      fresh_schema "$s"
      PGOPTIONS="-c search_path=$s" q -v endpoints="$ENDPOINTS" -v backlog="$BACKLOG" -v slots="$SLOTS" -v cap=10000 \
        -f "$here/log_setup.sql" >/dev/null ;;
    pgq-*)
      q -v endpoints="$ENDPOINTS" -v backlog="$BACKLOG" -v n="$n" -f "$here/pgq_setup.sql" >/dev/null ;;
  esac
  # Each drain starts from a clean checkpoint, so that none falls inside one
  # by chance of the order.
  q -c "CHECKPOINT"
}

# The pgbench script and variables of a shape.
script_of() {
  case $1 in
    full-*) echo "$here/full.pgbench" ;; minimal-*) echo "$here/minimal.pgbench" ;;
    minatt-*) echo "$here/minimal_attempt.pgbench" ;; log-*) echo "$here/log.pgbench" ;; pgq-*) echo "$here/pgq.pgbench" ;;
    logwait-*) echo "$work/log_wait.pgbench" ;; logstage-*) echo "$work/log_stage.pgbench" ;;
    logstagewait-*) echo "$work/log_stage_wait.pgbench" ;;
  esac
}
vars_of() {
  local shape=$1 n=$2 stalled=${3:-0}
  echo "-D n=$n"
  case $shape in
    full-*)
      local now eps="" counts="" e share
      now=$(cat "$work/now")
      for ((e = 1; e <= ENDPOINTS; e++)); do
        eps+="${eps:+,}$(printf '00000000-0000-4000-8000-%012x' "$e")"
        # share_claim spreads a claim evenly over the endpoints with room.
        share=$((n / ENDPOINTS + (e <= n % ENDPOINTS ? 1 : 0)))
        counts+="${counts:+,}$share"
      done
      echo "-D now=$now -D expires=$((now + 60000)) -D minute=$((now - now % 60000)) -D leased=leased"
      echo "-D eps={$eps} -D counts={$counts} -D heads=$(array_of "$ENDPOINTS" NULL) -D caps=$(array_of "$ENDPOINTS" 10000)"
      echo "-D codes=$(array_of "$n" 200) -D latencies=$(array_of "$n" 1) -D buckets=$(array_of "$n" 0)" ;;
    log-*|logwait-*|logstage-*|logstagewait-*) echo "-D backoff=$BACKOFF -D stalled=$stalled -D slot=$((SLOTS + 1))" ;;
    pgq-*) echo "-D endpoints=$ENDPOINTS" ;;
  esac
}

# Checks the shape's invariants after a drain and prints what it drained.
check() {
  local shape=$1 stalled=${2:-0} out
  case $shape in
    full-*) out=$(PGOPTIONS="$(options_of "$shape")" q -f "$here/full_check.sql") ;;
    minimal-*) out=$(PGOPTIONS="$(options_of "$shape")" q -v backlog="$BACKLOG" -v attempts=0 -f "$here/minimal_check.sql") ;;
    minatt-*) out=$(PGOPTIONS="$(options_of "$shape")" q -v backlog="$BACKLOG" -v attempts=1 -f "$here/minimal_check.sql") ;;
    log-*|logwait-*|logstage-*|logstagewait-*) out=$(PGOPTIONS="$(options_of "$shape")" q -v stalled="$stalled" -f "$here/log_check.sql") ;;
    pgq-*) out=$(q -v backlog="$BACKLOG" -f "$here/pgq_check.sql") ;;
  esac
  echo "$out" | awk -F'|' '$1 == "drained" { print $2 }'
}

# pgbench over a shape: $1 shape, $2 transactions per client, $3 stalled
# endpoint (log only). Prints pgbench's own seconds (transactions / tps,
# without the connections' start).
bench() {
  local shape=$1 t=$2 stalled=${3:-0} n out txns tps
  n=${shape#*-}; n=${n%%-*}
  out="$work/pgbench.out"
  # shellcheck disable=SC2046
  if ! PGOPTIONS="$(options_of "$shape")" pgbench -n -M prepared -c "$CLIENTS" -j 2 -t "$t" \
      -f "$(script_of "$shape")" $(vars_of "$shape" "$n" "$stalled") "$DB" >"$out" 2>&1 \
      || grep -q "aborted" "$out"; then
    echo "pgbench failed for $shape:" >&2; tail -20 "$out" >&2; exit 1
  fi
  txns=$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' "$out")
  tps=$(sed -n 's/^tps = \([0-9.]*\) (without initial connection time)/\1/p' "$out")
  echo "$txns / $tps" | bc -l
}

# The server's WAL position and this database's commits so far (both
# server-wide: anything else writing at the same time counts too).
db_cost() { q -c "SELECT pg_current_wal_lsn() - '0/0', xact_commit FROM pg_stat_database WHERE datname = current_database()"; }

# One drain: pgbench, then the shape's checks. Prints "drained seconds rate
# WAL-bytes-per-delivery commits-per-delivery". A claim that finds nothing
# to take (every endpoint with work busy) still counts as a transaction, so
# the drained count comes from the database.
drain() {
  local shape=$1 t=$2 secs drained before after heads0=0 heads1=0 published=""
  case $shape in *-pub*) heads0=$(PGOPTIONS="$(options_of "$shape")" q -c "SELECT last_value FROM event_ids") ;; esac
  before=$(db_cost)
  secs=$(bench "$shape" "$t")
  after=$(db_cost)
  case $shape in *-pub*)
    heads1=$(PGOPTIONS="$(options_of "$shape")" q -c "SELECT last_value FROM event_ids")
    published=$(printf ' %.0f' "$(echo "($heads1 - $heads0) / $secs" | bc -l)") ;;
  esac
  drained=$(check "$shape")
  # WAL and commits per delivery drained; with publishers they include the
  # publishes' (server-wide counters).
  printf '%s %.2f %.0f %.0f %.3f%s\n' "$drained" "$secs" "$(echo "$drained / $secs" | bc -l)" \
    "$(echo "(${after%%|*} - ${before%%|*}) / $drained" | bc -l)" \
    "$(echo "(${after##*|} - ${before##*|}) / $drained" | bc -l)" "$published"
}

# Transactions per client: a claim each, 96 % of the backlog in all, so
# that the backlog never runs dry under the claims (as in the earlier
# rounds: 192,000 of 200,000).
per_client() { echo $((BACKLOG * 96 / 100 / (CLIENTS * $1))); }

run_shape() {
  local shape=$1 n
  n=${shape#*-}; n=${n%%-*}
  setup "$shape" "$n"
  case $shape in *-open) start_holder ;; esac
  case $shape in *-pub*) start_publishers "$shape" ;; esac
  drain "$shape" "$(per_client "$n")"
  case $shape in *-pub*) stop_publishers ;; esac
  case $shape in *-open) stop_holder ;; esac
  case $shape in pgq-*) q -c "SELECT pgq.drop_queue(queue_name, true) FROM pgq.queue WHERE queue_name LIKE 'gate_q_%'" >/dev/null ;; esac
}

if [ -n "$WAIT_FOR" ]; then
  for ((i = 0; i < 200; i++)); do [ -e "$WAIT_FOR" ] && break; sleep 30; done
  if [ -e "$WAIT_FOR" ]; then echo "# $WAIT_FOR found at $(date -u +%H:%M:%S) UTC"
  else echo "# $WAIT_FOR did not appear in 100 minutes: these rounds ran on a busy machine"; fi
fi

[ "$STALL_ONLY" = 1 ] && SHAPES="" ROUNDS=0
read -r -a shapes <<<"$SHAPES"
count=${#shapes[@]}
echo "# $(date -u '+%Y-%m-%d %H:%M') UTC, backlog $BACKLOG over $ENDPOINTS endpoints, $CLIENTS clients, $ROUNDS round(s)"
echo "# round | shape | load (1 min) before | deliveries drained | seconds | deliveries/s | WAL bytes per delivery | commits per delivery | publishes/s (-pub shapes)"
results="$work/results"
: >"$results"
for ((r = 0; r < ROUNDS; r++)); do
  echo "# round $((r + 1)): $(uptime)"
  # Round r starts r thirds of the way along the list, so that no shape
  # always runs first or right after the same neighbour.
  for ((i = 0; i < count; i++)); do
    shape=${shapes[$(((i + r * count / ROUNDS) % count))]}
    load=$(cut -d' ' -f1 /proc/loadavg)
    line=$(run_shape "$shape")
    echo "$((r + 1)) $shape $load $line" | tee -a "$results"
  done
done

if [ "$ROUNDS" -gt 0 ]; then
median() { sort -n | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
echo
echo "| shape | deliveries/s, each round | median | WAL bytes per delivery (median) | commits per delivery (median) |"
echo "| --- | --- | --- | --- | --- |"
for shape in "${shapes[@]}"; do
  rates=$(awk -v s="$shape" '$2 == s { printf "%s%s", sep, $6; sep = ", " }' "$results")
  med=$(awk -v s="$shape" '$2 == s { print $6 }' "$results" | median)
  wal=$(awk -v s="$shape" '$2 == s { print $7 }' "$results" | median)
  commits=$(awk -v s="$shape" '$2 == s { print $8 }' "$results" | median)
  echo "| $shape | $rates | $med | $wal | $commits |"
  eval "med_${shape//-/_}=$med"
done
ratio() { if [ -n "${!1:-}" ] && [ -n "${!2:-}" ]; then printf '%s / %s = %.2f\n' "${1#med_}" "${2#med_}" "$(echo "${!1} / ${!2}" | bc -l)"; fi; }
echo
ratio med_log_100 med_full_100
ratio med_log_500 med_full_500
ratio med_log_100 med_minatt_100
ratio med_log_500 med_minatt_500
ratio med_log_100_open med_log_100
ratio med_minatt_100_open med_minatt_100
ratio med_pgq_100 med_log_100
ratio med_log_100_pub med_log_100
ratio med_logwait_100_pub med_logwait_100
ratio med_logwait_500_pub med_logwait_500
ratio med_logstage_100_pub med_log_100_pub
ratio med_logstage_100_pub_open med_logstage_100_pub
ratio med_logstagewait_100_pub med_logwait_100_pub
for shape in "${shapes[@]}"; do
  case $shape in *-pub*)
    echo "$shape: publishes/s, each round: $(awk -v s="$shape" '$2 == s { printf "%s%s", sep, $9; sep = ", " }' "$results")" ;;
  esac
done
fi

drop_schemas() {
  q -c "DROP SCHEMA IF EXISTS gate_full CASCADE" -c "DROP SCHEMA IF EXISTS gate_minimal CASCADE" \
    -c "DROP SCHEMA IF EXISTS gate_log CASCADE"
}
[ "$STALL" = 1 ] || { drop_schemas; exit 0; }

# ------------------------------------------------------------------ stalled
# One endpoint never answers: the drainers lease its batches up to its cap
# (1,000 in flight) and never record an outcome, while the other endpoints
# drain and rotate_log runs every half second. Run once with that endpoint
# and once without (it then answers like the others); everything else equal.
stall_case() {
  local stalled=$1 s=gate_log line
  setup log-100 100
  PGOPTIONS="-c search_path=$s" q -c "UPDATE flow SET cap = 1000 WHERE endpoint_id = 1" -c "UPDATE flow SET acked_at = now()"
  (
    while true; do
      echo "$(date -u +%H:%M:%S.%2N) $(PGOPTIONS="-c search_path=$s" q -c "SELECT rotate_log('3 seconds')")"
      sleep 0.5
    done
  ) >"$work/rotation.$stalled" 2>&1 &
  rotator_pid=$!
  # pgbench in short runs until every other endpoint is drained whole, its
  # retries included.
  local secs=0 drained chunk=$((BACKLOG / (CLIENTS * 100 * 20) > 10 ? BACKLOG / (CLIENTS * 100 * 20) : 10))
  echo "stalled endpoint $stalled: drain starts $(date -u +%H:%M:%S.%2N)"
  while [ "$(PGOPTIONS="-c search_path=$s" q -c "SELECT count(*) FROM flow WHERE endpoint_id <> $stalled
              AND (claimed < head OR in_flight > 0 OR next_retry_at IS NOT NULL)")" != 0 ]; do
    secs=$(echo "$secs + $(bench log-100 "$chunk" "$stalled")" | bc -l)
  done
  echo "stalled endpoint $stalled: drain ends $(date -u +%H:%M:%S.%2N)"
  drained=$(check log-100 "$stalled")
  line=$(printf '%s %.2f %.0f' "$drained" "$secs" "$(echo "$drained / $secs" | bc -l)")
  # Rotation carries on after the drain until only the open slot is left.
  for _ in $(seq 40); do
    [ "$(PGOPTIONS="-c search_path=$s" q -c "SELECT count(*) FROM log_slots")" = 1 ] && break
    sleep 0.5
  done
  kill "$rotator_pid" 2>/dev/null || true; wait "$rotator_pid" 2>/dev/null || true; rotator_pid=""
  echo "stalled endpoint $stalled: drained, seconds, deliveries/s: $line"
  grep -v "only the current slot" "$work/rotation.$stalled" | uniq -f1 | sed 's/^/  rotation /'
  PGOPTIONS="-c search_path=$s" q -F ' ' -c "
    SELECT 'log rows left (held):', (SELECT count(*) FROM log), (SELECT count(*) FROM log_held),
           'slots:', (SELECT string_agg(slot::text, ',') FROM log_slots),
           'log bytes:', (SELECT sum(pg_total_relation_size(c.oid)) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
                          WHERE i.inhparent = 'log'::regclass),
           'schema bytes:', (SELECT sum(pg_total_relation_size(c.oid)) FROM pg_class c
                             WHERE c.relnamespace = '$s'::regnamespace AND c.relkind = 'r')" | sed 's/^/  /'
}
echo
echo "# stalled endpoint, with rotation: $(uptime)"
stall_case 1
stall_case 0
drop_schemas
