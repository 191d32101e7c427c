#!/usr/bin/env bash
# ctest loom_gpu_rehearsal: scripts/gpu-run.sh --rehearse on this CPU
# machine (the standalone GPU build against Debian's LibTorch, with the
# system's Gloo headers hidden so that only the carried ones can serve,
# then every check), and then, independently of the script's own verdict,
# its preflight table (every fact has a row) and its summary table: the
# build passed; every GPU check reports SKIP with exit
# 77, none PASS (a skip is never a GPU pass); every part that needs no GPU
# reports PASS, and all of those below ran.
# Usage: tests/gpu/rehearsal_test.sh SOURCE_DIR [BUILD_DIR]
#   BUILD_DIR defaults to SOURCE_DIR/build-gpu-rehearsal, the folder a
#   rehearsal by hand uses; ctest passes <its build dir>/gpu-rehearsal.
set -uo pipefail
root=${1:?source dir}
build=${2:-$root/build-gpu-rehearsal}
out=$build/out
GPU_RUN_BUILD=$build "$root/scripts/gpu-run.sh" --rehearse --out "$out"
status=$?
summary=$out/summary.md
fail() { echo "rehearsal_test: FAIL: $*" >&2; exit 1; }
[ -f "$summary" ] || fail "no $summary"
[ "$status" = 0 ] || fail "gpu-run.sh --rehearse exited $status"

# The checks' table, "| name | result | exit | seconds | detail |" ->
# "name result exit" (the rows under its "| check |" header, up to the
# first line that is not a row).
table=$(awk -F' *[|] *' '/^[|] check [|]/ { on = 1; next }
                         on && !/^[|]/ { on = 0 }
                         on && /^[|] [a-z]/ { print $2, $3, $4 }' "$summary")
# The preflight table, printed before the build and kept in the summary:
# every fact a failed build's rerun needs has a row.
preflight=$out/preflight.md
[ -f "$preflight" ] || fail "no $preflight"
for f in "python torch" "torch.compiled_with_cxx11_abi()" "torch.cuda.nccl.version()" \
         "torch/include/gloo" "carried libgloo-dev" "libtorch_cpu.so exports sgemm_" \
         "libtorch_cpu.so exports protobuf symbols" "nccl.h" "cublas_v2.h" "cusparse.h" nvcc \
         cmake g++ glibc; do
  grep -F "| $f |" "$preflight" >/dev/null || fail "the preflight table has no row for $f"
  grep -F "| $f |" "$summary" >/dev/null || fail "the summary lacks the preflight row for $f"
done
# In a rehearsal the system's Gloo headers were hidden and the carried ones
# used: the build log's configure line names the carried folder.
if [ -d /usr/include/gloo ] && [ "${GPU_RUN_HIDE_SYSTEM_GLOO:-1}" != 0 ]; then
  grep -F "hidden from the build" "$summary" >/dev/null ||
    fail "the summary does not say that the system's Gloo headers were hidden"
fi
result_of() { awk -v n="$1" '$1 == n { print $2 "/" $3 }' <<<"$table"; }

[ "$(result_of build | cut -d/ -f1)" = PASS ] || fail "the build did not pass"
gpu_checks=(adamw-kernel adamw gpt-precision activation-checkpointing memory nvml nccl
            gloo-staging tp-pp resume bench)
cpu_parts=(gpt-precision/cpu-fp32 gpt-precision/cpu-bf16 activation-checkpointing/cpu
           nccl/cpu-gloo gloo-staging/cpu-one-rank gloo-staging/cpu tp-pp/cpu-one-rank
           tp-pp/cpu-tp2 tp-pp/cpu-pp2 resume/cpu bench/cpu-smoke)
for c in "${gpu_checks[@]}"; do
  [ "$(result_of "$c")" = SKIP/77 ] || fail "$c: want SKIP with exit 77, got '$(result_of "$c")'"
done
for p in "${cpu_parts[@]}"; do
  [ "$(result_of "$p")" = PASS/- ] || fail "$p: want PASS, got '$(result_of "$p")'"
done
rows=$(wc -l <<<"$table")
want=$((1 + ${#gpu_checks[@]} + ${#cpu_parts[@]}))
[ "$rows" = "$want" ] || fail "$rows rows in the table, want $want (build, checks, parts): $table"
echo "rehearsal_test: ${#gpu_checks[@]} GPU checks skipped with exit 77, ${#cpu_parts[@]} CPU parts passed"
