#!/usr/bin/python3
"""The Debian packages, as an operator gets them: `cpack -G DEB` in the build tree makes
traind_VERSION_amd64.deb (and traind-cuda_VERSION_amd64.deb when the CUDA backend was built);
lintian finds no error in them; their Depends come from the shared libraries; the unpacked
tree's traind answers --version and runs a short job with its own worker and dashboard; its
systemd unit passes systemd-analyze verify.

    /usr/bin/python3 tests/integration/package_test.py BUILD_DIR SOURCE_DIR

Prints the packages' sizes, their Depends and lintian's output (for the release notes)."""
import glob
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import harness  # noqa: E402

BUILD = None
SOURCE = None
VERSION = "0.1.0"


def run(argv, **kw):
    p = subprocess.run(argv, capture_output=True, text=True, timeout=900, **kw)
    if p.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} exited {p.returncode}:\n{p.stdout}\n{p.stderr}")
    return p.stdout


class PackageTest(harness.DaemonTest):
    @classmethod
    def setUpClass(cls):
        cls.out = tempfile.mkdtemp(prefix="traind-package-")
        # a root daemon runs its jobs as run_as (nobody here): the unpacked traind-worker must
        # be reachable for it, as /usr/bin is
        os.chmod(cls.out, 0o755)
        run(["cpack", "-G", "DEB", "-B", cls.out], cwd=BUILD)
        cls.debs = {os.path.basename(p).split("_")[0]: p
                    for p in glob.glob(os.path.join(cls.out, "*.deb"))}
        cls.root = os.path.join(cls.out, "root")
        run(["dpkg-deb", "-x", cls.debs["traind"], cls.root])

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.out, ignore_errors=True)

    def field(self, deb, name):
        return run(["dpkg-deb", "-f", deb, name]).strip()

    def test_a_contents_and_depends(self):
        deb = self.debs["traind"]
        self.assertEqual(os.path.basename(deb), f"traind_{VERSION}_amd64.deb")
        files = set(line.split()[-1] for line in run(["dpkg-deb", "-c", deb]).splitlines())
        for want in ("./usr/bin/traind", "./usr/bin/traind-worker", "./usr/bin/traind-run",
                     "./usr/bin/trainctl", "./usr/lib/traind/traind-shepherd",
                     "./lib/systemd/system/traind.service",
                     "./etc/traind/traind.json", "./usr/share/man/man1/traind.1.gz",
                     "./usr/share/man/man1/traind-run.1.gz",
                     "./usr/share/man/man1/traind-worker.1.gz",
                     "./usr/share/man/man1/trainctl.1.gz",
                     "./usr/share/doc/traind/openapi.json", "./usr/share/doc/traind/copyright",
                     "./usr/share/doc/traind/changelog.gz",
                     "./usr/share/traind/web/index.html",
                     "./usr/share/traind/examples/fmnist-lenet.json"):
            self.assertIn(want, files)
        self.assertFalse([f for f in files if "libtraind_gpu" in f],
                         "the CUDA backend is traind-cuda's, not traind's")
        depends = self.field(deb, "Depends")
        for lib in ("libc6", "libjansson4", "libmicrohttpd12", "libsqlite3-0", "libsystemd0",
                    "libprotobuf-c1", "libisal2", "libcurl4", "libarchive13", "libopenblas0",
                    "libjs-dygraphs"):
            self.assertIn(lib, depends, f"Depends: {depends}")
        control = os.path.join(self.out, "control")
        run(["dpkg-deb", "-e", deb, control])
        with open(os.path.join(control, "conffiles")) as f:
            self.assertEqual(f.read().split(), ["/etc/traind/traind.json"])
        for script in ("postinst", "prerm", "postrm"):
            self.assertTrue(os.access(os.path.join(control, script), os.X_OK), script)
        print(f"\n[package] {os.path.basename(deb)}: {os.path.getsize(deb)} bytes; "
              f"Installed-Size {self.field(deb, 'Installed-Size')} KiB\n"
              f"[package] Depends: {depends}", file=sys.stderr)
        if "traind-cuda" in self.debs:
            cuda = self.debs["traind-cuda"]
            self.assertIn("./usr/lib/traind/libtraind_gpu.so",
                          run(["dpkg-deb", "-c", cuda]))
            cuda_depends = self.field(cuda, "Depends")
            self.assertTrue(cuda_depends.startswith(f"traind (= {VERSION}), "), cuda_depends)
            self.assertIn("libc6", cuda_depends)
            self.assertNotIn("cublas", cuda_depends, "NVIDIA's libraries have no Debian package")
            print(f"[package] {os.path.basename(cuda)}: {os.path.getsize(cuda)} bytes; "
                  f"Depends: {cuda_depends}", file=sys.stderr)

    def test_a2_the_python_client_package(self):
        deb = self.debs["python3-traind-client"]
        self.assertEqual(os.path.basename(deb), f"python3-traind-client_{VERSION}_all.deb")
        self.assertEqual(self.field(deb, "Architecture"), "all")
        self.assertIn("python3", self.field(deb, "Depends"))
        files = set(line.split()[-1] for line in run(["dpkg-deb", "-c", deb]).splitlines())
        self.assertIn("./usr/lib/python3/dist-packages/traind_client/__init__.py", files)
        self.assertIn("./usr/share/doc/python3-traind-client/copyright", files)
        root = os.path.join(self.out, "python-root")
        run(["dpkg-deb", "-x", deb, root])
        lib = os.path.join(root, "usr/lib/python3/dist-packages")
        out = run(["/usr/bin/python3", "-c", "import traind_client; print(traind_client.__file__)"],
                  env=dict(os.environ, PYTHONPATH=lib))
        self.assertTrue(out.strip().startswith(lib), out)

    def test_b_lintian_finds_no_error(self):
        for name, deb in sorted(self.debs.items()):
            p = subprocess.run(["lintian", "--fail-on", "error", "--tag-display-limit", "0", deb],
                               capture_output=True, text=True, timeout=900)
            print(f"\n[package] lintian {os.path.basename(deb)} (exit {p.returncode}):\n"
                  f"{p.stdout}{p.stderr}", file=sys.stderr)
            self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
            self.assertNotRegex(p.stdout, r"(?m)^E: ", p.stdout)

    def test_c_the_unpacked_tree_runs_a_job(self):
        traind = os.path.join(self.root, "usr/bin/traind")
        self.assertEqual(run([traind, "--version"]).strip(), f"traind {VERSION}")
        harness.TRAIND = traind
        d = self.start_daemon("--config", "")  # not the host's /etc/traind
        log = "\n".join(d.stderr_tail().splitlines())
        self.assertIn(f"worker {os.path.join(self.root, 'usr/bin/traind-worker')}", log,
                      "the package's own worker")
        status, headers, body = d.request("GET", "/", token=False)
        self.assertEqual(status, 200)
        self.assertIn(b"traind", body, "the packaged dashboard")
        job, _ = d.submit(harness.train_spec("from-the-package", max_steps=10,
                                             checkpoint=False))
        self.assertEqual(d.follow(job["id"])[-1].data["state"], "succeeded")
        if os.geteuid() == 0:  # as the unit runs it: the job under a uid of its own
            ident = d.get_ok(f"/v1/jobs/{job['id']}")["identity"]
            self.assertIsNotNone(ident, "a root daemon gives its job an identity of its own")
            self.assertTrue(1879048192 <= ident["uid"] < 1879113727, ident)

    def test_d_the_packaged_unit_verifies(self):
        unit_dir = os.path.join(self.root, "lib/systemd/system")
        with open(os.path.join(unit_dir, "traind.service")) as f:
            unit = f.read()
        # isolation by default: root with a few capabilities (jobs get uids of their own) and a
        # delegated cgroup (each attempt in its own)
        self.assertNotRegex(unit, r"(?m)^User=", "the daemon gives jobs identities: it is root")
        self.assertRegex(unit, r"(?m)^Delegate=yes$")
        self.assertRegex(unit, r"(?m)^CapabilityBoundingSet=.*CAP_SETUID")
        self.assertRegex(unit, r"(?m)^NoNewPrivileges=yes$")
        check = os.path.join(SOURCE, "deploy/systemd/check-units.sh")
        print(run(["sh", check, unit_dir]), file=sys.stderr)


def main():
    global BUILD, SOURCE
    BUILD = os.path.abspath(sys.argv[1])
    SOURCE = os.path.abspath(sys.argv[2])
    harness.SOURCE_DIR = SOURCE
    names = sorted(k for k in vars(PackageTest) if k.startswith("test_"))
    suite = unittest.TestSuite(PackageTest(k) for k in names)
    result = unittest.TextTestRunner(verbosity=2).run(suite)
    sys.exit(0 if result.wasSuccessful() else 1)


if __name__ == "__main__":
    main()
