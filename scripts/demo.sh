#!/usr/bin/env bash
# README command 1: installs dependencies if missing, builds, starts a local
# Loom (controller + 2 workers), prepares a real English corpus with a BPE
# tokenizer trained on it, trains examples/llama-tiny.yaml (a Llama-family
# decoder) data-parallel on both workers with a live progress display,
# prints a sample of what it learned and a summary, and stops the cluster.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
./scripts/install-deps.sh
./scripts/build.sh loomctl loom-controller loom-worker loom-rank loom-ckpt loom-sentencepiece
LOOMCTL="$ROOT/build/bin/loomctl"
export LOOM_HOME=${LOOM_HOME:-$ROOT/build/demo-home}
DATA=$ROOT/build/demo-data

echo "== preparing the demo corpus (Debian's fortune-cookie databases, plain English text)"
mapfile -t inputs < <(find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' | sort)
if [ "${#inputs[@]}" -eq 0 ]; then
  echo "demo: no fortune files found; install the 'fortunes' package" >&2
  exit 1
fi
echo "   tokenizer: SentencePiece BPE with a 2048-token vocabulary, trained on the corpus's train split"
"$LOOMCTL" data prepare --input "${inputs[@]}" --out "$DATA" --val-fraction 0.05 \
  --tokenizer bpe --vocab-size 2048
mkdir -p "$ROOT/build/demo-examples"
cp examples/llama-tiny.yaml "$ROOT/build/demo-examples/"
ln -sfn "$DATA" "$ROOT/build/demo-examples/data"

echo "== starting a local cluster: controller + 2 workers"
"$LOOMCTL" local down >/dev/null 2>&1 || true
rm -rf "$LOOM_HOME"  # each demo starts from an empty job store
"$LOOMCTL" local up --workers 2
trap '"$LOOMCTL" local down >/dev/null 2>&1 || true' EXIT
"$LOOMCTL" workers

echo "== training examples/llama-tiny.yaml (Llama-family decoder on BPE tokens)"
start=$(date +%s)
set +e
"$LOOMCTL" submit "$ROOT/build/demo-examples/llama-tiny.yaml" --follow
rc=$?
set -e
elapsed=$(( $(date +%s) - start ))
job=$("$LOOMCTL" list | awk 'NR == 2 {print $1}')

if [ "$rc" -eq 0 ]; then
  echo
  echo "== a sample from $job's last checkpoint (prompt \"The \", 80 BPE tokens, temperature 0.8)"
  "$LOOMCTL" sample "$job" --prompt "The " --tokens 80 --temperature 0.8 --seed 1
fi

entropy=$(sed -n 's/.*"unigram_entropy_nats": \([0-9.]*\).*/\1/p' "$DATA/meta.json")
echo
echo "== summary"
echo "  BPE unigram entropy of the corpus: ${entropy} nats/token (a model that ignores context cannot beat this)"
"$LOOMCTL" list
echo "  wall time for the job: ${elapsed}s"
echo "  checkpoints kept: $(find "$LOOM_HOME"/controller/checkpoints -mindepth 2 -maxdepth 2 -type d -name 'step-*' 2>/dev/null | wc -l) under $LOOM_HOME/controller/checkpoints (step directories with a checksummed MANIFEST.json)"
"$LOOMCTL" checkpoints "$(ls "$LOOM_HOME"/controller/checkpoints | tail -1)" || true
echo "  rank 1's last log lines, through the controller (loomctl logs $job --rank 1 --tail 3):"
"$LOOMCTL" logs "$job" --rank 1 --tail 3 | sed 's/^/    /' || true
echo "  where the job's wall time went (goodput buckets; loomctl status $job):"
"$LOOMCTL" status "$job" | sed -n 's/^goodput  /    /p' || true
echo "  daemon logs: $LOOM_HOME/logs"
"$LOOMCTL" local down
trap - EXIT
exit $rc
