#!/usr/bin/python3
"""Checks Loom's documentation against the code it describes.

    /usr/bin/python3 tests/docs/check_jobspec_doc.py REPO_ROOT

1. The job-spec reference (docs/jobspec.md, the table(s) between the
   "BEGIN jobspec reference" and "END jobspec reference" HTML comments) has
   exactly one row per leaf field of loom.v1.JobSpec, walked recursively
   through proto/loom/v1/job.proto: every field path the proto has is
   documented, and every documented path is in the proto. A row's first cell
   is the dotted path in backticks, its second names the field's proto type.
2. Every relative link in README.md and docs/*.md points to a file or folder
   that exists in the repository, and a link to a heading of a Markdown file
   (FILE.md#anchor, or #anchor) names a heading that file has.

Field paths, as loomctl's error messages write them:
  * a message field's leaves are "field.leaf" (model.gpt.n_layer);
  * a repeated field is "field[]" (data.train[]), a repeated message's
    leaves "field[].leaf" (skip_batches[].begin);
  * a map field is "field{}" (its message values "field{}.leaf");
  * a oneof member of the same message type as an earlier member of the same
    oneof (model.llama beside model.gpt, both GptModel) is one row,
    "model.llama.*", whose meaning is "the fields of model.gpt"; the doc may
    instead list that member's leaves in full.

Standard library only. Prints what is wrong and exits 1, or prints a summary
and exits 0. Exit 2 on a usage error or a proto it cannot read.
"""

import os
import re
import sys

PROTO = os.path.join("proto", "loom", "v1", "job.proto")
DOC = os.path.join("docs", "jobspec.md")
ROOT_MESSAGE = "JobSpec"
BEGIN_MARK = "<!-- BEGIN jobspec reference -->"
END_MARK = "<!-- END jobspec reference -->"

SCALARS = {
    "double", "float", "int32", "int64", "uint32", "uint64", "sint32", "sint64",
    "fixed32", "fixed64", "sfixed32", "sfixed64", "bool", "string", "bytes",
}


class ProtoError(Exception):
    pass


# ---------------------------------------------------------------- proto ----

class Field:
    def __init__(self, name, type_name, label, oneof, scope, key_type=None):
        self.name = name
        self.type_name = type_name  # as written (value type for maps)
        self.label = label          # "", "repeated", "optional" or "map"
        self.oneof = oneof          # the oneof's name, or None
        self.scope = scope          # full name of the declaring message
        self.key_type = key_type


class Message:
    def __init__(self, full_name):
        self.full_name = full_name
        self.fields = []


def strip_comments(text):
    # Strings in a .proto are rare (options); keep them intact while removing
    # // and /* */ comments.
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == '"' or c == "'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(text[i:j + 1])
            i = j + 1
        elif text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            i = n if j < 0 else j + 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[A-Za-z_][A-Za-z0-9_.]*|\d[\w.+-]*|\S')


