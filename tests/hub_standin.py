"""A local stand-in for the Hub's HTTP endpoints that `huggingface_hub` uses to create repos and push commits.

Just enough of the API for `HfApi.create_repo`, `create_branch` and `upload_folder`/`create_commit`:

- `POST /api/repos/create`                            → 200 with the repo URL, 409 if it exists
- `POST /api/{type}s/{ns}/{name}/branch/{branch}`     → 200, 409 if it exists
- `POST /api/{type}s/{ns}/{name}/preupload/{rev}`     → every file "regular" (so the commit carries base64 content)
- `POST /api/{type}s/{ns}/{name}/commit/{rev}`        → NDJSON payload; files stored per (repo, revision)
- `POST /api/validate-yaml`                           → 400 unless the README starts with a YAML mapping
- `GET  /api/whoami-v2`, `GET /api/agent-harnesses`  → a fixed user, an empty registry

and, for `snapshot_download` and `hf_hub_download` of what was pushed:

- `GET  /api/{type}s/{ns}/{name}/revision/{rev}`      → the revision's commit sha and files
- `GET  /api/{type}s/{ns}/{name}/tree/{rev}`          → its files (one page, sizes and blob ids)
- `HEAD`/`GET [/{type}s]/{ns}/{name}/resolve/{rev}/{path}` → the file's commit, ETag and size / its bytes
- `HEAD /api/telemetry/...`                          → 200 (libraries' usage pings)

Requests are recorded in `server.requests` and files in `server.repos[repo_id]["files"][revision][path]` (bytes), so a
test can read back what arrived. Anything else answers 404 and is recorded, so a test sees an unexpected call.
"""

from __future__ import annotations

import base64
import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

import yaml

USER = "test-user"


