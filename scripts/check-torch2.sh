#!/usr/bin/env bash
# Proves, on a Debian 12 machine (LibTorch 1.13), that every translation unit
# of Loom that includes LibTorch compiles against Debian 13 (trixie)'s
# LibTorch 2.6: once against its CPU headers (libtorch-dev) and once against
# its CUDA headers (libtorch-cuda-dev, contrib) with -DUSE_C10D_NCCL
# -DLOOM_HAVE_TORCH_CUDA=1. Nothing is installed and no build file is written.
#
#  1. Fetch (once). apt-get with a private configuration (state, lists,
#     sources and an empty dpkg status under the cache folder; the system's
#     apt.conf.d, e.g. proxies, still applies) downloads the .debs from trixie
#     main contrib non-free on the mirror this machine's apt uses
#     (scripts/apt-mirror.sh), and dpkg-deb unpacks them into
#     ${LOOM_TORCH2_CACHE:-~/.cache/loom/torch2}. A stamp per package: a
#     second run downloads nothing (--refresh forgets the stamps). Packages:
#     libtorch-dev and libtorch-cuda-dev (2.4 MB each; the two hold the same
#     headers but for c10/cuda/impl/cuda_cmake_macros.h, ATen/cuda/CUDAConfig.h
#     and THC/). CUDA headers come from the machine's toolkit (nvcc on PATH,
#     or LOOM_TORCH2_CUDA_INCLUDE); without one, from Debian 13's
#     nvidia-cuda-dev (non-free, CUDA 12.4, a 912 MiB .deb of which only
#     usr/include is kept) with libcu++-dev, libcub-dev and libthrust-dev
#     (1.4 MiB together). nccl.h from the toolkit, else Debian 13's
#     libnccl-dev (108 MiB, contrib).
#  2. Select. Every entry of BUILD_DIR/compile_commands.json whose
#     dependencies (c++ -M against this machine's headers) include a header of
#     the system's LibTorch, so a new file is checked without anyone listing
#     it. The build dir must have been built once (generated .pb.h files).
#  3. Compile. Each entry's own command, with the system's LibTorch include
#     dirs and LibTorch's interface defines (Caffe2Targets.cmake) swapped for
#     Debian 13's, and -fsyntax-only: the whole TU is parsed and its templates
#     instantiated, no object is written. That is what "compiles" means here;
#     linking is not checked. Everything else (Abseil, protobuf, gRPC, gloo)
#     stays Debian 12's.
#  4. Isolation. Every compile writes its dependency list (-MD); a TU that
#     read any header of the system's LibTorch (/usr/include/{ATen,c10,torch,
#     caffe2,...}) fails, as does one that read none of Debian 13's.
#  5. Results are remembered, as ccache remembers objects. A check is a pure
#     function of its command, its compiler and the bytes of every file it
#     read, so a selection (step 2) or a compile that passed is not run again
#     while its command, the compiler binary (path, size, mtime) and the
#     SHA-256 of every file in its dependency list are unchanged; any edit to
#     a source or header it read runs it again. Kept in $cache/results (a
#     file per check with its dependency list: ~175 MB for ~510 checks),
#     with paths under the source tree relative to it, so a clone elsewhere
#     with the same bytes finds them; --refresh or --no-result-cache runs
#     all.
#     (Like ccache's direct mode, it does not notice a new header that would
#     shadow one found later on the include path.) Link mode never uses it.
#     A result no run has used for 14 days is deleted.
#
# Usage: scripts/check-torch2.sh [options] [BUILD_DIR]   (default: the repository's build/)
#   -j N               compiles at once (default: nproc)
#   --cpu-only         only the CPU headers
#   --cuda-only        only the CUDA headers
#   --cuda-from-debian CUDA headers from Debian 13's nvidia-cuda-dev even when
#                      a toolkit is installed (the path a machine without one takes)
#   --refresh          forget the stamps and remembered results: update the
#                      lists, fetch and unpack again, check every TU
#   --no-result-cache  check every TU (remembered results are neither read nor written)
#   --list             print the selected TUs and exit
#   --filter REGEX     only the selected TUs whose path matches REGEX (Python re.search)
#   --errors N         print the compiler errors of the first N failing TUs (default 5)
#   --link "T1 T2.."   also link: see "Link" below (implies --cuda-only)
# Exit status: 0 when every TU compiled in every configuration (and, with
# --link, every target linked and the canary failed), 1 otherwise.
#
# Link (--link "bin/loom-rank bin/loom-ckpt", ninja targets of BUILD_DIR; not
# part of scripts/test.sh: it fetches Debian 13's libtorch-cuda-2.6, a 480 MB
# .deb, 1.4 GB unpacked). The CUDA configuration's TUs in those targets are
# compiled to objects (-c, not -fsyntax-only), with LOOM_HAVE_TORCH_CUDA=1
# and fused_adamw_cuda.cu compiled by the machine's nvcc when there is one
# (=0 without, CMake's configuration when it finds no nvcc). ninja's own
# archive and link commands for the targets are rerun into
# $cache/link/BUILD with those objects in place of the build's, with
# Debian 12's LibTorch swapped for libtorch-cuda-2.6's libraries (torch,
# torch_cpu, torch_cuda, c10, c10_cuda) and -Wl,--allow-shlib-undefined:
# what LibTorch's own libraries need at run time and Debian 12 lacks (cuDNN,
# the CUDA 12 runtime libraries, trixie's glibc and libstdc++) may stay
# unresolved inside them, but any symbol Loom's objects reference must be
# defined, or the link fails. Each linked binary must need libtorch_cuda. A
# canary proves the allowance hides nothing of Loom's: the first target's
# link again with one more object that calls an undefined function must fail
# with "undefined reference".
#
# Cost, measured on a 2-core Debian 12 VM (gcc 12) while a build ran beside
# it, -j 1 (one compile peaks at ~1.4 GB of memory: mind -j):
#   fetch   cold 5 s (9.8 MB of lists, 4.7 MB of .debs; 120 MB unpacked);
#           without a CUDA toolkit 1.0 GB more, 60 s, 153 MB unpacked in all.
#           Warm: 0 s, no network.
#   select  c++ -M of every entry (~370): 2-5 min (4 s when every result is
#           remembered, step 5).
#   compile ~70 TUs per configuration, 5-8 s each on an idle core (15-30 s
#           on a busy one): ~8 min per configuration on one idle core; about
#           23 min per configuration were measured on the busy machine; 954 s
#           (CPU) and 598 s (CUDA) at -j 2 beside cluster tests on
#           2026-12-07. With every result remembered (step 5) the whole
#           script takes ~40 s; an edited header compiles the TUs that read it.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)