def parse_proto(text):
    """Returns ({full message name: Message}, {full enum names}, package)."""
    tokens = TOKEN.findall(strip_comments(text))
    messages, enums = {}, set()
    package = ""
    pos = 0

    def expect(tok):
        nonlocal pos
        if pos >= len(tokens) or tokens[pos] != tok:
            got = tokens[pos] if pos < len(tokens) else "end of file"
            raise ProtoError("expected %r, got %r" % (tok, got))
        pos += 1

    def skip_statement():
        # Up to and including the next ';' at this nesting level, or a whole
        # {...} block (option values, reserved, extensions, services).
        nonlocal pos
        depth = 0
        while pos < len(tokens):
            t = tokens[pos]
            pos += 1
            if t == "{":
                depth += 1
            elif t == "}":
                depth -= 1
                if depth == 0:
                    if pos < len(tokens) and tokens[pos] == ";":
                        pos += 1
                    return
            elif t == ";" and depth == 0:
                return
        raise ProtoError("unterminated statement")

    def skip_block():
        nonlocal pos
        expect("{")
        depth = 1
        while depth:
            if pos >= len(tokens):
                raise ProtoError("unterminated block")
            if tokens[pos] == "{":
                depth += 1
            elif tokens[pos] == "}":
                depth -= 1
            pos += 1

    def parse_field(msg, oneof):
        # [repeated|optional] TYPE NAME = N [options];  or  map<K, V> NAME = N;
        nonlocal pos
        label = ""
        key_type = None
        if tokens[pos] in ("repeated", "optional", "required"):
            label = tokens[pos]
            pos += 1
        if tokens[pos] == "map":
            pos += 1
            expect("<")
            key_type = tokens[pos]
            pos += 1
            expect(",")
            type_name = tokens[pos]
            pos += 1
            expect(">")
            label = "map"
        else:
            type_name = tokens[pos]
            pos += 1
        name = tokens[pos]
        pos += 1
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise ProtoError("bad field name %r in %s" % (name, msg.full_name))
        expect("=")
        pos += 1  # field number
        if tokens[pos] == "[":
            while tokens[pos] != "]":
                pos += 1
            pos += 1
        expect(";")
        msg.fields.append(Field(name, type_name, label, oneof, msg.full_name, key_type))

    def parse_message(full_name):
        nonlocal pos
        msg = Message(full_name)
        messages[full_name] = msg
        expect("{")
        while tokens[pos] != "}":
            t = tokens[pos]
            if t == "message":
                pos += 1
                name = tokens[pos]
                pos += 1
                parse_message(full_name + "." + name)
            elif t == "enum":
                pos += 1
                enums.add(full_name + "." + tokens[pos])
                pos += 1
                skip_block()
            elif t == "oneof":
                pos += 1
                oneof = tokens[pos]
                pos += 1
                expect("{")
                while tokens[pos] != "}":
                    if tokens[pos] == "option":
                        skip_statement()
                    else:
                        parse_field(msg, oneof)
                pos += 1
            elif t in ("option", "reserved", "extensions", "extend"):
                skip_statement()
            elif t == ";":
                pos += 1
            else:
                parse_field(msg, None)
        pos += 1

    while pos < len(tokens):
        t = tokens[pos]
        if t == "package":
            pos += 1
            package = tokens[pos]
            pos += 1
            expect(";")
        elif t == "message":
            pos += 1
            name = tokens[pos]
            pos += 1
            parse_message(name)
        elif t == "enum":
            pos += 1
            enums.add(tokens[pos])
            pos += 1
            skip_block()
        elif t in ("syntax", "import", "option"):
            skip_statement()
        elif t == "service":
            pos += 2
            skip_block()
        elif t == ";":
            pos += 1
        else:
            raise ProtoError("unexpected %r at top level" % t)
    return messages, enums, package


def resolve(type_name, scope, messages, enums, package):
    """('message'|'enum'|'scalar'|'external', full name) for a field's type."""
    if type_name in SCALARS:
        return "scalar", type_name
    name = type_name.lstrip(".")
    if package and name.startswith(package + "."):
        name = name[len(package) + 1:]
    # Innermost scope first, as protoc resolves names.
    parts = scope.split(".") if scope else []
    for i in range(len(parts), -1, -1):
        candidate = ".".join(parts[:i] + [name])
        if candidate in messages:
            return "message", candidate
        if candidate in enums:
            return "enum", candidate
    if name.startswith("google.protobuf."):
        return "external", name
    raise ProtoError("cannot resolve type %r in %s" % (type_name, scope))


def field_paths(messages, enums, package, root):
    """Returns (leaves, aliases).

    leaves: {path: the proto type as written, e.g. "int32", "Norm"}.
    aliases: [(alias prefix, canonical prefix, {alias leaf path: type})] for
    oneof members that repeat an earlier member's message type.
    """
    leaves = {}
    aliases = []

    def walk(msg_name, prefix, ancestry, out):
        seen_oneof_types = {}  # (oneof, message type) -> first member's prefix
        for f in messages[msg_name].fields:
            kind, full = resolve(f.type_name, f.scope, messages, enums, package)
            suffix = {"repeated": "[]", "map": "{}"}.get(f.label, "")
            path = prefix + f.name + suffix
            shown = f.type_name.split(".")[-1]
            if kind != "message" or full in ancestry:
                out[path] = shown
                continue
            if f.oneof is not None:
                key = (f.oneof, full)
                if key in seen_oneof_types:
                    expanded = {}
                    walk(full, path + ".", ancestry + (full,), expanded)
                    aliases.append((path, seen_oneof_types[key], expanded))
                    continue
                seen_oneof_types[key] = path
            walk(full, path + ".", ancestry + (full,), out)

    if root not in messages:
        raise ProtoError("no message %s" % root)
    walk(root, "", (root,), leaves)
    return leaves, aliases


# ------------------------------------------------------------------ doc ----

