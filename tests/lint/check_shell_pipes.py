#!/usr/bin/python3
"""Finds pipelines whose last command may stop reading early, in Loom's shell.

    /usr/bin/python3 tests/lint/check_shell_pipes.py REPO_ROOT

`producer | grep -q PATTERN` (and grep -m, --quiet, --silent, --max-count,
and `| head`) exits as soon as it has its answer. A producer that is still
writing then dies of SIGPIPE, and under `set -o pipefail` the pipeline fails
although the pattern was found: a check that passes or fails at random,
depending on how much the producer wrote before the reader left (seen twice
in this project: the render test's Deployment check, and gpu-run.sh's
`ninja -t targets all | grep -q`, which skipped a GPU check at random).
Read the whole output instead: `grep PATTERN >/dev/null`, `sed -n 1p`, or
grep a file.

Scans every shell script of the repository (*.sh, files whose first line
runs sh or bash, .ci/run) and the RUN lines of container files, skipping
comments. Before it scans, it checks its own pattern on examples that must
and must not match, so that a broken pattern fails instead of passing.
Prints each finding as FILE:LINE: text and exits 1, or a summary and 0;
exit 2 on a usage error. Standard library only.
"""

import os
import re
import sys

SKIP_DIRS = {".git", "node_modules", ".cache", "__pycache__"}

# A pipe (not ||) into grep with an option that stops early, or into head.
EARLY_READER = re.compile(
    r"(?<![|])\|(?![|])\s*(?:"
    r"grep\b(?:\s+(?!--\s)-\S+)*?\s+(?:-[a-zA-Z]*[qm][a-zA-Z0-9]*|--quiet|--silent|--max-count\S*)\b"
    r"|head\b)")

MUST_MATCH = [
    "ninja -t targets all | grep -q '^x:'",
    "a |grep -E -q foo",
    "a | grep -qE foo && b",
    "a | grep --quiet foo",
    "a | grep -m1 foo",
    "a | grep -c foo | head -n 1",
    "x=$(nvidia-smi | head -n 1)",
]
MUST_NOT_MATCH = [
    "a | grep foo >/dev/null",
    "grep -q foo file",
    "a || grep -q foo file",
    "a | grep -c foo",
    "a | sed -n 1p",
    "a | grep -- -quiet",
    "a | header",
]


def self_test():
    bad = [s for s in MUST_MATCH if not EARLY_READER.search(s)]
    bad += [s for s in MUST_NOT_MATCH if EARLY_READER.search(s)]
    if bad:
        print("check_shell_pipes: the pattern itself is wrong on: " + "; ".join(bad))
        sys.exit(2)


def is_shell(path):
    name = os.path.basename(path)
    if name.endswith(".sh") or path.endswith(os.path.join(".ci", "run")):
        return True
    try:
        with open(path, "rb") as f:
            first = f.readline(200)
    except OSError:
        return False
    return first.startswith(b"#!") and re.search(rb"\b(ba)?sh\b", first) is not None


def is_container_file(path):
    name = os.path.basename(path)
    return name.endswith(".Containerfile") or name in ("Containerfile", "Dockerfile")


def code_of(line):
    """The line without a trailing comment (a '#' at a word's start)."""
    stripped = line.strip()
    if stripped.startswith("#"):
        return ""
    return re.sub(r"(^|\s)#.*$", "", line)


def main(argv):
    if len(argv) != 2:
        print(__doc__)
        return 2
    root = argv[1]
    self_test()
    findings = []
    scanned = 0
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        dirnames[:] = [d for d in dirnames
                       if d not in SKIP_DIRS and not (rel_dir == "." and d.startswith("build"))]
        for name in filenames:
            path = os.path.join(dirpath, name)
            shell = is_shell(path)
            container = not shell and is_container_file(path)
            if not (shell or container):
                continue
            scanned += 1
            with open(path, encoding="utf-8", errors="replace") as f:
                in_run = False
                for number, line in enumerate(f, 1):
                    if container:
                        # RUN lines and their continuations are shell.
                        if re.match(r"\s*RUN\b", line):
                            in_run = True
                        if not in_run:
                            continue
                        in_run = line.rstrip().endswith("\\")
                    if EARLY_READER.search(code_of(line)):
                        findings.append("%s:%d: %s" % (os.path.relpath(path, root), number,
                                                       line.strip()))
    for finding in findings:
        print(finding)
    if findings:
        print("check_shell_pipes: %d pipeline(s) into a reader that may stop early; under "
              "pipefail the writer's SIGPIPE fails them at random (read everything: grep "
              "PATTERN >/dev/null, sed -n 1p)" % len(findings))
        return 1
    print("check_shell_pipes: %d shell files and container files, no pipeline into grep -q/-m "
          "or head" % scanned)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
