#!/usr/bin/env bash
# Makes a Vulkan CPU driver (Mesa lavapipe) available for ManiSkill3/SAPIEN without a system-wide Mesa install.
#
# Debian bookworm's own lavapipe (Mesa 22) is too old for SAPIEN 3; the Mesa 25 build from bookworm-backports
# works. This script fetches that package with `apt-get download` through a PRIVATE apt configuration (the
# system's sources and package lists are left untouched; the mirror is the one the system already uses),
# unpacks it under DIR and writes DIR/lvp_icd.json pointing at the unpacked driver. SAPIEN ships its own Vulkan
# loader, so VK_ICD_FILENAMES=DIR/lvp_icd.json is all a process needs.
#
# Usage:   eval "$(bash scripts/install_vulkan_cpu.sh [DIR])"
# Prints one line on stdout, `export VK_ICD_FILENAMES=...`; progress goes to stderr.
# DIR: first argument, else $RLINF_VULKAN_DIR, else /opt/rlinf/vulkan-cpu (root) or ~/.cache/rlinf/vulkan-cpu.
# A second run finds DIR complete and returns at once. Needs a Debian/Ubuntu system with apt-get and dpkg-deb;
# run as root only if the driver's ordinary library dependencies (LLVM, xcb, wayland) are missing, which it then
# installs with apt-get from the system's own release.
set -euo pipefail

MESA_SUITE="${RLINF_VULKAN_SUITE:-bookworm-backports}"
MESA_PKG=mesa-vulkan-drivers

log() { echo "[install_vulkan_cpu] $*" >&2; }
die() { log "error: $*"; exit 1; }

if [[ $# -ge 1 ]]; then
    DIR="$1"
elif [[ -n "${RLINF_VULKAN_DIR:-}" ]]; then
    DIR="$RLINF_VULKAN_DIR"
elif [[ -w /opt || "$(id -u)" == 0 ]]; then
    DIR=/opt/rlinf/vulkan-cpu
else
    DIR="${XDG_CACHE_HOME:-$HOME/.cache}/rlinf/vulkan-cpu"
fi
ICD="$DIR/lvp_icd.json"
STAMP="$DIR/.installed"

if [[ -f "$STAMP" && -f "$ICD" ]] && [[ -f "$(sed -n 's/.*"library_path": *"\([^"]*\)".*/\1/p' "$ICD")" ]]; then
    log "already installed: $(cat "$STAMP")"
    printf 'export VK_ICD_FILENAMES=%q\n' "$ICD"
    exit 0
fi

command -v apt-get >/dev/null && command -v dpkg-deb >/dev/null || die "needs apt-get and dpkg-deb (Debian/Ubuntu)"
ARCH="$(dpkg --print-architecture)"
case "$ARCH" in
    amd64) TRIPLET=x86_64-linux-gnu ;;
    arm64) TRIPLET=aarch64-linux-gnu ;;
    *) die "unsupported architecture $ARCH" ;;
esac

# The mirror the system already uses for Debian's main archive (keeps proxies/snapshots configured by the admin).
MIRROR="${RLINF_DEBIAN_MIRROR:-$(apt-get indextargets --no-release-info --format '$(REPO_URI) $(RELEASE)' 2>/dev/null \
    | awk '$2 ~ /^[a-z]+$/ && $1 !~ /security/ {print $1; exit}')}"
[[ -n "$MIRROR" ]] || die "no Debian mirror found in the apt sources; set RLINF_DEBIAN_MIRROR to the archive's URL"
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
[[ -f "$KEYRING" ]] || die "$KEYRING is missing (apt-get install debian-archive-keyring)"

mkdir -p "$DIR"
WORK="$(mktemp -d "$DIR/.work.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/lists/partial" "$WORK/cache/archives/partial" "$WORK/etc/preferences.d"
echo "deb [signed-by=$KEYRING] $MIRROR $MESA_SUITE main" >"$WORK/sources.list"
APT_OPTS=(
    -o "Dir::Etc::SourceList=$WORK/sources.list" -o "Dir::Etc::SourceParts=/dev/null"
    -o "Dir::Etc::PreferencesParts=$WORK/etc/preferences.d"
    -o "Dir::State::Lists=$WORK/lists" -o "Dir::Cache=$WORK/cache" -o "Debug::NoLocking=1"
    -o "APT::Sandbox::User=root" -o "Acquire::Retries=3"
)

log "fetching $MESA_PKG from $MESA_SUITE ($MIRROR)"
apt-get "${APT_OPTS[@]}" -qq update >&2 || die "apt-get update of $MESA_SUITE failed"
(cd "$WORK" && apt-get "${APT_OPTS[@]}" -qq download "$MESA_PKG:$ARCH" >&2) || die "apt-get download $MESA_PKG failed"
DEB="$(ls "$WORK"/"$MESA_PKG"_*.deb)"
VERSION="$(dpkg-deb -f "$DEB" Version)"

rm -rf "$DIR/root"
dpkg-deb -x "$DEB" "$DIR/root"
LIB="$DIR/root/usr/lib/$TRIPLET/libvulkan_lvp.so"
[[ -f "$LIB" ]] || die "$MESA_PKG $VERSION has no $LIB"

# Dependencies of the driver that the system lacks: ordinary libraries of the system's own release.
if ldd "$LIB" | grep -q "not found"; then
    log "missing libraries: $(ldd "$LIB" | awk '/not found/ {print $1}' | tr '\n' ' ')"
    [[ "$(id -u)" == 0 ]] || die "run as root to install the driver's library dependencies"
    mapfile -t DEPS < <(dpkg-deb -f "$DEB" Depends | tr ',' '\n' | sed 's/|.*//; s/(.*)//; s/:any//; s/ //g' | grep -v '^$')
    log "installing dependencies: ${DEPS[*]}"
    apt-get -qq update >&2
    DEBIAN_FRONTEND=noninteractive apt-get -qq install -y --no-install-recommends "${DEPS[@]}" >&2
    ! ldd "$LIB" | grep -q "not found" || die "still missing: $(ldd "$LIB" | awk '/not found/ {print $1}')"
fi

sed "s#\"library_path\": *\"[^\"]*\"#\"library_path\": \"$LIB\"#" \
    "$DIR/root/usr/share/vulkan/icd.d/lvp_icd.json" >"$ICD.tmp"
mv "$ICD.tmp" "$ICD"
echo "$MESA_PKG $VERSION ($MESA_SUITE)" >"$STAMP"
log "installed $MESA_PKG $VERSION under $DIR"
printf 'export VK_ICD_FILENAMES=%q\n' "$ICD"
