#!/usr/bin/python3
"""HTTPS end to end, with a CA and certificates made here by openssl: a traind started with
--tls-cert/--tls-key serves the API and the dashboard over TLS only; curl --cacert, trainctl
--cacert and the Python client (cafile=) reach it; a client without the CA is refused, as is
plain HTTP; an agent joins the master over TLS when it holds the CA (--tls-ca) and not when it
holds another; the session cookie is Secure.

    /usr/bin/python3 tests/integration/tls_test.py TRAIND SOURCE_DIR"""
import json
import os
import socket
import ssl
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import harness  # noqa: E402


def openssl(*args, cwd):
    p = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    if p.returncode != 0:
        raise AssertionError(f"openssl {' '.join(args)}: {p.stderr}")


def make_ca(d, name):
    """d/NAME-ca.pem and its key."""
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", f"{name}-ca.key", "-out", f"{name}-ca.pem", "-days", "2",
            "-subj", f"/CN=traind test CA {name}", cwd=d)
    return os.path.join(d, f"{name}-ca.pem")


def make_cert(d, ca, name, ip="127.0.0.1"):
    """d/NAME.pem (for IP, signed by CA) and d/NAME.key (mode 0600)."""
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=d)
    with open(os.path.join(d, f"{name}.ext"), "w") as f:
        f.write(f"subjectAltName=IP:{ip}\nextendedKeyUsage=serverAuth\n")
    openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}-ca.pem", "-CAkey", f"{ca}-ca.key",
            "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext",
            cwd=d)
    os.chmod(os.path.join(d, f"{name}.key"), 0o600)
    return os.path.join(d, f"{name}.pem"), os.path.join(d, f"{name}.key")