jobs=$(nproc)
configs="cpu cuda"
cuda_from_debian=0
refresh=0
result_cache=1
list_only=0
link_targets=""
errors=5
filter=""
build_dir=$repo/build
while [ $# -gt 0 ]; do
  case "$1" in
    -j) jobs=$2; shift ;;
    -j*) jobs=${1#-j} ;;
    --cpu-only) configs=cpu ;;
    --cuda-only) configs=cuda ;;
    --link) link_targets=$2; configs=cuda; shift ;;
    --cuda-from-debian) cuda_from_debian=1 ;;
    --refresh) refresh=1 ;;
    --no-result-cache) result_cache=0 ;;
    --list) list_only=1 ;;
    --errors) errors=$2; shift ;;
    --filter) filter=$2; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "check-torch2: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) build_dir=$1 ;;
  esac
  shift
done
build_dir=$(cd "$build_dir" && pwd)
if [ ! -f "$build_dir/compile_commands.json" ]; then
  echo "check-torch2: no $build_dir/compile_commands.json (configure with cmake first)" >&2
  exit 2
fi
# The system's LibTorch: Torch_DIR from the build's cache, its prefix as
# TorchConfig.cmake computes it (four levels up).
torch_dir=$(sed -n 's/^Torch_DIR:PATH=//p' "$build_dir/CMakeCache.txt" 2>/dev/null || true)
torch_dir=${torch_dir:-/usr/lib/$(gcc -dumpmachine)/cmake/Torch}
old_prefix=$(cd "$torch_dir/../../../.." && pwd)

cache=${LOOM_TORCH2_CACHE:-$HOME/.cache/loom/torch2}
mkdir -p "$cache/apt/lists/partial" "$cache/apt/sourceparts" "$cache/apt/prefparts" \
  "$cache/debs" "$cache/stamps" "$cache/pkg"
