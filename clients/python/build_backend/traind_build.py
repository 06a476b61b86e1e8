"""The client's build backend (PEP 517), in the tree and on the standard library alone.

Why not setuptools: a fresh virtual environment has setuptools but not wheel, so `pip install
./clients/python` needs the network to fetch them (build isolation), and with
--no-build-isolation setuptools cannot make a wheel at all ("invalid command 'bdist_wheel'").
The client is one pure-Python package: its wheel is a zip of the package and three metadata
files (PEP 427, the core metadata spec), which this writes from pyproject.toml's [project]."""
import base64
import hashlib
import io
import os
import tarfile
import tomllib
import zipfile

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _project():
    with open(os.path.join(HERE, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)["project"]


def _package_files(package):
    root = os.path.join(HERE, package)
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(filenames):
            if name.endswith(".py") or name == "py.typed":
                path = os.path.join(dirpath, name)
                yield path, os.path.relpath(path, HERE).replace(os.sep, "/")


def _metadata(p):
    lines = ["Metadata-Version: 2.1", f"Name: {p['name']}", f"Version: {p['version']}",
             f"Summary: {p.get('description', '')}",
             f"Requires-Python: {p.get('requires-python', '>=3')}"]
    if "license" in p and "text" in p["license"]:
        lines.append(f"License: {p['license']['text']}")
    return "\n".join(lines) + "\n"


def _dist_name(p):
    return p["name"].replace("-", "_")


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    p = _project()
    name, version = _dist_name(p), p["version"]
    info = f"{name}-{version}.dist-info"
    wheel = f"{name}-{version}-py3-none-any.whl"
    records = []

    def add(z, arcname, data):
        z.writestr(zipfile.ZipInfo(arcname, date_time=(1980, 1, 1, 0, 0, 0)), data)
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        records.append(f"{arcname},sha256={digest},{len(data)}")

    with zipfile.ZipFile(os.path.join(wheel_directory, wheel), "w", zipfile.ZIP_DEFLATED) as z:
        for package in p.get("packages", None) or [name]:
            for path, arcname in _package_files(package):
                with open(path, "rb") as f:
                    add(z, arcname, f.read())
        add(z, f"{info}/METADATA", _metadata(p).encode())
        add(z, f"{info}/WHEEL", b"Wheel-Version: 1.0\nGenerator: traind_build\n"
                                b"Root-Is-Purelib: true\nTag: py3-none-any\n")
        records.append(f"{info}/RECORD,,")
        z.writestr(zipfile.ZipInfo(f"{info}/RECORD", date_time=(1980, 1, 1, 0, 0, 0)),
                   "\n".join(records) + "\n")
    return wheel


def build_sdist(sdist_directory, config_settings=None):
    p = _project()
    base = f"{_dist_name(p)}-{p['version']}"
    path = os.path.join(sdist_directory, base + ".tar.gz")
    with tarfile.open(path, "w:gz") as t:
        for rel in ("pyproject.toml", "build_backend/traind_build.py"):
            t.add(os.path.join(HERE, rel), f"{base}/{rel}")
        for full, rel in _package_files("traind_client"):
            t.add(full, f"{base}/{rel}")
        info = tarfile.TarInfo(f"{base}/PKG-INFO")
        data = _metadata(p).encode()
        info.size = len(data)
        t.addfile(info, io.BytesIO(data))
    return os.path.basename(path)