class TLSTest(harness.DaemonTest):
    def setUp(self):
        self.pki = self.new_state_dir()
        self.ca = make_ca(self.pki, "good")
        self.other_ca = make_ca(self.pki, "other")
        self.cert, self.key = make_cert(self.pki, "good", "master")

    def start_tls(self, *args, state_dir=None, env=None):
        return self.start_daemon("--tls-cert", self.cert, "--tls-key", self.key, *args,
                                 state_dir=state_dir, env=env,
                                 ssl_context=ssl.create_default_context(cafile=self.ca))

    def curl(self, *args):
        return subprocess.run(["curl", "-sS", "--max-time", "30", *args], capture_output=True,
                              text=True, timeout=60)

    def test_clients_with_the_ca_and_without(self):
        d = self.start_tls()
        self.assertIn(f"listening on https://127.0.0.1:{d.port}", d.stderr_tail())
        url = f"https://127.0.0.1:{d.port}"
        auth = f"Authorization: Bearer {d.token}"
        ok = self.curl("--cacert", self.ca, "-H", auth, f"{url}/v1/jobs")
        self.assertEqual(ok.returncode, 0, ok.stderr)
        self.assertIn('"jobs"', ok.stdout)
        # the system's store does not know this CA; another CA does not sign it
        for args, what in (((), "the system's CAs"), (("--cacert", self.other_ca), "another CA")):
            bad = self.curl(*args, "-H", auth, f"{url}/v1/jobs")
            self.assertEqual(bad.returncode, 60, f"{what}: {bad.stderr}")  # peer not verified
        plain = self.curl("-H", auth, f"http://127.0.0.1:{d.port}/v1/jobs")
        self.assertEqual(plain.returncode, 0, plain.stderr)
        self.assertNotIn('"jobs"', plain.stdout, "plain HTTP is not served")

        # trainctl: --cacert, and TRAIND_CACERT
        trainctl = os.path.join(os.path.dirname(harness.TRAIND), "trainctl")
        env = dict(os.environ, HOME=self.new_state_dir())
        run = subprocess.run([trainctl, "--url", url, "--token", d.token, "--cacert", self.ca,
                              "submit", "-", "--name", "over-tls"],
                             input='{"command": ["true"]}', capture_output=True, text=True,
                             env=env, timeout=60)
        self.assertEqual(run.returncode, 0, run.stderr)
        listing = subprocess.run([trainctl, "--url", url, "--token", d.token, "ls"],
                                 capture_output=True, text=True, timeout=60,
                                 env=dict(env, TRAIND_CACERT=self.ca))
        self.assertEqual(listing.returncode, 0, listing.stderr)
        self.assertIn("over-tls", listing.stdout)
        refused = subprocess.run([trainctl, "--url", url, "--token", d.token, "ls"],
                                 capture_output=True, text=True, timeout=60, env=env)
        self.assertEqual(refused.returncode, 3, refused.stdout + refused.stderr)
        self.assertRegex(refused.stderr, "(?i)certificate|SSL")
        self.assertIn("--cacert", refused.stderr, "the hint names the option that fixes it")

        # the Python client
        sys.path.insert(0, os.path.join(harness.SOURCE_DIR, "clients/python"))
        from traind_client import Client
        c = Client(url, d.token, cafile=self.ca)
        job = [j for j in c.jobs() if j.data["name"] == "over-tls"][0]
        self.assertEqual(job.wait(timeout=60), "succeeded")
        with self.assertRaises(ssl.SSLError):
            Client(url, d.token, cafile=self.other_ca).jobs()

        # the dashboard's session cookie never travels in clear
        status, headers, _ = d.request("POST", "/v1/session", {"token": d.token}, token=False)
        self.assertEqual(status, 200)
        self.assertIn("; Secure", headers["set-cookie"])

    def test_plain_http_on_the_https_port(self):
        d = self.start_tls()
        # a silent connection first: the door waits for its first byte without holding others
        silent = socket.create_connection(("127.0.0.1", d.port))
        self.addCleanup(silent.close)
        plain = self.curl("-i", "-H", f"Authorization: Bearer {d.token}",
                          f"http://127.0.0.1:{d.port}/v1/jobs")
        self.assertEqual(plain.returncode, 0, plain.stderr)
        self.assertRegex(plain.stdout, r"^HTTP/1.1 400 ")
        body = json.loads(plain.stdout.split("\n\n", 1)[1])  # text mode: \r\n read as \n
        self.assertEqual(body["error"]["code"], "https_required")
        self.assertIn(f"use https://127.0.0.1:{d.port}/", body["error"]["message"])
        self.assertNotIn(d.token, plain.stdout)
        # TLS goes on as before, beside the silent one, from the same address
        ok = self.curl("--cacert", self.ca, "-H", f"Authorization: Bearer {d.token}",
                       f"https://127.0.0.1:{d.port}/v1/jobs")
        self.assertEqual(ok.returncode, 0, ok.stderr)
        self.assertIn('"jobs"', ok.stdout)
        # one address keeps at most 8 connections waiting for their first byte: the next ones
        # are closed at once, and a garbage first byte goes to the TLS handshake, which ends it
        held = [socket.create_connection(("127.0.0.1", d.port)) for _ in range(10)]
        for s in held:
            self.addCleanup(s.close)
        s = held[-1]
        s.settimeout(20)
        self.assertEqual(s.recv(1), b"", "the connection over the share is closed")
        g = socket.create_connection(("127.0.0.1", d.port))
        self.addCleanup(g.close)
        for s in held[:-1]:
            s.close()
        g.settimeout(60)
        g.sendall(b"\x00\x01garbage\r\n\r\n")
        try:
            got = g.recv(100)
        except ConnectionResetError:
            got = b""
        self.assertNotIn(b"HTTP/1.1", got)
        # 64 silent connections from 8 addresses fill the waiting list: the next client still
        # gets through (the oldest silent one makes room), promptly and over TLS
        crowd = []
        for a in range(2, 10):
            for _ in range(8):
                s = socket.socket()
                self.addCleanup(s.close)
                s.bind((f"127.0.0.{a}", 0))
                s.connect(("127.0.0.1", d.port))
                crowd.append(s)
        ok = self.curl("--cacert", self.ca, "-H", f"Authorization: Bearer {d.token}",
                       "--max-time", "4", f"https://127.0.0.1:{d.port}/v1/jobs")
        self.assertEqual(ok.returncode, 0, f"a full waiting list keeps new clients out: {ok.stderr}")
        self.assertIn('"jobs"', ok.stdout)
        self._stop_daemon(d)
        self.assertIn("a client (127.0.0.1) sent plain HTTP to the HTTPS port", d.stderr_tail(400))

    def test_an_agent_joins_over_tls(self):
        secret = os.path.join(self.pki, "cluster.secret")
        with open(secret, "w") as f:
            f.write("0123456789abcdef0123456789abcdef\n")
        os.chmod(secret, 0o600)
        master = self.start_tls("--cluster-secret-file", secret, "--node-name", "master")
        join = f"127.0.0.1:{master.port}"
        # one agent with the CA: it joins; one with another CA: it never does
        agent = self.start_daemon(
            "--join", join, "--tls-ca", self.ca, "--cluster-secret-file", secret,
            "--node-name", "agent-ok", "--advertise", "127.0.0.1")
        stranger = self.start_daemon(
            "--join", join, "--tls-ca", self.other_ca, "--cluster-secret-file", secret,
            "--node-name", "agent-bad", "--advertise", "127.0.0.1")

        def names():
            return {n["name"]: n["state"] for n in master.get_ok("/v1/nodes")["nodes"]}
        harness.wait_for(lambda: names().get("agent-ok") == "ready",
                         "the agent with the CA to join over TLS")
        harness.wait_for(
            lambda: any("certificate" in ln.lower() or "ssl" in ln.lower()
                        for ln in stranger.stderr_tail(1000).splitlines()),
            "the agent with another CA to say why it cannot reach its master")
        self.assertNotIn("agent-bad", names())
        # and the agent runs a job the master places on it, over the same channel
        status, _, job = master.json("POST", "/v1/jobs", {
            "name": "on-agent", "command": ["true"], "resources": {"nodes": ["agent-ok"]}})
        self.assertEqual(status, 201, job)
        self.assertEqual(master.follow(job["id"])[-1].data["state"], "succeeded")