cache=$(cd "$cache" && pwd)
if [ "$refresh" = 1 ]; then rm -rf "$cache"/stamps/* "$cache"/results; fi

# ---- 1. Fetch ---------------------------------------------------------------
fetch_start=$SECONDS
fetched=()
apt_ready=0
apt_setup() {
  [ "$apt_ready" = 1 ] && return 0
  local mirror keyring
  mirror=$("$repo/scripts/apt-mirror.sh")
  keyring=/usr/share/keyrings/debian-archive-keyring.gpg
  # Without gpg (not in a minimal Debian 12), apt-get update says it instead.
  if command -v gpg >/dev/null &&
    ! gpg --show-keys "$keyring" 2>/dev/null | grep '13/trixie' >/dev/null; then
    echo "check-torch2: $keyring has no Debian 13 key (upgrade debian-archive-keyring)" >&2
    exit 1
  fi
  echo "deb [signed-by=$keyring] $mirror trixie main contrib non-free" >"$cache/apt/sources.list"
  : >"$cache/apt/status"
  cat >"$cache/apt/apt.conf" <<EOF
Dir::State "$cache/apt";
Dir::State::Lists "$cache/apt/lists";
Dir::State::status "$cache/apt/status";
Dir::Cache "$cache/apt";
Dir::Cache::archives "$cache/debs";
Dir::Etc::SourceList "$cache/apt/sources.list";
Dir::Etc::SourceParts "$cache/apt/sourceparts";
Dir::Etc::Preferences "$cache/apt/preferences";
Dir::Etc::PreferencesParts "$cache/apt/prefparts";
Acquire::Languages "none";
APT::Architecture "$(dpkg --print-architecture)";
APT::Sandbox::User "$(id -un)";
#clear APT::Update::Post-Invoke-Success;
#clear APT::Update::Post-Invoke;
EOF
  echo "check-torch2: apt lists of trixie main contrib non-free from $mirror"
  APT_CONFIG=$cache/apt/apt.conf apt-get update -qq
  apt_ready=1
}
# fetch PACKAGE DIR [PATH_IN_DEB]: unpack PACKAGE's Debian 13 .deb into
# $cache/pkg/DIR (only PATH_IN_DEB, e.g. ./usr/include, when given).
fetch() {
  local pkg=$1 dir=$2 part=${3:-} deb
  if [ -f "$cache/stamps/$dir" ] && [ -d "$cache/pkg/$dir" ]; then return 0; fi
  apt_setup
  rm -rf "$cache/pkg/$dir" "$cache/debs/${pkg}_"*.deb
  (cd "$cache/debs" && APT_CONFIG=$cache/apt/apt.conf apt-get download -qq "$pkg")
  deb=$(compgen -G "$cache/debs/${pkg}_*.deb" | sed -n 1p || true)
  if [ -z "$deb" ]; then echo "check-torch2: $pkg was not downloaded" >&2; exit 1; fi
  mkdir -p "$cache/pkg/$dir.tmp"
  if [ -n "$part" ]; then
    dpkg-deb --fsys-tarfile "$deb" | tar -x -C "$cache/pkg/$dir.tmp" "$part"
  else
    dpkg-deb -x "$deb" "$cache/pkg/$dir.tmp"
  fi
  mv "$cache/pkg/$dir.tmp" "$cache/pkg/$dir"
  fetched+=("$(basename "$deb") ($(du -k "$deb" | cut -f1) KiB)")
  basename "$deb" >"$cache/stamps/$dir"
  rm -f "$deb"
}

case " $configs " in *" cpu "*) fetch libtorch-dev torch-cpu ;; esac
cuda_include=""
cuda_dirs=()  # -isystem dirs of the CUDA configuration besides LibTorch's
if [[ " $configs " == *" cuda "* ]]; then
  fetch libtorch-cuda-dev torch-cuda
  if [ -n "$link_targets" ]; then
    fetch libtorch-cuda-2.6 torch-cuda-lib ./usr/lib
  fi
  # The machine's CUDA toolkit: LOOM_TORCH2_CUDA_INCLUDE, else nvcc's.
  if [ "$cuda_from_debian" = 0 ]; then
    if [ -n "${LOOM_TORCH2_CUDA_INCLUDE:-}" ]; then
      cuda_include=$LOOM_TORCH2_CUDA_INCLUDE
    elif command -v nvcc >/dev/null; then
      cuda_home=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")
      for d in "$cuda_home/include" "$cuda_home/targets/$(uname -m)-linux/include"; do
        if [ -f "$d/cuda_runtime.h" ]; then cuda_include=$d; break; fi
      done
    fi
  fi
  if [ -n "$cuda_include" ]; then
    cuda_dirs+=("$cuda_include")
  else
    # Debian's toolkit headers, with the CCCL packages nvidia-cuda-dev
    # depends on (cuda_fp16.h includes <nv/target> from libcu++-dev).
    for p in nvidia-cuda-dev libcu++-dev libcub-dev libthrust-dev; do
      fetch "$p" "$p" ./usr/include
      cuda_dirs+=("$cache/pkg/$p/usr/include")
    done
    cuda_include=${cuda_dirs[0]}
  fi
  if [ ! -f "$cuda_include/cuda_runtime.h" ]; then
    echo "check-torch2: no cuda_runtime.h in $cuda_include" >&2; exit 1
  fi
  if [ ! -f "$cuda_include/nccl.h" ]; then
    fetch libnccl-dev libnccl-dev ./usr/include
    cuda_dirs+=("$cache/pkg/libnccl-dev/usr/include")
  fi
  echo "check-torch2: CUDA and NCCL headers from ${cuda_dirs[*]}"
fi
fetch_seconds=$((SECONDS - fetch_start))
if [ "${#fetched[@]}" -gt 0 ]; then
  echo "check-torch2: fetched ${fetched[*]}"
fi
echo "check-torch2: fetch and unpack: ${fetch_seconds} s ($(du -sh "$cache" | cut -f1) in $cache)"

# ---- 2-4. Select, compile, check isolation -----------------------------------
export CT2_BUILD_DIR=$build_dir CT2_OLD_PREFIX=$old_prefix CT2_TORCH_DIR=$torch_dir
export CT2_CACHE=$cache CT2_CONFIGS=$configs CT2_JOBS=$jobs CT2_LIST_ONLY=$list_only
cuda_dirs_list=$(IFS=:; echo "${cuda_dirs[*]}")
export CT2_ERRORS=$errors CT2_FILTER=$filter CT2_CUDA_DIRS=$cuda_dirs_list
# Link mode: the targets, and nvcc with its runtime library when there is one.
nvcc_path=""
cudart_dir=""
if [ -n "$link_targets" ] && command -v nvcc >/dev/null; then
  nvcc_path=$(readlink -f "$(command -v nvcc)")
  cuda_home=$(dirname "$(dirname "$nvcc_path")")
  for d in "$cuda_home/lib64" "$cuda_home/targets/$(uname -m)-linux/lib"; do
    if [ -e "$d/libcudart.so" ]; then cudart_dir=$d; break; fi
  done
  if [ -z "$cudart_dir" ]; then nvcc_path=""; fi
fi
export CT2_LINK_TARGETS=$link_targets CT2_NVCC=$nvcc_path CT2_CUDART_DIR=$cudart_dir
export CT2_REPO=$repo CT2_RESULT_CACHE=$result_cache
exec python3 - <<'PY'
import concurrent.futures, glob, hashlib, json, os, re, shlex, subprocess, sys, tempfile, threading, time

env = os.environ
build_dir = env["CT2_BUILD_DIR"]
old_prefix = env["CT2_OLD_PREFIX"]
cache = env["CT2_CACHE"]
jobs = max(1, int(env["CT2_JOBS"]))


def log(msg):
    print("check-torch2: " + msg, flush=True)


def interface_defines(targets_cmake, target):
    """INTERFACE_COMPILE_DEFINITIONS of `target` in a Caffe2Targets.cmake."""
    try:
        text = open(targets_cmake).read()
    except OSError:
        return []
    m = re.search(r"set_target_properties\(%s PROPERTIES(.*?)\n\)" % target, text, re.S)
    if not m:
        return []
    d = re.search(r'INTERFACE_COMPILE_DEFINITIONS "([^"]*)"', m.group(1))
    return d.group(1).split(";") if d else []


# Top-level names under include/ that the system's LibTorch owns; any header
# below them is "the system's LibTorch" (selection and isolation).
old_include = os.path.join(old_prefix, "include")
old_api_include = os.path.join(old_include, "torch/csrc/api/include")
new_roots = {c: os.path.join(cache, "pkg", "torch-" + c, "usr") for c in ("cpu", "cuda")}
torch_names = {"ATen", "c10", "caffe2", "torch", "THC", "kineto", "libshm.h", "qnnpack_func.h"}
for root in new_roots.values():
    if os.path.isdir(os.path.join(root, "include")):
        torch_names.update(os.listdir(os.path.join(root, "include")))
old_torch_paths = tuple(os.path.join(old_include, n) for n in sorted(torch_names))
old_caffe2 = os.path.join(os.path.dirname(env["CT2_TORCH_DIR"]), "Caffe2", "Caffe2Targets.cmake")
old_defines = set(interface_defines(old_caffe2, "torch_cpu")) or {
    "USE_DISTRIBUTED", "USE_C10D_GLOO", "USE_RPC", "USE_TENSORPIPE"}


# LibTorch's interface defines as a CMake build against Debian 13 gets them
# (torch_cpu's; the CUDA package's torch_cpu lacks USE_C10D_MPI).
new_cpu_defines = {}
for c, usr in new_roots.items():
    found = glob.glob(os.path.join(usr, "lib/*/cmake/Caffe2/Caffe2Targets.cmake"))
    new_cpu_defines[c] = interface_defines(found[0], "torch_cpu") if found else []


