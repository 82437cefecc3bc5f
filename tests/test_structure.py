"""The shape of the code: data flows one way (no module imports, even lazily,
a module that imports it back), and the command line's help loads no web
stack."""
import ast
import os
import subprocess
import sys

import goosedump

PACKAGE = os.path.dirname(goosedump.__file__)


def modules() -> dict[str, str]:
    out = {"goosedump._kernels": ""}
    for root, _, files in os.walk(PACKAGE):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(root, f)
                name = "goosedump" + path[len(PACKAGE):-3].replace(os.sep, ".")
                out[name.removesuffix(".__init__")] = path
    return out


def import_graph() -> dict[str, set[str]]:
    mods = modules()
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for m, path in mods.items():
        if not path:
            continue
        package = m if path.endswith("__init__.py") else m.rsplit(".", 1)[0]
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level:
                base = package
                for _ in range(node.level - 1):
                    base = base.rsplit(".", 1)[0]
                target = f"{base}.{node.module}" if node.module else base
                subs = {f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in mods}
                edges[m] |= subs
                if len(subs) < len(node.names) and target in mods:
                    edges[m].add(target)
            elif isinstance(node, ast.Import):
                edges[m] |= {a.name for a in node.names if a.name in mods}
    return edges


def test_no_import_cycles():
    edges = import_graph()
    assert len(edges) > 30 and "goosedump.server.app" in edges["goosedump.server"]
    state: dict[str, int] = {}      # 1: on the path, 2: done

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for n in sorted(edges[m]):
            assert state.get(n) != 1, "import cycle: " + " -> ".join(path[path.index(n):] + [m, n])
            if n not in state:
                visit(n, path + [m])
        state[m] = 2

    for m in sorted(edges):
        if m not in state:
            visit(m, [])


def test_serve_help_needs_no_web_stack():
    code = ("import sys\nfrom goosedump.cli import main\ntry:\n    main(['serve', '--help'])\n"
            "except SystemExit:\n    pass\nprint(sorted(m for m in ('fastapi', 'uvicorn', 'starlette') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "--api-key" in out.stdout and out.stdout.strip().splitlines()[-1] == "[]"


def test_the_plain_server_imports_no_ray(tiny_path):
    """Ray is the optional extra of `serve --replicas`: the single-process
    server builds its app, answers a request and never loads it."""
    code = ("import sys\nfrom fastapi.testclient import TestClient\nfrom goosedump import commands, cli\n"
            "from goosedump.model import load\nfrom goosedump.server.app import create_app\n"
            f"app = create_app(load({tiny_path!r}, n_ctx=256), model_name='m')\n"
            "with TestClient(app) as c:\n    assert c.get('/v1/models').status_code == 200\n"
            "print(sorted(m for m in sys.modules if m == 'ray' or m.startswith('ray.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_the_version_is_the_packages():
    import tomllib
    with open(os.path.join(os.path.dirname(__file__), "..", "pyproject.toml"), "rb") as f:
        assert tomllib.load(f)["project"]["version"] == goosedump.__version__
