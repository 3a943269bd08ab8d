"""make package: the Debian package, checked the way dpkg and lintian see it, installed into a
throwaway root with dpkg (its maintainer scripts run there), then removed and purged; and the
maintainer scripts' own work (the spindle user) run against stand-ins for adduser/getent."""
import os
import shutil
import subprocess

import pytest

from conftest import ROOT, sanitizer_build

# Builds the package from the tree (scripts/package.sh) into build/: make test only.
pytestmark = pytest.mark.exclusive


def run(argv, **kw):
    out = subprocess.run(argv, capture_output=True, text=True, **kw)
    assert out.returncode == 0, f"{' '.join(argv)}\n{out.stdout[-4000:]}\n{out.stderr[-4000:]}"
    return out


@pytest.fixture(scope="module")
def deb(build_dir):
    if sanitizer_build(build_dir):
        pytest.skip("the package is made from the release build (its run is the package check)")
    out = run([os.path.join(ROOT, "scripts", "package.sh")], timeout=1200)
    path = next(line.split(": ", 1)[1] for line in out.stdout.splitlines()
                if line.startswith("package: build/"))
    deb = os.path.join(ROOT, path)
    assert os.path.basename(deb) == "spindle_0.1.0_amd64.deb"
    # lintian, when installed, ran with --fail-on error (a non-zero exit fails run() above).
    return deb


def test_contents_control_and_conffiles(deb, tmp_path):
    contents = run(["dpkg-deb", "--contents", deb]).stdout
    for path, mode in [("./usr/bin/spindle", "-rwxr-xr-x"),
                       ("./etc/spindle/spindle.yaml", "-rw-r-----"),
                       ("./lib/systemd/system/spindle.service", "-rw-r--r--"),
                       ("./lib/systemd/system/spindle.socket", "-rw-r--r--"),
                       ("./usr/share/man/man1/spindle.1.gz", "-rw-r--r--"),
                       ("./usr/share/doc/spindle/copyright", "-rw-r--r--"),
                       ("./usr/share/doc/spindle/configuration.md", "-rw-r--r--")]:
        line = next((l for l in contents.splitlines() if l.endswith(" " + path)), None)
        assert line is not None, path
        assert line.startswith(mode + " root/root"), line
    fields = {k: run(["dpkg-deb", "-f", deb, k]).stdout.strip()
              for k in ["Package", "Version", "Architecture", "Depends"]}
    assert fields["Package"] == "spindle" and fields["Version"] == "0.1.0"
    assert fields["Architecture"] == "amd64"
    for dependency in ["libc6", "libssl3", "adduser"]:
        assert dependency in fields["Depends"], fields["Depends"]
    control = tmp_path / "control"
    run(["dpkg-deb", "--control", deb, str(control)])
    assert (control / "conffiles").read_text().split() == ["/etc/spindle/spindle.yaml"]
    for script in ["postinst", "prerm", "postrm"]:
        assert os.access(control / script, os.X_OK)
        run(["sh", "-n", str(control / script)])


def test_the_shipped_configuration_is_valid_and_the_man_page_renders(deb, tmp_path):
    run(["dpkg-deb", "-x", deb, str(tmp_path)])
    run([str(tmp_path / "usr/bin/spindle"), "check-config", str(tmp_path / "etc/spindle/spindle.yaml")])
    page = run(["man", "-l", str(tmp_path / "usr/share/man/man1/spindle.1.gz")],
               env={**os.environ, "MANWIDTH": "80"}).stdout
    assert "spindle - fiber-based HTTP server" in page and "LISTEN_FDS" in page


def dpkg_root(tmp_path):
    root = tmp_path / "root"
    for d in ["var/lib/dpkg/info", "var/lib/dpkg/updates", "var/lib/dpkg/triggers"]:
        (root / d).mkdir(parents=True)
    (root / "var/lib/dpkg/status").write_text("")
    return root


