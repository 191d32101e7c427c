#include "cli/help.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace loom::cli {
namespace {

std::vector<CommandHelp> MakeCommands() {
  std::vector<CommandHelp> c;
  c.push_back({"local",
               {"local up [--workers N] [--slots S] [--memory GIB] [--gpus G|auto] "
                "[--data-root DIR]... [--worker-timeout SECONDS] [--queues FILE] "
                "[--notice-url URL] [--warm-ranks N] [--store sqlite|postgres] [--ha]",
                "local down", "local restart controller|controller-N|worker-N|postgres [--kill]",
                "local status"},
               "run a controller and workers on this machine",
               R"(up       starts a controller and N workers (default 2) on this machine, with
         a cluster CA, certificates and the local admin's token in the home
         (--home; default $LOOM_HOME or ~/.loom), and waits until every worker
         has registered. Jobs read data under the --data-root directories:
         without the flag, the home and the current directory; any
         --data-root replaces both (give each directory you need, the
         current one too). A job's checkpoints go to
         <home>/controller/checkpoints/<job>; a checkpoint.dir must lie
         beneath that folder or <home>/checkpoints.
           --workers N          workers to start (default 2)
           --slots S            ranks each worker runs at once (default 1)
           --memory GIB         memory each worker lends its ranks
           --gpus G|auto        GPUs per worker (auto: what NVML sees)
           --data-root DIR      a directory jobs may read data under;
                                repeatable; replaces the defaults
           --worker-timeout S   seconds of silence before a worker is lost
           --queues FILE        the controller's queue file (docs/scheduling.md)
           --notice-url URL     each worker polls URL ({node}: its node) for its
                                node's reclaim notice (AWS spot or GCE shape);
                                `<home>/workers/N/notice` is watched anyway
           --warm-ranks N       rank processes each worker keeps loaded and
                                waiting (default 0 here: the workers share
                                this machine; a worker alone on its node
                                keeps one per slot)
           --store S            the controller's store: sqlite (in the home, the
                                default) or postgres (a PostgreSQL server of the
                                cluster's own)
           --ha                 a PostgreSQL server and two controllers on it,
                                controller-0 and controller-1: one leads, the
                                other stands by and takes over within ~2 s
                                when the leader dies (docs/ha.md)
down     stops them (the home and its state stay).
restart  restarts one daemon at the same address: SIGTERM, or SIGKILL with
         --kill; a worker with ranks running takes SIGTERM as a notice (its
         jobs save and move off it first); a dead one is just started (a controller of --ha comes back
         as the standby). Running jobs ride through a controller restart
         within the workers' lease.
status   shows the local daemons, whether each is alive and each
         controller's role (active or standby); `loomctl -o json local status`
         for scripts.

examples (the second lets jobs read data under the current directory only):
  loomctl local up --workers 3 --slots 2
  loomctl local up --data-root .
  loomctl local up --ha
  loomctl local status
  loomctl local restart controller --kill
  loomctl local down)",
               {"up", "down", "restart", "status"},
               {"--workers", "--slots", "--memory", "--gpus", "--data-root", "--worker-timeout",
                "--queues", "--notice-url", "--warm-ranks", "--kill", "--store", "--ha"},
               ArgKind::kNone});
  c.push_back({"submit",
               {"submit FILE [--follow]"},
               "submit a job spec (YAML or JSON)",
               R"(Submits the job spec in FILE and prints the new job's id. The controller
checks the spec (every error names its field) and plans the job's layout.
  -f, --follow   then follow the job until it ends; exits 1 unless it SUCCEEDED

examples:
  loomctl submit examples/llama-tiny.yaml
  loomctl submit examples/gpt-tiny.yaml --follow
Both specs read data/train_*.bin and data/val_*.bin beside themselves: the
README's tour copies the spec next to the shards it prepared (build/tour/).)",
               {},
               {"--follow", "-f"},
               ArgKind::kFile});
  c.push_back({"validate",
               {"validate FILE"},
               "check a job spec without submitting it",
               R"(Parses FILE, applies the defaults and checks every field the way submit
would (without a controller); prints "FILE: valid", or with -o json the spec
with its defaults.

examples:
  loomctl validate examples/llama-tiny.yaml
  loomctl -o json validate examples/gpt-tiny.yaml)",
               {},
               {},
               ArgKind::kFile});
  c.push_back({"list",
               {"list [--state STATE] [--pending] [--queue Q] [--user U] [--name TEXT]"},
               "list jobs, newest first",
               R"(Lists jobs with their state, progress and submitter, newest first.
  --state STATE   only jobs in STATE (PENDING, SCHEDULED, RUNNING, SUCCEEDED,
                  FAILED, CANCELLED, PREEMPTED)
  --pending       the waiting jobs by queue, in the order they would start:
                  each one's priority, position and what it waits for (over
                  quota, gang does not fit, capacity reserved)
  --queue Q       only jobs of queue Q ("default" takes those naming none)
  --user U        only jobs user U submitted
  --name TEXT     only jobs whose name or id contains TEXT
The controller filters, so a long history is not sent to be thrown away.

examples:
  loomctl list
  loomctl list --state RUNNING
  loomctl list --user uma --name sweep
  loomctl list --pending)",
               {},
               {"--state", "--pending", "--queue", "--user", "--name"},
               ArgKind::kNone});
  c.push_back({"status",
               {"status JOB"},
               "show a job, its plan, placement and history",
               R"(Shows a job: its state, who submitted it, the plan the controller chose
(layout, why, predicted step time), where each rank runs, its progress and
its state transitions.

example:
  loomctl status llama-tiny-1)",
               {},
               {},
               ArgKind::kJob});
  c.push_back({"watch",
               {"watch JOB"},
               "follow a job's progress until it ends",
               R"(Prints the job's progress and events as they happen until it ends; exits 1
unless it SUCCEEDED. If the controller restarts, or a standby takes over from
the leader, it reconnects and resumes after the last event it printed.

example:
  loomctl watch llama-tiny-1)",
               {},
               {},
               ArgKind::kJob});
  c.push_back({"cancel",
               {"cancel JOB [--reason TEXT]"},
               "cancel a job (yours, or any as an admin)",
               R"(Stops the job's ranks and marks it CANCELLED; its checkpoints stay.
  --reason TEXT   recorded with the cancellation

example:
  loomctl cancel llama-tiny-1 --reason "wrong learning rate")",
               {},
               {"--reason"},
               ArgKind::kJob});
  c.push_back({"rollback",
               {"rollback JOB --to-step S [--skip A:B]... [--reason TEXT]"},
               "resume a job from an earlier checkpoint, skipping data",
               R"(Stops the running job and resumes it from the newest good checkpoint at or
before step S, skipping the data batches of each [A, B) range (what the
controller does by itself after a loss spike).
  --to-step S     roll back to the newest good checkpoint <= S (required)
  --skip A:B      skip batches A (inclusive) to B (exclusive); repeatable
  --reason TEXT   recorded with the rollback

example:
  loomctl rollback llama-tiny-1 --to-step 400 --skip 450:500 --reason "bad shard")",
               {},
               {"--to-step", "--skip", "--reason"},
               ArgKind::kJob});
  c.push_back({"sample",
               {"sample JOB --prompt TEXT [--step S] [--tokens N] [--temperature T] [--top-k K] "
                "[--seed X]"},
               "generate text from a job's checkpoint",
               R"(Generates text after the prompt from the job's newest committed checkpoint
(or step S), with a key/value cache, and decodes it with the tokenizer the
job's data was prepared with. The checkpoint and the data must be readable
where loomctl runs (a local cluster, or a worker pod); loom-ckpt, built
beside loomctl, does the generating.
  --prompt TEXT       the text to continue (required)
  --step S            a committed checkpoint's step (default: the newest)
  --tokens N          tokens to generate (default 64)
  --temperature T     softmax temperature; 0 = greedy (default 0.8)
  --top-k K           sample among the K most likely tokens; 0 = all (default 40)
  --seed X            the sampler's seed (default 1): same seed, same text

examples:
  loomctl sample llama-tiny-1 --prompt "The " --tokens 80
  loomctl sample llama-tiny-1 --prompt "The " --step 400 --temperature 0 --tokens 40)",
               {},
               {"--prompt", "--step", "--tokens", "--temperature", "--top-k", "--seed"},
               ArgKind::kJob});
  c.push_back({"export",
               {"export JOB --out DIR [--step S]"},
               "write a job's weights in Hugging Face's layout",
               R"(Writes the job's newest committed checkpoint (or step S) as
DIR/model.safetensors, DIR/config.json and the tokenizer (tokenizer.model for
BPE data) in Hugging Face's layout: GPT2LMHeadModel for GPT-2, and
LlamaForCausalLM for the Llama family. Like sample, it reads the checkpoint
where loomctl runs (loom-ckpt, beside loomctl, writes the files).
  --out DIR    where the files go (made if missing)
  --step S     a committed checkpoint's step (default: the newest)

example:
  loomctl export llama-tiny-1 --out llama-tiny-hf)",
               {},
               {"--out", "--step"},
               ArgKind::kJob});
  c.push_back({"report",
               {"report JOB --out FILE"},
               "the job as one self-contained HTML page",
               R"(Writes FILE, one HTML page with no network requests: charts of train and
validation loss (recovery events marked, skipped data shaded), tokens/s, MFU,
the step-time split, memory, power and energy, then the plan and placement,
the recovery events and the checkpoint catalog. Charts are inline SVG.
  --out FILE   the page to write

example:
  loomctl report llama-tiny-1 --out report.html)",
               {},
               {"--out"},
               ArgKind::kJob});
  c.push_back({"steps",
               {"steps JOB [--last N] [--ledger]"},
               "the job's per-step records",
               R"(Lists the job's step records in the order they were reported: step, training
and validation loss, gradient norm, tokens/s, the attempt that trained it and
the layout generation it ran under (an elastic job's re-plans raise it). A
step that a restart, rollback or re-plan trained again appears once per
attempt. `-o json` prints every field of every record, for your own plots.
  --last N   only the newest N records
  --ledger   the data ledger instead: of the committed trajectory (each step's
             newest attempt), which data batches were trained, how many were
             skipped (outside the job's skip ranges) or trained twice, and how
             many step records a later attempt replayed; exits 1 if any batch
             was skipped or duplicated

examples:
  loomctl steps llama-tiny-1 --last 20
  loomctl steps llama-tiny-1 --ledger
  loomctl -o json steps llama-tiny-1 --last 100)",
               {},
               {"--last", "--ledger"},
               ArgKind::kJob});
  c.push_back({"events",
               {"events JOB [--since SEQ] [--follow]"},
               "the job's event log: transitions, recoveries, checkpoints",
               R"(Lists the job's events from the controller's event log, oldest first: its
state transitions, recovery events (loss spikes, rollbacks and skipped ranges,
restarts and why, preemptions, re-plans, slow ranks, corrupt checkpoints found
at load) and committed checkpoints. SEQ numbers every event of every job in the
order it was stored; it never repeats and has no gaps, whichever controller
led.

  --since SEQ   only the events after SEQ
  -f, --follow  print the events so far, then each new one as it is stored,
                until the job ends; across a controller restart or failover
                it resumes after the last one printed, so every event is
                printed exactly once

examples:
  loomctl events llama-tiny-1
  loomctl events llama-tiny-1 --since 120 --follow
  loomctl -o json events llama-tiny-1)",
               {},
               {"--since", "--follow", "-f"},
               ArgKind::kJob});
  c.push_back({"logs",
               {"logs JOB [--rank R] [--attempt G] [--tail N] [-f]",
                "logs JOB --grep TEXT [--max N]"},
               "a rank's log, from the controller; or search them all",
               R"(Prints rank R's log (default 0) of the job's newest attempt, as its worker
shipped it to the controller: no shell on the worker needed, and still there
after the worker is gone or another controller took over (the logs live in
the controller's store). The controller keeps the newest --log_max_bytes of
each log (16 MiB) until --log_retention (7 days) after the job ended.
  --rank R      which rank
  --attempt G   an earlier attempt (the job's generation, see `loomctl events`)
  --tail N      only the last N lines
  -f, --follow  keep printing as the rank writes, into its next attempt when
                the job restarts, until the job ends
  --grep TEXT   instead, the lines of every rank and attempt that contain TEXT
                (plain text, case-sensitive), with where each ran and its byte
                offset; exits 1 when none does
  --max N       with --grep: at most N lines (default 1000, at most 10000)
With -o json: which ranks and attempts have logs, and their sizes (with
--grep: the lines found).

examples:
  loomctl logs llama-tiny-1 --rank 1 --tail 20 -f
  loomctl logs llama-tiny-1 --grep "NCCL timeout"
  loomctl -o json logs llama-tiny-1)",
               {},
               {"--rank", "--attempt", "--tail", "-f", "--follow", "--grep", "--max"},
               ArgKind::kJob});
  c.push_back({"checkpoints",
               {"checkpoints JOB [--verify]", "checkpoints gc JOB --dry-run"},
               "the job's checkpoint catalog",
               R"(Lists the job's checkpoints: committed, pruned, corrupt or missing, and
their TIER: local (the directory is there), remote (a copy in the object
store of checkpoint.remote), or both; for each one retention deleted, why.
  --verify   re-read every file of every committed checkpoint and check its
             checksums (reads every byte: takes as long as the disk needs);
             exits 1 if any checkpoint is corrupt

gc JOB --dry-run shows what checkpoint.retention would delete now from each
tier and why each checkpoint stays or goes, and what is kept whatever the
rules (the spike-rollback window, other jobs' init_from). It deletes
nothing: retention runs after every save (rank 0 prunes the directory, the
uploading worker the object store), and the event log records what it
deleted (loomctl events shows CHECKPOINT_PRUNED).

examples:
  loomctl checkpoints llama-tiny-1
  loomctl checkpoints llama-tiny-1 --verify
  loomctl checkpoints gc llama-tiny-1 --dry-run)",
               {},
               {"--verify", "--dry-run"},
               ArgKind::kJob});
  c.push_back({"diagnose",
               {"diagnose JOB"},
               "what limits the job's step, with the evidence",
               R"(Says what bounds the job's step time (data loading, memory, communication
or compute) from its measured step split, and what to try.

example:
  loomctl diagnose llama-tiny-1)",
               {},
               {},
               ArgKind::kJob});
  c.push_back({"workers",
               {"workers"},
               "list workers",
               R"(Lists the registered workers: node, zone, rack, whether alive, slots and
what runs on them.

examples:
  loomctl workers
  loomctl -o json workers)",
               {},
               {},
               ArgKind::kNone});
  c.push_back({"cordon",
               {"cordon NODE [--for DURATION] [--reason TEXT]"},
               "take a node out of placement (admins)",
               R"(The node's workers take no new ranks; ranks already there keep running.
The cordon is stored: it outlives a controller restart and a failover.
  --for DURATION  end it by itself after this long (90s, 10m, 2h); without
                  it, the node stays cordoned until `loomctl uncordon`
  --reason TEXT   shown with the cordon in `loomctl workers`

example:
  loomctl cordon node-7 --reason "replacing a DIMM")",
               {},
               {"--for", "--reason"},
               ArgKind::kNode});
  c.push_back({"uncordon",
               {"uncordon NODE"},
               "put a cordoned node back into placement (admins)",
               R"(Ends the node's cordon, whoever set it: an operator, a drain, or a slow
rank's recovery (recovery.slow_rank.action "cordon").

example:
  loomctl uncordon node-7)",
               {},
               {},
               ArgKind::kNode});
  c.push_back({"drain",
               {"drain NODE [--deadline DURATION] [--reason TEXT]"},
               "move every job off a node without losing a step (admins)",
               R"(Cordons the node, then asks each job with ranks there to save a checkpoint
at its next step boundary and stop; an elastic job is then re-planned
without the node, any other is placed again on other workers (or waits for
room). No restart is counted, and each job's DRAINED event gives the steps
it lost: 0 when its save committed before the deadline. The node stays
cordoned until `loomctl uncordon`.
  --deadline DURATION  how long the node has (default: the queues'
                       preemption grace); a job not saved by then is
                       stopped and resumes from its newest checkpoint
  --reason TEXT        recorded in the events and the cordon

example:
  loomctl drain node-7 --deadline 2m --reason "kernel upgrade")",
               {},
               {"--deadline", "--reason"},
               ArgKind::kNode});
  c.push_back({"queues",
               {"queues"},
               "list the shared cluster's queues",
               R"(Lists the controller's queues (its --queues file, docs/scheduling.md): each
one's cohort, nominal quota and borrowing limit, fair-share weight, whether
priority preemption is on, what its placed jobs hold, and how many of its
jobs run and wait; then the priority classes and the preemption settings.

example:
  loomctl queues)",
               {},
               {},
               ArgKind::kNone});
  c.push_back({"whoami",
               {"whoami"},
               "who the controller takes you for",
               R"(Prints the user the controller takes this caller for (its token or client
certificate), the user's role (reader, user or admin) and the credential.

example:
  loomctl whoami
  loomctl -o json whoami)",
               {},
               {},
               ArgKind::kNone});
  c.push_back({"plan",
               {"plan FILE [--topology|--cluster T] [--top K] [--tokens N] [--executable-only]"},
               "plan data/tensor/pipeline parallelism for a spec",
               R"(Plans the layout of the job in FILE (data, tensor and pipeline degrees,
micro-batch, ZeRO stage, recompute, placement): offline on the topology file
T, else on the live cluster's workers.
  --topology T, --cluster T   a topology YAML instead of the live cluster
  --top K                     show the K best layouts (default 5)
  --tokens N                  tokens to train, for time-to-train and cost
                              (with --topology)
  --executable-only           only layouts the engine executes today (on
                              the live cluster: what submit would choose)

examples (the first two need no cluster):
  loomctl plan examples/gpt3-18b.yaml --topology examples/topology-a100-80g-256.yaml
  loomctl plan examples/gpt3-18b.yaml --topology examples/topology-a100-80g-256.yaml --tokens 3e11
  loomctl plan examples/gpt-tiny.yaml --executable-only)",
               {},
               {"--topology", "--cluster", "--top", "--tokens", "--executable-only"},
               ArgKind::kFile});
  c.push_back({"data",
               {"data prepare --input FILE... --out DIR [--tokenizer byte|bpe] [--vocab-size N] "
                "[--val-fraction F]"},
               "tokenize text into llm.c-format shards",
               R"(prepare  tokenizes text files into llm.c-format token shards in DIR, with a
         validation split, and writes DIR/meta.json naming the tokenizer.
           --input FILE...     the text files
           --out DIR           where the shards go (made if missing)
           --tokenizer byte    one token per byte, vocabulary 256 (the default)
           --tokenizer bpe     a SentencePiece BPE model trained on the train split,
                               written as DIR/tokenizer.model (byte fallback: any
                               text encodes and decodes back exactly)
           --vocab-size N      the BPE vocabulary, 260-65536 (default 4096); the
                               job's model.*.vocab_size must be at least N
           --val-fraction F    share held out for validation (default 0.1)

examples (neither needs a cluster):
  loomctl data prepare --input README.md --out build/tour/readme-bytes
  loomctl data prepare --input README.md docs/training.md docs/planner.md --out build/tour/docs-bpe --tokenizer bpe --vocab-size 512
The README's tour prepares a larger text (Debian's fortunes) the same way,
with --tokenizer bpe --vocab-size 2048.)",
               {"prepare"},
               {"--input", "--out", "--tokenizer", "--vocab-size", "--val-fraction"},
               ArgKind::kFile});
  c.push_back({"users",
               {"users add NAME [--role reader|user|admin] [--token-out FILE] [--users-file FILE]",
                "users remove NAME [--users-file FILE]", "users list [--users-file FILE]"},
               "edit the controller's users file",
               R"(Edits the users file the controller reads (default <home>/users; on
Kubernetes, the source of the loom-users Secret). The controller re-reads it
on change: a removed user is locked out within a second.
add      adds NAME with a role (default user) and a new token, printed once
         (or written to --token-out, mode 0600); only its hash is stored.
remove   removes NAME: their token and certificate stop working.
list     lists names and roles.

examples:
  loomctl users add alice --role user
  loomctl users list
  loomctl users remove alice)",
               {"add", "remove", "list"},
               {"--role", "--token-out", "--users-file"},
               ArgKind::kNone});
  c.push_back({"ca",
               {"ca issue server|worker|user NAME [--host H]... [--dir DIR]"},
               "issue a certificate from the cluster CA",
               R"(Issues a certificate from the cluster CA in DIR (default <home>/tls; made on
first use), written as DIR/<name>.pem and .key:
server NAME   the controller's; --host names every address clients dial
worker NODE   a worker's (common name worker:NODE), as worker-NODE.pem/.key
user NAME     a person's (common name user:NAME), as user-NAME.pem/.key

examples:
  loomctl ca issue user alice
  loomctl ca issue worker node-7 --dir tls)",
               {"issue"},
               {"--host", "--dir"},
               ArgKind::kNone});
  c.push_back({"completion",
               {"completion bash"},
               "print a shell completion script",
               R"(Prints a bash completion script for loomctl: commands, subcommands, flags,
files, and job ids from the controller.

example:
  loomctl completion bash
To install it, as root: `loomctl completion bash > /etc/bash_completion.d/loomctl`;
or add `source <(loomctl completion bash)` to your ~/.bashrc.)",
               {"bash"},
               {},
               ArgKind::kNone});
  c.push_back({"help",
               {"help [COMMAND]"},
               "show usage, or one command's",
               R"(Shows loomctl's usage, or COMMAND's (as `loomctl COMMAND --help` does).

examples:
  loomctl help
  loomctl help plan)",
               {},
               {},
               ArgKind::kNone});
  return c;
}

