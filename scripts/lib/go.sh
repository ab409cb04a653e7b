# shellcheck shell=bash
# A Go toolchain for the scripts that build a server from the Go module proxy (scripts/s3-server,
# scripts/seaweedfs). Sourced, not run: the script sets TOOLS (where tools are kept, e.g.
# target/tools) and defines die.
#
#   go_find MIN           print the path of a go >= MIN on this machine or under $TOOLS
#   go_install VERSION    fetch Go VERSION from the module proxy into $TOOLS/go
#   go_get MIN VERSION    go_find MIN, else go_install VERSION and find it; print its path
#
# Only the package registries are reachable, so a missing Go is fetched from the module proxy
# (golang.org/toolchain, as `go`'s own GOTOOLCHAIN mechanism does): Debian 12's golang package
# is 1.19. Builds should then run with GOTOOLCHAIN=local, so that `go` never switches on its own.

go_version_ok() { # GO MIN
  local v
  v=$("$1" env GOVERSION 2>/dev/null) || return 1
  v=${v#go}
  [ "$(printf '%s\n%s\n' "$v" "$2" | sort -V | head -n1)" = "$2" ]
}

go_find() { # MIN
  local g
  for g in "$(command -v go 2>/dev/null || true)" /usr/local/go/bin/go "$TOOLS/go/bin/go"; do
    if [ -n "$g" ] && [ -x "$g" ] && go_version_ok "$g" "$1"; then echo "$g"; return 0; fi
  done
  return 1
}

go_install() { # VERSION
  local version=$1
  local zip=$TOOLS/go$version.zip
  local url=https://proxy.golang.org/golang.org/toolchain/@v/v0.0.1-go$version.linux-amd64.zip
  command -v unzip >/dev/null 2>&1 || die "unzip is needed to install Go (apt-get install unzip)"
  echo "$(basename "$0"): fetching Go $version from the module proxy" >&2
  mkdir -p "$TOOLS"
  curl -fsSL --retry 3 --max-time 600 -o "$zip.part" "$url" || die "could not download $url"
  mv "$zip.part" "$zip"
  rm -rf "$TOOLS/go" "$TOOLS/go.unpack"
  unzip -q "$zip" -d "$TOOLS/go.unpack"
  mv "$TOOLS/go.unpack/golang.org/toolchain@v0.0.1-go$version.linux-amd64" "$TOOLS/go"
  rm -rf "$TOOLS/go.unpack" "$zip"
  chmod +x "$TOOLS/go/bin/"* "$TOOLS/go/pkg/tool/"*/* 2>/dev/null || true
}

go_get() { # MIN VERSION
  local go
  go=$(go_find "$1") && { echo "$go"; return 0; }
  go_install "$2"
  go_find "$1" || die "Go $2 did not install"
}
