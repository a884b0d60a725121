#!/usr/bin/env bash
# A tenant's workload inside an intern, through the gateway (docs/benchmarks.md,
# "The price of the second wall"): `cohort serve --provisioner P`, then the demo
# intern's shell (self-drive) makes a small Go project in a local git repository
# and, timed inside the intern, clones it and builds it: cold (an empty build
# cache) and warm (the cache of the cold runs). Prints one line per run and the
# medians.
#
#   tools/bench-tenant/run.sh COHORT_BINARY PROVISIONER [RUNS [SERVE_FLAGS...]]
#   (e.g. --gvisor-runsc PATH)
set -euo pipefail
cohort=$1 provisioner=$2 runs=${3:-3}
extra=("${@:4}")
dir=$(mktemp -d /tmp/cohort-bench-tenant-XXXXXX)
trap 'kill $gw 2>/dev/null; wait $gw 2>/dev/null; rm -rf "$dir"' EXIT
"$cohort" serve --listen 127.0.0.1:0 --data-dir "$dir/data" --provisioner "$provisioner" \
  --jail-orphan-timeout 0 --log-level error "${extra[@]}" >"$dir/out" 2>"$dir/err" &
gw=$!
for _ in $(seq 300); do grep -q "listening on" "$dir/out" 2>/dev/null && break; sleep 0.1; done
url=$(sed -n 's/.*listening on \(http[^ ]*\).*/\1/p' "$dir/out" | head -1)
read -r key intern < <(python3 -c 'import json,sys; b=json.load(open(sys.argv[1])); print(b["workspace_key"], b["intern_id"])' "$dir/data/bootstrap.json")
turn() { # a self-drive shell command; prints the shell's output
  python3 - "$url" "$key" "$intern" "$1" <<'PY'
import json, sys, urllib.request
url, key, intern, cmd = sys.argv[1:]
req = urllib.request.Request(f"{url}/api/v1/interns/{intern}/chat/completions",
    data=json.dumps({"stream": True, "messages": [{"role": "user", "content": "$ " + cmd}]}).encode(),
    headers={"Authorization": "Bearer " + key, "Content-Type": "application/json"})
text = ""
with urllib.request.urlopen(req, timeout=600) as r:
    for line in r:
        line = line.decode().strip()
        if line.startswith("data: {"):
            for c in json.loads(line[6:]).get("choices", []):
                text += c.get("delta", {}).get("content") or ""
print(text)
PY
}
setup='set -e; rm -rf /intern/bench; mkdir -p /intern/bench/src/greet; cd /intern/bench/src; git init -q
printf "module example.com/hello\n\ngo 1.22\n" > go.mod
printf "package greet\n\nimport \"fmt\"\n\nfunc Hello(n string) string { return fmt.Sprintf(\"hello, %%s\", n) }\n" > greet/greet.go
printf "package main\n\nimport (\n\t\"fmt\"\n\n\t\"example.com/hello/greet\"\n)\n\nfunc main() { fmt.Println(greet.Hello(\"tenant\")) }\n" > main.go
git add -A; git -c user.email=b@example.com -c user.name=bench commit -qm init; echo setup-ok'
turn "$setup" | grep -q setup-ok || { echo "setup failed"; turn "$setup"; exit 1; }
run() { # $1: cold|warm
  turn "cd /intern/bench; rm -rf dst; [ $1 = cold ] && rm -rf cache; export GOCACHE=/intern/bench/cache GOTOOLCHAIN=local GOFLAGS=-mod=mod; s=\$(date +%s%N); git clone -q src dst && cd dst && /usr/local/go/bin/go build -o /tmp/hello . && /tmp/hello >/dev/null && e=\$(date +%s%N) && echo elapsed-ms \$(( (e-s)/1000000 ))" |
    sed -n 's/.*elapsed-ms \([0-9]*\).*/\1/p' | head -1
}
for mode in cold warm; do
  ms=()
  for i in $(seq "$runs"); do
    m=$(run $mode); ms+=("$m"); echo "$provisioner $mode run $i: ${m} ms"
  done
  printf '%s\n' "${ms[@]}" | sort -n | awk -v p="$provisioner" -v m="$mode" '{a[NR]=$1} END {print p, m, "median", a[int((NR+1)/2)], "ms"}'
done