def split_row(line):
    """Cells of a Markdown table row, splitting on | outside code spans."""
    body = line.strip()
    if body.startswith("|"):
        body = body[1:]
    if body.endswith("|") and not body.endswith("\\|"):
        body = body[:-1]
    cells, cur, in_code = [], [], False
    i = 0
    while i < len(body):
        c = body[i]
        if c == "\\" and i + 1 < len(body) and body[i + 1] == "|":
            cur.append("|")
            i += 2
            continue
        if c == "`":
            in_code = not in_code
        if c == "|" and not in_code:
            cells.append("".join(cur).strip())
            cur = []
        else:
            cur.append(c)
        i += 1
    cells.append("".join(cur).strip())
    return cells


def doc_rows(text):
    """[(line number, path, type cell)] of the reference tables; problems."""
    problems = []
    begin = text.find(BEGIN_MARK)
    end = text.find(END_MARK)
    if begin < 0 or end < 0 or end < begin:
        return [], ["%s: no %r ... %r section" % (DOC, BEGIN_MARK, END_MARK)]
    first_line = text.count("\n", 0, begin) + 1
    rows = []
    lines = text[begin:end].split("\n")
    header_next = False
    for offset, line in enumerate(lines):
        lineno = first_line + offset
        s = line.strip()
        if not s.startswith("|"):
            header_next = False
            continue
        cells = split_row(s)
        if all(re.fullmatch(r":?-{3,}:?", c) for c in cells if c):
            continue  # the separator row
        if not header_next and cells and not cells[0].startswith("`"):
            header_next = True  # a header row ("Field | Type | ...")
            continue
        header_next = True
        m = re.fullmatch(r"`([^`]+)`", cells[0])
        if not m:
            problems.append("%s:%d: first cell %r is not one `field.path`" % (DOC, lineno, cells[0]))
            continue
        type_cell = cells[1] if len(cells) > 1 else ""
        rows.append((lineno, m.group(1), type_cell))
    if not rows:
        problems.append("%s: the reference section has no table rows" % DOC)
    return rows, problems


def check_reference(repo):
    problems = []
    with open(os.path.join(repo, PROTO), encoding="utf-8") as f:
        messages, enums, package = parse_proto(f.read())
    leaves, aliases = field_paths(messages, enums, package, ROOT_MESSAGE)
    with open(os.path.join(repo, DOC), encoding="utf-8") as f:
        rows, row_problems = doc_rows(f.read())
    problems += row_problems

    documented = {}
    for lineno, path, type_cell in rows:
        if path in documented:
            problems.append("%s:%d: `%s` documented twice (first on line %d)"
                            % (DOC, lineno, path, documented[path][0]))
            continue
        documented[path] = (lineno, type_cell)

    expected = dict(leaves)
    for alias, canonical, expanded in aliases:
        star = alias + ".*"
        if star in documented:
            expected[star] = None  # "the fields of <canonical>"
        elif any(p.startswith(alias + ".") for p in documented):
            expected.update(expanded)
        else:
            problems.append("%s: missing `%s` (the fields of %s) or its fields listed in full"
                            % (DOC, star, canonical))
            expected[star] = None

    for path in sorted(set(expected) - set(documented)):
        if path.endswith(".*") and any(path == a + ".*" for a, _, _ in aliases):
            continue  # reported above
        problems.append("%s: missing `%s` (%s in %s)" % (DOC, path, expected[path], PROTO))
    for path in sorted(set(documented) - set(expected)):
        problems.append("%s:%d: `%s` is not a field path of loom.v1.%s in %s"
                        % (DOC, documented[path][0], path, ROOT_MESSAGE, PROTO))
    # The type column names the proto type (int32 vs int64 drifts otherwise).
    for path, proto_type in sorted(expected.items()):
        if proto_type is None or path not in documented:
            continue
        lineno, type_cell = documented[path]
        if not re.search(r"(?<![A-Za-z0-9_])%s(?![A-Za-z0-9_])" % re.escape(proto_type), type_cell):
            problems.append("%s:%d: `%s` is %s in the proto, the table says %r"
                            % (DOC, lineno, path, proto_type, type_cell))
    return problems, len(expected), len(rows)


# ---------------------------------------------------------------- links ----

