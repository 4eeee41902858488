# What scripts/install, scripts/uninstall and scripts/package-deb share: where each file goes,
# the manifest of what an install made, and the files made at install time. Sourced, not run.

# Sets the folders of an install into PREFIX ($1), or of a --user install ($2 = 1) into ~/.local,
# with the desktop's data (unit, desktop entry, completion) in $XDG_DATA_HOME where they are looked for.
layout() {
  if (($2)); then
    prefix=$HOME/.local
    local data=${XDG_DATA_HOME:-$HOME/.local/share}
    unitdir=$data/systemd/user
    applicationsdir=$data/applications
    completionsdir=${BASH_COMPLETION_USER_DIR:-$data/bash-completion}/completions
    user_flag=" --user"
  else
    prefix=$(realpath -m "$1")
    unitdir=$prefix/lib/systemd/user
    applicationsdir=$prefix/share/applications
    completionsdir=$prefix/share/bash-completion/completions
    user_flag=$([[ $prefix == /usr/local ]] || echo " --prefix $prefix")
  fi
  bindir=$prefix/bin
  libdir=$prefix/lib/krakl-agent
  mandir=$prefix/share/man
  manifest=$libdir/install-manifest
  # The unit's ExecStart and the desktop entry's Exec name these paths unquoted.
  local folder
  for folder in "$prefix" "$unitdir" "$applicationsdir" "$completionsdir"; do
    [[ $folder =~ ^/[A-Za-z0-9._/+@-]*$ ]] || {
      echo "install: $folder: only letters, digits and ._/+@- are allowed in the install's paths (the unit and desktop entry name them)" >&2
      exit 2
    }
  done
}

# swift build -c release, as the person who ran sudo when run through sudo (so .build stays theirs).
build_release() {
  local swift
  swift=$(command -v swift || echo /opt/swift/usr/bin/swift)
  [[ -x $swift ]] || { echo "install: no Swift toolchain (swift on PATH or /opt/swift): run scripts/setup first" >&2; exit 1; }
  if [[ $(id -u) -eq 0 && -n ${SUDO_USER:-} && $SUDO_USER != root ]]; then
    sudo -H -u "$SUDO_USER" "$swift" build -c release --package-path "$repo"
  else
    "$swift" build -c release --package-path "$repo"
  fi
}

# The backend libraries the repository's plugins.json names (libBackendFile.so, …).
backend_libraries() {
  grep -o '"\.build/release/[^"]*"' "$repo/plugins.json" | sed 's|^"\.build/release/||; s|"$||'
}

# The Swift runtime libraries (the toolchain's lib/swift/linux) the given ELF files load.
swift_runtime() {
  ldd "$@" | awk '$3 ~ /\/lib\/swift\/linux\// { print $3 }' | sort -u
}

# build-info for `krakl-agent --version` (Sources/Agent/CLI/BuildInfo.swift): the checkout's commit,
# "-dirty" when tracked files differ from it. --build-dir names products built from this
# checkout, so its commit is theirs. safe.directory: run through sudo, git refuses another user's checkout.
build_info() {
  local commit
  if commit=$(git -c safe.directory="$repo" -C "$repo" rev-parse HEAD 2>/dev/null); then
    [[ -z $(git -c safe.directory="$repo" -C "$repo" status --porcelain --untracked-files=no 2>/dev/null) ]] || commit+=-dirty
  else
    commit="unknown (not installed from a git checkout)"
  fi
  printf 'commit=%s\n' "$commit"
}

# The man page, from `krakl-agent --help` on stdin (so it says what --help says): the help's
# upper-case headings become sections, everything else is kept as it is laid out (no filling).
# $1 is the version line for the page's footer.
man_page() {
  local date
  date=$(git -c safe.directory="$repo" -C "$repo" log -1 --format=%cs 2>/dev/null || date -u +%F)
  awk -v source="$1" -v date="$date" '
    function escaped(text) {
      gsub(/\\/, "\\e", text); gsub(/-/, "\\-", text)
      if (text ~ /^[.'"'"']/) text = "\\&" text
      return text
    }
    NR == 1 {
      name = $0; sub(/^krakl-agent: /, "", name); sub(/\. .*/, "", name)
      printf ".TH KRAKL-AGENT 1 \"%s\" \"%s\" \"User Commands\"\n.SH NAME\nkrakl-agent \\- %s\n.SH DESCRIPTION\n.nf\n", date, source, escaped(name)
    }
    /^[A-Z][A-Z0-9 ]*[A-Z]( \(.*\))?$/ { printf ".fi\n.SH %s\n.nf\n", escaped($0); next }
    { print escaped($0) }
    END { print ".fi" }'
}

# The manifest: one line per file ("f PATH") and per folder the install made ("d PATH"), in order.
manifest_begin() { entries=$(mktemp); }
record() { [[ -n $destdir ]] || printf '%s %s\n' "$1" "$2" >> "$entries"; }
manifest_end() {
  [[ -n $destdir ]] || install -m 644 "$entries" "$manifest"
  rm -f "$entries"
}

# Makes folder $1 (under $destdir) and the missing ones above it, recording each one made.
make_folders() {
  local folder=$1 missing=() made
  while [[ ! -d $destdir$folder ]]; do missing=("$folder" "${missing[@]}"); folder=$(dirname "$folder"); done
  for made in "${missing[@]}"; do mkdir -m 755 "$destdir$made"; record d "$made"; done
}

# put SOURCE|- PATH MODE: installs a file (- : stdin) at PATH (under $destdir) and records it.
put() {
  local source=$1
  [[ $source != - ]] || source=/dev/stdin
  make_folders "$(dirname "$2")"
  install -m "$3" "$source" "$destdir$2"
  record f "$2"
}

# Removes what manifest $1 lists: its files, the manifest, then the folders it made that are empty.
remove_install() {
  local kind path files=() folders=() i
  while read -r kind path; do
    # Only what an install writes: absolute paths, no way up.
    [[ $path == /* && $path != */../* ]] || { echo "uninstall: $1: skipped \"$path\"" >&2; continue; }
    case $kind in f) files+=("$path") ;; d) folders+=("$path") ;; esac
  done < "$1"
  rm -f -- "${files[@]}" "$1"
  for ((i = ${#folders[@]} - 1; i >= 0; i--)); do
    rmdir -- "${folders[i]}" 2>/dev/null || echo "uninstall: kept ${folders[i]}: other files are in it" >&2
  done
  removed=${#files[@]}
}

remove_previous_install() {
  [[ -f $manifest ]] || return 0
  echo "install: removing the previous install first ($manifest)"
  remove_install "$manifest"
}
