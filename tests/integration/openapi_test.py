#!/usr/bin/python3
"""api/openapi.json against the daemon: the document is OpenAPI 3.1 as far as can be checked
offline (its schemas are valid JSON Schema 2020-12 under python3-jsonschema, every $ref
resolves, every operation has an id and responses), the daemon serves it at /v1/openapi.json,
every route in the daemon's route table is in it and every documented route and method is
served, and real responses (jobs, metrics, checkpoints, nodes, events, errors) validate against
the schemas the document gives for their status.

    /usr/bin/python3 tests/integration/openapi_test.py TRAIND SOURCE_DIR"""
import json
import os
import re
import sys
import unittest

import jsonschema

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import harness  # noqa: E402

METHODS = ("get", "put", "post", "delete")


def load_doc():
    with open(os.path.join(harness.SOURCE_DIR, "api", "openapi.json")) as f:
        return json.load(f)


def resolve(doc, node):
    while isinstance(node, dict) and "$ref" in node:
        ref = node["$ref"]
        assert ref.startswith("#/"), ref
        node = doc
        for part in ref[2:].split("/"):
            node = node[part.replace("~1", "/").replace("~0", "~")]
    return node


def served_routes():
    """(method, path template) of the daemon's route tables in api/td_api.c."""
    with open(os.path.join(harness.SOURCE_DIR, "api", "td_api.c")) as f:
        src = f.read()
    routes = set()
    for table, prefix in (("ROUTES", ""), ("JOB_ROUTES", "/v1/jobs/{id}")):
        body = re.search(r"static const route %s\[\] = \{(.*?)\n\};" % table, src, re.S).group(1)
        for path, methods in re.findall(r'\{"([^"]*)", "([^"]*)"', body):
            for m in methods.split(", "):
                routes.add((m.lower(), prefix + path))
    return routes


