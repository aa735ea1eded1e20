#!/usr/bin/env bash
# redis.sh start|stop [DIR]: a throwaway redis-server on a free loopback port.
# start prints the address and writes it to DIR/addr (default .redis/).
set -euo pipefail
cmd=${1:-start}
dir=${2:-.redis}
case "$cmd" in
start)
  command -v redis-server >/dev/null || { echo "redis-server missing: run 'make deps-redis'" >&2; exit 1; }
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  if [ -f "$dir/pid" ] && kill -0 "$(cat "$dir/pid")" 2>/dev/null; then
    cat "$dir/addr"; exit 0
  fi
  for _ in 1 2 3 4 5; do
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])' 2>/dev/null || shuf -i 20000-60000 -n 1)
    if redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no \
        --daemonize yes --pidfile "$dir/pid" --logfile "$dir/redis.log" --dir "$dir" >/dev/null; then
      for _ in $(seq 50); do
        if redis-cli -p "$port" ping >/dev/null 2>&1; then
          echo "127.0.0.1:$port" > "$dir/addr"; cat "$dir/addr"; exit 0
        fi
        sleep 0.1
      done
    fi
  done
  echo "redis-server did not start; see $dir/redis.log" >&2; exit 1 ;;
stop)
  if [ -f "$dir/addr" ]; then
    redis-cli -h 127.0.0.1 -p "$(cut -d: -f2 < "$dir/addr")" shutdown nosave >/dev/null 2>&1 || true
  fi
  rm -f "$dir/addr" "$dir/pid" ;;
*) echo "usage: $0 start|stop [DIR]" >&2; exit 2 ;;
esac