def is_old_torch(path):
    return path == old_include or any(
        path == p or path.startswith(p + "/") for p in old_torch_paths)


def parse_deps(text):
    """The prerequisites of a make rule as gcc -M writes it, normalized."""
    text = text.replace("\\\n", " ")
    _, _, rest = text.partition(": ")
    return [os.path.normpath(p.replace("\\ ", " "))
            for p in re.split(r"(?<!\\)\s+", rest) if p]


def base_args(entry):
    """The entry's compiler command without output, dependency and -c flags."""
    args = entry["arguments"] if "arguments" in entry else shlex.split(entry["command"])
    if os.path.basename(args[0]) in ("ccache", "sccache"):
        args = args[1:]
    out = []
    skip = 0
    for a in args:
        if skip:
            skip -= 1
            continue
        if a in ("-o", "-MF", "-MT", "-MQ"):
            skip = 1
        elif a in ("-c", "-MD", "-MMD", "-MP", "-M", "-MM") or a.startswith(
                ("-o", "-MF", "-MT", "-MQ")):
            pass
        else:
            out.append(a)
    return out


def run(args, cwd):
    p = subprocess.run(["nice", "-n", "19"] + args, cwd=cwd, capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


entries = json.load(open(os.path.join(build_dir, "compile_commands.json")))
entries = [e for e in entries if e["file"].endswith((".cc", ".cpp", ".cxx", ".C"))]
if env["CT2_FILTER"]:
    entries = [e for e in entries if re.search(env["CT2_FILTER"], e["file"])]

# ---- Link mode: the targets' own commands ------------------------------------
link_targets = env.get("CT2_LINK_TARGETS", "").split()
link_dir = os.path.join(cache, "link", re.sub(r"[^A-Za-z0-9]+", "_", build_dir.strip("/")))
ninja_commands = []
if link_targets:
    p = subprocess.run(["ninja", "-C", build_dir, "-t", "commands"] + link_targets,
                       capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit("check-torch2: ninja -t commands %s: %s" % (" ".join(link_targets), p.stderr))
    ninja_commands = [line for line in p.stdout.splitlines() if line.strip()]
    def entry_output(e):
        """The object an entry writes: its "output", else its command's -o."""
        if e.get("output"):
            return e["output"]
        args = e["arguments"] if "arguments" in e else shlex.split(e["command"])
        return args[args.index("-o") + 1] if "-o" in args else ""

    closure = set()
    for line in ninja_commands:
        words = shlex.split(line)
        if "-c" in words and "-o" in words:
            closure.add(os.path.normpath(words[words.index("-o") + 1]))
    entries = [e for e in entries
               if os.path.normpath(os.path.relpath(
                   os.path.join(e["directory"], entry_output(e)), build_dir)) in closure]
    if not entries:
        sys.exit("check-torch2: no compile_commands.json entry builds %s" % " ".join(link_targets))
    have_cuda_kernel = bool(env.get("CT2_NVCC"))
# The source tree: CMAKE_HOME_DIRECTORY in the build's cache.
root_dir = os.path.dirname(build_dir.rstrip("/"))
try:
    for line in open(os.path.join(build_dir, "CMakeCache.txt")):
        if line.startswith("CMAKE_HOME_DIRECTORY:"):
            root_dir = line.split("=", 1)[1].strip()
except OSError:
    pass


def rel(path):
    return os.path.relpath(path, root_dir) if path.startswith(root_dir + "/") else path


# ---- Remembered results (step 5) ---------------------------------------------
results_dir = os.path.join(cache, "results")
use_results = env.get("CT2_RESULT_CACHE", "1") == "1" and not env.get("CT2_LINK_TARGETS", "").split()
_digests = {}
_digests_lock = threading.Lock()


def file_digest(path):
    """SHA-256 of a file's bytes ("absent" when it cannot be read), once per run."""
    with _digests_lock:
        if path in _digests:
            return _digests[path]
    try:
        with open(path, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
    except OSError:
        digest = "absent"
    with _digests_lock:
        _digests[path] = digest
    return digest


# Paths under the source tree are remembered relative to it ("<root>/..."), so
# that a clone elsewhere (CI's) finds what a check of the same bytes found.
ROOT_MARK = "<root>"


def portable(text):
    return re.sub(re.escape(root_dir) + r"(?=/|$)", ROOT_MARK, text)


def local_path(path):
    return root_dir + path[len(ROOT_MARK):] if path.startswith(ROOT_MARK + "/") else path


def result_key(kind, args, cwd):
    exe = shutil_which(args[0])
    try:
        st = os.stat(exe)
        compiler = [os.path.realpath(exe), st.st_size, st.st_mtime_ns]
    except OSError:
        compiler = [args[0]]
    text = json.dumps([kind, [portable(a) for a in args], portable(cwd), compiler])
    return os.path.join(results_dir, hashlib.sha256(text.encode()).hexdigest() + ".json")


def shutil_which(name):
    if os.path.isabs(name):
        return name
    for d in env.get("PATH", "").split(os.pathsep):
        p = os.path.join(d, name)
        if os.access(p, os.X_OK):
            return p
    return name


def remembered(kind, args, cwd):
    """The value a check with this command stored, if every file it read is unchanged."""
    if not use_results:
        return None
    key = result_key(kind, args, cwd)
    try:
        with open(key) as f:
            record = json.load(f)
    except (OSError, ValueError):
        return None
    for path, digest in record["deps"].items():
        if file_digest(local_path(path)) != digest:
            return None
    try:
        os.utime(key)  # used: kept by the pruning below
    except OSError:
        pass
    return record


def prune_results(days=14):
    """Forgets results no run has used for `days` days (the results of
    sources edited since are never used again)."""
    if not use_results or not os.path.isdir(results_dir):
        return
    cutoff = time.time() - days * 86400
    for name in os.listdir(results_dir):
        path = os.path.join(results_dir, name)
        try:
            if os.path.getmtime(path) < cutoff:
                os.remove(path)
        except OSError:
            pass


def remember(kind, args, cwd, deps, value):
    if not use_results:
        return
    record = {"deps": {portable(d): file_digest(d) for d in deps}, "value": value}
    path = result_key(kind, args, cwd)
    # A result that cannot be kept (a full or read-only cache) only costs the
    # next run a compile.
    try:
        os.makedirs(results_dir, exist_ok=True)
        tmp = "%s.tmp-%d-%d" % (path, os.getpid(), threading.get_ident())
        with open(tmp, "w") as f:
            json.dump(record, f)
        os.replace(tmp, path)
    except OSError as e:
        log("warning: could not keep a result in %s: %s" % (results_dir, e))


# ---- Select ------------------------------------------------------------------
# The CUDA configuration's defines also go into the selection, as some TUs
# include LibTorch's CUDA headers only under them (device_memory.cc).
CUDA_DEFINES = ["-DUSE_C10D_NCCL", "-DLOOM_HAVE_TORCH_CUDA=1"]
CUDA_DEFINES_NAMES = ("USE_C10D_NCCL", "LOOM_HAVE_TORCH_CUDA")


def includes_torch(entry, extra):
    """(True when the TU reads a header of the system's LibTorch, its
    dependencies); (None, error) when c++ -M failed."""
    # -MG: a header missing here (cuda_runtime.h) is listed as written.
    args = base_args(entry) + extra + ["-M", "-MG"]
    known = remembered("select", args, entry["directory"])
    if known is not None:
        return known["value"]["hit"], [local_path(d) for d in known["value"]["deps"]]
    rc, out, err = run(args, entry["directory"])
    if rc != 0:
        return None, err
    deps = parse_deps(out)
    hit, listed = classify_deps(entry, deps)
    remember("select", args, entry["directory"],
             [os.path.normpath(os.path.join(entry["directory"], d)) for d in deps],
             {"hit": hit, "deps": [portable(d) for d in listed]})
    return hit, listed


def classify_deps(entry, deps):
    """(True, deps) when deps hold a header of the system's LibTorch, else
    (False, the deps as absolute paths)."""
    for d in deps:
        if os.path.isabs(d) and is_old_torch(d):
            return True, deps
        if not os.path.isabs(d) and d.split("/")[0] in torch_names:
            return True, deps
    return False, [os.path.normpath(os.path.join(entry["directory"], d)) for d in deps]


def select(candidates, extra):
    """The candidates that include LibTorch, and the dependencies of the rest."""
    hits, others = [], []
    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        results = pool.map(lambda e: includes_torch(e, extra), candidates)
        for entry, (hit, deps) in zip(candidates, results):
            if hit is None:
                # Cannot tell: check it if CMake gave it LibTorch's include dirs.
                hit = old_api_include in " ".join(base_args(entry))
                log("warning: c++ -M failed for %s; %s" % (
                    rel(entry["file"]), "checking it (it has LibTorch's include dir)"
                    if hit else "skipping it"))
                sys.stderr.write(deps[:2000])
                deps = []
            (hits if hit else others).append((entry, deps))
    return [e for e, _ in hits], others


def mentions_cuda_defines(deps):
    """True when one of the project's own files among deps tests a CUDA define."""
    for d in deps:
        if d.startswith(root_dir + "/"):
            try:
                text = open(d, errors="replace").read()
            except OSError:
                continue
            if any(m in text for m in CUDA_DEFINES_NAMES):
                return True
    return False


t0 = time.time()
configs = env["CT2_CONFIGS"].split()
cpu_hits, others = select(entries, [])
selected = {"cpu": cpu_hits}
if "cuda" in configs:
    # Again with the CUDA defines, for the TUs whose own files test them.
    maybe = [e for e, deps in others if mentions_cuda_defines(deps)]
    cuda_extra, _ = select(maybe, CUDA_DEFINES)
    selected["cuda"] = [e for e in entries
                        if any(e is h for h in cpu_hits) or any(e is h for h in cuda_extra)]
select_seconds = time.time() - t0
log("selected the TUs that include LibTorch (c++ -M against %s, %.0f s): %s, of %d"
    % (old_include, select_seconds,
       ", ".join("%s %d" % (c, len(selected[c])) for c in configs), len(entries)))
if env["CT2_LIST_ONLY"] == "1":
    for c in configs:
        for e in selected[c]:
            print("%s %s" % (c, rel(e["file"])))
    sys.exit(0)


# ---- Compile -----------------------------------------------------------------
def include_dir_flag(a, nxt):
    """(words consumed, directory) when a (and nxt) name an include dir, else (0, None)."""
    for flag in ("-isystem", "-iquote", "-idirafter", "-I"):
        if a == flag:
            return 2, nxt
        if a.startswith(flag):
            return 1, a[len(flag):]
    return 0, None


def config_args(entry, config):
    usr = new_roots[config]
    new_dirs = ["-isystem", usr + "/include", "-isystem", usr + "/include/torch/csrc/api/include"]
    new_defines = list(new_cpu_defines[config])
    if config == "cuda":
        for d in env["CT2_CUDA_DIRS"].split(":"):
            new_dirs += ["-isystem", d]
        new_defines += [d[2:] for d in CUDA_DEFINES]
        if link_targets and not have_cuda_kernel:
            # Linking without nvcc: CMake's configuration when it finds none.
            new_defines = [d for d in new_defines if not d.startswith("LOOM_HAVE_TORCH_CUDA")]
            new_defines.append("LOOM_HAVE_TORCH_CUDA=0")
    args = base_args(entry)
    out = [args[0]]
    inserted = False
    i = 1
    while i < len(args):
        a = args[i]
        nxt = args[i + 1] if i + 1 < len(args) else ""
        n, d = include_dir_flag(a, nxt)
        if n and os.path.normpath(os.path.join(entry["directory"], d)) in (
                old_include, old_api_include):
            if not inserted:
                out += new_dirs
                inserted = True
            i += n
            continue
        if a.startswith("-D"):
            name = a[2:] or nxt
            if name.split("=")[0] in old_defines | {"LOOM_HAVE_TORCH_CUDA", "USE_C10D_NCCL"}:
                i += 1 if a[2:] else 2
                continue
        out.append(a)
        i += 1
    if not inserted:
        out[1:1] = new_dirs
    if not any(a.startswith("-std=") for a in out):
        out.insert(1, "-std=c++17")
    return out + ["-D" + d for d in new_defines] + ["-fsyntax-only"]


def object_of(entry):
    """Where link mode writes the entry's object: its build path under link_dir."""
    out = os.path.relpath(os.path.join(entry["directory"], entry_output(entry)), build_dir)
    return os.path.join(link_dir, "obj", out)


def compile_one(index, entry, config, deps_dir):
    deps_file = os.path.join(deps_dir, "%d.d" % index)
    key_args = config_args(entry, config)
    if remembered("compile", key_args, entry["directory"]) is not None:
        return True, 0.0, "", key_args, True
    args = key_args + ["-MD", "-MF", deps_file]
    if link_targets:
        obj = object_of(entry)
        os.makedirs(os.path.dirname(obj), exist_ok=True)
        args = [a for a in args if a != "-fsyntax-only"] + ["-c", "-o", obj]
    start = time.time()
    rc, out, err = run(args, entry["directory"])
    seconds = time.time() - start
    problem = ""
    if rc == 0:
        try:
            deps = [os.path.normpath(os.path.join(entry["directory"], d))
                    for d in parse_deps(open(deps_file).read())]
        except OSError:
            deps = []
        old = sorted({d for d in deps if is_old_torch(d)})
        if old:
            problem = "isolation: read %d header(s) of the system's LibTorch, e.g.\n  %s\n" % (
                len(old), "\n  ".join(old[:5]))
        elif not any(d.startswith(new_roots[config] + "/") for d in deps):
            problem = "isolation: read no header of Debian 13's LibTorch\n"
        if not problem and deps and not link_targets:
            remember("compile", key_args, entry["directory"], deps, True)
    return rc == 0 and not problem, seconds, (out + err + problem), args, False


exit_code = 0
summary = []
for config in configs:
    t0 = time.time()
    failures = []
    done = 0
    reused = 0
    with tempfile.TemporaryDirectory() as deps_dir, \
            concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        futures = {pool.submit(compile_one, i, e, config, deps_dir): e
                   for i, e in enumerate(selected[config])}
        for fut in concurrent.futures.as_completed(futures):
            entry = futures[fut]
            ok, seconds, output, args, cached = fut.result()
            done += 1
            reused += 1 if cached else 0
            print("[%s %d/%d] %s %5.1f s %s%s" % (config, done, len(selected[config]),
                                                  "ok  " if ok else "FAIL", seconds,
                                                  rel(entry["file"]),
                                                  " (unchanged: passed before)" if cached else ""),
                  flush=True)
            if not ok:
                failures.append((entry, output, args))
    seconds = time.time() - t0
    summary.append("%s: %d TUs compiled (%d of them unchanged since they passed), %d failed, %.0f s" % (
        config, len(selected[config]), reused, len(failures), seconds))
    if failures:
        exit_code = 1
        failures.sort(key=lambda f: f[0]["file"])
        log("%s: %d TU(s) failed:" % (config, len(failures)))
        for entry, _, _ in failures:
            print("  " + rel(entry["file"]))
        for entry, output, args in failures[:int(env["CT2_ERRORS"])]:
            print("---- %s (%s) ----" % (rel(entry["file"]), config))
            print("$ cd %s && %s" % (entry["directory"], " ".join(shlex.quote(a) for a in args)))
            lines = output.splitlines()
            print("\n".join(lines[:60]) + ("\n[... %d more lines]" % (len(lines) - 60)
                                             if len(lines) > 60 else ""))


prune_results()


# ---- Link ----------------------------------------------------------------------
def link():
    """Reruns ninja's archive and link commands for the targets with the
    LibTorch 2.6 objects and libraries; returns the failures."""
    new_libdir = glob.glob(os.path.join(cache, "pkg", "torch-cuda-lib", "usr", "lib", "*-linux-gnu"))
    if not new_libdir or not os.path.exists(os.path.join(new_libdir[0], "libtorch_cuda.so.2.6.0")):
        return ["no libtorch_cuda.so.2.6.0 under %s" % os.path.join(cache, "pkg", "torch-cuda-lib")]
    new_libdir = new_libdir[0]
    old_libdir = os.path.normpath(os.path.join(env["CT2_TORCH_DIR"], "../../"))
    objects = {}  # build-relative object path -> LibTorch 2.6 object
    for e in selected["cuda"]:
        objects[os.path.normpath(os.path.relpath(
            os.path.join(e["directory"], entry_output(e)), build_dir))] = object_of(e)
    failures = []
    extra_objects = []
    if have_cuda_kernel:
        cu = os.path.join(env["CT2_REPO"], "worker/engine/ops/fused_adamw_cuda.cu")
        obj = os.path.join(link_dir, "obj", "fused_adamw_cuda.cu.o")
        rc, out, err = run([env["CT2_NVCC"], "-std=c++17", "-O3", "-I", env["CT2_REPO"],
                            "-c", cu, "-o", obj], build_dir)
        if rc != 0:
            return ["nvcc %s:\n%s" % (cu, (out + err)[-3000:])]
        log("link: compiled %s with %s" % (rel(cu), env["CT2_NVCC"]))
        extra_objects = [obj, os.path.join(env["CT2_CUDART_DIR"], "libcudart.so")]
    archives = {}
    torch_lib = re.compile(re.escape(old_libdir) + r"/lib(torch|torch_cpu|c10)\.so(\.[0-9.]+)?\b")
    links = []
    for line in ninja_commands:
        words = shlex.split(line)
        if "ar" in [os.path.basename(w) for w in words] and " qc " in " %s " % " ".join(words):
            i = [os.path.basename(w) for w in words].index("ar")
            end = words.index("&&", i) if "&&" in words[i:] else len(words)
            archive, members = words[i + 2], words[i + 3:end]
            new_archive = os.path.join(link_dir, archive)
            os.makedirs(os.path.dirname(new_archive), exist_ok=True)
            if os.path.exists(new_archive):
                os.remove(new_archive)
            members = [objects.get(os.path.normpath(m), m) for m in members]
            rc, out, err = run(["ar", "qc", new_archive] + members, build_dir)
            if rc == 0:
                rc, out, err = run(["ranlib", new_archive], build_dir)
            if rc != 0:
                failures.append("ar %s: %s" % (archive, out + err))
            archives[os.path.normpath(archive)] = new_archive
        elif "-o" in words and "-c" not in words and words[0] == ":":
            links.append(words)
    if failures:
        return failures
    flags = ["-Wl,--allow-shlib-undefined", "-Wl,-rpath-link," + new_libdir]
    cuda_libs = ["-Wl,--no-as-needed," + os.path.join(new_libdir, "libtorch_cuda.so.2.6.0"),
                 os.path.join(new_libdir, "libc10_cuda.so.2.6.0"), "-Wl,--as-needed"]
    linked = []
    for words in links:
        cmd = words[words.index("&&") + 1:]
        cmd = cmd[:cmd.index("&&")] if "&&" in cmd else cmd
        target = cmd[cmd.index("-o") + 1]
        uses_torch = any(torch_lib.search(w) for w in cmd)
        out_path = os.path.join(link_dir, target)
        os.makedirs(os.path.dirname(out_path), exist_ok=True)
        new_cmd = []
        for j, w in enumerate(cmd):
            if j > 0 and cmd[j - 1] == "-o":
                new_cmd.append(out_path)
                continue
            w = objects.get(os.path.normpath(w), w)
            w = archives.get(os.path.normpath(w), w)
            w = torch_lib.sub(lambda m: os.path.join(new_libdir, "lib%s.so.2.6.0" % m.group(1)), w)
            new_cmd.append(w)
        if uses_torch:
            new_cmd += cuda_libs + extra_objects
        new_cmd += flags
        t0 = time.time()
        rc, out, err = run(new_cmd, build_dir)
        seconds = time.time() - t0
        if rc != 0:
            undefined = [l for l in (out + err).splitlines() if "undefined reference" in l]
            failures.append("link %s (%.0f s): %d undefined reference(s)\n%s\n$ cd %s && %s" % (
                target, seconds, len(undefined), "\n".join(((out + err).splitlines())[-40:]),
                build_dir, " ".join(shlex.quote(a) for a in new_cmd)))
            continue
        needed = subprocess.run(["readelf", "-d", out_path], capture_output=True, text=True).stdout
        if uses_torch and "libtorch_cuda.so.2.6" not in needed:
            failures.append("link %s: the binary does not need libtorch_cuda.so.2.6" % target)
            continue
        log("link: %s linked against libtorch-cuda-2.6 in %.0f s (%s)" % (
            target, seconds, out_path if uses_torch else out_path + ", no LibTorch"))
        linked.append((target, new_cmd, out_path))
    if not linked or failures:
        return failures or ["nothing linked"]
    # The canary: Loom's own undefined references must still fail the link.
    target, cmd, out_path = linked[0]
    canary_src = os.path.join(link_dir, "canary.cc")
    canary_obj = os.path.join(link_dir, "canary.o")
    with open(canary_src, "w") as f:
        f.write('extern "C" void loom_link_check_canary();\n'
                'extern "C" void loom_link_check_caller() { loom_link_check_canary(); }\n')
    rc, out, err = run(["c++", "-c", canary_src, "-o", canary_obj], link_dir)
    canary_cmd = [out_path + ".canary" if (k > 0 and cmd[k - 1] == "-o") else w
                  for k, w in enumerate(cmd)] + [canary_obj]
    rc, out, err = run(canary_cmd, build_dir)
    if rc == 0 or "undefined reference to `loom_link_check_canary'" not in out + err:
        return ["canary: %s linked with an undefined function of its own (rc %d): the check "
                "would hide Loom's missing symbols" % (target, rc)]
    log("link: canary ok: an undefined function in %s's objects fails its link" % target)
    return []


if link_targets and exit_code == 0:
    t0 = time.time()
    problems = link()
    seconds = time.time() - t0
    summary.append("link: %s, %d problem(s), %.0f s (LOOM_HAVE_TORCH_CUDA=%d)" % (
        " ".join(link_targets), len(problems), seconds, 1 if have_cuda_kernel else 0))
    for problem in problems:
        print("---- link ----\n" + problem)
    if problems:
        exit_code = 1
for line in summary:
    log(line)
if link_targets:
    log("linked against libtorch-cuda-2.6" if exit_code == 0 else "FAILED")
else:
    log("all TUs compiled against LibTorch 2.6" if exit_code == 0 else "FAILED")
sys.exit(exit_code)
PY