class MakeCertsTest(harness.DaemonTest):
    def test_deploy_make_certs(self):
        """deploy/make-certs.sh as docs/cluster.md uses it: a CA, then a node's
        certificate for its address, which a daemon serves and a client verifies; run again,
        it keeps the CA and adds a node."""
        pki = self.new_state_dir()
        script = os.path.join(harness.SOURCE_DIR, "deploy", "make-certs.sh")
        p = subprocess.run(["sh", script, pki, "master=127.0.0.1"], capture_output=True,
                           text=True, timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr)
        with open(os.path.join(pki, "ca.pem")) as f:
            ca = f.read()
        self.assertEqual(os.stat(os.path.join(pki, "master.key")).st_mode & 0o777, 0o600)
        d = self.start_daemon("--tls-cert", os.path.join(pki, "master.pem"),
                              "--tls-key", os.path.join(pki, "master.key"),
                              ssl_context=ssl.create_default_context(
                                  cafile=os.path.join(pki, "ca.pem")))
        ok = subprocess.run(["curl", "-sS", "--max-time", "30", "--cacert",
                             os.path.join(pki, "ca.pem"), "-H", f"Authorization: Bearer {d.token}",
                             f"https://127.0.0.1:{d.port}/v1/nodes"],
                            capture_output=True, text=True, timeout=60)
        self.assertEqual(ok.returncode, 0, ok.stderr)
        self.assertIn('"nodes"', ok.stdout)
        p = subprocess.run(["sh", script, pki, "n1=node1.example"], capture_output=True,
                           text=True, timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr)
        with open(os.path.join(pki, "ca.pem")) as f:
            self.assertEqual(f.read(), ca, "the CA is kept")
        p = subprocess.run(["sh", script, pki, "noaddress"], capture_output=True, text=True,
                           timeout=60)
        self.assertEqual(p.returncode, 2)
        self.assertIn("expected NAME=ADDRESS", p.stderr)


def main():
    harness.TRAIND = os.path.abspath(sys.argv[1])
    harness.SOURCE_DIR = os.path.abspath(sys.argv[2])
    names = sorted(k for k in vars(TLSTest) if k.startswith("test_"))
    suite = unittest.TestSuite(TLSTest(k) for k in names)
    suite.addTest(MakeCertsTest("test_deploy_make_certs"))
    result = unittest.TextTestRunner(verbosity=2).run(suite)
    sys.exit(0 if result.wasSuccessful() else 1)


if __name__ == "__main__":
    main()
