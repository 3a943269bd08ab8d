#!/usr/bin/env bash
# make package: the Debian package build/spindle_<version>_amd64.deb from the release build
# (or, with PGO=1, the profile-guided one):
# /usr/bin/spindle, /etc/spindle/spindle.yaml (conffile), the systemd units, spindle(1) and the
# docs; the spindle user made by postinst. Checked with lintian when it is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
# PGO=1: the binary built from a profile of its own load (scripts/pgo.sh: needs wrk and h2load,
# about six minutes), else the release build.
binary=build/release/bin/spindle
if [ "${PGO:-0}" = 1 ]; then
  scripts/pgo.sh
  binary=build/pgo/bin/spindle
else
  scripts/build.sh release spindle_bin >/dev/null
fi
version=$(sed -n 's/.*kVersion = "\(.*\)";/\1/p' apps/spindle/serve.h)
# Who answers for the package: set MAINTAINER="Name <address>" when publishing it. The default
# is a reserved domain that reaches nobody: the project has no list yet.
maintainer=${MAINTAINER:-spindle maintainers <maintainers@spindle.invalid>}
out=build/package
root=$out/root
rm -rf "$out"
mkdir -p "$root/DEBIAN"

install -D -m 0755 "$binary" "$root/usr/bin/spindle"
strip --strip-unneeded --remove-section=.comment --remove-section=.note "$root/usr/bin/spindle"
# 0640: credentials (Redis passwords, upstream keys) go here; postinst gives it to the group
# spindle, which the service runs as (as Debian's redis-server does with redis.conf).
install -D -m 0640 packaging/spindle.yaml "$root/etc/spindle/spindle.yaml"
install -D -m 0644 packaging/spindle.service "$root/lib/systemd/system/spindle.service"
install -D -m 0644 packaging/spindle.socket "$root/lib/systemd/system/spindle.socket"
install -d "$root/usr/share/man/man1" "$root/usr/share/doc/spindle"
gzip -9n -c packaging/spindle.1 >"$root/usr/share/man/man1/spindle.1.gz"
install -m 0644 packaging/debian/copyright "$root/usr/share/doc/spindle/copyright"
sed "s/@MAINTAINER@/$maintainer/" packaging/debian/changelog | gzip -9n >"$root/usr/share/doc/spindle/changelog.gz"
for doc in configuration gateway operations security; do
  install -m 0644 "docs/$doc.md" "$root/usr/share/doc/spindle/$doc.md"
done
for script in postinst prerm postrm; do
  install -m 0755 "packaging/debian/$script" "$root/DEBIAN/$script"
done
echo /etc/spindle/spindle.yaml >"$root/DEBIAN/conffiles"

# Depends: the shared libraries the binary needs, by dpkg-shlibdeps (run where it expects a
# debian/ directory).
work=$out/shlibdeps
mkdir -p "$work/debian"
printf 'Source: spindle\n\nPackage: spindle\nArchitecture: amd64\n' >"$work/debian/control"
depends=$(cd "$work" && dpkg-shlibdeps -O "$OLDPWD/$root/usr/bin/spindle" 2>/dev/null |
  sed -n 's/^shlibs:Depends=//p')
[ -n "$depends" ] || { echo "package: dpkg-shlibdeps found no dependencies" >&2; exit 1; }
size=$(du -sk --exclude=DEBIAN "$root" | cut -f1)
sed -e "s/@VERSION@/$version/" -e "s/@SIZE@/$size/" -e "s/@DEPENDS@/$depends/" \
  -e "s/@MAINTAINER@/$maintainer/" \
  packaging/debian/control.in >"$root/DEBIAN/control"
(cd "$root" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | sort -z |
  xargs -0 md5sum >DEBIAN/md5sums)
chmod 0644 "$root/DEBIAN/md5sums" "$root/DEBIAN/conffiles" "$root/DEBIAN/control"

deb=build/spindle_${version}_amd64.deb
dpkg-deb --root-owner-group -Zxz --build "$root" "$deb" >/dev/null
echo "package: $deb"
if command -v lintian >/dev/null; then
  lintian --fail-on error "$deb"
else
  echo "package: lintian is not installed (apt-get install lintian): not checked"
fi