LINK = re.compile(r"(?<!!)\[(?:[^\]\\]|\\.)*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
IMAGE = re.compile(r"!\[(?:[^\]\\]|\\.)*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REF_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")


def prose_lines(text, blank_code_spans=True):
    """(line number, line) outside fenced code blocks; code spans blanked
    unless told otherwise."""
    fence = None
    for lineno, line in enumerate(text.split("\n"), 1):
        m = re.match(r"^\s{0,3}(`{3,}|~{3,})", line)
        if m:
            if fence is None:
                fence = m.group(1)[0] * len(m.group(1))
                continue
            if m.group(1).startswith(fence):
                fence = None
                continue
        if fence is not None:
            continue
        if not blank_code_spans:
            yield lineno, line
            continue
        yield lineno, re.sub(r"(`+)(?:(?!\1).)+?\1", lambda s: " " * len(s.group(0)), line)


def github_anchor(heading):
    """GitHub's anchor for a heading: lower case, punctuation dropped,
    spaces to hyphens."""
    text = re.sub(r"`([^`]*)`", r"\1", heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text, flags=re.UNICODE)
    return text.replace(" ", "-")


def anchors_of(path, cache):
    if path not in cache:
        found = set()
        counts = {}
        with open(path, encoding="utf-8") as f:
            for _, line in prose_lines(f.read(), blank_code_spans=False):
                m = re.match(r"^\s{0,3}#{1,6}\s+(.*?)\s*#*\s*$", line)
                if not m:
                    continue
                base = github_anchor(m.group(1))
                n = counts.get(base, 0)
                counts[base] = n + 1
                found.add(base if n == 0 else "%s-%d" % (base, n))
        # Explicit anchors: <a id="..."> / <a name="...">.
        with open(path, encoding="utf-8") as f:
            found.update(re.findall(r"<a\s+(?:id|name)=\"([^\"]+)\"", f.read()))
        cache[path] = found
    return cache[path]


def check_links(repo):
    problems = []
    files = [os.path.join(repo, "README.md")]
    docs = os.path.join(repo, "docs")
    if os.path.isdir(docs):
        files += sorted(os.path.join(docs, n) for n in os.listdir(docs) if n.endswith(".md"))
    cache = {}
    checked = 0
    real_repo = os.path.realpath(repo)
    for md in files:
        if not os.path.isfile(md):
            problems.append("%s: missing" % os.path.relpath(md, repo))
            continue
        with open(md, encoding="utf-8") as f:
            text = f.read()
        rel_md = os.path.relpath(md, repo)
        for lineno, line in prose_lines(text):
            targets = LINK.findall(line) + IMAGE.findall(line)
            m = REF_DEF.match(line)
            if m:
                targets.append(m.group(1))
            for target in targets:
                if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:", target) or target.startswith("//"):
                    continue  # http:, https:, mailto:, ...
                checked += 1
                path_part, _, anchor = target.partition("#")
                if path_part:
                    if path_part.startswith("/"):
                        dest = os.path.join(repo, path_part.lstrip("/"))
                    else:
                        dest = os.path.join(os.path.dirname(md), path_part)
                    dest = os.path.normpath(dest)
                    if not os.path.realpath(dest).startswith(real_repo + os.sep) and \
                            os.path.realpath(dest) != real_repo:
                        problems.append("%s:%d: link %r leaves the repository" % (rel_md, lineno, target))
                        continue
                    if not os.path.exists(dest):
                        problems.append("%s:%d: link %r: no such file" % (rel_md, lineno, target))
                        continue
                else:
                    dest = md
                if anchor and dest.endswith(".md") and os.path.isfile(dest):
                    if anchor not in anchors_of(dest, cache):
                        problems.append("%s:%d: link %r: %s has no heading #%s"
                                        % (rel_md, lineno, target, os.path.relpath(dest, repo), anchor))
    return problems, checked, len(files)


def main(argv):
    if len(argv) != 2:
        print("usage: %s REPO_ROOT" % argv[0], file=sys.stderr)
        return 2
    repo = os.path.abspath(argv[1])
    try:
        ref_problems, n_paths, n_rows = check_reference(repo)
    except (ProtoError, IndexError) as e:
        print("check_jobspec_doc: cannot read %s: %s" % (PROTO, e), file=sys.stderr)
        return 2
    except OSError as e:
        print("check_jobspec_doc: %s" % e, file=sys.stderr)
        return 1
    link_problems, n_links, n_files = check_links(repo)
    problems = ref_problems + link_problems
    for p in problems:
        print("FAIL " + p)
    if problems:
        print("check_jobspec_doc: %d problem(s)" % len(problems))
        return 1
    print("check_jobspec_doc: %s: %d field paths of loom.v1.%s, %d rows, all match"
          % (DOC, n_paths, ROOT_MESSAGE, n_rows))
    print("check_jobspec_doc: %d relative links in %d Markdown files, all resolve"
          % (n_links, n_files))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