class OpenAPITest(harness.DaemonTest):
    def validator(self, doc, schema):
        resolver = jsonschema.RefResolver.from_schema(doc)
        return jsonschema.Draft202012Validator(schema, resolver=resolver)

    def check(self, doc, path, method, status, body):
        """body validates against the schema the document gives for this response."""
        op = doc["paths"][path][method]
        self.assertIn(str(status), op["responses"], f"{method} {path}: {status} undocumented")
        response = resolve(doc, op["responses"][str(status)])
        schema = response["content"]["application/json"]["schema"]
        errors = sorted(self.validator(doc, schema).iter_errors(body), key=str)
        self.assertEqual([], [f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
                              for e in errors[:5]], f"{method} {path} {status}")

    def test_a_the_document(self):
        doc = load_doc()
        self.assertEqual(doc["openapi"], "3.1.0")
        for key in ("info", "paths", "components"):
            self.assertIn(key, doc)
        for name, schema in doc["components"]["schemas"].items():
            jsonschema.Draft202012Validator.check_schema(schema)
        refs = re.findall(r'"\$ref": "([^"]+)"', json.dumps(doc))
        for ref in refs:
            resolve(doc, {"$ref": ref})  # raises when it points nowhere
        ids = []
        for path, item in doc["paths"].items():
            for method in METHODS:
                if method in item:
                    ids.append(item[method]["operationId"])
                    self.assertTrue(item[method]["responses"], f"{method} {path}")
        self.assertEqual(len(ids), len(set(ids)), "operationIds are unique")

        # every served route documented, every documented one served (the route tables name
        # prefixes: /v1/jobs/ and /v1/nodes/ are matched to the templates under them)
        documented = {(m, p) for p, item in doc["paths"].items() for m in METHODS if m in item}
        for method, path in served_routes():
            if path.endswith("/"):
                path = path[:-1]
                hits = [p for m, p in documented if m == method and p.startswith(path)]
            else:
                hits = [p for m, p in documented if m == method and p == path]
            if path == "/v1/jobs" and method in ("get", "post"):
                hits = hits or [path]
            self.assertTrue(hits, f"{method.upper()} {path} is served but not documented")

    def test_b_real_responses(self):
        doc = load_doc()
        d = self.start_daemon("--slots", "2", "--grace", "2", "--node-name", "solo")
        status, _, served = d.json("GET", "/v1/openapi.json", token=False)
        self.assertEqual((status, served), (200, doc), "served without a token, as in the source")
        self.check(doc, "/v1/health", "get", *d.json("GET", "/v1/health")[::2])
        self.check(doc, "/v1/version", "get", *d.json("GET", "/v1/version")[::2])
        self.check(doc, "/v1/nodes", "get", *d.json("GET", "/v1/nodes")[::2])

        status, _, job = d.json("POST", "/v1/jobs", harness.train_spec("lenet", nproc=2))
        self.check(doc, "/v1/jobs", "post", status, job)
        jid = job["id"]
        events = d.follow(jid)
        sse = doc["paths"]["/v1/jobs/{id}/events"]["get"]["responses"]["200"]["x-sse-events"]
        checked = set()
        for ev in events:
            if ev.event in sse:
                errors = list(self.validator(doc, sse[ev.event]).iter_errors(ev.data))
                self.assertEqual([], [e.message for e in errors[:3]], f"event {ev.event}")
                checked.add(ev.event)
        self.assertTrue({"state", "train", "checkpoint"} <= checked, checked)
        self.check(doc, "/v1/jobs/{id}", "get", *d.json("GET", f"/v1/jobs/{jid}")[::2])
        self.check(doc, "/v1/jobs", "get", *d.json("GET", "/v1/jobs?state=succeeded")[::2])
        self.check(doc, "/v1/jobs/{id}/metrics", "get",
                   *d.json("GET", f"/v1/jobs/{jid}/metrics")[::2])
        status, _, ckpts = d.json("GET", f"/v1/jobs/{jid}/checkpoints")
        self.check(doc, "/v1/jobs/{id}/checkpoints", "get", status, ckpts)
        step = ckpts[-1]["step"]
        self.check(doc, "/v1/jobs/{id}/checkpoints/{step}", "get",
                   *d.json("GET", f"/v1/jobs/{jid}/checkpoints/{step}")[::2])
        self.check(doc, "/v1/nodes/{name}/drain", "post",
                   *d.json("POST", "/v1/nodes/solo/drain")[::2])
        self.check(doc, "/v1/nodes/{name}/undrain", "post",
                   *d.json("POST", "/v1/nodes/solo/undrain")[::2])
        # errors, each as its operation documents it
        bad = harness.train_spec("bad")
        bad["train"]["batch_size"] = 0
        self.check(doc, "/v1/jobs", "post", *d.json("POST", "/v1/jobs", bad)[::2])
        self.check(doc, "/v1/jobs", "get", *d.json("GET", "/v1/jobs", token="0" * 64)[::2])
        self.check(doc, "/v1/jobs/{id}", "get", *d.json("GET", "/v1/jobs/999")[::2])
        self.check(doc, "/v1/jobs/{id}/cancel", "post",
                   *d.json("POST", f"/v1/jobs/{jid}/cancel")[::2])
        self.check(doc, "/v1/jobs/{id}/checkpoints/{step}", "get",
                   *d.json("GET", f"/v1/jobs/{jid}/checkpoints/123456")[::2])
        status, _, _ = d.request("DELETE", f"/v1/jobs/{jid}")
        self.assertIn(str(status), doc["paths"]["/v1/jobs/{id}"]["delete"]["responses"])

        # every documented route and method is served: none answers "no route"
        for path, item in doc["paths"].items():
            for method in METHODS:
                if method not in item or path.startswith("/v1/cluster/"):
                    continue
                url = (path.replace("{id}", "1").replace("{step}", "1").replace("{file}", "a")
                       .replace("{name}", "solo"))
                status, _, body = d.request(method.upper(), url,
                                            body=b"{}" if method in ("post", "put") else None)
                self.assertFalse(status == 404 and b"no route" in body, f"{method} {url}: {body}")
                self.assertNotEqual(status, 405, f"{method} {url}")


def main():
    harness.TRAIND = os.path.abspath(sys.argv[1])
    harness.SOURCE_DIR = os.path.abspath(sys.argv[2])
    suite = unittest.TestSuite(OpenAPITest(n) for n in ("test_a_the_document",
                                                        "test_b_real_responses"))
    result = unittest.TextTestRunner(verbosity=2).run(suite)
    sys.exit(0 if result.wasSuccessful() else 1)


if __name__ == "__main__":
    main()
