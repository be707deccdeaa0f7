#!/bin/bash
# Fixed runs of both trainers, for a change that must keep behaviour: record
# before, record after, diff. Each run's step and val lines (loss, norm, lr,
# tokens; not the timings) and the sha256 of every checkpoint file it wrote
# (the DONE markers by name: they hold a random run id), for the bf16 and fp32
# builds, one rank and mpirun -np 2 with ZeRO 0 and 1, with --doc-mask.
#   usage: dev/fixed_runs.sh OUTDIR     (after make cpu; about 2 minutes on 2 cores)
#   e.g.   dev/fixed_runs.sh /tmp/before; ...change...; dev/fixed_runs.sh /tmp/after; diff -r -x '*.raw' /tmp/before /tmp/after
set -u
out=${1:?usage: dev/fixed_runs.sh OUTDIR}
cd "$(dirname "$0")/.." || exit 1
mkdir -p "$out" && rm -f "$out"/*.txt "$out"/*.raw
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPIRUN="mpirun --oversubscribe --bind-to none -x CPUCUDA_WORKERS=1"
strip() { sed -E 's/ \| [0-9.]+ ms \|.*$//; /^(step [0-9]+: (val|sample)|step +[0-9]+\/)/!d'; }
run() {  # name, launcher ("" for none), binary, flags...
    local name=$1 launch=$2 bin=$3 dir
    shift 3
    dir=$(mktemp -d "${TMPDIR:-/tmp}/fixed_runs.XXXXXX") && rmdir "$dir"
    $launch "$bin" "$@" -o "$dir" > "$out/$name.raw" 2>&1
    echo "rc=$?" > "$out/$name.txt"
    strip < "$out/$name.raw" >> "$out/$name.txt"
    if [[ -d $dir ]]; then
        (cd "$dir" && find . -type f ! -name 'main.*' ! -name '*.lock' | sort | while read -r f; do
            case $f in *DONE*) echo "$f" ;; *) sha256sum "$f" ;; esac
        done) >> "$out/$name.txt"
        rm -rf "$dir"
    fi
}
for build in cpu cpu-fp32; do
    for trainer in train_gpt train_llama3; do
        bin=build/$build/$trainer
        [[ -x $bin ]] || { echo "error: $bin is not built (make cpu)"; exit 1; }
        common=(-x 6 -n 3 -v 3 -m 2)
        run "$build-$trainer-1" "" "$bin" "${common[@]}"
        run "$build-$trainer-1-dm" "" "$bin" "${common[@]}" --doc-mask 1 --doc-positions 1 -d 2048 -b 4 -t 64
        run "$build-$trainer-1-a2" "" "$bin" "${common[@]}" -b 4 -d 1024
        for z in 0 1; do
            run "$build-$trainer-np2-z$z" "$MPIRUN -np 2" "$bin" "${common[@]}" -z $z -b 4 -d 1024
            run "$build-$trainer-np2-z$z-dm" "$MPIRUN -np 2" "$bin" "${common[@]}" -z $z --doc-mask 1 -b 2 -d 1024 -r 2
        done
    done
done
echo "$(ls "$out"/*.txt | wc -l) runs recorded in $out"
