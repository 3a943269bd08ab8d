"""cmake --install into a temporary prefix, then programs built outside the tree against it:
with CMake (find_package) and with pkg-config; each serves one request, checked over HTTP.
Also: the installed headers reach nothing private, and the version rule holds."""
import os
import re
import shutil
import subprocess

import pytest

from conftest import ROOT, sanitizer_build

CONSUMER = os.path.join(ROOT, "tests", "install")


def run(argv, **kw):
    out = subprocess.run(argv, capture_output=True, text=True, **kw)
    assert out.returncode == 0, f"{' '.join(argv)}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out


def serve_once(binary):
    """Runs the consumer program, asks it for / and returns the answer's body."""
    import urllib.request
    proc = subprocess.Popen([binary], stdout=subprocess.PIPE, text=True)
    try:
        port = int(proc.stdout.readline())
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as r:
            body = r.read().decode()
        assert proc.wait(timeout=10) == 0
        return body
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def prefix(build_dir, tmp_path_factory):
    if sanitizer_build(build_dir):
        pytest.skip("an installed sanitizer build would need the sanitizer in its users too "
                    "(the release build's run is the install check)")
    path = tmp_path_factory.mktemp("prefix")
    run(["cmake", "--install", build_dir, "--prefix", str(path)])
    return path


def test_the_prefix_holds_headers_libraries_package_and_pc(prefix):
    lib = next(p for p in [prefix / "lib", *prefix.glob("lib/*-linux-gnu")]
               if (p / "libspindle_runtime.a").exists())
    # (The gateway is one library per room of src/proxy; spindle::proxy names them all.)
    layers = ["base", "runtime", "http", "h1", "h2", "server", "client", "handlers",
              "proxy_config", "proxy_parts", "proxy_request", "proxy_gateway", "hook", "pg"]
    for name in [*(f"libspindle_{layer}.a" for layer in layers),
                 "cmake/spindle/spindleConfig.cmake", "cmake/spindle/spindleConfigVersion.cmake",
                 "cmake/spindle/spindleTargets.cmake", "pkgconfig/spindle.pc"]:
        assert (lib / name).exists(), name
    assert (prefix / "bin" / "spindle").exists()
    headers = list((prefix / "include" / "spindle").rglob("*.h"))
    assert len(headers) > 50
    for header in headers:
        for include in re.findall(r'#include\s+"([^"]+)"', header.read_text()):
            # Only other public headers, by their spindle/ path.
            assert include.startswith("spindle/"), (header, include)
            assert (prefix / "include" / include).exists(), (header, include)


# Compiling a consumer takes a core for 20-40 s: with the package's other tests, make test's only.
@pytest.mark.exclusive
def test_a_cmake_project_builds_against_the_installed_package(prefix, tmp_path):
    build = tmp_path / "build"
    run(["cmake", "-S", CONSUMER, "-B", str(build), "-G", "Ninja",
         f"-DCMAKE_PREFIX_PATH={prefix}"])
    run(["cmake", "--build", str(build)])
    assert serve_once(str(build / "consumer")) == "installed"


@pytest.mark.parametrize("asked", ["0.2", "0.0"])
def test_the_version_rule_refuses_another_minor_version(prefix, tmp_path, asked):
    # 0.0 tells the rule apart: an older minor version asked for is refused too (while 0.x, a
    # minor version may change the API), where "any newer version" would take 0.1.
    project = tmp_path / "src"
    project.mkdir()
    text = open(os.path.join(CONSUMER, "CMakeLists.txt")).read()
    (project / "CMakeLists.txt").write_text(text.replace("find_package(spindle 0.1",
                                                         f"find_package(spindle {asked}"))
    shutil.copy(os.path.join(CONSUMER, "main.cc"), project / "main.cc")
    out = subprocess.run(["cmake", "-S", str(project), "-B", str(tmp_path / "build"), "-G",
                          "Ninja", f"-DCMAKE_PREFIX_PATH={prefix}"], capture_output=True,
                         text=True)
    assert out.returncode != 0
    assert asked in out.stderr and "spindle" in out.stderr


@pytest.mark.exclusive  # compiles a consumer, as above
def test_a_program_builds_with_pkg_config(prefix, tmp_path):
    pc = next(prefix.rglob("spindle.pc"))
    env = {**os.environ, "PKG_CONFIG_PATH": str(pc.parent)}
    flags = run(["pkg-config", "--cflags", "--libs", "spindle"], env=env).stdout.split()
    assert f"-I{prefix}/include" in [os.path.normpath(f[2:]) and "-I" + os.path.normpath(f[2:])
                                     for f in flags if f.startswith("-I")]
    binary = tmp_path / "consumer"
    run(["g++", "-O1", os.path.join(CONSUMER, "main.cc"), "-o", str(binary), *flags])
    assert serve_once(str(binary)) == "installed"