class HubStandIn(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.repos: dict[str, dict] = {}
        self.requests: list[tuple[str, str, dict]] = []  # (method, path, headers)
        self.unknown: list[tuple[str, str]] = []
        self.lock = threading.Lock()
        self._thread: threading.Thread | None = None

    @property
    def endpoint(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> HubStandIn:
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.shutdown()
        self.server_close()

    def files(self, repo_id: str, revision: str = "main") -> dict[str, bytes]:
        return self.repos[repo_id]["files"].get(revision, {})


class _Handler(BaseHTTPRequestHandler):
    server: HubStandIn

    def log_message(self, *args):  # keep pytest output clean
        pass

    def _reply(self, status: int, body: dict | list | None = None) -> None:
        data = json.dumps({} if body is None else body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def do_GET(self):
        path = unquote(urlsplit(self.path).path)
        self.server.requests.append(("GET", path, dict(self.headers)))
        if path == "/api/whoami-v2":
            return self._reply(200, {"name": USER, "type": "user", "orgs": [], "auth": {}})
        if path == "/api/agent-harnesses":  # the client's best-effort user-agent detection
            return self._reply(200, {"standardEnvVars": [], "harnesses": {}})
        parts = path.split("/")
        # /api/<type>s/<ns>/<name>/revision/<rev> and /api/<type>s/<ns>/<name>/tree/<rev>[/<path>]
        if len(parts) >= 7 and parts[1] == "api" and parts[5] in ("revision", "tree"):
            found = self._snapshot(f"{parts[3]}/{parts[4]}", parts[6])
            if found is None:
                return self._reply(404, {"error": f"stand-in: no revision {parts[6]} of {parts[3]}/{parts[4]}"})
            sha, files = found
            if parts[5] == "revision":
                siblings = [{"rfilename": name} for name in sorted(files)]
                return self._reply(200, {"id": f"{parts[3]}/{parts[4]}", "sha": sha, "siblings": siblings})
            entries = [
                {"type": "file", "oid": _blob_id(data), "size": len(data), "path": name}
                for name, data in sorted(files.items())
            ]
            return self._reply(200, entries)
        if self._resolve(path, send_body=True):
            return
        self.server.unknown.append(("GET", path))
        self._reply(404, {"error": f"stand-in: no GET {path}"})

    def do_HEAD(self):
        path = unquote(urlsplit(self.path).path)
        self.server.requests.append(("HEAD", path, dict(self.headers)))
        if path.startswith("/api/telemetry/"):  # libraries' usage pings (TRL's), answered and not checked
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if not self._resolve(path, send_body=False):
            self.server.unknown.append(("HEAD", path))
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

    def _snapshot(self, repo_id: str, revision: str) -> tuple[str, dict[str, bytes]] | None:
        """The commit sha and files of a branch or of a commit sha, `None` when the repo has neither."""
        repo = self.server.repos.get(repo_id)
        if repo is None:
            return None
        if revision in repo["files"]:
            return repo["heads"].get(revision, "0" * 40), repo["files"][revision]
        if revision in repo["snapshots"]:
            return revision, repo["snapshots"][revision]
        return None

    def _resolve(self, path: str, send_body: bool) -> bool:
        """`[/<type>s]/<ns>/<name>/resolve/<rev>/<file>`: the file's headers (and bytes); False if not such a path."""
        parts = path.strip("/").split("/")
        if parts and parts[0] in ("datasets", "spaces"):
            parts = parts[1:]
        if len(parts) < 5 or parts[2] != "resolve":
            return False
        found = self._snapshot(f"{parts[0]}/{parts[1]}", parts[3])
        data = None if found is None else found[1].get("/".join(parts[4:]))
        if data is None:
            self.send_response(404)
            self.send_header("X-Error-Code", "EntryNotFound")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return True
        self.send_response(200)
        self.send_header("X-Repo-Commit", found[0])
        self.send_header("ETag", f'"{_blob_id(data)}"')
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if send_body:
            self.wfile.write(data)
        return True

    def do_POST(self):
        path = unquote(urlsplit(self.path).path)
        body = self._body()
        self.server.requests.append(("POST", path, dict(self.headers)))
        if path == "/api/repos/create":
            return self._create_repo(json.loads(body))
        if path == "/api/validate-yaml":
            return self._validate_yaml(json.loads(body)["content"])
        parts = path.split("/")
        # /api/models/<ns>/<name>/<action>/<revision...>
        if len(parts) >= 7 and parts[1] == "api" and parts[2] in ("models", "datasets", "spaces"):
            repo_id = f"{parts[3]}/{parts[4]}"
            action, revision = parts[5], "/".join(parts[6:])
            with self.server.lock:
                repo = self.server.repos.get(repo_id)
                if repo is None:
                    return self._reply(404, {"error": f"Repository {repo_id} not found"})
                if action == "branch":
                    if revision in repo["files"]:
                        return self._reply(409, {"error": "Reference already exists"})
                    repo["files"][revision] = dict(repo["files"]["main"])
                    if "main" in repo["heads"]:
                        repo["heads"][revision] = repo["heads"]["main"]
                    return self._reply(200, {})
                if revision not in repo["files"]:
                    return self._reply(404, {"error": f"Invalid rev id: {revision}"})
                if action == "preupload":
                    files = json.loads(body)["files"]
                    return self._reply(
                        200,
                        {
                            "files": [
                                {"path": f["path"], "uploadMode": "regular", "shouldIgnore": False} for f in files
                            ]
                        },
                    )
                if action == "commit":
                    return self._commit(repo_id, repo, revision, body)
        self.server.unknown.append(("POST", path))
        self._reply(404, {"error": f"stand-in: no POST {path}"})

    def _validate_yaml(self, content: str) -> None:
        """The Hub checks a README's metadata block before a commit: it must be a YAML mapping."""
        parts = content.split("---", 2)
        try:
            metadata = yaml.safe_load(parts[1]) if content.startswith("---") and len(parts) == 3 else None
        except yaml.YAMLError as err:
            return self._reply(400, {"errors": [{"message": f"invalid YAML: {err}"}]})
        if not isinstance(metadata, dict):
            return self._reply(400, {"errors": [{"message": "no YAML metadata block"}]})
        self._reply(200, {"errors": [], "warnings": []})

    def _create_repo(self, payload: dict) -> None:
        repo_id = f"{payload.get('organization') or USER}/{payload['name']}"
        with self.server.lock:
            if repo_id in self.server.repos:
                return self._reply(409, {"error": "You already created this model repo", "url": self._url(repo_id)})
            self.server.repos[repo_id] = {
                "private": payload.get("visibility") == "private" or bool(payload.get("private")),
                "type": payload.get("type") or "model",
                "files": {"main": {}},
                "commits": [],
                "heads": {},  # branch → its last commit's sha
                "snapshots": {},  # commit sha → the files at that commit
            }
        self._reply(200, {"url": self._url(repo_id), "name": repo_id, "id": repo_id})

    def _commit(self, repo_id: str, repo: dict, revision: str, body: bytes) -> None:
        header, files, unsupported = {}, {}, []
        for line in body.splitlines():
            if not line.strip():
                continue
            item = json.loads(line)
            key, value = item["key"], item["value"]
            if key == "header":
                header = value
            elif key == "file" and value.get("encoding") == "base64":
                files[value["path"]] = base64.b64decode(value["content"])
            else:
                unsupported.append(key)
        if unsupported:
            return self._reply(400, {"error": f"stand-in: unsupported commit operations {unsupported}"})
        repo["files"][revision].update(files)
        oid = hashlib.sha1(body).hexdigest()
        repo["heads"][revision], repo["snapshots"][oid] = oid, dict(repo["files"][revision])
        repo["commits"].append(
            {"revision": revision, "oid": oid, "summary": header.get("summary"), "paths": list(files)}
        )
        self._reply(200, {"commitUrl": f"{self._url(repo_id)}/commit/{oid}", "commitOid": oid, "success": True})

    def _url(self, repo_id: str) -> str:
        return f"{self.server.endpoint}/{repo_id}"


def _blob_id(data: bytes) -> str:
    """The git blob sha of a file's bytes (what the Hub gives as a regular file's oid and ETag)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