constexpr char kGlobalFlagsText[] = R"(Global flags:
  --home DIR          local state (default $LOOM_HOME or ~/.loom)
  --controller ADDR   controller address (default: the local cluster's)
  --token-file FILE   your token (default: <home>/token)
  --tls-ca FILE       CA to trust for the controller (default: <home>/tls/ca.pem if
                      there, else the system's roots)
  --tls-cert F --tls-key K
                      a client certificate (common name user:<name>) instead of a token
  --plaintext         no TLS (only for a controller run with --allow_plaintext)
  -o table|json       output format (default table)
)";

}  // namespace

const std::vector<CommandHelp>& Commands() {
  static const std::vector<CommandHelp>* commands = new std::vector<CommandHelp>(MakeCommands());
  return *commands;
}

const std::vector<std::string>& GlobalFlags() {
  static const std::vector<std::string>* flags = new std::vector<std::string>{
      "--home", "--controller", "--token-file", "--tls-ca", "--tls-cert", "--tls-key",
      "--plaintext", "-o", "--help"};
  return *flags;
}

const CommandHelp* FindCommand(absl::string_view name) {
  for (const CommandHelp& c : Commands()) {
    if (c.name == name) return &c;
  }
  return nullptr;
}

std::string MainUsage() {
  std::string out = "usage: loomctl [global flags] COMMAND [args]\n\nCommands:\n";
  for (const CommandHelp& c : Commands()) {
    absl::StrAppend(&out, "  ", c.name, std::string(c.name.size() < 13 ? 13 - c.name.size() : 1, ' '),
                    c.summary, "\n");
  }
  absl::StrAppend(&out, "\nRun `loomctl COMMAND --help` for a command's arguments and flags.\n\n",
                  kGlobalFlagsText);
  return out;
}

std::string CommandUsage(const CommandHelp& command) {
  std::string out;
  for (size_t i = 0; i < command.synopsis.size(); ++i) {
    absl::StrAppend(&out, i == 0 ? "usage: " : "       ", "loomctl ", command.synopsis[i], "\n");
  }
  absl::StrAppend(&out, "\n", command.summary, ".\n\n", command.details, "\n\n",
                  "Global flags (before COMMAND) are in `loomctl --help`.\n");
  return out;
}

bool WantsHelp(const std::vector<std::string>& args) {
  if (!args.empty() && args[0] == "help") return true;
  return std::any_of(args.begin(), args.end(),
                     [](const std::string& a) { return a == "-h" || a == "--help"; });
}

}  // namespace loom::cli