def dpkg(root, *args):
    return run(["dpkg", f"--root={root}", "--force-script-chrootless", "--force-depends",
                "--force-not-root", f"--log={root}/dpkg.log", *args])


def test_installed_into_a_throwaway_root_then_removed_and_purged(deb, tmp_path):
    if shutil.which("dpkg") is None:
        pytest.skip("dpkg is not installed")
    root = dpkg_root(tmp_path)
    dpkg(root, "-i", deb)
    version = run([str(root / "usr/bin/spindle"), "--version"]).stdout
    assert version.strip() == "spindle 0.1.0"
    conf = root / "etc/spindle/spindle.yaml"
    assert conf.stat().st_mode & 0o777 == 0o640  # credentials go there
    # Installed again over itself: the changed configuration is kept.
    conf.write_text(conf.read_text() + "\n# changed by the operator\n")
    dpkg(root, "-i", deb)
    assert "changed by the operator" in conf.read_text()
    # Removed: the program goes; the configuration stays until a purge (Debian's rule for
    # conffiles, as with nginx).
    dpkg(root, "-r", "spindle")
    assert not (root / "usr/bin/spindle").exists()
    assert not (root / "lib/systemd/system/spindle.service").exists()
    assert conf.exists()
    dpkg(root, "-P", "spindle")
    assert not (root / "etc/spindle").exists()
    left = [p for p in root.rglob("*") if "spindle" in p.name and "var/lib/dpkg" not in str(p)]
    assert left == []


def test_postinst_makes_the_system_user_once(deb, tmp_path):
    control = tmp_path / "control"
    run(["dpkg-deb", "--control", deb, str(control)])
    stand_ins = tmp_path / "bin"
    stand_ins.mkdir()
    log = tmp_path / "calls"
    for name, code in [("adduser", 0), ("systemctl", 0)]:
        (stand_ins / name).write_text(f'#!/bin/sh\necho "{name} $*" >> {log}\nexit {code}\n')
        (stand_ins / name).chmod(0o755)
    env = {"PATH": f"{stand_ins}:/usr/bin:/bin"}
    for exists, expected in [(False, True), (True, False)]:
        (stand_ins / "getent").write_text(f"#!/bin/sh\nexit {0 if exists else 2}\n")
        (stand_ins / "getent").chmod(0o755)
        log.write_text("")
        run(["sh", str(control / "postinst"), "configure", ""], env=env)
        calls = log.read_text()
        assert ("adduser --system --group --quiet --no-create-home --home /nonexistent "
                "spindle" in calls) == expected, calls


def test_postinst_gives_the_configuration_to_the_service_group_unless_overridden(deb, tmp_path):
    control = tmp_path / "control"
    run(["dpkg-deb", "--control", deb, str(control)])
    conf = tmp_path / "spindle.yaml"
    script = tmp_path / "postinst"
    script.write_text((control / "postinst").read_text().replace("/etc/spindle/spindle.yaml",
                                                                  str(conf)))
    stand_ins = tmp_path / "bin"
    stand_ins.mkdir()
    log = tmp_path / "calls"
    for name in ["adduser", "systemctl", "chgrp", "chmod", "getent"]:
        (stand_ins / name).write_text(f'#!/bin/sh\necho "{name} $*" >> {log}\nexit 0\n')
        (stand_ins / name).chmod(0o755)
    env = {"PATH": f"{stand_ins}:/usr/bin:/bin"}
    for overridden, expected in [(False, True), (True, False)]:
        (stand_ins / "dpkg-statoverride").write_text(
            f"#!/bin/sh\nexit {0 if overridden else 1}\n")
        (stand_ins / "dpkg-statoverride").chmod(0o755)
        conf.write_text("listen: 127.0.0.1:8080\n")
        log.write_text("")
        run(["sh", str(script), "configure", ""], env=env)
        calls = log.read_text().splitlines()
        assert (f"chgrp spindle {conf}" in calls) == expected, calls
        assert (f"chmod 0640 {conf}" in calls) == expected, calls
