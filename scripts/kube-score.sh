#!/usr/bin/env bash
# make score (part of make test): score the rendered chart with kube-score, an outside
# manifest linter, for the default values and every values set in charts/ferry/ci/, and fail
# on any CRITICAL finding that is not a documented exception.
#
# A documented exception is a check named in the object's `kube-score/ignore` annotation AND
# in the table "kube-score exceptions" of charts/ferry/README.md for that component. kube-score
# runs with the annotations disabled, so this script sees every finding and checks that each
# annotation hides exactly what it says: an exception listed but not documented, documented
# but no longer needed (the check passes), or hiding more than its reason covers
# (`container-resources` also silences the ephemeral-storage check inside kube-score) fails.
#
# Usage: scripts/kube-score.sh [HELM ARGS...]   e.g. --set networkPolicy.enabled=false
# (extra arguments go to every `helm template`; the tests use them to show a finding fails).
set -euo pipefail
cd "$(dirname "$0")/.."
tools=${FERRY_TOOLS:-/var/cache/ferry-tools}
if [[ -f $tools/env.sh ]]; then
  # shellcheck source=/dev/null
  source "$tools/env.sh"
fi
helm=${FERRY_HELM:-}
score=${FERRY_KUBE_SCORE:-}
for t in "$helm" "$score"; do
  [[ -n $t && -x $t ]] || { echo "helm or kube-score is not installed ($tools): run 'make deps'" >&2; exit 1; }
done

chart=charts/ferry
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
sets=(default)
for v in "$chart"/ci/*.yaml; do sets+=("$(basename "$v")"); done
for s in "${sets[@]}"; do
  args=()
  [[ $s == default ]] || args=(-f "$chart/ci/$s")
  "$helm" template ferry "$chart" --namespace ferry-system "${args[@]}" "$@" >"$work/$s.yaml"
  # What kube-score's Kubernetes version changes is which API versions count as stable.
  "$score" score -o json --kubernetes-version v1.35 --disable-ignore-checks-annotations \
    "$work/$s.yaml" >"$work/$s.json" || true
  [[ -s $work/$s.json ]] || { echo "kube-score produced no output for $s" >&2; exit 1; }
done

exec python3 - "$work" "$chart/README.md" "${sets[@]}" <<'PY'
import json, re, sys

work, readme, sets = sys.argv[1], sys.argv[2], sys.argv[3:]
CRITICAL, WARNING = 1, 5
# Rows of the README's exceptions table: | `check-id` | component, component | reason |
documented = {}
for line in open(readme, encoding="utf-8"):
    m = re.match(r"\|\s*`([a-z0-9-]+)`\s*\|([^|]*)\|\s*(\S.*)\|\s*$", line)
    if m:
        for comp in re.split(r"[,\s]+", m.group(2).strip()):
            if comp:
                documented.setdefault(m.group(1), set()).add(comp)
# What an exception may hide, when it is narrower than the check (kube-score's check
# container-resources covers requests and both limits; only the missing limits are excused).
ALLOWED = {"container-resources": {"CPU limit is not set", "Memory limit is not set"}}

failures, warnings, excused = [], [], 0
for s in sets:
    for obj in json.load(open(f"{work}/{s}.json")):
        name = obj["object_name"]
        meta = obj.get("object_meta") or {}
        comp = (meta.get("labels") or {}).get("app.kubernetes.io/component", "")
        ignored = [c for c in ((meta.get("annotations") or {}).get("kube-score/ignore") or "").split(",") if c]
        fired = set()
        for check in obj["checks"]:
            cid = check["check"]["id"]
            if check["skipped"] or check["grade"] > WARNING:
                continue
            fired.add(cid)
            summaries = [c["summary"] for c in check.get("comments") or []]
            where = f"[{s}] {name}: {cid}: {'; '.join(summaries)}"
            if check["grade"] == WARNING:
                warnings.append(where)
                continue
            if cid not in ignored:
                failures.append(f"{where} (not an exception: fix it, or annotate and document it)")
            elif comp not in documented.get(cid, set()):
                failures.append(f"{where} (annotated kube-score/ignore but not documented for '{comp}' in {readme})")
            elif cid in ALLOWED and not set(summaries) <= ALLOWED[cid]:
                failures.append(f"{where} (the exception excuses only: {', '.join(sorted(ALLOWED[cid]))})")
            else:
                excused += 1
        for cid in ignored:
            if cid not in fired:
                failures.append(f"[{s}] {name}: kube-score/ignore lists {cid}, which passes: remove the exception")

for w in warnings:
    print(f"kube-score WARNING {w}", file=sys.stderr)
if failures:
    print("kube-score: CRITICAL findings that are not documented exceptions:", file=sys.stderr)
    for f in failures:
        print(f"  {f}", file=sys.stderr)
    sys.exit(1)
print(f"kube-score: {len(sets)} renders of the chart, no CRITICAL finding but {excused} documented exceptions")
PY
