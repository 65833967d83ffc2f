#!/usr/bin/env bash
# The refactoring net of issue #34: what `miles` says of every recipe in the repository, written
# to one file per recipe so two trees (or two commits) can be diffed. For each `.miles` file under
# recipes/, tests/cases/ and tests/plans/: the run spec (`miles run --print-spec`), the
# plan as JSON (`miles plan --format json`) and each command's exit code and diagnostics.
#
# Usage: scripts/recipe-net.sh MILES_BINARY OUT_DIR
#   then: diff -r OUT_BEFORE OUT_AFTER
set -euo pipefail
miles="$(realpath "$1")"
out="$2"
cd "$(dirname "$0")/.."
mkdir -p "$out"
# examples/packages is left out: a package build writes its miles.lock.
find recipes tests/cases tests/plans -name '*.miles' 2>/dev/null | sort | while read -r f; do
    name="$(echo "$f" | tr '/' '_')"
    for verb in spec plan; do
        if [[ $verb == spec ]]; then cmd=(run "$f" --print-spec); else cmd=(plan "$f" --format json); fi
        set +e
        timeout 60 "$miles" "${cmd[@]}" >"$out/$name.$verb" 2>"$out/$name.$verb.err" </dev/null
        echo "exit $?" >>"$out/$name.$verb.err"
        set -e
    done
done
echo "recipe-net: $(ls "$out" | wc -l) files in $out"
